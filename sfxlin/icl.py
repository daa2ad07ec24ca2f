"""In-context linear regression (docs/models.md, section 2; paper Sec. 5, Eq. 7): tasks, the three models
and their analytic gradients.

Tasks: ``w ~ N(0, Omega)`` (the paper: ``Omega = I_d``), covariates ``x ~ x_law`` on ``R^d`` (mean
``m``, covariance ``Sigma``; the paper's setting is centred, ``m = 0``), labels
``y = w^T x + eps``, ``eps ~ N(0, noise^2)`` (the paper: ``noise = 0``), tokens ``z = (x, y)`` in
``R^D``, ``D = d + 1``, masked queries ``z_q = (x_q, 0)`` with target ``y_q = w^T x_q + eps_q``,
``eps_q ~ N(0, query_noise^2)`` (the paper: 0). Tasks come in antithetic pairs: task ``2i`` has
``(w_i, eps_i)`` and task ``2i + 1`` has ``(-w_i, -eps_i)``, both with the same covariates (prompt
tokens and query points), so the partner's labels and targets are exact negatives. Prompts are
nested: the length-``L`` prompt is the first ``L`` tokens. The population moments, limits and Bayes
risks of these tasks: :mod:`sfxlin.bayes` and docs/tasks.md.

Models, all read out by ``v`` in ``R^D`` with ``U`` a ``D x D`` matrix (raw logits, docs/models.md, section 1):

* ``softmax(L)``: ``pred = v^T sum_k softmax_k(z_k^T U z_q) z_k``;
* ``linear(L)``: ``pred = v^T Ghat_L U z_q`` with ``Ghat_L = (1/L) sum_k z_k z_k^T``;
* ``linear(inf)``: ``pred = v^T Gamma_w U z_q`` with ``Gamma_w = E[z z^T]`` the limit of ``Ghat_L``
  as ``L -> inf``, built from the second moment ``M = Sigma + m m^T`` of the covariates (and the
  label-noise variance ``noise^2`` in its label-label corner). For centred
  Gaussian covariates it is also the limit of ``softmax(L)`` (Lemma 2.1). For non-centred Gaussian
  covariates it is not: softmax's limit is then affine in ``a = U z_q``, ``E z + Cov(z) a``. For a
  non-Gaussian covariate law (Rademacher, uniform, a mixture, Student-t, an empirical law: any law
  of :func:`sfxlin.laws.covariate_law`) "inf" means linear attention at infinite prompt length:
  ``Gamma_w`` from that law's second moment, still the limit of ``linear(L)`` (law of large
  numbers), but no longer the limit of ``softmax(L)``, which tends to the law's own tilted mean
  (``grad K(a)``; none for Student-t, which has no exponential moments).
* ``softmax(inf)`` (``"softmax_inf"``, :data:`LAW_MODELS`: it needs the covariate law itself, not
  only the tasks): that limit for a finite-support covariate law ``x ~ sum_i pi_i delta_{x_i}``
  (:class:`sfxlin.laws.Empirical`). With the support tokens ``z_i = (x_i, w^T x_i)`` of each task,
  ``pred = v^T sum_i softmax_i(log pi_i + z_i^T U z_q) z_i``, an exact finite sum: softmax(L) whose
  prompt is the whole support, each token weighted by ``pi_i`` (:func:`support_tasks`), so its
  risk and gradient are those of softmax(L) with token weights. For Gaussian covariates the same
  limit is linear(inf) (Lemma 2.1: the tilted mean of ``N(0, Gamma_w)`` is ``Gamma_w a``).

The risk is the mean over tasks and queries of ``1/2 (pred - y_q)^2``. Gradients are analytic:
with ``a = U z_q``, ``p = softmax(Z a)`` (``p_k`` proportional to ``pi_k e^{z_k . a}`` with token
weights ``pi``), ``mbar = sum p_k z_k`` and
``C = sum p_k z_k z_k^T - mbar mbar^T``: ``d pred/dv = mbar`` and ``d pred/dU = (C v) z_q^T``;
for a linear model with matrix ``G``: ``d pred/dv = G U z_q`` and ``d pred/dU = (G^T v) z_q^T``.

Parameter arrays may carry leading axes (``U`` of shape ``(..., D, D)``, ``v`` of shape
``(..., D)``), evaluated independently: one call evaluates many checkpoints or prompt lengths.
Pure numpy, float64.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import quadforms as qf
from . import softmax_core
from .laws import Empirical
from .validation import as_sigma, as_spd, finite_array, noise_std, numeric_array, positive_int, token_weights

__all__ = [
    "Tasks", "PairTokens", "make_tasks", "check_L", "check_model", "Ghat", "Gamma_w", "init_alpha", "init_theta",
    "bayes_optimum", "off_block_mass", "theta_distance", "ridge_risk",
    "softmax_predict", "linear_predict", "softmax_risk_grad", "linear_risk_grad",
    "model_matrix", "risk", "risk_grad", "pair_index", "support_tasks", "linear_inf_risk", "linear_inf_pair_variance",
    "MODELS", "LAW_MODELS",
]

MODELS = ("softmax", "linear", "linear_inf")
#: models defined by the covariate law itself (an argument ``x_law``), not by the tasks alone
LAW_MODELS = ("softmax_inf",)


@dataclass(frozen=True)
class PairTokens:
    """The prompt tokens of antithetic pairs, stored once per pair: ``x (n_pairs, L_max, d)`` the
    covariates both partners share, ``y (n_pairs, L_max)`` the labels of the pair's first task (the
    second task's are ``-y``). Given as ``Tasks(Z=PairTokens(x, y), ...)``, it holds the tokens of
    ``2 n_pairs`` tasks in ``d + 1`` numbers a pair and token instead of ``2 (d + 1)``."""

    x: np.ndarray
    y: np.ndarray


@dataclass(frozen=True, eq=False)
class Tasks:
    """A set of regression tasks (float64 arrays; ``n`` tasks, ``D = d + 1``).

    ``Z (n, L_max, D)`` prompt tokens ``(x, y)``; ``w (n, d)``; ``x_q (n, n_queries, d)``;
    ``y_q (n, n_queries)``; ``Sigma (d, d)`` the covariate covariance (a length-``d`` diagonal is
    accepted and stored as the matrix); ``mean (d,)`` the covariate mean (``None``: centred, stored
    as zeros). Tasks ``2i`` and ``2i + 1`` form an antithetic pair (``paired`` is True when they do).
    The law the tasks were drawn from, for the population quantities (``Gamma_w``, Bayes risks):
    ``noise`` the standard deviation of the prompt-label noise, ``query_noise`` that of the query
    targets (both ``>= 0``, default 0), ``Omega (d, d)`` the covariance of the prior of ``w``
    (``None``: ``I_d``, stored as the identity).

    ``Z`` may also be given as :class:`PairTokens` (``make_tasks`` does): exact antithetic pairs
    (``w``, ``x_q``, ``y_q`` of task ``2i + 1`` checked to be ``-w``, ``x_q``, ``-y_q`` of task
    ``2i``) whose tokens are stored once per pair (:attr:`pairs`). Reading ``Z`` then assembles the
    ``(n, L_max, D)`` array, a new one at each read (as ``z_q``): the engines of
    :mod:`sfxlin.training` and :meth:`Ghat` read the pairs and never assemble it.

    Construction checks that the shapes agree (``n`` and ``D`` from ``Z``, ``n_queries`` from
    ``x_q``), that every array is finite and that ``Sigma`` is symmetric positive definite; a
    ValueError names the array and the expected and actual shapes. Labels are not checked against
    ``w`` (noisy labels are legitimate data; the fast engine refuses them itself).
    """

    Z: np.ndarray
    w: np.ndarray
    x_q: np.ndarray
    y_q: np.ndarray
    Sigma: np.ndarray
    paired: bool = True
    mean: np.ndarray | None = None
    noise: float = 0.0
    query_noise: float = 0.0
    Omega: np.ndarray | None = None

    def __post_init__(self):
        """Validate (see the class doc) and store the arrays as float64, ``Sigma`` as ``d x d``."""
        tokens = self.__dict__["_tokens"]
        if isinstance(tokens, PairTokens):
            n, L_max, D = self._check_pairs(tokens)
        else:
            Z = finite_array(tokens, "Tasks.Z")
            if Z.ndim != 3 or Z.shape[0] < 1 or Z.shape[1] < 1 or Z.shape[2] < 2:
                raise ValueError(f"Tasks.Z must have shape (n, L_max, D) with n, L_max >= 1 and D = d + 1 >= 2, "
                                 f"got {Z.shape}")
            n, L_max, D = Z.shape
            self.__dict__["_tokens"] = Z
        self.__dict__["_shape"] = (n, L_max, D)
        d = D - 1
        w = finite_array(self.w, "Tasks.w")
        if w.shape != (n, d):
            raise ValueError(f"Tasks.w must have shape (n, d) = {(n, d)} (from Z {(n, L_max, D)}), got {w.shape}")
        x_q = finite_array(self.x_q, "Tasks.x_q")
        if x_q.ndim != 3 or x_q.shape[0] != n or x_q.shape[1] < 1 or x_q.shape[2] != d:
            raise ValueError(f"Tasks.x_q must have shape (n, n_queries, d) = ({n}, n_queries, {d}) "
                             f"(n and d from Z {(n, L_max, D)}), got {x_q.shape}")
        q = x_q.shape[1]
        y_q = finite_array(self.y_q, "Tasks.y_q")
        if y_q.shape != (n, q):
            raise ValueError(f"Tasks.y_q must have shape (n, n_queries) = {(n, q)} (from x_q {x_q.shape}), "
                             f"got {y_q.shape}")
        Sigma = as_sigma(self.Sigma, d)
        lam = np.linalg.eigvalsh(Sigma)
        if not lam[0] > 0:
            raise ValueError(f"Tasks.Sigma must be positive definite, smallest eigenvalue {lam[0]:.3g}")
        mean = np.zeros(d) if self.mean is None else finite_array(self.mean, "Tasks.mean")
        if mean.shape != (d,):
            raise ValueError(f"Tasks.mean must have shape (d,) = {(d,)} (from Z {(n, L_max, D)}), got {mean.shape}")
        noise = noise_std(self.noise, "Tasks.noise")
        query_noise = noise_std(self.query_noise, "Tasks.query_noise")
        Omega = np.eye(d) if self.Omega is None else as_spd(self.Omega, d, "Tasks.Omega")
        if self.pairs is not None and not (self.paired and np.array_equal(w[1::2], -w[0::2])
                                           and np.array_equal(x_q[1::2], x_q[0::2])
                                           and np.array_equal(y_q[1::2], -y_q[0::2])):
            raise ValueError("Tasks.Z given as PairTokens needs exact antithetic pairs (paired=True; task 2i + 1 has "
                             "-w, the same x_q and -y_q of task 2i); give the whole (n, L_max, D) array otherwise")
        for name, value in (("w", w), ("x_q", x_q), ("y_q", y_q), ("Sigma", Sigma), ("mean", mean),
                            ("noise", noise), ("query_noise", query_noise), ("Omega", Omega)):
            object.__setattr__(self, name, value)

    @staticmethod
    def _check_pairs(tokens):
        x = finite_array(tokens.x, "Tasks.Z.x")
        y = finite_array(tokens.y, "Tasks.Z.y")
        if x.ndim != 3 or x.shape[0] < 1 or x.shape[1] < 1 or x.shape[2] < 1 or y.shape != x.shape[:2]:
            raise ValueError(f"Tasks.Z as PairTokens needs x (n_pairs, L_max, d) and y (n_pairs, L_max), got "
                             f"{x.shape} and {y.shape}")
        object.__setattr__(tokens, "x", x)
        object.__setattr__(tokens, "y", y)
        return 2 * x.shape[0], x.shape[1], x.shape[2] + 1

    @property
    def pairs(self):
        """The :class:`PairTokens` the tokens are stored as, or ``None`` (stored as ``Z``)."""
        tokens = self.__dict__["_tokens"]
        return tokens if isinstance(tokens, PairTokens) else None

    def _assemble(self, tasks=slice(None), L=None):
        """The tokens ``(len(tasks), L, D)`` of tasks ``tasks`` (a slice or index array), first ``L``
        tokens (``None``: all), from the pairs: task ``i`` is pair ``i // 2`` with labels of sign
        ``(-1)^i``."""
        x, y = self.pairs.x, self.pairs.y
        L = self.L_max if L is None else L
        if isinstance(tasks, slice) and tasks == slice(None):     # every task: no gathered copy of x
            Z = np.empty((x.shape[0], 2, L, self.D))
            Z[..., :-1] = x[:, None, :L]
            Z[:, 0, :, -1] = y[:, :L]
            Z[:, 1, :, -1] = -y[:, :L]
            return Z.reshape(self.n_tasks, L, self.D)
        idx = np.arange(self.n_tasks)[tasks]
        Z = np.empty(idx.shape + (L, self.D))
        Z[..., :-1] = x[idx // 2, :L]
        Z[..., -1] = np.where((idx % 2 == 1)[..., None], -y[idx // 2, :L], y[idx // 2, :L])
        return Z

    @property
    def n_tasks(self):
        return self.__dict__["_shape"][0]

    @property
    def L_max(self):
        return self.__dict__["_shape"][1]

    @property
    def D(self):
        return self.__dict__["_shape"][2]

    @property
    def d(self):
        return self.__dict__["_shape"][2] - 1

    @property
    def n_queries(self):
        return self.x_q.shape[1]

    @property
    def second_moment(self):
        """``E[x x^T] = Sigma + m m^T`` of the covariates, ``(d, d)`` (``Sigma`` when centred)."""
        return self.Sigma + np.outer(self.mean, self.mean)

    @property
    def z_q(self):
        """Masked query tokens ``(x_q, 0)``, shape ``(n, n_queries, D)``."""
        return np.concatenate([self.x_q, np.zeros(self.x_q.shape[:-1] + (1,))], axis=-1)

    def prompt(self, L):
        """The first ``L`` tokens, ``(n, L, D)`` (a view; a new array when stored as pairs)."""
        L = check_L(L, self.L_max)
        if self.pairs is not None:
            return self._assemble(slice(None), L)
        return self.Z[:, :L, :]

    def Ghat(self, L=None):
        """:func:`Ghat` of every task's first ``L`` tokens, ``(n, D, D)``, or for a sequence of prompt
        lengths ``(len(L), n, D, D)``: bit for bit ``Ghat(self.Z, L)``. Tasks stored as pairs are
        assembled a few pairs at a time (first partners only, once for all the lengths); a second
        partner's matrix is its first's with the label row and column negated, exactly (each product
        in them changes sign, and ``-a`` rounds as ``a``)."""
        many = L is not None and not isinstance(L, (int, np.integer))
        Ls = [self.L_max if L is None else check_L(L, self.L_max)] if not many else [check_L(x, self.L_max) for x in L]
        if self.pairs is None:
            out = np.stack([Ghat(self.Z, x) for x in Ls])
            return out if many else out[0]
        n_pairs, D = self.n_tasks // 2, self.D
        out = np.empty((len(Ls), n_pairs, 2, D, D))
        step = max(1, _ASSEMBLE_BYTES // (8 * max(Ls) * D))
        for p0 in range(0, n_pairs, step):
            part = slice(p0, min(n_pairs, p0 + step))
            Z = self._assemble(slice(2 * part.start, 2 * part.stop, 2), max(Ls))     # first partners
            for i, x in enumerate(Ls):
                out[i, part, 0] = Ghat(Z, x)
        out[:, :, 1] = out[:, :, 0]
        out[:, :, 1, :-1, -1] *= -1.0
        out[:, :, 1, -1, :-1] *= -1.0
        out = out.reshape(len(Ls), self.n_tasks, D, D)
        return out if many else out[0]

    def subset(self, idx):
        """Tasks ``idx`` (e.g. a slice); ``paired`` only if whole pairs are kept in order (then stored
        as pairs again when they were)."""
        paired = self.paired and isinstance(idx, slice) and _slice_keeps_pairs(idx, self.n_tasks)
        if self.pairs is not None and paired:
            start, stop, _ = idx.indices(self.n_tasks)
            pairs = slice(start // 2, stop // 2)
            Z = PairTokens(self.pairs.x[pairs], self.pairs.y[pairs])
        else:
            Z = self.Z[idx] if self.pairs is None else self._assemble(idx)
        return Tasks(Z=Z, w=self.w[idx], x_q=self.x_q[idx], y_q=self.y_q[idx], Sigma=self.Sigma, paired=paired,
                     mean=self.mean, noise=self.noise, query_noise=self.query_noise, Omega=self.Omega)


def _tokens_of(self):
    tokens = self.__dict__["_tokens"]
    return self._assemble() if isinstance(tokens, PairTokens) else tokens


def _store_tokens(self, value):
    self.__dict__["_tokens"] = value   # reached only through object.__setattr__ (the instance is frozen)


# ``Z`` is a field (constructor, ``dataclasses.replace``, ``fields``) read through a property: the
# tokens given are validated and kept as given, an array or PairTokens, and read as the array
Tasks.Z = property(_tokens_of, _store_tokens, doc="Prompt tokens ``(n, L_max, D)`` (assembled at each read when "
                                                   "stored as :class:`PairTokens`).")

#: bytes of assembled tokens per chunk of :meth:`Tasks.Ghat`
_ASSEMBLE_BYTES = 1 << 25


def _tokens_last(x):
    """``x (n, L, d)`` rewritten in its own memory tokens last, ``(n, d, L)``, one block of ``L d``
    numbers at a time, and returned as the ``(n, L, d)`` view of that: the same values, laid out as
    the softmax engine reads them (a row per coordinate), with no second copy of the array."""
    if not (x.flags.c_contiguous and x.flags.owndata):
        x = np.array(x, order="C")
    n, L, d = x.shape
    rows = x.reshape(n, d, L)
    tile = 2048
    for i in range(n):
        block = x[i].copy()
        for t0 in range(0, L, tile):
            rows[i, :, t0:t0 + tile] = block[t0:t0 + tile].T
    return rows.transpose(0, 2, 1)


def _slice_keeps_pairs(s, n):
    start, stop, step = s.indices(n)
    return step == 1 and start % 2 == 0 and (stop - start) % 2 == 0


def check_L(L, L_max):
    if isinstance(L, (bool, np.bool_)) or not isinstance(L, (int, np.integer)):
        raise TypeError(f"L must be an integer, got {L!r}")
    if not 1 <= L <= L_max:
        raise ValueError(f"L must be in [1, {L_max}], got {L}")
    return int(L)


def make_tasks(rng, d, n_pairs, n_queries, L_max, x_law, *, noise=0.0, query_noise=0.0, Omega=None):
    """Draw ``2 n_pairs`` tasks in antithetic pairs.

    Draw order from ``rng`` (a ``np.random.Generator``): ``w (n_pairs, d)`` (standard normal, then
    times ``chol(Omega)^T`` when ``Omega`` is given), then the prompt covariates ``(n_pairs, L_max)``
    from ``x_law``, then the query covariates ``(n_pairs, n_queries)``; then, only when
    ``noise > 0``, the prompt-label noise ``eps (n_pairs, L_max)``, and only when ``query_noise > 0``
    the query-target noise ``(n_pairs, n_queries)`` (standard normal times the standard deviation).
    With the defaults (``noise = query_noise = 0``, ``Omega = None``: ``w ~ N(0, I_d)``) nothing
    else is drawn and the tasks are bit-for-bit those of the paper's setting.
    Task ``2i`` has ``(w_i, eps_i)``, task ``2i + 1`` has ``(-w_i, -eps_i)``, both with the same
    covariates; the labels and targets of the second are the exact negatives of the first. The
    prompt tokens are kept once per pair (``Z`` given as :class:`PairTokens`: the covariates as
    drawn, the first task's labels), so the tasks hold ``d + 1`` numbers a pair and token; the
    covariates are kept tokens last (``pairs.x`` a view of an ``(n_pairs, d, L_max)`` array, rewritten
    in the memory they were drawn in), the layout the softmax engine reads without a copy.
    ``x_law`` is a token law of :mod:`sfxlin.laws` on ``R^d``, usually from
    :func:`sfxlin.laws.covariate_law` (the tasks read ``Sigma = x_law.cov`` and ``mean =
    x_law.mean``, and draw with ``x_law.sample``).
    """
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy Generator, got {type(rng).__name__}")
    d = positive_int(d, "d")
    n_pairs = positive_int(n_pairs, "n_pairs")
    n_queries = positive_int(n_queries, "n_queries")
    L_max = positive_int(L_max, "L_max")
    if getattr(x_law, "D", None) != d:
        raise ValueError(f"x_law must be a law on R^{d}, got {x_law!r}")
    noise = noise_std(noise, "noise")
    query_noise = noise_std(query_noise, "query_noise")
    Omega = None if Omega is None else as_spd(Omega, d, "Omega")
    Sigma = as_sigma(x_law.cov, d)
    mean = getattr(x_law, "mean", None)
    w = rng.standard_normal((n_pairs, d))
    if Omega is not None:
        w = w @ np.linalg.cholesky(Omega).T
    x = np.asarray(x_law.sample(rng, (n_pairs, L_max)), dtype=float)
    xq = np.asarray(x_law.sample(rng, (n_pairs, n_queries)), dtype=float)
    y = np.einsum("pli,pi->pl", x, w)
    yq = np.einsum("pqi,pi->pq", xq, w)
    if noise > 0:
        y = y + noise * rng.standard_normal((n_pairs, L_max))
    if query_noise > 0:
        yq = yq + query_noise * rng.standard_normal((n_pairs, n_queries))
    x = _tokens_last(x)
    n = 2 * n_pairs
    W = np.stack([w, -w], axis=1).reshape(n, d)
    XQ = np.broadcast_to(xq[:, None], (n_pairs, 2, n_queries, d)).reshape(n, n_queries, d).copy()
    YQ = np.stack([yq, -yq], axis=1).reshape(n, n_queries)
    return Tasks(Z=PairTokens(x, y), w=W, x_q=XQ, y_q=YQ, Sigma=Sigma, paired=True, mean=mean, noise=noise,
                 query_noise=query_noise, Omega=Omega)


# --------------------------------------------------------------------------- matrices, init


def Ghat(Z, L=None):
    """Empirical second moment ``(1/L) sum_{k<L} z_k z_k^T`` of the first ``L`` tokens.

    ``Z (..., L_max, D)`` -> ``(..., D, D)``; ``L=None`` uses all tokens.
    """
    Z = numeric_array(Z, "Z")
    if Z.ndim < 2:
        raise ValueError(f"Z must have shape (..., L, D), got {Z.shape}")
    if L is not None:
        Z = Z[..., : check_L(L, Z.shape[-2]), :]
    return np.swapaxes(Z, -1, -2) @ Z / Z.shape[-2]


def Gamma_w(Sigma, w, mean=None, noise=0.0):
    """``E[z z^T]`` for ``z = (x, w^T x + eps)``, ``x`` of covariance ``Sigma`` and mean ``mean``
    (default 0), ``eps`` independent, centred, of standard deviation ``noise`` (default 0):
    ``[[M, M w], [w^T M, w^T M w + noise^2]]`` with the second moment ``M = Sigma + m m^T``
    (``M = Sigma`` when centred). ``w (..., d)`` -> ``(..., D, D)``. ``Sigma`` is a ``d x d`` matrix
    or a length-``d`` diagonal, as everywhere in this module."""
    Sigma = as_sigma(Sigma)
    w = numeric_array(w, "w")
    d = Sigma.shape[0]
    if w.shape[-1] != d:
        raise ValueError(f"w must have trailing dimension d = {d}, got shape {w.shape}")
    M = Sigma
    if mean is not None:
        m = finite_array(mean, "mean")
        if m.shape != (d,):
            raise ValueError(f"mean must have shape (d,) = {(d,)}, got {m.shape}")
        M = Sigma + np.outer(m, m)
    Sw = w @ M  # M symmetric: (M w)^T
    out = np.empty(w.shape[:-1] + (d + 1, d + 1))
    out[..., :d, :d] = M
    out[..., :d, d] = Sw
    out[..., d, :d] = Sw
    out[..., d, d] = np.einsum("...i,...i->...", Sw, w)
    noise = noise_std(noise, "noise")
    if noise > 0:
        out[..., d, d] += noise**2
    return out


def init_alpha(d, Sigma):
    """Eq. 9 scale ``alpha = 0.5 sqrt(2) / (d^{1/4} ||Sigma||_op)`` (midpoint of the admissible
    interval). Eq. 9 is stated for centred covariates, where ``Sigma = E[x x^T]``; training passes
    the second moment ``Tasks.second_moment`` (the matrix linear(inf) sees)."""
    Sigma = as_sigma(Sigma, d)
    return 0.5 * np.sqrt(2.0) / (d**0.25 * np.linalg.norm(Sigma, 2))


def init_theta(d, Sigma):
    """Eq. 9 initialisation ``(U0, v0)``: ``U0 = alpha blockdiag(I_d / sqrt(d), 0)``,
    ``v0 = alpha e_{d+1}`` (so ``Theta Theta^T = I_d / sqrt(d)`` and ``||U0||_F = ||v0||``)."""
    alpha = init_alpha(d, Sigma)
    U0 = np.zeros((d + 1, d + 1))
    U0[:d, :d] = alpha * np.eye(d) / np.sqrt(d)
    v0 = np.zeros(d + 1)
    v0[d] = alpha
    return U0, v0


def bayes_optimum(Sigma):
    """Remark 5.2: the Bayes optimum on the balanced manifold, ``(U*, v*)`` with
    ``c = ||Sigma^{-1}||_F^{1/2}``, ``U* = blockdiag(Sigma^{-1} / c, 0)``, ``v* = c e_{d+1}``, for
    centred covariates of covariance ``Sigma`` (the paper's setting)."""
    Sigma = as_sigma(Sigma)
    d = Sigma.shape[0]
    Sinv = np.linalg.inv(Sigma)
    c = np.sqrt(np.linalg.norm(Sinv, "fro"))
    U = np.zeros((d + 1, d + 1))
    U[:d, :d] = Sinv / c
    v = np.zeros(d + 1)
    v[d] = c
    return U, v


def off_block_mass(U, v):
    """Norm of ``U`` outside its top-left ``d x d`` block together with ``v[:d]``:
    ``sqrt(||U_{d+1,:}||^2 + ||U_{:d,d+1}||^2 + ||v_{:d}||^2)``. Leading axes are kept."""
    U = np.asarray(U, dtype=float)
    v = np.asarray(v, dtype=float)
    d = U.shape[-1] - 1
    s = (np.sum(U[..., d, :] ** 2, axis=-1) + np.sum(U[..., :d, d] ** 2, axis=-1)
         + np.sum(v[..., :d] ** 2, axis=-1))
    return np.sqrt(s)


def theta_distance(U1, v1, U2, v2):
    """``sqrt(||U1 - U2||_F^2 + ||v1 - v2||^2)``, broadcast over leading axes."""
    dU = np.asarray(U1, dtype=float) - np.asarray(U2, dtype=float)
    dv = np.asarray(v1, dtype=float) - np.asarray(v2, dtype=float)
    return np.sqrt(np.sum(dU**2, axis=(-2, -1)) + np.sum(dv**2, axis=-1))


def ridge_risk(tasks, L, lam=0.0):
    """Baseline: per task, ridge regression on the length-``L`` prompt,
    ``w_hat = argmin (1/L) ||y - X w||^2 + lam ||w||^2`` (``lam = 0``: minimum-norm least squares),
    then the risk ``mean over tasks and queries of 1/2 (x_q^T w_hat - y_q)^2``."""
    Zl = tasks.prompt(L)
    lam = float(lam)
    if lam < 0 or not np.isfinite(lam):
        raise ValueError(f"lam must be a finite non-negative number, got {lam}")
    d = tasks.d
    X, y = Zl[..., :d], Zl[..., d]
    if lam == 0.0:
        w_hat = np.stack([np.linalg.lstsq(Xi, yi, rcond=None)[0] for Xi, yi in zip(X, y)])
    else:
        A = np.swapaxes(X, -1, -2) @ X / L + lam * np.eye(d)
        b = np.einsum("nli,nl->ni", X, y) / L
        w_hat = np.linalg.solve(A, b[..., None])[..., 0]
    r = np.einsum("nqi,ni->nq", tasks.x_q, w_hat) - tasks.y_q
    return 0.5 * float(np.mean(r**2))


# --------------------------------------------------------------------------- models


def _params(U, v):
    U = numeric_array(U, "U")
    v = numeric_array(v, "v")
    D = U.shape[-1]
    if U.ndim < 2 or U.shape[-2] != D or v.shape[-1:] != (D,):
        raise ValueError(f"U must be (..., D, D) and v (..., D), got {U.shape} and {v.shape}")
    return U, v


def pair_index(d):
    """``(d, d)`` symmetric integer array: the position of ``x_i x_j`` among the products
    ``x_i x_j, i <= j`` in ``np.triu_indices(d)`` order (the quadratic token features)."""
    iu = np.triu_indices(d)
    full = np.zeros((d, d), dtype=int)
    full[iu] = np.arange(iu[0].size)
    return full + full.T - np.diag(np.diag(full))


def _softmax_moments(U, Z, z_q, v=None, weights=None):
    """Moments of ``p = softmax(Z U z_q)`` over the tokens (one group of
    :func:`sfxlin.softmax_core.prefix_moments` per task, its columns the parameters and queries):
    ``mbar = E_p z`` ``(..., n, q, D)`` and, given ``v``, also ``E_p[z (z . v)]`` (features
    ``z (z . v)`` for one ``v``, else ``z_i z_j``, ``i <= j``, contracted with each ``v``).
    ``weights (L,)``: token weights ``pi_k`` (``p_k`` proportional to ``pi_k e^{z_k . a}``), which
    multiply the features, never the logits."""
    Z, z_q = numeric_array(Z, "Z"), numeric_array(z_q, "z_q")
    D = U.shape[-1]
    if Z.ndim != 3 or Z.shape[2] != D or z_q.ndim != 3 or z_q.shape[::2] != (Z.shape[0], D):
        raise ValueError(f"Z must be (n, L, D) and z_q (n, q, D) with D = {D} (from U), got {Z.shape} and {z_q.shape}")
    n, L, _ = Z.shape
    a = np.einsum("...ij,nqj->n...qi", U, z_q)                          # columns (..., q) of task n
    X = np.swapaxes(Z, 1, 2)
    pairs = v is not None and v.ndim > 1
    nf = 1 + D + (0 if v is None else D * (D + 1) // 2 if pairs else D)
    phi = np.empty((n, nf, L))
    phi[:, 0] = 1.0
    phi[:, 1:D + 1] = X
    Xc = phi[:, 1:D + 1]          # the same values, tokens contiguous: the products below read these
    if pairs:
        k = D + 1
        for i in range(D):
            np.multiply(Xc[:, i:i + 1], Xc[:, i:], out=phi[:, k:k + D - i])
            k += D - i
    elif v is not None:
        np.multiply(Xc, (v @ X)[:, None], out=phi[:, D + 1:])
    weights = token_weights(weights, L)
    if weights is not None:
        phi *= weights
    _, P = softmax_core.prefix_moments(phi, (0, L), A=a.reshape(n, -1, D), X=X)
    E = np.moveaxis(softmax_core.normalised(P[0]).reshape(a.shape[:-1] + (-1,)), 0, -3)   # (..., n, q, nf - 1)
    if v is None:
        return E[..., :D]
    if not pairs:
        return E[..., :D], E[..., D:]
    return E[..., :D], np.einsum("...nqij,...j->...nqi", E[..., D:][..., pair_index(D)], v)


def softmax_predict(U, v, Z, z_q, weights=None):
    """Softmax attention read-out ``v^T sum_k p_k z_k``: ``Z (n, L, D)``, ``z_q (n, q, D)``,
    ``U (..., D, D)``, ``v (..., D)`` -> ``(..., n, q)``; ``weights (L,)``: token weights ``pi_k``
    (``p_k`` proportional to ``pi_k e^{z_k^T U z_q}``; ``None``: equal)."""
    U, v = _params(U, v)
    mbar = _softmax_moments(U, Z, z_q, weights=weights)
    return np.einsum("...nqi,...i->...nq", mbar, v)


def linear_predict(U, v, G, z_q):
    """Linear attention read-out ``v^T G U z_q``: ``G (..., n, D, D)`` (``Ghat_L`` or
    ``Gamma_w``), ``z_q (n, q, D)`` -> ``(..., n, q)``."""
    U, v = _params(U, v)
    h = np.einsum("...nij,...jk,nqk->...nqi", G, U, z_q)
    return np.einsum("...nqi,...i->...nq", h, v)


def softmax_risk_grad(U, v, Z, z_q, y_q, weights=None):
    """Risk of ``softmax(L)`` on the prompts ``Z (n, L, D)`` and its analytic gradient
    (``weights (L,)``: token weights, as in :func:`softmax_predict`).

    Returns ``(risk (...,), grad_U (..., D, D), grad_v (..., D))``.
    """
    U, v = _params(U, v)
    mbar, Ezv = _softmax_moments(U, Z, z_q, v, weights)
    pred = np.einsum("...nqi,...i->...nq", mbar, v)
    r = pred - y_q
    n_items = r.shape[-1] * r.shape[-2]
    # C v = E_p[z (z . v)] - mbar (mbar . v)
    Cv = Ezv - mbar * pred[..., None]
    risk = 0.5 * np.mean(r**2, axis=(-2, -1))
    g_v = np.einsum("...nq,...nqi->...i", r, mbar) / n_items
    g_U = np.einsum("...nq,...nqi,nqj->...ij", r, Cv, z_q) / n_items
    return risk, g_U, g_v


def linear_risk_grad(U, v, G, z_q, y_q):
    """Risk of a linear model ``v^T G U z_q`` (``G = Ghat_L`` or ``Gamma_w``, ``(..., n, D, D)``)
    and its analytic gradient. Returns ``(risk (...,), grad_U (..., D, D), grad_v (..., D))``."""
    U, v = _params(U, v)
    G = np.asarray(G, dtype=float)
    Uzq = np.einsum("...ij,nqj->...nqi", U, z_q)
    h = np.einsum("...nij,...nqj->...nqi", G, Uzq)
    r = np.einsum("...nqi,...i->...nq", h, v) - y_q
    n_items = r.shape[-1] * r.shape[-2]
    Gtv = np.einsum("...nji,...j->...ni", G, v)
    risk = 0.5 * np.mean(r**2, axis=(-2, -1))
    g_v = np.einsum("...nq,...nqi->...i", r, h) / n_items
    g_U = np.einsum("...nq,...ni,nqj->...ij", r, Gtv, z_q) / n_items
    return risk, g_U, g_v


def model_matrix(model, tasks, L=None):
    """The fixed matrix of a linear model: ``Ghat_L`` for ``"linear"``, ``Gamma_w`` for
    ``"linear_inf"`` (``(n, D, D)``; the ``L -> inf`` limit of ``Ghat_L``, from the covariates'
    second moment ``Sigma + m m^T`` and the label-noise variance ``tasks.noise^2``)."""
    if model == "linear":
        return tasks.Ghat(L)
    if model == "linear_inf":
        return Gamma_w(tasks.Sigma, tasks.w, tasks.mean, tasks.noise)
    raise ValueError(f"model {model!r} has no fixed matrix; expected 'linear' or 'linear_inf'")


def support_tasks(tasks, x_law):
    """softmax(inf) as softmax(L) over the support: ``(support, weights)``, where ``support`` is
    ``tasks`` with every prompt replaced by the whole support of ``x_law`` (an
    :class:`sfxlin.laws.Empirical` law ``sum_i pi_i delta_{x_i}`` on ``R^d``): tokens
    ``z_i = (x_i, w^T x_i)`` for each task's ``w``, ``(n, n_atoms, D)``, queries and targets
    unchanged; ``weights`` the atoms' ``pi_i`` (``None`` for equal weights, which cancel).

    ``ValueError`` unless the tasks could have been drawn from ``x_law``: an empirical law on
    ``R^d`` whose covariance and mean are the tasks' ``Sigma`` and ``mean`` (to 1e-10 of
    ``||Sigma||``), noiseless prompt labels (``tasks.noise == 0``: with label noise the token law
    has no finite support)."""
    if not isinstance(x_law, Empirical):
        raise ValueError(f"x_law: softmax_inf needs a finite-support covariate law (sfxlin.laws.Empirical), got "
                         f"{x_law!r}; for Gaussian covariates softmax(inf) is linear(inf): use 'linear_inf'")
    if x_law.D != tasks.d:
        raise ValueError(f"x_law is a law on R^{x_law.D}, the tasks have d = {tasks.d}")
    scale = np.linalg.norm(tasks.Sigma, 2)
    if not (np.abs(x_law.cov - tasks.Sigma).max() <= 1e-10 * scale
            and np.abs(x_law.mean - tasks.mean).max() <= 1e-10 * np.sqrt(scale)):
        raise ValueError("x_law: its covariance and mean are not the tasks' Sigma and mean: the tasks were not drawn "
                         "from this law (make them with icl.make_tasks(rng, d, ..., x_law))")
    if tasks.noise > 0:
        raise ValueError(f"softmax_inf needs noiseless prompt labels (tasks.noise = {tasks.noise:g}): with label noise "
                         "the token law has no finite support")
    X = np.asarray(x_law.samples, dtype=float)
    Z = np.empty((tasks.n_tasks, X.shape[0], tasks.D))
    Z[:, :, :tasks.d] = X
    Y = tasks.w @ X.T
    if tasks.paired and tasks.n_tasks % 2 == 0 and np.array_equal(tasks.w[1::2], -tasks.w[0::2]):
        Y[1::2] = -Y[0::2]   # antithetic partners' labels exact negatives (BLAS may round rows differently)
    Z[:, :, tasks.d] = Y
    support = Tasks(Z=Z, w=tasks.w, x_q=tasks.x_q, y_q=tasks.y_q, Sigma=tasks.Sigma, paired=tasks.paired,
                    mean=tasks.mean, query_noise=tasks.query_noise, Omega=tasks.Omega)
    return support, x_law.weights


def check_model(model, L):
    if model not in MODELS + LAW_MODELS:
        raise ValueError(f"unknown model {model!r}; expected one of {MODELS + LAW_MODELS}")
    if model in ("softmax", "linear") and L is None:
        raise ValueError(f"model {model!r} needs a prompt length L")


def _law_of(model, x_law):
    if model in LAW_MODELS and x_law is None:
        raise ValueError(f"model {model!r} needs the covariate law x_law (an sfxlin.laws.Empirical)")


def risk_grad(model, U, v, tasks, L=None, x_law=None):
    """Risk and analytic gradient of ``model`` (``"softmax"``, ``"linear"``, ``"linear_inf"``,
    ``"softmax_inf"``) at prompt length ``L`` (ignored for the infinite-prompt models) on ``tasks``:
    ``(risk, grad_U, grad_v)``. ``"softmax_inf"`` needs the tasks' covariate law ``x_law``
    (:func:`support_tasks`): its risk and gradient are exact finite sums over the support."""
    check_model(model, L)
    _law_of(model, x_law)
    if model == "softmax":
        return softmax_risk_grad(U, v, tasks.prompt(L), tasks.z_q, tasks.y_q)
    if model == "softmax_inf":
        support, weights = support_tasks(tasks, x_law)
        return softmax_risk_grad(U, v, support.Z, tasks.z_q, tasks.y_q, weights)
    return linear_risk_grad(U, v, model_matrix(model, tasks, L), tasks.z_q, tasks.y_q)


def risk(model, U, v, tasks, L=None, x_law=None):
    """Risk ``mean 1/2 (pred - y_q)^2`` of ``model`` on ``tasks`` (leading parameter axes kept;
    ``x_law`` for ``"softmax_inf"``, as in :func:`risk_grad`)."""
    check_model(model, L)
    _law_of(model, x_law)
    if model == "softmax":
        pred = softmax_predict(U, v, tasks.prompt(L), tasks.z_q)
    elif model == "softmax_inf":
        support, weights = support_tasks(tasks, x_law)
        pred = softmax_predict(U, v, support.Z, tasks.z_q, weights)
    else:
        pred = linear_predict(U, v, model_matrix(model, tasks, L), tasks.z_q)
    return 0.5 * np.mean((pred - tasks.y_q) ** 2, axis=(-2, -1))


def _linear_inf_terms(U, v, Sigma, noise):
    """``(S, a, b, vy, N, m1)`` of :func:`linear_inf_risk`'s error ``c(w)^T x_q - eps_q``, ``c(w) = a + v_y (w^T S w
    + noise^2) b + N w``, ``m1 = tr S + noise^2``."""
    U, v = _params(U, v)
    d = U.shape[-1] - 1
    S = as_sigma(Sigma, d)
    if np.linalg.eigvalsh(S)[0] < -1e-12 * max(np.abs(S).max(), 1e-300):
        raise ValueError(f"Sigma must be positive semi-definite, smallest eigenvalue {np.linalg.eigvalsh(S)[0]:.3g}")
    s2 = noise_std(noise, "noise") ** 2
    A, b = U[..., :d, :d], U[..., d, :d]
    vx, vy = v[..., :d], v[..., d]
    a = np.einsum("...ji,jk,...k->...i", A, S, vx)
    N = vy[..., None, None] * np.einsum("...ji,jk->...ik", A, S) + b[..., :, None] * (vx @ S)[..., None, :] - np.eye(d)
    return S, a, b, vy, N, np.trace(S) + s2


def linear_inf_risk(U, v, Sigma, noise=0.0, query_noise=0.0):
    """Exact risk of ``linear(inf)`` with the covariance ``Sigma``: the expectation over the prior
    ``w ~ N(0, I_d)``, the query ``x_q`` (centred, covariance ``Sigma``, any law: the error is linear
    in ``x_q``) and the query noise of ``1/2 (v^T Gamma_w U z_q - w^T x_q - eps_q)^2``, ``Gamma_w``
    from ``Sigma`` and the prompt-label noise (:func:`Gamma_w`). ``Sigma`` symmetric positive
    semi-definite (a singular one confines the covariates to a subspace); ``U (..., D, D)``,
    ``v (..., D)`` -> ``(...)``, any parameters (block-structured or not).

    With ``A = U[:d, :d]``, ``b = U[d, :d]``, ``v = (v_x, v_y)``, the error is ``c(w)^T x_q - eps_q``
    with ``c(w) = e(w) + N w``: the even part ``e = a + v_y (w^T Sigma w + noise^2) b``,
    ``a = A^T Sigma v_x``, and the odd part ``N = v_y A^T Sigma + b v_x^T Sigma - I``. Since
    ``E[w^T Sigma w] = tr Sigma`` and ``Var = 2 tr(Sigma^2)``, with ``m1 = tr Sigma + noise^2``:
    ``2 risk = a^T Sigma a + 2 v_y m1 a^T Sigma b + v_y^2 (m1^2 + 2 tr Sigma^2) b^T Sigma b
    + tr(N^T Sigma N) + query_noise^2``. Block-structured parameters (``b = 0``, ``v_x = 0``):
    ``1/2 [tr(B Sigma B^T) + query_noise^2]``, ``B = v_y Sigma A - I`` (the plug-in error)."""
    S, a, b, vy, N, m1 = _linear_inf_terms(U, v, Sigma, noise)
    q2 = noise_std(query_noise, "query_noise") ** 2
    quad = lambda x, y: np.einsum("...i,ij,...j->...", x, S, y)   # noqa: E731
    even = quad(a, a) + 2 * vy * m1 * quad(a, b) + vy**2 * (m1**2 + 2 * np.trace(S @ S)) * quad(b, b)
    odd = np.einsum("...ji,jk,...ki->...", N, S, N)
    return 0.5 * (even + odd + q2)


def linear_inf_pair_variance(U, v, Sigma, n_queries, noise=0.0, query_noise=0.0):
    """Exact variance of one antithetic pair's held-out risk under ``linear(inf)`` (the mean over the pair's
    two tasks ``(w, eps)``, ``(-w, -eps)`` and their ``n_queries`` shared Gaussian queries ``x_q ~ N(0, Sigma)``
    of ``1/2 (v^T Gamma_w U z_q - y_q)^2``, :func:`make_tasks`' pairs): the Monte Carlo of
    :func:`linear_inf_risk` over ``n`` independent pairs has the standard error ``sqrt(variance / n)``.
    Shapes as :func:`linear_inf_risk`.

    With the error ``c(+-w)^T x_q -+ eps_q``, ``c(w) = e(w) + N w`` (:func:`linear_inf_risk`), the two
    partners' losses of a query add to ``1/2 (alpha^2 + beta^2)``, ``alpha = e^T x_q``, ``beta = (N w)^T x_q -
    eps_q``: given ``w``, jointly Gaussian with variances ``P = e^T Sigma e``, ``B = w^T N^T Sigma N w +
    query_noise^2`` and covariance ``C = e^T Sigma N w``. So ``E[r | w] = (P + B) / 2`` and ``Var[r | w] = (P^2
    + B^2 + 2 C^2) / (2 n_queries)``, and ``Var r = E[P^2 + B^2 + 2 C^2] / (2 n_queries) + Var(P + B) / 4``:
    polynomials in quadratic forms of ``w ~ N(0, I)``, whose expectations are exact
    (:func:`sfxlin.quadforms.expect`). Block-structured parameters: ``((tr K)^2 + 2 tr K^2) / (2 n_queries) +
    tr K^2 / 2`` with ``K = N^T Sigma N`` (noiseless)."""
    S, a, b, vy, N, _ = _linear_inf_terms(U, v, Sigma, noise)
    q = positive_int(n_queries, "n_queries")
    s2 = noise_std(noise, "noise") ** 2
    q2 = noise_std(query_noise, "query_noise") ** 2
    quad = lambda x, y: np.einsum("...i,ij,...j->...", x, S, y)   # noqa: E731
    g1, g2 = np.einsum("...ji,jk,...k->...i", N, S, a), np.einsum("...ji,jk,...k->...i", N, S, b)
    outer = lambda x, y: 0.5 * (x[..., :, None] * y[..., None, :] + y[..., :, None] * x[..., None, :])  # noqa: E731
    atoms = [S, np.einsum("...ji,jk,...kl->...il", N, S, N), outer(g1, g1), outer(g1, g2), outer(g2, g2)]
    h = qf.add(qf.constant(vy * s2), qf.form(0, vy))                         # v_y (w^T S w + noise^2)
    P = qf.add(qf.constant(quad(a, a)), qf.mul(qf.constant(2 * quad(a, b)), h),
               qf.mul(qf.constant(quad(b, b)), qf.mul(h, h)))               # e^T S e
    B = qf.add(qf.form(1), qf.constant(q2))
    C2 = qf.add(qf.form(2), qf.mul(qf.constant(2.0), qf.mul(h, qf.form(3))), qf.mul(qf.mul(h, h), qf.form(4)))
    PB = qf.add(P, B)
    within = qf.expect(qf.add(qf.mul(P, P), qf.mul(B, B), qf.mul(qf.constant(2.0), C2)), atoms) / (2 * q)
    between = (qf.expect(qf.mul(PB, PB), atoms) - qf.expect(PB, atoms) ** 2) / 4
    return within + between
