"""Population moments, infinite-prompt limits and Bayes risks of the in-context regression tasks
(docs/tasks.md; the tasks: :func:`sfxlin.icl.make_tasks`).

A task: ``w ~ N(0, Omega)``; covariates ``x ~ N(m, Sigma)`` (second moment ``M = Sigma + m m^T``);
prompt labels ``y = w^T x + eps``, ``eps ~ N(0, noise^2)``; query ``z_q = (x_q, 0)`` with target
``y_q = w^T x_q + eps_q``, ``eps_q ~ N(0, query_noise^2)``; tokens ``z = (x, y)``.

* Per task (given ``w``): ``E z = (m, w^T m)``, ``Cov z = [[Sigma, Sigma w], [w^T Sigma,
  w^T Sigma w + noise^2]]`` and ``E z z^T = Gamma_w`` (:func:`sfxlin.icl.Gamma_w`, noise in its
  label-label corner). Averaged over the prior: :func:`prior_second_moment`.
* Infinite-prompt limits at fixed ``(U, v)``: ``linear(L) -> v^T Gamma_w U z_q``
  (:func:`linear_limit`, law of large numbers, any covariate law with a second moment);
  ``softmax(L) -> v^T (E z + Cov(z) U z_q)`` (:func:`softmax_limit`, Lemma 2.1 for Gaussian
  tokens ``z``). The softmax limit is AFFINE in ``z_q``, with intercept ``v^T E z``; it equals the
  linear limit only when ``m = 0`` (then ``E z = 0`` and ``Cov z = Gamma_w``).
* Bayes optimum of linear(inf)'s class (:func:`bayes_risk_linear_inf`): linear(inf) sees ``w``
  through ``Gamma_w``; ``U = blockdiag(M^{-1} / c, 0)``, ``v = c e_{d+1}`` predicts ``w^T x_q``
  exactly for every task, so the minimum risk is the query-noise floor ``query_noise^2 / 2``,
  whatever the prompt noise, the prior and the mean (:func:`linear_inf_optimum`).
* Bayes risk of the task (the posterior mean of ``w`` given the prompt, the best any estimator can
  do, :func:`bayes_risk_task`): closed forms for noiseless labels; none at finite ``L`` with noise
  (Monte Carlo of :func:`sfxlin.baselines.posterior_mean`, or the large-``d`` equivalent
  :func:`sfxlin.baselines.asymptotic_ridge_risk`).

Pure numpy, float64.
"""
from __future__ import annotations

import numpy as np

from . import icl
from .validation import as_sigma, as_spd, finite_array, noise_std, positive_int

__all__ = ["task_mean", "task_covariance", "prior_second_moment", "linear_limit", "softmax_limit",
           "linear_inf_optimum", "bayes_risk_linear_inf", "bayes_risk_task", "whitened_scale"]


def _mean(mean, d):
    if mean is None:
        return np.zeros(d)
    m = finite_array(mean, "mean")
    if m.shape != (d,):
        raise ValueError(f"mean must have shape (d,) = {(d,)}, got {m.shape}")
    return m


def task_mean(w, mean=None):
    """``E z = (m, w^T m)`` of a task's tokens, ``w (..., d)`` -> ``(..., D)`` (0 when centred)."""
    w = finite_array(w, "w")
    m = _mean(mean, w.shape[-1])
    return np.concatenate([np.broadcast_to(m, w.shape), (w @ m)[..., None]], axis=-1)


def task_covariance(Sigma, w, noise=0.0):
    """``Cov z = [[Sigma, Sigma w], [w^T Sigma, w^T Sigma w + noise^2]]``, ``w (..., d)`` ->
    ``(..., D, D)`` (the second moment of the centred tokens; the mean does not enter)."""
    return icl.Gamma_w(Sigma, w, None, noise)


def prior_second_moment(Sigma, Omega=None, mean=None, noise=0.0):
    """``E_w E[z z^T] = [[M, 0], [0, tr(M Omega) + noise^2]]`` over the prior ``w ~ N(0, Omega)``
    (``Omega = None``: ``I_d``), ``M = Sigma + m m^T``: the second moment of a token of a random task."""
    Sigma = as_sigma(Sigma)
    d = Sigma.shape[0]
    Omega = np.eye(d) if Omega is None else as_spd(Omega, d, "Omega")
    m = _mean(mean, d)
    M = Sigma + np.outer(m, m)
    out = np.zeros((d + 1, d + 1))
    out[:d, :d] = M
    out[d, d] = np.trace(M @ Omega) + noise_std(noise, "noise") ** 2
    return out


def linear_limit(U, v, Sigma, w, z_q, mean=None, noise=0.0):
    """``lim_L linear(L) = v^T Gamma_w U z_q``: ``U (D, D)``, ``v (D,)``, ``w (n, d)``,
    ``z_q (n, q, D)`` -> ``(n, q)``."""
    return icl.linear_predict(U, v, icl.Gamma_w(Sigma, w, mean, noise), z_q)


def softmax_limit(U, v, Sigma, w, z_q, mean=None, noise=0.0):
    """``lim_L softmax(L) = v^T (E z + Cov(z) U z_q)`` for Gaussian covariates (Lemma 2.1: the tokens
    ``z`` are then Gaussian; the limit is the tilted mean ``grad K(a)``, ``a = U z_q``). Affine in
    ``z_q``: the intercept ``v^T E z = v^T (m, w^T m)`` vanishes only for centred covariates.
    Shapes as :func:`linear_limit`."""
    C = task_covariance(Sigma, w, noise)
    slope = icl.linear_predict(U, v, C, z_q)
    intercept = task_mean(w, mean) @ np.asarray(v, dtype=float)
    return slope + intercept[:, None]


def linear_inf_optimum(Sigma, mean=None):
    """A Bayes optimum of linear(inf) on the balanced manifold: Remark 5.2 with the covariates'
    second moment ``M = Sigma + m m^T`` in place of ``Sigma``: ``c = ||M^{-1}||_F^{1/2}``,
    ``U* = blockdiag(M^{-1} / c, 0)``, ``v* = c e_{d+1}``; then ``v*^T Gamma_w U* z_q = w^T x_q``
    for every task (any noise, prior, mean)."""
    Sigma = as_sigma(Sigma)
    m = _mean(mean, Sigma.shape[0])
    return icl.bayes_optimum(Sigma + np.outer(m, m))


def bayes_risk_linear_inf(query_noise=0.0):
    """Minimum over ``(U, v)`` of the risk of linear(inf): ``query_noise^2 / 2`` (reached by
    :func:`linear_inf_optimum`; no model can beat the query noise)."""
    return 0.5 * noise_std(query_noise, "query_noise") ** 2


def whitened_scale(Sigma, Omega=None):
    """``kappa`` if ``K = Omega^{1/2} Sigma Omega^{1/2} = kappa I_d`` (to relative 1e-12; the
    whitened problem is then isotropic and rotation invariant), else ``None``. The eigenvalues of
    ``K`` are those of ``Sigma Omega``."""
    Sigma = as_sigma(Sigma)
    d = Sigma.shape[0]
    Omega = np.eye(d) if Omega is None else as_spd(Omega, d, "Omega")
    R = np.linalg.cholesky(Omega)
    lam = np.linalg.eigvalsh(R.T @ Sigma @ R)       # the spectrum of K
    return float(lam.mean()) if lam.max() - lam.min() <= 1e-12 * lam.max() else None


def bayes_risk_task(d, L, Sigma, Omega=None, noise=0.0, query_noise=0.0, mean=None):
    """Bayes risk of a task at prompt length ``L``: ``E 1/2 (x_q^T E[w | prompt] - y_q)^2``, for
    Gaussian covariates, where a closed form exists; ``nan`` otherwise.

    * noiseless labels, ``L >= d``: the prompt determines ``w`` (``X`` has full column rank almost
      surely): ``query_noise^2 / 2``;
    * noiseless, ``L < d``, centred, ``Omega^{1/2} Sigma Omega^{1/2} = kappa I``: the posterior
      covariance is ``Omega^{1/2} (I - P) Omega^{1/2}`` with ``P`` the projection on a uniformly
      random ``L``-plane, ``E P = (L / d) I``: ``(1 - L/d) tr(Sigma Omega) / 2 + query_noise^2 / 2``;
    * noisy labels: the posterior covariance ``noise^2 (X^T X + noise^2 Omega^{-1})^{-1}`` has no
      closed-form expectation at finite ``L`` (``nan``; its large-``d`` equivalent is
      :func:`sfxlin.baselines.asymptotic_ridge_risk` at the Bayes penalty).
    """
    d = positive_int(d, "d")
    L = positive_int(L, "L")
    Sigma = as_sigma(Sigma, d)
    noise = noise_std(noise, "noise")
    floor = bayes_risk_linear_inf(query_noise)
    if noise > 0:
        return float("nan")
    if L >= d:
        return floor
    m = _mean(mean, d)
    kappa = whitened_scale(Sigma, Omega)
    if np.any(m) or kappa is None:
        return float("nan")
    return 0.5 * (1.0 - L / d) * kappa * d + floor
