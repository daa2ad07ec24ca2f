"""C2: concentration of softmax attention and stability of its gradient, a variant of the C2 family. Main grid
``d x U_norm x seed``: the output tails and the gradient concentration at fixed parameters, from three child
streams of the cell's generator; part ``trajectory`` (``setting x traj_seed``): a gap run at ``d = traj_d``; part
``trajectory_constants``: each setting's constants. The tail bounds' constants are OUR assumption (the paper's
are existential). The protocol: docs/protocols.md, "c2_concentration"."""
from __future__ import annotations

import dataclasses

import numpy as np

from sfxlin.concentration import gradient_concentration, output_tails
from sfxlin.engine import Cells, Param, Profiles, Variable, substream
from sfxlin.engine.sensitivity import DEFAULT_EPS, param as amplification_param
from sfxlin.gradient_gap import concentration_constant

from .families.c2 import C2, SETTINGS, gap_run, run_counts, run_of, setting_covariance

NAME = "c2_concentration"
_MAIN, _TRAJ = ("",), ("trajectory",)   # parts reached: the main part (tails, gradients), the trajectory part
#: the family's gap-run parameters as the trajectory part names them
TRAJ_RUN = {"n_pairs": "traj_pairs", "n_queries": "traj_queries", "n_replicates": "traj_replicates", "lr": "traj_lr",
            "n_steps": "traj_steps", "ckpt_every": "traj_ckpt_every"}
#: the family's gap-run outputs the trajectory part keeps, each as ``traj_<name>``
TRAJ_OUT = ("g", "g_risk", "risk_inf", "dist_bayes", "logit_factor")


def _enough_clt_draws(config):
    """The quantile Monte Carlo needs about 10 draws beyond the deepest tail level."""
    level = min(config["tail_levels"])
    if config["clt_draws"] * level < 10:
        raise ValueError(f"clt_draws: {config['clt_draws']} is too few for the tail level {level:g} "
                         "(need clt_draws * level >= 10)")


def kernel(cell, rng, config):
    """(a) the ``tail_*`` variables, (b) the ``grad_*`` variables of every inner ``(setting, scale)``."""
    d, U_norm = cell["d"], cell["U_norm"]
    rng_tail, rng_clt, rng_grad = rng.spawn(3)
    out = output_tails(rng_tail, rng_clt, d, U_norm, sigma=config["sigma"], Ls=np.asarray(config["L"]),
                       levels=np.asarray(config["tail_levels"], dtype=float), n_queries=config["tail_queries"],
                       n_prompts=config["tail_prompts"], clt_draws=config["clt_draws"], chunk=config["prompt_chunk"],
                       log_c1_per_d=config["tail_log_c1_per_d"], c2_scale=config["tail_c2"])
    Ls, scales = list(config["L"]), list(config["grad_scales"])
    shape = (len(SETTINGS), len(scales))
    out.update({k: np.empty(shape + (len(Ls),)) for k in ("grad_gap_sq", "grad_gap_sq_se", "grad_log_bound")})
    out.update({k: np.empty(shape) for k in ("grad_inf_sq", "grad_log_K", "grad_log_K_sharp", "grad_max_quad")})
    for i, setting in enumerate(SETTINGS):
        for j, scale in enumerate(scales):
            res = gradient_concentration(
                substream(rng_grad, setting=setting, scale=scale), setting_covariance(setting, d, scale), U_norm, Ls,
                n_pairs=config["grad_pairs"], n_queries=config["grad_queries"], n_draws=config["grad_draws"],
                grad_c=config["grad_c"])
            for key, value in res.items():
                out[key][i, j] = value
    return out


def trajectory_kernel(cell, rng, config):
    """(c) the gap run of one ``(setting, traj_seed)``, from the cell's own generator."""
    setting, traj_seed = cell["setting"], cell["traj_seed"]
    res = gap_run(rng, setting_covariance(setting, config["traj_d"]), config["L"],
                  f"{NAME}[{setting}, seed {traj_seed}]", **run_of(config, **TRAJ_RUN))
    return {**{f"traj_{k}": res[k] for k in TRAJ_OUT}, "traj_U_norm": np.linalg.norm(res["U_inf"], axis=(-2, -1))}


def constants_kernel(cell, rng, config):
    """``tr(Sigma^-2)`` and the concentration constant of one trajectory setting (no draws)."""
    Sigma = setting_covariance(cell["setting"], config["traj_d"])
    return {"traj_trace_inv_sq": np.sum(np.diag(Sigma) ** -2.0),
            "traj_concentration_constant": concentration_constant(Sigma)}


def counts(config, part, cell):
    """Main part: the tails' token visits (times ``d``), the CLT draws, the gradients' token visits and
    gradients; trajectory part: one gap run; constants part: one cell."""
    if part == "trajectory":
        return run_counts(config["L"], **run_of(config, **TRAJ_RUN))
    if part:
        return {"cell": 1}
    Ls, Q = config["L"], config["tail_queries"]
    sets = len(SETTINGS) * len(config["grad_scales"]) * config["grad_draws"]
    return {"tail_visit": Q * config["tail_prompts"] * max(Ls) * cell["d"] / 3, "clt_draw": Q * config["clt_draws"],
            "grad_visit": sets * 2 * config["grad_pairs"] * config["grad_queries"] * sum(Ls),
            "gradient": sets * len(Ls), "cell": 1}


_TAIL, _GRAD = ("query", "L", "level"), ("setting", "scale")
_T = "trajectory"
OUTPUTS = (
    Variable("tail_count", _TAIL, "tail exceedance count", "number of the tail_n prompts with ||f_L(q) - f_inf(q)|| "
             "> tail_threshold (softmax attention, V = I, Gaussian tokens N(0, sigma^2 I), f_inf = sigma^2 U q).",
             units="1"),
    Variable("tail_n", (), "prompts per tail test", "independent prompts per query (the n of every tail test).",
             units="1"),
    Variable("tail_threshold", _TAIL, "tail threshold t", "r / sqrt(L), r the (1 - level) quantile of ||N(0, C)||, "
             "C = lim L Cov(f_L) = exp(a'Sigma a)(Sigma + Sigma a a' Sigma), a = U q (Monte Carlo, clt_draws draws)."),
    Variable("tail_clt", _TAIL, "CLT tail probability", "P(||N(0, C/L)|| > t): the sharp (CLT) prediction at the "
             "threshold used, by an independent Monte Carlo of clt_draws Gaussian vectors (independent of L since t "
             "~ 1/sqrt(L))."),
    Variable("tail_bound", _TAIL, "paper-form tail bound", "c1 exp(-c2 L t^2 / K(a)), K(a) = exp(4 sigma^2 ||U "
             "q||^2), c1 = exp(tail_log_c1_per_d d), c2 = tail_c2/sigma^2; tail_log_c1_per_d, tail_c2 "
             "(attrs['config']) are OUR assumption (Hsu-Kakade-Zhang norm bound of a sub-Gaussian vector with proxy "
             "sigma^2 K/L: defaults 2/3 and 1/3): the paper's constants are existential. Not capped at 1."),
    Variable("tail_K", ("query",), "paper's exponential factor K(a)", "exp(4 sigma^2 ||U q||^2) (the sharp "
             "asymptotics carry exp(sigma^2 ||U q||^2))."),
    Variable("tail_Uq_sq", ("query",), "squared logit norm ||U q||^2", "||U q||^2 of each tail query."),
    Variable("tail_c1_eff", (), "tail bound prefactor c1", "c1 = exp(tail_log_c1_per_d * d) used in tail_bound (OUR "
             "assumption)."),
    Variable("tail_c2_eff", (), "tail bound rate c2", "c2 = tail_c2 / sigma^2 used in tail_bound (OUR assumption)."),
    Variable("grad_gap_sq", _GRAD + ("L",), "mean squared gradient gap", "mean over grad_draws prompt sets of "
             "||grad R_L - grad R_inf||^2 (U Frobenius and v jointly), R_L the softmax(L) risk and R_inf the "
             "linear(inf) (Gamma_w) risk, both means over the same tasks and queries; U = U_norm "
             "blockdiag(Sigma^-1, 0)/||Sigma^-1||_F, v = U_norm e_{d+1}."),
    Variable("grad_gap_sq_se", _GRAD + ("L",), "standard error of the mean squared gradient gap",
             "sample standard deviation over prompt draws / sqrt(grad_draws)."),
    Variable("grad_inf_sq", _GRAD, "squared norm of the limit gradient", "||grad R_inf||^2 at the fixed parameters "
             "(linear(inf), same tasks and queries)."),
    Variable("grad_log_bound", _GRAD + ("L",), "natural log of the paper-form gradient bound", "log of grad_c / L * "
             "mean over (task, query) of K P, K = exp(4 lam ||U z_q||^2), lam = ||Gamma_w||_op, P = "
             "tr(Gamma_w)[(|r| + ||v|| ||m||)^2 + ||z_q||^2 ||v||^2 (lam |r| + ||Gamma_w v||)^2], m = Gamma_w U "
             "z_q, r = v.m - y_q (first-order derivation, sfxlin.concentration.gradient_log_bound_constant); grad_c "
             "(attrs['config']) is OUR assumption (default 1): the paper's constant is existential."),
    Variable("grad_log_K", _GRAD, "log of the mean paper exponential factor", "log of the mean over (task, query) "
             "of exp(4 lam ||U z_q||^2), lam = ||Gamma_w||_op."),
    Variable("grad_log_K_sharp", _GRAD, "log of the mean sharp exponential factor", "log of the mean over (task, "
             "query) of exp(a' Gamma_w a), a = U z_q (the factor of the sharp SNIS constant)."),
    Variable("grad_max_quad", _GRAD, "largest logit quadratic form", "max over (task, query) of a' Gamma_w a, a = U "
             "z_q: the SNIS error of that item is in its 1/L regime only once L >> exp(2 a' Gamma_w a) "
             "(third-moment term of the expansion)."),
)
#: the trajectory part's outputs: the family's gap run's, named ``traj_<name>``, and ``||U_inf(t)||_F``
TRAJECTORY = (*(dataclasses.replace(C2.output(name), name=f"traj_{name}")
                for name in TRAJ_OUT),
              Variable("traj_U_norm", ("t",), "Frobenius norm of U along the trajectory", "||U_inf(t)||_F."))
CONSTANTS = (
    Variable("traj_trace_inv_sq", (), "tr(Sigma^-2) of the trajectory setting", "the query-averaged concentration "
             "constant at the Bayes optimum is finite iff tr(Sigma^-2) > 4."),
    Variable("traj_concentration_constant", (), "query-averaged concentration constant", "E_xq exp(x_q' Sigma^-1 "
             "x_q / c^2) = (1 - 2 tr(Sigma^-2)^-1/2)^(-d/2) at the Bayes optimum; +inf by design when tr(Sigma^-2) "
             "<= 4.", allow_nonfinite=True),
)


def _p(name, kind, doc, value, parts=_MAIN, **rules):
    return Param(name, kind, doc, value, parts=parts, **rules)


EXPERIMENT = C2.variant(
    NAME, short="c2", analysis="sfxlin.analysis.c2", sweep=("d",),
    values=dict(d=Profiles(quick=[2, 3], paper=[2, 5, 10]),
                L=Profiles(quick=[8, 16, 32, 64, 128, 256], paper=[2**k for k in range(3, 13)]),
                n_seeds=Profiles(quick=2, paper=4), root_seed=20251212),
    params=(
        Param("U_norm", "float_list", "Frobenius norms of U", Profiles(quick=[0.1, 0.5], paper=[0.1, 0.3, 0.5]),
              low=0, low_open=True, grid=True),
        _p("sigma", "float", "token standard deviation of the tail part (covariance sigma^2 I)", 1.0, low=0,
           low_open=True),
        _p("tail_queries", "int", "queries per cell (tail part)", 2, low=1),
        _p("tail_prompts", "int", "independent prompts per query (tail part; the n of every tail test)",
           Profiles(quick=256, paper=4096), unit="prompts", low=1),
        _p("tail_levels", "float_list", "tail probabilities of the CLT law at which the thresholds are set",
           [0.1, 0.03, 0.01, 0.003, 0.001], low=0, low_open=True, high=1, high_open=True, order="decreasing"),
        _p("prompt_chunk", "int", "prompts sampled and evaluated together (memory: prompt_chunk * L_max * d floats)",
           64, low=1),
        _p("clt_draws", "int", "Gaussian draws per query of each CLT Monte Carlo (quantiles; independent tail "
           "estimate); clt_draws * min(tail_levels) >= 10", Profiles(quick=20000, paper=200000), low=1),
        _p("tail_log_c1_per_d", "float", "tail bound prefactor: c1 = exp(tail_log_c1_per_d * d) (OUR assumption; "
           "paper: existential)", 2 / 3, low=0, low_open=True),
        _p("tail_c2", "float", "tail bound rate: c2 = tail_c2 / sigma^2 (OUR assumption; paper: existential)", 1 / 3,
           low=0, low_open=True),
        _p("grad_scales", "float_list", "scales s of the covariate covariance s * Sigma_setting (gradient part)",
           [1.0, 2.0], low=0, low_open=True),
        _p("grad_pairs", "int", "antithetic task pairs per (cell, setting, scale)", Profiles(quick=4, paper=8), low=1),
        _p("grad_queries", "int", "queries per task (gradient part)", Profiles(quick=2, paper=4), low=1),
        _p("grad_draws", "int", "independent prompt sets per (cell, setting, scale) for E over prompts",
           Profiles(quick=4, paper=32), low=1),
        _p("grad_c", "float", "constant of the paper-form gradient bound (OUR assumption; paper: existential)", 1.0,
           low=0, low_open=True),
        _p("traj_d", "int", "covariate dimension of the trajectory part (C3: 3)", 3, _TRAJ, low=1),
        _p("traj_pairs", "int", "antithetic task pairs of the trajectory part (C3: 48)", Profiles(quick=8, paper=48),
           _TRAJ, low=1),
        _p("traj_queries", "int", "queries per task of the trajectory part (C3: 2)", 2, _TRAJ, low=1),
        _p("traj_replicates", "int", "prompt sets over which g_L(t) is averaged", Profiles(quick=1, paper=16), _TRAJ,
           low=1),
        _p("traj_lr", "float", "gradient-descent step of the linear(inf) trajectory (C3: 0.01)", 0.01, _TRAJ, low=0,
           low_open=True),
        _p("traj_steps", "int", "gradient-descent steps (C3: 2500), a multiple of traj_ckpt_every",
           Profiles(quick=100, paper=2500), _TRAJ, unit="steps", low=0),
        _p("traj_ckpt_every", "int", "checkpoint spacing in steps (C3: 20)", 20, _TRAJ, unit="steps", low=1),
        Param("traj_seeds", "int", "independent task draws per setting (trajectory part)", Profiles(quick=1, paper=4),
              low=1, grid=True),
        amplification_param(Profiles(quick=0.0, paper=DEFAULT_EPS))),
    cells=(Cells({"d": "d", "U_norm": "U_norm", "seed": "n_seeds"}, kernel, OUTPUTS),
           Cells({"setting": tuple(SETTINGS), "traj_seed": "traj_seeds"}, trajectory_kernel, TRAJECTORY, name=_T,
                 perturbed=True),
           Cells({"setting": tuple(SETTINGS)}, constants_kernel, CONSTANTS, name="trajectory_constants",
                 inputs=lambda config, cell: {"traj_d": config["traj_d"]})),
    coords={"query": lambda c: range(c["tail_queries"]), "level": lambda c: c["tail_levels"],
            "setting": lambda c: SETTINGS, "scale": lambda c: c["grad_scales"],
            "t": lambda c: range(0, c["traj_steps"] + 1, c["traj_ckpt_every"])},
    checks=(_enough_clt_draws,), cost=C2.cost.counting(counts),
    scheduler="processes",   # faster than threads on the paper profile (docs/performance.md, section 8)
    title="C2: non-asymptotic concentration of outputs and gradients",
    description="C2: output tails of softmax attention vs the paper-form bound (assumed constants) and the CLT; "
                "gradient concentration at fixed parameters; gradient gap along the infinite-prompt trajectory")
