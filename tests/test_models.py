"""sfxlin.models (JAX): the paper's single head against sfxlin.icl and sfxlin.training, the deep
linear limit against its closed form and against finite prompts, the kernels against naive loops,
optax training (thread safety and determinism: tests/test_c3_deep.py, on whole cells).

Tolerances: the JAX and numpy computations are the same float64 sums in other orders (rounding
~1e-15 relative), so 1e-12 for one evaluation; a 100-step trajectory compounds at most a few
hundred roundings per step through a contracting map, so 1e-10.
"""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from sfxlin import icl, kernels, laws, training
from sfxlin.kernels import Kernel

M = pytest.importorskip("sfxlin.models")

D3 = 3


def _tasks(seed=0, n_pairs=3, n_queries=2, L_max=32, d=D3):
    rng = np.random.default_rng(seed)
    return icl.make_tasks(rng, d, n_pairs, n_queries, L_max, laws.covariate_law("gaussian", np.eye(d)))


#: for tests that compare implementations on models breaking the 1/L rate condition (lambda >= 1/2,
#: test_softmax_warns_when_a_head_breaks_the_rate_condition): the condition does not concern them
BREAKS_RATE_CONDITION = pytest.mark.filterwarnings("ignore::sfxlin.models.RateConditionWarning")


def _rel(a, b):
    return np.max(np.abs(np.asarray(a) - np.asarray(b))) / np.max(np.abs(np.asarray(b)))


def _single(U, v):
    return M.Transformer.single_head(U.shape[-1]), {"U": U[None, None], "v": v}


def test_import_sfxlin_and_the_cli_import_neither_jax_nor_dask_array():
    """Every ``sfxlin`` process (and process-pool worker) pays its imports: JAX loads with the
    first model only, dask.array with the first sweep built (``sfxlin.engine.sweep``)."""
    code = ("import sys, sfxlin, sfxlin.cli, sfxlin.engine.experiments as e; e.experiments(); "
            "import sfxlin.pipelines.c3_deep, sfxlin.analysis.c3_deep; "
            "assert 'jax' not in sys.modules and 'optax' not in sys.modules, 'jax imported'; "
            "assert 'dask.array' not in sys.modules, 'dask.array imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_float64_is_on():
    from sfxlin.models._jax import jnp

    assert jnp.zeros(1).dtype == np.float64


@BREAKS_RATE_CONDITION
@pytest.mark.parametrize("model, kern", [("softmax", "softmax"), ("linear", "linear"), ("linear_inf", "limit")])
def test_single_head_risk_and_gradient_equal_icl(model, kern):
    tasks = _tasks()
    rng = np.random.default_rng(1)
    U0, v0 = icl.init_theta(D3, np.eye(D3))
    U, v = U0 + 0.3 * rng.standard_normal((4, 4)), v0 + 0.3 * rng.standard_normal(4)   # off-block too
    L = None if kern == "limit" else 16
    r, gU, gv = icl.risk_grad(model, U, v, tasks, L)
    m, p = _single(U, v)
    r2, g = M.risk_and_grad(m, kern, p, tasks, L)
    assert abs(r2 - r) <= 1e-12 * r
    assert _rel(g["U"][0, 0], gU) <= 1e-12 and _rel(g["v"], gv) <= 1e-12
    assert abs(M.risk(m, kern, p, tasks, L) - r) <= 1e-12 * r


def test_single_head_gd_trajectory_equals_train_all():
    tasks = _tasks(n_pairs=2, L_max=32)
    Ls = (8, 32)
    ref = training.train_all_arrays(tasks, Ls, lr=0.05, n_steps=100, ckpt_every=50)
    U0, v0 = icl.init_theta(D3, np.eye(D3))
    m, p = _single(U0, v0)
    for kern in ("softmax", "linear", "limit"):
        for i, L in enumerate(Ls if kern != "limit" else (None,)):
            run = M.train(m, kern, p, tasks, L, method="gd", lr=0.05, n_steps=100, ckpt_every=50)
            want = ref["linear_inf"] if kern == "limit" else {k: a[i] for k, a in ref[kern].items()}
            np.testing.assert_array_equal(run["t"], ref["t"])
            assert _rel(run["params"]["U"][:, 0, 0], want["U"]) <= 1e-10, (kern, L)
            assert _rel(run["params"]["v"], want["v"]) <= 1e-10, (kern, L)
            assert _rel(run["risk"], want["risk"]) <= 1e-10, (kern, L)
            assert want["risk"][-1] < 0.5 * want["risk"][0]    # the trajectory moved


def _numpy_limit(model, p, Sigma, z_q):
    """The closed form, written independently: A_l = I + sum_h V_h Sigma_l U_h, Sigma_{l+1} = A Sigma A^T."""
    U = p["U"] if "U" in p else np.einsum("khai,khaj->khij", p["W_K"], p["W_Q"])
    out = []
    for n in range(Sigma.shape[0]):
        S, q, preds = Sigma[n], z_q[n].T, []
        for l in range(model.n_layers):
            A = sum((p["V"][l, h] if model.values else np.eye(model.D)) @ S @ U[l, h] for h in range(model.n_heads))
            A = A + np.eye(model.D) if model.residual else A
            q, S = A @ q, A @ S @ A.T
            preds.append(p["v"] @ q)
        out.append(preds)
    return np.array(out).transpose(1, 0, 2)


@pytest.mark.parametrize("kw", [dict(), dict(residual=False), dict(values=False), dict(d_k=2)])
def test_deep_limit_equals_the_closed_form(kw):
    tasks = _tasks(seed=3)
    model = M.Transformer(4, 3, 2, **kw)
    p = model.init(np.random.default_rng(4), 0.5, 0.5)
    Sigma = icl.Gamma_w(tasks.Sigma, tasks.w)
    got = M.limit_layers(model, p, Sigma, tasks.z_q)
    assert got.shape == (3, tasks.n_tasks, tasks.n_queries)
    assert _rel(got, _numpy_limit(model, p, Sigma, tasks.z_q)) <= 1e-12


def test_deep_linear_attention_is_the_limit_with_the_empirical_moment():
    """Linear attention maps every token by the same matrix I + sum_h V_h Ghat U_h, so at finite L
    the deep linear transformer IS the closed form with Sigma_1 = Ghat_L (tokens attend to
    themselves too): an exact identity, and the token moments are the pushforwards."""
    tasks = _tasks(seed=5, L_max=16)
    model = M.Transformer(4, 3, 2)
    p = model.init(np.random.default_rng(6), 0.5, 0.5)
    G = icl.Ghat(tasks.Z)
    pred, mom = M.predict_layers(model, "linear", p, tasks.Z, tasks.z_q, moments=True)
    lim, Sig = M.limit_layers(model, p, G, tasks.z_q, moments=True)
    assert _rel(pred, lim) <= 1e-12 and _rel(mom, Sig) <= 1e-12


def _naive_forward(kappa, normalised, p, Z, zq, K, H, summed=False):
    """One task, plain loops: tokens attend to tokens, the query to the tokens, residual, values;
    the weights divided by their sum (``normalised``), by ``L``, or by nothing (``summed``)."""
    Z, zq = Z.copy(), zq.copy()
    for l in range(K):
        def attend(x):
            out = np.zeros(len(x))
            for h in range(H):
                s = np.array([z @ p["U"][l, h] @ x for z in Z])
                w = kappa(s)
                w = w if summed else w / (w.sum() if normalised else len(Z))
                out += p["V"][l, h] @ (w @ Z)
            return out
        newZ = np.array([z + attend(z) for z in Z])
        zq = np.array([q + attend(q) for q in zq])
        Z = newZ
    return zq @ p["v"]


@BREAKS_RATE_CONDITION
@pytest.mark.parametrize("kern, kappa, normalised, summed", [
    ("softmax", np.exp, True, False), ("relu", lambda s: np.maximum(s, 0), False, False),
    ("sigmoid", lambda s: 1 / (1 + np.exp(-s)), False, False), ("linear", lambda s: s, False, False),
    (Kernel("softmax", temperature=2.0), lambda s: np.exp(s / 2), True, False),
    (Kernel("sigmoid", bias=-1.3), lambda s: 1 / (1 + np.exp(1.3 - s)), False, False),
    ("relu2_norm", lambda s: np.maximum(s, 0) ** 2, True, False),
    ("sigmoid_logL", lambda s: 1 / (1 + 12 / np.exp(s)), False, True)],     # sigma(s - log L), L = 12
    ids=["softmax", "relu", "sigmoid", "linear", "softmax_T2", "sigmoid_b", "relu2_norm", "sigmoid_logL"])
def test_two_layer_kernels_equal_a_naive_loop(kern, kappa, normalised, summed):
    """Every kernel of sfxlin.kernels, by name or instance, through its JAX weight."""
    tasks = _tasks(seed=7, n_pairs=1, L_max=12)
    model = M.Transformer(4, 2, 2)
    p = model.init(np.random.default_rng(8), 0.7, 0.5)
    got = M.predict(model, kern, p, tasks.Z, tasks.z_q)
    want = np.array([_naive_forward(kappa, normalised, p, tasks.Z[n], tasks.z_q[n], 2, 2, summed) for n in range(2)])
    assert _rel(got, want) <= 1e-12


@BREAKS_RATE_CONDITION
def test_softmax_through_its_pointwise_weight_is_softmax(monkeypatch):
    """A kernel class with softmax's weight exp(s / T) and the generic normalised JAX attention
    (Kernel.jax_attention: weights over their sum) equals softmax's own stable evaluation."""
    monkeypatch.setattr(kernels, "KERNELS", dict(kernels.KERNELS))    # the registry, restored after the test

    class PointwiseExp(kernels.Softmax):
        name = "pointwise_exp"
        normalised = True
        smoothness = "smooth"
        jax_attention = kernels.Kernel.jax_attention

    tasks = _tasks(seed=9, n_pairs=1, L_max=12)
    model = M.Transformer(4, 2, 1)
    p = model.init(np.random.default_rng(10))
    for T in (1.0, 1.5):
        a = M.predict(model, PointwiseExp(temperature=T), p, tasks.Z, tasks.z_q)
        assert _rel(a, M.predict(model, Kernel("softmax", temperature=T), p, tasks.Z, tasks.z_q)) <= 1e-12
    assert _rel(M.predict(model, "pointwise_exp", p, tasks.Z, tasks.z_q),
                M.predict(model, "softmax", p, tasks.Z, tasks.z_q)) <= 1e-12


def test_deep_softmax_converges_to_the_limit_at_rate_one_over_L():
    """2 layers x 2 heads on Gaussian tokens, every head with lambda < 1/4 (the error constant has a
    finite variance; no RateConditionWarning): mean squared error to the closed form ~ C / L, so from
    L = 32 to 512 it falls ~16x. Monte Carlo over 64 tasks x 4 queries: the ratio of two means of
    squared errors scatters by a factor < 2.5 (5 SEs of each mean); the token moments' relative
    error falls ~4x (root L)."""
    import warnings

    tasks = _tasks(seed=11, n_pairs=32, n_queries=4, L_max=512)
    model = M.Transformer(4, 2, 2)
    p = model.init(np.random.default_rng(12), 0.05, 0.25)
    Gamma = icl.Gamma_w(tasks.Sigma, tasks.w)
    assert M.head_lambdas(model, p, Gamma).max() < 0.25
    lim, Sig = M.limit_layers(model, p, Gamma, tasks.z_q, moments=True)
    err, cov = [], []
    for L in (32, 512):
        with warnings.catch_warnings():
            warnings.simplefilter("error", M.RateConditionWarning)
            pred, mom = M.predict_layers(model, "softmax", p, tasks.prompt(L), tasks.z_q, moments=True)
        err.append(np.mean((pred[-1] - lim[-1]) ** 2))
        cov.append(np.mean(np.linalg.norm(mom[-1] - Sig[-1], axis=(-2, -1)) / np.linalg.norm(Sig[-1], axis=(-2, -1))))
    assert 16 / 2.5 < err[0] / err[1] < 16 * 2.5
    assert 4 / 2 < cov[0] / cov[1] < 4 * 2


@BREAKS_RATE_CONDITION
def test_factored_keys_and_queries_equal_the_merged_matrix():
    tasks = _tasks(seed=13, L_max=8)
    fac = M.Transformer(4, 2, 1, d_k=3)
    p = fac.init(np.random.default_rng(14))
    merged = M.Transformer(4, 2, 1)
    q = {"U": np.einsum("khai,khaj->khij", p["W_K"], p["W_Q"]), "V": p["V"], "v": p["v"]}
    assert _rel(M.predict(fac, "softmax", p, tasks.Z, tasks.z_q), M.predict(merged, "softmax", q, tasks.Z,
                                                                             tasks.z_q)) <= 1e-12


@BREAKS_RATE_CONDITION
def test_adam_follows_the_textbook_update():
    tasks = _tasks(seed=15, L_max=8)
    model = M.Transformer(4, 1, 1)
    p = model.init(np.random.default_rng(16))
    run = M.train(model, "softmax", p, tasks, 8, method="adam", lr=0.01, n_steps=2, ckpt_every=1)
    b1, b2, eps, m, s, theta = 0.9, 0.999, 1e-8, 0.0, 0.0, dict(p)
    for t in (1, 2):
        _, g = M.risk_and_grad(model, "softmax", theta, tasks, 8)
        m = {k: b1 * (m[k] if t > 1 else 0) + (1 - b1) * g[k] for k in g}
        s = {k: b2 * (s[k] if t > 1 else 0) + (1 - b2) * g[k] ** 2 for k in g}
        theta = {k: theta[k] - 0.01 * (m[k] / (1 - b1**t)) / (np.sqrt(s[k] / (1 - b2**t)) + eps) for k in g}
        for k in g:
            assert _rel(run["params"][k][t], theta[k]) <= 1e-10


def test_sgd_draws_fresh_tasks_in_order():
    tasks = _tasks(seed=17, L_max=8)
    model = M.Transformer(4, 1, 1)
    p = model.init(np.random.default_rng(18))
    law = laws.covariate_law("gaussian", np.eye(D3))
    run = M.train(model, "linear", p, tasks, 8, method="sgd", lr=0.01, n_steps=2, ckpt_every=1,
                  fresh=(np.random.default_rng(19), law, 3, 2))
    rng = np.random.default_rng(19)
    theta = dict(p)
    for t in range(3):
        batch = icl.make_tasks(rng, D3, 3, 2, 8, law)
        r, g = M.risk_and_grad(model, "linear", theta, batch, 8)
        assert abs(run["risk"][t] - r) <= 1e-12 * r
        theta = {k: theta[k] - 0.01 * g[k] for k in g}


def test_bad_input_raises_value_errors():
    tasks = _tasks(L_max=8)
    model = M.Transformer(4, 1, 1)
    p = model.init(np.random.default_rng(0))
    with pytest.raises(ValueError, match="kernel name must be one of"):
        M.predict(model, "tanh", p, tasks.Z, tasks.z_q)
    with pytest.raises(ValueError, match="kernel must be a sfxlin.kernels.Kernel or the name"):
        M.predict(model, 3, p, tasks.Z, tasks.z_q)
    with pytest.raises(ValueError, match="kernel name must be one of"):
        M.train(model, "tanh", p, tasks, 8)
    with pytest.raises(ValueError, match=r"params\['U'\]"):
        M.predict(model, "softmax", {**p, "U": p["U"][0]}, tasks.Z, tasks.z_q)
    with pytest.raises(ValueError, match="exactly the arrays"):
        M.predict(model, "softmax", {"U": p["U"]}, tasks.Z, tasks.z_q)
    with pytest.raises(ValueError, match="Z must"):
        M.predict(model, "softmax", p, tasks.Z[..., :3], tasks.z_q)
    with pytest.raises(ValueError, match="Z must be finite"):
        M.predict(model, "softmax", p, np.where(tasks.Z > 1.5, np.nan, tasks.Z), tasks.z_q)
    with pytest.raises(ValueError, match="n_heads"):
        M.Transformer(4, 1, 0)
    with pytest.raises(ValueError, match="method"):
        M.train(model, "softmax", p, tasks, 8, method="lbfgs")
    with pytest.raises(ValueError, match="fresh"):
        M.train(model, "softmax", p, tasks, 8, method="sgd")
    with pytest.raises(ValueError, match="finite"):
        M.predict(model, "softmax", {**p, "v": np.full(4, np.nan)}, tasks.Z, tasks.z_q)
    off = icl.Tasks(Z=tasks.Z, w=tasks.w, x_q=tasks.x_q, y_q=tasks.y_q, Sigma=tasks.Sigma, mean=np.ones(D3))
    with pytest.raises(ValueError, match="centred"):
        M.risk(model, "limit", p, off)


@BREAKS_RATE_CONDITION
def test_tasks_mapped_in_batches_with_a_remainder(monkeypatch):
    """Logit memory capped so that 5 tasks go in batches of 2 (2, 2, 1): same values as one batch."""
    from sfxlin.models import transformer as T

    tasks = _tasks(seed=22, n_pairs=3, L_max=8)
    tasks = tasks.subset(slice(0, 5))
    model = M.Transformer(4, 2, 3)                     # a shape no other test compiles
    p = model.init(np.random.default_rng(23))
    whole = np.array([_naive_forward(np.exp, True, p, tasks.Z[n], tasks.z_q[n], 2, 3) for n in range(5)])
    monkeypatch.setattr(T, "_LOGIT_BYTES", 8 * 3 * 8 * 8 * 2)
    assert T._batch(model, 8, 5) == 2
    assert _rel(M.predict(model, "softmax", p, tasks.Z, tasks.z_q), whole) <= 1e-12


# ------------------------------------------------------------------ the 1/L rate condition
def _lambda_direct(model, p, Sigma):
    """(K, H, n): the largest eigenvalue of the explicit product Sigma_l U^T Sigma_l U (the same
    spectrum as (Sigma_l^1/2 U Sigma_l^1/2)^T (Sigma_l^1/2 U Sigma_l^1/2)), Sigma_l by a numpy loop."""
    U = p["U"] if "U" in p else np.einsum("khai,khaj->khij", p["W_K"], p["W_Q"])
    K, H = U.shape[:2]
    out = np.empty((K, H, Sigma.shape[0]))
    for n in range(Sigma.shape[0]):
        S = Sigma[n]
        for l in range(K):
            for h in range(H):
                out[l, h, n] = np.max(np.linalg.eigvals(S @ U[l, h].T @ S @ U[l, h]).real)
            A = sum((p["V"][l, h] if model.values else np.eye(model.D)) @ S @ U[l, h] for h in range(H))
            A = A + np.eye(model.D) if model.residual else A
            S = A @ S @ A.T
    return out


@pytest.mark.parametrize("kw", [dict(), dict(residual=False), dict(values=False), dict(d_k=2)])
def test_head_lambdas_are_the_top_eigenvalues_of_the_explicit_products(kw):
    tasks = _tasks(seed=24)
    model = M.Transformer(4, 3, 2, **kw)
    p = model.init(np.random.default_rng(25), 0.5, 0.5)
    Sigma = icl.Gamma_w(tasks.Sigma, tasks.w)                 # rank d in R^(d+1): a singular Sigma_1
    got = M.head_lambdas(model, p, Sigma)
    assert got.shape == (3, 2, tasks.n_tasks)
    np.testing.assert_allclose(got, _lambda_direct(model, p, Sigma), rtol=1e-10)
    with pytest.raises(ValueError, match="Sigma must"):
        M.head_lambdas(model, p, Sigma[0])


@pytest.mark.parametrize("kw", [dict(), dict(d_k=2)])
def test_cap_lambdas_caps_every_head_layer_by_layer_and_leaves_the_others(kw):
    tasks = _tasks(seed=26)
    model = M.Transformer(4, 3, 2, **kw)
    p = model.init(np.random.default_rng(27), 1.5, 0.5)
    Sigma = icl.Gamma_w(tasks.Sigma, tasks.w)
    before = _lambda_direct(model, p, Sigma).max(axis=-1)               # (K, H)
    capped, scale = M.cap_lambdas(model, p, Sigma, 0.2)
    after = _lambda_direct(model, capped, Sigma).max(axis=-1)           # the explicit products, not head_lambdas
    assert before[0].min() > 0.2                                        # the draw needs capping from layer 1
    assert np.all(after <= 0.2 * (1 + 1e-10))
    capped_heads = scale < 1
    np.testing.assert_allclose(after[capped_heads], 0.2, rtol=1e-10)   # a capped head sits at the cap
    key = "U" if "U" in p else "W_K"
    for l, h in zip(*np.nonzero(~capped_heads)):
        np.testing.assert_array_equal(capped[key][l, h], p[key][l, h])
    np.testing.assert_array_equal(capped["v"], p["v"])
    assert np.all(p[key] == model.init(np.random.default_rng(27), 1.5, 0.5)[key])   # the input is not modified
    with pytest.raises(ValueError, match="cap must"):
        M.cap_lambdas(model, p, Sigma, 0.0)


def _one_bad_head(lam_bad, lam_good=0.3):
    """A 2-layer, 2-head model and prompts on which layer 1 leaves the tokens unchanged (V = 0) with
    lambda = 0.1 on both heads and layer 2's heads have max-over-tasks lambda = lam_good (head 1) and
    lam_bad (head 2), Sigma_1 the prompts' second moment (lambda scales as the square of U)."""
    tasks = _tasks(seed=26, n_pairs=1, L_max=12)             # the shapes of test_two_layer_kernels_equal_a_naive_loop
    model = M.Transformer(4, 2, 2)
    p = model.init(np.random.default_rng(27), 0.5, 0.5)
    p["V"][0] = 0.0
    G = np.einsum("nli,nlj->nij", tasks.Z, tasks.Z) / 12
    for (l, h), target in {(0, 0): 0.1, (0, 1): 0.1, (1, 0): lam_good, (1, 1): lam_bad}.items():
        p["U"][l, h] *= np.sqrt(target / _lambda_direct(model, p, G)[l, h].max())
    return model, p, tasks


def test_softmax_warns_when_a_head_breaks_the_rate_condition():
    model, p, tasks = _one_bad_head(1.72)
    with pytest.warns(M.RateConditionWarning, match=r"layer 2 head 2: lambda = 1\.72 .*bound 1/2") as rec:
        M.predict(model, "softmax", p, tasks.Z, tasks.z_q)
    assert len(rec) == 1 and "head 1" not in str(rec[0].message)
    assert issubclass(M.RateConditionWarning, UserWarning) and not issubclass(M.RateConditionWarning, RuntimeWarning)
    with pytest.warns(M.RateConditionWarning, match="layer 2 head 2"):
        M.risk(model, "softmax", p, tasks, 12)
    with pytest.warns(M.RateConditionWarning, match="layer 2 head 2"):
        M.risk_and_grad(model, "softmax", p, tasks, 12)
    with pytest.warns(M.RateConditionWarning, match=r"layer 2 head 2: lambda = 0\.764 .*T = 1\.5"):
        M.predict(model, Kernel("softmax", temperature=1.5), p, tasks.Z, tasks.z_q)   # U / T: 1.72 / 1.5^2


def test_no_warning_below_the_bound_or_without_softmax():
    import warnings

    model, p, tasks = _one_bad_head(0.3)
    bad = _one_bad_head(1.72)[1]
    with warnings.catch_warnings():
        warnings.simplefilter("error", M.RateConditionWarning)
        M.predict_layers(model, "softmax", p, tasks.Z, tasks.z_q)
        M.predict_layers(model, "linear", bad, tasks.Z, tasks.z_q)
        M.predict_layers(model, Kernel("softmax", temperature=2.0), bad, tasks.Z, tasks.z_q)   # 1.72 / 4 < 1/2
        M.risk(model, "limit", bad, tasks)


def test_check_rate_false_skips_only_the_warning():
    import warnings

    model, p, tasks = _one_bad_head(1.72)
    with pytest.warns(M.RateConditionWarning):
        want = M.predict_layers(model, "softmax", p, tasks.Z, tasks.z_q, moments=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", M.RateConditionWarning)
        got = M.predict_layers(model, "softmax", p, tasks.Z, tasks.z_q, moments=True, check_rate=False)
    for g, w in zip(got, want):                                             # the same compiled program
        np.testing.assert_array_equal(g, w)


# ------------------------------------------------------------------ blocked attention (Transformer.block)
#: (L, block, n_layers, n_heads): a block that does not divide L (a tail block), one that does, a block of 1
BLOCK_CASES = [(37, 8, 2, 2), (64, 16, 2, 1), (9, 1, 1, 2)]


def _prompts(seed, L, n=2, q=3, D=4, scale=1.0):
    rng = np.random.default_rng(seed)
    return scale * rng.standard_normal((n, L, D)), rng.standard_normal((n, q, D))


@BREAKS_RATE_CONDITION
@pytest.mark.parametrize("kern, cases", [("softmax", BLOCK_CASES), (Kernel("softmax", temperature=0.7), BLOCK_CASES[:1]),
                                         ("relu_norm", BLOCK_CASES[:1]), ("sigmoid", BLOCK_CASES[:1])])
def test_blocked_attention_equals_the_full_computation(kern, cases):
    """Blocked (query and key blocks, online softmax; other kernels: sums of weights) against the
    full ``L x L`` path: the same sums in another order, rounding ~1e-15 relative, so 1e-12
    (module doc); read-outs after every layer and the token moments entering every layer."""
    for i, (L, b, K, H) in enumerate(cases):
        Z, zq = _prompts(30 + i, L)
        full, blocked = M.Transformer(4, K, H, block=None), M.Transformer(4, K, H, block=b)
        p = full.init(np.random.default_rng(40 + i))
        want = M.predict_layers(full, kern, p, Z, zq, moments=True)
        got = M.predict_layers(blocked, kern, p, Z, zq, moments=True)
        for g, w in zip(got, want):
            assert _rel(g, w) <= 1e-12, (L, b, K, H)


@BREAKS_RATE_CONDITION
def test_blocked_softmax_merges_blocks_with_their_running_max():
    """Logits of several hundred (``exp`` overflows float64 beyond 709) with the largest logit of
    a query in a later key block: only a correct rescaling by ``exp(m_old - m_new)`` stays finite
    and equals the full softmax (which subtracts the maximum)."""
    Z, zq = _prompts(50, 37, scale=1.0)
    Z[:, 30] *= 40.0                                          # the maxima sit in the tail / a late block
    full, blocked = M.Transformer(4, 2, 2, block=None), M.Transformer(4, 2, 2, block=8)
    p = full.init(np.random.default_rng(51), U_scale=20.0)
    want = M.predict_layers(full, "softmax", p, Z, zq)
    assert np.all(np.isfinite(want))
    assert _rel(M.predict_layers(blocked, "softmax", p, Z, zq), want) <= 1e-12


@BREAKS_RATE_CONDITION
@pytest.mark.parametrize("kern, kw", [("softmax", dict()), ("softmax", dict(d_k=2, residual=False)),
                                      ("relu_norm", dict(values=False))])
def test_blocked_attention_gradient_equals_the_full_gradient(kern, kw):
    """``risk_and_grad`` (reverse mode through the scans, the query blocks rematerialised) equal
    to the full path's to 1e-10 relative per parameter array (a few hundred roundings of
    1e-16 through two layers); block 7 does not divide L = 40, and the 40 prompt tokens form
    5 full query blocks and a tail."""
    tasks = _tasks(seed=52, n_pairs=2, L_max=40, d=3)
    full, blocked = M.Transformer(4, 2, 2, block=None, **kw), M.Transformer(4, 2, 2, block=7, **kw)
    p = full.init(np.random.default_rng(53))
    r_full, g_full = M.risk_and_grad(full, kern, p, tasks, 40)
    r_blk, g_blk = M.risk_and_grad(blocked, kern, p, tasks, 40)
    assert abs(r_blk - r_full) <= 1e-12 * abs(r_full)
    for k in g_full:
        assert _rel(g_blk[k], g_full[k]) <= 1e-10, k


@pytest.mark.parametrize("bad", [0, -4, 2.5, 8.0, True, "512"])
def test_block_must_be_a_positive_integer_or_none(bad):
    with pytest.raises(ValueError, match="block must be a positive integer"):
        M.Transformer(4, 2, 2, block=bad)


def test_block_accepts_numpy_integers_and_none():
    assert M.Transformer(4, block=np.int64(16)).block == 16 and type(M.Transformer(4, block=np.int64(16)).block) is int
    assert M.Transformer(4, block=None).block is None
    assert M.Transformer(4).block == M.transformer.BLOCK


def _largest_intermediate(jaxpr):
    """The largest number of elements of any value in ``jaxpr`` and its sub-jaxprs (scan and map
    bodies, checkpointed functions)."""
    def subjaxprs(eqn):
        for v in eqn.params.values():
            for x in (v if isinstance(v, (tuple, list)) else (v,)):
                x = getattr(x, "jaxpr", x)                   # a ClosedJaxpr holds its Jaxpr
                if hasattr(x, "eqns"):
                    yield x

    best = 0
    for eqn in jaxpr.eqns:
        for var in eqn.outvars:
            best = max(best, int(np.prod(getattr(var.aval, "shape", ()))))
        for sub in subjaxprs(eqn):
            best = max(best, _largest_intermediate(sub))
    return best


@BREAKS_RATE_CONDITION
def test_blocked_attention_never_forms_the_L_by_L_logits():
    """Structural memory check (no process memory measured; benchmarks/deep_memory.py does that):
    in the traced forward pass and gradient of one task at L = 96, block 16, no intermediate has
    more than ``H b L`` elements (a query block's per-key-block residuals in the backward pass),
    while the full path holds the ``H L^2`` logits."""
    from sfxlin.models import transformer as T
    from sfxlin.models._jax import jax

    L, b, H = 96, 16, 2
    tasks = _tasks(seed=54, n_pairs=1, n_queries=2, L_max=L, d=3)
    Z, zq, yq = tasks.Z[:1], tasks.z_q[:1], tasks.y_q[:1]
    for block, bound in ((b, H * b * L), (None, None)):
        model = M.Transformer(4, 2, H, block=block)
        p = model.init(np.random.default_rng(55))
        fwd = jax.make_jaxpr(lambda pp: T._loss(pp, model, "softmax", Z, zq, yq))(p).jaxpr
        grad = jax.make_jaxpr(jax.grad(lambda pp: T._loss(pp, model, "softmax", Z, zq, yq)))(p).jaxpr
        sizes = _largest_intermediate(fwd), _largest_intermediate(grad)
        if bound is None:
            assert min(sizes) >= H * L * L
        else:
            assert max(sizes) <= bound < H * L * L
