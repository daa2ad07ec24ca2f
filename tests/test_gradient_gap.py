"""sfxlin.gradient_gap: the gradient-gap kernel against naive per-task loops, its L^-1/2 decay at
fixed parameters, the trajectory function's draw order and outputs, and the concentration
constant against Monte Carlo."""
import numpy as np
import pytest

from sfxlin import icl, laws, softmax_core, gradient_gap
from sfxlin.training import train, train_all_arrays


def _prompts(rng, tasks, law, n):
    """``n`` fresh prompt sets for ``tasks`` (partners share covariates, labels w^T x)."""
    x = law.sample(rng, (n, tasks.n_tasks // 2, tasks.L_max))
    x = np.repeat(x, 2, axis=1)
    return np.concatenate([x, np.einsum("rnli,ni->rnl", x, tasks.w)[..., None]], axis=-1)


def _naive_gaps(U, v, tasks, prompts, Ls, Sigma):
    """Plain loops: per task icl.softmax_risk_grad vs icl.linear_risk_grad with that task's
    Gamma_w; the training-risk version from the full-batch functions."""
    nt = U.shape[0]
    task = np.zeros((len(Ls), nt))
    risk = np.zeros((len(Ls), nt))
    G = icl.Gamma_w(Sigma, tasks.w)
    for ti in range(nt):
        for li, L in enumerate(Ls):
            acc, acc_r = [], []
            for Zr in prompts:
                for n in range(tasks.n_tasks):
                    sl = slice(n, n + 1)
                    _, gU, gv = icl.softmax_risk_grad(U[ti], v[ti], Zr[sl, :L], tasks.z_q[sl], tasks.y_q[sl])
                    _, hU, hv = icl.linear_risk_grad(U[ti], v[ti], G[sl], tasks.z_q[sl], tasks.y_q[sl])
                    acc.append(np.sum((gU - hU) ** 2) + np.sum((gv - hv) ** 2))
                _, gU, gv = icl.softmax_risk_grad(U[ti], v[ti], Zr[:, :L], tasks.z_q, tasks.y_q)
                _, hU, hv = icl.linear_risk_grad(U[ti], v[ti], G, tasks.z_q, tasks.y_q)
                acc_r.append(np.sum((gU - hU) ** 2) + np.sum((gv - hv) ** 2))
            task[li, ti] = np.sqrt(np.mean(acc))
            risk[li, ti] = np.sqrt(np.mean(acc_r))
    return task, risk


@pytest.mark.parametrize("block", [False, True], ids=["general", "block-structured"])
def test_gap_matches_naive_loops(block, monkeypatch):
    """Every path of the kernel (general logits / partners sharing logits, column padding and
    chunking of the BLAS calls, several parameter points, replicates, nested L) against loops."""
    rng = np.random.default_rng(7)
    d, Sigma = 2, np.array([[1.5, 0.3], [0.3, 0.6]])
    law = laws.covariate_law("gaussian", Sigma)
    tasks = icl.make_tasks(rng, d, 3, 2, 96, law)
    prompts = np.concatenate([tasks.Z[None], _prompts(rng, tasks, law, 1)])
    U = 0.5 * rng.standard_normal((3, d + 1, d + 1))
    v = rng.standard_normal((3, d + 1))
    if block:
        U[:, d, :d] = 0.0   # partners then have identical logits: evaluated once
    Ls = [3, 17, 40, 96]
    # tiny BLAS and cache budgets force column padding and several chunks of pairs
    monkeypatch.setattr(softmax_core, "GEMM_MNK", 7 * 60)
    monkeypatch.setattr(softmax_core, "CACHE_BYTES", 2000)
    got = gradient_gap.gradient_gap(U, v, tasks, prompts, Ls, kind="both", t_chunk=2)
    task, risk = _naive_gaps(U, v, tasks, prompts, Ls, Sigma)
    np.testing.assert_allclose(got["task"], task, rtol=1e-10)
    np.testing.assert_allclose(got["risk"], risk, rtol=1e-10)
    # kind only selects an output: same blocking, same arithmetic, so bitwise equal
    np.testing.assert_array_equal(gradient_gap.gradient_gap(U, v, tasks, prompts, Ls, t_chunk=2), got["task"])
    np.testing.assert_array_equal(gradient_gap.gradient_gap(U, v, tasks, prompts, Ls, kind="risk", t_chunk=2),
                                  got["risk"])
    # default budgets and t_chunk: other BLAS shapes (no padding, fewer chunks), and a different
    # BLAS blocking may sum the same terms in a different order (OpenBLAS Haswell and Nehalem
    # kernels: up to 5.6e-16 relative, i.e. 1-3 ulp; Sandybridge: 0). Reordering a sum of
    # n <= 56 tokens (the longest block) moves it by at most ~n u = 6e-15 of its size for these
    # well-conditioned sums: rtol 1e-14, still far below the 1e-10 of the loop comparison above.
    monkeypatch.undo()
    default = gradient_gap.gradient_gap(U, v, tasks, prompts, Ls, kind="both")
    np.testing.assert_allclose(default["task"], got["task"], rtol=1e-14, atol=0)
    np.testing.assert_allclose(default["risk"], got["risk"], rtol=1e-14, atol=0)


def test_features_are_one_x_and_the_upper_products():
    """The token features ``[1, x_1..x_d, x_i x_j (i <= j)]`` against a plain loop (same products: exact)."""
    X = np.random.default_rng(4).standard_normal((3, 5, 4))
    want = [np.ones(X.shape[:-1])] + [X[..., i] for i in range(4)]
    want += [X[..., i] * X[..., j] for i in range(4) for j in range(i, 4)]
    np.testing.assert_array_equal(gradient_gap._features(X), np.stack(want, axis=-1))


def test_gap_survives_huge_logits():
    """Raw logits of order 1e3: the online max-shift keeps every prefix finite and exact."""
    rng = np.random.default_rng(3)
    law = laws.covariate_law("gaussian", np.eye(2))
    tasks = icl.make_tasks(rng, 2, 2, 1, 64, law)
    U = np.zeros((1, 3, 3))
    U[0, :2, :2] = 400.0 * np.eye(2)
    v = np.ones((1, 3))
    g = gradient_gap.gradient_gap(U, v, tasks, tasks.Z, [1, 8, 64])
    task, _ = _naive_gaps(U, v, tasks, tasks.Z[None], [1, 8, 64], np.eye(2))
    assert np.all(np.isfinite(g))
    np.testing.assert_allclose(g, task, rtol=1e-9)


def test_gap_rejects_noisy_labels_and_unshared_partners():
    rng = np.random.default_rng(0)
    law = laws.covariate_law("gaussian", np.eye(2))
    tasks = icl.make_tasks(rng, 2, 2, 1, 16, law)
    U, v = icl.init_theta(2, np.eye(2))
    Z = tasks.Z.copy()
    Z[0, 3, 2] += 0.1
    with pytest.raises(ValueError, match="noiseless"):
        gradient_gap.gradient_gap(U, v, tasks, Z, [4, 16])
    Z = tasks.Z.copy()
    Z[1, :, :2] = rng.standard_normal((16, 2))
    Z[1, :, 2] = Z[1, :, :2] @ tasks.w[1]
    with pytest.raises(ValueError, match="share"):
        gradient_gap.gradient_gap(U, v, tasks, Z, [4, 16])
    with pytest.raises(ValueError, match="kind"):
        gradient_gap.gradient_gap(U, v, tasks, tasks.Z, [4, 16], kind="mean")


def test_gap_decays_like_inverse_sqrt_L_at_fixed_parameters():
    """At fixed (small-logit) parameters the gap is a Monte Carlo error: slope -1/2 in L.
    Spread of the fitted slope over seeds in this setting: sd 0.05, so [-0.7, -0.3] is 4 sd."""
    rng = np.random.default_rng([11, 5])
    Sigma = np.eye(2)
    law = laws.covariate_law("gaussian", Sigma)
    Ls = [2**k for k in range(4, 12)]
    tasks = icl.make_tasks(rng, 2, 8, 2, Ls[-1], law)
    U0, v0 = icl.init_theta(2, Sigma)
    prompts = np.concatenate([tasks.Z[None], _prompts(rng, tasks, law, 5)])
    g = gradient_gap.gradient_gap(0.3 * U0, v0, tasks, prompts, Ls)[:, 0]
    slope = np.polyfit(np.log(Ls), np.log(g), 1)[0]
    assert -0.7 < slope < -0.3, slope
    assert g[-1] < g[0] / 4


@pytest.mark.parametrize("trainer", gradient_gap.TRAINERS)
def test_trajectory_outputs_and_draw_order(trainer):
    """gradient_gap_trajectory = training of linear(inf) + gradient_gap on the documented draws."""
    Sigma = np.diag([1.2, 0.7])
    Ls = [4, 16, 32]
    kw = dict(n_pairs=3, n_queries=2, n_replicates=3, lr=0.05, n_steps=40, ckpt_every=10)
    out = gradient_gap.gradient_gap_trajectory(np.random.default_rng(5), Sigma, Ls, trainer=trainer, **kw)
    assert set(out) == set(gradient_gap.TRAJECTORY_KEYS)
    rng = np.random.default_rng(5)
    law = laws.covariate_law("gaussian", Sigma)
    tasks = icl.make_tasks(rng, 2, 3, 2, 32, law)
    prompts = [tasks.Z]
    for _ in range(2):
        x = np.repeat(law.sample(rng, (3, 32)), 2, axis=0)
        prompts.append(np.concatenate([x, np.einsum("nli,ni->nl", x, tasks.w)[..., None]], axis=-1))
    if trainer == "simple":
        traj = train("linear_inf", tasks, lr=0.05, n_steps=40, ckpt_every=10)
        U, v, risk = traj.U.values, traj.v.values, traj.risk.values
    else:
        r = train_all_arrays(tasks, (), models=("linear_inf",), lr=0.05, n_steps=40, ckpt_every=10)["linear_inf"]
        U, v, risk = r["U"], r["v"], r["risk"]
        assert np.all(icl.off_block_mass(U, v) == 0.0)   # antithetic partners cancel exactly
    np.testing.assert_array_equal(out["t"], [0, 10, 20, 30, 40])
    np.testing.assert_array_equal(out["L"], Ls)
    np.testing.assert_array_equal(out["U_inf"], U)
    np.testing.assert_array_equal(out["v_inf"], v)
    np.testing.assert_array_equal(out["risk_inf"], risk)
    both = gradient_gap.gradient_gap(U, v, tasks, np.stack(prompts), Ls, kind="both")
    np.testing.assert_allclose(out["g"], both["task"], rtol=1e-12)
    np.testing.assert_allclose(out["g_risk"], both["risk"], rtol=1e-12)
    assert out["g"].shape == (3, 5)
    Us, vs = icl.bayes_optimum(Sigma)
    np.testing.assert_allclose(out["dist_bayes"], icl.theta_distance(U, v, Us, vs))
    assert out["dist_bayes"][-1] < out["dist_bayes"][0]
    # logit factor: mean over tasks and queries of exp(a' Gamma_w a), a = U z_q, by loops
    G = icl.Gamma_w(Sigma, tasks.w)
    lf = [np.mean([np.exp(a @ G[n] @ a) for n in range(6) for a in (U[t] @ tasks.z_q[n].T).T])
          for t in range(5)]
    np.testing.assert_allclose(out["logit_factor"], lf, rtol=1e-12)


def test_trajectory_rejects_bad_arguments():
    kw = dict(n_pairs=2, n_queries=1, lr=0.01, n_steps=10, ckpt_every=5)
    with pytest.raises(ValueError, match="n_replicates"):
        gradient_gap.gradient_gap_trajectory(np.random.default_rng(0), np.eye(2), [4, 8], n_replicates=0, **kw)
    with pytest.raises(ValueError, match="increasing"):
        gradient_gap.gradient_gap_trajectory(np.random.default_rng(0), np.eye(2), [8, 4], n_replicates=1, **kw)
    with pytest.raises(ValueError, match="trainer"):
        gradient_gap.gradient_gap_trajectory(np.random.default_rng(0), np.eye(2), [4, 8], n_replicates=1,
                                          trainer="adam", **kw)
    with pytest.raises(ValueError, match="multiple"):
        gradient_gap.gradient_gap_trajectory(np.random.default_rng(0), np.eye(2), [4, 8], n_replicates=1,
                                          **{**kw, "n_steps": 7})


def _mc_constant(Sigma, n, seed):
    """Direct Monte Carlo of E exp(x' Sigma^-1 x / c^2), x ~ N(0, Sigma), c^2 = ||Sigma^-1||_F."""
    rng = np.random.default_rng(seed)
    Sinv = np.linalg.inv(Sigma)
    c2 = np.linalg.norm(Sinv, "fro")
    x = rng.standard_normal((n, Sigma.shape[0])) @ np.linalg.cholesky(Sigma).T
    vals = np.exp(np.einsum("ni,ij,nj->n", x, Sinv, x) / c2)
    return vals.mean(), vals.std() / np.sqrt(n)


@pytest.mark.parametrize("Sigma", [np.eye(3) / 3.0, np.diag([0.3, 0.4, 0.5]),
                                   np.array([[0.35, 0.1, 0.0], [0.1, 0.3, 0.05], [0.0, 0.05, 0.4]])],
                         ids=["isotropic tau=27", "diagonal tau=21.4", "full"])
def test_concentration_constant_matches_monte_carlo(Sigma):
    """tau > 16 here, so the Monte Carlo estimate has finite variance: 6 standard errors."""
    assert np.sum(np.linalg.eigvalsh(Sigma) ** -2.0) > 16
    est, se = _mc_constant(Sigma, 400_000, 1)
    exact = gradient_gap.concentration_constant(Sigma)
    assert abs(est - exact) < 6 * se, (est, se, exact)
    assert se < 0.01 * exact


def test_concentration_constant_closed_forms_and_threshold():
    # isotropic: Sigma = s I_3, tau = 3 / s^2
    for s in [0.2, 0.5, 0.8]:
        tau = 3 / s**2
        assert gradient_gap.concentration_constant(s, d=3) == pytest.approx((1 - 2 / np.sqrt(tau)) ** -1.5, rel=1e-12)
        assert gradient_gap.concentration_constant(s * np.eye(3)) == gradient_gap.concentration_constant(s, d=3)
    assert gradient_gap.concentration_constant(np.eye(4)) == np.inf          # tau = 4 exactly
    assert gradient_gap.concentration_constant(2.0, d=3) == np.inf            # tau = 0.75
    assert gradient_gap.concentration_constant([1.0, 1.0, 1.0]) == np.inf    # tau = 3
    assert np.isfinite(gradient_gap.concentration_constant(0.86, d=3))        # tau = 4.06
    # just above 4 the constant is large and decreasing in tau
    vals = [gradient_gap.concentration_constant(np.sqrt(3 / t), d=3) for t in (4.01, 5, 8, 15)]
    assert vals[0] > 1e3 and np.all(np.diff(vals) < 0)
    with pytest.raises(ValueError, match="positive definite"):
        gradient_gap.concentration_constant(np.diag([1.0, 0.0]))
    with pytest.raises(ValueError, match="needs a positive integer d"):
        gradient_gap.concentration_constant(0.5)
