"""Quadrature of tilted means: independent numerical checks of the closed forms in ``laws``.

The tilted mean of a law ``mu`` on ``R^D`` at logit vector ``a`` is

    T_mu(a) = E_mu[e^{a.z} z] / E_mu[e^{a.z}] = grad K_mu(a),

the infinite-prompt read-out of softmax attention (docs/models.md, section 1). This module computes it by
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
gaussian_mixture_rule(weights, means, covs, n_nodes=40)
    Nodes and log-weights of a rule for ``sum_k pi_k N(m_k, S_k)``: the union of the
    components' Gauss-Hermite grids (any expectation under the mixture, not only the tilted mean).
gaussian_mixture_tilted_mean_quadrature(weights, means, covs, a, n_nodes=40)
    The tilted mean of the mixture by a softmax over the nodes of that rule.
normal_expectation(g, r, n_nodes=120)
    ``E g(s)``, ``s ~ N(0, r^2)``, by 1-D Gauss-Hermite (smooth ``g`` of moderate ``r`` only).
graded_normal_rule(r, points)
    Nodes and weights of ``E g(s)``, ``s ~ N(0, r^2)``, for ``g`` with unit-scale transitions at
    ``points`` (a sigmoid's), at any ``r``: composite Gauss-Legendre (the kernel attention gains).
"""
from __future__ import annotations

import functools

import numpy as np
from numpy.polynomial.hermite_e import hermegauss
from numpy.polynomial.legendre import leggauss

from .validation import component_covariances, finite_array

__all__ = ["gaussian_tilted_mean_quadrature", "product_law_tilted_mean_quadrature", "gaussian_mixture_rule",
           "gaussian_mixture_tilted_mean_quadrature", "normal_expectation", "graded_normal_rule", "MAX_DIM"]

MAX_DIM = 4
_CHUNK_ELEMENTS = 1 << 22  # rows of a per chunk x grid nodes; 4M float64 = 32 MB per work array
_MAX_GRID = 1 << 25  # n_nodes**D above this (268 MB per work array) is refused
_MAX_MIXTURE_NODES = 1 << 22  # K n_nodes**D nodes stored explicitly, (N, D): 128 MB at D = 4
_PRODUCT_KINDS = ("rademacher", "uniform")


# --------------------------------------------------------------------------------------------
# validation
# --------------------------------------------------------------------------------------------
def _check_dim(D, name):
    if D < 1 or D > MAX_DIM:
        raise ValueError(
            f"{name} gives dimension D = {D}; tensor-product quadrature supports 1 <= D <= {MAX_DIM} "
            f"(the grid has n_nodes**D points)"
        )


def _check_logits(a, D):
    a = finite_array(a, "a")
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
    mean = finite_array(mean, "mean")
    if mean.ndim != 1:
        raise ValueError(f"mean must be a vector of shape (D,), got shape {mean.shape}")
    D = mean.shape[0]
    _check_dim(D, "mean")
    cov = finite_array(cov, "cov")
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
    S = finite_array(S, "S")
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


# --------------------------------------------------------------------------------------------
# Gaussian mixtures: the union of the components' Gauss-Hermite grids
# --------------------------------------------------------------------------------------------
def _check_mixture(weights, means, covs):
    """Validated ``(pi (K,), means (K, D), covs (K, D, D))``; covs may be (K, D) diagonals or (K,)
    scalars."""
    w = finite_array(weights, "weights")
    if w.ndim != 1 or w.shape[0] < 1:
        raise ValueError(f"weights must be a non-empty vector of shape (K,), got shape {w.shape}")
    if not np.all(w > 0):
        raise ValueError("weights must be positive")
    if abs(w.sum() - 1.0) > 1e-9:
        raise ValueError(f"weights must sum to 1 (within 1e-9), got sum {w.sum()!r}")
    K = w.shape[0]
    m = finite_array(means, "means")
    if m.ndim != 2 or m.shape[0] != K:
        raise ValueError(f"means must have shape (K, D) with K = {K} (from weights), got shape {m.shape}")
    D = m.shape[1]
    _check_dim(D, "means")
    c = component_covariances(covs, K, D)
    return w / w.sum(), m, c


def gaussian_mixture_rule(weights, means, covs, n_nodes=40):
    r"""Quadrature rule for the Gaussian mixture ``sum_k pi_k N(m_k, S_k)`` on ``R^D``.

    Maths. Each component is integrated as in :func:`gaussian_tilted_mean_quadrature`:
    ``S_k = R_k R_k^T`` by eigen-decomposition, keeping the ``r_k`` directions with
    ``lam > 8 D eps lam_max``, and ``z = m_k + R_k x`` with ``x ~ N(0, I_{r_k})`` on the tensor
    grid of ``n_nodes`` probabilists' Gauss-Hermite points per axis. The rule for the mixture is
    the union of the ``K`` grids, node ``z = m_k + R_k x_i`` carrying the weight

        log W = log pi_k + sum_j log w_{i_j} - (r_k / 2) log(2 pi),

    (the Gauss-Hermite weights sum to ``sqrt(2 pi)`` per axis), so that
    ``E f(z) ~= sum_nodes W f(z)``, with ``sum W = 1`` up to the rounding of the tabulated
    weights. A component with ``S_k = 0`` is the single node ``m_k``. No identity of the mixture
    (its moments, its tilted mean) is used.

    Accuracy. Component ``k`` contributes with the 1-D Gauss-Hermite error at
    ``b = R_k^T c`` for an integrand ``e^{c.z}`` times a low-degree polynomial (see the table in
    :func:`gaussian_tilted_mean_quadrature`): rounding level for ``sqrt(c^T S_k c) <= 5`` with 40
    nodes, up to about 8 with 60.

    Parameters
    ----------
    weights : array (K,), positive, summing to 1 within 1e-9 (then divided by the sum)
    means : array (K, D), ``1 <= D <= 4``
    covs : array (K, D, D) symmetric PSD, or (K, D) diagonals, or (K,) scalars times ``I_D``
    n_nodes : int, Gauss-Hermite points per axis

    Returns
    -------
    nodes : array (N, D), ``N = sum_k n_nodes**r_k``
    log_weights : array (N,)

    Raises
    ------
    ValueError
        naming the argument: non-finite entries, weights not positive or not summing to 1,
        shapes that do not match, a ``covs[k]`` not symmetric or not PSD, ``D > 4``,
        ``n_nodes`` not a positive integer or more than ``2**22`` nodes in all.
    """
    pi, means, covs = _check_mixture(weights, means, covs)
    K, D = means.shape
    n_nodes = _check_n_nodes(n_nodes, D)
    if K * n_nodes**D > _MAX_MIXTURE_NODES:
        raise ValueError(f"n_nodes = {n_nodes} in D = {D} with K = {K} components gives {K * n_nodes**D:.3g} nodes "
                         f"(limit {_MAX_MIXTURE_NODES:.3g})")
    x, w = hermegauss(n_nodes)
    pos = w > 0  # far-tail weights may underflow for very large n_nodes
    x, log_w = x[pos], np.log(w[pos]) - 0.5 * np.log(2 * np.pi)
    nodes, log_weights = [], []
    for k in range(K):
        S = covs[k]
        scale = max(1.0, float(np.abs(S).max()))
        if np.abs(S - S.T).max() > 1e-12 * scale:
            raise ValueError(f"covs[{k}] must be symmetric")
        lam, Q = np.linalg.eigh(0.5 * (S + S.T))
        if lam.min() < -1e-10 * max(1.0, lam.max()):
            raise ValueError(f"covs[{k}] must be positive semi-definite (smallest eigenvalue {lam.min():.3g})")
        keep = lam > 8 * D * np.finfo(float).eps * max(lam.max(), 0.0)
        R = Q[:, keep] * np.sqrt(lam[keep])  # (D, r), S ~= R R^T
        r = R.shape[1]
        idx = np.indices((x.size,) * r).reshape(r, x.size**r).T  # (n**r, r) multi-indices, one per node
        nodes.append(means[k] + x[idx] @ R.T)
        log_weights.append(np.log(pi[k]) + log_w[idx].sum(axis=1))
    return np.concatenate(nodes), np.concatenate(log_weights)


def gaussian_mixture_tilted_mean_quadrature(weights, means, covs, a, n_nodes=40):
    r"""Tilted mean of ``sum_k pi_k N(m_k, S_k)`` by the rule of :func:`gaussian_mixture_rule`.

    Maths. ``E[e^{a.z} z] / E[e^{a.z}] ~= sum_i W_i e^{a.z_i} z_i / sum_i W_i e^{a.z_i}`` over
    every node ``z_i`` of every component: a softmax over the nodes with logits
    ``log W_i + a.z_i``, evaluated with their maximum subtracted (nothing overflows; the
    posterior weight of each component is implicit in its nodes' share of the softmax, no closed
    form is used). The leading axes of ``a`` are processed in chunks of about 32 MB.

    Accuracy. That of the rule (see :func:`gaussian_mixture_rule`) at ``c = a``: with the
    default 40 nodes, rounding level while ``sqrt(a^T S_k a) <= 5`` for every component that
    carries weight at ``a``. The logits are rounded to ``~eps |a.z|``, a relative error
    ``~eps |a.z|`` on the weights.

    Parameters
    ----------
    weights, means, covs, n_nodes : as :func:`gaussian_mixture_rule` (``D <= 3`` keeps it quick:
        ``K n_nodes**D`` nodes, 6.4e4 per component at ``D = 3``)
    a : array (..., D), logit vectors; leading axes are vectorised over

    Returns
    -------
    array (..., D), same leading shape as ``a``.

    Raises
    ------
    ValueError
        as :func:`gaussian_mixture_rule`, and ``a`` without trailing dimension ``D`` or not
        finite.
    """
    nodes, log_w = gaussian_mixture_rule(weights, means, covs, n_nodes)
    D = nodes.shape[1]
    a = _check_logits(a, D)
    flat = a.reshape(-1, D)
    out = np.empty_like(flat)
    chunk = max(1, _CHUNK_ELEMENTS // nodes.shape[0])
    for start in range(0, flat.shape[0], chunk):
        with np.errstate(over="ignore", invalid="ignore"):
            logits = log_w + flat[start:start + chunk] @ nodes.T  # (chunk, N)
        if not np.all(np.isfinite(logits)):
            raise ValueError("a is too large: a.z overflows float64 on the quadrature nodes")
        p = np.exp(logits - logits.max(axis=1, keepdims=True))
        out[start:start + chunk] = (p @ nodes) / p.sum(axis=1, keepdims=True)
    return out.reshape(a.shape)


# --------------------------------------------------------------------------------------------
# one-dimensional Gaussian expectations (kernel attention gains)
# --------------------------------------------------------------------------------------------


def normal_expectation(g, r, n_nodes=120):
    """``E[g(s)]`` for ``s ~ N(0, r^2)`` by ``n_nodes``-point Gauss-Hermite (probabilists') quadrature.

    ``g`` is a vectorised function of ``s``; ``r >= 0`` broadcasts (result shaped like ``r``).
    Exact for polynomials of degree < ``2 n_nodes``; for smooth ``g`` (exponentials of moderate
    rate) it converges geometrically; for kinked ``g`` (ReLU) only algebraically. The nodes reach
    only ``|s| <= ~sqrt(4 n_nodes) r``, so a feature of ``g`` of width ``w`` is resolved only while
    ``r`` is small against ``w``: a sigmoid's (``w = 1``) to 4e-13 at ``r = 2``, 5e-5 at ``r = 5``
    (120 nodes). Use :func:`graded_normal_rule` for those.
    """
    r = finite_array(r, "r")
    if np.any(r < 0):
        raise ValueError(f"r (a standard deviation) must be >= 0, got {r}")
    if not (isinstance(n_nodes, (int, np.integer)) and n_nodes >= 1):
        raise ValueError(f"n_nodes must be an integer >= 1, got {n_nodes!r}")
    x, w = _normal_rule(int(n_nodes))
    return np.asarray(g(r[..., None] * x)) @ w


@functools.lru_cache(maxsize=8)
def _normal_rule(n_nodes):
    """Nodes and weights of ``E g(x)``, ``x ~ N(0, 1)`` (computed once per ``n_nodes``: an eigenproblem)."""
    x, w = hermegauss(n_nodes)
    x.flags.writeable = w.flags.writeable = False
    return x, w / np.sqrt(2 * np.pi)


_PANEL_XI, _PANEL_OMEGA = leggauss(20)   # Gauss-Legendre on [-1, 1], per panel
_PANEL_XI.flags.writeable = _PANEL_OMEGA.flags.writeable = False
_X_MAX = 40.0                            # |x| beyond 40: the N(0, 1) density < 1e-347 underflows
_X_PANELS = np.linspace(-_X_MAX, _X_MAX, 41)   # panels of width 2 in x = s / r


def _graded_breakpoints(r, points):
    """Panel ends in ``x = s / r``, sorted, shape ``lead + (n,)``: the uniform grid
    :data:`_X_PANELS` and, around each point ``t`` (in ``s``), ``t`` and ``t +- 2^k``
    (``k = 0 .. K-1``, ``2^(K-1) >= 4 max r``), clipped to ``[-40, 40]``. At ``r = 0`` the integrand
    does not depend on ``x`` and any panels do: ``r = 1`` places them."""
    lead = points.shape[:-1]
    scale = np.where(r > 0, r, 1.0)[..., None]
    K = int(np.ceil(np.log2(max(4.0 * float(np.max(scale, initial=0.0)), 1.0)))) + 1
    steps = np.concatenate([-(2.0 ** np.arange(K)), [0.0], 2.0 ** np.arange(K)])
    graded = (points[..., :, None] + steps).reshape(lead + (-1,)) / scale
    x = np.concatenate([np.broadcast_to(_X_PANELS, lead + _X_PANELS.shape), np.clip(graded, -_X_MAX, _X_MAX)], -1)
    return np.sort(x, axis=-1)


def graded_normal_rule(r, points):
    """Nodes ``s`` and weights ``w`` with ``E g(s) ~= sum(w * g(s), axis=-1)`` for ``s ~ N(0, r^2)``:
    both of shape ``lead + (N,)``, ``lead`` the broadcast of ``r.shape`` and ``points.shape[:-1]``.

    ``r >= 0`` (array); ``points (..., P)``: the values of ``s`` around which ``g`` changes on the
    unit scale (a sigmoid ``sigma(s + b)``: ``-b``). Composite 20-point Gauss-Legendre in
    ``x = s / r`` over ``|x| <= 40`` (the Gaussian weight underflows beyond), with panels of width
    at most 2 in ``x`` and, on both sides of each point ``t``, geometrically graded panels
    ``[t + 2^k, t + 2^(k+1)]`` in ``s`` (widths 1, 2, 4, ... out to ``4 r``). So every panel is
    short against the Gaussian's scale and against its distance to the complex singularities of
    ``g`` near ``t`` (a sigmoid's poles are at ``t + i pi (2j + 1)``): the rule converges
    geometrically on each panel whatever ``r`` and ``t``. Measured against adaptive quadrature
    (``scipy.integrate.quad``) for ``sigma^k`` times ``1, s^2`` and ``sigma'``: at most 1e-14
    relative for ``1e-6 <= r <= 1e8`` and ``|t| <= 700``. ``g`` must be finite at the nodes.

    Cost: ``20 (40 + 2 P (K + 1))`` nodes, ``K = ceil(log2(max(4 max r, 1))) + 1`` (980 nodes for
    one point and ``r <= 2``).
    """
    r = finite_array(r, "r")
    if np.any(r < 0):
        raise ValueError(f"r (a standard deviation) must be >= 0, got {r}")
    points = finite_array(points, "points")
    if points.ndim == 0:
        raise ValueError(f"points must have shape (..., P), got shape {points.shape}")
    lead = np.broadcast_shapes(r.shape, points.shape[:-1])
    r = np.broadcast_to(r, lead)
    x = _graded_breakpoints(r, np.broadcast_to(points, lead + points.shape[-1:]))
    half, mid = (x[..., 1:] - x[..., :-1]) / 2, (x[..., 1:] + x[..., :-1]) / 2
    nodes = (mid[..., None] + half[..., None] * _PANEL_XI).reshape(lead + (-1,))
    w = (half[..., None] * _PANEL_OMEGA).reshape(lead + (-1,)) * np.exp(-nodes**2 / 2) / np.sqrt(2 * np.pi)
    return r[..., None] * nodes, w
