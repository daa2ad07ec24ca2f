"""C3 dimension, a variant of the C3 family: softmax(L) against linear(inf) at d = 3, 8, 16, with
``ceil(task_ratio d^2 / n_queries)`` training pairs, each cell's step size chosen from its curvature
(:func:`cell_lr`: a faithful discretisation of the gradient flow) and ``T`` found per cell by a stop rule on
linear(inf) checked at equal flow times (:func:`sfxlin.training.train_until`), then the family's run for
``T_conv`` steps. Grid ``setting x d x seed`` (``setting`` a covariance spec), ``L`` cut per ``d`` at
``L_caps``. The protocol: docs/protocols.md, "c3_dim"."""
from __future__ import annotations

import dataclasses
import math

import numpy as np

from sfxlin import covariance, curvature, icl, laws, training
from sfxlin.engine import Cells, Param, Profiles, Variable

from .families.c3 import C3, STEP_CURVATURE, Run, draw, finite, heldout_counts, train_counts

NAME = "c3_dim"
FAITHFUL = "faithful"
#: a check's exact population risk of theta_inf above the previous check's by more than this (relative to the
#: init's risk) counts as a rise (``risk_rises``): the closed form's rounding is ~1e-15 of the init's risk, a
#: step-size instability's spike O(0.1 .. 1)
RISE_TOL = 1e-10


def _fixed_lr(rule):
    """The step size ``rule`` names (a positive number as text), or None for ``"faithful"``; a ValueError
    otherwise."""
    if rule == FAITHFUL:
        return None
    try:
        lr = float(rule)
    except ValueError:
        lr = math.nan   # not a number: refused below with the same message
    if not (math.isfinite(lr) and lr > 0):
        raise ValueError(f"lr_rule: expected {FAITHFUL!r} or a positive number, got {rule!r}")
    return lr


def _whole(ratio):
    """The integer ``ratio`` is to 1e-9 relative, or None."""
    n = round(ratio)
    return n if n >= 1 and abs(ratio - n) <= 1e-9 * ratio else None


def _checks(config):
    """``flow_max`` a whole number of ``check_flow``; a fixed ``lr_rule`` a whole number of steps a check; one
    ``L_caps`` per ``d``, none below the smallest ``L``."""
    if _whole(config["flow_max"] / config["check_flow"]) is None:
        raise ValueError(f"flow_max: {config['flow_max']} must be a multiple of check_flow = {config['check_flow']}")
    lr = _fixed_lr(config["lr_rule"])
    if lr is not None and _whole(config["check_flow"] / lr) is None:
        raise ValueError(f"lr_rule: a fixed step {lr} must divide check_flow = {config['check_flow']} (a whole "
                         "number of steps between checks at equal flow times)")
    caps, ds = config["L_caps"], config["d"]
    if len(caps) != len(ds):
        raise ValueError(f"L_caps: one cap per d, got {len(caps)} caps for {len(ds)} values of d")
    for d, cap in zip(ds, caps):
        if cap < config["L"][0]:
            raise ValueError(f"L_caps: the cap {cap} of d = {d} is below the smallest L = {config['L'][0]}")


def cell_lr(config, d, Sigma):
    """``(lr, steps)``: a cell's step size and its steps between checks (``steps x lr = check_flow``).
    ``lr_rule`` ``"faithful"``: :func:`sfxlin.curvature.faithful_lr` of ``Sigma`` (the Hessian of the population
    risk at the Eq. 9 init) with ``lr_margin``, lowered to the next whole number of steps a check; a number:
    that step."""
    fixed = _fixed_lr(config["lr_rule"])
    if fixed is not None:
        return fixed, _whole(config["check_flow"] / fixed)
    lr, _ = curvature.faithful_lr(d, Sigma, margin=config["lr_margin"])
    steps = math.ceil(config["check_flow"] / lr)
    return config["check_flow"] / steps, steps


def n_checks(config):
    """Checks after the init: ``flow_max / check_flow``."""
    return _whole(config["flow_max"] / config["check_flow"])


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
    return {**inputs, "L": cell_L(config, cell["d"]), "n_L": len(config["L"])}


def _pad(a, n, axis):
    """``a`` with NaN appended along ``axis`` up to length ``n`` (the L above the cap, the checks after T)."""
    a = np.asarray(a, dtype=float)
    if a.shape[axis] == n:
        return a
    shape = list(a.shape)
    shape[axis] = n - a.shape[axis]
    return np.concatenate([a, np.full(shape, np.nan)], axis=axis)


def risk_rises(rel):
    """Checks at which the relative population risk ``rel`` (one per check) exceeds the previous check's by more
    than :data:`RISE_TOL`."""
    return int(np.count_nonzero(np.diff(rel) > RISE_TOL))


def kernel(cell, rng, config):
    d, Ls = cell["d"], config["L"]
    nL, nt = config["n_L"], n_checks(config) + 1
    Sigma = covariance.from_spec(cell["setting"], d)
    lr, every = cell_lr(config, d, Sigma)
    law = laws.covariate_law("gaussian", Sigma)
    P = n_pairs(d, config["task_ratio"], config["n_queries"])
    tasks, held = draw(rng, d, law, P, config["n_queries"], Ls[-1],
                       (config["heldout_pairs"], config["heldout_queries"], Ls[-1]))
    label = f"c3_dim {cell}"
    U0, v0 = icl.init_theta(d, tasks.second_moment)
    r0 = float(icl.linear_inf_risk(U0, v0, Sigma))
    first = training.train_until(tasks, lambda U, v: icl.linear_inf_risk(U, v, Sigma) <= config["tol"] * r0,
                                 lr=lr, max_steps=(nt - 1) * every, check_every=every, label=label)
    T = first["T"]
    run = Run(tasks, Ls, label, lr=lr, n_steps=T, ckpt_every=every)
    traj = run.trajectory()
    U_inf, v_inf = run.U_inf, run.v_inf
    at_L, _, inf_ho, _ = run.heldout(held, Ls, Ls[-1], [0, -1])
    U_star, v_star = icl.bayes_optimum(Sigma)
    rel = icl.linear_inf_risk(first["U"], first["v"], Sigma) / r0
    out = finite({
        "T_conv": np.float64(T), "lr": np.float64(lr), "flow_time": np.float64(T * lr),
        "n_pairs": np.float64(P), "rel_risk_inf": rel, "risk_pop_init": np.float64(r0),
        "risk_pop_inf": np.float64(icl.linear_inf_risk(U_inf[-1], v_inf[-1], Sigma)),
        "D_inf_max": traj["D_inf"].max(axis=-1), "D_inf_T": traj["D_inf"][..., -1],
        "risk_heldout_init": at_L[:, :, 0], "risk_heldout_T": at_L[:, :, 1], "risk_heldout_inf_T": np.float64(inf_ho[1]),
        "dist_star_inf_T": np.float64(icl.theta_distance(U_inf[-1], v_inf[-1], U_star, v_star)),
        "norm_star": np.float64(np.sqrt(np.sum(U_star**2) + np.sum(v_star**2))),
        "norm_inf_T": np.float64(run.norm_inf_T()),
        "off_block_max": traj["off_block"].max(axis=-1), "off_block_inf_max": np.float64(traj["off_block_inf"].max()),
        "risk_train_T": traj["risk_train"][..., -1], "risk_train_inf": np.float64(traj["risk_inf"][-1]),
        "inf_rerun_diff": np.float64(max(np.abs(U_inf - first["U"]).max(), np.abs(v_inf - first["v"]).max())),
        **run.step_curvature(),
    })
    for name in CAPPED:
        out[name] = _pad(out[name], nL, axis=-1)
    out["rel_risk_inf"] = _pad(rel, nt, axis=0)
    out["risk_rises"] = np.int16(risk_rises(rel))
    out["converged"] = np.int8(first["converged"])
    return out


def counts(config, part, cell):
    """At most ``flow_max / lr`` steps of linear(inf) alone and of the main run over the cell's own pairs and ``L``
    (an upper bound: the stop rule ends most runs before), and the held-out risks at the init and at ``T``."""
    d = cell["d"]
    lr, every = cell_lr(config, d, covariance.from_spec(cell["setting"], d))
    Ls, T, P = cell_L(config, d), n_checks(config) * every, n_pairs(d, config["task_ratio"], config["n_queries"])
    train = train_counts(T, P, config["n_queries"], Ls, d=d)
    return {**train, "step": 2 * T, **heldout_counts(2, config["heldout_pairs"], config["heldout_queries"], Ls, Ls[-1])}


_CAP = " NaN by design at an L above the cell's cap (L_caps)."
CAPPED = ("D_inf_max", "D_inf_T", "risk_heldout_init", "risk_heldout_T", "off_block_max", "risk_train_T",
          "lr_lambda_block_max_linear")
OWN = {o.name: o for o in (
    Variable("T_conv", (), "steps trained T", "the steps to the first check (every check_flow of flow time) at which "
           "the exact population risk of theta_inf(t) is <= tol x that of the Eq. 9 init; flow_max / lr when never "
           "(converged = 0).", units="1"),
    Variable("lr", (), "step size of the cell", "the gradient-descent step of every model of the cell: lr_rule "
             "'faithful', sfxlin.curvature.faithful_lr of the cell's Sigma with lr_margin, lowered to a whole number "
             "of steps a check (pipelines/c3_dim.py cell_lr); or the fixed lr_rule.", units="1"),
    Variable("flow_time", (), "flow time trained (steps x lr)", "T_conv x lr: the time of the gradient flow the "
             "run discretises, comparable across cells of different step sizes.", units="1"),
    Variable("risk_rises", (), "rises of theta_inf's population risk between checks", "checks at which the exact "
             "population risk of theta_inf(t) (rel_risk_inf) exceeds the previous check's by more than 1e-10 of the "
             "init's (rounding is ~1e-15 of it): 0 for a faithful discretisation of the gradient flow, which never "
             "raises it here.", dtype="int16", units="1"),
    Variable("converged", (), "stop rule met within flow_max", "1: theta_inf(T_conv) meets the stop rule; 0: the run "
             "reached flow_max without it (T_conv = flow_max / lr).", dtype="int8",
             flag_meanings=("not_converged", "converged")),
    Variable("n_pairs", (), "antithetic training task pairs", "ceil(task_ratio d^2 / n_queries)."),
    Variable("rel_risk_inf", ("t_flow",), "relative population risk of theta_inf(t)",
           "sfxlin.icl.linear_inf_risk(theta_inf(t), Sigma) / same at t = 0 (exact, noiseless: floor 0), on the "
           "checks of the linear(inf)-alone run, at flow times t_flow; NaN by design after T_conv (the run stopped).",
           allow_nonfinite=True),
    Variable("risk_pop_init", (), "population risk of the Eq. 9 init under linear(inf)", "sfxlin.icl.linear_inf_risk "
             "at t = 0 (exact)."),
    Variable("risk_pop_inf", (), "population risk of theta_inf(T)", "sfxlin.icl.linear_inf_risk (exact) at T_conv."),
    Variable("D_inf_T", ("model", "L"), "distance of theta_L(T) to theta_inf(T)", "as D_inf_max, at t = T_conv."),
    Variable("dist_star_inf_T", (), "distance of theta_inf(T) to theta_star", "sqrt(||U_inf(T) - U*||_F^2 + "
             "||v_inf(T) - v*||^2), (U*, v*) the Remark 5.2 optimum for Sigma."),
    Variable("risk_train_inf", (), "training risk of theta_inf(T)", "as risk_train_T, linear(inf)."),
    Variable("inf_rerun_diff", (), "largest difference of the two linear(inf) trajectories",
           "max |theta_inf(t)| difference, entrywise, between the joint run and the linear(inf)-alone run at their "
           "common checks: 0 (same engine, same arithmetic)."))}


def _output(name):
    o = OWN.get(name) or C3.output(name)
    return dataclasses.replace(o, description=o.description + _CAP, allow_nonfinite=True) if name in CAPPED else o


EXPERIMENT = C3.variant(
    NAME, short="c3d", analysis="sfxlin.analysis.c3_dim", sweep=("d",),
    values=dict(settings=["isotropic", "power_law:1.0"], d=Profiles(quick=[2, 3], paper=[3, 8, 16]),
                n_seeds=Profiles(quick=2, paper=3), n_queries=2,
                L=Profiles(quick=[8, 16, 32], paper=[8 * 2**k for k in range(12)]),
                heldout_pairs=Profiles(quick=4, paper=64), heldout_queries=Profiles(quick=2, paper=4),
                root_seed=20261202),
    changes={"settings": {"doc": "covariance specs of sfxlin.covariance.from_spec (no ',' or ';'), built in "
                                 "dimension d", "choices": None}},
    params=(
        Param("L_caps", "int_list", "per d (same order), the largest L trained: the L grid is cut there (cost)",
              Profiles(quick=[32, 32], paper=[16384, 16384, 16384]), unit="tokens", low=1, unique=False),
        Param("task_ratio", "float", "training equations per unknown: n_pairs = ceil(task_ratio d^2 / n_queries) "
              "(one equation w^T (M - I) x_q = 0 per pair and query on the d^2 entries of the plug-in matrix; <= 1 "
              "leaves linear(inf) under-determined)", 4.0, low=0, low_open=True),
        Param("lr_rule", "str", "the step size of a cell: 'faithful' (sfxlin.curvature.faithful_lr of the cell's "
              "Sigma with lr_margin, lowered to a whole number of steps a check) or a fixed step, a positive number "
              "dividing check_flow", FAITHFUL),
        Param("lr_margin", "float", "the margin of a faithful step: lr = lr_margin x 2 / lambda_max of the Hessian "
              "of linear(inf)'s population risk at the Eq. 9 init, small enough for the curvature the flow reaches "
              "after it (docs/protocols.md, c3_dim)", 0.015, low=0,
              low_open=True, high=0.5),
        Param("tol", "float", "stop rule: exact population risk of theta_inf(T) <= tol x that of the init", 0.01,
              low=0, low_open=True),
        Param("flow_max", "float", "flow time (steps x lr) at most, a multiple of check_flow: a run without the stop "
              "by then is flagged", Profiles(quick=2.0, paper=25.0), unit="steps x lr", low=0, low_open=True),
        Param("check_flow", "float", "flow time between checks of the stop rule (and checkpoints of the joint run)",
              Profiles(quick=0.1, paper=0.25), unit="steps x lr", low=0, low_open=True)),
    cells=(Cells({"setting": "settings", "d": "d", "seed": "n_seeds"}, kernel, tuple(map(_output, (
        "T_conv", "lr", "flow_time", "converged", "risk_rises", "n_pairs", "rel_risk_inf", "risk_pop_init",
        "risk_pop_inf", "D_inf_max", "D_inf_T", "risk_heldout_init", "risk_heldout_T", "risk_heldout_inf_T",
        "dist_star_inf_T", "norm_star", "norm_inf_T", "off_block_max", "off_block_inf_max", "risk_train_T",
        "risk_train_inf", "inf_rerun_diff", *STEP_CURVATURE))),
                 inputs=cell_inputs),),
    coords={"t_flow": lambda c: (np.arange(n_checks(c) + 1) * c["check_flow"]).tolist()},
    checks=(_checks, covariance.spec_check("settings", "d")), cost=C3.cost.counting(counts),
    scheduler="processes",   # long cells of many small numpy calls (the GIL): docs/performance.md, section 8
    title="C3 dimension: d = 3, 8, 16 trained along a faithful gradient flow until theta_inf has converged, D_inf and "
          "risk slopes in L",
    description="C3 at larger d with task counts scaled to d^2, a step size from each cell's curvature and T found "
                "per cell by a stop rule on theta_inf at equal flow times")
