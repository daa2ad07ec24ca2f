"""An external dask cluster, as a user starts one: ``dask scheduler`` and ``dask worker`` processes
started from the command line in *other* working directories than the ``sfxlin run`` client, all
on 127.0.0.1. The run keeps its cells where the user asked (a relative ``--out`` in the client's
folder, none in the workers'), an interrupted run's count is the truth and the same command
resumes only the rest, the results are the local run's bits, a worker running a patched copy of
the package is refused before any cell is kept, and an input file the workers read differently
is refused before any work, naming the path."""
from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

from sfxlin.testing import assert_same_results

distributed = pytest.importorskip("distributed")

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
#: a relative token file (read by the workers in the client's folder) and cells of ~0.3 CPU s, so
#: that a run can be interrupted midway
C1 = ["run", "c1", "--no-figure", "--set", "tokens=own/tokens.npy", "--set", "d=3", "--set", "U_norm=0.1,0.5", "--set", "n_seeds=2",
      "--set", "n_prompts=32", "--set", "L=16,64,256,1024,4096"]
N_CELLS = 5   # 2 U_norm x 2 seeds, and the one cell of the non-Gaussian bias part
IGNORE = ("created", "history", "wall_seconds", "scheduler", "git_revision", "cell_timeline", "cell_seconds")


def _client_folder(path):
    """A client's working folder holding ``own/tokens.npy`` (the same tokens in every folder)."""
    (path / "own").mkdir(parents=True)
    np.save(path / "own/tokens.npy", np.random.default_rng(0).standard_normal((2000, 3)))
    return path


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",)}
    env.update(extra)
    return env


@contextlib.contextmanager
def _cluster(root, n_workers=2, worker_env=None, deadline=60):
    """A ``dask scheduler`` (cwd ``root/scheduler``) and ``n_workers`` ``dask worker`` processes
    (cwd ``root/workers``), single-threaded; yields ``(address, worker_folder)``."""
    sched_dir, work_dir = root / "scheduler", root / "workers"
    sched_dir.mkdir(parents=True)
    work_dir.mkdir()
    info = sched_dir / "scheduler.json"
    procs = [subprocess.Popen([str(BIN / "dask"), "scheduler", "--host", "127.0.0.1", "--port", "0",
                               "--no-dashboard", "--scheduler-file", str(info)], cwd=sched_dir, env=_env(),
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    try:
        end = time.time() + deadline
        while not info.exists() and time.time() < end:
            time.sleep(0.1)
        assert info.exists(), "the dask scheduler did not start"
        for _ in range(n_workers):
            procs.append(subprocess.Popen([str(BIN / "dask"), "worker", "--scheduler-file", str(info), "--nthreads",
                                           "1", "--nworkers", "1", "--no-dashboard", "--no-nanny",
                                           "--local-directory", str(work_dir / "dask")],
                                          cwd=work_dir, env=worker_env or _env(),
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        with distributed.Client(scheduler_file=str(info), timeout="30s") as client:
            client.wait_for_workers(n_workers, timeout=max(1.0, end - time.time()))
            address = client.scheduler.address
        yield address, work_dir
    finally:
        for p in procs:   # nothing of theirs is kept: no need to wait for a graceful close
            p.kill()
            p.wait()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with _cluster(tmp_path_factory.mktemp("external")) as found:
        yield found


@pytest.fixture(scope="module")
def local_run(tmp_path_factory):
    """The reference: the same sweep on local threads."""
    folder = _client_folder(tmp_path_factory.mktemp("local"))
    _sfxlin([*C1, "--out", "out", "--quiet", "--local-scheduler", "threads"], cwd=folder)
    return xr.load_dataset(folder / "out/c1_limit.nc")


def _sfxlin(args, cwd, check=True, timeout=240):
    proc = subprocess.run([str(BIN / "sfxlin"), *args], cwd=cwd, env=_env(), capture_output=True, text=True,
                          timeout=timeout)
    if check:
        assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def _kept(folder):
    return sorted(Path(folder).glob("cell_*.npz"))


@pytest.mark.slow
def test_cells_land_in_the_clients_relative_out_with_the_local_bits(cluster, local_run, tmp_path):
    """A relative ``--out`` and a relative input file, both in the client's folder: the cells are
    kept there (none in the workers' folder), the file has the local run's bits, and the progress
    is whole lines in cells."""
    address, worker_dir = cluster
    client_dir = _client_folder(tmp_path / "client")
    proc = _sfxlin([*C1, "--out", "runs/x", "--scheduler", address], cwd=client_dir)
    assert len(_kept(client_dir / "runs/x/.c1_limit.cells")) == N_CELLS
    assert not list(worker_dir.rglob("cell_*.npz")) and not list(worker_dir.rglob("*.cells"))
    ds = xr.load_dataset(client_dir / "runs/x/c1_limit.nc")
    assert ds.attrs["scheduler"] == f"distributed:{address}"
    assert_same_results(ds, local_run, ignore=IGNORE)
    lines = [line for line in proc.stderr.splitlines() if re.match(r"\d+/\d+ cells", line)]
    assert "\r" not in proc.stderr
    assert lines[0].startswith(f"0/{N_CELLS} cells") and lines[-1].startswith(f"{N_CELLS}/{N_CELLS} cells")
    elapsed = int(re.search(r"cells, (\d+) s elapsed", lines[-1]).group(1))
    assert len(lines) <= N_CELLS + 1 + elapsed // 30   # a line per cell at most, and a heartbeat per 30 s
    assert "dask dashboard: none served at http://127.0.0.1:" in proc.stderr   # the scheduler runs --no-dashboard


@pytest.mark.slow
def test_ctrl_c_counts_the_kept_cells_and_the_same_command_resumes_the_rest(cluster, local_run, tmp_path):
    address, _ = cluster
    client_dir = _client_folder(tmp_path / "client")
    args = [*C1, "--out", "runs/y", "--scheduler", address]
    proc = subprocess.Popen([str(BIN / "sfxlin"), *args], cwd=client_dir, env=_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    store = client_dir / "runs/y/.c1_limit.cells"
    end = time.time() + 120
    while len(_kept(store)) < 2 and time.time() < end and proc.poll() is None:
        time.sleep(0.02)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode != 0, "the run finished before it could be interrupted"
    said = re.search(r"(\d+) of (\d+) cells kept in (\S+);", err)
    assert said, err[-2000:]
    kept = len(_kept(store))
    assert int(said.group(1)) == kept and int(said.group(2)) == N_CELLS and 2 <= kept < N_CELLS
    assert Path(said.group(3)) == store.absolute()
    again = _sfxlin(args, cwd=client_dir)
    assert f"({kept} kept from earlier runs in {store.absolute()}, {N_CELLS - kept} to compute)" in again.stdout
    assert_same_results(xr.load_dataset(client_dir / "runs/y/c1_limit.nc"), local_run, ignore=IGNORE)


def _patched_copy(root):
    """A copy of the package laid out as installed (``sfxlin``, ``sfxlin/pipelines``,
    ``sfxlin/analysis``) with one kernel module changed: what a worker finds first on its
    PYTHONPATH."""
    pkg = root / "sfxlin"
    shutil.copytree(REPO / "sfxlin", pkg, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(REPO / "pipelines", pkg / "pipelines", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(REPO / "analysis", pkg / "analysis", ignore=shutil.ignore_patterns("__pycache__"))
    core = pkg / "softmax_core.py"
    core.write_text(core.read_text() + "\nCACHE_BYTES = CACHE_BYTES // 2  # a worker's local edit\n")
    return root


@pytest.mark.slow
def test_a_worker_running_a_patched_copy_is_refused_before_any_cell_is_kept(tmp_path):
    patched = _patched_copy(tmp_path / "patched")
    with _cluster(tmp_path / "mixed", n_workers=1, worker_env=_env(PYTHONPATH=str(patched))) as (address, _):
        proc = _sfxlin([*C1, "--out", "runs/z", "--scheduler", address], cwd=_client_folder(tmp_path / "client"),
                       check=False)
    assert proc.returncode != 0
    assert "runs other code than this client" in proc.stderr and "code: " in proc.stderr, proc.stderr[-2000:]
    assert re.search(r"worker tcp://127\.0\.0\.1:\d+", proc.stderr)
    assert not _kept(tmp_path / "client/runs/z/.c1_limit.cells")


@pytest.mark.slow
def test_an_input_file_changed_before_the_cells_run_is_refused_naming_it(cluster, tmp_path):
    """The workers check every input file against the digest the client took at configure time,
    before any cell runs (a file that differs where the workers read it)."""
    from sfxlin.engine.cellstore import CellStore
    from sfxlin.engine.cluster import WorkerMismatch
    from sfxlin.engine.execution import compute
    from sfxlin.engine.sweep import build
    from sfxlin.pipelines import c1_limit

    address, _ = cluster
    tokens = tmp_path / "tokens.npy"
    np.save(tokens, np.random.default_rng(0).standard_normal((500, 3)))
    exp = c1_limit.EXPERIMENT
    config = exp.configure("quick", [f"tokens={tokens}", "d=3", "U_norm=0.5", "n_seeds=1"])
    store = CellStore(tmp_path / "cells", exp, config)
    lazy = build(exp, config, store=store)
    np.save(tokens, np.random.default_rng(1).standard_normal((500, 3)))
    with pytest.raises(WorkerMismatch, match=rf"tokens: worker tcp://127.0.0.1:\d+ '{re.escape(str(tokens))}' has "
                                             r"sha256 \w+, not the configured"):
        compute(lazy, address=address, store=store, progress=False)
    assert not _kept(tmp_path / "cells")


def test_a_cell_store_is_not_written_by_a_worker(cluster, tmp_path):
    """Computing a store-backed Dataset on a cluster without handing the store to compute: the
    worker's write is refused loudly instead of landing in its own folder."""
    from sfxlin.engine.cellstore import CellStore, WorkerWriteError
    from sfxlin.engine.sweep import build
    from sfxlin.pipelines import c1_limit

    address, _ = cluster
    exp = c1_limit.EXPERIMENT
    config = exp.configure("quick", ["d=2", "U_norm=0.1", "n_seeds=1"])
    lazy = build(exp, config, store=CellStore(tmp_path / "cells", exp, config))
    with distributed.Client(address, timeout="20s"), pytest.raises(WorkerWriteError, match="written by the client"):
        lazy.compute()
