"""C2 threshold study: uniform-in-time stability of the softmax gradient vs tr(Sigma^-2).

SPEC section 2: at the Bayes optimum the query-averaged concentration constant
``E exp(x_q^T Sigma^-1 x_q / c^2) = (1 - 2 tau^{-1/2})^{-d/2}``, ``tau = tr(Sigma^-2)``, is finite
iff ``tau > 4``. SPEC C2 ("threshold study"): sweeping ``tau`` moves the exponent of the gradient
gap taken uniformly over the training trajectory (sup over t) from about 0 to about -0.4, while
the exponent at fixed parameters stays near -1/2.

Grid (one dask task per cell): ``tau x seed`` with ``Sigma = s I_d``, ``s = sqrt(d / tau)``
(so ``tr(Sigma^-2) = d / s^2 = tau``). Inside a cell (:func:`sfxlin.stability.gradient_gap_trajectory`):

* tasks: ``n_pairs`` antithetic pairs x ``n_queries`` queries, nested prompts of ``max(L)`` tokens,
  plus ``n_replicates - 1`` fresh prompt sets for the same tasks and queries;
* ``linear(inf)`` (``Gamma_w``) trained by gradient descent (``lr``, ``n_steps``) from the Eq. 9
  init; checkpoints every ``ckpt_every`` steps. ``trainer = "pairs"``: antithetic partners' gradient
  contributions are added first, so the block structure is kept in exact arithmetic; with
  ``"simple"`` (``training.train``) rounding seeds an unstable off-block direction of GD at lr 0.01
  for small tau and 2 of the 140 paper cells end at a non-balanced minimiser, 0.3-0.5 away from
  the Bayes optimum (see :func:`sfxlin.stability.gradient_gap_trajectory`);
* at every checkpoint and every ``L``: the per-task gradient gap ``g`` of ``softmax(L)`` against
  ``linear(inf)`` (and the gap ``g_risk`` of the training-risk gradient), the risk, the distance
  to the Bayes optimum, the off-block mass and the empirical logit factor ``exp(a^T Gamma_w a)``.

Paper profile: 14 values of tau log-spaced over [0.75, 14.81] (8 below 4, 6 above), 10 seeds,
48 pairs x 2 queries, L = 8..4096, lr 0.01, T = 2500, gap every 100 steps (26 checkpoints),
6 prompt replicates per cell. Choices: g_L(t) is smooth in t (it rises and plateaus as theta_inf
converges), so 100-step checkpoints lose nothing for the sup; the exponents' noise comes mostly
from the tasks and queries of a seed (heavy-tailed per-query constants), so the budget goes to
seeds rather than prompt replicates. Measured: 113 s CPU for the 140 cells (0.8 s per cell), 150 s
wall on this 2-core machine while other jobs kept its load average at 5-6 (about 60 s expected
when idle).
"""
from __future__ import annotations

import math

import numpy as np

from sfxlin import icl
from sfxlin.attention import check_prompt_lengths
from sfxlin.stability import TRAINERS, concentration_constant, gradient_gap_trajectory
from sfxlin.sweep import Experiment, Variable
from sfxlin.training import checkpoint_steps

NAME = "c2_threshold"
X_LAWS = ("gaussian", "rademacher")


def _tau_grid(lo, hi, n):
    return [round(float(x), 4) for x in np.geomspace(lo, hi, n)]


TAU_MAX = 3.0 / 0.45**2   # 14.8148: s = 0.45 (and tau = 0.75 is s = 2), as in the reference sweep

PROFILES = {
    "quick": {"d": 3, "tau": _tau_grid(0.75, TAU_MAX, 6), "L": [2**k for k in range(3, 10)], "n_seeds": 1,
              "n_pairs": 4, "n_queries": 2, "n_replicates": 2, "lr": 0.01, "n_steps": 200, "ckpt_every": 50,
              "x_law": "gaussian", "trainer": "pairs", "root_seed": 20251211},
    "paper": {"d": 3, "tau": _tau_grid(0.75, TAU_MAX, 14), "L": [2**k for k in range(3, 13)], "n_seeds": 10,
              "n_pairs": 48, "n_queries": 2, "n_replicates": 6, "lr": 0.01, "n_steps": 2500, "ckpt_every": 100,
              "x_law": "gaussian", "trainer": "pairs", "root_seed": 20251211},
}

PARAMETERS = {
    "d": "covariate dimension (int >= 1); Sigma = s I_d with s = sqrt(d / tau)",
    "tau": "values of tau = tr(Sigma^-2) (increasing list of float > 0); the threshold is tau = 4",
    "L": "nested prompt lengths (increasing list of int >= 1)",
    "n_seeds": "independent replicates (tasks, queries, prompts) per tau",
    "n_pairs": "antithetic task pairs (w, -w) per cell",
    "n_queries": "query points per task",
    "n_replicates": "independent prompt sets per cell for the gap (same tasks and queries)",
    "lr": "gradient-descent step size of linear(inf)",
    "n_steps": "gradient-descent steps T (a multiple of ckpt_every)",
    "ckpt_every": "steps between checkpoints at which the gap is measured",
    "x_law": "covariate law: 'gaussian' (the study) or 'rademacher'",
    "trainer": "'pairs' (antithetic partners summed first: the off-block gradient cancels exactly) or 'simple' "
               "(training.train; its rounding seeds a GD instability of the block structure at small tau)",
    "root_seed": "root of every cell's random generator",
}

# Predeclared criteria (SPEC C2, threshold study), stored in the results file's attrs.
# "fixed" exponent: log-log slope in L of the seed-mean gap at t = 0; "uniform" exponent: slope of
# the seed-mean of sup_t g_L(t). The break is the threshold (hinge) regression of the uniform
# exponent on tau (or log tau), weighted by 1/SE^2 (analysis/c2_threshold.py).
CRITERIA = [
    {"id": "C2T-fixed-exponent", "claim": "C2",
     "description": "fixed-parameter exponent (slope in L of the seed-mean gap at t = 0), every tau",
     "kind": "in", "threshold": [-0.65, -0.35], "reference": "near -1/2 at every tau (C2, Sigma = I: -0.526)"},
    {"id": "C2T-uniform-low-tau", "claim": "C2",
     "description": "uniform exponent (slope in L of the seed-mean sup_t gap) at the smallest tau: no convergence",
     "kind": ">", "threshold": -0.1, "reference": "+0.000 +- 0.029 (tau = 0.75)"},
    {"id": "C2T-uniform-high-tau", "claim": "C2",
     "description": "uniform exponent at the largest tau: uniform convergence",
     "kind": "<", "threshold": -0.25, "reference": "-0.386 (tau = 14.81)"},
    {"id": "C2T-uniform-trend", "claim": "C2",
     "description": "Spearman rank correlation of the uniform exponent with tau (monotone decrease)",
     "kind": "<=", "threshold": -0.8, "reference": "monotone (rank correlation -1)"},
    {"id": "C2T-separation-low-tau", "claim": "C2",
     "description": "uniform minus fixed-parameter exponent at the smallest tau",
     "kind": ">", "threshold": 0.2, "reference": "about +0.5 (0.000 vs about -1/2)"},
    {"id": "C2T-break-location", "claim": "C2",
     "description": "break (tau units) of the threshold regression of the uniform exponent",
     "kind": "in", "threshold": [2.0, 8.0], "reference": "near 4"},
    {"id": "C2T-break-covers-4", "claim": "C2",
     "description": "1 if the 95% LR confidence set of the break contains tau = 4, else 0",
     "kind": ">=", "threshold": 1.0, "reference": "(expected: tau = 4)"},
]


def _int(config, key, lo=1):
    val = config[key]
    if isinstance(val, bool) or not isinstance(val, (int, np.integer)) or val < lo:
        raise ValueError(f"{key} must be an integer >= {lo}, got {val!r}")
    return int(val)


def validate(config):
    """Raise ValueError for an inconsistent configuration, or one the analysis cannot use (checked
    before any work: at least 3 prompt lengths for the exponents, 6 tau values for the hinge)."""
    for key in ("d", "n_seeds", "n_pairs", "n_queries", "n_replicates", "ckpt_every"):
        _int(config, key)
    _int(config, "n_steps", 0)
    Ls = check_prompt_lengths(config["L"])
    if len(Ls) < 3:
        raise ValueError(f"L needs at least 3 prompt lengths (the exponents are log-log slopes in L), got {Ls.tolist()}")
    tau = np.asarray(config["tau"], dtype=float)
    if tau.ndim != 1 or tau.size == 0 or not np.all(np.isfinite(tau)) or np.any(tau <= 0):
        raise ValueError(f"tau must be a non-empty list of positive numbers, got {config['tau']}")
    if np.any(np.diff(tau) <= 0):
        raise ValueError(f"tau must be strictly increasing, got {config['tau']}")
    if tau.size < 6:
        raise ValueError(f"tau needs at least 6 values for the threshold regression (a 3-parameter hinge of the "
                         f"uniform exponent in tau), got {tau.tolist()}")
    lr = float(config["lr"])
    if not (math.isfinite(lr) and lr > 0):
        raise ValueError(f"lr must be a positive number, got {config['lr']}")
    checkpoint_steps(int(config["n_steps"]), int(config["ckpt_every"]))
    if config["x_law"] not in X_LAWS:
        raise ValueError(f"x_law must be one of {X_LAWS}, got {config['x_law']!r}")
    if config["trainer"] not in TRAINERS:
        raise ValueError(f"trainer must be one of {TRAINERS}, got {config['trainer']!r}")


def sigma_scale(tau, d):
    """``s`` of ``Sigma = s I_d`` with ``tr(Sigma^-2) = tau``: ``sqrt(d / tau)``."""
    return math.sqrt(d / float(tau))


def grid(config):
    return {"tau": [float(t) for t in config["tau"]], "seed": list(range(config["n_seeds"]))}


def inner_coords(config):
    D = int(config["d"]) + 1
    return {"L": list(config["L"]), "t": checkpoint_steps(int(config["n_steps"]), int(config["ckpt_every"])).tolist(),
            "row": list(range(D)), "col": list(range(D))}


def kernel(cell, rng, config):
    d, tau = int(config["d"]), float(cell["tau"])
    s = sigma_scale(tau, d)
    Sigma = s * np.eye(d)
    out = gradient_gap_trajectory(
        rng, Sigma, [int(L) for L in config["L"]], n_pairs=int(config["n_pairs"]),
        n_queries=int(config["n_queries"]), n_replicates=int(config["n_replicates"]), lr=float(config["lr"]),
        n_steps=int(config["n_steps"]), ckpt_every=int(config["ckpt_every"]), x_law=config["x_law"],
        trainer=config["trainer"], label=f"{NAME}[tau={tau:g}, seed={cell['seed']}]")
    return {
        "g": out["g"],
        "g_risk": out["g_risk"],
        "risk_inf": out["risk_inf"],
        "dist_bayes": out["dist_bayes"],
        "logit_factor": out["logit_factor"],
        "off_block": icl.off_block_mass(out["U_inf"], out["v_inf"]),
        "U_inf": out["U_inf"],
        "v_inf": out["v_inf"],
        "s": np.float64(s),
        "concentration_constant": np.float64(concentration_constant(Sigma)),
    }


VARIABLES = (
    Variable("g", ("tau", "seed", "L", "t"), "gradient gap g_L(t) along the linear(inf) trajectory",
             "sqrt(mean over prompt replicates and tasks of ||grad R_L^task - grad R_inf^task||^2) at theta_inf(t), "
             "R^task one task's risk (mean over its queries) of softmax(L) resp. linear(inf), norm joint in (U, v)"),
    Variable("g_risk", ("tau", "seed", "L", "t"), "gradient gap of the training risk",
             "sqrt(mean over prompt replicates of ||grad R_L - grad R_inf||^2) at theta_inf(t), R the mean over "
             "all tasks and queries (task noise averages out before the norm; diagnostic)"),
    Variable("risk_inf", ("tau", "seed", "t"), "training risk of linear(inf)",
             "mean over tasks and queries of 1/2 (v^T Gamma_w U z_q - y_q)^2 at the checkpoint"),
    Variable("dist_bayes", ("tau", "seed", "t"), "distance of theta_inf(t) to the Bayes optimum",
             "sqrt(||U - U*||_F^2 + ||v - v*||^2), (U*, v*) of Remark 5.2 (balanced manifold)"),
    Variable("logit_factor", ("tau", "seed", "t"), "empirical logit factor exp(a^T Gamma_w a)",
             "mean over tasks and queries of exp(a^T Gamma_w a), a = U z_q, at theta_inf(t): the exponential "
             "factor of the finite-L constant (SPEC section 1)"),
    Variable("off_block", ("tau", "seed", "t"), "off-block mass of theta_inf(t)",
             "norm of U outside its top-left d x d block together with v[:d] (measured, never imposed)"),
    Variable("U_inf", ("tau", "seed", "t", "row", "col"), "attention matrix U of linear(inf)",
             "gradient-descent iterate with Gamma_w at the checkpoint"),
    Variable("v_inf", ("tau", "seed", "t", "row"), "read-out vector v of linear(inf)",
             "gradient-descent iterate with Gamma_w at the checkpoint"),
    Variable("s", ("tau", "seed"), "covariate variance s (Sigma = s I_d)",
             "s = sqrt(d / tau), so that tr(Sigma^-2) = tau (the same for every seed)"),
    Variable("concentration_constant", ("tau", "seed"), "query-averaged concentration constant at the Bayes optimum",
             "(1 - 2 tau^{-1/2})^{-d/2} = E exp(x_q^T Sigma^-1 x_q / c^2); +inf by design for tau <= 4 "
             "(the expectation diverges); the same for every seed", allow_nonfinite=True),
)

EXPERIMENT = Experiment(name=NAME, grid=grid, inner_coords=inner_coords, variables=VARIABLES, kernel=kernel,
                        description="C2 threshold: uniform-in-time gradient stability vs tau = tr(Sigma^-2)",
                        grid_keys=("tau", "n_seeds"))
