"""Off-block curvature of the C3 risks along a block-structured trajectory (docs/performance.md).

From a block-structured point ``theta = (U, v)`` (``U[d, :] = 0``, ``U[:d, d] = 0``, ``v[:d] = 0``)
on antithetic tasks, the risk is even in the active off-block coordinates
``delta = (alpha, beta) = (U[d, :d], v[:d])`` (``2 d`` of them; ``U[:, d]`` multiplies
``z_q[d] = 0`` and has no gradient). So the block-structured trajectory of gradient descent is
exact, and a small off-block perturbation ``delta_t`` evolves by the linearised map

    delta_{t+1} = (I - lr H_off(theta_t)) delta_t,

``H_off`` the ``2d x 2d`` Hessian of the risk in ``delta``. It grows where the spectral radius
``rho_t = max |1 - lr lambda(H_off(theta_t))|`` exceeds 1; past the edge ``lambda_max > 2 / lr``
it grows by ``~rho_t`` a step, its sign flipping (a step-size instability). Computing ``H_off``
at the stored checkpoints says where the block structure is unstable without training every
model a second time from a perturbed init.

``H_off`` in closed form. Per task and query the read-out is ``f = v . m`` and the risk
``R = mean 1/2 (f - y_q)^2``, so ``H_off = mean[grad f grad f^T + (f - y_q) hess f]`` with the
derivatives of ``f`` in ``delta`` at the block-structured point (``v . z = v_d y`` there):

* softmax(L), ``m = sum_k p_k z_k``, ``p = softmax_k(z_k^T U z_q)`` over the first ``L`` tokens;
  ``alpha_i`` adds ``alpha_i x_q[i] y_k`` to the logits, so with the moments of the tokens under
  ``p`` (mean ``m``, variance ``Var_p(y)``, covariances ``Cov_p(x_j, y)``, third central moment
  ``k3_p(y)``):

      df/dalpha_i = x_q[i] v_d Var_p(y),      df/dbeta_j = m_j,
      d2f/dalpha_i dalpha_j = x_q[i] x_q[j] v_d k3_p(y),
      d2f/dalpha_i dbeta_j = x_q[i] Cov_p(x_j, y),      d2f/dbeta^2 = 0;

* linear(L) and linear(inf), ``f = v^T G U z_q`` (``G = Ghat_L`` or ``Gamma_w``):

      df/dalpha_i = x_q[i] (G^T v)_d,   df/dbeta_j = (G U z_q)_j,
      d2f/dalpha_i dbeta_j = x_q[i] G[j, d],   d2f/dalpha^2 = 0,   d2f/dbeta^2 = 0.

On exact antithetic pairs (tasks ``2i``, ``2i + 1``: same covariates, opposite labels) the two
partners have the same softmax weights at a block-structured point and ``r``, ``k3_p(y)``,
``Cov_p(x, y)`` change sign together while ``grad f`` is unchanged, so every term of the mean is
equal across partners: the softmax Hessian is computed on one partner of each pair. One pass of
the shared softmax core (:func:`sfxlin.softmax_core.prefix_moments`, online max shift) over half
the tasks' tokens gives the moments of every prompt length, checkpoint and query at once (nested
prompts), from the raw moments of ``[1, x, y, x y, y^2, y^3]`` (the raw-to-central step loses
< 1e-13 of the Hessian's largest entry on the C3 paper cells), where differences of the engine's
gradients needed ``2 d + 1`` passes per prompt length (``2 d`` of them over both partners).
Checked against central differences of the analytic per-L gradients ``icl.risk_grad``
(tests/test_speed_invariance.py).
"""
from __future__ import annotations

import numpy as np

from . import icl
from .softmax_core import normalised, prefix_moments
from .training import pair_structure, validate_Ls

__all__ = ["off_block_coordinates", "off_block_hessian", "curvature_extremes", "spectral_radius"]

#: bytes of softmax moments and Hessian terms per pass of :func:`_softmax_hessian` (bounds its memory)
_MOMENT_BYTES = 1 << 24


def off_block_coordinates(U, v):
    """The active off-block coordinates ``(U[..., d, :d], v[..., :d])`` -> ``(..., 2d)``."""
    d = U.shape[-1] - 1
    return np.concatenate([U[..., d, :d], v[..., :d]], axis=-1)


def _assemble(r, g, hess_aa, hess_ab):
    """``mean[g g^T + r hess f]`` over tasks and queries: ``r (..., n, q)``, ``g (..., n, q, 2d)``,
    the ``alpha alpha`` (None: 0) and ``alpha beta`` blocks of ``hess f`` ``(..., n, q, d, d)``
    (the ``beta beta`` block is 0) -> ``(..., 2d, 2d)``."""
    d = g.shape[-1] // 2
    n_items = r.shape[-1] * r.shape[-2]
    H = np.einsum("...nqa,...nqb->...ab", g, g)
    if hess_aa is not None:
        H[..., :d, :d] += np.einsum("...nq,...nqij->...ij", r, hess_aa)
    cross = np.einsum("...nq,...nqij->...ij", r, hess_ab)
    H[..., :d, d:] += cross
    H[..., d:, :d] += np.swapaxes(cross, -1, -2)
    return H / n_items


def _softmax_hessian(tasks, Ls, U, v):
    """``H_off (nL, T, 2d, 2d)`` of softmax(L) for every ``L = Ls[i]`` at ``U[i] (T, D, D)``,
    ``v[i] (T, D)``: the softmax moments of all prompt lengths, checkpoints and queries of a task
    in one :func:`~sfxlin.softmax_core.prefix_moments` pass over its tokens (the column of
    ``(L_i, t, query)`` reaches block ``i`` of the nested prompts ``(0,) + Ls``), on the raw
    features ``[1, x, y, x y, y^2, y^3]``; the central moments follow from them. Checkpoints are
    taken so that a pass holds about ``_MOMENT_BYTES`` of moments and Hessian terms."""
    d, x_q, y_q = tasks.d, tasks.x_q, tasks.y_q
    nL, T = U.shape[:2]
    n, q = y_q.shape
    Z = tasks.prompt(Ls[-1])
    X, y = np.swapaxes(Z[..., :d], 1, 2), Z[..., d]                               # (n, d, L), (n, L)
    phi = np.ascontiguousarray(np.concatenate(
        [np.ones_like(y)[:, None], X, y[:, None], X * y[:, None], (y ** 2)[:, None], (y ** 3)[:, None]], axis=1))
    X = np.ascontiguousarray(X)
    edges = (0,) + tuple(Ls)
    F = phi.shape[1]
    tc = max(1, _MOMENT_BYTES // (8 * nL * n * q * (F + d * d)))                 # checkpoints per pass
    H = np.empty((nL, T, 2 * d, 2 * d))
    for t0 in range(0, T, tc):
        Uc, vc = U[:, t0:t0 + tc], v[:, t0:t0 + tc]
        Tc = Uc.shape[1]
        A = np.einsum("ltij,nqj->nltqi", Uc[..., :d, :d], x_q).reshape(n, nL * Tc * q, d)   # U z_q, x part
        reach = np.repeat(np.arange(nL), Tc * q)
        _, P = prefix_moments(phi, edges, A=A, X=X, reach=reach, at_reach=True)
        mom = np.moveaxis(normalised(P).reshape(n, nL, Tc, q, F - 1), 0, 2)      # (nL, Tc, n, q, F - 1)
        m_x, m_y, m_xy, m_yy, m_yyy = (mom[..., :d], mom[..., d], mom[..., d + 1:2 * d + 1],
                                       mom[..., 2 * d + 1], mom[..., 2 * d + 2])
        cov_xy = m_xy - m_x * m_y[..., None]
        var_y = m_yy - m_y ** 2
        k3_y = m_yyy - 3 * m_y * m_yy + 2 * m_y ** 3
        vd = vc[..., d][..., None, None]                                          # (nL, Tc, 1, 1)
        r = m_y * vd - y_q                                                        # v . m, v[:d] = 0
        g = np.concatenate([x_q * (vd * var_y)[..., None], m_x], axis=-1)
        hess_aa = (vd * k3_y)[..., None, None] * x_q[..., :, None] * x_q[..., None, :]
        hess_ab = x_q[..., :, None] * cov_xy[..., None, :]
        H[:, t0:t0 + tc] = _assemble(r, g, hess_aa, hess_ab)
    return H


def _linear_hessian(tasks, G, U, v):
    """``H_off (nL, T, 2d, 2d)`` of a linear model with matrices ``G (nL, n, D, D)`` at
    ``U (nL, T, D, D)``, ``v (nL, T, D)``."""
    d, x_q, z_q = tasks.d, tasks.x_q, tasks.z_q
    h = np.einsum("lnij,ltjk,nqk->ltnqi", G, U, z_q)              # G U z_q
    r = np.einsum("ltnqi,lti->ltnq", h, v) - tasks.y_q
    Gtv_d = np.einsum("lnj,ltj->ltn", G[..., :, d], v)            # (G^T v)_d
    g = np.concatenate([Gtv_d[..., None, None] * x_q, h[..., :d]], axis=-1)
    hess_ab = x_q[None, :, :, :, None] * G[:, :, None, None, :d, d]   # (l, n, q, d, d)
    hess_ab = np.broadcast_to(hess_ab[:, None], r.shape + (d, d))
    return _assemble(r, g, None, hess_ab)


def off_block_hessian(model, tasks, Ls, U, v):
    """``H_off (nL, T, 2d, 2d)``: Hessian of the training risk of ``model`` in the active
    off-block coordinates at the block-structured parameters ``U (nL, T, D, D)``,
    ``v (nL, T, D)`` (``nL = len(Ls)``, parameter ``i`` evaluated at ``Ls[i]``; for
    ``linear_inf`` pass ``Ls = None`` and ``nL = 1``), in closed form (see the module docstring).
    Raises ValueError if the parameters are not block structured (the formulas, and the
    linearised map, hold only there)."""
    U, v = np.asarray(U, dtype=float), np.asarray(v, dtype=float)
    if U.ndim != 4 or v.ndim != 3 or U.shape[:2] != v.shape[:2] or U.shape[-1] != tasks.D:
        raise ValueError(f"U must be (nL, T, {tasks.D}, {tasks.D}) and v (nL, T, {tasks.D}), got {U.shape}, {v.shape}")
    if model not in icl.MODELS:
        raise ValueError(f"model: expected one of {icl.MODELS}, got {model!r}")
    if model == "linear_inf":
        if Ls is not None or U.shape[0] != 1:
            raise ValueError("Ls: linear_inf takes Ls = None and one parameter stack (nL = 1)")
    else:
        Ls = validate_Ls(Ls, tasks.L_max)
        if U.shape[0] != len(Ls):
            raise ValueError(f"U: {U.shape[0]} parameter stacks for {len(Ls)} prompt lengths Ls")
    d = tasks.d
    if np.any(off_block_coordinates(U, v)) or np.any(U[..., :d, d]) or np.any(U[..., d, d]):
        raise ValueError("U, v: the parameters must be block structured (U[d, :] = U[:d, d] = 0, v[:d] = 0)")
    if model == "softmax":
        if pair_structure(tasks) == 2:      # partners' terms are equal at block structure: one of each
            tasks = tasks.subset(slice(0, None, 2))
        H = _softmax_hessian(tasks, Ls, U, v)
    elif model == "linear":
        H = _linear_hessian(tasks, tasks.Ghat(Ls), U, v)
    else:
        H = _linear_hessian(tasks, icl.model_matrix("linear_inf", tasks)[None], U, v)
    if not np.all(np.isfinite(H)):
        raise FloatingPointError(f"non-finite off-block Hessian of {model}")
    return H


def curvature_extremes(H):
    """``(lambda_min, lambda_max)`` of symmetric ``H (..., k, k)``, each ``(...)``."""
    lam = np.linalg.eigvalsh(H)
    return lam[..., 0], lam[..., -1]


def spectral_radius(lam_min, lam_max, lr):
    """``max |1 - lr lambda|`` over the spectrum of ``H`` (symmetric): the per-step growth factor
    of an off-block perturbation aligned with the worst mode."""
    return np.maximum(np.abs(1 - lr * np.asarray(lam_min)), np.abs(1 - lr * np.asarray(lam_max)))
