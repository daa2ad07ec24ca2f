"""Gaussian AR(1) tokens (sfxlin.laws.GaussianAR1): the sampler (lag-h autocovariance, stationarity),
the exact dependent constant (against the direct lag sum, a Monte Carlo of L * mse, rho = 0), bad
rho, and the C1 experiment with the ar1 laws."""
import numpy as np
import pytest

from sfxlin.analysis import c1 as c1_analysis
from sfxlin.attention import asymptotic_mse, softmax_attention
from sfxlin.engine.sweep import build
from sfxlin.laws import FloatOverflowError, Gaussian, GaussianAR1
from sfxlin.pipelines import c1_limit

SIGMA = np.array([[1.0, 0.3], [0.3, 0.5]])
V = np.array([[1.0, -0.4], [0.2, 0.8], [0.5, 0.5]])  # D_out = 3


def _rng(*ids):
    return np.random.default_rng([*ids, 2525])


# --------------------------------------------------------------------------------- the sampler

@pytest.mark.parametrize("rho", [0.8, -0.6])
def test_lag_autocovariance_is_rho_to_the_h_sigma(rho):
    """Cov(z_k, z_{k+h}) = rho^h Sigma, within 5 SE: each of n independent sequences gives one
    average of z_k z_{k+h}^T over k, so the SE is the spread of those n averages / sqrt(n)."""
    n, L = 4000, 64
    z = GaussianAR1(rho, cov=SIGMA).sample(_rng(1, int(10 * abs(rho))), (n, L))
    assert z.shape == (n, L, 2)
    for h in (0, 1, 2, 5):
        per_seq = np.einsum("nkd,nke->nde", z[:, :L - h], z[:, h:]) / (L - h)  # (n, D, D)
        se = per_seq.std(axis=0) / np.sqrt(n)
        assert np.all(np.abs(per_seq.mean(axis=0) - rho**h * SIGMA) <= 5 * se), h


def test_the_sequence_is_stationary():
    """Mean 0 and covariance Sigma at the first, a middle and the last token (the start is
    stationary, not a burn-in), within 5 SE over independent sequences."""
    n, L = 20000, 50
    z = GaussianAR1(0.9, cov=SIGMA).sample(_rng(2), (n, L))
    for k in (0, L // 2, L - 1):
        zk = z[:, k]
        assert np.all(np.abs(zk.mean(axis=0)) <= 5 * zk.std(axis=0) / np.sqrt(n)), k
        prods = zk[:, :, None] * zk[:, None, :]
        assert np.all(np.abs(prods.mean(axis=0) - SIGMA) <= 5 * prods.std(axis=0) / np.sqrt(n)), k


def test_the_prompt_axis_is_the_last_axis_of_shape():
    """Leading axes are independent sequences; the last axis of ``shape`` is the prompt: the
    lag-1 correlation along it is rho, across the leading axis 0 (within 5 SE)."""
    z = GaussianAR1(0.7, cov=1.0, D=1).sample(_rng(3), (3000, 4, 8))[..., 0]
    along = np.mean(z[..., :-1] * z[..., 1:])
    across = np.mean(z[:-1] * z[1:])
    se = 1.0 / np.sqrt(z.size)  # each product has variance <= 1 + rho^2 < 2; averages of ~1e5 terms
    assert abs(along - 0.7) < 10 * se and abs(across) < 10 * se


def test_rho_zero_draws_the_gaussian_tokens_and_one_token_is_stationary():
    a = GaussianAR1(0.0, cov=SIGMA).sample(_rng(4), (3, 7))
    np.testing.assert_allclose(a, Gaussian(cov=SIGMA).sample(_rng(4), (3, 7)), rtol=0, atol=1e-15)
    one = GaussianAR1(0.9, cov=SIGMA).sample(_rng(5), ())
    np.testing.assert_array_equal(one, Gaussian(cov=SIGMA).sample(_rng(5), ()))
    assert GaussianAR1(0.5, cov=SIGMA).sample(_rng(6), (0,)).shape == (0, 2)


def test_the_law_says_its_tokens_are_dependent():
    law = GaussianAR1.isotropic(3, 2.0, rho=0.4)
    assert law.iid is False and Gaussian.iid is True
    assert law.rho == 0.4 and law.D == 3
    np.testing.assert_array_equal(law.cov, 4.0 * np.eye(3))
    np.testing.assert_array_equal(law.tilted_mean(np.ones(3)), 4.0 * np.ones(3))
    assert "dependent along the prompt axis" in GaussianAR1.__doc__


# ------------------------------------------------------------------------- the dependent constant

def _lag_sum(law, a):
    """sum_{h in Z} E[psi(z_0) psi(z_h)^T] term by term (docs/models.md, dependent tokens), truncated where the
    terms' bound exp(|rho|^h r^2) |rho|^h (||Sigma|| + ||Sigma a||^2), geometric in h, leaves a tail
    below 1e-17 of the sum."""
    total = law.influence_lag_covariance(a, 0)
    r2 = float(a @ law.cov @ a)
    h, p = 1, abs(law.rho)
    while p**h * np.exp(p**h * r2) / (1 - p) > 1e-17 * np.exp(r2) * (1 - p):
        total = total + 2 * law.influence_lag_covariance(a, h)  # lags h and -h: the same symmetric matrix
        h += 1
    return total


@pytest.mark.parametrize("rho", [0.5, 0.8, -0.6, 0.95])
@pytest.mark.parametrize("scale", [0.0, 0.3, 1.0, 3.0])
def test_the_closed_form_is_the_sum_over_lags(rho, scale):
    law = GaussianAR1(rho, cov=SIGMA)
    a = scale * np.array([0.6, -0.8])
    exact = law.snis_covariance(a)
    np.testing.assert_allclose(exact, _lag_sum(law, a), rtol=1e-13, atol=0)
    np.testing.assert_allclose(exact, exact.T, rtol=1e-15, atol=0)


def test_the_lag_covariance_matches_a_monte_carlo_of_the_influence_function():
    """E[psi(z_0) psi(z_h)^T], psi(z) = e^{a.z} (z - Sigma a) / E e^{a.z}: sample pairs, within 5 SE."""
    law = GaussianAR1(0.5, cov=SIGMA)
    a = np.array([0.5, 0.4])
    z = law.sample(_rng(7), (200_000, 4))
    psi = np.exp(z @ a - 0.5 * a @ SIGMA @ a)[..., None] * (z - SIGMA @ a)
    for h in (1, 3):
        prods = psi[:, 0, :, None] * psi[:, h, None, :]
        se = prods.std(axis=0) / np.sqrt(prods.shape[0])
        assert np.all(np.abs(prods.mean(axis=0) - law.influence_lag_covariance(a, h)) <= 5 * se), h


def _finite_L_first_order(law, a, L):
    """L Var((1/L) sum_k psi(z_k)) read out by V: sum_{|h| < L} (1 - |h|/L) tr V E[psi psi_h^T] V^T,
    the first-order error at length L (the series with its finite-L weights)."""
    terms = [np.trace(V @ law.influence_lag_covariance(a, h) @ V.T) for h in range(L)]
    return terms[0] + 2 * sum((1 - h / L) * t for h, t in enumerate(terms) if h)


@pytest.mark.parametrize("rho", [0.5, 0.8])
def test_the_constant_matches_a_monte_carlo_of_L_mse(rho):
    """L E||f_L - f_inf||^2 over 3000 AR(1) prompts of L = 1000 against the series. The Monte Carlo
    SE is that of the mean of the 3000 independent L ||f_L - f_inf||^2; the prediction at L is the
    series with its finite-L lag weights (1 - |h|/L) (0.2% below the limit at rho 0.8), and the
    ratio estimator's own O(1/L) term (exp(r^2) / L relative, r^2 = 0.12 here) is below 0.2%: 4 SE
    + 0.5% of the constant."""
    law = GaussianAR1(rho, cov=SIGMA)
    U = np.array([[0.4, 0.1], [-0.2, 0.3]])
    q = np.array([0.7, -0.9])
    a = U @ q
    n, L = 3000, 1000
    Z = law.sample(_rng(8, int(10 * rho)), (n, L))
    err = softmax_attention(Z, U, V, q) - V @ law.tilted_mean(a)
    L_sq = L * np.sum(err**2, axis=-1)
    se = L_sq.std() / np.sqrt(n)
    constant = float(asymptotic_mse(law, U, V, q))  # the dependent constant, through the i.i.d. path
    np.testing.assert_allclose(constant, np.trace(V @ law.snis_covariance(a) @ V.T), rtol=1e-14)
    prediction = _finite_L_first_order(law, a, L)
    assert abs(L_sq.mean() - prediction) <= 4 * se + 0.005 * constant
    iid = float(asymptotic_mse(law.marginal, U, V, q))
    assert L_sq.mean() > 2 * iid  # (1 + rho) / (1 - rho) >= 3 at small r^2: the i.i.d. constant is far off


def test_rho_zero_is_the_iid_constant_to_rounding():
    law, gauss = GaussianAR1(0.0, cov=SIGMA), Gaussian(cov=SIGMA)
    a = np.array([[0.0, 0.0], [0.3, -0.2], [1.0, 1.0], [4.0, -3.0]])  # a' Sigma a up to ~12
    np.testing.assert_allclose(law.snis_covariance(a), gauss.snis_covariance(a), rtol=1e-14, atol=0)


def test_the_constant_is_vectorised_and_overflow_is_an_error():
    law = GaussianAR1(0.7, cov=SIGMA)
    a = _rng(9).standard_normal((2, 3, 2))
    out = law.snis_covariance(a)
    assert out.shape == (2, 3, 2, 2)
    loop = np.array([[law.snis_covariance(a[i, j]) for j in range(3)] for i in range(2)])
    np.testing.assert_allclose(out, loop, rtol=1e-15, atol=0)
    with pytest.raises(FloatOverflowError, match="a is too large"):
        law.snis_covariance(np.array([40.0, 0.0]))  # a' Sigma a = 1600


# ------------------------------------------------------------------------------------- bad rho

@pytest.mark.parametrize("rho", [1.0, -1.0, 1.5, -3.0])
def test_rho_outside_the_unit_interval_is_refused(rho):
    with pytest.raises(ValueError, match=r"rho must be a scalar with \|rho\| < 1 \(a stationary AR\(1\)"):
        GaussianAR1(rho, cov=SIGMA)
    with pytest.raises(ValueError, match=r"\|rho\| < 1"):
        GaussianAR1.isotropic(2, rho=rho)


@pytest.mark.parametrize("rho, match", [(np.nan, "rho must be finite"), ([0.1, 0.2], r"\|rho\| < 1")])
def test_rho_must_be_a_finite_scalar(rho, match):
    with pytest.raises(ValueError, match=match):
        GaussianAR1(rho, cov=SIGMA)


def test_c1_refuses_an_ar1_rho_of_one():
    with pytest.raises(ValueError, match="ar1_rho"):
        c1_limit.EXPERIMENT.configure("quick", values={"ar1_rho": [0.5, 1.0]})


# ------------------------------------------------------------------------------ the C1 pipeline

@pytest.fixture(scope="module")
def small_run():
    config = c1_limit.EXPERIMENT.configure("quick", values={
        "laws": ["gaussian", "ar1"], "ar1_rho": [0.0, 0.8], "d": [2], "U_norm": [0.1], "n_seeds": 2,
        "L": [16, 32, 64, 128, 256], "n_queries": 2, "n_prompts": 4, "query_chunk": 2})
    return build(c1_limit.EXPERIMENT, config).compute()


def test_c1_runs_with_the_ar1_laws(small_run):
    ds = small_run
    assert ds.law.values.tolist() == ["gaussian", "ar1:0.0", "ar1:0.8"]
    assert c1_analysis.dependent_laws(ds) == {"ar1:0.0": 0.0, "ar1:0.8": 0.8}
    assert "ar1:0.8" not in c1_analysis.own_limit_laws(ds)
    np.testing.assert_array_equal(ds.bias_exact.sel(law=["ar1:0.0", "ar1:0.8"]), 0.0)  # the Gaussian's limit
    # the dependent constant at rho = 0 is the i.i.d. one; at rho = 0.8 about (1 + rho) / (1 - rho) = 9 times it
    np.testing.assert_allclose(ds.mse_predicted.sel(law="ar1:0.0"), ds.mse_asymptotic, rtol=1e-13)
    ratio = (ds.mse_predicted.sel(law="ar1:0.8") / ds.mse_asymptotic).values
    assert np.all((ratio > 6) & (ratio < 9))


def test_the_ar1_fits_and_criteria(small_run):
    fit = c1_analysis.ar1_fits(small_run)
    assert fit.law.values.tolist() == ["ar1:0.0", "ar1:0.8"]
    for name in ("slope", "slope_se", "L_mse", "const_dependent", "const_iid", "ratio_dependent",
                 "ratio_dependent_se", "ratio_iid", "ratio_iid_se"):
        assert np.all(np.isfinite(fit[name].values)), name
    np.testing.assert_allclose(fit.ratio_iid / fit.ratio_dependent,
                               (fit.const_dependent / fit.const_iid).values, rtol=0.05)  # seed means of ratios
    ids = {row.criterion.id: row for row in c1_analysis.verdicts(small_run)}
    assert {"C1-ar1-slopes", "C1-ar1-constant", "C1-ar1-iid-rejected"} <= set(ids)
    assert ids["C1-ar1-slopes"].verdict in ("PASS", "FAIL")
    assert "ar1" in c1_analysis.fit_tables(small_run)


def test_without_ar1_laws_the_criteria_are_inconclusive(small_run):
    ds = small_run.sel(law=["gaussian"])
    ids = {row.criterion.id: row for row in c1_analysis.verdicts(ds)}
    assert ids["C1-ar1-slopes"].verdict == "INCONCLUSIVE"
    assert "no dependent" in ids["C1-ar1-slopes"].note
    with pytest.raises(ValueError, match="no dependent"):
        c1_analysis.ar1_fits(ds)
