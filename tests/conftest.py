"""Shared fixtures: the toy experiment, a laziness guard, a computed toy dataset; one fresh JAX
compilation cache for the whole run."""
from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile
from pathlib import Path

import pytest

# a suite started in the background by a non-interactive shell (`make test &`, `nohup`, a runner that
# starts jobs so) inherits SIGINT ignored, and so would every process it starts: the tests that interrupt a
# run with SIGINT (tests/test_cli_nothing_lost.py, tests/test_external_cluster.py) would find it ignored,
# as a background job's is, and fail. A handler installed here is reset to the default in every child at
# exec, so each child turns SIGINT into KeyboardInterrupt, as a user's run at a terminal does
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# the toy experiment lives beside the tests; make it importable whatever the import mode
# (worker processes inherit sys.path through multiprocessing's spawn preparation data)
sys.path.insert(0, str(Path(__file__).resolve().parent))

import toy_experiment  # noqa: E402

# one JAX compilation cache (sfxlin.models._jax) for every process of this run, made here by the
# controlling process before any imports JAX: xdist workers, pool workers and CLI subprocesses
# inherit it through the environment, so a program compiled by one is loaded by the others; fresh,
# so no run of the suite depends on a cache an earlier run left, or writes into the user's
# (SFXLIN_JAX_CACHE set beforehand is kept: =off measures the suite without the cache)
if "PYTEST_XDIST_WORKER" not in os.environ and "SFXLIN_JAX_CACHE" not in os.environ:
    _JAX_CACHE = tempfile.mkdtemp(prefix="sfxlin-tests-jax-cache-")
    os.environ["SFXLIN_JAX_CACHE"] = _JAX_CACHE

    def pytest_unconfigure(config):
        shutil.rmtree(_JAX_CACHE, ignore_errors=True)


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
