"""Off-block curvature of the C3 risks along a block-structured trajectory (docs/performance.md).

From a block-structured point ``theta = (U, v)`` (``U[d, :] = 0``, ``U[:d, d] = 0``, ``v[:d] = 0``)
on antithetic tasks, the risk is even in the active off-block coordinates
``delta = (U[d, :d], v[:d])`` (``2 d`` of them; ``U[:, d]`` multiplies ``z_q[d] = 0`` and has no
gradient). So the block-structured trajectory of gradient descent is exact, and a small off-block
perturbation ``delta_t`` evolves by the linearised map

    delta_{t+1} = (I - lr H_off(theta_t)) delta_t,

``H_off`` the ``2d x 2d`` Hessian of the risk in ``delta``. It grows where the spectral radius
``rho_t = max |1 - lr lambda(H_off(theta_t))|`` exceeds 1; past the edge ``lambda_max > 2 / lr``
it grows by ``~rho_t`` a step, its sign flipping (a step-size instability). Computing ``H_off``
at the stored checkpoints says where the block structure is unstable without training every
model a second time from a perturbed init.

``H_off`` is computed by differences of the exact gradients of the fast engines
(:class:`sfxlin.training.SoftmaxPrefixEngine`, :class:`sfxlin.training.LinearEngine`), every
prompt length in one call: column ``j`` is ``(g_off(theta + h e_j) - g_off(theta)) / h``. The
gradient is odd in ``delta`` (the risk is even), so this one-sided difference is exact to
``O(h^2)`` relative (``h = 1e-5``: ~1e-10); rounding adds ~``u / h`` ~ 1e-11 relative
(measured against central differences of the analytic per-L gradients: <= 2e-10).
"""
from __future__ import annotations

import numpy as np

from . import icl
from .training import LinearEngine, SoftmaxPrefixEngine, validate_Ls

__all__ = ["off_block_coordinates", "off_block_hessian", "curvature_extremes", "spectral_radius"]


def off_block_coordinates(U, v):
    """The active off-block coordinates ``(U[..., d, :d], v[..., :d])`` -> ``(..., 2d)``."""
    d = U.shape[-1] - 1
    return np.concatenate([U[..., d, :d], v[..., :d]], axis=-1)


def _engine(model, tasks, Ls):
    if model == "softmax":
        return SoftmaxPrefixEngine(tasks, Ls)
    if model == "linear":
        return LinearEngine(tasks, np.stack([icl.Ghat(tasks.Z, L) for L in Ls]))
    if model == "linear_inf":
        return LinearEngine(tasks, icl.model_matrix("linear_inf", tasks)[None])
    raise ValueError(f"model: expected one of {icl.MODELS}, got {model!r}")


def off_block_hessian(model, tasks, Ls, U, v, h=1e-5):
    """``H_off (nL, T, 2d, 2d)``: Hessian of the training risk of ``model`` in the active
    off-block coordinates at the block-structured parameters ``U (nL, T, D, D)``,
    ``v (nL, T, D)`` (``nL = len(Ls)``, parameter ``i`` evaluated at ``Ls[i]``; for
    ``linear_inf`` pass ``Ls = None`` and ``nL = 1``), by differences of the engine's exact
    gradient with step ``h`` (see the module docstring). Raises ValueError if the parameters are
    not block structured (the difference would not be a Hessian)."""
    U, v = np.asarray(U, dtype=float), np.asarray(v, dtype=float)
    if U.ndim != 4 or v.ndim != 3 or U.shape[:2] != v.shape[:2] or U.shape[-1] != tasks.D:
        raise ValueError(f"U must be (nL, T, {tasks.D}, {tasks.D}) and v (nL, T, {tasks.D}), got {U.shape}, {v.shape}")
    if model == "linear_inf":
        if Ls is not None or U.shape[0] != 1:
            raise ValueError("Ls: linear_inf takes Ls = None and one parameter stack (nL = 1)")
        Ls = ()
    else:
        Ls = validate_Ls(Ls, tasks.L_max)
        if U.shape[0] != len(Ls):
            raise ValueError(f"U: {U.shape[0]} parameter stacks for {len(Ls)} prompt lengths Ls")
    d, nL, T = tasks.d, U.shape[0], U.shape[1]
    if np.any(off_block_coordinates(U, v)) or np.any(U[..., :d, d]) or np.any(U[..., d, d]):
        raise ValueError("U, v: the parameters must be block structured (U[d, :] = U[:d, d] = 0, v[:d] = 0)")
    if not (np.isfinite(h) and h > 0):
        raise ValueError(f"h: expected a positive step, got {h!r}")
    eng = _engine(model, tasks, Ls)
    H = np.empty((nL, T, 2 * d, 2 * d))
    with np.errstate(all="ignore"):
        for t in range(T):
            Ut, vt = U[:, t], v[:, t]
            _, gU, gv = eng.step(Ut, vt)
            g0 = off_block_coordinates(gU, gv)
            for j in range(2 * d):
                Up, vp = Ut.copy(), vt.copy()
                if j < d:
                    Up[:, d, j] += h
                else:
                    vp[:, j - d] += h
                _, gU, gv = eng.step(Up, vp)
                H[:, t, :, j] = (off_block_coordinates(gU, gv) - g0) / h
    if not np.all(np.isfinite(H)):
        raise FloatingPointError(f"non-finite off-block Hessian of {model}")
    return 0.5 * (H + np.swapaxes(H, -1, -2))     # symmetric up to O(h^2): symmetrise


def curvature_extremes(H):
    """``(lambda_min, lambda_max)`` of symmetric ``H (..., k, k)``, each ``(...)``."""
    lam = np.linalg.eigvalsh(H)
    return lam[..., 0], lam[..., -1]


def spectral_radius(lam_min, lam_max, lr):
    """``max |1 - lr lambda|`` over the spectrum of ``H`` (symmetric): the per-step growth factor
    of an off-block perturbation aligned with the worst mode."""
    return np.maximum(np.abs(1 - lr * np.asarray(lam_min)), np.abs(1 - lr * np.asarray(lam_max)))
