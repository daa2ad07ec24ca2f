"""A dask.distributed worker killed mid-sweep: the sweep still completes, with identical bits; a
run killed on the local process pool leaves no worker behind."""
import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from sfxlin.pipelines import c1_limit
from sfxlin.engine.sweep import build

distributed = pytest.importorskip("distributed")


def _kill(pid):
    os.kill(pid, 9)


@pytest.mark.slow
def test_killing_a_worker_mid_sweep_changes_nothing():
    # 8 cells of ~0.2 CPU s on 2 workers: the kill after 2 finished leaves at least 4 not started
    config = {**c1_limit.EXPERIMENT.configure("quick"), "n_prompts": 16, "L": [16, 64, 256, 1024, 4096]}
    reference = build(c1_limit.EXPERIMENT, config).compute(scheduler="threads")
    lazy = build(c1_limit.EXPERIMENT, config)
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster, \
            distributed.Client(cluster) as client:
        persisted = lazy.persist()
        futures = distributed.futures_of(persisted.mse)  # one chunk per cell
        assert len(futures) == 8
        deadline = time.time() + 60
        while time.time() < deadline and sum(f.done() for f in futures) < 2:
            time.sleep(0.02)
        done_before = sum(f.done() for f in futures)
        assert done_before < len(futures), "the sweep finished before a worker could be killed"
        victim = list(client.scheduler_info()["workers"])[0]
        pid = client.run(os.getpid, workers=[victim])[victim]
        _kill(pid)  # SIGKILL: no goodbye, the scheduler notices the lost connection
        result = persisted.compute()
    for name in reference.data_vars:
        np.testing.assert_array_equal(result[name].values, reference[name].values, err_msg=name)


# --------------------------------------------------------------------------------------------
# the local process pool's workers do not outlive the run that started them
# --------------------------------------------------------------------------------------------
def _stat_fields(pid):
    """The fields of /proc/PID/stat after the command name (state first, parent pid second), or
    None for a process that is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2:].split()


def _pool_workers(parent):
    """The pids of the multiprocessing workers (``spawn_main``) whose parent is ``parent``."""
    found = []
    for entry in Path("/proc").iterdir():
        fields = entry.name.isdigit() and _stat_fields(entry.name)
        if fields and int(fields[1]) == parent:
            with contextlib.suppress(OSError):
                if b"spawn_main" in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
    return found


def _alive(pid):
    fields = _stat_fields(pid)
    return fields is not None and fields[0] != "Z"  # a zombie has exited (its new parent may not reap it)


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="finds the workers through /proc")
def test_pool_workers_exit_when_the_run_is_killed(tmp_path):
    out = tmp_path / "out"
    cells = out / ".c1_limit.cells"
    proc = subprocess.Popen([sys.executable, "-m", "sfxlin.cli", "run", "c1", "--quiet", "--out", str(out),
                             "--local-scheduler", "processes", "--set", "n_prompts=96", "--set", "n_seeds=3",
                             "--set", "L=16,64,256,1024,4096"])
    workers = []
    try:
        deadline = time.time() + 120
        while time.time() < deadline and not (workers and list(cells.glob("cell_*.npz"))):
            workers = _pool_workers(proc.pid)
            time.sleep(0.05)
        assert workers and proc.poll() is None, "the run ended before its workers could be seen at work"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        assert not (out / "c1_limit.nc").exists(), "the kill landed after the pool had finished"
        deadline = time.time() + 10
        while time.time() < deadline and any(_alive(pid) for pid in workers):
            time.sleep(0.1)
        assert not [pid for pid in workers if _alive(pid)], "pool workers outlived the run that started them"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pid in workers:
            with contextlib.suppress(ProcessLookupError):
                if _alive(pid):  # left behind: not left running after the test either
                    os.kill(pid, signal.SIGKILL)
