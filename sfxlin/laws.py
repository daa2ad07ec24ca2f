"""Token laws: samplers and exact tilted means (gradients of cumulant generating functions).

Every law ``mu`` on ``R^D`` is a subclass of :class:`Law`, which declares what a law provides:

* ``name`` (the law's key in :data:`LAWS`), ``has_limit``, ``D``;
* ``mean`` (D,) and ``cov`` (D x D), the first two moments (``cov`` defines the matching
  Gaussian);
* ``sample(rng, shape)`` -> array of shape ``shape + (D,)``: i.i.d. tokens, unless the law's
  ``iid`` is False (:class:`GaussianAR1`): then tokens are dependent along the last axis of
  ``shape``, the prompt axis;
* ``tilted_mean(a)`` = ``E_mu[e^{a.z} z] / E_mu[e^{a.z}]`` = ``grad K_mu(a)``, vectorised over
  the leading axes of ``a`` (shape ``(..., D)``). This is the exact infinite-prompt read-out
  of softmax attention with logit vector ``a = U q`` (docs/models.md, section 1);
* ``snis_covariance(a)``: ``lim_L L Cov(f_L)`` (the sharp finite-L constant, delta method; for
  dependent tokens the long-run sum over lags);
* ``isotropic(D, sigma)``: the law on ``R^D`` with covariance ``sigma^2 I_D`` (the laws of C1);
* ``with_moments(Sigma, mean)``: the law with covariance ``Sigma`` (and mean, where the law has
  one), the covariate law of the in-context tasks (C2, C3); ``spec_option`` names the one option
  a spec ``"name:VALUE"`` sets.

Adding a law is a subclass of :class:`Law` with a ``name``: it is registered in :data:`LAWS`
when the class is defined, :func:`law_from_name` builds it, and :func:`covariate_law` builds it
from a spec string (``"gaussian"``, ``"student_t:5"``, ``"empirical:FILE.npy"``) and a covariance:
the one way every in-context experiment names its covariates.

Validation errors are ``ValueError`` naming the offending argument (``TypeError`` for
non-numeric input). A result that is finite in exact arithmetic but beyond the float64 range
raises :class:`FloatOverflowError` (a ``ValueError``), never returns inf or NaN.
"""
from __future__ import annotations

import abc
import threading

import numpy as np

from .softmax_core import normalised, prefix_moments
from .validation import component_covariances, finite_array, registry_name

__all__ = ["Law", "LAWS", "Gaussian", "Rademacher", "Uniform", "StudentT", "GaussianMixture", "Empirical", "GaussianAR1",
           "NoLimitError", "FloatOverflowError", "law_from_name", "covariate_law"]

SQRT3 = np.sqrt(3.0)


_BUILD_LOCK = threading.RLock()
"""Held while a lazily built value of a law is made (:func:`_built`): a law is shared by the cells
that run on threads, and a value one of them is building must not be seen half-built by another."""


def _built(law, attr, build):
    """The lazily built value ``law.<attr>`` (``None`` until built): made once by ``build()`` under
    :data:`_BUILD_LOCK`, then published in one assignment, so that every thread sees either nothing
    or the whole value, and all of them the same object. ``build`` returns it complete (its arrays
    read-only: cells share it)."""
    value = getattr(law, attr)
    if value is None:
        with _BUILD_LOCK:
            value = getattr(law, attr)
            if value is None:
                value = build()
                setattr(law, attr, value)
    return value


def _read_only(array):
    array.flags.writeable = False
    return array


class NoLimitError(ValueError):
    """The infinite-prompt limit does not exist (no exponential moments)."""


class FloatOverflowError(ValueError, FloatingPointError):
    """A result exceeds the float64 range although the inputs are finite (an argument's scale is
    too large). A ``ValueError`` for callers, and a ``FloatingPointError`` so that the sweep engine
    reports it with the cell's label."""


def _check_D(D):
    if isinstance(D, bool) or not isinstance(D, (int, np.integer)) or D < 1:
        raise ValueError(f"D must be an integer >= 1, got {D!r}")
    return int(D)


def _scale_matrix(scale, D, name="scale"):
    """Scalar, vector (diagonal) or square matrix -> D x D matrix ``S``."""
    S = finite_array(scale, name)
    if S.ndim == 0:
        return S * np.eye(D)
    if S.ndim == 1:
        if S.shape[0] != D:
            raise ValueError(f"{name} has length {S.shape[0]}, expected D = {D}")
        return np.diag(S)
    if S.ndim == 2 and S.shape == (D, D):
        return S
    raise ValueError(f"{name} must be a scalar, a length-{D} vector or a {D}x{D} matrix, got shape {S.shape}")


def _apply_scale(r, S):
    """``r @ S.T``, by broadcasting when ``S`` is diagonal."""
    if np.array_equal(S, np.diag(np.diag(S))):
        return r * np.diag(S)
    return r @ S.T


def _check_a(a, D):
    a = finite_array(a, "a")
    if a.ndim == 0 or a.shape[-1] != D:
        raise ValueError(f"a must have trailing dimension D = {D}, got shape {a.shape}")
    return a


def _check_shape(shape):
    shape = (shape,) if np.isscalar(shape) else tuple(shape)
    if any(isinstance(s, (bool, np.bool_)) or (not isinstance(s, (int, np.integer))) or s < 0 for s in shape):
        raise ValueError(f"shape must be non-negative integers, got {shape}")
    return shape


LAWS: dict[str, type] = {}
"""Every concrete :class:`Law` subclass by its ``name``, filled when the class is defined."""


class Law(abc.ABC):
    """A token law ``mu`` on ``R^D``: the interface every law provides.

    A concrete subclass sets the class attribute ``name`` (a new, non-empty string) and
    implements every abstract member below; it is then registered in :data:`LAWS` under
    ``name`` when the class statement runs, and a missing or duplicate ``name``, or a member left
    abstract, is refused there with a ``TypeError``. An intermediate class that is not a law by
    itself is declared with ``class Base(Law, abstract=True)`` and is not registered. The
    constructor must accept the dimension as a keyword ``D`` (checked against, or completing,
    the other arguments), which is how :func:`law_from_name` calls it.

    Attributes
    ----------
    name : str (class attribute)
        The law's key in :data:`LAWS` and for :func:`law_from_name`.
    has_limit : bool (class attribute)
        Whether ``E e^{a.z} < inf`` for every ``a``, i.e. softmax attention has an
        infinite-prompt limit; ``False`` means :meth:`tilted_mean` and :meth:`snis_covariance`
        raise :class:`NoLimitError`.
    D : int
        Dimension of the tokens.
    spec_option : (str, type) or None (class attribute)
        The keyword of :meth:`with_moments` (or, for a law without it, of :meth:`isotropic`) that
        the value of a spec ``"name:VALUE"`` sets, and the type it is read as (``("df", float)``
        for ``"student_t:5"``, ``("rho", float)`` for ``"ar1:0.5"``); ``None`` (default): the spec
        is the bare name.
    iid : bool (class attribute)
        Whether :meth:`sample` draws i.i.d. tokens (default ``True``). ``False``: the tokens are
        dependent along the last axis of ``shape`` (the prompt axis, ``-2`` of the draw ``(..., L,
        D)``), which is then the prompt length, and :meth:`snis_covariance` is the long-run constant
        of that dependent sequence.
    """

    name: str
    has_limit: bool = True
    spec_option: tuple | None = None
    iid: bool = True
    D: int

    def __init_subclass__(cls, abstract=False, **kwargs):
        """Register a concrete subclass in :data:`LAWS` (see the class doc for the rules)."""
        super().__init_subclass__(**kwargs)
        if abstract:
            return
        name = registry_name(cls, LAWS, "law", "LAWS")
        missing = sorted(attr for attr in dir(cls) if getattr(getattr(cls, attr, None), "__isabstractmethod__", False))
        if missing:
            raise TypeError(f"law class {cls.__qualname__} does not implement {missing} (declared by Law)")
        LAWS[name] = cls

    def __repr__(self):
        return f"{type(self).__name__}(D={self.D})"

    @property
    @abc.abstractmethod
    def mean(self):
        """Mean ``E z``, shape ``(D,)`` (zeros for the symmetric laws)."""

    @property
    @abc.abstractmethod
    def cov(self):
        """Covariance ``Cov(z)``, shape ``(D, D)``; ``ValueError`` if it is infinite."""

    @abc.abstractmethod
    def sample(self, rng, shape=()):
        """``shape + (D,)`` i.i.d. tokens drawn from the ``np.random.Generator`` ``rng`` (each law
        documents its draw order: the same ``rng`` state gives the same tokens); a law whose ``iid``
        is False draws sequences along the last axis of ``shape`` instead."""

    @abc.abstractmethod
    def tilted_mean(self, a):
        """``E[e^{a.z} z] / E[e^{a.z}] = grad K_mu(a)`` for ``a`` of shape ``(..., D)``, same shape
        out: the infinite-prompt limit of softmax attention at logits ``a = U q``. Raises
        :class:`NoLimitError` when the limit does not exist (``has_limit`` is False)."""

    @abc.abstractmethod
    def snis_covariance(self, a):
        """``lim_L L Cov(f_L)`` at ``a`` (shape ``(..., D)``), shape ``(..., D, D)``: the delta method
        for self-normalised importance sampling, ``E[w^2 (z - m_a)(z - m_a)^T] / (E w)^2`` with
        ``w = e^{a.z}``, ``m_a = tilted_mean(a)`` for i.i.d. tokens; for dependent tokens (``iid``
        False) the sum over lags ``h`` of ``E[psi(z_0) psi(z_h)^T]``, ``psi(z) = w (z - m_a) / E w``.
        Raises :class:`NoLimitError` like :meth:`tilted_mean`."""

    @classmethod
    @abc.abstractmethod
    def isotropic(cls, D, sigma=1.0):
        """This law on ``R^D`` with covariance ``sigma^2 I_D`` (the laws of experiment C1).
        Law-specific shape parameters are keyword arguments; a law that has no such member
        raises ``NotImplementedError`` saying why."""

    @classmethod
    def with_moments(cls, Sigma, mean=None, **options):
        """This law with covariance ``Sigma`` and mean ``mean``: the covariate law of the in-context
        tasks (C2, C3; built by :func:`covariate_law`, which passes ``Sigma`` as a finite symmetric
        ``d x d`` matrix or ``None`` and ``mean`` as a finite ``(d,)`` vector or ``None``: centred,
        and checks that the law returned has a positive-definite ``cov``). Law-specific shape
        parameters are keyword arguments (the one :attr:`spec_option` names comes from the spec).
        A law without this member keeps the default, which raises ``NotImplementedError``: it then
        serves C1 only."""
        raise NotImplementedError(f"{cls.__name__} has no member with a given covariance: it does not define the "
                                  "classmethod with_moments(Sigma, mean)")


def _check_sigma(sigma):
    """``sigma`` checked to be a finite scalar >= 0 and returned unchanged (so ``isotropic`` does the
    same float operations as the hand-built C1 laws)."""
    s = finite_array(sigma, "sigma")
    if s.ndim != 0 or not s >= 0:
        raise ValueError(f"sigma must be a scalar >= 0, got {sigma!r}")
    return sigma


def _given(Sigma, law_name):
    """``Sigma`` unchanged; ``ValueError`` if it is ``None`` (the law is built from its covariance)."""
    if Sigma is None:
        raise ValueError(f"Sigma: the {law_name} law is built from its covariance, give Sigma (a d x d matrix or "
                         "a length-d diagonal)")
    return Sigma


def _centred(mean, law_name):
    """``ValueError`` unless ``mean`` is ``None`` or zero: the law has no mean parameter."""
    if mean is not None and np.any(mean):
        raise ValueError(f"mean: the {law_name} law is centred (it has no mean parameter), got mean "
                         f"{np.asarray(mean).tolist()}")


def _symmetric_root(Sigma):
    """``Sigma^{1/2}``, the symmetric square root (eigen-decomposition; negative rounding
    eigenvalues clipped to 0), so that ``root @ root.T = Sigma``."""
    lam, Q = np.linalg.eigh(Sigma)
    return (Q * np.sqrt(np.clip(lam, 0.0, None))) @ Q.T


def _check_spread(spread):
    """``spread`` checked to be a scalar in ``[0, 1)`` and returned as a float array."""
    s = finite_array(spread, "spread")
    if s.ndim != 0 or not 0 <= s < 1:
        raise ValueError(f"spread must be a scalar in [0, 1), got {spread!r}")
    return s


class Gaussian(Law):
    """``N(mean, cov)`` on ``R^D``; Lemma 2.1: ``tilted_mean(a) = mean + cov a``.

    ``cov`` may be a scalar (times identity, needs ``D``), a vector (diagonal) or a symmetric
    positive semi-definite matrix.
    """

    name = "gaussian"

    def __init__(self, mean=None, cov=1.0, D=None):
        if D is not None:
            D = _check_D(D)
        if mean is None:
            if D is None:
                c = finite_array(cov, "cov")
                if c.ndim == 0:
                    raise ValueError("Gaussian needs mean, D, or a vector/matrix cov to know D")
                D = c.shape[0]
            mean = np.zeros(D)
        self._mean = finite_array(mean, "mean")
        if self._mean.ndim != 1 or self._mean.shape[0] < 1:
            raise ValueError(f"mean must be a non-empty vector, got shape {self._mean.shape}")
        self.D = self._mean.shape[0]
        if D is not None and D != self.D:
            raise ValueError(f"D = {D} does not match len(mean) = {self.D}")
        cov = finite_array(cov, "cov")
        if cov.ndim == 0:
            cov = cov * np.eye(self.D)
        elif cov.ndim == 1:
            if cov.shape[0] != self.D:
                raise ValueError(f"cov has length {cov.shape[0]}, expected D = {self.D}")
            cov = np.diag(cov)
        if cov.shape != (self.D, self.D):
            raise ValueError(f"cov must be {self.D}x{self.D}, got shape {cov.shape}")
        if not np.allclose(cov, cov.T, rtol=1e-12, atol=1e-12 * max(1.0, np.abs(cov).max())):
            raise ValueError("cov must be symmetric")
        cov = 0.5 * (cov + cov.T)
        eigval, eigvec = np.linalg.eigh(cov)
        if eigval.min() < -1e-10 * max(1.0, eigval.max()):
            raise ValueError(f"cov must be positive semi-definite (smallest eigenvalue {eigval.min():.3g})")
        self._cov = cov
        # eigenvalues at rounding level are zero: samples stay exactly in the range of cov
        eigval = np.where(eigval <= self.D * np.finfo(float).eps * max(eigval.max(), 0.0), 0.0, eigval)
        self._root = eigvec * np.sqrt(eigval)  # cov = root @ root.T
        self._std = np.sqrt(np.diag(cov)) if np.array_equal(cov, np.diag(np.diag(cov))) else None
        self._unit = self._std is not None and bool(np.all(self._std == 1.0))   # x * 1.0 is x, bit for bit

    @classmethod
    def isotropic(cls, D, sigma=1.0):
        """``N(0, sigma^2 I_D)``."""
        return cls(cov=_check_sigma(sigma) ** 2, D=D)

    @classmethod
    def with_moments(cls, Sigma, mean=None):
        """``N(mean, Sigma)`` (``mean = None``: centred)."""
        return cls(mean=mean, cov=_given(Sigma, cls.name))

    @property
    def mean(self):
        """The ``mean`` argument, shape ``(D,)``."""
        return self._mean

    @property
    def cov(self):
        """The ``cov`` argument as a symmetric ``D x D`` matrix."""
        return self._cov

    def __repr__(self):
        return f"Gaussian(D={self.D}, trace(cov)={np.trace(self.cov):.4g})"

    def sample(self, rng, shape=()):
        shape = _check_shape(shape)
        g = rng.standard_normal(shape + (self.D,))
        if self._std is None:
            g = g @ self._root.T
        elif not self._unit:   # diagonal covariance: no matmul (and no product by a unit std)
            g *= self._std
        g += self.mean         # in place: the bits of mean + g, without a temporary
        return g

    def tilted_mean(self, a):
        a = _check_a(a, self.D)
        with np.errstate(over="ignore", invalid="ignore"):
            out = self.mean + a @ self.cov
        if not np.all(np.isfinite(out)):
            raise FloatOverflowError(f"tilted_mean = mean + cov a overflows float64: a (max |a| = "
                                     f"{np.abs(a).max():.3g}) is too large for this cov")
        return out

    def snis_covariance(self, a):
        """``lim_L L Cov(f_L(q))`` for ``V = I``: self-normalised importance sampling, delta method.

        ``f_L`` is a ratio of empirical means of ``w z`` and ``w``, ``w = e^{a.z}``; the delta
        method gives ``E[w^2 (z - m_a)(z - m_a)^T] / (E w)^2``, which for ``N(m, Sigma)`` is
        ``exp(a^T Sigma a) (Sigma + Sigma a a^T Sigma)`` (docs/models.md, section 1).
        """
        a = _check_a(a, self.D)
        with np.errstate(over="ignore", invalid="ignore"):
            Sa = a @ self.cov
            quad = np.sum(a * Sa, axis=-1)
            C = np.exp(quad)[..., None, None] * (self.cov + Sa[..., :, None] * Sa[..., None, :])
        if not np.all(np.isfinite(C)):  # exp(a^T cov a) > 1.8e308: inf, and inf * 0 = NaN off the support
            raise FloatOverflowError(f"snis_covariance overflows float64: a^T cov a reaches {np.nanmax(quad):.4g} "
                                     f"(exp overflows beyond ~709); a is too large for this cov")
        return C


class _ProductLaw(Law, abstract=True):
    """``z = S r`` with i.i.d. coordinates ``r_i`` of a one-dimensional law of unit variance.

    Subclasses give per-coordinate ``_log_mgf(b) = log E e^{b r}``, ``_mean(b)`` (its
    derivative, the tilted mean), ``_var(b)`` (the tilted variance) and
    ``_log_rho(b) = _log_mgf(2b) - 2 _log_mgf(b)`` in a form without the cancellation of the two
    terms (both grow like ``|b|``; their difference like ``log |b|`` at most); everything else follows:
    ``tilted_mean(a) = S mean(S^T a)`` and the SNIS constant :meth:`snis_covariance`.
    """

    def __init__(self, scale=1.0, D=None):
        s = finite_array(scale, "scale")
        if D is None:
            if s.ndim == 0:
                raise ValueError(f"{type(self).__name__} with a scalar scale needs D")
            D = s.shape[0]
        self.D = _check_D(D)
        self.S = _scale_matrix(scale, self.D)
        self._cov = self.S @ self.S.T

    @classmethod
    def isotropic(cls, D, sigma=1.0):
        """Scale ``S = sigma I_D``: covariance ``sigma^2 I_D`` (the coordinates have unit variance)."""
        return cls(_check_sigma(sigma), D=D)

    @classmethod
    def with_moments(cls, Sigma, mean=None):
        """Scale ``S = Sigma^{1/2}``, the symmetric square root: covariance ``Sigma``, centred (a
        non-zero ``mean`` is refused: the law has none)."""
        _centred(mean, cls.name)
        return cls(scale=_symmetric_root(_given(Sigma, cls.name)))

    @property
    def mean(self):
        """Zero: the coordinates are symmetric."""
        return np.zeros(self.D)

    @property
    def cov(self):
        """``S S^T``."""
        return self._cov

    @staticmethod
    @abc.abstractmethod
    def _log_mgf(b):
        """``log E e^{b r}`` per coordinate."""

    @staticmethod
    @abc.abstractmethod
    def _mean(b):
        """``d/db log E e^{b r}``, the one-dimensional tilted mean."""

    @staticmethod
    @abc.abstractmethod
    def _var(b):
        """The one-dimensional tilted variance (derivative of :meth:`_mean`)."""

    @staticmethod
    @abc.abstractmethod
    def _log_rho(b):
        """``_log_mgf(2b) - 2 _log_mgf(b)`` without cancellation."""

    def tilted_mean(self, a):
        a = _check_a(a, self.D)
        with np.errstate(over="ignore", invalid="ignore"):
            out = self._mean(a @ self.S) @ self.S.T
        if not np.all(np.isfinite(out)):  # a @ S overflowing to inf - inf
            raise FloatOverflowError(f"tilted_mean overflows float64: a (max |a| = {np.abs(a).max():.3g}) "
                                     "is too large for this scale")
        return out

    def snis_covariance(self, a):
        """``lim L Cov(f_L)`` for the law's own limit (see :meth:`Gaussian.snis_covariance`).

        With ``b = S^T a``, coordinates independent: ``rho = prod_k E e^{2 b_k r} / (E e^{b_k r})^2``,
        ``c = mean(2b) - mean(b)``, ``C = rho S (diag(var(2b)) + c c^T) S^T``.
        """
        a = _check_a(a, self.D)
        with np.errstate(over="ignore", invalid="ignore"):
            b = a @ self.S
            rho = np.exp(np.sum(self._log_rho(b), axis=-1))
            c = self._mean(2 * b) - self._mean(b)
            inner = c[..., :, None] * c[..., None, :] + _diag_embed(self._var(2 * b))
            C = rho[..., None, None] * (self.S @ inner @ self.S.T)
        if not np.all(np.isfinite(C)):
            raise FloatOverflowError(f"snis_covariance overflows float64: a (max |a| = {np.abs(a).max():.3g}) "
                                     "is too large for this scale")
        return C


def _diag_embed(v):
    out = np.zeros(v.shape + (v.shape[-1],))
    idx = np.arange(v.shape[-1])
    out[..., idx, idx] = v
    return out


def _log_cosh(b):
    b = np.abs(b)
    return b + np.log1p(np.exp(-2 * b)) - np.log(2.0)


class Rademacher(_ProductLaw):
    """``z = S r`` with ``r_i = +-1`` i.i.d.; ``tilted_mean(a) = S tanh(S^T a)``.

    Bounded and sub-Gaussian but not Gaussian; covariance ``S S^T``.
    """

    name = "rademacher"

    def sample(self, rng, shape=()):
        shape = _check_shape(shape)
        n = int(np.prod(shape, dtype=np.int64)) * self.D
        bits = np.unpackbits(rng.integers(0, 256, size=(n + 7) // 8, dtype=np.uint8), count=n)
        r = (bits.astype(float) * 2.0 - 1.0).reshape(shape + (self.D,))
        return _apply_scale(r, self.S)

    _log_mgf = staticmethod(_log_cosh)
    _mean = staticmethod(np.tanh)

    @staticmethod
    def _var(b):
        """``sech(b)^2 = 4 e^{-2|b|} / (1 + e^{-2|b|})^2`` (``cosh`` would overflow beyond |b| = 710)."""
        e = np.exp(-2.0 * np.abs(b))
        return 4.0 * e / (1.0 + e) ** 2

    @staticmethod
    def _log_rho(b):
        """``log cosh(2b) - 2 log cosh(b) = log(1 + tanh(b)^2)``."""
        return np.log1p(np.tanh(b) ** 2)


def langevin(t):
    """``coth(t) - 1/t`` (0 at t = 0), relative error ~1e-16 everywhere.

    Below |t| = 2 the continued fraction ``t/(3 + t^2/(5 + t^2/(7 + ...)))`` (11 levels,
    evaluated from the inside out) avoids the cancellation of ``coth(t) - 1/t``; beyond, the
    direct formula is exact to rounding.
    """
    t = np.asarray(t, dtype=float)
    small = np.abs(t) < 2.0
    ts = np.where(small, t, 0.0)
    t2 = ts * ts
    frac = np.full_like(ts, 2.0 * 12 + 1)
    for k in range(11, 0, -1):
        frac = (2.0 * k + 1) + t2 / frac
    tl = np.where(small, 1.0, t)
    return np.where(small, ts / frac, 1.0 / np.tanh(tl) - 1.0 / tl)


def langevin_derivative(t):
    """``1/t^2 - 1/sinh(t)^2`` (1/3 at 0): a series below |t| = 0.1, the direct formula above."""
    t = np.asarray(t, dtype=float)
    small = np.abs(t) < 0.1
    ts = np.where(small, t, 0.0)
    t2 = ts * ts
    series = 1 / 3 - t2 * (1 / 15 - t2 * (2 / 189 - t2 * (1 / 675)))
    tl = np.where(small, 1.0, np.abs(t))
    direct = (1.0 / tl) ** 2 - np.where(tl > 350, 0.0, 1.0 / np.sinh(np.minimum(tl, 350)) ** 2)
    return np.where(small, series, direct)


def _log_sinhc(t):
    """``log(sinh(t) / t)``, stable at 0 (series) and for large |t|."""
    t = np.abs(np.asarray(t, dtype=float))
    small = t < 0.2
    ts = np.where(small, t, 0.0)
    t2 = ts * ts
    series = t2 * (1 / 6 - t2 * (1 / 180 - t2 * (1 / 2835 - t2 * (1 / 37800))))
    tl = np.where(small, 1.0, t)
    return np.where(small, series, tl + np.log1p(-np.exp(-2 * tl)) - np.log(2 * tl))


class Uniform(_ProductLaw):
    """``z = S u`` with ``u_i`` uniform on ``[-sqrt3, sqrt3]`` (unit variance).

    ``tilted_mean(a) = S m(S^T a)`` with ``m(b)_i = sqrt3 coth(sqrt3 b_i) - 1/b_i`` (0 at 0).
    """

    name = "uniform"

    def sample(self, rng, shape=()):
        shape = _check_shape(shape)
        return _apply_scale(rng.uniform(-SQRT3, SQRT3, size=shape + (self.D,)), self.S)

    @staticmethod
    def _log_mgf(b):
        return _log_sinhc(SQRT3 * b)

    @staticmethod
    def _mean(b):
        return SQRT3 * langevin(SQRT3 * b)

    @staticmethod
    def _var(b):
        return 3.0 * langevin_derivative(SQRT3 * b)

    @staticmethod
    def _log_rho(b):
        """``log sinhc(2t) - 2 log sinhc(t) = log(t coth t) = log1p(t langevin(t))``, ``t = sqrt3 b``."""
        t = SQRT3 * np.asarray(b, dtype=float)
        return np.log1p(t * langevin(t))


class StudentT(Law):
    """Multivariate Student-t: ``z = S g / sqrt(W / df)``, ``g ~ N(0, I_D)``, ``W ~ chi2(df)``
    (one ``W`` per token), ``df`` degrees of freedom.

    Negative control: ``E e^{a.z} = inf`` for every ``a != 0``, so ``tilted_mean`` raises
    :class:`NoLimitError`. Covariance ``df/(df-2) S S^T`` (defined for df > 2).
    """

    name = "student_t"
    has_limit = False
    spec_option = ("df", float)

    def __init__(self, df=3.0, scale=1.0, D=None):
        df_arr = finite_array(df, "df")
        if df_arr.ndim != 0:
            raise ValueError(f"df must be a scalar, got shape {df_arr.shape}")
        df = float(df_arr)
        if not df > 0:
            raise ValueError(f"df must be > 0, got {df}")
        self.df = df
        s = finite_array(scale, "scale")
        if D is None:
            if s.ndim == 0:
                raise ValueError("StudentT with a scalar scale needs D")
            D = s.shape[0]
        self.D = _check_D(D)
        self.S = _scale_matrix(scale, self.D)

    def __repr__(self):
        return f"StudentT(df={self.df:g}, D={self.D})"

    @classmethod
    def isotropic(cls, D, sigma=1.0, *, df=3.0):
        """Scale ``sigma sqrt((df - 2) / df)``, so that the covariance is ``sigma^2 I_D``; needs
        ``df > 2`` (finite variance)."""
        sigma = _check_sigma(sigma)
        df_arr = finite_array(df, "df")
        if df_arr.ndim != 0 or not df_arr > 2:
            raise ValueError(f"df must be a scalar > 2 for a finite covariance sigma^2 I, got {df!r}")
        return cls(df, sigma * np.sqrt((df - 2) / df), D=D)

    @classmethod
    def with_moments(cls, Sigma, mean=None, df=3.0):
        """Scale ``sqrt((df - 2) / df) Sigma^{1/2}`` (symmetric root), so that the covariance is
        ``Sigma``; centred. Needs ``df > 2`` (a finite second moment, which the in-context tasks
        read); spec ``"student_t:DF"``."""
        _centred(mean, cls.name)
        df_arr = finite_array(df, "df")
        if df_arr.ndim != 0 or not df_arr > 2:
            raise ValueError(f"df must be a scalar > 2 for a finite covariance Sigma (the in-context tasks need the "
                             f"covariates' second moment), got {df!r}")
        return cls(df, np.sqrt((df - 2) / df) * _symmetric_root(_given(Sigma, cls.name)))

    @property
    def mean(self):
        """Zero (symmetric law); ``ValueError`` for ``df <= 1``, where ``E |z| = inf``."""
        if self.df <= 1:
            raise ValueError(f"StudentT(df={self.df:g}) has no mean (needs df > 1)")
        return np.zeros(self.D)

    @property
    def cov(self):
        """``df/(df-2) S S^T``; ``ValueError`` for ``df <= 2`` (infinite variance)."""
        if self.df <= 2:
            raise ValueError(f"StudentT(df={self.df:g}) has infinite variance (needs df > 2)")
        return self.df / (self.df - 2) * self.S @ self.S.T

    def sample(self, rng, shape=()):
        shape = _check_shape(shape)
        g = rng.standard_normal(shape + (self.D,))
        w = rng.chisquare(self.df, size=shape + (1,)) / self.df
        with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
            z = _apply_scale(g / np.sqrt(w), self.S)
        if not np.all(np.isfinite(z)):  # chi2(df) draws underflow to 0 for df below ~0.05
            raise FloatOverflowError(f"StudentT(df={self.df:g}) drew samples beyond the float64 range: "
                                     "df is too small (or scale too large) to sample in float64")
        return z

    def tilted_mean(self, a):
        """Always raises :class:`NoLimitError` (no exponential moments)."""
        raise NoLimitError(
            f"StudentT(df={self.df:g}) has no exponential moments: E exp(a.z) = inf for every a != 0, "
            "so softmax attention has no infinite-prompt limit"
        )

    snis_covariance = tilted_mean


class GaussianMixture(Law):
    r"""Finite Gaussian mixture ``sum_k pi_k N(m_k, S_k)`` on ``R^D``, ``k = 1..K``.

    ``weights`` (K,) positive and summing to 1 (within 1e-9; they are then divided by their
    sum), ``means`` (K, D), ``covs`` (K, D, D) symmetric positive semi-definite matrices, (K, D)
    diagonals or (K,) scalars (times ``I_D``), as :class:`Gaussian` accepts one covariance.

    Moments: ``mean = sum_k pi_k m_k``, ``cov = sum_k pi_k (S_k + (m_k - mean)(m_k - mean)^T)``
    (equal to ``sum_k pi_k (S_k + m_k m_k^T) - mean mean^T``, without its cancellation).

    Limit. With ``M_k(a) = E_k e^{a.z} = exp(a.m_k + a^T S_k a / 2)``, tilting component ``k`` by
    ``e^{a.z}`` gives ``N(m_k + S_k a, S_k)``, so

        tilted_mean(a) = sum_k r_k(a) (m_k + S_k a),   r_k(a) = pi_k M_k(a) / sum_j pi_j M_j(a):

    the tilted component means weighted by the posterior ``r_k(a)``, which moves with ``a``: the
    limit is NOT linear (nor affine) in ``a``, unless all the components are one Gaussian (as for
    ``K = 1``); softmax attention over mixture tokens does not tend to linear attention. The
    ``r_k`` are a softmax of ``log pi_k + a.m_k + a^T S_k a / 2`` with the maximum
    subtracted, so a large ``a`` (the exponentials overflow from ``a^T S_k a / 2 ~ 709``) is
    exact; :class:`FloatOverflowError` only when the result itself is not finite in float64
    (``a`` of order ``1e154 / ||S||``).

    Attributes
    ----------
    weights : array (K,), the normalised ``pi_k``
    means : array (K, D)
    covs : array (K, D, D), symmetrised
    K : int, the number of components
    """

    name = "gaussian_mixture"
    spec_option = ("spread", float)

    def __init__(self, weights, means, covs, D=None):
        if D is not None:
            D = _check_D(D)
        w = finite_array(weights, "weights")
        if w.ndim != 1 or w.shape[0] < 1:
            raise ValueError(f"weights must be a non-empty vector of shape (K,), got shape {w.shape}")
        if not np.all(w > 0):
            raise ValueError(f"weights must be positive, got {w.tolist()}")
        if abs(w.sum() - 1.0) > 1e-9:
            raise ValueError(f"weights must sum to 1 (within 1e-9), got sum {w.sum()!r}")
        K = w.shape[0]
        m = finite_array(means, "means")
        if m.ndim != 2 or m.shape[0] != K or m.shape[1] < 1:
            raise ValueError(f"means must have shape (K, D) with K = {K} (from weights), got shape {m.shape}")
        self.D = m.shape[1]
        if D is not None and D != self.D:
            raise ValueError(f"D = {D} does not match means.shape[1] = {self.D}")
        self.weights = w / w.sum()
        self.means = m
        self.covs = self._check_covs(covs, K, self.D)
        self._log_weights = np.log(self.weights)
        self._roots = np.empty_like(self.covs)  # covs[k] = roots[k] @ roots[k].T
        for k, S in enumerate(self.covs):
            lam, Q = np.linalg.eigh(S)
            lam = np.where(lam <= self.D * np.finfo(float).eps * max(lam.max(), 0.0), 0.0, lam)  # as Gaussian
            self._roots[k] = Q * np.sqrt(lam)
        self._cum_weights = np.cumsum(self.weights)
        self._cum_weights[-1] = 1.0  # every uniform draw in [0, 1) falls below the last bin edge

    @staticmethod
    def _check_covs(covs, K, D):
        """``covs`` as (K, D, D) symmetric PSD matrices (from matrices, diagonals or scalars)."""
        c = component_covariances(covs, K, D)
        for k, S in enumerate(c):
            if not np.allclose(S, S.T, rtol=1e-12, atol=1e-12 * max(1.0, np.abs(S).max())):
                raise ValueError(f"covs[{k}] must be symmetric")
            lam = np.linalg.eigvalsh(0.5 * (S + S.T))
            if lam.min() < -1e-10 * max(1.0, lam.max()):
                raise ValueError(f"covs[{k}] must be positive semi-definite (smallest eigenvalue {lam.min():.3g})")
        return 0.5 * (c + np.swapaxes(c, 1, 2))

    @classmethod
    def isotropic(cls, D, sigma=1.0, *, spread=0.5):
        """Scale mixture ``N(0, (1 - spread) sigma^2 I_D) / 2 + N(0, (1 + spread) sigma^2 I_D) / 2``,
        ``0 <= spread < 1``: covariance ``sigma^2 I_D`` and rotation invariant, but not Gaussian
        for ``spread > 0`` (kurtosis ``3 (1 + spread^2)`` per coordinate). Its limit
        ``r(a) sigma^2 a`` is along ``a`` with a slope ``r`` that grows from ``sigma^2`` at
        ``a = 0`` to ``(1 + spread) sigma^2`` as ``|a| -> inf``.
        """
        D = _check_D(D)
        sigma = _check_sigma(sigma)
        s = _check_spread(spread)
        var = sigma**2 * np.array([1.0 - s, 1.0 + s])
        return cls(weights=[0.5, 0.5], means=np.zeros((2, D)), covs=var)

    @classmethod
    def with_moments(cls, Sigma, mean=None, spread=0.5):
        """Scale mixture ``N(m, (1 - spread) Sigma) / 2 + N(m, (1 + spread) Sigma) / 2``
        (``m = mean``, 0 when ``None``), ``0 <= spread < 1``: mean ``m``, covariance ``Sigma``, not
        Gaussian for ``spread > 0`` (the :meth:`isotropic` member with ``Sigma`` for ``sigma^2
        I``); spec ``"gaussian_mixture:SPREAD"``."""
        Sigma = _given(Sigma, cls.name)
        s = _check_spread(spread)
        m = np.zeros(Sigma.shape[0]) if mean is None else mean
        return cls(weights=[0.5, 0.5], means=np.stack([m, m]), covs=np.stack([(1.0 - s) * Sigma, (1.0 + s) * Sigma]))

    @property
    def K(self):
        """Number of components."""
        return self.weights.shape[0]

    @property
    def mean(self):
        """``sum_k pi_k m_k``."""
        return self.weights @ self.means

    @property
    def cov(self):
        """``sum_k pi_k (S_k + (m_k - mean)(m_k - mean)^T)``."""
        dm = self.means - self.mean
        return np.einsum("k,kij->ij", self.weights, self.covs + dm[:, :, None] * dm[:, None, :])

    def __repr__(self):
        return f"GaussianMixture(K={self.K}, D={self.D})"

    def sample(self, rng, shape=()):
        """Draw order: ``rng.random(shape)`` (one uniform per token, its component is the first
        ``k`` with ``u < pi_1 + .. + pi_k``), then ``rng.standard_normal(shape + (D,))``
        (``z = m_k + R_k g`` with ``S_k = R_k R_k^T`` by eigen-decomposition)."""
        shape = _check_shape(shape)
        k = np.searchsorted(self._cum_weights, rng.random(shape), side="right")
        g = rng.standard_normal(shape + (self.D,))
        z = np.empty_like(g)
        for j in range(self.K):
            sel = k == j
            z[sel] = self.means[j] + g[sel] @ self._roots[j].T
        return z

    def _logits(self, a, Sa):
        """``log pi_k + a.m_k + a^T S_k a / 2``, shape ``(..., K)``."""
        return self._log_weights + a @ self.means.T + 0.5 * np.sum(a[..., None, :] * Sa, axis=-1)

    def _tilt(self, a):
        """``(S_k a)_k`` ``(..., K, D)``, the logits ``log pi_k M_k(a)`` ``(..., K)`` and their
        log-sum-exp ``log E e^{a.z}`` ``(..., 1)`` (maximum subtracted): the posterior is
        ``r = exp(logits - log E e^{a.z})``."""
        Sa = np.stack([a @ S for S in self.covs], axis=-2)
        logits = self._logits(a, Sa)
        top = logits.max(axis=-1, keepdims=True)
        return Sa, logits, top + np.log(np.sum(np.exp(logits - top), axis=-1, keepdims=True))

    def tilted_mean(self, a):
        """``sum_k r_k(a) (m_k + S_k a)`` (see the class doc), shape of ``a``."""
        a = _check_a(a, self.D)
        with np.errstate(over="ignore", invalid="ignore"):
            Sa, logits, log_Ew = self._tilt(a)
            out = np.sum(np.exp(logits - log_Ew)[..., None] * (self.means + Sa), axis=-2)
        if not np.all(np.isfinite(out)):
            raise FloatOverflowError(f"tilted_mean overflows float64: a (max |a| = {np.abs(a).max():.3g}) is too "
                                     "large for these covs (a^T S_k a beyond the float64 range)")
        return out

    def snis_covariance(self, a):
        """``lim_L L Cov(f_L)`` (see :meth:`Law.snis_covariance`) in closed form.

        Tilting component ``k`` by ``w^2 = e^{2a.z}`` gives mass ``pi_k M_k(2a)`` and law
        ``N(m_k + 2 S_k a, S_k)``, so with ``m_a = tilted_mean(a)``, ``d_k = m_k + 2 S_k a - m_a``:

            E[w^2 (z - m_a)(z - m_a)^T] / (E w)^2
                = sum_k pi_k M_k(2a) (S_k + d_k d_k^T) / (sum_k pi_k M_k(a))^2,

        each coefficient ``exp(log pi_k + log M_k(2a) - 2 logsumexp_j(log pi_j + log M_j(a)))``
        formed in log space; :class:`FloatOverflowError` when it exceeds the float64 range.
        """
        a = _check_a(a, self.D)
        with np.errstate(over="ignore", invalid="ignore"):
            Sa, logits, log_Ew = self._tilt(a)
            m_a = np.sum(np.exp(logits - log_Ew)[..., None] * (self.means + Sa), axis=-2)
            logits2 = self._logits(2 * a, 2 * Sa)
            coef = np.exp(logits2 - 2 * log_Ew)  # (..., K)
            d = self.means + 2 * Sa - m_a[..., None, :]  # (..., K, D)
            inner = self.covs + d[..., :, None] * d[..., None, :]  # (..., K, D, D)
            C = np.sum(coef[..., None, None] * inner, axis=-3)
        if not np.all(np.isfinite(C)):
            raise FloatOverflowError(f"snis_covariance overflows float64: a (max |a| = {np.abs(a).max():.3g}) is "
                                     "too large for these covs (the factor E[w^2] / (E w)^2 exceeds ~1e308)")
        return C


class Empirical(Law):
    r"""The empirical law ``sum_i pi_i delta_{z_i}`` of ``n`` tokens ``z_i`` on ``R^D`` (``pi_i = 1/n``
    unless ``weights`` are given): a law from data.

    Its tilted mean is a softmax-weighted average over the support, computed exactly:

        tilted_mean(a) = sum_i pi_i e^{a.z_i} z_i / sum_i pi_i e^{a.z_i},

    log-sum-exp stable (every exponent is ``<= 0`` after subtracting the running maximum), and
    its SNIS constant (:meth:`snis_covariance`) likewise. Both stream over the support in chunks
    of at most :attr:`BLOCK` floats, so time is linear in ``n`` and memory that of the samples
    (the features ``[1, z_i]`` of the tilted mean, kept once built) plus the chunks
    (``n = 10^6`` tokens is fine). Bounded support: the limit always exists.

    ``samples``: an ``(n, D)`` array, a path to a ``.npy`` file, or ``"file.nc:variable"`` (a
    netCDF variable with dims (token, feature), or any order with ``feature_dim`` naming the
    feature dim); see :func:`sfxlin.realdata.read_tokens`. ``weights``: ``n`` finite non-negative
    numbers with a positive sum (normalised here); atoms of weight 0 are dropped. ``D``, when
    given, must equal the number of columns. ``ValueError`` naming the argument for NaN or inf
    rows, an empty array, a dimension mismatch, bad weights.
    """

    name = "empirical"
    spec_option = ("samples", str)
    BLOCK = 1 << 21
    """Largest number of floats a chunk of the streaming computations holds (16 MB)."""

    def __init__(self, samples, weights=None, D=None, feature_dim=None):
        from .realdata import read_tokens

        Z = read_tokens(samples, "samples", feature_dim=feature_dim)
        if D is not None and _check_D(D) != Z.shape[1]:
            raise ValueError(f"D = {D} does not match the samples' dimension {Z.shape[1]} (shape {Z.shape})")
        if weights is None:
            self.weights = None
        else:
            w = finite_array(weights, "weights")
            if w.shape != (Z.shape[0],):
                raise ValueError(f"weights must have shape ({Z.shape[0]},), one per sample, got {w.shape}")
            if np.any(w < 0) or not w.sum() > 0:
                raise ValueError("weights must be non-negative with a positive sum")
            keep = w > 0
            Z, w = Z[keep], w[keep]
            self.weights = w / w.sum()
        self.samples = Z.view()  # a read-only view: the caller's array keeps its own flags
        self.samples.flags.writeable = False
        self.n, self.D = Z.shape
        if self.weights is not None:
            cum = np.cumsum(self.weights)
            self._cum_weights = cum / cum[-1]
        self._mean = self._cov = self._support_pair = None   # built on first use (:func:`_built`)

    @classmethod
    def isotropic(cls, D, sigma=1.0):
        """Not defined: an empirical law is given by its samples, it has no isotropic member of its
        own (standardise and whiten the samples instead, e.g. :func:`sfxlin.realdata.pca_whiten`)."""
        raise NotImplementedError("Empirical has no isotropic member: an empirical law is given by its samples "
                                  "(whiten them, e.g. with sfxlin.realdata.pca_whiten, for covariance I_D)")

    @classmethod
    def with_moments(cls, Sigma=None, mean=None, samples=None):
        """The empirical law of ``samples`` as given (spec ``"empirical:FILE.npy"`` or
        ``"empirical:FILE.nc:variable"``): its covariance and mean are the samples' own, so
        ``Sigma`` and ``mean`` must be ``None`` (transform the samples for others, e.g.
        :func:`sfxlin.realdata.pca_whiten`)."""
        if Sigma is not None or mean is not None:
            raise ValueError("Sigma, mean: an empirical law has its samples' own covariance and mean, give neither "
                             "(transform the samples instead, e.g. sfxlin.realdata.pca_whiten)")
        if samples is None:
            raise ValueError("samples: an empirical law needs its samples (spec 'empirical:FILE.npy' or "
                             "'empirical:FILE.nc:variable')")
        return cls(samples)

    def __repr__(self):
        return f"Empirical(n={self.n}, D={self.D}{', weighted' if self.weights is not None else ''})"

    def _pi(self, lo, hi):
        return None if self.weights is None else self.weights[lo:hi]

    @property
    def mean(self):
        """``sum_i pi_i z_i``."""
        return _built(self, "_mean", lambda: _read_only(
            self.samples.mean(axis=0) if self.weights is None else self.weights @ self.samples))

    @property
    def cov(self):
        """``sum_i pi_i (z_i - mean)(z_i - mean)^T`` (the law's covariance: divisor 1, not n - 1)."""
        return _built(self, "_cov", self._build_cov)

    def _build_cov(self):
        C = np.zeros((self.D, self.D))
        step = max(1, self.BLOCK // self.D)
        for lo in range(0, self.n, step):
            Y = self.samples[lo:lo + step] - self.mean
            pi = self._pi(lo, lo + step)
            C += (Y / self.n if pi is None else Y * pi[:, None]).T @ Y
        return _read_only(0.5 * (C + C.T))

    def sample(self, rng, shape=()):
        """Tokens drawn with replacement. Draw order: ``rng.integers(0, n, shape)`` (equal weights)
        or ``rng.random(shape)`` (weights: the atom is the first ``i`` with ``u < pi_1 + .. + pi_i``)."""
        shape = _check_shape(shape)
        if self.weights is None:
            idx = rng.integers(0, self.n, size=shape)
        else:
            idx = np.minimum(np.searchsorted(self._cum_weights, rng.random(shape), side="right"), self.n - 1)
        return self.samples[idx]

    def _logits(self, A, lo, hi):
        """``A z_i`` for the atoms ``lo:hi`` ``(m, hi - lo)``; FloatOverflowError beyond float64."""
        with np.errstate(over="ignore", invalid="ignore"):
            s = A @ self.samples[lo:hi].T
        if not np.all(np.isfinite(s)):
            raise FloatOverflowError(f"the logits a.z_i exceed the float64 range: a (max |a| = {np.abs(A).max():.3g}) "
                                     "is too large for these samples")
        return s

    def _support(self):
        """The support as :func:`sfxlin.softmax_core.prefix_moments` sees it, built once: the
        features ``pi_i [1, z_i]`` (``[1, z_i]`` for equal weights, ``1/n`` applied to the sum)
        ``(1, D + 1, n)`` and ``max_i |z_i|`` (``|a.z_i| <= |a| max_i |z_i|``), as one pair (built
        and published together: a cell never sees one without the other)."""
        return _built(self, "_support_pair", self._build_support)

    def _build_support(self):
        Y = np.empty((self.n, self.D + 1))
        Y[:, 0] = 1.0
        Y[:, 1:] = self.samples
        if self.weights is not None:
            Y *= self.weights[:, None]
        with np.errstate(over="ignore"):  # inf: no bound, the logits are then checked one by one
            zmax = np.sqrt(np.einsum("ij,ij->i", self.samples, self.samples).max())
        return _read_only(Y.T[None]), zmax

    def _tilt(self, A):
        """The softmax over the support for queries ``A`` ``(m, D)`` (one group of
        :func:`sfxlin.softmax_core.prefix_moments`, streamed in chunks of :attr:`BLOCK` floats): the
        maximum logit ``top`` ``(m,)``, ``S0 = sum_i pi_i e^{a.z_i - top}`` ``(m,)`` and the tilted
        mean ``(m, D)``. FloatOverflowError when a logit exceeds float64 (checked atom by atom only
        when the bound ``|a| max_i |z_i|`` does not exclude it)."""
        phi, zmax = self._support()
        with np.errstate(over="ignore"):
            bound = np.linalg.norm(A, axis=1).max() * zmax
        if not bound < 1e300:
            step = max(1, self.BLOCK // A.shape[0])
            for lo in range(0, self.n, step):
                self._logits(A, lo, lo + step)
        M, P = prefix_moments(phi, (0, self.n), A=A[None], X=self.samples.T[None], cache_bytes=8 * self.BLOCK)
        S0 = P[0, 0, :, 0] if self.weights is not None else P[0, 0, :, 0] / self.n
        return M[0, 0], S0, normalised(P)[0, 0]

    def _queries(self, a):
        """``a`` checked, as ``(m, D)`` blocks of at most ``BLOCK // (8 D)`` queries, and its leading shape."""
        a = _check_a(a, self.D)
        A = a.reshape(-1, self.D)
        size = max(1, self.BLOCK // (8 * self.D))
        return a.shape[:-1], [A[i:i + size] for i in range(0, A.shape[0], size)]

    def tilted_mean(self, a):
        """``sum_i pi_i e^{a.z_i} z_i / sum_i pi_i e^{a.z_i}``, exact (see the class doc), shape of ``a``."""
        lead, blocks = self._queries(a)
        out = np.concatenate([self._tilt(A)[2] for A in blocks]) if blocks else np.zeros((0, self.D))
        return out.reshape(lead + (self.D,))

    def snis_covariance(self, a):
        """``lim_L L Cov(f_L)`` for tokens drawn with replacement (see :meth:`Law.snis_covariance`),
        exact: with ``m_a = tilted_mean(a)``,

            sum_i pi_i e^{2(a.z_i - top)} (z_i - m_a)(z_i - m_a)^T / (sum_i pi_i e^{a.z_i - top})^2,

        ``top`` the largest logit (a second streaming pass, centred exactly at ``m_a``)."""
        lead, blocks = self._queries(a)
        out = []
        for A in blocks:
            top, S0, m_a = self._tilt(A)
            m = A.shape[0]
            C = np.zeros((m, self.D, self.D))
            step = max(1, self.BLOCK // (m * self.D))
            for lo in range(0, self.n, step):
                s = self._logits(A, lo, lo + step)
                pi = self._pi(lo, lo + step)
                w = np.exp(2.0 * (s - top[:, None]))
                w = w / self.n if pi is None else w * pi
                Y = self.samples[None, lo:lo + step, :] - m_a[:, None, :]  # (m, c, D)
                C += np.matmul(np.swapaxes(Y * w[..., None], 1, 2), Y)
            with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
                C = C / (S0**2)[:, None, None]
            if not np.all(np.isfinite(C)):
                raise FloatOverflowError("snis_covariance exceeds the float64 range (the largest logit's atom has "
                                         "a weight below ~1e-154)")
            out.append(0.5 * (C + np.swapaxes(C, 1, 2)))
        out = np.concatenate(out) if out else np.zeros((0, self.D, self.D))
        return out.reshape(lead + (self.D, self.D))


def _check_rho(rho):
    """``rho`` checked to be a finite scalar with ``|rho| < 1`` and returned as a float."""
    r = finite_array(rho, "rho")
    if r.ndim != 0 or not abs(float(r)) < 1:
        raise ValueError(f"rho must be a scalar with |rho| < 1 (a stationary AR(1) sequence; |rho| >= 1 has no "
                         f"stationary law), got {rho!r}")
    return float(r)


class GaussianAR1(Law):
    r"""Gaussian AR(1) tokens: ``z_k = rho z_{k-1} + sqrt(1 - rho^2) eps_k``, ``eps_k ~ N(0, Sigma)``
    i.i.d., started stationary, ``z_0 ~ N(0, Sigma)``; ``|rho| < 1``.

    **The tokens are dependent along the prompt axis** (``iid`` is False): :meth:`sample` with
    ``shape = (..., L)`` draws, for every index of the leading axes, one stationary sequence of
    ``L`` tokens along the last axis of ``shape`` (the token axis ``-2`` of the draw ``(..., L, D)``,
    the axis that :func:`sfxlin.attention.softmax_attention_prefix` reads prefixes of), with lag-h
    cross-covariance ``Cov(z_k, z_{k+h}) = rho^|h| Sigma``; sequences of different leading indices
    are independent. A prefix of a sequence is a stationary sequence, so nested prompts are
    prompts of this law. ``shape = ()`` is one token of the stationary law.

    Its stationary law is ``N(0, Sigma)`` (:attr:`mean`, :attr:`cov`, :attr:`marginal`), and the
    law of large numbers holds for the stationary, mixing sequence, so the limit of softmax
    attention is the Gaussian's: ``tilted_mean(a) = Sigma a``. The finite-L constant changes:
    :meth:`snis_covariance` is the long-run (dependent) constant, the sum over lags of the
    influence function's autocovariance (:meth:`influence_lag_covariance`); the i.i.d. constant
    of the same stationary law is ``marginal.snis_covariance(a)``.

    One of the C1 token laws only: its :meth:`with_moments` raises (the in-context tasks draw
    covariates and queries by one ``sample`` call per axis and assume them i.i.d.), so
    :func:`covariate_law` refuses ``"ar1:RHO"``.
    """

    name = "ar1"
    iid = False
    spec_option = ("rho", float)

    def __init__(self, rho=0.5, cov=1.0, D=None):
        self.rho = _check_rho(rho)
        self.marginal = Gaussian(cov=cov, D=D)
        self.D = self.marginal.D

    @classmethod
    def isotropic(cls, D, sigma=1.0, *, rho=0.5):
        """Stationary law ``N(0, sigma^2 I_D)``, coefficient ``rho``."""
        return cls(rho, cov=_check_sigma(sigma) ** 2, D=D)

    @classmethod
    def with_moments(cls, Sigma, mean=None, rho=0.5):
        """Not defined: see the class doc (the in-context experiments assume i.i.d. covariates)."""
        raise NotImplementedError("the ar1 law's tokens are dependent along the prompt axis; the in-context tasks "
                                  "draw i.i.d. covariates and queries: it serves experiment C1 only")

    def __repr__(self):
        return f"GaussianAR1(rho={self.rho:g}, D={self.D})"

    @property
    def mean(self):
        """Zero (stationary mean)."""
        return self.marginal.mean

    @property
    def cov(self):
        """``Sigma``, the stationary covariance."""
        return self.marginal.cov

    def sample(self, rng, shape=()):
        """``shape + (D,)`` tokens, stationary AR(1) sequences along the last axis of ``shape`` (see
        the class doc). Draw order: ``eps = marginal.sample(rng, shape)`` (the Gaussian's draws, so
        ``rho = 0`` gives its tokens), then ``z_0 = eps_0`` and ``z_k = rho z_{k-1} + sqrt(1 - rho^2)
        eps_k``, one step along the prompt axis at a time for every sequence at once."""
        z = self.marginal.sample(rng, shape)
        if z.ndim < 2:  # one token: the stationary law
            return z
        z[..., 1:, :] *= np.sqrt(1.0 - self.rho**2)
        step = np.empty(z.shape[:-2] + (self.D,))
        for k in range(1, z.shape[-2]):
            np.multiply(z[..., k - 1, :], self.rho, out=step)
            z[..., k, :] += step
        return z

    def tilted_mean(self, a):
        """``Sigma a``, the stationary Gaussian's (Lemma 2.1)."""
        return self.marginal.tilted_mean(a)

    def influence_lag_covariance(self, a, h):
        """``E[psi(z_0) psi(z_h)^T]`` for the influence function ``psi(z) = e^{a.z} (z - Sigma a) /
        E e^{a.z}``: with ``r^2 = a^T Sigma a``,

            exp(rho^|h| r^2) (rho^|h| Sigma + rho^{2|h|} Sigma a a^T Sigma)

        (the pair ``(z_0, z_h)`` is jointly Gaussian with cross-covariance ``rho^|h| Sigma``; tilting it
        by ``e^{a.(z_0 + z_h)}`` moves both means to ``(1 + rho^|h|) Sigma a``). ``h = 0`` is the i.i.d.
        constant. ``a (..., D)``, ``h`` an integer -> ``(..., D, D)``."""
        a = _check_a(a, self.D)
        if isinstance(h, bool) or not isinstance(h, (int, np.integer)):
            raise ValueError(f"h must be an integer lag, got {h!r}")
        p = self.rho ** abs(int(h))
        Sa = a @ self.cov
        r2 = np.sum(a * Sa, axis=-1)
        with np.errstate(over="ignore", invalid="ignore"):
            C = np.exp(p * r2)[..., None, None] * (p * self.cov + p * p * Sa[..., :, None] * Sa[..., None, :])
        if not np.all(np.isfinite(C)):
            raise FloatOverflowError(f"influence_lag_covariance overflows float64: a^T Sigma a reaches {r2.max():.4g}")
        return C

    def snis_covariance(self, a):
        """The dependent constant ``lim_L L Cov(f_L) = sum_{h in Z} E[psi(z_0) psi(z_h)^T]``
        (:meth:`influence_lag_covariance`), exact to rounding: expanding ``exp(rho^|h| r^2) =
        sum_k (rho^|h| r^2)^k / k!`` and summing the geometric series ``sum_h x^|h| = (1 + x)/(1 - x)``,

            sum_h ... = S_1 Sigma + S_2 Sigma a a^T Sigma,   S_m = sum_{k >= 0} (r^2)^k / k! g(k + m),
            g(n) = (1 + rho^n) / (1 - rho^n).

        Every term is positive (``|rho^n| < 1``), so there is no cancellation. The sum stops at the
        first ``K`` where the tail bound ``G(K + 2) t_{K+1} / (1 - r^2 / (K + 2))`` (``t_k`` the
        Poisson-type term ``(r^2)^k / k!``, ``G(n) = (1 + |rho|^n) / (1 - |rho|^n) >= g(j)`` for every
        ``j >= n``, valid once ``K + 2 > r^2``) is below ``1e-16`` of both sums. ``rho = 0``:
        ``S_1 = S_2 = exp(r^2)``, the i.i.d. constant."""
        a = _check_a(a, self.D)
        Sa = a @ self.cov
        r2 = np.sum(a * Sa, axis=-1)
        rho = self.rho

        def g(n):
            x = rho**n
            return (1.0 + x) / (1.0 - x)

        t = np.ones_like(r2)
        S1, S2 = g(1) * t, g(2) * t
        k = 0
        with np.errstate(over="ignore", invalid="ignore"):
            while True:
                if not (np.all(np.isfinite(S1)) and np.all(np.isfinite(S2))):
                    raise FloatOverflowError(f"snis_covariance overflows float64: a^T Sigma a reaches "
                                             f"{r2.max():.4g} (exp overflows beyond ~709); a is too large for this cov")
                nxt = t * r2 / (k + 1)
                if np.all(k + 2 > r2):
                    G = (1.0 + abs(rho) ** (k + 2)) / (1.0 - abs(rho) ** (k + 2))
                    tail = G * nxt / (1.0 - r2 / (k + 2))
                    if np.all(tail <= 1e-16 * np.minimum(S1, S2)):
                        break
                k += 1
                t = nxt
                S1 = S1 + t * g(k + 1)
                S2 = S2 + t * g(k + 2)
        return S1[..., None, None] * self.cov + S2[..., None, None] * (Sa[..., :, None] * Sa[..., None, :])


def law_from_name(name, D, **kwargs):
    """Build the law registered in :data:`LAWS` as ``name`` on ``R^D``: ``LAWS[name](D=D,
    **kwargs)`` (keyword arguments go to the constructor). Unknown names raise ValueError
    listing the known ones."""
    if name not in LAWS:
        raise ValueError(f"unknown law name {name!r}; expected one of {sorted(LAWS)}")
    return LAWS[name](D=D, **kwargs)


def covariate_law(spec, Sigma=None, mean=None, *, d=None):
    """The covariate law of the in-context tasks (C2, C3, the landscape, the deep models), named
    by ``spec``, with covariance ``Sigma`` and mean ``mean``.

    ``spec``: a name of :data:`LAWS` (``"gaussian"``, ``"rademacher"``, ``"uniform"``,
    ``"student_t"``, ``"gaussian_mixture"``) or ``"name:VALUE"``, the value of the law's
    :attr:`Law.spec_option` (``"student_t:5"``: ``df = 5``; ``"gaussian_mixture:0.3"``: ``spread``;
    ``"empirical:FILE.npy"`` or ``"empirical:FILE.nc:variable"``: the samples, read with
    :func:`sfxlin.realdata.read_tokens`). ``Sigma``: a ``d x d`` symmetric positive-definite matrix or
    a length-``d`` diagonal (``None`` for ``empirical``, whose moments are its samples'). ``mean``:
    ``(d,)`` or ``None`` (centred); only laws with a mean parameter take a non-zero one. ``d``, when
    given, is checked against the law's dimension.

    Returns ``LAWS[name].with_moments(Sigma, mean, **option)``: a :class:`Law` on ``R^d`` whose
    ``cov`` is ``Sigma`` (to rounding) and ``mean`` is ``mean``, the two moments the tasks read
    (:func:`sfxlin.icl.make_tasks`; linear(inf) sees the second moment ``Sigma + m m^T``). For
    ``"gaussian"`` and ``"rademacher"`` it is ``Gaussian(mean=mean, cov=Sigma)`` and
    ``Rademacher(scale=Sigma^{1/2})`` (symmetric root), the laws and draws of the shipped experiments.

    One ``ValueError`` naming the spec for a law that cannot serve: an unknown name or a bad value,
    a law built from no covariance or given one it cannot take, a non-zero mean for a centred law,
    too few degrees of freedom for a second moment (``student_t`` needs ``df > 2``), a dimension
    other than ``d``, a covariance that is not positive definite, a law without ``with_moments``.
    """
    name, options = _parse_law_spec(spec)
    try:
        S = None if Sigma is None else _covariance_matrix(Sigma, d)
        m = None if mean is None else _mean_vector(mean, d if S is None else S.shape[0])
        law = LAWS[name].with_moments(S, m, **options)
        _check_serves(law, d)
    except (ValueError, NotImplementedError) as exc:
        raise ValueError(f"covariate law {spec!r}: {exc}") from None
    return law


def _parse_law_spec(spec):
    """``(name, options)`` of a covariate-law spec ``"name"`` or ``"name:VALUE"`` (split at the
    first ``:``; the value typed by the law's ``spec_option``)."""
    if not isinstance(spec, str) or not spec:
        raise ValueError(f"covariate law must be a law name or 'name:VALUE' (a non-empty string), got {spec!r}")
    name, sep, value = spec.partition(":")
    if name not in LAWS:
        raise ValueError(f"covariate law {spec!r}: unknown law name {name!r}; expected one of {sorted(LAWS)}")
    option = LAWS[name].spec_option
    if not sep:
        return name, {}
    if option is None:
        raise ValueError(f"covariate law {spec!r}: the {name} law takes no ':VALUE' (its spec is {name!r})")
    key, kind = option
    try:
        if value:
            return name, {key: kind(value)}
    except ValueError:
        pass
    raise ValueError(f"covariate law {spec!r}: expected {name}:{key.upper()} with {key} a {kind.__name__}, "
                     f"got {value!r}")


def _covariance_matrix(Sigma, d=None):
    """``Sigma`` (a square matrix or a diagonal) as a finite symmetric ``d x d`` float64 matrix,
    symmetry checked relative to the largest entry (definiteness: :func:`_check_serves`)."""
    S = finite_array(Sigma, "Sigma")
    if S.ndim == 1:
        S = np.diag(S)
    if S.ndim != 2 or S.shape[0] != S.shape[1] or S.shape[0] < 1 or (d is not None and S.shape[0] != d):
        raise ValueError(f"Sigma must be a square {d or 'd'} x {d or 'd'} matrix or a length-{d or 'd'} diagonal, "
                         f"got shape {S.shape}")
    if not np.allclose(S, S.T, atol=1e-8 * np.abs(S).max()):
        raise ValueError("Sigma must be symmetric")
    return S


def _mean_vector(mean, d):
    """``mean`` as a finite float64 vector of length ``d`` (when ``d`` is known)."""
    m = finite_array(mean, "mean")
    if m.ndim != 1 or (d is not None and m.shape[0] != d):
        raise ValueError(f"mean must have shape (d,) = ({d or 'd'},), got {m.shape}")
    return m


def _check_serves(law, d):
    """``ValueError`` unless ``law`` lives on ``R^d`` (when ``d`` is given) and has a finite,
    positive-definite covariance (the tasks' ``Sigma``)."""
    if d is not None and law.D != d:
        raise ValueError(f"the law is on R^{law.D} ({law!r}), but d = {d}")
    lam = np.linalg.eigvalsh(law.cov)
    if not lam[0] > 0:
        raise ValueError(f"its covariance is not positive definite (smallest eigenvalue {lam[0]:.3g}); the "
                         "in-context tasks need a positive-definite Sigma")
