"""Closed-form tilted means (sfxlin.laws) against independent quadrature and Monte Carlo.

* Gaussian: ``mean + cov a`` (Lemma 2.1) vs tensor Gauss-Hermite, random PSD ``cov`` (full rank
  and singular), random ``mean`` and ``a``, D = 1..4, to 1e-12 (max abs).
* Rademacher / Uniform: ``S tanh(S^T a)`` / ``S sqrt3 L(sqrt3 S^T a)`` vs enumeration /
  Gauss-Legendre (1e-12) and vs self-normalised Monte Carlo (5 standard errors).
* Gaussian mixture: the log-sum-exp posterior of the closed form vs a softmax over the union of
  the components' Gauss-Hermite grids, D = 1..3 (1e-12), and its closed-form SNIS constant vs
  the defining expectation ``E[w^2 (z - m_a)(z - m_a)^T] / (E w)^2`` on the same rule.
"""
import ast
import inspect

import numpy as np
import pytest

from sfxlin import quadrature
from sfxlin.laws import Gaussian, GaussianMixture, Rademacher, Uniform
from sfxlin.quadrature import (gaussian_mixture_rule, gaussian_mixture_tilted_mean_quadrature,
                               gaussian_tilted_mean_quadrature, product_law_tilted_mean_quadrature)

TOL = 1e-12
DIMS = [1, 2, 3, 4]


def _rng(*ids):
    return np.random.default_rng([*ids, 7041])


def _random_cov(rng, D, rank):
    """Random PSD matrix of the given rank, eigenvalues of order 1."""
    A = rng.standard_normal((D, rank))
    return A @ A.T / max(rank, 1)


def _random_logits(rng, cov, n, max_norm=3.0):
    """``n`` random ``a`` with ``sqrt(a^T cov a)`` uniform in [0, max_norm] (0 if cov a = 0)."""
    D = cov.shape[0]
    a = rng.standard_normal((n, D))
    norm = np.sqrt(np.einsum("bi,ij,bj->b", a, cov, a))
    return a * (max_norm * rng.uniform(0, 1, n) / np.where(norm > 0, norm, 1.0))[:, None]


def _cov_cases():
    """(label, D, rank): full rank for every D, singular for D >= 2 (rank 1 and D - 1)."""
    cases = [(f"full-D{D}", D, D) for D in DIMS]
    cases += [(f"rank1-D{D}", D, 1) for D in DIMS[1:]]
    cases += [(f"rank{D - 1}-D{D}", D, D - 1) for D in DIMS[2:]]
    return cases


# --------------------------------------------------------------------------------------------
# Gaussian: Lemma 2.1 vs Gauss-Hermite
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("label, D, rank", _cov_cases(), ids=[c[0] for c in _cov_cases()])
def test_gaussian_closed_form_matches_gauss_hermite(label, D, rank):
    rng = _rng(D, rank, 1)
    cov = _random_cov(rng, D, rank)
    mean = rng.standard_normal(D)
    a = _random_logits(rng, cov, 6 if D == 4 else 20)
    law = Gaussian(mean=mean, cov=cov)
    quad = gaussian_tilted_mean_quadrature(mean, cov, a)
    assert quad.shape == a.shape
    assert np.abs(quad - law.tilted_mean(a)).max() <= TOL


def test_gaussian_singular_cov_with_zero_direction():
    """A coordinate with zero variance keeps its mean whatever the tilt."""
    cov = np.diag([2.0, 0.0, 0.5])
    mean = np.array([0.3, -1.2, 0.7])
    a = np.array([[0.9, 50.0, -1.1], [-1.0, -1e6, 2.0]])
    quad = gaussian_tilted_mean_quadrature(mean, cov, a)
    assert np.abs(quad - Gaussian(mean=mean, cov=cov).tilted_mean(a)).max() <= TOL
    assert np.all(quad[:, 1] == mean[1])


def test_gaussian_zero_cov_is_point_mass():
    mean = np.array([1.0, -2.0])
    out = gaussian_tilted_mean_quadrature(mean, np.zeros((2, 2)), [[3.0, 4.0], [1e8, -1e8]])
    np.testing.assert_array_equal(out, np.broadcast_to(mean, (2, 2)))


def test_gaussian_documented_accuracy_range():
    """Default 40 nodes: rounding level up to sqrt(a^T cov a) = 5; 60 nodes up to 8."""
    rng = _rng(2)
    cov = _random_cov(rng, 2, 2)
    mean = rng.standard_normal(2)
    law = Gaussian(mean=mean, cov=cov)
    a5 = _random_logits(rng, cov, 10, max_norm=5.0)
    assert np.abs(gaussian_tilted_mean_quadrature(mean, cov, a5) - law.tilted_mean(a5)).max() <= TOL
    a8 = _random_logits(rng, cov, 10, max_norm=8.0)
    assert np.abs(gaussian_tilted_mean_quadrature(mean, cov, a8, n_nodes=60) - law.tilted_mean(a8)).max() <= TOL


def test_gaussian_large_logits_are_finite_without_warnings():
    """Max-subtracted log-weights: huge ||a|| is outside the accuracy range but never overflows."""
    x_max = np.polynomial.hermite_e.hermegauss(40)[0].max()
    cov = np.diag([4.0, 1.0, 0.25])
    a = [[1e300, -1e300, 0.5], [1e4, 0.0, -1e308], [np.finfo(float).max, 1.0, 2.0]]
    with np.errstate(over="raise", invalid="raise", divide="raise"):  # underflow to 0 is fine
        out = gaussian_tilted_mean_quadrature(np.zeros(3), cov, a)
    assert np.all(np.isfinite(out))
    # saturated coordinates sit on the extreme node; moderate ones stay exact (the rule factorises)
    np.testing.assert_allclose(out[:, 0], [2 * x_max, 2 * x_max, 2 * x_max], rtol=1e-14)
    np.testing.assert_allclose(out[:, 2], [0.5 * 0.25, -0.5 * x_max, 2.0 * 0.25], rtol=1e-13)
    np.testing.assert_allclose(out[:, 1], [-x_max, 0.0, 1.0], rtol=1e-13, atol=1e-15)


@pytest.mark.parametrize("D", DIMS)
def test_gaussian_vectorised_over_leading_axes_equals_loop(D):
    rng = _rng(D, 3)
    cov = _random_cov(rng, D, D)
    mean = rng.standard_normal(D)
    a = _random_logits(rng, cov, 6).reshape(2, 3, D)
    out = gaussian_tilted_mean_quadrature(mean, cov, a)
    assert out.shape == (2, 3, D)
    loop = np.array([[gaussian_tilted_mean_quadrature(mean, cov, a[i, j]) for j in range(3)] for i in range(2)])
    np.testing.assert_allclose(out, loop, rtol=0, atol=1e-14)  # a few ulp: BLAS paths differ
    assert gaussian_tilted_mean_quadrature(mean, cov, a[0, 0]).shape == (D,)
    assert gaussian_tilted_mean_quadrature(mean, cov, np.zeros((0, D))).shape == (0, D)


# --------------------------------------------------------------------------------------------
# Rademacher and Uniform: closed forms vs enumeration / Gauss-Legendre
# --------------------------------------------------------------------------------------------
PRODUCT_LAWS = {"rademacher": Rademacher, "uniform": Uniform}


@pytest.mark.parametrize("D", DIMS)
@pytest.mark.parametrize("kind", sorted(PRODUCT_LAWS))
def test_product_law_closed_form_matches_quadrature(kind, D):
    rng = _rng(D, 4, len(kind))
    S = rng.standard_normal((D, D))
    a = rng.standard_normal((8 if D == 4 else 25, D)) * rng.uniform(0, 3, (8 if D == 4 else 25, 1))
    law = PRODUCT_LAWS[kind](scale=S)
    quad = product_law_tilted_mean_quadrature(kind, S, a)
    assert quad.shape == a.shape
    assert np.abs(quad - law.tilted_mean(a)).max() <= TOL


@pytest.mark.parametrize("kind", sorted(PRODUCT_LAWS))
def test_product_law_scale_forms(kind):
    """Scalar (D from a), vector (diagonal) and matrix S agree."""
    a = _rng(5).standard_normal((4, 3))
    s = np.array([0.5, 1.0, 2.0])
    by_vector = product_law_tilted_mean_quadrature(kind, s, a)
    np.testing.assert_allclose(by_vector, product_law_tilted_mean_quadrature(kind, np.diag(s), a), rtol=0, atol=1e-15)
    np.testing.assert_allclose(by_vector, PRODUCT_LAWS[kind](scale=s).tilted_mean(a), rtol=0, atol=TOL)
    by_scalar = product_law_tilted_mean_quadrature(kind, 1.5, a)
    np.testing.assert_allclose(by_scalar, PRODUCT_LAWS[kind](scale=1.5, D=3).tilted_mean(a), rtol=0, atol=TOL)


def test_rademacher_enumeration_is_exact_for_any_logit():
    """A finite sum: no accuracy range, huge logits saturate to S sign(S^T a)."""
    rng = _rng(6)
    S = rng.standard_normal((3, 3))
    a = rng.standard_normal((20, 3)) * 10.0 ** rng.uniform(-3, 6, (20, 1))
    quad = product_law_tilted_mean_quadrature("rademacher", S, a)
    assert np.abs(quad - Rademacher(scale=S).tilted_mean(a)).max() <= TOL
    big = np.array([1e300, -1e300, 1e300])
    np.testing.assert_allclose(product_law_tilted_mean_quadrature("rademacher", np.eye(3), big), np.sign(big), atol=0)


def test_uniform_legendre_documented_range():
    """40 Gauss-Legendre nodes reach rounding level for |b_k| <= 30 (S = I so b = a)."""
    a = np.array([[30.0, -30.0], [-7.5, 0.0], [1e-9, 20.0]])
    quad = product_law_tilted_mean_quadrature("uniform", 1.0, a)
    assert np.abs(quad - Uniform(scale=1.0, D=2).tilted_mean(a)).max() <= TOL


@pytest.mark.parametrize("kind", sorted(PRODUCT_LAWS))
def test_product_law_vectorised_over_leading_axes_equals_loop(kind):
    rng = _rng(7, len(kind))
    S = rng.standard_normal((2, 2))
    a = rng.standard_normal((3, 2, 2))
    out = product_law_tilted_mean_quadrature(kind, S, a)
    loop = np.array([[product_law_tilted_mean_quadrature(kind, S, a[i, j]) for j in range(2)] for i in range(3)])
    np.testing.assert_allclose(out, loop, rtol=0, atol=1e-14)  # a few ulp: BLAS paths differ


# --------------------------------------------------------------------------------------------
# Monte Carlo (self-normalised importance sampling), CLT tolerance
# --------------------------------------------------------------------------------------------
def _snis(z, a):
    """``sum w_i z_i / sum w_i`` with ``w_i = e^{a.z_i}`` and its delta-method standard error."""
    logw = z @ a
    w = np.exp(logw - logw.max())
    est = w @ z / w.sum()
    se = np.sqrt((w**2) @ (z - est) ** 2) / w.sum()
    return est, se


MC_N = 200_000


@pytest.mark.parametrize("D", DIMS)
@pytest.mark.parametrize("kind", sorted(PRODUCT_LAWS))
def test_product_law_closed_form_matches_monte_carlo(kind, D):
    rng = _rng(D, 8, len(kind))
    S = rng.standard_normal((D, D)) / np.sqrt(D)
    law = PRODUCT_LAWS[kind](scale=S)
    if kind == "rademacher":  # drawn here, not with law.sample: an independent check
        u = rng.integers(0, 2, (MC_N, D)) * 2.0 - 1.0
    else:
        u = rng.uniform(-np.sqrt(3.0), np.sqrt(3.0), (MC_N, D))
    z = u @ S.T
    for a in rng.standard_normal((3, D)):
        est, se = _snis(z, a)
        assert np.all(np.abs(est - law.tilted_mean(a)) <= 5 * se + 1e-12), (a, est, se)


@pytest.mark.parametrize("D", DIMS)
def test_gaussian_closed_form_matches_monte_carlo(D):
    rng = _rng(D, 9)
    cov = _random_cov(rng, D, max(1, D - 1))
    mean = rng.standard_normal(D)
    law = Gaussian(mean=mean, cov=cov)
    lam, Q = np.linalg.eigh(cov)
    z = mean + rng.standard_normal((MC_N, D)) @ (Q * np.sqrt(np.clip(lam, 0, None))).T
    for a in _random_logits(rng, cov, 3, max_norm=1.0):
        est, se = _snis(z, a)
        assert np.all(np.abs(est - law.tilted_mean(a)) <= 5 * se + 1e-12), (a, est, se)


# --------------------------------------------------------------------------------------------
# validation and independence
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(mean=np.zeros(5), cov=np.eye(5), a=np.ones(5)), "mean.*D = 5"),
        (dict(mean=np.zeros((2, 1)), cov=np.eye(2), a=np.ones(2)), "mean"),
        (dict(mean=np.zeros(2), cov=np.eye(3), a=np.ones(2)), "cov"),
        (dict(mean=np.zeros(2), cov=[[1.0, 0.5], [0.0, 1.0]], a=np.ones(2)), "cov must be symmetric"),
        (dict(mean=np.zeros(2), cov=[[1.0, 0.0], [0.0, -1.0]], a=np.ones(2)), "cov must be positive semi-definite"),
        (dict(mean=[np.nan, 0.0], cov=np.eye(2), a=np.ones(2)), "mean"),
        (dict(mean=np.zeros(2), cov=[[1.0, np.inf], [np.inf, 1.0]], a=np.ones(2)), "cov"),
        (dict(mean=np.zeros(2), cov=np.eye(2), a=np.ones(3)), "a must have shape"),
        (dict(mean=np.zeros(2), cov=np.eye(2), a=1.0), "a must have shape"),
        (dict(mean=np.zeros(2), cov=np.eye(2), a=[np.nan, 1.0]), "a must"),
        (dict(mean=np.zeros(2), cov=np.eye(2), a=np.ones(2), n_nodes=0), "n_nodes"),
        (dict(mean=np.zeros(2), cov=np.eye(2), a=np.ones(2), n_nodes=2.5), "n_nodes"),
        (dict(mean=np.zeros(4), cov=np.eye(4), a=np.ones(4), n_nodes=100), "n_nodes"),
    ],
)
def test_gaussian_quadrature_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        gaussian_tilted_mean_quadrature(**kwargs)


@pytest.mark.parametrize(
    "args, match",
    [
        (("cauchy", np.eye(2), np.ones(2)), "kind"),
        (("uniform", np.eye(5), np.ones(5)), "S.*D = 5"),
        (("rademacher", 1.0, np.ones(5)), "a.*D = 5"),
        (("uniform", np.ones((2, 3)), np.ones(2)), "S must be"),
        (("uniform", np.eye(2), np.ones(3)), "a must have shape"),
        (("rademacher", [1.0, np.nan], np.ones(2)), "S must"),
        (("rademacher", 1.0, 2.0), "a must have shape"),
    ],
)
def test_product_law_quadrature_validation(args, match):
    with pytest.raises(ValueError, match=match):
        product_law_tilted_mean_quadrature(*args)


def test_quadrature_module_shares_no_code_with_laws():
    """No closed form reaches the quadrature: it imports nothing of sfxlin but the input checks of
    sfxlin.validation (which compute nothing)."""
    tree = ast.parse(inspect.getsource(quadrature))
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            imported.add(("." * node.level) + (node.module or ""))
    imported.discard(".validation")
    assert not any("laws" in name or name.startswith(".") or name.startswith("sfxlin") for name in imported), imported
    assert not any("scipy" in name for name in imported), imported


# --------------------------------------------------------------------------------------------
# Gaussian mixtures: closed forms vs the union of Gauss-Hermite grids
# --------------------------------------------------------------------------------------------
def _random_mixture(rng, K, D):
    """weights in [0.2, 1] normalised; means of order 1; covariances of order 1, with a rank-1
    (singular for D >= 2) second component."""
    w = rng.uniform(0.2, 1.0, K)
    covs = np.array([_random_cov(rng, D, D) + 0.1 * np.eye(D) for _ in range(K)])
    if K > 1:
        covs[1] = _random_cov(rng, D, 1)
    return w / w.sum(), rng.standard_normal((K, D)), covs


def _mixture_logits(rng, covs, n, max_norm):
    """``n`` random ``a`` scaled so that ``max_k sqrt(a^T S_k a)`` is uniform in [0, max_norm]:
    inside the rounding-level range of the rule for every component."""
    a = rng.standard_normal((n, covs.shape[1]))
    norm = np.sqrt(np.einsum("bi,kij,bj->bk", a, covs, a)).max(axis=1)
    return a * (max_norm * rng.uniform(0, 1, n) / norm)[:, None]


@pytest.mark.parametrize("K", [1, 2, 4])
@pytest.mark.parametrize("D", [1, 2, 3])
def test_gaussian_mixture_closed_form_matches_quadrature(D, K):
    """The 40-node rule is at rounding level (~1e-15 times the scale) for sqrt(a^T S_k a) <= 5
    (table in gaussian_tilted_mean_quadrature); here <= 4, so TOL is rounding plus margin."""
    rng = _rng(D, K, 10)
    weights, means, covs = _random_mixture(rng, K, D)
    a = _mixture_logits(rng, covs, 20, max_norm=4.0)
    quad = gaussian_mixture_tilted_mean_quadrature(weights, means, covs, a)
    assert quad.shape == a.shape
    assert np.abs(quad - GaussianMixture(weights, means, covs).tilted_mean(a)).max() <= TOL


def test_gaussian_mixture_separated_components_switch_with_a():
    """Components far apart: the posterior moves from one to the other as a turns, the regime
    where the limit is farthest from linear; still exact to TOL."""
    weights, means = np.array([0.3, 0.7]), np.array([[3.0, 0.0], [-3.0, 1.0]])
    covs = np.array([np.diag([1.0, 0.5]), [[0.8, 0.3], [0.3, 0.6]]])
    theta = np.linspace(0, 2 * np.pi, 25)
    a = 1.5 * np.stack([np.cos(theta), np.sin(theta)], axis=1)
    law = GaussianMixture(weights, means, covs)
    quad = gaussian_mixture_tilted_mean_quadrature(weights, means, covs, a)
    assert np.abs(quad - law.tilted_mean(a)).max() <= TOL
    m_a = law.tilted_mean(a)
    assert m_a[:, 0].max() > 3.5 and m_a[:, 0].min() < -3.5  # one component, then the other


def test_gaussian_mixture_point_mass_component():
    """A component with S_k = 0 is one node, the point mass at m_k."""
    weights, means, covs = [0.4, 0.6], np.array([[1.0, -1.0], [0.0, 0.5]]), [0.0, 1.3]
    a = _rng(11).standard_normal((10, 2))
    quad = gaussian_mixture_tilted_mean_quadrature(weights, means, covs, a)
    assert np.abs(quad - GaussianMixture(weights, means, covs).tilted_mean(a)).max() <= TOL
    nodes, log_w = gaussian_mixture_rule(weights, means, covs, n_nodes=7)
    assert nodes.shape == (1 + 49, 2)
    np.testing.assert_array_equal(nodes[0], means[0])
    assert log_w[0] == np.log(0.4)


@pytest.mark.parametrize("D", [1, 2, 3])
def test_gaussian_mixture_one_component_is_the_gaussian_rule(D):
    """K = 1, pi = 1: the same grid as gaussian_tilted_mean_quadrature, so the same numbers up
    to the order of the sums (a few ulp of the scale)."""
    rng = _rng(D, 12)
    mean, cov = rng.standard_normal(D), _random_cov(rng, D, D)
    a = _random_logits(rng, cov, 10, max_norm=4.0)
    mix = gaussian_mixture_tilted_mean_quadrature([1.0], mean[None], cov[None], a)
    np.testing.assert_allclose(mix, gaussian_tilted_mean_quadrature(mean, cov, a), rtol=0, atol=1e-14)


@pytest.mark.parametrize("D", [1, 2, 3])
def test_gaussian_mixture_rule_integrates_low_moments_exactly(D):
    """Gauss-Hermite with n nodes is exact for polynomials of degree < 2n: the rule's total mass
    is 1 and its first two moments are sum pi m and sum pi (S + m m^T), to rounding."""
    rng = _rng(D, 13)
    weights, means, covs = _random_mixture(rng, 3, D)
    nodes, log_w = gaussian_mixture_rule(weights, means, covs, n_nodes=10)
    W = np.exp(log_w)
    assert W.sum() == pytest.approx(1.0, abs=1e-14)
    np.testing.assert_allclose(W @ nodes, weights @ means, rtol=0, atol=1e-14)
    second = np.einsum("k,kij->ij", weights, covs + means[:, :, None] * means[:, None, :])
    np.testing.assert_allclose(np.einsum("n,ni,nj->ij", W, nodes, nodes), second, rtol=0, atol=1e-13)


def _snis_covariance_by_rule(weights, means, covs, a, n_nodes):
    """``E[w^2 (z - m_a)(z - m_a)^T] / (E w)^2``, ``w = e^{a.z}``, with every expectation (and
    ``m_a``) a sum over the nodes of the mixture rule, in log space."""
    nodes, log_w = gaussian_mixture_rule(weights, means, covs, n_nodes)
    out = []
    for row in np.atleast_2d(a):
        l1 = log_w + nodes @ row
        top = l1.max()
        log_Ew = top + np.log(np.exp(l1 - top).sum())
        m_a = np.exp(l1 - log_Ew) @ nodes
        dz = nodes - m_a
        out.append(np.einsum("n,ni,nj->ij", np.exp(log_w + 2 * nodes @ row - 2 * log_Ew), dz, dz))
    return np.array(out)


@pytest.mark.parametrize("D", [1, 2, 3])
def test_gaussian_mixture_snis_covariance_matches_its_definition(D):
    """The integrand e^{2a.z} is a tilt by 2a: with 60 nodes the rule is at rounding level up to
    sqrt((2a)^T S (2a)) ~ 8, so a with sqrt(a^T S_k a) <= 3.5. The constant grows like
    exp(a^T S a) (up to ~1e7 here), so the comparison is relative to its largest entry. The
    rule's own rounding floor is ~1e-13 relative (measured over 15 seeds at D = 3: 0.9e-13 to
    1.6e-13; logits up to |2a.z| ~ 50 on 2e5 nodes), and it is the rule's: the same sums in
    80-bit long double meet the closed form to 8e-15. Hence 1e-12."""
    rng = _rng(D, 14)
    weights, means, covs = _random_mixture(rng, 3, D)
    a = _mixture_logits(rng, covs, 12 if D == 3 else 25, max_norm=3.5)
    closed = GaussianMixture(weights, means, covs).snis_covariance(a)
    by_rule = _snis_covariance_by_rule(weights, means, covs, a, n_nodes=60)
    scale = np.abs(closed).max(axis=(1, 2), keepdims=True)
    assert np.abs(closed - by_rule).max(axis=(1, 2)).max() <= 1e-12 * scale.max()
    assert np.all(np.abs(closed - by_rule) <= 1e-12 * scale)


def test_gaussian_mixture_quadrature_vectorised_over_leading_axes_equals_loop():
    rng = _rng(15)
    weights, means, covs = _random_mixture(rng, 2, 2)
    a = _mixture_logits(rng, covs, 6, max_norm=3.0).reshape(2, 3, 2)
    out = gaussian_mixture_tilted_mean_quadrature(weights, means, covs, a)
    loop = np.array([[gaussian_mixture_tilted_mean_quadrature(weights, means, covs, a[i, j]) for j in range(3)]
                     for i in range(2)])
    np.testing.assert_allclose(out, loop, rtol=0, atol=1e-14)  # a few ulp: BLAS paths differ
    assert gaussian_mixture_tilted_mean_quadrature(weights, means, covs, np.zeros((0, 2))).shape == (0, 2)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(weights=[0.5, 0.6], means=np.zeros((2, 2)), covs=[1.0, 1.0]), "weights must sum to 1"),
        (dict(weights=[1.5, -0.5], means=np.zeros((2, 2)), covs=[1.0, 1.0]), "weights must be positive"),
        (dict(weights=[0.5, 0.5], means=np.zeros((3, 2)), covs=[1.0, 1.0]), "means must have shape"),
        (dict(weights=[0.5, 0.5], means=np.zeros((2, 5)), covs=[1.0, 1.0]), "means gives dimension D = 5"),
        (dict(weights=[0.5, 0.5], means=np.zeros((2, 2)), covs=np.ones((2, 3))), "covs must have shape"),
        (dict(weights=[0.5, 0.5], means=np.zeros((2, 2)), covs=[np.eye(2), [[1.0, 2.0], [2.0, 1.0]]]),
         r"covs\[1\] must be positive semi-definite"),
        (dict(weights=[0.5, 0.5], means=np.zeros((2, 2)), covs=[np.eye(2), [[1.0, 0.5], [0.0, 1.0]]]),
         r"covs\[1\] must be symmetric"),
        (dict(weights=[0.5, 0.5], means=[[0.0, np.nan], [0.0, 0.0]], covs=[1.0, 1.0]), "means must be finite"),
        (dict(weights=[0.5, 0.5], means=np.zeros((2, 2)), covs=[1.0, 1.0], a=np.ones(3)), "a must have shape"),
        (dict(weights=[0.5, 0.5], means=np.zeros((2, 2)), covs=[1.0, 1.0], n_nodes=0), "n_nodes"),
        (dict(weights=np.full(4, 0.25), means=np.zeros((4, 3)), covs=np.ones(4), n_nodes=120), "nodes"),
    ],
)
def test_gaussian_mixture_quadrature_validation(kwargs, match):
    kwargs.setdefault("a", np.ones(np.shape(kwargs["means"])[-1]))
    with pytest.raises(ValueError, match=match):
        gaussian_mixture_tilted_mean_quadrature(**kwargs)


# --------------------------------------------------------------------------------------------
# 1-D Gaussian expectations with a sharp transition: the graded composite Gauss-Legendre rule
# --------------------------------------------------------------------------------------------
def test_graded_normal_rule_integrates_gaussian_moments_at_every_scale():
    """E s^(2k) = r^(2k) (2k - 1)!! (k <= 5), to 1e-13 relative, from r = 1e-3 to 1e6 with the
    transition anywhere; at r = 0 the rule returns g(0)."""
    r = np.array([1e-3, 0.7, 3.0, 1e4, 1e6])
    for t in (-5.0, 0.0, 300.0):
        s, w = quadrature.graded_normal_rule(r, [t])
        for k in range(6):
            want = r ** (2 * k) * np.prod(np.arange(1, 2 * k, 2))
            np.testing.assert_allclose(np.sum(w * s ** (2 * k), -1), want, rtol=1e-13)
    s, w = quadrature.graded_normal_rule(0.0, [1.0])
    assert np.sum(w * (np.cos(s) + 3.0)) == pytest.approx(4.0, rel=1e-15)


def test_graded_normal_rule_resolves_a_unit_width_peak_at_any_r():
    """E phi(s - t) = phi(t / sqrt(1 + r^2)) / sqrt(1 + r^2) and E Phi(s - t) = Phi(-t / sqrt(1 + r^2))
    (a Gaussian feature of unit width at s = t, the sigmoid's derivative's analogue): 1e-12 relative
    from r = 0.1 to 1e6, where the 120-node Gauss-Hermite rule already misses the peak at r = 5."""
    from scipy.special import ndtr

    r = np.array([0.1, 1.0, 5.0, 10.0, 1e3, 1e6])
    for t in (-8.0, -1.3, 0.0, 4.0):
        s, w = quadrature.graded_normal_rule(r, [t])
        c = np.sqrt(1 + r**2)
        pdf = np.exp(-(s - t) ** 2 / 2) / np.sqrt(2 * np.pi)
        np.testing.assert_allclose(np.sum(w * pdf, -1), np.exp(-(t / c) ** 2 / 2) / np.sqrt(2 * np.pi) / c,
                                   rtol=1e-12)
        np.testing.assert_allclose(np.sum(w * ndtr(s - t), -1), ndtr(-t / c), rtol=1e-12)
    gh = quadrature.normal_expectation(lambda s: np.exp(-(s + 1.3) ** 2 / 2) / np.sqrt(2 * np.pi), 5.0)
    assert abs(gh / (np.exp(-(1.3 / np.sqrt(26)) ** 2 / 2) / np.sqrt(2 * np.pi * 26)) - 1) > 1e-6


def test_graded_normal_rule_broadcasts_r_against_the_points():
    r, t = np.array([[0.5], [4.0]]), np.array([[-1.0, 2.0], [0.0, 3.0], [5.0, 5.0]])
    s, w = quadrature.graded_normal_rule(r, t)
    assert s.shape[:2] == w.shape[:2] == (2, 3)
    for i in range(2):
        for j in range(3):
            si, wi = quadrature.graded_normal_rule(r[i, 0], t[j])
            np.testing.assert_allclose(np.sum(w[i, j] * np.tanh(s[i, j] - 1)), np.sum(wi * np.tanh(si - 1)),
                                       rtol=1e-14, atol=1e-16)


@pytest.mark.parametrize("args, match", [((-1.0, [0.0]), "r "), ((np.nan, [0.0]), "r "), ((1.0, 0.0), "points"),
                                         ((1.0, [np.inf]), "points")])
def test_graded_normal_rule_validation(args, match):
    with pytest.raises(ValueError, match=match):
        quadrature.graded_normal_rule(*args)
