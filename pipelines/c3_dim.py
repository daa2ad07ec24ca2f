"""C3 dimension, a variant of the C3 family: softmax(L) against linear(inf) at d = 3, 8, 16, with
``ceil(task_ratio d^2 / n_queries)`` training pairs and ``T`` found per cell by a stop rule on linear(inf)
(:func:`sfxlin.training.train_until`), then the family's run for ``T_conv`` steps. Grid ``setting x d x seed``
(``setting`` a covariance spec), ``L`` cut per ``d`` at ``L_caps``. The protocol: docs/protocols.md, "c3_dim"."""
from __future__ import annotations

import dataclasses
import math

import numpy as np

from sfxlin import covariance, icl, laws, training
from sfxlin.engine import Cells, Param, Profiles, Variable

from .families.c3 import C3, Run, draw, finite, heldout_counts, train_counts

NAME = "c3_dim"


def _caps_match_d(config):
    caps, ds = config["L_caps"], config["d"]
    if len(caps) != len(ds):
        raise ValueError(f"L_caps: one cap per d, got {len(caps)} caps for {len(ds)} values of d")
    for d, cap in zip(ds, caps):
        if cap < config["L"][0]:
            raise ValueError(f"L_caps: the cap {cap} of d = {d} is below the smallest L = {config['L'][0]}")


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
    """``a`` with NaN appended along ``axis`` up to length ``n`` (the L above the cap, the t after T)."""
    a = np.asarray(a, dtype=float)
    if a.shape[axis] == n:
        return a
    shape = list(a.shape)
    shape[axis] = n - a.shape[axis]
    return np.concatenate([a, np.full(shape, np.nan)], axis=axis)


def kernel(cell, rng, config):
    d, Ls = cell["d"], config["L"]
    nL, nt = config["n_L"], config["T_max"] // config["check_every"] + 1
    Sigma = covariance.from_spec(cell["setting"], d)
    law = laws.covariate_law("gaussian", Sigma)
    P = n_pairs(d, config["task_ratio"], config["n_queries"])
    tasks, held = draw(rng, d, law, P, config["n_queries"], Ls[-1],
                       (config["heldout_pairs"], config["heldout_queries"], Ls[-1]))
    label = f"c3_dim {cell}"
    U0, v0 = icl.init_theta(d, tasks.second_moment)
    r0 = float(icl.linear_inf_risk(U0, v0, Sigma))
    first = training.train_until(tasks, lambda U, v: icl.linear_inf_risk(U, v, Sigma) <= config["tol"] * r0,
                                 lr=config["lr"], max_steps=config["T_max"], check_every=config["check_every"],
                                 label=label)
    T = first["T"]
    run = Run(tasks, Ls, label, lr=config["lr"], n_steps=T, ckpt_every=config["check_every"])
    traj = run.trajectory()
    U_inf, v_inf = run.U_inf, run.v_inf
    at_L, _, inf_ho, _ = run.heldout(held, Ls, Ls[-1], [0, -1])
    U_star, v_star = icl.bayes_optimum(Sigma)
    rel = icl.linear_inf_risk(first["U"], first["v"], Sigma) / r0
    out = finite({
        "T_conv": np.float64(T), "n_pairs": np.float64(P), "rel_risk_inf": rel, "risk_pop_init": np.float64(r0),
        "risk_pop_inf": np.float64(icl.linear_inf_risk(U_inf[-1], v_inf[-1], Sigma)),
        "D_inf_max": traj["D_inf"].max(axis=-1), "D_inf_T": traj["D_inf"][..., -1],
        "risk_heldout_init": at_L[:, :, 0], "risk_heldout_T": at_L[:, :, 1], "risk_heldout_inf_T": np.float64(inf_ho[1]),
        "dist_star_inf_T": np.float64(icl.theta_distance(U_inf[-1], v_inf[-1], U_star, v_star)),
        "norm_star": np.float64(np.sqrt(np.sum(U_star**2) + np.sum(v_star**2))),
        "norm_inf_T": np.float64(run.norm_inf_T()),
        "off_block_max": traj["off_block"].max(axis=-1), "off_block_inf_max": np.float64(traj["off_block_inf"].max()),
        "risk_train_T": traj["risk_train"][..., -1], "risk_train_inf": np.float64(traj["risk_inf"][-1]),
        "inf_rerun_diff": np.float64(max(np.abs(U_inf - first["U"]).max(), np.abs(v_inf - first["v"]).max())),
    })
    for name in CAPPED:
        out[name] = _pad(out[name], nL, axis=1)
    out["rel_risk_inf"] = _pad(rel, nt, axis=0)
    out["converged"] = np.int8(first["converged"])
    return out


def counts(config, part, cell):
    """At most ``T_max`` steps of linear(inf) alone and of the main run over the cell's own pairs and ``L``
    (an upper bound: the stop rule ends most runs before), and the held-out risks at the init and at ``T``."""
    Ls, T, P = cell_L(config, cell["d"]), config["T_max"], n_pairs(cell["d"], config["task_ratio"], config["n_queries"])
    train = train_counts(T, P, config["n_queries"], Ls)
    return {**train, "step": 2 * T, **heldout_counts(2, config["heldout_pairs"], config["heldout_queries"], Ls, Ls[-1])}


_CAP = " NaN by design at an L above the cell's cap (L_caps)."
CAPPED = ("D_inf_max", "D_inf_T", "risk_heldout_init", "risk_heldout_T", "off_block_max", "risk_train_T")
OWN = {o.name: o for o in (
    Variable("T_conv", (), "steps trained T", "the first check (every check_every steps) at which the exact population "
           "risk of theta_inf(t) is <= tol x that of the Eq. 9 init; T_max when never (converged = 0).", units="1"),
    Variable("converged", (), "stop rule met within T_max", "1: theta_inf(T_conv) meets the stop rule; 0: the run "
             "reached T_max without it (T_conv = T_max).", dtype="int8", flag_meanings=("not_converged", "converged")),
    Variable("n_pairs", (), "antithetic training task pairs", "ceil(task_ratio d^2 / n_queries)."),
    Variable("rel_risk_inf", ("t",), "relative population risk of theta_inf(t)",
           "sfxlin.icl.linear_inf_risk(theta_inf(t), Sigma) / same at t = 0 (exact, noiseless: floor 0), on the "
           "checks of the linear(inf)-alone run; NaN by design after T_conv (the run stopped).", allow_nonfinite=True),
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
                L=Profiles(quick=[8, 16, 32], paper=[8 * 2**k for k in range(12)]), lr=0.01,
                heldout_pairs=Profiles(quick=4, paper=64), heldout_queries=Profiles(quick=2, paper=4),
                root_seed=20261202),
    changes={"settings": {"doc": "covariance specs of sfxlin.covariance.from_spec (no ',' or ';'), built in "
                                 "dimension d", "choices": None}},
    params=(
        Param("L_caps", "int_list", "per d (same order), the largest L trained: the L grid is cut there (cost)",
              Profiles(quick=[32, 32], paper=[16384, 2048, 128]), unit="tokens", low=1, unique=False),
        Param("task_ratio", "float", "training equations per unknown: n_pairs = ceil(task_ratio d^2 / n_queries) "
              "(one equation w^T (M - I) x_q = 0 per pair and query on the d^2 entries of the plug-in matrix; <= 1 "
              "leaves linear(inf) under-determined)", 4.0, low=0, low_open=True),
        Param("tol", "float", "stop rule: exact population risk of theta_inf(T) <= tol x that of the init", 0.01,
              low=0, low_open=True),
        Param("T_max", "int", "steps at most (a multiple of check_every): a run without the stop by then is flagged",
              Profiles(quick=200, paper=8000), unit="steps", low=1),
        Param("check_every", "int", "steps between checks of the stop rule (and checkpoints of the joint run)",
              Profiles(quick=10, paper=25), unit="steps", low=1)),
    cells=(Cells({"setting": "settings", "d": "d", "seed": "n_seeds"}, kernel, tuple(map(_output, (
        "T_conv", "converged", "n_pairs", "rel_risk_inf", "risk_pop_init", "risk_pop_inf", "D_inf_max", "D_inf_T",
        "risk_heldout_init", "risk_heldout_T", "risk_heldout_inf_T", "dist_star_inf_T", "norm_star", "norm_inf_T",
        "off_block_max", "off_block_inf_max", "risk_train_T", "risk_train_inf", "inf_rerun_diff"))),
                 inputs=cell_inputs),),
    coords={"t": lambda c: training.checkpoint_steps(c["T_max"], c["check_every"]).tolist()},
    checks=(_caps_match_d, covariance.spec_check("settings", "d")), cost=C3.cost.counting(counts),
    scheduler="processes",   # long cells of many small numpy calls (the GIL): docs/performance.md, section 8
    title="C3 dimension: d = 3, 8, 16 trained until theta_inf has converged, D_inf and risk slopes in L",
    description="C3 at larger d with task counts scaled to d^2 and T found per cell by a stop rule on theta_inf")
