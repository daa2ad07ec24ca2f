"""One law table for every experiment: ``laws.covariate_law(spec, Sigma, mean)`` names the
covariates of C2, C3, the landscape and the deep models by any law of ``laws.LAWS``.

* the Gaussian and Rademacher draws are the numbers of the documented draw (written here by hand
  from the generator), so the shipped experiments keep their data bit for bit;
* every law built with a covariance has that covariance and mean (closed form and Monte Carlo);
* a law that cannot serve is refused with one message naming the spec;
* a law defined after the import serves C2 with no pipeline touched;
* C3 runs on empirical covariates (the ``covariates`` file of ``c3_transfer``).
"""
from __future__ import annotations

import numpy as np
import pytest

from sfxlin import icl, laws, training
from sfxlin.engine.cellstore import cell_fingerprint
from sfxlin.laws import LAWS, Empirical, Rademacher, covariate_law
from sfxlin.pipelines import c2_threshold, c3_transfer
from sfxlin.engine.sweep import cell_rng, run_cell

FULL = np.array([[2.0, 0.3, 0.1], [0.3, 1.0, -0.2], [0.1, -0.2, 0.5]])
DIAG = np.array([2.0, 1.0, 0.5])
SHAPE = (4, 5)


def _root(Sigma):
    """The symmetric square root by eigen-decomposition, as docs/tasks.md states for Rademacher."""
    lam, Q = np.linalg.eigh(Sigma)
    return (Q * np.sqrt(np.clip(lam, 0.0, None))) @ Q.T


# --------------------------------------------------------------------------- the shipped draws


@pytest.mark.parametrize("Sigma", [DIAG, np.diag(DIAG)], ids=["vector", "diagonal matrix"])
@pytest.mark.parametrize("mean", [None, np.array([0.5, -1.0, 2.0])], ids=["centred", "mean"])
def test_gaussian_draws_are_mean_plus_scaled_standard_normals(Sigma, mean):
    g = np.random.default_rng(5).standard_normal(SHAPE + (3,))
    expected = (0.0 if mean is None else mean) + g * np.sqrt(DIAG)
    got = covariate_law("gaussian", Sigma, mean).sample(np.random.default_rng(5), SHAPE)
    assert np.array_equal(got, expected)


def test_gaussian_draws_with_a_full_covariance_are_standard_normals_times_its_eigen_root():
    lam, Q = np.linalg.eigh(FULL)
    g = np.random.default_rng(6).standard_normal(SHAPE + (3,))
    expected = g @ (Q * np.sqrt(lam)).T
    assert np.array_equal(covariate_law("gaussian", FULL).sample(np.random.default_rng(6), SHAPE), expected)


@pytest.mark.parametrize("Sigma", [FULL, np.diag(DIAG), DIAG], ids=["full", "diagonal", "vector"])
def test_rademacher_draws_are_packed_random_signs_times_the_symmetric_root(Sigma):
    n = int(np.prod(SHAPE)) * 3
    rng = np.random.default_rng(8)
    bits = np.unpackbits(rng.integers(0, 256, size=(n + 7) // 8, dtype=np.uint8), count=n)
    r = (2.0 * bits - 1.0).reshape(SHAPE + (3,))
    S = _root(np.diag(Sigma) if np.ndim(Sigma) == 1 else Sigma)
    expected = r @ S.T
    law = covariate_law("rademacher", Sigma)
    assert np.array_equal(law.sample(np.random.default_rng(8), SHAPE), expected)
    np.testing.assert_allclose(law.cov, S @ S.T, rtol=0, atol=0)


def test_a_zero_mean_is_the_centred_law_for_a_centred_family():
    a = covariate_law("rademacher", FULL, np.zeros(3)).sample(np.random.default_rng(1), 6)
    assert np.array_equal(a, covariate_law("rademacher", FULL).sample(np.random.default_rng(1), 6))


# --------------------------------------------------------------------------- moments of every law

MEAN = np.array([0.5, -1.0, 0.25])
SPECS = [("gaussian", MEAN), ("gaussian", None), ("rademacher", None), ("uniform", None), ("student_t:10", None),
         ("gaussian_mixture:0.6", MEAN), ("gaussian_mixture", None)]


def test_every_law_with_a_covariance_member_is_a_spec():
    """The specs below cover every law of LAWS but the empirical one (built from samples, tested below)
    and the AR(1) one (C1 only: refused below)."""
    assert {spec.partition(":")[0] for spec, _ in SPECS} == set(LAWS) - {"empirical", "ar1"}


def test_the_ar1_law_is_refused_as_covariates():
    """Its tokens are dependent along the prompt axis; the tasks draw i.i.d. covariates and queries."""
    with pytest.raises(ValueError, match="covariate law 'ar1:0.5': the ar1 law's tokens are dependent .* C1 only"):
        covariate_law("ar1:0.5", FULL)


@pytest.mark.parametrize("spec, mean", SPECS)
def test_the_law_has_the_covariance_and_mean_it_was_given(spec, mean):
    law = covariate_law(spec, FULL, mean, d=3)
    assert law.name == spec.partition(":")[0] and law.D == 3
    m = np.zeros(3) if mean is None else mean
    np.testing.assert_allclose(law.cov, FULL, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(law.mean, m, rtol=0, atol=1e-15)
    # Monte Carlo: mean and covariance of the draws within 5 standard errors
    n = 200_000
    x = law.sample(np.random.default_rng(2), n)
    assert np.all(np.abs(x.mean(axis=0) - m) <= 5 * x.std(axis=0) / np.sqrt(n))
    y = x - m
    prod = y[:, :, None] * y[:, None, :]
    assert np.all(np.abs(prod.mean(axis=0) - FULL) <= 5 * prod.std(axis=0) / np.sqrt(n))


def test_student_t_spec_sets_the_degrees_of_freedom():
    law = covariate_law("student_t:7.5", FULL)
    assert law.df == 7.5
    np.testing.assert_allclose(law.S, np.sqrt(5.5 / 7.5) * _root(FULL), rtol=1e-15, atol=1e-15)
    assert covariate_law("student_t", FULL).df == 3.0      # the default, as C1's student_df


def test_the_mixture_spec_sets_the_spread_of_its_two_components():
    law = covariate_law("gaussian_mixture:0.25", FULL, MEAN)
    np.testing.assert_array_equal(law.weights, [0.5, 0.5])
    np.testing.assert_array_equal(law.means, [MEAN, MEAN])
    np.testing.assert_allclose(law.covs, [0.75 * FULL, 1.25 * FULL], rtol=1e-15)


def test_an_empirical_law_is_the_files_rows_as_given(tmp_path):
    X = np.random.default_rng(3).integers(-3, 4, size=(50, 3)) + np.array([1.0, 0.0, -2.0])
    np.save(tmp_path / "x.npy", X)
    law = covariate_law(f"empirical:{tmp_path}/x.npy", d=3)
    assert isinstance(law, Empirical) and law.n == 50
    np.testing.assert_allclose(law.mean, X.mean(axis=0), rtol=1e-14)
    np.testing.assert_allclose(law.cov, np.cov(X.T, bias=True), rtol=1e-12, atol=1e-14)
    draws = law.sample(np.random.default_rng(4), (6, 7))
    rows = {tuple(row) for row in X}
    assert all(tuple(x) in rows for x in draws.reshape(-1, 3))


# --------------------------------------------------------------------------- refusals


def _file(tmp_path, X):
    np.save(tmp_path / "x.npy", np.asarray(X, dtype=float))
    return f"{tmp_path}/x.npy"


REFUSED = [
    (lambda p: covariate_law("cauchy", FULL), r"^covariate law 'cauchy': unknown law name 'cauchy'; expected one of"),
    (lambda p: covariate_law("", FULL), r"^covariate law must be a law name or 'name:VALUE'"),
    (lambda p: covariate_law("student_t:abc", FULL),
     r"^covariate law 'student_t:abc': expected student_t:DF with df a float, got 'abc'"),
    (lambda p: covariate_law("student_t:", FULL), r"^covariate law 'student_t:': expected student_t:DF"),
    (lambda p: covariate_law("gaussian:3", FULL), r"^covariate law 'gaussian:3': the gaussian law takes no ':VALUE'"),
    (lambda p: covariate_law("student_t:2", FULL),
     r"^covariate law 'student_t:2': df must be a scalar > 2 for a finite covariance"),
    (lambda p: covariate_law("gaussian_mixture:1", FULL), r"^covariate law 'gaussian_mixture:1': spread must be"),
    (lambda p: covariate_law("rademacher", FULL, MEAN), r"^covariate law 'rademacher': mean: the rademacher law is "
                                                         r"centred"),
    (lambda p: covariate_law("gaussian"), r"^covariate law 'gaussian': Sigma: the gaussian law is built from its "
                                          r"covariance"),
    (lambda p: covariate_law("gaussian", FULL, d=2), r"^covariate law 'gaussian': Sigma must be a square 2 x 2"),
    (lambda p: covariate_law("gaussian", FULL, np.zeros(2)), r"^covariate law 'gaussian': mean must have shape"),
    (lambda p: covariate_law("gaussian", [[1.0, 2.0], [0.0, 1.0]]), r"^covariate law 'gaussian': Sigma must be "
                                                                    r"symmetric"),
    (lambda p: covariate_law("rademacher", [[1.0, 1.0], [1.0, 1.0]]),
     r"^covariate law 'rademacher': its covariance is not positive definite"),
    (lambda p: covariate_law("gaussian", [1.0, np.nan]), r"^covariate law 'gaussian': Sigma must be finite"),
    (lambda p: covariate_law("empirical", FULL), r"^covariate law 'empirical': Sigma, mean: an empirical law has"),
    (lambda p: covariate_law("empirical"), r"^covariate law 'empirical': samples: an empirical law needs"),
    (lambda p: covariate_law(f"empirical:{p}/none.npy"), r"^covariate law 'empirical:.*none.npy': samples: no such"),
    (lambda p: covariate_law(f"empirical:{_file(p, np.ones((5, 2)))}", d=3),
     r"^covariate law 'empirical:.*x.npy': the law is on R\^2 \(Empirical\(n=5, D=2\)\), but d = 3"),
    (lambda p: covariate_law(f"empirical:{_file(p, [[1.0, 2.0], [2.0, 4.0], [3.0, 6.0]])}"),
     r"^covariate law 'empirical:.*': its covariance is not positive definite"),
]


@pytest.mark.parametrize("call, message", REFUSED)
def test_a_law_that_cannot_serve_is_refused_with_one_message(tmp_path, call, message):
    with pytest.raises(ValueError, match=message) as info:
        call(tmp_path)
    assert "\n" not in str(info.value)


# --------------------------------------------------------------------------- a new law


@pytest.fixture
def coin(monkeypatch):
    """A law defined after the import (the module's table restored after the test): Rademacher
    under another name, so its draws must equal Rademacher's."""
    monkeypatch.setattr(laws, "LAWS", dict(LAWS))
    return type("Coin", (Rademacher,), {"name": "coin"})


def test_a_law_without_with_moments_is_refused(monkeypatch):
    monkeypatch.setattr(laws, "LAWS", dict(LAWS))
    type("Point", (laws.StudentT,), {"name": "point", "with_moments": classmethod(laws.Law.with_moments.__func__)})
    with pytest.raises(ValueError, match=r"^covariate law 'point': Point has no member with a given covariance"):
        covariate_law("point", FULL)


def test_a_new_law_serves_c2_with_no_pipeline_touched(coin):
    a = covariate_law("coin", FULL).sample(np.random.default_rng(9), 10)
    assert np.array_equal(a, covariate_law("rademacher", FULL).sample(np.random.default_rng(9), 10))
    values = {"tau": [1.0, 2.0, 4.0, 6.0, 8.0, 10.0], "n_seeds": 1, "L": [4, 8, 16], "n_pairs": 1, "n_queries": 1,
              "n_replicates": 1, "n_steps": 20, "ckpt_every": 10}
    cell = {"tau": 2.0, "seed": 0}
    exp = c2_threshold.EXPERIMENT
    new = run_cell(exp, exp.configure("quick", values={**values, "x_law": "coin"}), cell)
    old = run_cell(exp, exp.configure("quick", values={**values, "x_law": "rademacher"}), cell)
    assert new.keys() == old.keys() and all(np.array_equal(new[k], old[k], equal_nan=True) for k in new)


# --------------------------------------------------------------------------- C3 on empirical covariates

C3 = {"settings": ["isotropic"], "n_seeds": 1, "n_seeds_control": 1, "n_pairs": 2, "n_queries": 2, "L": [4, 8, 16],
      "lr": 0.01, "n_steps": 4, "ckpt_every": 2, "heldout_pairs": 1, "heldout_queries": 1, "L_eval": 32,
      "heldout_every": 4}
EMPIRICAL_CELL = {"setting": "empirical", "seed": 0}


@pytest.fixture
def rows(tmp_path):
    """A non-Gaussian, non-centred covariate file on R^3: integer rows, shifted."""
    X = np.random.default_rng(11).integers(-2, 3, size=(40, 3)) + np.array([0.5, -0.3, 0.2])
    return X, _file(tmp_path, X)


def test_c3_runs_on_empirical_covariates_and_trains_on_them(rows):
    X, path = rows
    config = c3_transfer.EXPERIMENT.configure("quick", values={**C3, "covariates": path})
    assert c3_transfer.EXPERIMENT.part("").grid(config)["setting"] == ["isotropic", "empirical"]
    out = run_cell(c3_transfer.EXPERIMENT, config, EMPIRICAL_CELL)
    assert out["in_protocol"] == 1   # every output measured (amplifications are not at the quick profile: NaN)
    assert all(np.all(np.isfinite(v)) == (not k.endswith("_amplification")) for k, v in out.items())

    # the cell's tasks, in the documented draw order: their covariates are rows of the file
    rng = cell_rng(c3_transfer.NAME, EMPIRICAL_CELL, config["root_seed"])
    tasks = icl.make_tasks(rng, 3, C3["n_pairs"], C3["n_queries"], 16, Empirical(X))
    file_rows = {tuple(r) for r in X}
    assert all(tuple(x) in file_rows for x in tasks.Z[..., :3].reshape(-1, 3))
    assert all(tuple(x) in file_rows for x in tasks.x_q.reshape(-1, 3))

    # the Eq. 9 init from the rows' second moment M = X^T X / n, written out here
    M = X.T @ X / len(X)
    alpha = 0.5 * np.sqrt(2.0) / (3**0.25 * np.linalg.norm(M, 2))
    np.testing.assert_allclose(out["U"][:, :, 0, :3, :3], np.broadcast_to(alpha * np.eye(3) / np.sqrt(3), (2, 3, 3, 3)),
                               rtol=1e-12)
    np.testing.assert_allclose(out["v"][:, :, 0, 3], alpha, rtol=1e-12)

    # softmax(L), linear(L) and linear(inf) trained on those tasks (the simple per-L engine)
    kw = dict(lr=C3["lr"], n_steps=C3["n_steps"], ckpt_every=C3["ckpt_every"])
    for i, model in enumerate(c3_transfer.MODELS):
        for j, L in enumerate(C3["L"]):
            ref = training.train(model, tasks, L, **kw)
            np.testing.assert_allclose(out["U"][i, j], ref.U.values, rtol=1e-9, atol=1e-13)
            np.testing.assert_allclose(out["risk_train"][i, j], ref.risk.values, rtol=1e-9)
    # linear(inf) sees Gamma_w from the rows' second moment: one gradient step from the init
    U0, v0 = out["U_inf"][0], out["v_inf"][0]
    G = icl.Gamma_w(M, tasks.w)
    _, gU, gv = icl.linear_risk_grad(U0, v0, G, tasks.z_q, tasks.y_q)
    step = training.train("linear_inf", tasks, lr=C3["lr"], n_steps=1, ckpt_every=1)
    np.testing.assert_allclose(step.U.values[1], U0 - C3["lr"] * gU, rtol=1e-10, atol=1e-15)
    np.testing.assert_allclose(step.v.values[1], v0 - C3["lr"] * gv, rtol=1e-10, atol=1e-15)
    np.testing.assert_allclose(out["U_inf"], training.train("linear_inf", tasks, **kw).U.values, rtol=1e-10,
                               atol=1e-14)


def test_the_covariate_file_reaches_only_its_own_setting(rows, tmp_path):
    X, path = rows
    exp = c3_transfer.EXPERIMENT
    plain = exp.configure("quick", values=C3)
    with_file = exp.configure("quick", values={**C3, "covariates": path})
    iso = {"setting": "isotropic", "seed": 0}
    assert c3_transfer.EXPERIMENT.part("").grid(plain)["setting"] == ["isotropic"]
    assert cell_fingerprint(exp, plain, iso) == cell_fingerprint(exp, with_file, iso)   # reused by an extension
    before = cell_fingerprint(exp, with_file, EMPIRICAL_CELL)
    np.save(tmp_path / "x.npy", X[::-1])                                                 # same shape, new content
    again = exp.configure("quick", values={**C3, "covariates": path})     # the digest is taken when configuring
    assert cell_fingerprint(exp, again, EMPIRICAL_CELL) != before
    assert cell_fingerprint(exp, again, iso) == cell_fingerprint(exp, plain, iso)
    with pytest.raises(ValueError, match="covariates: .*changed since the run was configured"):
        run_cell(exp, with_file, EMPIRICAL_CELL)                          # the old configuration is refused


def test_a_covariate_file_changed_after_configuring_is_refused(rows, tmp_path):
    X, path = rows
    exp = c3_transfer.EXPERIMENT
    inputs = exp.cell_inputs(exp.configure("quick", values={**C3, "covariates": path}), EMPIRICAL_CELL)
    np.save(tmp_path / "x.npy", X + 1.0)
    with pytest.raises(ValueError, match=r"^covariates: .*x.npy' changed since the run was configured"):
        c3_transfer.covariate_law_of("empirical", inputs)


def test_a_covariate_file_of_another_dimension_is_refused_when_configuring(tmp_path):
    path = _file(tmp_path, np.random.default_rng(0).standard_normal((20, 2)))
    with pytest.raises(ValueError, match=r"^covariates: covariate law 'empirical:.*': the law is on R\^2 .*, but "
                                         r"d = 3"):
        c3_transfer.EXPERIMENT.configure("quick", values={**C3, "covariates": path})
