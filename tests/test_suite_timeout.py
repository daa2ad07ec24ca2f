"""The suite's own guards. A test that hangs (here a deadlock on a lock, the futex wait that once
stopped the suite at 33% with both xdist workers idle) fails naming itself, with every thread's
traceback, under the project's pytest configuration (setup.cfg: pytest-timeout, method signal),
instead of stopping the suite until CI's limit. A suite started with SIGINT ignored (in the
background by a non-interactive shell) still starts its runs with SIGINT at its default."""
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


def test_a_suite_started_with_sigint_ignored_starts_its_runs_with_the_default():
    """tests/conftest.py: the processes the tests start must turn SIGINT into KeyboardInterrupt (the tests
    that interrupt a run send it) even where the suite itself was started ignoring it, as `make test &`
    is by a non-interactive shell. Here a shell ignores SIGINT, then Python loads the suite's conftest and
    starts a child that reports its disposition; without the conftest's reset the child inherits SIG_IGN."""
    tests = Path(__file__).resolve().parent
    probe = ("import signal, subprocess, sys; sys.path.insert(0, sys.argv[1]); "
             "before = signal.getsignal(signal.SIGINT); import conftest; "
             "child = subprocess.run([sys.executable, '-c', 'import signal; print(signal.getsignal(signal.SIGINT))'], "
             "capture_output=True, text=True, check=True).stdout.strip(); print(before is signal.SIG_IGN, child)")
    proc = subprocess.run(["sh", "-c", 'trap "" INT; exec "$0" -c "$1" "$2"', sys.executable, probe, str(tests)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    before, child = proc.stdout.strip().split(" ", 1)
    assert before == "True"                                # the shell did ignore it: the case is the one meant
    assert child == "<built-in function default_int_handler>", proc.stdout
