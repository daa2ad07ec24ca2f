"""The deep family of C3: deep multi-head residual attention (:mod:`sfxlin.models`, JAX, float64) and its exact
deep linear limit (docs/deep.md). A family of its own beside C3 (:mod:`.c3`): its model (``K`` layers of ``H``
heads, ``theta`` every ``U``, ``V`` and ``v``) is trained by :func:`sfxlin.models.train` (Adam or gradient
descent, compiled), not by the C3 run, so it shares no cell code with C3; it takes C3's declarations of the
parameters both use (``d``, ``n_pairs``, ``n_queries``, ``heldout_pairs``, ``lr``, ``n_steps``, ``ckpt_every``),
so no name is declared twice.

Cell (a) (:func:`limit_cell`): a fixed random model against its limit, per prompt length, kernel and layer.
Cell (b) (:func:`train_cell`): softmax(L), linear(L) and the deep limit model trained from one initialisation.
"""
from __future__ import annotations

import numpy as np

from sfxlin import icl, laws
from sfxlin.engine import Param, Variable
from sfxlin.engine.family import Cost, Family, multiples
from sfxlin.training import checkpoint_steps

from .c3 import C3

KERNELS = ("softmax", "linear")      # coordinate ``kernel`` of cell (a), ``model`` of cell (b)
STAGES = ("initial", "final")
METHODS = ("gd", "adam")


def tasks_of(rng, d, n_pairs, n_queries, L_max):
    """Antithetic tasks with Gaussian covariates ``N(0, I_d)`` (:func:`sfxlin.icl.make_tasks`)."""
    return icl.make_tasks(rng, d, n_pairs, n_queries, L_max, laws.covariate_law("gaussian", np.eye(d)))


def _heldout_risk(models, model, kern, params, held, n, L=None):
    """Held-out risk, evaluated in blocks of ``n`` tasks (the training shape: the compiled training
    function serves them, nothing new is compiled); equal blocks, so the mean of block means."""
    blocks = [held.subset(slice(i, i + n)) for i in range(0, held.n_tasks, n)]
    return float(np.mean([models.risk_and_grad(model, kern, params, b, L)[0] for b in blocks]))


def limit_cell(cell, rng, config):
    """(a): squared output error and token-moment error of a fixed random ``depth_max``-layer model (drawn first
    from ``rng``, then the tasks) against its limit, every head's ``lambda`` capped at ``lambda_cap``."""
    from sfxlin import models

    d, Ls = config["d"], list(config["L"])
    model = models.Transformer(d + 1, config["depth_max"], cell["heads"])
    drawn = model.init(rng, config["U_scale"], config["V_scale"], config["v_scale"])
    tasks = tasks_of(rng, d, config["n_pairs"], config["n_queries"], Ls[-1])
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


def train_cell(cell, rng, config):
    """(b): one initialisation (drawn first), the training then the held-out tasks; softmax(L), linear(L) (every
    ``L`` of ``L_train``) and the deep limit model trained from it by ``method``."""
    from sfxlin import models

    d, Ls = config["d"], list(config["L_train"])
    model = models.Transformer(d + 1, cell["depth"], cell["heads"])
    params0 = model.init(rng, config["U_scale"], config["V_scale"], config["v_scale"])
    tasks = tasks_of(rng, d, config["train_pairs"], config["train_queries"], Ls[-1])
    held = tasks_of(rng, d, config["heldout_pairs"], config["train_queries"], Ls[-1])
    opts = dict(method=config["method"], lr=config["lr"], n_steps=config["n_steps"], ckpt_every=config["ckpt_every"],
                label=f"train[depth={cell['depth']}, heads={cell['heads']}, seed={cell['seed']}]")
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


def _heldout_fits(config):
    if config["heldout_pairs"] % config["train_pairs"]:
        raise ValueError(f"heldout_pairs: {config['heldout_pairs']} must be a multiple of train_pairs = "
                         f"{config['train_pairs']} (held-out tasks are evaluated in blocks shaped like the training "
                         "tasks)")


def _counts(config, part, cell):
    """Cell (a): past the first layer every layer attends each of the ``L`` tokens to all ``L``; a token read per
    pair and layer; a compilation per kernel and ``L`` (paid once per process and shape). Cell (b): a compiled
    step per model and step, and the compilation of its runs."""
    if part == "train":
        runs = 2 * len(config["L_train"]) + 1
        return {"jit_step": runs * (config["n_steps"] + 35), "compile": runs, "cell": 1}
    Ls, P, K = config["L"], config["n_pairs"], config["depth_max"]
    return {"token_pair": P * (K - 1) * sum(L * L for L in Ls), "token_layer": P * K * sum(Ls),
            "compile": len(KERNELS) * len(Ls), "cell": 1}


_A = ("", )
_B = ("train",)
PARAMS = (
    C3.param("d"),
    Param("heads", "int_list", "numbers of heads H", [1], low=1, order="increasing", grid=True),
    Param("U_scale", "float", "initial U entries N(0, U_scale^2 / D)", 0.25, low=0, low_open=True),
    Param("V_scale", "float", "initial V entries N(0, V_scale^2 / D)", 0.1, low=0, low_open=True),
    Param("v_scale", "float", "initial read-out entries N(0, v_scale^2 / D)", 1.0, low=0, low_open=True),
    Param("depth_max", "int", "(a) layers of the fixed random model; every depth 1..depth_max is read out", 2, low=1,
          parts=_A),
    Param("lambda_cap", "float", "(a) every head's U is scaled down, layer by layer, until lambda_{l,h} = "
          "||Sigma_l^(1/2) U_{l,h} Sigma_l^(1/2)||_op^2 <= lambda_cap on every task (models.cap_lambdas): below 1/2 "
          "softmax's error constant has a finite mean over Gaussian queries, below 1/4 a finite variance", 0.2, low=0,
          low_open=True, parts=_A),
    C3.param("n_pairs"), C3.param("n_queries"),
    Param("depths", "int_list", "(b) depths K trained", [1], low=1, order="increasing", grid=True, parts=_B),
    Param("L_train", "int_list", "(b) prompt lengths trained", [4, 8, 16], unit="tokens", low=1, order="increasing",
          min_len=3, why="the analysis fits log-log slopes in L", parts=_B),
    Param("train_pairs", "int", "(b) antithetic training task pairs", 2, low=1, parts=_B),
    Param("train_queries", "int", "(b) queries per training and held-out task", 4, low=1, parts=_B),
    C3.param("heldout_pairs"),
    Param("method", "str", "(b) optimiser: 'adam' (default) or 'gd' (gradient descent; at lr 0.03 it diverged for a "
          "depth-2, 2-head limit model)", "adam", choices=METHODS, parts=_B),
    C3.param("lr"), C3.param("n_steps"), C3.param("ckpt_every"),
)

_AO, _BO = ("kernel", "layer", "L"), ("model", "L_train")
OUTPUTS = (
    Variable("err", _AO, "squared output error against the deep limit", "mean over tasks and queries of (pred_L - "
             "pred_inf)^2 after layer l (the depth-l model), pred_inf = v . A_l ... A_1 z_q."),
    Variable("err_median", _AO, "median squared output error against the deep limit", "median over tasks and "
             "queries of (pred_L - pred_inf)^2 after layer l (robust to the heavy tail of the softmax constant over "
             "tasks and queries)."),
    Variable("cov_err", _AO, "relative error of the token second moment", "mean over tasks of ||Z_l^T Z_l / L - "
             "Sigma_l||_F / ||Sigma_l||_F, tokens entering layer l, Sigma_l the Gaussian pushforward A_{l-1} "
             "Sigma_{l-1} A_{l-1}^T, Sigma_1 = Gamma_w."),
    Variable("out_sq", ("layer",), "mean squared limit output", "mean over tasks and queries of pred_inf^2 after "
             "layer l (the scale of err)."),
    Variable("lambda_drawn", ("layer",), "largest lambda of the drawn model", "max over heads and tasks of "
             "lambda_{l,h} = ||Sigma_l^(1/2) U_{l,h} Sigma_l^(1/2)||_op^2 (Sigma_1 = Gamma_w) of the model as "
             "drawn, before lambda_cap."),
    Variable("lambda_max", ("layer",), "largest lambda of the model measured", "max over heads and tasks of "
             "lambda_{l,h} after every head is capped at lambda_cap (models.cap_lambdas)."),
    Variable("U_shrink", ("layer",), "smallest factor a head's U was scaled by", "min over heads of the factor c <= "
             "1 applied to U_{l,h} by the cap (1: no head of the layer capped)."),
    Variable("D_inf", _BO + ("t",), "distance to the limit model's trajectory", "||theta_L(t) - theta_inf(t)|| over "
             "all parameters (U, V, v), same initialisation and tasks."),
    Variable("D_linL", ("L_train", "t"), "distance between softmax(L) and linear(L)", "||theta_L^softmax(t) - "
             "theta_L^linear(t)|| over all parameters."),
    Variable("risk", _BO + ("t",), "training risk", "mean over training tasks and queries of 1/2 (pred - y_q)^2 at "
             "the checkpoint."),
    Variable("risk_inf", ("t",), "training risk of the deep limit model", "mean over training tasks and queries of "
             "1/2 (v . A_K ... A_1 z_q - y_q)^2, Sigma_1 = Gamma_w."),
    Variable("risk_heldout", _BO + ("stage",), "held-out risk at the training L", "mean over held-out tasks and "
             "queries of 1/2 (pred - y_q)^2 at the initialisation and at the end."),
    Variable("risk_heldout_inf", ("stage",), "held-out risk of the deep limit model", "as risk_heldout, for the "
             "limit model under its limit."),
    Variable("norm_inf", (), "norm of the trained limit model", "||theta_inf(T)|| over all parameters."),
)

#: the family's cost model: seconds per unit on the reference machine (docs/performance.md, "Cost models")
RATES = {"token_pair": 4.6e-9, "token_layer": 6.3e-6, "compile": 0.45, "jit_step": 2.7e-4, "cell": 0.011}

DEEP = Family("C3 deep", PARAMS, OUTPUTS,
              coords={"kernel": lambda c: KERNELS, "layer": lambda c: range(1, c["depth_max"] + 1),
                      "L": lambda c: c["L"], "model": lambda c: KERNELS, "L_train": lambda c: c["L_train"],
                      "t": lambda c: checkpoint_steps(c["n_steps"], c["ckpt_every"]).tolist(),
                      "stage": lambda c: STAGES},
              checks=(multiples(("n_steps", "ckpt_every")), _heldout_fits), cost=Cost(RATES, _counts))
