"""Checks of user input shared by the science modules, with messages that name the argument.

* :func:`numeric_array`: ``x`` as a float64 array, a ``TypeError`` naming it when it is not numeric;
* :func:`finite_array`: the same, and a ``ValueError`` naming it, counting the non-finite entries
  and giving the first one's index when any entry is NaN or infinite;
* :func:`component_covariances`: a mixture's covariances, whole, diagonal or scalar, as matrices.
"""
from __future__ import annotations

import numpy as np

__all__ = ["numeric_array", "finite_array", "component_covariances"]


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
    bad = ~np.isfinite(a)
    if bad.any():
        first = tuple(int(i) for i in np.argwhere(bad)[0])
        raise ValueError(f"{name} must be finite: {int(bad.sum())} non-finite entries, the first ({a[first]}) "
                         f"at index {first}")
    return a


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
