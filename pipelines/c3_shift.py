"""C3 shift, a variant of the C3 family: the trained models on shifted test prompts (:mod:`sfxlin.shift`) against
their exact large-prompt prediction, the risk under linear(inf) with the test covariance. Grid ``setting x seed``.
docs/claims.md, "C3 shift"."""
from __future__ import annotations

import numpy as np

from sfxlin import shift, training
from sfxlin.engine import Cells, Param, Profiles, Variable
from sfxlin.engine.sensitivity import step_perturbation

from .families.c3 import (C3, GAUSSIAN, STEP_CURVATURE_INF, draw, finite, named, setting_inputs, setting_law,
                          step_curvature, train_counts)

NAME = "c3_shift"
INF = "linear(inf)"


def theta_labels(Ls):
    """The ``theta`` coordinate: ``softmax(L)`` per training ``L``, then ``linear(inf)``."""
    return [f"softmax({int(L)})" for L in Ls] + [INF]


def kernel(cell, rng, config):
    d, Ls, Le, T = config["d"], config["L"], config["L_eval"], config["n_steps"]
    law, Sigma = setting_law(cell["setting"], config)
    tasks, held = draw(rng, d, law, config["n_pairs"], config["n_queries"], Ls[-1],
                       (config["heldout_pairs"], config["heldout_queries"], Le[-1]))
    res = training.train_all_arrays(tasks, Ls, models=("softmax", "linear_inf"), lr=config["lr"], n_steps=T,
                                    ckpt_every=T, label="training", perturb=step_perturbation())
    U = np.concatenate([res["softmax"]["U"][:, -1], res["linear_inf"]["U"][-1][None]])   # (theta, D, D)
    v = np.concatenate([res["softmax"]["v"][:, -1], res["linear_inf"]["v"][-1][None]])   # (theta, D)
    per_shift = [shift.shift_risks(U, v, held, spec, Sigma, Le, config["ridge_lam"]) for spec in config["shifts"]]
    out = {k: np.stack([r[k] for r in per_shift]) for k in per_shift[0]}
    out["risk_train_T"] = np.concatenate([res["softmax"]["risk"][:, -1], [res["linear_inf"]["risk"][-1]]])
    out.update(step_curvature(tasks, config["lr"], res["linear_inf"]["U"], res["linear_inf"]["v"]))   # init and T
    return finite(out, nan=("risk_pgd_test",))


def counts(config, part, cell):
    """The training, then per shift every trained theta (``len(L) + 1``) evaluated on the shifted held-out pairs at
    every ``L_eval`` in one pass over the longest prompts (the partners of the block-structured trained parameters
    sharing it), the shifted tokens and their prefix sums (the ridge and PGD baselines) and the shift's fixed cost;
    the held-out tokens drawn once more."""
    Ls, Le, n_shifts = config["L"], config["L_eval"], len(config["shifts"])
    pairs = config["heldout_pairs"]
    evals = n_shifts * (len(Ls) + 1) * pairs * config["heldout_queries"] * Le[-1]
    return {**train_counts(config["n_steps"], config["n_pairs"], config["n_queries"], Ls, d=config["d"]),
            "eval_visit": evals,
            "shift_token": (n_shifts + 1) * pairs * Le[-1], "shift": n_shifts}


_GS = ("shift",)
_GST = _GS + ("theta",)
_ON = " on the shifted held-out prompts (the held-out tasks mapped by the shift's A: x' = A x, y' = w^T x')"
OWN = (
    Variable("risk_softmax", _GST + ("L_eval",), "measured held-out risk of softmax(L_eval) with theta",
           "mean over held-out tasks and queries of 1/2 (pred - y_q)^2, theta (trained, at T) used as softmax "
           "attention on the first L_eval tokens" + _ON + "."),
    Variable("risk_softmax_se", _GST + ("L_eval",), "SE of risk_softmax over held-out pairs", "standard deviation "
             "over the held-out antithetic pairs of their mean risk, over sqrt(pairs)."),
    Variable("risk_exact", _GST, "exact large-L prediction: risk of theta under linear(inf) with the test covariance",
             "sfxlin.icl.linear_inf_risk(U, v, Sigma_test): E over w ~ N(0, I_d) and x_q of 1/2 (v^T Gamma_w U z_q "
             "- y_q)^2, Gamma_w from Sigma_test (closed form; the limit of risk_softmax as L_eval -> inf)."),
    Variable("risk_linf_mc", _GST, "risk of theta under linear(inf) with the test covariance, Monte Carlo",
           "mean over the held-out tasks and queries" + _ON + " of 1/2 (v^T Gamma_w U z_q - y_q)^2, Gamma_w from "
           "Sigma_test and each task's w: the closed form's Monte Carlo on the same tasks as risk_softmax."),
    Variable("risk_linf_mc_se", _GST, "SE of risk_linf_mc over held-out pairs, estimated", "as risk_softmax_se (the "
             "sample standard deviation: noisy for these heavy-tailed risks, and low where the mean is low)."),
    Variable("risk_linf_exact_se", _GST, "exact SE of risk_linf_mc", "sqrt(sfxlin.icl.linear_inf_pair_variance(U, v, "
             "Sigma_test, heldout_queries) / heldout_pairs): the closed-form variance of a held-out pair's risk under "
             "linear(inf) (the population value of risk_linf_mc_se).", units="1"),
    Variable("diff_se", _GST + ("L_eval",), "SE of risk_softmax - risk_linf_mc over held-out pairs",
             "the paired difference per held-out pair (same tasks), its standard deviation over sqrt(pairs)."),
    Variable("risk_ridge", _GS + ("L_eval",), "held-out risk of ridge on the shifted prompt", "per held-out task, "
             "ridge (ridge_lam; 0: minimum-norm least squares pinv(X) y) on its first L_eval shifted tokens, risk "
             "1/2 (x_q'^T w_hat - y_q')^2 averaged (noiseless: rounding once the prompt spans the test covariates' "
             "subspace).", yardstick="risk_pgd_train"),
    Variable("risk_pgd_train", _GS + ("L_eval",), "held-out risk of one-step preconditioned GD, training "
             "preconditioner", "w_hat = Gamma_L(Sigma) (1/L) X'^T y' (sfxlin.baselines.pgd_preconditioner of the "
             "TRAINING Sigma: the shift-unaware optimum of linear(L) attention) on the shifted prompts."),
    Variable("risk_pgd_test", _GS + ("L_eval",), "held-out risk of one-step preconditioned GD, test preconditioner",
             "as risk_pgd_train with the preconditioner of the test covariance (the oracle that knows the shift); "
             "NaN by design where the test covariance is singular (subspace:K: no inverse).", allow_nonfinite=True),
    Variable("Sigma_test", _GS + ("i", "j"), "test covariance Sigma' = A Sigma A^T", "sfxlin.shift.shifted_covariance."),
    Variable("risk_train_T", ("theta",), "final training risk of theta", "mean over training tasks and queries of "
             "1/2 (pred - y_q)^2 at T: softmax(L) at its training L, linear(inf) with Gamma_w."),
)

EXPERIMENT = C3.variant(
    NAME, short="c3s", analysis="sfxlin.analysis.c3_shift",
    values=dict(d=3, **named(*GAUSSIAN), n_seeds=Profiles(quick=2, paper=6), n_pairs=Profiles(quick=2, paper=48),
                n_queries=2, L=Profiles(quick=[8, 16], paper=[16, 64, 256, 1024]), lr=0.01,
                n_steps=Profiles(quick=40, paper=2500),
                L_eval=Profiles(quick=[8, 16, 32], paper=[16, 64, 256, 1024, 4096, 16384, 65536]),
                heldout_pairs=Profiles(quick=4, paper=256), heldout_queries=Profiles(quick=2, paper=4), ridge_lam=0.0,
                root_seed=20261202),
    changes={"d": {"low": 2}, "settings": {"choices": GAUSSIAN}, "L": {"min_len": 1, "why": ""},
             "L_eval": {"kind": "int_list", "order": "increasing", "min_len": 3,
                        "doc": "nested held-out prompt lengths at which every trained theta is evaluated",
                        "why": "the analysis fits the log-log slope of |ratio - 1| in L_eval"},
             "heldout_pairs": {"low": 2}},
    params=(Param("shifts", "str_list", "test shifts (sfxlin.shift.parse_shift: none, scale:C, rotate:SEED, "
                  "subspace:K, or a covariance spec; no ',' or ';')",
                  Profiles(quick=["none", "scale:2", "subspace:2"],
                           paper=["none", "scale:0.5", "scale:2", "power_law:2.0", "rotate:1", "subspace:2"]),
                  unique=True),),
    cells=(Cells({"setting": "settings", "seed": "n_seeds"}, kernel, (*OWN, *STEP_CURVATURE_INF), inputs=setting_inputs, perturbed=True),),
    coords={"shift": lambda c: c["shifts"], "theta": lambda c: theta_labels(c["L"]), "L_eval": lambda c: c["L_eval"],
            "i": lambda c: range(c["d"]), "j": lambda c: range(c["d"])},
    checks=(shift.shift_check("shifts"),), cost=C3.cost.counting(counts), scheduler="processes",
    title="C3 shift: trained C3 models on shifted test prompts against their exact linear(inf) prediction",
    description="C3 under test-time distribution shift: measured softmax(L_eval) risk vs the exact large-L prediction")
