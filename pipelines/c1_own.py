"""C1 for your own head: softmax attention over a token file against the exact limit of its law.

A user brings a token file (``.npy`` or ``file.nc:variable``, one token of dimension D per row)
and, optionally, a head: ``U`` (D x D) or ``W_Q, W_K`` (d_head x D, ``U = W_K^T W_Q``), ``V``
(D_out x D) or ``W_V`` (:mod:`sfxlin.heads`), a logit scale (``1``, ``1/sqrt(d_head)``, a number)
and queries (a file of rows of dimension D, or ``n_queries`` tokens of the file). Every file is a
``file`` parameter (sha256 taken when the run is configured, in each cell's inputs, checked again
before a cell reads it, recorded in ``input_files``), and every file is read and checked once when
the run is configured (:func:`_inputs_fit`): a bad file is one ``ValueError`` before any work.

* tokens: the file's rows as given; ``mu`` their empirical law (:class:`sfxlin.laws.Empirical`).
  With no file, the built-in default: the scikit-learn data set ``default_set`` standardised and
  whitened to ``default_D`` components (:func:`sfxlin.realdata.token_set`, as ``c1_real``), so the
  quick and paper profiles run out of the box;
* head: the logits are ``c z^T U q``; the experiment uses ``U_eff = c U``. With no ``U`` nor
  ``W_Q``/``W_K``, the default head :func:`sfxlin.heads.default_U` (a Gaussian direction with
  ``||S^{1/2} U S^{1/2}||_F = U_norm``, ``S = (tr Sigma / D) I``); with no ``V`` nor ``W_V``,
  ``V = I``. The head used is stored (``U_eff``, ``V_used``);
* queries: the query file's rows, or ``n_queries`` distinct tokens of the file; drawn with the
  default head from one generator keyed by ``root_seed`` alone (:func:`head_rng`), so every cell
  sees the same head and the same query set: the seeds and prompts are independent replicates
  of the prompts only, and every figure is a mean over this one query set;
* prompts (grid dim ``sampling``): ``"iid"``, ``n_prompts`` prompts of ``L_max`` tokens drawn
  with replacement from ``mu``; ``"window"``, ``n_prompts`` contiguous windows of the file in its
  order, ``file[s : s + L_max]`` with ``s`` uniform on ``0 .. n - L_max``. Each prompt is shared
  by every query (one prompt, many queries, as in a transformer), and its prefixes give every
  ``L`` (nested prompts);
* exact part (one cell): ``f_inf(q) = grad K_mu(U_eff q)`` (exact, a softmax over the whole file),
  the Gaussian surrogate ``m + Sigma U_eff q`` and its squared bias, the i.i.d. SNIS constant
  ``tr V C_mu V^T`` (:func:`sfxlin.attention.asymptotic_mse`), the Gaussian picture's constant,
  the weight ratio and the integrated autocorrelation factor ``tau`` of the influence function
  along the file's order (:func:`sfxlin.dependence.integrated_factor`, batch means).
"""
from __future__ import annotations

import functools
import math

import numpy as np

from sfxlin.attention import asymptotic_mse, softmax_attention_prefix
from sfxlin.dependence import integrated_factor
from sfxlin.engine.params import Param, Profiles, file_digests
from sfxlin.engine.sweep import Experiment, Out, Part, Variable, cell_rng, substream
from sfxlin.heads import LOGIT_SCALES, default_U, head_matrices, parse_logit_scale
from sfxlin.laws import Empirical, FloatOverflowError, Gaussian
from sfxlin.realdata import DATASETS, TOKEN_SUFFIXES, check_unchanged, read_tokens, token_set

NAME = "c1_own"

SAMPLINGS = ("iid", "window")
MATRICES = ("U", "V", "W_Q", "W_K", "W_V")


def _file(name, doc):
    return Param(name, "file", doc + ": 'path.npy' or 'path.nc:variable'; '' for none", "", suffixes=TOKEN_SUFFIXES,
                 optional=True)


PARAMS = (
    _file("tokens", f"the token file, one token of dimension D per row ('': the built-in default_set)"),
    Param("default_set", "str", "the scikit-learn data set used when tokens is '' (standardised, whitened to "
          "default_D components)", "digits", choices=DATASETS),
    Param("default_D", "int", "the dimension of the built-in token set", 4, low=1, high=10),
    _file("U", "the logit matrix U (D x D), logits c z^T U q"),
    _file("V", "the read-out V (D_out x D); '' with no W_V: V = I"),
    _file("W_Q", "the query projection (d_head x D), with W_K: U = W_K^T W_Q"),
    _file("W_K", "the key projection (d_head x D)"),
    _file("W_V", "the value projection (d_v x D): V = W_V"),
    Param("d_head", "int", "the head dimension for logit_scale=1/sqrt(d_head) when no W_Q gives it (0: not given)",
          0, low=0),
    Param("logit_scale", "str", f"the logit scale c: {' or '.join(LOGIT_SCALES)} or a positive number", "1"),
    Param("U_norm", "float", "the default head's scale ||S^{1/2} U S^{1/2}||_F, S = (tr Sigma / D) I (used only "
          "without U and W_Q)", 0.5, low=0, low_open=True),
    _file("queries", "queries, one of dimension D per row ('': n_queries tokens of the file)"),
    Param("n_queries", "int", "queries drawn from the tokens (distinct rows) when no query file is given",
          Profiles(quick=8, paper=32), low=1),
    Param("sampling", "str_list", "how prompts are drawn: 'iid' (with replacement from the tokens' law) or 'window' "
          "(contiguous windows of the file in its order, for a file that is a sequence; the built-in set's order is "
          "the data set's, not a sequence)", ["iid"], choices=SAMPLINGS, grid=True),
    Param("L", "int_list", "nested prompt lengths",
          Profiles(quick=[16, 32, 64, 128, 256], paper=[16, 32, 64, 128, 256, 512, 1024, 2048]), unit="tokens", low=1,
          order="increasing", min_len=3, why="the analysis fits log-log slopes in L"),
    Param("n_seeds", "int", "independent replicates (cells) per sampling", Profiles(quick=2, paper=4), low=1,
          grid=True),
    Param("n_prompts", "int", "independent prompts per cell, each shared by every query", Profiles(quick=12,
          paper=64), low=1),
    Param("eps", "float_list", "relative errors at which L*(eps) is reported (analysis only)", [0.3, 0.1, 0.03],
          low=0, low_open=True, order="decreasing"),
    Param("batch", "int", "batch length of the batch-means estimate of tau (0: floor(sqrt(n)))", 0, low=0),
    Param("prompt_chunk", "int", "prompts evaluated together (memory: prompt_chunk * L_max * (D + queries) floats)",
          8, low=1),
    Param("root_seed", "int", "root of every cell's random generator", 20251225),
)

#: the parameters that make the head, the tokens and the query set (what the exact part sees)
HEAD_PARAMS = ("tokens", "default_set", "default_D", *MATRICES, "d_head", "logit_scale", "U_norm", "queries",
               "n_queries", "root_seed")


# ------------------------------------------------------------------------------ reading the inputs
@functools.lru_cache(maxsize=8)
def _read(name, spec, sha256):
    """The read-only matrix of the file ``spec`` of parameter ``name`` (cached per file content)."""
    X = read_tokens(spec, name)
    X.flags.writeable = False
    return X


def _matrix_of(inputs, name, digests):
    """The matrix of file parameter ``name``, or None; in a cell ``digests`` are the configured
    ones and the file is checked unchanged first."""
    spec = inputs[name]
    if not spec:
        return None
    check_unchanged(spec, digests[name], name)
    return _read(name, spec, digests[name])


class Setup:
    """The tokens, head and query set of a configuration (read and checked once per process)."""

    def __init__(self, inputs, digests):
        Z = _matrix_of(inputs, "tokens", digests)
        self.builtin = Z is None
        self.tokens = token_set(inputs["default_set"], inputs["default_D"]) if Z is None else Z
        self.n, self.D = self.tokens.shape
        mats = {m: _matrix_of(inputs, m, digests) for m in MATRICES}
        U, self.V, d_head = head_matrices(self.D, **mats, d_head=inputs["d_head"] or None)
        self.scale = parse_logit_scale(inputs["logit_scale"], d_head)
        self.law = Empirical(self.tokens)
        rng = head_rng(inputs["root_seed"])
        self.default_head = U is None
        if U is None:
            U = default_U(substream(rng, part="head"), self.law.cov, inputs["U_norm"])
        self.U = self.scale * U
        q = _matrix_of(inputs, "queries", digests)
        if q is None:
            if inputs["n_queries"] > self.n:
                raise ValueError(f"n_queries: {inputs['n_queries']} distinct queries from a file of {self.n} tokens; "
                                 f"--set n_queries={self.n} at most, or give a query file")
            q = self.tokens[np.sort(substream(rng, part="queries").choice(self.n, inputs["n_queries"], replace=False))]
        elif q.shape[1] != self.D:
            raise ValueError(f"queries: the query file's rows have dimension {q.shape[1]} (shape {q.shape}), the "
                             f"tokens' D = {self.D}")
        self.q = q
        for shared in (self.U, self.V, self.q):  # every cell of the process reads these
            shared.flags.writeable = False


def head_rng(root_seed):
    """The generator of the default head and of the queries drawn from the tokens: keyed by
    ``root_seed`` alone (every cell sees the same head and query set)."""
    return cell_rng(f"{NAME}/head", {}, root_seed)


@functools.lru_cache(maxsize=4)
def _setup(key, digests):
    return Setup(dict(key), dict(digests))


def setup(inputs):
    """The :class:`Setup` of a cell's ``inputs`` (or a configuration), cached by their values; in a
    cell every file is first checked unchanged since the run was configured (its digest)."""
    digests = getattr(inputs, "digests", None)
    if digests is None:  # a cell's inputs carry the digests as <name>_sha256
        digests = {p: inputs[f"{p}_sha256"] for p in ("tokens", *MATRICES, "queries") if inputs.get(f"{p}_sha256")}
        for name, sha256 in digests.items():
            check_unchanged(inputs[name], sha256, name)
    key = tuple((p, inputs[p]) for p in HEAD_PARAMS)
    return _setup(key, tuple(sorted(digests.items())))


def _inputs_fit(config):
    """Every file read and checked before any work: finite 2-D arrays, the head's shapes against the
    tokens' D, the logit scale, the queries; window sampling needs L_max <= n; tau's batches."""
    s = setup(config)
    L_max = config["L"][-1]
    if "window" in config["sampling"] and L_max > s.n:
        raise ValueError(f"L: window sampling takes contiguous windows of the file, but the largest L = {L_max} "
                         f"exceeds its {s.n} tokens; use L <= {s.n} or --set sampling=iid")
    b = config["batch"] or math.isqrt(s.n)
    if s.n // b < 2:
        raise ValueError(f"batch: {b} tokens per batch leaves fewer than 2 batches of the file's {s.n} tokens; "
                         f"--set batch={s.n // 2} at most")


# ------------------------------------------------------------------------------ parts
def grid(config):
    return {"sampling": list(config["sampling"]), "seed": list(range(config["n_seeds"]))}


def no_grid(config):
    """The exact part is one cell."""
    return {}


def inner_coords(config):
    s = setup(config)
    return {"prompt": list(range(config["n_prompts"])), "L": list(config["L"]), "key_dim": list(range(s.D)),
            "query_dim": list(range(s.D)), "out_dim": list(range(s.V.shape[0]))}


def _with_digests(config, inputs):
    return {**inputs, **file_digests(PARAMS, config, inputs)}


def main_inputs(config, cell):
    """What reaches a prompt cell: every parameter but the grid's, ``eps`` (analysis only) and
    ``batch`` (exact part only), with the files' digests."""
    return _with_digests(config, {p.name: config[p.name] for p in PARAMS
                                  if not p.grid and p.name not in ("eps", "batch")})


def exact_inputs(config, cell):
    """What reaches the exact cell: the head, tokens and query set, and ``batch``."""
    return _with_digests(config, {name: config[name] for name in (*HEAD_PARAMS, "batch")})


def prompt_indices(rng, sampling, n, P, L_max):
    """The token rows of ``P`` prompts of ``L_max`` tokens, ``(P, L_max)``: ``"iid"`` draws
    ``rng.integers(0, n, (P, L_max))`` (with replacement, the empirical law's draw order);
    ``"window"`` draws the starts ``s = rng.integers(0, n - L_max + 1, P)`` and takes ``s + k``."""
    if sampling == "iid":
        return rng.integers(0, n, (P, L_max))
    return rng.integers(0, n - L_max + 1, P)[:, None] + np.arange(L_max)


def kernel(cell, rng, config):
    s = setup(config)
    Ls = np.asarray(config["L"])
    P, chunk = config["n_prompts"], config["prompt_chunk"]
    a = s.q @ s.U.T
    f_inf = s.law.tilted_mean(a) @ s.V.T  # (Q, D_out): the exact limit
    f_gauss = (s.law.mean + a @ s.law.cov) @ s.V.T  # the Gaussian surrogate m + Sigma U q (Sigma symmetric)
    idx = prompt_indices(rng, cell["sampling"], s.n, P, int(Ls[-1]))
    sq_err = np.empty((P, len(Ls)))
    sq_gauss = np.empty((P, len(Ls)))
    for lo in range(0, P, chunk):
        Z = s.tokens[idx[lo:lo + chunk]]  # (p, L_max, D)
        f_L = softmax_attention_prefix(Z[:, None], s.U, s.V, s.q[None], Ls)  # (p, Q, nL, D_out)
        sq_err[lo:lo + chunk] = np.sum((f_L - f_inf[None, :, None]) ** 2, axis=-1).mean(axis=1)
        sq_gauss[lo:lo + chunk] = np.sum((f_L - f_gauss[None, :, None]) ** 2, axis=-1).mean(axis=1)
    return {"mse": Out(sq_err, ("prompt", "L")), "mse_gauss": Out(sq_gauss, ("prompt", "L"))}


def gaussian_constant(law, U, V, q):
    """Query-set mean of the Gaussian picture's constant ``exp(a' Sigma a)(tr V Sigma V^T + ||V Sigma a||^2)``
    (:func:`asymptotic_mse` of ``N(m, Sigma)``, the tokens' moments); ``inf`` when it exceeds float64
    (the Gaussian picture then predicts no finite error constant at all)."""
    try:
        return float(asymptotic_mse(Gaussian(law.mean, law.cov), U, V, q).mean())
    except FloatOverflowError:
        return math.inf


def exact(cell, rng, config):
    """The exact quantities of the tokens' law at the query set (one cell, no draw)."""
    s = setup(config)
    a = s.q @ s.U.T
    f_inf = s.law.tilted_mean(a)
    m, Sigma, V = s.law.mean, s.law.cov, s.V
    logits = a @ s.tokens.T
    w = np.exp(logits - logits.max(axis=1, keepdims=True))
    b = config["batch"] or math.isqrt(s.n)
    tau, tau_se, _, B = integrated_factor(s.tokens, a, f_inf, V, b)
    return {
        "limit_sq": np.mean(np.sum(((f_inf - m) @ V.T) ** 2, axis=-1)),
        "limit_sq_gauss": np.mean(np.sum((a @ Sigma @ V.T) ** 2, axis=-1)),
        "bias_gauss": np.mean(np.sum(((f_inf - m - a @ Sigma) @ V.T) ** 2, axis=-1)),
        "const_sharp": np.mean(asymptotic_mse(s.law, s.U, V, s.q)),
        "const_gauss": gaussian_constant(s.law, s.U, V, s.q),
        "weight_ratio": np.mean(s.n * np.sum(w**2, axis=1) / np.sum(w, axis=1) ** 2),
        "tau": tau, "tau_se": tau_se, "n_batches": float(B), "n_tokens": float(s.n),
        "U_eff": Out(s.U, ("key_dim", "query_dim")), "V_used": Out(V, ("out_dim", "key_dim")),
    }


def cell_work(config, part):
    """Work of one cell of ``part`` in its non-grid parameters (``sfxlin run --plan``'s cost law,
    :mod:`sfxlin.engine.plan`; the grid dims' costs are fitted), from the configuration's tokens and
    query set (:func:`setup`, read once per process). Main part: every prompt of ``L_max`` tokens is
    evaluated at every query in one prefix pass, ``n_prompts * L_max * queries``, plus
    ``MAIN_OVERHEAD_WORK``, a cell's fixed cost (the exact limits at the query set) in the same units.
    Exact part: a softmax over the whole file and the influence functions per query, ``n * queries``,
    plus ``EXACT_OVERHEAD_WORK``."""
    s = setup(config)
    Q = s.q.shape[0]
    if part == E:
        return s.n * Q + EXACT_OVERHEAD_WORK
    return config["n_prompts"] * max(config["L"]) * Q + MAIN_OVERHEAD_WORK


#: a main cell's fixed cost in :func:`cell_work` units: warm CPU seconds of the cell sampling=iid
#: (``python -m sfxlin.engine.plan c1_own --cell sampling=iid --set ...``, built-in tokens, over L_max 128 .. 2048,
#: n_prompts x queries 12x8 and 64x32) follow about 0.005 s + 6e-9 s per unit of work
MAIN_OVERHEAD_WORK = 900_000
#: the exact cell's fixed cost: 2 .. 128 queries of the digits and wine sets follow 0.0034 s + 1.2e-7 s per
#: token and query (``python -m sfxlin.engine.plan c1_own --part exact --set n_queries=...``)
EXACT_OVERHEAD_WORK = 29_000


E = "exact"
VARIABLES = (
    Variable("mse", ("sampling", "seed", "prompt", "L"), "squared error to the exact limit",
             "for one prompt (shared by the queries), mean over the query set of ||V f_L(q) - V grad K_mu(U_eff q)||^2,"
             " mu the tokens' empirical law, f_L softmax attention over the prompt's first L tokens."),
    Variable("mse_gauss", ("sampling", "seed", "prompt", "L"), "squared error to the Gaussian surrogate",
             "for one prompt, mean over the query set of ||V f_L(q) - V (m + Sigma U_eff q)||^2, m and Sigma the "
             "tokens' mean and covariance (Lemma 2.1 for N(m, Sigma))."),
    Variable("limit_sq", (), "squared size of the limit's signal",
             "mean over the query set of ||V (grad K_mu(U_eff q) - m)||^2: the scale of the relative error.", part=E),
    Variable("limit_sq_gauss", (), "squared size of the Gaussian surrogate's signal",
             "mean over the query set of ||V Sigma U_eff q||^2.", part=E),
    Variable("bias_gauss", (), "exact squared bias of the Gaussian surrogate",
             "mean over the query set of ||V (grad K_mu(U_eff q) - m - Sigma U_eff q)||^2.", part=E),
    Variable("const_sharp", (), "sharp i.i.d. constant",
             "mean over the query set of tr V C_mu(U_eff q) V^T, C_mu the empirical law's exact SNIS (delta-method) "
             "constant: L E||V(f_L - f_inf)||^2 -> it for i.i.d. prompts.", part=E),
    Variable("const_gauss", (), "the Gaussian picture's constant",
             "mean over the query set of exp(a' Sigma a)(tr V Sigma V^T + ||V Sigma a||^2), a = U_eff q: the sharp "
             "constant if the tokens were N(m, Sigma); inf when it exceeds float64.", part=E, allow_nonfinite=True),
    Variable("weight_ratio", (), "inverse effective sample fraction",
             "mean over the query set of n sum_i w_i^2 / (sum_i w_i)^2, w_i = exp(z_i . U_eff q) over the file: a "
             "prompt of L tokens weighs like L / weight_ratio equal-weight tokens.", part=E),
    Variable("tau", (), "integrated autocorrelation factor of the influence function",
             "sum over lags h of tr V E[psi(z_0) psi(z_h)^T] V^T / tr V C_mu V^T along the file's order, summed over "
             "the query set, psi(z) = e^{a.z}(z - f_inf)/E e^{a.z}; batch means (batch length: the batch parameter). "
             "Window prompts have the constant tau * const_sharp.", part=E),
    Variable("tau_se", (), "standard error of tau", "batch-to-batch standard deviation / sqrt(n_batches), over the "
             "i.i.d. constant.", part=E),
    Variable("n_batches", (), "batches of the tau estimate", "floor(n / batch length).", part=E),
    Variable("n_tokens", (), "tokens in the file", "the rows of the token file (or of the built-in set).", part=E),
    Variable("U_eff", ("key_dim", "query_dim"), "the logit matrix used, c U",
             "logits c z^T U q = z^T U_eff q: U from its file, or W_K^T W_Q, or the default head (a Gaussian "
             "direction scaled to ||S^{1/2} U S^{1/2}||_F = U_norm, S = (tr Sigma / D) I, from root_seed: the "
             "config attr says which), times the logit scale c.", part=E),
    Variable("V_used", ("out_dim", "key_dim"), "the read-out used",
             "V from its file, or W_V, or I_D when neither is given.", part=E),
)

EXPERIMENT = Experiment(
    name=NAME, short="c1o", params=PARAMS, checks=(_inputs_fit,), inner_coords=inner_coords, variables=VARIABLES,
    analysis="sfxlin.analysis.c1_own",
    parts=(Part("", grid, kernel, inputs=main_inputs), Part(E, no_grid, exact, inputs=exact_inputs)),
    title="C1 for your own head: the error to the exact limit, its rate, and the prompt length L*(eps)",
    description="C1 for a user's head and token file: error to the exact limit vs L, constants, L*(eps), "
                "i.i.d. and contiguous-window prompts")
