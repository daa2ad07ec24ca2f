"""C3 shift: the trained C3 models on shifted test prompts against their exact large-prompt prediction
(docs/claims.md, "C3 shift"; the shifts: :mod:`sfxlin.shift`; the closed form:
:func:`sfxlin.icl.linear_inf_risk`).

Grid (one dask task per cell): ``setting x seed``; ``setting`` is C3's Gaussian ``isotropic``
(``Sigma = I_d``) or ``anisotropic`` (``Sigma = diag(2, 1, 0.5)``), each ``Sigma`` a parameter.

Inside a cell, in this draw order from the cell's generator: the training tasks (``n_pairs``
antithetic pairs x ``n_queries`` queries, nested prompts of ``max(L)`` tokens, covariates
``N(0, Sigma)``), then the held-out tasks (``heldout_pairs`` pairs x ``heldout_queries`` queries,
prompts of ``max(L_eval)`` tokens, the same law). Then

1. training as C3's main run (:func:`sfxlin.training.train_all_arrays`, exact): gradient descent
   (``lr``, ``n_steps``) from the Eq. 9 init for softmax(L) at every training ``L`` and for
   linear(inf); the parameters kept are those at ``T`` (coordinate ``theta``: ``softmax(L)`` per
   ``L``, and ``linear(inf)``, theta_inf(T));
2. per shift (coordinate ``shift``, a spec of :func:`sfxlin.shift.parse_shift`: ``none``,
   ``scale:C``, ``rotate:SEED``, ``subspace:K`` or a covariance spec such as ``power_law:2.0``): the
   held-out tasks mapped by the shift's ``A`` (``x' = A x``, labels ``w^T x'``; common random
   numbers across shifts), and on them, per trained ``theta``:

   * the measured risk of softmax(``L_eval``) with ``theta`` at every ``L_eval`` (the first
     ``L_eval`` tokens of each shifted prompt), with its SE over held-out pairs;
   * the prediction: the exact risk of ``theta`` under linear(inf) with the test covariance
     ``Sigma' = A Sigma A^T`` (closed form), and its Monte Carlo on the same held-out tasks (with SE);
     the SE over pairs of the paired difference softmax(``L_eval``) minus that Monte Carlo;

   and per ``L_eval`` the baselines on the same shifted prompts: ridge (``ridge_lam``; 0: minimum-norm
   least squares) and one step of preconditioned gradient descent with the preconditioner of the
   training ``Sigma`` (what linear attention at its optimum implements, shift-unaware) and of the test
   ``Sigma'`` (the oracle; NaN by design when ``Sigma'`` is singular, ``subspace``).

Paper profile: C3's training (d = 3, 48 pairs x 2 queries, lr 0.01, T = 2500) at L = 16, 64, 256,
1024 (a subset of C3's 8 .. 4096), 6 seeds; held-out 256 pairs x 4 queries; L_eval = 16 .. 4096
(x4); shifts none, scale:0.5, scale:2, power_law:2.0, rotate:1, subspace:2.
"""
from __future__ import annotations

import numpy as np

from sfxlin import icl, laws, shift, training
from sfxlin.engine.params import Param, Profiles
from sfxlin.engine.sweep import Experiment, Part, Variable
from sfxlin.pipelines.c3_transfer import sigmas_are_d_by_d, train_work

NAME = "c3_shift"
SETTINGS = ("isotropic", "anisotropic")
INF = "linear(inf)"

_MATRIX = "d diagonal entries or a d x d symmetric positive-definite matrix"

PARAMS = (
    Param("d", "int", "covariate dimension; tokens (x, y) have D = d + 1", 3, low=2),
    Param("settings", "str_list", "training covariate settings (Gaussian)", list(SETTINGS), choices=SETTINGS,
          grid=True, unique=True),
    Param("Sigma_isotropic", "matrix", f"training covariance of the 'isotropic' setting: {_MATRIX}", [1.0, 1.0, 1.0]),
    Param("Sigma_anisotropic", "matrix", f"training covariance of the 'anisotropic' setting: {_MATRIX}",
          [2.0, 1.0, 0.5]),
    Param("n_seeds", "int", "seeds per setting", Profiles(quick=2, paper=6), low=1, grid=True),
    Param("n_pairs", "int", "antithetic training task pairs (w, -w) per cell", Profiles(quick=2, paper=48), low=1),
    Param("n_queries", "int", "query points per training task", 2, low=1),
    Param("L", "int_list", "nested training prompt lengths (one trained softmax(L) per L)",
          Profiles(quick=[8, 16], paper=[16, 64, 256, 1024]), unit="tokens", low=1, order="increasing"),
    Param("lr", "float", "gradient-descent step size", 0.01, low=0, low_open=True),
    Param("n_steps", "int", "gradient-descent steps T", Profiles(quick=40, paper=2500), unit="steps", low=1),
    Param("shifts", "str_list", "test shifts (sfxlin.shift.parse_shift: none, scale:C, rotate:SEED, subspace:K, "
          "or a covariance spec; no ',' or ';')",
          Profiles(quick=["none", "scale:2", "subspace:2"],
                   paper=["none", "scale:0.5", "scale:2", "power_law:2.0", "rotate:1", "subspace:2"]), unique=True),
    Param("L_eval", "int_list", "nested held-out prompt lengths at which every trained theta is evaluated",
          Profiles(quick=[8, 16, 32], paper=[16, 64, 256, 1024, 4096]), unit="tokens", low=1, order="increasing",
          min_len=3, why="the analysis fits the log-log slope of |ratio - 1| in L_eval"),
    Param("heldout_pairs", "int", "antithetic held-out task pairs per cell (the units of the SEs)",
          Profiles(quick=4, paper=256), low=2),
    Param("heldout_queries", "int", "query points per held-out task", Profiles(quick=2, paper=4), low=1),
    Param("ridge_lam", "float", "ridge penalty of the baseline (0: minimum-norm least squares)", 0.0, low=0),
    Param("root_seed", "int", "root of every cell's random generator", 20261202),
)


def grid(config):
    return {"setting": list(config["settings"]), "seed": list(range(config["n_seeds"]))}


def theta_labels(Ls):
    """The ``theta`` coordinate: ``softmax(L)`` per training ``L``, then ``linear(inf)``."""
    return [f"softmax({int(L)})" for L in Ls] + [INF]


def inner_coords(config):
    d = config["d"]
    return {"shift": list(config["shifts"]), "theta": theta_labels(config["L"]), "L_eval": list(config["L_eval"]),
            "i": list(range(d)), "j": list(range(d))}


def cell_inputs(config, cell):
    """The run's parameters less the grid's and the covariances, plus the cell's own ``Sigma``."""
    inputs = {k: v for k, v in config.items() if k not in ("settings", "n_seeds") and not k.startswith("Sigma_")}
    inputs["Sigma"] = config[f"Sigma_{cell['setting']}"]
    return inputs


def _mean_se(pairs):
    """Mean and SE over the last axis (held-out pairs, independent)."""
    return pairs.mean(axis=-1), pairs.std(axis=-1, ddof=1) / np.sqrt(pairs.shape[-1])


def kernel(cell, rng, config):
    d = config["d"]
    Sigma = np.asarray(config["Sigma"], dtype=float)
    law = laws.covariate_law("gaussian", Sigma)
    Ls, Le = config["L"], config["L_eval"]
    tasks = icl.make_tasks(rng, d, config["n_pairs"], config["n_queries"], Ls[-1], law)
    held = icl.make_tasks(rng, d, config["heldout_pairs"], config["heldout_queries"], Le[-1], law)
    T = config["n_steps"]
    res = training.train_all_arrays(tasks, Ls, models=("softmax", "linear_inf"), lr=config["lr"], n_steps=T,
                                    ckpt_every=T, label="training")
    U = np.concatenate([res["softmax"]["U"][:, -1], res["linear_inf"]["U"][-1][None]])   # (theta, D, D)
    v = np.concatenate([res["softmax"]["v"][:, -1], res["linear_inf"]["v"][-1][None]])   # (theta, D)
    risk_train = np.concatenate([res["softmax"]["risk"][:, -1], [res["linear_inf"]["risk"][-1]]])
    out = {k: [] for k in ("risk_softmax", "risk_softmax_se", "risk_exact", "risk_linf_mc", "risk_linf_mc_se",
                           "diff_se", "risk_ridge", "risk_pgd_train", "risk_pgd_test", "Sigma_test")}
    for spec in config["shifts"]:
        P = shift.shifted_prompts(held, shift.shift_map(spec, Sigma))
        sm = np.stack([shift.softmax_pair_risks(U, v, P, L) for L in Le], axis=1)     # (theta, L_eval, pairs)
        lin = shift.linear_inf_pair_risks(U, v, P)                                     # (theta, pairs)
        for name, pairs in (("risk_softmax", sm), ("risk_linf_mc", lin)):
            out[name].append(pairs.mean(axis=-1))
            out[f"{name}_se"].append(_mean_se(pairs)[1])
        out["diff_se"].append(_mean_se(sm - lin[:, None])[1])
        out["risk_exact"].append(icl.linear_inf_risk(U, v, P.Sigma))
        out["risk_ridge"].append(shift.ridge_pair_risks(P, Le, config["ridge_lam"]).mean(axis=-1))
        out["risk_pgd_train"].append(shift.pgd_pair_risks(P, Le, Sigma).mean(axis=-1))
        out["risk_pgd_test"].append(np.full(len(Le), np.nan) if shift.is_singular(spec, d)
                                    else shift.pgd_pair_risks(P, Le, P.Sigma).mean(axis=-1))
        out["Sigma_test"].append(P.Sigma)
    out = {k: np.stack(a) for k, a in out.items()}
    out["risk_train"] = risk_train
    for name, arr in out.items():
        finite = np.isfinite(arr) if name != "risk_pgd_test" else np.isfinite(arr) | np.isnan(arr)
        if not np.all(finite):
            raise FloatingPointError(f"non-finite values in {name}")
    return out


def cell_work(config, part):
    """Work of one cell in its non-grid parameters (``sfxlin run --plan``'s cost law,
    :mod:`sfxlin.engine.plan`; the grid dims' costs are fitted) in
    :func:`~sfxlin.pipelines.c3_transfer.train_work` units: the training (softmax(L) at every ``L``
    and linear(inf)), then per shift every trained theta (``len(L) + 1``) evaluated on the
    ``2 heldout_pairs x heldout_queries`` shifted items at every ``L_eval`` (``EVAL_VISIT_WORK`` per token
    visit) and its fixed cost ``SHIFT_WORK`` (the shifted prompts, the ridge and PGD baselines), plus
    ``CELL_OVERHEAD_WORK``."""
    Ls, Le = config["L"], config["L_eval"]
    evals = len(config["shifts"]) * (len(Ls) + 1) * 2 * config["heldout_pairs"] * config["heldout_queries"] * sum(Le)
    return (train_work(config["n_steps"], config["n_pairs"], config["n_queries"], Ls) + EVAL_VISIT_WORK * evals
            + SHIFT_WORK * len(config["shifts"]) + CELL_OVERHEAD_WORK)


#: :func:`cell_work`'s constants: warm CPU seconds of the quick cell isotropic, seed 0 under 9 configurations
#: (``python -m sfxlin.engine.plan c3_shift --set ...``: n_steps 10 .. 400, 1 .. 6 shifts, heldout_pairs x
#: heldout_queries 4x2 .. 128x4, L_eval up to 2048) fitted (least relative squares) to 4.1e-9 s per training token
#: visit, 1.5e-8 s per evaluated token visit, 0.0025 s per shift and 0.0041 s: every one within 0.64 .. 1.06 of it
EVAL_VISIT_WORK = 3.6
SHIFT_WORK = 620_000
CELL_OVERHEAD_WORK = 1_000_000


_G = ("setting", "seed")
_GS = _G + ("shift",)
_GST = _GS + ("theta",)
_ON = " on the shifted held-out prompts (the held-out tasks mapped by the shift's A: x' = A x, y' = w^T x')"

VARIABLES = (
    Variable("risk_softmax", _GST + ("L_eval",), "measured held-out risk of softmax(L_eval) with theta",
             "mean over held-out tasks and queries of 1/2 (pred - y_q)^2, theta (trained, at T) used as softmax "
             "attention on the first L_eval tokens" + _ON + "."),
    Variable("risk_softmax_se", _GST + ("L_eval",), "SE of risk_softmax over held-out pairs",
             "standard deviation over the held-out antithetic pairs of their mean risk, over sqrt(pairs)."),
    Variable("risk_exact", _GST, "exact large-L prediction: risk of theta under linear(inf) with the test covariance",
             "sfxlin.icl.linear_inf_risk(U, v, Sigma_test): E over w ~ N(0, I_d) and x_q of 1/2 (v^T Gamma_w U z_q "
             "- y_q)^2, Gamma_w from Sigma_test (closed form; the limit of risk_softmax as L_eval -> inf)."),
    Variable("risk_linf_mc", _GST, "risk of theta under linear(inf) with the test covariance, Monte Carlo",
             "mean over the held-out tasks and queries" + _ON + " of 1/2 (v^T Gamma_w U z_q - y_q)^2, Gamma_w from "
             "Sigma_test and each task's w: the closed form's Monte Carlo on the same tasks as risk_softmax."),
    Variable("risk_linf_mc_se", _GST, "SE of risk_linf_mc over held-out pairs", "as risk_softmax_se."),
    Variable("diff_se", _GST + ("L_eval",), "SE of risk_softmax - risk_linf_mc over held-out pairs",
             "the paired difference per held-out pair (same tasks), its standard deviation over sqrt(pairs)."),
    Variable("risk_ridge", _GS + ("L_eval",), "held-out risk of ridge on the shifted prompt",
             "per held-out task, ridge (ridge_lam; 0: minimum-norm least squares pinv(X) y) on its first L_eval "
             "shifted tokens, risk 1/2 (x_q'^T w_hat - y_q')^2 averaged (noiseless: rounding once the prompt spans "
             "the test covariates' subspace)."),
    Variable("risk_pgd_train", _GS + ("L_eval",), "held-out risk of one-step preconditioned GD, training preconditioner",
             "w_hat = Gamma_L(Sigma) (1/L) X'^T y' (sfxlin.baselines.pgd_preconditioner of the TRAINING Sigma: "
             "the shift-unaware optimum of linear(L) attention) on the shifted prompts."),
    Variable("risk_pgd_test", _GS + ("L_eval",), "held-out risk of one-step preconditioned GD, test preconditioner",
             "as risk_pgd_train with the preconditioner of the test covariance (the oracle that knows the shift); "
             "NaN by design where the test covariance is singular (subspace:K: no inverse).", allow_nonfinite=True),
    Variable("Sigma_test", _GS + ("i", "j"), "test covariance Sigma' = A Sigma A^T", "sfxlin.shift.shifted_covariance."),
    Variable("risk_train", _G + ("theta",), "final training risk of theta",
             "mean over training tasks and queries of 1/2 (pred - y_q)^2 at T: softmax(L) at its training L, "
             "linear(inf) with Gamma_w."),
)

EXPERIMENT = Experiment(
    name=NAME, short="c3s", params=PARAMS,
    checks=(sigmas_are_d_by_d, shift.shift_check("shifts")),
    inner_coords=inner_coords, variables=VARIABLES, analysis="sfxlin.analysis.c3_shift",
    parts=(Part("", grid, kernel, inputs=cell_inputs),), scheduler="processes",
    title="C3 shift: trained C3 models on shifted test prompts against their exact linear(inf) prediction",
    description="C3 under test-time distribution shift: measured softmax(L_eval) risk vs the exact large-L prediction")
