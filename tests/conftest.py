"""Shared fixtures: the toy experiment, a laziness guard, a computed toy dataset."""
from __future__ import annotations

import contextlib
import sys
from pathlib import Path

import dask
import pytest

# the toy experiment lives beside the tests; make it importable whatever the import mode
# (worker processes inherit sys.path through multiprocessing's spawn preparation data)
sys.path.insert(0, str(Path(__file__).resolve().parent))

import toy_experiment  # noqa: E402


class DaskComputed(AssertionError):
    """Raised by :func:`raise_if_dask_computes` when something computes."""


@contextlib.contextmanager
def raise_if_dask_computes(max_computes=0):
    """Fail if dask computes more than ``max_computes`` times inside the block (as in flox)."""
    total = {"n": 0}

    def scheduler(dsk, keys, **kwargs):
        total["n"] += 1
        if total["n"] > max_computes:
            raise DaskComputed(f"dask computed {total['n']} time(s), {max_computes} allowed")
        return dask.get(dsk, keys, **kwargs)

    with dask.config.set(scheduler=scheduler):
        yield total


@pytest.fixture(scope="session")
def toy():
    return toy_experiment


@pytest.fixture
def toy_config():
    return toy_experiment.make_config()


@pytest.fixture(scope="session")
def toy_computed():
    """The toy experiment computed once, synchronously, one task per cell."""
    from sfxlin.sweep import build

    return build(toy_experiment.EXPERIMENT, toy_experiment.make_config()).compute(scheduler="synchronous")
