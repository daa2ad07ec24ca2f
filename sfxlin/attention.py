"""Attention operators at finite prompt length and their exact infinite-prompt limits.

Notation (docs/models.md, section 1): tokens ``Z`` of shape ``(..., L, D)``, query ``q`` of shape
``(..., D)``, ``U`` (D x D), read-out ``V`` (D_out x D). Logits are raw: ``s_k = z_k^T U q``.
All functions broadcast over leading axes and are pure numpy.

Inputs are validated: ``TypeError`` naming the argument for non-numeric input, ``ValueError``
naming it for a bad shape or a non-finite entry, and
:class:`~sfxlin.laws.FloatOverflowError` (a ``ValueError``) when finite inputs are so large that
the logits or the result leave the float64 range: never a silent inf or NaN.
"""
from __future__ import annotations

import math

import numpy as np

from .softmax_core import normalised, prefix_moments
from .validation import finite_array, numeric_array

from .laws import FloatOverflowError

__all__ = [
    "check_operands",
    "check_UVq",
    "read_out",
    "weighted_sum",
    "softmax_attention",
    "softmax_attention_prefix",
    "online_softmax_prefix",
    "linear_attention",
    "limit_attention",
    "asymptotic_mse",
    "check_prompt_lengths",
    "weight_ratio",
]


def _check_logits(s, func):
    """Finite inputs can still give logits beyond float64 (then ``s - max`` is ``inf - inf``)."""
    with np.errstate(invalid="ignore"):
        top = s.max(axis=-1)
    if not np.all(np.isfinite(top)):
        raise FloatOverflowError(f"{func}: the logits z_k^T U q overflow float64; Z, U and q are too large together")
    return top


def read_out(mean, V, func):
    """``mean @ V.T``; a convex combination of tokens is finite, but a huge ``V`` can overflow it."""
    with np.errstate(over="ignore", invalid="ignore"):
        out = mean @ V.T
    if not np.all(np.isfinite(out)):
        raise FloatOverflowError(f"{func}: the read-out V f overflows float64; V and Z are too large together")
    return out


def check_UVq(D, U, V, q, against):
    """Validate the attention operands ``U (D, D)``, ``V (D_out, D)``, ``q (..., D)`` (finite
    arrays); ``against`` names what fixes ``D`` in the error message."""
    U = finite_array(U, "U")
    V = finite_array(V, "V")
    q = finite_array(q, "q")
    if U.shape != (D, D):
        raise ValueError(f"U must be {D}x{D} to match {against}, got {U.shape}")
    if V.ndim != 2 or V.shape[1] != D:
        raise ValueError(f"V must be (D_out, {D}), got {V.shape}")
    if q.shape[-1:] != (D,):
        raise ValueError(f"q must have trailing dimension D = {D}, got {q.shape}")
    return U, V, q


def check_operands(Z, U, V, q, check_Z=True):
    Z = (finite_array(Z, "Z") if check_Z else numeric_array(Z, "Z"))
    if Z.ndim < 2:
        raise ValueError(f"Z must have shape (..., L, D), got {Z.shape}")
    D = Z.shape[-1]
    U, V, q = check_UVq(D, U, V, q, f"the token dimension D = {D}")
    if Z.shape[-2] < 1:
        raise ValueError("Z holds no tokens (L = 0)")
    return Z, U, V, q


def _logits(Z, U, q):
    """``s[..., k] = z_k^T U q``, shape ``(..., L)`` (a batched matrix-vector product)."""
    with np.errstate(over="ignore", invalid="ignore"):  # overflow is reported by _check_logits
        a = q @ U.T  # (..., D)
        return (Z @ a[..., None])[..., 0]


def weighted_sum(e, Z):
    """``sum_k e_k z_k`` as a batched matmul, shape ``(..., D)``."""
    return (e[..., None, :] @ Z)[..., 0, :]


def softmax_attention(Z, U, V, q):
    """``V sum_k softmax(s)_k z_k`` with raw logits ``s_k = z_k^T U q``.

    Stable for logits thousands apart: the maximum is subtracted before exponentiating (the
    softmax core, :func:`online_softmax_prefix` at the one length ``L``), so the largest weight
    is exactly 1 and the normaliser lies in ``[1, L]``. Returns shape ``(..., D_out)``.
    """
    Z, U, V, q = check_operands(Z, U, V, q)
    s = _logits(Z, U, q)
    _check_logits(s, "softmax_attention")
    mean = online_softmax_prefix(s, Z, np.array([Z.shape[-2]]))[..., 0, :]
    return read_out(mean, V, "softmax_attention")


def check_prompt_lengths(Ls, L_max=None):
    """Validate a list of prompt lengths: integers >= 1, strictly increasing, <= L_max."""
    Ls = np.asarray(Ls)
    if Ls.ndim != 1 or Ls.size == 0:
        raise ValueError(f"Ls must be a non-empty 1-D list of prompt lengths, got {Ls!r}")
    if not np.issubdtype(Ls.dtype, np.integer):
        as_float = finite_array(Ls, "Ls (prompt lengths)")
        if not np.all(as_float == np.round(as_float)) or np.abs(as_float).max() > 2.0**62:
            raise ValueError(f"prompt lengths Ls must be integers (below 2**62), got {Ls.tolist()}")
        Ls = Ls.astype(np.int64)
    if Ls.min() < 1:
        raise ValueError(f"prompt lengths must be >= 1, got {Ls.tolist()}")
    if np.any(np.diff(Ls) <= 0):
        raise ValueError(f"prompt lengths must be strictly increasing, got {Ls.tolist()}")
    if L_max is not None and Ls[-1] > L_max:
        raise ValueError(f"largest prompt length {Ls[-1]} exceeds the {L_max} tokens available")
    return Ls.astype(np.int64)


def softmax_attention_prefix(Z, U, V, q, Ls):
    """Softmax attention at every nested prompt length ``L in Ls`` in one pass over the tokens.

    The length-L prompt is ``Z[..., :L, :]``. The logits are computed once; tokens are split
    into the blocks ``[0, L_1), [L_1, L_2), ...``; each block contributes its own maximum
    ``m_b`` and its sums ``sum e^{s-m_b}``, ``sum e^{s-m_b} z``, merged into running sums with
    a running maximum (online softmax). Cost O(L_max), not O(sum L), and exactly as stable as
    :func:`softmax_attention` (every exponent is <= 0).

    ``Z (..., L_max, D)``, ``q (..., D)`` -> ``(..., len(Ls), D_out)``.
    """
    Z, U, V, q = check_operands(Z, U, V, q, check_Z=False)
    Ls = check_prompt_lengths(Ls, Z.shape[-2])
    finite_array(Z[..., : Ls[-1], :], "Z")  # tokens beyond the largest L are never read
    s = _logits(Z[..., : Ls[-1], :], U, q)  # (..., L_max): logits once for every L
    _check_logits(s, "softmax_attention_prefix")
    return read_out(online_softmax_prefix(s, Z, Ls), V, "softmax_attention_prefix")


def online_softmax_prefix(s, Z, Ls):
    """``sum_k softmax(s[:L])_k z_k`` at every ``L in Ls`` from logits ``s (..., >= L_max)``.

    Computed by :func:`sfxlin.softmax_core.prefix_moments` (online softmax over the blocks
    ``[0, L_1), [L_1, L_2), ...``: every exponent is <= 0) with the features ``phi = (1, z)``
    (the constant implicit, ``ones=True``: the tokens are passed as they are).
    The token sets ``Z (..., L_max, D)`` are its groups; the leading axes along which ``s``
    varies but ``Z`` is broadcast (queries sharing prompts) are its columns, so shared tokens
    are read once, not copied per query. ``Ls`` must already be checked
    (:func:`check_prompt_lengths`) and ``s`` finite. Returns ``(..., len(Ls), D)``.
    """
    L_max = int(Ls[-1])
    lead = np.broadcast_shapes(s.shape[:-1], Z.shape[:-2])
    n = len(lead)
    z_lead = (1,) * (n - Z.ndim + 2) + Z.shape[:-2]
    cols = [i for i in range(n) if z_lead[i] == 1 and lead[i] > 1]  # Z broadcast, s not
    groups = [i for i in range(n) if i not in cols]
    order = groups + cols
    G, C = math.prod(lead[i] for i in groups), math.prod(lead[i] for i in cols)
    logits = np.broadcast_to(s[..., :L_max], lead + (L_max,)).transpose(order + [n]).reshape(G, C, L_max)
    D = Z.shape[-1]
    Z = np.broadcast_to(Z[..., :L_max, :], tuple(lead[i] if i in groups else 1 for i in range(n)) + (L_max, D))
    phi = np.swapaxes(Z.reshape(G, L_max, D), 1, 2)                  # the tokens themselves, a view
    P = prefix_moments(phi, np.concatenate([[0], Ls]), logits=logits, ones=True)[1]
    mean = normalised(P).reshape((len(Ls),) + tuple(lead[i] for i in order) + (D,))
    # back to the caller's axes: (..., len(Ls), D)
    return mean.transpose([1 + order.index(i) for i in range(n)] + [0, n + 1])


def linear_attention(Z, U, V, q):
    """``V Ghat_L U q`` with ``Ghat_L = (1/L) sum_k z_k z_k^T``; shape ``(..., D_out)``."""
    Z, U, V, q = check_operands(Z, U, V, q)
    with np.errstate(over="ignore", invalid="ignore"):
        out = (weighted_sum(_logits(Z, U, q), Z) / Z.shape[-2]) @ V.T
    if not np.all(np.isfinite(out)):
        raise FloatOverflowError("linear_attention: V Ghat_L U q overflows float64; Z, U, V and q are too large together")
    return out


def _law_logits(law, U, V, q, func):
    """Validate ``U``, ``V``, ``q`` against a token law; return ``V`` and the logit vector ``a = U q``."""
    U, V, q = check_UVq(law.D, U, V, q, "the law")
    with np.errstate(over="ignore", invalid="ignore"):
        a = q @ U.T
    if not np.all(np.isfinite(a)):
        raise FloatOverflowError(f"{func}: U q overflows float64; U and q are too large together")
    return V, a


def limit_attention(law, U, V, q):
    """Infinite-prompt limit ``V grad K_mu(U q)`` (the tilted mean of the token law)."""
    V, a = _law_logits(law, U, V, q, "limit_attention")
    tm = law.tilted_mean(a)
    with np.errstate(over="ignore", invalid="ignore"):
        out = tm @ V.T
    if not np.all(np.isfinite(out)):
        raise FloatOverflowError("limit_attention: V times the tilted mean overflows float64; V is too large")
    return out


def asymptotic_mse(law, U, V, q, L=1):
    """Sharp prediction of ``E||f_L(q) - f_inf(q)||^2`` from the law's SNIS constant.

    With ``a = U q`` and ``C = law.snis_covariance(a)`` (delta method for self-normalised
    importance sampling), ``L E||f_L - f_inf||^2 -> tr(V C V^T)``; for Gaussian tokens
    ``exp(a^T Sigma a) (tr(V Sigma V^T) + ||V Sigma a||^2)``. Returns that constant divided by
    ``L`` (broadcast over leading axes of ``q`` and over ``L``). Raises
    :class:`~sfxlin.laws.NoLimitError` for laws without exponential moments.
    """
    L = finite_array(L, "L")
    if np.any(L < 1):
        raise ValueError(f"L must be >= 1, got {L}")
    V, a = _law_logits(law, U, V, q, "asymptotic_mse")
    C = law.snis_covariance(a)
    with np.errstate(over="ignore", invalid="ignore"):
        const = np.einsum("ij,...jk,ik->...", V, C, V)
    if not np.all(np.isfinite(const)):
        raise FloatOverflowError("asymptotic_mse: tr(V C V^T) overflows float64; V is too large")
    return const / L


def weight_ratio(logits):
    """The inverse effective sample fraction of the softmax weights ``w_i = exp(s_i)`` over the last axis of
    ``logits`` ``(..., n)`` (the logits of a query over a whole token set): ``n sum_i w_i^2 / (sum_i w_i)^2``,
    ``(...,)``, each row shifted by its maximum first. A prompt of ``L`` tokens drawn from the set weighs
    like ``L / weight_ratio`` equal-weight tokens."""
    w = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return logits.shape[-1] * np.sum(w**2, axis=-1) / np.sum(w, axis=-1) ** 2
