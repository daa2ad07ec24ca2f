"""Determinism matrix: every experiment's quick profile gives the same bits on every scheduler,
chunking and worker count (issue: sweeps that survive)."""
import importlib

import numpy as np
import pytest

from sfxlin.cli import EXPERIMENTS
from sfxlin.execution import compute
from sfxlin.sweep import build

MODULES = sorted(EXPERIMENTS.values())


def _quick(name):
    module = importlib.import_module(f"sfxlin.pipelines.{name}")
    return module, module.PROFILES["quick"]


def _assert_same_bits(a, b):
    assert set(a.data_vars) == set(b.data_vars)
    for var in a.data_vars:
        np.testing.assert_array_equal(a[var].values, b[var].values, err_msg=var)


@pytest.fixture(scope="module", params=MODULES)
def reference(request):
    module, config = _quick(request.param)
    ds, _, _ = compute(build(module.EXPERIMENT, config), scheduler="synchronous", progress=False)
    return module, config, ds


def _chunkings(module, config):
    grid = module.EXPERIMENT.grid(config)
    last = list(grid)[-1]
    return [{}, {last: len(grid[last])}, {dim: len(values) for dim, values in grid.items()}]


@pytest.mark.slow
@pytest.mark.parametrize("scheduler", ["threads", "processes"])
@pytest.mark.parametrize("chunking", [0, 1, 2])
def test_local_schedulers_and_chunkings(reference, scheduler, chunking):
    module, config, ref = reference
    chunks = _chunkings(module, config)[chunking]
    ds, _, label = compute(build(module.EXPERIMENT, config, chunks=chunks), scheduler=scheduler, progress=False)
    _assert_same_bits(ds, ref)
    assert label == scheduler or label.startswith(scheduler)


@pytest.mark.slow
@pytest.mark.parametrize("workers", [1, 2])
def test_distributed_worker_counts(reference, workers):
    module, config, ref = reference
    chunks = _chunkings(module, config)[workers]
    ds, _, label = compute(build(module.EXPERIMENT, config, chunks=chunks), workers=workers, progress=False)
    _assert_same_bits(ds, ref)
    assert f"n_workers={workers}" in label
