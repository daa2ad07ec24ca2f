"""The C2 family: concentration of softmax attention and the gradient gap ``g_L(t)`` along the linear(inf)
training trajectory (docs/claims.md, C2; the models: docs/models.md, section 2; the protocols:
docs/protocols.md). Its shared cell is one gap run (:func:`gap_run`); its covariances are
``sfxlin.covariance`` specs (:data:`SETTINGS`)."""
from __future__ import annotations

from sfxlin import covariance, icl
from sfxlin.engine import Param, Variable
from sfxlin.engine.family import Cost, Family, multiples
from sfxlin.engine.sensitivity import step_perturbation
from sfxlin.gradient_gap import TRAINERS, gradient_gap_trajectory

#: the covariate settings of the gradient and trajectory tests: setting -> covariance spec
SETTINGS = {"isotropic": "isotropic", "anisotropic": "geometric:2:0.5"}


def setting_covariance(setting, d, scale=1.0):
    """``scale`` times the covariance of ``setting`` (:data:`SETTINGS`) in dimension ``d``."""
    return scale * covariance.from_spec(SETTINGS[setting], d)


def gap_run(rng, Sigma, Ls, label, **run):
    """One run of :func:`sfxlin.gradient_gap.gradient_gap_trajectory` (``run``: its keywords) as the family's
    outputs: ``g``, ``g_risk`` ``(L, t)``; ``risk_inf``, ``dist_bayes``, ``logit_factor``, ``off_block``
    ``(t,)``; ``U_inf`` ``(t, row, col)``, ``v_inf`` ``(t, row)``. Its training takes the engine's step
    perturbation in an amplification run (a part of gap runs declares ``perturbed=True``)."""
    out = gradient_gap_trajectory(rng, Sigma, list(Ls), label=label, perturb=step_perturbation(), **run)
    keep = ("g", "g_risk", "risk_inf", "dist_bayes", "logit_factor", "U_inf", "v_inf")
    return {**{k: out[k] for k in keep}, "off_block": icl.off_block_mass(out["U_inf"], out["v_inf"])}


#: the keywords of a :func:`gap_run` that are the family's parameters (``x_law``, ``trainer``: where a variant
#: declares them, else the run's defaults)
RUN = ("n_pairs", "n_queries", "n_replicates", "lr", "n_steps", "ckpt_every")


def run_of(config, **names):
    """The keywords of a :func:`gap_run` from ``config``: each of :data:`RUN` under its own name or under
    the variant's name for it in ``names`` (``n_pairs="traj_pairs"``), ``x_law`` and ``trainer`` where declared."""
    return {k: config[names.get(k, k)] for k in RUN} | {k: config[k] for k in ("x_law", "trainer") if k in config}


def run_counts(Ls, n_pairs, n_queries, n_replicates, n_steps, ckpt_every, **rest):
    """The work of one :func:`gap_run` (``rest``: its keywords that do not change it) in the family's units:
    at each checkpoint and prompt set, a prefix pass over the ``L_max`` tokens of every pair and query; a
    linear(inf) step per step; one call."""
    visits = n_replicates * (n_steps // ckpt_every + 1) * n_pairs * n_queries * max(Ls)
    return {"gap_visit": visits, "step": n_steps, "cell": 1}


PARAMS = (
    Param("d", "int", "covariate (token) dimension d", 3, low=1),
    Param("n_pairs", "int", "antithetic task pairs (w, -w) per cell", 4, low=1),
    Param("n_queries", "int", "query points per task", 2, low=1),
    Param("n_replicates", "int", "independent prompt sets per cell for the gap (same tasks and queries)", 2, low=1),
    Param("lr", "float", "gradient-descent step size of linear(inf)", 0.01, low=0, low_open=True),
    Param("n_steps", "int", "gradient-descent steps T (a multiple of ckpt_every)", 200, unit="steps", low=0),
    Param("ckpt_every", "int", "steps between checkpoints at which the gap is measured", 50, unit="steps", low=1),
    Param("x_law", "str", "covariate law with covariance Sigma, a spec of sfxlin.laws.covariate_law: 'gaussian' "
          "(the study), 'rademacher', 'uniform', 'student_t:DF' (DF > 2), 'gaussian_mixture:SPREAD'", "gaussian"),
    Param("trainer", "str", "'pairs' (antithetic partners summed first: the off-block gradient cancels exactly) or "
          "'simple' (training.train; its rounding seeds a GD instability of the block structure at small tau)",
          "pairs", choices=TRAINERS),
)

_INF = "; +inf by design for tau <= 4 (the expectation diverges)."
OUTPUTS = (
    Variable("g", ("L", "t"), "gradient gap g_L(t) along the linear(inf) trajectory", "sqrt(mean over prompt "
             "replicates and tasks of ||grad R_L^task - grad R_inf^task||^2) at theta_inf(t), R^task one task's "
             "risk (mean over its queries) of softmax(L) resp. linear(inf), norm joint in (U, v)."),
    Variable("g_risk", ("L", "t"), "gradient gap of the training risk", "sqrt(mean over prompt replicates of ||grad "
             "R_L - grad R_inf||^2) at theta_inf(t), R the mean over all tasks and queries (task noise averages out "
             "before the norm; diagnostic)."),
    Variable("risk_inf", ("t",), "training risk of linear(inf)", "mean over tasks and queries of 1/2 (v^T Gamma_w U "
             "z_q - y_q)^2 at the checkpoint."),
    Variable("dist_bayes", ("t",), "distance of theta_inf(t) to the Bayes optimum", "sqrt(||U - U*||_F^2 + ||v - "
             "v*||^2), (U*, v*) of Remark 5.2 (balanced manifold)."),
    Variable("logit_factor", ("t",), "empirical logit factor exp(a^T Gamma_w a)", "mean over tasks and queries of "
             "exp(a^T Gamma_w a), a = U z_q, at theta_inf(t): the exponential factor of the finite-L constant "
             "(docs/models.md, section 1)."),
    Variable("off_block", ("t",), "off-block mass of theta_inf(t)", "norm of U outside its top-left d x d block "
             "together with v[:d] (measured, never imposed)."),
    Variable("U_inf", ("t", "row", "col"), "attention matrix U of linear(inf)", "gradient-descent iterate with "
             "Gamma_w at the checkpoint."),
    Variable("v_inf", ("t", "row"), "read-out vector v of linear(inf)", "gradient-descent iterate with Gamma_w at "
             "the checkpoint."),
    Variable("gap_constant", (), "gradient-gap constant K = lim L E g_L^2 at the Bayes optimum",
           "gradient_gap.gap_constant(s I_d, n_queries): exponential factors exact, polynomial moments by Monte Carlo "
           "(gap_samples draws)" + _INF, allow_nonfinite=True),
    Variable("gap_constant_se", (), "Monte Carlo standard error of gap_constant", "0 where K = +inf."),
)

#: the family's cost model: seconds per unit on the reference machine (docs/performance.md, "Cost models")
RATES = {"gap_visit": 1.8e-8, "step": 5.8e-5, "cell": 0.0098, "tail_visit": 7.7e-8, "clt_draw": 1.5e-7,
         "grad_visit": 1.2e-8, "gradient": 1.6e-4}

C2 = Family("C2", PARAMS, OUTPUTS,
            coords={"L": lambda c: c["L"], "row": lambda c: range(c["d"] + 1), "col": lambda c: range(c["d"] + 1)},
            checks=(multiples(("n_steps", "ckpt_every"), ("family_steps", "family_ckpt_every"),
                              ("traj_steps", "traj_ckpt_every")),),
            cost=Cost(RATES, lambda config, part, cell: {"cell": 1}))
