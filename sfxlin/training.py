"""Gradient-descent training of the C3 models (docs/models.md, section 2): ``softmax(L)``, ``linear(L)``,
``linear(inf)``, and for a finite-support covariate law ``softmax(inf)`` (``"softmax_inf"``: softmax
over the law's whole support, each token weighted by its atom's weight; :func:`sfxlin.icl.support_tasks`).

Two paths:

* :func:`train` -- one model at one prompt length, simple and readable (calls the analytic
  gradients of :mod:`sfxlin.icl`); returns an ``xr.Dataset`` over checkpoints ``t``.
* :func:`train_all` / :func:`train_all_arrays` -- the fast engine: every prompt length of a
  strictly increasing list and every model in one vectorised loop. It is exact (same maths,
  float64), only organised differently:

  - the tokens are fixed during training and kept once per group of tasks sharing covariates (an
    antithetic pair), ``O(d)`` numbers a token (:class:`SoftmaxPrefixEngine`: the rows
    ``[x y, 1, x]`` at small d, the pairs' own covariates at larger d). Because ``y = w^T x``, a
    logit is ``z.a = x.(a_x + a_y w)`` and ``z . v = x . u``, ``u = v_x + v_y w``, so the moments a
    step needs are ``E_p 1``, ``E_p x``, ``E_p x y`` and, while ``v[:d] != 0``, ``E_p x (x . v_x)``, a
    moment weighted by ``x . v_x`` (a product of the logits' shape, never a row ``x_i x_j``);
  - the softmax moments come from the package's one softmax-moments core
    (:mod:`sfxlin.softmax_core`): nested prompts, tokens split into the blocks ``[L_{b-1}, L_b)``;
    the column of ``(L_j, query)`` reaches block ``j`` only (its parameters are ``L_j``'s), so a
    step costs ``sum_L L`` token evaluations per (task, query), nothing wasted;
  - the softmax shift is the previous step's log-sum-exp of each column (``>= max``, within
    ``log L`` of it; parameters move little per step), folded into the logit matmul as an extra
    coordinate (or, with the pairs' own covariates, subtracted, and skipped for a pair whose
    shifts are within ``FREE_SHIFT``), so a block costs one matmul, one in-place ``exp`` and one
    matmul. Every
    step checks that the normaliser is finite and far from under/overflow (``[1e-200, 1e200]``);
    otherwise it recomputes the step shifting each block by its own maximum, merged online
    (always safe);
  - antithetic partners (tasks ``2i``, ``2i + 1``) share their covariates, hence their logits
    whenever ``U[d, :d] == 0`` exactly: the softmax is then evaluated once per pair
    (``pair_first``, exact; gradient contributions of partners are added first).

The off-block part (``U`` outside the top-left block, ``v[:d]``) is computed, never imposed.
From a block-structured init on antithetic tasks the partners' off-block contributions are exact
opposites, so it stays exactly 0 with ``pair_first`` (by construction). The plain pairwise sums
leave rounding noise (~1e-17) there, which grows like an off-block perturbation wherever gradient
descent is unstable off-block (``lr * lambda_max(H_off) > 2``; on some BLAS kernels linear(L=4)
diverges at lr 0.05 that way); perturb ``(U0, v0)`` (e.g. by 1e-12 off-block) to study the
stability of the block structure.

Non-finite or exploding risk/parameters raise :class:`TrainingDiverged` (a
``FloatingPointError``) naming the cell label, the model, ``L`` and the step: never a silent NaN.
"""
from __future__ import annotations

import numpy as np

from . import icl, softmax_core
from ._version import __version__
from .validation import token_weights

__all__ = ["TrainingDiverged", "train", "train_all", "train_all_arrays", "validate_Ls", "checkpoint_steps",
           "log_checkpoint_steps", "given_checkpoints", "SoftmaxPrefixEngine", "LinearEngine", "heldout_risks",
           "perturbed_init", "pair_structure", "train_until"]

FINITE_MODELS = ("softmax", "linear")
#: largest ``2 d + 1`` for which :class:`SoftmaxPrefixEngine` keeps the tokens as the feature rows
#: ``[x y, 1, x]`` (faster while the products are narrow); above, it reads the pairs' own covariates,
#: ``E_p x y`` a label-weighted moment (docs/performance.md, section 11)
FEATURE_ROWS = 19
#: the layout of the pairs' own covariates: short prompt blocks evaluated together up to this many
#: tokens, and a group's logits exponentiated without a shift while its carried log-sum-exps are
#: within this bound (the sums then stay within the checked ``[1e-200, 1e200]``; beyond it the shift
#: is subtracted)
MERGE_TOKENS, FREE_SHIFT = 64, 300.0
TRAINED_MODELS = icl.MODELS + icl.LAW_MODELS
_TINY, _HUGE = 1e-200, 1e200


class TrainingDiverged(FloatingPointError):
    """Training produced a non-finite or exploding risk or parameter.

    Attributes: ``label`` (the caller's cell label), ``model``, ``L`` (None for linear_inf),
    ``step``.
    """

    def __init__(self, message, *, label="", model=None, L=None, step=None):
        super().__init__(message)
        self.label, self.model, self.L, self.step = label, model, L, step


# --------------------------------------------------------------------------- validation


def validate_Ls(Ls, L_max=None):
    """A strictly increasing list of positive integer prompt lengths (``<= L_max``) -> tuple."""
    try:
        seq = list(Ls)
    except TypeError as exc:
        raise TypeError(f"Ls must be a sequence of integers, got {Ls!r}") from exc
    if not seq:
        raise ValueError("Ls must not be empty")
    out = []
    for L in seq:
        if isinstance(L, (bool, np.bool_)) or not isinstance(L, (int, np.integer)) or L < 1:
            raise ValueError(f"every L must be a positive integer, got {L!r} in {seq}")
        out.append(int(L))
    if any(b <= a for a, b in zip(out, out[1:])):
        raise ValueError(f"Ls must be strictly increasing, got {out}")
    if L_max is not None and out[-1] > L_max:
        raise ValueError(f"largest L = {out[-1]} exceeds the prompt length L_max = {L_max} of the tasks")
    return tuple(out)


def checkpoint_steps(n_steps, ckpt_every):
    """Checkpoint steps ``0, k, 2k, ..., n_steps`` (``n_steps`` must be a multiple of ``k``)."""
    for name, val in (("n_steps", n_steps), ("ckpt_every", ckpt_every)):
        if isinstance(val, (bool, np.bool_)) or not isinstance(val, (int, np.integer)):
            raise TypeError(f"{name} must be an integer, got {val!r}")
    if n_steps < 0 or ckpt_every < 1:
        raise ValueError(f"need n_steps >= 0 and ckpt_every >= 1, got {n_steps}, {ckpt_every}")
    if n_steps % ckpt_every:
        raise ValueError(f"n_steps = {n_steps} must be a multiple of ckpt_every = {ckpt_every}")
    return np.arange(0, n_steps + 1, ckpt_every)


def log_checkpoint_steps(n_steps, per_octave):
    """Log-spaced checkpoint steps: ``0`` and the distinct ``round(2^(k / per_octave))`` up to ``n_steps``
    (``n_steps`` included): every step while they are closer than 1 apart, then ``per_octave``
    checkpoints per doubling of ``t`` (consecutive ratio ``2^(1 / per_octave)`` up to rounding)."""
    for name, val in (("n_steps", n_steps), ("per_octave", per_octave)):
        if isinstance(val, (bool, np.bool_)) or not isinstance(val, (int, np.integer)):
            raise TypeError(f"{name} must be an integer, got {val!r}")
    if n_steps < 1 or per_octave < 1:
        raise ValueError(f"need n_steps >= 1 and per_octave >= 1, got {n_steps}, {per_octave}")
    k = np.arange(int(np.ceil(per_octave * np.log2(n_steps))) + 1)
    t = np.minimum(np.rint(2.0 ** (k / per_octave)).astype(np.int64), n_steps)
    return np.unique(np.concatenate([[0], t, [n_steps]]))


def given_checkpoints(steps, n_steps):
    """``steps`` as an int array of checkpoint steps: strictly increasing integers from 0 to ``n_steps``."""
    t = np.asarray(steps)
    if t.ndim != 1 or t.size == 0 or t.dtype.kind not in "iu":
        raise ValueError(f"checkpoints must be a non-empty 1-d sequence of integers, got {steps!r}")
    if t[0] != 0 or t[-1] != n_steps or np.any(np.diff(t) <= 0):
        raise ValueError(f"checkpoints must increase strictly from 0 to n_steps = {n_steps}, got {t[0]} .. {t[-1]}"
                         f"{' (not strictly increasing)' if np.any(np.diff(t) <= 0) else ''}")
    return t.astype(np.int64)


def _check_lr(lr):
    lr = float(lr)
    if not (np.isfinite(lr) and lr > 0):
        raise ValueError(f"lr must be a positive finite number, got {lr}")
    return lr


def _init(tasks, U0, v0):
    if U0 is None and v0 is None:
        return icl.init_theta(tasks.d, tasks.second_moment)
    if U0 is None or v0 is None:
        raise ValueError("give both U0 and v0, or neither (Eq. 9 initialisation)")
    U0 = np.array(U0, dtype=float)
    v0 = np.array(v0, dtype=float)
    D = tasks.D
    if U0.shape != (D, D) or v0.shape != (D,):
        raise ValueError(f"U0 must be ({D}, {D}) and v0 ({D},), got {U0.shape} and {v0.shape}")
    if not (np.all(np.isfinite(U0)) and np.all(np.isfinite(v0))):
        raise ValueError("U0 and v0 must be finite")
    return U0, v0


def _cell(label, model, L):
    where = f"{model}(L={L})" if L is not None else f"{model}"
    return f"[{label}] {where}" if label else where


def _check_finite(risk, U, v, *, step, max_abs, label, model, Ls=None):
    """Raise TrainingDiverged for the first (model, L) whose risk or parameters are non-finite
    or exceed ``max_abs`` in absolute value. ``risk (...,)``, ``U (..., D, D)``, ``v (..., D)``."""
    if np.isfinite(risk).all() and np.abs(U).max() <= max_abs and np.abs(v).max() <= max_abs:
        return   # (a NaN parameter fails the comparisons)
    risk = np.atleast_1d(risk)
    U = U.reshape((-1,) + U.shape[-2:])
    v = v.reshape((-1, v.shape[-1]))
    with np.errstate(invalid="ignore"):
        big = np.maximum(np.abs(U).max(axis=(-2, -1)), np.abs(v).max(axis=-1))
        bad = ~np.isfinite(risk) | ~(big <= max_abs)
    i = int(np.flatnonzero(bad)[0])
    L = None if Ls is None else Ls[i]
    raise TrainingDiverged(
        f"{_cell(label, model, L)} diverged at step {step}: risk = {risk[i]!r}, max |theta| = {big[i]!r} "
        f"(limit {max_abs:g}); the learning rate is probably too large",
        label=label, model=model, L=L, step=step)


# --------------------------------------------------------------------------- simple path


def train(model, tasks, L=None, *, lr=0.01, n_steps=2500, ckpt_every=20, U0=None, v0=None,
          label="", max_abs=1e6, x_law=None, perturb=None):
    """Gradient descent on one ``model`` (``"softmax"``, ``"linear"``, ``"linear_inf"``,
    ``"softmax_inf"``) at prompt length ``L`` (ignored for the infinite-prompt models), from
    ``(U0, v0)`` (default: Eq. 9 init). ``"softmax_inf"`` needs the tasks' covariate law ``x_law``
    (an :class:`sfxlin.laws.Empirical`; see :func:`sfxlin.icl.support_tasks`).

    ``perturb``: as in :func:`train_all_arrays`.

    Returns an ``xr.Dataset`` with ``U (t, row, col)``, ``v (t, row)``, ``risk (t)`` at the
    checkpoints ``t = 0, ckpt_every, ..., n_steps`` (risk evaluated at the checkpoint parameters).
    Raises :class:`TrainingDiverged` naming ``label`` and the step on a non-finite or exploding
    risk or parameter.
    """
    icl.check_model(model, L)
    if model in FINITE_MODELS:
        L = icl.check_L(L, tasks.L_max)
    else:
        L = None
    lr = _check_lr(lr)
    steps = checkpoint_steps(n_steps, ckpt_every)
    U, v = _init(tasks, U0, v0)
    D = tasks.D
    Us = np.empty((len(steps), D, D))
    vs = np.empty((len(steps), D))
    risks = np.empty(len(steps))
    if model == "softmax":
        Z, zq, yq = tasks.prompt(L), tasks.z_q, tasks.y_q
        step_fn = lambda U, v: icl.softmax_risk_grad(U, v, Z, zq, yq)  # noqa: E731
    elif model == "softmax_inf":
        support, weights = icl.support_tasks(tasks, x_law)
        Z, zq, yq = support.Z, tasks.z_q, tasks.y_q
        step_fn = lambda U, v: icl.softmax_risk_grad(U, v, Z, zq, yq, weights)  # noqa: E731
    else:
        G, zq, yq = icl.model_matrix(model, tasks, L), tasks.z_q, tasks.y_q
        step_fn = lambda U, v: icl.linear_risk_grad(U, v, G, zq, yq)  # noqa: E731
    j = 0
    with np.errstate(all="ignore"):
        for t in range(n_steps + 1):
            risk, gU, gv = step_fn(U, v)
            _check_finite(risk, U, v, step=t, max_abs=max_abs, label=label, model=model,
                          Ls=None if L is None else (L,))
            if t == steps[j]:
                Us[j], vs[j], risks[j] = U, v, risk
                j += 1
            if t < n_steps:
                U = U - lr * gU
                v = v - lr * gv
                if perturb is not None:
                    U, v = perturb(U, v)
    import xarray as xr   # the labelled face of the arrays; the engines and train_all_arrays are numpy only

    ds = xr.Dataset(
        {"U": (("t", "row", "col"), Us), "v": (("t", "row"), vs), "risk": ("t", risks)},
        coords={"t": steps, "row": np.arange(D), "col": np.arange(D)},
        attrs={"model": model, "L": -1 if L is None else L, "lr": lr, "label": label,
               "sfxlin_version": __version__})
    _annotate(ds)
    return ds


def _annotate(ds):
    meta = {
        "U": ("attention matrix U = K^T Q", "gradient-descent iterate at the checkpoint"),
        "v": ("read-out vector v", "gradient-descent iterate at the checkpoint"),
        "risk": ("training risk", "mean over tasks and queries of 1/2 (pred - y_q)^2 at the checkpoint parameters"),
        "U_inf": ("attention matrix U of linear(inf)", "gradient descent with Gamma_w (Lemma 2.1 limit)"),
        "v_inf": ("read-out vector v of linear(inf)", "gradient descent with Gamma_w (Lemma 2.1 limit)"),
        "risk_inf": ("training risk of linear(inf)", "mean over tasks and queries of 1/2 (pred - y_q)^2"),
        "U_softmax_inf": ("attention matrix U of softmax(inf)", "gradient descent on the exact limit under the law"),
        "v_softmax_inf": ("read-out vector v of softmax(inf)", "gradient descent on the exact limit under the law"),
        "risk_softmax_inf": ("training risk of softmax(inf)", "mean over tasks and queries of 1/2 (pred - y_q)^2"),
    }
    for name, (long_name, desc) in meta.items():
        if name in ds:
            ds[name].attrs.update(long_name=long_name, description=desc)
    ds["t"].attrs.update(long_name="gradient-descent step")
    if "L" in ds.coords:
        ds["L"].attrs.update(long_name="prompt length")
    return ds


# --------------------------------------------------------------------------- fast engine


def pair_structure(tasks):
    """Group size: 2 if tasks ``2i, 2i+1`` are exact antithetic pairs (same covariates and query
    points, opposite ``w``, labels and query targets), else 1."""
    if not tasks.paired or tasks.n_tasks % 2:
        return 1
    if tasks.pairs is not None:          # stored once per pair: exact pairs, checked at construction
        return 2
    d = tasks.d
    Z, w = tasks.Z, tasks.w
    pairs = (np.array_equal(Z[0::2, :, :d], Z[1::2, :, :d]) and np.array_equal(Z[1::2, :, d], -Z[0::2, :, d])
             and np.array_equal(w[1::2], -w[0::2]) and np.array_equal(tasks.x_q[0::2], tasks.x_q[1::2])
             and np.array_equal(tasks.y_q[1::2], -tasks.y_q[0::2]))
    return 2 if pairs else 1


class _ItemSum:
    """Sums over the items ``(task, query)`` of arrays with items on the last axis (task-major,
    ``N = n_tasks * n_queries``): plain, or antithetic partners first (tasks ``2i`` and
    ``2i + 1``), which makes the sum of exactly opposite contributions exactly zero.

    ``total(T (..., N)) -> (...)``; ``outer(T (..., N), items(X)) = sum_n T[..., n] X[n] ->
    (..., m)`` for an item array ``X (N, m)`` equal across antithetic partners (e.g. query points):
    ``items(X)``, the rows the sum reads (the first partner's when ``pair_first``), is taken once
    by the caller, not at every step.
    """

    def __init__(self, n_tasks, n_queries, pair_first):
        self.n, self.q, self.pair_first = n_tasks, n_queries, pair_first

    def _fold(self, T):
        if not self.pair_first:
            return T
        T = T.reshape(T.shape[:-1] + (self.n // 2, 2 * self.q))
        return (T[..., : self.q] + T[..., self.q:]).reshape(T.shape[:-2] + (-1,))

    def total(self, T):
        return self._fold(T).sum(axis=-1)

    def items(self, X):
        if not self.pair_first:
            return X
        return X.reshape((self.n // 2, 2 * self.q) + X.shape[1:])[:, : self.q].reshape((-1,) + X.shape[1:])

    def outer(self, T, X_items):
        return self._fold(T) @ X_items


def _group_tokens(tasks, g):
    """``(X (ng, L_max, d), Y (ng, L_max))``: the covariates of each group of ``g`` tasks sharing them
    and the labels of the group's first task (views of ``Z``, or the pairs themselves when the tasks
    store them once: :class:`sfxlin.icl.PairTokens`)."""
    if g == 2 and tasks.pairs is not None:
        return tasks.pairs.x, tasks.pairs.y
    Z = tasks.Z
    return Z[::g, :, :tasks.d], Z[::g, :, tasks.d]


def _tokens_last(X, Y, L, *, x, one=None, xy=None):
    """The first ``L`` tokens of the groups, tokens last, ``(ng, rows, L)``: rows ``x .. x + d`` the
    covariates, row ``one`` the constant 1 and rows ``xy .. xy + d`` the products ``x_i y`` (when
    given). Filled a tile of tokens at a time (a transposing copy that stays in cache),
    ``X (ng, L_max, d)``, ``Y (ng, L_max)``."""
    ng, _, d = X.shape
    rows = d + (0 if one is None else 1) + (0 if xy is None else d)
    out = np.empty((ng, rows, L))
    if one is not None:
        out[:, one] = 1.0
    tile = 2048
    for g in range(ng):
        for t0 in range(0, L, tile):
            t1 = min(L, t0 + tile)
            xb = X[g, t0:t1].T
            out[g, x:x + d, t0:t1] = xb
            if xy is not None:
                np.multiply(xb, Y[g, t0:t1], out=out[g, xy:xy + d, t0:t1])
    return out


class SoftmaxPrefixEngine:
    """Risk and gradient of ``softmax(L)`` for all ``L`` in ``Ls`` at once (see module doc).

    ``step(U (nL, D, D), v (nL, D)) -> (risk (nL,), grad_U (nL, D, D), grad_v (nL, D))``.
    Requires labels ``y = w^T x``, or noisy labels ``y = w^T x + eps`` in exact antithetic pairs
    (checked; noisy pairs run in ``d + 1`` covariate dimensions, the noise as a covariate, see
    ``_embed_noise``; for other labels use :func:`train` per ``L``).
    ``cache_bytes`` bounds the bytes of the logits of one batched product of the softmax core
    (cache blocking). ``weights (L_max,)``: token weights ``pi_k`` shared by every task (softmax
    weights proportional to ``pi_k e^{logit}``; ``None``: equal), which multiply the feature rows
    and never the logits: with ``Ls = (n_atoms,)`` on :func:`sfxlin.icl.support_tasks` this is
    softmax(inf) under an empirical covariate law.

    The moments per column (a prompt length and a query) are ``E_p 1``, ``E_p x``, ``E_p x y``
    (``y`` the label of the group's first task) and, while ``v[:, :d] != 0``, ``E_p x (x . v_x)``;
    with ``z . v = x . u``, ``u = v_x + v_y w``, they give ``E_p x (x . u) = E_p x (x . v_x) +
    v_y sign E_p x y`` (a partner's sign enters there, so partners share the pass). A logit is
    ``x . (a_x + a_y w_j)`` for partner ``j`` (``y = w . x``). The tokens are kept once per group of
    tasks sharing covariates, tokens last, ``O(d)`` numbers a token, in one of two layouts (the
    ``features`` attribute; docs/performance.md, section 11, measures both):

    * ``2 d + 1 <= FEATURE_ROWS``: the rows ``x_i y, 1, x_i``; the logits read ``[1, x]`` (the shift
      on the row 1), the moments all rows, so ``E_p x y`` is the moment of the feature ``x y``;
    * otherwise the rows ``x_i`` alone, the pairs' own covariates when the tasks store them
      (:class:`sfxlin.icl.PairTokens`: no copy); ``E_p 1`` is the sum of the weights, ``E_p x y`` a
      moment weighted by the label (:func:`sfxlin.softmax_core.prefix_moments`' ``row_weights``),
      the shift subtracted only when some carried log-sum-exp leaves ``[-FREE_SHIFT, FREE_SHIFT]``,
      short blocks merged up to ``MERGE_TOKENS``, and with ``pair_first`` a pair's two contributions
      added in closed form (:meth:`_pair_step`).

    ``E_p x (x . v_x)`` is a column-weighted moment (``col_weights``: the weight ``x . v_x(L)`` per
    column and token, a product of the logits' shape), so no token carries its products ``x_i x_j``.
    With ``pair_first`` the gradient sums add antithetic partners first, and whenever ``U[:, d, :d] ==
    0`` exactly the partners have bitwise identical logits and are evaluated once.
    """

    #: Evaluate antithetic partners' softmax once whenever their logits and shifts are bitwise
    #: identical (``U[:, d, :d] == 0``, equal shifts) also with the plain sums: the same numbers
    #: (each partner's moments are the shared column's), half the exponentials. ``False``
    #: restores the partner-by-partner pass (the reference of tests/test_speed_invariance.py).
    share_pairs = True

    def __init__(self, tasks, Ls, *, cache_bytes=1 << 19, pair_first=False, weights=None, _group=None):
        Ls = validate_Ls(Ls, tasks.L_max)
        weights = token_weights(weights, tasks.L_max)
        d, n, q = tasks.d, tasks.n_tasks, tasks.n_queries
        g = pair_structure(tasks) if _group is None else _group
        X, Y = _group_tokens(tasks, g)                         # (ng, L_max, d), (ng, L_max)
        resid = np.abs(Y - np.einsum("nli,ni->nl", X, tasks.w[::g]))
        if not np.all(resid <= 1e-12 * (np.max(np.abs(Y)) + 1.0)):
            if g == 2:
                self._embed_noise(tasks, X, Y, Ls, cache_bytes, pair_first, weights)
                return
            task, token = np.unravel_index(np.argmax(resid), resid.shape)
            raise ValueError(
                f"the fast engine needs noiseless labels y = w^T x, or noisy labels y = w^T x + eps in exact antithetic pairs "
                f"((w, eps) and (-w, -eps) sharing covariates and query points) in tasks.Z (largest |y - w^T x| = "
                f"{resid.max():.3g}, task {task}, token {token}, pairs not exact); for other labels call the general "
                "path training.train('softmax', tasks, L) once per prompt length L (slower); linear(L) accepts them "
                "in train_all(tasks, Ls, models=('linear',))")
        if pair_first and g != 2:
            raise ValueError("pair_first needs tasks in exact antithetic pairs sharing covariates")
        ng = n // g
        self.Ls, self.nL, self.d, self.D, self.g, self.ng, self.q = Ls, len(Ls), d, d + 1, g, ng, q
        self.N = n * q
        self.cache_bytes = int(cache_bytes)
        self.w = tasks.w.reshape(ng, g, d)
        self.xq = np.ascontiguousarray(tasks.x_q[::g])          # (ng, q, d), shared in a group
        self.WT = np.ascontiguousarray(np.repeat(tasks.w, q, axis=0).T)   # (d, N) per item
        self.partner_sign = np.array([1.0, -1.0][:g])           # y of partner j = partner_sign[j] * y of the group
        self.sign = np.tile(np.repeat(self.partner_sign, q), ng)  # y_item = sign * y_group
        self.XQ = tasks.x_q.reshape(self.N, d)                  # (N, d)
        self.YQ = tasks.y_q.reshape(self.N)
        self.sum_items = _ItemSum(n, q, pair_first)
        self.XQ_items = self.sum_items.items(self.XQ)
        L = Ls[-1]
        self.features = 2 * d + 1 <= FEATURE_ROWS
        if self.features:                                       # rows [x_i y (d) | 1 | x_i (d)]
            Phi = _tokens_last(X, Y, L, one=d, x=d + 1, xy=0)
            self.X, self.y_row = Phi[:, d:], None               # logits on [1, x]
            self.rows = dict(one=d, x=slice(d + 1, 2 * d + 1), xy=(0, slice(0, d)))
            if weights is not None:
                self.X = self.X.copy()
                Phi *= weights[:L]
        else:                                                   # rows x_i (d): the pairs' own when stored so
            self.X = X[:, :L].transpose(0, 2, 1) if X.strides[1] == X.itemsize else _tokens_last(X, Y, L, x=0)
            self.y_row = Y[:, None, :L]                         # E_p x y: weighted by the label
            self.rows = dict(one=0, x=slice(1, d + 1), xy=(-1, slice(1, d + 1)))
            Phi = self.X                                        # with the sums of the weights as feature 0
            if weights is not None:
                Phi = _tokens_last(X, Y, L, one=0, x=1) * weights[:L]
        self.Phi, self.edges = Phi, (0,) + Ls
        self.reach = np.repeat(np.arange(self.nL), q)            # column (L_l, query) needs blocks <= l
        self._B, self._work = {}, {}                             # coefficient buffers, core workspace
        self.shift = None                                       # (ng, nL, g, q)
        self.n_exact = 0                                        # steps needing the exact max
        self.n_shared = 0                                       # steps with shared pair logits

    def _embed_noise(self, tasks, X, Y, Ls, cache_bytes, pair_first, weights):
        """Noisy labels in exact antithetic pairs: run the engine on noiseless tasks in ``d + 1``
        covariate dimensions. The noise ``eps = y - w^T x`` of each token becomes a covariate and
        ``w`` gains the entry ``+-1`` (``(w, 1)`` and ``(-w, -1)``: still exact pairs sharing the
        covariates ``(x, eps)``, stored once per pair), so the labels ``(w, 1) . (x, eps)`` are
        unchanged. The model's ``(U, v)`` are embedded with zero rows, columns and read-out on that
        coordinate, where the logits, predictions and gradients equal the original model's exactly
        (same maths; the extra coordinate's gradient is dropped). Query points get 0 there (``U``
        ignores it)."""
        d = tasks.d
        eps = np.empty(Y.shape)                                 # a covariate: shared by the partners
        for p in range(0, X.shape[0], 64):                      # w . x over contiguous tokens, as ever
            part = slice(p, p + 64)
            eps[part] = Y[part] - np.einsum("nli,ni->nl", np.ascontiguousarray(X[part]), tasks.w[0::2][part])
        s = np.where(np.arange(tasks.n_tasks) % 2, -1.0, 1.0)
        Sigma = np.eye(d + 1)
        Sigma[:d, :d] = tasks.Sigma
        Xa = np.empty((X.shape[0], d + 1, X.shape[1]))          # (x, eps), tokens last
        Xa[:, :d] = X.transpose(0, 2, 1)
        Xa[:, d] = eps
        aug = icl.Tasks(Z=icl.PairTokens(Xa.transpose(0, 2, 1), Y),
                        w=np.concatenate([tasks.w, s[:, None]], axis=-1),
                        x_q=np.concatenate([tasks.x_q, np.zeros(tasks.x_q.shape[:-1] + (1,))], axis=-1),
                        y_q=tasks.y_q, Sigma=Sigma, paired=True)
        inner = SoftmaxPrefixEngine(aug, Ls, cache_bytes=cache_bytes, pair_first=pair_first, weights=weights,
                                    _group=2)
        keep = np.r_[0:d, d + 1]                      # the model's coordinates (x, y) among (x, eps, y)
        D = d + 1

        def step(U, v):
            nL = U.shape[0]
            Ua = np.zeros((nL, D + 1, D + 1))
            Ua[:, keep[:, None], keep] = U
            va = np.zeros((nL, D + 1))
            va[:, keep] = v
            risk, gU, gv = inner.step(Ua, va)
            self.n_exact, self.n_shared = inner.n_exact, inner.n_shared
            return risk, gU[:, keep[:, None], keep], gv[:, keep]

        self.Ls, self.nL, self.d, self.D, self.g = inner.Ls, inner.nL, d, D, 2
        self.n_exact, self.n_shared, self.inner = 0, 0, inner
        self.step = step

    def _passes(self, B, C, shift):
        """Un-normalised moments ``(ng, nL, ge, q, nw, nf)`` and the shift their logits had
        ``(ng, nL, ge, q)`` (the log-sum-exp is that plus ``log`` of the sum of the weights), of the
        logit coefficients ``B (ng, ge, nL, q, K)`` and the column weights ``C (ng, nL * q, 1, K)``
        (``x . v_x``; ``None`` while ``v_x == 0``), shifted by the carried ``shift (ng, nL, ge, q)``
        (folded into ``B``'s constant row in the features layout; in the weighted layout only for the
        groups it keeps far from 0) or, ``None``, by each block's maximum (the largest logit is then
        the shift), from the softmax core: one call per partner column ``j``, each of the
        same shapes whatever ``ge`` is, so a partner's logits and moments are the same floating-point
        operations on the same operands in the shared pass (``ge = 1``) and in the partner-by-partner
        pass (``ge = 2``). Sharing changes the cost, never a bit."""
        ng, ge, nL, q, K = B.shape
        nw = 1 + (C is not None) + (self.y_row is not None)
        nf = self.rows["x"].stop
        Mom, applied = np.empty((ng, nL, ge, q, nw, nf)), np.empty((ng, nL, ge, q))
        for j in range(ge):
            kw = dict(shifted=shift is not None)
            if shift is not None:
                applied[:, :, j] = shift[:, :, j]
            if not self.features:      # a group's logits exponentiated as given while its carried shift is
                # the tokens' rows held in cache beside the columns' (docs/performance.md, section 13); the
                # features layout keeps its sub-blocks, and its bits
                kw.update(ones=self.Phi is self.X, merge_tokens=MERGE_TOKENS, hold_tokens=True)
                if shift is not None:  # moderate (s - 0 is s: its bits do not depend on the other groups)
                    far = np.abs(shift[:, :, j]).max(axis=(1, 2)) > FREE_SHIFT
                    applied[:, :, j] = np.where(far[:, None, None], shift[:, :, j], 0.0)
                    if np.any(far):
                        kw["shift"] = applied[:, :, j].reshape(ng, nL * q)
            M, P = softmax_core.prefix_moments(
                self.Phi, self.edges, A=B[:, j].reshape(ng, nL * q, K), X=self.X, reach=self.reach, at_reach=True,
                col_weights=C, row_weights=self.y_row, cache_bytes=self.cache_bytes, work=self._work, **kw)
            Mom[:, :, j] = P.reshape(ng, nL, q, nw, nf)          # column (L_l, query) at its own prompt l
            if shift is None:
                applied[:, :, j] = M.reshape(ng, nL, q)
        return Mom, applied

    def _ok(self, Mom):
        M0 = Mom[..., 0, self.rows["one"]]
        return bool(np.all(np.isfinite(Mom)) and M0.min() > _TINY and M0.max() < _HUGE)

    def _partners_alike(self, g):
        """With the plain sums, partners may share one pass only if their shifts are bitwise equal
        too (the shift is part of the arithmetic); they differ after a step with unequal logits."""
        if not (self.share_pairs and g == 2):
            return False
        return self.shift is None or np.array_equal(self.shift[:, :, 0], self.shift[:, :, 1])

    def moments(self, U, v):
        """Un-normalised moments ``(ng, nL, ge, q, nw, nf)`` of the softmax weights (the plain sums,
        then the ``x . v_x``-weighted ones while ``v_x != 0``, then the ``y``-weighted ones in the
        weighted layout), ``ge = 1`` when the partners shared the pass (``ge = g`` otherwise), or
        ``None`` if they cannot be made finite; updates the shift to the log-sum-exp."""
        d, g, K = self.d, self.g, self.X.shape[1]
        a = (self.xq.reshape(-1, d) @ np.swapaxes(U[:, :, :d], -1, -2))   # (nL, ng*q, D)
        a = a.reshape(self.nL, self.ng, self.q, self.D).transpose(1, 0, 2, 3)
        shared = not np.any(U[:, d, :d]) and (self.sum_items.pair_first or self._partners_alike(g))
        ge = 1 if shared else g
        B = self._B.get(ge)
        if B is None:
            B = self._B[ge] = np.zeros((self.ng, ge, self.nL, self.q, K))
        x = slice(K - d, K)                                     # the x rows (after the constant one)
        if shared:                     # a_y == 0 exactly: both partners have the logits x . a_x
            B[:, 0, :, :, x] = a[..., :d]
        else:                          # y_j = w_j . x: x . (a_x + a_y w_j)
            B[..., x] = a[:, None, :, :, :d] + a[:, None, :, :, d:] * self.w[:, :, None, None, :]
        C = None
        if np.any(v[:, :d]):           # weights x . v_x(L) of the column (L, query)
            C = np.zeros((self.ng, self.nL, self.q, 1, K))
            C[..., 0, x] = v[:, None, :d]
            C = C.reshape(self.ng, self.nL * self.q, 1, K)
        shift = None if self.shift is None else self.shift[:, :, :ge]
        Mom = None
        if shift is not None:
            if self.features:
                B[..., 0] = -shift.transpose(0, 2, 1, 3)
            Mom, shift = self._passes(B, C, shift)
        if Mom is None or not self._ok(Mom):
            self.n_exact += 1
            if self.features:
                B[..., 0] = 0.0
            Mom, shift = self._passes(B, C, None)
            if not (np.all(np.isfinite(shift)) and self._ok(Mom)):
                self.shift = None
                return None
        self.shift = shift + np.log(Mom[..., 0, self.rows["one"]])   # log-sum-exp: next step's shift
        if shared:
            self.n_shared += 1
            self.shift = np.broadcast_to(self.shift, (self.ng, self.nL, g, self.q))
        return Mom

    def _pair_step(self, Mom, v):
        """Risk and gradient from the moments ``(ng, nL, q, nw, nf)`` of a pass shared by antithetic
        partners (weighted layout, ``pair_first``): each pair's two contributions added in closed
        form. With ``m1 = E_p x``, ``m2 = E_p x y``, ``m3 = E_p x (x . v_x)`` of the pair's first task,
        partner ``s = +-1`` has ``pred = A + s B`` (``A = v_x . m1``, ``B = v_y w . m1``) and the
        residual ``r = A + s E`` (``E = B - y_q``), so ``sum_s r^2 = 2 (A^2 + E^2)``, ``sum_s r m1 =
        2 A m1``, ``sum_s r (w_s . m1) = 2 E w . m1``, and ``rc_s = r (E_p x (x . u) - m1 pred) =
        (A + s E)(P + s Q)`` with ``P = m3 - A m1``, ``Q = v_y m2 - B m1``: ``sum_s rc_s = 2 (A P +
        E Q)``, ``sum_s s rc_s = 2 (A Q + E P)``. While ``v_x == 0`` exactly, ``A = 0`` and ``m3 = 0``, so
        the off-block gradient (``grad v_x``, ``grad U[d, :d]``) is exactly 0, as partner-first sums
        make it."""
        d, D, nL, N = self.d, self.D, self.nL, self.N
        rows, vy = self.rows, v[None, :, None, d]
        inv = 1.0 / Mom[..., 0, rows["one"]]                               # (ng, nL, q)
        m1 = Mom[..., 0, rows["x"]] * inv[..., None]                       # (ng, nL, q, d)
        w = self.w[:, 0]                                                   # (ng, d) of the first partner
        wm1 = np.einsum("glqi,gi->glq", m1, w)
        B = vy * wm1
        E = B - self.YQ.reshape(self.ng, 2, self.q)[:, None, 0]
        Q = Mom[..., rows["xy"][0], rows["xy"][1]] * (inv * vy)[..., None] - B[..., None] * m1
        xq = self.xq.reshape(-1, d)                                        # (ng q, d)
        gv, gU = np.zeros((nL, D)), np.zeros((nL, D, D))
        c1 = E[..., None] * Q
        if np.any(v[:, :d]):
            A = np.einsum("glqi,li->glq", m1, v[:, :d])
            P = Mom[..., 1, rows["x"]] * inv[..., None] - A[..., None] * m1
            c1 += A[..., None] * P
            c2 = A[..., None] * Q + E[..., None] * P
            gv[:, :d] = 2.0 * np.einsum("glq,glqi->li", A, m1) / N
            gU[:, d, :d] = 2.0 * np.einsum("glq,gqj->lj", np.einsum("glqi,gi->glq", c2, w),
                                           self.xq) / N
            risk = np.einsum("glq->l", A * A + E * E) / N
        else:
            risk = np.einsum("glq->l", E * E) / N
        gv[:, d] = 2.0 * np.einsum("glq,glq->l", E, wm1) / N
        gU[:, :d, :d] = 2.0 * (c1.transpose(1, 3, 0, 2).reshape(nL, d, -1) @ xq) / N
        return risk, gU, gv

    def step(self, U, v):
        d, D, nL, N = self.d, self.D, self.nL, self.N
        with np.errstate(over="ignore", under="ignore", invalid="ignore", divide="ignore"):
            Mom = self.moments(U, v)
        if Mom is None:
            return np.full(nL, np.nan), np.full((nL, D, D), np.nan), np.full((nL, D), np.nan)
        if Mom.shape[2] == 1 and self.g == 2 and self.sum_items.pair_first and not self.features:
            return self._pair_step(Mom[:, :, 0], v)
        Mom = np.broadcast_to(Mom, Mom.shape[:2] + (self.g,) + Mom.shape[3:])
        nw, nf = Mom.shape[-2:]
        M = Mom.transpose(4, 5, 1, 0, 2, 3).reshape(nw, nf, nL, N)   # items (task, query) last
        rows = self.rows
        inv = 1.0 / M[0, rows["one"]]
        m1 = M[0, rows["x"]] * inv                                 # E_p x   (d, nL, N)
        WT = self.WT                                               # (d, N): w of each item
        u = v.T[:d, :, None] + v[:, d, None] * WT[:, None, :]      # z . v = x . u   (d, nL, N)
        m2u = M[rows["xy"]] * (v[:, d, None] * self.sign * inv)    # E_p x (x . u) = v_y sign E_p x y
        if np.any(v[:, :d]):                                       #   + E_p x (x . v_x)
            m2u += M[1, rows["x"]] * inv
        pred = (m1 * u).sum(axis=0)                                # v . mbar_z = u . E_p x
        r = pred - self.YQ                                         # (nL, N)
        rc = r * (m2u - m1 * pred)                                 # r (C v), x-part; y-part w . rc
        rm1 = r * m1                                               # r mbar, x-part; y-part w . rm1
        s = self.sum_items
        risk = 0.5 * s.total(r * r) / N
        gv = np.empty((nL, D))
        gv[:, :d] = s.total(rm1).T / N
        gv[:, d] = s.total((rm1 * WT[:, None, :]).sum(axis=0)) / N
        gU = np.zeros((nL, D, D))                                  # z_q = (x_q, 0): last column 0
        gU[:, :d, :d] = s.outer(rc, self.XQ_items).transpose(1, 0, 2) / N
        gU[:, d, :d] = s.outer((rc * WT[:, None, :]).sum(axis=0), self.XQ_items) / N
        return risk, gU, gv


class LinearEngine:
    """Risk and gradient of ``v^T G U z_q`` for a stack of models, ``G (nL, n, D, D)`` (one
    matrix per model and task: ``Ghat_L`` for all L, or ``Gamma_w`` with nL = 1).
    ``step(U (nL, D, D), v (nL, D)) -> (risk (nL,), grad_U (nL, D, D), grad_v (nL, D))``."""

    def __init__(self, tasks, G, *, pair_first=False, _group=None):
        n, q, D = tasks.n_tasks, tasks.n_queries, tasks.D
        G = np.asarray(G, dtype=float)
        if G.ndim != 4 or G.shape[1:] != (n, D, D):
            raise ValueError(f"G must be (nL, {n}, {D}, {D}), got {G.shape}")
        self.GT = np.ascontiguousarray(G.transpose(0, 2, 3, 1))  # (nL, D, D, n): tasks last
        self.n, self.q, self.D, self.N = n, q, D, n * q
        self.zq = tasks.z_q.reshape(self.N, D)                  # items (task, query)
        self.zqT = np.ascontiguousarray(tasks.z_q.transpose(2, 1, 0)).reshape(D, q * n)  # (q, task) order
        self.YQ = np.ascontiguousarray(tasks.y_q.T)             # (q, n)
        if pair_first and (pair_structure(tasks) if _group is None else _group) != 2:
            raise ValueError("pair_first needs tasks in exact antithetic pairs sharing covariates")
        self.sum_items = _ItemSum(n, q, pair_first)
        self.zq_items = self.sum_items.items(self.zq)

    def step(self, U, v):
        nL, n, q, D, N = U.shape[0], self.n, self.q, self.D, self.N
        GT = self.GT
        # inner loops run over tasks (contiguous): layout (q, n), then items (n, q) for the sums
        Uz = (U @ self.zqT).reshape(nL, 1, D, q, n)             # U z_q
        h = (GT[:, :, :, None, :] * Uz).sum(axis=2)             # G U z_q      (nL, D, q, n)
        r = (v[:, :, None, None] * h).sum(axis=1) - self.YQ     # (nL, q, n)
        Gtv = (GT * v[:, :, None, None]).sum(axis=1)            # G^T v        (nL, D, n)
        rGtv = Gtv[:, :, None, :] * r[:, None]                  # (nL, D, q, n)
        r = r.transpose(0, 2, 1).reshape(nL, N)
        h = h.transpose(0, 1, 3, 2).reshape(nL, D, N)
        rGtv = rGtv.transpose(0, 1, 3, 2).reshape(nL, D, N)
        s = self.sum_items
        risk = 0.5 * s.total(r * r) / N
        gv = s.total(r[:, None, :] * h) / N
        gU = s.outer(rGtv, self.zq_items) / N
        return risk, gU, gv


def train_all_arrays(tasks, Ls, *, models=icl.MODELS, lr=0.01, n_steps=2500, ckpt_every=20,
                     U0=None, v0=None, label="", max_abs=1e6, pair_first=None,
                     cache_bytes=1 << 19, x_law=None, checkpoints=None, perturb=None):
    """Fast engine: train every model in ``models`` (``"softmax"``, ``"linear"``,
    ``"linear_inf"``, ``"softmax_inf"``) and, for the finite-L models, every ``L`` in ``Ls``
    (strictly increasing), from the same ``(U0, v0)`` (default Eq. 9) on the same ``tasks``, by
    gradient descent with step ``lr``. ``"softmax_inf"`` needs the tasks' covariate law ``x_law``
    (an :class:`sfxlin.laws.Empirical`): the prefix engine runs it on the whole support, its tokens
    weighted by the atoms' weights (:func:`sfxlin.icl.support_tasks`), exact.

    ``pair_first``: add the gradient contributions of antithetic partners (tasks ``2i``,
    ``2i + 1``) first, and evaluate the softmax of both partners once while ``U[:, d, :d]`` is
    exactly zero (then their logits are bitwise identical): about 1.5x faster, exact. ``None``
    (default): True when the tasks are antithetic pairs sharing covariates, else False.
    Either way the off-block part is computed, never imposed: from a block-structured init on
    antithetic tasks it stays exactly 0 with ``pair_first`` (the partners' contributions are exact
    opposites and cancel; the plain pairwise sums leave ~1e-17 of rounding, which grows where the
    off-block dynamics are unstable), and any off-block perturbation in ``(U0, v0)`` evolves freely.

    ``checkpoints``: the checkpoint steps, strictly increasing from 0 to ``n_steps`` (e.g.
    :func:`log_checkpoint_steps`), instead of every ``ckpt_every`` steps.

    ``perturb``: None (the plain update), or ``perturb(U, v) -> (U, v)``, applied to each model's
    parameters after every update (``U (k, D, D)``, ``v (k, D)``, ``k`` its prompt lengths; the models in
    the order of ``models``): how an amplification run perturbs the floating-point path of the
    trajectory (:mod:`sfxlin.engine.sensitivity`).

    Returns a dict: ``t (n_ckpt,)``, ``L (nL,)``, and per model a dict with ``U``, ``v``,
    ``risk``: shapes ``(nL, n_ckpt, D, D)``, ``(nL, n_ckpt, D)``, ``(nL, n_ckpt)`` for softmax and
    linear, ``(n_ckpt, D, D)``, ``(n_ckpt, D)``, ``(n_ckpt,)`` for linear_inf and softmax_inf; plus
    ``n_exact_shift_steps`` and ``n_shared_steps`` (softmax steps that needed the exact max
    shift, and that evaluated antithetic partners once; softmax(L) only).
    Raises :class:`TrainingDiverged` naming ``label``, the model, ``L`` and the step.
    """
    models = tuple(models)
    for m in models:
        if m not in TRAINED_MODELS:
            raise ValueError(f"unknown model {m!r}; expected one of {TRAINED_MODELS}")
    if "softmax_inf" in models and x_law is None:
        raise ValueError("model 'softmax_inf' needs the covariate law x_law (an sfxlin.laws.Empirical)")
    if len(set(models)) != len(models) or not models:
        raise ValueError(f"models must be a non-empty list without repeats, got {models}")
    has_finite = any(m in FINITE_MODELS for m in models)
    Ls = () if Ls is None else tuple(Ls)
    Ls = validate_Ls(Ls, tasks.L_max) if has_finite or Ls else ()
    lr = _check_lr(lr)
    steps = checkpoint_steps(n_steps, ckpt_every) if checkpoints is None else given_checkpoints(checkpoints, n_steps)
    U0, v0 = _init(tasks, U0, v0)
    group = pair_structure(tasks)
    if pair_first is None:
        pair_first = group == 2
    nL, D, nc = len(Ls), tasks.D, len(steps)
    state, rec, engines = {}, {}, {}
    for m in models:
        k = nL if m in FINITE_MODELS else 1
        state[m] = [np.repeat(U0[None], k, axis=0), np.repeat(v0[None], k, axis=0)]
        rec[m] = dict(U=np.empty((k, nc, D, D)), v=np.empty((k, nc, D)), risk=np.empty((k, nc)))
        if m == "softmax":
            engines[m] = SoftmaxPrefixEngine(tasks, Ls, cache_bytes=cache_bytes, pair_first=pair_first,
                                             _group=group)
        elif m == "linear":
            G = tasks.Ghat(Ls)
            engines[m] = LinearEngine(tasks, G, pair_first=pair_first, _group=group)
        elif m == "softmax_inf":
            support, weights = icl.support_tasks(tasks, x_law)
            engines[m] = SoftmaxPrefixEngine(support, (support.L_max,), cache_bytes=cache_bytes,
                                             pair_first=pair_first, weights=weights, _group=group)
        else:
            engines[m] = LinearEngine(tasks, icl.model_matrix("linear_inf", tasks)[None], pair_first=pair_first,
                                      _group=group)
    j = 0
    with np.errstate(all="ignore"):
        for t in range(n_steps + 1):
            ck = t == steps[j]
            for m in models:
                U, v = state[m]
                risk, gU, gv = engines[m].step(U, v)
                _check_finite(risk, U, v, step=t, max_abs=max_abs, label=label, model=m,
                              Ls=Ls if m in FINITE_MODELS else (None,))
                if ck:
                    r = rec[m]
                    r["U"][:, j], r["v"][:, j], r["risk"][:, j] = U, v, risk
                if t < n_steps:
                    U, v = U - lr * gU, v - lr * gv
                    state[m] = [U, v] if perturb is None else list(perturb(U, v))
            if ck:
                j += 1
    out = {"t": steps, "L": np.array(Ls, dtype=int)}
    for m in models:
        out[m] = {k: (a if m in FINITE_MODELS else a[0]) for k, a in rec[m].items()}
    sm = engines.get("softmax")
    out["n_exact_shift_steps"] = sm.n_exact if sm else 0
    out["n_shared_steps"] = sm.n_shared if sm else 0
    out["pair_first"] = bool(pair_first)
    return out


def train_until(tasks, stop, *, lr=0.01, max_steps=40000, check_every=25, U0=None, v0=None, label="", perturb=None):
    """Train ``linear(inf)`` alone until ``stop(U, v)`` holds at a check (every ``check_every`` steps,
    from ``t = 0``) or ``max_steps`` is reached: the steps a run needs, found without fixing them first.

    The run is :func:`train_all_arrays` with ``models=("linear_inf",)`` in chunks of ``check_every``
    steps, each chunk started from the last one's final parameters: the arithmetic of every step is
    that of one uninterrupted :func:`train_all_arrays` run (same engine, same update), so its
    trajectory equals, bit for bit, the ``linear_inf`` trajectory of a joint run on the same tasks
    (the models of :func:`train_all_arrays` do not interact). ``stop`` takes ``U (D, D)``, ``v (D,)``
    and returns a bool. ``max_steps`` must be a multiple of ``check_every``.

    Returns a dict: ``t (n_check,)`` the checks made (``0, check_every, ..., T``), ``U (n_check, D, D)``,
    ``v (n_check, D)``, ``risk (n_check,)`` (training risk), ``T`` the last check (the first at which
    ``stop`` held, else ``max_steps``) and ``converged`` (whether ``stop`` held at ``T``). ``perturb``: as in
    :func:`train_all_arrays`, applied after every update."""
    steps = checkpoint_steps(max_steps, check_every)
    U, v = _init(tasks, U0, v0)
    rec_U, rec_v, rec_r = [U], [v], []
    done = bool(stop(U, v))
    for _ in steps[1:]:
        if done:
            break
        res = train_all_arrays(tasks, (), models=("linear_inf",), lr=lr, n_steps=check_every,
                               ckpt_every=check_every, U0=U, v0=v, label=label, perturb=perturb)["linear_inf"]
        if not rec_r:
            rec_r.append(res["risk"][0])
        U, v = res["U"][-1], res["v"][-1]
        rec_U.append(U)
        rec_v.append(v)
        rec_r.append(res["risk"][-1])
        done = bool(stop(U, v))
    if not rec_r:   # stopped at t = 0: the risk of the init alone
        rec_r.append(train_all_arrays(tasks, (), models=("linear_inf",), lr=lr, n_steps=0, ckpt_every=1, U0=U,
                                      v0=v, label=label)["linear_inf"]["risk"][0])
    n = len(rec_U)
    return {"t": steps[:n], "U": np.stack(rec_U), "v": np.stack(rec_v), "risk": np.array(rec_r),
            "T": int(steps[n - 1]), "converged": done}


def train_all(tasks, Ls, *, models=icl.MODELS, lr=0.01, n_steps=2500, ckpt_every=20, U0=None,
              v0=None, label="", max_abs=1e6, pair_first=None, cache_bytes=1 << 19, x_law=None):
    """:func:`train_all_arrays` as an ``xr.Dataset``.

    Finite-L models: ``U (model, L, t, row, col)``, ``v (model, L, t, row)``,
    ``risk (model, L, t)`` with ``model`` in (``softmax``, ``linear``) as requested;
    ``linear_inf``: ``U_inf (t, row, col)``, ``v_inf (t, row)``, ``risk_inf (t)``;
    ``softmax_inf``: ``U_softmax_inf``, ``v_softmax_inf``, ``risk_softmax_inf`` likewise.
    """
    res = train_all_arrays(tasks, Ls, models=models, lr=lr, n_steps=n_steps, ckpt_every=ckpt_every,
                           U0=U0, v0=v0, label=label, max_abs=max_abs, pair_first=pair_first,
                           cache_bytes=cache_bytes, x_law=x_law)
    D = tasks.D
    coords = {"t": res["t"], "row": np.arange(D), "col": np.arange(D)}
    data = {}
    finite = [m for m in FINITE_MODELS if m in res]
    if finite:
        coords.update(model=list(finite), L=res["L"])
        data["U"] = (("model", "L", "t", "row", "col"), np.stack([res[m]["U"] for m in finite]))
        data["v"] = (("model", "L", "t", "row"), np.stack([res[m]["v"] for m in finite]))
        data["risk"] = (("model", "L", "t"), np.stack([res[m]["risk"] for m in finite]))
    for m, suffix in (("linear_inf", "inf"), ("softmax_inf", "softmax_inf")):
        if m in res:
            r = res[m]
            data[f"U_{suffix}"] = (("t", "row", "col"), r["U"])
            data[f"v_{suffix}"] = (("t", "row"), r["v"])
            data[f"risk_{suffix}"] = ("t", r["risk"])
    import xarray as xr

    ds = xr.Dataset(data, coords=coords,
                    attrs={"lr": float(lr), "label": label, "pair_first": int(res["pair_first"]),
                           "n_exact_shift_steps": int(res["n_exact_shift_steps"]),
                           "n_shared_steps": int(res["n_shared_steps"]),
                           "sfxlin_version": __version__})
    return _annotate(ds)


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

    ``U[m] (nL, k, D, D)``, ``v[m] (nL, k, D)`` for ``m`` in ``("softmax", "linear")`` (``k``
    checkpoints, held-out tasks ``held`` with prompts of at least ``max(max(Ls), L_eval)`` tokens),
    ``U_inf (k, D, D)``, ``v_inf (k, D)``. Returns ``at_L (2, nL, k)`` (each model at its training
    ``L``), ``at_eval (2, nL, k)`` (at ``L_eval``), ``inf (k,)`` (theta_inf under linear(inf)) and
    ``inf_eval (k,)`` (theta_inf under softmax(L_eval)). Exact: the softmax risks use the prefix
    engine (its ``step`` evaluates parameter ``i`` at ``Ls[i]``); each softmax model is evaluated at
    ``L_eval`` once per distinct parameter (the shared init at ``t = 0`` once), antithetic partners
    of block-structured parameters in one pass (``SoftmaxPrefixEngine.share_pairs``).

    The calls are not merged into fewer, larger ones: each engine carries its softmax shift from
    one call to the next (the previous parameter's log-sum-exp), and the shift is part of the
    arithmetic (``exp(logit - shift)`` rounds differently for another shift), so evaluating the
    models at ``L_eval`` in one batch would change the last bits of every risk."""
    nL, k = U["softmax"].shape[:2]
    at_L = np.empty((2, nL, k))
    at_eval = np.empty((2, nL, k))
    inf_eval = np.empty(k)
    eng = SoftmaxPrefixEngine(held, Ls)
    eng_eval = SoftmaxPrefixEngine(held, (L_eval,))
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
    *Gs, G_eval = held.Ghat(tuple(int(L) for L in Ls) + (int(L_eval),))
    for i, L in enumerate(Ls):
        G = Gs[i]
        at_L[1, i] = 0.5 * np.mean((icl.linear_predict(U["linear"][i], v["linear"][i], G, z_q) - y_q) ** 2, axis=(-2, -1))
        at_eval[1, i] = 0.5 * np.mean((icl.linear_predict(U["linear"][i], v["linear"][i], G_eval, z_q) - y_q) ** 2,
                                      axis=(-2, -1))
    inf = icl.risk("linear_inf", U_inf, v_inf, held)
    return at_L, at_eval, inf, inf_eval
