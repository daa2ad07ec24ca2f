"""C3: large-prompt softmax attention inherits the optimisation of linear attention (SPEC section 2, C3).

Grid (one dask task per cell): ``setting x seed``.

* ``setting``: ``isotropic`` (Gaussian covariates, ``Sigma = I_d``), ``anisotropic`` (Gaussian,
  ``Sigma = diag(2, 1, 0.5)``) and the control ``rademacher`` (``x = Sigma^{1/2} r``, ``r_i = +-1``,
  ``Sigma = I_d``: bounded, not Gaussian, so softmax(L) converges to its own tilted-mean limit and
  not to linear(inf)). Each setting's ``Sigma`` is a parameter (``Sigma_<setting>``).
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
   softmax(``L_eval``); baselines per ``L``: ridge / least squares on the prompt (``ridge_lam``) and the
   plug-in estimator ``x_q^T Sigma^{-1} (1/L) sum_k y_k x_k`` (linear(L) attention at the Bayes optimum);
3. perturbation diagnostic: the fast engine keeps the off-block parameters exactly 0 (antithetic
   partners cancel exactly), so a dynamical instability of the block structure cannot show by
   itself. A second run starts from ``(U0, v0)`` plus an off-block perturbation of norm
   ``perturbation`` along a seeded random direction of the dynamically active off-block coordinates
   ``(U[d, :d], v[:d])`` (``U[:, d]`` multiplies the masked query coordinate 0: its gradient is 0, a
   perturbation there would stay constant and hide any decay) and records the off-block mass of all
   three models over ``t``.

Paper profile = the SPEC protocol: d = 3; 48 pairs x 2 queries; L = 8 .. 4096 doubling; lr 0.01;
T = 2500; checkpoints every 20 steps; 2 seeds (control: 1); held-out 256 pairs x 4 queries at the
training L and at 4096 (every 500 steps: 6 checkpoints); perturbation 1e-12.
Cost of one protocol cell (CPU seconds, one core): main run ~7 s, perturbed run ~12 s (once
``U[d, :d] != 0`` the antithetic partners' logits differ, so their softmax cannot be shared and
needs the quadratic features), held-out ~2 s; about 105 CPU s for the five cells, so about 60 s
wall on two free cores (5 equal cells on 2 workers: 3 rounds).

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

import math

import numpy as np

from sfxlin import icl, training
from sfxlin.sweep import Experiment, Variable

NAME = "c3_transfer"

#: setting -> covariate law (the names are part of the file schema; ``rademacher`` is the control).
SETTINGS = {"isotropic": "gaussian", "anisotropic": "gaussian", "rademacher": "rademacher"}
CONTROL = "rademacher"
MODELS = ("softmax", "linear")  # the finite-L models, coordinate ``model``

_PAPER_L = [8 * 2**k for k in range(10)]

PROFILES = {
    "quick": {"d": 3, "settings": ["isotropic", "anisotropic", "rademacher"],
              "Sigma_isotropic": [1.0, 1.0, 1.0], "Sigma_anisotropic": [2.0, 1.0, 0.5],
              "Sigma_rademacher": [1.0, 1.0, 1.0], "n_seeds": 2, "n_seeds_control": 1,
              "n_pairs": 4, "n_queries": 2, "L": [8, 16, 32, 64], "lr": 0.01, "n_steps": 200, "ckpt_every": 20,
              "heldout_pairs": 8, "heldout_queries": 2, "L_eval": 128, "heldout_every": 100,
              "ridge_lam": 0.0, "perturbation": 1e-12, "root_seed": 20251211},
    "paper": {"d": 3, "settings": ["isotropic", "anisotropic", "rademacher"],
              "Sigma_isotropic": [1.0, 1.0, 1.0], "Sigma_anisotropic": [2.0, 1.0, 0.5],
              "Sigma_rademacher": [1.0, 1.0, 1.0], "n_seeds": 2, "n_seeds_control": 1,
              "n_pairs": 48, "n_queries": 2, "L": _PAPER_L, "lr": 0.01, "n_steps": 2500, "ckpt_every": 20,
              "heldout_pairs": 256, "heldout_queries": 4, "L_eval": 4096, "heldout_every": 500,
              "ridge_lam": 0.0, "perturbation": 1e-12, "root_seed": 20251211},
}

PARAMETERS = {
    "d": "covariate dimension (int >= 1); tokens (x, y) have D = d + 1",
    "settings": f"covariate settings (subset of {sorted(SETTINGS)}; 'rademacher' is the control)",
    "Sigma_isotropic": "covariance of the 'isotropic' setting: d diagonal entries or a d x d symmetric positive-definite matrix",
    "Sigma_anisotropic": "covariance of the 'anisotropic' setting (as Sigma_isotropic)",
    "Sigma_rademacher": "covariance of the Rademacher control, x = Sigma^{1/2} r (as Sigma_isotropic)",
    "n_seeds": "seeds of the Gaussian settings",
    "n_seeds_control": "seeds of the Rademacher control (the grid runs max of both; extra cells are NaN, in_protocol = 0)",
    "n_pairs": "antithetic training task pairs (w, -w) per cell",
    "n_queries": "query points per training task",
    "L": "nested training prompt lengths (strictly increasing list of int >= 1)",
    "lr": "gradient-descent step size (> 0)",
    "n_steps": "gradient-descent steps T (>= 1, a multiple of ckpt_every)",
    "ckpt_every": "steps between checkpoints t",
    "heldout_pairs": "antithetic held-out task pairs per cell",
    "heldout_queries": "query points per held-out task",
    "L_eval": "long held-out prompt length at which every trained model is also evaluated",
    "heldout_every": "steps between held-out evaluations t_heldout (a multiple of ckpt_every dividing n_steps)",
    "ridge_lam": "ridge penalty of the baseline on the prompt (0: minimum-norm least squares)",
    "perturbation": "norm of the off-block perturbation of (U0, v0) in the diagnostic run (> 0)",
    "root_seed": "root of every cell's random generator",
}

# Predeclared criteria (SPEC C3), stored in the results file's attrs so analysis reads them from data.
# Gaussian criteria are measured per Gaussian setting (isotropic, anisotropic), on seed means; every
# value must satisfy the comparison. D(L) = max_t ||theta_L^softmax(t) - theta_inf(t)||_F.
CRITERIA = [
    {"id": "C3a-monotone", "claim": "C3",
     "description": "increases of seed-mean D(L) = max_t ||theta_L^softmax(t) - theta_inf(t)|| along L, per Gaussian setting",
     "kind": "<=", "threshold": 1, "reference": "non-monotone bump at L = 128..256", "fmt": "g"},
    {"id": "C3a-slope", "claim": "C3",
     "description": "log-log slope in L of seed-mean D(L), per Gaussian setting",
     "kind": "in", "threshold": [-0.65, -0.35], "reference": "-0.134 (iso) / -0.176 (aniso)"},
    {"id": "C3a-final", "claim": "C3",
     "description": "D(L_max) / ||theta_inf(T)||, per Gaussian setting",
     "kind": "<", "threshold": 0.05, "reference": "15.7% / 11.1%"},
    {"id": "C3b-monotone", "claim": "C3",
     "description": "increases along L of the seed-mean final held-out risk of softmax(L) at its training L",
     "kind": "<=", "threshold": 1, "reference": "monotone (0)", "fmt": "g"},
    {"id": "C3b-final", "claim": "C3",
     "description": "final / initial held-out risk of softmax(L_max) at L_max (seed mean), per Gaussian setting",
     "kind": "<", "threshold": 0.02, "reference": "0.95% / 0.64%"},
    {"id": "C3c", "claim": "C3",
     "description": "final distance of softmax(L) to the Bayes optimum, L_max over L_min (seed mean), per Gaussian setting",
     "kind": "<", "threshold": 0.25, "reference": "(PASS in the reference)"},
    {"id": "C3d-inf", "claim": "C3",
     "description": "max over t and seeds of the off-block mass of theta_inf, per Gaussian setting",
     "kind": "<", "threshold": 1e-8, "reference": "~1e-18"},
    {"id": "C3d-softmax", "claim": "C3",
     "description": "max over t and seeds of the off-block mass of softmax(L_max), per Gaussian setting",
     "kind": "<", "threshold": 1e-2, "reference": "~1e-17"},
    {"id": "C3e-drop", "claim": "C3",
     "description": "Rademacher control: D(L_min) / D(L_max) (seed mean)",
     "kind": ">=", "threshold": 5.0, "reference": "falls fast, then plateaus at 0.20"},
    {"id": "C3e-plateau", "claim": "C3",
     "description": "Rademacher control: log-log slope of D(L) over the last four L",
     "kind": ">", "threshold": -0.25, "reference": "plateau at 0.20 from L = 1024"},
    # supplementary checks of figures quoted in SPEC's C3 text (not predeclared by the reference)
    {"id": "C3-inf-risk", "claim": "C3",
     "description": "supplementary: final training risk of theta_inf, max over seeds, per Gaussian setting",
     "kind": "<=", "threshold": 1e-6, "reference": "~1e-11 .. 1e-25"},
    {"id": "C3-inf-bayes", "claim": "C3",
     "description": "supplementary: final distance of theta_inf to the Bayes optimum, max over seeds, per Gaussian setting",
     "kind": "<=", "threshold": 2e-3, "reference": "~1e-3"},
    {"id": "C3-linL-gap", "claim": "C3",
     "description": "supplementary: |max_t ||theta_L^softmax - theta_L^linear|| / D(L) - 1| for L >= 1024 (seed means), Gaussian settings",
     "kind": "<", "threshold": 0.05, "reference": "equal to 3 digits"},
]


# --------------------------------------------------------------------------- configuration


def _int(config, key, lo=1):
    val = config[key]
    if isinstance(val, (bool, np.bool_)) or not isinstance(val, (int, np.integer)) or val < lo:
        raise ValueError(f"{key} must be an integer >= {lo}, got {val!r}")
    return int(val)


def sigma_of(config, setting):
    """The covariance matrix of ``setting`` (``d x d``), validated symmetric positive definite."""
    return _sigma_matrix(config[f"Sigma_{setting}"], int(config["d"]), f"Sigma_{setting}")


def _sigma_matrix(value, d, key):
    try:
        S = np.asarray(value, dtype=float)
    except (TypeError, ValueError):
        raise ValueError(f"{key} must be numbers, got {value!r}") from None
    if S.ndim == 1:
        S = np.diag(S)
    if S.shape != (d, d):
        raise ValueError(f"{key} must be {d} diagonal entries or a {d} x {d} matrix, got shape {S.shape}")
    if not np.all(np.isfinite(S)) or not np.allclose(S, S.T, rtol=0, atol=1e-12 * max(1.0, np.abs(S).max())):
        raise ValueError(f"{key} must be finite and symmetric, got {S.tolist()}")
    lam = np.linalg.eigvalsh(S)
    if lam.min() <= 0:
        raise ValueError(f"{key} must be positive definite (a covariance with an inverse for the Bayes "
                         f"optimum); its eigenvalues are {lam.tolist()}")
    return S


def seeds_of(config, setting):
    """Number of seeds of ``setting`` in the protocol."""
    return int(config["n_seeds_control"] if setting == CONTROL else config["n_seeds"])


def in_protocol(config, setting, seed):
    return int(seed) < seeds_of(config, setting)


def cell_inputs(config, cell):
    """What reaches a cell: the run's parameters less the grid's (``settings``, the seed counts)
    and the other settings' covariances; plus the cell's own ``Sigma`` and ``in_protocol`` flag."""
    setting = cell["setting"]
    inputs = {k: v for k, v in config.items()
              if k not in ("settings", "n_seeds", "n_seeds_control") and not k.startswith("Sigma_")}
    inputs["Sigma"] = config[f"Sigma_{setting}"]
    inputs["in_protocol"] = in_protocol(config, setting, cell["seed"])
    return inputs


def validate(config):
    """Raise ValueError for an inconsistent configuration, or one the analysis cannot use (checked
    before any work: at least 3 prompt lengths for the slopes in L, no setting listed twice)."""
    missing = sorted(set(PARAMETERS) - set(config))
    if missing:
        raise ValueError(f"configuration misses {missing}")
    d = _int(config, "d")
    for key in ("n_seeds", "n_seeds_control", "n_pairs", "n_queries", "heldout_pairs", "heldout_queries",
                "ckpt_every", "heldout_every", "L_eval"):
        _int(config, key)
    n_steps = config["n_steps"]
    if isinstance(n_steps, (bool, np.bool_)) or not isinstance(n_steps, (int, np.integer)) or n_steps < 1:
        raise ValueError(f"n_steps (T) must be an integer >= 1, got {n_steps!r}")
    settings = config["settings"]
    if isinstance(settings, str) or not list(settings):
        raise ValueError(f"settings must be a non-empty list of names from {sorted(SETTINGS)}, got {settings!r}")
    unknown = [s for s in settings if s not in SETTINGS]
    if unknown:
        raise ValueError(f"unknown setting(s) {unknown}; expected names from {sorted(SETTINGS)}")
    if len(set(settings)) != len(settings):
        raise ValueError(f"settings must not repeat, got {settings}")
    for s in settings:
        sigma_of(config, s)
    Ls = training.validate_Ls(config["L"])
    if len(Ls) < 3:
        raise ValueError(f"L needs at least 3 prompt lengths (the log-log slopes in L of C3), got {list(Ls)}")
    lr = config["lr"]
    if isinstance(lr, bool) or not isinstance(lr, (int, float, np.number)) or not (math.isfinite(lr) and lr > 0):
        raise ValueError(f"lr must be a positive finite number, got {lr!r}")
    training.checkpoint_steps(int(n_steps), int(config["ckpt_every"]))
    he, ce = int(config["heldout_every"]), int(config["ckpt_every"])
    if he % ce or n_steps % he:
        raise ValueError(f"heldout_every = {he} must be a multiple of ckpt_every = {ce} and divide n_steps = {n_steps}")
    lam = float(config["ridge_lam"])
    if not (math.isfinite(lam) and lam >= 0):
        raise ValueError(f"ridge_lam must be a finite number >= 0, got {config['ridge_lam']!r}")
    eps = float(config["perturbation"])
    if not (math.isfinite(eps) and eps > 0):
        raise ValueError(f"perturbation must be a positive finite number, got {config['perturbation']!r}")
    if d < 1:  # pragma: no cover (checked by _int)
        raise ValueError("d must be >= 1")


# --------------------------------------------------------------------------- grid and kernel


def grid(config):
    settings = list(config["settings"])
    return {"setting": settings, "seed": list(range(max(seeds_of(config, s) for s in settings)))}


def inner_coords(config):
    D = int(config["d"]) + 1
    return {"model": list(MODELS), "L": [int(L) for L in config["L"]],
            "t": training.checkpoint_steps(int(config["n_steps"]), int(config["ckpt_every"])).tolist(),
            "t_heldout": training.checkpoint_steps(int(config["n_steps"]), int(config["heldout_every"])).tolist(),
            "row": list(range(D)), "col": list(range(D))}


def _nan_cell(config):
    inner = inner_coords(config)
    out = {}
    for var in VARIABLES:
        shape = tuple(len(inner[dim]) for dim in var.dims if dim not in _G)
        out[var.name] = np.full(shape, np.nan)
    out["in_protocol"] = np.float64(0.0)
    return out


def _theta_norm_sq(U, v):
    return np.sum(U**2, axis=(-2, -1)) + np.sum(v**2, axis=-1)


def perturbed_init(U0, v0, direction, eps):
    """``(U0, v0)`` plus ``eps * direction / ||direction||`` on the active off-block coordinates
    ``(U[d, :d], v[:d])`` (``direction`` has ``2 d`` entries): the off-block mass of the result is
    exactly ``eps`` when ``(U0, v0)`` is block structured."""
    d = U0.shape[-1] - 1
    delta = eps * np.asarray(direction, dtype=float) / np.linalg.norm(direction)
    U, v = U0.copy(), v0.copy()
    U[d, :d] += delta[:d]
    v[:d] += delta[d:]
    return U, v


def heldout_risks(held, Ls, L_eval, U, v, U_inf, v_inf):
    """Held-out risks of trained parameters.

    ``U[m] (nL, k, D, D)``, ``v[m] (nL, k, D)`` for ``m`` in ``MODELS`` (``k`` checkpoints),
    ``U_inf (k, D, D)``, ``v_inf (k, D)``. Returns ``at_L (2, nL, k)`` (each model at its training
    ``L``), ``at_eval (2, nL, k)`` (at ``L_eval``), ``inf (k,)`` (theta_inf under linear(inf)) and
    ``inf_eval (k,)`` (theta_inf under softmax(L_eval)). Exact: the softmax risks use the prefix
    engine of :mod:`sfxlin.training` (its ``step`` evaluates parameter ``i`` at ``Ls[i]``)."""
    nL, k = U["softmax"].shape[:2]
    at_L = np.empty((2, nL, k))
    at_eval = np.empty((2, nL, k))
    inf_eval = np.empty(k)
    eng = training.SoftmaxPrefixEngine(held, Ls)
    eng_eval = training.SoftmaxPrefixEngine(held, (L_eval,))
    for j in range(k):
        at_L[0, :, j] = eng.step(U["softmax"][:, j], v["softmax"][:, j])[0]
        for i in range(nL):
            if i and np.array_equal(U["softmax"][i, j], U["softmax"][0, j]) and np.array_equal(v["softmax"][i, j],
                                                                                               v["softmax"][0, j]):
                at_eval[0, i, j] = at_eval[0, 0, j]   # same parameters (the shared init at t = 0)
                continue
            at_eval[0, i, j] = eng_eval.step(U["softmax"][i, j][None], v["softmax"][i, j][None])[0][0]
        inf_eval[j] = eng_eval.step(U_inf[j][None], v_inf[j][None])[0][0]
    z_q, y_q = held.z_q, held.y_q
    G_eval = icl.Ghat(held.Z, L_eval)
    for i, L in enumerate(Ls):
        G = icl.Ghat(held.Z, int(L))
        at_L[1, i] = 0.5 * np.mean((icl.linear_predict(U["linear"][i], v["linear"][i], G, z_q) - y_q) ** 2, axis=(-2, -1))
        at_eval[1, i] = 0.5 * np.mean((icl.linear_predict(U["linear"][i], v["linear"][i], G_eval, z_q) - y_q) ** 2,
                                      axis=(-2, -1))
    inf = icl.risk("linear_inf", U_inf, v_inf, held)
    return at_L, at_eval, inf, inf_eval


def kernel(cell, rng, config):
    setting = cell["setting"]
    if not config["in_protocol"]:
        return _nan_cell(config)
    d = int(config["d"])
    Sigma = _sigma_matrix(config["Sigma"], d, f"Sigma_{setting}")
    law = icl.covariate_law(SETTINGS[setting], Sigma)
    Ls = tuple(int(L) for L in config["L"])
    L_eval = int(config["L_eval"])
    kw = dict(lr=float(config["lr"]), n_steps=int(config["n_steps"]), ckpt_every=int(config["ckpt_every"]))
    tasks = icl.make_tasks(rng, d, int(config["n_pairs"]), int(config["n_queries"]), Ls[-1], law)
    held = icl.make_tasks(rng, d, int(config["heldout_pairs"]), int(config["heldout_queries"]), max(Ls[-1], L_eval), law)
    direction = rng.standard_normal(2 * d)

    # 1. main run: softmax(L), linear(L) for every L and linear(inf), same tasks, same init
    res = training.train_all_arrays(tasks, Ls, models=("softmax", "linear", "linear_inf"), label="main run", **kw)
    U = np.stack([res[m]["U"] for m in MODELS])          # (model, L, t, D, D)
    v = np.stack([res[m]["v"] for m in MODELS])          # (model, L, t, D)
    U_inf, v_inf = res["linear_inf"]["U"], res["linear_inf"]["v"]
    U_star, v_star = icl.bayes_optimum(Sigma)

    # 2. held-out risks at a subset of checkpoints, and the baselines per L
    t = res["t"]
    sub = np.flatnonzero(np.isin(t, training.checkpoint_steps(kw["n_steps"], int(config["heldout_every"]))))
    at_L, at_eval, inf_ho, inf_eval = heldout_risks(
        held, Ls, L_eval, {m: U[i][:, sub] for i, m in enumerate(MODELS)}, {m: v[i][:, sub] for i, m in enumerate(MODELS)},
        U_inf[sub], v_inf[sub])
    lam = float(config["ridge_lam"])
    risk_ridge = np.array([icl.ridge_risk(held, L, lam) for L in Ls])
    risk_plugin = np.array([icl.risk("linear", U_star, v_star, held, L) for L in Ls])

    # 3. perturbation diagnostic
    U0, v0 = icl.init_theta(d, Sigma)
    U0p, v0p = perturbed_init(U0, v0, direction, float(config["perturbation"]))
    pert = training.train_all_arrays(tasks, Ls, models=("softmax", "linear", "linear_inf"), U0=U0p, v0=v0p,
                                     label="perturbed run", **kw)

    out = {
        "in_protocol": np.float64(1.0),
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
        "off_block_perturbed": np.stack([icl.off_block_mass(pert[m]["U"], pert[m]["v"]) for m in MODELS]),
        "risk_train_perturbed": np.stack([pert[m]["risk"] for m in MODELS]),
        "D_perturbed": np.stack([icl.theta_distance(pert[m]["U"], pert[m]["v"], U[i], v[i]) for i, m in enumerate(MODELS)]),
        "off_block_perturbed_inf": icl.off_block_mass(pert["linear_inf"]["U"], pert["linear_inf"]["v"]),
        "n_exact_shift_steps": np.float64(res["n_exact_shift_steps"]),
    }
    for name, arr in out.items():   # the variables allow NaN (for cells outside the protocol): check here
        if not np.all(np.isfinite(arr)):
            raise FloatingPointError(f"non-finite values in {name}")
    return out


# --------------------------------------------------------------------------- declarations

_NAN = " NaN where in_protocol = 0 (a cell outside the protocol, not computed)."
_G, _GM = ("setting", "seed"), ("setting", "seed", "model")


def _v(name, dims, long_name, description, units=None):
    return Variable(name, dims, long_name, description + _NAN, units=units, allow_nonfinite=True)


VARIABLES = (
    Variable("in_protocol", _G, "cell is part of the protocol",
             "1 if the cell was computed (seed < n_seeds, or < n_seeds_control for the Rademacher control), "
             "0 if it only fills the product grid (every other variable is NaN there)"),
    _v("U", _GM + ("L", "t", "row", "col"), "attention matrix U of model(L)",
       "gradient-descent iterate at the checkpoint (main run, Eq. 9 init, same tasks for every model and L)"),
    _v("v", _GM + ("L", "t", "row"), "read-out vector v of model(L)", "gradient-descent iterate at the checkpoint (main run)"),
    _v("risk_train", _GM + ("L", "t"), "training risk of model(L)",
       "mean over training tasks and queries of 1/2 (pred - y_q)^2 at the checkpoint parameters, prompt length L"),
    _v("U_inf", _G + ("t", "row", "col"), "attention matrix U of linear(inf) (theta_inf)",
       "gradient descent with Gamma_w (Lemma 2.1 limit) from the same init on the same tasks"),
    _v("v_inf", _G + ("t", "row"), "read-out vector v of linear(inf) (theta_inf)",
       "gradient descent with Gamma_w (Lemma 2.1 limit) from the same init on the same tasks"),
    _v("risk_inf", _G + ("t",), "training risk of linear(inf)",
       "mean over training tasks and queries of 1/2 (v^T Gamma_w U z_q - y_q)^2 at the checkpoint"),
    _v("D_inf", _GM + ("L", "t"), "distance of theta_L(t) to theta_inf(t)",
       "sqrt(||U_L(t) - U_inf(t)||_F^2 + ||v_L(t) - v_inf(t)||^2) at the same step t"),
    _v("D_linL", _G + ("L", "t"), "distance between softmax(L) and linear(L) at the same L and t",
       "sqrt(||U_softmax - U_linear||_F^2 + ||v_softmax - v_linear||^2): the softmax nonlinearity at L"),
    _v("dist_bayes", _GM + ("L", "t"), "distance of theta_L(t) to the Bayes optimum",
       "sqrt(||U - U*||_F^2 + ||v - v*||^2), (U*, v*) of Remark 5.2 for the setting's Sigma"),
    _v("dist_bayes_inf", _G + ("t",), "distance of theta_inf(t) to the Bayes optimum",
       "sqrt(||U_inf - U*||_F^2 + ||v_inf - v*||^2), (U*, v*) of Remark 5.2"),
    _v("off_block", _GM + ("L", "t"), "off-block mass of theta_L(t)",
       "sqrt(||U[d, :]||^2 + ||U[:d, d]||^2 + ||v[:d]||^2), measured (never imposed), main run"),
    _v("off_block_inf", _G + ("t",), "off-block mass of theta_inf(t)",
       "sqrt(||U[d, :]||^2 + ||U[:d, d]||^2 + ||v[:d]||^2) of linear(inf), main run"),
    _v("conservation", _GM + ("L", "t"), "||U||_F^2 - ||v||^2 of theta_L(t)",
       "conserved by the linear gradient flows (0 at the Eq. 9 init); gradient descent drifts by O(lr^2)"),
    _v("conservation_inf", _G + ("t",), "||U||_F^2 - ||v||^2 of theta_inf(t)",
       "conserved by the gradient flow of linear(inf) (0 at the Eq. 9 init)"),
    _v("norm_inf", _G + ("t",), "norm of theta_inf(t)", "sqrt(||U_inf||_F^2 + ||v_inf||^2)"),
    _v("risk_heldout", _GM + ("L", "t_heldout"), "held-out risk of model(L) at its training L",
       "mean over held-out tasks and queries of 1/2 (pred - y_q)^2, theta_L(t) evaluated with held-out prompts "
       "of length L (softmax(L) resp. linear(L) with the held-out Ghat_L)"),
    _v("risk_heldout_eval", _GM + ("L", "t_heldout"), "held-out risk of theta_L(t) at L_eval",
       "as risk_heldout but with held-out prompts of length L_eval (config; 4096 in the paper profile)"),
    _v("risk_heldout_inf", _G + ("t_heldout",), "held-out risk of theta_inf under linear(inf)",
       "mean over held-out tasks and queries of 1/2 (v^T Gamma_w U z_q - y_q)^2"),
    _v("risk_heldout_inf_eval", _G + ("t_heldout",), "held-out risk of theta_inf under softmax(L_eval)",
       "theta_inf(t) used as softmax attention with held-out prompts of length L_eval"),
    _v("risk_ridge", _G + ("L",), "held-out risk of ridge regression on the prompt",
       "per held-out task, ridge (penalty ridge_lam; 0: minimum-norm least squares) on its length-L prompt, "
       "risk 1/2 (x_q^T w_hat - y_q)^2 averaged; noiseless labels: least squares is exact (rounding) once L >= d"),
    _v("risk_plugin", _G + ("L",), "held-out risk of the plug-in estimator (linear(L) at the Bayes optimum)",
       "w_hat = Sigma^{-1} (1/L) sum_k y_k x_k, i.e. linear(L) attention at (U*, v*); held-out prompts of length L"),
    _v("off_block_perturbed", _GM + ("L", "t"), "off-block mass of model(L), perturbed run",
       "as off_block, for the diagnostic run started from (U0, v0) plus an off-block perturbation of norm "
       "`perturbation` (config) along a seeded random direction of (U[d, :d], v[:d]): growth = instability"),
    _v("risk_train_perturbed", _GM + ("L", "t"), "training risk of model(L), perturbed run",
       "as risk_train, for the diagnostic run (its trajectory leaves the main one where the block structure "
       "is unstable)"),
    _v("D_perturbed", _GM + ("L", "t"), "distance of the perturbed run to the main run",
       "sqrt(||U_perturbed - U||_F^2 + ||v_perturbed - v||^2) at the same model, L and t (the perturbation "
       "itself at t = 0)"),
    _v("off_block_perturbed_inf", _G + ("t",), "off-block mass of linear(inf), perturbed run",
       "as off_block_perturbed, for linear(inf)"),
    _v("n_exact_shift_steps", _G, "softmax steps with the exact max shift (main run)",
       "engine diagnostic: steps whose cached log-sum-exp shift was out of range and were recomputed exactly"),
)

EXPERIMENT = Experiment(name=NAME, grid=grid, inner_coords=inner_coords, variables=VARIABLES, kernel=kernel,
                        description="C3: large-prompt softmax attention inherits linear-attention optimisation",
                        cell_config=cell_inputs)
