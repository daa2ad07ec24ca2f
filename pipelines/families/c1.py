"""The C1 family: a token law x a kernel x a head -> the error of attention over nested prompts to its exact
infinite-prompt limit (docs/claims.md, C1; the models: docs/models.md, section 1; the protocols:
docs/protocols.md). Its shared cell step is :func:`sq_errors` (one prefix pass, the squared error to each
limit); token and matrix files are read once per process and content (:func:`file_matrix`)."""
from __future__ import annotations

import functools

import numpy as np

from sfxlin.attention import softmax_attention_prefix
from sfxlin.engine import Param, Variable
from sfxlin.engine.family import Cost, Family
from sfxlin.realdata import DATASETS, TOKEN_SUFFIXES, check_unchanged, read_tokens


def file_matrix(name, spec, sha256, check=True):
    """The read-only matrix of the file parameter ``name`` (its source ``spec``), read once per process and
    file content; with ``check`` (a cell) after checking that the file still has the digest ``sha256`` taken
    when the run was configured (ValueError naming ``name`` otherwise), without (the configuration, which
    took it a moment ago) not hashed again."""
    if check:
        check_unchanged(spec, sha256, name)
    return _read(name, spec, sha256)


@functools.lru_cache(maxsize=8)
def _read(name, spec, sha256):
    X = read_tokens(spec, name)
    X.flags.writeable = False
    return X


def sq_errors(Z, U, V, q, Ls, *limits):
    """Softmax attention over the prompts ``Z`` at every nested length of ``Ls`` in one prefix pass
    (:func:`sfxlin.attention.softmax_attention_prefix` of ``Z, U, V, q``), and its squared error
    ``||f_L - f_ref||^2`` to each limit of ``limits`` (broadcast against ``f_L``): one array each."""
    f_L = softmax_attention_prefix(Z, U, V, q, Ls)
    return tuple(np.sum((f_L - ref) ** 2, axis=-1) for ref in limits)


def chunks(n, size):
    """The slices of ``0 .. n - 1`` in blocks of ``size`` (queries or prompts evaluated together)."""
    return [slice(start, min(start + size, n)) for start in range(0, n, size)]


PARAMS = (
    Param("d", "int", "token dimension d", 2, low=1),
    Param("U_norm", "float", "Frobenius norm of U", 0.5, low=0, low_open=True),
    Param("n_queries", "int", "queries per cell", 6, low=1),
    Param("n_prompts", "int", "independent prompts per query", 8, low=1),
    Param("query_chunk", "int", "queries evaluated together (memory: query_chunk * n_prompts * L_max * d floats)", 3,
          low=1),
    Param("tokens", "file", "a token file, 'path.npy' or 'path.nc:variable' (one token of dimension d per row); '' "
          "for none", "", suffixes=TOKEN_SUFFIXES, optional=True),
    Param("datasets", "str_list", "real data sets bundled with scikit-learn, used as token sets", list(DATASETS),
          choices=DATASETS, grid=True),
)

OUTPUTS = (
    Variable("mse", ("L",), "mean squared error to the reference limit", "mean over queries and prompts of ||V "
             "f_L(q) - V f_ref(q)||^2, f_L attention over the first L tokens of a prompt, f_ref the reference "
             "limit: the exact limit of the tokens' law and the kernel (c1_own: per prompt, mean over the query "
             "set), or, in c1_limit, the Gaussian limit sigma^2 U q for every law."),
    Variable("mse_asymptotic", ("L",), "sharp asymptotic prediction", "mean over queries of tr C(U q) / L, C the "
             "law's exact SNIS (delta-method) constant (Gaussian tokens: exp(a'Sigma a)(tr Sigma + ||Sigma a||^2), "
             "a = U q)."),
    Variable("mse_query", ("query", "L"), "per-query mean squared error", "mean over prompts of ||f_L(q) - "
             "f_inf(q)||^2 for each query (c1_limit: Gaussian tokens)."),
    Variable("mse_gauss", ("L",), "mean squared error to the Gaussian surrogate", "mean over queries and prompts of "
             "||V f_L(q) - V (m + Sigma U q)||^2, m and Sigma the tokens' mean and covariance (Lemma 2.1 for N(m, "
             "Sigma))."),
    Variable("bias_gauss", (), "exact squared bias of the Gaussian surrogate", "mean over queries of ||V (grad "
             "K_mu(U q) - m - Sigma U q)||^2, mu the tokens' empirical law."),
    Variable("weight_ratio", (), "inverse effective sample fraction", "mean over queries of n sum_i w_i^2 / (sum_i "
             "w_i)^2, w_i = exp(z_i . U q) over the tokens' set: a prompt of L tokens weighs like L / weight_ratio "
             "equal-weight tokens, so 1/L asymptotics need L >> weight_ratio."),
    Variable("limit_sq", (), "squared size of the limit's signal", "mean over queries of ||V (grad K_mu(U q) - "
             "m)||^2: the scale the bias and the relative error are compared with."),
)

#: the family's cost model: seconds per unit on the reference machine (docs/performance.md, "Cost models"): a
#: token of a prompt read by one query, a token read by a block of queries at once, a quadrature node, a
#: random-feature draw, a cell's fixed cost
RATES = {"visit": 4.6e-8, "shared_visit": 6e-9, "node": 6.3e-7, "feature_draw": 1.9e-6, "cell": 0.008}


def _visits(config, part, cell):
    """Each query reads its prompts' ``L_max`` tokens once (a prefix pass), a main cell; another part, a cell."""
    if part:
        return {"cell": 1}
    return {"visit": config["n_queries"] * config["n_prompts"] * max(config["L"]), "cell": 1}


C1 = Family("C1", PARAMS, OUTPUTS, coords={"L": lambda c: c["L"], "query": lambda c: range(c["n_queries"])},
            cost=Cost(RATES, _visits))
