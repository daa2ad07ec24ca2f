"""Training the JAX models on in-context regression tasks (:class:`sfxlin.icl.Tasks`) with optax.

Optimisers (``method``): ``"gd"`` gradient descent on fixed tasks (``optax.sgd``: the update is
``theta - lr * grad``, exactly :func:`sfxlin.training.train_all`'s), ``"adam"`` Adam on fixed tasks
(``optax.adam``), ``"sgd"`` stochastic gradient descent with fresh tasks and prompts at every step
(drawn by :func:`sfxlin.icl.make_tasks` from a numpy generator). The model is a kernel of
:mod:`sfxlin.kernels` (``"softmax"``, ``"linear"``, any registered name, or a
:class:`~sfxlin.kernels.Kernel`), or ``"limit"`` (the deep linear limit with ``Sigma = Gamma_w``
per task). A step is the compiled risk-and-gradient of
:func:`sfxlin.models.risk_and_grad` (one compilation per model shape, kernel and data shape, shared
with held-out evaluations of the same shape) and the compiled optax update (one per optimiser and
parameter shapes); compiled functions are safe to call from several threads (dask workers).
"""
from __future__ import annotations

import functools

import numpy as np

from ._jax import jax
from .transformer import model_data, loss_and_grad, flatten

__all__ = ["METHODS", "train"]

METHODS = ("gd", "sgd", "adam")


@functools.lru_cache(maxsize=None)
def _optimizer(method, lr):
    import optax

    return optax.adam(lr) if method == "adam" else optax.sgd(lr)


@functools.lru_cache(maxsize=None)
def _update(method, lr):
    """The compiled optimiser update (its compilation depends on the parameter shapes only, so
    every prompt length and kernel shares it)."""
    import optax

    opt = _optimizer(method, lr)

    def update(params, grads, state):
        updates, state = opt.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    return jax.jit(update)


def _check(lr, n_steps, ckpt_every):
    from sfxlin.training import checkpoint_steps

    lr = float(lr)
    if not (np.isfinite(lr) and lr > 0):
        raise ValueError(f"lr must be a positive finite number, got {lr}")
    return lr, checkpoint_steps(n_steps, ckpt_every)


def train(model, kern, params0, tasks, L=None, *, method="gd", lr=0.01, n_steps=100, ckpt_every=10,
          fresh=None, label=""):
    """Train ``model`` (a :class:`~sfxlin.models.Transformer`) with kernel ``kern`` from
    ``params0`` on ``tasks`` at prompt length ``L``.

    ``fresh`` (``method="sgd"`` only, and required there): ``(rng, x_law, n_pairs, n_queries)``;
    step ``t`` trains on ``icl.make_tasks(rng, d, n_pairs, n_queries, L, x_law)`` drawn in order
    (``tasks`` is then only used for ``d``). Returns a dict: ``t (n_ckpt,)``, ``params`` (each
    array ``(n_ckpt, *shape)``: the parameters at the checkpoint steps, before that step's
    update), ``risk (n_ckpt,)`` (the training risk at those parameters, on that step's tasks),
    ``theta (n_ckpt, P)`` (:func:`~sfxlin.models.flatten`). Raises
    :class:`sfxlin.training.TrainingDiverged` naming ``label`` on a non-finite risk or parameter.
    """
    from sfxlin import icl
    from sfxlin.training import TrainingDiverged

    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if (method == "sgd") != (fresh is not None):
        raise ValueError("fresh = (rng, x_law, n_pairs, n_queries) is required by method 'sgd' and only by it")
    lr, steps = _check(lr, n_steps, ckpt_every)
    params = {k: jax.numpy.asarray(a) for k, a in model.params(**params0).items()}
    update = _update(method, lr)
    state = _optimizer(method, lr).init(params)
    data, z_q, y_q = model_data(kern, tasks, L), tasks.z_q, tasks.y_q
    rec = {k: [] for k in params}
    risks = []
    j = 0
    for t in range(n_steps + 1):
        if fresh is not None:
            rng, x_law, n_pairs, n_queries = fresh
            batch = icl.make_tasks(rng, tasks.d, n_pairs, n_queries, L or 1, x_law)
            data, z_q, y_q = model_data(kern, batch, L), batch.z_q, batch.y_q
        r, grads = loss_and_grad(params, model, kern, data, z_q, y_q)
        if t == steps[j]:
            r = float(r)
            if not np.isfinite(r) or not all(np.all(np.isfinite(a)) for a in params.values()):
                raise TrainingDiverged(f"{label}: non-finite risk or parameters at step {t} ({kern}, L={L})",
                                       label=label, model=str(kern), L=L, step=t)
            for k, a in params.items():
                rec[k].append(np.asarray(a))
            risks.append(r)
            j += 1
            if t == n_steps:
                break
        params, state = update(params, grads, state)
    out_params = {k: np.stack(v) for k, v in rec.items()}
    return {"t": steps, "params": out_params, "risk": np.array(risks), "theta": flatten(out_params, lead=1)}
