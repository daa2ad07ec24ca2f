"""Kernel attention (softmax with a temperature, sigmoid, ReLU, ReLU^2, random-feature softmax)
at finite prompt length and its exact limit on Gaussian tokens.

Notation as :mod:`sfxlin.attention`: tokens ``Z (..., L, D)``, query ``q (..., D)``, ``U`` (D x D),
read-out ``V`` (D_out x D), logits ``s_k = z_k^T a`` with ``a = U q``. A kernel is a weight
``kappa(s) >= 0``; its attention at prompt length ``L`` is

* normalised: ``V sum_k kappa(s_k) z_k / sum_k kappa(s_k)`` (softmax, ``relu_norm``, ``relu2_norm``);
* unnormalised: ``V (1/L) sum_k kappa(s_k) z_k`` (``sigmoid``, ``relu``, ``relu2``);
* ``sigmoid_logL``: ``V sum_k sigma(s_k - log L) z_k``, sigmoid attention with the bias ``-log L``,
  summed over tokens (as it is used in practice): the bias plays the part of ``1/L``, since
  ``sigma(s - log L) = e^s / (L + e^s) ~ e^s / L``. Its ``(1/L)``-mean tends to 0 like ``1/L``.

Exact limit on Gaussian tokens ``z ~ N(0, Sigma)`` (Stein's lemma: ``E[kappa(s) z] =
Sigma a E[kappa'(s)]``, ``s ~ N(0, r^2)``, ``r^2 = a^T Sigma a``): ``V Sigma a gain(r)`` with
``gain = E kappa'(s) / E kappa(s)`` (normalised) or ``E kappa'(s)`` (unnormalised); for
``sigmoid_logL`` the limit of ``L E sigma'(s - log L)`` is ``E e^s = exp(r^2 / 2)``.
Closed forms: softmax ``1/T``; ReLU ``1/2``; ReLU^2 ``r sqrt(2/pi)``; normalised ReLU
``sqrt(pi/2) / r``; normalised ReLU^2 ``2 sqrt(2/pi) / r``. The sigmoid moments are 1-D integrals
by a composite Gauss-Legendre rule graded around the sigmoid's transition
(:func:`sfxlin.quadrature.graded_normal_rule`), to rounding (1e-14 relative measured) for
``r <= SIGMOID_R_MAX`` and ``|b| <= SIGMOID_BIAS_MAX``; larger values are refused. A moment that
overflows float64 (softmax at ``r / T`` beyond about 18) raises ``FloatOverflowError``.

Random-feature softmax (positive features, Performer-style): ``phi(x) = exp(W x - |x|^2/2) / sqrt(m)``,
``W (m, D)`` with ``N(0, 1)`` rows, so ``E_W phi(a).phi(z) = exp(a.z)``; its attention is normalised
with the weights ``phi(a).phi(z_k)``. At fixed features its limit on ``N(0, Sigma)`` tokens is, in
closed form, ``V M sum_j pi_j w_j`` with ``M = Sigma (I + Sigma)^-1`` and
``pi = softmax_j(w_j.a + w_j^T M w_j / 2)``; as ``m -> inf`` it tends to ``V Sigma a`` (softmax's
limit), by self-normalised importance sampling over the features (docs/kernels.md).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .laws import FloatOverflowError
from .attention import (_check_operands, _check_UVq, _read_out, _weighted_sum, check_prompt_lengths,
                        online_softmax_prefix)
from .quadrature import graded_normal_rule
from .validation import finite_array

__all__ = ["KERNEL_NAMES", "Kernel", "kernel_attention", "kernel_attention_prefix", "kernel_gain",
           "kernel_limit", "kernel_mse", "positive_random_features", "rf_attention_prefix", "rf_limit",
           "rf_feature_constant", "gaussian_covariance", "SIGMOID_R_MAX", "SIGMOID_BIAS_MAX"]

#: every kernel :class:`Kernel` knows
KERNEL_NAMES = ("softmax", "sigmoid", "sigmoid_logL", "relu", "relu_norm", "relu2", "relu2_norm")
_NORMALISED = ("softmax", "relu_norm", "relu2_norm")
_RELU_POWER = {"relu": 1, "relu_norm": 1, "relu2": 2, "relu2_norm": 2}
#: largest r = ||a||_Sigma and |bias| (sigmoid_logL: log L) at which the sigmoid moments are computed
#: (the range over which graded_normal_rule was checked against adaptive quadrature)
SIGMOID_R_MAX = 1e8
SIGMOID_BIAS_MAX = 700.0


def _sigmoid(x):
    """``1 / (1 + e^-x)`` without overflow for either sign."""
    return np.exp(-np.logaddexp(0.0, -x))


def _half_moment(p, r):
    """``E[max(s, 0)^p]`` for ``s ~ N(0, r^2)``: ``r^p 2^(p/2) Gamma((p+1)/2) / (2 sqrt(pi))``."""
    return r**p * 2.0 ** (p / 2) * math.gamma((p + 1) / 2) / (2 * math.sqrt(math.pi))


@dataclass(frozen=True)
class Kernel:
    """An attention weight ``kappa``: ``name`` in :data:`KERNEL_NAMES`, ``temperature`` (softmax:
    ``kappa(s) = exp(s / T)``; ``T = sqrt(D)`` is the usual ``1/sqrt(d)`` scaling) and ``bias``
    (sigmoid: ``kappa(s) = sigma(s + b)``; ``sigmoid_logL`` uses ``b = -log L`` instead)."""

    name: str
    temperature: float = 1.0
    bias: float = 0.0

    def __post_init__(self):
        if self.name not in KERNEL_NAMES:
            raise ValueError(f"kernel name must be one of {KERNEL_NAMES}, got {self.name!r}")
        if not (np.isfinite(self.temperature) and self.temperature > 0):
            raise ValueError(f"temperature must be finite and > 0, got {self.temperature!r}")
        if not np.isfinite(self.bias):
            raise ValueError(f"bias must be finite, got {self.bias!r}")
        if self.name == "sigmoid" and abs(self.bias) > SIGMOID_BIAS_MAX:
            raise ValueError(f"bias: the sigmoid kernel accepts |bias| <= {SIGMOID_BIAS_MAX:g} (beyond, its moments "
                             f"leave the float64 range), got {self.bias!r}")

    @property
    def normalised(self) -> bool:
        """True if the weights are divided by their sum (else by L, or by nothing for ``sigmoid_logL``)."""
        return self.name in _NORMALISED

    def weight(self, s, L=None):
        """``kappa(s)`` (``sigmoid_logL``: ``sigma(s - log L)``, ``L`` needed)."""
        if self.name == "softmax":
            return np.exp(s / self.temperature)
        if self.name == "sigmoid":
            return _sigmoid(s + self.bias)
        if self.name == "sigmoid_logL":
            if L is None or np.any(np.asarray(L) < 1):
                raise ValueError(f"L: the sigmoid_logL weight sigma(s - log L) needs a prompt length >= 1, got {L}")
            return _sigmoid(s - np.log(L))
        return np.maximum(s, 0.0) ** _RELU_POWER[self.name]

    def moments(self, r, L=None):
        """``E kappa, E kappa', E kappa^2, E kappa^2 s, E kappa^2 s^2`` for ``s ~ N(0, r^2)``, as
        arrays shaped like ``r`` (broadcast against ``L`` for ``sigmoid_logL``): closed forms for
        softmax and the ReLUs, the graded rule of :func:`sfxlin.quadrature.graded_normal_rule` for
        the sigmoids (to rounding for ``r <= SIGMOID_R_MAX``; beyond, a ``ValueError``)."""
        r = np.asarray(r, dtype=float)
        if self.name in _RELU_POWER:
            p = _RELU_POWER[self.name]
            with np.errstate(over="ignore"):
                out = (_half_moment(p, r), p * _half_moment(p - 1, r), _half_moment(2 * p, r),
                       _half_moment(2 * p + 1, r), _half_moment(2 * p + 2, r))
        elif self.name == "softmax":  # E e^{cs} s^j: closed forms of the Gaussian MGF
            c, r2 = 1.0 / self.temperature, r**2
            with np.errstate(over="ignore", invalid="ignore"):
                e1, e2 = np.exp(c**2 * r2 / 2), np.exp(2 * c**2 * r2)
                out = (e1, c * e1, e2, 2 * c * r2 * e2, (r2 + 4 * c**2 * r2**2) * e2)
        else:
            out = self._sigmoid_moments(r, L)
        if not all(np.all(np.isfinite(m)) for m in out):
            raise FloatOverflowError(f"Kernel({self.name!r}).moments: a moment at r = {np.max(r):.4g} overflows "
                                     "float64 (softmax: E e^(2 s / T) = exp(2 r^2 / T^2)); r is too large")
        return out

    def _sigmoid_moments(self, r, L):
        """The five moments of :meth:`moments` for ``kappa(s) = sigma(s + b)`` (``sigmoid_logL``:
        ``b = -log L``) by :func:`sfxlin.quadrature.graded_normal_rule` around the transition
        ``s = -b``. Every integrand is positive (no cancellation): ``sigma' = sigma(u) sigma(-u)``
        in log space, and ``E kappa^2 s = r^2 E (kappa^2)' = 2 r^2 E sigma(u)^2 sigma(-u)``
        (Stein), ``u = s + b``."""
        if np.any(r > SIGMOID_R_MAX):
            raise ValueError(f"r: the sigmoid moments are computed for r = ||a||_Sigma <= {SIGMOID_R_MAX:g}, got "
                             f"max {np.max(r):.4g}")
        if self.name == "sigmoid":
            b = np.asarray(self.bias)
        else:
            if L is None or np.any(np.asarray(L) < 1):
                raise ValueError(f"L: the sigmoid_logL moments need a prompt length >= 1, got {L}")
            b = -np.log(np.asarray(L, dtype=float))
            if np.any(-b > SIGMOID_BIAS_MAX):
                raise ValueError(f"L: sigmoid_logL accepts log L <= {SIGMOID_BIAS_MAX:g}, got L = {np.max(L):.4g}")
        s, w = graded_normal_rule(r, -b[..., None])
        u = s + b[..., None]
        log_k, log_1mk = -np.logaddexp(0.0, -u), -np.logaddexp(0.0, u)   # log sigma(u), log sigma(-u)
        r = np.broadcast_to(r, s.shape[:-1])
        return (np.sum(w * np.exp(log_k), -1), np.sum(w * np.exp(log_k + log_1mk), -1),
                np.sum(w * np.exp(2 * log_k), -1), 2 * r**2 * np.sum(w * np.exp(2 * log_k + log_1mk), -1),
                np.sum(w * np.exp(2 * log_k) * s**2, -1))

    def gain(self, r, L=None):
        """Scalar gain of the limit ``V Sigma a gain`` at ``r = ||a||_Sigma``: ``E kappa'/E kappa``
        (normalised) or ``E kappa'`` (unnormalised); ``sigmoid_logL``: ``exp(r^2/2)`` (``L = None``,
        the limit) or ``L E sigma'(s - log L)`` (the exact mean at prompt length ``L``).

        ``r`` must be > 0 for the normalised ReLUs (their gain is ``c / r``). Closed forms but for
        the sigmoids (:meth:`moments`)."""
        r = np.asarray(r, dtype=float)
        if self.name in ("relu_norm", "relu2_norm") and np.any(r <= 0):
            raise ValueError(f"r: the normalised ReLU gains are c / r and need r = ||a||_Sigma > 0, got {r}")
        if self.name == "softmax":
            return np.full(r.shape, 1.0 / self.temperature)
        if self.name in _RELU_POWER:  # p E max(s,0)^(p-1) [/ E max(s,0)^p]
            p = _RELU_POWER[self.name]
            with np.errstate(over="ignore"):
                m1, m0 = p * _half_moment(p - 1, r), _half_moment(p, r)
            if not (np.all(np.isfinite(m0)) and np.all(np.isfinite(m1))):
                raise FloatOverflowError(f"Kernel({self.name!r}).gain: E max(s, 0)^{p} overflows float64 at r = "
                                         f"{np.max(r):.4g}; r is too large")
            return m1 / m0 if self.normalised else m1
        if self.name == "sigmoid_logL" and L is None:
            with np.errstate(over="ignore"):
                limit = np.exp(r**2 / 2)
            if not np.all(np.isfinite(limit)):
                raise FloatOverflowError(f"Kernel('sigmoid_logL').gain: exp(r^2 / 2) overflows float64 at r = "
                                         f"{np.max(r):.4g}; r is too large")
            return limit
        m1 = self.moments(r, L)[1]
        return L * m1 if self.name == "sigmoid_logL" else m1


def _check_kernel(kernel):
    if not isinstance(kernel, Kernel):
        raise ValueError(f"kernel must be a sfxlin.kernels.Kernel, got {type(kernel).__name__}")
    return kernel


def kernel_attention(Z, U, V, q, kernel):
    """Kernel attention of ``kernel`` (a :class:`Kernel`) at the prompt length ``L = Z.shape[-2]``.

    ``Z (..., L, D)``, ``q (..., D)`` -> ``(..., D_out)``. Normalised kernels whose weights are all
    0 (ReLU with every logit <= 0) return 0. Softmax is evaluated stably (the maximum logit is
    subtracted)."""
    return kernel_attention_prefix(Z, U, V, q, [Z.shape[-2]], kernel)[..., 0, :]


def kernel_attention_prefix(Z, U, V, q, Ls, kernel):
    """Kernel attention at every nested prompt length ``L in Ls`` (the prompt ``Z[..., :L, :]``).

    Logits are computed once; softmax uses the online softmax of
    :func:`sfxlin.attention.online_softmax_prefix`; the other kernels cumulate ``kappa(s) z`` and
    ``kappa(s)`` block by block (cost O(L_max)), but for ``sigmoid_logL`` whose weights depend on
    ``L`` (cost O(sum L)). ``Z (..., L_max, D)``, ``q (..., D)`` -> ``(..., len(Ls), D_out)``.
    """
    kernel = _check_kernel(kernel)
    Z, U, V, q = _check_operands(Z, U, V, q, check_Z=False)
    Ls = check_prompt_lengths(Ls, Z.shape[-2])
    Z = finite_array(Z[..., : Ls[-1], :], "Z")
    with np.errstate(over="ignore", invalid="ignore"):  # overflow is reported below
        a = q @ U.T
        s = (Z @ a[..., None])[..., 0]
    if not np.all(np.isfinite(s)):
        raise FloatOverflowError("kernel_attention_prefix: the logits z_k^T U q overflow float64; Z, U and q are "
                                 "too large together")
    if kernel.name == "softmax":
        return _read_out(online_softmax_prefix(s / kernel.temperature, Z, Ls), V, "kernel_attention_prefix")
    if kernel.name == "sigmoid_logL":
        out = [_weighted_sum(kernel.weight(s[..., :L], L), Z[..., :L, :]) for L in Ls]
    else:
        w = kernel.weight(s)
        out, num, den = [], 0.0, 0.0
        for lo, hi in zip(np.concatenate([[0], Ls[:-1]]), Ls):
            num = num + _weighted_sum(w[..., lo:hi], Z[..., lo:hi, :])
            den = den + w[..., lo:hi].sum(axis=-1)
            out.append(_reduce_sums(kernel, num, den, hi))
    return _read_out(np.stack(out, axis=-2), V, "kernel_attention_prefix")


def _reduce_sums(kernel, num, den, L):
    """Normalised (``num / den``; 0 where no weight is positive: every ReLU logit <= 0, probability
    ``2^-L``) or the ``(1/L)``-mean."""
    if kernel.normalised:
        den = den[..., None]
        return np.where(den > 0, num / np.where(den > 0, den, 1.0), 0.0)
    return num / L


def gaussian_covariance(Sigma, D=None):
    """``Sigma`` as a symmetric positive-definite D x D matrix (given whole, as a diagonal or a scalar)."""
    S = finite_array(Sigma, "Sigma")
    if S.ndim == 0 and D is not None:
        S = S * np.eye(D)
    elif S.ndim == 1:
        S = np.diag(S)
    if S.ndim != 2 or S.shape[0] != S.shape[1] or (D is not None and S.shape[0] != D):
        raise ValueError(f"Sigma must be a {D or 'D'} x {D or 'D'} matrix, a diagonal or a scalar, got shape {S.shape}")
    if not np.allclose(S, S.T) or np.linalg.eigvalsh(S).min() <= 0:
        raise ValueError("Sigma must be symmetric positive definite")
    return S


def _law_operands(Sigma, U, V, q):
    U = finite_array(U, "U")
    S = gaussian_covariance(Sigma, U.shape[0] if U.ndim == 2 else None)
    U, V, q = _check_UVq(S.shape[0], U, V, q, "Sigma")
    a = q @ U.T
    Sa = a @ S  # Sigma a (Sigma symmetric)
    return S, V, a, Sa, np.sqrt(np.sum(a * Sa, axis=-1))


def kernel_gain(kernel, Sigma, U, q, L=None):
    """The Stein gain ``gain(||U q||_Sigma)`` of ``kernel`` (see :meth:`Kernel.gain`), shape ``q.shape[:-1]``."""
    kernel = _check_kernel(kernel)
    S, _, _, _, r = _law_operands(Sigma, U, np.eye(np.shape(U)[0]), q)
    return kernel.gain(r, L)


def kernel_limit(kernel, Sigma, U, V, q):
    """Exact infinite-prompt limit of :func:`kernel_attention` on ``N(0, Sigma)`` tokens:
    ``V Sigma a gain(||a||_Sigma)``, ``a = U q`` (Stein's lemma); shape ``(..., D_out)``."""
    kernel = _check_kernel(kernel)
    S, V, a, Sa, r = _law_operands(Sigma, U, V, q)
    return (Sa * np.asarray(kernel.gain(r))[..., None]) @ V.T


def kernel_mse(kernel, Sigma, U, q, L):
    """``E||f_L(q) - f_inf(q)||^2`` on ``N(0, Sigma)`` tokens with ``V = I``, per query and ``L``
    (``L`` broadcasts against ``q.shape[:-1]``).

    Exact for the unnormalised kernels (an i.i.d. mean: variance / L) and for ``sigmoid_logL``
    (squared bias ``|L E sigma'(s - log L) - e^{r^2/2}|^2 |Sigma a|^2`` plus the variance of the sum);
    the delta-method (self-normalised importance sampling) constant over ``L`` for the normalised
    ones, sharp as ``L -> inf``. With ``z = Sigma a s / r^2 + z_perp`` (``z_perp`` independent of
    ``s``): ``E kappa^2 |z|^2 = E kappa^2 tr Sigma + (|Sigma a|^2 / r^2)(E kappa^2 s^2 / r^2 - E kappa^2)``.
    """
    kernel = _check_kernel(kernel)
    S, _, a, Sa, r = _law_operands(Sigma, U, np.eye(np.shape(U)[0]), q)
    L = finite_array(L, "L")
    if np.any(L < 1):
        raise ValueError(f"L must be >= 1, got {L}")
    if np.any(r <= 0):
        raise ValueError("q: kernel_mse needs a = U q != 0 (r = ||a||_Sigma > 0)")
    B, r2 = np.sum(Sa**2, axis=-1), r**2
    if kernel.name == "sigmoid_logL":
        k0, k1, k2, k2s, k2ss = kernel.moments(*np.broadcast_arrays(r, L))
        second = k2 * np.trace(S) + B / r2 * (k2ss / r2 - k2)
        return (L * k1 - np.exp(r2 / 2)) ** 2 * B + L * (second - B * k1**2)
    k0, k1, k2, k2s, k2ss = kernel.moments(r)
    second = k2 * np.trace(S) + B / r2 * (k2ss / r2 - k2)
    if not kernel.normalised:
        return (second - B * k1**2) / L
    g = k1 / k0
    return (second - 2 * g * B * k2s / r2 + g**2 * B * k2) / k0**2 / L


def positive_random_features(rng, m, D, n_draws=None):
    """``W (m, D)`` (or ``(n_draws, m, D)``: independent draws) with i.i.d. ``N(0, 1)`` entries: the
    features ``phi(x) = exp(W x - |x|^2/2) / sqrt(m)``, ``E_W phi(a).phi(z) = exp(a.z)``."""
    if not (isinstance(m, (int, np.integer)) and m >= 1):
        raise ValueError(f"m (number of random features) must be an integer >= 1, got {m!r}")
    if n_draws is None:
        return rng.standard_normal((int(m), D))
    if not (isinstance(n_draws, (int, np.integer)) and n_draws >= 1):
        raise ValueError(f"n_draws must be an integer >= 1, got {n_draws!r}")
    return rng.standard_normal((int(n_draws), int(m), D))


def _rf_log_weights(W, a, Z):
    """``log phi(a).phi(z_k)`` up to a constant in ``k``: ``logsumexp_j(w_j.(a + z_k)) - |z_k|^2/2``."""
    t = Z @ W.T + (a @ W.T)[..., None, :]  # (..., L, m)
    top = t.max(axis=-1, keepdims=True)
    return (top + np.log(np.exp(t - top).sum(axis=-1, keepdims=True)))[..., 0] - 0.5 * np.sum(Z**2, axis=-1)


def rf_attention_prefix(Z, U, V, q, Ls, W):
    """Random-feature softmax attention ``V sum_k phi(a).phi(z_k) z_k / sum_k phi(a).phi(z_k)``
    at every ``L in Ls``; ``W (m, D)`` from :func:`positive_random_features`. Weights are handled
    in log space (log-sum-exp over features, online softmax over tokens): no overflow.
    ``Z (..., L_max, D)``, ``q (..., D)`` -> ``(..., len(Ls), D_out)``."""
    Z, U, V, q = _check_operands(Z, U, V, q, check_Z=False)
    W = finite_array(W, "W")
    if W.ndim != 2 or W.shape[1] != Z.shape[-1]:
        raise ValueError(f"W must be (m, {Z.shape[-1]}), got {W.shape}")
    Ls = check_prompt_lengths(Ls, Z.shape[-2])
    Z = finite_array(Z[..., : Ls[-1], :], "Z")
    with np.errstate(over="ignore", invalid="ignore"):  # overflow is reported below
        s = _rf_log_weights(W, q @ U.T, Z)
    if not np.all(np.isfinite(s)):
        raise FloatOverflowError("rf_attention_prefix: the feature logits overflow float64; Z, U, q and W are too "
                                 "large together")
    return _read_out(online_softmax_prefix(s, Z, Ls), V, "rf_attention_prefix")


def rf_limit(Sigma, U, V, q, W):
    """Exact limit of :func:`rf_attention_prefix` at fixed features on ``N(0, Sigma)`` tokens:
    ``V M sum_j pi_j w_j``, ``M = Sigma (I + Sigma)^-1``, ``pi = softmax_j(w_j.a + w_j^T M w_j / 2)``.

    (``E[exp(w.z - |z|^2/2) (1, z)] = det(I + Sigma)^-1/2 exp(w^T M w / 2) (1, M w)``.) ``W (..., m, D)``:
    leading axes of ``W`` (independent feature draws) broadcast against those of ``q``."""
    S, V, a, _, _ = _law_operands(Sigma, U, V, q)
    W = finite_array(W, "W")
    if W.ndim < 2 or W.shape[-1] != S.shape[0]:
        raise ValueError(f"W must be (..., m, {S.shape[0]}), got {W.shape}")
    M = S @ np.linalg.inv(np.eye(S.shape[0]) + S)
    t = (W @ a[..., None])[..., 0] + 0.5 * np.sum((W @ M) * W, axis=-1)
    pi = np.exp(t - t.max(axis=-1, keepdims=True))
    pi /= pi.sum(axis=-1, keepdims=True)
    return (pi[..., None, :] @ W)[..., 0, :] @ M.T @ V.T


def rf_feature_constant(Sigma, U, q):
    """``lim m E_W||rf_limit - Sigma a||^2`` (``V = I``) as ``m -> inf``: the delta-method constant of
    self-normalised importance sampling over features,
    ``E[rho^2] / E[rho]^2 tr(M (P^-1 + (nu - mu)(nu - mu)^T) M)`` with ``rho(w) = exp(w.a + w^T M w / 2)``,
    ``P = I - 2M``, ``nu = 2 P^-1 a``, ``mu = (I + Sigma) a``. Finite iff every eigenvalue of ``Sigma``
    is < 1 (``P`` positive definite); ``inf`` otherwise: the feature weights then have infinite
    variance and the error decays more slowly than ``1/m`` (docs/kernels.md)."""
    S, _, a, _, _ = _law_operands(Sigma, U, np.eye(np.shape(U)[0]), q)
    D = S.shape[0]
    M = S @ np.linalg.inv(np.eye(D) + S)
    P = np.eye(D) - 2 * M
    if np.linalg.eigvalsh(P).min() <= 0:
        return np.full(a.shape[:-1], np.inf)
    Pinv = np.linalg.inv(P)
    nu, mu = 2 * a @ Pinv, a @ (np.eye(D) + S)
    log_ratio = (np.linalg.slogdet(np.eye(D) - M)[1] - 0.5 * np.linalg.slogdet(P)[1]
                 + 2 * np.einsum("...d,de,...e->...", a, Pinv, a) - np.sum(a * mu, axis=-1))
    diff = nu - mu
    quad = np.trace(M @ Pinv @ M) + np.sum((diff @ M) ** 2, axis=-1)
    return np.exp(log_ratio) * quad
