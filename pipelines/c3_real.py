"""C3 on real covariates, a variant of the C3 family: softmax(L) against its exact limit softmax(inf) under a data
set's empirical law, and linear(inf)'s distance to it. Grid ``dataset x d x seed``. docs/models.md, section 2;
docs/real_data.md."""
from __future__ import annotations

import numpy as np

from sfxlin import icl, training
from sfxlin.engine import Cells, Profiles, Variable
from sfxlin.engine.sensitivity import DEFAULT_EPS, step_perturbation
from sfxlin.engine.sensitivity import param as amplification_param
from sfxlin.laws import Empirical
from sfxlin.realdata import DATASETS, token_set

from .families.c3 import C3, STEP_CURVATURE_INF, draw, finite, step_curvature, train_counts

NAME = "c3_real"


def _norm(U, v):
    return np.sqrt(np.sum(U**2, axis=(-2, -1)) + np.sum(v**2, axis=-1))


def heldout(held, law, Ls, sub, res):
    """Held-out risks at the checkpoints ``sub`` of the run ``res``: softmax(L) at its ``L``
    ``(L, k)``, ``theta_sinf`` under softmax(inf), ``theta_linf`` under linear(inf) and under
    softmax(inf) ``(k,)`` (exact: the prefix engine, on the held-out prompts and on the support)."""
    sm, li, si = res["softmax"], res["linear_inf"], res["softmax_inf"]
    prompts = training.SoftmaxPrefixEngine(held, Ls)
    support, weights = icl.support_tasks(held, law)
    exact = training.SoftmaxPrefixEngine(support, (support.L_max,), weights=weights)
    at_L = np.stack([prompts.step(sm["U"][:, j], sm["v"][:, j])[0] for j in sub], axis=-1)
    sinf = np.array([exact.step(si["U"][j][None], si["v"][j][None])[0][0] for j in sub])
    linf_as_sinf = np.array([exact.step(li["U"][j][None], li["v"][j][None])[0][0] for j in sub])
    linf = icl.risk("linear_inf", li["U"][sub], li["v"][sub], held)
    return at_L, sinf, linf, linf_as_sinf


def kernel(cell, rng, config):
    d, Ls = cell["d"], config["L"]
    law = Empirical(token_set(cell["dataset"], d))
    kw = dict(lr=config["lr"], n_steps=config["n_steps"], ckpt_every=config["ckpt_every"])
    tasks, held = draw(rng, d, law, config["n_pairs"], config["n_queries"], Ls[-1],
                       (config["heldout_pairs"], config["heldout_queries"], Ls[-1]))
    res = training.train_all_arrays(tasks, Ls, models=("softmax", "linear_inf", "softmax_inf"), x_law=law,
                                    label=f"{cell['dataset']}, d = {d}", perturb=step_perturbation(), **kw)
    sm, li, si = res["softmax"], res["linear_inf"], res["softmax_inf"]
    sub = np.flatnonzero(np.isin(res["t"], training.checkpoint_steps(kw["n_steps"], config["heldout_every"])))
    at_L, h_sinf, h_linf, h_linf_as_sinf = heldout(held, law, Ls, sub, res)
    return finite({
        "D_sinf": icl.theta_distance(sm["U"], sm["v"], si["U"], si["v"]),
        "D_linf": icl.theta_distance(sm["U"], sm["v"], li["U"], li["v"]),
        "gap": icl.theta_distance(si["U"], si["v"], li["U"], li["v"]),
        "norm_linf": _norm(li["U"], li["v"]), "norm_sinf": _norm(si["U"], si["v"]),
        "off_block_sinf": icl.off_block_mass(si["U"], si["v"]),
        "risk_train": sm["risk"], "risk_train_sinf": si["risk"], "risk_train_linf": li["risk"],
        "risk_heldout": at_L, "risk_heldout_sinf": h_sinf, "risk_heldout_linf": h_linf,
        "risk_heldout_linf_as_sinf": h_linf_as_sinf,
        **step_curvature(tasks, config["lr"], li["U"], li["v"]),
    })


def counts(config, part, cell):
    """The run, whose softmax(inf) reads the whole support of the cell's data set at every step, and the held-out
    risks every ``heldout_every`` steps (softmax(L) at its ``L``, two softmax(inf) evaluations over the support)."""
    Ls, support = config["L"], token_set(cell["dataset"], 1).shape[0]
    evals = config["n_steps"] // config["heldout_every"] + 1
    return {**train_counts(config["n_steps"], config["n_pairs"], config["n_queries"], Ls, d=cell["d"],
                           support=support),
            "heldout_visit": evals * config["heldout_pairs"] * config["heldout_queries"] * (sum(Ls) + 2 * support)}


OWN = (
    Variable("D_sinf", ("L", "t"), "distance of theta_L(t) to theta_sinf(t)", "sqrt(||U_L(t) - U_sinf(t)||_F^2 + "
             "||v_L(t) - v_sinf(t)||^2): softmax(L) against softmax(inf) under the set's empirical law, same tasks, "
             "same init, same step t."),
    Variable("D_linf", ("L", "t"), "distance of theta_L(t) to theta_linf(t)", "as D_sinf, against linear(inf) "
             "(Gamma_w from the set's covariance I_d)."),
    Variable("gap", ("t",), "distance between the trajectories of softmax(inf) and linear(inf)", "sqrt(||U_sinf(t) "
             "- U_linf(t)||_F^2 + ||v_sinf(t) - v_linf(t)||^2): 0 for Gaussian covariates."),
    Variable("norm_linf", ("t",), "norm of theta_linf(t)", "sqrt(||U_linf||_F^2 + ||v_linf||^2)."),
    Variable("norm_sinf", ("t",), "norm of theta_sinf(t)", "sqrt(||U_sinf||_F^2 + ||v_sinf||^2)."),
    Variable("off_block_sinf", ("t",), "off-block mass of theta_sinf(t)", "sqrt(||U[d, :]||^2 + ||U[:d, d]||^2 + "
             "||v[:d]||^2) of softmax(inf), measured, never imposed."),
    Variable("risk_train", ("L", "t"), "training risk of softmax(L)", "mean over training tasks and queries of 1/2 "
             "(pred - y_q)^2 at the checkpoint, prompt length L."),
    Variable("risk_train_sinf", ("t",), "training risk of softmax(inf)", "mean over training tasks and queries of "
             "1/2 (pred - y_q)^2, pred the exact softmax over the whole set."),
    Variable("risk_train_linf", ("t",), "training risk of linear(inf)", "mean over training tasks and queries of "
             "1/2 (v^T Gamma_w U z_q - y_q)^2."),
    Variable("risk_heldout", ("L", "t_heldout"), "held-out risk of softmax(L) at its training L",
             "mean over held-out tasks and queries of 1/2 (pred - y_q)^2, theta_L(t) on held-out prompts of length "
             "L drawn from the set."),
    Variable("risk_heldout_sinf", ("t_heldout",), "held-out risk of theta_sinf under softmax(inf)",
             "held-out tasks' w and queries, the exact softmax over the whole set."),
    Variable("risk_heldout_linf", ("t_heldout",), "held-out risk of theta_linf under linear(inf)",
             "mean over held-out tasks and queries of 1/2 (v^T Gamma_w U z_q - y_q)^2."),
    Variable("risk_heldout_linf_as_sinf", ("t_heldout",), "held-out risk of theta_linf under softmax(inf)",
             "linear-attention theory's trained parameters theta_linf(t) used by the real infinite-prompt softmax."),
)

EXPERIMENT = C3.variant(
    NAME, short="c3r", analysis="sfxlin.analysis.c3_real", sweep=("d",),
    values=dict(datasets=Profiles(quick=["wine", "diabetes"], paper=list(DATASETS)),
                d=Profiles(quick=[3], paper=[3, 5]), n_seeds=Profiles(quick=2, paper=4),
                n_pairs=Profiles(quick=2, paper=32), n_queries=2,
                L=Profiles(quick=[8, 16, 32, 64], paper=[8 * 2**k for k in range(10)]), lr=0.01,
                n_steps=Profiles(quick=100, paper=1500), ckpt_every=20, heldout_pairs=Profiles(quick=4, paper=64),
                heldout_queries=Profiles(quick=2, paper=4), heldout_every=Profiles(quick=100, paper=500),
                root_seed=20261202),
    changes={"d": {"doc": "covariate dimensions (principal components kept)", "high": 10}},
    cells=(Cells({"dataset": "datasets", "d": "d", "seed": "n_seeds"}, kernel, (*OWN, *STEP_CURVATURE_INF), perturbed=True),),
    params=(amplification_param(Profiles(quick=0.0, paper=DEFAULT_EPS)),),
    cost=C3.cost.counting(counts), scheduler="processes",
    title="C3 on real covariates: softmax(L) against its exact limit softmax(inf), and linear(inf)",
    description="C3 on real covariates: softmax(L) -> softmax(inf) under the empirical law; gap to linear(inf)")
