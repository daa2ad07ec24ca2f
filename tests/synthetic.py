"""Synthetic results files with known answers, in the schema each analysis module reads.

Every factory returns a Dataset on which every predeclared criterion of its experiment PASSES,
built from exact curves (``mse = c / L`` has log-log slope -1 to rounding), with the traps a
wrong reduction would fall into already in place: seeds that scatter around their mean, other
laws / models / settings / checkpoints / prompt lengths with values that would fail the criterion
if they were read instead. Tests copy it and change one cell to make one criterion fail.

The criteria are attached as ``build()`` stores them: ``attrs['criteria']``, the JSON list of
the experiment's declared criteria (:func:`sfxlin.engine.sweep.criteria_of`), with the ``analysis`` attr.

:data:`FACTORIES` holds one factory per experiment, under the experiment's name (``@factory(name)``):
tests/test_synthetic.py fails for an experiment that has none, and the tests that go over every
analysis (tests/test_criteria_pinned.py, tests/test_fit_tables.py) take them from there.
"""
from __future__ import annotations

import json

import numpy as np
import xarray as xr

from sfxlin import training
from sfxlin.engine.experiments import get as get_experiment
from sfxlin.engine.sweep import criteria_of
from sfxlin.pipelines import c1_kernels as c1_kernels_pipeline
from sfxlin.pipelines import c2_concentration
from sfxlin.pipelines.families.c3 import MODELS as C3_MODELS
from sfxlin.pipelines.families.c3 import SETTINGS as C3_SETTINGS

#: seed factors with mean exactly 1: per-seed curves differ from their mean
SEED_FACTORS = np.array([0.5, 1.5])

#: ``{experiment name: factory}``: the synthetic results file of every experiment
FACTORIES = {}


def factory(name):
    """Register the decorated function as the synthetic file of the experiment ``name``."""
    def register(make):
        FACTORIES[name] = make
        return make
    return register


def _attach(ds, name, config=None):
    exp = get_experiment(name)
    ds.attrs.update(experiment=exp.name, analysis=exp.analysis, title=exp.title, profile="synthetic",
                    criteria=json.dumps(criteria_of(exp)), config=json.dumps(config or {}))
    return ds


def power(L, p, c=1.0):
    """``c * (L / L[0]) ** p`` as floats: log-log slope ``p`` exactly (to rounding)."""
    L = np.asarray(L, dtype=float)
    return c * (L / L[0]) ** p


# --------------------------------------------------------------------------- C1


@factory("c1_limit")
def c1(L=(16, 32, 64, 128, 256)):
    """``c1_limit`` file: Gaussian error ``c(d, U_norm) / L`` exactly in its seed mean (seeds
    scatter by +-50% with alternating sign along L), the sharp asymptotics equal to it at the
    largest L only, bounded laws on their predicted plateau, Student-t and the sqrt(L) control
    growing at the largest U_norm only, quadrature errors ~1e-15; AR(1) tokens (rho 0.8) with 8 times
    the Gaussian error, on their dependent constant (8x the i.i.d. one at the largest L)."""
    laws = ["gaussian", "rademacher", "uniform", "student_t", "ar1:0.8"]
    d, U = [2, 3], [0.1, 0.5]
    L = np.asarray(L)
    nL = L.size
    c = np.array([[1.0, 2.0], [3.0, 4.0]])[:, :, None]                      # (d, U_norm, 1)
    gauss = c * power(L, -1.0)                                               # (d, U_norm, L)
    wiggle = 0.5 * (-1.0) ** np.arange(nL)
    wiggle[-1] = 0.0                                                         # seeds agree at L_max
    seeds = 1.0 + np.stack([wiggle, -wiggle], axis=-1)                       # (L, seed): mean 1
    plateau = 0.01 + c * power(L, -1.0, 0.1)                                 # bias + constant / L
    growth = np.where(np.array(U)[None, :, None] == max(U), power(L, 0.5), power(L, -1.0)) * c
    mse = np.stack([gauss[..., None] * seeds, plateau[..., None] * seeds, plateau[..., None] * seeds,
                    growth[..., None] * seeds, 8.0 * gauss[..., None] * seeds])  # (law, d, U_norm, L, seed)
    # the sharp constant holds at the largest L only: off by 1.5x before
    asym = gauss / np.where(np.arange(nL) == nL - 1, 1.0, 1.5)
    predicted = np.stack([2.0 * gauss, plateau, plateau, np.full_like(gauss, np.nan), 8.0 * gauss])
    bias = np.stack([np.zeros((2, 2)), np.full((2, 2), 0.01), np.full((2, 2), 0.01), np.full((2, 2), np.nan),
                     np.zeros((2, 2))])
    uq = np.linspace(0.1, 1.0, 3)
    Uq_sq = np.broadcast_to(uq, (2, 2, 2, 3))                                # (d, U_norm, seed, query)
    mse_query = np.exp(0.5 * uq)[None, None, None, None, :] / L[None, None, :, None, None] * np.ones((2, 2, 1, 2, 1))
    scaled = growth                                                          # grows at the largest U_norm only
    ds = xr.Dataset(
        {"mse": (("law", "d", "U_norm", "L", "seed"), mse),
         "mse_asymptotic": (("d", "U_norm", "L", "seed"), np.repeat(asym[..., None], 2, -1)),
         "mse_predicted": (("law", "d", "U_norm", "L", "seed"), np.repeat(predicted[..., None], 2, -1)),
         "bias_exact": (("law", "d", "U_norm", "seed"), np.repeat(bias[..., None], 2, -1)),
         "mse_query": (("d", "U_norm", "L", "seed", "query"), mse_query),
         "Uq_sq": (("d", "U_norm", "seed", "query"), Uq_sq.copy()),
         "mse_scaled_U": (("d", "U_norm", "L", "seed"), scaled[..., None] * seeds),
         "quadrature_error": (("D_quad",), np.array([1e-15, 2e-15, 3e-15, 4e-15]))},
        coords={"law": laws, "d": d, "U_norm": U, "L": L, "seed": [0, 1], "query": [0, 1, 2], "D_quad": [1, 2, 3, 4]})
    return _attach(ds, "c1_limit", {"sigma": 1.0})


# --------------------------------------------------------------------------- C2

#: tail levels: exact binary fractions, the last one below the CLT criterion's 1e-3
C2_LEVELS = [0.125, 0.03125, 0.0078125, 0.001953125, 0.00048828125]


@factory("c2_concentration")
def c2(L=(8, 16, 32, 64, 128)):
    """``c2_concentration`` file. Tails: ``count = n * level`` and ``clt = level`` (empirical / CLT
    exactly 1), bound ``4 * level`` (never violated, never vacuous); at the smallest L and at the
    level below 1e-3 the ratio is 3 (outside [0.5, 2], not read by the criterion). Gradients: gap
    ``c / L`` in its seed mean, bound 100x above. Trajectory: ``g_L(0) ~ L^-1/2``, the sup over t
    (at t = 20) ``~ L^-0.45``, the last checkpoint ``~ L^-0.9``."""
    d, U, seed, query = [2, 3], [0.1, 0.5], [0, 1], [0, 1]
    settings, scales, traj_seeds, t = list(c2_concentration.SETTINGS), [1.0, 2.0], [0, 1], [0, 20, 40]
    L = np.asarray(L)
    levels = np.array(C2_LEVELS)
    n = 4096
    tail_shape = (2, 2, 2, 2, L.size, levels.size)
    clt = np.broadcast_to(levels, tail_shape).copy()
    count = n * clt
    count[..., 0, :-1] *= 3.0                                                # smallest L: ratio 3
    count[..., -1] *= 3.0                                                    # level < 1e-3: ratio 3
    grad_shape = (2, 2, 2, 2, 2)
    gap = power(L, -1.0, 1e-3) * SEED_FACTORS[None, None, :, None, None, None]
    gap = np.broadcast_to(gap, grad_shape + (L.size,)).copy()
    g = np.stack([power(L, -0.5), power(L, -0.45, 10.0), power(L, -0.9, 0.1)], axis=-1)   # (L, t)
    traj_g = g[None, None] * SEED_FACTORS[None, :, None, None] * np.ones((2, 1, 1, 1))
    ds = xr.Dataset(
        {"tail_count": (("d", "U_norm", "seed", "query", "L", "level"), count),
         "tail_n": (("d", "U_norm", "seed"), np.full((2, 2, 2), float(n))),
         "tail_clt": (("d", "U_norm", "seed", "query", "L", "level"), clt),
         "tail_bound": (("d", "U_norm", "seed", "query", "L", "level"), 4.0 * clt),
         "tail_c1_eff": (("d", "U_norm", "seed"), np.exp(2.0 / 3.0 * np.array(d, float))[:, None, None]
                         * np.ones((2, 2, 2))),
         "tail_c2_eff": (("d", "U_norm", "seed"), np.full((2, 2, 2), 1.0 / 3.0)),
         "grad_gap_sq": (("d", "U_norm", "seed", "setting", "scale", "L"), gap),
         "grad_log_bound": (("d", "U_norm", "seed", "setting", "scale", "L"), np.log(100.0 * gap)),
         "grad_inf_sq": (("d", "U_norm", "seed", "setting", "scale"), np.ones(grad_shape)),
         "grad_log_K": (("d", "U_norm", "seed", "setting", "scale"), np.full(grad_shape, 2.0)),
         "grad_log_K_sharp": (("d", "U_norm", "seed", "setting", "scale"), np.full(grad_shape, 0.5)),
         "grad_max_quad": (("d", "U_norm", "seed", "setting", "scale"), np.full(grad_shape, 0.3)),
         "traj_g": (("setting", "traj_seed", "L", "t"), traj_g),
         "traj_g_risk": (("setting", "traj_seed", "L", "t"), 0.5 * traj_g),
         "traj_risk_inf": (("setting", "traj_seed", "t"), np.broadcast_to([1.0, 0.1, 0.01], (2, 2, 3)).copy()),
         "traj_dist_bayes": (("setting", "traj_seed", "t"), np.broadcast_to([1.0, 0.1, 0.01], (2, 2, 3)).copy()),
         "traj_trace_inv_sq": (("setting",), np.array([3.0, 5.25]))},
        coords={"d": d, "U_norm": U, "seed": seed, "query": query, "L": L, "level": levels, "setting": settings,
                "scale": scales, "traj_seed": traj_seeds, "t": t})
    return _attach(ds, "c2_concentration")


# --------------------------------------------------------------------------- C2 threshold

#: tau values: data points at 1.9, 2, 8 and 8.1 (either side of the break criterion's ends) and 4
C2T_TAU = (0.5, 1.0, 1.5, 1.9, 2.0, 3.0, 4.0, 6.0, 8.0, 8.1, 10.0, 12.0, 14.0)


def hinge(tau, break_tau=4.0):
    """Uniform exponents with a kink at ``break_tau``: slope -0.05 per unit tau before, -0.01 after."""
    tau = np.asarray(tau, dtype=float)
    return -0.05 * tau + 0.04 * np.maximum(0.0, tau - break_tau)


@factory("c2_threshold")
def c2t(tau=C2T_TAU, uniform=None, fixed=-0.5, L=(8, 16, 32, 64, 128, 256)):
    """``c2_threshold`` file: ``g = 3 L^fixed`` at t = 0, ``5 L^uniform(tau)`` at t = 100 (the sup),
    ``4 L^uniform`` at t = 200; ``uniform`` defaults to :func:`hinge` (break at tau = 4); seeds
    scale the gap by 0.5 and 1.5. ``fixed`` may be a number or one value per tau."""
    tau = np.asarray(tau, dtype=float)
    u = hinge(tau) if uniform is None else np.asarray(uniform, dtype=float)
    f = np.broadcast_to(np.asarray(fixed, dtype=float), tau.shape)
    L = np.asarray(L)
    Lr = (L / L[0])[None, :]
    g = np.stack([3.0 * Lr ** f[:, None], 5.0 * Lr ** u[:, None], 4.0 * Lr ** u[:, None]], axis=-1)   # (tau, L, t)
    g = g[:, None] * SEED_FACTORS[None, :, None, None]                                                   # (tau, seed, L, t)
    cc = np.where(tau > 4.0, (1.0 - 2.0 / np.sqrt(np.maximum(tau, 4.0 + 1e-12))) ** -1.5, np.inf)
    # the gap constant K: the seed-pooled L g_L(T)^2 at the largest L above 4 (ratio exactly 1 there),
    # +inf at and below 4; the families repeat the isotropic gaps (same exponents, same ratio)
    K = np.where(tau > 4.0, L[-1] * np.mean(g[:, :, -1, -1] ** 2, axis=1), np.inf)
    fams = ["kms:0.5", "power_law:1.0"]
    per_fam = np.ones((2, tau.size))
    ds = xr.Dataset(
        {"g": (("tau", "seed", "L", "t"), g),
         "g_risk": (("tau", "seed", "L", "t"), 0.5 * g),
         "s": (("tau", "seed"), np.repeat(np.sqrt(3.0 / tau)[:, None], 2, 1)),
         "concentration_constant": (("tau", "seed"), np.repeat(cc[:, None], 2, 1)),
         "gap_constant": (("tau",), K),
         "gap_constant_se": (("tau",), np.where(np.isfinite(K), 0.01 * K, 0.0)),
         "g_family": (("family", "tau", "family_seed", "L", "t_family"), np.stack([g, g])),
         "dist_bayes_family": (("family", "tau", "family_seed", "t_family"), np.full((2, tau.size, 2, 3), 1e-3)),
         "off_block_family": (("family", "tau", "family_seed", "t_family"), np.zeros((2, tau.size, 2, 3))),
         "family_trace": (("family", "tau"), 3.0 * per_fam),
         "family_op_norm": (("family", "tau"), 2.0 * per_fam),
         "family_condition": (("family", "tau"), 4.0 * per_fam),
         "family_tr_inv2": (("family", "tau"), tau * per_fam),
         "concentration_constant_family": (("family", "tau"), cc * per_fam),
         "gap_constant_family": (("family", "tau"), K * per_fam),
         "gap_constant_family_se": (("family", "tau"), np.where(np.isfinite(K), 0.01 * K, 0.0) * per_fam)},
        coords={"tau": tau, "seed": [0, 1], "L": L, "t": [0, 100, 200], "family": fams, "family_seed": [0, 1],
                "t_family": [0, 400, 800]})
    return _attach(ds, "c2_threshold")


# --------------------------------------------------------------------------- C3

C3_L = tuple(8 * 2**k for k in range(10))          # 8 .. 4096, as the paper profile


@factory("c3_transfer")
def c3(L=C3_L):
    """``c3_transfer`` file: Gaussian settings with ``D(L) = 0.5 (L/8)^-1/2`` (sup over t at t = 20;
    seeds 0.5x and 1.5x), held-out risk ``0.01 (L/8)^-0.7`` at the end (at the start ``1 + 0.01 k``
    at the k-th L: rising), final distance to Bayes ``(L/8)^-0.3`` (1 at t = 0), exact block
    structure, theta_inf at 1e-12 risk and 1e-4 from Bayes (1 at t = 0), softmax within 1% of
    linear; the Rademacher control (one seed in the protocol, the other NaN with ``in_protocol =
    0``) falls from 2.2 to a plateau at 0.2."""
    settings = list(C3_SETTINGS)                     # isotropic, anisotropic, rademacher
    L = np.asarray(L)
    nL, t, th = L.size, [0, 20, 40], [0, 40]
    gm = ("setting", "seed", "model", "L", "t")
    D = np.empty((3, 2, 2, nL, 3))
    gauss = power(L, -0.5, 0.5)
    control = 0.2 + 2.0 * power(L, -2.0)
    for i, curve in enumerate([gauss, gauss, control]):
        D[i, :, 0] = np.stack([0.0 * curve, curve, 0.5 * curve], axis=-1)        # softmax: sup at t = 20
        D[i, :, 1] = np.stack([0.0 * curve, 0.9 * curve, 0.4 * curve], axis=-1)  # linear
    D *= SEED_FACTORS[None, :, None, None, None]
    risk_h = np.empty((3, 2, 2, nL, 2))
    risk_h[..., 0] = 1.0 + 0.01 * np.arange(nL)                                  # initial: rises with L
    risk_h[..., 1] = power(L, -0.7, 0.01)
    dist = np.stack([np.ones(nL), np.full(nL, 0.5), power(L, -0.3)], axis=-1)          # final: (L/8)^-0.3
    dist = np.broadcast_to(dist, (3, 2, 2, nL, 3)).copy()
    over_t = np.array([1.0, 1e-3, 1e-12])
    one = np.ones((3, 2))
    data = {
        "in_protocol": (("setting", "seed"), np.array([[1.0, 1.0], [1.0, 1.0], [1.0, 0.0]])),
        "D_inf": (gm, D),
        "D_linL": (("setting", "seed", "L", "t"), 1.01 * D[:, :, 0]),
        "dist_bayes": (gm, dist),
        "off_block": (gm, np.zeros((3, 2, 2, nL, 3))),
        "off_block_perturbed": (gm, np.full((3, 2, 2, nL, 3), 1e-12)),
        "conservation": (gm, np.full((3, 2, 2, nL, 3), 1e-4)),
        "risk_train": (gm, np.broadcast_to(over_t, (3, 2, 2, nL, 3)).copy()),
        "risk_train_perturbed": (gm, np.broadcast_to(over_t, (3, 2, 2, nL, 3)).copy()),
        "risk_heldout": (("setting", "seed", "model", "L", "t_heldout"), risk_h),
        "risk_heldout_eval": (("setting", "seed", "model", "L", "t_heldout"), 0.9 * risk_h),
        "norm_inf": (("setting", "seed", "t"), np.broadcast_to([0.5, 1.0, 1.0], (3, 2, 3)).copy()),
        "risk_inf": (("setting", "seed", "t"), one[..., None] * over_t),
        "dist_bayes_inf": (("setting", "seed", "t"), one[..., None] * np.array([1.0, 0.1, 1e-4])),
        "off_block_inf": (("setting", "seed", "t"), np.zeros((3, 2, 3))),
        "conservation_inf": (("setting", "seed", "t"), np.full((3, 2, 3), 1e-4)),
        "risk_heldout_inf": (("setting", "seed", "t_heldout"), np.broadcast_to([1.0, 1e-12], (3, 2, 2)).copy()),
        "risk_heldout_inf_eval": (("setting", "seed", "t_heldout"), np.broadcast_to([1.0, 1e-3], (3, 2, 2)).copy()),
        "risk_ridge": (("setting", "seed", "L"), np.full((3, 2, nL), 1e-30)),
        "risk_plugin": (("setting", "seed", "L"), np.broadcast_to(power(L, -1.0), (3, 2, nL)).copy()),
        "risk_pgd": (("setting", "seed", "L"), np.broadcast_to(power(L, -1.0, 2.0), (3, 2, nL)).copy()),
        "risk_bayes_ridge": (("setting", "seed", "L"), np.full((3, 2, nL), 1e-30)),
        "off_block_curvature_max": (gm, np.full((3, 2, 2, nL, 3), 50.0)),      # lr * 50 = 0.5: stable
        "off_block_curvature_min": (gm, np.full((3, 2, 2, nL, 3), 1.0)),
    }
    ds = xr.Dataset(data, coords={"setting": settings, "seed": [0, 1], "model": list(C3_MODELS), "L": L,
                                  "t": t, "t_heldout": th})
    outside = dict(setting="rademacher", seed=1)     # not in the protocol: NaN, as the pipeline writes it
    for name in ds.data_vars:
        if name != "in_protocol":
            ds[name].loc[outside] = np.nan
    return _attach(ds, "c3_transfer", {"lr": 0.01, "n_steps": 40})


# --------------------------------------------------------------------------- C3 landscape


@factory("c3_landscape")
def c3l(L=(8, 16, 32, 64, 128)):
    """``c3_landscape`` file: two covariances x noise {0, 0.5} x d = 2 x mean_norm {0, 1} x two seeds.
    Centred settings: ``D(L) = 0.5 (L/8)^-1/2`` for softmax (linear: 0.1, would pass nothing),
    ``D_linL = D``, excess held-out risk of softmax over the Bayes floor ``(L/8)^-0.7``; the control
    (mean_norm 1): ``D`` flat at 0.3 and a limit gap of 0.1 (0 when centred); exact block structure."""
    L = np.asarray(L)
    nL = L.size
    covs, noises, means = ["isotropic", "kms:0.5"], [0.0, 0.5], [0.0, 1.0]
    shape = (2, 2, 1, 2, 2)                                     # covariance, noise, d, mean_norm, seed
    g = ("covariance", "noise", "d", "mean_norm", "seed")
    seeds = SEED_FACTORS.reshape(1, 1, 1, 1, 2)
    centred = np.array([1.0, 0.0]).reshape(1, 1, 1, 2, 1)
    curve = centred[..., None] * power(L, -0.5, 0.5) + (1 - centred[..., None]) * 0.3
    D = np.empty(shape + (2, nL))
    D[..., 0, :] = seeds[..., None] * curve
    D[..., 1, :] = 0.1
    bayes = np.broadcast_to(np.array([0.0, 0.2]).reshape(1, 2, 1, 1, 1, 1), shape + (nL,)) + 0.0
    risk = np.empty(shape + (2, nL))
    risk[..., 0, :] = bayes + seeds[..., None] * power(L, -0.7)
    risk[..., 1, :] = bayes + 5.0                                # linear: flat, would fail the slope
    data = {
        "D_inf_max": (g + ("model", "L"), D),
        "D_linL_max": (g + ("L",), D[..., 0, :].copy()),
        "off_block_max": (g + ("model", "L"), np.zeros(shape + (2, nL))),
        "risk_heldout_T": (g + ("model", "L"), risk),
        "risk_heldout_init": (g + ("model", "L"), np.full(shape + (2, nL), 1.0)),
        "risk_bayes_ridge": (g + ("L",), bayes.copy()),
        "risk_pgd": (g + ("L",), bayes + 0.1),
        "risk_pgd_theory": (g + ("L",), bayes + 0.1),
        "limit_gap": (g, np.broadcast_to(0.1 * (1 - centred), shape).copy()),
        "norm_inf_T": (g, np.ones(shape)),
        "Sigma_trace": (("covariance", "d"), np.full((2, 1), 2.0)),
        "Sigma_op_norm": (("covariance", "d"), np.array([[1.0], [1.5]])),
        "Sigma_condition": (("covariance", "d"), np.array([[1.0], [3.0]])),
        "Sigma_tr_inv2": (("covariance", "d"), np.array([[2.0], [4.4]])),
    }
    ds = xr.Dataset(data, coords={"covariance": covs, "noise": noises, "d": [2], "mean_norm": means, "seed": [0, 1],
                                  "model": list(C3_MODELS), "L": L})
    return _attach(ds, "c3_landscape", {"lr": 0.01, "n_steps": 40})
# --------------------------------------------------------------------------- C1 on real data


@factory("c1_real")
def c1_real(L=(16, 32, 64, 128, 256)):
    """``c1_real`` file: error to the exact limit ``c / L`` in its seed mean (seeds +-50%), the
    sharp constant exact at the largest L only, the error to the Gaussian surrogate exactly
    ``mse + bias``, the bias ``1e-3 U_norm^4`` (order 4); at U_norm = 0.8 the weight ratio is 5
    (heavy tilt, outside the 1/L criteria) and there the slope is -0.5, the constant off by 2 and
    the decomposition by 2: read by mistake, they would fail."""
    datasets, D, U = ["wine", "digits"], [2, 5], np.array([0.05, 0.1, 0.8])
    L = np.asarray(L)
    nL = L.size
    heavy = (U == 0.8)[None, None, :, None]                                  # (1, 1, U_norm, 1)
    c = np.array([[1.0, 2.0], [3.0, 4.0]])[:, :, None, None] * (1.0 + U)[None, None, :, None]
    mse = c * np.where(heavy, power(L, -0.5), power(L, -1.0))                # (dataset, D, U_norm, L)
    wiggle = 0.5 * (-1.0) ** np.arange(nL)
    wiggle[-1] = 0.0
    seeds = 1.0 + np.stack([wiggle, -wiggle], axis=-1)                       # (L, seed): mean 1
    asym = mse / np.where(np.arange(nL) == nL - 1, np.where(heavy, 0.5, 1.0), 1.5)
    bias = 1e-3 * np.broadcast_to(U**4, (2, 2, 3))                           # (dataset, D, U_norm)
    gauss = (mse + bias[..., None]) * np.where(heavy, 2.0, 1.0)
    per_seed = ("dataset", "D", "U_norm", "L", "seed")
    ds = xr.Dataset(
        {"mse": (per_seed, mse[..., None] * seeds),
         "mse_asymptotic": (per_seed, np.repeat(asym[..., None], 2, -1)),
         "mse_gauss": (per_seed, np.repeat(gauss[..., None], 2, -1)),
         "bias_gauss": (("dataset", "D", "U_norm", "seed"), np.repeat(bias[..., None], 2, -1)),
         "weight_ratio": (("dataset", "D", "U_norm", "seed"),
                          np.broadcast_to(np.where(U == 0.8, 5.0, 1.0)[:, None], (2, 2, 3, 2)).copy()),
         "limit_sq": (("dataset", "D", "U_norm", "seed"), np.broadcast_to((U**2)[:, None], (2, 2, 3, 2)).copy())},
        coords={"dataset": datasets, "D": D, "U_norm": U, "L": L, "seed": [0, 1]})
    return _attach(ds, "c1_real")


# --------------------------------------------------------------------------- C1 kernels


@factory("c1_kernels")
def c1_kernels(L=(16, 32, 64, 128)):
    """``c1_kernels`` file: errors ``c / L`` exactly (seeds scattering by +-50%, and their two queries
    by +-50% about the seed's error) equal to their
    prediction at the largest L only (1.5x before), gains equal to the limit's, z2 = 1, Stein errors
    1e-15 (smooth) and 1e-6 (ReLU), random-feature errors ``c / m`` for sigma^2 = 0.1 with their
    constant and ``m^-0.3`` for sigma^2 = 2 (constant inf)."""
    kernels, r, m = ["softmax", "relu", "rf_softmax"], [0.5, 1.0], np.array([4, 16, 64, 256])
    L = np.asarray(L)
    c = np.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])[:, :, None]          # (kernel, r, 1)
    mse = c * power(L, -1.0)
    seeds = np.stack([1 + 0.5 * (-1.0) ** np.arange(L.size), 1 - 0.5 * (-1.0) ** np.arange(L.size)], -1)
    seeds[-1] = 1.0
    theory = mse / np.where(np.arange(L.size) == L.size - 1, 1.0, 1.5)
    theory[2] = np.nan                                                        # rf_softmax: none by design
    gain = np.ones((3, 2, 2))
    rf = np.stack([0.05 / m, power(m, -0.3)])                                 # (rf_sigma2, rf_m)
    ds = xr.Dataset(
        {"mse": (("kernel", "r", "L", "seed"), mse[..., None] * seeds),
         "mse_query": (("kernel", "r", "L", "seed", "query"), (mse[..., None] * seeds)[..., None] * SEED_FACTORS),
         "mse_theory": (("kernel", "r", "L", "seed"), np.repeat(theory[..., None], 2, -1)),
         "gain_measured": (("kernel", "r", "seed"), gain.copy()),
         "gain_se": (("kernel", "r", "seed"), 0.01 * gain),
         "gain_limit": (("kernel", "r", "seed"), gain.copy()),
         "orth_share": (("kernel", "r", "seed"), 0.01 * gain),
         "z2": (("kernel", "r", "seed"), gain.copy()),
         "stein_error": (("stein_kernel",), np.array([1e-15] * 3 + [1e-6] * 4)),
         "stein_smoothness": (("stein_kernel",), np.array([0] * 3 + [1] * 4, dtype=np.int8),
                              {"flag_values": np.array([0, 1], dtype=np.int8), "flag_meanings": "smooth kinked"}),
         "rf_sq_error": (("rf_sigma2", "rf_m", "rf_draw"), np.repeat(rf[..., None], 3, -1)),
         "rf_constant": (("rf_sigma2", "rf_m"), np.array([[0.05] * 4, [np.inf] * 4]))},
        coords={"kernel": kernels, "r": r, "L": L, "seed": [0, 1], "query": [0, 1],
                "stein_kernel": list(c1_kernels_pipeline.KERNEL_NAMES),
                "rf_sigma2": [0.1, 2.0], "rf_m": m, "rf_draw": [0, 1, 2]})
    return _attach(ds, "c1_kernels", {"Sigma": [1.5, 1.0, 0.5], "sigmoid_bias": -2.0})


# --------------------------------------------------------------------------- C3 deep


@factory("c3_deep")
def c3_deep(L=(16, 32, 64, 128, 256, 512, 1024), L_train=(8, 16, 32, 64, 128)):
    """``c3_deep`` file: (a) ``err = 2^(l-1) * 16 / L`` (layer l; constant 16 * 2^(l-1), growth
    2^(l-1); heads 2 twice as large; linear 0.9x; median 0.2x), ``cov_err = 0.5 (L/16)^-1/2``, ``out_sq = 1``,
    ``lambda_drawn = 0.6`` capped to ``lambda_max = 0.2``;
    seeds 0.5x and 1.5x. (b) ``D_inf`` softmax ``(L/8)^-1/2`` at t = 10 (the sup), half at t = 20,
    0 at t = 0; linear 0.9x; ``D_linL`` 0.1x; held-out risk 1 -> 0.1 (limit model 1 -> 0.2)."""
    L, Lt = np.asarray(L), np.asarray(L_train)
    layers = np.arange(1, 4)
    base = 16.0 / L[None, :] * 2.0 ** (layers[:, None] - 1)                           # (layer, L)
    err = np.stack([base, 0.9 * base])                                              # (kernel, layer, L)
    err = np.stack([err, 2 * err])[:, None] * SEED_FACTORS[None, :, None, None, None]  # (heads, seed, ...)
    cov = np.broadcast_to(power(L, -0.5, 0.5), err.shape) * SEED_FACTORS[None, :, None, None, None]
    curve = power(Lt, -0.5)
    Dsm = np.stack([0.0 * curve, curve, 0.5 * curve], axis=-1)                        # (L_train, t)
    D = np.broadcast_to(np.stack([Dsm, 0.9 * Dsm]), (2, 2, 2, 2, Lt.size, 3))
    D = D * SEED_FACTORS[None, None, :, None, None, None]
    stage = np.broadcast_to(np.array([1.0, 0.1]), (2, 2, 2, 2, Lt.size, 2))
    g = ("depth", "heads", "seed")
    ds = xr.Dataset(
        {"err": (("heads", "seed", "kernel", "layer", "L"), err),
         "err_median": (("heads", "seed", "kernel", "layer", "L"), 0.2 * err),
         "cov_err": (("heads", "seed", "kernel", "layer", "L"), cov),
         "out_sq": (("heads", "seed", "layer"), np.ones((2, 2, 3))),
         "lambda_drawn": (("heads", "seed", "layer"), np.full((2, 2, 3), 0.6)),
         "lambda_max": (("heads", "seed", "layer"), np.full((2, 2, 3), 0.2)),
         "U_shrink": (("heads", "seed", "layer"), np.full((2, 2, 3), 0.58)),
         "D_inf": ((*g, "model", "L_train", "t"), D),
         "D_linL": ((*g, "L_train", "t"), 0.1 * D[:, :, :, 0]),
         "risk": ((*g, "model", "L_train", "t"), np.broadcast_to(np.array([1.0, 0.5, 0.1]), D.shape).copy()),
         "risk_inf": ((*g, "t"), np.broadcast_to(np.array([1.0, 0.5, 0.1]), (2, 2, 2, 3)).copy()),
         "risk_heldout": ((*g, "model", "L_train", "stage"), stage.copy()),
         "risk_heldout_inf": ((*g, "stage"), np.broadcast_to(np.array([1.0, 0.2]), (2, 2, 2, 2)).copy()),
         "norm_inf": (g, np.ones((2, 2, 2)))},
        coords={"heads": [1, 2], "seed": [0, 1], "kernel": ["softmax", "linear"], "layer": layers, "L": L,
                "depth": [1, 2], "model": ["softmax", "linear"], "L_train": Lt, "t": [0, 10, 20],
                "stage": ["initial", "final"]})
    return _attach(ds, "c3_deep")


# --------------------------------------------------------------------------- C1 for your own head


@factory("c1_own")
def c1_own(L=(16, 32, 64, 128, 256)):
    """``c1_own`` file: the error to the exact limit exactly ``C / L`` in its unit mean (units +-20%,
    the same along L), ``C = const_sharp = 2`` for iid and ``tau * const_sharp = 4`` for windows,
    the error to the surrogate exactly ``mse + bias_gauss``: every measure is 1 (ratios), -1
    (slopes) or 0 (the slope interval's distance to -1). A file of ``n = 10^4`` tokens (every L within
    the windows' reach ``n / 20``), whose exact window error is ``4 (n - L) / ((n - 1) L)``."""
    L = np.asarray(L, dtype=float)
    n = 1e4
    C = np.array([2.0, 4.0])[:, None, None, None]                                # (sampling, 1, 1, 1)
    units = 1.0 + 0.2 * np.array([[1.0, -1.0], [-1.0, 1.0]])[None, :, :, None]   # (1, seed, prompt, 1)
    mse = C * units / L                                                          # (sampling, seed, prompt, L)
    dims = ("sampling", "seed", "prompt", "L")
    scalars = {"limit_sq": 1.0, "limit_sq_gauss": 1.0, "bias_gauss": 1e-3, "const_sharp": 2.0, "const_gauss": 2.0,
               "weight_ratio": 1.0, "tau": 2.0, "tau_se": 0.1, "n_batches": 100.0, "n_tokens": n}
    ds = xr.Dataset({"mse": (dims, mse), "mse_gauss": (dims, mse + 1e-3),
                     "window_mse": ("L", 4 * (n - L) / ((n - 1) * L)),
                     **{k: ((), v) for k, v in scalars.items()}},
                    coords={"sampling": ["iid", "window"], "seed": [0, 1], "prompt": [0, 1], "L": L.astype(int)})
    return _attach(ds, "c1_own", {"eps": [0.3, 0.1]})


# --------------------------------------------------------------------------- C3 dimension

C3_DIM_L = np.array([8, 16, 32, 64, 128, 256, 512])
C3_DIM_D = (3, 8, 16)
C3_DIM_SEEDS = np.array([0.9, 1.0, 1.1])


@factory("c3_dim")
def c3_dim(D_slope=-0.3, excess_slope=-1.0, T_slope=-0.5, not_converged=0, rises=0):
    """``c3_dim`` file with a known answer: per seed ``g``, ``max_t D_inf = f_g (L / 8)^D_slope`` (softmax),
    held-out risk of softmax(L) = ``risk_inf + 0.1 f_g (L / 8)^excess_slope``, ``flow_time = 4 f_g
    (d / 3)^T_slope`` (both settings) at ``lr = 0.01 (3 / d)`` (``T_conv = flow_time / lr`` steps); d = 16 capped
    at L = 128 (NaN beyond); ``not_converged`` runs of (isotropic, d = 8) flagged; ``rises`` rises of the
    population risk in run (power_law:1.0, d = 16, seed 1)."""
    S, G = ["isotropic", "power_law:1.0"], len(C3_DIM_SEEDS)
    L = C3_DIM_L.astype(float)
    f = C3_DIM_SEEDS[None, None, :, None, None]
    shape = (2, len(C3_DIM_D), G, 2, L.size)
    Dm = np.broadcast_to(f * (L / 8) ** D_slope, shape).copy()
    inf = np.full((2, len(C3_DIM_D), G), 0.02)
    ho = np.broadcast_to(0.02 + 0.1 * f * (L / 8) ** excess_slope, shape).copy()
    cap = L > 128
    for a in (Dm, ho):
        a[:, 2, :, :, cap] = np.nan
    dd = np.array(C3_DIM_D, float)[None, :, None]
    flow = np.broadcast_to(4 * C3_DIM_SEEDS[None, None, :] * (dd / 3) ** T_slope, (2, len(C3_DIM_D), G)).copy()
    lr = np.broadcast_to(0.01 * 3 / dd, flow.shape).copy()
    conv = np.ones((2, len(C3_DIM_D), G), dtype=np.int8)
    conv[0, 1, :not_converged] = 0
    up = np.zeros(flow.shape, dtype=np.int16)
    up[1, 2, 1] = rises
    g = ("setting", "d", "seed")
    gm = g + ("model", "L")
    ob = np.zeros(shape)
    ob[:, 2, :, :, cap] = np.nan
    ds = xr.Dataset(
        {"D_inf_max": (gm, Dm), "risk_heldout_T": (gm, ho), "risk_heldout_inf_T": (g, inf), "T_conv": (g, flow / lr),
         "lr": (g, lr), "flow_time": (g, flow), "risk_rises": (g, up),
         "converged": (g, conv), "off_block_max": (gm, ob), "inf_rerun_diff": (g, np.zeros(flow.shape)),
         "risk_pop_inf": (g, np.full(flow.shape, 0.004)), "risk_pop_init": (g, np.full(flow.shape, 0.5)),
         "dist_star_inf_T": (g, np.full(flow.shape, 0.1)), "norm_star": (g, np.full(flow.shape, 2.0)),
         "risk_train_inf": (g, np.full(flow.shape, 1e-3)), "n_pairs": (g, np.full(flow.shape, 18.0))},
        coords={"setting": S, "d": list(C3_DIM_D), "seed": np.arange(G), "model": ["softmax", "linear"],
                "L": C3_DIM_L, "t_flow": np.arange(0, 41) * 0.25})
    return _attach(ds, "c3_dim", {"lr_rule": "faithful", "lr_margin": 0.015, "tol": 0.01})


# --------------------------------------------------------------------------- C3 horizon

C3_HORIZON_T_MAX, C3_HORIZON_PER_OCTAVE, C3_HORIZON_RATE = 4000, 16, 3.6e-4
C3_HORIZON_L = np.array([8, 16, 32, 64, 128, 256, 512])
C3_HORIZON_K = np.array([0.8, 1.0, 1.25])          # per-seed speed of the distance


@factory("c3_horizon")
def c3_horizon(gamma_true=0.5, n_seeds=3):
    """``c3_horizon`` file with a known answer. softmax: ``D_inf = RATE k_g t (L / 8)^-gamma`` against
    ``||theta_inf|| = 1``, so ``T*`` is the first integer step above ``eps (L / 8)^gamma / (RATE k_g)``
    (beyond T_MAX at the largest L for eps = 0.2 in two seeds); linear(L): a distance that never
    reaches 5% (never). ``dist_star`` of softmax: ``b(L) + 0.01 (log t - log T_best(L))^2`` with
    ``b = 0.5 (L / 8)^-0.3`` (seed factors of mean 1) and ``T_best = 100 (L / 8)^0.25``."""
    t = training.log_checkpoint_steps(C3_HORIZON_T_MAX, C3_HORIZON_PER_OCTAVE)
    tt = t.astype(float)
    L = C3_HORIZON_L.astype(float)
    k = C3_HORIZON_K[:n_seeds]
    settings = ["isotropic", "anisotropic"]
    shape = (2, n_seeds, 2, L.size, t.size)
    D = np.empty(shape)
    D[:, :, 0] = C3_HORIZON_RATE * k[None, :, None, None] * tt * (L[:, None] / 8) ** -gamma_true
    D[:, :, 1] = 1e-3 * tt / (1 + tt)
    seed_b = np.array([0.9, 1.1, 1.0])[:n_seeds]
    seed_b = seed_b / seed_b.mean()
    b = 0.5 * (L / 8) ** -0.3
    T_best = 100 * (L / 8) ** 0.25
    with np.errstate(divide="ignore"):
        logt = np.log(np.maximum(tt, 1e-300))
    S = np.full(shape, 5.0)
    S[:, :, 0] = seed_b[None, :, None, None] * b[:, None] + 0.01 * (logt - np.log(T_best)[:, None]) ** 2
    S[:, :, 0, :, 0] = 10.0                                   # the init is far
    G = ("setting", "seed")
    ds = xr.Dataset(
        {"D_inf": (G + ("model", "L", "t"), D), "dist_star": (G + ("model", "L", "t"), S),
         "norm_inf": (G + ("t",), np.ones((2, n_seeds, t.size))),
         "dist_star_inf": (G + ("t",), np.broadcast_to(1e-4 + 1 / (1 + tt), (2, n_seeds, t.size)).copy()),
         "norm_star": (G, np.full((2, n_seeds), 2.0)),
         "risk_inf": (G + ("t",), np.broadcast_to(1e-9 + 1 / (1 + tt) ** 3, (2, n_seeds, t.size)).copy()),
         "conservation_inf": (G + ("t",), np.zeros((2, n_seeds, t.size))),
         "off_block_max": (G + ("model", "L"), np.zeros((2, n_seeds, 2, L.size)))},
        coords={"setting": settings, "seed": np.arange(n_seeds), "model": ["softmax", "linear"], "L": C3_HORIZON_L,
                "t": t})
    return _attach(ds, "c3_horizon", {"lr": 0.01})


# --------------------------------------------------------------------------- C3 on real covariates


@factory("c3_real")
def c3_real(L=(8, 16, 32, 64, 128), seeds=3):
    """``c3_real`` file: ``D_sinf = c (L/8)^-1/2`` in the seed mean (seeds scatter by +-20%, the
    same along L), ``D_linf`` tending to a gap of 0.3, held-out risks of softmax(L) tending to
    theta_sinf's (0.1) and theta_linf's under softmax(inf) 0.15."""
    L = np.asarray(L, dtype=float)
    datasets, ds_ = ["wine", "digits"], [3, 5]
    t = np.array([0, 50, 100])
    g = ("dataset", "d", "seed")
    shape = (2, 2, seeds)
    f = np.linspace(0.8, 1.2, seeds).reshape(1, 1, seeds)
    ramp = np.array([0.0, 0.5, 1.0])
    D = np.broadcast_to(f[..., None, None] * (0.5 * (L / 8) ** -0.5)[:, None] * ramp, shape + (L.size, 3)).copy()
    gap = np.broadcast_to(0.3 * ramp, shape + (3,))
    risk_L = 0.1 * (1 + 2 / L)
    data = {
        "D_sinf": (g + ("L", "t"), D),
        "D_linf": (g + ("L", "t"), D + gap[..., None, :]),
        "gap": (g + ("t",), gap.copy()),
        "norm_linf": (g + ("t",), np.full(shape + (3,), 1.5)),
        "risk_heldout": (g + ("L", "t_heldout"), np.broadcast_to(risk_L[:, None], shape + (L.size, 2)).copy()),
        "risk_heldout_sinf": (g + ("t_heldout",), np.full(shape + (2,), 0.1)),
        "risk_heldout_linf": (g + ("t_heldout",), np.full(shape + (2,), 0.01)),
        "risk_heldout_linf_as_sinf": (g + ("t_heldout",), np.full(shape + (2,), 0.15)),
    }
    ds = xr.Dataset(data, coords={"dataset": datasets, "d": ds_, "seed": np.arange(seeds), "L": L, "t": t,
                                  "t_heldout": [0, 100]})
    return _attach(ds, "c3_real")


# --------------------------------------------------------------------------- C3 under covariate shift


@factory("c3_shift")
def c3_shift(slope_by_seed=(-1.0, -1.0), n_seeds=2):
    """``c3_shift`` file whose ``|paired - 1|`` is exactly ``0.5 (L_eval / 16)^slope`` per seed: the
    linear(inf) Monte Carlo 1% above its closed form (0.4 exact SE), softmax(L_eval) risk that far above it
    times ``1 + |paired - 1|``."""
    Le = np.array([16.0, 64.0, 256.0, 1024.0])
    coords = {"setting": ["isotropic"], "seed": list(range(n_seeds)), "shift": ["none", "scale:2"],
              "theta": ["softmax(16)", "linear(inf)"], "L_eval": Le.astype(int), "i": [0, 1], "j": [0, 1]}
    sh = (1, n_seeds, 2, 2)
    exact = np.full(sh, 0.4)
    dev = np.stack([0.5 * (Le / 16) ** p for p in slope_by_seed[:n_seeds]])[None, :, None, None, :]
    ds = xr.Dataset({
        "risk_exact": (("setting", "seed", "shift", "theta"), exact),
        "risk_linf_mc": (("setting", "seed", "shift", "theta"), exact * 1.01),
        "risk_linf_mc_se": (("setting", "seed", "shift", "theta"), np.full(sh, 0.012)),
        "risk_linf_exact_se": (("setting", "seed", "shift", "theta"), np.full(sh, 0.01)),
        "risk_softmax": (("setting", "seed", "shift", "theta", "L_eval"), (exact * 1.01)[..., None] * (1 + dev)),
        "Sigma_test": (("setting", "seed", "shift", "i", "j"), np.broadcast_to(np.eye(2), (1, n_seeds, 2, 2, 2)).copy()),
    }, coords=coords)
    for k in ("risk_ridge", "risk_pgd_train", "risk_pgd_test"):
        ds[k] = (("setting", "seed", "shift", "L_eval"), np.full((1, n_seeds, 2, 4), 0.1))
    return _attach(ds, "c3_shift")
