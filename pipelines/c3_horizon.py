"""C3 horizon: the transfer horizon ``T(L)`` up to which softmax(L) training follows the infinite-prompt
flow ``theta_inf(t)`` (docs/claims.md, "C3 horizon"; the models: docs/models.md, section 2).

The transfer theorem (Thm 4.3) guarantees ``lim_L theta_L(T(L)) = lim_t theta_inf(t)`` only for a
suitably chosen horizon ``T(L)``; ``c3_transfer`` found that a fixed horizon does not carry it (C3a).
This experiment measures the horizon: it trains long enough for ``theta_inf(t)`` to converge and
keeps, per checkpoint ``t``, the distances the analysis needs to find, per ``L`` and tolerance
``eps``, the first ``t`` at which ``||theta_L(t) - theta_inf(t)|| > eps ||theta_inf(t)||``.

Grid (one dask task per cell): ``setting x seed``. ``setting``: ``isotropic`` (``Sigma = I_d``) and
``anisotropic`` (``Sigma = diag(2, 1, 0.5)``), Gaussian covariates; each setting's ``Sigma`` is a
parameter (``Sigma_<setting>``). ``seed``: ``0 .. n_seeds - 1``, the independent units.

Inside a cell, from the cell's generator: the training tasks (``n_pairs`` antithetic pairs x
``n_queries`` queries, nested prompts of ``max(L)`` tokens, labels ``y = w^T x``, no noise). Then
gradient descent (``lr``, ``n_steps`` = ``T_max``) from the Eq. 9 init on the same tasks for
``softmax(L)`` and ``linear(L)`` at every ``L`` and ``linear(inf)`` (:func:`sfxlin.training.train_all_arrays`,
exact), the parameters recorded on a log-spaced grid of checkpoints
(:func:`sfxlin.training.log_checkpoint_steps`: every step up to ~``per_octave / ln 2``, then
``per_octave`` checkpoints per doubling of ``t``), so that a horizon is resolved at early times as at
late ones: a first exceedance between checkpoints ``t_{k-1}`` and ``t_k`` is known to lie in
``[t_{k-1} + 1, t_k]``, a relative width of at most the grid's largest ``t_k / (t_{k-1} + 1)``
(1.044 at 16 per octave; the analysis reads it from the coordinate ``t`` and carries it in its
results' attrs). From the trajectories: distances to
``theta_inf(t)`` and to ``theta_star``, the Bayes optimum of Remark 5.2 (``sfxlin.icl.bayes_optimum``:
exact, the limit of the gradient flow of ``linear(inf)`` on noiseless tasks, which conserves
``||U||_F^2 - ||v||^2 = 0``; gradient descent conserves it to ``O(lr^2)`` per step, so
``theta_inf(T_max)`` stops at a small distance from ``theta_star``, stored as ``dist_star_inf``),
``||theta_inf(t)||``, the training risks and ``||U||_F^2 - ||v||^2`` of ``theta_inf``.

Paper profile: d = 3; 48 pairs x 2 queries; L = 8 .. 16384 doubling (12 lengths); lr 0.01;
``T_max`` = 8000 steps (``theta_inf``'s training risk reaches 1e-6 by t ~ 1000 isotropic and
~4400 for an anisotropic draw; the slowest anisotropic draws of ``c3_transfer`` need ~3800);
16 checkpoints per octave (160 checkpoints); 4 seeds.
Cost (one thread, quiet machine): 11.7 ms a step for the three models at all twelve ``L`` (the
softmax at ``sum L = 32760`` tokens per item dominates), 94 s a cell, 750 CPU s for the eight
cells (about 6.5 minutes on two free cores). Going further costs in proportion: ``T_max = 20000``
(more horizons of ``eps = 0.2`` inside the run) 235 s a cell, 31 minutes on two cores; each extra
seed 190 CPU s; ``L`` up to 32768 doubles the cost of a step.
"""
from __future__ import annotations

import numpy as np

from sfxlin import icl, laws, training
from sfxlin.engine.params import Param, Profiles
from sfxlin.engine.sweep import Experiment, Part, Variable
from sfxlin.pipelines.c3_transfer import sigmas_are_d_by_d, train_work

NAME = "c3_horizon"
SETTINGS = ("isotropic", "anisotropic")
MODELS = ("softmax", "linear")   # the finite-L models, coordinate ``model``

_MATRIX = "d diagonal entries or a d x d symmetric positive-definite matrix"

PARAMS = (
    Param("d", "int", "covariate dimension; tokens (x, y) have D = d + 1", 3, low=1),
    Param("settings", "str_list", "Gaussian covariate settings", list(SETTINGS), choices=SETTINGS, grid=True),
    Param("Sigma_isotropic", "matrix", f"covariance of the 'isotropic' setting: {_MATRIX}", [1.0, 1.0, 1.0]),
    Param("Sigma_anisotropic", "matrix", f"covariance of the 'anisotropic' setting: {_MATRIX}", [2.0, 1.0, 0.5]),
    Param("n_seeds", "int", "seeds per setting (independent training runs: the units of the SEs)",
          Profiles(quick=2, paper=4), low=1, grid=True),
    Param("n_pairs", "int", "antithetic training task pairs (w, -w) per cell", Profiles(quick=3, paper=48), low=1),
    Param("n_queries", "int", "query points per training task", 2, low=1),
    Param("L", "int_list", "nested training prompt lengths",
          Profiles(quick=[8, 16, 32], paper=[8 * 2**k for k in range(12)]), unit="tokens", low=1,
          order="increasing", min_len=3, why="the analysis fits log-log slopes in L"),
    Param("lr", "float", "gradient-descent step size", 0.01, low=0, low_open=True),
    Param("n_steps", "int", "gradient-descent steps T_max (the last checkpoint)", Profiles(quick=60, paper=8000),
          unit="steps", low=1),
    Param("per_octave", "int", "checkpoints per doubling of t (log-spaced grid; every step while they are closer "
          "than one apart)", Profiles(quick=4, paper=16), low=1),
    Param("root_seed", "int", "root of every cell's random generator", 20261202),
)


def checkpoints(config):
    """The checkpoint steps ``t`` of a run: :func:`sfxlin.training.log_checkpoint_steps`."""
    return training.log_checkpoint_steps(config["n_steps"], config["per_octave"])


def cell_inputs(config, cell):
    """What reaches a cell: the run's parameters less the grid's and the covariances, plus the
    cell's own ``Sigma``."""
    inputs = {k: v for k, v in config.items() if k not in ("settings", "n_seeds") and not k.startswith("Sigma_")}
    inputs["Sigma"] = config[f"Sigma_{cell['setting']}"]
    return inputs


def grid(config):
    return {"setting": list(config["settings"]), "seed": list(range(config["n_seeds"]))}


def inner_coords(config):
    return {"model": list(MODELS), "L": list(config["L"]), "t": checkpoints(config).tolist()}


def kernel(cell, rng, config):
    d, Ls = config["d"], config["L"]
    Sigma = np.asarray(config["Sigma"], dtype=float)
    tasks = icl.make_tasks(rng, d, config["n_pairs"], config["n_queries"], Ls[-1], laws.covariate_law("gaussian", Sigma))
    res = training.train_all_arrays(tasks, Ls, models=("softmax", "linear", "linear_inf"), lr=config["lr"],
                                    n_steps=config["n_steps"], checkpoints=checkpoints(config), label="horizon run")
    U = np.stack([res[m]["U"] for m in MODELS])          # (model, L, t, D, D)
    v = np.stack([res[m]["v"] for m in MODELS])          # (model, L, t, D)
    U_inf, v_inf = res["linear_inf"]["U"], res["linear_inf"]["v"]
    U_star, v_star = icl.bayes_optimum(Sigma)
    out = {
        "D_inf": icl.theta_distance(U, v, U_inf, v_inf),
        "norm_inf": np.sqrt(np.sum(U_inf**2, axis=(-2, -1)) + np.sum(v_inf**2, axis=-1)),
        "dist_star": icl.theta_distance(U, v, U_star, v_star),
        "dist_star_inf": icl.theta_distance(U_inf, v_inf, U_star, v_star),
        "norm_star": np.sqrt(np.sum(U_star**2) + np.sum(v_star**2)),
        "risk_train": np.stack([res[m]["risk"] for m in MODELS]),
        "risk_inf": res["linear_inf"]["risk"],
        "conservation_inf": np.sum(U_inf**2, axis=(-2, -1)) - np.sum(v_inf**2, axis=-1),
        "off_block": icl.off_block_mass(U, v).max(axis=-1),
        "n_exact_shift_steps": np.float64(res["n_exact_shift_steps"]),
    }
    for name, arr in out.items():
        if not np.all(np.isfinite(arr)):
            raise FloatingPointError(f"non-finite values in {name}")
    return out


def cell_work(config, part):
    """Work of one cell in its non-grid parameters (``sfxlin run --plan``'s cost law,
    :mod:`sfxlin.engine.plan`; the grid dims' costs are fitted): the run's
    :func:`~sfxlin.pipelines.c3_transfer.train_work` (the log-spaced checkpoints only store
    parameters) plus ``CELL_OVERHEAD_WORK``, in the same units."""
    return train_work(config["n_steps"], config["n_pairs"], config["n_queries"], config["L"]) + CELL_OVERHEAD_WORK


#: a cell's fixed cost in :func:`cell_work` units: warm CPU seconds of the quick cell isotropic, seed 0 under 4
#: configurations (``python -m sfxlin.engine.plan c3_horizon --set ...``: n_steps 10 .. 400, n_pairs 3 and 12,
#: L_max 32 and 512) follow 0.0044 s + 5.4e-9 s per unit (every one within 0.78 .. 1.08 of it)
CELL_OVERHEAD_WORK = 800_000


_G, _GM = ("setting", "seed"), ("setting", "seed", "model")

VARIABLES = (
    Variable("D_inf", _GM + ("L", "t"), "distance of theta_L(t) to theta_inf(t)",
             "sqrt(||U_L(t) - U_inf(t)||_F^2 + ||v_L(t) - v_inf(t)||^2) at the same step t (same tasks and Eq. 9 "
             "init for every model and L; 0 at t = 0)."),
    Variable("norm_inf", _G + ("t",), "norm of theta_inf(t)", "sqrt(||U_inf(t)||_F^2 + ||v_inf(t)||^2)."),
    Variable("dist_star", _GM + ("L", "t"), "distance of theta_L(t) to theta_star",
             "sqrt(||U_L(t) - U*||_F^2 + ||v_L(t) - v*||^2), (U*, v*) the Bayes optimum of Remark 5.2 for the "
             "setting's Sigma (the limit of the gradient flow of linear(inf))."),
    Variable("dist_star_inf", _G + ("t",), "distance of theta_inf(t) to theta_star",
             "sqrt(||U_inf(t) - U*||_F^2 + ||v_inf(t) - v*||^2): falls to the floor set by gradient descent's "
             "drift of ||U||_F^2 - ||v||^2."),
    Variable("norm_star", _G, "norm of theta_star", "sqrt(||U*||_F^2 + ||v*||^2) = sqrt(2) ||Sigma^-1||_F^(1/2)."),
    Variable("risk_train", _GM + ("L", "t"), "training risk of model(L)",
             "mean over training tasks and queries of 1/2 (pred - y_q)^2 at the checkpoint parameters, prompt length L."),
    Variable("risk_inf", _G + ("t",), "training risk of linear(inf)",
             "mean over training tasks and queries of 1/2 (v^T Gamma_w U z_q - y_q)^2 at the checkpoint (floor 0: "
             "noiseless labels)."),
    Variable("conservation_inf", _G + ("t",), "||U||_F^2 - ||v||^2 of theta_inf(t)",
             "0 at the Eq. 9 init and conserved by the gradient flow; gradient descent drifts by O(lr^2) a step."),
    Variable("off_block", _GM + ("L",), "max_t off-block mass of theta_L(t)",
             "max over checkpoints of sqrt(||U[d, :]||^2 + ||U[:d, d]||^2 + ||v[:d]||^2), measured, never imposed."),
    Variable("n_exact_shift_steps", _G, "softmax steps with the exact max shift",
             "engine diagnostic: steps whose cached log-sum-exp shift was out of range and were recomputed exactly.",
             units="steps"),
)

EXPERIMENT = Experiment(
    name=NAME, short="c3h", params=PARAMS, checks=(sigmas_are_d_by_d,), inner_coords=inner_coords,
    variables=VARIABLES, analysis="sfxlin.analysis.c3_horizon", parts=(Part("", grid, kernel, inputs=cell_inputs),),
    scheduler="processes",   # as c3_transfer: long cells of many small numpy calls (the GIL)
    title="C3 horizon: the horizon T(L) up to which softmax(L) training follows theta_inf(t)",
    description="C3 transfer horizon T*(L, eps), its growth in L, and the best-horizon distance to the Bayes optimum")
