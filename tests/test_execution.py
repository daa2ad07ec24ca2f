"""Execution: local schedulers and a LocalCluster give the same numbers; the label says which."""
from __future__ import annotations

import os
import subprocess
import sys

import dask
import pytest
import xarray as xr

from conftest import raise_if_dask_computes
from sfxlin.engine.execution import compute, scheduler_label
from sfxlin.engine.sweep import CellError, build
from sfxlin.testing import assert_same_results


def _assert_bitwise_identical(a, b):
    assert_same_results(a, b)


@pytest.mark.parametrize("scheduler", [None, "threads", "synchronous", "processes"])
def test_local_schedulers(toy, toy_config, toy_computed, scheduler):
    ds = build(toy.EXPERIMENT, toy_config)
    before = toy.CALLS[0]
    result, wall, label = compute(ds, scheduler=scheduler, progress=False)
    _assert_bitwise_identical(result, toy_computed)
    for name in result.data_vars:
        assert not isinstance(result[name].data, dask.array.Array), name
    assert wall > 0
    assert label == (scheduler or f"threads({os.cpu_count()})")
    ran_here = toy.CALLS[0] - before
    assert ran_here == (0 if scheduler == "processes" else ds.attrs["n_cells"] - 1)  # the global cell is not counted
    assert isinstance(ds["value"].data, dask.array.Array)  # the input stays lazy


def test_progress_bar_counts_blocks_of_cells(toy, toy_config, capsys):
    ds = build(toy.EXPERIMENT, toy_config, chunks={"seed": 4})
    n_blocks = (ds.attrs["n_cells"] - 1) // 4 + 1  # blocks of 4 seeds, and the global part's cell
    compute(ds, scheduler="synchronous", progress=True)
    err = capsys.readouterr().err
    assert f"0/{n_blocks} tasks of cells" in err and f"{n_blocks}/{n_blocks} tasks of cells" in err
    assert "ETA" in err


def test_verbose_progress_names_the_finished_cells(toy, toy_config, capsys):
    ds = build(toy.EXPERIMENT, toy_config)
    compute(ds, scheduler="synchronous", progress=True, verbose=True)
    err = capsys.readouterr().err
    assert err.count("finished cells") == ds.attrs["n_cells"]  # the global part's cell too
    assert "seed[0:1]" in err and "finished cells global:" in err


def test_compute_propagates_cell_errors(toy):
    config = toy.make_config(fault="nan", fault_cell={"d": 2, "U_norm": 1.0, "seed": 3})
    with pytest.raises(CellError, match=r"toy\[d=2, U_norm=1.0, seed=3\]"):
        compute(build(toy.EXPERIMENT, config), scheduler="threads", progress=False)


@pytest.mark.slow
def test_local_cluster_matches_threads(toy, toy_config, toy_computed):
    ds = build(toy.EXPERIMENT, toy_config, chunks={"seed": 2})
    threads, _, _ = compute(ds, scheduler="threads", progress=False)
    before = toy.CALLS[0]
    cluster, wall, label = compute(ds, workers=2, progress=False)
    assert toy.CALLS[0] == before  # the cells ran in the worker processes, not here
    _assert_bitwise_identical(cluster, threads)
    _assert_bitwise_identical(cluster, toy_computed)
    assert label == "distributed:LocalCluster(n_workers=2)"
    assert wall > 0
    # the cluster is closed again: later computes use the local scheduler
    from distributed import default_client

    with pytest.raises(ValueError):
        default_client()


def test_scheduler_labels():
    assert scheduler_label() == f"threads({os.cpu_count()})"
    assert scheduler_label("synchronous") == "synchronous"
    assert scheduler_label(workers=4) == "distributed:LocalCluster(n_workers=4)"
    assert scheduler_label(address="tcp://node1:8786") == "distributed:tcp://node1:8786"


@pytest.mark.parametrize("kwargs, match", [
    ({"scheduler": "thread"}, "unknown scheduler 'thread'"),
    ({"scheduler": "distributed"}, "unknown scheduler"),
    ({"workers": 0}, "workers must be >= 1"),
    ({"workers": -2}, "workers must be >= 1"),
    ({"scheduler": "processes", "workers": 2}, "at most one of scheduler, workers and address, got scheduler and workers"),
    ({"scheduler": "threads", "address": "tcp://node1:8786"}, "got scheduler and address"),
    ({"workers": 2, "address": "tcp://node1:8786"}, "got workers and address"),
])
def test_bad_arguments(toy, toy_config, kwargs, match):
    ds = build(toy.EXPERIMENT, toy_config)
    with raise_if_dask_computes(), pytest.raises(ValueError, match=match):
        compute(ds, progress=False, **kwargs)


def test_the_cell_timeline_says_when_each_block_ran_and_on_which_thread(toy, toy_config):
    import json

    ds = build(toy.EXPERIMENT, toy_config, chunks={"seed": 2})
    result, wall, _ = compute(ds, scheduler="threads", progress=False)
    rows = json.loads(result.attrs["cell_timeline"])
    assert len(rows) == (ds.attrs["n_cells"] - 1) // 2 + 1  # every block, the global part's cell too
    assert {r[0] for r in rows} >= {"d[0:1],U_norm[0:1],seed[0:2]", "global:"}
    for block, thread, start, end in rows:
        assert 0 <= start <= end <= wall + 0.01 and isinstance(thread, int)


def test_a_process_pool_runs_the_cells_of_a_small_sweep_at_once(tmp_path):
    """dask's process pool hands up to ``chunksize`` (default 6) ready tasks to one process at a
    time: a sweep of <= 6 cells (C3's paper profile) then ran on one core. ``compute`` sets
    chunksize 1; the two cells of this experiment finish only if they run at the same time."""
    import rendezvous_experiment as rendezvous

    ds = build(rendezvous.EXPERIMENT, {"folder": str(tmp_path), "timeout": 60.0, "root_seed": 1})
    result, _, _ = compute(ds, scheduler="processes", progress=False)
    assert result["met"].values.tolist() == [1.0, 1.0]
    assert len({(tmp_path / s).read_text() for s in ("0", "1")}) == 2   # two worker processes


_FOLLOWER = """
import os, sys, time
from sfxlin.engine.execution import follow_parent
follow_parent(int(sys.argv[1]))
time.sleep(0.5)   # the watching thread sees the same parent all along
print("still here", flush=True)
"""


@pytest.mark.parametrize("parent, code, stdout", [("own", 0, "still here\n"), ("other", 1, "")])
def test_a_pool_worker_follows_the_process_that_started_it(parent, code, stdout):
    """``follow_parent(pid)`` (the process pool's initializer) ends the worker at once when its
    parent is not ``pid`` any more, and leaves it alone while it is."""
    pid = os.getpid() if parent == "own" else -1  # this process is the child's parent; no process is -1
    res = subprocess.run([sys.executable, "-c", _FOLLOWER, str(pid)], capture_output=True, text=True, timeout=120)
    assert (res.returncode, res.stdout) == (code, stdout), res.stderr


def test_progress_in_a_log_has_a_heartbeat_while_no_unit_finishes_and_stops_at_the_end():
    """A long cell must not leave a log silent: between begin and end a line is written every
    LINE_SECONDS even when nothing finishes; after end, nothing more."""
    import io
    import time

    from sfxlin.engine.execution import LineProgress

    stream = io.StringIO()
    progress = LineProgress("cells", stream=stream)
    progress.LINE_SECONDS = 0.05
    progress.begin(4)
    time.sleep(0.5)
    progress.advance()
    progress.end()
    lines = stream.getvalue().splitlines()
    waiting = [line for line in lines if line.startswith("0/4 cells, ")]
    assert len(waiting) >= 4, lines            # the start line and heartbeats while no cell finished
    assert lines[-1].startswith("1/4 cells, ") and "ETA" in lines[-1]
    time.sleep(0.2)
    assert stream.getvalue().splitlines() == lines   # the heartbeat ended with the progress
