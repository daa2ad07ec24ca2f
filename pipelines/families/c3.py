"""The C3 family: in-context linear regression trained at finite prompt length L against its limits
(docs/claims.md, C3; the models: docs/models.md, section 2; the protocols: docs/protocols.md).

Its shared cell is one training run (:class:`Run`): softmax(L) and linear(L) at every ``L`` and
linear(inf), trained by gradient descent from the Eq. 9 init on the same tasks
(:func:`sfxlin.training.train_all_arrays`), with the family's measures along it (:meth:`Run.trajectory`,
per checkpoint; a variant keeps them per ``t``, their maximum over ``t`` (``_max``) or their value at the
end ``T`` (``_T``): one meaning per name, :func:`kept`) and its held-out risks (:meth:`Run.heldout`). A
covariate setting is a named one (``isotropic``, ``anisotropic``, the ``rademacher`` control), whose covariance is
the ``sfxlin.covariance`` spec ``Sigma_<setting>``, or, where a variant says so, any covariance spec.
"""
from __future__ import annotations

import numpy as np

from sfxlin import covariance, curvature, icl, laws, training
from sfxlin.engine import Param, Variable
from sfxlin.engine.family import Cost, Family, multiples
from sfxlin.engine.sensitivity import step_perturbation
from sfxlin.realdata import DATASETS

MODELS = ("softmax", "linear")   # the finite-L models, coordinate ``model``
#: the named covariate settings: setting -> covariate law; its covariance is the spec ``Sigma_<setting>``
SETTINGS = {"isotropic": "gaussian", "anisotropic": "gaussian", "rademacher": "rademacher"}
#: the named settings with Gaussian covariates
GAUSSIAN = ("isotropic", "anisotropic")
#: parameters that only say which cells a grid has (they reach no cell)
GRID = ("settings", "n_seeds", "n_seeds_control")


def named(*settings) -> dict:
    """A variant's values of the named ``settings``: ``settings`` and each ``Sigma_<setting>`` at the family's
    own spec."""
    return {"settings": list(settings), **{f"Sigma_{s}": C3.param(f"Sigma_{s}").value for s in settings}}


def setting_inputs(config, cell):
    """What reaches a cell of a named setting: the run's parameters less the grid's and the covariance specs,
    plus the cell's own spec ``Sigma``."""
    inputs = {k: v for k, v in config.items() if k not in GRID and not k.startswith("Sigma_")}
    return {**inputs, "Sigma": config[f"Sigma_{cell['setting']}"]}


def setting_law(setting, inputs):
    """``(law, Sigma)`` of a cell of a named ``setting`` (``inputs``: its cell inputs): the covariate law
    (:data:`SETTINGS`) with the covariance of the cell's spec ``Sigma``."""
    Sigma = covariance.from_spec(inputs["Sigma"], inputs["d"])
    return laws.covariate_law(SETTINGS[setting], Sigma), Sigma


def draw(rng, d, law, n_pairs, n_queries, L_max, held=None, noise=0.0):
    """The training tasks (``n_pairs`` antithetic pairs x ``n_queries`` queries, nested prompts of ``L_max``
    tokens, label noise ``noise`` on prompts and targets), then, where ``held = (pairs, queries, L_max)``, the
    held-out tasks, in this draw order from ``rng`` (:func:`sfxlin.icl.make_tasks`); ``(tasks, held tasks or
    None)``."""
    tasks = icl.make_tasks(rng, d, n_pairs, n_queries, L_max, law, noise=noise, query_noise=noise)
    return tasks, None if held is None else icl.make_tasks(rng, d, *held, law, noise=noise, query_noise=noise)


class Run:
    """One training run of the three models on ``tasks`` (:func:`sfxlin.training.train_all_arrays` with
    ``run``'s keywords): ``res`` its result, ``U (model, L, t, D, D)``, ``v (model, L, t, D)`` of the finite-L
    models, ``U_inf (t, D, D)``, ``v_inf (t, D)`` of linear(inf). It takes the engine's step perturbation in
    an amplification run (a part of such runs declares ``perturbed=True``)."""

    def __init__(self, tasks, Ls, label, **run):
        self.tasks, self.Ls, self.lr = tasks, Ls, run["lr"]
        self.res = training.train_all_arrays(tasks, Ls, models=("softmax", "linear", "linear_inf"), label=label,
                                             perturb=step_perturbation(), **run)
        self.U = np.stack([self.res[m]["U"] for m in MODELS])
        self.v = np.stack([self.res[m]["v"] for m in MODELS])
        self.U_inf, self.v_inf = self.res["linear_inf"]["U"], self.res["linear_inf"]["v"]

    def trajectory(self, Sigma=None) -> dict:
        """The family's measures at every checkpoint: ``risk_train``, ``D_inf``, ``off_block``,
        ``conservation`` ``(model, L, t)``; ``D_linL`` ``(L, t)``; ``risk_inf``, ``off_block_inf``,
        ``conservation_inf``, ``norm_inf`` ``(t,)``; with ``Sigma``, the distances to the Bayes optimum
        ``theta_star = (U*, v*)`` of Remark 5.2 (:func:`sfxlin.icl.bayes_optimum`), ``dist_bayes`` ``(model, L,
        t)`` and ``dist_bayes_inf`` ``(t,)`` (stored by c3_horizon as ``dist_star`` and ``dist_star_inf``, the
        names of its shipped file: one quantity, theta_star being the Bayes optimum)."""
        U, v, U_inf, v_inf = self.U, self.v, self.U_inf, self.v_inf
        out = {"risk_train": np.stack([self.res[m]["risk"] for m in MODELS]), "risk_inf": self.res["linear_inf"]["risk"],
               "D_inf": icl.theta_distance(U, v, U_inf, v_inf), "D_linL": icl.theta_distance(U[0], v[0], U[1], v[1]),
               "off_block": icl.off_block_mass(U, v), "off_block_inf": icl.off_block_mass(U_inf, v_inf),
               "conservation": np.sum(U**2, axis=(-2, -1)) - np.sum(v**2, axis=-1),
               "conservation_inf": np.sum(U_inf**2, axis=(-2, -1)) - np.sum(v_inf**2, axis=-1),
               "norm_inf": np.sqrt(np.sum(U_inf**2, axis=(-2, -1)) + np.sum(v_inf**2, axis=-1))}
        if Sigma is not None:
            U_star, v_star = icl.bayes_optimum(Sigma)
            out["dist_bayes"] = icl.theta_distance(U, v, U_star, v_star)
            out["dist_bayes_inf"] = icl.theta_distance(U_inf, v_inf, U_star, v_star)
        return out

    def norm_inf_T(self):
        """``||theta_inf(T)||``, the norm of linear(inf) at the last checkpoint."""
        return np.sqrt(np.sum(self.U_inf[-1] ** 2) + np.sum(self.v_inf[-1] ** 2))

    def step_curvature(self) -> dict:
        """:func:`step_curvature` of the run: linear(inf) and linear(L) along their checkpoints."""
        return step_curvature(self.tasks, self.lr, self.U_inf, self.v_inf, self.Ls, self.U[1], self.v[1])

    def heldout(self, held, Ls, L_eval, at):
        """:func:`sfxlin.training.heldout_risks` of the checkpoints ``at`` (indices): ``at_L``, ``at_eval``
        ``(model, L, k)``, ``inf``, ``inf_eval`` ``(k,)``."""
        return training.heldout_risks(held, Ls, L_eval, {m: self.U[i][:, at] for i, m in enumerate(MODELS)},
                                      {m: self.v[i][:, at] for i, m in enumerate(MODELS)}, self.U_inf[at],
                                      self.v_inf[at])


def kept(traj: dict, t=(), max_t=(), T=()) -> dict:
    """The measures of :meth:`Run.trajectory` a variant stores, one meaning per name: those of ``t`` per
    checkpoint (their own names), those of ``max_t`` their maximum over the checkpoints (``<name>_max``), those
    of ``T`` their value at the last checkpoint (``<name>_T``)."""
    return {**{k: traj[k] for k in t}, **{f"{k}_max": traj[k].max(axis=-1) for k in max_t},
            **{f"{k}_T": traj[k][..., -1] for k in T}}


#: the outputs of :func:`step_curvature`: of linear(inf), and with linear(L)'s
STEP_CURVATURE_INF = ("lr_lambda_init_inf", "lr_lambda_max_inf", "lr_lambda_block_max_inf")
STEP_CURVATURE = STEP_CURVATURE_INF + ("lr_lambda_block_max_linear",)
#: bytes of the Jacobians of one batch of checkpoints in :func:`step_curvature` (bounds its memory)
_HESSIAN_BYTES = 1 << 26


def _lambdas(hessian, U, v, items):
    """``(whole, block)``: the largest eigenvalue of ``hessian(U, v)`` (a training Hessian over ``items`` tasks and
    queries) over all of theta and over its block coordinates (:func:`sfxlin.curvature.lambda_max`) at every
    checkpoint of ``U (t, D, D)``, ``v (t, D)``, a batch of checkpoints at a time."""
    D = U.shape[-1]
    per = max(1, _HESSIAN_BYTES // (8 * items * D * (D + 1)))
    whole, block = [], []
    for t0 in range(0, U.shape[0], per):
        H = hessian(U[t0:t0 + per], v[t0:t0 + per])
        whole.append(curvature.lambda_max(H))
        block.append(curvature.lambda_max(H, D - 1))
    return np.concatenate(whole), np.concatenate(block)


def step_curvature(tasks, lr, U_inf, v_inf, Ls=(), U_lin=None, v_lin=None) -> dict:
    """The step ``lr`` against the curvature of the training risks along a run (docs/performance.md, section
    10): ``lr_lambda_init_inf``, ``lr`` times the largest eigenvalue of linear(inf)'s training Hessian at its
    first checkpoint ``U_inf[0]`` (the Eq. 9 init), over all of theta; ``lr_lambda_max_inf`` and
    ``lr_lambda_block_max_inf``, the largest over the checkpoints ``U_inf (t, D, D)``, ``v_inf (t, D)``, over
    all of theta and over the block coordinates (:func:`sfxlin.curvature.block_coordinates`); with ``Ls``,
    ``lr_lambda_block_max_linear (L,)``, the same of linear(L) over its checkpoints ``U_lin (L, t, D, D)``,
    ``v_lin (L, t, D)``. Exact (:func:`sfxlin.curvature.linear_inf_training_hessian`,
    :func:`~sfxlin.curvature.linear_training_hessian`); above 2, gradient descent is unstable along that
    direction at that checkpoint."""
    items = tasks.n_tasks * tasks.n_queries
    whole, block = _lambdas(lambda U, v: curvature.linear_inf_training_hessian(tasks, U, v), U_inf, v_inf, items)
    out = {"lr_lambda_init_inf": np.float64(lr * whole[0]), "lr_lambda_max_inf": np.float64(lr * whole.max()),
           "lr_lambda_block_max_inf": np.float64(lr * block.max())}
    if len(Ls):
        block_L = [_lambdas(lambda U, v: curvature.linear_training_hessian(tasks, L, U, v), U_lin[i], v_lin[i],
                            items)[1] for i, L in enumerate(Ls)]
        out["lr_lambda_block_max_linear"] = lr * np.array([b.max() for b in block_L])
    return out


def finite(out, allowed=(), nan=()):
    """``out``, after checking that every value is finite but those of ``allowed`` (anything) and of ``nan``
    (NaN by design, never an infinity): a FloatingPointError naming the variable otherwise (the variables
    that allow NaN for the engine are checked here)."""
    for name, arr in out.items():
        ok = np.isfinite(arr) | np.isnan(arr) if name in nan else np.isfinite(arr)
        if name not in allowed and not np.all(ok):
            raise FloatingPointError(f"non-finite values in {name}")
    return out


def _heldout_on_checkpoints(config):
    if "heldout_every" not in config:
        return
    he, ce, T = config["heldout_every"], config["ckpt_every"], config["n_steps"]
    if he % ce or T % he:
        raise ValueError(f"heldout_every: {he} must be a multiple of ckpt_every = {ce} and divide n_steps = {T}")


def _sigmas_are_specs(config):
    """Every ``Sigma_<setting>`` of ``settings`` builds a ``d x d`` covariance."""
    for setting in config.get("settings", ()):
        if f"Sigma_{setting}" in config:
            covariance.spec_check(f"Sigma_{setting}")(config)


def train_counts(n_steps, n_pairs, n_queries, Ls, *, d, support=0, runs=1):
    """The work of ``runs`` runs of :func:`sfxlin.training.train_all_arrays` in the family's units: each step
    reads the ``sum L`` tokens (and ``support`` atoms of a softmax(inf) model) of every antithetic pair and
    query, a block of bookkeeping per pair, query and prompt length, and its own fixed cost. A token visit
    costs the ``3 d + 3`` multiply-adds of a logit and its moments: it counts ``(d + 1) / 4`` visits, one
    at d = 3, where the rate was measured (the engine's step per logit grows so: docs/performance.md,
    section 11)."""
    blocks = len(Ls) + (support > 0)
    return {"visit": runs * n_steps * n_pairs * n_queries * (sum(Ls) + support) * (d + 1) / 4,
            "block": runs * n_steps * n_pairs * n_queries * blocks, "step": runs * n_steps, "cell": 1}


def heldout_counts(n_evals, n_pairs, n_queries, Ls, L_eval):
    """The work of ``n_evals`` calls of :func:`sfxlin.training.heldout_risks` in the family's units: every
    softmax(L) at its ``L`` and, with linear(inf), at ``L_eval``."""
    return {"heldout_visit": n_evals * n_pairs * n_queries * (sum(Ls) + (len(Ls) + 1) * L_eval)}


#: the family's cost model: seconds per unit on the reference machine (docs/performance.md, "Cost models"): a
#: training token visit, a (pair, query, L) block, a step, a held-out token visit, an evaluated token visit of a
#: shifted prompt (a column of the one pass), a shifted held-out token (drawn, mapped, summed), a shift's fixed
#: cost, a cell's
RATES = {"visit": 4.7e-9, "block": 6.5e-7, "step": 3.9e-4, "heldout_visit": 1.03e-8, "eval_visit": 3.3e-9,
         "shift_token": 5e-8, "shift": 0.0025, "cell": 0.007}

_SPEC = "a covariance spec of sfxlin.covariance.from_spec (a diagonal may be given as its entries, 2,1,0.5)"
PARAMS = (
    Param("d", "int", "covariate dimension; tokens (x, y) have D = d + 1", 3, low=1),
    Param("settings", "str_list", "covariate settings: 'isotropic' and 'anisotropic' (Gaussian, covariance "
          "Sigma_<setting>), 'rademacher' (the control, x = Sigma^{1/2} r)", list(SETTINGS), choices=tuple(SETTINGS),
          grid=True),
    Param("Sigma_isotropic", "covariance", f"covariance of the 'isotropic' setting: {_SPEC}", "isotropic"),
    Param("Sigma_anisotropic", "covariance", f"covariance of the 'anisotropic' setting: {_SPEC}", "diagonal:2/1/0.5"),
    Param("Sigma_rademacher", "covariance", f"covariance of the Rademacher control, x = Sigma^{{1/2}} r: {_SPEC}",
          "isotropic"),
    Param("L", "int_list", "nested training prompt lengths", [8, 16, 32], unit="tokens", low=1, order="increasing",
          min_len=3, why="the analysis fits log-log slopes in L"),
    Param("n_pairs", "int", "antithetic training task pairs (w, -w) per cell", 4, low=1),
    Param("n_queries", "int", "query points per training task", 2, low=1),
    Param("lr", "float", "gradient-descent step size", 0.01, low=0, low_open=True),
    Param("n_steps", "int", "gradient-descent steps T (a multiple of ckpt_every)", 200, unit="steps", low=1),
    Param("ckpt_every", "int", "steps between checkpoints t", 20, unit="steps", low=1),
    Param("heldout_pairs", "int", "antithetic held-out task pairs per cell", 8, low=1),
    Param("heldout_queries", "int", "query points per held-out task", 2, low=1),
    Param("heldout_every", "int", "steps between held-out evaluations t_heldout (a multiple of ckpt_every dividing "
          "n_steps)", 100, unit="steps", low=1),
    Param("L_eval", "int", "long held-out prompt length at which every trained model is also evaluated", 128,
          unit="tokens", low=1),
    Param("ridge_lam", "float", "ridge penalty of the baseline on the prompt (0: minimum-norm least squares)", 0.0,
          low=0),
    Param("datasets", "str_list", "real data sets bundled with scikit-learn, whose whitened principal components "
          "are the covariates", list(DATASETS), choices=DATASETS, grid=True, unique=True),
)

_GM = ("model", "L")
OUTPUTS = (
    Variable("U", _GM + ("t", "row", "col"), "attention matrix U of model(L)", "gradient-descent iterate at the "
             "checkpoint (main run, Eq. 9 init, same tasks for every model and L)."),
    Variable("v", _GM + ("t", "row"), "read-out vector v of model(L)", "gradient-descent iterate at the checkpoint "
             "(main run)."),
    Variable("U_inf", ("t", "row", "col"), "attention matrix U of linear(inf) (theta_inf)", "gradient descent with "
             "Gamma_w (Lemma 2.1 limit) from the same init on the same tasks."),
    Variable("v_inf", ("t", "row"), "read-out vector v of linear(inf) (theta_inf)", "gradient descent with Gamma_w "
             "(Lemma 2.1 limit) from the same init on the same tasks."),
    Variable("risk_train", _GM + ("t",), "training risk of model(L)", "mean over training tasks and queries of 1/2 "
             "(pred - y_q)^2 at the checkpoint parameters, prompt length L."),
    Variable("risk_train_T", _GM, "final training risk of model(L)", "mean over training tasks and queries of 1/2 "
             "(pred - y_q)^2 at T."),
    Variable("risk_inf", ("t",), "training risk of linear(inf)", "mean over training tasks and queries of 1/2 (v^T "
             "Gamma_w U z_q - y_q)^2 at the checkpoint."),
    Variable("risk_inf_T", (), "final training risk of linear(inf)", "with Gamma_w (noise in its label corner) at T."),
    Variable("D_inf", _GM + ("t",), "distance of theta_L(t) to theta_inf(t)", "sqrt(||U_L(t) - U_inf(t)||_F^2 + "
             "||v_L(t) - v_inf(t)||^2) at the same step t (same tasks and Eq. 9 init for every model and L; 0 at t "
             "= 0)."),
    Variable("D_inf_max", _GM, "max_t distance of theta_L(t) to theta_inf(t)", "max over checkpoints of "
             "sqrt(||U_L(t) - U_inf(t)||_F^2 + ||v_L(t) - v_inf(t)||^2), same tasks and init."),
    Variable("D_linL", ("L", "t"), "distance between softmax(L) and linear(L) at the same L and t",
             "sqrt(||U_softmax - U_linear||_F^2 + ||v_softmax - v_linear||^2): the softmax nonlinearity at L."),
    Variable("D_linL_max", ("L",), "max_t distance between softmax(L) and linear(L)", "max over checkpoints of the "
             "parameter distance of the two models trained at the same L."),
    Variable("dist_bayes", _GM + ("t",), "distance of theta_L(t) to the Bayes optimum", "sqrt(||U - U*||_F^2 + ||v "
             "- v*||^2), (U*, v*) of Remark 5.2 for the setting's Sigma."),
    Variable("dist_bayes_inf", ("t",), "distance of theta_inf(t) to the Bayes optimum", "sqrt(||U_inf - U*||_F^2 + "
             "||v_inf - v*||^2), (U*, v*) of Remark 5.2."),
    Variable("off_block", _GM + ("t",), "off-block mass of theta_L(t)", "sqrt(||U[d, :]||^2 + ||U[:d, d]||^2 + "
             "||v[:d]||^2), measured (never imposed), main run."),
    Variable("off_block_max", _GM, "max_t off-block mass of theta_L(t)", "max over checkpoints of sqrt(||U[d, "
             ":]||^2 + ||U[:d, d]||^2 + ||v[:d]||^2), measured, never imposed."),
    Variable("off_block_inf", ("t",), "off-block mass of theta_inf(t)", "sqrt(||U[d, :]||^2 + ||U[:d, d]||^2 + "
             "||v[:d]||^2) of linear(inf), main run."),
    Variable("off_block_inf_max", (), "max_t off-block mass of theta_inf(t)", "as off_block_max, for linear(inf)."),
    Variable("conservation", _GM + ("t",), "||U||_F^2 - ||v||^2 of theta_L(t)", "conserved by the linear gradient "
             "flows (0 at the Eq. 9 init); gradient descent drifts by O(lr^2)."),
    Variable("conservation_inf", ("t",), "||U||_F^2 - ||v||^2 of theta_inf(t)", "0 at the Eq. 9 init and conserved "
             "by the gradient flow; gradient descent drifts by O(lr^2) a step."),
    Variable("norm_inf", ("t",), "norm of theta_inf(t)", "sqrt(||U_inf(t)||_F^2 + ||v_inf(t)||^2)."),
    Variable("norm_inf_T", (), "norm of theta_inf(T)", "sqrt(||U_inf(T)||_F^2 + ||v_inf(T)||^2)."),
    Variable("risk_heldout", _GM + ("t_heldout",), "held-out risk of model(L) at its training L",
             "mean over held-out tasks and queries of 1/2 (pred - y_q)^2, theta_L(t) evaluated with held-out "
             "prompts of length L (softmax(L) resp. linear(L) with the held-out Ghat_L)."),
    Variable("risk_heldout_init", _GM, "held-out risk of model(L) at the init", "mean over held-out tasks and "
             "queries of 1/2 (pred - y_q)^2, Eq. 9 init, held-out prompts of length L."),
    Variable("risk_heldout_T", _GM, "held-out risk of model(L) at T", "as risk_heldout_init, at the trained "
             "parameters theta_L(T)."),
    Variable("risk_heldout_inf", ("t_heldout",), "held-out risk of theta_inf under linear(inf)", "mean over "
             "held-out tasks and queries of 1/2 (v^T Gamma_w U z_q - y_q)^2."),
    Variable("risk_heldout_inf_T", (), "held-out risk of theta_inf(T) under linear(inf)", "mean over held-out tasks "
             "and queries of 1/2 (v^T Gamma_w U z_q - y_q)^2 at T."),
    Variable("risk_bayes_ridge", ("L",), "held-out risk of the posterior mean of w (the Bayes estimator)",
           "sfxlin.baselines.posterior_mean (ridge at the Bayes penalty noise^2 for w ~ N(0, I)) on the held-out "
           "prompts of length L: the Monte Carlo Bayes floor of the task (rounding level once L >= d when noiseless)."),
    Variable("risk_pgd", ("L",), "held-out risk of one step of optimally preconditioned gradient descent",
             "w_hat = Gamma_L (1/L) sum_k y_k x_k with the risk-minimising Gamma_L = [(1 + 1/L) Sigma + (tr Sigma / "
             "L) I]^{-1} for centred Gaussian covariates (sfxlin.baselines.pgd; the optimum of linear(L) "
             "attention), held-out prompts of length L."),
    Variable("lr_lambda_init_inf", (), "lr x largest curvature of linear(inf)'s training risk at the init",
             "the step lr times the largest eigenvalue of the Hessian of linear(inf)'s training risk over all of theta "
             "(sfxlin.curvature.linear_inf_training_hessian) at the Eq. 9 init: > 2, gradient descent is unstable "
             "there along some direction (docs/performance.md, section 10)."),
    Variable("lr_lambda_max_inf", (), "lr x largest curvature of linear(inf)'s training risk along the run",
             "as lr_lambda_init_inf, the largest over the checkpoints of theta_inf(t); at a block-structured point "
             "the off-block coordinates usually set it: > 2, an off-block perturbation grows (the run's own off-block "
             "mass stays 0 on exact antithetic pairs)."),
    Variable("lr_lambda_block_max_inf", (), "lr x largest block curvature of linear(inf)'s training risk along the run",
             "as lr_lambda_max_inf, over the block coordinates U[:d, :d], v[d] (sfxlin.curvature.block_coordinates), "
             "on which the trajectory moves: > 2, the trajectory itself is beyond the stable step (oscillation, "
             "catapults, rounding amplified)."),
    Variable("lr_lambda_block_max_linear", ("L",), "lr x largest block curvature of linear(L)'s training risk along "
             "the run", "as lr_lambda_block_max_inf, for linear(L) (Ghat_L, sfxlin.curvature."
             "linear_training_hessian) at its own checkpoints theta_L(t)."),
    Variable("n_exact_shift_steps", (), "softmax steps with the exact max shift (main run)", "engine diagnostic: "
             "steps whose cached log-sum-exp shift was out of range and were recomputed exactly.", units="1"),
    Variable("norm_star", (), "norm of theta_star", "sqrt(||U*||_F^2 + ||v*||^2) = sqrt(2) ||Sigma^-1||_F^(1/2)."),
)


def _train_counts(config, part, cell):
    """The family's counts: one run of ``n_steps`` steps over the cell's training tasks."""
    return train_counts(config["n_steps"], config["n_pairs"], config["n_queries"], config["L"], d=config["d"])


C3 = Family("C3", PARAMS, OUTPUTS,
            coords={"model": lambda c: MODELS, "L": lambda c: c["L"],
                    "t": lambda c: training.checkpoint_steps(c["n_steps"], c["ckpt_every"]).tolist(),
                    "t_heldout": lambda c: training.checkpoint_steps(c["n_steps"], c["heldout_every"]).tolist(),
                    "row": lambda c: range(c["d"] + 1), "col": lambda c: range(c["d"] + 1)},
            checks=(multiples(("n_steps", "ckpt_every")), _heldout_on_checkpoints, _sigmas_are_specs),
            cost=Cost(RATES, _train_counts))
