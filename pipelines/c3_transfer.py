"""C3: large-prompt softmax attention inherits the optimisation of linear attention (docs/claims.md,
C3; the models: docs/models.md, section 2).

Grid (one dask task per cell): ``setting x seed``.

* ``setting``: ``isotropic`` (Gaussian covariates, ``Sigma = I_d``), ``anisotropic`` (Gaussian,
  ``Sigma = diag(2, 1, 0.5)``) and the control ``rademacher`` (``x = Sigma^{1/2} r``, ``r_i = +-1``,
  ``Sigma = I_d``: bounded, not Gaussian, so softmax(L) converges to its own tilted-mean limit and
  not to linear(inf)). Each setting's ``Sigma`` is a parameter (``Sigma_<setting>``). With
  ``covariates`` (a file of covariates, one row each, ``.npy`` or ``file.nc:variable``) the setting
  ``empirical`` joins them: covariates drawn with replacement from the file's rows as given (the law
  ``laws.covariate_law("empirical:FILE")``), ``n_seeds`` seeds; its ``Sigma`` is the rows' second
  moment ``M = cov + m m^T`` (the Eq. 9 init, the Bayes optimum of Remark 5.2, and what linear(inf)
  sees: "inf" is then linear attention at infinite prompt length, not softmax's limit, which is the
  rows' own tilted mean). The file's sha256 is one of that setting's cell inputs.
* ``seed``: ``0 .. max(n_seeds, n_seeds_control) - 1``. Gaussian settings run ``n_seeds`` seeds, the
  control ``n_seeds_control`` (the protocol: 2 and 1). The grid is a product, so cells outside the
  protocol (the control's extra seeds) exist in the file but are not computed: their kernel returns
  at once, ``in_protocol = 0`` and every other variable is NaN there (an explicitly flagged outcome,
  skipped by ``mean("seed")``). Inside the protocol every value is checked finite.

Inside a cell, in this draw order from the cell's generator: the training tasks (``n_pairs``
antithetic pairs x ``n_queries`` queries, nested prompts of ``max(L)`` tokens), the held-out tasks
(``heldout_pairs`` pairs x ``heldout_queries`` queries, prompts of ``max(max(L), L_eval)`` tokens),
then the direction of the off-block perturbation. Then

1. main run (:func:`sfxlin.training.train_all_arrays`, exact): gradient descent (``lr``, ``n_steps``)
   from the Eq. 9 init on the same tasks for ``softmax(L)`` and ``linear(L)`` at every ``L`` and
   ``linear(inf)`` (``theta_inf``), checkpoints every ``ckpt_every`` steps; from the stored
   trajectories: distances to ``theta_inf(t)``, between softmax and linear at the same ``L``, to the
   Bayes optimum, off-block mass and ``||U||_F^2 - ||v||^2``;
2. held-out risks every ``heldout_every`` steps (coordinate ``t_heldout``, a subset of ``t``): each
   trained model at its training ``L`` and at ``L_eval``; ``theta_inf`` under linear(inf) and under
   softmax(``L_eval``); baselines per ``L``: ridge / least squares on the prompt (``ridge_lam``), the
   plug-in estimator ``x_q^T Sigma^{-1} (1/L) sum_k y_k x_k`` (linear(L) attention at the Bayes optimum),
   the posterior mean of ``w`` and one step of optimally preconditioned gradient descent
   (:mod:`sfxlin.baselines`);
3. off-block stability diagnostic: the fast engine keeps the off-block parameters exactly 0 (antithetic
   partners cancel exactly), so a dynamical instability of the block structure cannot show by
   itself. An off-block perturbation ``delta`` of the block-structured trajectory evolves by the
   linearised map ``delta_{t+1} = (I - lr H_off(theta_t)) delta_t`` (the risk is even in the active
   off-block coordinates ``(U[d, :d], v[:d])``; ``U[:, d]`` multiplies the masked query coordinate 0
   and has no gradient), so it grows where ``lr lambda_max(H_off) > 2``. The kernel computes the
   extreme eigenvalues of ``H_off`` of every model at every checkpoint of the main run
   (:mod:`sfxlin.curvature`: in closed form from the softmax moments of the tokens).
   With ``perturbed_run`` (quick profile: on; paper: off) it also trains every model again from
   ``(U0, v0)`` plus an off-block perturbation of norm ``perturbation`` along a seeded random
   direction of ``(U[d, :d], v[:d])`` and records the off-block mass of all three models over
   ``t`` (the direct diagnostic; NaN when off). The direction is drawn either way, so the draws do
   not depend on the option. The two agree where the perturbed run is informative (its
   perturbation grows > 10x exactly where ``lr lambda_max`` crosses 2: tests/test_speed_invariance.py).

Paper profile = the reference protocol (docs/protocols.md): d = 3; 48 pairs x 2 queries;
L = 8 .. 4096 doubling; lr 0.01; T = 2500; checkpoints every 20 steps; 2 seeds (control: 1);
held-out 256 pairs x 4 queries at the training L and at 4096 (every 500 steps: 6 checkpoints);
perturbation 1e-12.
Cost of one protocol cell: the main run, the held-out evaluations, and the curvature at 126
checkpoints (one softmax pass over one partner of each pair per checkpoint and L); the perturbed
run, when asked, is 2500 more evaluations off the pair-shared path (docs/performance.md has the
measured figures).

What the perturbation diagnostic showed in the paper profile (see the fit table): at some
``(seed, L)`` (L = 512 .. 4096 here) the 1e-12 perturbation of softmax(L) first decays, then grows
by ~1.1 per step with its sign flipping every step, to ~1e-2, and the run ends in a period-2
oscillation of the off-block coordinates with a higher training risk. That is a step-size
(edge-of-stability) instability: the off-block curvature of the risk along the block-structured
trajectory exceeds ``2 / lr`` (growth 1.11 .. 1.16 per step: curvature ~212); with ``lr / 2`` and
``2 T`` the same cells stay stable. linear(L) and linear(inf) stay stable everywhere. The main run
does not show it because its off-block part is exactly 0 (exact cancellation), not because the
structure is stable.
"""
from __future__ import annotations

import numpy as np

from sfxlin import baselines, curvature, icl, laws, training
from sfxlin.engine.params import Param, Profiles, digest_key
from sfxlin.realdata import TOKEN_SUFFIXES, check_unchanged
from sfxlin.engine.sweep import Experiment, Part, Variable

NAME = "c3_transfer"

#: setting -> covariate law (the names are part of the file schema; ``rademacher`` is the control).
SETTINGS = {"isotropic": "gaussian", "anisotropic": "gaussian", "rademacher": "rademacher"}
CONTROL = "rademacher"
EMPIRICAL = "empirical"  # the setting of the ``covariates`` file
MODELS = ("softmax", "linear")  # the finite-L models, coordinate ``model``

_MATRIX = "d diagonal entries or a d x d symmetric positive-definite matrix"

PARAMS = (
    Param("d", "int", "covariate dimension; tokens (x, y) have D = d + 1", 3, low=1),
    Param("settings", "str_list", "covariate settings ('rademacher' is the control)",
          ["isotropic", "anisotropic", "rademacher"], choices=tuple(SETTINGS), grid=True),
    Param("Sigma_isotropic", "matrix", f"covariance of the 'isotropic' setting: {_MATRIX}", [1.0, 1.0, 1.0]),
    Param("Sigma_anisotropic", "matrix", f"covariance of the 'anisotropic' setting: {_MATRIX}", [2.0, 1.0, 0.5]),
    Param("Sigma_rademacher", "matrix", f"covariance of the Rademacher control, x = Sigma^{{1/2}} r: {_MATRIX}",
          [1.0, 1.0, 1.0]),
    Param("covariates", "file", "a covariate file, 'path.npy' or 'path.nc:variable' (one covariate x of dimension d per "
          "row), whose empirical law joins the settings as 'empirical' (rows as given, drawn with replacement); '' for "
          "none", "", suffixes=TOKEN_SUFFIXES, optional=True),
    Param("n_seeds", "int", "seeds of the Gaussian settings", 2, low=1, grid=True),
    Param("n_seeds_control", "int", "seeds of the Rademacher control (the grid runs max of both; extra cells are "
          "NaN, in_protocol = 0)", 1, low=1, grid=True),
    Param("n_pairs", "int", "antithetic training task pairs (w, -w) per cell", Profiles(quick=4, paper=48), low=1),
    Param("n_queries", "int", "query points per training task", 2, low=1),
    Param("L", "int_list", "nested training prompt lengths",
          Profiles(quick=[8, 16, 32, 64], paper=[8 * 2**k for k in range(10)]), unit="tokens", low=1,
          order="increasing", min_len=3,
          why="the analysis fits log-log slopes in L"),
    Param("lr", "float", "gradient-descent step size", 0.01, low=0, low_open=True),
    Param("n_steps", "int", "gradient-descent steps T (a multiple of ckpt_every)", Profiles(quick=200, paper=2500),
          unit="steps", low=1),
    Param("ckpt_every", "int", "steps between checkpoints t", 20, unit="steps", low=1),
    Param("heldout_pairs", "int", "antithetic held-out task pairs per cell", Profiles(quick=8, paper=256), low=1),
    Param("heldout_queries", "int", "query points per held-out task", Profiles(quick=2, paper=4), low=1),
    Param("L_eval", "int", "long held-out prompt length at which every trained model is also evaluated",
          Profiles(quick=128, paper=4096), unit="tokens", low=1),
    Param("heldout_every", "int", "steps between held-out evaluations t_heldout (a multiple of ckpt_every "
          "dividing n_steps)", Profiles(quick=100, paper=500), unit="steps", low=1),
    Param("ridge_lam", "float", "ridge penalty of the baseline on the prompt (0: minimum-norm least squares)", 0.0,
          low=0),
    Param("perturbation", "float", "norm of the off-block perturbation of (U0, v0) in the diagnostic run", 1e-12,
          low=0, low_open=True),
    Param("perturbed_run", "bool", "also train every model from the perturbed init (the direct diagnostic; else its "
          "variables are NaN and the off-block curvature alone says where the block structure is unstable)",
          Profiles(quick=True, paper=False)),
    Param("root_seed", "int", "root of every cell's random generator", 20251211),
)


# --------------------------------------------------------------------------- configuration


def _steps_fit_checkpoints(config):
    if config["n_steps"] % config["ckpt_every"]:
        raise ValueError(f"n_steps: {config['n_steps']} must be a multiple of ckpt_every = {config['ckpt_every']}")


def _heldout_on_checkpoints(config):
    he, ce, T = config["heldout_every"], config["ckpt_every"], config["n_steps"]
    if he % ce or T % he:
        raise ValueError(f"heldout_every: {he} must be a multiple of ckpt_every = {ce} and divide n_steps = {T}")


def sigmas_are_d_by_d(config):
    """Every ``Sigma_<setting>`` of ``settings`` is ``d x d`` (shared by the C3 experiments with settings)."""
    d = config["d"]
    for setting in config["settings"]:
        key = f"Sigma_{setting}"
        shape = np.shape(config[key])
        if shape != (d, d):
            raise ValueError(f"{key}: must be {d} diagonal entries or a {d} x {d} matrix (d = {d}), got "
                             f"{shape[0]} x {shape[1]}")


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
    """``(law, Sigma)`` of a cell of ``setting`` (``config``: its cell inputs): the covariate law and
    the matrix of the Eq. 9 init and the Bayes optimum, the setting's ``Sigma`` (Gaussian or
    Rademacher law with that covariance), or for ``empirical`` the file's rows' second moment
    ``cov + m m^T``; ``ValueError`` if the file changed since the run was configured."""
    if setting != EMPIRICAL:
        Sigma = np.asarray(config["Sigma"], dtype=float)
        return laws.covariate_law(SETTINGS[setting], Sigma), Sigma
    check_unchanged(config["covariates"], config[digest_key("covariates")], "covariates")
    law = laws.covariate_law(f"{EMPIRICAL}:{config['covariates']}", d=config["d"])
    return law, law.cov + np.outer(law.mean, law.mean)


def seeds_of(config, setting):
    """Number of seeds of ``setting`` in the protocol."""
    return config["n_seeds_control"] if setting == CONTROL else config["n_seeds"]


def in_protocol(config, setting, seed):
    return seed < seeds_of(config, setting)


def cell_inputs(config, cell):
    """What reaches a cell: the run's parameters less the grid's (``settings``, the seed counts),
    the covariances and the covariate file; plus the cell's own ``Sigma`` (for ``empirical``: the
    file instead, to which the engine adds its digest) and ``in_protocol`` flag."""
    setting = cell["setting"]
    inputs = {k: v for k, v in config.items()
              if k not in ("settings", "n_seeds", "n_seeds_control", "covariates") and not k.startswith("Sigma_")}
    if setting == EMPIRICAL:
        inputs["covariates"] = config["covariates"]
    else:
        inputs["Sigma"] = config[f"Sigma_{setting}"]
    inputs["in_protocol"] = in_protocol(config, setting, cell["seed"])
    return inputs


# --------------------------------------------------------------------------- grid and kernel


def grid(config):
    settings = settings_of(config)
    return {"setting": settings, "seed": list(range(max(seeds_of(config, s) for s in settings)))}


def inner_coords(config):
    D = config["d"] + 1
    return {"model": list(MODELS), "L": list(config["L"]),
            "t": training.checkpoint_steps(config["n_steps"], config["ckpt_every"]).tolist(),
            "t_heldout": training.checkpoint_steps(config["n_steps"], config["heldout_every"]).tolist(),
            "row": list(range(D)), "col": list(range(D))}


def _nan_cell(config):
    inner = inner_coords(config)
    out = {}
    for var in VARIABLES:
        shape = tuple(len(inner[dim]) for dim in var.dims if dim not in _G)
        out[var.name] = np.full(shape, np.nan)
    out["in_protocol"] = np.int8(0)
    return out


def _theta_norm_sq(U, v):
    return np.sum(U**2, axis=(-2, -1)) + np.sum(v**2, axis=-1)


def kernel(cell, rng, config):
    setting = cell["setting"]
    if not config["in_protocol"]:
        return _nan_cell(config)
    d = config["d"]
    law, Sigma = covariate_law_of(setting, config)
    Ls, L_eval = config["L"], config["L_eval"]
    kw = dict(lr=config["lr"], n_steps=config["n_steps"], ckpt_every=config["ckpt_every"])
    tasks = icl.make_tasks(rng, d, config["n_pairs"], config["n_queries"], Ls[-1], law)
    held = icl.make_tasks(rng, d, config["heldout_pairs"], config["heldout_queries"], max(Ls[-1], L_eval), law)
    direction = rng.standard_normal(2 * d)

    # 1. main run: softmax(L), linear(L) for every L and linear(inf), same tasks, same init
    res = training.train_all_arrays(tasks, Ls, models=("softmax", "linear", "linear_inf"), label="main run", **kw)
    U = np.stack([res[m]["U"] for m in MODELS])          # (model, L, t, D, D)
    v = np.stack([res[m]["v"] for m in MODELS])          # (model, L, t, D)
    U_inf, v_inf = res["linear_inf"]["U"], res["linear_inf"]["v"]
    U_star, v_star = icl.bayes_optimum(Sigma)

    # 2. held-out risks at a subset of checkpoints, and the baselines per L
    t = res["t"]
    sub = np.flatnonzero(np.isin(t, training.checkpoint_steps(kw["n_steps"], config["heldout_every"])))
    at_L, at_eval, inf_ho, inf_eval = training.heldout_risks(
        held, Ls, L_eval, {m: U[i][:, sub] for i, m in enumerate(MODELS)}, {m: v[i][:, sub] for i, m in enumerate(MODELS)},
        U_inf[sub], v_inf[sub])
    lam = config["ridge_lam"]
    risk_ridge = np.array([icl.ridge_risk(held, L, lam) for L in Ls])
    risk_plugin = np.array([icl.risk("linear", U_star, v_star, held, L) for L in Ls])
    base = baselines.baseline_risks(held, Ls)

    # 3. off-block stability: curvature along the stored trajectory; the perturbed run if asked
    curv = _off_block_curvature(tasks, Ls, U, v, U_inf, v_inf)
    pert = _perturbed_run(tasks, Ls, d, Sigma, direction, U, v, config, kw)

    out = {
        "in_protocol": np.int8(1),
        "U": U, "v": v,
        "risk_train": np.stack([res[m]["risk"] for m in MODELS]),
        "U_inf": U_inf, "v_inf": v_inf, "risk_inf": res["linear_inf"]["risk"],
        "D_inf": icl.theta_distance(U, v, U_inf, v_inf),
        "D_linL": icl.theta_distance(U[0], v[0], U[1], v[1]),
        "dist_bayes": icl.theta_distance(U, v, U_star, v_star),
        "dist_bayes_inf": icl.theta_distance(U_inf, v_inf, U_star, v_star),
        "off_block": icl.off_block_mass(U, v),
        "off_block_inf": icl.off_block_mass(U_inf, v_inf),
        "conservation": np.sum(U**2, axis=(-2, -1)) - np.sum(v**2, axis=-1),
        "conservation_inf": np.sum(U_inf**2, axis=(-2, -1)) - np.sum(v_inf**2, axis=-1),
        "norm_inf": np.sqrt(_theta_norm_sq(U_inf, v_inf)),
        "risk_heldout": at_L,
        "risk_heldout_eval": at_eval,
        "risk_heldout_inf": inf_ho,
        "risk_heldout_inf_eval": inf_eval,
        "risk_ridge": risk_ridge,
        "risk_plugin": risk_plugin,
        **pert, **curv,
        **{f"risk_{name}": base[name] for name in ("bayes_ridge", "pgd")},
        "n_exact_shift_steps": np.float64(res["n_exact_shift_steps"]),
    }
    for name, arr in out.items():   # the variables allow NaN (for cells outside the protocol): check here
        if not np.all(np.isfinite(arr)) and not (name in _PERTURBED and not config["perturbed_run"]):
            raise FloatingPointError(f"non-finite values in {name}")
    return out


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
                                     label="perturbed run", **kw)
    return {
        "off_block_perturbed": np.stack([icl.off_block_mass(pert[m]["U"], pert[m]["v"]) for m in MODELS]),
        "risk_train_perturbed": np.stack([pert[m]["risk"] for m in MODELS]),
        "D_perturbed": np.stack([icl.theta_distance(pert[m]["U"], pert[m]["v"], U[i], v[i]) for i, m in enumerate(MODELS)]),
        "off_block_perturbed_inf": icl.off_block_mass(pert["linear_inf"]["U"], pert["linear_inf"]["v"]),
    }


# --------------------------------------------------------------------------- cost (sfxlin run --plan)


def train_work(n_steps, n_pairs, n_queries, Ls, support=0):
    """Work of :func:`sfxlin.training.train_all_arrays` (softmax(L) at every ``L``, linear models),
    in token visits (docs/performance.md section 5; shared by the C3 pipelines): a step reads the
    ``sum L`` tokens of every antithetic pair and query (the partners share them; ``support``: the
    atoms of a softmax(inf) model on an empirical law, one more "prompt"), plus ``BLOCK_WORK`` per
    pair, query and prompt length (the per-L bookkeeping) and ``STEP_WORK`` (the step's fixed cost:
    the linear models, the parameter updates)."""
    n_blocks = len(Ls) + (support > 0)
    return n_steps * (n_pairs * n_queries * (sum(Ls) + support + BLOCK_WORK * n_blocks) + STEP_WORK)


def heldout_work(n_evals, n_pairs, n_queries, Ls, L_eval):
    """Work of ``n_evals`` calls of :func:`sfxlin.training.heldout_risks` in :func:`train_work` units:
    every softmax(L) at its ``L`` and, with linear(inf), at ``L_eval``, ``HELDOUT_VISIT_WORK`` per
    token visit (one engine call per model at ``L_eval``)."""
    return HELDOUT_VISIT_WORK * n_evals * n_pairs * n_queries * (sum(Ls) + (len(Ls) + 1) * L_eval)


#: :func:`train_work`'s constants: warm CPU seconds of ``train_all_arrays`` (softmax, linear, linear_inf; d = 3)
#: at 8 configurations (n_pairs 2 .. 48, L_max 64 .. 4096, 20 and 100 steps; the per-step cost from the
#: difference) fitted to 4.7e-9 s per token visit + 6.5e-7 s per (pair, query, L) block + 3.9e-4 s a step:
#: every configuration within 0.74 .. 1.21 of it, but the smallest (2 pairs, L_max 64: 2.06)
BLOCK_WORK = 140
STEP_WORK = 83_000
#: a held-out token visit in training visits: c3_transfer cells with 4 .. 16 M held-out visits (heldout_pairs 64 and
#: 256 x 4 queries, L_eval 1024 and 4096) cost 1.0 .. 1.2e-8 s per visit more than without, 2.2 times 4.7e-9
HELDOUT_VISIT_WORK = 2.2


def cell_work(config, part):
    """Work of one cell in its non-grid parameters (``sfxlin run --plan``'s cost law,
    :mod:`sfxlin.engine.plan`; the grid dims' costs are fitted): the main run's
    :func:`train_work` (twice with ``perturbed_run``), the held-out evaluations
    (:func:`heldout_work`, every ``heldout_every`` steps) and ``CELL_OVERHEAD_WORK``, a cell's fixed
    cost (the tasks, the baselines, the off-block curvature along the checkpoints) in the same units.
    A cell outside the protocol (a control seed beyond ``n_seeds_control``) computes nothing; the law's
    mean over the paper cells counts them as they were."""
    Ls = config["L"]
    runs = 2 if config["perturbed_run"] else 1
    evals = config["n_steps"] // config["heldout_every"] + 1
    return (runs * train_work(config["n_steps"], config["n_pairs"], config["n_queries"], Ls)
            + heldout_work(evals, config["heldout_pairs"], config["heldout_queries"], Ls, config["L_eval"])
            + CELL_OVERHEAD_WORK)


#: a cell's fixed cost in :func:`cell_work` units: warm CPU seconds of the quick cell isotropic, seed 0 with 20 steps
#: (``python -m sfxlin.engine.plan c3_transfer --set perturbed_run=false,n_steps=20,heldout_every=20``: 0.016 s)
#: less its 1.8 M units of training at 4.7e-9 s
CELL_OVERHEAD_WORK = 1_500_000


# --------------------------------------------------------------------------- declarations

_NAN = " NaN where in_protocol = 0 (a cell outside the protocol, not computed)."
_G, _GM = ("setting", "seed"), ("setting", "seed", "model")


def _v(name, dims, long_name, description, units=None):
    return Variable(name, dims, long_name, description + _NAN, units=units, allow_nonfinite=True)


VARIABLES = (
    Variable("in_protocol", _G, "cell is part of the protocol",
             "1 if the cell was computed (seed < n_seeds, or < n_seeds_control for the Rademacher control), "
             "0 if it only fills the product grid (every other variable is NaN there).",
             dtype="int8", flag_meanings=("outside_protocol", "in_protocol")),
    _v("U", _GM + ("L", "t", "row", "col"), "attention matrix U of model(L)",
       "gradient-descent iterate at the checkpoint (main run, Eq. 9 init, same tasks for every model and L)."),
    _v("v", _GM + ("L", "t", "row"), "read-out vector v of model(L)", "gradient-descent iterate at the checkpoint (main run)."),
    _v("risk_train", _GM + ("L", "t"), "training risk of model(L)",
       "mean over training tasks and queries of 1/2 (pred - y_q)^2 at the checkpoint parameters, prompt length L."),
    _v("U_inf", _G + ("t", "row", "col"), "attention matrix U of linear(inf) (theta_inf)",
       "gradient descent with Gamma_w (Lemma 2.1 limit) from the same init on the same tasks."),
    _v("v_inf", _G + ("t", "row"), "read-out vector v of linear(inf) (theta_inf)",
       "gradient descent with Gamma_w (Lemma 2.1 limit) from the same init on the same tasks."),
    _v("risk_inf", _G + ("t",), "training risk of linear(inf)",
       "mean over training tasks and queries of 1/2 (v^T Gamma_w U z_q - y_q)^2 at the checkpoint."),
    _v("D_inf", _GM + ("L", "t"), "distance of theta_L(t) to theta_inf(t)",
       "sqrt(||U_L(t) - U_inf(t)||_F^2 + ||v_L(t) - v_inf(t)||^2) at the same step t."),
    _v("D_linL", _G + ("L", "t"), "distance between softmax(L) and linear(L) at the same L and t",
       "sqrt(||U_softmax - U_linear||_F^2 + ||v_softmax - v_linear||^2): the softmax nonlinearity at L."),
    _v("dist_bayes", _GM + ("L", "t"), "distance of theta_L(t) to the Bayes optimum",
       "sqrt(||U - U*||_F^2 + ||v - v*||^2), (U*, v*) of Remark 5.2 for the setting's Sigma."),
    _v("dist_bayes_inf", _G + ("t",), "distance of theta_inf(t) to the Bayes optimum",
       "sqrt(||U_inf - U*||_F^2 + ||v_inf - v*||^2), (U*, v*) of Remark 5.2."),
    _v("off_block", _GM + ("L", "t"), "off-block mass of theta_L(t)",
       "sqrt(||U[d, :]||^2 + ||U[:d, d]||^2 + ||v[:d]||^2), measured (never imposed), main run."),
    _v("off_block_inf", _G + ("t",), "off-block mass of theta_inf(t)",
       "sqrt(||U[d, :]||^2 + ||U[:d, d]||^2 + ||v[:d]||^2) of linear(inf), main run."),
    _v("conservation", _GM + ("L", "t"), "||U||_F^2 - ||v||^2 of theta_L(t)",
       "conserved by the linear gradient flows (0 at the Eq. 9 init); gradient descent drifts by O(lr^2)."),
    _v("conservation_inf", _G + ("t",), "||U||_F^2 - ||v||^2 of theta_inf(t)",
       "conserved by the gradient flow of linear(inf) (0 at the Eq. 9 init)."),
    _v("norm_inf", _G + ("t",), "norm of theta_inf(t)", "sqrt(||U_inf||_F^2 + ||v_inf||^2)."),
    _v("risk_heldout", _GM + ("L", "t_heldout"), "held-out risk of model(L) at its training L",
       "mean over held-out tasks and queries of 1/2 (pred - y_q)^2, theta_L(t) evaluated with held-out prompts "
       "of length L (softmax(L) resp. linear(L) with the held-out Ghat_L)."),
    _v("risk_heldout_eval", _GM + ("L", "t_heldout"), "held-out risk of theta_L(t) at L_eval",
       "as risk_heldout but with held-out prompts of length L_eval (config; 4096 in the paper profile)."),
    _v("risk_heldout_inf", _G + ("t_heldout",), "held-out risk of theta_inf under linear(inf)",
       "mean over held-out tasks and queries of 1/2 (v^T Gamma_w U z_q - y_q)^2."),
    _v("risk_heldout_inf_eval", _G + ("t_heldout",), "held-out risk of theta_inf under softmax(L_eval)",
       "theta_inf(t) used as softmax attention with held-out prompts of length L_eval."),
    _v("risk_ridge", _G + ("L",), "held-out risk of ridge regression on the prompt",
       "per held-out task, ridge (penalty ridge_lam; 0: minimum-norm least squares) on its length-L prompt, "
       "risk 1/2 (x_q^T w_hat - y_q)^2 averaged; noiseless labels: least squares is exact (rounding) once L >= d."),
    _v("risk_plugin", _G + ("L",), "held-out risk of the plug-in estimator (linear(L) at the Bayes optimum)",
       "w_hat = Sigma^{-1} (1/L) sum_k y_k x_k, i.e. linear(L) attention at (U*, v*); held-out prompts of length L."),
    _v("off_block_perturbed", _GM + ("L", "t"), "off-block mass of model(L), perturbed run",
       "as off_block, for the diagnostic run started from (U0, v0) plus an off-block perturbation of norm "
       "`perturbation` (config) along a seeded random direction of (U[d, :d], v[:d]): growth = instability; "
       "NaN everywhere when perturbed_run is off (the paper profile)."),
    _v("risk_train_perturbed", _GM + ("L", "t"), "training risk of model(L), perturbed run",
       "as risk_train, for the diagnostic run (its trajectory leaves the main one where the block structure "
       "is unstable)."),
    _v("D_perturbed", _GM + ("L", "t"), "distance of the perturbed run to the main run",
       "sqrt(||U_perturbed - U||_F^2 + ||v_perturbed - v||^2) at the same model, L and t (the perturbation "
       "itself at t = 0)."),
    _v("off_block_perturbed_inf", _G + ("t",), "off-block mass of linear(inf), perturbed run",
       "as off_block_perturbed, for linear(inf)."),
    _v("risk_bayes_ridge", _G + ("L",), "held-out risk of the posterior mean of w (Bayes baseline)",
       "E[w | prompt] for the prior N(0, I_d) and noiseless labels: the minimum-norm interpolator (ridge at the "
       "Bayes penalty, 0 here; sfxlin.baselines.posterior_mean), risk 1/2 (x_q^T w_hat - y_q)^2 averaged over "
       "held-out tasks and queries, prompts of length L; rounding level once L >= d."),
    _v("risk_pgd", _G + ("L",), "held-out risk of one step of preconditioned gradient descent",
       "w_hat = Gamma_L (1/L) sum_k y_k x_k with the risk-minimising Gamma_L = [(1 + 1/L) Sigma + (tr Sigma / L) "
       "I]^{-1} for centred Gaussian covariates (sfxlin.baselines.pgd; the optimum of linear(L) attention, the "
       "plug-in's finite-L correction), held-out prompts of length L."),
    _v("off_block_curvature_max", _GM + ("L", "t"), "largest off-block curvature of model(L)",
       "largest eigenvalue of the Hessian of the training risk in the active off-block coordinates "
       "(U[d, :d], v[:d]) at theta_L(t) of the main run; lr * it > 2: an off-block perturbation grows "
       "(step-size instability of the block structure)."),
    _v("off_block_curvature_min", _GM + ("L", "t"), "smallest off-block curvature of model(L)",
       "smallest eigenvalue of the same Hessian (negative: a saddle direction off-block)."),
    _v("off_block_curvature_max_inf", _G + ("t",), "largest off-block curvature of linear(inf)",
       "as off_block_curvature_max, for linear(inf) at theta_inf(t)."),
    _v("off_block_curvature_min_inf", _G + ("t",), "smallest off-block curvature of linear(inf)",
       "as off_block_curvature_min, for linear(inf) at theta_inf(t)."),
    _v("n_exact_shift_steps", _G, "softmax steps with the exact max shift (main run)",
       "engine diagnostic: steps whose cached log-sum-exp shift was out of range and were recomputed exactly.",
       units="steps"),
)

EXPERIMENT = Experiment(
    name=NAME, short="c3", params=PARAMS,
    checks=(_steps_fit_checkpoints, _heldout_on_checkpoints, sigmas_are_d_by_d, _covariates_fit),
    inner_coords=inner_coords,
    variables=VARIABLES, analysis="sfxlin.analysis.c3", parts=(Part("", grid, kernel, inputs=cell_inputs),),
    scheduler="processes",   # a cell takes ~30% longer beside another on threads (the GIL): docs/performance.md
    title="C3: large-prompt softmax training inherits linear-attention training",
    description="C3: large-prompt softmax attention inherits linear-attention optimisation")
