"""Deep multi-head attention models in JAX (docs/deep.md): ``H`` heads, ``K`` layers, a residual
stream, merged ``U`` or separate key/query matrices, value matrices, any attention kernel, and
their exact deep linear limit on centred Gaussian tokens.

Notation (docs/models.md): tokens ``z_k`` in ``R^D`` (``k < L``, the prompt), queries ``z_q``. A
head with matrix ``U`` (``D x D``; with separate keys and queries ``U = W_K^T W_Q``) lets a token or
query ``z`` attend to the prompt with ``a = U z`` and logits ``s_k = z_k . a``:

* ``softmax``: ``sum_k softmax_k(s) z_k``;
* ``linear``: ``(1/L) sum_k s_k z_k = Ghat_L a`` (computed so, ``O(L D^2)``);
* any other kernel of :mod:`sfxlin.kernels` (a :class:`sfxlin.kernels.Kernel`, or its name in
  :data:`sfxlin.kernels.KERNELS`), through its JAX weight ``kappa``: ``(1/L) sum_k kappa(s_k) z_k``,
  or, normalised, ``sum_k kappa(s_k) z_k / sum_k kappa(s_k)`` (:meth:`~sfxlin.kernels.Kernel.jax_attention`;
  softmax at a temperature ``T`` is the softmax of ``s / T``).

Layer ``l`` (heads ``h``): ``z <- z + sum_h V_{l,h} attn_{l,h}(z)`` (``residual=True``) or
``z <- sum_h V_{l,h} attn_{l,h}(z)``; without value matrices (``values=False``) ``V = I``. The
query attends to the prompt tokens, the prompt tokens attend to each other (themselves included),
all with the layer's input tokens. The read-out is ``pred = v . z_q^{(K)}``. The paper's single
head is ``K = H = 1``, ``residual=False``, ``values=False`` (:meth:`Transformer.single_head`).

Deep limit (:func:`limit_layers`): for centred Gaussian tokens ``N(0, Sigma_1)``, as ``L -> inf``
softmax and linear attention of ``z`` both tend to ``Sigma_l U z``, so layer ``l`` maps every
token and the query by ``A_l = I + sum_h V_{l,h} Sigma_l U_{l,h}`` (no ``I`` without residual); the
tokens stay centred Gaussian with ``Sigma_{l+1} = A_l Sigma_l A_l^T`` and the output is
``v . A_K ... A_1 z_q``. For a pointwise kernel the limit is not linear (its gain depends on
``a^T Sigma a``) and the tokens leave the Gaussian family after one layer: no closed form here.

Rate condition (:func:`head_lambdas`): softmax's squared error to the limit falls like ``1/L``
only while every head has ``lambda = ||Sigma_l^{1/2} U_{l,h} Sigma_l^{1/2}||_op^2 < 1/2``: its
constant ``exp(z^T U^T Sigma_l U z)`` has a finite mean over ``z ~ N(0, Sigma_l)`` only then (a
finite variance needs ``lambda < 1/4``). The finite-``L`` functions warn
(:class:`RateConditionWarning`) when a softmax model breaks it on the prompt they are given.

Cost per task, layer and head: ``O(L^2 D)`` time for the softmax and the pointwise kernels
(tokens attend to tokens; the last layer updates the query only, ``O(L D)``), ``O(L D^2)`` for
linear attention. Memory: blocked attention (:func:`_attend_blocked`, ``Transformer.block = b``
tokens, default :data:`BLOCK`) never forms the ``L x L`` logits when ``L > b``: the rows attend in
query blocks of ``b`` (each rematerialised in the backward pass), each over key blocks of ``b``
with the online softmax (running max ``m``, sum of weights ``l``, weighted sum of tokens ``o``;
a new block merges by rescaling with ``exp(m_old - m_new)``), so the logits live ``b x b`` at a
time. It is the same sums in another order (rounding ~1e-15 relative). Kernels with the
generic :meth:`~sfxlin.kernels.Kernel.jax_attention` (a pointwise weight divided by its sum or
by ``L``) are blocked the same way without the max; the others (linear: ``O(L D^2)`` already;
``sigmoid_logL``) keep their own path. ``block=None``: the full ``L x L`` computation. Tasks are
mapped in batches that keep the live logits (``L x L`` or ``b x b`` per head) under 64 MB.

Parameters are a dict of arrays: ``U (K, H, D, D)`` (or ``W_K``, ``W_Q (K, H, d_k, D)``),
``V (K, H, D, D)`` (with ``values``), ``v (D,)``. Everything is float64 (JAX's x64 mode, switched
on by :mod:`sfxlin.models`).
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np

from ..kernels import Kernel, as_kernel
from ._jax import jax, jnp

__all__ = ["LINEAR_LIMIT", "Transformer", "predict", "predict_layers", "limit_layers",
           "head_lambdas", "cap_lambdas", "RateConditionWarning", "LAMBDA_BOUND", "risk", "risk_and_grad", "flatten",
           "model_data", "loss_and_grad", "BLOCK"]

_LOGIT_BYTES = 1 << 26

#: default query and key block of the blocked attention (``Transformer.block``, tokens), from a
#: measurement at L = 4096 (benchmarks/deep_memory.py, docs/deep.md)
BLOCK = 512

#: the bound on every head's lambda (head_lambdas) below which softmax's error to the deep limit falls like 1/L
LAMBDA_BOUND = 0.5


class RateConditionWarning(UserWarning):
    """A softmax head has ``lambda >= 1/2`` (:func:`head_lambdas`) on the prompt it is evaluated on:
    its error constant has an infinite mean over Gaussian queries, and the squared error to the
    deep limit need not fall like ``1/L``."""


#: kernels whose large-prompt limit on centred Gaussian tokens is ``Sigma U z`` (the deep limit;
#: softmax at temperature 1)
LINEAR_LIMIT = ("softmax", "linear")


def _positive(value, name):
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


@dataclass(frozen=True)
class Transformer:
    """Shape of a model (hashable: the compiled functions are keyed by it).

    ``D`` token dimension, ``n_layers`` (``K``), ``n_heads`` (``H``), ``residual``, ``values``
    (value matrices ``V``; ``False``: ``V = I``), ``d_k`` (``None``: merged ``U``; an integer:
    separate ``W_K``, ``W_Q`` of shape ``(d_k, D)`` per head, ``U = W_K^T W_Q``), ``block`` (how
    the attention is computed, not what: query and key blocks of ``block`` tokens, so memory
    ``O(block^2)`` per head instead of ``O(L^2)``; ``None``: the full ``L x L`` logits; module doc).
    """

    D: int
    n_layers: int = 1
    n_heads: int = 1
    residual: bool = True
    values: bool = True
    d_k: int | None = None
    block: int | None = BLOCK

    def __post_init__(self):
        _positive(self.D, "D")
        _positive(self.n_layers, "n_layers")
        _positive(self.n_heads, "n_heads")
        if self.d_k is not None:
            _positive(self.d_k, "d_k")
        if self.block is not None:
            object.__setattr__(self, "block", _positive(self.block, "block"))

    @classmethod
    def single_head(cls, D):
        """The paper's model: one head, one layer, no residual, no value matrix."""
        return cls(D, 1, 1, residual=False, values=False)

    def shapes(self) -> dict:
        """Parameter name -> shape."""
        K, H, D = self.n_layers, self.n_heads, self.D
        out = {"U": (K, H, D, D)} if self.d_k is None else {"W_K": (K, H, self.d_k, D), "W_Q": (K, H, self.d_k, D)}
        if self.values:
            out["V"] = (K, H, D, D)
        out["v"] = (D,)
        return out

    def init(self, rng, U_scale=0.5, V_scale=0.5, v_scale=1.0) -> dict:
        """Random parameters (numpy float64, drawn from ``rng`` in the order of :meth:`shapes`):
        entries of ``U`` (or of ``W_K``, ``W_Q``), ``V``, ``v`` are ``N(0, scale^2 / D)`` (``U``:
        ``||U z|| ~ U_scale ||z||``; ``W_K``, ``W_Q``: scale ``sqrt(U_scale)``)."""
        if not isinstance(rng, np.random.Generator):
            raise TypeError(f"rng must be a numpy Generator, got {type(rng).__name__}")
        scale = {"U": U_scale, "W_K": np.sqrt(U_scale), "W_Q": np.sqrt(U_scale), "V": V_scale, "v": v_scale}
        return {k: scale[k] / np.sqrt(self.D) * rng.standard_normal(s) for k, s in self.shapes().items()}

    def params(self, **arrays) -> dict:
        """Check and convert a parameter dict (every name of :meth:`shapes`, right shapes, finite)."""
        want = self.shapes()
        if set(arrays) != set(want):
            raise ValueError(f"params must have exactly the arrays {sorted(want)}, got {sorted(arrays)}")
        out = {}
        for k, s in want.items():
            a = np.asarray(arrays[k], dtype=float)
            if a.shape != s:
                raise ValueError(f"params[{k!r}] must have shape {s}, got {a.shape}")
            if not np.all(np.isfinite(a)):
                raise ValueError(f"params[{k!r}] must be finite")
            out[k] = a
        return out


def _U(model, params, xp=jnp):
    """``(K, H, D, D)`` attention matrices (``W_K^T W_Q`` when factored); ``xp``: ``jax.numpy`` or ``numpy``."""
    if model.d_k is None:
        return params["U"]
    return xp.einsum("khai,khaj->khij", params["W_K"], params["W_Q"])


def _attend(kern, U, X, Z, G, block=None):
    """Heads' attention of the rows of ``X (m, D)`` over the tokens ``Z (L, D)``: ``(H, m, D)``, by
    the kernel's :meth:`~sfxlin.kernels.Kernel.jax_attention`, or blocked (:func:`_attend_blocked`)
    when ``block`` is an integer below ``L`` and the kernel is blockable. ``G = Z^T Z / L`` (used
    by linear attention)."""
    if block is not None and Z.shape[0] > block and _blockable(kern):
        return _attend_blocked(kern, U, X, Z, block)
    A = jnp.einsum("hij,mj->hmi", U, X)                     # a = U x
    return kern.jax_attention(A, Z, G)


def _blockable(kern):
    """Softmax (online, with the running max) and the kernels with the generic pointwise
    :meth:`~sfxlin.kernels.Kernel.jax_attention` (sums of weights and of weighted tokens)."""
    return kern.name == "softmax" or type(kern).jax_attention is Kernel.jax_attention


def _split(X, b):
    """Rows of ``X (m, D)`` as ``(m // b, b, D)`` full blocks and the tail ``(m % b, D)``."""
    n = X.shape[0] // b
    return X[:n * b].reshape(n, b, X.shape[1]), X[n * b:]


def _key_scan(kern, A, Z, b):
    """Attention of the rows ``a`` of ``A (H, m, D)`` over ``Z (L, D)``, key block by key block
    (``b`` tokens; the tail block of ``L % b`` first): ``(H, m, D)``. Softmax: the online softmax
    of ``s / T``, carry ``(m, l, o)`` = running max (no gradient: the result does not depend on
    it), ``sum exp(s - m)``, ``sum exp(s - m) z``; a block merges with ``exp(m_old - m_new)``.
    Other kernels: carry ``(sum kappa(s), sum kappa(s) z)``, divided at the end by the first
    (normalised) or by ``L``."""
    L = Z.shape[0]
    blocks, tail = _split(Z, b)
    if tail.shape[0] == 0:
        first, blocks = blocks[0], blocks[1:]
    else:
        first = tail
    logits = lambda Zb: jnp.einsum("hmi,li->hml", A, Zb)  # noqa: E731
    if kern.name == "softmax":
        T = kern.temperature

        def start(Zb):
            S = logits(Zb) / T
            m = jax.lax.stop_gradient(S.max(axis=-1))
            W = jnp.exp(S - m[..., None])
            return m, W.sum(axis=-1), W @ Zb

        def step(carry, Zb):
            m, l, o = carry
            S = logits(Zb) / T
            m_new = jnp.maximum(m, jax.lax.stop_gradient(S.max(axis=-1)))
            W, c = jnp.exp(S - m_new[..., None]), jnp.exp(m - m_new)
            return (m_new, l * c + W.sum(axis=-1), o * c[..., None] + W @ Zb), None

        (_, l, o), _ = jax.lax.scan(step, start(first), blocks)
        return o / l[..., None]

    def sums(Zb):
        W = kern.jax_weight(logits(Zb), L)
        return W.sum(axis=-1), W @ Zb

    def add(carry, Zb):
        return jax.tree_util.tree_map(jnp.add, carry, sums(Zb)), None

    (l, o), _ = jax.lax.scan(add, sums(first), blocks)
    return o / (l[..., None] if kern.normalised else L)


def _attend_blocked(kern, U, X, Z, b):
    """:func:`_attend` without the ``L x m`` logits: the rows of ``X`` in query blocks of ``b``
    (full blocks mapped, each rematerialised in the backward pass, then the tail), each over
    the key blocks of :func:`_key_scan`. ``(H, m, D)``."""
    one = jax.checkpoint(lambda Xb: _key_scan(kern, jnp.einsum("hij,mj->hmi", U, Xb), Z, b))
    if X.shape[0] <= b:
        return one(X)
    blocks, tail = _split(X, b)
    out = jax.lax.map(one, blocks)                           # (n, H, b, D)
    out = jnp.moveaxis(out, 0, 1).reshape(out.shape[1], -1, out.shape[-1])
    return jnp.concatenate([out, one(tail)], axis=1) if tail.shape[0] else out


def _mix(model, V, O, X):
    """``X + sum_h V_h O_h`` (residual) or ``sum_h V_h O_h``; ``V = I`` without values."""
    delta = jnp.einsum("hij,hmj->mi", V, O) if model.values else O.sum(axis=0)
    return X + delta if model.residual else delta


def _task_layers(model, kern, params, Z, Q, tokens):
    """One task: read-outs after every layer ``(K, q)`` and, with ``tokens``, the token second
    moments ``Z_l^T Z_l / L`` entering every layer ``(K, D, D)``."""
    U = _U(model, params)
    preds, moments = [], []
    for l in range(model.n_layers):
        G = Z.T @ Z / Z.shape[0]
        moments.append(G)
        V = params["V"][l] if model.values else None
        Q_new = _mix(model, V, _attend(kern, U[l], Q, Z, G, model.block), Q)
        if l + 1 < model.n_layers:
            Z = _mix(model, V, _attend(kern, U[l], Z, Z, G, model.block), Z)
        Q = Q_new
        preds.append(Q @ params["v"])
    out = jnp.stack(preds)
    return (out, jnp.stack(moments)) if tokens else out


def _batch(model, L, n):
    """Tasks per batch: the live logits of one task are ``H L^2`` (``H block^2`` when blocked)."""
    e = L if model.block is None else min(L, model.block)
    return int(max(1, min(n, _LOGIT_BYTES // (8 * model.n_heads * e * e))))


def _layers(model, kern, params, Z, z_q, tokens=False):
    f = lambda zz: _task_layers(model, kern, params, zz[0], zz[1], tokens)  # noqa: E731
    out = jax.lax.map(f, (Z, z_q), batch_size=_batch(model, Z.shape[1], Z.shape[0]))
    if tokens:
        return jnp.moveaxis(out[0], 0, 1), jnp.moveaxis(out[1], 0, 1)
    return jnp.moveaxis(out, 0, 1)


def _layer_maps(model, params, Sigma, xp=jnp):
    """The deep limit layer by layer: yields ``(A_l, Sigma_l)``, the map ``A_l = I + sum_h V_{l,h}
    Sigma_l U_{l,h}`` and the token covariance entering layer ``l`` (``Sigma_1 = Sigma``,
    ``Sigma_{l+1} = A_l Sigma_l A_l^T``), arrays ``(n, D, D)``; ``xp``: ``jax.numpy`` (traced) or
    ``numpy``."""
    U = _U(model, params, xp)
    eye = xp.eye(model.D)
    for l in range(model.n_layers):
        M = xp.einsum("hij,njk,hkl->nil", params["V"][l], Sigma, U[l]) if model.values else \
            xp.einsum("njk,hkl->njl", Sigma, U[l])
        A = eye + M if model.residual else M                 # (n, D, D)
        yield A, Sigma
        Sigma = A @ Sigma @ xp.swapaxes(A, -1, -2)


def _limit(model, params, Sigma, z_q):
    preds, moments = [], []
    for A, S in _layer_maps(model, params, Sigma):
        moments.append(S)
        z_q = jnp.einsum("nij,nqj->nqi", A, z_q)
        preds.append(z_q @ params["v"])
    return jnp.stack(preds), jnp.stack(moments)


_layers_jit = jax.jit(_layers, static_argnums=(0, 1, 5))
_limit_jit = jax.jit(_limit, static_argnums=(0,))


def _loss(params, model, kern, data, z_q, y_q):
    if kern == "limit":
        pred = _limit(model, params, data, z_q)[0][-1]
    else:
        pred = _layers(model, as_kernel(kern), params, data, z_q)[-1]
    return 0.5 * jnp.mean((pred - y_q) ** 2)


_loss_jit = jax.jit(_loss, static_argnums=(1, 2))
#: ``(loss, grads)`` of ``model`` with kernel ``kern`` on ``data`` (:func:`model_data`), jitted:
#: the one gradient every optimiser of :mod:`sfxlin.models.optimise` steps with
loss_and_grad = jax.jit(jax.value_and_grad(_loss), static_argnums=(1, 2))


def _arrays(Z, z_q, D, Zname="Z"):
    Z = np.asarray(Z, dtype=float)
    z_q = np.asarray(z_q, dtype=float)
    if Z.ndim != 3 or Z.shape[-1] != D:
        raise ValueError(f"{Zname} must have shape (n, L, {D}), got {Z.shape}")
    if z_q.ndim != 3 or z_q.shape[0] != Z.shape[0] or z_q.shape[-1] != D:
        raise ValueError(f"z_q must have shape ({Z.shape[0]}, q, {D}), got {z_q.shape}")
    for name, a in ((Zname, Z), ("z_q", z_q)):
        if not np.all(np.isfinite(a)):
            raise ValueError(f"{name} must be finite (no NaN or inf entries)")
    return Z, z_q


def _square_root(Sigma):
    """The PSD square roots of ``Sigma (..., D, D)`` (symmetric PSD, possibly singular)."""
    lam, Q = np.linalg.eigh(Sigma)
    return (Q * np.sqrt(np.clip(lam, 0.0, None))[..., None, :]) @ np.swapaxes(Q, -1, -2)


def head_lambdas(model, params, Sigma):
    """``lambda_{l,h} = ||Sigma_l^{1/2} U_{l,h} Sigma_l^{1/2}||_op^2`` for every layer ``l``, head ``h``
    and task, along the deep limit's token covariances ``Sigma_l`` (``Sigma_1 = Sigma (n, D, D)``,
    ``Sigma_{l+1} = A_l Sigma_l A_l^T``, :func:`limit_layers`): ``(K, H, n)`` numpy.

    Softmax's squared error to the limit falls like ``1/L`` only while every ``lambda < 1/2``
    (:data:`LAMBDA_BOUND`): for ``z ~ N(0, Sigma_l)``, ``z^T U^T Sigma_l U z = |B g|^2`` with
    ``B = Sigma_l^{1/2} U Sigma_l^{1/2}`` and ``g ~ N(0, I)``, so the error constant
    ``exp(z^T U^T Sigma_l U z)`` has a finite mean iff ``||B||_op^2 < 1/2`` (finite variance iff
    ``< 1/4``)."""
    p = model.params(**params)
    Sigma = np.asarray(Sigma, dtype=float)
    if Sigma.ndim != 3 or Sigma.shape[1:] != (model.D, model.D) or not np.all(np.isfinite(Sigma)):
        raise ValueError(f"Sigma must be finite with shape (n, {model.D}, {model.D}), got {Sigma.shape}")
    covariances = np.stack([S for _, S in _layer_maps(model, p, Sigma, np)])   # (K, n, D, D)
    R = _square_root(covariances)[:, None]                           # (K, 1, n, D, D)
    B = R @ _U(model, p, np)[:, :, None] @ R                          # (K, H, n, D, D)
    return np.linalg.norm(B, ord=2, axis=(-2, -1)) ** 2


def cap_lambdas(model, params, Sigma, cap):
    """``params`` with every head's ``U_{l,h}`` scaled down (by ``c <= 1``; ``W_K`` and ``W_Q`` each
    by ``sqrt(c)``) so that ``max over tasks of lambda_{l,h} <= cap`` (:func:`head_lambdas` along
    ``Sigma (n, D, D)``); heads already within the cap are unchanged. Layer by layer: scaling
    layer ``l`` changes the covariances of the layers after it, so each layer is capped along the
    covariances its capped predecessors give. Returns ``(params, scale (K, H))``, new arrays.

    ``cap < 1/2`` (:data:`LAMBDA_BOUND`) makes softmax's error constant to the deep limit finite
    in mean over Gaussian queries, ``cap < 1/4`` in variance too."""
    if not np.isfinite(cap) or cap <= 0:
        raise ValueError(f"cap must be a positive number, got {cap!r}")
    p = {k: np.array(v, dtype=float) for k, v in model.params(**params).items()}
    scale = np.ones((model.n_layers, model.n_heads))
    for l in range(model.n_layers):
        lam = head_lambdas(model, p, Sigma)[l].max(axis=-1)                # (H,)
        c = np.sqrt(np.where(lam > cap, cap / np.where(lam > 0, lam, 1.0), 1.0))   # lambda is quadratic in U
        scale[l] = c
        if "U" in p:
            p["U"][l] *= c[:, None, None]
        else:
            p["W_K"][l] *= np.sqrt(c)[:, None, None]
            p["W_Q"][l] *= np.sqrt(c)[:, None, None]
    return p, scale


def _warn_rate_condition(model, kern, params, Z, stacklevel):
    """Warn (:class:`RateConditionWarning`, attributed ``stacklevel`` frames up) when a softmax model
    has a head with ``lambda >= 1/2`` on the prompts ``Z (n, L, D)`` (``Sigma_1`` their second
    moments ``Z^T Z / L``, max over tasks); at the temperature ``T`` the logits are those of
    ``U / T``, so ``lambda`` is :func:`head_lambdas` ``/ T^2``."""
    kern = as_kernel(kern)
    if kern.name != "softmax":
        return
    T = kern.temperature
    lam = head_lambdas(model, params, np.einsum("nli,nlj->nij", Z, Z) / Z.shape[1]).max(axis=-1) / T**2   # (K, H)
    broken = sorted(zip(*np.nonzero(lam >= LAMBDA_BOUND)), key=lambda lh: -lam[lh])
    if broken:
        heads = ", ".join(f"layer {l + 1} head {h + 1}: lambda = {lam[l, h]:.3g}" for l, h in broken)
        warnings.warn(f"softmax: {heads} (lambda = ||Sigma_l^(1/2) U Sigma_l^(1/2)||_op^2 / T^2 at the temperature "
                      f"T = {T:g}, max over the tasks, Sigma_1 the prompts' second moment) is not below the bound "
                      "1/2: the error constant "
                      "exp(z^T U^T Sigma_l U z) has an infinite mean over Gaussian queries, and the error to the "
                      "deep limit need not fall like 1/L", RateConditionWarning, stacklevel=stacklevel)


def predict_layers(model, kern, params, Z, z_q, moments=False, check_rate=True):
    """Read-outs ``v . z_q^{(l)}`` after every layer ``l = 1..K``: ``(K, n, q)`` numpy.
    ``Z (n, L, D)`` prompts, ``z_q (n, q, D)`` queries; ``kern`` a :class:`sfxlin.kernels.Kernel`
    or its name.
    ``moments=True``: also the second moments ``Z_l^T Z_l / L`` of the prompt tokens entering
    every layer, ``(K, n, D, D)`` (layer 1: the prompt's ``Ghat_L``). Softmax: a
    :class:`RateConditionWarning` when a head has ``lambda >= 1/2`` on these prompts
    (:func:`head_lambdas` with ``Sigma_1 = Z^T Z / L``), unless ``check_rate`` is False: for a
    caller whose own check is on the population covariances, since the prompts' empirical moment
    overstates ``lambda`` at small ``L``. (Not ``warnings.catch_warnings`` around the call: it
    changes the process-wide filters, and silences the warnings of every other thread meanwhile.)"""
    return _predict_layers(model, kern, params, Z, z_q, moments, check_rate)


def _predict_layers(model, kern, params, Z, z_q, moments, check_rate=True):
    """:func:`predict_layers`, called by the public functions (the warning names their caller)."""
    Z, z_q = _arrays(Z, z_q, model.D)
    kern, params = as_kernel(kern), model.params(**params)
    if check_rate:
        _warn_rate_condition(model, kern, params, Z, stacklevel=4)
    out = _layers_jit(model, kern, params, Z, z_q, bool(moments))
    return tuple(np.asarray(a) for a in out) if moments else np.asarray(out)


def predict(model, kern, params, Z, z_q):
    """Read-out of the last layer, ``(n, q)`` (:func:`predict_layers`)."""
    return _predict_layers(model, kern, params, Z, z_q, False)[-1]


def limit_layers(model, params, Sigma, z_q, moments=False):
    """Exact ``L -> inf`` limit of the softmax and linear models on centred Gaussian tokens of
    covariance ``Sigma (n, D, D)`` (per task; ``Gamma_w`` for in-context regression): the
    read-outs ``v . A_l ... A_1 z_q`` after every layer, ``(K, n, q)`` (module doc).
    ``moments=True``: also the token covariances ``Sigma_l`` entering every layer, ``(K, n, D, D)``."""
    Sigma, z_q = _arrays(Sigma, z_q, model.D, "Sigma")
    if Sigma.shape[1] != model.D:
        raise ValueError(f"Sigma must have shape (n, {model.D}, {model.D}), got {Sigma.shape}")
    preds, Sig = _limit_jit(model, model.params(**params), Sigma, z_q)
    return (np.asarray(preds), np.asarray(Sig)) if moments else np.asarray(preds)


def model_data(kern, tasks, L):
    """What ``kern`` attends over for ``tasks``: the first ``L`` prompt tokens, or the tasks'
    second moments ``Gamma_w`` for the infinite-prompt ``"limit"``."""
    from sfxlin import icl

    if kern == "limit":
        if np.any(tasks.mean):
            raise ValueError("the deep limit needs centred covariates (Tasks.mean = 0)")
        return icl.Gamma_w(tasks.Sigma, tasks.w)
    as_kernel(kern)
    return tasks.prompt(L)


def risk(model, kern, params, tasks, L=None):
    """Risk ``mean 1/2 (pred - y_q)^2`` over the tasks and queries of ``tasks``
    (:class:`sfxlin.icl.Tasks`) at prompt length ``L``; ``kern="limit"``: the deep limit with
    ``Sigma = Gamma_w`` (``L`` ignored). Softmax: the :class:`RateConditionWarning` of
    :func:`predict_layers`."""
    data, params = model_data(kern, tasks, L), model.params(**params)
    if kern != "limit":
        _warn_rate_condition(model, kern, params, data, stacklevel=3)
    return float(_loss_jit(params, model, kern, data, tasks.z_q, tasks.y_q))


def risk_and_grad(model, kern, params, tasks, L=None):
    """``(risk, grad)`` of :func:`risk`, the gradient a dict like ``params`` (numpy), by
    reverse-mode autodiff. The compiled function is the one training uses (:func:`train`), so
    evaluating tasks shaped like the training tasks compiles nothing new. Softmax: the
    :class:`RateConditionWarning` of :func:`predict_layers`."""
    data, params = model_data(kern, tasks, L), model.params(**params)
    if kern != "limit":
        _warn_rate_condition(model, kern, params, data, stacklevel=3)
    params = {k: jnp.asarray(a) for k, a in params.items()}
    r, g = loss_and_grad(params, model, kern, data, tasks.z_q, tasks.y_q)
    return float(r), {k: np.asarray(a) for k, a in g.items()}


def flatten(params, lead=0) -> np.ndarray:
    """All parameters in one vector (names sorted), for distances between parameter sets; the
    first ``lead`` axes (e.g. the checkpoints of a trajectory) are kept."""
    return np.concatenate([np.asarray(params[k]).reshape(np.shape(params[k])[:lead] + (-1,))
                           for k in sorted(params)], axis=-1)
