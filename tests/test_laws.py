"""Token laws: the Law interface and its registry, samplers, moments, isotropic members, validation,
vectorisation, the Langevin function, limits, and the Gaussian mixture."""
from decimal import Decimal, localcontext

import numpy as np
import pytest

from sfxlin import laws
from sfxlin.laws import (LAWS, Empirical, FloatOverflowError, Gaussian, GaussianAR1, GaussianMixture, Law, NoLimitError,
                         Rademacher, StudentT, Uniform, langevin, law_from_name)

SQRT3 = np.sqrt(3.0)
N_MOMENTS = 200_000
NAMES = ["gaussian", "rademacher", "uniform", "student_t", "gaussian_mixture", "empirical", "ar1"]
WITH_LIMIT = [name for name in NAMES if name != "student_t"]
ISOTROPIC = [name for name in NAMES if name != "empirical"]  # an empirical law is given by its samples


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
        "gaussian_mixture": _mixture(rng, 3, D),
        "empirical": Empirical(rng.standard_exponential((300, D)) @ A.T),  # skewed, 300 atoms
        "ar1": GaussianAR1(0.6, cov=A @ A.T + 0.1 * np.eye(D)),  # tokens dependent along the prompt axis
    }


def _stationary_tokens(law, rng, n, **kwargs):
    """``n`` tokens of the law's stationary law: one call ``sample(rng, n)`` for i.i.d. laws, ``n``
    independent one-token prompts ``(n, 1)`` for a dependent law (``iid`` False), whose ``sample(rng,
    n)`` is one sequence (its moments: tests/test_ar1.py)."""
    return law.sample(rng, n) if law.iid else law.sample(rng, (n, 1)).reshape(n, law.D)


def _mixture(rng, K, D):
    """Random K-component mixture on R^D: weights in [0.2, 1] normalised, standard normal means,
    covariances of order 1, the second one of rank 1 (singular for D >= 2)."""
    w = rng.uniform(0.2, 1.0, K)
    A = rng.standard_normal((K, D, D)) / np.sqrt(D)
    covs = A @ A.transpose(0, 2, 1) + 0.1 * np.eye(D)
    if K > 1:
        v = rng.standard_normal(D)
        covs[1] = np.outer(v, v) / D
    return GaussianMixture(w / w.sum(), rng.standard_normal((K, D)), covs)


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
    z = _stationary_tokens(law, _rng(D, 4, len(name)), N_MOMENTS)
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


@pytest.mark.parametrize("mean, cov", [(np.zeros(3), 1.0), ([0.5, -1.0, 2.0], [4.0, 1.0, 0.25]),
                                       ([0.5, -1.0, 2.0], [[2.0, 0.3, 0.0], [0.3, 1.0, -0.2], [0.0, -0.2, 0.5]])],
                         ids=["unit", "diagonal", "full"])
def test_gaussian_sample_is_mean_plus_scaled_standard_normals(mean, cov):
    """The draws are ``mean + g * std`` (diagonal cov) or ``mean + g @ root.T`` (full), ``g`` the
    generator's standard normals: the same operations, so bit for bit (in place or not)."""
    law = Gaussian(mean=mean, cov=cov, D=3)
    g = _rng(8).standard_normal((5, 7, 3))
    S = np.asarray(law.cov)
    if np.array_equal(S, np.diag(np.diag(S))):
        want = law.mean + g * np.sqrt(np.diag(S))
    else:
        lam, V = np.linalg.eigh(0.5 * (S + S.T))
        want = law.mean + g @ (V * np.sqrt(lam)).T
    np.testing.assert_array_equal(law.sample(_rng(8), (5, 7)), want)


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
    assert set(laws.__all__) >= {"Law", "LAWS", "GaussianMixture", "FloatOverflowError"}


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
    kwargs = {"gaussian_mixture": dict(weights=[0.25, 0.75], means=np.zeros((2, 3)), covs=[1.0, 2.0]),
              "empirical": dict(samples=np.arange(12.0).reshape(4, 3))}.get(name, {})
    law = law_from_name(name, 3, **kwargs)
    assert type(law) is LAWS[name] and law.D == 3 and law.name == name
    assert law.mean.shape == (3,) and law.cov.shape == (3, 3)


def test_law_from_name_unknown_name_lists_the_known_ones():
    with pytest.raises(ValueError, match="unknown law name 'cauchy'") as info:
        law_from_name("cauchy", 2)
    assert all(repr(name) in str(info.value) for name in NAMES)


def test_law_from_name_checks_D_against_the_mixture():
    with pytest.raises(ValueError, match="D = 3 does not match means"):
        law_from_name("gaussian_mixture", 3, weights=[1.0], means=np.zeros((1, 2)), covs=[1.0])


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
    # dependent tokens: the long-run covariance, sum_h Cov(z_0, z_h) (AR(1): (1 + rho) / (1 - rho) cov)
    long_run = 1.0 if law.iid else (1 + law.rho) / (1 - law.rho)
    np.testing.assert_allclose(law.snis_covariance(np.zeros(3)), long_run * law.cov, rtol=0, atol=1e-14)


def test_student_t_mean_needs_df_above_one():
    np.testing.assert_array_equal(StudentT(df=1.5, D=2).mean, np.zeros(2))
    with pytest.raises(ValueError, match="has no mean"):
        StudentT(df=1.0, D=2).mean


# --------------------------------------------------------------------------------------------
# isotropic members: covariance sigma^2 I
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("sigma", [0.5, 1.0, 3.0])
@pytest.mark.parametrize("name", ISOTROPIC)
def test_isotropic_covariance_is_sigma_squared_identity(name, sigma):
    law = LAWS[name].isotropic(3, sigma)
    assert type(law) is LAWS[name] and law.D == 3
    # the covariances are sigma^2 times exact 0/1 entries, up to one rounding of products
    np.testing.assert_allclose(law.cov, sigma**2 * np.eye(3), rtol=4e-16, atol=0)
    np.testing.assert_array_equal(law.mean, np.zeros(3))


@pytest.mark.parametrize("name", ISOTROPIC)
def test_isotropic_sample_covariance(name):
    """Sample covariance of 2e5 tokens within 5 standard errors of sigma^2 I. The per-entry SE
    is the sample std of z_i z_j over sqrt(n), which needs E z^4 < inf: Student-t with df = 10."""
    sigma = 1.7
    law = LAWS[name].isotropic(2, sigma, **({"df": 10.0} if name == "student_t" else {}))
    z = _stationary_tokens(law, _rng(14, len(name)), N_MOMENTS)
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


def test_isotropic_mixture_is_a_scale_mixture_with_a_nonlinear_limit():
    """0.5 N(0, (1 - s) sigma^2 I) + 0.5 N(0, (1 + s) sigma^2 I): slope sigma^2 at a = 0, then
    growing towards (1 + s) sigma^2 along a."""
    law = GaussianMixture.isotropic(2, 2.0, spread=0.5)
    np.testing.assert_array_equal(law.covs, [2.0 * np.eye(2), 6.0 * np.eye(2)])
    u = np.array([0.6, 0.8])
    slopes = [law.tilted_mean(t * u) @ u / t for t in (1e-6, 0.5, 1.0, 50.0)]
    assert slopes[0] == pytest.approx(4.0, rel=1e-10)
    assert np.all(np.diff(slopes) > 0) and slopes[-1] == pytest.approx(6.0, rel=1e-12)
    np.testing.assert_array_equal(GaussianMixture.isotropic(2, 2.0, spread=0.0).cov, 4.0 * np.eye(2))


@pytest.mark.parametrize(
    "build, match",
    [
        (lambda: StudentT.isotropic(2, 1.0, df=2.0), "df must be a scalar > 2"),
        (lambda: GaussianMixture.isotropic(2, 1.0, spread=1.0), r"spread must be a scalar in \[0, 1\)"),
        (lambda: GaussianMixture.isotropic(2, 1.0, spread=-0.1), "spread"),
        (lambda: Gaussian.isotropic(2, -1.0), "sigma must be a scalar >= 0"),
        (lambda: Uniform.isotropic(2, [1.0, 2.0]), "sigma must be a scalar >= 0"),
        (lambda: Rademacher.isotropic(2, np.nan), "sigma must be finite"),
        (lambda: GaussianMixture.isotropic(0, 1.0), "D must be an integer >= 1"),
    ],
)
def test_isotropic_validation(build, match):
    with pytest.raises(ValueError, match=match):
        build()


# --------------------------------------------------------------------------------------------
# GaussianMixture
# --------------------------------------------------------------------------------------------
def test_mixture_of_one_component_is_the_gaussian():
    """K = 1: r_1 = 1 exactly, so tilted_mean is mean + cov a computed by the same product
    (identical bits); the SNIS constant goes through log space (exp(2 a.m + 2 q - 2 (a.m + q/2)),
    q = a^T S a), so it agrees to the rounding of the exponent, ~eps * (|a.m| + q) relative."""
    rng = _rng(20)
    A = rng.standard_normal((3, 3))
    mean, cov = rng.standard_normal(3), A @ A.T / 3
    gauss, mix = Gaussian(mean, cov), GaussianMixture([1.0], mean[None], cov[None])
    a = rng.standard_normal((50, 3))
    np.testing.assert_array_equal(mix.tilted_mean(a), gauss.tilted_mean(a))
    np.testing.assert_array_equal(mix.mean, gauss.mean)
    np.testing.assert_array_equal(mix.cov, gauss.cov)
    np.testing.assert_allclose(mix.snis_covariance(a), gauss.snis_covariance(a), rtol=1e-13, atol=1e-14)


def test_mixture_accepts_diagonal_and_scalar_covs():
    means = np.array([[0.0, 1.0], [2.0, -1.0]])
    full = GaussianMixture([0.5, 0.5], means, [np.diag([1.0, 2.0]), 3.0 * np.eye(2)])
    np.testing.assert_array_equal(GaussianMixture([0.5, 0.5], means, [[1.0, 2.0], [3.0, 3.0]]).covs, full.covs)
    np.testing.assert_array_equal(GaussianMixture([0.5, 0.5], means, [2.0, 3.0]).covs, [2.0 * np.eye(2), full.covs[1]])


def test_mixture_moments_closed_form():
    """mean = sum pi m, cov = sum pi (S + m m^T) - mean mean^T, on a hand example."""
    law = GaussianMixture([0.25, 0.75], [[2.0, 0.0], [-2.0, 4.0]], [[1.0, 2.0], [3.0, 0.5]])
    np.testing.assert_allclose(law.mean, [-1.0, 3.0], rtol=1e-15)
    second = 0.25 * (np.diag([1.0, 2.0]) + np.outer([2.0, 0.0], [2.0, 0.0])) \
        + 0.75 * (np.diag([3.0, 0.5]) + np.outer([-2.0, 4.0], [-2.0, 4.0]))
    np.testing.assert_allclose(law.cov, second - np.outer(law.mean, law.mean), rtol=1e-15, atol=1e-15)


def test_mixture_sample_draw_order():
    """One uniform per token picks the component (searchsorted on the cumulative weights), then
    the standard normals: the generator ends in the state of exactly these two draws."""
    w = np.array([0.2, 0.5, 0.3])
    means = np.array([[-100.0, 0.0], [0.0, 100.0], [100.0, 0.0]])  # far apart: the component is legible
    law = GaussianMixture(w, means, [1e-2, 1e-2, 1e-2])
    z = law.sample(_rng(21), (40, 3))
    ref = _rng(21)
    k = np.searchsorted(np.cumsum(w), ref.random((40, 3)), side="right")
    g = ref.standard_normal((40, 3, 2))
    assert np.array_equal(np.argmin(np.linalg.norm(z[..., None, :] - means, axis=-1), axis=-1), k)
    np.testing.assert_allclose(z, means[k] + 0.1 * g, rtol=0, atol=1e-13)  # diagonal root: sqrt(1e-2)
    rng = _rng(21)
    law.sample(rng, (40, 3))
    assert rng.random() == ref.random()


def test_mixture_tilted_mean_large_logits_is_the_dominant_component():
    """|a| = 50: the logits log pi_k + a.m_k + a^T S_k a / 2 are of order 1e3 (exp overflows at
    709) and the top two differ by more than 40 here, so the posterior sits on one component to
    within e^{-40} ~ 4e-18: the result is that component's tilted mean m_k + S_k a to rounding
    (~eps |S_k a| ~ 1e-14)."""
    rng = _rng(22)
    law = _mixture(rng, 3, 3)
    a = 50.0 * rng.standard_normal((20, 3)) / np.sqrt(3)
    logits = np.log(law.weights) + a @ law.means.T + 0.5 * np.einsum("bi,kij,bj->bk", a, law.covs, a)
    top2 = np.sort(logits, axis=1)[:, -2:]
    assert logits.max() > 709 and np.all(top2[:, 1] - top2[:, 0] > 40)
    k = np.argmax(logits, axis=1)
    expected = law.means[k] + np.einsum("bij,bj->bi", law.covs[k], a)
    np.testing.assert_allclose(law.tilted_mean(a), expected, rtol=1e-13, atol=1e-12)


def test_mixture_overflow_raises():
    law = GaussianMixture([0.5, 0.5], [[0.0], [1.0]], [1.0, 2.0])
    with pytest.raises(FloatOverflowError, match="tilted_mean overflows"):
        law.tilted_mean([1e200])
    with pytest.raises(FloatOverflowError, match="snis_covariance overflows"):
        law.snis_covariance([30.0])  # E w^2 / (E w)^2 ~ exp(a^T S a) = exp(1800)
    assert np.isfinite(law.snis_covariance([10.0])).all()


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(weights=[0.5, 0.6], means=np.zeros((2, 2)), covs=[1.0, 1.0]), "weights must sum to 1"),
        (dict(weights=[0.5, 0.5 + 2e-9], means=np.zeros((2, 2)), covs=[1.0, 1.0]), "weights must sum to 1"),
        (dict(weights=[1.5, -0.5], means=np.zeros((2, 2)), covs=[1.0, 1.0]), "weights must be positive"),
        (dict(weights=[1.0, 0.0], means=np.zeros((2, 2)), covs=[1.0, 1.0]), "weights must be positive"),
        (dict(weights=[[1.0]], means=np.zeros((1, 2)), covs=[1.0]), "weights must be a non-empty vector"),
        (dict(weights=[], means=np.zeros((0, 2)), covs=[]), "weights must be a non-empty vector"),
        (dict(weights=[np.nan, 1.0], means=np.zeros((2, 2)), covs=[1.0, 1.0]), "weights must be finite"),
        (dict(weights=[0.5, 0.5], means=np.zeros((3, 2)), covs=[1.0, 1.0]), r"means must have shape \(K, D\) with K = 2"),
        (dict(weights=[0.5, 0.5], means=np.zeros(2), covs=[1.0, 1.0]), "means must have shape"),
        (dict(weights=[0.5, 0.5], means=np.zeros((2, 2)), covs=np.ones((2, 3))), "covs must have shape"),
        (dict(weights=[0.5, 0.5], means=np.zeros((2, 2)), covs=np.ones((3,))), "covs must have shape"),
        (dict(weights=[0.5, 0.5], means=np.zeros((2, 2)), covs=np.eye(2)[None]), "covs must have shape"),
        (dict(weights=[0.5, 0.5], means=np.zeros((2, 2)), covs=[np.eye(2), [[1.0, 2.0], [2.0, 1.0]]]),
         r"covs\[1\] must be positive semi-definite"),
        (dict(weights=[0.5, 0.5], means=np.zeros((2, 2)), covs=[-1.0, 1.0]), r"covs\[0\] must be positive semi-definite"),
        (dict(weights=[0.5, 0.5], means=np.zeros((2, 2)), covs=[np.eye(2), [[1.0, 0.5], [0.0, 1.0]]]),
         r"covs\[1\] must be symmetric"),
        (dict(weights=[0.5, 0.5], means=np.zeros((2, 2)), covs=[1.0, 1.0], D=3), "D = 3 does not match"),
    ],
)
def test_mixture_validation_errors_name_the_argument(kwargs, match):
    with pytest.raises(ValueError, match=match):
        GaussianMixture(**kwargs)


def test_mixture_weights_within_tolerance_are_normalised():
    law = GaussianMixture([0.5, 0.5 + 5e-10], np.zeros((2, 1)), [1.0, 2.0])
    assert law.weights.sum() == pytest.approx(1.0, abs=1e-15)
