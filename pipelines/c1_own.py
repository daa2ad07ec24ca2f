"""C1 for your own head, a variant of the C1 family: softmax attention over a token file against the exact limit
of its law. The tokens, the head and the query set are read and checked once when the run is configured
(:class:`Setup`); the default head and the queries come from ``root_seed`` alone (:func:`head_rng`). Main grid
``sampling x seed`` (iid or window prompts, each shared by every query); part ``exact``: the exact constants of
the tokens' law at the query set, and with window sampling the exact expected error of a window of the finite file
at every L. The inputs and the protocol: docs/own_head.md."""
from __future__ import annotations

import functools
import math

import numpy as np

from sfxlin.attention import asymptotic_mse, weight_ratio
from sfxlin.dependence import integrated_factor, window_mse
from sfxlin.engine import Cells, Out, Param, Profiles, Variable, cell_rng, substream
from sfxlin.heads import LOGIT_SCALES, default_U, head_matrices, parse_logit_scale
from sfxlin.laws import Empirical, FloatOverflowError, Gaussian
from sfxlin.realdata import DATASETS, TOKEN_SUFFIXES, check_unchanged, token_set

from .families.c1 import C1, chunks, file_matrix, sq_errors

NAME = "c1_own"
E = "exact"
SAMPLINGS = ("iid", "window")
MATRICES = ("U", "V", "W_Q", "W_K", "W_V")
#: the parameters that make the head, the tokens and the query set (what the exact part sees)
HEAD_PARAMS = ("tokens", "default_set", "default_D", *MATRICES, "d_head", "logit_scale", "U_norm", "queries",
               "n_queries", "root_seed")


def head_rng(root_seed):
    """The generator of the default head and of the queries drawn from the tokens: keyed by
    ``root_seed`` alone (every cell sees the same head and query set)."""
    return cell_rng(f"{NAME}/head", {}, root_seed)


class Setup:
    """The tokens, head and query set of a configuration (read and checked once per process)."""

    def __init__(self, inputs, digests):
        def read(name):
            return file_matrix(name, inputs[name], digests[name]) if inputs[name] else None

        Z = read("tokens")
        self.builtin = Z is None
        self.tokens = token_set(inputs["default_set"], inputs["default_D"]) if Z is None else Z
        self.n, self.D = self.tokens.shape
        U, self.V, d_head = head_matrices(self.D, **{m: read(m) for m in MATRICES}, d_head=inputs["d_head"] or None)
        self.scale = parse_logit_scale(inputs["logit_scale"], d_head)
        self.law = Empirical(self.tokens)
        rng = head_rng(inputs["root_seed"])
        self.default_head = U is None
        if U is None:
            U = default_U(substream(rng, part="head"), self.law.cov, inputs["U_norm"])
        self.U = self.scale * U
        q = read("queries")
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
    return _setup(tuple((p, inputs[p]) for p in HEAD_PARAMS), tuple(sorted(digests.items())))


def _inputs_fit(config):
    """Every file read and checked (:class:`Setup`) before any work; window sampling needs L_max <= n (a longer
    window would read a token twice); tau's batches."""
    s = setup(config)
    L_max = config["L"][-1]
    if "window" in config["sampling"] and L_max > s.n:
        raise ValueError(f"L: window sampling takes contiguous windows of the file, but the largest L = {L_max} "
                         f"exceeds its {s.n} tokens (a window would read a token twice); use L <= {s.n} or "
                         f"--set sampling=iid")
    b = config["batch"] or math.isqrt(s.n)
    if s.n // b < 2:
        raise ValueError(f"batch: {b} tokens per batch leaves fewer than 2 batches of the file's {s.n} tokens; "
                         f"--set batch={s.n // 2} at most")


def prompt_indices(rng, sampling, n, P, L_max):
    """The token rows of ``P`` prompts of ``L_max`` tokens, ``(P, L_max)``: ``"iid"`` with replacement (the
    empirical law's draw order); ``"window"`` from uniform starts ``s``, ``(s + k) mod n``: the file read
    circularly (why: docs/own_head.md, "A finite file")."""
    if sampling == "iid":
        return rng.integers(0, n, (P, L_max))
    return (rng.integers(0, n, P)[:, None] + np.arange(L_max)) % n


def kernel(cell, rng, config):
    s = setup(config)
    Ls = np.asarray(config["L"])
    P = config["n_prompts"]
    a = s.q @ s.U.T
    f_inf = s.law.tilted_mean(a) @ s.V.T  # (Q, D_out): the exact limit
    f_gauss = (s.law.mean + a @ s.law.cov) @ s.V.T  # the Gaussian surrogate m + Sigma U q (Sigma symmetric)
    idx = prompt_indices(rng, cell["sampling"], s.n, P, int(Ls[-1]))
    sq_err, sq_gauss = np.empty((P, len(Ls))), np.empty((P, len(Ls)))
    for ps in chunks(P, config["prompt_chunk"]):
        err, gauss = sq_errors(s.tokens[idx[ps]][:, None], s.U, s.V, s.q[None], Ls, f_inf[None, :, None],
                               f_gauss[None, :, None])   # (p, Q, nL): a prompt shared by the queries
        sq_err[ps], sq_gauss[ps] = err.mean(axis=1), gauss.mean(axis=1)
    return {"mse": sq_err, "mse_gauss": sq_gauss}


def gaussian_constant(law, U, V, q):
    """Query-set mean of the Gaussian picture's constant ``exp(a' Sigma a)(tr V Sigma V^T + ||V Sigma a||^2)``
    (:func:`asymptotic_mse` of ``N(m, Sigma)``, the tokens' moments); ``inf`` when it exceeds float64
    (the Gaussian picture then predicts no finite error constant at all)."""
    try:
        return float(asymptotic_mse(Gaussian(law.mean, law.cov), U, V, q).mean())
    except FloatOverflowError:
        return math.inf


def exact(cell, rng, config):
    """The exact quantities of the tokens' law at the query set (one cell, no draw); with window sampling
    the exact expected error of a window of the file at every L (:func:`sfxlin.dependence.window_mse`)."""
    s = setup(config)
    a = s.q @ s.U.T
    f_inf = s.law.tilted_mean(a)
    m, Sigma, V = s.law.mean, s.law.cov, s.V
    tau, tau_se, _, B = integrated_factor(s.tokens, a, f_inf, V, config["batch"] or math.isqrt(s.n))
    windows = (window_mse(s.tokens, a, f_inf, V, config["L"]) if config["windows"]
               else np.full(len(config["L"]), np.nan))
    return {
        "limit_sq": np.mean(np.sum(((f_inf - m) @ V.T) ** 2, axis=-1)),
        "limit_sq_gauss": np.mean(np.sum((a @ Sigma @ V.T) ** 2, axis=-1)),
        "bias_gauss": np.mean(np.sum(((f_inf - m - a @ Sigma) @ V.T) ** 2, axis=-1)),
        "const_sharp": np.mean(asymptotic_mse(s.law, s.U, V, s.q)), "const_gauss": gaussian_constant(s.law, s.U, V, s.q),
        "weight_ratio": np.mean(weight_ratio(a @ s.tokens.T)),
        "tau": tau, "tau_se": tau_se, "n_batches": float(B), "n_tokens": float(s.n), "window_mse": windows,
        "U_eff": Out(s.U, ("key_dim", "query_dim")), "V_used": Out(V, ("out_dim", "key_dim")),
    }


def exact_inputs(config, cell):
    """What reaches the exact cell: :data:`HEAD_PARAMS`, tau's batch, the prompt lengths, and ``windows``:
    whether the run samples windows (the exact window errors are computed only then)."""
    return {**{p: config[p] for p in (*HEAD_PARAMS, "batch", "L")}, "windows": "window" in config["sampling"]}


def counts(config, part, cell):
    """Main part: every prompt of ``L_max`` tokens read by the whole query set in one prefix pass; exact
    part: a softmax over the whole file per query, and with windows once more per query and prompt length."""
    s = setup(config)
    if part == E:
        windows = len(config["L"]) if "window" in config["sampling"] else 0
        return {"visit": s.n * s.q.shape[0] * (1 + windows), "cell": 1}
    return {"shared_visit": config["n_prompts"] * max(config["L"]) * s.q.shape[0], "cell": 1}


def _file(name, doc):
    return Param(name, "file", doc + ": 'path.npy' or 'path.nc:variable'; '' for none", "", suffixes=TOKEN_SUFFIXES,
                 optional=True, parts=(E, ""))


OWN = (
    Variable("limit_sq_gauss", (), "squared size of the Gaussian surrogate's signal", "mean over the query set of "
             "||V Sigma U_eff q||^2."),
    Variable("const_sharp", (), "sharp i.i.d. constant", "mean over the query set of tr V C_mu(U_eff q) V^T, C_mu "
             "the empirical law's exact SNIS (delta-method) constant: L E||V(f_L - f_inf)||^2 -> it for i.i.d. "
             "prompts."),
    Variable("const_gauss", (), "the Gaussian picture's constant", "mean over the query set of exp(a' Sigma a)(tr V "
             "Sigma V^T + ||V Sigma a||^2), a = U_eff q: the sharp constant if the tokens were N(m, Sigma); inf "
             "when it exceeds float64.", allow_nonfinite=True),
    Variable("tau", (), "integrated autocorrelation factor of the influence function", "sum over lags h of tr V "
             "E[psi(z_0) psi(z_h)^T] V^T / tr V C_mu V^T along the file's order, summed over the query set, psi(z) "
             "= e^{a.z}(z - f_inf)/E e^{a.z}; batch means (batch length: the batch parameter). Window prompts have "
             "the constant tau * const_sharp."),
    Variable("tau_se", (), "standard error of tau", "batch-to-batch standard deviation / sqrt(n_batches), over the "
             "i.i.d. constant."),
    Variable("n_batches", (), "batches of the tau estimate", "floor(n / batch length)."),
    Variable("n_tokens", (), "tokens in the file", "the rows of the token file (or of the built-in set)."),
    Variable("window_mse", ("L",), "exact expected error of a window of the file", "mean over the query set and "
             "over every start s of ||V(f_L - f_inf)||^2, f_L the softmax over the window z_s .. z_{s+L-1} of the "
             "file read circularly: what window prompts measure, exactly, at this finite file (0 at L = n: the "
             "window is the whole file); NaN when the run samples no windows.", allow_nonfinite=True),
    Variable("U_eff", ("key_dim", "query_dim"), "the logit matrix used, c U", "logits c z^T U q = z^T U_eff q: U "
             "from its file, or W_K^T W_Q, or the default head (a Gaussian direction scaled to ||S^{1/2} U "
             "S^{1/2}||_F = U_norm, S = (tr Sigma / D) I, from root_seed: the config attr says which), times the "
             "logit scale c."),
    Variable("V_used", ("out_dim", "key_dim"), "the read-out used", "V from its file, or W_V, or I_D when neither "
             "is given."),
)

EXPERIMENT = C1.variant(
    NAME, short="c1o", analysis="sfxlin.analysis.c1_own",
    values=dict(tokens="", U_norm=0.5, n_queries=Profiles(quick=8, paper=32),
                L=Profiles(quick=[16, 32, 64, 128, 256], paper=[16, 32, 64, 128, 256, 512, 1024, 2048]),
                n_seeds=Profiles(quick=2, paper=4), n_prompts=Profiles(quick=12, paper=64), root_seed=20251225),
    changes={"tokens": {"doc": "the token file, one token of dimension D per row ('': the built-in default_set): "
                               "'path.npy' or 'path.nc:variable'; '' for none", "parts": (E, "")},
             "U_norm": {"doc": "the default head's scale ||S^{1/2} U S^{1/2}||_F, S = (tr Sigma / D) I (used only "
                               "without U and W_Q)", "parts": (E, "")},
             "n_queries": {"doc": "queries drawn from the tokens (distinct rows) when no query file is given",
                           "parts": (E, "")},
             "L": {"parts": (E, "")},
             "n_prompts": {"doc": "prompts per cell, each shared by every query", "parts": ("",)}},
    params=(
        Param("default_set", "str", "the scikit-learn data set used when tokens is '' (standardised, whitened to "
              "default_D components)", "digits", choices=DATASETS, parts=(E, "")),
        Param("default_D", "int", "the dimension of the built-in token set", 4, low=1, high=10, parts=(E, "")),
        _file("U", "the logit matrix U (D x D), logits c z^T U q"),
        _file("V", "the read-out V (D_out x D); '' with no W_V: V = I"),
        _file("W_Q", "the query projection (d_head x D), with W_K: U = W_K^T W_Q"),
        _file("W_K", "the key projection (d_head x D)"),
        _file("W_V", "the value projection (d_v x D): V = W_V"),
        Param("d_head", "int", "the head dimension for logit_scale=1/sqrt(d_head) when no W_Q gives it (0: not "
              "given)", 0, low=0, parts=(E, "")),
        Param("logit_scale", "str", f"the logit scale c: {' or '.join(LOGIT_SCALES)} or a positive number", "1",
              parts=(E, "")),
        _file("queries", "queries, one of dimension D per row ('': n_queries tokens of the file)"),
        Param("sampling", "str_list", "how prompts are drawn: 'iid' (with replacement from the tokens' law) or "
              "'window' (contiguous windows of the file in its order, read circularly from a uniform start, for a "
              "file that is a sequence; the built-in set's order is the data set's, not a sequence)", ["iid"],
              choices=SAMPLINGS, grid=True),
        Param("eps", "float_list", "relative errors at which L*(eps) is reported (analysis only)", [0.3, 0.1, 0.03],
              low=0, low_open=True, order="decreasing", parts=()),
        Param("batch", "int", "batch length of the batch-means estimate of tau (0: floor(sqrt(n)))", 0, low=0,
              parts=(E,)),
        Param("prompt_chunk", "int", "prompts evaluated together (memory: prompt_chunk * L_max * (D + queries) "
              "floats)", 8, low=1, parts=("",))),
    cells=(Cells({"sampling": "sampling", "seed": "n_seeds"}, kernel,
                 (C1.output("mse", over=("prompt",)), C1.output("mse_gauss", over=("prompt",)))),
           Cells({}, exact, ("limit_sq", OWN[0], "bias_gauss", *OWN[1:3], "weight_ratio", *OWN[3:]), name=E,
                 inputs=exact_inputs)),
    coords={"prompt": lambda c: range(c["n_prompts"]), "key_dim": lambda c: range(setup(c).D),
            "query_dim": lambda c: range(setup(c).D), "out_dim": lambda c: range(setup(c).V.shape[0])},
    checks=(_inputs_fit,), cost=C1.cost.counting(counts),
    title="C1 for your own head: the error to the exact limit, its rate, and the prompt length L*(eps)",
    description="C1 for a user's head and token file: error to the exact limit vs L, constants, L*(eps), "
                "i.i.d. and contiguous-window prompts")
