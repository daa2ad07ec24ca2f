"""softmax(inf) under an empirical covariate law: the exact finite sum against a naive loop, its
gradient against finite differences, linear(inf) for a Gaussian law (Gauss-Hermite nodes as an
empirical law), the fast engine against the simple trainer, and bad input."""
import numpy as np
import pytest
from numpy.polynomial.hermite_e import hermegauss

from sfxlin import icl, laws, training
from sfxlin.realdata import token_set


def gauss_hermite_law(d, n):
    """``N(0, I_d)`` as the empirical law of the ``n^d`` tensor Gauss-Hermite nodes with their weights
    (exact for polynomials of degree < 2n in each coordinate; for ``e^{b.x}`` the rule's error is
    ``~ n! |b|^{2n} / (2^n (2n)!)``, below 1e-17 here)."""
    x, w = hermegauss(n)
    X = np.stack(np.meshgrid(*[x] * d, indexing="ij"), axis=-1).reshape(-1, d)
    W = np.prod(np.stack(np.meshgrid(*[w / w.sum()] * d, indexing="ij"), axis=-1).reshape(-1, d), axis=1)
    return laws.Empirical(X, weights=W)


def weighted_law(rng, n=40, d=2):
    """An empirical law with unequal weights, centred and whitened exactly (weighted moments)."""
    X = rng.standard_normal((n, d)) ** 3                      # skewed, heavy
    w = rng.random(n) + 0.1
    w /= w.sum()
    X = X - w @ X
    C = (X * w[:, None]).T @ X
    X = X @ np.linalg.inv(np.linalg.cholesky(C)).T
    return laws.Empirical(X, weights=w)


def _theta(rng, d, M, scale=0.3):
    U0, v0 = icl.init_theta(d, M)
    return U0 + scale * rng.standard_normal(U0.shape), v0 + scale * rng.standard_normal(v0.shape)


@pytest.mark.parametrize("d, n", [(2, 40), (3, 16)])
def test_a_gaussian_law_gives_linear_inf(d, n):
    """The tilted mean of N(0, Gamma_w) is Gamma_w a (Lemma 2.1): risk and gradient of softmax(inf)
    under the Gauss-Hermite law equal those of linear(inf) to rounding, and so do the trajectories."""
    rng = np.random.default_rng(d)
    gh = gauss_hermite_law(d, n)
    tasks = icl.make_tasks(rng, d, 3, 2, 16, laws.covariate_law("gaussian", np.eye(d)))
    U, v = _theta(rng, d, tasks.second_moment)
    for got, ref in zip(icl.risk_grad("softmax_inf", U, v, tasks, x_law=gh), icl.risk_grad("linear_inf", U, v, tasks)):
        np.testing.assert_allclose(got, ref, rtol=0, atol=1e-13 * max(1.0, np.abs(ref).max()))
    res = training.train_all_arrays(tasks, None, models=("linear_inf", "softmax_inf"), n_steps=200, ckpt_every=50,
                                    x_law=gh)
    for key in ("U", "v", "risk"):
        np.testing.assert_allclose(res["softmax_inf"][key], res["linear_inf"][key], rtol=0, atol=1e-12)


def test_prediction_is_the_weighted_softmax_sum_over_the_support():
    """``v^T sum_i softmax_i(log pi_i + z_i^T U z_q) z_i`` by a plain loop over tasks and queries."""
    rng = np.random.default_rng(0)
    law = weighted_law(rng)
    tasks = icl.make_tasks(rng, 2, 2, 3, 8, law)
    U, v = _theta(rng, 2, tasks.second_moment, scale=1.0)
    support, weights = icl.support_tasks(tasks, law)
    pred = icl.softmax_predict(U, v, support.Z, tasks.z_q, weights)
    ref = np.empty_like(pred)
    for k in range(tasks.n_tasks):
        Z = np.column_stack([law.samples, law.samples @ tasks.w[k]])
        for j in range(tasks.n_queries):
            s = np.log(law.weights) + Z @ (U @ tasks.z_q[k, j])
            p = np.exp(s - s.max())
            ref[k, j] = v @ (p @ Z) / p.sum()
    np.testing.assert_allclose(pred, ref, rtol=1e-12, atol=1e-14)
    r = icl.risk("softmax_inf", U, v, tasks, x_law=law)
    assert r == pytest.approx(0.5 * np.mean((ref - tasks.y_q) ** 2), rel=1e-12)


@pytest.mark.parametrize("which", ["wine", "weighted"])
def test_gradient_matches_central_differences(which):
    """Every entry of the analytic gradient against (R(theta + h e) - R(theta - h e)) / 2h: the error
    is O(h^2) ~ 1e-10 relative to the curvature, plus rounding 1e-16 / h."""
    rng = np.random.default_rng(1)
    law = laws.Empirical(token_set("wine", 2)) if which == "wine" else weighted_law(rng, d=2)
    d = law.D
    tasks = icl.make_tasks(rng, d, 2, 2, 8, law)
    U, v = _theta(rng, d, tasks.second_moment)
    _, gU, gv = icl.risk_grad("softmax_inf", U, v, tasks, x_law=law)
    h = 1e-5

    def R(U, v):
        return icl.risk("softmax_inf", U, v, tasks, x_law=law)

    fdU = np.zeros_like(U)
    for i, j in np.ndindex(U.shape):
        E = np.zeros_like(U)
        E[i, j] = h
        fdU[i, j] = (R(U + E, v) - R(U - E, v)) / (2 * h)
    fdv = np.array([(R(U, v + h * e) - R(U, v - h * e)) / (2 * h) for e in np.eye(d + 1)])
    # central differences err by h^2 |R'''| / 6: 1e-10 times third derivatives up to ~1e3 here (the
    # weighted law's cubed atoms reach |x| ~ 10), so 1e-7 of the gradient's scale
    tol = 1e-7 * max(1.0, np.abs(gU).max(), np.abs(gv).max())
    np.testing.assert_allclose(gU, fdU, rtol=0, atol=tol)
    np.testing.assert_allclose(gv, fdv, rtol=0, atol=tol)
    assert np.abs(gU).max() > 1e-3 and np.abs(gv).max() > 1e-3        # a gradient that is not trivially 0


@pytest.mark.parametrize("pair_first", [True, False])
def test_fast_engine_matches_the_simple_trainer(pair_first):
    """train_all's softmax(inf) (prefix engine on the support, weights on the features, shifted logits)
    against train('softmax_inf') (icl.softmax_risk_grad on the support), equal and weighted atoms."""
    rng = np.random.default_rng(2)
    for law in (laws.Empirical(token_set("diabetes", 3)), weighted_law(rng, d=3)):
        tasks = icl.make_tasks(rng, 3, 3, 2, 32, law)
        fast = training.train_all_arrays(tasks, [8, 32], models=("softmax", "softmax_inf"), n_steps=60, ckpt_every=20,
                                         x_law=law, pair_first=pair_first)
        ref = training.train("softmax_inf", tasks, n_steps=60, ckpt_every=20, x_law=law)
        np.testing.assert_allclose(fast["softmax_inf"]["U"], ref.U.values, rtol=0, atol=1e-12)
        np.testing.assert_allclose(fast["softmax_inf"]["v"], ref.v.values, rtol=0, atol=1e-12)
        np.testing.assert_allclose(fast["softmax_inf"]["risk"], ref.risk.values, rtol=1e-12)
        assert fast["softmax_inf"]["U"].shape == (4, 4, 4)
        ds = training.train_all(tasks, [8, 32], models=("softmax_inf",), n_steps=60, ckpt_every=20, x_law=law)
        np.testing.assert_array_equal(ds.U_softmax_inf.values, training.train_all_arrays(
            tasks, [8, 32], models=("softmax_inf",), n_steps=60, ckpt_every=20, x_law=law)["softmax_inf"]["U"])


def test_softmax_L_on_the_whole_support_is_softmax_inf():
    """Equal weights: softmax(L) whose prompt is the set itself is softmax(inf), step for step."""
    rng = np.random.default_rng(3)
    law = laws.Empirical(token_set("wine", 2))
    tasks = icl.make_tasks(rng, 2, 2, 2, 8, law)
    support, weights = icl.support_tasks(tasks, law)
    assert weights is None and support.L_max == law.n
    U, v = _theta(rng, 2, tasks.second_moment)
    got = icl.risk_grad("softmax_inf", U, v, tasks, x_law=law)
    ref = icl.risk_grad("softmax", U, v, support, law.n)
    for a, b in zip(got, ref):
        np.testing.assert_array_equal(a, b)


def test_bad_input_is_refused_with_a_message():
    rng = np.random.default_rng(4)
    law = laws.Empirical(token_set("wine", 2))
    tasks = icl.make_tasks(rng, 2, 1, 1, 8, law)
    U, v = icl.init_theta(2, tasks.second_moment)
    with pytest.raises(ValueError, match="needs the covariate law x_law"):
        icl.risk_grad("softmax_inf", U, v, tasks)
    with pytest.raises(ValueError, match="needs the covariate law x_law"):
        training.train_all_arrays(tasks, None, models=("softmax_inf",), n_steps=1, ckpt_every=1)
    with pytest.raises(ValueError, match="use 'linear_inf'"):
        icl.risk("softmax_inf", U, v, tasks, x_law=laws.covariate_law("gaussian", np.eye(2)))
    with pytest.raises(ValueError, match="not drawn from this law"):
        icl.risk("softmax_inf", U, v, tasks, x_law=laws.Empirical(2.0 * token_set("wine", 2)))
    with pytest.raises(ValueError, match="law on R\\^3"):
        icl.risk("softmax_inf", U, v, tasks, x_law=laws.Empirical(token_set("wine", 3)))
    noisy = icl.make_tasks(rng, 2, 1, 1, 8, law, noise=0.1)
    with pytest.raises(ValueError, match="noiseless prompt labels"):
        icl.risk("softmax_inf", U, v, noisy, x_law=law)
    with pytest.raises(ValueError, match="weights must be positive"):
        training.SoftmaxPrefixEngine(tasks, (8,), weights=np.r_[0.0, np.ones(7)])
    with pytest.raises(ValueError, match="weights must be 8 numbers"):
        icl.softmax_predict(U, v, tasks.Z, tasks.z_q, np.ones(3))
