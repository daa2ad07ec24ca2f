"""C3 dimension: softmax(L) training against linear(inf) at d = 3, 8, 16, each run trained until
``theta_inf(t)`` has converged in held-out risk (docs/claims.md, "C3 dimension"; the models:
docs/models.md, section 2).

``c3_landscape`` found at d = 8 that its fixed T = 1000 bounds the run and at d = 16 that the run says
nothing. Two causes, both handled here:

* **Too few tasks.** The noiseless training risk of linear(inf), ``v^T Gamma_w U z_q = w^T x_q``, is
  a set of equations ``w^T (M - I) x_q = 0`` on the ``d^2`` entries of the plug-in matrix
  ``M = v_y Sigma U[:d, :d]``: one per (task pair, query) (the antithetic partner ``-w`` gives the
  same equation). With ``n_pairs x n_queries <= d^2`` gradient descent reaches zero *training* risk
  at a point that is not ``theta_star`` (c3_landscape's 32 pairs x 2 queries at d = 16: 64
  equations on 256 unknowns). So the number of pairs scales with ``d^2``:
  ``n_pairs = ceil(task_ratio d^2 / n_queries)``; at a fixed ratio the conditioning of the
  empirical design (its smallest eigenvalue, ~``(1 - task_ratio^-1/2)^2`` of the population's for
  isotropic covariates, Marchenko-Pastur) does not change with ``d``.
* **Too few steps.** ``T`` is not fixed but found per cell: ``linear(inf)`` is trained alone
  (:func:`sfxlin.training.train_until`) until its EXACT population risk
  (:func:`sfxlin.icl.linear_inf_risk`, the held-out risk over ``w ~ N(0, I_d)`` and ``x_q ~ (0,
  Sigma)``) is at most ``tol`` times that of the Eq. 9 init. Labels are noiseless, so the floor of
  that risk is 0 (``theta_star`` attains it) and "within ``tol`` of the floor" can only be read
  relative to the start. The first check (every ``check_every`` steps) meeting the rule is
  ``T_conv``; a run that reaches ``T_max`` without it is flagged (``converged = 0``) and trained to
  ``T_max``.

Then softmax(L), linear(L) at every ``L`` and linear(inf) are trained together
(:func:`sfxlin.training.train_all_arrays`) for ``T_conv`` steps on the same tasks from the same
Eq. 9 init, recorded every ``check_every`` steps. Their ``linear_inf`` trajectory is the first run's
bit for bit (the same engine and arithmetic; ``inf_rerun_diff`` stores the largest difference, 0).

Grid (one dask task per cell): ``setting x d x seed``. ``setting``: a spec of
:func:`sfxlin.covariance.from_spec` (``isotropic``, ``power_law:1.0``: eigenvalues ``k^-1``,
condition number ``d``), built in dimension ``d``; Gaussian covariates, ``w ~ N(0, I_d)``.
``L``: nested prompts, the grid of ``L`` truncated per ``d`` at ``L_caps`` (cost): a value at an
``L`` above the cell's cap is NaN by design. Draw order from the cell's generator: the training tasks
(``n_pairs`` antithetic pairs x ``n_queries`` queries, prompts of the cell's largest ``L``), then the
held-out tasks (``heldout_pairs`` x ``heldout_queries``).

Stored per cell: ``T_conv``, ``converged``, the exact relative population risk of ``theta_inf`` on
every check of the first run; ``max_t D_inf`` and ``D_inf`` at ``T`` per (model, L); held-out risks
(Monte Carlo, :func:`sfxlin.training.heldout_risks`, prompts of length ``L``) at the init and at ``T``
of softmax(L), linear(L), of ``theta_inf(T)`` under linear(inf); the exact population risk of
``theta_inf(T)``; ``||theta_inf(T) - theta_star||`` (:func:`sfxlin.icl.bayes_optimum`); off-block
masses; training risks at ``T``.

Cost (one thread, the mean step of one run of 5 .. 50 steps while another job loaded the 2 cores,
load average 1-6: noisy, upper figures). A joint step with ``task_ratio = 4``, 2 queries: ~13 ms at
d = 3 (L to 16384; 6.5 ms measured at ``task_ratio = 2``); 73 ms at d = 8 (L to 2048), 0.17 s (L to
4096), ~0.5 s (L to 16384, from 0.25 s measured at ``task_ratio = 2``);
55 ms at d = 16 (L to 128), 0.14 s (L to 256), 1.0 s (L to 1024), ~6.6 s (L to 16384, from 3.3 s at
``task_ratio = 2``). ``T_conv`` (paper run): 150 .. 350 steps isotropic at every
d, 650 .. 1050 for ``power_law:1.0`` at d = 3, 8 and 4075 .. 4325 at d = 16. Paper profile (L cut at
16384, 2048, 128 for d = 3, 8, 16; 3 seeds; 18 cells): the shipped run on main, 862 cell-seconds
(largest cell 242 s, the d = 16 ``power_law:1.0`` cells), 466 s wall on 2 workers at a load average
falling from 7 to 3 (a first run under a load of 6-11: 2190 cell-seconds, 1143 s wall). The
full design (d = 8 and 16 at L = 16384, both settings, 3 seeds) would cost about 25 CPU hours, 95%
of it the d = 16 ``power_law:1.0`` cells (4300 steps x 6.6 s).
"""
from __future__ import annotations

import math

import numpy as np

from sfxlin import covariance, icl, laws, training
from sfxlin.engine.params import Param, Profiles
from sfxlin.engine.sweep import Experiment, Part, Variable

NAME = "c3_dim"
MODELS = ("softmax", "linear")   # the finite-L models, coordinate ``model``

PARAMS = (
    Param("settings", "str_list", "covariance specs of sfxlin.covariance.from_spec (no ',' or ';'), built in "
          "dimension d", ["isotropic", "power_law:1.0"], grid=True, unique=True),
    Param("d", "int_list", "covariate dimensions; tokens (x, y) have D = d + 1",
          Profiles(quick=[2, 3], paper=[3, 8, 16]), low=1, grid=True, unique=True),
    Param("L_caps", "int_list", "per d (same order), the largest L trained: the L grid is cut there (cost)",
          Profiles(quick=[32, 32], paper=[16384, 2048, 128]), unit="tokens", low=1, unique=False),
    Param("n_seeds", "int", "seeds per (setting, d): independent training runs, the units of the SEs",
          Profiles(quick=2, paper=3), low=1, grid=True),
    Param("task_ratio", "float", "training equations per unknown: n_pairs = ceil(task_ratio d^2 / n_queries) "
          "(one equation w^T (M - I) x_q = 0 per pair and query on the d^2 entries of the plug-in matrix; "
          "<= 1 leaves linear(inf) under-determined)", 4.0, low=0, low_open=True),
    Param("n_queries", "int", "query points per training task", 2, low=1),
    Param("L", "int_list", "nested training prompt lengths (cut per d at L_caps)",
          Profiles(quick=[8, 16, 32], paper=[8 * 2**k for k in range(12)]), unit="tokens", low=1,
          order="increasing", min_len=3, why="the analysis fits log-log slopes in L"),
    Param("lr", "float", "gradient-descent step size", 0.01, low=0, low_open=True),
    Param("tol", "float", "stop rule: exact population risk of theta_inf(T) <= tol x that of the init",
          0.01, low=0, low_open=True),
    Param("T_max", "int", "steps at most (a multiple of check_every): a run without the stop by then is flagged",
          Profiles(quick=200, paper=8000), unit="steps", low=1),
    Param("check_every", "int", "steps between checks of the stop rule (and checkpoints of the joint run)",
          Profiles(quick=10, paper=25), unit="steps", low=1),
    Param("heldout_pairs", "int", "antithetic held-out task pairs per cell", Profiles(quick=4, paper=64), low=1),
    Param("heldout_queries", "int", "query points per held-out task", Profiles(quick=2, paper=4), low=1),
    Param("root_seed", "int", "root of every cell's random generator", 20261202),
)


def _caps_match_d(config):
    caps, ds = config["L_caps"], config["d"]
    if len(caps) != len(ds):
        raise ValueError(f"L_caps: one cap per d, got {len(caps)} caps for {len(ds)} values of d")
    for d, cap in zip(ds, caps):
        if cap < config["L"][0]:
            raise ValueError(f"L_caps: the cap {cap} of d = {d} is below the smallest L = {config['L'][0]}")


def _steps_fit_checks(config):
    if config["T_max"] % config["check_every"]:
        raise ValueError(f"T_max: {config['T_max']} must be a multiple of check_every = {config['check_every']}")


def n_pairs(d, task_ratio, n_queries):
    """Training pairs at dimension ``d``: ``ceil(task_ratio d^2 / n_queries)``."""
    return int(math.ceil(task_ratio * d * d / n_queries - 1e-9))


def cell_L(config, d):
    """The ``L`` trained at dimension ``d``: the grid of ``L`` up to the cap of ``d``."""
    cap = dict(zip(config["d"], config["L_caps"]))[d]
    return [L for L in config["L"] if L <= cap]


def cell_inputs(config, cell):
    """What reaches a cell: the run's parameters less the grid's, with ``L`` the cell's own lengths
    (:func:`cell_L`) and ``n_L`` the length of the full grid of ``L`` (for the NaN above the cap)."""
    inputs = {k: v for k, v in config.items() if k not in ("settings", "d", "n_seeds", "L_caps")}
    inputs["L"] = cell_L(config, cell["d"])
    inputs["n_L"] = len(config["L"])
    return inputs


def grid(config):
    return {"setting": list(config["settings"]), "d": list(config["d"]), "seed": list(range(config["n_seeds"]))}


def inner_coords(config):
    return {"model": list(MODELS), "L": list(config["L"]),
            "t": training.checkpoint_steps(config["T_max"], config["check_every"]).tolist()}


def _pad(a, n, axis):
    """``a`` with NaN appended along ``axis`` up to length ``n`` (the L above the cap, the t after T)."""
    a = np.asarray(a, dtype=float)
    if a.shape[axis] == n:
        return a
    shape = list(a.shape)
    shape[axis] = n - a.shape[axis]
    return np.concatenate([a, np.full(shape, np.nan)], axis=axis)


def kernel(cell, rng, config):
    d = cell["d"]
    Ls = config["L"]
    nL, nt = config["n_L"], config["T_max"] // config["check_every"] + 1
    Sigma = covariance.from_spec(cell["setting"], d)
    law = laws.covariate_law("gaussian", Sigma)
    P = n_pairs(d, config["task_ratio"], config["n_queries"])
    tasks = icl.make_tasks(rng, d, P, config["n_queries"], Ls[-1], law)
    held = icl.make_tasks(rng, d, config["heldout_pairs"], config["heldout_queries"], Ls[-1], law)
    label = f"c3_dim {cell}"
    U0, v0 = icl.init_theta(d, tasks.second_moment)
    r0 = float(icl.linear_inf_risk(U0, v0, Sigma))
    first = training.train_until(tasks, lambda U, v: icl.linear_inf_risk(U, v, Sigma) <= config["tol"] * r0,
                                 lr=config["lr"], max_steps=config["T_max"], check_every=config["check_every"],
                                 label=label)
    T = first["T"]
    res = training.train_all_arrays(tasks, Ls, models=("softmax", "linear", "linear_inf"), lr=config["lr"],
                                    n_steps=T, ckpt_every=config["check_every"], label=label)
    U = np.stack([res[m]["U"] for m in MODELS])          # (model, L, t, D, D)
    v = np.stack([res[m]["v"] for m in MODELS])
    U_inf, v_inf = res["linear_inf"]["U"], res["linear_inf"]["v"]
    ends = [0, -1]
    at_L, _, inf_ho, _ = training.heldout_risks(held, Ls, Ls[-1], {m: U[i][:, ends] for i, m in enumerate(MODELS)},
                                                {m: v[i][:, ends] for i, m in enumerate(MODELS)}, U_inf[ends],
                                                v_inf[ends])
    U_star, v_star = icl.bayes_optimum(Sigma)
    D_inf = icl.theta_distance(U, v, U_inf, v_inf)       # (model, L, t)
    rel = icl.linear_inf_risk(first["U"], first["v"], Sigma) / r0
    out = {
        "T_conv": np.float64(T),
        "n_pairs": np.float64(P),
        "rel_risk_inf": rel,
        "risk_pop_init": np.float64(r0),
        "risk_pop_inf": np.float64(icl.linear_inf_risk(U_inf[-1], v_inf[-1], Sigma)),
        "D_inf_max": D_inf.max(axis=-1),
        "D_inf_T": D_inf[..., -1],
        "risk_heldout_init": at_L[:, :, 0],
        "risk_heldout": at_L[:, :, 1],
        "risk_heldout_inf": np.float64(inf_ho[1]),
        "dist_star_inf": np.float64(icl.theta_distance(U_inf[-1], v_inf[-1], U_star, v_star)),
        "norm_star": np.float64(np.sqrt(np.sum(U_star**2) + np.sum(v_star**2))),
        "norm_inf": np.float64(np.sqrt(np.sum(U_inf[-1] ** 2) + np.sum(v_inf[-1] ** 2))),
        "off_block": icl.off_block_mass(U, v).max(axis=-1),
        "off_block_inf": np.float64(icl.off_block_mass(U_inf, v_inf).max()),
        "risk_train": np.stack([res[m]["risk"][:, -1] for m in MODELS]),
        "risk_train_inf": np.float64(res["linear_inf"]["risk"][-1]),
        "inf_rerun_diff": np.float64(max(np.abs(U_inf - first["U"]).max(), np.abs(v_inf - first["v"]).max())),
    }
    for name, arr in out.items():
        if not np.all(np.isfinite(arr)):
            raise FloatingPointError(f"c3_dim cell {cell}: non-finite values in {name}")
    for name in ("D_inf_max", "D_inf_T", "risk_heldout_init", "risk_heldout", "off_block", "risk_train"):
        out[name] = _pad(out[name], nL, axis=1)
    out["rel_risk_inf"] = _pad(rel, nt, axis=0)
    out["converged"] = np.int8(first["converged"])
    return out


_G = ("setting", "d", "seed")
_GM = _G + ("model",)
_CAP = " NaN by design at an L above the cell's cap (L_caps)."

def cell_work(config, part):
    """None: no declared work holds (``sfxlin run --plan`` takes a cell to cost what the paper cells
    cost). A cell's steps ``T`` are found by the stop rule (``tol``, ``lr``, ``T_max``): 150 .. 4325
    across the 18 paper cells, and a quick run's ``T_max`` = 200 caps most of them, so ``T_max`` in a
    work formula would put a quick cell at 1/40 of a paper one where it costs about 1/5; and a cell's
    pairs and ``L`` follow its own ``d`` (``n_pairs(d)``, ``L_caps``), which a per-part work cannot
    see."""
    return None


VARIABLES = (
    Variable("T_conv", _G, "steps trained T", "the first check (every check_every steps) at which the exact "
             "population risk of theta_inf(t) is <= tol x that of the Eq. 9 init; T_max when never (converged = 0).",
             units="steps"),
    Variable("converged", _G, "stop rule met within T_max", "1: theta_inf(T_conv) meets the stop rule; 0: the run "
             "reached T_max without it (T_conv = T_max).", dtype="int8", flag_meanings=("not_converged", "converged")),
    Variable("n_pairs", _G, "antithetic training task pairs", "ceil(task_ratio d^2 / n_queries)."),
    Variable("rel_risk_inf", _G + ("t",), "relative population risk of theta_inf(t)",
             "sfxlin.icl.linear_inf_risk(theta_inf(t), Sigma) / same at t = 0 (exact, noiseless: floor 0), on the "
             "checks of the linear(inf)-alone run; NaN by design after T_conv (the run stopped).",
             allow_nonfinite=True),
    Variable("risk_pop_init", _G, "population risk of the Eq. 9 init under linear(inf)",
             "sfxlin.icl.linear_inf_risk at t = 0 (exact)."),
    Variable("risk_pop_inf", _G, "population risk of theta_inf(T)", "sfxlin.icl.linear_inf_risk (exact) at T_conv."),
    Variable("D_inf_max", _GM + ("L",), "max_t distance of theta_L(t) to theta_inf(t)",
             "max over the checkpoints 0 .. T_conv of sqrt(||U_L(t) - U_inf(t)||_F^2 + ||v_L(t) - v_inf(t)||^2)."
             + _CAP,
             allow_nonfinite=True),
    Variable("D_inf_T", _GM + ("L",), "distance of theta_L(T) to theta_inf(T)", "as D_inf_max, at t = T_conv." + _CAP,
             allow_nonfinite=True),
    Variable("risk_heldout_init", _GM + ("L",), "held-out risk of model(L) at the init",
             "mean over held-out tasks and queries of 1/2 (pred - y_q)^2, Eq. 9 init, held-out prompts of length L."
             + _CAP, allow_nonfinite=True),
    Variable("risk_heldout", _GM + ("L",), "held-out risk of model(L) at T",
             "as risk_heldout_init, at theta_L(T_conv)." + _CAP, allow_nonfinite=True),
    Variable("risk_heldout_inf", _G, "held-out risk of theta_inf(T) under linear(inf), Monte Carlo",
             "mean over the held-out tasks and queries of 1/2 (v^T Gamma_w U z_q - y_q)^2 at T_conv."),
    Variable("dist_star_inf", _G, "distance of theta_inf(T) to theta_star",
             "sqrt(||U_inf(T) - U*||_F^2 + ||v_inf(T) - v*||^2), (U*, v*) the Remark 5.2 optimum for Sigma."),
    Variable("norm_star", _G, "norm of theta_star", "sqrt(||U*||_F^2 + ||v*||^2)."),
    Variable("norm_inf", _G, "norm of theta_inf(T)", "sqrt(||U_inf(T)||_F^2 + ||v_inf(T)||^2)."),
    Variable("off_block", _GM + ("L",), "max_t off-block mass of theta_L(t)",
             "max over checkpoints of sqrt(||U[d, :]||^2 + ||U[:d, d]||^2 + ||v[:d]||^2), measured, never imposed."
             + _CAP, allow_nonfinite=True),
    Variable("off_block_inf", _G, "max_t off-block mass of theta_inf(t)", "as off_block, for linear(inf)."),
    Variable("risk_train", _GM + ("L",), "training risk of model(L) at T",
             "mean over training tasks and queries of 1/2 (pred - y_q)^2 at T_conv." + _CAP, allow_nonfinite=True),
    Variable("risk_train_inf", _G, "training risk of theta_inf(T)", "as risk_train, linear(inf)."),
    Variable("inf_rerun_diff", _G, "largest difference of the two linear(inf) trajectories",
             "max |theta_inf(t)| difference, entrywise, between the joint run and the linear(inf)-alone run at their "
             "common checks: 0 (same engine, same arithmetic)."),
)

EXPERIMENT = Experiment(
    name=NAME, short="c3d", params=PARAMS,
    checks=(_caps_match_d, _steps_fit_checks, covariance.spec_check("settings", "d")), inner_coords=inner_coords,
    variables=VARIABLES, analysis="sfxlin.analysis.c3_dim", parts=(Part("", grid, kernel, inputs=cell_inputs),),
    scheduler="processes",   # as c3_horizon: long cells of many small numpy calls (the GIL)
    title="C3 dimension: d = 3, 8, 16 trained until theta_inf has converged, D_inf and risk slopes in L",
    description="C3 at larger d with task counts scaled to d^2 and T found per cell by a stop rule on theta_inf")
