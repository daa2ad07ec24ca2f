"""The gradient gap of softmax(L) against linear(inf), along the infinite-prompt training trajectory and at
the Bayes optimum (claim C2, "trajectory stability" and "threshold study": docs/claims.md, docs/protocols.md),
and the query-averaged concentration constant (docs/models.md, section 2).

* :func:`gradient_gap_trajectory` trains ``linear(inf)`` (the Lemma 2.1 limit, matrix
  ``Gamma_w``) by gradient descent and, at every checkpoint ``theta_inf(t)`` and every prompt
  length ``L``, measures the gradient gap

      g_L(t) = sqrt( mean over prompt replicates and tasks of
                     ||grad R_L^task(theta_inf(t)) - grad R_inf^task(theta_inf(t))||^2 ),

  the norm taken jointly over ``(U, v)`` (Frobenius for ``U``), ``R^task`` one task's risk (mean
  over its queries of ``1/2 (pred - y_q)^2``) of ``softmax(L)`` resp. ``linear(inf)``.
* :func:`concentration_constant`: ``E_xq exp(x_q^T Sigma^-1 x_q / c^2)`` at the Bayes optimum,
  ``(1 - 2 tr(Sigma^-2)^{-1/2})^{-d/2}``, ``+inf`` when ``tr(Sigma^-2) <= 4``.

How the gap is computed (exact maths, float64, organised for speed): the labels are noiseless,
``y = w^T x``, so a logit is ``z . a = x . b`` with ``b = a_x + a_y w`` and every softmax moment
needed (``sum p``, ``sum p z``, ``sum p z z^T``) is a linear image of the moments of the token
features ``[1, x, x_i x_j (i <= j)]``. Antithetic partners share their covariates, so the features
are computed once per pair (and the logits too while ``U[d, :d] == 0`` exactly, when partners have
identical logits). Nested prompts: the moments of every ``L`` come from the package's one
softmax-moments core (:mod:`sfxlin.softmax_core`): each block ``[L_{b-1}, L_b)`` of tokens is
shifted by its own max and the prefixes are merged with the online-softmax rescaling, so no
normaliser can under- or overflow. Pure numpy.
"""
from __future__ import annotations

import math

import numpy as np

from . import icl, laws, softmax_core
from .training import checkpoint_steps, train, train_all_arrays, validate_Ls
from .validation import as_sigma

__all__ = ["gradient_gap_trajectory", "gradient_gap", "concentration_constant", "gap_constant", "TRAJECTORY_KEYS",
           "TRAINERS"]

#: how ``linear(inf)`` is trained (see :func:`gradient_gap_trajectory`).
TRAINERS = ("pairs", "simple")

#: keys of the dict returned by :func:`gradient_gap_trajectory`.
TRAJECTORY_KEYS = ("t", "L", "g", "g_risk", "risk_inf", "dist_bayes", "U_inf", "v_inf", "logit_factor")



# --------------------------------------------------------------------------- concentration constant


def concentration_constant(Sigma, d=None):
    """Query-averaged concentration constant at the Bayes optimum (docs/models.md, section 2):
    ``E_{x ~ N(0, Sigma)} exp(x^T Sigma^{-1} x / c^2) = (1 - 2 tr(Sigma^-2)^{-1/2})^{-d/2}`` with
    ``c^2 = ||Sigma^{-1}||_F = tr(Sigma^-2)^{1/2}``; ``+inf`` when ``tr(Sigma^-2) <= 4``.

    ``Sigma``: a positive-definite ``d x d`` matrix, a length-``d`` diagonal, or a scalar ``s``
    (``Sigma = s I_d``, then ``d`` is required). Raises ValueError for a non-symmetric,
    non-finite or singular / indefinite ``Sigma``.
    """
    S = np.asarray(Sigma, dtype=float)
    if S.ndim == 0:
        if d is None or isinstance(d, bool) or not isinstance(d, (int, np.integer)) or d < 1:
            raise ValueError(f"a scalar Sigma = s I_d needs a positive integer d, got d = {d!r}")
        S = float(S) * np.eye(int(d))
    S = as_sigma(S, d)  # diagonal or square, finite, symmetric
    lam = np.linalg.eigvalsh(S)
    if lam.min() <= 0:
        raise ValueError(f"Sigma must be positive definite (smallest eigenvalue {lam.min():g}): "
                         "the Bayes optimum needs Sigma^-1")
    tau = float(np.sum(lam ** -2.0))
    if tau <= 4.0:
        return float("inf")
    return float((1.0 - 2.0 / np.sqrt(tau)) ** (-S.shape[0] / 2.0))


def _gap_integrand(X1, X2, W, Sigma, c2):
    """``P(x, x', w)`` of :func:`gap_constant` for samples ``X1, X2, W (n, d)``: the covariance of
    the residuals of two queries (without the exponential factor) times the inner product of the
    gradients of their predictions, at the Bayes optimum."""
    y1, y2 = np.einsum("ni,ni->n", W, X1), np.einsum("ni,ni->n", W, X2)
    SW = W @ Sigma
    wSw = np.einsum("ni,ni->n", SW, W)
    xx = np.einsum("ni,ni->n", X1, X2)
    cov = c2 * wSw + y1 * y2
    inner = (xx + y1 * y2) / c2 + c2 * (np.einsum("ni,ni->n", SW, SW) + wSw ** 2) * xx
    return cov * inner


def gap_constant(Sigma, n_queries, rng, n_samples=1 << 18):
    """Asymptotic constant of the per-task gradient gap at the Bayes optimum:
    ``K = lim_{L -> inf} L E[g_L^2]`` (docs/models.md, section 2, "The gradient-gap constant"),
    for centred Gaussian covariates of covariance ``Sigma``, ``w ~ N(0, I_d)``, noiseless labels
    and ``n_queries`` queries per task; ``(K, standard error)``.

    ``K = D / q + (1 - 1/q) X`` with the same-query term ``D = E[e^{x^T Sigma^-1 x / c^2} P(x, x, w)]``
    and the cross-query term ``X = E[e^{x^T Sigma^-1 x' / c^2} P(x, x', w)]`` (``x, x'`` independent
    queries, ``c^2 = tau^{1/2}``, ``tau = tr(Sigma^-2)``). The exponential factors are integrated
    exactly by a change of Gaussian measure: ``D = kappa^{-d/2} E P(x, x, w)`` with ``x ~ N(0, Sigma / kappa)``,
    ``kappa = 1 - 2 / c^2`` (finite iff ``tau > 4``); ``X = (1 - eps^2)^{-d/2} E P(x, x', w)`` with
    ``(Sigma^{-1/2} x, Sigma^{-1/2} x')`` jointly Gaussian, covariance ``[[I, eps I], [eps I, I]] / (1 - eps^2)``,
    ``eps = 1 / c^2`` (finite iff ``tau > 1``). The remaining polynomial moments are averaged over
    ``n_samples`` draws from ``rng`` (finite variance: the standard error is returned). ``+inf`` (SE 0)
    when ``tau <= 4``.
    """
    S = as_sigma(Sigma)
    lam, V = np.linalg.eigh(S)
    if lam.min() <= 0:
        raise ValueError(f"Sigma must be positive definite (smallest eigenvalue {lam.min():g})")
    if isinstance(n_queries, bool) or not isinstance(n_queries, (int, np.integer)) or n_queries < 1:
        raise ValueError(f"n_queries must be a positive integer, got {n_queries!r}")
    if isinstance(n_samples, bool) or not isinstance(n_samples, (int, np.integer)) or n_samples < 2:
        raise ValueError(f"n_samples must be an integer >= 2, got {n_samples!r}")
    d = S.shape[0]
    tau = float(np.sum(lam ** -2.0))
    c2 = math.sqrt(tau)
    kappa, eps = 1.0 - 2.0 / c2, 1.0 / c2
    if kappa <= 0.0:                                             # tau <= 4 (to rounding)
        return float("inf"), 0.0
    root = (V * np.sqrt(lam)) @ V.T                              # Sigma^{1/2}
    n = int(n_samples)
    W = rng.standard_normal((n, d))
    Y = rng.standard_normal((n, d)) @ root / math.sqrt(kappa)    # x ~ N(0, Sigma / kappa)
    pd = kappa ** (-d / 2.0) * _gap_integrand(Y, Y, W, S, c2)
    u, v = rng.standard_normal((n, d)), rng.standard_normal((n, d))
    s1, s2 = 1.0 / math.sqrt(2.0 * (1.0 - eps)), 1.0 / math.sqrt(2.0 * (1.0 + eps))
    X1, X2 = (s1 * u + s2 * v) @ root, (s1 * u - s2 * v) @ root
    px = (1.0 - eps * eps) ** (-d / 2.0) * _gap_integrand(X1, X2, W, S, c2)
    q = int(n_queries)
    terms = pd / q + (1.0 - 1.0 / q) * px
    return float(terms.mean()), float(terms.std(ddof=1) / math.sqrt(n))


# --------------------------------------------------------------------------- the gap kernel


def _features(X):
    """Token features ``[1, x_1..x_d, x_i x_j (i <= j)]``: ``X (..., L, d) -> (..., L, nf)``."""
    d = X.shape[-1]
    iu = np.triu_indices(d)
    return np.concatenate([np.ones(X.shape[:-1] + (1,)), X, X[..., iu[0]] * X[..., iu[1]]], axis=-1)


def _group_size(tasks):
    return 2 if tasks.paired else 1


def _param_terms(U, v, tasks):
    """The prompt-free terms of the gap at the parameters ``U (t, D, D)``, ``v (t, D)``, computed
    once and shared by every prompt set: the logit coefficients of each group's columns ``Bp``
    (:func:`_softmax_moments_all`) and ``u``, ``r_inf h``, ``r_inf Gamma_w v`` of linear(inf)
    (:func:`_grad_diff`)."""
    d, n, q = tasks.d, tasks.n_tasks, tasks.n_queries
    nt = U.shape[0]
    g = _group_size(tasks)
    npair = n // g
    Sigma, w, xq, yq = tasks.Sigma, tasks.w, tasks.x_q, tasks.y_q
    a = np.einsum("tij,nqj->tnqi", U[:, :, :d], xq)                 # a = U z_q  (t, n, q, D)
    b = a[..., :d] + a[..., d:] * w[None, :, None, :]               # logit coefficients (t, n, q, d)
    shared = g == 2 and not np.any(U[:, d, :d])                     # partners: identical logits
    ge = 1 if shared else g
    # columns per pair: (t, partner, query)
    Bfull = b.reshape(nt, npair, g, q, d)[:, :, :ge]                 # (t, npair, ge, q, d)
    Bp = np.ascontiguousarray(Bfull.transpose(1, 0, 2, 3, 4)).reshape(npair, nt * ge * q, d)
    u = v[:, None, :d] + v[:, None, d:] * w[None]                   # z . v = x . u   (t, n, d)
    # linear(inf): h = Gamma_w a = (Sigma b, w . Sigma b), Gamma_w v = (Sigma u, w . Sigma u)
    Sb = b @ Sigma
    Su = u @ Sigma
    h = np.concatenate([Sb, np.einsum("tnqi,ni->tnq", Sb, w)[..., None]], axis=-1)
    Gv = np.concatenate([Su, np.einsum("tni,ni->tn", Su, w)[..., None]], axis=-1)   # (t, n, D)
    r_inf = np.einsum("tnqi,tni->tnq", Sb, u) - yq                  # (t, n, q)
    return {"nt": nt, "ge": ge, "Bp": Bp, "u": u,
            "rh": (r_inf[..., None] * h)[:, :, :, None, :],                       # (t, n, q, 1, D)
            "rGv": r_inf[..., None, None] * Gv[:, :, None, None, :]}               # (t, n, q, 1, D)


def _softmax_moments_all(terms, tasks, XT, Phi, Ls):
    """``E_p x (t, n, q, L, d)`` and ``E_p x x^T (t, n, q, L, d, d)`` of ``softmax(L)`` at the
    parameters of ``terms`` (:func:`_param_terms`) on the prompt covariates of each group of tasks
    sharing them (antithetic pairs when ``tasks.paired``): ``XT (groups, d, L_max)``, features
    ``Phi (groups, L_max, nf)``; labels are ``w^T x`` (noiseless)."""
    d, n, q = tasks.d, tasks.n_tasks, tasks.n_queries
    nt, ge = terms["nt"], terms["ge"]
    g = _group_size(tasks)
    npair = n // g
    edges = (0,) + tuple(Ls)
    nL = len(Ls)
    _, P = softmax_core.prefix_moments(np.swapaxes(Phi, 1, 2), edges, A=terms["Bp"], X=XT)   # (nL, npair, C, nf)
    out = softmax_core.normalised(P).transpose(1, 2, 0, 3).reshape(npair, nt, ge, q, nL, -1)
    if ge != g:
        out = np.broadcast_to(out, (npair, nt, g, q, nL, out.shape[-1]))
    out = out.transpose(1, 0, 2, 3, 4, 5).reshape(nt, n, q, nL, -1)  # (t, n, q, L, nf - 1)
    m1 = out[..., :d]
    m2 = out[..., d:][..., icl.pair_index(d)]                        # (t, n, q, L, d, d)
    return m1, m2


def _grad_diff(terms, tasks, m1, m2):
    """Per task ``grad R_L - grad R_inf`` at the parameters of ``terms`` (:func:`_param_terms`):
    ``dU (t, n, L, D, d)`` (the last column of the ``U`` gradient, ``z_q[d] = 0``, is identically
    0 and omitted) and ``dv (t, n, L, D)``."""
    q = tasks.n_queries
    w, xq, yq = tasks.w, tasks.x_q, tasks.y_q
    u = terms["u"]
    # softmax(L): mbar = (m1, w . m1), E_p[z (z . v)] = (m2 u, w . m2 u)
    pred = np.einsum("tnqli,tni->tnql", m1, u)
    r = pred - yq[None, :, :, None]                                 # (t, n, q, L)
    m2u = np.einsum("tnqlij,tnj->tnqli", m2, u)
    mbar = np.concatenate([m1, np.einsum("tnqli,ni->tnql", m1, w)[..., None]], axis=-1)
    Ezv = np.concatenate([m2u, np.einsum("tnqli,ni->tnql", m2u, w)[..., None]], axis=-1)
    Cv = Ezv - mbar * pred[..., None]                               # C v   (t, n, q, L, D)
    dv = (r[..., None] * mbar - terms["rh"]).mean(axis=2)           # (t, n, L, D)
    c = r[..., None] * Cv - terms["rGv"]                            # (t, n, q, L, D)
    dU = np.einsum("tnqli,nqj->tnlij", c, xq) / q                   # (t, n, L, D, d); column d is 0
    return dU, dv


def _param_chunks(U, v, tasks, nL, t_chunk=None):
    """The parameter points in chunks (``t_chunk`` bounds the points evaluated together; default:
    the ``(t, n, q, L, d, d)`` moment arrays within ~32 MB), each ``(slice, _param_terms)``."""
    d, nt = tasks.d, U.shape[0]
    if t_chunk is None:
        per_t = tasks.n_tasks * tasks.n_queries * nL * (d * d + 4 * (d + 1)) * 8
        t_chunk = int(max(1, min(nt, (32 << 20) // max(per_t, 1))))
    chunks = []
    with np.errstate(under="ignore"):
        for lo in range(0, nt, t_chunk):
            sl = slice(lo, min(nt, lo + t_chunk))
            chunks.append((sl, _param_terms(U[sl], v[sl], tasks)))
    return chunks


def _gap_sums(chunks, tasks, X, Ls):
    """Sums over tasks of the squared gaps for one prompt set given by its group covariates
    ``X (groups, L_max, d)``, at the parameter points of ``chunks`` (:func:`_param_chunks`):
    ``(task (nt, nL), risk (nt, nL))`` where ``task`` is the mean over tasks of
    ``||grad R_L^task - grad R_inf^task||^2`` and ``risk`` is ``||mean over tasks of the
    difference||^2``."""
    nt, nL = chunks[-1][0].stop, len(Ls)
    X = np.ascontiguousarray(X, dtype=float)
    XT = np.ascontiguousarray(X.transpose(0, 2, 1))
    Phi = _features(X)
    sq_task = np.empty((nt, nL))
    sq_risk = np.empty((nt, nL))
    with np.errstate(under="ignore"):
        for sl, terms in chunks:
            m1, m2 = _softmax_moments_all(terms, tasks, XT, Phi, Ls)
            dU, dv = _grad_diff(terms, tasks, m1, m2)
            sq_task[sl] = (np.sum(dU ** 2, axis=(-2, -1)) + np.sum(dv ** 2, axis=-1)).mean(axis=1)
            sq_risk[sl] = np.sum(dU.mean(axis=1) ** 2, axis=(-2, -1)) + np.sum(dv.mean(axis=1) ** 2, axis=-1)
    return sq_task, sq_risk


def _check_params(U, v, D):
    U = np.asarray(U, dtype=float)
    v = np.asarray(v, dtype=float)
    if U.ndim == 2:
        U, v = U[None], v[None]
    if U.ndim != 3 or U.shape[1:] != (D, D) or v.shape != (U.shape[0], D):
        raise ValueError(f"U must be (nt, {D}, {D}) and v (nt, {D}), got {U.shape}, {v.shape}")
    if not (np.all(np.isfinite(U)) and np.all(np.isfinite(v))):
        raise ValueError("U and v must be finite")
    return U, v


def _finish(sq_task, sq_risk, n_sets, kind, label=""):
    out = {"task": np.sqrt(sq_task / n_sets).T, "risk": np.sqrt(sq_risk / n_sets).T}
    for name, g in out.items():
        if not np.all(np.isfinite(g)):
            where = f"[{label}] " if label else ""
            raise FloatingPointError(f"{where}non-finite gradient gap ({name}): parameters or prompts out of range")
    return out if kind == "both" else out[kind]


def gradient_gap(U, v, tasks, prompts, Ls, *, kind="task", t_chunk=None):
    """Gradient gap of ``softmax(L)`` against ``linear(inf)`` at the parameters ``U (nt, D, D)``,
    ``v (nt, D)``, shape ``(len(Ls), nt)`` (a dict ``{"task": ..., "risk": ...}`` with ``kind="both"``).

    * ``kind="task"``: ``sqrt(mean over prompt sets and tasks of ||grad R_L^task - grad R_inf^task||^2)``
      with ``R^task`` one task's risk (mean over its queries);
    * ``kind="risk"``: ``sqrt(mean over prompt sets of ||grad R_L - grad R_inf||^2)`` with ``R`` the
      training risk (mean over all tasks and queries): task noise averages out before the norm, a
      common bias does not.

    Norms are joint in ``(U, v)`` (Frobenius for ``U``). ``prompts (R, n_tasks, L_max, D)`` (or one
    set ``(n_tasks, L_max, D)``): ``R`` prompt sets for ``tasks`` with noiseless labels ``y = w^T x``
    (antithetic partners sharing covariates when ``tasks.paired``); the length-``L`` prompt is the
    first ``L`` tokens. ``t_chunk`` bounds the parameter points evaluated together (memory).
    """
    if kind not in ("task", "risk", "both"):
        raise ValueError(f"kind must be 'task', 'risk' or 'both', got {kind!r}")
    U, v = _check_params(U, v, tasks.D)
    prompts = np.asarray(prompts, dtype=float)
    if prompts.ndim == 3:
        prompts = prompts[None]
    if prompts.ndim != 4 or prompts.shape[1:2] + prompts.shape[3:] != (tasks.n_tasks, tasks.D):
        raise ValueError(f"prompts must be (R, {tasks.n_tasks}, L_max, {tasks.D}), got {prompts.shape}")
    Ls = validate_Ls(Ls, prompts.shape[2])
    if np.any(tasks.mean):
        raise ValueError("the gap kernel compares softmax(L) with linear(inf), its limit for centred covariates "
                         f"only; these tasks have covariate mean {tasks.mean.tolist()} (softmax then tends to an "
                         "affine map, not to linear(inf))")
    d, g = tasks.d, _group_size(tasks)
    x = prompts[..., :d]
    resid = np.max(np.abs(prompts[..., d] - np.einsum("rnli,ni->rnl", x, tasks.w)))
    if not resid <= 1e-12 * (np.max(np.abs(prompts[..., d])) + 1.0):
        raise ValueError("the gap kernel needs noiseless labels y = w^T x in the prompts")
    if g == 2 and not np.array_equal(x[:, 0::2], x[:, 1::2]):
        raise ValueError("tasks.paired but antithetic partners do not share their prompt covariates")
    sq_task = np.zeros((U.shape[0], len(Ls)))
    sq_risk = np.zeros((U.shape[0], len(Ls)))
    chunks = _param_chunks(U, v, tasks, len(Ls), t_chunk)   # the prompt-free terms, once for every set
    for xr_ in x:
        a, b = _gap_sums(chunks, tasks, xr_[::g], Ls)
        sq_task += a
        sq_risk += b
    return _finish(sq_task, sq_risk, prompts.shape[0], kind)


def gradient_gap_trajectory(rng, Sigma, Ls, *, n_pairs, n_queries, n_replicates, lr, n_steps,
                            ckpt_every, x_law="gaussian", trainer="pairs", label="", perturb=None):
    """Train ``linear(inf)`` and measure the gradient gap of ``softmax(L)`` along its trajectory.

    Draws, from ``rng`` in this order: the tasks (``icl.make_tasks``: ``n_pairs`` antithetic pairs,
    ``n_queries`` queries each, ``L_max = max(Ls)`` prompt tokens, covariates from
    ``laws.covariate_law(x_law, Sigma)``: any law spec with covariance ``Sigma``, e.g. ``"gaussian"``,
    ``"rademacher"``, ``"uniform"``, ``"student_t:5"``), then, one replicate at a time,
    the covariates ``(n_pairs, L_max)`` of ``n_replicates - 1`` further prompt sets for the same
    tasks and queries (shared by antithetic partners, labels ``w^T x``); replicate 0 is the tasks'
    own prompts.

    ``trainer``: ``"pairs"`` (default) trains with ``training.train_all_arrays``, which adds the
    gradient contributions of antithetic partners first, so the off-block part of the gradient
    cancels exactly and the block structure of the Eq. 9 init is kept in exact arithmetic (it is
    still computed, never imposed: ``off_block`` measures it); ``"simple"`` uses ``training.train``,
    whose einsum sums leave ~1e-18 of off-block rounding. At lr = 0.01 and large covariate
    variance (small tau) the block structure is a dynamically unstable direction of gradient
    descent: with ``"simple"`` that rounding grows to ~1e-2 within 200 steps in some cells and
    kicks the block part off the balanced manifold, so the trajectory ends at another global
    minimiser (``U v = Sigma^-1`` but ``||U||_F^2 != ||v||^2``), 0.3-0.5 away from the Bayes
    optimum (2 of the 140 paper cells: tau = 0.75 and 1.19, seed 7). ``linear(inf)`` (matrix ``Gamma_w``, independent of the prompts) is trained
    by gradient descent (``trainer``, step ``lr``) from the Eq. 9 init; at the checkpoints
    ``t = 0, ckpt_every, ..., n_steps`` the gap of :func:`gradient_gap` is measured for every ``L``.
    ``perturb``: passed to the trainer, applied to the parameters after every update
    (:func:`sfxlin.training.train_all_arrays`; an amplification run, :mod:`sfxlin.engine.sensitivity`).

    Returns a dict (numpy arrays):

    * ``t (n_ckpt,)``, ``L (nL,)``;
    * ``g (nL, n_ckpt)``: the gradient gap ``g_L(t)`` (per task, ``kind="task"`` of :func:`gradient_gap`);
    * ``g_risk (nL, n_ckpt)``: the gap of the training-risk gradient (``kind="risk"``);
    * ``risk_inf (n_ckpt,)``: training risk of ``linear(inf)``;
    * ``dist_bayes (n_ckpt,)``: ``||theta_inf(t) - theta*||`` (``icl.bayes_optimum``);
    * ``U_inf (n_ckpt, D, D)``, ``v_inf (n_ckpt, D)``: the trajectory;
    * ``logit_factor (n_ckpt,)``: mean over tasks and queries of ``exp(a^T Gamma_w a)``,
      ``a = U z_q`` (the exponential factor of the finite-L constant, docs/models.md, section 1).
    """
    Ls = validate_Ls(Ls)
    if isinstance(n_replicates, bool) or not isinstance(n_replicates, (int, np.integer)) or n_replicates < 1:
        raise ValueError(f"n_replicates must be a positive integer, got {n_replicates!r}")
    checkpoint_steps(n_steps, ckpt_every)
    if trainer not in TRAINERS:
        raise ValueError(f"trainer must be one of {TRAINERS}, got {trainer!r}")
    law = laws.covariate_law(x_law, Sigma)   # validates Sigma (square, symmetric, positive definite)
    Sigma = np.asarray(law.cov, dtype=float)
    d = Sigma.shape[0]
    tasks = icl.make_tasks(rng, d, n_pairs, n_queries, Ls[-1], law)
    if trainer == "pairs":
        res = train_all_arrays(tasks, (), models=("linear_inf",), lr=lr, n_steps=n_steps,
                               ckpt_every=ckpt_every, label=label, pair_first=True, perturb=perturb)
        t_ckpt, traj = res["t"], res["linear_inf"]
        U, v, risk_inf = traj["U"], traj["v"], traj["risk"]
    else:
        traj = train("linear_inf", tasks, lr=lr, n_steps=n_steps, ckpt_every=ckpt_every, label=label,
                     perturb=perturb)
        t_ckpt, U, v, risk_inf = traj["t"].values, traj["U"].values, traj["v"].values, traj["risk"].values
    U = np.asarray(U, dtype=float)
    v = np.asarray(v, dtype=float)
    sq_task = np.zeros((U.shape[0], len(Ls)))
    sq_risk = np.zeros((U.shape[0], len(Ls)))
    chunks = _param_chunks(U, v, tasks, len(Ls))   # the prompt-free terms, once for every replicate
    for r in range(int(n_replicates)):   # replicate 0: the tasks' own prompts; then fresh covariates
        X = tasks.Z[::2, :, :d] if r == 0 else np.asarray(law.sample(rng, (n_pairs, Ls[-1])), dtype=float)
        a, b = _gap_sums(chunks, tasks, X, Ls)
        sq_task += a
        sq_risk += b
    gaps = _finish(sq_task, sq_risk, int(n_replicates), "both", label)
    Ustar, vstar = icl.bayes_optimum(Sigma)
    a = np.einsum("tij,nqj->tnqi", U, tasks.z_q)
    quad = np.einsum("tnqi,nij,tnqj->tnq", a, icl.Gamma_w(Sigma, tasks.w), a)
    with np.errstate(over="ignore"):
        logit_factor = np.exp(quad).mean(axis=(1, 2))
    return {
        "t": np.asarray(t_ckpt),
        "L": np.array(Ls, dtype=int),
        "g": gaps["task"],
        "g_risk": gaps["risk"],
        "risk_inf": np.asarray(risk_inf, dtype=float),
        "dist_bayes": icl.theta_distance(U, v, Ustar, vstar),
        "U_inf": U,
        "v_inf": v,
        "logit_factor": logit_factor,
    }
