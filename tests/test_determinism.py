"""Determinism matrix: every experiment's quick profile gives the same bits on every scheduler,
chunking and worker count (issue: sweeps that survive)."""
import dask
import distributed
import numpy as np
import pytest

from sfxlin.engine.execution import _process_pool, compute
from sfxlin.engine.experiments import experiments
from sfxlin.engine.sweep import build

MODULES = sorted(experiments())


def _quick(name):
    experiment = experiments()[name]
    return experiment, experiment.configure("quick")


def _assert_same_bits(a, b):
    assert set(a.data_vars) == set(b.data_vars)
    for var in a.data_vars:
        np.testing.assert_array_equal(a[var].values, b[var].values, err_msg=var)


@pytest.fixture(scope="module", params=MODULES)
def reference(request):
    experiment, config = _quick(request.param)
    ds, _, _ = compute(build(experiment, config), scheduler="synchronous", progress=False)
    return experiment, config, ds


def _chunkings(experiment, config):
    grid = experiment.part().grid(config)
    last = list(grid)[-1]
    return [{}, {last: len(grid[last])}, {dim: len(values) for dim, values in grid.items()}]


# every chunking on threads, and one chunking on processes (the chunking is the engine's; what an
# experiment can break is thread or process safety): 4 runs per experiment, not 7
@pytest.mark.slow
@pytest.mark.parametrize("chunking", [0, 1, 2])
def test_threads_at_every_chunking(reference, chunking):
    experiment, config, ref = reference
    chunks = _chunkings(experiment, config)[chunking]
    ds, _, label = compute(build(experiment, config, chunks=chunks), scheduler="threads", progress=False)
    _assert_same_bits(ds, ref)
    assert label == "threads"


@pytest.fixture(scope="module")
def on_processes():
    """Every experiment's quick profile (chunking 1) computed in one dask call on one process pool of the
    engine's own kind (``_process_pool``: what ``compute(scheduler="processes")`` runs on, whose own path
    tests/test_execution.py covers). What an experiment can break there is process safety (its cells
    pickled, run in spawned workers, their results pickled back), which one pool for all of them tests as
    one pool each would, for one pool's start-up (each worker imports the package) instead of thirteen."""
    builds = {}
    for name in MODULES:
        experiment, config = _quick(name)
        builds[name] = build(experiment, config, chunks=_chunkings(experiment, config)[1])
    with _process_pool("processes") as pool, \
            dask.config.set({"scheduler": "processes", "chunksize": 1, "pool": pool}):
        computed = dask.compute(*builds.values())
    return dict(zip(builds, computed))


@pytest.mark.slow
def test_a_process_pool(reference, on_processes):
    experiment, _, ref = reference
    _assert_same_bits(on_processes[experiment.name], ref)


@pytest.fixture(scope="module")
def cluster():
    """One LocalCluster of 2 single-threaded worker processes for every experiment (as
    ``compute(workers=2)`` starts; tests/test_execution.py covers that path): the experiments
    join it by address instead of paying a cluster start-up each."""
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=None) as c:
        yield c


@pytest.mark.slow
def test_distributed_worker_counts(reference, cluster):
    experiment, config, ref = reference
    workers = len(cluster.workers)
    chunks = _chunkings(experiment, config)[workers]
    ds, _, label = compute(build(experiment, config, chunks=chunks), address=cluster.scheduler_address,
                           progress=False)
    _assert_same_bits(ds, ref)
    assert label == f"distributed:{cluster.scheduler_address}" and workers == 2
