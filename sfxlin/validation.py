"""Checks of user input shared by the science modules, with messages that name the argument.

* :func:`numeric_array`: ``x`` as a float64 array, a ``TypeError`` naming it when it is not numeric;
* :func:`finite_array`: the same, and a ``ValueError`` naming it, counting the non-finite entries
  and giving the first one's index when any entry is NaN or infinite;
* :func:`token_weights`: the weights of ``L`` tokens, positive and finite (or ``None``: equal);
* :func:`component_covariances`: a mixture's covariances, whole, diagonal or scalar, as matrices;
* :func:`positive_int`, :func:`noise_std`: a count >= 1, a standard deviation >= 0;
* :func:`registry_name`: the new key of a class that registers itself by subclassing (laws, kernels);
* :func:`as_sigma`, :func:`as_spd`: a covariance (whole or its diagonal) as a symmetric, resp.
  symmetric positive-definite, matrix.
"""
from __future__ import annotations

import numpy as np

__all__ = ["numeric_array", "finite_array", "token_weights", "component_covariances", "positive_int", "noise_std", "as_sigma",
           "as_spd", "registry_name"]


def numeric_array(x, name) -> np.ndarray:
    """``x`` as a float64 array; ``TypeError`` naming ``name`` if it is not numeric."""
    try:
        return np.asarray(x, dtype=float)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{name} must be a numeric array, got {type(x).__name__} ({exc})") from None


def finite_array(x, name) -> np.ndarray:
    """``x`` as a float64 array with finite entries only; ``ValueError`` naming ``name``, the number
    of non-finite entries and the first one's index otherwise (``TypeError`` if not numeric)."""
    a = numeric_array(x, name)
    if a.size == 0 or (np.isfinite(a.min()) and np.isfinite(a.max())):   # NaN and inf reach the extremes
        return a
    finite = np.isfinite(a)
    if not finite.all():   # (the mask is inverted only to report the bad entries)
        bad = ~finite
        first = tuple(int(i) for i in np.argwhere(bad)[0])
        raise ValueError(f"{name} must be finite: {int(bad.sum())} non-finite entries, the first ({a[first]}) "
                         f"at index {first}")
    return a


def token_weights(weights, L, name="weights"):
    """``weights`` as ``(L,)`` positive finite floats, one per token (``None`` stays ``None``: equal
    weights); ``ValueError`` naming ``name`` for another shape or a weight that is not positive."""
    if weights is None:
        return None
    w = finite_array(weights, name)
    if w.shape != (L,):
        raise ValueError(f"{name} must be {L} numbers, one per token, got shape {w.shape}")
    if not np.all(w > 0):
        raise ValueError(f"{name} must be positive (drop the tokens of weight 0), got minimum {w.min():.3g}")
    return w


def component_covariances(covs, K, D, name="covs") -> np.ndarray:
    """The ``K`` covariance matrices of a mixture as a ``(K, D, D)`` array, given whole, as ``(K, D)``
    diagonals or as ``(K,)`` scalars (times the identity); finite, else a ``ValueError`` naming
    ``name`` (symmetry and definiteness are the caller's to check)."""
    c = finite_array(covs, name)
    if c.shape == (K,):
        return c[:, None, None] * np.eye(D)
    if c.shape == (K, D):
        return c[:, :, None] * np.eye(D)
    if c.shape != (K, D, D):
        raise ValueError(f"{name} must have shape ({K}, {D}, {D}) (matrices), ({K}, {D}) (diagonals) or ({K},) "
                         f"(scalars) for K = {K} components in D = {D}, got shape {c.shape}")
    return c


def positive_int(value, name):
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def noise_std(value, name):
    """A finite standard deviation ``>= 0`` as a float."""
    if isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    try:
        s = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}") from None
    if not (np.isfinite(s) and s >= 0):
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    return s


def as_sigma(Sigma, d=None):
    """``Sigma`` as a finite symmetric ``d x d`` float64 matrix (a length-``d`` vector is its
    diagonal). Symmetry is checked relative to the largest entry, so it holds at any scale."""
    S = numeric_array(Sigma, "Sigma")
    if S.ndim == 1:
        S = np.diag(S)
    if S.ndim != 2 or S.shape[0] != S.shape[1] or (d is not None and S.shape[0] != d):
        raise ValueError(f"Sigma must be a square {d or 'd'} x {d or 'd'} matrix or a diagonal, got shape {S.shape}")
    if not np.all(np.isfinite(S)):
        raise ValueError("Sigma must be finite")
    if not np.allclose(S, S.T, atol=1e-8 * np.abs(S).max()):
        raise ValueError("Sigma must be symmetric")
    return S


def as_spd(A, d, name):
    """``A`` (a ``d x d`` matrix or a length-``d`` diagonal) as a symmetric positive-definite matrix."""
    try:
        S = as_sigma(A, d)
    except ValueError as exc:
        raise ValueError(f"{name}: {exc}") from None
    if not np.linalg.eigvalsh(S)[0] > 0:
        raise ValueError(f"{name} must be positive definite, smallest eigenvalue {np.linalg.eigvalsh(S)[0]:.3g}")
    return S


def registry_name(cls, registry, kind, table):
    """``cls``'s own class attribute ``name``, a new key of ``registry`` (the table ``table`` of
    ``kind`` classes that fill it by subclassing); a ``TypeError`` when it is missing, empty or
    already taken."""
    name = cls.__dict__.get("name")
    if not isinstance(name, str) or not name:
        raise TypeError(f"{kind} class {cls.__qualname__} must set a class attribute name (a non-empty string, "
                        f"its key in {table}), got {name!r}")
    if name in registry:
        raise TypeError(f"{kind} name {name!r} of {cls.__qualname__} is already taken by "
                        f"{registry[name].__module__}.{registry[name].__qualname__}")
    return name
