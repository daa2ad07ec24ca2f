"""C1: softmax attention over i.i.d. tokens converges to the tilted-mean operator (Lemma 2.1).

Grid (one dask task per cell): ``d x U_norm x seed``. Inside a cell, vectorised numpy over
laws, prompts, queries and all nested prompt lengths at once (prefix evaluation):

* ``U``: Gaussian d x d matrix rescaled to Frobenius norm ``U_norm``; ``V = I_d``;
* queries ``q ~ N(0, sigma^2 I_d)``, the same for every law;
* for every law (Gaussian, Rademacher, Uniform, Student-t, all with covariance
  ``sigma^2 I_d``), ``n_prompts`` independent prompts of ``L_max`` tokens *per query*, drawn
  from the law's own substream of the cell's generator (``sweep.substream(rng, law=name)``,
  query chunk after query chunk), so adding or removing a law changes no other law's prompts;
* ``f_inf`` is the Gaussian closed form ``sigma^2 U q`` for every law: the Gaussian law
  converges to it, the bounded laws plateau at the bias of their own tilted mean
  (``bias_exact``), the Student-t law has no limit and its error grows;
* ``ar1`` in ``laws`` adds one law per coefficient of ``ar1_rho``, labelled ``"ar1:RHO"``
  (:class:`sfxlin.laws.GaussianAR1`): Gaussian AR(1) tokens, **dependent along the prompt** (each
  prompt one stationary sequence, so the nested prompts are its prefixes), stationary law
  ``N(0, sigma^2 I)``: the same limit ``sigma^2 U q``, with the dependent constant (a sum over
  lags) in ``mse_predicted`` in place of the i.i.d. one (``mse_asymptotic``);
* the ``sqrt(L)`` control rescales ``U`` to ``U_norm * sqrt(L / L_min)`` at each L and
  measures the error to that U's own limit;
* ``tokens`` (a ``.npy`` file or ``file.nc:variable``, rows of dimension d) adds the law
  ``empirical``: the file's tokens as given (not rescaled), drawn with replacement, with its
  exact limit and SNIS constant (:class:`sfxlin.laws.Empirical`). It is a ``file`` parameter:
  its sha256, taken once when the run is configured, is one of the main cells' inputs (a
  changed file is recomputed), is checked again before each cell reads the file, and is
  recorded in the results file's ``input_files`` attr.
"""
from __future__ import annotations

import functools

import numpy as np

from sfxlin.attention import asymptotic_mse, softmax_attention, softmax_attention_prefix
from sfxlin.laws import LAWS, Empirical, GaussianAR1
from sfxlin.engine.params import Param, Profiles, file_digests
from sfxlin.quadrature import gaussian_tilted_mean_quadrature
from sfxlin.realdata import TOKEN_SUFFIXES, check_unchanged, read_tokens
from sfxlin.engine.sweep import Experiment, Out, Part, Variable, cell_rng, substream

NAME = "c1_limit"

PARAMS = (
    Param("d", "int_list", "token dimensions", Profiles(quick=[2, 3], paper=[2, 5, 10]), low=1, grid=True),
    Param("U_norm", "float_list", "Frobenius norms of U", Profiles(quick=[0.1, 0.5], paper=[0.1, 0.3, 0.5]),
          low=0, low_open=True, grid=True),
    Param("L", "int_list", "nested prompt lengths",
          Profiles(quick=[2**k for k in range(4, 11)], paper=[2**k for k in range(4, 15)]), unit="tokens",
          low=1, order="increasing", min_len=3,
          why="the analysis fits log-log slopes in L"),
    Param("n_seeds", "int", "independent replicates per (d, U_norm)", Profiles(quick=2, paper=4), low=1, grid=True),
    Param("laws", "str_list", "token laws, each with covariance sigma^2 I_d (LAWS of sfxlin.laws with an "
          "isotropic member); 'gaussian' is needed (its limit sigma^2 U q is the reference of every law); 'ar1' "
          "is one law per ar1_rho, labelled 'ar1:RHO'",
          ["gaussian", "rademacher", "uniform", "student_t", GaussianAR1.name],
          choices=tuple(name for name in LAWS if name != Empirical.name)),
    Param("ar1_rho", "float_list", "AR(1) coefficients of the 'ar1' laws (tokens dependent along the prompt, "
          "lag-h correlation rho^h)", Profiles(quick=[0.8], paper=[0.0, 0.5, 0.8]), low=-1, high=1,
          low_open=True, high_open=True, order="increasing"),
    Param("tokens", "file", "a token file, 'path.npy' or 'path.nc:variable' (one token of dimension d per row), "
          "whose empirical law joins the laws as 'empirical' (tokens as given); '' for none", "",
          suffixes=TOKEN_SUFFIXES, optional=True),
    Param("n_queries", "int", "queries per cell", Profiles(quick=6, paper=32), low=1),
    Param("n_prompts", "int", "independent prompts per query and law", Profiles(quick=8, paper=16), low=1),
    Param("sigma", "float", "token standard deviation (covariance sigma^2 I)", 1.0, low=0, low_open=True),
    Param("student_df", "float", "degrees of freedom of the Student-t control (finite covariance)", 3.0,
          low=2, low_open=True),
    Param("root_seed", "int", "root of every cell's random generator", 20251211),
    Param("query_chunk", "int", "queries evaluated together (memory: query_chunk * n_prompts * L_max * d floats)",
          Profiles(quick=3, paper=4), low=1),
)


def _needs_gaussian(config):
    if "gaussian" not in config["laws"]:
        raise ValueError(f"laws: 'gaussian' is needed (the reference limit sigma^2 U q), got {list(config['laws'])}")


def _tokens_fit(config):
    """``tokens``: the file exists, holds finite (n, D) tokens, and D is every d of the grid."""
    if not config["tokens"]:
        return
    Z = _tokens_of(config["tokens"], config.digests["tokens"])
    bad = [d for d in config["d"] if d != Z.shape[1]]
    if bad:
        raise ValueError(f"tokens: the file's tokens have dimension {Z.shape[1]} (shape {Z.shape}), but d = "
                         f"{list(config['d'])}; run with --set d={Z.shape[1]}")


def _read_token_file(spec, sha256):
    """The tokens of ``spec`` (read once per process and file content); ``ValueError`` if the file's
    content is no longer the one ``sha256`` names (changed after the run was configured): the
    cache below is keyed by that digest, so it is checked wherever the kernel runs."""
    check_unchanged(spec, sha256, "tokens")
    return _tokens_of(spec, sha256)


@functools.lru_cache(maxsize=2)
def _tokens_of(spec, sha256):
    """The read-only tokens of ``spec``, whose file has the digest ``sha256`` (the cache key)."""
    Z = read_tokens(spec, "tokens")
    Z.flags.writeable = False
    return Z


def main_inputs(config, cell):
    """What reaches a main cell: every non-grid parameter, and ``tokens_sha256``, the token file's
    digest taken when the run was configured, when ``tokens`` names one (so a changed file gives
    other fingerprints)."""
    inputs = {p.name: config[p.name] for p in PARAMS if not p.grid}
    return {**inputs, **file_digests(PARAMS, config, inputs)}


def ar1_label(rho):
    """The law coordinate of the AR(1) law with coefficient ``rho``: ``"ar1:RHO"`` (the law's spec,
    ``RHO`` the float's shortest repr, so that it reads back exactly)."""
    return f"{GaussianAR1.name}:{float(rho)!r}"


def _law_specs(config):
    """``(label, name, options)`` of every law of ``config["laws"]``, ``ar1`` expanded over ``ar1_rho``."""
    specs = []
    for name in config["laws"]:
        if name == GaussianAR1.name:
            specs += [(ar1_label(rho), name, {"rho": rho}) for rho in config["ar1_rho"]]
        else:
            specs.append((name, name, {"df": config["student_df"]} if name == "student_t" else {}))
    return specs


def law_names(config):
    """The law coordinate: the labels of ``config["laws"]`` (``ar1`` as ``"ar1:RHO"`` per ``ar1_rho``),
    then ``"empirical"`` when ``tokens`` names a file."""
    return [label for label, _, _ in _law_specs(config)] + ([Empirical.name] if config["tokens"] else [])


def token_laws(config, d):
    """The laws of ``config["laws"]`` on R^d by their labels, each with covariance sigma^2 I_d, then the
    token file's empirical law when ``config["tokens"]`` names one (``config``: a cell's inputs, which
    carry the file's ``tokens_sha256``)."""
    laws = {label: LAWS[name].isotropic(d, config["sigma"], **options) for label, name, options in _law_specs(config)}
    if config["tokens"]:
        laws[Empirical.name] = Empirical(_read_token_file(config["tokens"], config["tokens_sha256"]), D=d)
    return laws


def grid(config):
    return {"d": list(config["d"]), "U_norm": list(config["U_norm"]), "seed": list(range(config["n_seeds"]))}


def inner_coords(config):
    return {"law": law_names(config), "L": list(config["L"]), "query": list(range(config["n_queries"])),
            "D_quad": [1, 2, 3, 4]}


def kernel(cell, rng, config):
    d, U_norm = cell["d"], cell["U_norm"]
    sigma, Ls = config["sigma"], np.asarray(config["L"])
    Q, P, chunk = config["n_queries"], config["n_prompts"], config["query_chunk"]
    laws = token_laws(config, d)
    law_rng = {name: substream(rng, law=name) for name in laws}
    gauss = laws["gaussian"]
    V = np.eye(d)
    U = rng.standard_normal((d, d))
    U *= U_norm / np.linalg.norm(U)
    q = gauss.sample(rng, Q)  # (Q, d)
    f_inf = gauss.tilted_mean(q @ U.T)  # Lemma 2.1: sigma^2 U q

    sq_err = np.empty((len(laws), Q, P, len(Ls)))
    sq_err_scaled = np.empty((Q, P, len(Ls)))
    U_scale = np.sqrt(Ls / Ls[0])
    for start in range(0, Q, chunk):
        qs = slice(start, min(start + chunk, Q))
        for i, (name, law) in enumerate(laws.items()):
            Z = law.sample(law_rng[name], (qs.stop - qs.start, P, Ls[-1]))
            f_L = softmax_attention_prefix(Z, U, V, q[qs, None, :], Ls)  # (q, P, nL, d)
            sq_err[i, qs] = np.sum((f_L - f_inf[qs, None, None, :]) ** 2, axis=-1)
            if name == "gaussian":
                for j, (L, c) in enumerate(zip(Ls, U_scale)):
                    f_scaled = softmax_attention(Z[:, :, :L, :], c * U, V, q[qs, None, :])
                    lim = gauss.tilted_mean(q[qs] @ (c * U).T)
                    sq_err_scaled[qs, :, j] = np.sum((f_scaled - lim[:, None, :]) ** 2, axis=-1)

    bias = np.full(len(laws), np.nan)
    predicted = np.full((len(laws), len(Ls)), np.nan)
    for i, law in enumerate(laws.values()):
        if law.has_limit:  # no limit (Student-t): NaN by design
            bias[i] = np.mean(np.sum((law.tilted_mean(q @ U.T) - f_inf) ** 2, axis=-1))
            predicted[i] = bias[i] + asymptotic_mse(law, U, V, q[:, None, :], Ls).mean(axis=0)
    return {
        "mse_predicted": Out(predicted, ("law", "L")),
        "mse": Out(sq_err.mean(axis=(1, 2)), ("law", "L")),
        "mse_asymptotic": Out(asymptotic_mse(gauss, U, V, q[:, None, :], Ls).mean(axis=0), ("L",)),
        "bias_exact": Out(bias, ("law",)),
        "mse_query": Out(sq_err[list(laws).index("gaussian")].mean(axis=1), ("query", "L")),
        "Uq_sq": Out(np.sum((q @ U.T) ** 2, axis=-1), ("query",)),
        "mse_scaled_U": Out(sq_err_scaled.mean(axis=(0, 1)), ("L",)),
    }


def cell_work(config, part):
    """Work of one cell of ``part`` in its non-grid parameters (``sfxlin run --plan``'s cost law,
    :mod:`sfxlin.engine.plan`; the grid dims' costs are fitted): each query and prompt draws
    ``L_max`` tokens per law and the scaled-U control re-reads every prefix ``L`` of the Gaussian
    one; ``CELL_OVERHEAD_WORK`` is the fixed cost of a cell (its set-up and the closed forms per query
    and L) in the same units. The quadrature check reads nothing of the sweep: None (it costs what it
    cost)."""
    if part:
        return None
    Ls = config["L"]
    return config["n_queries"] * config["n_prompts"] * (len(config["laws"]) * max(Ls) + sum(Ls)) + CELL_OVERHEAD_WORK


#: a main cell's fixed cost in :func:`cell_work` units: warm CPU seconds of the cell d=2, U_norm=0.1
#: (``python -m sfxlin.engine.plan c1_limit --cell d=2,U_norm=0.1,seed=0 --set ...`` over L_max 64 ..
#: 8192, n_queries x n_prompts 6x8 and 32x16) follow 0.008 s + 4.6e-8 s per unit of work: 0.008 / 4.6e-8
CELL_OVERHEAD_WORK = 175_000


def no_grid(config):
    """The quadrature check is one cell."""
    return {}


def quadrature_inputs(config, cell):
    """Nothing of the sweep reaches the quadrature check but the root seed."""
    return {"root_seed": config["root_seed"]}


def quadrature_check(cell, rng, config):
    """Closed form vs tensor Gauss-Hermite quadrature for random N(m, Sigma), a, D = 1..4."""
    errors = []
    for D in range(1, 5):
        A = rng.standard_normal((D, D))
        cov = A @ A.T / D
        mean = rng.standard_normal(D)
        a = 0.5 * rng.standard_normal((8, D))
        closed = LAWS["gaussian"](mean, cov).tilted_mean(a)
        errors.append(np.max(np.abs(closed - gaussian_tilted_mean_quadrature(mean, cov, a))))
    return {"quadrature_error": Out(np.array(errors), ("D_quad",))}


VARIABLES = (
    Variable("mse", ("law", "d", "U_norm", "L", "seed"), "mean squared error to the Gaussian limit",
             "mean over queries and prompts of ||f_L(q) - sigma^2 U q||^2 (softmax attention, V = I)."),
    Variable("mse_asymptotic", ("d", "U_norm", "L", "seed"), "sharp asymptotic prediction",
             "mean over queries of exp(a'Sigma a)(tr Sigma + ||Sigma a||^2)/L, a = U q (delta method)."),
    Variable("bias_exact", ("law", "d", "U_norm", "seed"), "exact squared bias of the law's own limit",
             "mean over queries of ||grad K_law(Uq) - sigma^2 U q||^2; NaN by design for a law without a "
             "limit (student_t) "
             "(no exponential moments, no limit).", allow_nonfinite=True),
    Variable("mse_predicted", ("law", "d", "U_norm", "L", "seed"), "predicted mean squared error",
             "bias_exact + mean over queries of tr C_law(Uq)/L, C_law the law's exact SNIS (delta-method) "
             "covariance of its own limit (for ar1:RHO the dependent constant, a sum over lags); NaN by design for "
             "a law without a limit (student_t).",
             allow_nonfinite=True),
    Variable("mse_query", ("d", "U_norm", "L", "seed", "query"), "per-query mean squared error (Gaussian)",
             "mean over prompts of ||f_L(q) - sigma^2 U q||^2 for each query, Gaussian tokens."),
    Variable("Uq_sq", ("d", "U_norm", "seed", "query"), "squared logit norm ||U q||^2",
             "||U q||^2 of each query; the paper-form fit uses sigma^2 ||U q||^2."),
    Variable("quadrature_error", ("D_quad",), "closed form vs quadrature",
             "max |Gaussian tilted mean (Lemma 2.1) - tensor Gauss-Hermite quadrature| over 8 random a, "
             "random mean and covariance, token dimension D_quad.", part="quadrature"),
    Variable("mse_scaled_U", ("d", "U_norm", "L", "seed"), "mean squared error with U scaled by sqrt(L/L_min)",
             "negative control: Gaussian tokens, U_L = sqrt(L/L_min) U, error to that U_L's own limit."),
)

EXPERIMENT = Experiment(
    name=NAME, short="c1", params=PARAMS, checks=(_needs_gaussian, _tokens_fit), inner_coords=inner_coords,
    variables=VARIABLES, analysis="sfxlin.analysis.c1",
    parts=(Part("", grid, kernel, inputs=main_inputs),
           Part("quadrature", no_grid, quadrature_check, inputs=quadrature_inputs)),
    title="C1: softmax attention -> linear operator on the token measure",
    description="C1: softmax attention -> tilted-mean (linear) operator as L grows")
