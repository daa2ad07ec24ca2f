"""C3 landscape: does large-prompt softmax training inherit linear-attention training across covariance
families, label noise and dimensions, and does it fail where it must (non-centred covariates)?
(docs/claims.md, "C3 landscape"; the tasks and their Bayes risks: docs/tasks.md.)

Grid (one dask task per cell): ``covariance x noise x d x mean_norm x seed``.

* ``covariance``: a spec of :func:`sfxlin.covariance.from_spec` (``isotropic``, ``power_law:1.0``,
  ``kms:0.5``, ...), built in dimension ``d``;
* ``noise``: the standard deviation of the label noise, on the prompt labels and on the query
  targets alike (``y = w^T x + eps``);
* ``d``: the covariate dimension;
* ``mean_norm``: ``||m||`` of the covariate mean ``m = mean_norm (1, ..., 1) / sqrt(d)``; 0 is the
  paper's centred setting, a positive value the non-centred control: softmax(L) then tends to an
  AFFINE limit ``v^T (E z + Cov(z) U z_q)``, linear(L) to ``v^T Gamma_w U z_q`` (docs/tasks.md), so
  the transfer must fail there;
* ``seed``: ``0 .. n_seeds - 1``.

Covariates are Gaussian ``N(m, Sigma)``, ``w ~ N(0, I_d)``. Inside a cell, in this draw order from
the cell's generator: the training tasks (``n_pairs`` antithetic pairs ``(w, eps) <-> (-w, -eps)`` x
``n_queries``), the held-out tasks (``heldout_pairs`` x ``heldout_queries``, prompts of ``max(L)``
tokens). Then, with C3's machinery (:func:`sfxlin.training.train_all_arrays`, exact, the fast engine
also on noisy labels; :func:`sfxlin.training.heldout_risks`; the measures of
:mod:`sfxlin.icl`, as in ``c3_transfer``): gradient descent from the Eq. 9 init (built from the
covariates' second moment) for softmax(L), linear(L) at every L and linear(inf) (``Gamma_w`` with
the noise in its label corner); per (model, L) the trajectory distance ``max_t D_inf``, per L
``max_t D_linL``; the off-block mass; held-out risks at the first and last checkpoint; the baselines
of :mod:`sfxlin.baselines` on the held-out tasks and the closed forms of :mod:`sfxlin.bayes` /
:mod:`sfxlin.baselines` where they exist (NaN otherwise, by design); the squared gap between the
softmax and linear limits at ``theta_inf(T)`` (0 when centred).

A second part, ``covariance`` (grid ``covariance x d``), stores the summary figures of each
``Sigma`` (:func:`sfxlin.covariance.summary`).

Cost (paper profile, CPU seconds per cell on one thread of a loaded 2-core machine): ``d = 3``
7.9 s (noiseless and noisy alike), ``d = 8`` 10.6 s noiseless, 11.6 s noisy; ``d = 16`` runs, 20.3 s
per noisy cell (``--set d=3,8,16``). The 24 cells of the paper profile need about 230 CPU s (2 min
on two free cores). A cell's cost grows with ``sum(L) x pairs x queries x T`` times the number of
token features, ``2 d + 1`` (``2 d + 3`` with noise, carried as an extra covariate).
"""
from __future__ import annotations

import numpy as np

from sfxlin import baselines, bayes, covariance, icl, laws, training
from sfxlin.engine.params import Param, Profiles
from sfxlin.engine.sweep import Experiment, Part, Variable
from sfxlin.pipelines.c3_transfer import heldout_work, train_work

NAME = "c3_landscape"
MODELS = ("softmax", "linear")

PARAMS = (
    Param("covariances", "str_list", "covariance specs of sfxlin.covariance.from_spec (no ',' or ';')",
          Profiles(quick=["isotropic", "kms:0.5"], paper=["isotropic", "power_law:1.0", "kms:0.5"]), grid=True,
          unique=True),
    Param("noises", "float_list", "label-noise standard deviations (prompt labels and query targets)",
          Profiles(quick=[0.0, 0.5], paper=[0.0, 0.5]), low=0, grid=True, unique=True),
    Param("d", "int_list", "covariate dimensions; tokens (x, y) have D = d + 1",
          Profiles(quick=[2], paper=[3, 8]), low=1, grid=True, unique=True),
    Param("mean_norms", "float_list", "norms of the covariate mean m = mean_norm (1, ..., 1) / sqrt(d); 0: centred, "
          "> 0: the non-centred control", [0.0, 1.0], low=0, grid=True, unique=True),
    Param("n_seeds", "int", "seeds per cell", 1, low=1, grid=True),
    Param("n_pairs", "int", "antithetic training task pairs per cell", Profiles(quick=3, paper=32), low=1),
    Param("n_queries", "int", "query points per training task", 2, low=1),
    Param("L", "int_list", "nested training prompt lengths",
          Profiles(quick=[8, 16, 32, 64], paper=[8 * 2**k for k in range(9)]), unit="tokens", low=1,
          order="increasing", min_len=4, why="the analysis fits log-log slopes in L, the control over the last four"),
    Param("lr", "float", "gradient-descent step size", 0.01, low=0, low_open=True),
    Param("n_steps", "int", "gradient-descent steps T (a multiple of ckpt_every)", Profiles(quick=100, paper=1000),
          unit="steps", low=1),
    Param("ckpt_every", "int", "steps between checkpoints (the max over t of the distances)",
          Profiles(quick=20, paper=50), unit="steps", low=1),
    Param("heldout_pairs", "int", "antithetic held-out task pairs per cell", Profiles(quick=8, paper=128), low=1),
    Param("heldout_queries", "int", "query points per held-out task", Profiles(quick=2, paper=4), low=1),
    Param("root_seed", "int", "root of every cell's random generator", 20261130),
)


def _steps_fit_checkpoints(config):
    if config["n_steps"] % config["ckpt_every"]:
        raise ValueError(f"n_steps: {config['n_steps']} must be a multiple of ckpt_every = {config['ckpt_every']}")


def grid(config):
    return {"covariance": list(config["covariances"]), "noise": list(config["noises"]), "d": list(config["d"]),
            "mean_norm": list(config["mean_norms"]), "seed": list(range(config["n_seeds"]))}


def covariance_grid(config):
    return {"covariance": list(config["covariances"]), "d": list(config["d"])}


def inner_coords(config):
    return {"model": list(MODELS), "L": list(config["L"])}


def kernel(cell, rng, config):
    d, s, Ls = cell["d"], cell["noise"], config["L"]
    law = laws.covariate_law("gaussian", covariance.from_spec(cell["covariance"], d),
                             np.full(d, cell["mean_norm"] / np.sqrt(d)))
    Sigma, mean = law.cov, law.mean
    kw = dict(lr=config["lr"], n_steps=config["n_steps"], ckpt_every=config["ckpt_every"])
    tasks = icl.make_tasks(rng, d, config["n_pairs"], config["n_queries"], Ls[-1], law, noise=s, query_noise=s)
    held = icl.make_tasks(rng, d, config["heldout_pairs"], config["heldout_queries"], Ls[-1], law, noise=s,
                          query_noise=s)
    res = training.train_all_arrays(tasks, Ls, models=("softmax", "linear", "linear_inf"), label="main run", **kw)
    U = np.stack([res[m]["U"] for m in MODELS])            # (model, L, t, D, D)
    v = np.stack([res[m]["v"] for m in MODELS])
    U_inf, v_inf = res["linear_inf"]["U"], res["linear_inf"]["v"]
    ends = [0, -1]                                         # held-out risks at the init and at T
    at_L, _, inf_ho, inf_sm = training.heldout_risks(
        held, Ls, Ls[-1], {m: U[i][:, ends] for i, m in enumerate(MODELS)},
        {m: v[i][:, ends] for i, m in enumerate(MODELS)}, U_inf[ends], v_inf[ends])
    base = baselines.baseline_risks(held, Ls)
    gap = (bayes.softmax_limit(U_inf[-1], v_inf[-1], Sigma, held.w, held.z_q, mean, s)
           - bayes.linear_limit(U_inf[-1], v_inf[-1], Sigma, held.w, held.z_q, mean, s))
    out = {
        "D_inf": icl.theta_distance(U, v, U_inf, v_inf).max(axis=-1),
        "D_linL": icl.theta_distance(U[0], v[0], U[1], v[1]).max(axis=-1),
        "norm_inf": np.sqrt(np.sum(U_inf[-1] ** 2) + np.sum(v_inf[-1] ** 2)),
        "off_block": icl.off_block_mass(U, v).max(axis=-1),
        "off_block_inf": icl.off_block_mass(U_inf, v_inf).max(),
        "risk_train": np.stack([res[m]["risk"][:, -1] for m in MODELS]),
        "risk_inf": res["linear_inf"]["risk"][-1],
        "risk_heldout_init": at_L[:, :, 0],
        "risk_heldout": at_L[:, :, 1],
        "risk_heldout_inf": inf_ho[1],
        "risk_heldout_inf_softmax": inf_sm[1],
        "limit_gap": 0.5 * np.mean(gap**2),
        "risk_min_norm": base["min_norm"],
        "risk_bayes_ridge": base["bayes_ridge"],
        "risk_pgd": base["pgd"],
    }
    for name, arr in out.items():
        if not np.all(np.isfinite(arr)):
            raise FloatingPointError(f"non-finite values in {name}")
    centred = not np.any(mean)
    out["risk_pgd_theory"] = np.array([baselines.pgd_risk(L, Sigma, None, s, s) if centred else np.nan for L in Ls])
    out["risk_bayes_theory"] = np.array([bayes.bayes_risk_task(d, L, Sigma, None, s, s, mean) for L in Ls])
    out["risk_ridge_asymptotic"] = np.array([baselines.asymptotic_ridge_risk(d, L, Sigma, None, s, s) if centred
                                             else np.nan for L in Ls])
    out["risk_floor_inf"] = np.float64(bayes.bayes_risk_linear_inf(s))
    return out


def covariance_kernel(cell, rng, config):
    """Summary figures of ``Sigma = covariance.from_spec(covariance, d)``."""
    summ = covariance.summary(covariance.from_spec(cell["covariance"], cell["d"]))
    return {f"Sigma_{k}": np.float64(summ[k]) for k in covariance.SUMMARY_KEYS}


def cell_work(config, part):
    """Work of one cell of ``part`` in its non-grid parameters (``sfxlin run --plan``'s cost law,
    :mod:`sfxlin.engine.plan`; the grid dims' costs, d and the label noise among them, are fitted): the
    main run's :func:`~sfxlin.pipelines.c3_transfer.train_work`, the held-out risks at the init and at
    ``T`` (:func:`~sfxlin.pipelines.c3_transfer.heldout_work`, ``L_eval = L_max``) and
    ``CELL_OVERHEAD_WORK``, in the same units. The covariance part draws nothing: None (what it cost)."""
    if part:
        return None
    Ls = config["L"]
    return (train_work(config["n_steps"], config["n_pairs"], config["n_queries"], Ls)
            + heldout_work(2, config["heldout_pairs"], config["heldout_queries"], Ls, Ls[-1]) + CELL_OVERHEAD_WORK)


#: a cell's fixed cost in :func:`cell_work` units: warm CPU seconds of the quick cell isotropic, d = 2 under 5
#: configurations (``python -m sfxlin.engine.plan c3_landscape --set ...``: n_steps 20 .. 400, n_pairs 3 and 12,
#: L_max 64 .. 512, heldout_pairs x heldout_queries 8x2 and 64x4) follow 0.0071 s + 5.8e-9 s per unit
#: (every one within 0.85 .. 1.23 of it)
CELL_OVERHEAD_WORK = 1_200_000


_G = ("covariance", "noise", "d", "mean_norm", "seed")
_GM = _G + ("model",)
_NAN = " NaN by design where no closed form exists"

VARIABLES = (
    Variable("D_inf", _GM + ("L",), "max_t distance of theta_L(t) to theta_inf(t)",
             "max over checkpoints of sqrt(||U_L(t) - U_inf(t)||_F^2 + ||v_L(t) - v_inf(t)||^2), same tasks and init."),
    Variable("D_linL", _G + ("L",), "max_t distance between softmax(L) and linear(L)",
             "max over checkpoints of the parameter distance of the two models trained at the same L."),
    Variable("norm_inf", _G, "norm of theta_inf(T)", "sqrt(||U_inf(T)||_F^2 + ||v_inf(T)||^2)."),
    Variable("off_block", _GM + ("L",), "max_t off-block mass of theta_L(t)",
             "max over checkpoints of sqrt(||U[d, :]||^2 + ||U[:d, d]||^2 + ||v[:d]||^2), measured, never imposed."),
    Variable("off_block_inf", _G, "max_t off-block mass of theta_inf(t)", "as off_block, for linear(inf)."),
    Variable("risk_train", _GM + ("L",), "final training risk of model(L)",
             "mean over training tasks and queries of 1/2 (pred - y_q)^2 at T."),
    Variable("risk_inf", _G, "final training risk of linear(inf)", "with Gamma_w (noise in its label corner) at T."),
    Variable("risk_heldout_init", _GM + ("L",), "held-out risk of model(L) at the init",
             "mean over held-out tasks and queries of 1/2 (pred - y_q)^2, Eq. 9 init, held-out prompts of length L."),
    Variable("risk_heldout", _GM + ("L",), "held-out risk of model(L) at T",
             "as risk_heldout_init, at the trained parameters theta_L(T)."),
    Variable("risk_heldout_inf", _G, "held-out risk of theta_inf(T) under linear(inf)",
             "mean over held-out tasks and queries of 1/2 (v^T Gamma_w U z_q - y_q)^2."),
    Variable("risk_heldout_inf_softmax", _G, "held-out risk of theta_inf(T) used as softmax(L_max)",
             "theta_inf(T) as softmax attention on held-out prompts of the largest L."),
    Variable("limit_gap", _G, "squared gap between the softmax and linear limits at theta_inf(T)",
             "mean over held-out tasks and queries of 1/2 (softmax_limit - linear_limit)^2 (sfxlin.bayes): rounding "
             "when centred; the affine intercept and the covariance/second-moment mismatch when not."),
    Variable("risk_min_norm", _G + ("L",), "held-out risk of minimum-norm least squares",
             "sfxlin.baselines.min_norm on the held-out prompts of length L."),
    Variable("risk_bayes_ridge", _G + ("L",), "held-out risk of the posterior mean of w (the Bayes estimator)",
             "sfxlin.baselines.posterior_mean (ridge at the Bayes penalty noise^2 for w ~ N(0, I)): the Monte Carlo "
             "Bayes floor of the task on the held-out tasks."),
    Variable("risk_pgd", _G + ("L",), "held-out risk of one step of optimally preconditioned gradient descent",
             "sfxlin.baselines.pgd (the optimum of linear(L) attention for centred Gaussian covariates)."),
    Variable("risk_pgd_theory", _G + ("L",), "exact risk of risk_pgd's estimator",
             "sfxlin.baselines.pgd_risk, centred covariates;" + _NAN + " (non-centred).", allow_nonfinite=True),
    Variable("risk_bayes_theory", _G + ("L",), "Bayes risk of the task, closed form",
             "sfxlin.bayes.bayes_risk_task (noiseless labels);" + _NAN + " (noisy labels at finite L).",
             allow_nonfinite=True),
    Variable("risk_ridge_asymptotic", _G + ("L",), "asymptotic risk of ridge at the Bayes penalty",
             "sfxlin.baselines.asymptotic_ridge_risk (Marchenko-Pastur; isotropic, centred);" + _NAN + ".",
             allow_nonfinite=True),
    Variable("risk_floor_inf", _G, "Bayes risk of linear(inf)'s class", "noise^2 / 2: the query-noise floor."),
    Variable("Sigma_trace", ("covariance", "d"), "tr(Sigma)", "sfxlin.covariance.summary.", part="covariance"),
    Variable("Sigma_op_norm", ("covariance", "d"), "largest eigenvalue of Sigma", "sfxlin.covariance.summary.",
             part="covariance"),
    Variable("Sigma_condition", ("covariance", "d"), "condition number of Sigma", "sfxlin.covariance.summary.",
             part="covariance"),
    Variable("Sigma_tr_inv2", ("covariance", "d"), "tr(Sigma^-2)", "sfxlin.covariance.summary.", part="covariance"),
)

EXPERIMENT = Experiment(
    name=NAME, short="c3l", params=PARAMS,
    checks=(_steps_fit_checkpoints, covariance.spec_check("covariances", "d")), inner_coords=inner_coords,
    variables=VARIABLES, analysis="sfxlin.analysis.c3_landscape",
    parts=(Part("", grid, kernel), Part("covariance", covariance_grid, covariance_kernel, inputs=lambda c, cell: {})),
    title="C3 landscape: covariance family x label noise x d x L, with a non-centred control",
    description="C3 across covariance families, label noise and dimensions; baselines; non-centred control")
