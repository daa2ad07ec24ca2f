"""C1 for other attention kernels, a variant of the C1 family: each kernel converges to its own exact limit,
linear attention times a scalar gain (Stein's lemma), random-feature softmax to softmax's limit. Parts: the main
grid ``kernel x r x seed``, ``stein`` (Stein's identity by tensor quadrature) and ``rf`` (the fixed-feature limit
against ``m``). The protocol: docs/kernels.md."""
from __future__ import annotations

import math

import numpy as np

from sfxlin.kernels import KERNELS as KERNEL_CLASSES
from sfxlin.kernels import (KERNEL_NAMES, SMOOTHNESS, Kernel, kernel_attention_prefix, kernel_limit, kernel_mse,
                            positive_random_features, rf_attention_prefix, rf_feature_constant, rf_limit,
                            stein_identity_error)
from sfxlin.engine import Cells, Out, Param, Profiles, Variable, substream

from .families.c1 import C1

NAME = "c1_kernels"
#: the kernels of the sweep: every kernel of the registry (``sfxlin.kernels.KERNEL_NAMES``), softmax at
#: temperature sqrt(D) beside softmax, and random features
KERNELS = ("softmax", "softmax_sqrtd", *(name for name in KERNEL_NAMES if name != "softmax"), "rf_softmax")


def make_kernel(name, config):
    """The :class:`~sfxlin.kernels.Kernel` of a sweep kernel name (not ``rf_softmax``)."""
    D = len(config["Sigma"])
    if name == "softmax_sqrtd":
        return Kernel("softmax", temperature=math.sqrt(D))
    return Kernel("sigmoid", bias=config["sigmoid_bias"]) if name == "sigmoid" else Kernel(name)


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
        attend = lambda Z, q: rf_attention_prefix(Z, I, I, q, Ls, W)  # noqa: E731
    else:
        k = make_kernel(name, config)
        lim = kernel_limit(k, S, I, I, a)
        theory = kernel_mse(k, S, I, a[:, None, :], Ls).mean(axis=0)
        attend = lambda Z, q: kernel_attention_prefix(Z, I, I, q, Ls, k)  # noqa: E731
    token_rng = substream(rng, part="tokens")
    sq_err = np.empty((Q, P, len(Ls)))
    final_mean, final_se = np.empty((Q, D)), np.empty((Q, D))
    Sa = a @ S
    B = np.sum(Sa**2, axis=-1)
    gain_q_se = np.empty(Q)
    for i in range(Q):
        Z = token_rng.standard_normal((P, Ls[-1], D)) @ chol.T
        f = attend(Z, a[i])
        sq_err[i] = np.sum((f - lim[i]) ** 2, axis=-1)
        final_mean[i] = f[:, -1].mean(axis=0)
        final_se[i] = f[:, -1].std(axis=0, ddof=1) / math.sqrt(P)
        gain_q_se[i] = (f[:, -1] @ Sa[i]).std(ddof=1) / (B[i] * math.sqrt(P))   # the prompts' projections' spread
    gain_q = np.sum(final_mean * Sa, axis=-1) / B              # projection of the prompt mean on Sigma a
    orth = final_mean - gain_q[:, None] * Sa
    return {
        "mse": sq_err.mean(axis=(0, 1)), "mse_theory": theory, "mse_query": Out(sq_err.mean(axis=1), ("query", "L")),
        "gain_measured": np.float64(gain_q.mean()), "gain_se": np.float64(np.sqrt(np.sum(gain_q_se**2)) / Q),
        "gain_limit": np.float64((np.sum(lim * Sa, axis=-1) / B).mean()),
        "orth_share": np.float64(np.mean(np.linalg.norm(orth, axis=-1) / np.linalg.norm(final_mean, axis=-1))),
        "z2": np.float64(np.mean(((final_mean - lim) / final_se) ** 2)),
    }


def stein_check(cell, rng, config):
    """:func:`~sfxlin.kernels.stein_identity_error` of every kernel at 4 random ``a`` (``sigmoid_logL`` at
    ``L = 16``), and each kernel's smoothness class."""
    S = np.diag(np.asarray(config["Sigma"], dtype=float))
    a = _queries(rng, S, 1.0, 4) * rng.uniform(0.3, 1.5, size=(4, 1))
    errors = [stein_identity_error(make_kernel(name, config), S, a, config["stein_nodes"]) for name in KERNEL_NAMES]
    smoothness = [SMOOTHNESS.index(KERNEL_CLASSES[name].smoothness) for name in KERNEL_NAMES]
    return {"stein_error": np.array(errors), "stein_smoothness": np.array(smoothness, dtype=np.int8)}


def rf_study(cell, rng, config):
    """Squared error of the fixed-feature limit to ``Sigma a`` over independent feature draws."""
    s2, m, n = cell["rf_sigma2"], cell["rf_m"], config["rf_draws"]
    a, S, I = config["rf_a"] * np.eye(3)[0], s2 * np.eye(3), np.eye(3)
    chunk = max(1, (1 << 21) // m)  # draws per chunk: about 6M feature entries (48 MB)
    err = np.concatenate([
        np.sum((rf_limit(S, I, I, a, positive_random_features(rng, m, 3, n_draws=min(chunk, n - lo))) - a @ S) ** 2,
               axis=-1) for lo in range(0, n, chunk)])
    return {"rf_sq_error": err, "rf_constant": np.float64(rf_feature_constant(S, I, a))}


def counts(config, part, cell):
    """Main part: each query reads its prompts' ``L_max`` tokens once; Stein part: the tensor rule's
    ``stein_nodes ** D`` nodes per kernel; random-feature part: ``rf_draws`` draws of ``rf_m`` features."""
    if part == "stein":
        return {"node": len(KERNEL_NAMES) * config["stein_nodes"] ** len(config["Sigma"]), "cell": 1}
    if part == "rf":
        return {"feature_draw": config["rf_draws"] * cell["rf_m"] / 16, "cell": 1}
    return {"visit": config["n_queries"] * config["n_prompts"] * max(config["L"]), "cell": 1}


OWN = {o.name: o for o in (
    Variable("mse_theory", ("L",), "predicted mean squared error", "mean over queries of sfxlin.kernels.kernel_mse: "
             "exact for unnormalised kernels and sigmoid_logL, delta-method constant / L for normalised ones; NaN "
             "by design for rf_softmax.", allow_nonfinite=True),
    Variable("gain_measured", (), "gain read off Monte Carlo at L_max", "mean over queries of <mean over prompts of "
             "f_Lmax, Sigma a> / ||Sigma a||^2."),
    Variable("gain_se", (), "standard error of gain_measured", "from the prompt-to-prompt spread of the projections "
             "<f_Lmax, Sigma a> / ||Sigma a||^2 (independent prompts and queries; the projection's own spread, which "
             "holds the covariance of f's components)."),
    Variable("gain_limit", (), "gain of the exact limit", "mean over queries of <f_inf, Sigma a> / ||Sigma a||^2: "
             "the Stein gain (rf_softmax: of the fixed-feature limit, which is not exactly along Sigma a)."),
    Variable("orth_share", (), "share of the Monte Carlo mean orthogonal to Sigma a", "mean over queries of ||(I - "
             "proj on Sigma a) mean f_Lmax|| / ||mean f_Lmax||."),
    Variable("z2", (), "mean squared z-score of the Monte Carlo mean against the limit", "mean over queries and "
             "components of ((mean over prompts of f_Lmax - f_inf) / SE)^2; about (P-1)/(P-3) when the limit is "
             "right and the bias at L_max is negligible."),
    Variable("stein_error", ("stein_kernel",), "Stein identity vs tensor quadrature", "max over 4 random a of "
             "|E[kappa(s) z] (tensor Gauss-Hermite) - Sigma a E kappa'(s)| / |Sigma a E kappa'(s)|; the normalised "
             "ReLUs check their numerators."),
    Variable("stein_smoothness", ("stein_kernel",), "smoothness class of the kernel's weight", "The kernel class's "
             "declared smoothness: 0 smooth (derivatives of every order: the tensor Gauss-Hermite rule converges "
             "geometrically), 1 kinked (a jump in some derivative: algebraic convergence).", dtype="int8",
             flag_meanings=SMOOTHNESS),
    Variable("rf_sq_error", ("rf_draw",), "squared error of the fixed-feature limit", "||rf_limit(W) - Sigma a||^2 "
             "for one draw W of m positive random features."),
    Variable("rf_constant", (), "delta-method constant of the feature average",
           "lim m E||rf_limit - Sigma a||^2 (sfxlin.kernels.rf_feature_constant); inf by design when "
           "rf_sigma2 >= 1 (infinite-variance feature weights).", allow_nonfinite=True))}

EXPERIMENT = C1.variant(
    NAME, short="c1_kernels", analysis="sfxlin.analysis.c1_kernels",
    values=dict(L=Profiles(quick=[2**k for k in range(4, 11)], paper=[2**k for k in range(4, 15)]),
                n_seeds=Profiles(quick=1, paper=16), n_queries=Profiles(quick=3, paper=64),
                n_prompts=Profiles(quick=8, paper=16), root_seed=20251211),
    changes={"n_prompts": {"low": 2, "why": "the z-scores need a standard error over prompts"}},
    params=(
        Param("kernels", "str_list", "attention kernels: " + " ".join(KERNELS) + " (softmax_sqrtd: temperature "
              "sqrt(D); rf_softmax: positive random features)", list(KERNELS), choices=KERNELS, grid=True),
        Param("Sigma", "float_list", "diagonal of the token covariance (D = its length)", [1.5, 1.0, 0.5], low=0,
              low_open=True),
        Param("r", "float_list", "query sizes r = ||a||_Sigma, a = U q",
              Profiles(quick=[0.5, 1.0], paper=[0.25, 0.5, 1.0, 1.5]), low=0, low_open=True, grid=True),
        Param("sigmoid_bias", "float", "bias b of the sigmoid kernel sigma(s + b)", -2.0),
        Param("rf_m_attention", "int", "random features of the rf_softmax kernel", 16, low=1),
        Param("rf_sigma2", "float_list", "token variances s (Sigma = s I) of the random-feature study",
              Profiles(quick=[0.1, 2.0], paper=[0.1, 0.25, 0.5, 1.0, 2.0]), low=0, low_open=True, grid=True),
        Param("rf_m", "int_list", "numbers of random features m",
              Profiles(quick=[4, 16, 64, 256], paper=[2**k for k in range(2, 12)]), low=1, order="increasing",
              min_len=3, why="the analysis fits log-log slopes in m", grid=True),
        Param("rf_a", "float", "Euclidean norm |a| of the random-feature study's query (the feature weights' spread "
              "grows like exp(|a|^2))", 0.5, low=0, low_open=True),
        Param("rf_draws", "int", "independent feature draws per (rf_sigma2, m)", Profiles(quick=200, paper=16000),
              low=2),
        Param("stein_nodes", "int", "Gauss-Hermite nodes per dimension of the Stein check", 60, low=2)),
    cells=(Cells({"kernel": "kernels", "r": "r", "seed": "n_seeds"}, kernel,
                 ("mse", OWN["mse_theory"], "mse_query", *(OWN[k] for k in ("gain_measured", "gain_se", "gain_limit",
                                                                             "orth_share", "z2")))),
           Cells({}, stein_check, (OWN["stein_error"], OWN["stein_smoothness"]), name="stein",
                 inputs=lambda config, cell: {k: config[k] for k in ("Sigma", "sigmoid_bias", "stein_nodes",
                                                                     "root_seed")}),
           Cells({"rf_sigma2": "rf_sigma2", "rf_m": "rf_m"}, rf_study, (OWN["rf_sq_error"], OWN["rf_constant"]),
                 name="rf", inputs=lambda config, cell: {k: config[k] for k in ("rf_a", "rf_draws", "root_seed")})),
    coords={"stein_kernel": lambda c: KERNEL_NAMES, "rf_draw": lambda c: range(c["rf_draws"])},
    order=("kernel", "r", "L", "seed", "query"), cost=C1.cost.counting(counts),
    title="C1 kernels: kernel attention -> linear attention times a scalar gain",
    description="C1 kernels: softmax, sigmoid, ReLU, ReLU^2, random features; limits and Stein gains")
