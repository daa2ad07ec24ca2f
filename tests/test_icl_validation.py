"""Silent wrong answers turned into correct answers or clear errors: linear(inf) for non-centred
covariates (the limit of Ghat_L is the second moment, not the covariance), inconsistent or
non-finite arrays in ``icl.Tasks``, and what to call when the fast engine refuses noisy labels."""
import re

import numpy as np
import pytest

from sfxlin import icl, training
from sfxlin.laws import Gaussian

ANISO = np.diag([2.0, 1.0, 0.5])
MEAN = np.array([1.0, 0.0, -0.5])


def _rng(*ids):
    return np.random.default_rng([*ids, 5521])


def _tasks(d=3, n_pairs=2, n_queries=2, L_max=32, mean=None, seed=0):
    law = Gaussian(mean=np.zeros(d) if mean is None else mean, cov=ANISO[:d, :d])
    return icl.make_tasks(_rng(seed), d, n_pairs, n_queries, L_max, law)


def _second_moment_gamma(Sigma, mean, w):
    """[[M, M w], [w^T M, w^T M w]] with M = Sigma + m m^T, written out independently."""
    M = Sigma + np.outer(mean, mean)
    d = len(mean)
    G = np.zeros((len(w), d + 1, d + 1))
    G[:, :d, :d] = M
    G[:, :d, d] = G[:, d, :d] = w @ M
    G[:, d, d] = np.einsum("ni,ij,nj->n", w, M, w)
    return G


# --------------------------------------------------------------------------- non-centred covariates


def test_linear_inf_is_the_large_L_limit_of_Ghat_for_non_centred_covariates():
    """Ghat_L at L = 2^14 is within 5 CLT standard errors (of the entrywise mean of z z^T over
    the prompt) of the linear(inf) matrix, entry by entry: the second moment, not the covariance."""
    L = 1 << 14
    t = _tasks(n_pairs=3, L_max=L, mean=MEAN, seed=1)
    G = icl.Ghat(t.Z)
    zz = t.Z[:, :, :, None] * t.Z[:, :, None, :]                     # (n, L, D, D)
    se = zz.std(axis=1) / np.sqrt(L)
    Gam = icl.model_matrix("linear_inf", t)
    assert np.all(np.abs(G - Gam) <= 5 * se)
    np.testing.assert_allclose(Gam, _second_moment_gamma(ANISO, MEAN, t.w), rtol=1e-14)
    np.testing.assert_allclose(icl.Gamma_w(ANISO, t.w, mean=MEAN), Gam, rtol=0, atol=0)


def test_linear_inf_risk_and_training_use_the_second_moment():
    t = _tasks(mean=MEAN, seed=2)
    U0, v0 = icl.init_theta(3, ANISO + np.outer(MEAN, MEAN))
    G = _second_moment_gamma(ANISO, MEAN, t.w)
    r, gU, gv = icl.linear_risk_grad(U0, v0, G, t.z_q, t.y_q)
    got = icl.risk_grad("linear_inf", U0, v0, t)
    for a, b in zip(got, (r, gU, gv)):
        np.testing.assert_allclose(a, b, rtol=1e-13, atol=1e-15)
    kw = dict(lr=0.02, n_steps=6, ckpt_every=3)
    fast = training.train_all_arrays(t, (), models=("linear_inf",), **kw)["linear_inf"]
    simple = training.train("linear_inf", t, **kw)
    np.testing.assert_allclose(fast["risk"][0], r, rtol=1e-13)
    np.testing.assert_allclose(simple["risk"].values, fast["risk"], rtol=1e-12)
    np.testing.assert_allclose(simple["U"].values[0], U0, rtol=0, atol=0)   # Eq. 9 with E[x x^T]


def test_centred_tasks_are_unchanged():
    t = _tasks(seed=3)
    assert np.array_equal(t.mean, np.zeros(3)) and np.array_equal(t.second_moment, t.Sigma)
    np.testing.assert_array_equal(icl.model_matrix("linear_inf", t), icl.Gamma_w(t.Sigma, t.w))


def test_subset_keeps_the_mean():
    t = _tasks(n_pairs=3, mean=MEAN, seed=4)
    s = t.subset(slice(2, 6))
    np.testing.assert_array_equal(s.mean, MEAN)
    np.testing.assert_array_equal(icl.model_matrix("linear_inf", s), icl.model_matrix("linear_inf", t)[2:6])


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
    (lambda t: dict(mean=np.zeros(2)), ["mean", "(3,)", "(2,)"]),
    (lambda t: dict(mean=[0.0, np.inf, 0.0]), ["mean", "non-finite"]),
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


# --------------------------------------------------------------------------- the engine's noisy-label message


def test_fast_engine_on_noisy_labels_names_the_general_path():
    t = _tasks()
    Z = t.Z.copy()
    Z[1, 2, 3] += 0.1
    noisy = icl.Tasks(**_parts(t, Z=Z))
    for call in (lambda: training.train_all(noisy, (4, 8), n_steps=2, ckpt_every=1),
                 lambda: training.SoftmaxPrefixEngine(noisy, (4, 8))):
        with pytest.raises(ValueError, match="noiseless") as info:
            call()
        assert "training.train('softmax', tasks, L)" in str(info.value)
    # and the general path named there does train on them
    ds = training.train("softmax", noisy, 8, n_steps=2, ckpt_every=1)
    assert np.all(np.isfinite(ds["risk"].values))


def test_the_gap_kernel_and_the_reference_refuse_non_centred_covariates():
    """softmax(L) does not tend to linear(inf) when the covariates have a mean (its limit is
    affine), and the per-L reference builds linear(inf) from the covariance: both refuse."""
    from sfxlin import gradient_gap
    from sfxlin.laws import Gaussian
    from sfxlin.testing.reference_c3 import train_reference

    rng = np.random.default_rng(0)
    tasks = icl.make_tasks(rng, 2, 2, 1, 16, Gaussian(mean=[1.0, 0.0], cov=np.eye(2)))
    U, v = icl.init_theta(2, tasks.Sigma)
    with pytest.raises(ValueError, match=r"centred covariates only.*mean \[1\.0, 0\.0\]"):
        gradient_gap.gradient_gap(U[None], v[None], tasks, tasks.Z[None], [4, 16])
    with pytest.raises(ValueError, match=r"centred covariates only, got mean \[1\.0, 0\.0\]"):
        train_reference("linear_inf", tasks, 16, lr=0.01, n_steps=2, ckpt_every=1, U0=U, v0=v)
