"""C3 landscape, a variant of the C3 family: the transfer across covariance families, label noise and
dimensions, and its failure where it must fail (non-centred covariates). Grid ``covariance x noise x d x mean_norm
x seed``; the family's run, its maxima over ``t`` and values at ``T``, the baselines and their closed forms; part
``covariance``: each ``Sigma``'s summary figures. docs/claims.md, "C3 landscape"; the tasks: docs/tasks.md."""
from __future__ import annotations

import numpy as np

from sfxlin import baselines, bayes, covariance, laws
from sfxlin.engine import Cells, Param, Profiles, Variable
from sfxlin.engine.sensitivity import DEFAULT_EPS, param as amplification_param

from .families.c3 import C3, STEP_CURVATURE, Run, draw, finite, heldout_counts, kept, train_counts

NAME = "c3_landscape"


def kernel(cell, rng, config):
    d, s, Ls = cell["d"], cell["noise"], config["L"]
    law = laws.covariate_law("gaussian", covariance.from_spec(cell["covariance"], d),
                             np.full(d, cell["mean_norm"] / np.sqrt(d)))
    Sigma, mean = law.cov, law.mean
    tasks, held = draw(rng, d, law, config["n_pairs"], config["n_queries"], Ls[-1],
                       (config["heldout_pairs"], config["heldout_queries"], Ls[-1]), noise=s)
    run = Run(tasks, Ls, "main run", lr=config["lr"], n_steps=config["n_steps"], ckpt_every=config["ckpt_every"])
    traj = run.trajectory()
    at_L, _, inf_ho, inf_sm = run.heldout(held, Ls, Ls[-1], [0, -1])   # at the init and at T
    base = baselines.baseline_risks(held, Ls)
    gap = (bayes.softmax_limit(run.U_inf[-1], run.v_inf[-1], Sigma, held.w, held.z_q, mean, s)
           - bayes.linear_limit(run.U_inf[-1], run.v_inf[-1], Sigma, held.w, held.z_q, mean, s))
    out = finite({
        **kept(traj, max_t=("D_inf", "D_linL", "off_block", "off_block_inf"), T=("risk_train", "risk_inf")),
        "norm_inf_T": run.norm_inf_T(), "risk_heldout_init": at_L[:, :, 0], "risk_heldout_T": at_L[:, :, 1],
        "risk_heldout_inf_T": inf_ho[1], "risk_heldout_inf_softmax": inf_sm[1], "limit_gap": 0.5 * np.mean(gap**2),
        "risk_min_norm": base["min_norm"], "risk_bayes_ridge": base["bayes_ridge"], "risk_pgd": base["pgd"],
        **run.step_curvature(),
    })
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


def counts(config, part, cell):
    """The main run and the held-out risks at the init and at ``T`` (``L_eval = L_max``); the covariance
    part draws nothing: a cell."""
    if part:
        return {"cell": 1}
    Ls = config["L"]
    return {**train_counts(config["n_steps"], config["n_pairs"], config["n_queries"], Ls, d=cell["d"]),
            **heldout_counts(2, config["heldout_pairs"], config["heldout_queries"], Ls, Ls[-1])}


_NAN = " NaN by design where no closed form exists"
_GM = ("model", "L")
OWN = (
    Variable("risk_heldout_inf_softmax", (), "held-out risk of theta_inf(T) used as softmax(L_max)",
             "theta_inf(T) as softmax attention on held-out prompts of the largest L."),
    Variable("limit_gap", (), "squared gap between the softmax and linear limits at theta_inf(T)",
             "mean over held-out tasks and queries of 1/2 (softmax_limit - linear_limit)^2 (sfxlin.bayes): rounding "
             "when centred; the affine intercept and the covariance/second-moment mismatch when not."),
    Variable("risk_min_norm", ("L",), "held-out risk of minimum-norm least squares", "sfxlin.baselines.min_norm on "
             "the held-out prompts of length L."),
)
THEORY = (
    Variable("risk_pgd_theory", ("L",), "exact risk of risk_pgd's estimator",
             "sfxlin.baselines.pgd_risk, centred covariates;" + _NAN + " (non-centred).", allow_nonfinite=True),
    Variable("risk_bayes_theory", ("L",), "Bayes risk of the task, closed form",
             "sfxlin.bayes.bayes_risk_task (noiseless labels);" + _NAN + " (noisy labels at finite L).",
             allow_nonfinite=True),
    Variable("risk_ridge_asymptotic", ("L",), "asymptotic risk of ridge at the Bayes penalty",
             "sfxlin.baselines.asymptotic_ridge_risk (Marchenko-Pastur; isotropic, centred);" + _NAN + ".",
             allow_nonfinite=True),
    Variable("risk_floor_inf", (), "Bayes risk of linear(inf)'s class", "noise^2 / 2: the query-noise floor."),
)
SUMMARY = tuple(Variable(f"Sigma_{key}", (), long_name, "sfxlin.covariance.summary.") for key, long_name in
                (("trace", "tr(Sigma)"), ("op_norm", "largest eigenvalue of Sigma"),
                 ("condition", "condition number of Sigma"), ("tr_inv2", "tr(Sigma^-2)")))

EXPERIMENT = C3.variant(
    NAME, short="c3l", analysis="sfxlin.analysis.c3_landscape", sweep=("d",),
    values=dict(d=Profiles(quick=[2], paper=[3, 8]), n_seeds=Profiles(quick=1, paper=4),
                n_pairs=Profiles(quick=3, paper=32), n_queries=2,
                L=Profiles(quick=[8, 16, 32, 64], paper=[8 * 2**k for k in range(9)]), lr=0.01,
                n_steps=Profiles(quick=100, paper=1000), ckpt_every=Profiles(quick=20, paper=50),
                heldout_pairs=Profiles(quick=8, paper=128), heldout_queries=Profiles(quick=2, paper=4),
                root_seed=20261130),
    changes={"L": {"min_len": 4, "why": "the analysis fits log-log slopes in L, the control over the last four"}},
    params=(
        Param("covariances", "str_list", "covariance specs of sfxlin.covariance.from_spec (no ',' or ';')",
              Profiles(quick=["isotropic", "kms:0.5"], paper=["isotropic", "power_law:1.0", "kms:0.5"]), grid=True,
              unique=True),
        Param("noises", "float_list", "label-noise standard deviations (prompt labels and query targets)",
              Profiles(quick=[0.0, 0.5], paper=[0.0, 0.5]), low=0, grid=True, unique=True),
        Param("mean_norms", "float_list", "norms of the covariate mean m = mean_norm (1, ..., 1) / sqrt(d); 0: "
              "centred, > 0: the non-centred control", [0.0, 1.0], low=0, grid=True, unique=True),
        amplification_param(Profiles(quick=0.0, paper=DEFAULT_EPS))),
    cells=(Cells({"covariance": "covariances", "noise": "noises", "d": "d", "mean_norm": "mean_norms",
                  "seed": "n_seeds"}, kernel,
                 ("D_inf_max", "D_linL_max", "norm_inf_T", "off_block_max", "off_block_inf_max", "risk_train_T",
                  "risk_inf_T", "risk_heldout_init", "risk_heldout_T", "risk_heldout_inf_T", *OWN[:2], OWN[2],
                  "risk_bayes_ridge", "risk_pgd", *THEORY, *STEP_CURVATURE), perturbed=True),
           Cells({"covariance": "covariances", "d": "d"}, covariance_kernel, SUMMARY, name="covariance",
                 inputs=lambda config, cell: {})),
    checks=(covariance.spec_check("covariances", "d"),), cost=C3.cost.counting(counts),
    title="C3 landscape: covariance family x label noise x d x L, with a non-centred control",
    description="C3 across covariance families, label noise and dimensions; baselines; non-centred control")
