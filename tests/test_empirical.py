"""The empirical law: exact tilted mean and SNIS constant against direct numpy, streaming over the
support (bounded memory for 10^6 tokens), Lemma 2.1 recovered as n grows for Gaussian samples,
sampling with replacement, reading tokens from .npy and netCDF files, and its refusals."""
import tracemalloc

import numpy as np
import pytest
import xarray as xr

from sfxlin.attention import softmax_attention
from sfxlin.laws import Empirical, FloatOverflowError, Gaussian, law_from_name


def _rng(*ids):
    return np.random.default_rng([*ids, 9173])


def _direct(Z, a, pi=None):
    """Tilted mean and SNIS constant written out with whole (m, n) arrays: the softmax over the
    support of ``a . z_i + log pi_i`` (maximum subtracted), then the moments."""
    pi = np.full(Z.shape[0], 1.0 / Z.shape[0]) if pi is None else pi / pi.sum()
    A = a.reshape(-1, Z.shape[1])
    s = A @ Z.T
    top = s.max(axis=1, keepdims=True)
    w = pi * np.exp(s - top)
    m = (w @ Z) / w.sum(axis=1, keepdims=True)
    C = np.stack([((pi * np.exp(2 * (s[k] - top[k])))[:, None] * (Z - m[k])).T @ (Z - m[k]) for k in range(len(A))])
    C /= (w.sum(axis=1) ** 2)[:, None, None]
    return m.reshape(a.shape), C.reshape(a.shape + (Z.shape[1],))


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("block", [Empirical.BLOCK, 7])  # 7 floats: every chunk boundary exercised
def test_tilted_mean_and_snis_constant_equal_a_direct_computation(weighted, block, monkeypatch):
    """Same sums in another order (chunked, running maximum): agreement to 1e-12 relative."""
    monkeypatch.setattr(Empirical, "BLOCK", block)
    rng = _rng(1)
    Z = rng.standard_exponential((257, 3)) @ rng.standard_normal((3, 3)) + 2.0
    pi = rng.uniform(0.1, 1.0, 257) if weighted else None
    law = Empirical(Z, weights=pi)
    a = rng.standard_normal((2, 5, 3))
    m, C = _direct(Z, a, pi)
    np.testing.assert_allclose(law.tilted_mean(a), m, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(law.snis_covariance(a), C, rtol=1e-12, atol=1e-12 * np.abs(C).max())


def test_large_logits_are_stable_and_select_the_top_atom():
    """a.z_i of order 10^4: a naive exp overflows; the tilted law is the arg-max atom to rounding."""
    rng = _rng(2)
    Z = rng.standard_normal((50, 2))
    a = 1e4 * np.array([1.0, 0.3])
    law = Empirical(Z)
    top = Z[np.argmax(Z @ a)]
    np.testing.assert_allclose(law.tilted_mean(a), top, rtol=0, atol=1e-12)
    assert np.all(np.isfinite(law.snis_covariance(a)))
    with pytest.raises(FloatOverflowError, match="too large"):
        law.tilted_mean(np.array([1e308, 1e308]))


def test_a_beyond_the_logit_bound_with_finite_logits_is_not_refused():
    """|a| max |z_i| beyond float64 does not by itself refuse a: the logits are checked atom by atom
    (here a.z_i = z_i1 exactly, the second coordinate of every atom being 0)."""
    Z = np.array([[1.0, 0.0], [2.0, 0.0], [-1.0, 0.0]])
    law = Empirical(Z, weights=[0.2, 0.3, 0.5])
    a = np.array([[1.0, 1e305], [0.5, 1e308]])
    np.testing.assert_array_equal(law.tilted_mean(a), law.tilted_mean(a * [1.0, 0.0]))
    np.testing.assert_array_equal(law.snis_covariance(a), law.snis_covariance(a * [1.0, 0.0]))


def test_moments_and_small_a_expansion():
    """mean and cov are the weighted moments (divisor 1); grad K(a) = mean + cov a + O(a^2)."""
    rng = _rng(3)
    Z = rng.standard_normal((40, 3))
    pi = rng.uniform(size=40)
    law = Empirical(Z, weights=pi)
    np.testing.assert_allclose(law.mean, np.average(Z, axis=0, weights=pi), rtol=1e-13)
    np.testing.assert_allclose(law.cov, np.cov(Z.T, aweights=pi, bias=True), rtol=1e-12, atol=1e-14)
    a = rng.standard_normal(3)
    for h in (1e-3, 1e-4):  # the remainder is kappa_3[a, a] / 2, a few units times h^2
        np.testing.assert_allclose(law.tilted_mean(h * a), law.mean + h * law.cov @ a, rtol=0, atol=20 * h**2)


def test_gaussian_samples_approach_lemma_2_1_at_the_snis_rate():
    """For z_i ~ N(m, S), the empirical tilted mean is a self-normalised importance-sampling
    estimate of m + S a: E||error||^2 = tr C_gauss(a) / n (1 + O(1/n)). Over 200 independent
    sets the mean of n ||error||^2 / tr C is 1 within 5 standard errors, at n = 500 and n = 8000."""
    rng = _rng(4)
    m, S = np.array([0.5, -1.0]), np.array([[1.0, 0.4], [0.4, 0.5]])
    gauss = Gaussian(m, S)
    a = np.array([0.6, -0.3])
    trC = np.trace(gauss.snis_covariance(a))
    for n in (500, 8000):
        ratios = np.array([n * np.sum((Empirical(gauss.sample(rng, n)).tilted_mean(a) - gauss.tilted_mean(a)) ** 2)
                           / trC for _ in range(200)])
        assert abs(ratios.mean() - 1.0) <= 5 * ratios.std() / np.sqrt(ratios.size) + 2.0 / n, (n, ratios.mean())


def test_snis_constant_is_the_finite_L_error_of_softmax_attention():
    """Softmax attention over L tokens drawn with replacement from the law: L E||f_L - f_inf||^2 ->
    tr C (delta method). 4000 prompts of L = 400: within 5 SE plus an O(1/L) allowance of 5%."""
    rng = _rng(5)
    law = Empirical(rng.standard_exponential((30, 2)))
    U, q = np.array([[0.8, -0.2], [0.3, 0.5]]), np.array([0.7, 1.1])
    L, R = 400, 4000
    f_L = softmax_attention(law.sample(rng, (R, L)), U, np.eye(2), q)
    sq = L * np.sum((f_L - law.tilted_mean(U @ q)) ** 2, axis=-1)
    trC = np.trace(law.snis_covariance(U @ q))
    assert abs(sq.mean() - trC) <= 5 * sq.std() / np.sqrt(R) + 0.05 * trC


def test_sample_draws_with_replacement_in_the_documented_order():
    rng = _rng(6)
    Z = np.arange(10.0).reshape(5, 2)
    np.testing.assert_array_equal(Empirical(Z).sample(np.random.default_rng(1), (3, 4)),
                                  Z[np.random.default_rng(1).integers(0, 5, size=(3, 4))])
    pi = np.array([0.1, 0.0, 0.6, 0.2, 0.1])
    draws = Empirical(Z, weights=pi).sample(rng, 100_000)[:, 0] / 2
    freq = np.bincount(draws.astype(int), minlength=5) / draws.size
    # the zero-weight atom is dropped; the others within 5 binomial SE
    assert freq[1] == 0
    assert np.all(np.abs(freq - pi) <= 5 * np.sqrt(pi * (1 - pi) / draws.size))
    assert Empirical(Z).sample(rng, 0).shape == (0, 2)


def test_a_million_tokens_stream_in_bounded_memory():
    """n = 10^6, D = 4, 40 queries: the whole (m, n) logit matrix would be 320 MB; the streamed
    computation stays below 100 MB of new arrays (a chunk is 16 MB), and agrees with a direct
    computation on 3 queries."""
    rng = _rng(7)
    Z = rng.standard_normal((1_000_000, 4))
    law = Empirical(Z)
    a = 0.3 * rng.standard_normal((40, 4))
    tracemalloc.start()
    out = law.tilted_mean(a)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 100e6, peak
    np.testing.assert_allclose(out[:3], _direct(Z, a[:3])[0], rtol=1e-12, atol=1e-12)


def test_tokens_from_npy_and_netcdf_files(tmp_path):
    rng = _rng(8)
    Z = rng.standard_normal((20, 3))
    np.save(tmp_path / "tok.npy", Z)
    xr.Dataset({"emb": (("token", "feature"), Z), "embT": (("feature", "token"), Z.T)}).to_netcdf(tmp_path / "tok.nc")
    a = rng.standard_normal(3)
    expected = Empirical(Z).tilted_mean(a)
    for source, kwargs in [(str(tmp_path / "tok.npy"), {}), (tmp_path / "tok.npy", {}),
                           (f"{tmp_path}/tok.nc:emb", {}), (f"{tmp_path}/tok.nc:embT", {"feature_dim": "feature"})]:
        np.testing.assert_array_equal(Empirical(source, **kwargs).tilted_mean(a), expected)
    assert law_from_name("empirical", 3, samples=str(tmp_path / "tok.npy")).n == 20


@pytest.mark.parametrize("build, match", [
    (lambda p: Empirical(np.array([[0.0, 1.0], [np.nan, 2.0], [np.inf, 0.0]])),
     r"2 row\(s\) hold NaN or inf, the first is row 1"),
    (lambda p: Empirical(np.zeros((0, 3))), "samples is empty"),
    (lambda p: Empirical(np.zeros(3)), r"must be an \(n, D\) array"),
    (lambda p: Empirical(np.zeros((4, 3)), D=2), "D = 2 does not match the samples' dimension 3"),
    (lambda p: Empirical(np.zeros((4, 3)), weights=[1.0, 1.0]), r"weights must have shape \(4,\)"),
    (lambda p: Empirical(np.zeros((2, 3)), weights=[1.0, -1.0]), "weights must be non-negative"),
    (lambda p: Empirical(np.zeros((2, 3)), weights=[0.0, 0.0]), "positive sum"),
    (lambda p: Empirical(str(p / "missing.npy")), "no such file"),
    (lambda p: Empirical(str(p / "tok.nc")), "needs a variable"),
    (lambda p: Empirical(f"{p}/tok.nc:nope"), "has no variable 'nope'"),
    (lambda p: Empirical(f"{p}/tok.nc:cube"), "expected two"),
    (lambda p: Empirical(str(p / "tok.csv")), "must be a .npy file or 'file.nc:variable'"),
    (lambda p: Empirical(np.zeros((2, 2))).tilted_mean(np.zeros(3)), "a must have trailing dimension D = 2"),
])
def test_bad_input_is_one_clear_error(build, match, tmp_path):
    xr.Dataset({"cube": (("a", "b", "c"), np.zeros((2, 2, 2)))}).to_netcdf(tmp_path / "tok.nc")
    with pytest.raises(ValueError, match=match):
        build(tmp_path)


def test_the_callers_array_is_left_writable_and_the_law_read_only():
    Z = np.zeros((3, 2))
    law = Empirical(Z)
    assert Z.flags.writeable and not law.samples.flags.writeable
    with pytest.raises(ValueError, match="read-only"):
        law.samples[0, 0] = 1.0


def test_isotropic_says_why_it_does_not_exist():
    with pytest.raises(NotImplementedError, match="given by its samples"):
        Empirical.isotropic(2)
