"""The softmax off-block Hessian (one nested-prompt pass of the shared softmax core over every
prompt length, checkpoint and query, from raw moments) against a direct two-pass computation of
the central moments per prompt length and checkpoint; with the checkpoints split over several
passes (``_MOMENT_BYTES`` small) as the long C3 trajectories are."""
import numpy as np
import pytest

from sfxlin import curvature, icl, laws, training


def _two_pass(tasks, L, U, v):
    """``H_off (2d, 2d)`` of softmax(L) at one ``U``, ``v``: weights normalised first, then the
    central moments of ``y`` about its weighted mean."""
    d = tasks.d
    Z = tasks.prompt(L)
    p = np.exp(np.einsum("nkj,ji,nqi->nqk", Z[..., :d], U[:d, :d], tasks.x_q))
    p /= p.sum(axis=-1, keepdims=True)
    m = p @ Z
    yc = Z[:, None, :, d] - m[..., d:]
    cov_xy = np.einsum("nqk,nqk,nkj->nqj", p, yc, Z[..., :d])
    var_y, k3_y = np.sum(p * yc ** 2, axis=-1), np.sum(p * yc ** 3, axis=-1)
    r = m @ v - tasks.y_q
    g = np.concatenate([tasks.x_q * (v[d] * var_y)[..., None], m[..., :d]], axis=-1)
    xx = tasks.x_q[..., :, None] * tasks.x_q[..., None, :]
    H = np.einsum("nqa,nqb->ab", g, g)
    H[:d, :d] += np.einsum("nq,nqij->ij", r * v[d] * k3_y, xx)
    cross = np.einsum("nq,nqi,nqj->ij", r, tasks.x_q, cov_xy)
    H[:d, d:] += cross
    H[d:, :d] += cross.T
    return H / r.size


@pytest.mark.parametrize("moment_bytes", [None, 1])
def test_softmax_off_block_hessian_matches_two_pass_central_moments(monkeypatch, moment_bytes):
    """Raw-to-central moments lose ~1e-14 relative here (measured; < 1e-13 on the C3 paper cells, 2e-13 on 96 tasks at L <= 4096 after 400 steps):
    asserted at the project's 1e-10 contract. ``moment_bytes = 1``: one checkpoint per pass."""
    if moment_bytes is not None:
        monkeypatch.setattr(curvature, "_MOMENT_BYTES", moment_bytes)
    tasks = icl.make_tasks(np.random.default_rng(3), 3, 6, 2, 256, laws.Gaussian(cov=np.diag([2.0, 1.0, 0.5])))
    Ls = (8, 64, 256)
    res = training.train_all_arrays(tasks, Ls, models=("softmax",), lr=0.05, n_steps=60, ckpt_every=20)
    U, v = res["softmax"]["U"], res["softmax"]["v"]
    H = curvature.off_block_hessian("softmax", tasks, Ls, U, v)
    assert H.shape == U.shape[:2] + (6, 6)
    for i, L in enumerate(Ls):
        for t in range(U.shape[1]):
            ref = _two_pass(tasks, L, U[i, t], v[i, t])
            assert np.max(np.abs(H[i, t] - ref)) <= 1e-10 * np.max(np.abs(ref)), (L, t)


# --------------------------------------------------------------------------- the whole Hessian of linear(inf)

def _stencil_hessian(risk, theta, h=0.5):
    """Dense Hessian of a polynomial of degree <= 5 along every line: the 5-point second difference
    ``(-R(2h) + 16 R(h) - 30 R(0) + 16 R(-h) - R(-2h)) / 12 h^2`` is exact for it, ``H_ii`` along
    ``e_i`` and ``H_ij = (R''(e_i + e_j) - R''(e_i - e_j)) / 4``; ``risk`` takes ``(..., P)``."""
    P = theta.size
    eye = np.eye(P)
    dirs = np.concatenate([eye, (eye[:, None] + eye[None]).reshape(-1, P), (eye[:, None] - eye[None]).reshape(-1, P)])
    pts = theta + h * np.array([-2, -1, 0, 1, 2])[:, None, None] * dirs[None]
    R = risk(pts)
    second = (-R[0] + 16 * R[1] - 30 * R[2] + 16 * R[3] - R[4]) / (12 * h * h)
    H = np.diag(second[:P])
    plus, minus = second[P:P + P * P].reshape(P, P), second[P + P * P:].reshape(P, P)
    off = (plus - minus) / 4
    return np.where(np.eye(P, dtype=bool), H, off)


def _theta(U, v):
    return np.concatenate([U.ravel(), v])


def _split(theta, D):
    return theta[..., :D * D].reshape(theta.shape[:-1] + (D, D)), theta[..., D * D:]


@pytest.mark.parametrize("d, Sigma, noise", [(2, np.eye(2), 0.0), (3, np.diag([2.0, 1.0, 0.5]), 0.0),
                                             (3, np.diag([2.0, 1.0, 0.5]), 0.4), (4, None, 0.2)])
def test_linear_inf_gradient_and_hessian_of_the_exact_risk(d, Sigma, noise):
    """At a generic point (no block structure): the gradient against central differences of the
    closed-form risk (sfxlin.icl.linear_inf_risk); the Hessian against central differences of that
    gradient and against a dense Hessian of the risk itself by an exact stencil (the risk is a
    quartic polynomial of theta)."""
    rng = np.random.default_rng(d)
    if Sigma is None:
        Q = np.linalg.qr(rng.standard_normal((d, d)))[0]
        Sigma = Q @ np.diag(np.linspace(0.5, 2.0, d)) @ Q.T
    D = d + 1
    U, v = 0.4 * rng.standard_normal((D, D)), rng.standard_normal(D)
    theta = _theta(U, v)
    risk = lambda t: icl.linear_inf_risk(*_split(t, D), Sigma, noise)          # noqa: E731
    grad = lambda t: _theta(*curvature.linear_inf_gradient(*_split(t, D), Sigma, noise))   # noqa: E731
    h, eye = 1e-5, np.eye(theta.size)
    num = np.array([(risk(theta + h * e) - risk(theta - h * e)) / (2 * h) for e in eye])
    g = grad(theta)
    assert np.abs(g - num).max() <= 1e-8 * np.abs(num).max()
    H = curvature.linear_inf_hessian(U, v, Sigma, noise)
    assert H.shape == (D * D + D,) * 2 and np.array_equal(H, H.T)
    fd = np.stack([(grad(theta + h * e) - grad(theta - h * e)) / (2 * h) for e in eye], axis=1)
    assert np.abs(H - fd).max() <= 1e-8 * np.abs(H).max()
    dense = _stencil_hessian(risk, theta)
    assert np.abs(H - dense).max() <= 1e-10 * np.abs(H).max()
    dead = np.arange(d) * D + d          # U[:d, d] multiplies z_q[d] = 0
    assert not np.any(H[dead]) and not np.any(H[:, dead])


def test_linear_inf_training_hessian_against_its_gradient_and_an_exact_stencil():
    rng = np.random.default_rng(5)
    tasks = icl.make_tasks(rng, 3, 4, 3, 8, laws.covariate_law("gaussian", np.diag([2.0, 1.0, 0.5])))
    D = tasks.D
    U, v = 0.4 * rng.standard_normal((D, D)), rng.standard_normal(D)
    theta = _theta(U, v)
    G = icl.model_matrix("linear_inf", tasks)
    grad = lambda t: _theta(*icl.linear_risk_grad(*_split(t, D), G, tasks.z_q, tasks.y_q)[1:])   # noqa: E731
    H = curvature.linear_inf_training_hessian(tasks, U, v)
    h, eye = 1e-5, np.eye(theta.size)
    fd = np.stack([(grad(theta + h * e) - grad(theta - h * e)) / (2 * h) for e in eye], axis=1)
    assert np.abs(H - fd).max() <= 1e-8 * np.abs(H).max()
    dense = _stencil_hessian(lambda t: icl.risk("linear_inf", *_split(t, D), tasks), theta)
    assert np.abs(H - dense).max() <= 1e-10 * np.abs(H).max()


def test_linear_training_hessian_against_an_exact_stencil_and_batched():
    """linear(L) (G = Ghat_L of the first L tokens) against the 5-point stencil of its training risk, exact for
    the quartic; a stack of parameters gives each one's Hessian; bad shapes are refused."""
    rng = np.random.default_rng(7)
    tasks = icl.make_tasks(rng, 3, 4, 2, 16, laws.covariate_law("gaussian", np.diag([2.0, 1.0, 0.5]), np.ones(3)))
    D = tasks.D
    U, v = 0.4 * rng.standard_normal((2, D, D)), rng.standard_normal((2, D))
    H = curvature.linear_training_hessian(tasks, 8, U, v)
    assert H.shape == (2, D * D + D, D * D + D)
    for k in range(2):
        dense = _stencil_hessian(lambda t: icl.risk("linear", *_split(t, D), tasks, 8), _theta(U[k], v[k]))
        assert np.abs(H[k] - dense).max() <= 1e-10 * np.abs(H[k]).max()
        scale = np.abs(H[k]).max()
        np.testing.assert_allclose(H[k], curvature.linear_training_hessian(tasks, 8, U[k], v[k]), rtol=0,
                                   atol=1e-13 * scale)
        inf = curvature.linear_inf_training_hessian(tasks, U[k], v[k])
        np.testing.assert_allclose(curvature.linear_inf_training_hessian(tasks, U, v)[k], inf, rtol=0,
                                   atol=1e-13 * np.abs(inf).max())
    with pytest.raises(ValueError, match="same leading dims"):
        curvature.linear_training_hessian(tasks, 8, U, v[0])
    with pytest.raises(ValueError, match="L must be in"):
        curvature.linear_training_hessian(tasks, 17, U, v)


def test_block_coordinates_split_the_hessian_at_a_block_structured_point():
    """On antithetic tasks at a block-structured point the risk is even in the off-block coordinates: the
    Hessian has no entry between them and the block coordinates U[:d, :d], v[d], so its spectrum is the union
    of the two blocks' and lambda_max(H, d) is the block coordinates' largest eigenvalue."""
    d = 3
    tasks = icl.make_tasks(np.random.default_rng(8), d, 5, 2, 8, laws.covariate_law("gaussian", np.diag([2.0, 1.0, 0.5])))
    D = d + 1
    U, v = np.zeros((D, D)), np.zeros(D)
    U[:d, :d] = np.random.default_rng(9).standard_normal((d, d))
    v[d] = 0.7
    idx = curvature.block_coordinates(d)
    assert sorted(idx) == sorted([i * D + j for i in range(d) for j in range(d)] + [D * D + d])
    for H in (curvature.linear_inf_training_hessian(tasks, U, v), curvature.linear_training_hessian(tasks, 4, U, v)):
        off = np.setdiff1d(np.arange(D * D + D), idx)
        assert np.abs(H[np.ix_(idx, off)]).max() <= 1e-13 * np.abs(H).max()
        block = np.linalg.eigvalsh(H[np.ix_(idx, idx)])
        both = np.sort(np.concatenate([block, np.linalg.eigvalsh(H[np.ix_(off, off)])]))
        np.testing.assert_allclose(np.linalg.eigvalsh(H), both, rtol=0, atol=1e-12 * np.abs(H).max())
        assert curvature.lambda_max(H, d) == pytest.approx(block[-1], rel=1e-13)
        assert curvature.lambda_max(H) == pytest.approx(np.linalg.eigvalsh(H)[-1], rel=1e-13)
        np.testing.assert_allclose(curvature.lambda_max(np.stack([H, 2 * H]), d), [block[-1], 2 * block[-1]],
                                   rtol=1e-13)


def test_faithful_lr_at_the_eq9_init():
    """lr = margin * 2 / lambda_max of the Hessian at the Eq. 9 init (population, or training risk on
    given tasks); with it the stiffest direction contracts by 1 - 2 margin a step."""
    Sigma = np.diag([2.0, 1.0, 0.5])
    lr, lam = curvature.faithful_lr(3, Sigma)
    U0, v0 = icl.init_theta(3, Sigma)
    dense = _stencil_hessian(lambda t: icl.linear_inf_risk(*_split(t, 4), Sigma), _theta(U0, v0))
    lam_dense = np.linalg.eigvalsh(dense)[-1]
    assert abs(lam - lam_dense) <= 1e-10 * lam_dense
    assert lr == 2 * curvature.FAITHFUL_MARGIN / lam
    lams = np.linalg.eigvalsh(curvature.linear_inf_hessian(U0, v0, Sigma))
    assert lams[0] < 0 < lams[-1]                          # a saddle's neighbourhood: the flow leaves it
    contraction = 1 - lr * lams[lams > 0]                   # positive curvature: no overshoot
    assert np.all(contraction >= 1 - 2 * curvature.FAITHFUL_MARGIN - 1e-12) and np.all(contraction < 1)
    tasks = icl.make_tasks(np.random.default_rng(6), 3, 8, 2, 4, laws.covariate_law("gaussian", Sigma))
    lr_t, lam_t = curvature.faithful_lr(3, Sigma, margin=0.25, tasks=tasks)
    assert lam_t == np.linalg.eigvalsh(curvature.linear_inf_training_hessian(tasks, U0, v0))[-1]
    assert lr_t == 0.5 / lam_t
    for bad in (0.0, 0.6, -1.0):
        with pytest.raises(ValueError, match="margin must be in"):
            curvature.faithful_lr(3, Sigma, margin=bad)


def test_linear_inf_hessian_refuses_bad_parameters():
    with pytest.raises(ValueError, match=r"U must be \(D, D\)"):
        curvature.linear_inf_hessian(np.zeros((3, 4)), np.zeros(4), np.eye(2))
    with pytest.raises(ValueError, match="finite"):
        curvature.linear_inf_hessian(np.full((3, 3), np.nan), np.zeros(3), np.eye(2))


def test_block_edge_is_lr_times_the_top_curvature_in_the_block_coordinates():
    """Against a central-difference Hessian of the training gradient in the block coordinates (U[:d, :d], v[d])
    alone, at two block-structured points of a trajectory."""
    rng = np.random.default_rng(8)
    tasks = icl.make_tasks(rng, 2, 3, 2, 4, laws.covariate_law("gaussian", np.diag([3.0, 0.5])))
    D, d, lr = tasks.D, tasks.d, 0.02
    run = training.train_all_arrays(tasks, (), models=("linear_inf",), lr=lr, n_steps=40, ckpt_every=40)
    U, v = run["linear_inf"]["U"], run["linear_inf"]["v"]
    G = icl.model_matrix("linear_inf", tasks)
    block = [i * D + j for i in range(d) for j in range(d)] + [D * D + d]
    grad = lambda t: _theta(*icl.linear_risk_grad(*_split(t, D), G, tasks.z_q, tasks.y_q)[1:])   # noqa: E731
    h = 1e-5
    expected = []
    for Ui, vi in zip(U, v):
        theta = _theta(Ui, vi)
        fd = np.stack([(grad(theta + h * e) - grad(theta - h * e))[block] / (2 * h)
                       for e in np.eye(theta.size)[block]], axis=1)
        expected.append(lr * np.linalg.eigvalsh((fd + fd.T) / 2)[-1])
    np.testing.assert_allclose(curvature.block_edge(tasks, U, v, lr), expected, rtol=1e-7)
    with pytest.raises(ValueError, match=r"U must be \(n, 3, 3\)"):
        curvature.block_edge(tasks, U[0], v[0], lr)
