"""Token laws: samplers, moments, validation, vectorisation, the Langevin function, limits."""
from decimal import Decimal, localcontext

import numpy as np
import pytest

from sfxlin import laws
from sfxlin.laws import Gaussian, NoLimitError, Rademacher, StudentT, Uniform, langevin, law_from_name

SQRT3 = np.sqrt(3.0)
N_MOMENTS = 200_000


def _rng(*ids):
    return np.random.default_rng([*ids, 5501])


def _laws(D, rng):
    """One instance of every law on R^D with a generic (non-diagonal) scale."""
    A = rng.standard_normal((D, D)) / np.sqrt(D)
    return {
        "gaussian": Gaussian(mean=rng.standard_normal(D), cov=A @ A.T + 0.1 * np.eye(D)),
        "rademacher": Rademacher(scale=A),
        "uniform": Uniform(scale=A),
        "student_t": StudentT(df=10.0, scale=A),  # df > 4: the sample covariance has a CLT
    }


def _law_mean(law):
    return law.mean if isinstance(law, Gaussian) else np.zeros(law.D)


# --------------------------------------------------------------------------------------------
# samplers
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["gaussian", "rademacher", "uniform", "student_t"])
@pytest.mark.parametrize("shape, expected", [((), ()), (5, (5,)), ((2, 3), (2, 3)), ((0,), (0,))])
def test_sample_shapes(name, shape, expected):
    law = _laws(3, _rng(1))[name]
    z = law.sample(_rng(2), shape)
    assert z.shape == expected + (3,)
    assert z.dtype == np.float64


@pytest.mark.parametrize("D", [1, 2, 4])
@pytest.mark.parametrize("name", ["gaussian", "rademacher", "uniform", "student_t"])
def test_sample_mean_and_covariance(name, D):
    """Sample mean and covariance within 5 standard errors of the law's (CLT)."""
    law = _laws(D, _rng(D, 3))[name]
    z = law.sample(_rng(D, 4, len(name)), N_MOMENTS)
    mean, cov = _law_mean(law), law.cov
    se_mean = np.sqrt(np.diag(cov) / N_MOMENTS)
    assert np.all(np.abs(z.mean(axis=0) - mean) <= 5 * se_mean)
    zc = z - mean  # centred at the true mean: E[zc_i zc_j] = cov_ij
    prods = zc[:, :, None] * zc[:, None, :]
    se_cov = prods.std(axis=0) / np.sqrt(N_MOMENTS)
    assert np.all(np.abs(prods.mean(axis=0) - cov) <= 5 * se_cov + 1e-15)


def test_sample_supports():
    rng = _rng(5)
    S = np.array([[1.0, 0.5], [-0.3, 2.0]])
    r = np.linalg.solve(S, Rademacher(scale=S).sample(rng, 1000).T).T
    np.testing.assert_allclose(np.abs(r), 1.0, atol=1e-12)
    u = np.linalg.solve(S, Uniform(scale=S).sample(rng, 1000).T).T
    assert np.all(np.abs(u) <= SQRT3 + 1e-12)
    assert u.std() == pytest.approx(1.0, rel=0.05)


def test_sample_is_reproducible_from_the_seed():
    law = Gaussian(mean=[1.0, -1.0], cov=[[2.0, 0.3], [0.3, 1.0]])
    np.testing.assert_array_equal(law.sample(_rng(6), (4, 2)), law.sample(_rng(6), (4, 2)))


def test_singular_gaussian_samples_stay_in_the_range_of_cov():
    """Rank-1 cov v v^T: every sample is a multiple of v (to rounding)."""
    v = np.array([1.0, 2.0, -1.0])
    law = Gaussian(mean=np.zeros(3), cov=np.outer(v, v))
    z = law.sample(_rng(7), 100)
    np.testing.assert_allclose(np.cross(z, v), 0.0, atol=1e-12)


# --------------------------------------------------------------------------------------------
# Student-t: no limit
# --------------------------------------------------------------------------------------------
def test_student_t_tilted_mean_raises_no_limit_error():
    law = StudentT(df=3.0, D=2)
    with pytest.raises(NoLimitError, match="no exponential moments"):
        law.tilted_mean(np.array([0.1, 0.0]))
    assert issubclass(NoLimitError, ValueError)


def test_student_t_cov_needs_df_above_two():
    np.testing.assert_allclose(StudentT(df=4.0, D=2).cov, 2.0 * np.eye(2))
    with pytest.raises(ValueError, match="df"):
        StudentT(df=2.0, D=2).cov


# --------------------------------------------------------------------------------------------
# validation: ValueError naming the argument
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "build, match",
    [
        (lambda: Gaussian(mean=np.zeros(2), cov=[[1.0, 0.0], [0.0, -1.0]]), "cov must be positive semi-definite"),
        (lambda: Gaussian(mean=np.zeros(2), cov=-1.0), "cov must be positive semi-definite"),
        (lambda: Gaussian(mean=np.zeros(2), cov=[[1.0, 0.5], [0.0, 1.0]]), "cov must be symmetric"),
        (lambda: Gaussian(mean=np.zeros(3), cov=np.eye(2)), "cov must be 3x3"),
        (lambda: Gaussian(mean=np.zeros(3), cov=np.ones(2)), "cov has length 2"),
        (lambda: Gaussian(mean=np.zeros(2), D=3), "D = 3"),
        (lambda: Gaussian(mean=np.zeros((2, 2))), "mean must be a non-empty vector"),
        (lambda: Gaussian(mean=[0.0, np.nan]), "mean must be finite"),
        (lambda: Gaussian(mean=np.zeros(2), cov=[[1.0, np.nan], [np.nan, 1.0]]), "cov must be finite"),
        (lambda: Gaussian(mean=np.zeros(2), cov=np.inf), "cov must be finite"),
        (lambda: StudentT(df=0.0, D=2), "df must be > 0"),
        (lambda: StudentT(df=-1.0, D=2), "df must be > 0"),
        (lambda: StudentT(df=np.nan, D=2), "df must be finite"),
        (lambda: Rademacher(scale=[1.0, np.nan]), "scale must be finite"),
        (lambda: Uniform(scale=[1.0, 2.0, 3.0], D=2), "scale has length 3"),
        (lambda: Uniform(scale=np.ones((2, 3)), D=2), "scale must be"),
        (lambda: Rademacher(scale=1.0), "needs D"),
        (lambda: law_from_name("cauchy", 2), "unknown law name 'cauchy'"),
    ],
)
def test_validation_errors_name_the_argument(build, match):
    with pytest.raises(ValueError, match=match):
        build()


@pytest.mark.parametrize("name", ["gaussian", "rademacher", "uniform"])
@pytest.mark.parametrize("a", [np.ones(3), np.ones((4, 1)), 1.0, [np.nan, 0.0], [np.inf, 0.0]], ids=str)
def test_tilted_mean_rejects_bad_a(name, a):
    law = _laws(2, _rng(8))[name]
    with pytest.raises(ValueError, match="a must"):
        law.tilted_mean(a)


def test_law_from_name_builds_each_law():
    for name, cls in [("gaussian", Gaussian), ("rademacher", Rademacher), ("uniform", Uniform),
                      ("student_t", StudentT)]:
        law = law_from_name(name, 3)
        assert isinstance(law, cls) and law.D == 3 and law.name == name
    assert law_from_name("student_t", 2, df=5.0).df == 5.0
    np.testing.assert_allclose(law_from_name("gaussian", 2, cov=2.0).cov, 2.0 * np.eye(2))


# --------------------------------------------------------------------------------------------
# tilted means: vectorisation, small-a expansion
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["gaussian", "rademacher", "uniform"])
def test_tilted_mean_vectorised_over_leading_axes_equals_loop(name):
    rng = _rng(9, len(name))
    law = _laws(3, rng)[name]
    a = rng.standard_normal((2, 4, 5, 3))
    out = law.tilted_mean(a)
    assert out.shape == a.shape
    loop = np.array([[[law.tilted_mean(a[i, j, k]) for k in range(5)] for j in range(4)] for i in range(2)])
    np.testing.assert_allclose(out, loop, rtol=0, atol=1e-14)  # a few ulp: BLAS paths differ
    assert law.tilted_mean(np.zeros((0, 3))).shape == (0, 3)


@pytest.mark.parametrize("name", ["gaussian", "rademacher", "uniform"])
def test_tilted_mean_near_zero_is_mean_plus_cov_a(name):
    """grad K(a) = E z + Cov(z) a + O(|a|^2): the closed forms agree with ``cov``."""
    rng = _rng(10, len(name))
    law = _laws(3, rng)[name]
    a = rng.standard_normal(3)
    for h in (1e-3, 1e-4):
        np.testing.assert_allclose(law.tilted_mean(h * a), _law_mean(law) + h * law.cov @ a, rtol=0, atol=50 * h**2)


# --------------------------------------------------------------------------------------------
# the Langevin function coth(t) - 1/t and the Uniform tilted mean
# --------------------------------------------------------------------------------------------
def _langevin_reference(t):
    """coth(t) - 1/t of the exact binary value of ``t``, in 80-digit decimal arithmetic.

    ``coth t = (e^{2t} + 1) / (e^{2t} - 1)``; for t >= 1e-8 the two cancellations lose at most
    ~25 digits, leaving > 50 correct.
    """
    with localcontext() as ctx:
        ctx.prec = 80
        T = Decimal(float(t))
        e2 = (2 * T).exp()
        return float((e2 + 1) / (e2 - 1) - 1 / T)


LANGEVIN_T = np.geomspace(1e-8, 50.0, 3001)
LANGEVIN_REF = np.array([_langevin_reference(t) for t in LANGEVIN_T])


def _langevin_rel_error(lo, hi):
    sel = (LANGEVIN_T >= lo) & (LANGEVIN_T <= hi)
    t, ref = LANGEVIN_T[sel], LANGEVIN_REF[sel]
    return max(np.max(np.abs(langevin(t) - ref) / ref), np.max(np.abs(langevin(-t) + ref) / ref))


def test_langevin_matches_high_precision_reference_everywhere():
    assert _langevin_rel_error(1e-8, 50.0) <= 1e-15


def test_langevin_at_zero_and_far_out():
    assert langevin(0.0) == 0.0
    assert langevin(np.array([0.0, -0.0])).tolist() == [0.0, 0.0]
    np.testing.assert_allclose(langevin([1e3, -1e3, 1e300]), [1 - 1e-3, -(1 - 1e-3), 1.0], rtol=1e-15)
    assert langevin(np.zeros((2, 3))).shape == (2, 3)


def test_uniform_tilted_mean_is_odd():
    rng = _rng(11)
    for law in (Uniform(scale=1.0, D=3), Uniform(scale=rng.standard_normal((3, 3)))):
        a = rng.standard_normal((50, 3)) * 10.0 ** rng.uniform(-9, 3, (50, 1))
        np.testing.assert_array_equal(law.tilted_mean(-a), -law.tilted_mean(a))
    np.testing.assert_array_equal(Uniform(scale=1.0, D=2).tilted_mean(np.zeros(2)), np.zeros(2))


def test_uniform_tilted_mean_saturates_at_sqrt3_sign():
    """S = I: sqrt3 coth(sqrt3 a_i) - 1/a_i -> sqrt3 sign(a_i), with gap 1/|a_i| (once coth = 1)."""
    law = Uniform(scale=1.0, D=3)
    for scale in (1e2, 1e4, 1e8, 1e300):
        a = scale * np.array([1.0, -2.0, 0.5])
        out = law.tilted_mean(a)
        np.testing.assert_allclose(out, SQRT3 * np.sign(a) - 1 / a, rtol=1e-15, atol=0)
        assert np.all(np.abs(out) < SQRT3 + 1e-15)
    assert np.all(np.diff(law.tilted_mean(np.linspace(-50, 50, 1001)[:, None] * np.ones(3))[:, 0]) >= 0)


def test_module_exports():
    assert set(laws.__all__) >= {"Gaussian", "Rademacher", "Uniform", "StudentT", "NoLimitError", "law_from_name"}
