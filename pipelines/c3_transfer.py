"""C3: large-prompt softmax attention inherits the optimisation of linear attention, the C3 family's reference
variant. Grid ``setting x seed``: the named settings (``rademacher`` the control, ``n_seeds_control`` seeds; a cell
of the product grid outside the protocol is NaN, ``in_protocol = 0``) and with ``covariates`` the file's
``empirical``. A cell: the family's run with its measures per checkpoint, the held-out risks and baselines, the
off-block curvature along the run (:mod:`sfxlin.curvature`) and, with ``perturbed_run``, the run again from an
off-block perturbation. The protocol: docs/protocols.md, "c3_transfer"."""
from __future__ import annotations

import dataclasses

import numpy as np

from sfxlin import baselines, curvature, icl, laws, training
from sfxlin.engine import Cells, Param, Profiles, Variable
from sfxlin.engine.params import digest_key
from sfxlin.engine.sensitivity import DEFAULT_EPS, step_perturbation
from sfxlin.engine.sensitivity import param as amplification_param
from sfxlin.realdata import TOKEN_SUFFIXES, check_unchanged

from .families.c3 import (C3, GRID, MODELS, SETTINGS, STEP_CURVATURE, Run, draw, finite, heldout_counts, named,
                          setting_law, train_counts)

NAME = "c3_transfer"
CONTROL = "rademacher"
EMPIRICAL = "empirical"  # the setting of the ``covariates`` file


def _covariates_fit(config):
    """``covariates``: a readable file of finite rows of dimension ``d`` with a positive-definite covariance."""
    if config["covariates"]:
        try:
            laws.covariate_law(f"{EMPIRICAL}:{config['covariates']}", d=config["d"])
        except ValueError as exc:
            raise ValueError(f"covariates: {exc}") from None


def settings_of(config):
    """The setting coordinate: ``config["settings"]``, then ``"empirical"`` when ``covariates`` names a file."""
    return list(config["settings"]) + ([EMPIRICAL] if config["covariates"] else [])


def covariate_law_of(setting, config):
    """``(law, Sigma)`` of a cell of ``setting`` (``config``: its cell inputs): a named setting's
    (:func:`~sfxlin.pipelines.families.c3.setting_law`), or for ``empirical`` the file's rows and their second
    moment ``cov + m m^T``; ``ValueError`` if the file changed since the run was configured."""
    if setting != EMPIRICAL:
        return setting_law(setting, config)
    check_unchanged(config["covariates"], config[digest_key("covariates")], "covariates")
    law = laws.covariate_law(f"{EMPIRICAL}:{config['covariates']}", d=config["d"])
    return law, law.cov + np.outer(law.mean, law.mean)


def seeds_of(config, setting):
    """Number of seeds of ``setting`` in the protocol."""
    return config["n_seeds_control"] if setting == CONTROL else config["n_seeds"]


def in_protocol(config, setting, seed):
    return seed < seeds_of(config, setting)


def cell_inputs(config, cell):
    """What reaches a cell: the run's parameters less the grid's, the covariances and the covariate file;
    plus the cell's own covariance spec ``Sigma`` (for ``empirical``: the file instead, to which the engine
    adds its digest) and ``in_protocol`` flag."""
    setting = cell["setting"]
    inputs = {k: v for k, v in config.items() if k not in (*GRID, "covariates") and not k.startswith("Sigma_")}
    if setting == EMPIRICAL:
        inputs["covariates"] = config["covariates"]
    else:
        inputs["Sigma"] = config[f"Sigma_{setting}"]
    inputs["in_protocol"] = in_protocol(config, setting, cell["seed"])
    return inputs


def _nan_cell(config):
    inner = EXPERIMENT.inner_coords(config)
    out = {var.name: np.full(tuple(len(inner[dim]) for dim in var.dims if dim not in ("setting", "seed")), np.nan)
           for var in EXPERIMENT.variables}
    return {**out, "in_protocol": np.int8(0)}


def kernel(cell, rng, config):
    if not config["in_protocol"]:
        return _nan_cell(config)
    d, Ls, L_eval = config["d"], config["L"], config["L_eval"]
    law, Sigma = covariate_law_of(cell["setting"], config)
    kw = dict(lr=config["lr"], n_steps=config["n_steps"], ckpt_every=config["ckpt_every"])
    tasks, held = draw(rng, d, law, config["n_pairs"], config["n_queries"], Ls[-1],
                       (config["heldout_pairs"], config["heldout_queries"], max(Ls[-1], L_eval)))
    direction = rng.standard_normal(2 * d)
    run = Run(tasks, Ls, "main run", **kw)
    U_star, v_star = icl.bayes_optimum(Sigma)
    sub = np.flatnonzero(np.isin(run.res["t"], training.checkpoint_steps(kw["n_steps"], config["heldout_every"])))
    at_L, at_eval, inf_ho, inf_eval = run.heldout(held, Ls, L_eval, sub)
    base = baselines.baseline_risks(held, Ls)
    out = {
        "in_protocol": np.int8(1), "U": run.U, "v": run.v, "U_inf": run.U_inf, "v_inf": run.v_inf,
        **run.trajectory(Sigma),
        "risk_heldout": at_L, "risk_heldout_eval": at_eval, "risk_heldout_inf": inf_ho, "risk_heldout_inf_eval": inf_eval,
        "risk_ridge": np.array([icl.ridge_risk(held, L, config["ridge_lam"]) for L in Ls]),
        "risk_plugin": np.array([icl.risk("linear", U_star, v_star, held, L) for L in Ls]),
        **_perturbed_run(tasks, Ls, d, Sigma, direction, run.U, run.v, config, kw),
        **_off_block_curvature(tasks, Ls, run.U, run.v, run.U_inf, run.v_inf), **run.step_curvature(),
        **{f"risk_{name}": base[name] for name in ("bayes_ridge", "pgd")},
        "n_exact_shift_steps": np.float64(run.res["n_exact_shift_steps"]),
    }
    return finite(out, allowed=() if config["perturbed_run"] else _PERTURBED)


_PERTURBED = ("off_block_perturbed", "risk_train_perturbed", "D_perturbed", "off_block_perturbed_inf")


def _off_block_curvature(tasks, Ls, U, v, U_inf, v_inf):
    """Extreme eigenvalues of the off-block Hessian of each model's risk at every checkpoint of
    the main (block-structured) run (:mod:`sfxlin.curvature`)."""
    out = {}
    lo, hi = zip(*(curvature.curvature_extremes(curvature.off_block_hessian(m, tasks, Ls, U[i], v[i]))
                   for i, m in enumerate(MODELS)))
    out["off_block_curvature_min"], out["off_block_curvature_max"] = np.stack(lo), np.stack(hi)
    lo, hi = curvature.curvature_extremes(curvature.off_block_hessian("linear_inf", tasks, None, U_inf[None],
                                                                      v_inf[None])[0])
    out["off_block_curvature_min_inf"], out["off_block_curvature_max_inf"] = lo, hi
    return out


def _perturbed_run(tasks, Ls, d, Sigma, direction, U, v, config, kw):
    """The direct diagnostic: every model trained again from ``(U0, v0)`` plus the off-block
    perturbation (NaN when ``perturbed_run`` is off; the direction is drawn either way)."""
    if not config["perturbed_run"]:
        return {"off_block_perturbed": np.full(U.shape[:3], np.nan), "risk_train_perturbed": np.full(U.shape[:3], np.nan),
                "D_perturbed": np.full(U.shape[:3], np.nan), "off_block_perturbed_inf": np.full(U.shape[2], np.nan)}
    U0, v0 = icl.init_theta(d, Sigma)
    U0p, v0p = training.perturbed_init(U0, v0, direction, config["perturbation"])
    pert = training.train_all_arrays(tasks, Ls, models=("softmax", "linear", "linear_inf"), U0=U0p, v0=v0p,
                                     label="perturbed run", perturb=step_perturbation(), **kw)
    return {
        "off_block_perturbed": np.stack([icl.off_block_mass(pert[m]["U"], pert[m]["v"]) for m in MODELS]),
        "risk_train_perturbed": np.stack([pert[m]["risk"] for m in MODELS]),
        "D_perturbed": np.stack([icl.theta_distance(pert[m]["U"], pert[m]["v"], U[i], v[i])
                                 for i, m in enumerate(MODELS)]),
        "off_block_perturbed_inf": icl.off_block_mass(pert["linear_inf"]["U"], pert["linear_inf"]["v"]),
    }


def counts(config, part, cell):
    """The main run (twice with ``perturbed_run``) and the held-out evaluations every ``heldout_every`` steps;
    a cell outside the protocol computes nothing."""
    if not in_protocol(config, cell["setting"], cell["seed"]):
        return {"cell": 1}
    Ls = config["L"]
    train = train_counts(config["n_steps"], config["n_pairs"], config["n_queries"], Ls, d=config["d"],
                         runs=2 if config["perturbed_run"] else 1)
    return {**train, **heldout_counts(config["n_steps"] // config["heldout_every"] + 1, config["heldout_pairs"],
                                      config["heldout_queries"], Ls, config["L_eval"])}


_NAN = " NaN where in_protocol = 0 (a cell outside the protocol, not computed)."


def _nan_outside(o):
    return dataclasses.replace(o, description=o.description + _NAN, allow_nonfinite=True)


_GM = ("model", "L")
OWN = {o.name: o for o in (
    Variable("risk_heldout_eval", _GM + ("t_heldout",), "held-out risk of theta_L(t) at L_eval", "as risk_heldout "
             "but with held-out prompts of length L_eval (config; 4096 in the paper profile)."),
    Variable("risk_heldout_inf_eval", ("t_heldout",), "held-out risk of theta_inf under softmax(L_eval)",
             "theta_inf(t) used as softmax attention with held-out prompts of length L_eval."),
    Variable("risk_ridge", ("L",), "held-out risk of ridge regression on the prompt", "per held-out task, ridge "
             "(penalty ridge_lam; 0: minimum-norm least squares) on its length-L prompt, risk 1/2 (x_q^T w_hat - "
             "y_q)^2 averaged; noiseless labels: least squares is exact (rounding) once L >= d."),
    Variable("risk_plugin", ("L",), "held-out risk of the plug-in estimator (linear(L) at the Bayes optimum)",
           "w_hat = Sigma^{-1} (1/L) sum_k y_k x_k, i.e. linear(L) attention at (U*, v*); held-out prompts of length L."),
    Variable("off_block_perturbed", _GM + ("t",), "off-block mass of model(L), perturbed run", "as off_block, for "
             "the diagnostic run started from (U0, v0) plus an off-block perturbation of norm `perturbation` "
             "(config) along a seeded random direction of (U[d, :d], v[:d]): growth = instability; NaN everywhere "
             "when perturbed_run is off (the paper profile)."),
    Variable("risk_train_perturbed", _GM + ("t",), "training risk of model(L), perturbed run", "as risk_train, for "
             "the diagnostic run (its trajectory leaves the main one where the block structure is unstable)."),
    Variable("D_perturbed", _GM + ("t",), "distance of the perturbed run to the main run", "sqrt(||U_perturbed - "
             "U||_F^2 + ||v_perturbed - v||^2) at the same model, L and t (the perturbation itself at t = 0)."),
    Variable("off_block_perturbed_inf", ("t",), "off-block mass of linear(inf), perturbed run", "as "
             "off_block_perturbed, for linear(inf)."),
    Variable("off_block_curvature_max", _GM + ("t",), "largest off-block curvature of model(L)", "largest "
             "eigenvalue of the Hessian of the training risk in the active off-block coordinates (U[d, :d], v[:d]) "
             "at theta_L(t) of the main run; lr * it > 2: an off-block perturbation grows (step-size instability of "
             "the block structure)."),
    Variable("off_block_curvature_min", _GM + ("t",), "smallest off-block curvature of model(L)",
             "smallest eigenvalue of the same Hessian (negative: a saddle direction off-block)."),
    Variable("off_block_curvature_max_inf", ("t",), "largest off-block curvature of linear(inf)",
             "as off_block_curvature_max, for linear(inf) at theta_inf(t)."),
    Variable("off_block_curvature_min_inf", ("t",), "smallest off-block curvature of linear(inf)",
           "as off_block_curvature_min, for linear(inf) at theta_inf(t)."))}
OUTPUTS = (
    "U", "v", "risk_train", "U_inf", "v_inf", "risk_inf", "D_inf", "D_linL", "dist_bayes", "dist_bayes_inf",
    "off_block", "off_block_inf", "conservation", "conservation_inf", "norm_inf", "risk_heldout", "risk_heldout_eval",
    "risk_heldout_inf", "risk_heldout_inf_eval", "risk_ridge", "risk_plugin", "off_block_perturbed",
    "risk_train_perturbed", "D_perturbed", "off_block_perturbed_inf", "risk_bayes_ridge", "risk_pgd",
    "off_block_curvature_max", "off_block_curvature_min", "off_block_curvature_max_inf", "off_block_curvature_min_inf",
    *STEP_CURVATURE, "n_exact_shift_steps")
FLAG = Variable("in_protocol", (), "cell is part of the protocol", "1 if the cell was computed (seed < n_seeds, or "
                "< n_seeds_control for the Rademacher control), 0 if it only fills the product grid (every other "
                "variable is NaN there).", dtype="int8", flag_meanings=("outside_protocol", "in_protocol"))

EXPERIMENT = C3.variant(
    NAME, short="c3", analysis="sfxlin.analysis.c3",
    values=dict(d=3, **named(*SETTINGS), n_seeds=Profiles(quick=2, paper=8), n_pairs=Profiles(quick=4, paper=48),
                n_queries=2, L=Profiles(quick=[8, 16, 32, 64], paper=[8 * 2**k for k in range(10)]), lr=0.01,
                n_steps=Profiles(quick=200, paper=2500), ckpt_every=20, heldout_pairs=Profiles(quick=8, paper=256),
                heldout_queries=Profiles(quick=2, paper=4), L_eval=Profiles(quick=128, paper=4096),
                heldout_every=Profiles(quick=100, paper=500), ridge_lam=0.0, root_seed=20251211),
    params=(
        Param("covariates", "file", "a covariate file, 'path.npy' or 'path.nc:variable' (one covariate x of "
              "dimension d per row), whose empirical law joins the settings as 'empirical' (rows as given, drawn "
              "with replacement); '' for none", "", suffixes=TOKEN_SUFFIXES, optional=True),
        Param("n_seeds_control", "int", "seeds of the Rademacher control (the grid runs max of both; extra cells "
              "are NaN, in_protocol = 0)", Profiles(quick=1, paper=4), low=1, grid=True),
        Param("perturbation", "float", "norm of the off-block perturbation of (U0, v0) in the diagnostic run", 1e-12,
              low=0, low_open=True),
        Param("perturbed_run", "bool", "also train every model from the perturbed init (the direct diagnostic; else "
              "its variables are NaN and the off-block curvature alone says where the block structure is unstable)",
              Profiles(quick=True, paper=False)),
        amplification_param(Profiles(quick=0.0, paper=DEFAULT_EPS))),
    cells=(Cells({"setting": settings_of, "seed": lambda c: range(max(seeds_of(c, s) for s in settings_of(c)))},
                 kernel, (FLAG, *(_nan_outside(OWN.get(name) or C3.output(name)) for name in OUTPUTS)),
                 inputs=cell_inputs, perturbed=True),),
    checks=(_covariates_fit,), cost=C3.cost.counting(counts),
    scheduler="processes",   # long cells of many small numpy calls (the GIL): docs/performance.md, section 8
    title="C3: large-prompt softmax training inherits linear-attention training",
    description="C3: large-prompt softmax attention inherits linear-attention optimisation")
