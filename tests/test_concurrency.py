"""Shared objects hit by many threads at once: every object a cell can receive from another cell
(a law and its lazily built values, a kernel, a head's set-up, a token set, a cached quadrature rule,
a cached file) is built cold, then called by many threads released together through a barrier. No
thread may see it half-built (an error), and every thread gets the bits of a serial call on a fresh
object (the same arithmetic: exact equality).

The thread switch interval is shortened while the threads run, so an unsafe lazy build is
interleaved on nearly every trial (the ``Empirical`` support race of 4fd69e5 fails here every run).
Every ``functools.lru_cache`` in sfxlin must have a case below: a new cache without one fails
:func:`test_every_cache_has_a_stress_case`.
"""
from __future__ import annotations

import functools
import importlib
import pkgutil
import sys
import threading

import numpy as np
import pytest

import sfxlin
from sfxlin import kernels, laws, quadrature, realdata

N_THREADS = 8
TRIALS = 4


@pytest.fixture(autouse=True)
def _fast_switching():
    """Switch threads every microsecond (default 5 ms), so that races show up on most trials."""
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(old)


def hammer(call, n_threads=N_THREADS):
    """``call()`` from ``n_threads`` threads released together; their results (an exception is
    re-raised in the caller, the first one found)."""
    barrier = threading.Barrier(n_threads)
    results, errors = [None] * n_threads, [None] * n_threads

    def run(i):
        barrier.wait()
        try:
            results[i] = call()
        except BaseException as exc:  # noqa: BLE001 (re-raised below)
            errors[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for exc in errors:
        if exc is not None:
            raise exc
    return results


def assert_identical(results, reference):
    """Every result equals ``reference`` bit for bit (arrays, tuples, dicts of arrays)."""
    for r in results:
        _identical(r, reference)


def _identical(a, b):
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            _identical(a[k], b[k])
    elif isinstance(a, (tuple, list)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _identical(x, y)
    elif isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        np.testing.assert_array_equal(a, b, strict=True)
    else:
        assert a == b


# --------------------------------------------------------------------------------------- laws
def _samples():
    """100,000 skewed tokens in R^3: a support large enough that its build takes a while."""
    Z = np.random.default_rng(1).standard_normal((100_000, 3))
    Z[:, 0] = np.exp(0.5 * Z[:, 0])
    return Z


_SAMPLES = _samples()
_WEIGHTS = np.random.default_rng(2).random(_SAMPLES.shape[0])


def _make_law(name):
    if name == laws.Empirical.name:
        return laws.Empirical(_SAMPLES)
    return laws.LAWS[name].isotropic(3)


LAW_CASES = [*laws.LAWS, "empirical-weighted"]


def _fresh_law(case):
    return laws.Empirical(_SAMPLES, weights=_WEIGHTS) if case == "empirical-weighted" else _make_law(case)


def _law_calls(law):
    """Every value a cell reads from a law (the lazily built ones first touched here)."""
    a = np.array([[0.3, -0.2, 0.1], [0.05, 0.4, -0.3]])
    out = {"mean": law.mean, "sample": law.sample(np.random.default_rng(5), (4, 6))}
    try:
        out["cov"] = law.cov
    except ValueError:  # an infinite covariance (Student-t with df <= 2): refused alike every time
        out["cov"] = None
    if law.has_limit:
        out["tilted_mean"] = law.tilted_mean(a)
        out["snis_covariance"] = law.snis_covariance(a)
    return out


def test_every_law_is_covered():
    assert set(laws.LAWS) <= set(LAW_CASES)


@pytest.mark.parametrize("case", LAW_CASES)
@pytest.mark.parametrize("first", ["tilted_mean", "mean", "cov", "snis_covariance"])
def test_a_fresh_law_from_many_threads(case, first):
    """A fresh law, every thread first touching ``first`` (each lazy value built under contention)."""
    reference = _law_calls(_fresh_law(case))
    a = np.array([[0.3, -0.2, 0.1]])
    for _ in range(TRIALS):
        law = _fresh_law(case)

        def call():
            if first in ("tilted_mean", "snis_covariance") and law.has_limit:
                getattr(law, first)(a)
            elif first in ("mean", "cov"):
                try:
                    getattr(law, first)
                except ValueError:
                    pass
            return _law_calls(law)

        assert_identical(hammer(call), reference)


def test_published_law_values_are_read_only():
    """A cached value handed to several cells cannot be changed in place by one of them."""
    law = laws.Empirical(_SAMPLES[:1000])
    for value in (law.mean, law.cov, law.samples):
        with pytest.raises(ValueError, match="read-only"):
            value[0] = 1.0


# -------------------------------------------------------------------------------------- kernels
@pytest.mark.parametrize("name", kernels.KERNEL_NAMES)
def test_a_kernel_from_many_threads(name):
    kern = kernels.Kernel(name)
    r = np.array([0.3, 1.0, 2.5])
    rng = np.random.default_rng(3)
    Z, U, q = rng.standard_normal((2, 64, 3)), 0.3 * rng.standard_normal((3, 3)), rng.standard_normal((2, 3))
    Ls = [8, 32, 64]

    def call():
        return (kern.moments(r, L=64), kern.gain(r, L=64),
                kernels.kernel_attention_prefix(Z, U, np.eye(3), q, Ls, kern))

    reference = call()
    for _ in range(2):
        quadrature._normal_rule.cache_clear()
        assert_identical(hammer(call), reference)


# ------------------------------------------------------------------------------ cached rules
def test_a_quadrature_rule_from_a_cold_cache():
    def call():
        return quadrature.normal_expectation(np.tanh, np.array([0.5, 1.5]), n_nodes=61), quadrature._normal_rule(61)

    reference = call()
    for _ in range(TRIALS):
        quadrature._normal_rule.cache_clear()
        assert_identical(hammer(call), reference)


def test_a_token_set_from_a_cold_cache():
    name = realdata.DATASETS[0]

    def call():
        Z = realdata.token_set(name, 3)
        assert not Z.flags.writeable
        return Z

    reference = call()
    for _ in range(3):
        realdata._token_set.cache_clear()
        assert_identical(hammer(call), reference)


def test_a_hashed_file_from_a_cold_cache(tmp_path):
    path = tmp_path / "t.npy"
    np.save(path, _SAMPLES[:5000])
    reference = realdata.file_sha256(path)
    for _ in range(TRIALS):
        realdata._sha256.cache_clear()
        assert hammer(lambda: realdata.file_sha256(path)) == [reference] * N_THREADS


# ------------------------------------------------------------------------ cells of the pipelines
@pytest.fixture(scope="module")
def own_files(tmp_path_factory):
    root = tmp_path_factory.mktemp("concurrent-own")
    rng = np.random.default_rng(7)
    Z = rng.standard_normal((200_000, 3))
    Z[:, 0] = np.exp(0.5 * Z[:, 0])
    files = {"tokens": root / "tokens.npy", "U": root / "u.npy"}
    np.save(files["tokens"], Z)
    np.save(files["U"], 0.2 * rng.standard_normal((3, 3)))
    return {k: str(v) for k, v in files.items()}


def _clear_pipeline_caches(module):
    from sfxlin.pipelines.families import c1

    for obj in (*vars(module).values(), *vars(c1).values()):   # the variant's caches and its family's
        if callable(getattr(obj, "cache_clear", None)):
            obj.cache_clear()
    realdata._sha256.cache_clear()


@pytest.mark.parametrize("part", ["", "exact"])
def test_c1_own_cells_share_a_cold_set_up(own_files, part):
    """The failing path of the paper run: cells on threads sharing one cached head set-up (its
    empirical law built lazily by the first cell to need it)."""
    from sfxlin.engine.sweep import run_cell
    from sfxlin.pipelines import c1_own

    exp = c1_own.EXPERIMENT
    config = exp.configure("quick", [f"tokens={own_files['tokens']}", f"U={own_files['U']}", "n_queries=3",
                                     "L=4,16,64", "n_prompts=2", "prompt_chunk=2"])
    cell = {} if part else {"sampling": "iid", "seed": 0}
    _clear_pipeline_caches(c1_own)
    reference = run_cell(exp, config, cell, part)
    for cold in (True, False):
        for _ in range(2):
            _clear_pipeline_caches(c1_own)
            if not cold:  # as configure leaves it: the set-up cached, its law's support not yet built
                c1_own.setup(config)
            assert_identical(hammer(lambda: run_cell(exp, config, cell, part)), reference)


def test_c1_limit_cells_share_a_cold_token_file(own_files):
    from sfxlin.engine.sweep import run_cell
    from sfxlin.pipelines import c1_limit

    exp = c1_limit.EXPERIMENT
    config = exp.configure("quick", [f"tokens={own_files['tokens']}", "d=3"])
    cell = dict(next(iter(_cells(exp, config))))
    _clear_pipeline_caches(c1_limit)
    reference = run_cell(exp, config, cell)
    for _ in range(2):
        _clear_pipeline_caches(c1_limit)
        assert_identical(hammer(lambda: run_cell(exp, config, cell), n_threads=4), reference)


def test_c1_real_cells_share_a_cold_token_set():
    from sfxlin.engine.sweep import run_cell
    from sfxlin.pipelines import c1_real

    exp = c1_real.EXPERIMENT
    config = exp.configure("quick")
    cell = dict(next(iter(_cells(exp, config))))
    reference = run_cell(exp, config, cell)
    for _ in range(2):
        realdata._token_set.cache_clear()
        assert_identical(hammer(lambda: run_cell(exp, config, cell), n_threads=4), reference)


def _cells(exp, config):
    """The main part's cells of ``config`` as dicts of coordinate values."""
    import itertools

    grid = exp.part("").grid(config)
    for values in itertools.product(*grid.values()):
        yield dict(zip(grid, values))


# ----------------------------------------------------------------------- every cache has a case
CASES = {
    "sfxlin.quadrature._normal_rule": test_a_quadrature_rule_from_a_cold_cache,
    "sfxlin.realdata._token_set": test_a_token_set_from_a_cold_cache,
    "sfxlin.realdata._sha256": test_a_hashed_file_from_a_cold_cache,
    "sfxlin.pipelines.families.c1._read": test_c1_limit_cells_share_a_cold_token_file,
    "sfxlin.pipelines.c1_own._setup": test_c1_own_cells_share_a_cold_set_up,
}
"""Each ``lru_cache`` that hands a value to cells, and the test that hammers it from a cold cache."""

NOT_CELL_VALUES = {
    "sfxlin.engine.cellstore.code_fingerprint": "a str, read by the client before any cell runs",
    "sfxlin.models.optimise._optimizer": "an optax optimiser (immutable pure functions), made per process",
    "sfxlin.models.optimise._update": "a jax.jit function; JAX's compiled functions are thread-safe",
}
"""Caches whose value is immutable or never shared by cells, with the reason."""


def _caches():
    """Every ``functools.lru_cache``-wrapped function defined in sfxlin's modules (JAX ones only
    when JAX is importable, models skipped otherwise)."""
    found = set()
    packages = [sfxlin, importlib.import_module("sfxlin.pipelines")]
    for package in packages:
        for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            if info.name.startswith(("sfxlin.pipelines.", "sfxlin.analysis")) and package is sfxlin:
                continue
            try:
                module = importlib.import_module(info.name)
            except ImportError:
                continue
            for name, obj in vars(module).items():
                if isinstance(obj, functools._lru_cache_wrapper) and obj.__module__ == info.name:
                    found.add(f"{info.name}.{name}")
    return found


def test_every_cache_has_a_stress_case():
    caches = _caches()
    assert "sfxlin.pipelines.c1_own._setup" in caches  # the walk sees the pipelines
    missing = sorted(caches - set(CASES) - set(NOT_CELL_VALUES))
    assert not missing, f"lru_caches without a concurrency stress case in {__name__}: {missing}"
    stale = sorted((set(CASES) | set(NOT_CELL_VALUES)) - caches)
    assert not stale, f"cases for caches that no longer exist: {stale}"
