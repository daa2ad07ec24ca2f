"""Quadrature of tilted means: independent numerical checks of the closed forms in ``laws``.

The tilted mean of a law ``mu`` on ``R^D`` at logit vector ``a`` is

    T_mu(a) = E_mu[e^{a.z} z] / E_mu[e^{a.z}] = grad K_mu(a),

the infinite-prompt read-out of softmax attention (SPEC section 1). This module computes it by
brute-force tensor-product quadrature, without using any closed form, so that the closed forms
of :mod:`sfxlin.laws` can be checked against it. It deliberately imports nothing from
``sfxlin.laws``.

Every rule here has the form ``T(a) ~= sum_i W_i e^{a.z_i} z_i / sum_i W_i e^{a.z_i}`` over a
finite set of nodes ``z_i`` with positive weights ``W_i``: a softmax over the nodes with logits
``log W_i + a.z_i``. It is evaluated with the maximum subtracted from the logits, so
large ``||a||`` never overflows (the accuracy limit for large ``||a||`` is the rule's, see each
function). The tensor grid has ``n^D`` nodes, so ``D <= 4`` (40^4 = 2.56e6 nodes); the leading
axes of ``a`` are processed in chunks that keep the work arrays to about 32 MB.

Functions
---------
gaussian_tilted_mean_quadrature(mean, cov, a, n_nodes=40)
    Gauss-Hermite rule for ``N(mean, cov)``, ``cov`` PSD and possibly singular.
product_law_tilted_mean_quadrature(kind, S, a, n_nodes=40)
    ``z = S u`` with ``u`` uniform on ``[-sqrt3, sqrt3]^D`` (Gauss-Legendre) or ``u`` a
    Rademacher sign vector (exact enumeration of the ``2^D`` sign vectors).
"""
from __future__ import annotations

import numpy as np
from numpy.polynomial.hermite_e import hermegauss
from numpy.polynomial.legendre import leggauss

__all__ = ["gaussian_tilted_mean_quadrature", "product_law_tilted_mean_quadrature", "MAX_DIM"]

MAX_DIM = 4
_CHUNK_ELEMENTS = 1 << 22  # rows of a per chunk x grid nodes; 4M float64 = 32 MB per work array
_MAX_GRID = 1 << 25  # n_nodes**D above this (268 MB per work array) is refused
_PRODUCT_KINDS = ("rademacher", "uniform")


# --------------------------------------------------------------------------------------------
# validation
# --------------------------------------------------------------------------------------------
def _finite_array(x, name):
    try:
        arr = np.asarray(x, dtype=float)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name} must be a numeric array, got {type(x).__name__}") from exc
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} must contain only finite values")
    return arr


def _check_dim(D, name):
    if D < 1 or D > MAX_DIM:
        raise ValueError(
            f"{name} gives dimension D = {D}; tensor-product quadrature supports 1 <= D <= {MAX_DIM} "
            f"(the grid has n_nodes**D points)"
        )


def _check_logits(a, D):
    a = _finite_array(a, "a")
    if a.ndim == 0 or a.shape[-1] != D:
        raise ValueError(f"a must have shape (..., {D}) (trailing dimension D = {D}), got shape {a.shape}")
    return a


def _check_n_nodes(n_nodes, D):
    if isinstance(n_nodes, bool) or not isinstance(n_nodes, (int, np.integer)) or n_nodes < 1:
        raise ValueError(f"n_nodes must be a positive integer, got {n_nodes!r}")
    if int(n_nodes) ** D > _MAX_GRID:
        raise ValueError(f"n_nodes = {n_nodes} in D = {D} gives {int(n_nodes) ** D:.3g} grid points (limit {_MAX_GRID:.3g})")
    return int(n_nodes)


# --------------------------------------------------------------------------------------------
# the engine: a softmax over a fixed tensor grid
# --------------------------------------------------------------------------------------------
def _logit_coefficients(a, R):
    """``b = a @ R`` (so ``a.z = b.x`` for ``z = m + R x``); inf is allowed (capped later), NaN
    (``inf - inf`` from a gigantic ``a``) is an error."""
    with np.errstate(over="ignore", invalid="ignore"):
        b = a @ R
    if np.isnan(b).any():
        raise ValueError("a is too large: a @ (scale factor) overflows to inf - inf")
    return b


def _marginal(p, axis):
    """Sum ``p`` over every axis but 0 and ``axis``, one axis at a time (each a short sum of
    ``n`` terms, so rounding grows like ``n``, not like ``n**(r-1)``)."""
    for j in range(p.ndim - 1, 0, -1):
        if j != axis:
            p = p.sum(axis=j)
    return p


def _tensor_tilted_mean(b, nodes, log_w):
    """Tensor-product rule: ``sum_i W_i e^{b.x_i} x_i / sum_i W_i e^{b.x_i}`` per row of ``b``.

    ``b`` has shape ``(B, r)``; the grid is every ``x_i = (nodes[i_1], .., nodes[i_r])`` with
    weight ``W_i = prod_k e^{log_w[i_k]}``, i.e. ``n**r`` nodes. The logits
    ``log W_i + b.x_i = sum_k (log_w[i_k] + b_k nodes[i_k])`` are built on the full
    ``(chunk,) + (n,) * r`` grid by broadcasting, with the maximum subtracted before
    exponentiating: the maximum over the grid of this sum is the sum of the per-axis maxima, and
    subtracting each axis's maximum from its share before the sum keeps a huge ``b_j`` from
    swamping, by rounding, a moderate ``b_k`` on another axis. The largest term is then exactly 1
    and nothing overflows. Coordinate ``k`` of the mean is read off the marginal of the weights
    on axis ``k``. Every one of the ``n**r`` terms is evaluated. Returns ``(B, r)``.
    """
    B, r = b.shape
    out = np.empty((B, r))
    if r == 0:  # point mass (e.g. cov = 0): nothing to integrate
        return out
    n = nodes.size
    # |b_k| beyond cap would let b_k x overflow. The logits are a sum over axes, so the rule's
    # marginal on axis k only depends on b_k, and at |b_k| >= cap it already sits on the extreme
    # node (logit gaps >= 1e297 against a log-weight spread of ~1e2): capping changes nothing.
    cap = 1e300 / max(1.0, np.abs(nodes).max())
    b = np.clip(b, -cap, cap)
    chunk = max(1, _CHUNK_ELEMENTS // n**r)
    for start in range(0, B, chunk):
        bc = b[start:start + chunk]
        logits = np.zeros((bc.shape[0],) + (n,) * r)
        for k in range(r):
            shape = [bc.shape[0]] + [1] * r
            shape[k + 1] = n
            term = log_w + bc[:, k:k + 1] * nodes  # (chunk, n): axis k's share of the logits
            term -= term.max(axis=1, keepdims=True)
            logits += term.reshape(shape)
        p = np.exp(logits)  # logits <= 0 and = 0 at the grid maximum: nothing overflows
        for k in range(r):
            marginal = _marginal(p, k + 1)  # (chunk, n)
            out[start:start + chunk, k] = (marginal @ nodes) / marginal.sum(axis=1)
    return out


# --------------------------------------------------------------------------------------------
# Gaussian: Gauss-Hermite
# --------------------------------------------------------------------------------------------
def gaussian_tilted_mean_quadrature(mean, cov, a, n_nodes=40):
    r"""Tilted mean of ``N(mean, cov)`` by tensor-product Gauss-Hermite quadrature.

    Maths. Factor ``cov = R R^T`` with the eigen-decomposition ``cov = Q diag(lam) Q^T``,
    ``R = Q diag(sqrt(lam))``, keeping only the ``r`` columns with ``lam_k > 0`` (numerically:
    ``lam_k > 8 D eps lam_max``), so a singular ``cov`` is handled by integrating over its range
    only. Then ``z = mean + R x`` with ``x ~ N(0, I_r)`` and, with ``b = R^T a``,

        E[e^{a.z} z] / E[e^{a.z}] = mean + R E[e^{b.x} x] / E[e^{b.x}]

    (the factor ``e^{a.mean}`` cancels). The expectations over ``N(0, I_r)`` use the
    probabilists' Gauss-Hermite rule (:func:`numpy.polynomial.hermite_e.hermegauss`, weight
    ``e^{-x^2/2}``), ``n_nodes`` points per axis, tensorised to ``n_nodes**r`` points:

        E[g(x)] ~= sum_{i_1..i_r} w_{i_1}..w_{i_r} g(x_{i_1}, .., x_{i_r}) / (sqrt(2 pi))^r,

    and the normalisation cancels in the ratio. No Gaussian identity beyond the change of
    variables is used (in particular not ``mean + cov a``).

    Accuracy. Gauss-Hermite is exact for polynomials of degree ``< 2 n_nodes`` times the
    weight; ``e^{b.x}`` is not a polynomial, and the tilted integrand ``e^{-|x - b|^2/2}`` has
    to be resolved by nodes that reach only ``|x| <= ~sqrt(4 n_nodes)``. The tensor rule
    factorises over axes, so the error on coordinate ``k`` of ``E[x]`` is the 1-D error at
    ``b_k``, with ``|b_k| <= ||b|| = ||cov^{1/2} a|| = sqrt(a^T cov a)``. Measured 1-D absolute
    errors on ``E[x]`` (exact value ``b``):

        ============  ========  ========  ========  ========  ========
        n_nodes       |b| <= 3  |b| = 4   |b| = 5   |b| = 6   |b| = 8
        ============  ========  ========  ========  ========  ========
        20            4e-11     5e-7      3e-4      2e-2      7e-1
        30            4e-16     1e-14     5e-10     1e-6      2e-2
        40 (default)  4e-16     9e-16     4e-16     2e-12     1e-5
        60            3e-16     4e-16     9e-16     2e-15     9e-16
        ============  ========  ========  ========  ========  ========

    So the default ``n_nodes=40`` is at rounding level (~1e-15 times the scale
    ``sqrt(lam_max)`` of ``R``) for ``sqrt(a^T cov a) <= 5``; use ``n_nodes=60`` up to about 8.
    Cost is ``n_nodes**r`` exponentials per row of ``a`` (2.56e6 for D = 4 at the default).

    Parameters
    ----------
    mean : array (D,)
    cov : array (D, D), symmetric positive semi-definite (possibly singular)
    a : array (..., D), logit vectors; leading axes are vectorised over
    n_nodes : int, Gauss-Hermite points per axis

    Returns
    -------
    array (..., D), same leading shape as ``a``.

    Raises
    ------
    ValueError
        naming the argument: non-finite entries, ``mean`` not a vector, ``cov`` not ``(D, D)``,
        not symmetric or not positive semi-definite, ``a`` without trailing dimension ``D``,
        ``D > 4``, ``n_nodes`` not a positive integer or ``n_nodes**D > 2**25``.
    """
    mean = _finite_array(mean, "mean")
    if mean.ndim != 1:
        raise ValueError(f"mean must be a vector of shape (D,), got shape {mean.shape}")
    D = mean.shape[0]
    _check_dim(D, "mean")
    cov = _finite_array(cov, "cov")
    if cov.shape != (D, D):
        raise ValueError(f"cov must have shape ({D}, {D}) to match mean, got shape {cov.shape}")
    scale = max(1.0, float(np.abs(cov).max()))
    if np.abs(cov - cov.T).max() > 1e-12 * scale:
        raise ValueError("cov must be symmetric")
    lam, Q = np.linalg.eigh(0.5 * (cov + cov.T))
    if lam.min() < -1e-10 * max(1.0, lam.max()):
        raise ValueError(f"cov must be positive semi-definite (smallest eigenvalue {lam.min():.3g})")
    a = _check_logits(a, D)
    n_nodes = _check_n_nodes(n_nodes, D)

    keep = lam > 8 * D * np.finfo(float).eps * max(lam.max(), 0.0)
    R = Q[:, keep] * np.sqrt(lam[keep])  # (D, r), cov ~= R R^T
    x, w = hermegauss(n_nodes)
    pos = w > 0  # far-tail weights may underflow for very large n_nodes
    Ex = _tensor_tilted_mean(_logit_coefficients(a.reshape(-1, D), R), x[pos], np.log(w[pos]))  # (B, r)
    return (mean + Ex @ R.T).reshape(a.shape)


# --------------------------------------------------------------------------------------------
# product laws z = S u: Uniform (Gauss-Legendre) and Rademacher (enumeration)
# --------------------------------------------------------------------------------------------
def _scale_from(S, a):
    S = _finite_array(S, "S")
    if S.ndim == 0:
        a_arr = np.asarray(a)
        if a_arr.ndim == 0:
            raise ValueError(f"a must have shape (..., D), got shape {a_arr.shape}")
        D = a_arr.shape[-1]
        _check_dim(D, "a")
        return S * np.eye(D)
    if S.ndim == 1:
        _check_dim(S.shape[0], "S")
        return np.diag(S)
    if S.ndim == 2 and S.shape[0] == S.shape[1]:
        _check_dim(S.shape[0], "S")
        return S
    raise ValueError(f"S must be a scalar, a vector (diagonal) or a square (D, D) matrix, got shape {S.shape}")


def product_law_tilted_mean_quadrature(kind, S, a, n_nodes=40):
    r"""Tilted mean of ``z = S u`` with ``u`` i.i.d. per coordinate, by quadrature/enumeration.

    Maths. With ``b = S^T a`` (so ``a.z = b.u``),

        E[e^{a.z} z] / E[e^{a.z}] = S E[e^{b.u} u] / E[e^{b.u}].

    * ``kind="uniform"``: ``u_k`` uniform on ``[-sqrt3, sqrt3]`` (unit variance). Tensor
      Gauss-Legendre rule (:func:`numpy.polynomial.legendre.leggauss`) with ``n_nodes`` points
      per axis mapped to ``u = sqrt3 t``; the uniform density and the ``sqrt3`` Jacobian cancel
      in the ratio. Gauss-Legendre is exact for polynomials of degree ``< 2 n_nodes``; its nodes
      cluster at the ends of the interval, where the tilted density ``~ e^{b_k u}`` piles up for
      large ``|b_k|``. Measured 1-D absolute errors on ``E[u]``: ``n_nodes=40`` gives ~5e-15 for
      ``|b_k| <= 30`` and 2e-8 at ``|b_k| = 100``; ``n_nodes=20`` ~3e-15 for ``|b_k| <= 10``.
      (The ~3e-15 floor comes from rounding in the tabulated nodes and weights.)
    * ``kind="rademacher"``: ``u_k = +-1``. Exact enumeration of the ``2^D`` sign vectors with
      equal weights: a finite sum, so the only error is rounding (for any ``b``). ``n_nodes``
      is ignored.

    Parameters
    ----------
    kind : ``"uniform"`` or ``"rademacher"``
    S : scalar (times identity, ``D`` from ``a``), vector (diagonal) or ``(D, D)`` matrix
    a : array (..., D), logit vectors; leading axes are vectorised over
    n_nodes : int, Gauss-Legendre points per axis (uniform only)

    Returns
    -------
    array (..., D), same leading shape as ``a``.

    Raises
    ------
    ValueError
        naming the argument: unknown ``kind``, bad shape or non-finite ``S`` or ``a``,
        ``D > 4``, ``n_nodes`` not a positive integer or (uniform) ``n_nodes**D > 2**25``.
    """
    if kind not in _PRODUCT_KINDS:
        raise ValueError(f"kind must be one of {list(_PRODUCT_KINDS)}, got {kind!r}")
    S = _scale_from(S, a)
    D = S.shape[0]
    a = _check_logits(a, D)
    n_nodes = _check_n_nodes(n_nodes, D if kind == "uniform" else 1)

    if kind == "uniform":
        t, w = leggauss(n_nodes)
        nodes, log_w = np.sqrt(3.0) * t, np.log(w)
    else:
        nodes, log_w = np.array([-1.0, 1.0]), np.zeros(2)
    Eu = _tensor_tilted_mean(_logit_coefficients(a.reshape(-1, D), S), nodes, log_w)  # (B, D)
    return (Eu @ S.T).reshape(a.shape)
