"""Baselines for in-context regression: estimators of ``w`` from the prompt, vectorised over tasks
and nested prompt lengths, their held-out risks, and the closed forms of their risks (docs/tasks.md).

Estimators (``w_hat (nL, n, d)`` for every ``L`` of a strictly increasing ``Ls``, each from the
first ``L`` tokens of each task; the regularised ones from the prompt sums ``X^T X`` and ``X^T y``,
accumulated block by block over the nested prompts, the interpolators from the SVD of each nested
``X``):

* :func:`min_norm` -- minimum-norm least squares ``pinv(X) y``, by the SVD of each nested ``X``
  itself (the normal equations would square its condition number);
* :func:`ridge` -- ``argmin (1/L) ||y - X w||^2 + lam ||w||^2``;
* :func:`posterior_mean` -- ``E[w | prompt]`` for the prior ``N(0, Omega)`` and the label noise of
  the tasks: ridge with the Bayes penalty ``noise^2 Omega^{-1}`` (``(1/L)``-normalised:
  ``lam = noise^2 / (L omega^2)`` for ``Omega = omega^2 I``); noiseless: the minimum-``Omega^{-1}``-
  norm interpolator. The Bayes estimator (any covariate law);
* :func:`pgd` -- one step of preconditioned gradient descent from 0,
  ``w_hat = Gamma_L (1/L) X^T y``, with the preconditioner that minimises the risk for centred
  Gaussian covariates, ``Gamma_L = Omega Sigma [(1 + 1/L) Sigma Omega Sigma + ((tr(Sigma Omega) +
  noise^2) / L) Sigma]^{-1}``: the optimum of linear(L) attention (``v^T Ghat_L U z_q`` with ``U``
  block diagonal reads ``x_q^T U_xx^T (1/L) X^T y v_y``).

Closed forms: :func:`pgd_risk` (exact, finite ``L``, centred Gaussian covariates),
:func:`ols_risk` (exact, ``L > d + 1``) and :func:`asymptotic_ridge_risk` (the Marchenko-Pastur
deterministic equivalent, exact as ``d, L -> inf`` with ``d / L`` fixed, isotropic settings).
"""
from __future__ import annotations

import numpy as np

from . import icl
from .bayes import whitened_scale
from .training import validate_Ls
from .validation import as_sigma, as_spd, noise_std, positive_int

__all__ = ["prompt_sums", "min_norm", "ridge", "posterior_mean", "pgd", "pgd_preconditioner",
           "heldout_risk", "baseline_risks", "BASELINES", "pgd_risk", "ols_risk", "mp_stieltjes",
           "asymptotic_ridge_risk"]

#: the baselines of :func:`baseline_risks`, in order
BASELINES = ("min_norm", "bayes_ridge", "pgd")


def prompt_sums(tasks, Ls):
    """``X^T X (nL, n, d, d)`` and ``X^T y (nL, n, d)`` of the first ``L`` tokens of each task, for
    every ``L`` in ``Ls`` (strictly increasing, ``<= tasks.L_max``): one pass over the tokens."""
    Ls = validate_Ls(Ls, tasks.L_max)
    d = tasks.d
    XtX = np.empty((len(Ls), tasks.n_tasks, d, d))
    Xty = np.empty((len(Ls), tasks.n_tasks, d))
    A, b, lo = 0.0, 0.0, 0
    for i, L in enumerate(Ls):
        X, y = tasks.Z[:, lo:L, :d], tasks.Z[:, lo:L, d]
        A = A + np.swapaxes(X, -1, -2) @ X
        b = b + np.einsum("nli,nl->ni", X, y)
        XtX[i], Xty[i], lo = A, b, L
    return XtX, Xty


def _min_norm_solve(X, y):
    """``pinv(X) y`` per task for ``X (n, L, k)``, ``y (n, L)`` -> ``(n, k)``, by the SVD of ``X``
    (batched): singular values at or below ``eps max(L, k)`` times the largest count as 0
    (numpy.linalg.lstsq's default ``rcond``). Under-determined (``L < k``): the minimum-norm solution."""
    U, S, Vt = np.linalg.svd(X, full_matrices=False)
    cut = np.finfo(float).eps * max(X.shape[-2:]) * S[..., :1]
    inv = np.where(S > cut, 1.0 / np.where(S > cut, S, 1.0), 0.0)
    return np.einsum("nki,nk->ni", Vt, inv * np.einsum("nlk,nl->nk", U, y))


def _nested_min_norm(tasks, Ls, R=None):
    """``pinv(X_L R) y_L`` for every ``L`` in ``Ls`` (``X_L``, ``y_L`` the first ``L`` tokens of each
    task; ``R = I`` by default) -> ``(nL, n, d)``. Cost ``O(n d^2 sum(Ls))``."""
    Ls = validate_Ls(Ls, tasks.L_max)
    X, y = tasks.Z[..., : tasks.d], tasks.Z[..., tasks.d]
    if R is not None:
        X = X @ R
    return np.stack([_min_norm_solve(X[:, :L], y[:, :L]) for L in Ls])


def min_norm(tasks, Ls):
    """Minimum-norm least squares ``pinv(X) y`` per task and ``L`` -> ``(nL, n, d)``: by the SVD of
    ``X`` itself, backward stable like ``numpy.linalg.lstsq`` (within 1e-8 of it at ``cond(X) = 1e8``;
    the eigenvalues of ``X^T X`` would square the condition number and lose its smallest
    directions)."""
    return _nested_min_norm(tasks, Ls)


def _lams(lam, nL):
    lam = np.broadcast_to(np.asarray(lam, dtype=float), (nL,)) if np.ndim(lam) <= 1 else None
    if lam is None or not np.all(np.isfinite(lam)) or np.any(lam <= 0):
        raise ValueError(f"lam must be a positive finite number or one per L ({nL}), got {lam!r}")
    return lam


def ridge(tasks, Ls, lam):
    """Ridge ``(X^T X / L + lam I)^{-1} X^T y / L`` per task and ``L``; ``lam > 0`` a number or one
    per ``L`` -> ``(nL, n, d)``. (``lam = 0`` is :func:`min_norm`.)"""
    Ls = validate_Ls(Ls, tasks.L_max)
    lam = _lams(lam, len(Ls))
    XtX, Xty = prompt_sums(tasks, Ls)
    Lc = np.array(Ls, dtype=float)[:, None, None]
    A = XtX / Lc[..., None] + lam[:, None, None, None] * np.eye(tasks.d)
    return np.linalg.solve(A, (Xty / Lc)[..., None])[..., 0]


def posterior_mean(tasks, Ls):
    """``E[w | prompt]`` for the tasks' prior ``N(0, tasks.Omega)`` and label noise ``tasks.noise``:
    ``(X^T X + noise^2 Omega^{-1})^{-1} X^T y``; noiseless: ``Omega^{1/2} pinv(X Omega^{1/2}) y``
    (the interpolator of least ``w^T Omega^{-1} w``, the posterior mean's limit; by the SVD of
    ``X Omega^{1/2}``, as :func:`min_norm`). ``(nL, n, d)``."""
    Omega = tasks.Omega
    if tasks.noise > 0:
        XtX, Xty = prompt_sums(tasks, Ls)
        return np.linalg.solve(XtX + tasks.noise**2 * np.linalg.inv(Omega), Xty[..., None])[..., 0]
    R = np.linalg.cholesky(Omega)                 # Omega = R R^T; any root gives the same estimator
    return _nested_min_norm(tasks, Ls, R) @ R.T


def pgd_preconditioner(L, Sigma, Omega=None, noise=0.0):
    """``Gamma_L = Omega Sigma [(1 + 1/L) Sigma Omega Sigma + ((tr(Sigma Omega) + noise^2) / L)
    Sigma]^{-1}``, the risk-minimising ``Gamma`` of ``w_hat = Gamma (1/L) X^T y`` for centred
    Gaussian covariates (``Gamma = E[w h^T] E[h h^T]^{-1}``, ``h = X^T y / L``, by the Wishart
    fourth moment ``E[S A S] = Sigma A Sigma + (Sigma A Sigma + tr(A Sigma) Sigma) / L``). Tends to
    ``Sigma^{-1}`` as ``L -> inf`` (the paper's plug-in)."""
    L = positive_int(L, "L")
    Sigma = as_sigma(Sigma)
    d = Sigma.shape[0]
    Omega = np.eye(d) if Omega is None else as_spd(Omega, d, "Omega")
    noise = noise_std(noise, "noise")
    H = (1 + 1 / L) * Sigma @ Omega @ Sigma + (np.trace(Sigma @ Omega) + noise**2) / L * Sigma
    return np.linalg.solve(H.T, (Omega @ Sigma).T).T


def pgd(tasks, Ls):
    """One step of preconditioned gradient descent, ``Gamma_L (1/L) X^T y`` with
    :func:`pgd_preconditioner` for the tasks' ``Sigma``, ``Omega`` and noise -> ``(nL, n, d)``.
    Non-centred covariates: ``Sigma`` is replaced by the second moment ``Sigma + m m^T`` (the
    plug-in's limit; the finite-``L`` optimum then differs)."""
    Ls = validate_Ls(Ls, tasks.L_max)
    _, Xty = prompt_sums(tasks, Ls)
    M = tasks.second_moment
    G = np.stack([pgd_preconditioner(L, M, tasks.Omega, tasks.noise) for L in Ls])
    return np.einsum("kij,knj->kni", G, Xty / np.array(Ls, dtype=float)[:, None, None])


def heldout_risk(tasks, w_hat):
    """``mean over tasks and queries of 1/2 (x_q^T w_hat - y_q)^2``; ``w_hat (..., n, d)`` -> ``(...)``."""
    r = np.einsum("nqi,...ni->...nq", tasks.x_q, w_hat) - tasks.y_q
    return 0.5 * np.mean(r**2, axis=(-2, -1))


def baseline_risks(tasks, Ls):
    """Held-out risks ``(nL,)`` of every baseline of :data:`BASELINES` on ``tasks`` at each ``L``:
    ``{"min_norm": ..., "bayes_ridge": posterior mean, "pgd": ...}``."""
    return {"min_norm": heldout_risk(tasks, min_norm(tasks, Ls)),
            "bayes_ridge": heldout_risk(tasks, posterior_mean(tasks, Ls)),
            "pgd": heldout_risk(tasks, pgd(tasks, Ls))}


# --------------------------------------------------------------------------- closed forms


def pgd_risk(L, Sigma, Omega=None, noise=0.0, query_noise=0.0):
    """Exact risk of :func:`pgd` for centred Gaussian covariates:
    ``1/2 [tr(Sigma Omega) - tr(Sigma Gamma_L Sigma Omega) + query_noise^2]``."""
    Sigma = as_sigma(Sigma)
    d = Sigma.shape[0]
    Om = np.eye(d) if Omega is None else as_spd(Omega, d, "Omega")
    G = pgd_preconditioner(L, Sigma, Om, noise)
    return 0.5 * (np.trace(Sigma @ Om) - np.trace(Sigma @ G @ Sigma @ Om)
                  + noise_std(query_noise, "query_noise") ** 2)


def ols_risk(d, L, noise=0.0, query_noise=0.0):
    """Exact risk of least squares for centred Gaussian covariates (any ``Sigma``, any prior):
    ``1/2 [noise^2 d / (L - d - 1) + query_noise^2]`` for ``L > d + 1`` (inverse-Wishart mean,
    ``E (X^T X)^{-1} = Sigma^{-1} / (L - d - 1)``); noiseless, ``L >= d``: ``query_noise^2 / 2``;
    ``nan`` otherwise (infinite at ``L = d + 1``; depends on ``w`` below ``d``)."""
    d, L = positive_int(d, "d"), positive_int(L, "L")
    noise, query_noise = noise_std(noise, "noise"), noise_std(query_noise, "query_noise")
    if noise == 0 and L >= d:
        return 0.5 * query_noise**2
    if noise > 0 and L > d + 1:
        return 0.5 * (noise**2 * d / (L - d - 1) + query_noise**2)
    return float("nan")


def mp_stieltjes(gamma, lam):
    """``m(-lam)`` and ``m'(-lam)`` of the Marchenko-Pastur law of ratio ``gamma = d / L`` (unit
    variance), ``m(z) = int dF(x) / (x - z)``, for ``lam > 0``: the root of
    ``gamma z m^2 - (1 - gamma - z) m + 1 = 0`` that is positive at ``z = -lam``."""
    gamma, lam = float(gamma), float(lam)
    if not (gamma > 0 and lam > 0 and np.isfinite(gamma) and np.isfinite(lam)):
        raise ValueError(f"need gamma > 0 and lam > 0, got gamma = {gamma}, lam = {lam}")
    b = 1.0 - gamma + lam
    m = (np.sqrt(b * b + 4 * gamma * lam) - b) / (2 * gamma * lam)
    # differentiate the quadratic at z = -lam: m' = (gamma m^2 + m) / ((1 - gamma - z) - 2 gamma z m)
    dm = (gamma * m * m + m) / (b + 2 * gamma * lam * m)
    return m, dm


def asymptotic_ridge_risk(d, L, Sigma, Omega=None, noise=0.0, query_noise=0.0, lam=None):
    """Risk of :func:`ridge` (penalty ``lam``; ``None``: the Bayes penalty, i.e. of
    :func:`posterior_mean`) in the proportional limit ``d, L -> inf``, ``gamma = d / L`` fixed, for
    centred Gaussian covariates with ``Sigma = s_x^2 I`` and prior ``Omega = omega^2 I`` (``nan``
    for other settings, where no closed form exists). With ``r^2 = d s_x^2 omega^2`` the expected
    signal, ``l = lam / s_x^2`` and ``m = m(-l)`` (:func:`mp_stieltjes`):
    ``1/2 [r^2 l^2 m' + noise^2 gamma (m - l m') + query_noise^2]``; at the Bayes penalty
    ``l = gamma noise^2 / r^2`` it reduces to ``1/2 [noise^2 gamma m + query_noise^2]``.
    Noiseless labels need ``lam > 0`` (at ``lam = 0`` the estimator interpolates; the limit is
    ``(1 - 1/gamma)_+ r^2 / 2``, the Bayes risk's)."""
    d, L = positive_int(d, "d"), positive_int(L, "L")
    Sigma = as_sigma(Sigma, d)
    noise, query_noise = noise_std(noise, "noise"), noise_std(query_noise, "query_noise")
    Om = np.eye(d) if Omega is None else as_spd(Omega, d, "Omega")
    sx2, om2 = whitened_scale(Sigma), whitened_scale(Om)
    if sx2 is None or om2 is None:
        return float("nan")
    gamma, r2 = d / L, d * sx2 * om2
    if lam is None:
        if noise == 0:
            return 0.5 * (max(0.0, 1.0 - 1.0 / gamma) * r2 + query_noise**2)
        l_eff = gamma * noise**2 / r2
    else:
        lam = float(lam)
        if not (np.isfinite(lam) and lam > 0):
            raise ValueError(f"lam must be a positive finite number, got {lam}")
        l_eff = lam / sx2
    m, dm = mp_stieltjes(gamma, l_eff)
    return 0.5 * (r2 * l_eff**2 * dm + noise**2 * gamma * (m - l_eff * dm) + query_noise**2)
