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
shifts differ by their maps, not by their samples). The shifted tasks are kept once per antithetic
pair (:class:`Pairs`, tokens last) and risks per pair (the unit whose tasks share covariates), so their
standard errors are over pairs; the softmax risks at every evaluated length come from one pass over the
longest prompts (nested prompts: prefix sums), the baselines from the prompts' prefix sums.

Pure numpy, float64.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import baselines, covariance, icl, softmax_core
from .validation import as_sigma, positive_int

__all__ = ["TRANSFORMS", "parse_shift", "shift_map", "shifted_covariance", "is_singular", "shift_check", "Pairs",
           "shifted_pairs", "softmax_pair_risks", "linear_inf_pair_risks", "ridge_pair_risks", "pgd_pair_risks",
           "shift_risks"]

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
class Pairs:
    """Shifted held-out tasks, one row per antithetic pair (its first task ``(w, eps)``; the partner has
    ``-w``, the same covariates and queries, labels and targets negated): ``Z (n_pairs, D, L_max)`` the
    prompt tokens ``(x, y)`` tokens last (the rows the softmax core reads), ``w (n_pairs, d)``, ``x_q
    (n_pairs, q, d)``, ``y_q (n_pairs, q)``; ``Sigma`` the test covariance (positive semi-definite)."""

    Z: np.ndarray
    w: np.ndarray
    x_q: np.ndarray
    y_q: np.ndarray
    Sigma: np.ndarray

    @property
    def z_q(self):
        """Masked queries ``(n_pairs, q, D)``: ``(x_q, 0)``."""
        return np.concatenate([self.x_q, np.zeros(self.x_q.shape[:-1] + (1,))], axis=-1)


def shifted_pairs(tasks, A) -> Pairs:
    """The held-out ``tasks`` (noiseless, centred, in antithetic pairs) with every covariate mapped by ``A``:
    ``x' = A x``, ``y' = w^T x'``, the queries likewise; ``Sigma' = A Sigma A^T``; one row per pair."""
    if tasks.noise or tasks.query_noise or np.any(tasks.mean) or not tasks.paired or tasks.n_tasks % 2:
        raise ValueError("shifted_pairs needs noiseless, centred tasks in antithetic pairs (icl.make_tasks with "
                         "noise = query_noise = 0 and a centred law)")
    A = np.asarray(A, dtype=float)
    d = tasks.d
    if A.shape != (d, d) or not np.all(np.isfinite(A)):
        raise ValueError(f"A must be a finite {d} x {d} matrix, got shape {A.shape}")
    w = tasks.w[0::2]
    x = tasks.pairs.x if tasks.pairs is not None else tasks.Z[0::2, :, :d]          # (n_pairs, L_max, d)
    Z = np.empty((w.shape[0], d + 1, tasks.L_max))
    np.einsum("ij,plj->pil", A, x, out=Z[:, :d])                                      # x' = A x, tokens last
    np.matmul(w[:, None, :], Z[:, :d], out=Z[:, d:])                                  # y' = w . x'
    xq = tasks.x_q[0::2] @ A.T
    S = A @ tasks.Sigma @ A.T
    return Pairs(Z=Z, w=w.copy(), x_q=xq, y_q=np.einsum("pqi,pi->pq", xq, w), Sigma=0.5 * (S + S.T))


def _lengths(Ls, L_max):
    Ls = [icl.check_L(L, L_max) for L in Ls]
    if not Ls or np.any(np.diff(Ls) <= 0):
        raise ValueError(f"the prompt lengths must be strictly increasing, got {Ls}")
    return Ls


def _first_partner(err) -> np.ndarray:
    """``1/2 err^2`` averaged over the queries (last axis): a pair's risk when the partner's error is exactly
    ``-err`` (an estimator linear in the labels: the partner's estimate, prediction and target are negated)."""
    return 0.5 * np.mean(err**2, axis=-1)


def softmax_pair_risks(U, v, pairs, Ls) -> np.ndarray:
    """Per-pair risks of softmax(``L``) attention, for every ``L`` of ``Ls`` (strictly increasing), on the
    first ``L`` tokens of the shifted prompts, with parameters ``U (..., D, D)``, ``v (..., D)`` ->
    ``(..., len(Ls), n_pairs)``: one pass over the tokens for every length (the nested prompts' prefix sums,
    :func:`sfxlin.softmax_core.prefix_moments`). A partner's tokens are ``(x, -y)``: its logits
    ``x . a_x - y a_y`` (``a = U z_q``) equal the first task's when ``U[d, :d] = 0`` (every parameter), and the
    pair then shares one pass (its moments are the same numbers); otherwise each partner has its own columns."""
    U, v = np.asarray(U, dtype=float), np.asarray(v, dtype=float)
    D = pairs.Z.shape[1]
    d = D - 1
    if U.shape[-2:] != (D, D) or v.shape[-1:] != (D,) or U.shape[:-2] != v.shape[:-1]:
        raise ValueError(f"U must be (..., {D}, {D}) and v (..., {D}) with the same leading axes, got {U.shape} and "
                         f"{v.shape}")
    Ls = _lengths(Ls, pairs.Z.shape[2])
    lead = U.shape[:-2]
    Uf, vf = U.reshape(-1, D, D), v.reshape(-1, D)
    P, q = pairs.y_q.shape
    signs = np.array([1.0] if not np.any(Uf[:, d, :d]) else [1.0, -1.0])   # partners sharing one pass, or not
    a = np.einsum("kij,pqj->pkqi", Uf, pairs.z_q)                                 # (P, k, q, D)
    coef = np.repeat(a[:, :, None], signs.size, axis=2)                           # (P, k, J, q, D)
    coef[..., d] *= signs[:, None]
    _, Mom = softmax_core.prefix_moments(pairs.Z, (0, *Ls), A=coef.reshape(P, -1, D), X=pairs.Z, ones=True)
    E = (Mom[..., 1:] / Mom[..., :1]).reshape(len(Ls), P, Uf.shape[0], signs.size, q, D)
    E = np.broadcast_to(E, E.shape[:3] + (2, q, D))                               # both partners
    s = np.array([1.0, -1.0])[:, None]
    pred = np.einsum("bpkjqi,ki->bpkjq", E[..., :d], vf[:, :d]) + s * E[..., d] * vf[:, None, None, d]
    err = pred - s * pairs.y_q[None, :, None, None]                               # targets y_q, -y_q
    risk = 0.5 * np.mean(err**2, axis=(-2, -1))                                   # (nL, P, k)
    return np.moveaxis(risk, -1, 0).reshape(lead + (len(Ls), P))


def linear_inf_pair_risks(U, v, pairs) -> np.ndarray:
    """Per-pair risks of linear(inf) with the test covariance (``Gamma_w`` from ``pairs.Sigma`` and each task's
    ``w``, ``-w`` for the partner) on the shifted queries -> ``(..., n_pairs)``: the Monte Carlo of
    :func:`sfxlin.icl.linear_inf_risk` on these tasks."""
    U, v = np.asarray(U, dtype=float), np.asarray(v, dtype=float)
    Uz = np.einsum("...ij,pqj->...pqi", U, pairs.z_q)                         # U z_q
    err = [np.einsum("...pj,...pqj->...pq", np.einsum("pij,...i->...pj", icl.Gamma_w(pairs.Sigma, s * pairs.w), v), Uz)
           - s * pairs.y_q for s in (1.0, -1.0)]                              # (Gamma_w v) . U z_q, Gamma_w symmetric
    return 0.5 * np.mean(np.stack(err, axis=-3) ** 2, axis=(-3, -1))


def _block_sums(pairs, Ls):
    """Prefix sums ``X^T X`` ``(nL, P, d, d)`` and ``X^T y`` ``(nL, P, d)`` of the first ``L`` tokens of each pair."""
    d = pairs.w.shape[-1]
    edges = (0, *Ls)
    sums = np.cumsum([pairs.Z[:, :d, lo:hi] @ np.swapaxes(pairs.Z[:, :, lo:hi], 1, 2)        # X^T [X | y]
                      for lo, hi in zip(edges, edges[1:])], axis=0)
    return sums[..., :d], sums[..., d]


def ridge_pair_risks(pairs, Ls, lam=0.0) -> np.ndarray:
    """Per-pair risks ``(nL, n_pairs)`` of ridge on the first ``L`` tokens of each shifted prompt:
    ``argmin (1/L) ||y - X w||^2 + lam ||w||^2``; ``lam = 0``: minimum-norm least squares
    ``pinv(X^T X) X^T y`` (eigenvalues of ``X^T X`` below ``1e-12`` of the largest cut: the confined directions
    of a subspace shift, exactly 0 there). From the prompts' prefix sums, one pass for every ``L``; linear in
    the labels: a pair's risk is its first task's (noiseless: rounding once the prompt spans the covariates)."""
    lam = float(lam)
    if not (np.isfinite(lam) and lam >= 0):
        raise ValueError(f"lam must be a finite non-negative number, got {lam}")
    d = pairs.w.shape[-1]
    Ls = _lengths(Ls, pairs.Z.shape[2])
    XtX, Xty = _block_sums(pairs, Ls)
    if lam > 0:
        Lc = np.array(Ls, dtype=float)[:, None, None]
        w_hat = np.linalg.solve(XtX / Lc[..., None] + lam * np.eye(d), (Xty / Lc)[..., None])[..., 0]
    else:
        w_hat = (np.linalg.pinv(XtX, rcond=1e-12, hermitian=True) @ Xty[..., None])[..., 0]
    return _first_partner(np.einsum("pqi,kpi->kpq", pairs.x_q, w_hat) - pairs.y_q)


def pgd_pair_risks(pairs, Ls, Sigma_pre) -> np.ndarray:
    """Per-pair risks ``(nL, n_pairs)`` of one step of preconditioned gradient descent on the shifted
    prompts, ``w_hat = Gamma_L (1/L) X^T y`` with the preconditioner
    :func:`sfxlin.baselines.pgd_preconditioner` of ``Sigma_pre`` (positive definite): the training
    covariance (the shift-unaware estimator that linear attention at its optimum implements) or the
    test covariance (the oracle). Linear in the labels: a pair's risk is its first task's."""
    Ls = _lengths(Ls, pairs.Z.shape[2])
    _, Xty = _block_sums(pairs, Ls)
    G = np.stack([baselines.pgd_preconditioner(L, Sigma_pre) / L for L in Ls])
    w_hat = np.einsum("kij,kpj->kpi", G, Xty)
    return _first_partner(np.einsum("pqi,kpi->kpq", pairs.x_q, w_hat) - pairs.y_q)


def _mean_se(pairs):
    """Mean and SE over the last axis (held-out pairs, independent)."""
    return pairs.mean(axis=-1), pairs.std(axis=-1, ddof=1) / np.sqrt(pairs.shape[-1])


def shift_risks(U, v, held, spec, Sigma, L_eval, ridge_lam=0.0) -> dict:
    """The trained parameters ``U (theta, D, D)``, ``v (theta, D)`` on the held-out tasks ``held`` mapped by the
    shift ``spec`` of the training covariance ``Sigma``, at every length of ``L_eval``: ``risk_softmax``,
    ``risk_softmax_se``, ``diff_se`` ``(theta, L_eval)`` (softmax(L_eval), its SE over pairs, the SE of its paired
    difference to linear(inf)'s Monte Carlo); ``risk_exact`` (:func:`sfxlin.icl.linear_inf_risk` with the test
    covariance), ``risk_linf_mc``, ``risk_linf_mc_se`` (its SE over pairs, estimated) and ``risk_linf_exact_se``
    (its exact SE, :func:`sfxlin.icl.linear_inf_pair_variance`) ``(theta,)``; the baselines ``risk_ridge``,
    ``risk_pgd_train``, ``risk_pgd_test`` ``(L_eval,)`` (preconditioned by the training and the test covariance;
    NaN where the test covariance is singular) and ``Sigma_test``."""
    P = shifted_pairs(held, shift_map(spec, Sigma))
    n_pairs, q = P.y_q.shape
    sm = softmax_pair_risks(U, v, P, L_eval)                                   # (theta, L_eval, pairs)
    lin = linear_inf_pair_risks(U, v, P)                                       # (theta, pairs)
    singular = is_singular(spec, Sigma.shape[0])
    test = np.full(len(L_eval), np.nan) if singular else pgd_pair_risks(P, L_eval, P.Sigma).mean(axis=-1)
    return {"risk_softmax": sm.mean(axis=-1), "risk_softmax_se": _mean_se(sm)[1],
            "risk_exact": icl.linear_inf_risk(U, v, P.Sigma), "risk_linf_mc": lin.mean(axis=-1),
            "risk_linf_mc_se": _mean_se(lin)[1],
            "risk_linf_exact_se": np.sqrt(icl.linear_inf_pair_variance(U, v, P.Sigma, q) / n_pairs),
            "diff_se": _mean_se(sm - lin[:, None])[1],
            "risk_ridge": ridge_pair_risks(P, L_eval, ridge_lam).mean(axis=-1),
            "risk_pgd_train": pgd_pair_risks(P, L_eval, Sigma).mean(axis=-1), "risk_pgd_test": test,
            "Sigma_test": P.Sigma}
