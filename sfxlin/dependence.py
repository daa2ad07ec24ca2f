"""Dependent tokens: the influence function of softmax attention and its integrated autocorrelation
along a token sequence (docs/models.md, "Dependent tokens: Gaussian AR(1)").

For a stationary, mixing token sequence with marginal law ``mu`` and ``a = U q``, the error of
the ratio estimator ``f_L = sum_k e^{a.z_k} z_k / sum_k e^{a.z_k}`` is, to first order,
``(1/L) sum_k psi(z_k)`` with the influence function

    psi(z) = e^{a.z} (z - f_inf) / E_mu e^{a.z},   f_inf = grad K_mu(a),

so ``L E||V(f_L - f_inf)||^2 -> sum_{h in Z} tr V gamma(h) V^T``, ``gamma(h) = E psi(z_0) psi(z_h)^T``.
At ``h = 0`` this is the i.i.d. sharp constant ``tr V C_mu(a) V^T``; their ratio is the
integrated autocorrelation factor ``tau`` (1 for i.i.d. tokens). Here ``mu`` is the empirical law
of a token file and the sequence is the file in its order.

A finite file is also a finite population: a window of ``L`` of its ``n`` tokens is ``L`` distinct
tokens, and a window of all ``n`` is the whole file, whose softmax is the limit itself (error 0). For an
exchangeable file the first-order error of a window has the finite-population correction of sampling
without replacement, ``E||(1/L) sum psi||^2 = (C / L) (n - L) / (n - 1)``; for a sequence it also holds
the file's own correlations up to lag ``L``. :func:`window_mse` gives the expected error of a window
read circularly from a uniform start exactly, to every order: the finite file's answer, not a model.
"""
from __future__ import annotations

import numpy as np

from .validation import finite_array

__all__ = ["influence", "batch_means", "integrated_factor", "window_mse"]


def influence(Z, a, f_inf, V):
    """``V psi(z_k)`` for every token of ``Z (n, D)`` (the empirical law of ``Z``: ``E e^{a.z}`` is
    the mean over its rows), ``a (D,)``, ``f_inf (D,)`` the exact tilted mean of that law, ``V
    (D_out, D)``; shape ``(n, D_out)``. Stable for large logits: ``e^{a.z_k - max}`` over its mean.
    Its mean over the rows is 0 and its mean squared norm ``tr V C_mu(a) V^T`` (the SNIS constant
    of :meth:`sfxlin.laws.Empirical.snis_covariance`)."""
    s = Z @ a
    w = np.exp(s - s.max())
    return (w / w.mean())[:, None] * ((Z - f_inf) @ V.T)


def batch_means(x, b):
    """Batch-means estimate of the long-run variance ``sum_h tr E x_0 x_h^T`` of a stationary
    sequence ``x (n, p)``: the first ``B = n // b`` batches of ``b`` rows, ``lrv = b / (B - 1) *
    sum_j ||xbar_j - xbar||^2``. Returns ``(lrv, se, B)``; ``se = sd_j(b ||xbar_j - xbar||^2) /
    sqrt(B)``, the batches taken as independent (valid when ``b`` is much longer than the
    correlation time; the estimate's bias is ``O(tau / b)``). ``ValueError`` when ``B < 2``."""
    x = finite_array(x, "x")
    n = x.shape[0]
    if not (isinstance(b, (int, np.integer)) and b >= 1) or n // b < 2:
        raise ValueError(f"batch: a batch of {b} rows leaves {n // max(int(b), 1)} batch(es) of {n} rows; at least 2 "
                         "are needed (use a batch of at most n / 2)")
    B = n // b
    means = x[: B * b].reshape(B, b, -1).mean(axis=1)
    dev = b * np.sum((means - means.mean(axis=0)) ** 2, axis=-1)  # (B,)
    return float(dev.sum() / (B - 1)), float(dev.std(ddof=1) / np.sqrt(B)), B


def integrated_factor(Z, A, f_inf, V, b):
    """The integrated autocorrelation factor of the influence function along the rows of ``Z``
    (the file's order), for a set of queries: ``tau = sum_q lrv_q / sum_q tr V C(a_q) V^T``, the
    ratio of the query-set mean constants of dependent and i.i.d. tokens.

    ``Z (n, D)``, ``A (Q, D)`` the logit vectors ``a_q = U q``, ``f_inf (Q, D)`` their exact limits,
    ``V (D_out, D)``, ``b`` the batch length of :func:`batch_means` (applied to the queries'
    influence functions stacked side by side, so its batches sum over the queries). Returns
    ``(tau, tau_se, trC, B)`` with ``trC`` the query-set mean i.i.d. constant from the same
    influence functions (its own check against the SNIS constant) and ``B`` the number of batches."""
    x = np.concatenate([influence(Z, a, f, V) for a, f in zip(A, f_inf)], axis=1)  # (n, Q * D_out)
    Q = A.shape[0]
    trC = float(np.sum(x**2) / x.shape[0] / Q)
    lrv, se, B = batch_means(x, b)
    return lrv / Q / trC, se / Q / trC, trC, B


def window_mse(Z, A, f_inf, V, Ls):
    """The exact expected squared error of softmax attention over a window of the file ``Z (n, D)``,
    for each length ``L`` of ``Ls``: ``mean_q mean_s ||V (f_L(s, q) - f_inf(q))||^2``, ``f_L(s, q)`` the
    softmax of the tokens ``z_s, z_{s+1}, .., z_{s+L-1}`` read circularly (indices mod ``n``, the last
    token followed by the first), over every start ``s = 0 .. n - 1`` (the window prompts of
    ``c1_own``, whose starts are uniform), ``A (Q, D)`` the logit vectors ``a_q = U q``, ``f_inf (Q, D)``
    their exact limits (the whole file's tilted means), ``V (D_out, D)``.

    Exact, not a first-order expansion: ``f_L - f_inf = sum_win w_k (z_k - f_inf) / sum_win w_k``
    with ``w_k = e^{a.z_k - max}``, both sums taken for every start at once (``O(n D_out)`` per length and
    query) without a difference of running sums (whose cancellation would lose the windows of small
    weights): the file read circularly is cut into blocks of ``L`` tokens, and the window from ``s = kL + r``
    is the suffix of block ``k`` from ``r`` plus the prefix of block ``k + 1`` before ``r``. At ``L = n``
    every window is the whole file and the error is 0 to rounding. ``ValueError`` unless every ``L`` is an
    integer in ``1 .. n``."""
    Z = finite_array(Z, "Z")
    n = Z.shape[0]
    Ls = np.asarray(Ls)
    if Ls.ndim != 1 or Ls.size == 0 or not np.all(Ls == np.round(Ls)) or Ls.min() < 1 or Ls.max() > n:
        raise ValueError(f"Ls: window lengths must be integers in 1 .. n = {n} (a window of the file), got {Ls}")
    out = np.zeros(Ls.size)
    for a, f in zip(A, f_inf):
        s = Z @ a
        w = np.exp(s - s.max())
        y = np.concatenate([w[:, None], w[:, None] * ((Z - f) @ V.T)], axis=1)   # (n, 1 + D_out)
        for j, L in enumerate(Ls.astype(np.int64)):
            m = -(-(n + L) // L) * L                                          # whole blocks covering n + L
            blocks = y[np.arange(m) % n].reshape(m // L, L, -1)
            suffix = np.cumsum(blocks[:, ::-1], axis=1)[:, ::-1].reshape(m, -1)   # from r to the block's end
            prefix = np.zeros_like(blocks)
            np.cumsum(blocks[:, :-1], axis=1, out=prefix[:, 1:])
            win = suffix[:n] + prefix.reshape(m, -1)[L:L + n]                 # every start s = 0 .. n - 1
            err = win[:, 1:] / win[:, :1]
            out[j] += np.einsum("ij,ij->", err, err) / n
    return out / len(A)
