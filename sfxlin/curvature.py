"""Curvature of the C3 risks: the off-block Hessian along a block-structured trajectory
(docs/performance.md), and the whole Hessian of linear(inf) with the step size it allows.

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
from .validation import as_sigma, noise_std

__all__ = ["off_block_coordinates", "off_block_hessian", "curvature_extremes", "spectral_radius",
           "linear_inf_gradient", "linear_inf_hessian", "linear_inf_training_hessian", "linear_training_hessian",
           "block_coordinates", "lambda_max", "block_edge", "faithful_lr", "FAITHFUL_MARGIN"]

#: :func:`faithful_lr`'s default: ``lr = 0.1 * 2 / lambda_max``, the stiffest direction contracting by
#: 0.8 a step, where gradient descent and the gradient flow differ by ``lr^2 lambda^2 / 2 = 2%`` a step
FAITHFUL_MARGIN = 0.1

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


# --------------------------------------------------------------------------- the whole Hessian of linear(inf)


def _active(U, v, Sigma):
    U, v = np.asarray(U, dtype=float), np.asarray(v, dtype=float)
    if U.ndim != 2 or U.shape[0] != U.shape[1] or v.shape != (U.shape[0],) or U.shape[0] < 2:
        raise ValueError(f"U must be (D, D) and v (D,) with D = d + 1 >= 2, got {U.shape} and {v.shape}")
    if not (np.all(np.isfinite(U)) and np.all(np.isfinite(v))):
        raise ValueError("U and v must be finite")
    d = U.shape[0] - 1
    S = as_sigma(Sigma, d)
    if np.linalg.eigvalsh(S)[0] < -1e-12 * max(np.abs(S).max(), 1e-300):
        raise ValueError("Sigma must be positive semi-definite")
    return U[:d, :d], U[d, :d], v[:d], float(v[d]), S


def _place(d, blocks):
    """The ``(D^2 + D)``-square matrix of ``theta = (U row-major, v)`` from the blocks of the active
    parameters ``A = U[:d, :d]`` (``d^2``, row-major), ``b = U[d, :d]``, ``v_x = v[:d]``, ``v_y = v[d]``;
    ``U[:, d]`` multiplies ``z_q[d] = 0``: its rows and columns are 0."""
    D = d + 1
    index = {"A": (np.arange(d)[:, None] * D + np.arange(d)).ravel(), "b": d * D + np.arange(d),
             "vx": D * D + np.arange(d), "vy": np.array([D * D + d])}
    H = np.zeros((D * D + D, D * D + D))
    for (x, y), block in blocks.items():
        block = np.asarray(block, dtype=float).reshape(index[x].size, index[y].size)
        if x == y:                                   # symmetric to rounding: made exactly so
            block = 0.5 * (block + block.T)
        H[np.ix_(index[x], index[y])] = block
        H[np.ix_(index[y], index[x])] = block.T
    return H


def linear_inf_gradient(U, v, Sigma, noise=0.0):
    """Gradient of the population risk of linear(inf), :func:`sfxlin.icl.linear_inf_risk`, at ``(U, v)``:
    ``(grad_U (D, D), grad_v (D,))``, in closed form (see :func:`linear_inf_hessian`)."""
    A, b, vx, vy, S = _active(U, v, Sigma)
    d = S.shape[0]
    m1 = np.trace(S) + noise_std(noise, "noise") ** 2
    S2 = S @ S
    k2 = m1 * m1 + 2 * np.trace(S2)                  # E rho^2
    e = A.T @ S @ vx + vy * m1 * b                   # E c
    Ewc = vy * S @ A + np.outer(S @ vx, b) - np.eye(d)   # E[w c^T]
    Ebc = vy * m1 * A.T @ S @ vx + vy * A.T @ S2 @ vx + (vy * vy * k2 + vx @ S2 @ vx) * b - S @ vx   # E[beta c]
    gU, gv = np.zeros((d + 1, d + 1)), np.zeros(d + 1)
    gU[:d, :d] = (np.outer(S @ vx, e) + vy * S @ Ewc) @ S
    gU[d, :d] = S @ Ebc
    gv[:d] = S @ A @ S @ e + S @ Ewc @ S @ b
    gv[d] = np.trace(S @ A @ S @ Ewc.T) + b @ S @ (m1 * A.T @ S @ vx + vy * k2 * b)
    return gU, gv


def linear_inf_hessian(U, v, Sigma, noise=0.0):
    """Hessian of the population risk of linear(inf) (:func:`sfxlin.icl.linear_inf_risk`, ``w ~ N(0,
    I_d)``, queries of covariance ``Sigma``, prompt-label noise ``noise``) at ``(U, v)``, over all of
    ``theta = (U row-major, v)``: ``(D^2 + D, D^2 + D)``, exact, any parameters.

    The query error is ``c(w) . x_q`` with ``c = A^T g + beta b - w``, ``g = Sigma (v_x + v_y w)``,
    ``beta = v_y rho + v_x . Sigma w``, ``rho = w^T Sigma w + noise^2`` (``A = U[:d, :d]``, ``b =
    U[d, :d]``), so ``R = E_w c^T Sigma c / 2`` (plus the query noise) and ``H = E_w[J^T Sigma J +
    (Sigma c) . c'']``, ``J`` the Jacobian of ``c`` (linear in ``theta``) and ``c''`` its constant second
    derivatives (the products ``A v_x``, ``A v_y``, ``b v_y``, ``b v_x`` of ``c``). Every entry is a
    polynomial of degree <= 4 in ``w``; its expectation follows from ``E w w^T = I``, ``E rho = m_1 =
    tr Sigma + noise^2``, ``E rho w w^T = m_1 I + 2 Sigma``, ``E rho^2 = m_1^2 + 2 tr Sigma^2``.
    ``U[:, d]`` multiplies ``z_q[d] = 0``: its rows and columns are 0."""
    A, b, vx, vy, S = _active(U, v, Sigma)
    d = S.shape[0]
    m1 = np.trace(S) + noise_std(noise, "noise") ** 2
    S2 = S @ S
    k2 = m1 * m1 + 2 * np.trace(S2)
    Svx, Sb, SAS = S @ vx, S @ b, S @ A @ S
    e = A.T @ Svx + vy * m1 * b                                         # E c
    Mg = np.outer(Svx, Svx) + vy * vy * S2                              # E g g^T
    gb = vy * (m1 * S + S2) @ vx                                        # E beta g
    blocks = {
        ("A", "A"): np.einsum("ij,kl->ikjl", Mg, S),
        ("A", "b"): np.einsum("j,kl->jkl", gb, S),
        ("A", "vx"): np.einsum("j,kl->jkl", Svx, SAS.T) + vy * np.einsum("k,jl->jkl", Sb, S2)
        + np.einsum("k,jl->jkl", S @ e, S),                              # + residual E(Sigma c)_k Sigma_jl
        ("A", "vy"): vy * S2 @ A @ S + m1 * np.outer(Svx, Sb)
        + vy * (S @ A.T @ S2).T + np.outer(S2 @ vx, Sb) - S2,             # + residual E(Sigma c)_k (Sigma w)_j
        ("b", "b"): (vy * vy * k2 + vx @ S2 @ vx) * S,
        ("b", "vx"): vy * m1 * SAS.T + np.outer(Sb, S2 @ vx)
        + S @ (vy * A.T @ S2 + np.outer(b, S2 @ vx) - S),                 # + residual E(Sigma c)_j (Sigma w)_l
        ("b", "vy"): S @ A.T @ S2 @ vx + vy * k2 * Sb
        + S @ (m1 * A.T @ Svx + vy * k2 * b),                             # + residual E rho (Sigma c)_j
        ("vx", "vx"): SAS @ A.T @ S + (b @ Sb) * S2,
        ("vx", "vy"): (m1 * S + S2) @ A @ Sb,
        ("vy", "vy"): np.trace(SAS @ A.T @ S) + k2 * (b @ Sb),
    }
    return _place(d, blocks)


def block_coordinates(d):
    """Indices in ``theta = (U row-major, v)`` (``D = d + 1``) of the block coordinates ``U[:d, :d]`` and
    ``v[d]``: the ``d^2 + 1`` parameters a block-structured trajectory moves. At a block-structured point on
    antithetic tasks the risk is even in the off-block coordinates, so the Hessian has no entry between the
    two sets and its eigenvalues are those of either block (those of the block coordinates govern the
    trajectory, the others the growth of an off-block perturbation)."""
    D = d + 1
    return np.concatenate([(np.arange(d)[:, None] * D + np.arange(d)).ravel(), [D * D + d]])


def lambda_max(H, d=None):
    """Largest eigenvalue of the symmetric ``H (..., P, P)``, of all of ``theta`` or, with ``d``, of its block
    coordinates (:func:`block_coordinates`) -> ``(...)``."""
    if d is not None:
        idx = block_coordinates(d)
        H = H[..., idx[:, None], idx]
    return np.linalg.eigvalsh(H)[..., -1]


def _linear_training_hessian(G, z, y_q, U, v):
    """``mean[grad f grad f^T + (f - y_q) hess f]`` over tasks and queries of ``f = v^T G U z_q`` at ``U (...,
    D, D)``, ``v (..., D)`` (leading dims: a batch), ``G (n, D, D)``, ``z (n, q, D)`` -> ``(..., P, P)``."""
    D = U.shape[-1]
    lead = U.shape[:-2]
    U, v = U.reshape((-1, D, D)), v.reshape((-1, D))
    b = U.shape[0]
    h = np.einsum("nij,bjk,nqk->bnqi", G, U, z)                         # G U z_q
    r = np.einsum("bnqi,bi->bnq", h, v) - y_q                           # residuals
    Gv = np.einsum("nij,bj->bni", G, v)
    N = r.shape[1] * r.shape[2]
    J = np.concatenate([np.einsum("bni,nqk->bnqik", Gv, z).reshape(b, N, D * D), h.reshape(b, N, D)], axis=2)
    H = np.einsum("bna,bnc->bac", J, J) / N
    cross = np.einsum("bnq,nij,nqk->bijk", r, G, z).reshape(b, D, D * D) / N   # (v_i, U_jk)
    H[:, D * D:, :D * D] += cross
    H[:, :D * D, D * D:] += np.swapaxes(cross, 1, 2)
    return H.reshape(lead + H.shape[1:])


def _check_theta(tasks, U, v):
    U, v = np.asarray(U, dtype=float), np.asarray(v, dtype=float)
    D = tasks.D
    if U.shape[-2:] != (D, D) or v.shape[-1:] != (D,) or U.shape[:-2] != v.shape[:-1]:
        raise ValueError(f"U must be (..., {D}, {D}) and v (..., {D}) with the same leading dims, got {U.shape} and "
                         f"{v.shape}")
    return U, v


def linear_inf_training_hessian(tasks, U, v):
    """Hessian of the training risk of linear(inf) on ``tasks`` (``mean 1/2 (v^T Gamma_w U z_q -
    y_q)^2`` over tasks and queries, ``Gamma_w`` of :func:`sfxlin.icl.model_matrix`) at ``(U, v)``, over
    ``theta = (U row-major, v)``, exact: each prediction ``f = v^T G U z_q`` is bilinear, so ``H =
    mean[grad f grad f^T + (f - y_q) hess f]`` with ``grad_v f = G U z_q``, ``grad_U f = (G v) z_q^T``
    and ``d^2 f / dv_i dU_jk = G_ij z_q,k``. ``U (..., D, D)``, ``v (..., D)`` -> ``(..., P, P)``,
    ``P = D^2 + D`` (leading dims: e.g. the checkpoints of a run)."""
    U, v = _check_theta(tasks, U, v)
    return _linear_training_hessian(icl.model_matrix("linear_inf", tasks), tasks.z_q, tasks.y_q, U, v)


def linear_training_hessian(tasks, L, U, v):
    """As :func:`linear_inf_training_hessian`, for linear(L): ``G = Ghat_L``, the empirical second moment of
    each task's first ``L`` prompt tokens."""
    U, v = _check_theta(tasks, U, v)
    return _linear_training_hessian(icl.model_matrix("linear", tasks, icl.check_L(L, tasks.L_max)), tasks.z_q,
                                    tasks.y_q, U, v)


def block_edge(tasks, U, v, lr):
    """``lr`` times the largest eigenvalue of the Hessian of linear(inf)'s training risk on ``tasks``
    (:func:`linear_inf_training_hessian`) restricted to the block coordinates ``(U[:d, :d], v[d])``, at each
    of the parameters ``U (n, D, D)``, ``v (n, D)``: ``(n,)``. From the Eq. 9 init on antithetic pairs
    summed first, the off-block coordinates stay exactly 0 (their gradient cancels), so the block Hessian is
    the curvature gradient descent meets; past 2 (the edge of stability) a step overshoots along its top
    eigenvector, whose component grows by ``lr lambda_max - 1`` a step, its sign flipping."""
    U, v = np.asarray(U, dtype=float), np.asarray(v, dtype=float)
    D = tasks.D
    d = D - 1
    if U.ndim != 3 or U.shape[1:] != (D, D) or v.shape != (U.shape[0], D):
        raise ValueError(f"U must be (n, {D}, {D}) and v (n, {D}), got {U.shape} and {v.shape}")
    block = np.r_[(np.arange(d)[:, None] * D + np.arange(d)).ravel(), D * D + d]   # U[:d, :d] row-major, v[d]
    return np.array([lr * np.linalg.eigvalsh(linear_inf_training_hessian(tasks, Ui, vi)[np.ix_(block, block)])[-1]
                     for Ui, vi in zip(U, v)])


def faithful_lr(d, Sigma, margin=FAITHFUL_MARGIN, noise=0.0, tasks=None):
    """The step size ``lr = margin * 2 / lambda_max`` of gradient descent on linear(inf) from the
    Eq. 9 initialisation (:func:`sfxlin.icl.init_theta` of ``Sigma``), ``lambda_max`` the largest
    eigenvalue of the Hessian of its population risk there (:func:`linear_inf_hessian`), or of its
    training risk on ``tasks`` when given (:func:`linear_inf_training_hessian`). With ``margin`` <= 1/2
    the stiffest direction of the quadratic model contracts by ``1 - 2 margin`` a step without
    overshooting: gradient descent then follows the gradient flow ``exp(-lambda t)``, which ``2 / lambda``
    (the edge of stability) does not. Returns ``(lr, lambda_max)``."""
    if not 0 < margin <= 0.5:
        raise ValueError(f"margin must be in (0, 1/2] (lr below 1 / lambda_max: no overshoot), got {margin}")
    U0, v0 = icl.init_theta(d, Sigma)
    H = linear_inf_hessian(U0, v0, Sigma, noise) if tasks is None else linear_inf_training_hessian(tasks, U0, v0)
    lam = float(np.linalg.eigvalsh(H)[-1])
    return 2.0 * margin / lam, lam
