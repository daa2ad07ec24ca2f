"""An attention head given by its weights: the logit matrix ``U``, the read-out ``V`` and the
logit scale, from a user's matrices or by a documented default.

Convention (docs/models.md, section 1): the logits are ``s_k = c * z_k^T U q``, ``z_k`` the
prompt tokens (keys), ``q`` the query, ``c`` the logit scale; the output is ``V sum_k
softmax(s)_k z_k``. A head in projection form (PyTorch ``nn.Linear`` weights, shape ``(out, in)``)
has ``W_Q, W_K`` of shape ``(d_head, D)`` and ``W_V`` of shape ``(d_v, D)``: the query's logit
against token ``z`` is ``(W_K z) . (W_Q q) = z^T (W_K^T W_Q) q``, so ``U = W_K^T W_Q`` and
``V = W_V`` (the output projection ``W_O`` is not part of the head: apply it to ``V`` first,
``V = W_O W_V``, to see the head's contribution to the residual stream).
"""
from __future__ import annotations

import math

import numpy as np

from .validation import finite_array

__all__ = ["LOGIT_SCALES", "parse_logit_scale", "head_matrices", "default_U"]

LOGIT_SCALES = ("1", "1/sqrt(d_head)")
"""The named logit scales; any positive number (as text, e.g. ``"0.125"``) is also one."""


def parse_logit_scale(text, d_head=None) -> float:
    """The logit scale ``c`` of ``text``: ``"1"``, ``"1/sqrt(d_head)"`` (``d_head`` needed: the
    rows of ``W_Q``, or given) or a positive finite number. ``ValueError`` naming ``logit_scale``."""
    text = str(text).strip()
    if text.replace(" ", "") == "1/sqrt(d_head)":
        if d_head is None:
            raise ValueError("logit_scale: '1/sqrt(d_head)' needs d_head: give W_Q and W_K (d_head is their number "
                             "of rows) or --set d_head=N")
        return 1.0 / math.sqrt(d_head)
    try:
        c = float(text)
    except ValueError:
        raise ValueError(f"logit_scale must be one of {list(LOGIT_SCALES)} or a positive number, got {text!r}") from None
    if not (math.isfinite(c) and c > 0):
        raise ValueError(f"logit_scale must be a positive finite number, got {text!r}")
    return c


def _matrix(M, name, rows=None, cols=None, what=""):
    """``M`` as a finite 2-D array with the given number of rows and columns (None: any)."""
    M = finite_array(M, name)
    if M.ndim != 2:
        raise ValueError(f"{name} must be a matrix{what}, got shape {M.shape}")
    if (rows is not None and M.shape[0] != rows) or (cols is not None and M.shape[1] != cols):
        want = f"({'any' if rows is None else rows}, {'any' if cols is None else cols})"
        raise ValueError(f"{name} must have shape {want}{what}, got {M.shape}")
    return M


def head_matrices(D, U=None, V=None, W_Q=None, W_K=None, W_V=None, d_head=None):
    """``(U, V, d_head)`` of a head on tokens of dimension ``D``, from its matrices (see the module
    doc): ``U`` (D, D) or ``W_Q`` and ``W_K`` (d_head, D) with ``U = W_K^T W_Q``; ``V`` (D_out, D) or
    ``W_V`` (d_v, D), ``I_D`` when neither is given. ``U`` is None when neither ``U`` nor ``W_Q``
    is given (the caller's default head). ``d_head``: the rows of ``W_Q``, or the given one (which
    must then agree with them). One ``ValueError`` per problem, naming the matrix: not 2-D, NaN or
    inf, a dimension other than the tokens' ``D``, ``U`` given together with ``W_Q``/``W_K``, one of
    ``W_Q``/``W_K`` without the other, ``V`` together with ``W_V``."""
    tok = f" to act on the tokens (dimension D = {D})"
    if U is not None and (W_Q is not None or W_K is not None):
        raise ValueError("U, W_Q, W_K: give either U or the pair W_Q, W_K (U = W_K^T W_Q), not both")
    if (W_Q is None) != (W_K is None):
        raise ValueError(f"{'W_K' if W_K is None else 'W_Q'}: W_Q and W_K come together (U = W_K^T W_Q)")
    if V is not None and W_V is not None:
        raise ValueError("V, W_V: give one read-out, V or W_V (the same matrix, V = W_V)")
    if d_head is not None and (isinstance(d_head, bool) or int(d_head) != d_head or d_head < 1):
        raise ValueError(f"d_head must be an integer >= 1, got {d_head!r}")
    if U is not None:
        U = _matrix(U, "U", D, D, tok)
    elif W_Q is not None:
        W_Q = _matrix(W_Q, "W_Q", None, D, f" (d_head, D){tok}")
        W_K = _matrix(W_K, "W_K", W_Q.shape[0], D, f" (d_head, D), the shape of W_Q,{tok[:-1]}")
        if d_head is not None and d_head != W_Q.shape[0]:
            raise ValueError(f"d_head = {d_head} but W_Q has {W_Q.shape[0]} rows (d_head); drop --set d_head")
        d_head = W_Q.shape[0]
        U = W_K.T @ W_Q
    if W_V is not None:
        V = _matrix(W_V, "W_V", None, D, f" (d_v, D){tok}")
    elif V is not None:
        V = _matrix(V, "V", None, D, f" (D_out, D){tok}")
    else:
        V = np.eye(D)
    return U, V, (None if d_head is None else int(d_head))


def default_U(rng, Sigma, U_norm):
    """The default head's ``U``: a standard Gaussian ``D x D`` direction ``G`` (``rng.standard_normal``)
    scaled to ``U_norm * G / (||G||_F s^2)``, ``s^2 = tr(Sigma) / D`` the tokens' mean variance, so
    that ``||S^{1/2} U S^{1/2}||_F = U_norm`` for the isotropic ``S = s^2 I``: the logits' spread is
    ``U_norm`` in the tokens' own units, whatever their scale. ``ValueError`` when ``tr Sigma = 0``
    (every token the same: attention has nothing to average)."""
    Sigma = finite_array(Sigma, "Sigma")
    D = Sigma.shape[0]
    s2 = np.trace(Sigma) / D
    if not s2 > 0:
        raise ValueError("tokens: every token is the same (covariance 0): the attention output is that token at "
                         "every L, there is nothing to measure")
    G = rng.standard_normal((D, D))
    return U_norm * G / (np.linalg.norm(G) * s2)
