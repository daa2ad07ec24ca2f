"""C2 threshold study: uniform-in-time stability of the softmax gradient vs tr(Sigma^-2).

docs/models.md, section 2: at the Bayes optimum the query-averaged concentration constant
``E exp(x_q^T Sigma^-1 x_q / c^2) = (1 - 2 tau^{-1/2})^{-d/2}``, ``tau = tr(Sigma^-2)``, is finite
iff ``tau > 4``. Claim C2 ("threshold study", docs/claims.md): sweeping ``tau`` moves the exponent of the gradient
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

Families part (``family x tau x family_seed``): the same cell with ``Sigma = covariance.scaled(
covariance.from_spec(family, d), tau)`` (KMS(0.5) and a power-law spectrum in the paper profile), every family on the
same tau grid, trained for ``family_steps`` (10,000: anisotropic Sigma converge more slowly along their small
eigenvalues) with checkpoints every ``family_ckpt_every`` (400, so the same 26 checkpoints and the same gap cost).
The theory's threshold depends on Sigma through tau alone; the families part asks whether the uniform exponents do.
Constants parts (``tau``; ``family x tau``): the summary figures of each Sigma (``covariance.summary``) and the
gradient-gap constant ``K = lim L E g_L^2`` at the Bayes optimum (``stability.gap_constant``, docs/models.md), which
the analysis compares with ``L g_L(T)^2`` at the end of training.

Paper profile: 14 values of tau log-spaced over [0.75, 14.81] (8 below 4, 6 above), 10 seeds,
48 pairs x 2 queries, L = 8..4096, lr 0.01, T = 2500, gap every 100 steps (26 checkpoints),
6 prompt replicates per cell. Choices: g_L(t) is smooth in t (it rises and plateaus as theta_inf
converges), so 100-step checkpoints lose nothing for the sup; the exponents' noise comes mostly
from the tasks and queries of a seed (heavy-tailed per-query constants), so the budget goes to
seeds rather than prompt replicates. Families: 3 seeds each (84 cells): the families criterion compares means over
the 14 tau, whose noise 3 seeds already make small (docs/criteria.md), at about 60% more CPU than the isotropic
sweep alone. Measured before the families: 113 s CPU for the 140 cells (0.8 s per cell), 150 s
wall on this 2-core machine while other jobs kept its load average at 5-6 (about 60 s expected
when idle).
"""
from __future__ import annotations

import math

import numpy as np

from sfxlin import covariance, icl, laws
from sfxlin.engine.params import Param, Profiles
from sfxlin.stability import TRAINERS, concentration_constant, gap_constant, gradient_gap_trajectory
from sfxlin.engine.sweep import Experiment, Part, Variable
from sfxlin.training import checkpoint_steps

NAME = "c2_threshold"


def _tau_grid(lo, hi, n):
    return [round(float(x), 4) for x in np.geomspace(lo, hi, n)]


TAU_MAX = 3.0 / 0.45**2   # 14.8148: s = 0.45 (and tau = 0.75 is s = 2), as in the reference sweep

PARAMS = (
    Param("d", "int", "covariate dimension; Sigma = s I_d with s = sqrt(d / tau)", 3, low=1),
    Param("tau", "float_list", "values of tau = tr(Sigma^-2); the threshold is tau = 4", Profiles(quick=_tau_grid(0.75, TAU_MAX, 6), paper=_tau_grid(0.75, TAU_MAX, 14)),
          low=0, low_open=True, order="increasing", min_len=6,
          why="the threshold regression fits a hinge in tau", grid=True),
    Param("L", "int_list", "nested prompt lengths",
          Profiles(quick=[2**k for k in range(3, 10)], paper=[2**k for k in range(3, 13)]), unit="tokens",
          low=1, order="increasing", min_len=3,
          why="the analysis fits log-log slopes in L"),
    Param("n_seeds", "int", "independent replicates (tasks, queries, prompts) per tau", Profiles(quick=1, paper=10),
          low=1, grid=True),
    Param("n_pairs", "int", "antithetic task pairs (w, -w) per cell", Profiles(quick=4, paper=48), low=1),
    Param("n_queries", "int", "query points per task", 2, low=1),
    Param("n_replicates", "int", "independent prompt sets per cell for the gap (same tasks and queries)",
          Profiles(quick=2, paper=6), low=1),
    Param("lr", "float", "gradient-descent step size of linear(inf)", 0.01, low=0, low_open=True),
    Param("n_steps", "int", "gradient-descent steps T (a multiple of ckpt_every)", Profiles(quick=200, paper=2500),
          unit="steps", low=0),
    Param("ckpt_every", "int", "steps between checkpoints at which the gap is measured", Profiles(quick=50, paper=100),
          unit="steps", low=1),
    Param("x_law", "str", "covariate law with covariance Sigma, a spec of sfxlin.laws.covariate_law: 'gaussian' (the "
          "study), 'rademacher', 'uniform', 'student_t:DF' (DF > 2), 'gaussian_mixture:SPREAD'", "gaussian"),
    Param("trainer", "str", "'pairs' (antithetic partners summed first: the off-block gradient cancels exactly) or "
          "'simple' (training.train; its rounding seeds a GD instability of the block structure at small tau)",
          "pairs", choices=TRAINERS),
    Param("root_seed", "int", "root of every cell's random generator", 20251211),
    Param("families", "str_list", "covariance families (sfxlin.covariance spec strings) swept beside the isotropic "
          "one, each rescaled to every tau: Sigma = covariance.scaled(from_spec(family, d), tau)",
          Profiles(quick=["kms:0.5"], paper=["kms:0.5", "power_law:1.0"]), grid=True, parts=("families", "family_constants")),
    Param("n_family_seeds", "int", "independent replicates per (family, tau) of the families part",
          Profiles(quick=1, paper=3), low=1, grid=True, parts=("families",)),
    Param("family_steps", "int", "gradient-descent steps of the families part (a multiple of family_ckpt_every): "
          "anisotropic Sigma converge more slowly along their small eigenvalues", Profiles(quick=200, paper=10000),
          unit="steps", low=0, parts=("families",)),
    Param("family_ckpt_every", "int", "steps between checkpoints of the families part",
          Profiles(quick=50, paper=400), unit="steps", low=1, parts=("families",)),
    Param("gap_samples", "int", "Monte Carlo draws of the polynomial moments of the gradient-gap constant "
          "(stability.gap_constant; its exponential factors are exact)", Profiles(quick=2**14, paper=2**18),
          low=2, parts=("constants", "family_constants")),
)


def _steps_fit_checkpoints(config):
    for steps, every in (("n_steps", "ckpt_every"), ("family_steps", "family_ckpt_every")):
        if config[steps] % config[every]:
            raise ValueError(f"{steps}: {config[steps]} must be a multiple of {every} = {config[every]}")


def _x_law_serves(config):
    """``x_law`` names a covariate law with a covariance ``Sigma`` on ``R^d`` (ValueError ``"x_law: ..."``)."""
    try:
        laws.covariate_law(config["x_law"], np.eye(config["d"]), d=config["d"])
    except ValueError as exc:
        raise ValueError(f"x_law: {exc}") from None


def sigma_scale(tau, d):
    """``s`` of ``Sigma = s I_d`` with ``tr(Sigma^-2) = tau``: ``sqrt(d / tau)``."""
    return math.sqrt(d / float(tau))


def grid(config):
    return {"tau": list(config["tau"]), "seed": list(range(config["n_seeds"]))}


def family_grid(config):
    """One trajectory cell per (family, tau, family_seed)."""
    return {"family": list(config["families"]), "tau": list(config["tau"]),
            "family_seed": list(range(config["n_family_seeds"]))}


def constants_grid(config):
    """One gap-constant cell per tau (isotropic Sigma)."""
    return {"tau": list(config["tau"])}


def family_constants_grid(config):
    """One constants cell per (family, tau)."""
    return {"family": list(config["families"]), "tau": list(config["tau"])}


def constants_inputs(config, cell):
    """What reaches a constants cell: the dimension, the queries per task (the constant averages
    over a task's queries), the Monte Carlo budget and the root seed (its draws)."""
    return {k: config[k] for k in ("d", "n_queries", "gap_samples", "root_seed")}


def family_sigma(family, tau, d):
    """``Sigma`` of a families cell: ``covariance.scaled(covariance.from_spec(family, d), tau)``."""
    return covariance.scaled(covariance.from_spec(family, d), float(tau))


def inner_coords(config):
    D = config["d"] + 1
    return {"L": list(config["L"]), "t": checkpoint_steps(config["n_steps"], config["ckpt_every"]).tolist(),
            "row": list(range(D)), "col": list(range(D)),
            "t_family": checkpoint_steps(config["family_steps"], config["family_ckpt_every"]).tolist()}


def kernel(cell, rng, config):
    d, tau = config["d"], cell["tau"]
    s = sigma_scale(tau, d)
    Sigma = s * np.eye(d)
    out = gradient_gap_trajectory(
        rng, Sigma, list(config["L"]), n_pairs=config["n_pairs"], n_queries=config["n_queries"],
        n_replicates=config["n_replicates"], lr=config["lr"], n_steps=config["n_steps"],
        ckpt_every=config["ckpt_every"], x_law=config["x_law"], trainer=config["trainer"],
        label=f"{NAME}[tau={tau:g}, seed={cell['seed']}]")
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


def family_kernel(cell, rng, config):
    """The isotropic kernel's trajectory and gap for ``Sigma = family_sigma(family, tau, d)``, trained for
    ``family_steps`` steps with checkpoints every ``family_ckpt_every`` (coordinate ``t_family``)."""
    Sigma = family_sigma(cell["family"], cell["tau"], config["d"])
    out = gradient_gap_trajectory(
        rng, Sigma, list(config["L"]), n_pairs=config["n_pairs"], n_queries=config["n_queries"],
        n_replicates=config["n_replicates"], lr=config["lr"], n_steps=config["family_steps"],
        ckpt_every=config["family_ckpt_every"], x_law=config["x_law"], trainer=config["trainer"],
        label=f"{NAME}[family={cell['family']}, tau={cell['tau']:g}, family_seed={cell['family_seed']}]")
    return {"g_family": out["g"], "dist_bayes_family": out["dist_bayes"],
            "off_block_family": icl.off_block_mass(out["U_inf"], out["v_inf"])}


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


def trajectory_work(Ls, n_pairs, n_queries, n_replicates, n_steps, ckpt_every):
    """Work of one :func:`sfxlin.stability.gradient_gap_trajectory` call, in token visits of its gap
    (also the trajectory part of ``c2_concentration``): at each of the ``n_steps / ckpt_every + 1``
    checkpoints and for each prompt set, one prefix pass over the ``L_max`` tokens of every pair and
    query; each gradient step of ``linear(inf)`` costs ``STEP_WORK`` of them (it reads no token), a
    call ``CALL_WORK`` (the tasks, the Bayes optimum, the logit factors)."""
    checkpoints = n_steps // ckpt_every + 1
    return n_replicates * checkpoints * n_pairs * n_queries * max(Ls) + STEP_WORK * n_steps + CALL_WORK


#: :func:`trajectory_work`'s constants: warm CPU seconds of 9 calls (``n_pairs`` 4 .. 48, ``L_max`` 256 .. 4096,
#: ``n_steps`` 200 .. 5000, checkpoints every 50 .. 1000 steps, 1 .. 6 prompt sets; d = 3) fitted (least relative
#: squares) to 1.8e-8 s per token visit + 5.8e-5 s per step + 0.0098 s: every call within 0.63 .. 1.24 of it
STEP_WORK = 3_200
CALL_WORK = 540_000


def cell_work(config, part):
    """Work of one cell of ``part`` in its non-grid parameters (``sfxlin run --plan``'s cost law,
    :mod:`sfxlin.engine.plan`; the grid dims' costs are fitted): the main and families parts are one
    :func:`trajectory_work` each (the families with ``family_steps`` and ``family_ckpt_every``). The
    constants parts draw ``gap_samples`` Monte Carlo moments: None (a few milliseconds a cell, what they
    cost in the paper file)."""
    common = (config["L"], config["n_pairs"], config["n_queries"], config["n_replicates"])
    if part == "":
        return trajectory_work(*common, config["n_steps"], config["ckpt_every"])
    if part == "families":
        return trajectory_work(*common, config["family_steps"], config["family_ckpt_every"])
    return None


_FAM = ("family", "tau", "family_seed")
_INF_NOTE = "; +inf by design for tau <= 4 (the expectation diverges)."

VARIABLES = (
    Variable("g", ("tau", "seed", "L", "t"), "gradient gap g_L(t) along the linear(inf) trajectory",
             "sqrt(mean over prompt replicates and tasks of ||grad R_L^task - grad R_inf^task||^2) at theta_inf(t), "
             "R^task one task's risk (mean over its queries) of softmax(L) resp. linear(inf), norm joint in (U, v)."),
    Variable("g_risk", ("tau", "seed", "L", "t"), "gradient gap of the training risk",
             "sqrt(mean over prompt replicates of ||grad R_L - grad R_inf||^2) at theta_inf(t), R the mean over "
             "all tasks and queries (task noise averages out before the norm; diagnostic)."),
    Variable("risk_inf", ("tau", "seed", "t"), "training risk of linear(inf)",
             "mean over tasks and queries of 1/2 (v^T Gamma_w U z_q - y_q)^2 at the checkpoint."),
    Variable("dist_bayes", ("tau", "seed", "t"), "distance of theta_inf(t) to the Bayes optimum",
             "sqrt(||U - U*||_F^2 + ||v - v*||^2), (U*, v*) of Remark 5.2 (balanced manifold)."),
    Variable("logit_factor", ("tau", "seed", "t"), "empirical logit factor exp(a^T Gamma_w a)",
             "mean over tasks and queries of exp(a^T Gamma_w a), a = U z_q, at theta_inf(t): the exponential "
             "factor of the finite-L constant (docs/models.md, section 1)."),
    Variable("off_block", ("tau", "seed", "t"), "off-block mass of theta_inf(t)",
             "norm of U outside its top-left d x d block together with v[:d] (measured, never imposed)."),
    Variable("U_inf", ("tau", "seed", "t", "row", "col"), "attention matrix U of linear(inf)",
             "gradient-descent iterate with Gamma_w at the checkpoint."),
    Variable("v_inf", ("tau", "seed", "t", "row"), "read-out vector v of linear(inf)",
             "gradient-descent iterate with Gamma_w at the checkpoint."),
    Variable("s", ("tau", "seed"), "covariate variance s (Sigma = s I_d)",
             "s = sqrt(d / tau), so that tr(Sigma^-2) = tau (the same for every seed)."),
    Variable("concentration_constant", ("tau", "seed"), "query-averaged concentration constant at the Bayes optimum",
             "(1 - 2 tau^{-1/2})^{-d/2} = E exp(x_q^T Sigma^-1 x_q / c^2); +inf by design for tau <= 4 "
             "(the expectation diverges); the same for every seed.", allow_nonfinite=True),
    Variable("gap_constant", ("tau",), "gradient-gap constant K = lim L E g_L^2 at the Bayes optimum",
             "stability.gap_constant(s I_d, n_queries): exponential factors exact, polynomial moments by Monte Carlo "
             "(gap_samples draws)" + _INF_NOTE, allow_nonfinite=True, part="constants"),
    Variable("gap_constant_se", ("tau",), "Monte Carlo standard error of gap_constant", "0 where K = +inf.", part="constants"),
    Variable("g_family", _FAM + ("L", "t_family"), "gradient gap g_L(t) for a covariance family",
             "as g, with Sigma = covariance.scaled(from_spec(family, d), tau).", part="families"),
    Variable("dist_bayes_family", _FAM + ("t_family",), "distance of theta_inf(t) to the Bayes optimum (family)",
             "as dist_bayes, for the family's Sigma.", part="families"),
    Variable("off_block_family", _FAM + ("t_family",), "off-block mass of theta_inf(t) (family)",
             "as off_block, for the family's Sigma.", part="families"),
    Variable("family_trace", ("family", "tau"), "trace of Sigma", "covariance.summary: sum of the eigenvalues.", part="family_constants"),
    Variable("family_op_norm", ("family", "tau"), "operator norm of Sigma", "covariance.summary: largest eigenvalue.", part="family_constants"),
    Variable("family_condition", ("family", "tau"), "condition number of Sigma",
             "covariance.summary: largest / smallest eigenvalue (scale-free: the same at every tau).", part="family_constants"),
    Variable("family_tr_inv2", ("family", "tau"), "tr(Sigma^-2) of the family's Sigma",
             "covariance.summary: sum of eigenvalue^-2; equals tau by construction (covariance.scaled).", part="family_constants"),
    Variable("concentration_constant_family", ("family", "tau"), "query-averaged concentration constant (family)",
             "(1 - 2 tau^{-1/2})^{-d/2}, the same for every Sigma with tr(Sigma^-2) = tau" + _INF_NOTE,
             allow_nonfinite=True, part="family_constants"),
    Variable("gap_constant_family", ("family", "tau"), "gradient-gap constant K (family)",
             "stability.gap_constant of the family's Sigma" + _INF_NOTE, allow_nonfinite=True, part="family_constants"),
    Variable("gap_constant_family_se", ("family", "tau"), "Monte Carlo standard error of gap_constant_family",
             "0 where K = +inf.", part="family_constants"),
)

EXPERIMENT = Experiment(
    name=NAME, short="c2_threshold", params=PARAMS, checks=(_steps_fit_checkpoints, covariance.spec_check("families"), _x_law_serves),
    inner_coords=inner_coords, variables=VARIABLES, analysis="sfxlin.analysis.c2_threshold",
    parts=(Part("", grid, kernel), Part("families", family_grid, family_kernel),
           Part("constants", constants_grid, constants_kernel, inputs=constants_inputs),
           Part("family_constants", family_constants_grid, family_constants_kernel, inputs=constants_inputs)),
    title="C2: uniform-in-time stability and the tr(Sigma^-2) > 4 threshold",
    description="C2 threshold: uniform-in-time gradient stability vs tau = tr(Sigma^-2)")
