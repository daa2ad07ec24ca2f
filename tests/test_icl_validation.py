"""Silent wrong answers turned into clear errors: inconsistent or non-finite arrays in
``icl.Tasks``."""
import re

import numpy as np
import pytest

from sfxlin import icl, training
from sfxlin.laws import Gaussian

ANISO = np.diag([2.0, 1.0, 0.5])


def _rng(*ids):
    return np.random.default_rng([*ids, 5521])


def _tasks(d=3, n_pairs=2, n_queries=2, L_max=32, seed=0):
    law = Gaussian(cov=ANISO[:d, :d])
    return icl.make_tasks(_rng(seed), d, n_pairs, n_queries, L_max, law)


# --------------------------------------------------------------------------- Tasks validation


def _parts(t, **change):
    kw = dict(Z=t.Z, w=t.w, x_q=t.x_q, y_q=t.y_q, Sigma=t.Sigma)
    kw.update(change)
    return kw


def _with_nan(a, index):
    a = np.array(a, dtype=float)
    a[index] = np.nan
    return a


# (change, names that the message must contain); the base tasks: n = 4, L_max = 32, d = 3, q = 2
BAD_TASKS = [
    (lambda t: dict(y_q=t.y_q[:, :1]), ["y_q", "(4, 2)", "(4, 1)"]),
    (lambda t: dict(y_q=t.y_q[:, :, None]), ["y_q", "(4, 2)", "(4, 2, 1)"]),
    (lambda t: dict(w=np.ones((4, 2))), ["w", "(4, 3)", "(4, 2)"]),
    (lambda t: dict(w=t.w[:2]), ["w", "(4, 3)", "(2, 3)"]),
    (lambda t: dict(x_q=t.x_q[:3], y_q=t.y_q[:3]), ["x_q", "(4, n_queries, 3)", "(3, 2, 3)"]),
    (lambda t: dict(x_q=t.x_q[..., :2]), ["x_q", "(4, n_queries, 3)", "(4, 2, 2)"]),
    (lambda t: dict(Z=t.Z[0]), ["Z", "(n, L_max, D)", "(32, 4)"]),
    (lambda t: dict(Z=t.Z[:2]), ["w", "(2, 3)", "(4, 3)"]),
    (lambda t: dict(Sigma=np.eye(4)), ["Sigma", "3 x 3", "(4, 4)"]),
    (lambda t: dict(Sigma=[[1.0, 0.5, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]]), ["Sigma", "symmetric"]),
    (lambda t: dict(Sigma=1e-12 * np.array([[1.0, 0.5, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])),
     ["Sigma", "symmetric"]),
    (lambda t: dict(Sigma=np.diag([1.0, 0.0, 1.0])), ["Sigma", "positive definite"]),
    (lambda t: dict(Sigma=np.diag([1.0, -1.0, 1.0])), ["Sigma", "positive definite"]),
    (lambda t: dict(Z=_with_nan(t.Z, (1, 5, 3))), ["Z", "non-finite", "(1, 5, 3)"]),
    (lambda t: dict(w=_with_nan(t.w, (0, 1))), ["w", "non-finite"]),
    (lambda t: dict(x_q=_with_nan(t.x_q, (3, 1, 0))), ["x_q", "non-finite"]),
    (lambda t: dict(y_q=np.where(t.y_q > 0, np.inf, t.y_q)), ["y_q", "non-finite"]),
    (lambda t: dict(Sigma=_with_nan(np.eye(3), (0, 0))), ["Sigma", "finite"]),
]


@pytest.mark.parametrize("change, names", BAD_TASKS, ids=[f"{i}-{n[0]}" for i, (_, n) in enumerate(BAD_TASKS)])
def test_tasks_refuse_inconsistent_or_non_finite_arrays(change, names):
    t = _tasks()
    with pytest.raises(ValueError) as info:
        icl.Tasks(**_parts(t, **change(t)))
    msg = str(info.value)
    for name in names:
        assert re.search(rf"(?<![A-Za-z_]){re.escape(name)}(?![A-Za-z_])", msg), (name, msg)


def test_nan_prompt_is_refused_before_training_not_blamed_on_the_learning_rate():
    t = _tasks()
    Z = _with_nan(t.Z, (0, 0, 0))
    with pytest.raises(ValueError, match=r"\bZ\b.*non-finite"):
        training.train("softmax", icl.Tasks(**_parts(t, Z=Z)), 8)


def test_legitimate_tasks_still_construct():
    t = _tasks()
    noisy_Z = t.Z.copy()
    noisy_Z[0, 0, 3] += 0.1                                  # noisy labels: refused later, by the engine
    noisy = icl.Tasks(**_parts(t, Z=noisy_Z))
    assert noisy.L_max == 32
    ints = icl.Tasks(Z=t.Z.astype(int), w=t.w.tolist(), x_q=t.x_q, y_q=t.y_q, Sigma=[2.0, 1.0, 0.5],
                     paired=False)
    assert ints.Z.dtype == np.float64 and isinstance(ints.w, np.ndarray)
    np.testing.assert_array_equal(ints.Sigma, ANISO)        # a diagonal becomes the d x d matrix
    odd = t.subset([0, 3, 2])
    assert odd.n_tasks == 3 and not odd.paired
