"""C1 on real data: softmax attention over tokens drawn from a real data set's empirical law.

Grid (one dask task per cell): ``dataset x D x U_norm x seed``. Inside a cell, vectorised numpy
over queries, prompts and all nested prompt lengths at once (prefix evaluation):

* tokens: the data set's token set on ``R^D`` (:func:`sfxlin.realdata.token_set`: the features
  standardised, then the top-D principal components, each scaled to unit variance, so mean 0 and
  covariance ``I_D``); its law ``mu`` is the empirical law :class:`sfxlin.laws.Empirical`;
* ``U``: Gaussian D x D matrix rescaled to Frobenius norm ``U_norm``; ``V = I_D``;
* queries ``q``: ``n_queries`` tokens of the set (drawn from ``mu``). The direction of ``U`` and
  the queries come from a generator keyed by ``(dataset, D, seed)`` alone
  (:func:`direction_rng`), so every ``U_norm`` of a seed scales the *same* ``U`` at the *same*
  queries: the Gaussian surrogate's bias is then a smooth function of ``U_norm`` whose log-log
  slope is its order (4, see ``docs/real_data.md``), not a comparison of two random draws;
* prompts: ``n_prompts`` prompts of ``L_max`` tokens per query, i.i.d. from ``mu`` (with
  replacement), from the cell's own generator, query chunk after query chunk;
* ``f_inf(q) = grad K_mu(U q)``, the exact infinite-prompt limit (a softmax-weighted average over
  the whole set): the error to it is a law of large numbers, ``~ tr C_mu(Uq) / L`` with ``C_mu``
  the empirical law's exact SNIS constant;
* ``f_gauss(q) = m + Sigma U q`` (Lemma 2.1 with the set's mean ``m`` and covariance ``Sigma``):
  the Gaussian picture; its exact squared bias ``||f_inf - f_gauss||^2`` is the price of
  replacing the data by their Gaussian surrogate.
"""
from __future__ import annotations

import numpy as np

from sfxlin.attention import asymptotic_mse, softmax_attention_prefix
from sfxlin.laws import Empirical, Gaussian
from sfxlin.engine.params import Param, Profiles
from sfxlin.realdata import DATASETS, token_set
from sfxlin.engine.sweep import Experiment, Out, Part, Variable, cell_rng

NAME = "c1_real"

PARAMS = (
    Param("datasets", "str_list", "real data sets bundled with scikit-learn, used as token sets",
          list(DATASETS), choices=DATASETS, grid=True),
    Param("D", "int_list", "token dimensions (principal components kept)", Profiles(quick=[2, 5], paper=[2, 5, 10]),
          low=1, high=10, grid=True),
    Param("U_norm", "float_list", "Frobenius norms of U",
          Profiles(quick=[0.05, 0.1, 0.8], paper=[0.025, 0.05, 0.1, 0.2, 0.4, 0.8]), low=0, low_open=True, grid=True),
    Param("L", "int_list", "nested prompt lengths",
          Profiles(quick=[2**k for k in range(4, 11)], paper=[2**k for k in range(4, 14)]), unit="tokens",
          low=1, order="increasing", min_len=3, why="the analysis fits log-log slopes in L"),
    Param("n_seeds", "int", "independent replicates per (dataset, D, U_norm)", Profiles(quick=1, paper=2), low=1,
          grid=True),
    Param("n_queries", "int", "queries per cell (tokens of the set)", Profiles(quick=6, paper=16), low=1),
    Param("n_prompts", "int", "independent prompts per query", Profiles(quick=8, paper=16), low=1),
    Param("root_seed", "int", "root of every cell's random generator", 20251212),
    Param("query_chunk", "int", "queries evaluated together (memory: query_chunk * n_prompts * L_max * D floats)",
          Profiles(quick=3, paper=4), low=1),
)


def grid(config):
    return {"dataset": list(config["datasets"]), "D": list(config["D"]), "U_norm": list(config["U_norm"]),
            "seed": list(range(config["n_seeds"]))}


def inner_coords(config):
    return {"L": list(config["L"])}


def direction_rng(cell, root_seed):
    """The generator of ``U``'s direction and of the queries: keyed by the cell's ``dataset``, ``D``
    and ``seed`` (not ``U_norm``) and ``root_seed``, under its own tag."""
    keys = {dim: cell[dim] for dim in ("dataset", "D", "seed")}
    return cell_rng(f"{NAME}/direction", keys, root_seed)


def kernel(cell, rng, config):
    D, U_norm = cell["D"], cell["U_norm"]
    Ls = np.asarray(config["L"])
    Q, P, chunk = config["n_queries"], config["n_prompts"], config["query_chunk"]
    law = Empirical(token_set(cell["dataset"], D))
    surrogate = Gaussian(law.mean, law.cov)
    V = np.eye(D)
    shared = direction_rng(cell, config["root_seed"])
    U = shared.standard_normal((D, D))
    U *= U_norm / np.linalg.norm(U)
    q = law.sample(shared, Q)  # (Q, D)
    a = q @ U.T
    f_inf = law.tilted_mean(a)  # exact: softmax-weighted average over the whole set
    f_gauss = surrogate.tilted_mean(a)  # Lemma 2.1 with the fitted mean and covariance

    sq_err = np.empty((Q, P, len(Ls)))
    sq_err_gauss = np.empty((Q, P, len(Ls)))
    for start in range(0, Q, chunk):
        qs = slice(start, min(start + chunk, Q))
        Z = law.sample(rng, (qs.stop - qs.start, P, Ls[-1]))
        f_L = softmax_attention_prefix(Z, U, V, q[qs, None, :], Ls)  # (q, P, nL, D)
        sq_err[qs] = np.sum((f_L - f_inf[qs, None, None, :]) ** 2, axis=-1)
        sq_err_gauss[qs] = np.sum((f_L - f_gauss[qs, None, None, :]) ** 2, axis=-1)
    s = a @ law.samples.T  # (Q, n) logits over the whole set
    w = np.exp(s - s.max(axis=1, keepdims=True))
    return {
        "weight_ratio": np.mean(law.n * np.sum(w**2, axis=1) / np.sum(w, axis=1) ** 2),
        "mse": Out(sq_err.mean(axis=(0, 1)), ("L",)),
        "mse_asymptotic": Out(asymptotic_mse(law, U, V, q[:, None, :], Ls).mean(axis=0), ("L",)),
        "mse_gauss": Out(sq_err_gauss.mean(axis=(0, 1)), ("L",)),
        "bias_gauss": np.mean(np.sum((f_inf - f_gauss) ** 2, axis=-1)),
        "limit_sq": np.mean(np.sum((f_inf - law.mean) ** 2, axis=-1)),
    }


def cell_work(config, part):
    """Work of one cell in its non-grid parameters (``sfxlin run --plan``'s cost law,
    :mod:`sfxlin.engine.plan`; the grid dims' costs, the data set's size among them, are fitted):
    each query evaluates ``n_prompts`` prompts of ``L_max`` tokens in one prefix pass, plus
    ``CELL_OVERHEAD_WORK``, a cell's fixed cost (the token set, the exact limits over the whole set
    and the SNIS constants) in the same units."""
    return config["n_queries"] * config["n_prompts"] * max(config["L"]) + CELL_OVERHEAD_WORK


#: a cell's fixed cost in :func:`cell_work` units: warm CPU seconds of the cells digits, D=5 and wine, D=2
#: (``python -m sfxlin.engine.plan c1_real --cell dataset=digits,D=5,U_norm=0.1 --set ...`` over L_max 256 ..
#: 8192, n_queries x n_prompts 6x8 and 16x16) follow 0.009 .. 0.011 s + 3.3 .. 3.7e-8 s per unit of work
CELL_OVERHEAD_WORK = 290_000


VARIABLES = (
    Variable("mse", ("dataset", "D", "U_norm", "L", "seed"), "mean squared error to the exact empirical limit",
             "mean over queries and prompts of ||f_L(q) - grad K_mu(U q)||^2, mu the data set's empirical law "
             "(softmax attention, V = I, tokens drawn with replacement)."),
    Variable("mse_asymptotic", ("dataset", "D", "U_norm", "L", "seed"), "sharp asymptotic prediction",
             "mean over queries of tr C_mu(U q) / L, C_mu the empirical law's exact SNIS (delta-method) constant."),
    Variable("mse_gauss", ("dataset", "D", "U_norm", "L", "seed"), "mean squared error to the Gaussian surrogate",
             "mean over queries and prompts of ||f_L(q) - (m + Sigma U q)||^2, m and Sigma the set's mean and "
             "covariance (Lemma 2.1 for N(m, Sigma))."),
    Variable("bias_gauss", ("dataset", "D", "U_norm", "seed"), "exact squared bias of the Gaussian surrogate",
             "mean over queries of ||grad K_mu(U q) - (m + Sigma U q)||^2."),
    Variable("weight_ratio", ("dataset", "D", "U_norm", "seed"), "inverse effective sample fraction",
             "mean over queries of E_mu[w^2] / (E_mu w)^2, w = exp(z.U q): a prompt of L tokens weighs like "
             "L / weight_ratio equal-weight tokens, so 1/L asymptotics need L >> weight_ratio."),
    Variable("limit_sq", ("dataset", "D", "U_norm", "seed"), "squared size of the limit's signal",
             "mean over queries of ||grad K_mu(U q) - m||^2 (the scale the bias is compared with)."),
)

EXPERIMENT = Experiment(
    name=NAME, short="c1r", params=PARAMS, inner_coords=inner_coords, variables=VARIABLES,
    analysis="sfxlin.analysis.c1_real", parts=(Part("", grid, kernel),),
    title="C1 on real data: the exact empirical limit and the Gaussian surrogate's bias",
    description="C1 on real data: softmax attention -> the empirical law's tilted mean; Gaussian surrogate bias")
