"""C2: non-asymptotic concentration of softmax attention and stability of its gradient.

One experiment, one Dataset, three parts. The output-tail part and the gradient part share the
outer grid ``d x U_norm x seed`` (one dask task per cell; inside a cell both parts are vectorised
numpy, and a cell's cost grows with ``d`` alike for both). The trajectory part has neither ``d``
(it is the C3 protocol, ``d = 3``) nor ``U_norm`` (its parameters are the training trajectory),
so it is the engine's one global task, over its own dims ``setting x traj_seed x L x t``.

Every cell splits its generator (``sweep.cell_rng``, keyed by the cell's coordinate values) into three
independent child streams (``Generator.spawn``): tails, CLT Monte Carlo, gradients; changing the
size of one part leaves the draws of the others unchanged. Each gradient ``(setting, scale)``
draws from its own substream of the gradient stream (``sweep.substream``), keyed by its values.

(a) Output tails (SPEC section 1, C2 "output tail tests"). Tokens ``N(0, sigma^2 I_d)``,
    ``U`` a Gaussian ``d x d`` matrix rescaled to ``||U||_F = U_norm``, ``V = I_d``, queries
    ``q ~ N(0, sigma^2 I_d)``. Per query, ``tail_prompts`` independent prompts of ``L_max``
    tokens; all nested ``L`` in one prefix pass. ``f_inf = sigma^2 U q`` (Lemma 2.1).
    Thresholds: ``t(q, L, level) = r(q, level) / sqrt(L)`` with ``r`` the ``1 - level`` quantile
    of ``||N(0, C)||``, ``C = Gaussian.snis_covariance(U q) = lim L Cov(f_L)``, estimated by a
    seeded Monte Carlo (``clt_draws`` Gaussian vectors, ``||C^{1/2} g||^2 = sum lam_j g_j^2``).
    Stored per test ``(query, L, level)``: the exceedance count of ``||f_L - f_inf|| > t`` and
    ``n`` (analysis draws the Clopper-Pearson intervals); the CLT tail
    ``P(||N(0, C/L)|| > t)`` from an *independent* Monte Carlo of the same size (so it estimates
    the sharp prediction at the threshold actually used, not the level by construction); and the
    paper-form bound ``c1 exp(-c2 L t^2 / K(a))``, ``K(a) = exp(4 sigma^2 ||U q||^2)`` with
    ``c1 = exp(tail_log_c1_per_d * d)`` and ``c2 = tail_c2 / sigma^2``. These constants are OUR
    assumption (the paper's are existential): for a sub-Gaussian vector with variance proxy
    ``s^2 I_d``, ``s^2 = sigma^2 K(a) / L`` (the paper's), Hsu-Kakade-Zhang (2012, Thm 1) give
    ``P(||X||^2 > s^2 (d + 2 sqrt(d u) + 2 u)) <= e^-u``; with ``d + 2 sqrt(d u) + 2 u <= 2d + 3u``
    this is ``P(||X|| > t) <= e^{2d/3} exp(-t^2 / (3 s^2))``: ``tail_log_c1_per_d = 2/3``,
    ``tail_c2 = 1/3``. (Asymptotically ``Cov(f_L) <= sigma^2 e^{2 sigma^2 ||Uq||^2} I / L``, below
    the proxy, so the bound holds in the CLT limit; finite-L tails are what is tested.)
    Because ``t ~ 1 / sqrt(L)``, ``L t^2`` and hence the bound and the CLT tail do not depend on
    ``L``; they are stored per test all the same.

(b) Gradient concentration at fixed parameters (SPEC section 2). Per cell and per inner
    ``(setting, scale)``: covariates ``N(0, Sigma)``, ``Sigma = scale * Sigma_setting``
    (isotropic ``I_d``; anisotropic ``diag(geomspace(2, 0.5, d))``, which is diag(2, 1, 0.5) at
    d = 3); parameters on the training manifold: ``U = U_norm * blockdiag(Sigma^-1, 0) /
    ||Sigma^-1||_F`` (the Bayes optimum's direction, which is the Eq. 9 init's ``I_d / sqrt(d)``
    when isotropic) and ``v = U_norm e_{d+1}`` (``||v|| = ||U||_F``, the balanced manifold).
    With this choice the logit ``a = U z_q`` has no label component, so ``a^T Gamma_w a =
    a_x^T Sigma a_x`` does not grow with ``||w||``; off-block gradient components vanish to
    rounding by the antithetic symmetry in both models. Tasks (``grad_pairs`` antithetic pairs x
    ``grad_queries`` queries, ``icl.make_tasks``) are drawn once per cell; ``grad_draws``
    independent prompt sets (the tasks' own, then fresh covariates one set at a time).
    Stored: ``E ||grad R_L - grad R_inf||^2`` over prompt draws (joint Frobenius norm over
    ``(U, v)``), ``R_L`` the softmax(L) risk (mean over tasks and queries, ``icl``) and
    ``R_inf`` the linear(inf) (``Gamma_w``) risk on the same tasks and queries; its standard
    error; ``||grad R_inf||^2``; and the
    paper-form bound ``grad_c / L * mean_items K_i P_i``, stored as its log (see
    :func:`gradient_log_bound_constant`).

(c) Trajectory stability (C2 "trajectory stability"), global task: for isotropic and
    anisotropic ``Sigma`` at ``d = 3`` (the C3 protocol: ``traj_pairs`` pairs x ``traj_queries``
    queries, gradient descent on linear(inf), step ``traj_lr``, ``traj_steps`` steps, checkpoint
    every ``traj_ckpt_every``), ``stability.gradient_gap_trajectory`` gives ``g_L(t)``, the
    gradient gap of softmax(L) at the infinite-prompt trajectory ``theta_inf(t)``, over
    ``traj_replicates`` prompt sets; ``traj_seeds`` independent task draws per setting, each from
    ``sweep.cell_rng("c2_concentration/trajectory", {setting, traj_seed}, root_seed)``, keyed by
    the setting's name and the seed's value.
"""
from __future__ import annotations

import numpy as np

from sfxlin import icl
from sfxlin.attention import check_prompt_lengths, softmax_attention_prefix
from sfxlin.laws import Gaussian
from sfxlin.stability import concentration_constant, gradient_gap_trajectory
from sfxlin.sweep import Experiment, Variable, cell_rng, substream

NAME = "c2_concentration"
SETTINGS = ("isotropic", "anisotropic")

_COMMON = {"sigma": 1.0, "tail_levels": [0.1, 0.03, 0.01, 0.003, 0.001], "tail_log_c1_per_d": 2 / 3, "tail_c2": 1 / 3,
           "grad_scales": [1.0, 2.0], "grad_c": 1.0, "traj_d": 3, "traj_lr": 0.01, "root_seed": 20251212}

PROFILES = {
    "quick": {**_COMMON, "d": [2, 3], "U_norm": [0.1, 0.5], "L": [8, 16, 32, 64, 128, 256], "n_seeds": 2,
              "tail_queries": 2, "tail_prompts": 256, "prompt_chunk": 64, "clt_draws": 20000,
              "grad_pairs": 4, "grad_queries": 2, "grad_draws": 4,
              "traj_pairs": 8, "traj_queries": 2, "traj_replicates": 1, "traj_steps": 100,
              "traj_ckpt_every": 20, "traj_seeds": 1},
    "paper": {**_COMMON, "d": [2, 5, 10], "U_norm": [0.1, 0.3, 0.5], "L": [2**k for k in range(3, 13)],
              "n_seeds": 4, "tail_queries": 2, "tail_prompts": 4096, "prompt_chunk": 64, "clt_draws": 200000,
              "grad_pairs": 8, "grad_queries": 4, "grad_draws": 32,
              "traj_pairs": 48, "traj_queries": 2, "traj_replicates": 16, "traj_steps": 2500,
              "traj_ckpt_every": 20, "traj_seeds": 4},
}

# Predeclared criteria (SPEC C2), stored in the results file's attrs so analysis reads them from data.
CRITERIA = [
    {"id": "C2-tail-violations", "claim": "C2",
     "description": "output tail tests (d, U_norm, seed, query, L, level) where the paper-form bound "
                    "c1 exp(-c2 L t^2/K(a)) (our assumed constants, defaults c1 = e^{2d/3}, c2 = 1/3) is below "
                    "the lower end of the Clopper-Pearson 95% interval of the empirical tail",
     "kind": "<=", "threshold": 0, "reference": "0 of 236 tests (147,000 prompts)"},
    {"id": "C2-tail-clt", "claim": "C2",
     "description": "empirical / CLT tail at the largest L for tail levels >= 1e-3, pooled over seeds and "
                    "queries, every (d, U_norm, level)",
     "kind": "in", "threshold": [0.5, 2.0], "reference": "(not reported)"},
    {"id": "C2-grad-violations", "claim": "C2",
     "description": "gradient cells (d, U_norm, setting, scale) where the paper-form bound (grad_c: our "
                    "assumed constant) is below the measured E||grad R_L - grad R_inf||^2 at some L and seed",
     "kind": "<=", "threshold": 0, "reference": "0 of 36"},
    {"id": "C2-grad-slopes", "claim": "C2",
     "description": "log-log slope in L of the seed-mean E||grad R_L - grad R_inf||^2, every (d, U_norm, "
                    "setting, scale)",
     "kind": "in", "threshold": [-1.15, -0.85], "reference": "-0.899 .. -1.043"},
    {"id": "C2-traj-fixed", "claim": "C2",
     "description": "log-log slope in L of the gradient gap g_L(t=0) at fixed parameters (Eq. 9 init), "
                    "seed-pooled, per setting (theory: -1/2)",
     "kind": "in", "threshold": [-0.6, -0.4], "reference": "-0.526"},
    {"id": "C2-traj-uniform", "claim": "C2",
     "description": "log-log slope in L of sup_t g_L(t) along the infinite-prompt trajectory, seed-pooled, "
                    "per setting (uniform-in-time concentration at the fixed-parameter rate -1/2)",
     "kind": "in", "threshold": [-0.6, -0.4], "reference": "-0.342 (non-monotone)"},
]

PARAMETERS = {
    "d": "token / covariate dimensions (list of int >= 1)",
    "U_norm": "Frobenius norms of U (list of float > 0)",
    "L": "nested prompt lengths, shared by the three parts (increasing list of int >= 1)",
    "n_seeds": "independent replicates per (d, U_norm): new U, queries, tasks",
    "sigma": "token standard deviation of the tail part (covariance sigma^2 I)",
    "tail_queries": "queries per cell (tail part)",
    "tail_prompts": "independent prompts per query (tail part; the n of every tail test)",
    "tail_levels": "tail probabilities of the CLT law at which the thresholds are set",
    "prompt_chunk": "prompts sampled and evaluated together (memory: prompt_chunk * L_max * d floats)",
    "clt_draws": "Gaussian draws per query of each CLT Monte Carlo (quantiles; independent tail estimate)",
    "tail_log_c1_per_d": "tail bound prefactor: c1 = exp(tail_log_c1_per_d * d) (OUR assumption; paper: existential)",
    "tail_c2": "tail bound rate: c2 = tail_c2 / sigma^2 (OUR assumption; paper: existential)",
    "grad_scales": "scales s of the covariate covariance s * Sigma_setting (gradient part)",
    "grad_pairs": "antithetic task pairs per (cell, setting, scale)",
    "grad_queries": "queries per task (gradient part)",
    "grad_draws": "independent prompt sets per (cell, setting, scale) for E over prompts",
    "grad_c": "constant of the paper-form gradient bound (OUR assumption; paper: existential)",
    "traj_d": "covariate dimension of the trajectory part (C3: 3)",
    "traj_pairs": "antithetic task pairs of the trajectory part (C3: 48)",
    "traj_queries": "queries per task of the trajectory part (C3: 2)",
    "traj_replicates": "prompt sets over which g_L(t) is averaged",
    "traj_lr": "gradient-descent step of the linear(inf) trajectory (C3: 0.01)",
    "traj_steps": "gradient-descent steps (C3: 2500)",
    "traj_ckpt_every": "checkpoint spacing in steps (C3: 20)",
    "traj_seeds": "independent task draws per setting (trajectory part)",
    "root_seed": "root of every cell's random generator",
}


def _positive_int(config, key):
    value = config[key]
    if isinstance(value, bool) or int(value) != value or int(value) < 1:
        raise ValueError(f"{key} must be a positive integer, got {value!r}")


def validate(config):
    """Raise ValueError for an inconsistent configuration, or one the analysis cannot use (checked
    before any work: at least 3 prompt lengths for the slopes in L, no value listed twice)."""
    Ls = check_prompt_lengths(config["L"])
    if len(Ls) < 3:
        raise ValueError(f"L needs at least 3 prompt lengths (log-log slopes), got {Ls.tolist()}")
    for key in ("d", "U_norm", "grad_scales"):
        values = list(config[key])
        repeated = list(dict.fromkeys(v for i, v in enumerate(values) if v in values[:i]))
        if repeated:
            raise ValueError(f"{key} repeats the value{'s' * (len(repeated) > 1)} {', '.join(map(repr, repeated))}: "
                             f"each value is its own coordinate of the results, list it once (got {values})")
    if not config["d"] or any(int(d) < 1 for d in config["d"]):
        raise ValueError(f"d must be >= 1, got {config['d']}")
    if not config["U_norm"] or any(not float(u) > 0 for u in config["U_norm"]):
        raise ValueError(f"U_norm must be > 0, got {config['U_norm']}")
    for key in ("n_seeds", "tail_queries", "tail_prompts", "prompt_chunk", "clt_draws", "grad_pairs",
                "grad_queries", "grad_draws", "traj_d", "traj_pairs", "traj_queries", "traj_replicates",
                "traj_ckpt_every", "traj_seeds"):
        _positive_int(config, key)
    levels = np.asarray(config["tail_levels"], dtype=float)
    if levels.ndim != 1 or levels.size == 0 or np.any(~(levels > 0) | ~(levels < 1)):
        raise ValueError(f"tail_levels must be probabilities in (0, 1), got {config['tail_levels']}")
    if np.any(np.diff(levels) >= 0):
        raise ValueError(f"tail_levels must be strictly decreasing, got {config['tail_levels']}")
    if float(config["clt_draws"]) * float(levels.min()) < 10:
        raise ValueError(f"clt_draws = {config['clt_draws']} is too few for the tail level {levels.min():g} "
                         "(need clt_draws * level >= 10)")
    for key in ("sigma", "tail_log_c1_per_d", "tail_c2", "grad_c", "traj_lr"):
        if not float(config[key]) > 0:
            raise ValueError(f"{key} must be > 0, got {config[key]}")
    if not config["grad_scales"] or any(not float(s) > 0 for s in config["grad_scales"]):
        raise ValueError(f"grad_scales must be > 0, got {config['grad_scales']}")
    if int(config["traj_steps"]) < 0 or int(config["traj_steps"]) % int(config["traj_ckpt_every"]):
        raise ValueError(f"traj_steps = {config['traj_steps']} must be a non-negative multiple of "
                         f"traj_ckpt_every = {config['traj_ckpt_every']}")


# --------------------------------------------------------------------------- (a) output tails


def clt_radii(rng, C, levels, n_draws):
    """``(1 - level)`` quantiles of ``||N(0, C)||`` by Monte Carlo: ``C (Q, d, d)`` -> ``(Q, nlev)``.

    ``||C^{1/2} g||^2 = sum_j lam_j g_j^2`` with ``lam`` the eigenvalues of ``C``; one block of
    ``n_draws x d`` standard normals per query, in query order.
    """
    lam = np.linalg.eigvalsh(C)
    out = np.empty((C.shape[0], len(levels)))
    for i in range(C.shape[0]):
        y = rng.standard_normal((n_draws, C.shape[-1])) ** 2 @ lam[i]
        out[i] = np.sqrt(np.quantile(y, 1.0 - np.asarray(levels, dtype=float)))
    return out


def clt_tail(rng, C, radii, n_draws):
    """``P(||N(0, C)|| > r)`` by Monte Carlo: ``C (Q, d, d)``, ``radii (Q, nlev)`` -> ``(Q, nlev)``.

    Equals ``P(||N(0, C / L)|| > r / sqrt(L))`` for every ``L``."""
    lam = np.linalg.eigvalsh(C)
    out = np.empty(radii.shape)
    for i in range(C.shape[0]):
        y = rng.standard_normal((n_draws, C.shape[-1])) ** 2 @ lam[i]
        out[i] = np.mean(y[:, None] > radii[i] ** 2, axis=0)
    return out


def tail_counts(rng, law, U, q, f_inf, Ls, thresholds, n_prompts, chunk):
    """Exceedance counts ``#{prompts : ||f_L(q) - f_inf(q)|| > t}``, ``(Q, nL, nlev)``.

    For each query in turn, prompts of ``L_max`` tokens are drawn from ``law`` in chunks of
    ``chunk`` (``law.sample(rng, (chunk, L_max))``) and evaluated at every ``L`` in one prefix pass.
    ``thresholds (Q, nL, nlev)``.
    """
    Q = q.shape[0]
    counts = np.zeros(thresholds.shape)
    V = np.eye(law.D)
    for i in range(Q):
        for start in range(0, n_prompts, chunk):
            m = min(chunk, n_prompts - start)
            Z = law.sample(rng, (m, Ls[-1]))
            f_L = softmax_attention_prefix(Z, U, V, q[i], Ls)  # (m, nL, d)
            err = np.sqrt(np.sum((f_L - f_inf[i]) ** 2, axis=-1))  # (m, nL)
            counts[i] += np.sum(err[:, :, None] > thresholds[i][None], axis=0)
    return counts


def tail_part(rng_tail, rng_clt, d, U_norm, config):
    sigma, Ls = float(config["sigma"]), np.asarray(config["L"])
    levels = np.asarray(config["tail_levels"], dtype=float)
    Q, P, n_mc = int(config["tail_queries"]), int(config["tail_prompts"]), int(config["clt_draws"])
    law = Gaussian(cov=sigma**2, D=d)
    U = rng_tail.standard_normal((d, d))
    U *= U_norm / np.linalg.norm(U)
    q = law.sample(rng_tail, Q)
    a = q @ U.T
    f_inf = law.tilted_mean(a)  # sigma^2 U q
    C = law.snis_covariance(a)  # (Q, d, d): lim L Cov(f_L)
    radii = clt_radii(rng_clt, C, levels, n_mc)
    clt = clt_tail(rng_clt, C, radii, n_mc)
    thresholds = radii[:, None, :] / np.sqrt(Ls)[None, :, None]  # (Q, nL, nlev)
    counts = tail_counts(rng_tail, law, U, q, f_inf, Ls, thresholds, P, int(config["prompt_chunk"]))
    Uq_sq = np.sum(a**2, axis=-1)
    K = np.exp(4.0 * sigma**2 * Uq_sq)
    c1, c2 = np.exp(float(config["tail_log_c1_per_d"]) * d), float(config["tail_c2"]) / sigma**2
    bound = c1 * np.exp(-c2 * Ls[None, :, None] * thresholds**2 / K[:, None, None])
    nL = len(Ls)
    return {
        "tail_count": counts,
        "tail_n": np.float64(P),
        "tail_threshold": thresholds,
        "tail_clt": np.repeat(clt[:, None, :], nL, axis=1),
        "tail_bound": bound,
        "tail_K": K,
        "tail_Uq_sq": Uq_sq,
        "tail_c1_eff": np.float64(c1),
        "tail_c2_eff": np.float64(c2),
    }


# --------------------------------------------------------------------------- (b) gradients


def covariance(setting, scale, d):
    """``scale * I_d`` (isotropic) or ``scale * diag(geomspace(2, 0.5, d))`` (anisotropic)."""
    if setting == "isotropic":
        base = np.ones(d)
    elif setting == "anisotropic":
        base = np.geomspace(2.0, 0.5, d)
    else:
        raise ValueError(f"unknown setting {setting!r}; expected one of {SETTINGS}")
    return np.diag(float(scale) * base)


def gradient_parameters(Sigma, U_norm):
    """``U = U_norm blockdiag(Sigma^-1, 0) / ||Sigma^-1||_F``, ``v = U_norm e_{d+1}``."""
    d = Sigma.shape[0]
    Sinv = np.linalg.inv(Sigma)
    U = np.zeros((d + 1, d + 1))
    U[:d, :d] = U_norm * Sinv / np.linalg.norm(Sinv)
    v = np.zeros(d + 1)
    v[d] = U_norm
    return U, v


def gradient_log_bound_constant(tasks, U, v):
    """``log`` of ``mean over (task, query) of K_i P_i``; the paper-form bound is ``grad_c / L``
    times ``exp`` of it. Also returns ``log mean K_i``, ``log mean exp(a_i' Gamma a_i)`` and
    ``max a_i' Gamma a_i``.

    Per item (task ``w``, query ``z_q``), with ``Gamma = Gamma_w``, ``lam = ||Gamma||_op`` (the
    sub-Gaussian proxy of the task's tokens ``(x, w.x)``, the paper's ``sigma^2``), ``a = U z_q``,
    ``m = Gamma a``, ``r = v.m - y_q`` (linear(inf) residual):

    * ``K = exp(4 lam ||a||^2)``: the paper's exponential factor;
    * ``P = tr(Gamma) [(|r| + ||v|| ||m||)^2 + ||z_q||^2 ||v||^2 (lam |r| + ||Gamma v||)^2]``.

    Derivation (first order in the SNIS fluctuations ``dm`` of the tilted mean and ``d(Cv)`` of
    the tilted covariance times ``v``): ``||dg_v|| <= (|r| + ||v|| ||m||) ||dm||``,
    ``||dg_U|| <= ||z_q|| (|r| ||d(Cv)|| + ||v|| ||Gamma v|| ||dm||)``, and the paper-form
    ``E||dm||^2 <= tr(Gamma) K / L``, ``E||d(Cv)||^2 <= lam^2 ||v||^2 tr(Gamma) K / L``
    (the sharp delta-method constant of ``dm`` is ``exp(a'Gamma a)(tr Gamma + ||Gamma a||^2)``,
    below ``(tr Gamma + lam) K``). The task-and-query mean of the gradients is bounded by the
    mean of the per-item bounds (Jensen), so the bound holds for the risk's gradient whatever the
    dependence between items. The constant ``grad_c`` in front is our assumption. Computed in
    log space (``K`` reaches ``exp(300)`` for large ``d``, ``||U||`` and ``Sigma``).
    """
    G = icl.Gamma_w(tasks.Sigma, tasks.w)                        # (n, D, D)
    lam = np.linalg.eigvalsh(G)[:, -1][:, None]                  # (n, 1)
    trG = np.trace(G, axis1=-2, axis2=-1)[:, None]
    z_q = tasks.z_q
    a = z_q @ U.T                                                # (n, q, D)
    m = np.einsum("nij,nqj->nqi", G, a)
    r = m @ v - tasks.y_q                                        # (n, q)
    vn = np.linalg.norm(v)
    Gv = np.linalg.norm(G @ v, axis=-1)[:, None]                 # (n, 1)
    log_K = 4.0 * lam * np.sum(a**2, axis=-1)
    P = trG * ((np.abs(r) + vn * np.linalg.norm(m, axis=-1)) ** 2
               + np.sum(z_q**2, axis=-1) * vn**2 * (lam * np.abs(r) + Gv) ** 2)
    quad = np.einsum("nqi,nij,nqj->nq", a, G, a)
    return _log_mean_exp(log_K + np.log(P)), _log_mean_exp(log_K), _log_mean_exp(quad), float(quad.max())


def _log_mean_exp(x):
    x = np.ravel(x)
    top = x.max()
    return float(top + np.log(np.mean(np.exp(x - top))))


def fresh_prompt(rng, tasks, law):
    """A new prompt set for the same tasks: covariates ``law.sample(rng, (n_pairs, L_max))`` shared
    by antithetic partners, labels ``w^T x`` (the layout of ``icl.make_tasks``)."""
    x = np.repeat(np.asarray(law.sample(rng, (tasks.n_tasks // 2, tasks.L_max)), dtype=float), 2, axis=0)
    return np.concatenate([x, np.einsum("nli,ni->nl", x, tasks.w)[..., None]], axis=-1)


def gradient_gaps(rng, Sigma, U, v, Ls, n_pairs, n_queries, n_draws):
    """Squared gradient gaps over ``n_draws`` prompt sets for tasks drawn once.

    Draw order from ``rng``: ``icl.make_tasks(rng, d, n_pairs, n_queries, L_max, N(0, Sigma))``
    (its prompts are draw 0), then for each further draw the covariates ``(n_pairs, L_max)``
    (:func:`fresh_prompt`), as ``stability.gradient_gap_trajectory`` draws its replicates.

    Returns ``(tasks, gap_sq (n_draws, nL), grad_inf_sq)``: ``gap_sq = ||grad R_L - grad R_inf||^2``
    of the risk (mean over tasks and queries; softmax(L) vs linear(inf), both from ``icl``).
    """
    d = Sigma.shape[0]
    law = icl.covariate_law("gaussian", Sigma)
    tasks = icl.make_tasks(rng, d, n_pairs, n_queries, int(Ls[-1]), law)
    _, gU_inf, gv_inf = icl.linear_risk_grad(U, v, icl.Gamma_w(Sigma, tasks.w), tasks.z_q, tasks.y_q)
    gap_sq = np.empty((n_draws, len(Ls)))
    for r in range(n_draws):
        Z = tasks.Z if r == 0 else fresh_prompt(rng, tasks, law)
        for j, L in enumerate(Ls):
            _, gU, gv = icl.softmax_risk_grad(U, v, Z[:, :L], tasks.z_q, tasks.y_q)
            gap_sq[r, j] = np.sum((gU - gU_inf) ** 2) + np.sum((gv - gv_inf) ** 2)
    return tasks, gap_sq, float(np.sum(gU_inf**2) + np.sum(gv_inf**2))


def gradient_part(rng, d, U_norm, config):
    Ls = [int(L) for L in config["L"]]
    scales = [float(s) for s in config["grad_scales"]]
    shape = (len(SETTINGS), len(scales))
    out = {k: np.empty(shape + (len(Ls),)) for k in ("grad_gap_sq", "grad_gap_sq_se", "grad_log_bound")}
    out.update({k: np.empty(shape) for k in ("grad_inf_sq", "grad_log_K", "grad_log_K_sharp", "grad_max_quad")})
    n_draws = int(config["grad_draws"])
    for i, setting in enumerate(SETTINGS):
        for j, scale in enumerate(scales):
            Sigma = covariance(setting, scale, d)
            U, v = gradient_parameters(Sigma, U_norm)
            tasks, gap_sq, inf_sq = gradient_gaps(
                substream(rng, setting=setting, scale=scale), Sigma, U, v, Ls, int(config["grad_pairs"]), int(config["grad_queries"]), n_draws)
            log_const, log_K, log_K_sharp, max_quad = gradient_log_bound_constant(tasks, U, v)
            out["grad_gap_sq"][i, j] = gap_sq.mean(axis=0)
            out["grad_gap_sq_se"][i, j] = (gap_sq.std(axis=0, ddof=1) / np.sqrt(n_draws) if n_draws > 1
                                           else np.zeros(len(Ls)))
            out["grad_log_bound"][i, j] = np.log(float(config["grad_c"])) + log_const - np.log(Ls)
            out["grad_inf_sq"][i, j] = inf_sq
            out["grad_log_K"][i, j] = log_K
            out["grad_log_K_sharp"][i, j] = log_K_sharp
            out["grad_max_quad"][i, j] = max_quad
    return out


# --------------------------------------------------------------------------- engine plumbing


def grid(config):
    return {"d": list(config["d"]), "U_norm": list(config["U_norm"]), "seed": list(range(config["n_seeds"]))}


def checkpoints(config):
    return list(range(0, int(config["traj_steps"]) + 1, int(config["traj_ckpt_every"])))


def inner_coords(config):
    return {"query": list(range(config["tail_queries"])), "L": list(config["L"]),
            "level": [float(x) for x in config["tail_levels"]], "setting": list(SETTINGS),
            "scale": [float(s) for s in config["grad_scales"]], "traj_seed": list(range(config["traj_seeds"])),
            "t": checkpoints(config)}


def kernel(cell, rng, config):
    d, U_norm = int(cell["d"]), float(cell["U_norm"])
    rng_tail, rng_clt, rng_grad = rng.spawn(3)
    return {**tail_part(rng_tail, rng_clt, d, U_norm, config), **gradient_part(rng_grad, d, U_norm, config)}


def cell_inputs(config, cell):
    """What reaches a cell: every key but the grid's (``d``, ``U_norm``, ``n_seeds``) and the
    trajectory part's (``traj_*``, the global task's own)."""
    return {k: v for k, v in config.items() if k not in ("d", "U_norm", "n_seeds") and not k.startswith("traj_")}


def trajectory_rng(setting, traj_seed, root_seed):
    """The generator of one trajectory run, keyed by its values (setting name, trajectory seed)."""
    return cell_rng(f"{NAME}/trajectory", {"setting": setting, "traj_seed": traj_seed}, root_seed)


def trajectory_part(config):
    """The global task: ``gradient_gap_trajectory`` for every (setting, traj_seed)."""
    d, Ls = int(config["traj_d"]), [int(L) for L in config["L"]]
    n_set, n_seed, n_t = len(SETTINGS), int(config["traj_seeds"]), len(checkpoints(config))
    out = {k: np.empty((n_set, n_seed, len(Ls), n_t)) for k in ("traj_g", "traj_g_risk")}
    out.update({k: np.empty((n_set, n_seed, n_t)) for k in ("traj_risk_inf", "traj_dist_bayes",
                                                              "traj_logit_factor", "traj_U_norm")})
    out["traj_trace_inv_sq"] = np.empty(n_set)
    out["traj_concentration_constant"] = np.empty(n_set)
    for i, setting in enumerate(SETTINGS):
        Sigma = covariance(setting, 1.0, d)
        out["traj_trace_inv_sq"][i] = np.sum(np.diag(Sigma) ** -2.0)
        out["traj_concentration_constant"][i] = concentration_constant(Sigma)
        for s in range(n_seed):
            res = gradient_gap_trajectory(
                trajectory_rng(setting, s, config["root_seed"]), Sigma, Ls, n_pairs=int(config["traj_pairs"]),
                n_queries=int(config["traj_queries"]), n_replicates=int(config["traj_replicates"]),
                lr=float(config["traj_lr"]), n_steps=int(config["traj_steps"]),
                ckpt_every=int(config["traj_ckpt_every"]), x_law="gaussian", label=f"{NAME}[{setting}, seed {s}]")
            out["traj_g"][i, s] = res["g"]
            out["traj_g_risk"][i, s] = res["g_risk"]
            out["traj_risk_inf"][i, s] = res["risk_inf"]
            out["traj_dist_bayes"][i, s] = res["dist_bayes"]
            out["traj_logit_factor"][i, s] = res["logit_factor"]
            out["traj_U_norm"][i, s] = np.linalg.norm(res["U_inf"], axis=(-2, -1))
    return out


_TAIL = ("d", "U_norm", "seed", "query", "L", "level")
_GRAD = ("d", "U_norm", "seed", "setting", "scale")

VARIABLES = (
    # (a) output tails
    Variable("tail_count", _TAIL, "tail exceedance count",
             "number of the tail_n prompts with ||f_L(q) - f_inf(q)|| > tail_threshold (softmax attention, V = I, "
             "Gaussian tokens N(0, sigma^2 I), f_inf = sigma^2 U q)", units="prompts"),
    Variable("tail_n", ("d", "U_norm", "seed"), "prompts per tail test",
             "independent prompts per query (the n of every tail test)", units="prompts"),
    Variable("tail_threshold", _TAIL, "tail threshold t",
             "r / sqrt(L), r the (1 - level) quantile of ||N(0, C)||, C = lim L Cov(f_L) = "
             "exp(a'Sigma a)(Sigma + Sigma a a' Sigma), a = U q (Monte Carlo, clt_draws draws)"),
    Variable("tail_clt", _TAIL, "CLT tail probability",
             "P(||N(0, C/L)|| > t): the sharp (CLT) prediction at the threshold used, by an independent Monte "
             "Carlo of clt_draws Gaussian vectors (independent of L since t ~ 1/sqrt(L))"),
    Variable("tail_bound", _TAIL, "paper-form tail bound",
             "c1 exp(-c2 L t^2 / K(a)), K(a) = exp(4 sigma^2 ||U q||^2), c1 = exp(tail_log_c1_per_d d), "
             "c2 = tail_c2/sigma^2; tail_log_c1_per_d, tail_c2 (attrs['config']) are OUR assumption (Hsu-Kakade-Zhang "
             "norm bound of a sub-Gaussian vector with proxy sigma^2 K/L: defaults 2/3 and 1/3): the paper's "
             "constants are existential. Not capped at 1"),
    Variable("tail_K", ("d", "U_norm", "seed", "query"), "paper's exponential factor K(a)",
             "exp(4 sigma^2 ||U q||^2) (the sharp asymptotics carry exp(sigma^2 ||U q||^2))"),
    Variable("tail_Uq_sq", ("d", "U_norm", "seed", "query"), "squared logit norm ||U q||^2",
             "||U q||^2 of each tail query"),
    Variable("tail_c1_eff", ("d", "U_norm", "seed"), "tail bound prefactor c1",
             "c1 = exp(tail_log_c1_per_d * d) used in tail_bound (OUR assumption)"),
    Variable("tail_c2_eff", ("d", "U_norm", "seed"), "tail bound rate c2",
             "c2 = tail_c2 / sigma^2 used in tail_bound (OUR assumption)"),
    # (b) gradient concentration
    Variable("grad_gap_sq", _GRAD + ("L",), "mean squared gradient gap",
             "mean over grad_draws prompt sets of ||grad R_L - grad R_inf||^2 (U Frobenius and v jointly), R_L the "
             "softmax(L) risk and R_inf the linear(inf) (Gamma_w) risk, both means over the same tasks and queries; "
             "U = U_norm blockdiag(Sigma^-1, 0)/||Sigma^-1||_F, v = U_norm e_{d+1}"),
    Variable("grad_gap_sq_se", _GRAD + ("L",), "standard error of the mean squared gradient gap",
             "sample standard deviation over prompt draws / sqrt(grad_draws)"),
    Variable("grad_inf_sq", _GRAD, "squared norm of the limit gradient",
             "||grad R_inf||^2 at the fixed parameters (linear(inf), same tasks and queries)"),
    Variable("grad_log_bound", _GRAD + ("L",), "natural log of the paper-form gradient bound",
             "log of grad_c / L * mean over (task, query) of K P, K = exp(4 lam ||U z_q||^2), lam = ||Gamma_w||_op, "
             "P = tr(Gamma_w)[(|r| + ||v|| ||m||)^2 + ||z_q||^2 ||v||^2 (lam |r| + ||Gamma_w v||)^2], "
             "m = Gamma_w U z_q, "
             "r = v.m - y_q (first-order derivation, pipelines.c2_concentration.gradient_log_bound_constant); grad_c "
             "(attrs['config']) is OUR assumption (default 1): the paper's constant is existential"),
    Variable("grad_log_K", _GRAD, "log of the mean paper exponential factor",
             "log of the mean over (task, query) of exp(4 lam ||U z_q||^2), lam = ||Gamma_w||_op"),
    Variable("grad_log_K_sharp", _GRAD, "log of the mean sharp exponential factor",
             "log of the mean over (task, query) of exp(a' Gamma_w a), a = U z_q (the factor of the sharp "
             "SNIS constant)"),
    Variable("grad_max_quad", _GRAD, "largest logit quadratic form",
             "max over (task, query) of a' Gamma_w a, a = U z_q: the SNIS error of that item is in its 1/L regime "
             "only once L >> exp(2 a' Gamma_w a) (third-moment term of the expansion)"),
    # (c) trajectory stability (global task)
    Variable("traj_g", ("setting", "traj_seed", "L", "t"), "gradient gap along the infinite-prompt trajectory",
             "g_L(t) = sqrt(mean over prompt replicates and tasks of ||grad R_L^task - grad R_inf^task||^2) at "
             "theta_inf(t) (stability.gradient_gap_trajectory; d = traj_d, Sigma = I or diag(geomspace(2, 0.5, d)))"),
    Variable("traj_g_risk", ("setting", "traj_seed", "L", "t"), "risk-gradient gap along the trajectory",
             "sqrt(mean over prompt replicates of ||grad R_L - grad R_inf||^2) at theta_inf(t), R the training risk "
             "(mean over all tasks and queries): the definition of grad_gap_sq, as a norm"),
    Variable("traj_risk_inf", ("setting", "traj_seed", "t"), "training risk of linear(inf)",
             "risk of theta_inf(t) on the trajectory's tasks"),
    Variable("traj_dist_bayes", ("setting", "traj_seed", "t"), "distance to the Bayes optimum",
             "||theta_inf(t) - theta*||, theta* of Remark 5.2"),
    Variable("traj_logit_factor", ("setting", "traj_seed", "t"), "mean exponential logit factor",
             "mean over tasks and queries of exp(a' Gamma_w a), a = U_inf(t) z_q"),
    Variable("traj_U_norm", ("setting", "traj_seed", "t"), "Frobenius norm of U along the trajectory",
             "||U_inf(t)||_F"),
    Variable("traj_trace_inv_sq", ("setting",), "tr(Sigma^-2) of the trajectory setting",
             "the query-averaged concentration constant at the Bayes optimum is finite iff tr(Sigma^-2) > 4"),
    Variable("traj_concentration_constant", ("setting",), "query-averaged concentration constant",
             "E_xq exp(x_q' Sigma^-1 x_q / c^2) = (1 - 2 tr(Sigma^-2)^-1/2)^(-d/2) at the Bayes optimum; "
             "+inf by design when tr(Sigma^-2) <= 4", allow_nonfinite=True),
)

EXPERIMENT = Experiment(
    name=NAME, grid=grid, inner_coords=inner_coords, variables=VARIABLES, kernel=kernel,
    description="C2: output tails of softmax attention vs the paper-form bound (assumed constants) and the CLT; "
                "gradient concentration at fixed parameters; gradient gap along the infinite-prompt trajectory",
    global_kernel=trajectory_part, cell_config=cell_inputs)
