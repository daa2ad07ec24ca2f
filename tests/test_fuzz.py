"""Property-based fuzzing of the public numerical API (hypothesis).

Every call on random shapes, dtypes (float64, float32, int, bool, object, nested lists, strings)
and scales (logits from 1e-8 to 1e6 and beyond, tiny and huge covariances) must either

* return the right answer, checked against a naive reference written here (python loops with
  ``math.fsum`` / ``math.exp`` after max-subtraction, ``decimal`` at 50 digits, closed forms,
  ``np.polyfit``, central finite differences), or
* raise ``ValueError`` / ``TypeError`` whose message names the offending argument.

It never returns NaN or inf from finite inputs (in particular for Gaussian tokens, whatever the
logit scale). The profile is derandomised and database-less, so CI runs the same examples every
time; ``pytest --hypothesis-show-statistics`` reports how many ran.
"""
from __future__ import annotations

import math
import re
import warnings
from decimal import Decimal, localcontext

import numpy as np
import pytest
import xarray as xr
from hypothesis import HealthCheck, assume, given, note, settings
from hypothesis import strategies as st

from sfxlin import icl, laws
from sfxlin.analysis.fits import loglog_slope
from sfxlin.analysis.threshold import threshold_regression
from sfxlin.attention import (asymptotic_mse, check_prompt_lengths, limit_attention, linear_attention,
                              softmax_attention, softmax_attention_prefix)
from sfxlin.laws import FloatOverflowError, Gaussian, NoLimitError, Rademacher, StudentT, Uniform
from sfxlin.quadrature import gaussian_tilted_mean_quadrature

settings.register_profile(
    "sfxlin-fuzz",
    derandomize=True,  # the same examples on every run: reproducible CI
    database=None,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large],
)
FUZZ = settings.get_profile("sfxlin-fuzz")


def fuzz(n):
    """The module's profile with ``n`` examples (not loaded globally: other modules keep theirs)."""
    return settings(FUZZ, max_examples=n)


EPS = np.finfo(float).eps
seeds = st.integers(0, 2**32 - 1)
KINDS = ("float64", "float32", "int64", "bool", "object", "list")
kinds = st.sampled_from(KINDS)
ERRORS = (ValueError, TypeError)


def user_form(arr, kind):
    """``arr`` as a user might pass it: another dtype, an object array or nested lists."""
    arr = np.asarray(arr, dtype=float)
    if kind == "float32":
        with np.errstate(over="ignore", under="ignore"):
            return arr.astype(np.float32)
    if kind == "int64":
        return np.rint(np.clip(arr, -(2.0**52), 2.0**52)).astype(np.int64)
    if kind == "bool":
        return arr > 0
    if kind == "object":
        return arr.astype(object)
    if kind == "list":
        return arr.tolist()
    return arr


def as_float(x):
    with np.errstate(over="ignore"):
        return np.asarray(x, dtype=float)


def assert_names(exc, *names):
    """The error message names (one of) the offending argument(s), as a whole word."""
    msg = str(exc)
    assert any(re.search(rf"(?<![A-Za-z_]){re.escape(n)}(?![A-Za-z_])", msg) for n in names), (
        f"{type(exc).__name__} does not name {names}: {msg!r}")


def all_finite(*arrays):
    return all(np.all(np.isfinite(np.asarray(a, dtype=float))) for a in arrays)


# ============================================================================================
# attention: naive references
# ============================================================================================
def ref_attention(Z, U, V, q, kind="softmax"):
    """Python-loop reference. Softmax: ``math.exp`` after max-subtraction. Returns the output and
    a bound on its rounding error (from the logits' magnitude and the tokens' range)."""
    Z, U, V, q = (np.asarray(x, dtype=float) for x in (Z, U, V, q))
    L, D = Z.shape[-2:]
    batch = np.broadcast_shapes(Z.shape[:-2], q.shape[:-1])
    Zb = np.broadcast_to(Z, batch + (L, D))
    qb = np.broadcast_to(q, batch + (D,))
    out = np.empty(batch + (V.shape[0],))
    tol = np.empty(batch + (V.shape[0],))
    vabs = np.abs(V).sum(axis=1)
    for idx in np.ndindex(*batch):
        z, qq = Zb[idx], qb[idx]
        a = [math.fsum(U[i, j] * qq[j] for j in range(D)) for i in range(D)]
        a_mag = [math.fsum(abs(U[i, j] * qq[j]) for j in range(D)) for i in range(D)]
        s = [math.fsum(z[k, i] * a[i] for i in range(D)) for k in range(L)]
        s_mag = max(math.fsum(abs(z[k, i]) * a_mag[i] for i in range(D)) for k in range(L))
        zmax = float(np.abs(z).max())
        if kind == "softmax":
            m = max(s)
            w = [math.exp(sk - m) for sk in s]
            tot = math.fsum(w)
            mean = [math.fsum(w[k] * z[k, i] for k in range(L)) / tot for i in range(D)]
            err = zmax * (16 * D * EPS * s_mag + 16 * (L + D) * EPS)
        else:  # linear: (1/L) sum_k z_k (z_k . U q)
            mean = [math.fsum(z[k, i] * s[k] for k in range(L)) / L for i in range(D)]
            err = zmax * s_mag * 16 * (L + 2 * D) * EPS
        out[idx] = [math.fsum(V[o, i] * mean[i] for i in range(D)) for o in range(V.shape[0])]
        tol[idx] = vabs * err + 1e-300
    return out, tol


@st.composite
def attention_problem(draw, max_L=12, log_logit=(-8.0, 6.0)):
    """Tokens, U, V, q at a target logit scale ``|z^T U q| ~ 10**log_logit``."""
    rng = np.random.default_rng(draw(seeds))
    batch = tuple(draw(st.lists(st.integers(1, 3), max_size=2)))
    L, D, D_out = draw(st.integers(1, max_L)), draw(st.integers(1, 4)), draw(st.integers(1, 3))
    tok = 10.0 ** draw(st.floats(-50, 50))
    qs = 10.0 ** draw(st.floats(-50, 50))
    logit = 10.0 ** draw(st.floats(*log_logit))
    q_batch = batch if draw(st.booleans()) else ()  # q may broadcast against Z's leading axes
    Z = rng.standard_normal(batch + (L, D)) * tok
    q = rng.standard_normal(q_batch + (D,)) * qs
    U = rng.standard_normal((D, D)) * (logit / (tok * qs * D))
    V = rng.standard_normal((D_out, D)) * 10.0 ** draw(st.floats(-3, 3))
    return Z, U, V, q


# ============================================================================================
# attention: correct results for every dtype and scale
# ============================================================================================
@fuzz(250)
@given(problem=attention_problem(), forms=st.tuples(kinds, kinds, kinds, kinds))
def test_softmax_attention_matches_a_naive_loop(problem, forms):
    args = dict(zip("ZUVq", (user_form(x, k) for x, k in zip(problem, forms))))
    note(f"dtypes {forms}")
    bad = [name for name, x in args.items() if not all_finite(as_float(x))]
    if bad:  # float32 overflow of a huge input: inf must be refused, naming it
        with pytest.raises(ValueError) as info:
            softmax_attention(**args)
        assert_names(info.value, *bad)
        return
    got = softmax_attention(**args)
    ref, tol = ref_attention(*(as_float(args[n]) for n in "ZUVq"))
    assert got.shape == ref.shape and got.dtype == np.float64
    assert np.all(np.isfinite(got))
    assert np.all(np.abs(got - ref) <= tol), np.max(np.abs(got - ref) / tol)


@fuzz(200)
@given(problem=attention_problem(max_L=16), data=st.data())
def test_prefix_matches_the_per_L_loop_and_the_naive_loop(problem, data):
    Z, U, V, q = problem
    L_max = Z.shape[-2]
    Ls = sorted(data.draw(st.sets(st.integers(1, L_max), min_size=1, max_size=L_max)))
    Ls_form = data.draw(st.sampled_from(["list", "int32", "float", "tuple"]))
    Ls_arg = {"list": Ls, "int32": np.array(Ls, np.int32), "float": [float(L) for L in Ls], "tuple": tuple(Ls)}[Ls_form]
    got = softmax_attention_prefix(Z, U, V, q, Ls_arg)
    assert got.shape == np.broadcast_shapes(Z.shape[:-2], q.shape[:-1]) + (len(Ls), V.shape[0])
    assert np.all(np.isfinite(got))
    for j, L in enumerate(Ls):
        ref, tol = ref_attention(Z[..., :L, :], U, V, q)
        loop = softmax_attention(Z[..., :L, :], U, V, q)
        assert np.all(np.abs(got[..., j, :] - ref) <= tol), (L, np.max(np.abs(got[..., j, :] - ref) / tol))
        assert np.all(np.abs(got[..., j, :] - loop) <= 2 * tol), L


@fuzz(150)
@given(problem=attention_problem(), forms=st.tuples(kinds, kinds, kinds, kinds))
def test_linear_attention_matches_the_explicit_formula(problem, forms):
    args = dict(zip("ZUVq", (user_form(x, k) for x, k in zip(problem, forms))))
    bad = [name for name, x in args.items() if not all_finite(as_float(x))]
    if bad:
        with pytest.raises(ValueError) as info:
            linear_attention(**args)
        assert_names(info.value, *bad)
        return
    got = linear_attention(**args)
    ref, tol = ref_attention(*(as_float(args[n]) for n in "ZUVq"), kind="linear")
    assert got.shape == ref.shape and np.all(np.isfinite(got))
    assert np.all(np.abs(got - ref) <= tol), np.max(np.abs(got - ref) / tol)


# ============================================================================================
# attention: bad input is refused, naming the argument
# ============================================================================================
CORRUPTIONS = ("text", "none", "nan", "inf", "ragged", "shape")


def corrupt(x, how, rng):
    x = np.array(x, dtype=float)
    if how == "text":
        return np.full(x.shape, "abc")
    if how == "none":
        y = x.astype(object)
        y.flat[0] = None
        return y
    if how in ("nan", "inf"):
        x.flat[0] = np.nan if how == "nan" else -np.inf
        return x
    if how == "ragged":
        rows = x.reshape(-1, x.shape[-1]).tolist()
        return [rows[0] + [1.0]] + rows[1:] if len(rows) > 1 else [rows[0], rows[0] + [1.0]]
    return x[..., :-1] if x.shape[-1] > 1 else np.concatenate([x, x], axis=-1)  # "shape"


@fuzz(200)
@given(problem=attention_problem(log_logit=(-2, 2)), which=st.sampled_from("ZUVq"),
       how=st.sampled_from(CORRUPTIONS), func=st.sampled_from(["softmax", "prefix", "linear"]))
def test_attention_refuses_bad_input_naming_it(problem, which, how, func):
    args = dict(zip("ZUVq", problem))
    if how == "shape" and which == "V":
        args["V"] = args["V"][:, :-1] if args["V"].shape[1] > 1 else np.concatenate([args["V"]] * 2, axis=1)
    else:
        args[which] = corrupt(args[which], how, np.random.default_rng(0))
    call = {"softmax": lambda: softmax_attention(**args), "linear": lambda: linear_attention(**args),
            "prefix": lambda: softmax_attention_prefix(**args, Ls=[np.shape(problem[0])[-2]])}[func]
    with pytest.raises(ERRORS) as info:
        call()
    names = [which] + (["Z", "U", "V", "q"] if how == "shape" else [])  # a shape mismatch names either side
    assert_names(info.value, *names)


@fuzz(80)
@given(Ls=st.one_of(
    st.lists(st.sampled_from([0, -1, 2.5, np.nan, np.inf, -np.inf, 1e30, "a", None, 3]), min_size=1, max_size=4),
    st.lists(st.integers(1, 9), min_size=2, max_size=4).filter(lambda v: any(b <= a for a, b in zip(v, v[1:]))),
    st.just([]), st.just([[1, 2]])))
def test_check_prompt_lengths_refuses_bad_lengths(Ls):
    try:
        out = check_prompt_lengths(Ls, 8)
    except ERRORS as exc:
        assert_names(exc, "Ls", "prompt lengths")
        return
    # accepted: then it really is a valid list of lengths
    assert out.dtype == np.int64 and np.all(out >= 1) and np.all(np.diff(out) > 0) and out[-1] <= 8
    assert np.array_equal(out, np.asarray(Ls, dtype=float))


# ============================================================================================
# Gaussian tokens: never NaN or inf, whatever the logit scale
# ============================================================================================
@st.composite
def gaussian_law(draw, log_var=(-200.0, 200.0), D=None):
    rng = np.random.default_rng(draw(seeds))
    D = D if D is not None else draw(st.integers(1, 4))
    var = 10.0 ** draw(st.floats(*log_var))
    form = draw(st.sampled_from(["scalar", "vector", "matrix", "singular"]))
    if form == "scalar":
        cov = var
    elif form == "vector":
        cov = var * rng.uniform(0.0, 1.0, D)
    else:
        r = D if form == "matrix" else draw(st.integers(0, D - 1))
        A = rng.standard_normal((D, r))
        cov = var * (A @ A.T) / max(r, 1)
    mean = None if draw(st.booleans()) else rng.standard_normal(D) * math.sqrt(var)
    return Gaussian(mean=mean, cov=cov, D=D)


def _finite_or_overflow(call):
    """``call()`` is finite, or it raises FloatOverflowError (a ValueError) naming an argument."""
    try:
        out = call()
    except FloatOverflowError as exc:
        assert_names(exc, "Z", "U", "V", "q", "a", "cov")
        return None
    assert np.all(np.isfinite(out)), out
    return out


@fuzz(300)
@given(law=gaussian_law(), seed=seeds, log_U=st.floats(-8, 300), L=st.integers(1, 20), n_q=st.integers(1, 3))
def test_gaussian_tokens_never_give_nan_or_inf(law, seed, log_U, L, n_q):
    rng = np.random.default_rng(seed)
    D = law.D
    Z = law.sample(rng, (n_q, L))
    q = law.sample(rng, (n_q,))
    U = rng.standard_normal((D, D)) * 10.0**log_U
    V = rng.standard_normal((2, D))
    assert np.all(np.isfinite(Z)) and np.all(np.isfinite(q))
    # the logits are representable: then no error at all is allowed
    with np.errstate(over="ignore"):
        s_bound = np.abs(Z).max() * np.abs(U).max() * np.abs(q).max() * D * D
        a_bound = np.abs(U).max() * np.abs(q).max() * D * np.abs(law.cov).max() * D + np.abs(law.mean).max()
    outs = [_finite_or_overflow(lambda: softmax_attention(Z, U, V, q)),
            _finite_or_overflow(lambda: softmax_attention_prefix(Z, U, V, q, [1, L] if L > 1 else [1]))]
    if s_bound < 1e300:
        assert all(o is not None for o in outs)
    limit = _finite_or_overflow(lambda: limit_attention(law, U, V, q))
    if a_bound < 1e300:
        assert limit is not None
        ref = law.mean + (q @ U.T) @ law.cov
        np.testing.assert_allclose(limit, ref @ V.T, rtol=1e-12,
                                   atol=1e-12 * (np.abs(ref).max() * np.abs(V).max() * D + 1e-300))


# ============================================================================================
# laws
# ============================================================================================
@st.composite
def any_law(draw, log_scale=(-150.0, 150.0)):
    kind = draw(st.sampled_from(["gaussian", "rademacher", "uniform", "student_t"]))
    if kind == "gaussian":
        return draw(gaussian_law(log_var=(2 * log_scale[0], 2 * log_scale[1])))
    rng = np.random.default_rng(draw(seeds))
    D = draw(st.integers(1, 4))
    s = 10.0 ** draw(st.floats(*log_scale))
    form = draw(st.sampled_from(["scalar", "vector", "matrix"]))
    scale = {"scalar": s, "vector": s * rng.uniform(-1, 1, D), "matrix": s * rng.standard_normal((D, D))}[form]
    D_arg = D if form == "scalar" or draw(st.booleans()) else None
    if kind == "student_t":
        return StudentT(df=10.0 ** draw(st.floats(-1, 2)), scale=scale, D=D_arg)
    return (Rademacher if kind == "rademacher" else Uniform)(scale=scale, D=D_arg)


@fuzz(200)
@given(law=any_law(), seed=seeds, shape=st.one_of(st.integers(0, 5), st.lists(st.integers(0, 4), max_size=3)))
def test_law_samples_have_the_requested_shape_and_support(law, seed, shape):
    z = law.sample(np.random.default_rng(seed), shape if isinstance(shape, int) else tuple(shape))
    expected = ((shape,) if isinstance(shape, int) else tuple(shape)) + (law.D,)
    assert z.shape == expected and z.dtype == np.float64
    assert np.all(np.isfinite(z))
    if isinstance(law, Rademacher | Uniform):
        r = z @ np.linalg.pinv(law.S).T  # back to the unit coordinates, where S is invertible
        if np.linalg.cond(law.S) < 1e6 and z.size:
            bound = 1.0 if isinstance(law, Rademacher) else math.sqrt(3.0)
            assert np.all(np.abs(r) <= bound * (1 + 1e-6))
            if isinstance(law, Rademacher):
                np.testing.assert_allclose(np.abs(r), 1.0, rtol=1e-6)
    if isinstance(law, Gaussian) and z.size:
        # samples stay in mean + range(cov)
        lam, Q = np.linalg.eigh(law.cov)
        null = Q[:, lam <= law.D * EPS * max(lam.max(), 0.0)]
        if null.size:
            assert np.all(np.abs((z - law.mean) @ null) <= 1e-6 * (math.sqrt(max(lam.max(), 0.0)) + 1e-300)
                          + 1e-9 * np.abs(law.mean).max())


@fuzz(80)
@given(seed=seeds, D=st.integers(1, 4), form=kinds, kind=st.sampled_from(["gaussian", "rademacher", "uniform"]))
def test_law_parameters_of_any_numeric_dtype(seed, D, form, kind):
    """float32, int, bool, object and list parameters build the same law as their float64 values."""
    rng = np.random.default_rng(seed)
    if kind == "gaussian":
        A = rng.standard_normal((D, D))
        base = np.rint(A @ A.T + D * np.eye(D))  # integer-valued, strictly PD: exact in every dtype
        if form == "bool":
            base = np.eye(D)
        law = Gaussian(cov=user_form(base, form))
        np.testing.assert_array_equal(law.cov, as_float(user_form(base, form)))
    else:
        base = np.rint(rng.uniform(-3, 3, D)) + 0.0
        cls = Rademacher if kind == "rademacher" else Uniform
        law = cls(scale=user_form(base, form))
        np.testing.assert_array_equal(law.S, np.diag(as_float(user_form(base, form))))
    z = law.sample(np.random.default_rng(seed), (3,))
    assert z.shape == (3, D) and z.dtype == np.float64


BAD_LAW_ARGS = [
    (lambda: Gaussian(cov="abc", D=2), "cov"),
    (lambda: Gaussian(cov=[[1.0, None], [None, 1.0]]), "cov"),
    (lambda: Gaussian(cov=[[1.0, 2.0], [0.0, 1.0]]), "cov"),
    (lambda: Gaussian(cov=[[1.0, 0.0], [0.0, -1.0]]), "cov"),
    (lambda: Gaussian(cov=np.ones((2, 3))), "cov"),
    (lambda: Gaussian(cov=[1.0, np.inf]), "cov"),
    (lambda: Gaussian(mean=[0.0, np.nan]), "mean"),
    (lambda: Gaussian(mean=["a", "b"]), "mean"),
    (lambda: Gaussian(mean=np.zeros(2), cov=np.eye(3)), "cov"),
    (lambda: Gaussian(mean=np.zeros(2), D=3), "D"),
    (lambda: Gaussian(D=0), "D"),
    (lambda: Gaussian(D=-1), "D"),
    (lambda: Gaussian(D=2.0), "D"),
    (lambda: Gaussian(D=True), "D"),
    (lambda: Gaussian(D="2"), "D"),
    (lambda: Rademacher(scale=[[1.0, 2.0], [3.0]]), "scale"),
    (lambda: Rademacher(scale="x", D=2), "scale"),
    (lambda: Rademacher(scale=1.0, D=0), "D"),
    (lambda: Uniform(scale=np.ones(3), D=2), "scale"),
    (lambda: Uniform(scale=np.ones((2, 3))), "scale"),
    (lambda: Uniform(scale=1.0, D=2.5), "D"),
    (lambda: StudentT(df=[1.0, 2.0], D=2), "df"),
    (lambda: StudentT(df=0.0, D=2), "df"),
    (lambda: StudentT(df=np.nan, D=2), "df"),
    (lambda: StudentT(df="three", D=2), "df"),
    (lambda: StudentT(df=3.0), "D"),
    (lambda: Gaussian(D=2).sample(np.random.default_rng(0), (2.0,)), "shape"),
    (lambda: Gaussian(D=2).sample(np.random.default_rng(0), (-1,)), "shape"),
    (lambda: Gaussian(D=2).sample(np.random.default_rng(0), (True,)), "shape"),
    (lambda: Gaussian(D=2).tilted_mean(np.ones(3)), "a"),
    (lambda: Gaussian(D=2).tilted_mean(["x", "y"]), "a"),
    (lambda: Gaussian(D=2).tilted_mean(np.array([None, 1.0], dtype=object)), "a"),
    (lambda: Uniform(D=2).snis_covariance([np.nan, 0.0]), "a"),
    (lambda: Rademacher(D=2).tilted_mean(1.0), "a"),
]


@pytest.mark.parametrize("call, name", BAD_LAW_ARGS, ids=[f"{i}-{n}" for i, (_, n) in enumerate(BAD_LAW_ARGS)])
def test_law_constructors_refuse_bad_arguments_naming_them(call, name):
    with pytest.raises(ERRORS) as info:
        call()
    assert_names(info.value, name)


def _dec(x):
    return Decimal(repr(float(x)))


def _uniform_parts(b):
    """Per coordinate of the unit uniform on [-sqrt3, sqrt3], at 50 digits: ``(m(b), var(b),
    rho(b) = E e^{2bu} / (E e^{bu})^2)`` with ``E e^{bu} = sinh(t) / t``, ``t = sqrt3 b``."""
    with localcontext() as ctx:
        ctx.prec = 50
        r3 = Decimal(3).sqrt()
        t = abs(_dec(b)) * r3
        sign = 1 if b >= 0 else -1
        if t < Decimal("1e-12"):
            return sign * float(r3 * t / 3), 1.0 - float(t * t / 5), 1.0 + float(t * t / 3)
        E = (-2 * t).exp()
        coth = (1 + E) / (1 - E)
        m = r3 * (coth - 1 / t)
        var = 3 * (1 / (t * t) - 4 * E / (1 - E) ** 2)  # 3 (1/t^2 - 1/sinh^2 t)
        rho = t * (1 - E * E) / (1 - E) ** 2  # sinhc(2t) / sinhc(t)^2
        return sign * float(m), float(var), float(rho)


def _rademacher_parts(b):
    with localcontext() as ctx:
        ctx.prec = 50
        x = abs(_dec(b))
        E = (-2 * x).exp()
        sign = 1 if b >= 0 else -1
        tanh = (1 - E) / (1 + E)
        sech2 = 4 * E / (1 + E) ** 2
        rho = 2 * (1 + E * E) / (1 + E) ** 2  # cosh(2b) / cosh(b)^2
        return sign * float(tanh), float(sech2), float(rho)


def ref_product_law(law, a):
    """Tilted mean and SNIS constant of ``z = S r`` from the 1-D references, coordinate by coordinate."""
    parts = _rademacher_parts if isinstance(law, Rademacher) else _uniform_parts
    S = law.S
    b = a @ S
    mean = np.array([parts(bk)[0] for bk in b])
    mean2 = np.array([parts(2 * bk)[0] for bk in b])
    var2 = np.array([parts(2 * bk)[1] for bk in b])
    rho = math.prod(parts(bk)[2] for bk in b)
    c = mean2 - mean
    return S @ mean, rho * (S @ (np.diag(var2) + np.outer(c, c)) @ S.T), rho


@fuzz(200)
@given(law=any_law(log_scale=(-3.0, 3.0)), seed=seeds, log_a=st.floats(-8, 6))
def test_tilted_mean_and_snis_constant_match_references(law, seed, log_a):
    rng = np.random.default_rng(seed)
    size = np.abs(law.cov if isinstance(law, Gaussian) else law.S).max()
    a = rng.standard_normal(law.D) * 10.0**log_a / max(size, 1e-300)
    if isinstance(law, StudentT):
        for method in (law.tilted_mean, law.snis_covariance):
            with pytest.raises(NoLimitError):
                method(a)
        return
    tm = law.tilted_mean(a)
    assert tm.shape == (law.D,) and np.all(np.isfinite(tm))
    if isinstance(law, Gaussian):
        Sa = np.array([math.fsum(law.cov[i, j] * a[j] for j in range(law.D)) for i in range(law.D)])
        np.testing.assert_allclose(tm, law.mean + Sa, rtol=1e-13,
                                   atol=1e-13 * (np.abs(law.cov).max() * np.abs(a).max() * law.D + 1e-300))
        quad = math.fsum(a * Sa)
        assume(abs(quad - 709.78) > 1.0)  # exp overflow boundary
        if quad > 709.78:
            with pytest.raises(FloatOverflowError) as info:
                law.snis_covariance(a)
            assert_names(info.value, "a")
            return
        C = law.snis_covariance(a)
        ref = math.exp(quad) * (law.cov + np.outer(Sa, Sa))
        np.testing.assert_allclose(C, ref, rtol=1e-11 * (1 + abs(quad)), atol=1e-12 * np.abs(ref).max() + 1e-300)
        return
    ref_tm, ref_C, rho = ref_product_law(law, a)
    smax = np.abs(law.S).max()
    np.testing.assert_allclose(tm, ref_tm, rtol=0, atol=1e-13 * smax * law.D)
    C = law.snis_covariance(a)
    assert C.shape == (law.D, law.D) and np.all(np.isfinite(C))
    np.testing.assert_allclose(C, ref_C, rtol=0, atol=1e-11 * rho * smax**2 * law.D)


@fuzz(150)
@given(law=any_law(log_scale=(-100.0, 100.0)), seed=seeds, log_a=st.floats(-8, 300), lead=st.integers(0, 3))
def test_tilted_mean_and_snis_constant_never_nan_at_any_scale(law, seed, log_a, lead):
    """Any scale: a finite answer or FloatOverflowError naming the argument; never inf or NaN."""
    if isinstance(law, StudentT):
        return
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((lead, law.D) if lead else (law.D,)) * 10.0**log_a
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no overflow warnings either
        tm = _finite_or_overflow(lambda: law.tilted_mean(a))
        C = _finite_or_overflow(lambda: law.snis_covariance(a))
    if tm is not None:
        assert tm.shape == a.shape
    if C is not None:
        assert C.shape == a.shape + (law.D,)
        np.testing.assert_allclose(C, np.swapaxes(C, -1, -2), rtol=1e-12, atol=1e-12 * np.abs(C).max())
    if isinstance(law, Rademacher | Uniform):
        assert tm is not None  # bounded laws: the tilted mean always exists and is representable
        with np.errstate(over="ignore", invalid="ignore"):
            moderate = not lead and np.abs(a @ law.S).max() < 1e12
        if moderate:
            ref_tm, ref_C, rho = ref_product_law(law, a)
            smax = np.abs(law.S).max()
            np.testing.assert_allclose(tm, ref_tm, rtol=0, atol=1e-13 * smax * law.D)
            if C is not None and np.isfinite(rho):
                # the 2b vs b cancellation costs |b| eps relative accuracy on the smallest entries
                np.testing.assert_allclose(C, ref_C, rtol=0, atol=1e-9 * rho * smax**2 * law.D)


@fuzz(100)
@given(law=gaussian_law(log_var=(-6, 6)), seed=seeds, log_a=st.floats(-3, 3), L=st.integers(1, 10**6))
def test_asymptotic_mse_is_the_traced_snis_constant(law, seed, log_a, L):
    rng = np.random.default_rng(seed)
    D = law.D
    q = rng.standard_normal(D)
    U = rng.standard_normal((D, D)) * 10.0**log_a / math.sqrt(max(np.abs(law.cov).max(), 1e-300))
    V = rng.standard_normal((2, D))
    a = U @ q
    Sa = law.cov @ a
    quad = float(a @ Sa)
    assume(abs(quad - 709.78) > 1.0)
    if quad > 709.78:
        with pytest.raises(FloatOverflowError):
            asymptotic_mse(law, U, V, q, L)
        return
    ref = math.exp(quad) * (np.trace(V @ law.cov @ V.T) + np.sum((V @ Sa) ** 2)) / L
    got = asymptotic_mse(law, U, V, q, L)
    assert np.isfinite(got) and got >= 0
    assert got == pytest.approx(ref, rel=1e-10 * (1 + quad), abs=1e-300)


# ============================================================================================
# quadrature
# ============================================================================================
@fuzz(60)
@given(law=gaussian_law(log_var=(-200, 200), D=None), seed=seeds, b_norm=st.floats(0, 5), n_rows=st.integers(1, 3))
def test_gaussian_quadrature_matches_the_closed_form(law, seed, b_norm, n_rows):
    assume(law.D <= 3)
    rng = np.random.default_rng(seed)
    lam_max = max(np.linalg.eigvalsh(law.cov).max(), 0.0)
    # a with sqrt(a^T cov a) <= 5, where the default 40-node rule is at rounding level
    a = rng.standard_normal((n_rows, law.D))
    a *= b_norm / np.maximum(np.sqrt(np.einsum("ri,ij,rj->r", a, law.cov, a)), 1e-300)[:, None]
    assume(np.all(np.isfinite(a)))
    got = gaussian_tilted_mean_quadrature(law.mean, law.cov, a)
    exact = law.mean + a @ law.cov
    assert got.shape == a.shape and np.all(np.isfinite(got))
    np.testing.assert_allclose(got, exact, rtol=0,
                               atol=1e-11 * math.sqrt(lam_max) * law.D + 1e-13 * np.abs(law.mean).max() + 1e-300)


@fuzz(50)
@given(law=gaussian_law(log_var=(-200, 200)), seed=seeds, log_a=st.floats(-8, 300))
def test_gaussian_quadrature_is_finite_or_refuses_at_any_scale(law, seed, log_a):
    assume(law.D <= 3)
    a = np.random.default_rng(seed).standard_normal(law.D) * 10.0**log_a
    try:
        got = gaussian_tilted_mean_quadrature(law.mean, law.cov, a, n_nodes=20)
    except ValueError as exc:
        assert_names(exc, "a")
        return
    assert np.all(np.isfinite(got))


@pytest.mark.parametrize("which", ["mean", "cov", "a", "n_nodes"])
@pytest.mark.parametrize("bad", ["text", "nan", "shape", "none"])
def test_gaussian_quadrature_refuses_bad_input_naming_it(which, bad):
    args = {"mean": np.zeros(2), "cov": np.eye(2), "a": np.ones(2), "n_nodes": 10}
    if which == "n_nodes":
        args["n_nodes"] = {"text": "ten", "nan": np.nan, "shape": [10, 10], "none": None}[bad]
    elif bad == "text":
        args[which] = np.full(np.shape(args[which]), "x")
    elif bad == "nan":
        args[which] = np.where(np.ones(np.shape(args[which]), bool), np.nan, 0.0)
    elif bad == "none":
        args[which] = np.array([None] * np.size(args[which]), dtype=object).reshape(np.shape(args[which]))
    else:
        args[which] = np.ones(3) if which != "cov" else np.eye(3)
    with pytest.raises(ERRORS) as info:
        gaussian_tilted_mean_quadrature(**args)
    assert_names(info.value, which, "mean" if which == "cov" else which)


# ============================================================================================
# analysis fits
# ============================================================================================
@st.composite
def positive_series(draw):
    rng = np.random.default_rng(draw(seeds))
    n = draw(st.integers(3, 12))
    logx = np.sort(rng.uniform(-5, 5, n) * math.log(10))
    assume(np.min(np.diff(logx)) > 1e-3)
    slope = draw(st.floats(-3, 3))
    logy = draw(st.floats(-200, 200)) * math.log(10) + slope * logx + draw(st.floats(0, 2)) * rng.standard_normal(n)
    n_seed = draw(st.integers(0, 3))
    extra = rng.standard_normal(n_seed) if n_seed else None
    return np.exp(logx), logy, extra


@fuzz(60)
@given(series=positive_series(), form=st.sampled_from(["float64", "float32", "object"]), dask=st.booleans())
def test_loglog_slope_matches_polyfit(series, form, dask):
    x, logy, extra = series
    y = np.exp(logy)
    if extra is not None:
        y = y[:, None] * np.exp(extra)[None, :]
    values = user_form(y, form)
    if form == "float32":
        values = values.astype(np.float32)
        assume(np.all(np.isfinite(values)) and np.all(values > 0))
    dims = ("L",) if extra is None else ("L", "seed")
    coords = {"L": x} if extra is None else {"L": x, "seed": np.arange(len(extra))}
    da = xr.DataArray(values, dims=dims, coords=coords, name="mse")
    if dask:
        da = da.chunk()
    fit = loglog_slope(da).compute()
    yv = np.asarray(values, dtype=float).reshape(len(x), -1)
    for j in range(yv.shape[1]):
        ref = np.polyfit(np.log(x), np.log(yv[:, j]), 1)[0]
        got = float(np.ravel(fit["slope"].values)[j])
        assert got == pytest.approx(ref, rel=1e-7, abs=1e-7), (j, got, ref)
    assert np.all(fit["n"].values == len(x))
    r2 = fit["r2"].values
    assert np.all(np.isnan(r2) | ((r2 >= -1e-12) & (r2 <= 1 + 1e-12)))


@fuzz(50)
@given(series=positive_series(), bad=st.sampled_from([0.0, -1.0, np.nan, np.inf, "text", None]), seed=seeds)
def test_loglog_slope_refuses_non_positive_or_non_numeric_values_naming_where(series, bad, seed):
    x, logy, _ = series
    y = np.exp(logy).astype(object)
    i = int(np.random.default_rng(seed).integers(len(x)))
    y[i] = bad
    if bad is not None and not isinstance(bad, str):
        y = y.astype(float)
    da = xr.DataArray(y, dims="L", coords={"L": x}, name="mse")
    with pytest.raises(ERRORS) as info:
        loglog_slope(da)
    if isinstance(bad, str):
        assert_names(info.value, "mse")
    else:
        assert "mse" in str(info.value) and f"L={x[i]:g}" in str(info.value)


@st.composite
def threshold_data(draw):
    rng = np.random.default_rng(draw(seeds))
    n = draw(st.integers(1, 40))
    shape = draw(st.sampled_from(["normal", "uniform", "rounded", "repeated", "two_values", "constant"]))
    x = {"normal": rng.standard_normal(n), "uniform": rng.uniform(0, 1, n), "rounded": np.round(rng.normal(0, 2, n)),
         "repeated": np.repeat(rng.standard_normal(n // 3 + 1), 3)[:n], "two_values": rng.integers(0, 2, n) + 0.0,
         "constant": np.ones(n)}[shape]
    sx, off = 10.0 ** draw(st.floats(-250, 250)), draw(st.sampled_from([0.0, 1.0, 1e3, -1e6]))
    x = (x + off) * sx
    y = rng.standard_normal(n)
    if draw(st.booleans()):
        c = np.median(x)
        y = y * draw(st.floats(0, 0.1)) + x / sx - 2 * np.maximum(0, x - c) / sx
    y = y * 10.0 ** draw(st.floats(-250, 250))
    w = None
    if draw(st.booleans()):
        w = rng.uniform(0, 2, n) * (rng.uniform(0, 1, n) > draw(st.floats(0, 0.5)))
    return y, x, w, draw(st.sampled_from([0.1, 0.15, 0.3]))


@fuzz(80)
@given(data=threshold_data())
def test_threshold_regression_on_random_data_gives_a_trimmed_break_or_a_value_error(data):
    y, x, w, trim = data
    try:
        fit = threshold_regression(y, x, w, trim=trim, n_grid=40)
    except ValueError as exc:
        assert "threshold_regression" in str(exc)
        return
    xs = x if w is None else x[w > 0]
    lo, hi = np.quantile(xs, trim), np.quantile(xs, 1 - trim)
    assert lo <= fit.c_hat <= hi
    assert fit.c_ci_low <= fit.c_hat <= fit.c_ci_high and lo <= fit.c_ci_low and fit.c_ci_high <= hi
    assert not np.isnan(fit.ssr_profile).any() and not np.isnan(fit.lr_profile).any()
    assert np.all(fit.lr_profile >= -1e-9) and fit.lr_profile[np.searchsorted(fit.grid, fit.c_hat)] == 0.0
    assert fit.n == xs.size and fit.ssr >= 0
    assert np.isfinite([fit.slope_left, fit.slope_right]).all() or abs(np.log10(np.abs(y).max() / np.ptp(x))) > 290


@fuzz(30)
@given(seed=seeds, log_sx=st.floats(-250, 250), log_sy=st.floats(-250, 250), off=st.sampled_from([0.0, 5.0, 1e6]))
def test_threshold_regression_is_equivariant_under_rescaling(seed, log_sx, log_sy, off):
    """A fit in other units is the same fit: x -> sx (x + off), y -> sy y move c_hat and the slopes
    accordingly (never a spurious 'singular design' at x ~ 1e-20 or 1e11 + O(1))."""
    assume(abs(log_sy - log_sx) < 290)  # slopes sy/sx stay normal floats (subnormals lose digits)
    rng = np.random.default_rng(seed)
    x = np.sort(rng.uniform(0, 10, 30))
    y = 0.5 * x - 1.5 * np.maximum(0, x - 4.0) + 0.05 * rng.standard_normal(30)
    sx, sy = 10.0**log_sx, 10.0**log_sy
    base = threshold_regression(y, x, n_grid=60)
    fit = threshold_regression(y * sy, (x + off) * sx, n_grid=60)
    step = np.max(np.diff(base.grid))
    assert abs(fit.c_hat / sx - off - base.c_hat) <= 1.01 * step + 1e-9 * (off + 10)
    if abs(fit.c_hat / sx - off - base.c_hat) <= 1e-9 * (off + 10):  # same breakpoint chosen
        assert fit.slope_left * sx / sy == pytest.approx(base.slope_left, rel=1e-6, abs=1e-9)
        assert fit.slope_right * sx / sy == pytest.approx(base.slope_right, rel=1e-6, abs=1e-9)
        assert fit.slope_right_se * sx / sy == pytest.approx(base.slope_right_se, rel=1e-5)
        assert fit.r2 == pytest.approx(base.r2, rel=1e-9)


# ============================================================================================
# in-context regression
# ============================================================================================
@st.composite
def tasks_strategy(draw, log_var=(-50.0, 50.0), max_L=8):
    d = draw(st.integers(1, 4))
    law_kind = draw(st.sampled_from(["gaussian", "rademacher"]))
    rng = np.random.default_rng(draw(seeds))
    var = 10.0 ** draw(st.floats(*log_var))
    A = rng.standard_normal((d, d))
    Sigma = var * (A @ A.T / d + 0.1 * np.eye(d)) if draw(st.booleans()) else var * rng.uniform(0.1, 1, d)
    x_law = laws.covariate_law(law_kind, Sigma)
    n_pairs, n_q, L_max = draw(st.integers(1, 3)), draw(st.integers(1, 3)), draw(st.integers(1, max_L))
    tasks = icl.make_tasks(np.random.default_rng(draw(seeds)), d, n_pairs, n_q, L_max, x_law)
    return tasks, (d, n_pairs, n_q, L_max), Sigma


@fuzz(120)
@given(case=tasks_strategy())
def test_make_tasks_shapes_antithetic_pairs_and_labels(case):
    t, (d, n_pairs, n_q, L_max), Sigma = case
    n = 2 * n_pairs
    assert (t.Z.shape, t.w.shape, t.x_q.shape, t.y_q.shape) == ((n, L_max, d + 1), (n, d), (n, n_q, d), (n, n_q))
    assert t.Sigma.shape == (d, d) and t.paired and (t.D, t.d, t.n_tasks, t.L_max) == (d + 1, d, n, L_max)
    for arr in (t.Z, t.w, t.x_q, t.y_q, t.Sigma):
        assert arr.dtype == np.float64 and np.all(np.isfinite(arr))
    even, odd = slice(0, None, 2), slice(1, None, 2)
    assert np.array_equal(t.Z[even, :, :d], t.Z[odd, :, :d]) and np.array_equal(t.x_q[even], t.x_q[odd])
    assert np.array_equal(t.Z[odd, :, d], -t.Z[even, :, d]) and np.array_equal(t.y_q[odd], -t.y_q[even])
    assert np.array_equal(t.w[odd], -t.w[even])
    scale = np.abs(t.Z[..., :d]).max() * np.abs(t.w).max() * d
    np.testing.assert_allclose(t.Z[..., d], np.einsum("nli,ni->nl", t.Z[..., :d], t.w), rtol=0, atol=4 * EPS * scale)
    np.testing.assert_allclose(t.y_q, np.einsum("nqi,ni->nq", t.x_q, t.w), rtol=0,
                               atol=4 * EPS * np.abs(t.x_q).max() * np.abs(t.w).max() * d)
    zq = t.z_q
    assert zq.shape == (n, n_q, d + 1) and np.all(zq[..., d] == 0) and np.array_equal(zq[..., :d], t.x_q)


def _psd_checks(G):
    G = np.asarray(G)
    scale = np.abs(G).max(axis=(-2, -1), keepdims=True) + 1e-300
    assert np.all(np.abs(G - np.swapaxes(G, -1, -2)) <= 1e-14 * scale), "not symmetric"
    lam = np.linalg.eigvalsh(0.5 * (G + np.swapaxes(G, -1, -2)))
    assert np.all(lam >= -1e-12 * scale[..., 0]), lam.min()


@fuzz(120)
@given(case=tasks_strategy(), data=st.data())
def test_Ghat_and_Gamma_w_are_symmetric_psd(case, data):
    t, (d, _, _, L_max), Sigma = case
    L = data.draw(st.integers(1, L_max))
    G = icl.Ghat(t.Z, L)
    assert G.shape == (t.n_tasks, d + 1, d + 1)
    _psd_checks(G)
    ref = np.einsum("nli,nlj->nij", t.Z[:, :L], t.Z[:, :L]) / L
    np.testing.assert_allclose(G, ref, rtol=1e-12, atol=1e-14 * np.abs(ref).max())
    Gw = icl.Gamma_w(t.Sigma, t.w)
    _psd_checks(Gw)
    np.testing.assert_array_equal(Gw[:, :d, :d], np.broadcast_to(t.Sigma, (t.n_tasks, d, d)))
    if np.ndim(Sigma) == 1:  # a diagonal Sigma is accepted as a vector, as everywhere in icl
        np.testing.assert_allclose(icl.Gamma_w(Sigma, t.w), Gw, rtol=1e-15, atol=0)


@fuzz(100)
@given(seed=seeds, d=st.integers(1, 4), lead=st.lists(st.integers(1, 3), max_size=2), log_s=st.floats(-100, 100),
       block=st.booleans())
def test_off_block_mass_is_a_non_negative_norm(seed, d, lead, log_s, block):
    rng = np.random.default_rng(seed)
    s = 10.0**log_s
    U = rng.standard_normal(tuple(lead) + (d + 1, d + 1)) * s
    v = rng.standard_normal(tuple(lead) + (d + 1,)) * s
    if block:
        U[..., d, :] = 0.0
        U[..., :d, d] = 0.0
        v[..., :d] = 0.0
    m = icl.off_block_mass(U, v)
    assert m.shape == tuple(lead) and np.all(m >= 0) and np.all(np.isfinite(m))
    if block:
        assert np.all(m == 0)
    ref = np.sqrt(np.sum(U[..., d, :] ** 2, -1) + np.sum(U[..., :d, d] ** 2, -1) + np.sum(v[..., :d] ** 2, -1))
    np.testing.assert_allclose(m, ref, rtol=1e-14)


def _naive_softmax_predict(U, v, Z, zq):
    n, L, D = Z.shape
    out = np.empty(zq.shape[:2])
    for i in range(n):
        for j in range(zq.shape[1]):
            a = U @ zq[i, j]
            s = [math.fsum(Z[i, k] * a) for k in range(L)]
            m = max(s)
            e = [math.exp(sk - m) for sk in s]
            tot = math.fsum(e)
            mbar = np.array([math.fsum(e[k] * Z[i, k, c] for k in range(L)) / tot for c in range(D)])
            out[i, j] = math.fsum(v * mbar)
    return out


@fuzz(100)
@given(case=tasks_strategy(log_var=(-3, 3)), seed=seeds, log_U=st.floats(-8, 6), data=st.data())
def test_icl_softmax_predict_matches_a_naive_loop_at_every_logit_scale(case, seed, log_U, data):
    t, (d, _, _, L_max), _ = case
    L = data.draw(st.integers(1, L_max))
    rng = np.random.default_rng(seed)
    zmax = np.abs(t.Z).max()
    U = rng.standard_normal((d + 1, d + 1)) * 10.0**log_U / max(zmax**2, 1e-300)
    v = rng.standard_normal(d + 1)
    Z = t.prompt(L)
    got = icl.softmax_predict(U, v, Z, t.z_q)
    ref = _naive_softmax_predict(U, v, Z, t.z_q)
    assert got.shape == ref.shape and np.all(np.isfinite(got))
    s_mag = np.abs(Z).max() * np.abs(U).max() * np.abs(t.z_q).max() * (d + 1) ** 2
    tol = np.abs(v).sum() * zmax * (16 * (d + 1) * EPS * s_mag + 64 * EPS * (L + d))
    assert np.all(np.abs(got - ref) <= tol), np.max(np.abs(got - ref)) / tol
    # huge U: still finite, the risk and its gradient too
    Uh = U * 10.0 ** data.draw(st.floats(0, 100))
    risk, gU, gv = icl.softmax_risk_grad(Uh, v, Z, t.z_q, t.y_q)
    assert np.all(np.isfinite(icl.softmax_predict(Uh, v, Z, t.z_q)))
    assert np.isfinite(risk) and np.all(np.isfinite(gU)) and np.all(np.isfinite(gv))


def _central_fd(f, x, h):
    g = np.zeros_like(x)
    for idx in np.ndindex(*x.shape):
        e = np.zeros_like(x)
        e[idx] = h
        g[idx] = (f(x + e) - f(x - e)) / (2 * h)
    return g


@fuzz(80)
@given(case=tasks_strategy(log_var=(-1, 1), max_L=6), seed=seeds, log_U=st.floats(-1.5, 0.5),
       model=st.sampled_from(icl.MODELS), data=st.data())
def test_icl_gradients_match_central_finite_differences(case, seed, log_U, model, data):
    t, (d, _, _, L_max), _ = case
    L = data.draw(st.integers(1, L_max))
    rng = np.random.default_rng(seed)
    scale = 10.0**log_U / max(np.abs(t.Z).max(), 1e-300) ** 2 * (d + 1)
    U = rng.standard_normal((t.D, t.D)) * scale
    v = rng.standard_normal(t.D)
    risk, gU, gv = icl.risk_grad(model, U, v, t, L)
    assert risk == pytest.approx(float(icl.risk(model, U, v, t, L)), rel=1e-12, abs=1e-300)
    hU, hv = 1e-5 * max(np.abs(U).max(), 1e-8), 1e-5 * max(np.abs(v).max(), 1e-8)
    fdU = _central_fd(lambda X: float(icl.risk(model, X, v, t, L)), U, hU)
    fdv = _central_fd(lambda X: float(icl.risk(model, U, X, t, L)), v, hv)
    sU = max(np.abs(gU).max(), np.abs(fdU).max(), risk / max(np.abs(U).max(), 1e-300) * 1e-6, 1e-300)
    sv = max(np.abs(gv).max(), np.abs(fdv).max(), risk / max(np.abs(v).max(), 1e-300) * 1e-6, 1e-300)
    np.testing.assert_allclose(gU, fdU, rtol=0, atol=2e-5 * sU)
    np.testing.assert_allclose(gv, fdv, rtol=0, atol=2e-5 * sv)


BAD_ICL_CALLS = [
    (lambda t: icl.softmax_predict("U", np.ones(t.D), t.Z, t.z_q), "U"),
    (lambda t: icl.softmax_predict(np.eye(t.D), ["a"] * t.D, t.Z, t.z_q), "v"),
    (lambda t: icl.softmax_predict(np.eye(t.D), np.ones(t.D), np.full(t.Z.shape, "z"), t.z_q), "Z"),
    (lambda t: icl.softmax_risk_grad(np.eye(t.D), np.ones(t.D), t.Z, np.full(t.z_q.shape, "q"), t.y_q), "z_q"),
    (lambda t: icl.softmax_predict(np.eye(t.D + 1), np.ones(t.D), t.Z, t.z_q), "U"),
    (lambda t: icl.Ghat([[["a"]]]), "Z"),
    (lambda t: icl.Ghat(t.Z, L=0), "L"),
    (lambda t: icl.Ghat(t.Z, L=1.5), "L"),
    (lambda t: icl.Gamma_w(np.ones((t.d, t.d + 1)), t.w), "Sigma"),
    (lambda t: icl.Gamma_w("Sigma", t.w), "Sigma"),
    (lambda t: icl.Gamma_w(t.Sigma, np.ones(t.d + 1)), "w"),
    (lambda t: icl.make_tasks(0, 2, 1, 1, 4, Gaussian(D=2)), "rng"),
    (lambda t: icl.make_tasks(np.random.default_rng(0), 2.0, 1, 1, 4, Gaussian(D=2)), "d"),
    (lambda t: icl.make_tasks(np.random.default_rng(0), 2, 0, 1, 4, Gaussian(D=2)), "n_pairs"),
    (lambda t: icl.make_tasks(np.random.default_rng(0), 2, 1, True, 4, Gaussian(D=2)), "n_queries"),
    (lambda t: icl.make_tasks(np.random.default_rng(0), 2, 1, 1, -4, Gaussian(D=2)), "L_max"),
    (lambda t: icl.make_tasks(np.random.default_rng(0), 3, 1, 1, 4, Gaussian(D=2)), "x_law"),
    (lambda t: icl.risk("transformer", np.eye(t.D), np.ones(t.D), t, 1), "model"),
    (lambda t: icl.risk("softmax", np.eye(t.D), np.ones(t.D), t, None), "L"),
    (lambda t: icl.ridge_risk(t, 1, lam=-1.0), "lam"),
]


@pytest.mark.parametrize("call, name", BAD_ICL_CALLS, ids=[f"{i}-{n}" for i, (_, n) in enumerate(BAD_ICL_CALLS)])
def test_icl_refuses_bad_input_naming_it(call, name):
    tasks = icl.make_tasks(np.random.default_rng(1), 2, 1, 2, 4, Gaussian(D=2))
    with pytest.raises(ERRORS) as info:
        call(tasks)
    assert_names(info.value, name)
