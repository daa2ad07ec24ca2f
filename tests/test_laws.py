"""Token laws: the Law interface and its registry, samplers, moments, isotropic members, validation,
vectorisation, the Langevin function, limits."""
from decimal import Decimal, localcontext

import numpy as np
import pytest

from sfxlin import laws
from sfxlin.laws import LAWS, Gaussian, Law, NoLimitError, Rademacher, StudentT, Uniform, langevin, law_from_name

SQRT3 = np.sqrt(3.0)
N_MOMENTS = 200_000
NAMES = ["gaussian", "rademacher", "uniform", "student_t"]
WITH_LIMIT = [name for name in NAMES if name != "student_t"]


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


# --------------------------------------------------------------------------------------------
# samplers
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("shape, expected", [((), ()), (5, (5,)), ((2, 3), (2, 3)), ((0,), (0,))])
def test_sample_shapes(name, shape, expected):
    law = _laws(3, _rng(1))[name]
    z = law.sample(_rng(2), shape)
    assert z.shape == expected + (3,)
    assert z.dtype == np.float64


@pytest.mark.parametrize("D", [1, 2, 4])
@pytest.mark.parametrize("name", NAMES)
def test_sample_mean_and_covariance(name, D):
    """Sample mean and covariance within 5 standard errors of the law's (CLT)."""
    law = _laws(D, _rng(D, 3))[name]
    z = law.sample(_rng(D, 4, len(name)), N_MOMENTS)
    mean, cov = law.mean, law.cov
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


@pytest.mark.parametrize("name", WITH_LIMIT)
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
@pytest.mark.parametrize("name", WITH_LIMIT)
def test_tilted_mean_vectorised_over_leading_axes_equals_loop(name):
    rng = _rng(9, len(name))
    law = _laws(3, rng)[name]
    a = rng.standard_normal((2, 4, 5, 3))
    out = law.tilted_mean(a)
    assert out.shape == a.shape
    loop = np.array([[[law.tilted_mean(a[i, j, k]) for k in range(5)] for j in range(4)] for i in range(2)])
    np.testing.assert_allclose(out, loop, rtol=0, atol=1e-14)  # a few ulp: BLAS paths differ
    assert law.tilted_mean(np.zeros((0, 3))).shape == (0, 3)


@pytest.mark.parametrize("name", WITH_LIMIT)
def test_tilted_mean_near_zero_is_mean_plus_cov_a(name):
    """grad K(a) = E z + Cov(z) a + O(|a|^2): the closed forms agree with ``cov``."""
    rng = _rng(10, len(name))
    law = _laws(3, rng)[name]
    a = rng.standard_normal(3)
    for h in (1e-3, 1e-4):
        np.testing.assert_allclose(law.tilted_mean(h * a), law.mean + h * law.cov @ a, rtol=0, atol=50 * h**2)


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


def test_module_exports_the_law_interface():
    assert set(laws.__all__) >= {"Law", "LAWS", "FloatOverflowError"}


# --------------------------------------------------------------------------------------------
# the Law interface and the LAWS registry
# --------------------------------------------------------------------------------------------
def _concrete_subclasses(cls):
    out = []
    for sub in cls.__subclasses__():
        if "name" in sub.__dict__:
            out.append(sub)
        out += _concrete_subclasses(sub)
    return out


def test_every_law_is_registered_once_under_its_name():
    assert list(LAWS) == NAMES  # definition order
    assert all(LAWS[name].name == name and issubclass(LAWS[name], Law) for name in NAMES)
    concrete = [cls for cls in _concrete_subclasses(Law) if cls.__module__ == laws.__name__]
    assert sorted(cls.name for cls in concrete) == sorted(NAMES)  # each class once, none missing
    assert [name for name in NAMES if not LAWS[name].has_limit] == ["student_t"]


@pytest.mark.parametrize("name", NAMES)
def test_law_from_name_builds_every_registered_law(name):
    law = law_from_name(name, 3)
    assert type(law) is LAWS[name] and law.D == 3 and law.name == name
    assert law.mean.shape == (3,) and law.cov.shape == (3, 3)


def test_law_from_name_unknown_name_lists_the_known_ones():
    with pytest.raises(ValueError, match="unknown law name 'cauchy'") as info:
        law_from_name("cauchy", 2)
    assert all(repr(name) in str(info.value) for name in NAMES)


def _law_body():
    """The members of a complete law (a point mass at 0), for the registration tests."""
    def isotropic(cls, D, sigma=1.0):
        raise NotImplementedError("a point mass has covariance 0")

    return {
        "__init__": lambda self, D=1: setattr(self, "D", D),
        "mean": property(lambda self: np.zeros(self.D)),
        "cov": property(lambda self: np.zeros((self.D, self.D))),
        "sample": lambda self, rng, shape=(): np.zeros(laws._check_shape(shape) + (self.D,)),
        "tilted_mean": lambda self, a: np.zeros_like(laws._check_a(a, self.D)),
        "snis_covariance": lambda self, a: np.zeros(laws._check_a(a, self.D).shape + (self.D,)),
        "isotropic": classmethod(isotropic),
    }


def test_a_new_law_is_registered_by_defining_it(monkeypatch):
    monkeypatch.setattr(laws, "LAWS", dict(LAWS))  # the module's table, restored after the test
    PointMass = type("PointMass", (Law,), {"name": "point_mass", **_law_body()})
    assert laws.LAWS["point_mass"] is PointMass and "point_mass" not in LAWS
    law = law_from_name("point_mass", 2)
    assert isinstance(law, PointMass) and law.D == 2 and PointMass.has_limit
    with pytest.raises(NotImplementedError, match="covariance 0"):
        PointMass.isotropic(2)


@pytest.mark.parametrize(
    "name, drop, match",
    [
        (None, None, "must set a class attribute name"),
        ("", None, "must set a class attribute name"),
        ("uniform", None, "law name 'uniform' of .* is already taken by sfxlin.laws.Uniform"),
        ("point_mass", "snis_covariance", r"does not implement \['snis_covariance'\]"),
        ("point_mass", "cov", r"does not implement \['cov'\]"),
    ],
)
def test_a_law_without_a_new_name_or_a_member_is_refused(name, drop, match):
    body = _law_body()
    if name is not None:
        body["name"] = name
    body.pop(drop, None)
    before = dict(LAWS)
    with pytest.raises(TypeError, match=match):
        type("PointMass", (Law,), body)
    assert LAWS == before


def test_a_subclass_of_a_law_needs_its_own_name():
    """An inherited name counts as missing: the table maps each name to one class."""
    with pytest.raises(TypeError, match="must set a class attribute name"):
        type("MyGaussian", (Gaussian,), {})


def test_an_abstract_intermediate_class_is_not_registered():
    before = dict(LAWS)
    Base = type("Base", (Law,), {}, abstract=True)
    assert LAWS == before
    with pytest.raises(TypeError):  # abstract members: cannot be instantiated
        Base()


@pytest.mark.parametrize("name", WITH_LIMIT)
def test_tilted_mean_at_zero_is_the_mean(name):
    """``a = 0`` is no tilt: ``E z`` (to rounding)."""
    law = _laws(3, _rng(12, len(name)))[name]
    np.testing.assert_allclose(law.tilted_mean(np.zeros(3)), law.mean, rtol=0, atol=1e-15)


@pytest.mark.parametrize("name", WITH_LIMIT)
def test_snis_covariance_at_zero_is_the_covariance(name):
    """``a = 0``: ``w = 1`` and the SNIS constant is ``E[(z - E z)(z - E z)^T] = cov``."""
    law = _laws(3, _rng(13, len(name)))[name]
    np.testing.assert_allclose(law.snis_covariance(np.zeros(3)), law.cov, rtol=0, atol=1e-14)


def test_student_t_mean_needs_df_above_one():
    np.testing.assert_array_equal(StudentT(df=1.5, D=2).mean, np.zeros(2))
    with pytest.raises(ValueError, match="has no mean"):
        StudentT(df=1.0, D=2).mean


# --------------------------------------------------------------------------------------------
# isotropic members: covariance sigma^2 I
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("sigma", [0.5, 1.0, 3.0])
@pytest.mark.parametrize("name", NAMES)
def test_isotropic_covariance_is_sigma_squared_identity(name, sigma):
    law = LAWS[name].isotropic(3, sigma)
    assert type(law) is LAWS[name] and law.D == 3
    # the covariances are sigma^2 times exact 0/1 entries, up to one rounding of products
    np.testing.assert_allclose(law.cov, sigma**2 * np.eye(3), rtol=4e-16, atol=0)
    np.testing.assert_array_equal(law.mean, np.zeros(3))


@pytest.mark.parametrize("name", NAMES)
def test_isotropic_sample_covariance(name):
    """Sample covariance of 2e5 tokens within 5 standard errors of sigma^2 I. The per-entry SE
    is the sample std of z_i z_j over sqrt(n), which needs E z^4 < inf: Student-t with df = 10."""
    sigma = 1.7
    law = LAWS[name].isotropic(2, sigma, **({"df": 10.0} if name == "student_t" else {}))
    z = law.sample(_rng(14, len(name)), N_MOMENTS)
    prods = z[:, :, None] * z[:, None, :]  # the true mean is 0
    se = prods.std(axis=0) / np.sqrt(N_MOMENTS)
    # Rademacher's diagonal is sigma^2 in every draw (se = 0): allow the rounding of a sum of n
    # terms, at most n eps relative (measured 4e-12)
    rounding = N_MOMENTS * np.finfo(float).eps * sigma**2
    assert np.all(np.abs(prods.mean(axis=0) - sigma**2 * np.eye(2)) <= 5 * se + rounding)


def test_isotropic_is_the_c1_construction_bit_for_bit():
    """isotropic(D, sigma) builds exactly the laws that experiment C1 builds by hand."""
    d, sigma, df = 3, 0.7, 4.5
    by_hand = {"gaussian": Gaussian(cov=sigma**2, D=d), "rademacher": Rademacher(sigma, D=d),
               "uniform": Uniform(sigma, D=d), "student_t": StudentT(df, sigma * np.sqrt((df - 2) / df), D=d)}
    for name, law in by_hand.items():
        iso = LAWS[name].isotropic(d, sigma, **({"df": df} if name == "student_t" else {}))
        np.testing.assert_array_equal(iso.cov, law.cov)
        np.testing.assert_array_equal(iso.sample(_rng(15), (4, 5)), law.sample(_rng(15), (4, 5)))
    assert StudentT.isotropic(2).df == 3.0


@pytest.mark.parametrize(
    "build, match",
    [
        (lambda: StudentT.isotropic(2, 1.0, df=2.0), "df must be a scalar > 2"),
        (lambda: Gaussian.isotropic(2, -1.0), "sigma must be a scalar >= 0"),
        (lambda: Uniform.isotropic(2, [1.0, 2.0]), "sigma must be a scalar >= 0"),
        (lambda: Rademacher.isotropic(2, np.nan), "sigma must be finite"),
    ],
)
def test_isotropic_validation(build, match):
    with pytest.raises(ValueError, match=match):
        build()
