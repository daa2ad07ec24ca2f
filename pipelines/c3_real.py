"""C3 on real covariates: softmax(L) against its exact limit softmax(inf) under a data set's empirical
law, and how far linear(inf), the paper's limit for Gaussian covariates, is from it (docs/models.md,
section 2; docs/real_data.md).

Grid (one dask task per cell): ``dataset x d x seed``.

* ``dataset``: a data set bundled with scikit-learn (:data:`sfxlin.realdata.DATASETS`, those of
  ``c1_real``); its covariates are the token set on ``R^d`` of :func:`sfxlin.realdata.token_set`
  (features standardised, the top-``d`` principal components, each scaled to unit variance: mean 0,
  covariance ``I_d``), their law ``mu = (1/n) sum_i delta_{x_i}`` the empirical law
  (:class:`sfxlin.laws.Empirical`); ``w ~ N(0, I_d)``, noiseless labels ``y = w^T x``;
* ``d``: the covariate dimension (tokens ``(x, y)`` have ``D = d + 1``);
* ``seed``: ``0 .. n_seeds - 1``, the independent units (one training run each).

The tokens are not Gaussian, so softmax(L) does not tend to linear(inf) (``v^T Gamma_w U z_q``): its
limit is the tilted mean of the law of ``z = (x, w^T x)``, ``softmax(inf)``: ``v^T sum_i
softmax_i(z_i^T U z_q) z_i`` over the whole set (exact, a finite sum; risk and gradient exact too:
:func:`sfxlin.icl.support_tasks`). Inside a cell, in this draw order from the cell's generator: the
training tasks (``n_pairs`` antithetic pairs x ``n_queries`` queries, covariates drawn with
replacement from the set, nested prompts of ``max(L)`` tokens), the held-out tasks
(``heldout_pairs`` x ``heldout_queries``, prompts of ``max(L)`` tokens). Then, with the fast engine
(:func:`sfxlin.training.train_all_arrays`, exact): gradient descent (``lr``, ``n_steps``) from the
Eq. 9 init (``Sigma = I_d``, the set's covariance) on the same tasks for softmax(L) at every ``L``,
linear(inf) (``theta_linf``) and softmax(inf) (``theta_sinf``); from the trajectories the distances
of ``theta_L(t)`` to ``theta_sinf(t)`` and to ``theta_linf(t)``, the gap between the two limits'
trajectories and their norms; held-out risks every ``heldout_every`` steps: softmax(L) at its
training ``L`` on held-out prompts, ``theta_sinf`` under softmax(inf), ``theta_linf`` under
linear(inf) and under softmax(inf) (linear-attention theory's parameters used by the real limit).

Paper profile: the four data sets, d = 3 and 5, 4 seeds (32 cells); 32 pairs x 2 queries;
L = 8 .. 4096 doubling; lr 0.01; T = 1500, checkpoints every 20 steps; held-out 64 pairs x 4 queries
every 500 steps. Cost of the training per cell (process CPU s, one process on a quiet machine, 32
pairs, T = 1000): 2.3 s (wine, d = 3) to 3.9 s (digits, d = 5); softmax(inf) costs one softmax(L)
step at ``L = n`` (the set's size: 178 .. 1797) per step.
"""
from __future__ import annotations

import numpy as np

from sfxlin import icl, training
from sfxlin.engine.params import Param, Profiles
from sfxlin.engine.sweep import Experiment, Part, Variable
from sfxlin.pipelines.c3_transfer import HELDOUT_VISIT_WORK, train_work
from sfxlin.laws import Empirical
from sfxlin.realdata import DATASETS, token_set

NAME = "c3_real"

PARAMS = (
    Param("datasets", "str_list", "real data sets bundled with scikit-learn, whose whitened principal components "
          "are the covariates", Profiles(quick=["wine", "diabetes"], paper=list(DATASETS)), choices=DATASETS,
          grid=True, unique=True),
    Param("d", "int_list", "covariate dimensions (principal components kept); tokens (x, y) have D = d + 1",
          Profiles(quick=[3], paper=[3, 5]), low=1, high=10, grid=True, unique=True),
    Param("n_seeds", "int", "seeds (independent training runs) per (dataset, d)", Profiles(quick=2, paper=4), low=1,
          grid=True),
    Param("n_pairs", "int", "antithetic training task pairs (w, -w) per cell", Profiles(quick=2, paper=32), low=1),
    Param("n_queries", "int", "query points per training task", 2, low=1),
    Param("L", "int_list", "nested training prompt lengths",
          Profiles(quick=[8, 16, 32, 64], paper=[8 * 2**k for k in range(10)]), unit="tokens", low=1,
          order="increasing", min_len=3, why="the analysis fits log-log slopes in L"),
    Param("lr", "float", "gradient-descent step size", 0.01, low=0, low_open=True),
    Param("n_steps", "int", "gradient-descent steps T (a multiple of ckpt_every and of heldout_every)",
          Profiles(quick=100, paper=1500), unit="steps", low=1),
    Param("ckpt_every", "int", "steps between checkpoints t", 20, unit="steps", low=1),
    Param("heldout_pairs", "int", "antithetic held-out task pairs per cell", Profiles(quick=4, paper=64), low=1),
    Param("heldout_queries", "int", "query points per held-out task", Profiles(quick=2, paper=4), low=1),
    Param("heldout_every", "int", "steps between held-out evaluations t_heldout (a multiple of ckpt_every dividing "
          "n_steps)", Profiles(quick=100, paper=500), unit="steps", low=1),
    Param("root_seed", "int", "root of every cell's random generator", 20261202),
)


def _steps_fit_checkpoints(config):
    he, ce, T = config["heldout_every"], config["ckpt_every"], config["n_steps"]
    if T % ce:
        raise ValueError(f"n_steps: {T} must be a multiple of ckpt_every = {ce}")
    if he % ce or T % he:
        raise ValueError(f"heldout_every: {he} must be a multiple of ckpt_every = {ce} and divide n_steps = {T}")


def grid(config):
    return {"dataset": list(config["datasets"]), "d": list(config["d"]), "seed": list(range(config["n_seeds"]))}


def inner_coords(config):
    return {"L": list(config["L"]),
            "t": training.checkpoint_steps(config["n_steps"], config["ckpt_every"]).tolist(),
            "t_heldout": training.checkpoint_steps(config["n_steps"], config["heldout_every"]).tolist()}


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
    tasks = icl.make_tasks(rng, d, config["n_pairs"], config["n_queries"], Ls[-1], law)
    held = icl.make_tasks(rng, d, config["heldout_pairs"], config["heldout_queries"], Ls[-1], law)
    res = training.train_all_arrays(tasks, Ls, models=("softmax", "linear_inf", "softmax_inf"), x_law=law,
                                    label=f"{cell['dataset']}, d = {d}", **kw)
    sm, li, si = res["softmax"], res["linear_inf"], res["softmax_inf"]
    sub = np.flatnonzero(np.isin(res["t"], training.checkpoint_steps(kw["n_steps"], config["heldout_every"])))
    at_L, h_sinf, h_linf, h_linf_as_sinf = heldout(held, law, Ls, sub, res)
    out = {
        "D_sinf": icl.theta_distance(sm["U"], sm["v"], si["U"], si["v"]),
        "D_linf": icl.theta_distance(sm["U"], sm["v"], li["U"], li["v"]),
        "gap": icl.theta_distance(si["U"], si["v"], li["U"], li["v"]),
        "norm_linf": _norm(li["U"], li["v"]),
        "norm_sinf": _norm(si["U"], si["v"]),
        "off_block_sinf": icl.off_block_mass(si["U"], si["v"]),
        "risk_train": sm["risk"],
        "risk_train_sinf": si["risk"],
        "risk_train_linf": li["risk"],
        "risk_heldout": at_L,
        "risk_heldout_sinf": h_sinf,
        "risk_heldout_linf": h_linf,
        "risk_heldout_linf_as_sinf": h_linf_as_sinf,
    }
    for name, arr in out.items():
        if not np.all(np.isfinite(arr)):
            raise FloatingPointError(f"non-finite values in {name}")
    return out


def cell_work(config, part):
    """Work of one cell in its non-grid parameters (``sfxlin run --plan``'s cost law,
    :mod:`sfxlin.engine.plan`; the grid dims' costs are fitted) in
    :func:`~sfxlin.pipelines.c3_transfer.train_work` units: the run, whose softmax(inf) reads the
    whole support of the data set (``support``: the mean number of atoms over ``datasets``), the
    held-out risks every ``heldout_every`` steps (softmax(L) at its ``L``, and two softmax(inf)
    evaluations over the support, ``HELDOUT_VISIT_WORK`` per token visit) and ``CELL_OVERHEAD_WORK``."""
    Ls = config["L"]
    support = float(np.mean([token_set(name, 1).shape[0] for name in config["datasets"]]))
    evals = config["n_steps"] // config["heldout_every"] + 1
    return (train_work(config["n_steps"], config["n_pairs"], config["n_queries"], Ls, support)
            + HELDOUT_VISIT_WORK * evals * config["heldout_pairs"] * config["heldout_queries"] * (sum(Ls) + 2 * support)
            + CELL_OVERHEAD_WORK)


#: a cell's fixed cost in :func:`cell_work` units: warm CPU seconds of the quick cell wine, d = 3 under 5
#: configurations (``python -m sfxlin.engine.plan c3_real --cell dataset=wine,d=3,seed=0 --set ...``: n_steps
#: 20 .. 400, n_pairs 2 and 12, L_max 64 and 512, heldout_pairs x heldout_queries 4x2 and 32x4) follow
#: 0.016 s + 4.7e-9 s per unit (every one within 0.76 .. 1.35 of it)
CELL_OVERHEAD_WORK = 3_500_000


_G = ("dataset", "d", "seed")

VARIABLES = (
    Variable("D_sinf", _G + ("L", "t"), "distance of theta_L(t) to theta_sinf(t)",
             "sqrt(||U_L(t) - U_sinf(t)||_F^2 + ||v_L(t) - v_sinf(t)||^2): softmax(L) against softmax(inf) under the "
             "set's empirical law, same tasks, same init, same step t."),
    Variable("D_linf", _G + ("L", "t"), "distance of theta_L(t) to theta_linf(t)",
             "as D_sinf, against linear(inf) (Gamma_w from the set's covariance I_d)."),
    Variable("gap", _G + ("t",), "distance between the trajectories of softmax(inf) and linear(inf)",
             "sqrt(||U_sinf(t) - U_linf(t)||_F^2 + ||v_sinf(t) - v_linf(t)||^2): 0 for Gaussian covariates."),
    Variable("norm_linf", _G + ("t",), "norm of theta_linf(t)", "sqrt(||U_linf||_F^2 + ||v_linf||^2)."),
    Variable("norm_sinf", _G + ("t",), "norm of theta_sinf(t)", "sqrt(||U_sinf||_F^2 + ||v_sinf||^2)."),
    Variable("off_block_sinf", _G + ("t",), "off-block mass of theta_sinf(t)",
             "sqrt(||U[d, :]||^2 + ||U[:d, d]||^2 + ||v[:d]||^2) of softmax(inf), measured, never imposed."),
    Variable("risk_train", _G + ("L", "t"), "training risk of softmax(L)",
             "mean over training tasks and queries of 1/2 (pred - y_q)^2 at the checkpoint, prompt length L."),
    Variable("risk_train_sinf", _G + ("t",), "training risk of softmax(inf)",
             "mean over training tasks and queries of 1/2 (pred - y_q)^2, pred the exact softmax over the whole set."),
    Variable("risk_train_linf", _G + ("t",), "training risk of linear(inf)",
             "mean over training tasks and queries of 1/2 (v^T Gamma_w U z_q - y_q)^2."),
    Variable("risk_heldout", _G + ("L", "t_heldout"), "held-out risk of softmax(L) at its training L",
             "mean over held-out tasks and queries of 1/2 (pred - y_q)^2, theta_L(t) on held-out prompts of length L "
             "drawn from the set."),
    Variable("risk_heldout_sinf", _G + ("t_heldout",), "held-out risk of theta_sinf under softmax(inf)",
             "held-out tasks' w and queries, the exact softmax over the whole set."),
    Variable("risk_heldout_linf", _G + ("t_heldout",), "held-out risk of theta_linf under linear(inf)",
             "mean over held-out tasks and queries of 1/2 (v^T Gamma_w U z_q - y_q)^2."),
    Variable("risk_heldout_linf_as_sinf", _G + ("t_heldout",), "held-out risk of theta_linf under softmax(inf)",
             "linear-attention theory's trained parameters theta_linf(t) used by the real infinite-prompt softmax."),
)

EXPERIMENT = Experiment(
    name=NAME, short="c3r", params=PARAMS, checks=(_steps_fit_checkpoints,),
    inner_coords=inner_coords, variables=VARIABLES, analysis="sfxlin.analysis.c3_real",
    parts=(Part("", grid, kernel),), scheduler="processes",
    title="C3 on real covariates: softmax(L) against its exact limit softmax(inf), and linear(inf)",
    description="C3 on real covariates: softmax(L) -> softmax(inf) under the empirical law; gap to linear(inf)")
