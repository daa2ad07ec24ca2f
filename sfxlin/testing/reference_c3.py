"""Plain per-L, per-step numpy reference for the C3 training (the oracle of the fast engine).

Written the straightforward way on purpose, independently of :mod:`sfxlin.icl`'s loss code and
of :mod:`sfxlin.training`'s engine: for every model and every prompt length ``L``, for every
step, compute the risk and its analytic gradient with plain batched matmuls on the first ``L``
tokens, then take a gradient step. It is the honest "plain numpy" baseline of the benchmark
(batched ``@``, not einsum, over the token axis), not a deliberately slow one.

Only data come from the :class:`sfxlin.icl.Tasks` object (``Z``, ``w``, ``x_q``, ``y_q``,
``Sigma``).
"""
from __future__ import annotations

import numpy as np

__all__ = ["softmax_step", "linear_step", "train_reference", "train_reference_all"]


def _queries(tasks):
    n, q, d = tasks.x_q.shape
    zq = np.zeros((n, q, d + 1))
    zq[:, :, :d] = tasks.x_q
    return zq


def softmax_step(U, v, Z, zq, yq):
    """Risk and gradient of softmax attention on prompts ``Z (n, L, D)``: ``(risk, gU, gv)``."""
    n, q = yq.shape
    A = zq @ U.T                         # (n, q, D): a = U z_q
    S = A @ Z.transpose(0, 2, 1)         # (n, q, L) logits z_k . a
    S -= S.max(axis=2, keepdims=True)
    P = np.exp(S)
    P /= P.sum(axis=2, keepdims=True)    # softmax over tokens
    mbar = P @ Z                         # (n, q, D)
    pred = mbar @ v                      # (n, q)
    r = pred - yq
    Zv = Z @ v                           # (n, L)
    Cv = (P * Zv[:, None, :]) @ Z - mbar * pred[:, :, None]   # (sum p z z^T - mbar mbar^T) v
    risk = 0.5 * np.mean(r**2)
    gv = (r[:, :, None] * mbar).reshape(n * q, -1).sum(axis=0) / (n * q)
    gU = (r[:, :, None] * Cv).reshape(n * q, -1).T @ zq.reshape(n * q, -1) / (n * q)
    return risk, gU, gv


def linear_step(U, v, G, zq, yq):
    """Risk and gradient of ``v^T G U z_q`` for per-task symmetric ``G (n, D, D)``."""
    n, q = yq.shape
    H = G @ (zq @ U.T).transpose(0, 2, 1)   # (n, D, q): G U z_q
    pred = H.transpose(0, 2, 1) @ v          # (n, q)
    r = pred - yq
    Gv = G @ v                               # (n, D)
    risk = 0.5 * np.mean(r**2)
    gv = (H * r[:, None, :]).sum(axis=(0, 2)) / (n * q)
    gU = (Gv[:, :, None] * (r[:, :, None] * zq).sum(axis=1)[:, None, :]).sum(axis=0) / (n * q)
    return risk, gU, gv


def train_reference(model, tasks, L, *, lr, n_steps, ckpt_every, U0, v0):
    """Gradient descent on one model at one ``L`` (``L`` ignored for ``linear_inf``).

    Returns ``dict(U=(n_ckpt, D, D), v=(n_ckpt, D), risk=(n_ckpt,), t=(n_ckpt,))`` with
    checkpoints at ``t = 0, ckpt_every, ..., n_steps`` (risk at the checkpoint parameters).
    """
    zq = _queries(tasks)
    yq = tasks.y_q
    d = tasks.x_q.shape[-1]
    if model == "softmax":
        Z = np.ascontiguousarray(tasks.Z[:, :L, :])
        step = lambda U, v: softmax_step(U, v, Z, zq, yq)  # noqa: E731
    elif model in ("linear", "linear_inf"):
        if model == "linear":
            ZL = tasks.Z[:, :L, :]
            G = ZL.transpose(0, 2, 1) @ ZL / L
        else:
            if np.any(tasks.mean):
                raise ValueError("the reference's linear(inf) is built from the covariance: centred covariates "
                                 f"only, got mean {tasks.mean.tolist()}")
            S, w = tasks.Sigma, tasks.w
            G = np.zeros((w.shape[0], d + 1, d + 1))
            G[:, :d, :d] = S
            G[:, :d, d] = w @ S
            G[:, d, :d] = w @ S
            G[:, d, d] = ((w @ S) * w).sum(axis=1)
        step = lambda U, v: linear_step(U, v, G, zq, yq)  # noqa: E731
    else:
        raise ValueError(f"unknown model {model!r}")
    U = np.array(U0, dtype=float)
    v = np.array(v0, dtype=float)
    Us, vs, risks, ts = [], [], [], []
    for t in range(n_steps + 1):
        risk, gU, gv = step(U, v)
        if t % ckpt_every == 0:
            Us.append(U.copy())
            vs.append(v.copy())
            risks.append(risk)
            ts.append(t)
        if t < n_steps:
            U = U - lr * gU
            v = v - lr * gv
    return dict(U=np.array(Us), v=np.array(vs), risk=np.array(risks), t=np.array(ts))


def train_reference_all(tasks, Ls, *, models=("softmax", "linear", "linear_inf"), lr, n_steps,
                        ckpt_every, U0, v0):
    """The per-L loop over ``Ls`` for the finite-L models, plus ``linear_inf`` once.

    Returns ``{model: dict(U (nL, n_ckpt, D, D), v, risk)}`` for ``softmax``/``linear`` and
    ``{"linear_inf": dict(U (n_ckpt, D, D), v, risk)}``.
    """
    out = {}
    kw = dict(lr=lr, n_steps=n_steps, ckpt_every=ckpt_every, U0=U0, v0=v0)
    for model in models:
        if model == "linear_inf":
            out[model] = train_reference(model, tasks, None, **kw)
        else:
            runs = [train_reference(model, tasks, L, **kw) for L in Ls]
            out[model] = {k: np.stack([r[k] for r in runs]) for k in ("U", "v", "risk")}
            out[model]["t"] = runs[0]["t"]
    return out
