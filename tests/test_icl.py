"""In-context regression: tasks, fixed matrices, init, Bayes optimum, baselines, the three
models and their analytic gradients (against finite differences and independent loops)."""
import numpy as np
import pytest

from sfxlin import icl, laws
from sfxlin.laws import Gaussian, Rademacher

ANISO = np.diag([2.0, 1.0, 0.5])


def _rng(*ids):
    return np.random.default_rng([*ids, 7303])


def _tasks(d=3, n_pairs=3, n_queries=2, L_max=32, Sigma=None, law="gaussian", seed=0):
    Sigma = np.eye(d) if Sigma is None else Sigma
    return icl.make_tasks(_rng(seed), d, n_pairs, n_queries, L_max, laws.covariate_law(law, Sigma))


def _generic_theta(D, rng, scale=0.4):
    """A generic (not block-structured) parameter point."""
    return scale * rng.standard_normal((D, D)), scale * rng.standard_normal(D)


# --------------------------------------------------------------------------- tasks


@pytest.mark.parametrize("law", ["gaussian", "rademacher"])
def test_make_tasks_shapes_and_antithetic_pairs(law):
    d, n_pairs, q, L_max = 3, 4, 2, 16
    t = _tasks(d, n_pairs, q, L_max, ANISO, law)
    n = 2 * n_pairs
    assert t.Z.shape == (n, L_max, d + 1) and t.w.shape == (n, d)
    assert t.x_q.shape == (n, q, d) and t.y_q.shape == (n, q) and t.Sigma.shape == (d, d)
    assert (t.n_tasks, t.d, t.D, t.L_max, t.n_queries, t.paired) == (n, d, d + 1, L_max, q, True)
    np.testing.assert_allclose(t.Sigma, ANISO, rtol=1e-14, atol=1e-15)
    # pairs (w, -w) share prompt covariates and query points; labels are exact opposites
    np.testing.assert_array_equal(t.w[1::2], -t.w[0::2])
    np.testing.assert_array_equal(t.Z[1::2, :, :d], t.Z[0::2, :, :d])
    np.testing.assert_array_equal(t.Z[1::2, :, d], -t.Z[0::2, :, d])
    np.testing.assert_array_equal(t.x_q[1::2], t.x_q[0::2])
    np.testing.assert_array_equal(t.y_q[1::2], -t.y_q[0::2])
    # noiseless labels y = w^T x, and masked queries z_q = (x_q, 0)
    np.testing.assert_allclose(t.Z[..., d], np.einsum("nli,ni->nl", t.Z[..., :d], t.w), rtol=1e-14, atol=1e-14)
    np.testing.assert_allclose(t.y_q, np.einsum("nqi,ni->nq", t.x_q, t.w), rtol=1e-14, atol=1e-14)
    np.testing.assert_array_equal(t.z_q[..., :d], t.x_q)
    assert np.all(t.z_q[..., d] == 0)
    # nested prompts: the length-L prompt is the first L tokens
    np.testing.assert_array_equal(t.prompt(5), t.Z[:, :5])


def test_make_tasks_rademacher_covariates_are_scaled_signs():
    S = np.linalg.cholesky(ANISO)
    t = icl.make_tasks(_rng(1), 3, 2, 1, 64, Rademacher(scale=S))
    r = np.linalg.solve(S, t.Z[..., :3].reshape(-1, 3).T)
    np.testing.assert_allclose(np.abs(r), 1.0, rtol=1e-12)
    np.testing.assert_allclose(t.Sigma, ANISO, rtol=1e-14)
    # laws.covariate_law("rademacher", Sigma) uses the symmetric root: covariance Sigma exactly
    np.testing.assert_allclose(laws.covariate_law("rademacher", ANISO).cov, ANISO, rtol=1e-12, atol=1e-15)


def test_make_tasks_is_reproducible_and_validates():
    a, b = _tasks(seed=3), _tasks(seed=3)
    np.testing.assert_array_equal(a.Z, b.Z)
    np.testing.assert_array_equal(a.y_q, b.y_q)
    with pytest.raises(ValueError, match="x_law"):
        icl.make_tasks(_rng(0), 3, 2, 2, 8, Gaussian(cov=np.eye(2)))
    with pytest.raises(ValueError, match="n_pairs"):
        icl.make_tasks(_rng(0), 3, 0, 2, 8, Gaussian(cov=np.eye(3)))
    with pytest.raises(TypeError, match="Generator"):
        icl.make_tasks(0, 3, 2, 2, 8, Gaussian(cov=np.eye(3)))
    with pytest.raises(ValueError, match="L must be"):
        a.prompt(a.L_max + 1)
    with pytest.raises(ValueError, match="unknown law name 'cauchy'"):
        laws.covariate_law("cauchy", np.eye(2))


def test_subset_keeps_pairs_only_when_whole_pairs_are_kept():
    t = _tasks(n_pairs=3)
    assert t.subset(slice(0, 4)).paired and not t.subset(slice(1, 5)).paired
    assert t.subset(slice(0, 4)).n_tasks == 4


# --------------------------------------------------------------------------- fixed matrices


def test_make_tasks_draws_in_the_documented_order():
    """w, then the prompt covariates, then the query covariates, each one call of the law: the
    tasks' arrays are those draws (task 2i + 1 the antithetic partner of task 2i)."""
    law = laws.covariate_law("gaussian", ANISO)
    t = icl.make_tasks(_rng(4), 3, 5, 2, 20, law)
    rng = _rng(4)
    w = rng.standard_normal((5, 3))
    x = law.sample(rng, (5, 20))
    xq = law.sample(rng, (5, 2))
    np.testing.assert_array_equal(t.w[0::2], w)
    np.testing.assert_array_equal(t.Z[0::2, :, :3], x)
    np.testing.assert_array_equal(t.Z[1::2, :, :3], x)
    np.testing.assert_array_equal(t.Z[0::2, :, 3], np.einsum("pli,pi->pl", x, w))
    np.testing.assert_array_equal(t.Z[1::2, :, 3], -np.einsum("pli,pi->pl", x, w))
    np.testing.assert_array_equal(t.x_q[1::2], xq)


def test_pairs_are_stored_once_and_read_as_the_whole_tasks():
    """make_tasks keeps each pair's tokens once (d + 1 numbers a pair and token); Z, prompt,
    subset, Ghat and the linear models read the same numbers as tasks given the whole array."""
    d, n_pairs, L_max = 3, 4, 24
    t = _tasks(d, n_pairs, 2, L_max, ANISO, seed=5)
    assert t.pairs is not None
    stored = sum(a.nbytes for a in vars(t).values() if isinstance(a, np.ndarray))
    stored += t.pairs.x.nbytes + t.pairs.y.nbytes
    assert t.pairs.x.nbytes + t.pairs.y.nbytes == n_pairs * L_max * (d + 1) * 8
    assert stored < t.Z.nbytes                      # the whole array is not held
    assert t.Z is not t.Z                           # assembled at each read, as z_q
    whole = icl.Tasks(Z=t.Z, w=t.w, x_q=t.x_q, y_q=t.y_q, Sigma=t.Sigma)
    assert whole.pairs is None
    for L in (1, 7, L_max):
        np.testing.assert_array_equal(t.prompt(L), whole.prompt(L))
        np.testing.assert_array_equal(t.Ghat(L), icl.Ghat(whole.Z, L))   # bit for bit
        np.testing.assert_array_equal(icl.model_matrix("linear", t, L), icl.Ghat(whole.Z, L))
    many = np.stack([icl.Ghat(whole.Z, L) for L in (3, 9, L_max)])
    np.testing.assert_array_equal(t.Ghat((3, 9, L_max)), many)
    np.testing.assert_array_equal(whole.Ghat([3, 9, L_max]), many)
    for idx in (slice(2, 6), slice(1, 4), [0, 3, 5], np.array([7, 2])):
        a, b = t.subset(idx), whole.subset(idx)
        np.testing.assert_array_equal(a.Z, b.Z)
        assert a.paired == b.paired and (a.pairs is not None) == (isinstance(idx, slice) and a.paired)
    import dataclasses

    unpaired = dataclasses.replace(t, paired=False)
    assert unpaired.pairs is None and not unpaired.paired
    np.testing.assert_array_equal(unpaired.Z, t.Z)


def test_pair_tokens_need_exact_antithetic_pairs():
    t = _tasks(seed=6)
    x, y = t.pairs.x, t.pairs.y
    kw = dict(w=t.w, x_q=t.x_q, y_q=t.y_q, Sigma=t.Sigma)
    w = t.w.copy()
    w[1] *= 1.5
    with pytest.raises(ValueError, match="exact antithetic pairs"):
        icl.Tasks(Z=icl.PairTokens(x, y), **dict(kw, w=w))
    with pytest.raises(ValueError, match="exact antithetic pairs"):
        icl.Tasks(Z=icl.PairTokens(x, y), paired=False, **kw)
    with pytest.raises(ValueError, match=r"x \(n_pairs, L_max, d\) and y \(n_pairs, L_max\)"):
        icl.Tasks(Z=icl.PairTokens(x, y[:, :-1]), **kw)
    bad = x.copy()
    bad[0, 2, 1] = np.nan
    with pytest.raises(ValueError, match="Tasks.Z.x must be finite"):
        icl.Tasks(Z=icl.PairTokens(bad, y), **kw)


@pytest.mark.parametrize("law", ["gaussian", "rademacher"])
def test_Gamma_w_is_the_exact_second_moment(law):
    """Gamma_w = E[z z^T] for z = (x, w^T x): Monte Carlo mean within 5 CLT standard errors."""
    rng = _rng(11)
    x_law = laws.covariate_law(law, ANISO)
    w = rng.standard_normal(3)
    n = 200_000
    x = x_law.sample(rng, n)
    z = np.concatenate([x, (x @ w)[:, None]], axis=1)
    zz = z[:, :, None] * z[:, None, :]
    mean, se = zz.mean(axis=0), zz.std(axis=0) / np.sqrt(n)
    G = icl.Gamma_w(ANISO, w)
    assert np.all(np.abs(mean - G) <= 5 * se + 1e-12)
    # and the closed form itself, entry by entry
    np.testing.assert_allclose(G[:3, :3], ANISO)
    np.testing.assert_allclose(G[:3, 3], ANISO @ w)
    np.testing.assert_allclose(G[3, 3], w @ ANISO @ w)
    # vectorised over leading axes of w
    W = rng.standard_normal((2, 5, 3))
    np.testing.assert_allclose(icl.Gamma_w(ANISO, W)[1, 3], icl.Gamma_w(ANISO, W[1, 3]))


def test_Ghat_is_the_empirical_second_moment():
    t = _tasks(L_max=10)
    G = icl.Ghat(t.Z, 7)
    loop = sum(np.einsum("ni,nj->nij", t.Z[:, k], t.Z[:, k]) for k in range(7)) / 7
    np.testing.assert_allclose(G, loop, rtol=1e-13)
    np.testing.assert_allclose(icl.Ghat(t.Z), icl.Ghat(t.Z, 10))


def test_linear_L_converges_to_linear_inf():
    """Ghat_L -> Gamma_w at the CLT rate L^{-1/2}; the linear(L) risk, predictions and gradients
    converge to those of linear(inf) at fixed parameters."""
    t = _tasks(n_pairs=8, L_max=1 << 16, Sigma=ANISO, seed=2)
    Gam = icl.Gamma_w(t.Sigma, t.w)
    Ls = [1 << 8, 1 << 12, 1 << 16]
    err = np.array([np.mean(np.linalg.norm(icl.Ghat(t.Z, L) - Gam, axis=(-2, -1))) for L in Ls])
    # each step multiplies L by 16: the error should shrink by about 4 (2 to 8 allows noise)
    assert np.all(err[1:] < err[:-1] / 2) and np.all(err[1:] > err[:-1] / 8)
    U, v = _generic_theta(4, _rng(3))
    r_inf, gU_inf, gv_inf = icl.risk_grad("linear_inf", U, v, t)
    gaps = []
    for L in (1 << 6, 1 << 16):   # L x 1024: the gap should shrink ~32x; ask for 8x
        r, gU, gv = icl.risk_grad("linear", U, v, t, L)
        gaps.append(abs(r - r_inf) + np.linalg.norm(gU - gU_inf) + np.linalg.norm(gv - gv_inf))
    assert gaps[1] < gaps[0] / 8
    assert gaps[1] < 0.05 * (abs(r_inf) + np.linalg.norm(gU_inf) + np.linalg.norm(gv_inf))


# --------------------------------------------------------------------------- init, optimum


def test_init_alpha_values_and_balance():
    assert icl.init_alpha(3, np.eye(3)) == pytest.approx(0.5373, abs=5e-5)
    assert icl.init_alpha(3, ANISO) == pytest.approx(0.2686, abs=5e-5)
    for Sigma in (np.eye(3), ANISO):
        U0, v0 = icl.init_theta(3, Sigma)
        a = icl.init_alpha(3, Sigma)
        np.testing.assert_allclose(U0[:3, :3], a * np.eye(3) / np.sqrt(3))  # Theta Theta^T = I/sqrt(d)
        assert np.all(U0[3] == 0) and np.all(U0[:, 3] == 0)
        np.testing.assert_array_equal(v0, [0, 0, 0, a])
        assert np.linalg.norm(U0) == pytest.approx(np.linalg.norm(v0), rel=1e-14)
        assert icl.off_block_mass(U0, v0) == 0.0


def test_bayes_optimum_predicts_exactly_and_is_balanced():
    t = _tasks(Sigma=ANISO, seed=4)
    U, v = icl.bayes_optimum(ANISO)
    c = np.sqrt(np.linalg.norm(np.linalg.inv(ANISO)))
    np.testing.assert_allclose(v, [0, 0, 0, c])
    np.testing.assert_allclose(U[:3, :3], np.linalg.inv(ANISO) / c)
    assert np.linalg.norm(U) == pytest.approx(np.linalg.norm(v), rel=1e-14)
    assert icl.risk("linear_inf", U, v, t) < 1e-28
    pred = icl.linear_predict(U, v, icl.Gamma_w(t.Sigma, t.w), t.z_q)
    np.testing.assert_allclose(pred, t.y_q, rtol=1e-13, atol=1e-13)


def test_off_block_mass_and_theta_distance():
    U = np.arange(16.0).reshape(4, 4)
    v = np.array([1.0, 2.0, 3.0, 4.0])
    outside = np.concatenate([U[3, :], U[:3, 3], v[:3]])
    assert icl.off_block_mass(U, v) == pytest.approx(np.linalg.norm(outside))
    stack = icl.off_block_mass(np.stack([U, 2 * U]), np.stack([v, 2 * v]))
    np.testing.assert_allclose(stack, np.array([1.0, 2.0]) * icl.off_block_mass(U, v))
    U2, v2 = U + 1.0, v - 2.0
    assert icl.theta_distance(U, v, U2, v2) == pytest.approx(np.sqrt(16 * 1 + 4 * 4))
    assert icl.theta_distance(U, v, U, v) == 0.0


def test_ridge_risk_against_explicit_solutions():
    t = _tasks(d=3, n_pairs=3, n_queries=4, L_max=12, Sigma=ANISO, seed=5)
    # noiseless, L >= d: least squares recovers w, risk ~ 0
    assert icl.ridge_risk(t, 12) < 1e-25
    # underdetermined (L < d): minimum-norm solution = pseudo-inverse
    X, y = t.Z[:, :2, :3], t.Z[:, :2, 3]
    w_mn = np.stack([np.linalg.pinv(Xi) @ yi for Xi, yi in zip(X, y)])
    r = np.einsum("nqi,ni->nq", t.x_q, w_mn) - t.y_q
    assert icl.ridge_risk(t, 2) == pytest.approx(0.5 * np.mean(r**2), rel=1e-10)
    # ridge: solve the augmented least-squares problem [X / sqrt(L); sqrt(lam) I] w = [y / sqrt(L); 0]
    lam, L = 0.3, 6
    X, y = t.Z[:, :L, :3], t.Z[:, :L, 3]
    w_r = np.stack([np.linalg.lstsq(np.vstack([Xi / np.sqrt(L), np.sqrt(lam) * np.eye(3)]),
                                    np.concatenate([yi / np.sqrt(L), np.zeros(3)]), rcond=None)[0]
                    for Xi, yi in zip(X, y)])
    r = np.einsum("nqi,ni->nq", t.x_q, w_r) - t.y_q
    assert icl.ridge_risk(t, L, lam) == pytest.approx(0.5 * np.mean(r**2), rel=1e-10)
    with pytest.raises(ValueError, match="lam"):
        icl.ridge_risk(t, L, -1.0)


# --------------------------------------------------------------------------- models


def test_softmax_prediction_matches_a_per_token_loop():
    t = _tasks(d=2, n_pairs=2, n_queries=2, L_max=9, seed=6)
    U, v = _generic_theta(3, _rng(7), scale=0.8)
    pred = icl.softmax_predict(U, v, t.prompt(9), t.z_q)
    for i in range(t.n_tasks):
        for j in range(t.n_queries):
            s = [t.Z[i, k] @ U @ t.z_q[i, j] for k in range(9)]
            p = np.exp(np.array(s) - max(s))
            p /= p.sum()
            assert pred[i, j] == pytest.approx(v @ (p @ t.Z[i, :9]), rel=1e-12)


def test_softmax_linearises_at_small_U():
    """For U -> eps U: softmax pred = v.zbar + eps v.(Ghat_L - zbar zbar^T) U z_q + O(eps^2)."""
    t = _tasks(d=3, n_pairs=2, L_max=20, seed=8)
    U, v = _generic_theta(4, _rng(9))
    Z = t.prompt(20)
    zbar = Z.mean(axis=1)
    C = icl.Ghat(Z) - zbar[:, :, None] * zbar[:, None, :]
    first = np.einsum("i,nij,jk,nqk->nq", v, C, U, t.z_q)
    for eps in (1e-3, 1e-4):
        pred = icl.softmax_predict(eps * U, v, Z, t.z_q)
        slope = (pred - (zbar @ v)[:, None]) / eps
        assert np.max(np.abs(slope - first)) < 50 * eps * np.max(np.abs(first))


def _fd_grad(f, U, v, h=1e-5):
    gU, gv = np.zeros_like(U), np.zeros_like(v)
    for idx in np.ndindex(U.shape):
        E = np.zeros_like(U)
        E[idx] = h
        gU[idx] = (f(U + E, v) - f(U - E, v)) / (2 * h)
    for i in range(v.size):
        e = np.zeros_like(v)
        e[i] = h
        gv[i] = (f(U, v + e) - f(U, v - e)) / (2 * h)
    return gU, gv


@pytest.mark.parametrize("model", icl.MODELS)
@pytest.mark.parametrize("seed", [0, 1])
def test_analytic_gradients_match_central_differences(model, seed):
    """Central differences with h = 1e-5: truncation O(h^2) ~ 1e-10 and rounding
    O(eps / h) ~ 1e-11 relative, far below the 1e-6 criterion."""
    t = _tasks(d=3, n_pairs=2, n_queries=2, L_max=16, Sigma=ANISO, seed=10 + seed)
    U, v = _generic_theta(4, _rng(20 + seed), scale=0.6)
    L = None if model == "linear_inf" else 16
    risk, gU, gv = icl.risk_grad(model, U, v, t, L)
    assert risk == pytest.approx(icl.risk(model, U, v, t, L), rel=1e-14)
    fU, fv = _fd_grad(lambda U_, v_: icl.risk(model, U_, v_, t, L), U, v)
    g = np.concatenate([gU.ravel(), gv])
    f = np.concatenate([fU.ravel(), fv])
    assert np.linalg.norm(g - f) <= 1e-6 * np.linalg.norm(f)
    # z_q = (x_q, 0): the last column of U never matters
    assert np.all(gU[:, 3] == 0)


@pytest.mark.parametrize("model", icl.MODELS)
def test_leading_parameter_axes_are_independent_evaluations(model):
    t = _tasks(d=2, n_pairs=2, L_max=8, seed=12)
    rng = _rng(13)
    Us, vs = 0.5 * rng.standard_normal((2, 3, 3, 3)), 0.5 * rng.standard_normal((2, 3, 3))
    L = None if model == "linear_inf" else 8
    r, gU, gv = icl.risk_grad(model, Us, vs, t, L)
    assert r.shape == (2, 3) and gU.shape == (2, 3, 3, 3) and gv.shape == (2, 3, 3)
    r1, gU1, gv1 = icl.risk_grad(model, Us[1, 2], vs[1, 2], t, L)
    np.testing.assert_allclose([r[1, 2]], [r1], rtol=1e-13)
    np.testing.assert_allclose(gU[1, 2], gU1, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(gv[1, 2], gv1, rtol=1e-12, atol=1e-15)


def test_softmax_with_huge_logits_is_finite_and_tends_to_hard_attention():
    t = _tasks(d=3, n_pairs=2, L_max=64, seed=14)
    U, v = _generic_theta(4, _rng(15))
    U = 1e3 * U
    with np.errstate(over="raise", invalid="raise", divide="raise"):
        risk, gU, gv = icl.softmax_risk_grad(U, v, t.prompt(64), t.z_q, t.y_q)
    assert np.isfinite(risk) and np.all(np.isfinite(gU)) and np.all(np.isfinite(gv))
    # logits of order 1e3: the softmax is the argmax token unless two logits are within ~40
    S = np.einsum("nli,ij,nqj->nql", t.Z[:, :64], U, t.z_q)
    top2 = np.sort(S, axis=-1)[..., -2:]
    clear = top2[..., 1] - top2[..., 0] > 50
    hard = np.einsum("nqi,i->nq", t.Z[np.arange(t.n_tasks)[:, None], S.argmax(-1)], v)
    pred = icl.softmax_predict(U, v, t.prompt(64), t.z_q)
    assert clear.sum() >= 2
    np.testing.assert_allclose(pred[clear], hard[clear], rtol=1e-12, atol=1e-12)


def test_model_validation():
    t = _tasks()
    U, v = icl.init_theta(3, np.eye(3))
    with pytest.raises(ValueError, match="unknown model"):
        icl.risk_grad("relu", U, v, t, 8)
    with pytest.raises(ValueError, match="needs a prompt length"):
        icl.risk_grad("softmax", U, v, t)
    with pytest.raises(ValueError, match="U must be"):
        icl.risk("linear", U[:3], v, t, 8)
