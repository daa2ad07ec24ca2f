"""C2 threshold: uniform-in-time stability of the softmax gradient against ``tau = tr(Sigma^-2)``, a variant of the
C2 family. Main grid ``tau x seed``: a gap run at ``Sigma = s I_d``, ``s = sqrt(d / tau)``; part ``families``: the
same at ``covariance.scaled(from_spec(family, d), tau)``; the constants parts: the gradient-gap constant ``K`` and
the summary figures of each ``Sigma``. The protocol: docs/protocols.md, "c2_threshold"."""
from __future__ import annotations

import math

import numpy as np

from sfxlin import covariance, laws
from sfxlin.engine import Cells, Param, Profiles, Variable
from sfxlin.engine.sensitivity import DEFAULT_EPS, param as amplification_param
from sfxlin.gradient_gap import concentration_constant, gap_constant
from sfxlin.training import checkpoint_steps

from .families.c2 import C2, gap_run, run_counts, run_of

NAME = "c2_threshold"
TAU_MAX = 3.0 / 0.45**2   # 14.8148: s = 0.45 (and tau = 0.75 is s = 2), as in the reference sweep


def _tau_grid(lo, hi, n):
    return [round(float(x), 4) for x in np.geomspace(lo, hi, n)]


def _x_law_serves(config):
    """``x_law`` names a covariate law with a covariance ``Sigma`` on ``R^d`` (ValueError ``"x_law: ..."``)."""
    try:
        laws.covariate_law(config["x_law"], np.eye(config["d"]), d=config["d"])
    except ValueError as exc:
        raise ValueError(f"x_law: {exc}") from None


def sigma_scale(tau, d):
    """``s`` of ``Sigma = s I_d`` with ``tr(Sigma^-2) = tau``: ``sqrt(d / tau)``."""
    return math.sqrt(d / float(tau))


def family_sigma(family, tau, d):
    """``Sigma`` of a families cell: ``covariance.scaled(covariance.from_spec(family, d), tau)``."""
    return covariance.scaled(covariance.from_spec(family, d), float(tau))


#: the family's gap-run parameters the families part names its own
FAMILY_RUN = {"n_steps": "family_steps", "ckpt_every": "family_ckpt_every"}


def kernel(cell, rng, config):
    d, tau = config["d"], cell["tau"]
    s = sigma_scale(tau, d)
    Sigma = s * np.eye(d)
    out = gap_run(rng, Sigma, config["L"], f"{NAME}[tau={tau:g}, seed={cell['seed']}]",
                  **run_of(config))
    return {**out, "s": np.float64(s), "concentration_constant": np.float64(concentration_constant(Sigma))}


def family_kernel(cell, rng, config):
    """The main kernel's run at ``Sigma = family_sigma(family, tau, d)`` for ``family_steps`` steps."""
    out = gap_run(rng, family_sigma(cell["family"], cell["tau"], config["d"]), config["L"],
                  f"{NAME}[family={cell['family']}, tau={cell['tau']:g}, family_seed={cell['family_seed']}]",
                  **run_of(config, **FAMILY_RUN))
    return {"g_family": out["g"], "dist_bayes_family": out["dist_bayes"], "off_block_family": out["off_block"]}


def constants_inputs(config, cell):
    """What reaches a constants cell: the dimension, the queries per task (the constant averages
    over a task's queries), the Monte Carlo budget and the root seed (its draws)."""
    return {k: config[k] for k in ("d", "n_queries", "gap_samples", "root_seed")}


def constants_kernel(cell, rng, inputs):
    """Gradient-gap constant ``K`` (and its Monte Carlo SE) of the isotropic ``Sigma = s I_d``."""
    d = inputs["d"]
    K, se = gap_constant(sigma_scale(cell["tau"], d) * np.eye(d), inputs["n_queries"], rng, inputs["gap_samples"])
    return {"gap_constant": np.float64(K), "gap_constant_se": np.float64(se)}


def family_constants_kernel(cell, rng, inputs):
    """Summary figures, concentration constant and gradient-gap constant of one family at one tau."""
    Sigma = family_sigma(cell["family"], cell["tau"], inputs["d"])
    K, se = gap_constant(Sigma, inputs["n_queries"], rng, inputs["gap_samples"])
    fig = covariance.summary(Sigma)
    return {**{f"family_{k}": np.float64(fig[k]) for k in covariance.SUMMARY_KEYS},
            "concentration_constant_family": np.float64(concentration_constant(Sigma)),
            "gap_constant_family": np.float64(K), "gap_constant_family_se": np.float64(se)}


def counts(config, part, cell):
    """A gap run per main and families cell (:func:`~sfxlin.pipelines.families.c2.run_counts`), a cell
    for a constants cell."""
    if part in ("", "families"):
        return run_counts(config["L"], **run_of(config, **(FAMILY_RUN if part else {})))
    return {"cell": 1}


_INF = "; +inf by design for tau <= 4 (the expectation diverges)."
_FC = "family_constants"
OWN = {
    "s": Variable("s", (), "covariate variance s (Sigma = s I_d)", "s = sqrt(d / tau), so that tr(Sigma^-2) = tau "
                  "(the same for every seed)."),
    "concentration_constant": Variable("concentration_constant", (), "query-averaged concentration constant at the "
                                       "Bayes optimum", "(1 - 2 tau^{-1/2})^{-d/2} = E exp(x_q^T Sigma^-1 x_q / "
                                       "c^2); +inf by design for tau <= 4 (the expectation diverges); the same for "
                                       "every seed.", allow_nonfinite=True),
    "g_family": Variable("g_family", ("L", "t_family"), "gradient gap g_L(t) for a covariance family",
                         "as g, with Sigma = covariance.scaled(from_spec(family, d), tau)."),
    "dist_bayes_family": Variable("dist_bayes_family", ("t_family",), "distance of theta_inf(t) to the Bayes "
                                  "optimum (family)", "as dist_bayes, for the family's Sigma."),
    "off_block_family": Variable("off_block_family", ("t_family",), "off-block mass of theta_inf(t) (family)",
                                 "as off_block, for the family's Sigma."),
    _FC: (Variable("family_trace", (), "trace of Sigma", "covariance.summary: sum of the eigenvalues."),
          Variable("family_op_norm", (), "operator norm of Sigma", "covariance.summary: largest eigenvalue."),
          Variable("family_condition", (), "condition number of Sigma", "covariance.summary: largest / smallest "
                   "eigenvalue (scale-free: the same at every tau)."),
          Variable("family_tr_inv2", (), "tr(Sigma^-2) of the family's Sigma", "covariance.summary: sum of "
                   "eigenvalue^-2; equals tau by construction (covariance.scaled)."),
          Variable("concentration_constant_family", (), "query-averaged concentration constant (family)",
                   "(1 - 2 tau^{-1/2})^{-d/2}, the same for every Sigma with tr(Sigma^-2) = tau" + _INF,
                   allow_nonfinite=True),
          Variable("gap_constant_family", (), "gradient-gap constant K (family)",
                   "gradient_gap.gap_constant of the family's Sigma" + _INF, allow_nonfinite=True),
          Variable("gap_constant_family_se", (), "Monte Carlo standard error of gap_constant_family",
                 "0 where K = +inf.")),
}

EXPERIMENT = C2.variant(
    NAME, short="c2_threshold", analysis="sfxlin.analysis.c2_threshold",
    values=dict(d=3, L=Profiles(quick=[2**k for k in range(3, 10)], paper=[2**k for k in range(3, 13)]),
                n_seeds=Profiles(quick=1, paper=20), n_pairs=Profiles(quick=4, paper=48), n_queries=2,
                n_replicates=Profiles(quick=2, paper=6), lr=0.01, n_steps=Profiles(quick=200, paper=2500),
                ckpt_every=Profiles(quick=50, paper=100), x_law="gaussian", trainer="pairs", root_seed=20251211),
    params=(
        Param("tau", "float_list", "values of tau = tr(Sigma^-2); the threshold is tau = 4",
              Profiles(quick=_tau_grid(0.75, TAU_MAX, 6), paper=_tau_grid(0.75, TAU_MAX, 14)), low=0, low_open=True,
              order="increasing", min_len=6, why="the threshold regression fits a hinge in tau", grid=True),
        Param("families", "str_list", "covariance families (sfxlin.covariance spec strings) swept beside the "
              "isotropic one, each rescaled to every tau: Sigma = covariance.scaled(from_spec(family, d), tau)",
              Profiles(quick=["kms:0.5"], paper=["kms:0.5", "power_law:1.0"]), grid=True, parts=("families", _FC)),
        Param("n_family_seeds", "int", "independent replicates per (family, tau) of the families part",
              Profiles(quick=1, paper=6), low=1, grid=True, parts=("families",)),
        Param("family_steps", "int", "gradient-descent steps of the families part (a multiple of "
              "family_ckpt_every): anisotropic Sigma converge more slowly along their small eigenvalues",
              Profiles(quick=200, paper=10000), unit="steps", low=0, parts=("families",)),
        Param("family_ckpt_every", "int", "steps between checkpoints of the families part",
              Profiles(quick=50, paper=400), unit="steps", low=1, parts=("families",)),
        Param("gap_samples", "int", "Monte Carlo draws of the polynomial moments of the gradient-gap constant "
              "(gradient_gap.gap_constant; its exponential factors are exact)", Profiles(quick=2**14, paper=2**18),
              low=2, parts=("constants", _FC)),
        amplification_param(Profiles(quick=0.0, paper=DEFAULT_EPS))),
    cells=(Cells({"tau": "tau", "seed": "n_seeds"}, kernel,
                 ("g", "g_risk", "risk_inf", "dist_bayes", "logit_factor", "off_block", "U_inf", "v_inf", OWN["s"],
                  OWN["concentration_constant"]), perturbed=True),
           Cells({"family": "families", "tau": "tau", "family_seed": "n_family_seeds"}, family_kernel,
                 (OWN["g_family"], OWN["dist_bayes_family"], OWN["off_block_family"]), name="families", perturbed=True),
           Cells({"tau": "tau"}, constants_kernel, ("gap_constant", "gap_constant_se"), name="constants",
                 inputs=constants_inputs),
           Cells({"family": "families", "tau": "tau"}, family_constants_kernel, OWN[_FC], name=_FC,
                 inputs=constants_inputs)),
    coords={"t": lambda c: checkpoint_steps(c["n_steps"], c["ckpt_every"]).tolist(),
            "t_family": lambda c: checkpoint_steps(c["family_steps"], c["family_ckpt_every"]).tolist()},
    checks=(covariance.spec_check("families"), _x_law_serves), cost=C2.cost.counting(counts),
    title="C2: uniform-in-time stability and the tr(Sigma^-2) > 4 threshold",
    description="C2 threshold: uniform-in-time gradient stability vs tau = tr(Sigma^-2)")
