"""Kernel attention (softmax with a temperature, sigmoid, ReLU, ReLU^2, linear, random-feature
softmax) at finite prompt length and its exact limit on Gaussian tokens.

Notation as :mod:`sfxlin.attention`: tokens ``Z (..., L, D)``, query ``q (..., D)``, ``U`` (D x D),
read-out ``V`` (D_out x D), logits ``s_k = z_k^T a`` with ``a = U q``. A kernel is a weight
``kappa(s)``; its attention at prompt length ``L`` is

* normalised: ``V sum_k kappa(s_k) z_k / sum_k kappa(s_k)`` (softmax, ``relu_norm``, ``relu2_norm``);
* unnormalised: ``V (1/L) sum_k kappa(s_k) z_k`` (``sigmoid``, ``relu``, ``relu2``, ``linear``);
* ``sigmoid_logL``: ``V sum_k sigma(s_k - log L) z_k``, sigmoid attention with the bias ``-log L``,
  summed over tokens (as it is used in practice): the bias plays the part of ``1/L``, since
  ``sigma(s - log L) = e^s / (L + e^s) ~ e^s / L``. Its ``(1/L)``-mean tends to 0 like ``1/L``.

Exact limit on Gaussian tokens ``z ~ N(0, Sigma)`` (Stein's lemma: ``E[kappa(s) z] =
Sigma a E[kappa'(s)]``, ``s ~ N(0, r^2)``, ``r^2 = a^T Sigma a``): ``V Sigma a gain(r)`` with
``gain = E kappa'(s) / E kappa(s)`` (normalised) or ``E kappa'(s)`` (unnormalised); for
``sigmoid_logL`` the limit of ``L E sigma'(s - log L)`` is ``E e^s = exp(r^2 / 2)``.
Closed forms: softmax ``1/T``; ReLU ``1/2``; ReLU^2 ``r sqrt(2/pi)``; normalised ReLU
``sqrt(pi/2) / r``; normalised ReLU^2 ``2 sqrt(2/pi) / r``; linear ``1``. The sigmoid moments are 1-D
integrals by a composite Gauss-Legendre rule graded around the sigmoid's transition
(:func:`sfxlin.quadrature.graded_normal_rule`), to rounding (1e-14 relative measured) for
``r <= SIGMOID_R_MAX`` and ``|b| <= SIGMOID_BIAS_MAX``; larger values are refused. A moment that
overflows float64 (softmax at ``r / T`` beyond about 18) raises ``FloatOverflowError``.

**One class per kernel.** Every kernel is a subclass of :class:`Kernel` that declares what a
kernel is (``name``, ``normalised``, ``smoothness``; its numpy and JAX weights; its Gaussian
moments, in closed form or by :func:`quadrature_moments`) and is registered in :data:`KERNELS`
when the class is defined, like :data:`sfxlin.laws.LAWS`. ``Kernel(name, **parameters)`` builds
the kernel registered as ``name``; :mod:`sfxlin.models` takes the same kernels (by name or
instance) and uses their JAX weights, which import JAX at their first call only: importing
this module never imports JAX.

Random-feature softmax (positive features, Performer-style): ``phi(x) = exp(W x - |x|^2/2) / sqrt(m)``,
``W (m, D)`` with ``N(0, 1)`` rows, so ``E_W phi(a).phi(z) = exp(a.z)``; its attention is normalised
with the weights ``phi(a).phi(z_k)``. At fixed features its limit on ``N(0, Sigma)`` tokens is, in
closed form, ``V M sum_j pi_j w_j`` with ``M = Sigma (I + Sigma)^-1`` and
``pi = softmax_j(w_j.a + w_j^T M w_j / 2)``; as ``m -> inf`` it tends to ``V Sigma a`` (softmax's
limit), by self-normalised importance sampling over the features (docs/kernels.md).
"""
from __future__ import annotations

import abc
import dataclasses
import math

import numpy as np
from numpy.polynomial.hermite_e import hermegauss

from .laws import FloatOverflowError
from .attention import (check_operands, check_UVq, read_out, weighted_sum, check_prompt_lengths,
                        online_softmax_prefix)
from .quadrature import graded_normal_rule
from .validation import finite_array, registry_name

__all__ = ["KERNELS", "KERNEL_NAMES", "SMOOTHNESS", "Kernel", "Softmax", "Sigmoid", "SigmoidLogL", "ReLU", "ReLUNorm",
           "ReLU2", "ReLU2Norm", "Linear", "as_kernel", "quadrature_moments", "kernel_attention",
           "kernel_attention_prefix", "kernel_gain", "kernel_limit", "kernel_mse", "positive_random_features",
           "rf_attention_prefix", "rf_limit", "rf_feature_constant", "gaussian_covariance", "SIGMOID_R_MAX",
           "SIGMOID_BIAS_MAX", "stein_identity_error"]

#: largest r = ||a||_Sigma and |bias| (sigmoid_logL: log L) at which the sigmoid moments are computed
#: (the range over which graded_normal_rule was checked against adaptive quadrature)
SIGMOID_R_MAX = 1e8
SIGMOID_BIAS_MAX = 700.0
#: the values of :attr:`Kernel.smoothness`: ``"smooth"``, a weight with derivatives of every order
#: (Gauss-Hermite quadrature of its Stein integrands converges geometrically); ``"kinked"``, a weight
#: with a jump in some derivative (ReLU: the first, ReLU^2: the second), for which Stein's lemma
#: holds with the weak derivative and Gauss-Hermite converges only algebraically
SMOOTHNESS = ("smooth", "kinked")

KERNELS: dict[str, type] = {}
"""Every concrete :class:`Kernel` subclass by its ``name``, filled when the class is defined."""

#: class attributes every kernel declares (plain class attributes, not constructor parameters)
_DECLARED = ("name", "normalised", "smoothness")
#: parameters of some kernels, accepted by ``Kernel(name, ...)`` for a kernel without them at the
#: value that leaves every kernel unchanged (the keywords of the former single kernel class)
_NEUTRAL = {"temperature": 1.0, "bias": 0.0}


def _sigmoid(x):
    """``1 / (1 + e^-x)`` without overflow for either sign."""
    return np.exp(-np.logaddexp(0.0, -x))


def _half_moment(p, r):
    """``E[max(s, 0)^p]`` for ``s ~ N(0, r^2)``: ``r^p 2^(p/2) Gamma((p+1)/2) / (2 sqrt(pi))``."""
    return r**p * 2.0 ** (p / 2) * math.gamma((p + 1) / 2) / (2 * math.sqrt(math.pi))


def _jax():
    """``(jax, jax.numpy)`` with float64 on (:mod:`sfxlin.models._jax`, the one place sfxlin imports
    JAX): imported at the first JAX weight, never when this module is imported."""
    from .models._jax import jax, jnp

    return jax, jnp


def _jax_logits(A, Z):
    """``s_k = z_k . a`` for the rows ``a`` of ``A (H, m, D)`` over the tokens ``Z (L, D)``: ``(H, m, L)``."""
    return _jax()[1].einsum("hmi,li->hml", A, Z)


# ------------------------------------------------------------------ the interface and the registry
class _KernelType(abc.ABCMeta):
    """The type of the kernels: calling :class:`Kernel` itself builds the kernel registered under a name."""

    def __call__(cls, *args, **kwargs):
        if cls is Kernel:
            return _by_name(*args, **kwargs)
        return super().__call__(*args, **kwargs)


def _is_neutral(key, value):
    """Whether ``key=value`` is a parameter at the value that leaves every kernel unchanged."""
    return key in _NEUTRAL and np.ndim(value) == 0 and value == _NEUTRAL[key]


def _by_name(name, **parameters):
    """The kernel registered in :data:`KERNELS` as ``name``, built with ``parameters`` (one it does
    not have is accepted at its neutral value only)."""
    if name not in KERNELS:
        raise ValueError(f"kernel name must be one of {tuple(KERNELS)}, got {name!r}")
    cls = KERNELS[name]
    own = [f.name for f in dataclasses.fields(cls)]
    for key, value in parameters.items():
        if key not in own and not _is_neutral(key, value):
            accepted = f", accepted only at {_NEUTRAL[key]!r}" if key in _NEUTRAL else ""
            raise ValueError(f"{key}: kernel {name!r} has no parameter {key} (its parameters: "
                             f"{', '.join(own) or 'none'}); got {key}={value!r}{accepted}")
    return cls(**{key: value for key, value in parameters.items() if key in own})


def _check_declarations(cls):
    """Refuse (``TypeError``) a kernel class without its own new ``name``, ``normalised`` and
    ``smoothness``, or with a member left abstract."""
    registry_name(cls, KERNELS, "kernel", "KERNELS")
    normalised = cls.__dict__.get("normalised")
    if not isinstance(normalised, bool):
        raise TypeError(f"kernel class {cls.__qualname__} must set a class attribute normalised (True: weights "
                        f"divided by their sum; False: not), got {normalised!r}")
    smoothness = cls.__dict__.get("smoothness")
    if smoothness not in SMOOTHNESS:
        raise TypeError(f"kernel class {cls.__qualname__} must set a class attribute smoothness, one of "
                        f"{SMOOTHNESS}, got {smoothness!r}")
    missing = sorted(attr for attr in dir(cls) if getattr(getattr(cls, attr, None), "__isabstractmethod__", False))
    if missing:
        raise TypeError(f"kernel class {cls.__qualname__} does not implement {missing} (declared by Kernel)")


class Kernel(metaclass=_KernelType):
    """An attention weight ``kappa`` (module doc): the interface every kernel provides.

    ``Kernel(name, **parameters)`` builds the kernel registered in :data:`KERNELS` as ``name``
    (``Kernel("sigmoid", bias=-1.3)`` is ``Sigmoid(bias=-1.3)``); an unknown name, or a parameter
    the kernel does not have, is a ``ValueError``, but ``temperature=1.0`` and ``bias=0.0``, which
    leave any kernel as it is, are accepted by every kernel.

    A kernel is a subclass that sets, in its own body and as plain class attributes (no annotation):

    * ``name``: a new non-empty string, its key in :data:`KERNELS`;
    * ``normalised``: ``True`` if its attention divides the weights by their sum, ``False`` if not
      (by ``L``, or by nothing for a kernel that says so in its own :meth:`attention_prefix`);
    * ``smoothness``: one of :data:`SMOOTHNESS` (whether Stein's lemma holds in its smooth form,
      with Gauss-Hermite quadrature of the Stein integrands converging geometrically);

    and implements :meth:`weight` (numpy), :meth:`jax_weight` (JAX) and :meth:`expectations`
    (closed forms, or :func:`quadrature_moments`). Its parameters are annotated class attributes
    with defaults (``bias: float = 0.0``), checked in ``__post_init__``: every kernel class is made a
    frozen dataclass when it is defined (hashable and equal by value, as the compiled JAX models
    need), so it is not decorated itself. It is then registered; a missing or taken ``name``, a
    missing or invalid ``normalised`` or ``smoothness``, or a member left abstract is refused there
    with a ``TypeError``. An intermediate class that is not a kernel by itself is declared with
    ``class Base(Kernel, abstract=True)`` and is not registered.

    :meth:`moments`, :meth:`gain` (the Stein gain from the moments), :meth:`attention_prefix` and
    :meth:`jax_attention` (the weights divided by their sum or by ``L``) and :meth:`finite_mse`
    (an i.i.d. mean or the delta method) follow; a kernel overrides the last four where it has a
    closed form or its own evaluation.
    """

    name: str
    normalised: bool
    smoothness: str

    def __init_subclass__(cls, abstract=False, **kwargs):
        """Make the subclass a frozen dataclass and register it in :data:`KERNELS` (class doc)."""
        super().__init_subclass__(**kwargs)
        annotated = sorted(set(_DECLARED) & set(cls.__dict__.get("__annotations__", {})))
        if annotated:
            raise TypeError(f"kernel class {cls.__qualname__}: {annotated} must be plain class attributes (no "
                            "annotation: an annotated attribute is a constructor parameter)")
        dataclasses.dataclass(frozen=True)(cls)
        if not abstract:
            _check_declarations(cls)
            KERNELS[cls.name] = cls

    @abc.abstractmethod
    def weight(self, s, L=None):
        """``kappa(s)``, numpy, elementwise (``L``: the prompt length, for a weight that depends on it)."""

    @abc.abstractmethod
    def jax_weight(self, s, L=None):
        """``kappa(s)`` on JAX arrays, differentiable (the weight of :meth:`jax_attention`)."""

    @abc.abstractmethod
    def expectations(self, r, L=None):
        """``(E kappa, E kappa', E kappa^2, E kappa^2 s, E kappa^2 s^2)`` for ``s ~ N(0, r^2)``, ``r`` a
        float array: arrays shaped like ``r`` (broadcast against ``L`` where the weight depends on
        it), a value beyond float64 as inf (:meth:`moments` refuses it)."""

    def moments(self, r, L=None):
        """The five moments of :meth:`expectations` at ``r`` (any array); a ``FloatOverflowError``
        where one overflows float64."""
        r = np.asarray(r, dtype=float)
        with np.errstate(over="ignore", invalid="ignore"):   # overflow is reported below
            out = self.expectations(r, L)
        if not all(np.all(np.isfinite(m)) for m in out):
            raise FloatOverflowError(f"Kernel({self.name!r}).moments: a moment at r = {np.max(r):.4g} overflows "
                                     "float64 (softmax: E e^(2 s / T) = exp(2 r^2 / T^2)); r is too large")
        return out

    def gain(self, r, L=None):
        """Scalar gain of the limit ``V Sigma a gain`` at ``r = ||a||_Sigma``: ``E kappa' / E kappa``
        (normalised) or ``E kappa'`` (:meth:`moments`), shaped like ``r``."""
        m = self.moments(r, L)
        return m[1] / m[0] if self.normalised else m[1]

    def attention_prefix(self, s, Z, Ls):
        """The attention before the read-out at every ``L in Ls`` (checked, increasing): ``(...,
        len(Ls), D)`` from the logits ``s (..., L_max)`` and tokens ``Z (..., L_max, D)``, by
        cumulating ``kappa(s) z`` and ``kappa(s)`` block by block (cost O(L_max)), divided by the
        sum of the weights (normalised) or by ``L``."""
        w = self.weight(s)
        out, num, den = [], 0.0, 0.0
        for lo, hi in zip(np.concatenate([[0], Ls[:-1]]), Ls):
            num = num + weighted_sum(w[..., lo:hi], Z[..., lo:hi, :])
            den = den + w[..., lo:hi].sum(axis=-1)
            out.append(_reduce_sums(self, num, den, hi))
        return np.stack(out, axis=-2)

    def jax_attention(self, A, Z, G):
        """JAX attention of the rows ``a`` of ``A (H, m, D)`` (``a = U x``) over the tokens ``Z (L, D)``:
        ``(H, m, D)``, the weights :meth:`jax_weight` of the logits divided by their sum (normalised)
        or by ``L``. ``G = Z^T Z / L`` (for kernels that attend through it)."""
        S = _jax_logits(A, Z)
        W = self.jax_weight(S, Z.shape[0])
        W = W / (W.sum(axis=-1, keepdims=True) if self.normalised else Z.shape[0])
        return W @ Z

    def finite_mse(self, r, L, tr_Sigma, B):
        """``E||f_L - f_inf||^2`` (``V = I``) on ``N(0, Sigma)`` tokens from ``r = ||a||_Sigma > 0``,
        ``tr Sigma`` and ``B = |Sigma a|^2`` (arrays that broadcast): exact for an unnormalised
        kernel (an i.i.d. mean: variance / L), the delta-method constant / L for a normalised one
        (:func:`kernel_mse`)."""
        k0, k1, k2, k2s, k2ss = self.moments(r)
        r2 = r**2
        second = _second_moment(k2, k2ss, tr_Sigma, B, r2)
        if not self.normalised:
            return (second - B * k1**2) / L
        g = k1 / k0
        return (second - 2 * g * B * k2s / r2 + g**2 * B * k2) / k0**2 / L


def _second_moment(k2, k2ss, tr_Sigma, B, r2):
    """``E kappa^2 |z|^2 = E kappa^2 tr Sigma + (B / r^2)(E kappa^2 s^2 / r^2 - E kappa^2)``
    (``z = Sigma a s / r^2 + z_perp``, ``z_perp`` independent of ``s``)."""
    return k2 * tr_Sigma + B / r2 * (k2ss / r2 - k2)


def _reduce_sums(kernel, num, den, L):
    """Normalised (``num / den``; 0 where no weight is positive: every ReLU logit <= 0, probability
    ``2^-L``) or the ``(1/L)``-mean."""
    if kernel.normalised:
        den = den[..., None]
        return np.where(den > 0, num / np.where(den > 0, den, 1.0), 0.0)
    return num / L


def quadrature_moments(kappa, kappa_prime, r, points):
    """The five moments of :meth:`Kernel.expectations` of a weight without a closed form:
    ``(E kappa, E kappa', E kappa^2, E kappa^2 s, E kappa^2 s^2)`` for ``s ~ N(0, r^2)``, arrays
    shaped like ``r``, by :func:`sfxlin.quadrature.graded_normal_rule` around ``points`` (the values
    of ``s`` where ``kappa`` changes on the unit scale, shape ``(P,)``). ``kappa`` and ``kappa_prime``
    (its derivative) are numpy functions; ``E kappa^2 s = 2 r^2 E kappa kappa'`` (Stein: no
    cancellation for a positive increasing weight)."""
    r = np.asarray(r, dtype=float)
    s, w = graded_normal_rule(r, np.asarray(points, dtype=float))
    k, dk = kappa(s), kappa_prime(s)
    return (np.sum(w * k, -1), np.sum(w * dk, -1), np.sum(w * k**2, -1), 2 * r**2 * np.sum(w * k * dk, -1),
            np.sum(w * k**2 * s**2, -1))


# ------------------------------------------------------------------ the kernels
class Softmax(Kernel):
    """``kappa(s) = exp(s / T)``, normalised: softmax at the temperature ``T`` (``T = sqrt(D)`` is the
    usual ``1/sqrt(d)`` scaling); gain ``1/T``; evaluated by the online softmax (stable)."""

    name = "softmax"
    normalised = True
    smoothness = "smooth"
    temperature: float = 1.0

    def __post_init__(self):
        if not (np.isfinite(self.temperature) and self.temperature > 0):
            raise ValueError(f"temperature must be finite and > 0, got {self.temperature!r}")

    def weight(self, s, L=None):
        """``exp(s / T)``."""
        return np.exp(s / self.temperature)

    def jax_weight(self, s, L=None):
        """``exp(s / T)`` (JAX)."""
        return _jax()[1].exp(s / self.temperature)

    def expectations(self, r, L=None):
        """``E e^{cs} s^j``, ``c = 1/T``: closed forms of the Gaussian moment generating function."""
        c, r2 = 1.0 / self.temperature, r**2
        e1, e2 = np.exp(c**2 * r2 / 2), np.exp(2 * c**2 * r2)
        return (e1, c * e1, e2, 2 * c * r2 * e2, (r2 + 4 * c**2 * r2**2) * e2)

    def gain(self, r, L=None):
        """``1/T`` at every ``r``."""
        r = np.asarray(r, dtype=float)
        return np.full(r.shape, 1.0 / self.temperature)

    def attention_prefix(self, s, Z, Ls):
        """The online softmax of ``s / T`` (:func:`sfxlin.attention.online_softmax_prefix`)."""
        return online_softmax_prefix(s / self.temperature, Z, Ls)

    def jax_attention(self, A, Z, G):
        """``softmax(s / T) @ Z`` (the maximum logit subtracted)."""
        jax = _jax()[0]
        return jax.nn.softmax(_jax_logits(A, Z) / self.temperature, axis=-1) @ Z


def _check_sigmoid_r(r):
    if np.any(r > SIGMOID_R_MAX):
        raise ValueError(f"r: the sigmoid moments are computed for r = ||a||_Sigma <= {SIGMOID_R_MAX:g}, got "
                         f"max {np.max(r):.4g}")


def _check_L(L, what):
    """A prompt length ``L >= 1`` (array) for ``what``; ``ValueError`` naming ``L`` otherwise."""
    if L is None or np.any(np.asarray(L) < 1):
        raise ValueError(f"L: {what} needs a prompt length >= 1, got {L}")


def _sigmoid_moments(r, b):
    """The five moments for ``kappa(s) = sigma(s + b)`` by :func:`sfxlin.quadrature.graded_normal_rule`
    around the transition ``s = -b``. Every integrand is positive (no cancellation): ``sigma' =
    sigma(u) sigma(-u)`` in log space, and ``E kappa^2 s = r^2 E (kappa^2)' = 2 r^2 E sigma(u)^2
    sigma(-u)`` (Stein), ``u = s + b``."""
    s, w = graded_normal_rule(r, -b[..., None])
    u = s + b[..., None]
    log_k, log_1mk = -np.logaddexp(0.0, -u), -np.logaddexp(0.0, u)   # log sigma(u), log sigma(-u)
    r = np.broadcast_to(r, s.shape[:-1])
    return (np.sum(w * np.exp(log_k), -1), np.sum(w * np.exp(log_k + log_1mk), -1),
            np.sum(w * np.exp(2 * log_k), -1), 2 * r**2 * np.sum(w * np.exp(2 * log_k + log_1mk), -1),
            np.sum(w * np.exp(2 * log_k) * s**2, -1))


class Sigmoid(Kernel):
    """``kappa(s) = sigma(s + b)``, the ``(1/L)``-mean; gain ``E sigma'(s + b)`` by the graded rule
    (to rounding for ``r <= SIGMOID_R_MAX``, ``|b| <= SIGMOID_BIAS_MAX``)."""

    name = "sigmoid"
    normalised = False
    smoothness = "smooth"
    bias: float = 0.0

    def __post_init__(self):
        if not np.isfinite(self.bias):
            raise ValueError(f"bias must be finite, got {self.bias!r}")
        if abs(self.bias) > SIGMOID_BIAS_MAX:
            raise ValueError(f"bias: the sigmoid kernel accepts |bias| <= {SIGMOID_BIAS_MAX:g} (beyond, its moments "
                             f"leave the float64 range), got {self.bias!r}")

    def weight(self, s, L=None):
        """``sigma(s + b)``."""
        return _sigmoid(s + self.bias)

    def jax_weight(self, s, L=None):
        """``sigma(s + b)`` (JAX)."""
        return _jax()[0].nn.sigmoid(s + self.bias)

    def expectations(self, r, L=None):
        """The graded rule around ``s = -b`` (:func:`_sigmoid_moments`); ``ValueError`` for ``r > SIGMOID_R_MAX``."""
        _check_sigmoid_r(r)
        return _sigmoid_moments(r, np.asarray(self.bias))


class SigmoidLogL(Kernel):
    """``kappa(s) = sigma(s - log L)``, summed over the tokens (not divided by ``L``): tends to the
    unnormalised softmax numerator ``exp(r^2 / 2) Sigma a`` (module doc)."""

    name = "sigmoid_logL"
    normalised = False
    smoothness = "smooth"

    def weight(self, s, L=None):
        """``sigma(s - log L)`` (``L`` needed)."""
        _check_L(L, "the sigmoid_logL weight sigma(s - log L)")
        return _sigmoid(s - np.log(L))

    def jax_weight(self, s, L=None):
        """``sigma(s - log L)`` (JAX; ``L`` needed)."""
        _check_L(L, "the sigmoid_logL weight sigma(s - log L)")
        jax, jnp = _jax()
        return jax.nn.sigmoid(s - jnp.log(L))

    def expectations(self, r, L=None):
        """The sigmoid's graded rule at the bias ``-log L`` (``r`` and ``L`` broadcast); ``ValueError``
        for ``r > SIGMOID_R_MAX`` or ``log L > SIGMOID_BIAS_MAX``."""
        _check_sigmoid_r(r)
        _check_L(L, "the sigmoid_logL moments")
        b = -np.log(np.asarray(L, dtype=float))
        if np.any(-b > SIGMOID_BIAS_MAX):
            raise ValueError(f"L: sigmoid_logL accepts log L <= {SIGMOID_BIAS_MAX:g}, got L = {np.max(L):.4g}")
        return _sigmoid_moments(r, b)

    def gain(self, r, L=None):
        """``exp(r^2 / 2)`` (``L = None``: the limit) or ``L E sigma'(s - log L)`` (the exact mean at
        prompt length ``L``)."""
        r = np.asarray(r, dtype=float)
        if L is None:
            with np.errstate(over="ignore"):
                limit = np.exp(r**2 / 2)
            if not np.all(np.isfinite(limit)):
                raise FloatOverflowError(f"Kernel('sigmoid_logL').gain: exp(r^2 / 2) overflows float64 at r = "
                                         f"{np.max(r):.4g}; r is too large")
            return limit
        return L * self.moments(r, L)[1]

    def attention_prefix(self, s, Z, Ls):
        """``sum_k sigma(s_k - log L) z_k`` at every ``L`` (the weights depend on ``L``: cost O(sum L))."""
        return np.stack([weighted_sum(self.weight(s[..., :L], L), Z[..., :L, :]) for L in Ls], axis=-2)

    def jax_attention(self, A, Z, G):
        """``sum_k sigma(s_k - log L) z_k`` (JAX)."""
        return self.jax_weight(_jax_logits(A, Z), Z.shape[0]) @ Z

    def finite_mse(self, r, L, tr_Sigma, B):
        """Exact: the squared bias ``|L E sigma'(s - log L) - e^{r^2/2}|^2 B`` plus the variance of the sum."""
        k0, k1, k2, k2s, k2ss = self.moments(*np.broadcast_arrays(r, L))
        r2 = r**2
        second = _second_moment(k2, k2ss, tr_Sigma, B, r2)
        return (L * k1 - np.exp(r2 / 2)) ** 2 * B + L * (second - B * k1**2)


class _ReLUPower(Kernel, abstract=True):
    """``kappa(s) = max(s, 0)^p`` (class attribute ``power = p``): Gaussian half-moments in closed
    form, ``E max(s, 0)^p = r^p 2^(p/2) Gamma((p+1)/2) / (2 sqrt pi)``."""

    def weight(self, s, L=None):
        """``max(s, 0)^p``."""
        return np.maximum(s, 0.0) ** self.power

    def jax_weight(self, s, L=None):
        """``relu(s)^p`` (JAX)."""
        return _jax()[0].nn.relu(s) ** self.power

    def expectations(self, r, L=None):
        """Half-moments: ``E k = h_p``, ``E k' = p h_(p-1)``, ``E k^2 s^j = h_(2p+j)``."""
        p = self.power
        return (_half_moment(p, r), p * _half_moment(p - 1, r), _half_moment(2 * p, r), _half_moment(2 * p + 1, r),
                _half_moment(2 * p + 2, r))

    def gain(self, r, L=None):
        """``p h_(p-1) [/ h_p]``: ``1/2``, ``r sqrt(2/pi)`` (unnormalised), ``sqrt(pi/2) / r``,
        ``2 sqrt(2/pi) / r`` (normalised, which need ``r > 0``)."""
        r = np.asarray(r, dtype=float)
        if self.normalised and np.any(r <= 0):
            raise ValueError(f"r: the normalised ReLU gains are c / r and need r = ||a||_Sigma > 0, got {r}")
        p = self.power
        with np.errstate(over="ignore"):
            m1, m0 = p * _half_moment(p - 1, r), _half_moment(p, r)
        if not (np.all(np.isfinite(m0)) and np.all(np.isfinite(m1))):
            raise FloatOverflowError(f"Kernel({self.name!r}).gain: E max(s, 0)^{p} overflows float64 at r = "
                                     f"{np.max(r):.4g}; r is too large")
        return m1 / m0 if self.normalised else m1


class ReLU(_ReLUPower):
    """``max(s, 0)``, the ``(1/L)``-mean; gain ``1/2``."""

    name = "relu"
    normalised = False
    smoothness = "kinked"
    power = 1


class ReLUNorm(_ReLUPower):
    """``max(s, 0)``, normalised (0 when no logit is positive); gain ``sqrt(pi/2) / r``."""

    name = "relu_norm"
    normalised = True
    smoothness = "kinked"
    power = 1


class ReLU2(_ReLUPower):
    """``max(s, 0)^2``, the ``(1/L)``-mean; gain ``r sqrt(2/pi)``."""

    name = "relu2"
    normalised = False
    smoothness = "kinked"
    power = 2


class ReLU2Norm(_ReLUPower):
    """``max(s, 0)^2``, normalised; gain ``2 sqrt(2/pi) / r``."""

    name = "relu2_norm"
    normalised = True
    smoothness = "kinked"
    power = 2


class Linear(Kernel):
    """``kappa(s) = s``, the ``(1/L)``-mean: linear attention ``Ghat_L a`` (the limit every other kernel
    is compared with); gain 1. The JAX attention is computed as ``Ghat_L a`` (cost ``O(L D^2)``)."""

    name = "linear"
    normalised = False
    smoothness = "smooth"

    def weight(self, s, L=None):
        """``s``."""
        return np.asarray(s)

    def jax_weight(self, s, L=None):
        """``s`` (JAX)."""
        return s

    def expectations(self, r, L=None):
        """``E s = 0``, ``E 1 = 1``, ``E s^2 = r^2``, ``E s^3 = 0``, ``E s^4 = 3 r^4``."""
        return np.zeros_like(r), np.ones_like(r), r**2, np.zeros_like(r), 3 * r**4

    def jax_attention(self, A, Z, G):
        """``Ghat_L a`` (``G = Ghat_L`` symmetric)."""
        return _jax()[1].einsum("hmi,ij->hmj", A, G)


#: the kernels of the Stein study (docs/kernels.md, the part ``stein`` of ``c1_kernels``): every
#: kernel defined in this module but linear attention, the limit they are compared with
KERNEL_NAMES = tuple(name for name in KERNELS if name != Linear.name)


def as_kernel(kernel):
    """``kernel`` itself if it is a :class:`Kernel`, else the kernel registered under that name with
    its default parameters (``Kernel(name)``); ``ValueError`` otherwise."""
    if isinstance(kernel, Kernel):
        return kernel
    if isinstance(kernel, str):
        return Kernel(kernel)
    raise ValueError(f"kernel must be a sfxlin.kernels.Kernel or the name of one of {tuple(KERNELS)}, got "
                     f"{type(kernel).__name__}")


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

    Logits are computed once, then evaluated by the kernel's :meth:`Kernel.attention_prefix`:
    softmax by the online softmax of :func:`sfxlin.attention.online_softmax_prefix`; the other
    kernels cumulate ``kappa(s) z`` and ``kappa(s)`` block by block (cost O(L_max)), but for
    ``sigmoid_logL`` whose weights depend on ``L`` (cost O(sum L)). ``Z (..., L_max, D)``,
    ``q (..., D)`` -> ``(..., len(Ls), D_out)``.
    """
    kernel = _check_kernel(kernel)
    Z, U, V, q = check_operands(Z, U, V, q, check_Z=False)
    Ls = check_prompt_lengths(Ls, Z.shape[-2])
    Z = finite_array(Z[..., : Ls[-1], :], "Z")
    with np.errstate(over="ignore", invalid="ignore"):  # overflow is reported below
        a = q @ U.T
        s = (Z @ a[..., None])[..., 0]
    if not np.all(np.isfinite(s)):
        raise FloatOverflowError("kernel_attention_prefix: the logits z_k^T U q overflow float64; Z, U and q are "
                                 "too large together")
    return read_out(kernel.attention_prefix(s, Z, Ls), V, "kernel_attention_prefix")


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
    U, V, q = check_UVq(S.shape[0], U, V, q, "Sigma")
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

    By :meth:`Kernel.finite_mse`: exact for the unnormalised kernels (an i.i.d. mean: variance / L)
    and for ``sigmoid_logL`` (squared bias ``|L E sigma'(s - log L) - e^{r^2/2}|^2 |Sigma a|^2`` plus
    the variance of the sum); the delta-method (self-normalised importance sampling) constant over
    ``L`` for the normalised ones, sharp as ``L -> inf``. With ``z = Sigma a s / r^2 + z_perp``
    (``z_perp`` independent of ``s``): ``E kappa^2 |z|^2 = E kappa^2 tr Sigma + (|Sigma a|^2 / r^2)
    (E kappa^2 s^2 / r^2 - E kappa^2)``.
    """
    kernel = _check_kernel(kernel)
    S, _, a, Sa, r = _law_operands(Sigma, U, np.eye(np.shape(U)[0]), q)
    L = finite_array(L, "L")
    if np.any(L < 1):
        raise ValueError(f"L must be >= 1, got {L}")
    if np.any(r <= 0):
        raise ValueError("q: kernel_mse needs a = U q != 0 (r = ||a||_Sigma > 0)")
    return kernel.finite_mse(r, L, np.trace(S), np.sum(Sa**2, axis=-1))


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
    Z, U, V, q = check_operands(Z, U, V, q, check_Z=False)
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
    return read_out(online_softmax_prefix(s, Z, Ls), V, "rf_attention_prefix")


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
    lead = np.broadcast_shapes(t.shape[:-1], W.shape[:-2])
    tilted = online_softmax_prefix(np.broadcast_to(t, lead + t.shape[-1:]), W, np.array([W.shape[-2]]))
    return tilted[..., 0, :] @ M.T @ V.T


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


def stein_identity_error(kernel, Sigma, a, n_nodes, L=16):
    """How far ``kernel`` is from Stein's identity ``E[kappa(s) z] = Sigma a E kappa'(s)``, ``z ~ N(0, Sigma)``,
    ``s = z.a``: ``max_i |lhs_i - rhs_i| / |rhs_i|`` over the rows ``a_i`` of ``a`` ``(n, D)``, the left side by
    a tensor Gauss-Hermite rule of ``n_nodes`` nodes per dimension on ``N(0, Sigma)`` (no use of the identity),
    the right side by :meth:`Kernel.moments` (closed form or 1-D quadrature); ``L`` for a kernel whose weight
    depends on it. A float."""
    D = Sigma.shape[0]
    x, w = hermegauss(n_nodes)
    nodes = np.stack(np.meshgrid(*[x] * D, indexing="ij"), -1).reshape(-1, D) @ np.linalg.cholesky(Sigma).T
    weights = np.prod(np.stack(np.meshgrid(*[w / math.sqrt(2 * math.pi)] * D, indexing="ij"), -1).reshape(-1, D),
                      axis=-1)
    s = nodes @ a.T                                              # (nodes, n)
    lhs = np.einsum("n,nq,nd->qd", weights, kernel.weight(s, L), nodes)
    r = np.sqrt(np.einsum("qd,de,qe->q", a, Sigma, a))
    rhs = (a @ Sigma) * kernel.moments(r, L)[1][:, None]        # E kappa'(s)
    return np.max(np.linalg.norm(lhs - rhs, axis=-1) / np.linalg.norm(rhs, axis=-1))
