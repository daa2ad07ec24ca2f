"""The suite's own guard: a test that hangs (here a deadlock on a lock, the futex wait that once
stopped the suite at 33% with both xdist workers idle) fails naming itself, with every thread's
traceback, under the project's pytest configuration (setup.cfg: pytest-timeout, method signal),
instead of stopping the suite until CI's limit."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SETUP_CFG = Path(__file__).resolve().parent.parent / "setup.cfg"

HANGS = '''
import threading


def test_waits_for_itself():
    lock = threading.Lock()
    lock.acquire()
    lock.acquire()   # a deadlock: the second acquire waits forever
'''


def test_a_deadlocked_test_fails_naming_itself_with_the_tracebacks(tmp_path):
    (tmp_path / "test_hangs.py").write_text(HANGS)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-c", str(SETUP_CFG), "--rootdir", str(tmp_path),
                           "-p", "no:cacheprovider", "-o", "timeout=3", "-n", "1", str(tmp_path / "test_hangs.py")],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-3000:]
    assert "Timeout" in out and "test_waits_for_itself" in out, out[-3000:]
    assert ">       lock.acquire()   # a deadlock" in out, out[-3000:]   # the hung test's traceback, at the line
    assert "Stack of" in out, out[-3000:]                               # and every other thread's stack
    assert "1 failed" in out and "crashed" not in out, out[-3000:]      # the worker lives on: the suite goes on
