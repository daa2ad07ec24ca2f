"""Distribution shift at test time for the in-context regression models (docs/tasks.md; the
experiment ``c3_shift``): test covariances named by shift specs, shifted held-out prompts, and the
held-out risks on them of the trained attention models and of two baselines.

A shift maps the training covariates ``x ~ N(0, Sigma)`` to ``x' = A x`` (test covariance
``Sigma' = A Sigma A^T``; labels ``y' = w^T x'`` with the same task ``w``). Shift specs (no ``,`` or
``;``):

* ``none`` -- ``A = I`` (no shift: the control);
* ``scale:C`` -- ``A = sqrt(C) I``: scaled covariates, ``Sigma' = C Sigma`` (``C > 0``);
* ``rotate:SEED`` -- ``A = Q``, ``Q`` Haar on ``O(d)`` from ``np.random.default_rng(SEED)`` (QR of a
  standard Gaussian matrix, column signs fixed so that ``R`` has a positive diagonal):
  ``Sigma' = Q Sigma Q^T``, the spectrum kept, the eigenvectors turned (no shift when ``Sigma``
  is isotropic);
* ``subspace:K`` -- ``A = diag(1, .., 1, 0, .., 0)`` (``K`` ones, ``1 <= K < d``): the covariates
  confined to their first ``K`` coordinates, ``Sigma' = P Sigma P`` singular (``K = 2`` of
  ``d = 3``: the "half subspace");
* any covariance spec of :func:`sfxlin.covariance.from_spec` (``power_law:2.0``, ``kms:0.5``,
  ``diagonal:3/1/0.5``, ...): that matrix as the test covariance, ``A = Sigma'^{1/2} Sigma^{-1/2}``
  (symmetric roots); ``power_law:2.0`` is the skewed spectrum ``k^-2`` at trace ``d``.

The held-out tasks of all shifts are one draw mapped by each ``A`` (common random numbers: the
shifts differ by their maps, not by their samples). Risks are kept per antithetic pair (the unit
whose tasks share covariates), so their standard errors are over pairs.

Pure numpy, float64.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import baselines, covariance, icl
from .validation import as_sigma, positive_int

__all__ = ["TRANSFORMS", "parse_shift", "shift_map", "shifted_covariance", "is_singular", "shift_check", "Prompts",
           "shifted_prompts", "pair_means", "softmax_pair_risks", "linear_inf_pair_risks", "ridge_pair_risks",
           "pgd_pair_risks", "shift_risks"]

#: the shift specs that are transforms of the training covariance (every other spec is a covariance spec)
TRANSFORMS = ("none", "scale", "rotate", "subspace")


def _bad(spec, what):
    return ValueError(f"shift spec {spec!r}: {what}")


def parse_shift(spec, d) -> tuple:
    """``(kind, argument)`` of a shift spec in dimension ``d``: ``("none", None)``, ``("scale", C)``,
    ``("rotate", SEED)``, ``("subspace", K)`` or ``("covariance", matrix)``; one ValueError naming the
    spec and what was expected otherwise."""
    d = positive_int(d, "d")
    if not isinstance(spec, str) or not spec or spec != spec.strip() or "," in spec or ";" in spec:
        raise _bad(spec, "expected none, scale:C, rotate:SEED, subspace:K or a covariance spec, without spaces, "
                         "',' or ';'")
    name, _, arg = spec.partition(":")
    if name == "none":
        if arg:
            raise _bad(spec, "none takes no argument")
        return "none", None
    if name == "scale":
        try:
            c = float(arg)
        except ValueError:
            c = float("nan")
        if not (np.isfinite(c) and c > 0):
            raise _bad(spec, f"scale:C needs a finite C > 0, got {arg!r}")
        return "scale", c
    if name in ("rotate", "subspace"):
        try:
            k = int(arg)
        except ValueError:
            k = -1
        if name == "rotate" and k < 0:
            raise _bad(spec, f"rotate:SEED needs a non-negative integer seed, got {arg!r}")
        if name == "subspace" and not 1 <= k < d:
            raise _bad(spec, f"subspace:K needs an integer 1 <= K < d = {d}, got {arg!r}")
        return name, k
    try:
        return "covariance", covariance.from_spec(spec, d)
    except ValueError as exc:
        raise _bad(spec, f"not a transform ({', '.join(TRANSFORMS)}) and not a covariance spec: {exc}") from None


def _sym_power(S, p):
    lam, V = np.linalg.eigh(S)
    return (V * lam**p) @ V.T


def shift_map(spec, Sigma) -> np.ndarray:
    """The ``d x d`` map ``A`` of ``x' = A x`` for the shift ``spec`` from the training covariance
    ``Sigma`` (symmetric positive definite)."""
    S = covariance.validate(as_sigma(Sigma))
    d = S.shape[0]
    kind, arg = parse_shift(spec, d)
    if kind == "none":
        return np.eye(d)
    if kind == "scale":
        return np.sqrt(arg) * np.eye(d)
    if kind == "rotate":
        Q, R = np.linalg.qr(np.random.default_rng(arg).standard_normal((d, d)))
        return Q * np.where(np.diag(R) < 0, -1.0, 1.0)
    if kind == "subspace":
        return np.diag((np.arange(d) < arg).astype(float))
    return _sym_power(arg, 0.5) @ _sym_power(S, -0.5)


def shifted_covariance(spec, Sigma) -> np.ndarray:
    """``Sigma' = A Sigma A^T`` of the shift (exactly symmetrised; singular for ``subspace``)."""
    A = shift_map(spec, Sigma)
    S = A @ as_sigma(Sigma) @ A.T
    return 0.5 * (S + S.T)


def is_singular(spec, d) -> bool:
    """Whether the shift's test covariance is singular (``subspace:K``), whatever the training ``Sigma``."""
    return parse_shift(spec, d)[0] == "subspace"


def shift_check(param, d_param="d"):
    """An :class:`sfxlin.engine.sweep.Experiment` check: every spec of ``config[param]`` parses in
    dimension ``config[d_param]``; ValueError ``"<param>: ..."``."""
    def check(config):
        for spec in config[param]:
            try:
                parse_shift(spec, config[d_param])
            except ValueError as exc:
                raise ValueError(f"{param}: {exc}") from None
    check.__name__ = f"check_{param}_shifts"
    return check


@dataclass(frozen=True, eq=False)
class Prompts:
    """Shifted held-out prompts, arrays in the layout of :class:`sfxlin.icl.Tasks`: ``Z (n, L_max, D)``,
    ``w (n, d)``, ``z_q (n, q, D)`` (masked queries), ``y_q (n, q)``; tasks ``2i``, ``2i + 1`` an
    antithetic pair; ``Sigma`` the test covariance (positive semi-definite)."""

    Z: np.ndarray
    w: np.ndarray
    z_q: np.ndarray
    y_q: np.ndarray
    Sigma: np.ndarray


def shifted_prompts(tasks, A) -> Prompts:
    """The held-out ``tasks`` (noiseless, centred, in antithetic pairs) with every covariate mapped
    by ``A``: ``x' = A x``, ``y' = w^T x'``, the queries likewise; ``Sigma' = A Sigma A^T``."""
    if tasks.noise or tasks.query_noise or np.any(tasks.mean) or not tasks.paired:
        raise ValueError("shifted_prompts needs noiseless, centred tasks in antithetic pairs (icl.make_tasks with "
                         "noise = query_noise = 0 and a centred law)")
    A = np.asarray(A, dtype=float)
    d = tasks.d
    if A.shape != (d, d) or not np.all(np.isfinite(A)):
        raise ValueError(f"A must be a finite {d} x {d} matrix, got shape {A.shape}")
    x = tasks.Z[..., :d] @ A.T
    xq = tasks.x_q @ A.T
    Z = np.concatenate([x, np.einsum("nli,ni->nl", x, tasks.w)[..., None]], axis=-1)
    z_q = np.concatenate([xq, np.zeros(xq.shape[:-1] + (1,))], axis=-1)
    S = A @ tasks.Sigma @ A.T
    return Prompts(Z=Z, w=tasks.w.copy(), z_q=z_q, y_q=np.einsum("nqi,ni->nq", xq, tasks.w), Sigma=0.5 * (S + S.T))


def pair_means(pred, y_q) -> np.ndarray:
    """``1/2 (pred - y_q)^2`` averaged over each antithetic pair's two tasks and their queries:
    ``pred (..., n, q)`` -> ``(..., n / 2)``."""
    e = 0.5 * (np.asarray(pred, dtype=float) - y_q) ** 2
    return e.reshape(e.shape[:-2] + (e.shape[-2] // 2, -1)).mean(axis=-1)


def softmax_pair_risks(U, v, prompts, L) -> np.ndarray:
    """Per-pair risks of softmax(``L``) attention with parameters ``U (..., D, D)``, ``v (..., D)``
    on the first ``L`` tokens of the shifted prompts -> ``(..., n / 2)``."""
    L = icl.check_L(L, prompts.Z.shape[1])
    return pair_means(icl.softmax_predict(U, v, prompts.Z[:, :L], prompts.z_q), prompts.y_q)


def linear_inf_pair_risks(U, v, prompts) -> np.ndarray:
    """Per-pair risks of linear(inf) with the test covariance (``Gamma_w`` from ``prompts.Sigma``
    and each task's ``w``) on the shifted queries -> ``(..., n / 2)``: the Monte Carlo of
    :func:`sfxlin.icl.linear_inf_risk` on these tasks."""
    G = icl.Gamma_w(prompts.Sigma, prompts.w)
    return pair_means(icl.linear_predict(U, v, G, prompts.z_q), prompts.y_q)


def ridge_pair_risks(prompts, Ls, lam=0.0) -> np.ndarray:
    """Per-pair risks ``(nL, n / 2)`` of ridge on the first ``L`` tokens of each shifted prompt:
    ``argmin (1/L) ||y - X w||^2 + lam ||w||^2``; ``lam = 0``: minimum-norm least squares
    ``pinv(X) y`` (singular values below ``1e-12`` of the largest cut: the confined directions of a
    subspace shift)."""
    lam = float(lam)
    if not (np.isfinite(lam) and lam >= 0):
        raise ValueError(f"lam must be a finite non-negative number, got {lam}")
    d = prompts.w.shape[-1]
    out = []
    for L in Ls:
        L = icl.check_L(L, prompts.Z.shape[1])
        X, y = prompts.Z[:, :L, :d], prompts.Z[:, :L, d]
        if lam == 0:
            w_hat = np.einsum("nil,nl->ni", np.linalg.pinv(X, rcond=1e-12), y)
        else:
            w_hat = np.linalg.solve(np.swapaxes(X, -1, -2) @ X / L + lam * np.eye(d),
                                    np.einsum("nli,nl->ni", X, y)[..., None] / L)[..., 0]
        out.append(pair_means(np.einsum("nqi,ni->nq", prompts.z_q[..., :d], w_hat), prompts.y_q))
    return np.stack(out)


def pgd_pair_risks(prompts, Ls, Sigma_pre) -> np.ndarray:
    """Per-pair risks ``(nL, n / 2)`` of one step of preconditioned gradient descent on the shifted
    prompts, ``w_hat = Gamma_L (1/L) X^T y`` with the preconditioner
    :func:`sfxlin.baselines.pgd_preconditioner` of ``Sigma_pre`` (positive definite): the training
    covariance (the shift-unaware estimator that linear attention at its optimum implements) or the
    test covariance (the oracle)."""
    d = prompts.w.shape[-1]
    out = []
    for L in Ls:
        L = icl.check_L(L, prompts.Z.shape[1])
        X, y = prompts.Z[:, :L, :d], prompts.Z[:, :L, d]
        w_hat = np.einsum("ij,nj->ni", baselines.pgd_preconditioner(L, Sigma_pre), np.einsum("nli,nl->ni", X, y) / L)
        out.append(pair_means(np.einsum("nqi,ni->nq", prompts.z_q[..., :d], w_hat), prompts.y_q))
    return np.stack(out)


def _mean_se(pairs):
    """Mean and SE over the last axis (held-out pairs, independent)."""
    return pairs.mean(axis=-1), pairs.std(axis=-1, ddof=1) / np.sqrt(pairs.shape[-1])


def shift_risks(U, v, held, spec, Sigma, L_eval, ridge_lam=0.0) -> dict:
    """The trained parameters ``U (theta, D, D)``, ``v (theta, D)`` on the held-out tasks ``held`` mapped by the
    shift ``spec`` of the training covariance ``Sigma``, at every length of ``L_eval``: ``risk_softmax``,
    ``risk_softmax_se``, ``diff_se`` ``(theta, L_eval)`` (softmax(L_eval), its SE over pairs, the SE of its paired
    difference to linear(inf)'s Monte Carlo); ``risk_exact`` (:func:`sfxlin.icl.linear_inf_risk` with the test
    covariance), ``risk_linf_mc``, ``risk_linf_mc_se`` ``(theta,)``; the baselines ``risk_ridge``,
    ``risk_pgd_train``, ``risk_pgd_test`` ``(L_eval,)`` (preconditioned by the training and the test covariance;
    NaN where the test covariance is singular) and ``Sigma_test``."""
    P = shifted_prompts(held, shift_map(spec, Sigma))
    sm = np.stack([softmax_pair_risks(U, v, P, L) for L in L_eval], axis=1)     # (theta, L_eval, pairs)
    lin = linear_inf_pair_risks(U, v, P)                                       # (theta, pairs)
    singular = is_singular(spec, Sigma.shape[0])
    test = np.full(len(L_eval), np.nan) if singular else pgd_pair_risks(P, L_eval, P.Sigma).mean(axis=-1)
    return {"risk_softmax": sm.mean(axis=-1), "risk_softmax_se": _mean_se(sm)[1],
            "risk_exact": icl.linear_inf_risk(U, v, P.Sigma), "risk_linf_mc": lin.mean(axis=-1),
            "risk_linf_mc_se": _mean_se(lin)[1], "diff_se": _mean_se(sm - lin[:, None])[1],
            "risk_ridge": ridge_pair_risks(P, L_eval, ridge_lam).mean(axis=-1),
            "risk_pgd_train": pgd_pair_risks(P, L_eval, Sigma).mean(axis=-1), "risk_pgd_test": test, "Sigma_test": P.Sigma}
