"""The command line's replies that compute nothing, against ``python -c "import numpy"``, end to end.

``python -m sfxlin.benchmarks.startup [--rounds N]``: each command of :data:`COMMANDS` as a whole
child process (the ``sfxlin`` console script of this install), run in turn with the baseline
``python -c "import numpy"`` in every round (B C1 C2 ... B C1 C2 ...), so that a drift of the
machine's speed moves every arm alike. Prints each command's median wall seconds and the median
of its per-round ratios to the baseline, and checks each exits as it should (0, or 2 for a
refusal). The target: every ratio within 2 (a reply before numpy could give one is 1).

The children run as on a user's machine: Python writes its bytecode caches (``PYTHONDONTWRITEBYTECODE``
is removed from their environment; an install's own modules would otherwise be compiled at every
start), and one round before the measured ones writes them.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

__all__ = ["COMMANDS", "BASELINE", "bench_startup"]

#: label -> (arguments of ``sfxlin``, the exit status it must give)
COMMANDS = {
    "sfxlin --help": (["--help"], 0),
    "sfxlin --version": (["--version"], 0),
    "sfxlin list": (["list"], 0),
    "sfxlin list c1": (["list", "c1"], 0),
    "a refused --set": (["run", "c1", "--set", "d=two"], 2),
    "an unknown experiment": (["run", "c1_limt"], 2),
}

BASELINE = [sys.executable, "-c", "import numpy"]


def _sfxlin():
    """The console script beside this interpreter (what a user runs), else ``python -m sfxlin.cli``."""
    script = Path(sys.executable).with_name("sfxlin")
    return [str(script)] if script.exists() else [sys.executable, "-m", "sfxlin.cli"]


_ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def _wall(cmd, status):
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=_ENV)
    wall = time.perf_counter() - start
    if proc.returncode != status:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}, not {status}:\n{proc.stderr[-2000:]}")
    return wall


def bench_startup(rounds=7, commands=None, verbose=True):
    """``{label: {"wall": median seconds, "ratio": median of the per-round ratios to the baseline}}``,
    with ``"baseline"`` the median of ``python -c "import numpy"``; every arm run once per round, in turn."""
    commands = COMMANDS if commands is None else commands
    base = _sfxlin()
    walls = {label: [] for label in ("baseline", *commands)}
    for label, (args, status) in commands.items():   # the warm-up round: bytecode caches written
        _wall(base + args, status)
    for _ in range(int(rounds)):
        walls["baseline"].append(_wall(BASELINE, 0))
        for label, (args, status) in commands.items():
            walls[label].append(_wall(base + args, status))
    out = {"baseline": {"wall": statistics.median(walls["baseline"]), "ratio": 1.0}}
    for label in commands:
        ratios = [w / b for w, b in zip(walls[label], walls["baseline"])]
        out[label] = {"wall": statistics.median(walls[label]), "ratio": statistics.median(ratios)}
    if verbose:
        numpy = 'python -c "import numpy"'
        print(f"{numpy:28s} {out['baseline']['wall']:6.3f} s")
        for label in commands:
            print(f"{label:28s} {out[label]['wall']:6.3f} s  {out[label]['ratio']:5.2f} x numpy "
                  f"({'within' if out[label]['ratio'] <= 2 else 'BEYOND'} 2x)")
        print(f"median of {rounds} rounds, in turn; load average {', '.join(f'{x:.2f}' for x in os.getloadavg())} "
              f"on {os.cpu_count()} cores")
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=7)
    args = p.parse_args(argv)
    if args.rounds < 1:
        raise SystemExit(f"--rounds must be >= 1, got {args.rounds}")
    bench_startup(args.rounds)
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
