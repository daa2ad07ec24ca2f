"""Non-asymptotic concentration of softmax attention (claim C2): output tails and gradient gaps.

The science of the ``c2_concentration`` experiment; the pipeline only maps its configuration
and cell onto these functions.

Output tails (docs/models.md, section 1; C2 "output tail tests", docs/protocols.md), :func:`output_tails`. Tokens
``N(0, sigma^2 I_d)``, ``U`` a Gaussian ``d x d`` matrix rescaled to ``||U||_F = U_norm``,
``V = I_d``, queries ``q ~ N(0, sigma^2 I_d)``. Per query, ``n_prompts`` independent prompts of
``L_max`` tokens; all nested ``L`` in one prefix pass. ``f_inf = sigma^2 U q`` (Lemma 2.1).
Thresholds: ``t(q, L, level) = r(q, level) / sqrt(L)`` with ``r`` the ``1 - level`` quantile of
``||N(0, C)||``, ``C = Gaussian.snis_covariance(U q) = lim L Cov(f_L)``, estimated by a seeded
Monte Carlo (``clt_draws`` Gaussian vectors, ``||C^{1/2} g||^2 = sum lam_j g_j^2``). Per test
``(query, L, level)``: the exceedance count of ``||f_L - f_inf|| > t`` and ``n``; the CLT tail
``P(||N(0, C/L)|| > t)`` from an *independent* Monte Carlo of the same size (so it estimates the
sharp prediction at the threshold actually used, not the level by construction); and the
paper-form bound ``c1 exp(-c2 L t^2 / K(a))``, ``K(a) = exp(4 sigma^2 ||U q||^2)`` with
``c1 = exp(log_c1_per_d * d)`` and ``c2 = c2_scale / sigma^2`` (:func:`tail_bound_constants`).
These constants are OUR assumption (the paper's are existential): for a sub-Gaussian vector with
variance proxy ``s^2 I_d``, ``s^2 = sigma^2 K(a) / L`` (the paper's), Hsu-Kakade-Zhang (2012,
Thm 1) give ``P(||X||^2 > s^2 (d + 2 sqrt(d u) + 2 u)) <= e^-u``; with
``d + 2 sqrt(d u) + 2 u <= 2d + 3u`` this is ``P(||X|| > t) <= e^{2d/3} exp(-t^2 / (3 s^2))``:
``log_c1_per_d = 2/3``, ``c2_scale = 1/3``. (Asymptotically ``Cov(f_L) <= sigma^2 e^{2 sigma^2
||Uq||^2} I / L``, below the proxy, so the bound holds in the CLT limit; finite-L tails are what
is tested.) Because ``t ~ 1 / sqrt(L)``, ``L t^2`` and hence the bound and the CLT tail do not
depend on ``L``.

Gradient concentration at fixed parameters (docs/models.md, section 2), :func:`gradient_concentration`.
Covariates ``N(0, Sigma)``, ``Sigma`` any covariance (C2 uses ``scale`` times an ``sfxlin.covariance``
spec: ``isotropic``, ``I_d``, or ``geometric:2:0.5``, ``diag(geomspace(2, 0.5, d))``, diag(2, 1, 0.5) at d = 3);
parameters on the training manifold (:func:`gradient_parameters`): ``U = U_norm *
blockdiag(Sigma^-1, 0) / ||Sigma^-1||_F`` (the Bayes optimum's direction, which is the Eq. 9
init's ``I_d / sqrt(d)`` when isotropic) and ``v = U_norm e_{d+1}`` (``||v|| = ||U||_F``, the
balanced manifold). With this choice the logit ``a = U z_q`` has no label component, so
``a^T Gamma_w a = a_x^T Sigma a_x`` does not grow with ``||w||``; off-block gradient components
vanish to rounding by the antithetic symmetry in both models. Tasks (``n_pairs`` antithetic pairs
x ``n_queries`` queries, ``icl.make_tasks``) are drawn once; ``n_draws`` independent prompt sets
(the tasks' own, then fresh covariates one set at a time, :func:`gradient_gaps`). Measured:
``E ||grad R_L - grad R_inf||^2`` over prompt draws (joint Frobenius norm over ``(U, v)``),
``R_L`` the softmax(L) risk (mean over tasks and queries, ``icl``) and ``R_inf`` the linear(inf)
(``Gamma_w``) risk on the same tasks and queries; its standard error; ``||grad R_inf||^2``; and
the paper-form bound ``grad_c / L * mean_items K_i P_i``, as its log
(:func:`gradient_log_bound_constant`).
"""
from __future__ import annotations

import numpy as np

from . import icl
from .attention import softmax_attention_prefix
from .laws import Gaussian, covariate_law

__all__ = ["clt_radii", "clt_tail", "tail_counts", "paper_factor", "tail_bound_constants",
           "tail_bound", "output_tails", "gradient_parameters", "gradient_log_bound_constant", "fresh_prompt",
           "gradient_gaps", "gradient_concentration"]

# --------------------------------------------------------------------------- output tails


def clt_radii(rng, C, levels, n_draws):
    """``(1 - level)`` quantiles of ``||N(0, C)||`` by Monte Carlo: ``C (Q, d, d)`` -> ``(Q, nlev)``.

    ``||C^{1/2} g||^2 = sum_j lam_j g_j^2`` with ``lam`` the eigenvalues of ``C``; one block of
    ``n_draws x d`` standard normals per query, in query order.
    """
    lam = np.linalg.eigvalsh(C)
    out = np.empty((C.shape[0], len(levels)))
    for i in range(C.shape[0]):
        y = rng.standard_normal((n_draws, C.shape[-1])) ** 2 @ lam[i]
        out[i] = np.sqrt(np.quantile(y, 1.0 - np.asarray(levels, dtype=float)))
    return out


def clt_tail(rng, C, radii, n_draws):
    """``P(||N(0, C)|| > r)`` by Monte Carlo: ``C (Q, d, d)``, ``radii (Q, nlev)`` -> ``(Q, nlev)``.

    Equals ``P(||N(0, C / L)|| > r / sqrt(L))`` for every ``L``."""
    lam = np.linalg.eigvalsh(C)
    out = np.empty(radii.shape)
    for i in range(C.shape[0]):
        y = rng.standard_normal((n_draws, C.shape[-1])) ** 2 @ lam[i]
        out[i] = np.mean(y[:, None] > radii[i] ** 2, axis=0)
    return out


def tail_counts(rng, law, U, q, f_inf, Ls, thresholds, n_prompts, chunk):
    """Exceedance counts ``#{prompts : ||f_L(q) - f_inf(q)|| > t}``, ``(Q, nL, nlev)``.

    For each query in turn, prompts of ``L_max`` tokens are drawn from ``law`` in chunks of
    ``chunk`` (``law.sample(rng, (chunk, L_max))``) and evaluated at every ``L`` in one prefix pass.
    ``thresholds (Q, nL, nlev)``.
    """
    Q = q.shape[0]
    counts = np.zeros(thresholds.shape)
    V = np.eye(law.D)
    for i in range(Q):
        for start in range(0, n_prompts, chunk):
            m = min(chunk, n_prompts - start)
            Z = law.sample(rng, (m, Ls[-1]))
            f_L = softmax_attention_prefix(Z, U, V, q[i], Ls)  # (m, nL, d)
            err = np.sqrt(np.sum((f_L - f_inf[i]) ** 2, axis=-1))  # (m, nL)
            counts[i] += np.sum(err[:, :, None] > thresholds[i][None], axis=0)
    return counts


def paper_factor(sigma, Uq_sq):
    """The paper's exponential factor ``K(a) = exp(4 sigma^2 ||U q||^2)`` (the sharp asymptotics
    carry ``exp(sigma^2 ||U q||^2)``)."""
    return np.exp(4.0 * sigma**2 * Uq_sq)


def tail_bound_constants(d, sigma, log_c1_per_d, c2_scale):
    """``(c1, c2) = (exp(log_c1_per_d * d), c2_scale / sigma^2)``: the constants of the
    paper-form tail bound, OUR assumption (defaults 2/3 and 1/3, see the module docstring)."""
    return np.exp(float(log_c1_per_d) * d), float(c2_scale) / sigma**2


def tail_bound(c1, c2, Ls, thresholds, K):
    """The paper-form bound ``c1 exp(-c2 L t^2 / K)`` at every test: ``Ls (nL,)``,
    ``thresholds (Q, nL, nlev)``, ``K (Q,)`` -> ``(Q, nL, nlev)``; not capped at 1."""
    return c1 * np.exp(-c2 * Ls[None, :, None] * thresholds**2 / K[:, None, None])


def output_tails(rng_tail, rng_clt, d, U_norm, *, sigma, Ls, levels, n_queries, n_prompts, clt_draws, chunk,
                 log_c1_per_d, c2_scale):
    """The output tail tests of one cell (module docstring), as the ``tail_*`` variables.

    Draw order: from ``rng_tail`` the matrix ``U (d, d)``, the queries ``(n_queries, d)``, then the
    prompts (:func:`tail_counts`); from ``rng_clt`` the quantile Monte Carlo (:func:`clt_radii`),
    then the independent tail Monte Carlo (:func:`clt_tail`). ``Ls`` an increasing integer array,
    ``levels`` the tail probabilities of the CLT law at which the thresholds are set.

    Returns ``tail_count``, ``tail_threshold``, ``tail_clt``, ``tail_bound`` ``(Q, nL, nlev)``,
    ``tail_K``, ``tail_Uq_sq`` ``(Q,)`` and the scalars ``tail_n``, ``tail_c1_eff``, ``tail_c2_eff``.
    """
    law = Gaussian(cov=sigma**2, D=d)
    U = rng_tail.standard_normal((d, d))
    U *= U_norm / np.linalg.norm(U)
    q = law.sample(rng_tail, n_queries)
    a = q @ U.T
    f_inf = law.tilted_mean(a)  # sigma^2 U q
    C = law.snis_covariance(a)  # (Q, d, d): lim L Cov(f_L)
    radii = clt_radii(rng_clt, C, levels, clt_draws)
    clt = clt_tail(rng_clt, C, radii, clt_draws)
    thresholds = radii[:, None, :] / np.sqrt(Ls)[None, :, None]  # (Q, nL, nlev)
    counts = tail_counts(rng_tail, law, U, q, f_inf, Ls, thresholds, n_prompts, chunk)
    Uq_sq = np.sum(a**2, axis=-1)
    K = paper_factor(sigma, Uq_sq)
    c1, c2 = tail_bound_constants(d, sigma, log_c1_per_d, c2_scale)
    return {
        "tail_count": counts,
        "tail_n": np.float64(n_prompts),
        "tail_threshold": thresholds,
        "tail_clt": np.repeat(clt[:, None, :], len(Ls), axis=1),
        "tail_bound": tail_bound(c1, c2, Ls, thresholds, K),
        "tail_K": K,
        "tail_Uq_sq": Uq_sq,
        "tail_c1_eff": np.float64(c1),
        "tail_c2_eff": np.float64(c2),
    }


# --------------------------------------------------------------------------- gradients


def gradient_parameters(Sigma, U_norm):
    """``U = U_norm blockdiag(Sigma^-1, 0) / ||Sigma^-1||_F``, ``v = U_norm e_{d+1}``."""
    d = Sigma.shape[0]
    Sinv = np.linalg.inv(Sigma)
    U = np.zeros((d + 1, d + 1))
    U[:d, :d] = U_norm * Sinv / np.linalg.norm(Sinv)
    v = np.zeros(d + 1)
    v[d] = U_norm
    return U, v


def gradient_log_bound_constant(tasks, U, v):
    """``log`` of ``mean over (task, query) of K_i P_i``; the paper-form bound is ``grad_c / L``
    times ``exp`` of it. Also returns ``log mean K_i``, ``log mean exp(a_i' Gamma a_i)`` and
    ``max a_i' Gamma a_i``.

    Per item (task ``w``, query ``z_q``), with ``Gamma = Gamma_w``, ``lam = ||Gamma||_op`` (the
    sub-Gaussian proxy of the task's tokens ``(x, w.x)``, the paper's ``sigma^2``), ``a = U z_q``,
    ``m = Gamma a``, ``r = v.m - y_q`` (linear(inf) residual):

    * ``K = exp(4 lam ||a||^2)``: the paper's exponential factor;
    * ``P = tr(Gamma) [(|r| + ||v|| ||m||)^2 + ||z_q||^2 ||v||^2 (lam |r| + ||Gamma v||)^2]``.

    Derivation (first order in the SNIS fluctuations ``dm`` of the tilted mean and ``d(Cv)`` of
    the tilted covariance times ``v``): ``||dg_v|| <= (|r| + ||v|| ||m||) ||dm||``,
    ``||dg_U|| <= ||z_q|| (|r| ||d(Cv)|| + ||v|| ||Gamma v|| ||dm||)``, and the paper-form
    ``E||dm||^2 <= tr(Gamma) K / L``, ``E||d(Cv)||^2 <= lam^2 ||v||^2 tr(Gamma) K / L``
    (the sharp delta-method constant of ``dm`` is ``exp(a'Gamma a)(tr Gamma + ||Gamma a||^2)``,
    below ``(tr Gamma + lam) K``). The task-and-query mean of the gradients is bounded by the
    mean of the per-item bounds (Jensen), so the bound holds for the risk's gradient whatever the
    dependence between items. The constant ``grad_c`` in front is our assumption. Computed in
    log space (``K`` reaches ``exp(300)`` for large ``d``, ``||U||`` and ``Sigma``).
    """
    G = icl.Gamma_w(tasks.Sigma, tasks.w)                        # (n, D, D)
    lam = np.linalg.eigvalsh(G)[:, -1][:, None]                  # (n, 1)
    trG = np.trace(G, axis1=-2, axis2=-1)[:, None]
    z_q = tasks.z_q
    a = z_q @ U.T                                                # (n, q, D)
    m = np.einsum("nij,nqj->nqi", G, a)
    r = m @ v - tasks.y_q                                        # (n, q)
    vn = np.linalg.norm(v)
    Gv = np.linalg.norm(G @ v, axis=-1)[:, None]                 # (n, 1)
    log_K = 4.0 * lam * np.sum(a**2, axis=-1)
    P = trG * ((np.abs(r) + vn * np.linalg.norm(m, axis=-1)) ** 2
               + np.sum(z_q**2, axis=-1) * vn**2 * (lam * np.abs(r) + Gv) ** 2)
    quad = np.einsum("nqi,nij,nqj->nq", a, G, a)
    return _log_mean_exp(log_K + np.log(P)), _log_mean_exp(log_K), _log_mean_exp(quad), float(quad.max())


def _log_mean_exp(x):
    x = np.ravel(x)
    top = x.max()
    return float(top + np.log(np.mean(np.exp(x - top))))


def fresh_prompt(rng, tasks, law):
    """A new prompt set for the same tasks: covariates ``law.sample(rng, (n_pairs, L_max))`` shared
    by antithetic partners, labels ``w^T x`` (the layout of ``icl.make_tasks``)."""
    x = np.repeat(np.asarray(law.sample(rng, (tasks.n_tasks // 2, tasks.L_max)), dtype=float), 2, axis=0)
    return np.concatenate([x, np.einsum("nli,ni->nl", x, tasks.w)[..., None]], axis=-1)


def gradient_gaps(rng, Sigma, U, v, Ls, n_pairs, n_queries, n_draws):
    """Squared gradient gaps over ``n_draws`` prompt sets for tasks drawn once.

    Draw order from ``rng``: ``icl.make_tasks(rng, d, n_pairs, n_queries, L_max, N(0, Sigma))``
    (its prompts are draw 0), then for each further draw the covariates ``(n_pairs, L_max)``
    (:func:`fresh_prompt`), as ``gradient_gap.gradient_gap_trajectory`` draws its replicates.

    Returns ``(tasks, gap_sq (n_draws, nL), grad_inf_sq)``: ``gap_sq = ||grad R_L - grad R_inf||^2``
    of the risk (mean over tasks and queries; softmax(L) vs linear(inf), both from ``icl``).
    """
    d = Sigma.shape[0]
    law = covariate_law("gaussian", Sigma)
    tasks = icl.make_tasks(rng, d, n_pairs, n_queries, int(Ls[-1]), law)
    _, gU_inf, gv_inf = icl.linear_risk_grad(U, v, icl.Gamma_w(Sigma, tasks.w), tasks.z_q, tasks.y_q)
    gap_sq = np.empty((n_draws, len(Ls)))
    for r in range(n_draws):
        Z = tasks.Z if r == 0 else fresh_prompt(rng, tasks, law)
        for j, L in enumerate(Ls):
            _, gU, gv = icl.softmax_risk_grad(U, v, Z[:, :L], tasks.z_q, tasks.y_q)
            gap_sq[r, j] = np.sum((gU - gU_inf) ** 2) + np.sum((gv - gv_inf) ** 2)
    return tasks, gap_sq, float(np.sum(gU_inf**2) + np.sum(gv_inf**2))


def gradient_concentration(rng, Sigma, U_norm, Ls, *, n_pairs, n_queries, n_draws, grad_c):
    """Gradient concentration at the fixed parameters :func:`gradient_parameters` ``(Sigma,
    U_norm)`` (module docstring): the ``grad_*`` values of one ``(setting, scale)``.

    ``Ls`` a list of increasing integers; draws from ``rng`` as :func:`gradient_gaps`. Returns
    ``grad_gap_sq`` (mean over the ``n_draws`` prompt sets), ``grad_gap_sq_se`` (their standard
    error; 0 for one draw) and ``grad_log_bound`` (``log grad_c + log mean K P - log L``), each
    ``(nL,)``; ``grad_inf_sq``, ``grad_log_K``, ``grad_log_K_sharp``, ``grad_max_quad`` (floats,
    :func:`gradient_log_bound_constant`).
    """
    U, v = gradient_parameters(Sigma, U_norm)
    tasks, gap_sq, inf_sq = gradient_gaps(rng, Sigma, U, v, Ls, n_pairs, n_queries, n_draws)
    log_const, log_K, log_K_sharp, max_quad = gradient_log_bound_constant(tasks, U, v)
    return {
        "grad_gap_sq": gap_sq.mean(axis=0),
        "grad_gap_sq_se": gap_sq.std(axis=0, ddof=1) / np.sqrt(n_draws) if n_draws > 1 else np.zeros(len(Ls)),
        "grad_log_bound": np.log(float(grad_c)) + log_const - np.log(Ls),
        "grad_inf_sq": inf_sq,
        "grad_log_K": log_K,
        "grad_log_K_sharp": log_K_sharp,
        "grad_max_quad": max_quad,
    }
