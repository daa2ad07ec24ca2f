"""C3 deep: deep multi-head residual attention and its exact deep linear limit (docs/deep.md).

Models (:mod:`sfxlin.models`, JAX, float64): ``K`` residual layers of ``H`` heads with merged
``U`` and value matrices ``V``, read out by ``v``: ``z <- z + sum_h V_{l,h} attn_{l,h}(z)``, the
query attending to the prompt, the prompt tokens to each other. On centred Gaussian tokens, as
``L -> inf``, softmax and linear attention both give the deep linear model
``pred = v . A_K ... A_1 z_q``, ``A_l = I + sum_h V_{l,h} Sigma_l U_{l,h}``,
``Sigma_{l+1} = A_l Sigma_l A_l^T`` (:func:`sfxlin.models.limit_layers`), with ``Sigma_1 =
Gamma_w`` the token covariance of a task.

Part ``""`` (a): a fixed random model against its limit. Grid ``heads x seed``; inside a cell, in
this draw order from its generator: the parameters of a ``depth_max``-layer model
(:meth:`~sfxlin.models.Transformer.init`, scales ``U_scale``, ``V_scale``, ``v_scale``), then the
tasks (``n_pairs`` antithetic pairs x ``n_queries`` queries, Gaussian covariates ``N(0, I_d)``,
nested prompts of ``max(L)`` tokens). For every prompt length ``L``, kernel (softmax, linear) and
layer ``l`` (the depth-``l`` model is the first ``l`` layers): the squared output error
``mean (pred_L - pred_inf)^2`` against the limit (and its median over tasks and queries), and the
relative error of the tokens' second
moment entering layer ``l`` against ``Sigma_l`` (the Gaussian pushforward).

Part ``"train"`` (b): training. Grid ``depth x heads x seed``; one random initialisation per cell
(same scales), then training tasks and held-out tasks. From that initialisation, on the same tasks,
``softmax(L)``, ``linear(L)`` (every ``L`` of ``L_train``) and the deep limit model (``Sigma =
Gamma_w``) are trained by ``method`` (``adam``, or ``gd``: gradient descent) for ``n_steps`` steps; as
in C3: ``D_inf = ||theta_L(t) - theta_inf(t)||`` (all parameters), ``D_linL = ||theta_L^softmax(t) -
theta_L^linear(t)||``, the training risks, and the held-out risks at the start and the end (each
model at its own ``L``; the limit model under its limit).

Cost: softmax attention among the prompt tokens is ``O(L^2 D)`` per task, layer and head (linear
attention ``O(L D^2)``), so part (a) is dominated by its largest ``L`` and part (b) by softmax
training at the largest ``L_train``. Paper profile (12 cells): 268 s wall, 164 s CPU on 2 cores.
"""
from __future__ import annotations

import numpy as np

from sfxlin import icl, laws
from sfxlin.engine.params import Param, Profiles
from sfxlin.engine.sweep import Experiment, Part, Variable
from sfxlin.training import checkpoint_steps

NAME = "c3_deep"
KERNELS = ("softmax", "linear")      # coordinate ``kernel`` of part (a), ``model`` of part (b)
STAGES = ("initial", "final")
METHODS = ("gd", "adam")

PARAMS = (
    Param("d", "int", "covariate dimension; tokens (x, y) have D = d + 1", 3, low=1),
    Param("heads", "int_list", "numbers of heads H", Profiles(quick=[1], paper=[1, 2]), low=1, order="increasing",
          grid=True),
    Param("n_seeds", "int", "independent replicates per grid point", Profiles(quick=1, paper=4), low=1, grid=True),
    Param("U_scale", "float", "initial U entries N(0, U_scale^2 / D)", 0.25, low=0, low_open=True),
    Param("V_scale", "float", "initial V entries N(0, V_scale^2 / D)", 0.1, low=0, low_open=True),
    Param("v_scale", "float", "initial read-out entries N(0, v_scale^2 / D)", 1.0, low=0, low_open=True),
    Param("depth_max", "int", "(a) layers of the fixed random model; every depth 1..depth_max is read out",
          Profiles(quick=2, paper=4), low=1, parts=("",)),
    Param("L", "int_list", "(a) nested prompt lengths",
          Profiles(quick=[8, 16, 32], paper=[2**k for k in range(4, 15)]), unit="tokens", low=1,
          order="increasing", min_len=3, why="the analysis fits log-log slopes in L", parts=("",)),
    Param("lambda_cap", "float", "(a) every head's U is scaled down, layer by layer, until lambda_{l,h} = "
          "||Sigma_l^(1/2) U_{l,h} Sigma_l^(1/2)||_op^2 <= lambda_cap on every task (models.cap_lambdas): below 1/2 "
          "softmax's error constant has a finite mean over Gaussian queries, below 1/4 a finite variance", 0.2,
          low=0, low_open=True, parts=("",)),
    Param("n_pairs", "int", "(a) antithetic task pairs per cell", Profiles(quick=2, paper=12), low=1, parts=("",)),
    Param("n_queries", "int", "(a) queries per task", Profiles(quick=2, paper=8), low=1, parts=("",)),
    Param("depths", "int_list", "(b) depths K trained", Profiles(quick=[1], paper=[1, 2]), low=1,
          order="increasing", grid=True, parts=("train",)),
    Param("L_train", "int_list", "(b) prompt lengths trained",
          Profiles(quick=[4, 8, 16], paper=[8, 16, 32, 64, 128]), unit="tokens", low=1, order="increasing",
          min_len=3, why="the analysis fits log-log slopes in L", parts=("train",)),
    Param("train_pairs", "int", "(b) antithetic training task pairs", Profiles(quick=2, paper=16), low=1,
          parts=("train",)),
    Param("train_queries", "int", "(b) queries per training and held-out task", Profiles(quick=4, paper=16), low=1,
          parts=("train",)),
    Param("heldout_pairs", "int", "(b) antithetic held-out task pairs", Profiles(quick=4, paper=64), low=1,
          parts=("train",)),
    Param("method", "str", "(b) optimiser: 'adam' (default) or 'gd' (gradient descent; at lr 0.03 it diverged "
          "for a depth-2, 2-head limit model)", "adam", choices=METHODS,
          parts=("train",)),
    Param("lr", "float", "(b) step size", 0.01, low=0, low_open=True, parts=("train",)),
    Param("n_steps", "int", "(b) optimiser steps (a multiple of ckpt_every)", Profiles(quick=10, paper=200),
          unit="steps", low=0, parts=("train",)),
    Param("ckpt_every", "int", "(b) steps between checkpoints", Profiles(quick=5, paper=20), unit="steps", low=1,
          parts=("train",)),
    Param("root_seed", "int", "root of every cell's random generator", 20261130),
)


def _steps_fit_checkpoints(config):
    if config["n_steps"] % config["ckpt_every"]:
        raise ValueError(f"n_steps: {config['n_steps']} must be a multiple of ckpt_every = {config['ckpt_every']}")


def grid(config):
    return {"heads": list(config["heads"]), "seed": list(range(config["n_seeds"]))}


def train_grid(config):
    return {"depth": list(config["depths"]), **grid(config)}


def inner_coords(config):
    return {"kernel": list(KERNELS), "layer": list(range(1, config["depth_max"] + 1)), "L": list(config["L"]),
            "model": list(KERNELS), "L_train": list(config["L_train"]),
            "t": checkpoint_steps(config["n_steps"], config["ckpt_every"]).tolist(), "stage": list(STAGES)}


def _heldout_fits(config):
    if config["heldout_pairs"] % config["train_pairs"]:
        raise ValueError(f"heldout_pairs: {config['heldout_pairs']} must be a multiple of train_pairs = "
                         f"{config['train_pairs']} (held-out tasks are evaluated in blocks shaped like the training "
                         "tasks)")


def _heldout_risk(models, model, kern, params, held, n, L=None):
    """Held-out risk, evaluated in blocks of ``n`` tasks (the training shape: the compiled training
    function serves them, nothing new is compiled); equal blocks, so the mean of block means."""
    blocks = [held.subset(slice(i, i + n)) for i in range(0, held.n_tasks, n)]
    return float(np.mean([models.risk_and_grad(model, kern, params, b, L)[0] for b in blocks]))


def _tasks(rng, d, n_pairs, n_queries, L_max):
    return icl.make_tasks(rng, d, n_pairs, n_queries, L_max, laws.covariate_law("gaussian", np.eye(d)))


def kernel(cell, rng, config):
    """(a): squared output error and token-moment error of a fixed random model vs its limit."""
    from sfxlin import models

    d, Ls = config["d"], list(config["L"])
    model = models.Transformer(d + 1, config["depth_max"], cell["heads"])
    drawn = model.init(rng, config["U_scale"], config["V_scale"], config["v_scale"])
    tasks = _tasks(rng, d, config["n_pairs"], config["n_queries"], Ls[-1])
    Gamma = icl.Gamma_w(tasks.Sigma, tasks.w)
    params, scale = models.cap_lambdas(model, drawn, Gamma, config["lambda_cap"])
    lim, Sig = models.limit_layers(model, params, Gamma, tasks.z_q, moments=True)
    err = np.empty((len(KERNELS), model.n_layers, len(Ls)))
    med, cov = np.empty_like(err), np.empty_like(err)
    norm = np.linalg.norm(Sig, axis=(-2, -1))                              # (K, n)
    for i, k in enumerate(KERNELS):
        for j, L in enumerate(Ls):
            # the cap holds for the population covariances Sigma_l (Gamma_w pushed forward); the rate check
            # reads the prompts' empirical second moment, which at the smallest L overstates lambda
            pred, G = models.predict_layers(model, k, params, tasks.prompt(L), tasks.z_q, moments=True,
                                            check_rate=False)
            sq = ((pred - lim) ** 2).reshape(model.n_layers, -1)
            err[i, :, j], med[i, :, j] = sq.mean(axis=-1), np.median(sq, axis=-1)
            cov[i, :, j] = np.mean(np.linalg.norm(G - Sig, axis=(-2, -1)) / norm, axis=-1)
    return {"err": err, "err_median": med, "cov_err": cov, "out_sq": np.mean(lim**2, axis=(-2, -1)),
            "lambda_drawn": models.head_lambdas(model, drawn, Gamma).max(axis=(1, 2)),
            "lambda_max": models.head_lambdas(model, params, Gamma).max(axis=(1, 2)), "U_shrink": scale.min(axis=1)}


def train_kernel(cell, rng, config):
    """(b): softmax(L), linear(L) and the deep limit trained from one initialisation."""
    from sfxlin import models

    d, Ls = config["d"], list(config["L_train"])
    model = models.Transformer(d + 1, cell["depth"], cell["heads"])
    params0 = model.init(rng, config["U_scale"], config["V_scale"], config["v_scale"])
    tasks = _tasks(rng, d, config["train_pairs"], config["train_queries"], Ls[-1])
    held = _tasks(rng, d, config["heldout_pairs"], config["train_queries"], Ls[-1])
    opts = dict(method=config["method"], lr=config["lr"], n_steps=config["n_steps"], ckpt_every=config["ckpt_every"],
                label=f"{NAME}/train[depth={cell['depth']}, heads={cell['heads']}, seed={cell['seed']}]")
    inf = models.train(model, "limit", params0, tasks, **opts)
    nt = len(inf["t"])
    D_inf = np.empty((len(KERNELS), len(Ls), nt))
    risk = np.empty_like(D_inf)
    held_risk = np.empty((len(KERNELS), len(Ls), len(STAGES)))
    theta = {}
    for i, k in enumerate(KERNELS):
        for j, L in enumerate(Ls):
            run = models.train(model, k, params0, tasks, L, **opts)
            theta[k, L] = run["theta"]
            D_inf[i, j] = np.linalg.norm(run["theta"] - inf["theta"], axis=-1)
            risk[i, j] = run["risk"]
            final = {name: a[-1] for name, a in run["params"].items()}
            held_risk[i, j] = [_heldout_risk(models, model, k, p, held, tasks.n_tasks, L) for p in (params0, final)]
    D_linL = np.stack([np.linalg.norm(theta["softmax", L] - theta["linear", L], axis=-1) for L in Ls])
    final_inf = {name: a[-1] for name, a in inf["params"].items()}
    return {"D_inf": D_inf, "D_linL": D_linL, "risk": risk, "risk_inf": inf["risk"], "risk_heldout": held_risk,
            "risk_heldout_inf": np.array([_heldout_risk(models, model, "limit", p, held, tasks.n_tasks)
                                          for p in (params0, final_inf)]),
            "norm_inf": np.linalg.norm(inf["theta"][-1])}


def cell_work(config, part):
    """Work of one cell of ``part`` in its non-grid parameters (``sfxlin run --plan``'s cost law,
    :mod:`sfxlin.engine.plan`; the grid dims' costs, heads among them, are fitted).

    Main part (a), in token pairs: past the first layer every layer attends each of the ``L`` tokens
    to all ``L``, ``n_pairs (depth_max - 1) sum L^2`` over the prompt lengths, plus
    ``MAIN_LINEAR_WORK`` per pair, token and layer (the query's read-out, the moments), the JAX
    compilation of every kernel at every ``L`` (``COMPILE_WORK`` each) and ``MAIN_OVERHEAD_WORK``; the
    queries are not in it (8 in place of 2 did not raise a cell's cost). The compilation is paid once
    per process and array shape, so a cell whose shapes another cell of the same process compiled
    costs less (at the paper's sizes the compilation is a few seconds of cells of 144 .. 522 s; at
    the quick sizes it is nearly all of a cell).

    Training part (b): None (it costs what its paper cells cost). Its warm cost follows
    ``(2 len(L_train) + 1) * (n_steps + 35)`` jitted steps (0.23 .. 0.30 ms a step, 7 .. 11 ms a run
    more), but a cell whose shapes are new compiles 11 runs for about 5.8 s where its warm work takes
    0.24 s (the quick cell with 16 pairs x 16 queries, L_train up to 128, 40 steps), and the paper
    cells mix compiling and compiled ones (1.6 .. 18.9 s): no per-cell work holds within a factor 3."""
    if part == "train":
        return None
    Ls, P, K = config["L"], config["n_pairs"], config["depth_max"]
    return (P * (K - 1) * sum(L * L for L in Ls) + MAIN_LINEAR_WORK * P * K * sum(Ls)
            + COMPILE_WORK * len(KERNELS) * len(Ls) + MAIN_OVERHEAD_WORK)


#: the main part's constants: warm CPU seconds of the quick cell heads=1 (``python -m sfxlin.engine.plan c3_deep
#: --set ...``) under 8 configurations (L 8 .. 8192 in nested grids of 3 .. 8 values, n_pairs 2 and 8,
#: depth_max 2 and 4) fitted (least relative squares) to 4.6e-9 s per token pair, 6.3e-6 s per token and layer
#: and 0.011 s: every one within 0.73 .. 1.35 of it; the quick cell's first computation in a process took 2.71 s,
#: its second 0.008 s: 0.45 s per compiled (kernel, L), 1e8 token pairs
MAIN_LINEAR_WORK = 1_350
MAIN_OVERHEAD_WORK = 2_400_000
COMPILE_WORK = 100_000_000


_A = ("heads", "seed")
_B = ("depth", "heads", "seed")
VARIABLES = (
    Variable("err", (*_A, "kernel", "layer", "L"), "squared output error against the deep limit",
             "mean over tasks and queries of (pred_L - pred_inf)^2 after layer l (the depth-l model), pred_inf = "
             "v . A_l ... A_1 z_q."),
    Variable("err_median", (*_A, "kernel", "layer", "L"), "median squared output error against the deep limit",
             "median over tasks and queries of (pred_L - pred_inf)^2 after layer l (robust to the heavy tail of the "
             "softmax constant over tasks and queries)."),
    Variable("cov_err", (*_A, "kernel", "layer", "L"), "relative error of the token second moment",
             "mean over tasks of ||Z_l^T Z_l / L - Sigma_l||_F / ||Sigma_l||_F, tokens entering layer l, Sigma_l the "
             "Gaussian pushforward A_{l-1} Sigma_{l-1} A_{l-1}^T, Sigma_1 = Gamma_w."),
    Variable("out_sq", (*_A, "layer"), "mean squared limit output",
             "mean over tasks and queries of pred_inf^2 after layer l (the scale of err)."),
    Variable("lambda_drawn", (*_A, "layer"), "largest lambda of the drawn model",
             "max over heads and tasks of lambda_{l,h} = ||Sigma_l^(1/2) U_{l,h} Sigma_l^(1/2)||_op^2 (Sigma_1 = "
             "Gamma_w) of the model as drawn, before lambda_cap."),
    Variable("lambda_max", (*_A, "layer"), "largest lambda of the model measured",
             "max over heads and tasks of lambda_{l,h} after every head is capped at lambda_cap (models.cap_lambdas)."),
    Variable("U_shrink", (*_A, "layer"), "smallest factor a head's U was scaled by",
             "min over heads of the factor c <= 1 applied to U_{l,h} by the cap (1: no head of the layer capped)."),
    Variable("D_inf", (*_B, "model", "L_train", "t"), "distance to the limit model's trajectory",
             "||theta_L(t) - theta_inf(t)|| over all parameters (U, V, v), same initialisation and tasks.",
             part="train"),
    Variable("D_linL", (*_B, "L_train", "t"), "distance between softmax(L) and linear(L)",
             "||theta_L^softmax(t) - theta_L^linear(t)|| over all parameters.", part="train"),
    Variable("risk", (*_B, "model", "L_train", "t"), "training risk",
             "mean over training tasks and queries of 1/2 (pred - y_q)^2 at the checkpoint.", part="train"),
    Variable("risk_inf", (*_B, "t"), "training risk of the deep limit model",
             "mean over training tasks and queries of 1/2 (v . A_K ... A_1 z_q - y_q)^2, Sigma_1 = Gamma_w.",
             part="train"),
    Variable("risk_heldout", (*_B, "model", "L_train", "stage"), "held-out risk at the training L",
             "mean over held-out tasks and queries of 1/2 (pred - y_q)^2 at the initialisation and at the end.",
             part="train"),
    Variable("risk_heldout_inf", (*_B, "stage"), "held-out risk of the deep limit model",
             "as risk_heldout, for the limit model under its limit.", part="train"),
    Variable("norm_inf", _B, "norm of the trained limit model", "||theta_inf(T)|| over all parameters.", part="train"),
)

EXPERIMENT = Experiment(
    name=NAME, short="c3_deep", params=PARAMS, checks=(_steps_fit_checkpoints, _heldout_fits),
    inner_coords=inner_coords,
    variables=VARIABLES, analysis="sfxlin.analysis.c3_deep",
    parts=(Part("", grid, kernel), Part("train", train_grid, train_kernel)),
    scheduler="processes",   # JAX runs each compiled program on one thread (sfxlin.models._jax): threads share it
    title="C3 deep: deep multi-head attention and its exact deep linear limit",
    description="C3 deep: depth x heads x L, error to the deep linear limit and training")
