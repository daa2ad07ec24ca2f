"""Shared fixtures: the toy experiment, a laziness guard, a computed toy dataset."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

# the toy experiment lives beside the tests; make it importable whatever the import mode
# (worker processes inherit sys.path through multiprocessing's spawn preparation data)
sys.path.insert(0, str(Path(__file__).resolve().parent))

import toy_experiment  # noqa: E402


from sfxlin.testing import DaskComputed, raise_if_dask_computes  # noqa: E402,F401  (re-exported for the tests)


@pytest.fixture(scope="session")
def toy():
    return toy_experiment


@pytest.fixture
def toy_config():
    return toy_experiment.make_config()


@pytest.fixture(scope="session")
def toy_computed():
    """The toy experiment computed once, synchronously, one task per cell."""
    from sfxlin.engine.sweep import build

    return build(toy_experiment.EXPERIMENT, toy_experiment.make_config()).compute(scheduler="synchronous")
