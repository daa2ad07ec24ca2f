"""Tasks beyond the paper's: label noise (prompts, query targets), a prior w ~ N(0, Omega), non-centred
covariates. Draws, population moments, infinite-prompt limits and Bayes risks against Monte Carlo
(tolerance: 4 standard errors, a false alarm once in ~16000 runs), and the fast all-L trainer against
the per-L paths on noisy tasks (1e-10)."""
import numpy as np
import pytest

from sfxlin import baselines, bayes, icl, laws, training
from sfxlin.laws import Gaussian
from sfxlin.testing import reference_c3

ANISO = np.diag([2.0, 1.0, 0.5])
OMEGA = np.array([[1.0, 0.3, 0.0], [0.3, 0.5, 0.1], [0.0, 0.1, 2.0]])


def _rng(*ids):
    return np.random.default_rng([*ids, 9151])


def _old_make_tasks(rng, d, n_pairs, n_queries, L_max, x_law):
    """The paper's task draw, written out independently (the layout before noise and priors)."""
    w = rng.standard_normal((n_pairs, d))
    x = x_law.sample(rng, (n_pairs, L_max))
    xq = x_law.sample(rng, (n_pairs, n_queries))
    Z, W, XQ, YQ = [], [], [], []
    for p in range(n_pairs):
        y = x[p] @ w[p]
        yq = xq[p] @ w[p]
        for s in (1.0, -1.0):
            Z.append(np.concatenate([x[p], (y if s > 0 else -y)[:, None]], axis=1))
            W.append(w[p] if s > 0 else -w[p])
            XQ.append(xq[p])
            YQ.append(yq if s > 0 else -yq)
    return np.array(Z), np.array(W), np.array(XQ), np.array(YQ)


@pytest.mark.parametrize("law", ["gaussian", "rademacher"])
def test_default_tasks_are_bit_for_bit_the_papers(law):
    x_law = laws.covariate_law(law, ANISO)
    t = icl.make_tasks(_rng(1), 3, 5, 2, 17, x_law)
    Z, W, XQ, YQ = _old_make_tasks(_rng(1), 3, 5, 2, 17, x_law)
    # einsum vs matmul may order the 3 products differently: labels agree to rounding, the rest exactly
    np.testing.assert_array_equal(t.Z[..., :3], Z[..., :3])
    np.testing.assert_allclose(t.Z[..., 3], Z[..., 3], rtol=0, atol=1e-14)
    np.testing.assert_array_equal(t.w, W)
    np.testing.assert_array_equal(t.x_q, XQ)
    np.testing.assert_allclose(t.y_q, YQ, rtol=0, atol=1e-14)
    assert t.noise == 0.0 and t.query_noise == 0.0
    np.testing.assert_array_equal(t.Omega, np.eye(3))
    # the defaults draw nothing more: the generator is left where the paper's draw leaves it
    g1, g2 = _rng(1), _rng(1)
    icl.make_tasks(g1, 3, 5, 2, 17, x_law)
    _old_make_tasks(g2, 3, 5, 2, 17, x_law)
    assert g1.standard_normal() == g2.standard_normal()


def test_noisy_prior_tasks_draw_order_and_antithetic_pairs():
    d, n_pairs, q, L = 3, 4, 3, 20
    law = Gaussian(mean=[1.0, -0.5, 0.2], cov=ANISO)
    t = icl.make_tasks(_rng(2), d, n_pairs, q, L, law, noise=0.7, query_noise=0.3, Omega=OMEGA)
    g = _rng(2)
    w = g.standard_normal((n_pairs, d)) @ np.linalg.cholesky(OMEGA).T
    x = law.sample(g, (n_pairs, L))
    xq = law.sample(g, (n_pairs, q))
    eps = 0.7 * g.standard_normal((n_pairs, L))
    eps_q = 0.3 * g.standard_normal((n_pairs, q))
    np.testing.assert_array_equal(t.w[0::2], w)
    np.testing.assert_array_equal(t.Z[0::2, :, :d], x)
    np.testing.assert_allclose(t.Z[0::2, :, d], np.einsum("pli,pi->pl", x, w) + eps, atol=1e-13)
    np.testing.assert_allclose(t.y_q[0::2], np.einsum("pqi,pi->pq", xq, w) + eps_q, atol=1e-13)
    # (w, eps) <-> (-w, -eps) with shared covariates, exactly
    np.testing.assert_array_equal(t.w[1::2], -t.w[0::2])
    np.testing.assert_array_equal(t.Z[1::2, :, :d], t.Z[0::2, :, :d])
    np.testing.assert_array_equal(t.Z[1::2, :, d], -t.Z[0::2, :, d])
    np.testing.assert_array_equal(t.y_q[1::2], -t.y_q[0::2])
    assert (t.noise, t.query_noise) == (0.7, 0.3)
    np.testing.assert_array_equal(t.Omega, OMEGA)
    np.testing.assert_array_equal(t.mean, [1.0, -0.5, 0.2])
    s = t.subset(slice(0, 4))
    assert (s.noise, s.query_noise) == (0.7, 0.3) and s.paired


@pytest.mark.parametrize("kw, match", [
    (dict(noise=-0.1), "noise"), (dict(query_noise=float("nan")), "query_noise"),
    (dict(noise="a"), "noise"), (dict(Omega=np.diag([1.0, -1.0, 1.0])), "Omega"),
    (dict(Omega=np.eye(2)), "Omega")])
def test_make_tasks_rejects_bad_noise_and_prior(kw, match):
    with pytest.raises(ValueError, match=match):
        icl.make_tasks(_rng(0), 3, 2, 1, 4, laws.covariate_law("gaussian", ANISO), **kw)


# --------------------------------------------------------------------------- population moments


def _mc_check(samples, expected, k=4.0):
    """Mean of ``samples`` (first axis) equals ``expected`` within k standard errors, entrywise."""
    m = samples.mean(axis=0)
    se = samples.std(axis=0, ddof=1) / np.sqrt(samples.shape[0])
    assert np.all(np.abs(m - expected) <= k * se + 1e-12), (m, expected, se)


def test_task_second_moment_with_noise_and_mean_matches_monte_carlo():
    d, s = 3, 0.8
    m = np.array([0.5, -1.0, 0.3])
    w = np.array([0.7, -0.2, 1.1])
    g = _rng(3)
    x = g.multivariate_normal(m, ANISO, size=200_000)
    z = np.concatenate([x, (x @ w + s * g.standard_normal(len(x)))[:, None]], axis=1)
    G = icl.Gamma_w(ANISO, w, m, noise=s)
    _mc_check(z[:, :, None] * z[:, None, :], G)
    _mc_check(z, bayes.task_mean(w, m))
    _mc_check((z - bayes.task_mean(w, m))[:, :, None] * (z - bayes.task_mean(w, m))[:, None, :],
              bayes.task_covariance(ANISO, w, s))
    # noise only enters the label-label corner
    G0 = icl.Gamma_w(ANISO, w, m)
    np.testing.assert_array_equal(np.delete(G, d, 0), np.delete(G0, d, 0))
    assert G[d, d] - G0[d, d] == pytest.approx(s**2, rel=1e-12)


def test_prior_second_moment_matches_monte_carlo():
    s, m = 0.4, np.array([0.3, 0.0, -0.6])
    g = _rng(4)
    n = 200_000
    w = g.standard_normal((n, 3)) @ np.linalg.cholesky(OMEGA).T
    x = g.multivariate_normal(m, ANISO, size=n)
    z = np.concatenate([x, (np.einsum("ni,ni->n", x, w) + s * g.standard_normal(n))[:, None]], axis=1)
    _mc_check(z[:, :, None] * z[:, None, :], bayes.prior_second_moment(ANISO, OMEGA, m, s))


# --------------------------------------------------------------------------- limits


def test_softmax_limit_is_affine_for_non_centred_tokens_and_matches_monte_carlo():
    """The tilted mean E[e^{a.z} z] / E[e^{a.z}] by Monte Carlo (a ratio of sample means; delta-method
    standard error) against softmax_limit; it differs from the linear limit by many standard errors,
    and at z_q = 0 the softmax limit is v^T E z != 0 (an intercept) while linear's is 0."""
    m, s = np.array([0.8, -0.4, 0.5]), 0.5
    w = np.array([[0.6, -0.3, 0.9]])
    g = _rng(5)
    U = 0.3 * g.standard_normal((4, 4))
    v = g.standard_normal(4)
    z_q = np.array([[[0.4, -0.2, 0.7, 0.0]]])
    N = 400_000
    x = g.multivariate_normal(m, ANISO, size=N)
    z = np.concatenate([x, (x @ w[0] + s * g.standard_normal(N))[:, None]], axis=1)
    e = np.exp(z @ (U @ z_q[0, 0]))
    num, den = e * (z @ v), e
    est = num.mean() / den.mean()
    # delta method for a ratio of means
    resid = (num - est * den) / den.mean()
    se = resid.std(ddof=1) / np.sqrt(N)
    lim = bayes.softmax_limit(U, v, ANISO, w, z_q, m, s)[0, 0]
    lin = bayes.linear_limit(U, v, ANISO, w, z_q, m, s)[0, 0]
    assert abs(est - lim) <= 4 * se
    assert abs(lin - lim) > 50 * se
    # the intercept: at z_q = 0
    zero = np.zeros((1, 1, 4))
    assert bayes.softmax_limit(U, v, ANISO, w, zero, m, s)[0, 0] == pytest.approx(bayes.task_mean(w, m)[0] @ v)
    assert bayes.linear_limit(U, v, ANISO, w, zero, m, s)[0, 0] == 0.0
    # centred: the two limits coincide
    np.testing.assert_allclose(bayes.softmax_limit(U, v, ANISO, w, z_q, None, s),
                               bayes.linear_limit(U, v, ANISO, w, z_q, None, s), rtol=1e-13)


def test_linear_limit_matches_long_prompt_monte_carlo():
    m, s = np.array([0.8, -0.4, 0.5]), 0.5
    t = icl.make_tasks(_rng(6), 3, 1, 2, 200_000, Gaussian(mean=m, cov=ANISO), noise=s)
    g = _rng(7)
    U, v = 0.3 * g.standard_normal((4, 4)), g.standard_normal(4)
    h = t.z_q[0] @ U.T                              # (q, D): U z_q
    per_token = (t.Z[0] @ v)[:, None] * (t.Z[0] @ h.T)   # (L, q): (v.z)(z . U z_q)
    lim = bayes.linear_limit(U, v, ANISO, t.w[:1], t.z_q[:1], m, s)[0]
    _mc_check(per_token, lim)


# --------------------------------------------------------------------------- Bayes risks


def test_linear_inf_optimum_reaches_the_query_noise_floor():
    law = Gaussian(mean=[0.5, 0.0, -0.5], cov=ANISO)
    t = icl.make_tasks(_rng(8), 3, 4000, 2, 1, law, noise=0.9, query_noise=0.6, Omega=OMEGA)
    U, v = bayes.linear_inf_optimum(ANISO, t.mean)
    pred = icl.linear_predict(U, v, icl.model_matrix("linear_inf", t), t.z_q)
    # exactly w^T x_q: the error is the query noise alone
    np.testing.assert_allclose(pred, np.einsum("nqi,ni->nq", t.x_q, t.w), rtol=1e-10, atol=1e-10)
    loss = 0.5 * (pred - t.y_q)[0::2].ravel() ** 2
    _mc_check(loss[:, None], np.array([bayes.bayes_risk_linear_inf(0.6)]))


@pytest.mark.parametrize("L, Sigma, Omega", [(2, 0.5 * np.eye(5), 2.0 * np.eye(5)),
                                              (3, np.diag([2.0, 1.0, 0.5, 4.0]), np.diag([0.5, 1.0, 2.0, 0.25])),
                                              (6, ANISO, OMEGA)])
def test_bayes_risk_of_noiseless_tasks_matches_monte_carlo(L, Sigma, Omega):
    d = Sigma.shape[0]
    t = icl.make_tasks(_rng(9, L), d, 3000, 1, L, laws.covariate_law("gaussian", Sigma), query_noise=0.2, Omega=Omega)
    w_hat = baselines.posterior_mean(t, (L,))[0]
    loss = 0.5 * (np.einsum("nqi,ni->nq", t.x_q, w_hat) - t.y_q)[0::2].ravel() ** 2
    expected = bayes.bayes_risk_task(d, L, Sigma, Omega, 0.0, 0.2)
    assert np.isfinite(expected)
    _mc_check(loss[:, None], np.array([expected]))


def test_bayes_risk_has_no_closed_form_where_documented():
    assert np.isnan(bayes.bayes_risk_task(3, 10, ANISO, None, 0.5))           # noisy
    assert np.isnan(bayes.bayes_risk_task(3, 2, ANISO, None, 0.0))            # L < d, not whitened-isotropic
    assert np.isnan(bayes.bayes_risk_task(3, 2, np.eye(3), None, 0.0, mean=[1.0, 0, 0]))
    assert bayes.bayes_risk_task(3, 3, ANISO, OMEGA, 0.0, 0.4) == pytest.approx(0.08)
    assert bayes.whitened_scale(ANISO, np.diag([0.5, 1.0, 2.0])) == pytest.approx(1.0)
    assert bayes.whitened_scale(ANISO) is None


# --------------------------------------------------------------------------- the fast trainer on noisy tasks


@pytest.mark.parametrize("mean, Omega", [(None, None), ([0.4, -0.3, 0.2], OMEGA)])
def test_fast_trainer_on_noisy_tasks_matches_the_per_L_paths(mean, Omega):
    law = Gaussian(mean=mean, cov=ANISO) if mean is not None else laws.covariate_law("gaussian", ANISO)
    t = icl.make_tasks(_rng(10), 3, 3, 2, 32, law, noise=0.6, query_noise=0.4, Omega=Omega)
    Ls, kw = (4, 8, 32), dict(lr=0.02, n_steps=60, ckpt_every=20)
    fast = training.train_all_arrays(t, Ls, **kw)
    U0, v0 = icl.init_theta(3, t.second_moment)
    ref = reference_c3.train_reference_all(t, Ls, models=("softmax", "linear"), U0=U0, v0=v0, **kw)
    for m in ("softmax", "linear"):
        for k in ("U", "v", "risk"):
            np.testing.assert_allclose(fast[m][k], ref[m][k], rtol=0, atol=1e-10)
        for i, L in enumerate(Ls):
            one = training.train(m, t, L, **kw)
            np.testing.assert_allclose(fast[m]["U"][i], one["U"].values, rtol=0, atol=1e-10)
    inf = training.train("linear_inf", t, **kw)
    np.testing.assert_allclose(fast["linear_inf"]["U"], inf["U"].values, rtol=0, atol=1e-10)
    assert fast["pair_first"] and fast["n_shared_steps"] > 0
    # noisy held-out risks through the prefix engine equal the direct evaluation
    held = icl.make_tasks(_rng(11), 3, 2, 2, 64, law, noise=0.6, query_noise=0.4, Omega=Omega)
    eng = training.SoftmaxPrefixEngine(held, (8, 64))
    Us, vs = fast["softmax"]["U"][[0, 2], -1], fast["softmax"]["v"][[0, 2], -1]
    direct = [icl.risk("softmax", Us[i], vs[i], held, L) for i, L in enumerate((8, 64))]
    np.testing.assert_allclose(eng.step(Us, vs)[0], direct, rtol=1e-12)


def test_fast_trainer_refuses_noisy_tasks_without_exact_pairs():
    t = icl.make_tasks(_rng(12), 3, 2, 2, 16, laws.covariate_law("gaussian", ANISO), noise=0.5)
    Z = t.Z.copy()
    Z[1, 0, 3] += 1e-3                                  # breaks (w, eps) <-> (-w, -eps)
    broken = icl.Tasks(Z=Z, w=t.w, x_q=t.x_q, y_q=t.y_q, Sigma=t.Sigma, noise=0.5)
    with pytest.raises(ValueError, match="exact antithetic pairs"):
        training.train_all(broken, (4, 8), n_steps=2, ckpt_every=1)
