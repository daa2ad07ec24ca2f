"""C1 for other attention kernels: each converges to its own exact limit, linear attention times
a scalar gain (Stein's lemma on Gaussian tokens), and random-feature softmax to softmax's limit.

docs/kernels.md: for ``z ~ N(0, Sigma)`` and a weight ``kappa(z.a)``,
``E[kappa(s) z] = Sigma a E kappa'(s)``, ``s ~ N(0, r^2)``, ``r = ||a||_Sigma``.

Part ``""`` (grid ``kernel x r x seed``, one dask task per cell): ``Sigma = diag(Sigma)``,
``U = I``, ``V = I``; ``n_queries`` queries ``a`` of random direction rescaled to
``||a||_Sigma = r``; for each, ``n_prompts`` prompts of ``L_max`` Gaussian tokens evaluated at
every nested ``L`` (:func:`sfxlin.kernels.kernel_attention_prefix`). Measured: the error to the
kernel's own exact limit, its exact (unnormalised, ``sigmoid_logL``) or delta-method
(normalised) prediction, the gain read off the prompt mean at ``L_max`` (projection on
``Sigma a``) against the Stein gain, the share of that mean orthogonal to ``Sigma a``, and the
z-scores of the prompt mean against the limit. Kernel ``rf_softmax`` is random-feature softmax
with ``rf_m_attention`` features drawn per cell; its limit is the fixed-feature closed form.

Part ``stein`` (one cell): Stein's identity ``E[kappa(s) z] = Sigma a E kappa'(s)`` checked by a
D-dimensional tensor Gauss-Hermite rule that does not use it, for every kernel.

Part ``rf`` (grid ``rf_sigma2 x rf_m``): the fixed-feature limit of random-feature softmax
against softmax's ``Sigma a`` as the number of features ``m`` grows, over ``rf_draws``
independent feature draws; ``D = 3``, ``Sigma = rf_sigma2 I`` and ``a = rf_a e_1`` (every direction
is equivalent: the law of the features is rotation invariant).
"""
from __future__ import annotations

import math

import numpy as np
from numpy.polynomial.hermite_e import hermegauss

from sfxlin.kernels import KERNELS as KERNEL_CLASSES
from sfxlin.kernels import (KERNEL_NAMES, SMOOTHNESS, Kernel, kernel_attention_prefix, kernel_limit, kernel_mse,
                            positive_random_features, rf_attention_prefix, rf_feature_constant, rf_limit)
from sfxlin.engine.params import Param, Profiles
from sfxlin.engine.sweep import Experiment, Out, Part, Variable, substream

NAME = "c1_kernels"
#: the kernels of the sweep: every kernel of the registry (``sfxlin.kernels.KERNEL_NAMES``), softmax at
#: temperature sqrt(D) beside softmax, and random features
KERNELS = ("softmax", "softmax_sqrtd", *(name for name in KERNEL_NAMES if name != "softmax"), "rf_softmax")

PARAMS = (
    Param("kernels", "str_list", "attention kernels: " + " ".join(KERNELS) + " (softmax_sqrtd: temperature "
          "sqrt(D); rf_softmax: positive random features)", list(KERNELS), choices=KERNELS, grid=True),
    Param("Sigma", "float_list", "diagonal of the token covariance (D = its length)", [1.5, 1.0, 0.5],
          low=0, low_open=True),
    Param("r", "float_list", "query sizes r = ||a||_Sigma, a = U q", Profiles(quick=[0.5, 1.0], paper=[0.25, 0.5, 1.0, 1.5]),
          low=0, low_open=True, grid=True),
    Param("L", "int_list", "nested prompt lengths",
          Profiles(quick=[2**k for k in range(4, 11)], paper=[2**k for k in range(4, 15)]), unit="tokens",
          low=1, order="increasing", min_len=3, why="the analysis fits log-log slopes in L"),
    Param("n_seeds", "int", "independent replicates per (kernel, r)", Profiles(quick=1, paper=2), low=1, grid=True),
    Param("n_queries", "int", "queries per cell", Profiles(quick=3, paper=8), low=1),
    Param("n_prompts", "int", "independent prompts per query", Profiles(quick=8, paper=16), low=2,
          why="the z-scores need a standard error over prompts"),
    Param("sigmoid_bias", "float", "bias b of the sigmoid kernel sigma(s + b)", -2.0),
    Param("rf_m_attention", "int", "random features of the rf_softmax kernel", 16, low=1),
    Param("rf_sigma2", "float_list", "token variances s (Sigma = s I) of the random-feature study",
          Profiles(quick=[0.1, 2.0], paper=[0.1, 0.25, 0.5, 1.0, 2.0]), low=0, low_open=True, grid=True),
    Param("rf_m", "int_list", "numbers of random features m", Profiles(quick=[4, 16, 64, 256], paper=[2**k for k in range(2, 12)]),
          low=1, order="increasing", min_len=3, why="the analysis fits log-log slopes in m", grid=True),
    Param("rf_a", "float", "Euclidean norm |a| of the random-feature study's query (the feature weights' spread "
          "grows like exp(|a|^2))", 0.5, low=0, low_open=True),
    Param("rf_draws", "int", "independent feature draws per (rf_sigma2, m)", Profiles(quick=200, paper=2000), low=2),
    Param("stein_nodes", "int", "Gauss-Hermite nodes per dimension of the Stein check", 60, low=2),
    Param("root_seed", "int", "root of every cell's random generator", 20251211),
)


def make_kernel(name, config):
    """The :class:`~sfxlin.kernels.Kernel` of a sweep kernel name (not ``rf_softmax``)."""
    D = len(config["Sigma"])
    if name == "softmax_sqrtd":
        return Kernel("softmax", temperature=math.sqrt(D))
    return Kernel("sigmoid", bias=config["sigmoid_bias"]) if name == "sigmoid" else Kernel(name)


def grid(config):
    return {"kernel": list(config["kernels"]), "r": list(config["r"]), "seed": list(range(config["n_seeds"]))}


def inner_coords(config):
    return {"L": list(config["L"]), "query": list(range(config["n_queries"])), "stein_kernel": list(KERNEL_NAMES),
            "rf_draw": list(range(config["rf_draws"]))}


def _queries(rng, S, r, n):
    """``n`` logit vectors of random direction with ``||a||_Sigma = r``."""
    a = rng.standard_normal((n, S.shape[0]))
    return r * a / np.sqrt(np.einsum("qd,de,qe->q", a, S, a))[:, None]


def kernel(cell, rng, config):
    name, r = cell["kernel"], cell["r"]
    S = np.diag(np.asarray(config["Sigma"], dtype=float))
    D, Ls = S.shape[0], np.asarray(config["L"])
    Q, P = config["n_queries"], config["n_prompts"]
    I = np.eye(D)
    a = _queries(rng, S, r, Q)
    chol = np.linalg.cholesky(S)
    if name == "rf_softmax":
        W = positive_random_features(substream(rng, part="features"), config["rf_m_attention"], D)
        lim = rf_limit(S, I, I, a, W)
        theory = np.full(len(Ls), np.nan)
    else:
        k = make_kernel(name, config)
        lim = kernel_limit(k, S, I, I, a)
        theory = kernel_mse(k, S, I, a[:, None, :], Ls).mean(axis=0)
    token_rng = substream(rng, part="tokens")
    sq_err = np.empty((Q, P, len(Ls)))
    final_mean, final_se = np.empty((Q, D)), np.empty((Q, D))
    for i in range(Q):
        Z = token_rng.standard_normal((P, Ls[-1], D)) @ chol.T
        if name == "rf_softmax":
            f = rf_attention_prefix(Z, I, I, a[i], Ls, W)
        else:
            f = kernel_attention_prefix(Z, I, I, a[i], Ls, k)
        sq_err[i] = np.sum((f - lim[i]) ** 2, axis=-1)
        final_mean[i] = f[:, -1].mean(axis=0)
        final_se[i] = f[:, -1].std(axis=0, ddof=1) / math.sqrt(P)
    Sa = a @ S
    B = np.sum(Sa**2, axis=-1)
    gain_q = np.sum(final_mean * Sa, axis=-1) / B              # projection of the prompt mean on Sigma a
    gain_q_se = np.sqrt(np.sum((final_se * Sa) ** 2, axis=-1)) / B
    orth = final_mean - gain_q[:, None] * Sa
    return {
        "mse": Out(sq_err.mean(axis=(0, 1)), ("L",)),
        "mse_theory": Out(theory, ("L",)),
        "mse_query": Out(sq_err.mean(axis=1), ("query", "L")),
        "gain_measured": np.float64(gain_q.mean()),
        "gain_se": np.float64(np.sqrt(np.sum(gain_q_se**2)) / Q),
        "gain_limit": np.float64((np.sum(lim * Sa, axis=-1) / B).mean()),
        "orth_share": np.float64(np.mean(np.linalg.norm(orth, axis=-1) / np.linalg.norm(final_mean, axis=-1))),
        "z2": np.float64(np.mean(((final_mean - lim) / final_se) ** 2)),
    }


def no_grid(config):
    """The Stein check is one cell."""
    return {}


def stein_inputs(config, cell):
    return {k: config[k] for k in ("Sigma", "sigmoid_bias", "stein_nodes", "root_seed")}


def stein_check(cell, rng, config):
    """``|E[kappa(s) z] - Sigma a E kappa'(s)| / |Sigma a E kappa'(s)|`` (max over 4 random ``a``), the
    left side by a tensor Gauss-Hermite rule on ``N(0, Sigma)`` (no use of Stein's identity), the right
    side by :meth:`Kernel.gain` (closed form or 1-D quadrature). ``sigmoid_logL`` at ``L = 16``."""
    S = np.diag(np.asarray(config["Sigma"], dtype=float))
    D, n = S.shape[0], config["stein_nodes"]
    x, w = hermegauss(n)
    nodes = np.stack(np.meshgrid(*[x] * D, indexing="ij"), -1).reshape(-1, D) @ np.linalg.cholesky(S).T
    weights = np.prod(np.stack(np.meshgrid(*[w / math.sqrt(2 * math.pi)] * D, indexing="ij"), -1).reshape(-1, D),
                      axis=-1)
    a = _queries(rng, S, 1.0, 4) * rng.uniform(0.3, 1.5, size=(4, 1))
    errors = []
    for name in KERNEL_NAMES:
        k, L = make_kernel(name, config), 16
        s = nodes @ a.T                                              # (nodes, 4)
        lhs = np.einsum("n,nq,nd->qd", weights, k.weight(s, L), nodes)
        r = np.sqrt(np.einsum("qd,de,qe->q", a, S, a))
        e1 = k.moments(r, L)[1]                                      # E kappa'(s)
        rhs = (a @ S) * e1[:, None]
        errors.append(np.max(np.linalg.norm(lhs - rhs, axis=-1) / np.linalg.norm(rhs, axis=-1)))
    smoothness = [SMOOTHNESS.index(KERNEL_CLASSES[name].smoothness) for name in KERNEL_NAMES]
    return {"stein_error": Out(np.array(errors), ("stein_kernel",)),
            "stein_smoothness": Out(np.array(smoothness, dtype=np.int8), ("stein_kernel",))}


def rf_grid(config):
    return {"rf_sigma2": list(config["rf_sigma2"]), "rf_m": list(config["rf_m"])}


def rf_inputs(config, cell):
    return {k: config[k] for k in ("rf_a", "rf_draws", "root_seed")}


def rf_study(cell, rng, config):
    """Squared error of the fixed-feature limit to ``Sigma a`` over independent feature draws."""
    s2, m, n = cell["rf_sigma2"], cell["rf_m"], config["rf_draws"]
    a, S, I = config["rf_a"] * np.eye(3)[0], s2 * np.eye(3), np.eye(3)
    chunk = max(1, (1 << 21) // m)  # draws per chunk: about 6M feature entries (48 MB)
    err = np.concatenate([
        np.sum((rf_limit(S, I, I, a, positive_random_features(rng, m, 3, n_draws=min(chunk, n - lo))) - a @ S) ** 2,
               axis=-1) for lo in range(0, n, chunk)])
    return {"rf_sq_error": Out(err, ("rf_draw",)), "rf_constant": np.float64(rf_feature_constant(S, I, a))}


def cell_work(config, part):
    """Work of one cell of ``part`` in its non-grid parameters (``sfxlin run --plan``'s cost law,
    :mod:`sfxlin.engine.plan`; the grid dims' costs, ``rf_m`` among them, are fitted). Main part:
    each query evaluates ``n_prompts`` prompts of ``L_max`` tokens in one prefix pass, plus
    ``MAIN_OVERHEAD_WORK``, a cell's fixed cost (the limits and the delta-method constants per L)
    in the same units; ``rf_m_attention`` is not in it (``rf_softmax`` is one kernel of the grid,
    whose mean cost the law fits). Stein part: the tensor rule's ``stein_nodes ** D`` nodes per
    kernel, plus ``STEIN_OVERHEAD_WORK``. Random-feature part: ``rf_draws`` feature draws, plus
    ``RF_OVERHEAD_WORK``."""
    if part == "stein":
        return config["stein_nodes"] ** len(config["Sigma"]) + STEIN_OVERHEAD_WORK
    if part == "rf":
        return config["rf_draws"] + RF_OVERHEAD_WORK
    return config["n_queries"] * config["n_prompts"] * max(config["L"]) + MAIN_OVERHEAD_WORK


#: a main cell's fixed cost in :func:`cell_work` units: warm CPU seconds of the cell kernel=softmax, r=0.5
#: (``python -m sfxlin.engine.plan c1_kernels --cell kernel=softmax,r=0.5 --set ...`` over L_max 256 .. 16384,
#: n_queries x n_prompts 3x8 .. 8x16) follow 0.0041 s + 5.3e-8 s per unit of work: 0.0041 / 5.3e-8
MAIN_OVERHEAD_WORK = 77_000
#: the Stein cell's fixed cost: 10^3 .. 90^3 nodes (D = 2, 3, 4) follow about 0.0037 s + 6.3e-7 s per node
STEIN_OVERHEAD_WORK = 6_000
#: a random-feature cell's fixed cost, in draws: 0.002 s, against 1.9e-6 s per draw at m = 16 and 3.0e-5 at
#: m = 256 (1200 and 64 draws): the value at m = 64, where the part's cells are in the middle
RF_OVERHEAD_WORK = 300


VARIABLES = (
    Variable("mse", ("kernel", "r", "L", "seed"), "mean squared error to the kernel's own limit",
             "mean over queries and prompts of ||f_L(q) - f_inf(q)||^2, f_inf the exact limit (Stein gain; "
             "rf_softmax: the fixed-feature closed form)."),
    Variable("mse_theory", ("kernel", "r", "L", "seed"), "predicted mean squared error",
             "mean over queries of sfxlin.kernels.kernel_mse: exact for unnormalised kernels and sigmoid_logL, "
             "delta-method constant / L for normalised ones; NaN by design for rf_softmax.", allow_nonfinite=True),
    Variable("mse_query", ("kernel", "r", "L", "seed", "query"), "per-query mean squared error",
             "mean over prompts of ||f_L(q) - f_inf(q)||^2."),
    Variable("gain_measured", ("kernel", "r", "seed"), "gain read off Monte Carlo at L_max",
             "mean over queries of <mean over prompts of f_Lmax, Sigma a> / ||Sigma a||^2."),
    Variable("gain_se", ("kernel", "r", "seed"), "standard error of gain_measured",
             "from the prompt-to-prompt spread of f_Lmax (independent prompts and queries)."),
    Variable("gain_limit", ("kernel", "r", "seed"), "gain of the exact limit",
             "mean over queries of <f_inf, Sigma a> / ||Sigma a||^2: the Stein gain (rf_softmax: of the fixed-feature "
             "limit, which is not exactly along Sigma a)."),
    Variable("orth_share", ("kernel", "r", "seed"), "share of the Monte Carlo mean orthogonal to Sigma a",
             "mean over queries of ||(I - proj on Sigma a) mean f_Lmax|| / ||mean f_Lmax||."),
    Variable("z2", ("kernel", "r", "seed"), "mean squared z-score of the Monte Carlo mean against the limit",
             "mean over queries and components of ((mean over prompts of f_Lmax - f_inf) / SE)^2; about "
             "(P-1)/(P-3) when the limit is right and the bias at L_max is negligible."),
    Variable("stein_error", ("stein_kernel",), "Stein identity vs tensor quadrature",
             "max over 4 random a of |E[kappa(s) z] (tensor Gauss-Hermite) - Sigma a E kappa'(s)| / |Sigma a E "
             "kappa'(s)|; the normalised ReLUs check their numerators.", part="stein"),
    Variable("stein_smoothness", ("stein_kernel",), "smoothness class of the kernel's weight",
             "The kernel class's declared smoothness: 0 smooth (derivatives of every order: the tensor Gauss-Hermite "
             "rule converges geometrically), 1 kinked (a jump in some derivative: algebraic convergence).",
             part="stein", dtype="int8", flag_meanings=SMOOTHNESS),
    Variable("rf_sq_error", ("rf_sigma2", "rf_m", "rf_draw"), "squared error of the fixed-feature limit",
             "||rf_limit(W) - Sigma a||^2 for one draw W of m positive random features.", part="rf"),
    Variable("rf_constant", ("rf_sigma2", "rf_m"), "delta-method constant of the feature average",
             "lim m E||rf_limit - Sigma a||^2 (sfxlin.kernels.rf_feature_constant); inf by design when "
             "rf_sigma2 >= 1 (infinite-variance feature weights).", part="rf", allow_nonfinite=True),
)

EXPERIMENT = Experiment(
    name=NAME, short="c1_kernels", params=PARAMS, inner_coords=inner_coords, variables=VARIABLES,
    analysis="sfxlin.analysis.c1_kernels",
    parts=(Part("", grid, kernel), Part("stein", no_grid, stein_check, inputs=stein_inputs),
           Part("rf", rf_grid, rf_study, inputs=rf_inputs)),
    title="C1 kernels: kernel attention -> linear attention times a scalar gain",
    description="C1 kernels: softmax, sigmoid, ReLU, ReLU^2, random features; limits and Stein gains")
