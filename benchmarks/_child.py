"""One child process timed from outside, for the end-to-end benchmarks."""
from __future__ import annotations

import resource
import subprocess
import time

__all__ = ["run_child"]


def run_child(cmd):
    """Run ``cmd`` as a child process: ``(wall, cpu, stdout)``, ``cpu`` the user + system seconds of
    the child and the processes it waited for (the operating system's accounting). RuntimeError
    with the end of its output if it fails."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), proc.stdout
