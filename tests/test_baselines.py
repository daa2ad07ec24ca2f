"""Baselines: the vectorised estimators against naive per-task numpy.linalg loops, their closed-form
risks against Monte Carlo (4 standard errors), and the Marchenko-Pastur asymptotic ridge risk against
Monte Carlo at large d (finite-size error O(1/d) on top of Monte Carlo's)."""
import numpy as np
import pytest

from sfxlin import baselines, icl, laws
from sfxlin.laws import Gaussian

ANISO = np.diag([2.0, 1.0, 0.5])
OMEGA = np.array([[1.0, 0.3, 0.0], [0.3, 0.5, 0.1], [0.0, 0.1, 2.0]])
LS = (2, 3, 7, 20)


def _rng(*ids):
    return np.random.default_rng([*ids, 4417])


def _tasks(noise=0.5, Omega=OMEGA, n_pairs=3, L=20, mean=None, q=2, seed=0, Sigma=ANISO, d=3):
    law = Gaussian(mean=mean, cov=Sigma) if mean is not None else laws.covariate_law("gaussian", Sigma)
    return icl.make_tasks(_rng(seed), d, n_pairs, q, L, law, noise=noise, query_noise=0.3, Omega=Omega)


def _naive(tasks, fn):
    d = tasks.d
    return np.array([[fn(tasks.Z[i, :L, :d], tasks.Z[i, :L, d], L) for i in range(tasks.n_tasks)] for L in LS])


def test_min_norm_and_ridge_match_numpy_loops():
    t = _tasks()
    np.testing.assert_allclose(baselines.min_norm(t, LS),
                               _naive(t, lambda X, y, L: np.linalg.lstsq(X, y, rcond=None)[0]), rtol=1e-9, atol=1e-10)
    lam = np.array([0.1, 0.2, 0.05, 1.0])
    naive = np.array([[np.linalg.solve(t.Z[i, :L, :3].T @ t.Z[i, :L, :3] / L + lam[k] * np.eye(3),
                                       t.Z[i, :L, :3].T @ t.Z[i, :L, 3] / L) for i in range(t.n_tasks)]
                      for k, L in enumerate(LS)])
    np.testing.assert_allclose(baselines.ridge(t, LS, lam), naive, rtol=1e-10, atol=1e-12)
    with pytest.raises(ValueError, match="lam"):
        baselines.ridge(t, LS, -1.0)


def _ill_conditioned_tasks(seed, cond=1e8, d=4, n=6, L_max=30, noise=0.5):
    """Tasks whose covariates are ``G diag(1, .., 1/cond) V^T`` (``G`` Gaussian, ``V`` a random rotation):
    every nested ``X`` with ``L >= d`` has condition number about ``cond``; noisy labels."""
    rng = _rng(seed, 99)
    V = np.linalg.qr(rng.standard_normal((d, d)))[0]
    X = rng.standard_normal((n, L_max, d)) * np.logspace(0, -np.log10(cond), d) @ V.T
    w = rng.standard_normal((n, d))
    y = np.einsum("nld,nd->nl", X, w) + noise * rng.standard_normal((n, L_max))
    return icl.Tasks(Z=np.concatenate([X, y[..., None]], axis=-1), w=w, x_q=np.zeros((n, 1, d)), y_q=np.zeros((n, 1)),
                     Sigma=np.eye(d), paired=False, noise=noise)


def _residual(X, y, w):
    """``||y - X w||^2`` in extended precision: at ``|w| ~ cond`` the float64 product ``X w`` rounds by
    ``~|X| |w| eps``, more than the gap between two backward-stable solutions."""
    ld = np.longdouble
    return np.sum((y.astype(ld) - X.astype(ld) @ w.astype(ld)) ** 2)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_min_norm_at_condition_number_1e8_is_lstsq(seed):
    """cond(X) = 1e8 (X^T X: 1e16, at which its eigenvalues lose the smallest direction): per task
    and L, relative 1e-8 to numpy.linalg.lstsq (backward-stable solvers agree to ~cond eps) and a
    residual no larger than lstsq's times (1 + 1e-8); L < d: lstsq's minimum-norm solution."""
    t = _ill_conditioned_tasks(seed)
    Ls = (1, 2, 3, 4, 5, 9, 30)
    got = baselines.min_norm(t, Ls)
    assert got.shape == (len(Ls), t.n_tasks, t.d)
    for k, L in enumerate(Ls):
        for i in range(t.n_tasks):
            X, y = t.Z[i, :L, :t.d], t.Z[i, :L, t.d]
            ref = np.linalg.lstsq(X, y, rcond=None)[0]
            assert np.linalg.norm(got[k, i] - ref) <= 1e-8 * np.linalg.norm(ref), (L, i)
            if L > t.d:
                assert _residual(X, y, got[k, i]) <= _residual(X, y, ref) * (1 + 1e-8), (L, i)


@pytest.mark.parametrize("seed", [0, 1])
def test_min_norm_on_a_rank_deficient_design_is_pinv(seed):
    """Covariates in a 2-dimensional subspace of R^4 (``X = G B``, ``B`` 2 x 4) at every L, 1 to 30: ``X``
    has two singular values that are 0 up to rounding, whatever L, which min_norm must drop (at L >= d
    the L < d branch does not apply). Per task and L, relative 1e-8 to ``np.linalg.pinv(X) @ y``, and the
    solution lies in the row space of B (its component along B's null space is 0 to 1e-8): the
    minimum-norm least-squares solution, not one of the many that fit as well."""
    rng = _rng(seed, 7)
    n, L_max, d = 5, 30, 4
    B = rng.standard_normal((2, d))
    X = rng.standard_normal((n, L_max, 2)) @ B
    y = np.einsum("nld,nd->nl", X, rng.standard_normal((n, d))) + 0.5 * rng.standard_normal((n, L_max))
    t = icl.Tasks(Z=np.concatenate([X, y[..., None]], axis=-1), w=np.zeros((n, d)), x_q=np.zeros((n, 1, d)),
                  y_q=np.zeros((n, 1)), Sigma=np.eye(d), paired=False, noise=0.5)
    null = np.linalg.svd(B)[2][2:]                      # an orthonormal basis of B's null space (2 x 4)
    Ls = (1, 2, 3, 4, 5, 9, 30)
    got = baselines.min_norm(t, Ls)
    for k, L in enumerate(Ls):
        for i in range(n):
            ref = np.linalg.pinv(X[i, :L]) @ y[i, :L]
            assert np.linalg.norm(got[k, i] - ref) <= 1e-8 * np.linalg.norm(ref), (L, i)
            assert np.linalg.norm(null @ got[k, i]) <= 1e-8 * np.linalg.norm(ref), (L, i)


def test_noiseless_posterior_mean_at_condition_number_1e8_is_the_least_omega_norm_interpolator():
    """Omega^{1/2} lstsq(X Omega^{1/2}, y) per task (relative 1e-8), L < d included (the interpolator
    of least w^T Omega^{-1} w). The tasks declare noise = 0 (the interpolator branch) but their labels
    carry the noise of _ill_conditioned_tasks: the solution is then large along the small singular
    direction, as in test_min_norm_at_condition_number_1e8_is_lstsq, and two backward-stable solvers
    agree to 1e-8 relative (with exact labels and |w| ~ 1 they agree only to ~cond eps = 1e-8 times
    a few, in that direction)."""
    t0 = _ill_conditioned_tasks(3)
    Omega = np.diag([2.0, 1.0, 0.5, 1.5]) + 0.2
    t = icl.Tasks(Z=t0.Z, w=t0.w, x_q=t0.x_q, y_q=t0.y_q, Sigma=t0.Sigma, paired=False, Omega=Omega)
    assert t.noise == 0
    R = np.linalg.cholesky(Omega)
    Ls = (2, 3, 4, 6, 30)
    got = baselines.posterior_mean(t, Ls)
    for k, L in enumerate(Ls):
        for i in range(t.n_tasks):
            ref = R @ np.linalg.lstsq(t.Z[i, :L, :t.d] @ R, t.Z[i, :L, t.d], rcond=None)[0]
            assert np.linalg.norm(got[k, i] - ref) <= 1e-8 * np.linalg.norm(ref), (L, i)


@pytest.mark.parametrize("noise", [0.0, 0.5])
def test_posterior_mean_matches_the_bayes_formula(noise):
    t = _tasks(noise=noise)
    if noise:
        fn = lambda X, y, L: np.linalg.solve(X.T @ X + noise**2 * np.linalg.inv(OMEGA), X.T @ y)  # noqa: E731
    else:   # min w^T Omega^{-1} w subject to X w = y (L >= d: the unique solution)
        fn = lambda X, y, L: OMEGA @ X.T @ np.linalg.pinv(X @ OMEGA @ X.T) @ y  # noqa: E731
    np.testing.assert_allclose(baselines.posterior_mean(t, LS), _naive(t, fn), rtol=1e-8, atol=1e-9)


def test_pgd_matches_a_loop_and_tends_to_the_plug_in():
    t = _tasks(mean=[0.3, 0.0, -0.2])
    M = t.second_moment

    def fn(X, y, L):
        H = (1 + 1 / L) * M @ OMEGA @ M + (np.trace(M @ OMEGA) + 0.25) / L * M
        return OMEGA @ M @ np.linalg.inv(H) @ (X.T @ y / L)
    np.testing.assert_allclose(baselines.pgd(t, LS), _naive(t, fn), rtol=1e-10, atol=1e-12)
    # Gamma_L = Sigma^{-1} + O(1/L): at L = 1e9 within ~(1 + tr(Sigma Omega) + noise^2) ||Sigma^-1||^2 / L ~ 1e-8
    np.testing.assert_allclose(baselines.pgd_preconditioner(10**9, ANISO, OMEGA, 0.5), np.linalg.inv(ANISO),
                               rtol=0, atol=1e-7)


def _mc_risk(estimator, L, n_pairs=4000, noise=0.5, Omega=OMEGA, Sigma=ANISO, seed=1, d=3):
    t = icl.make_tasks(_rng(seed, L), d, n_pairs, 1, L, laws.covariate_law("gaussian", Sigma), noise=noise,
                       query_noise=0.3, Omega=Omega)
    w_hat = estimator(t, (L,))[0]
    loss = 0.5 * (np.einsum("nqi,ni->nq", t.x_q, w_hat) - t.y_q)[0::2].ravel() ** 2   # pairs are not independent
    return loss.mean(), loss.std(ddof=1) / np.sqrt(loss.size)


@pytest.mark.parametrize("L", [2, 5, 40])
def test_pgd_risk_closed_form_matches_monte_carlo(L):
    est, se = _mc_risk(baselines.pgd, L)
    assert abs(est - baselines.pgd_risk(L, ANISO, OMEGA, 0.5, 0.3)) <= 4 * se


@pytest.mark.parametrize("L", [6, 12, 50])
def test_ols_risk_closed_form_matches_monte_carlo(L):
    est, se = _mc_risk(baselines.min_norm, L)
    assert abs(est - baselines.ols_risk(3, L, 0.5, 0.3)) <= 4 * se
    assert np.isnan(baselines.ols_risk(3, 4, 0.5)) and baselines.ols_risk(3, 3, 0.0, 0.3) == pytest.approx(0.045)


def test_bayes_estimator_beats_the_others_on_the_same_tasks():
    t = icl.make_tasks(_rng(2), 3, 3000, 1, 12, laws.covariate_law("gaussian", ANISO), noise=1.0, query_noise=0.3,
                       Omega=OMEGA)
    risks = baselines.baseline_risks(t, (4, 12))
    assert set(risks) == set(baselines.BASELINES)
    assert np.all(risks["bayes_ridge"] < risks["min_norm"]) and np.all(risks["bayes_ridge"] < risks["pgd"])


def test_mp_stieltjes_against_quadrature_and_finite_differences():
    for gamma, lam in [(0.3, 0.5), (2.0, 0.1), (1.0, 1e-2)]:
        a, b = (1 - np.sqrt(gamma)) ** 2, (1 + np.sqrt(gamma)) ** 2
        # x = a + (b - a)(1 - cos th) / 2 removes the square-root edges: a smooth integrand in th
        # (midpoint rule: no node at the edge x = a = 0 of gamma = 1)
        n = 20_000
        th = (np.arange(n) + 0.5) * np.pi / n
        x = a + (b - a) * (1 - np.cos(th)) / 2
        f = ((b - a) / 2 * np.sin(th)) ** 2 / (2 * np.pi * gamma * x * (x + lam))
        m_quad = f.sum() * np.pi / n + max(0.0, 1 - 1 / gamma) / lam   # the atom at 0 when gamma > 1
        m, dm = baselines.mp_stieltjes(gamma, lam)
        assert m == pytest.approx(m_quad, rel=1e-8)
        h = 1e-6 * lam
        fd = -(baselines.mp_stieltjes(gamma, lam + h)[0] - baselines.mp_stieltjes(gamma, lam - h)[0]) / (2 * h)
        assert dm == pytest.approx(fd, rel=1e-6)


@pytest.mark.parametrize("lam", [None, 0.3])
def test_asymptotic_ridge_risk_matches_large_d_monte_carlo(lam):
    """d = 80, L = 128 (gamma = 0.625), isotropic Sigma = 0.5 I, Omega = 2 I / d (signal r^2 = 1).
    Deterministic-equivalent error O(1/d) ~ 1%: tolerance 4 SE + 3%."""
    d, L, noise = 80, 128, 0.5
    Sigma, Omega = 0.5 * np.eye(d), 2.0 / d * np.eye(d)
    t = icl.make_tasks(_rng(3), d, 120, 64, L, laws.covariate_law("gaussian", Sigma), noise=noise, query_noise=0.3,
                       Omega=Omega)
    w_hat = (baselines.posterior_mean(t, (L,)) if lam is None else baselines.ridge(t, (L,), lam))[0]
    loss = 0.5 * (np.einsum("nqi,ni->nq", t.x_q, w_hat) - t.y_q)[0::2] ** 2
    est = loss.mean()
    se = loss.mean(axis=1).std(ddof=1) / np.sqrt(loss.shape[0])
    pred = baselines.asymptotic_ridge_risk(d, L, Sigma, Omega, noise, 0.3, lam)
    assert abs(est - pred) <= 4 * se + 0.03 * pred
    if lam is None:   # the Bayes penalty: the formula reduces to noise^2 gamma m / 2
        m, _ = baselines.mp_stieltjes(d / L, (d / L) * noise**2 / (d * 0.5 * 2.0 / d))
        assert pred == pytest.approx(0.5 * (noise**2 * (d / L) * m + 0.09), rel=1e-12)


def test_asymptotic_ridge_risk_is_nan_without_a_closed_form():
    assert np.isnan(baselines.asymptotic_ridge_risk(3, 10, ANISO, None, 0.5))
    assert np.isnan(baselines.asymptotic_ridge_risk(3, 10, np.eye(3), OMEGA, 0.5))
    # noiseless, Bayes penalty: the interpolation limit (1 - 1/gamma)_+ r^2 / 2
    assert baselines.asymptotic_ridge_risk(4, 2, np.eye(4), None, 0.0) == pytest.approx(0.5 * 0.5 * 4)
    assert baselines.asymptotic_ridge_risk(4, 8, np.eye(4), None, 0.0) == 0.0
