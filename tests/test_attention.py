"""Attention operators: naive references, stability, prefix evaluation, exact limits, the
asymptotic constant (Monte Carlo), input validation."""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import sfxlin.attention as attention
from sfxlin.attention import (asymptotic_mse, check_prompt_lengths, limit_attention, linear_attention,
                              softmax_attention, softmax_attention_prefix)
from sfxlin.laws import Gaussian, Rademacher, StudentT, Uniform


def _rng(*ids):
    return np.random.default_rng([*ids, 7301])


def _problem(rng, L, D, D_out, batch=(), scale=1.0):
    Z = rng.standard_normal(batch + (L, D))
    U = scale * rng.standard_normal((D, D))
    V = rng.standard_normal((D_out, D))
    q = rng.standard_normal(batch + (D,))
    return Z, U, V, q


def naive_softmax_attention(Z, U, V, q):
    """One prompt ``Z (L, D)``, one query ``q (D,)``: python loops, math.exp after the max."""
    L, D = Z.shape
    Uq = [math.fsum(U[i, j] * q[j] for j in range(D)) for i in range(D)]
    s = [math.fsum(Z[k, i] * Uq[i] for i in range(D)) for k in range(L)]
    m = max(s)
    w = [math.exp(sk - m) for sk in s]
    total = math.fsum(w)
    mean = [math.fsum(w[k] * Z[k, i] for k in range(L)) / total for i in range(D)]
    return np.array([math.fsum(V[o, i] * mean[i] for i in range(D)) for o in range(V.shape[0])])


def _scale(Z, V):
    """Natural error scale of ``V * (convex combination of tokens)``."""
    return np.abs(V).sum(axis=1).max() * np.abs(Z).max()


# --------------------------------------------------------------------------------------------
# softmax attention
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("L, D, D_out", [(1, 1, 1), (7, 3, 2), (50, 4, 4), (200, 2, 5)])
@pytest.mark.parametrize("scale", [0.1, 1.0, 10.0])
def test_softmax_matches_naive_loop(L, D, D_out, scale):
    rng = _rng(1, L, D, D_out)
    Z, U, V, q = _problem(rng, L, D, D_out, batch=(3,), scale=scale)
    got = softmax_attention(Z, U, V, q)
    assert got.shape == (3, D_out)
    for b in range(3):
        want = naive_softmax_attention(Z[b], U, V, q[b])
        np.testing.assert_allclose(got[b], want, rtol=0, atol=1e-13 * _scale(Z[b], V))


def test_softmax_broadcasts_queries_over_one_prompt():
    rng = _rng(2)
    Z, U, V, _ = _problem(rng, 30, 3, 2)
    q = rng.standard_normal((4, 5, 3))
    got = softmax_attention(Z, U, V, q)
    assert got.shape == (4, 5, 2)
    for i in range(4):
        for j in range(5):
            np.testing.assert_allclose(got[i, j], naive_softmax_attention(Z, U, V, q[i, j]),
                                       rtol=0, atol=1e-13 * _scale(Z, V))


def test_softmax_single_token_returns_that_token():
    rng = _rng(3)
    Z, U, V, q = _problem(rng, 1, 3, 2, scale=1e4)
    np.testing.assert_allclose(softmax_attention(Z, U, V, q), V @ Z[0], rtol=1e-15, atol=0)


@pytest.mark.parametrize("scale", [1e3, 1e5])
def test_softmax_stable_for_huge_logits(scale):
    """Logits thousands apart: finite, and the one-hot answer V z_argmax when the gap is huge."""
    rng = _rng(4, int(scale))
    Z, U, V, q = _problem(rng, 64, 3, 2, batch=(20,))
    U = scale * U / np.linalg.norm(U)
    with np.errstate(over="raise", invalid="raise", divide="raise", under="ignore"):  # underflow only
        got = softmax_attention(Z, U, V, q)
        got_prefix = softmax_attention_prefix(Z, U, V, q, [1, 10, 64])
    assert np.all(np.isfinite(got)) and np.all(np.isfinite(got_prefix))
    s = np.einsum("bkd,bd->bk", Z, q @ U.T)
    top2 = np.sort(s, axis=-1)[:, -2:]
    gap = top2[:, 1] - top2[:, 0]
    assert np.ptp(s, axis=-1).min() > 100  # the logits really are far apart
    huge = gap > 40  # exp(-40) < 5e-18: the runner-up weight is below double rounding
    assert huge.sum() >= 10
    one_hot = Z[np.arange(20), s.argmax(axis=-1)] @ V.T
    np.testing.assert_allclose(got[huge], one_hot[huge], rtol=0, atol=1e-15 * _scale(Z, V))
    np.testing.assert_allclose(got_prefix[huge, -1], one_hot[huge], rtol=0, atol=1e-15 * _scale(Z, V))
    for b in range(20):  # and the general answer is still the exact softmax
        np.testing.assert_allclose(got[b], naive_softmax_attention(Z[b], U, V, q[b]),
                                   rtol=0, atol=1e-13 * _scale(Z[b], V))


# --------------------------------------------------------------------------------------------
# prefix evaluation
# --------------------------------------------------------------------------------------------
@st.composite
def prefix_problems(draw):
    D = draw(st.integers(1, 4))
    D_out = draw(st.integers(1, 3))
    batch = tuple(draw(st.lists(st.integers(1, 3), max_size=2)))
    L_max = draw(st.integers(1, 60))
    Ls = sorted(draw(st.sets(st.integers(1, L_max), min_size=1, max_size=min(L_max, 12))))
    extra = draw(st.integers(0, 5))  # Z may hold more tokens than the largest prompt
    scale = draw(st.sampled_from([1e-3, 0.1, 1.0, 10.0, 1e2, 1e3, 1e4]))
    seed = draw(st.integers(0, 2**32 - 1))
    return D, D_out, batch, Ls, L_max + extra, scale, seed


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(prefix_problems())
def test_prefix_equals_per_length_loop(problem):
    D, D_out, batch, Ls, n_tokens, scale, seed = problem
    rng = np.random.default_rng(seed)
    Z, U, V, q = _problem(rng, n_tokens, D, D_out, batch=batch, scale=scale)
    got = softmax_attention_prefix(Z, U, V, q, Ls)
    assert got.shape == batch + (len(Ls), D_out)
    want = np.stack([softmax_attention(Z[..., :L, :], U, V, q) for L in Ls], axis=-2)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12 * _scale(Z, V))


def test_prefix_broadcasts_like_c1():
    """Queries ``(Q, 1, D)`` against prompts ``(Q, P, L, D)``, as the C1 kernel calls it."""
    rng = _rng(5)
    Z = rng.standard_normal((3, 4, 100, 2))
    U, V = rng.standard_normal((2, 2)), np.eye(2)
    q = rng.standard_normal((3, 1, 2))
    Ls = [5, 17, 64, 100]
    got = softmax_attention_prefix(Z, U, V, q, Ls)
    assert got.shape == (3, 4, 4, 2)
    for j, L in enumerate(Ls):
        np.testing.assert_allclose(got[:, :, j], softmax_attention(Z[:, :, :L], U, V, q), rtol=0, atol=1e-13)


def test_prefix_touches_only_the_first_L_max_tokens():
    rng = _rng(6)
    Z, U, V, q = _problem(rng, 40, 3, 2, batch=(2,))
    poisoned = np.concatenate([Z, np.full((2, 25, 3), np.nan)], axis=-2)
    poisoned[:, 40:][:, ::2] = np.inf
    Ls = [3, 20, 40]
    got = softmax_attention_prefix(poisoned, U, V, q, Ls)
    np.testing.assert_array_equal(got, softmax_attention_prefix(Z, U, V, q, Ls))


class _CountingNumpy:
    """Proxy of numpy in ``sfxlin.attention``: counts the elements passed to ``exp``."""

    def __init__(self):
        self.exp_elements = 0

    def __getattr__(self, name):
        return getattr(np, name)

    def exp(self, x, *args, **kwargs):
        self.exp_elements += np.size(x)
        return np.exp(x, *args, **kwargs)


def test_prefix_cost_is_linear_in_L_max(monkeypatch):
    """One pass: logits computed once, and the exponentials, taken in :mod:`sfxlin.softmax_core`,
    one per token and query plus two per block for the online merge, not one pass per L."""
    import sfxlin.softmax_core as core

    rng = _rng(7)
    Q, L_max = 3, 400
    Z, U, V, q = _problem(rng, L_max, 2, 2, batch=(Q,))
    Ls = list(range(1, L_max + 1))  # sum L = 80200 = 200 L_max
    counting = _CountingNumpy()
    calls = []
    logits = attention._logits
    monkeypatch.setattr(core, "np", counting)
    monkeypatch.setattr(attention, "_logits", lambda *a: calls.append(1) or logits(*a))
    softmax_attention_prefix(Z, U, V, q, Ls)
    assert len(calls) == 1
    assert Q * L_max <= counting.exp_elements <= Q * (L_max + 3 * len(Ls))
    assert counting.exp_elements < Q * sum(Ls) / 50


# --------------------------------------------------------------------------------------------
# linear attention and the infinite-prompt limit
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("L, D, D_out", [(1, 2, 1), (10, 3, 3), (300, 4, 2)])
def test_linear_attention_is_V_Ghat_U_q(L, D, D_out):
    rng = _rng(8, L, D)
    Z, U, V, q = _problem(rng, L, D, D_out, batch=(4,))
    got = linear_attention(Z, U, V, q)
    for b in range(4):
        Ghat = sum(np.outer(z, z) for z in Z[b]) / L
        want = V @ Ghat @ U @ q[b]
        np.testing.assert_allclose(got[b], want, rtol=1e-12, atol=1e-13 * np.abs(want).max())


def test_limit_attention_gaussian_is_V_Sigma_U_q():
    rng = _rng(9)
    D = 3
    A = rng.standard_normal((D, D))
    Sigma = A @ A.T + 0.2 * np.eye(D)
    U, V = rng.standard_normal((D, D)), rng.standard_normal((2, D))
    q = rng.standard_normal((5, D))
    got = limit_attention(Gaussian(cov=Sigma), U, V, q)
    assert got.shape == (5, 2)
    for b in range(5):
        np.testing.assert_allclose(got[b], V @ Sigma @ U @ q[b], rtol=1e-13, atol=1e-14)
    m = rng.standard_normal(D)  # with a mean: V (m + Sigma U q)
    got_m = limit_attention(Gaussian(mean=m, cov=Sigma), U, V, q)
    np.testing.assert_allclose(got_m, (m + q @ U.T @ Sigma) @ V.T, rtol=1e-13, atol=1e-14)


def test_limit_attention_rademacher_tanh():
    rng = _rng(10)
    U, V, q = rng.standard_normal((2, 2)), np.eye(2), rng.standard_normal(2)
    np.testing.assert_allclose(limit_attention(Rademacher(1.0, D=2), U, V, q), np.tanh(U @ q), rtol=1e-14)


def test_softmax_converges_to_limit_for_gaussian_tokens():
    """Law of large numbers at fixed U: the prefix error shrinks towards V Sigma U q."""
    rng = _rng(11)
    law = Gaussian(cov=np.diag([1.5, 0.5]))
    U, V = 0.3 * np.eye(2), np.eye(2)
    q = np.array([1.0, -1.0])
    Z = law.sample(rng, (200, 4096))
    f = softmax_attention_prefix(Z, U, V, q, [16, 256, 4096])
    err = np.mean(np.sum((f - limit_attention(law, U, V, q)) ** 2, axis=-1), axis=0)
    assert err[0] > err[1] > err[2]
    assert err[2] < 2e-3


# --------------------------------------------------------------------------------------------
# the sharp asymptotic constant
# --------------------------------------------------------------------------------------------
def test_asymptotic_mse_closed_form_and_broadcasting():
    rng = _rng(12)
    Sigma = np.array([[2.0, 0.3], [0.3, 0.5]])
    law = Gaussian(cov=Sigma)
    U, V = rng.standard_normal((2, 2)), rng.standard_normal((3, 2))
    q = 0.5 * rng.standard_normal((4, 2))
    Ls = np.array([10, 100, 1000])
    got = asymptotic_mse(law, U, V, q[:, None, :], Ls)
    assert got.shape == (4, 3)
    for b in range(4):
        a = U @ q[b]
        const = math.exp(a @ Sigma @ a) * (np.trace(V @ Sigma @ V.T) + np.sum((V @ Sigma @ a) ** 2))
        np.testing.assert_allclose(got[b], const / Ls, rtol=1e-13)
    # the constant does not depend on the mean of the law
    np.testing.assert_allclose(asymptotic_mse(Gaussian(mean=[3.0, -1.0], cov=Sigma), U, V, q[:, None, :], Ls),
                               got, rtol=1e-14)


def _mc_constant(law, U, V, q, L, n_prompts, rng, chunk=500):
    """Samples of ``L ||f_L(q) - f_inf(q)||^2`` over independent prompts."""
    f_inf = limit_attention(law, U, V, q)
    stat = np.empty(n_prompts)
    for start in range(0, n_prompts, chunk):
        Z = law.sample(rng, (chunk, L))
        stat[start:start + chunk] = L * np.sum((softmax_attention(Z, U, V, q) - f_inf) ** 2, axis=-1)
    return stat


def test_asymptotic_mse_monte_carlo():
    """``L * mean ||f_L - f_inf||^2`` matches the delta-method constant (CLT tolerance)."""
    rng = _rng(13)
    Sigma = np.diag([2.0, 0.5])
    law = Gaussian(cov=Sigma)
    U = np.eye(2)
    V = np.array([[1.0, 0.5], [0.0, 1.0], [-0.5, 2.0]])
    q = np.array([0.4, 0.0])  # a = U q: a'Sigma a = 0.32, ||Sigma a||^2 = 0.64 vs tr Sigma = 2.5
    L, n_prompts = 4000, 4000
    stat = _mc_constant(law, U, V, q, L, n_prompts, rng)
    const = asymptotic_mse(law, U, V, q, L) * L
    np.testing.assert_allclose(const, math.exp(0.32) * (np.trace(V @ Sigma @ V.T) + np.sum((V @ Sigma @ q) ** 2)),
                               rtol=1e-13)
    sem = stat.std(ddof=1) / np.sqrt(n_prompts)
    allowance = 25.0 / L * const  # O(1/L) second-order term of the delta method
    assert abs(stat.mean() - const) < 4 * sem + allowance, (stat.mean(), const, sem)
    # and the test has the power to see a wrong constant: dropping the exponential factor
    # or the ||V Sigma a||^2 term would be many standard errors away
    no_exp = const / math.exp(0.32)
    no_bias_term = math.exp(0.32) * np.trace(V @ Sigma @ V.T)
    for wrong in (no_exp, no_bias_term):
        assert abs(stat.mean() - wrong) > 4 * sem + allowance


@pytest.mark.parametrize("name", ["rademacher", "uniform"])
def test_asymptotic_mse_monte_carlo_bounded_laws(name):
    """The same CLT check for the bounded laws, around their own limits."""
    rng = _rng(15, len(name))
    S = np.array([[1.0, 0.4], [-0.3, 0.8]])
    law = {"rademacher": Rademacher(scale=S), "uniform": Uniform(scale=S)}[name]
    U, V = np.array([[0.8, 0.2], [0.0, 0.6]]), np.array([[1.0, -0.5], [0.3, 1.0]])
    q = np.array([0.5, -0.4])
    L, n_prompts = 4000, 4000
    stat = _mc_constant(law, U, V, q, L, n_prompts, rng)
    const = asymptotic_mse(law, U, V, q, L) * L
    sem = stat.std(ddof=1) / np.sqrt(n_prompts)
    assert abs(stat.mean() - const) < 4 * sem + 25.0 / L * const, (stat.mean(), const, sem)


# --------------------------------------------------------------------------------------------
# input validation
# --------------------------------------------------------------------------------------------
def _ok():
    rng = _rng(14)
    return _problem(rng, 10, 3, 2)


@pytest.mark.parametrize("fn", [softmax_attention, linear_attention,
                                lambda Z, U, V, q: softmax_attention_prefix(Z, U, V, q, [2, 5])])
@pytest.mark.parametrize("which, bad, match", [
    ("U", np.eye(2), r"\bU\b"),
    ("U", np.ones((3, 2)), r"\bU\b"),
    ("V", np.ones((2, 4)), r"\bV\b"),
    ("V", np.ones(3), r"\bV\b"),
    ("q", np.ones(4), r"\bq\b"),
    ("q", np.ones((5, 2)), r"\bq\b"),
    ("Z", np.ones(3), r"\bZ\b"),
])
def test_operand_shape_errors_name_the_argument(fn, which, bad, match):
    Z, U, V, q = _ok()
    args = {"Z": Z, "U": U, "V": V, "q": q}
    args[which] = bad
    with pytest.raises(ValueError, match=match):
        fn(**args)


def test_finite_array_passes_finite_input_and_locates_the_first_bad_entry():
    from sfxlin.validation import finite_array

    x = np.arange(12).reshape(3, 4)
    got = finite_array(x, "Z")
    assert got.dtype == np.float64
    np.testing.assert_array_equal(got, x)
    bad = x.astype(float)
    bad[1, 2], bad[2, 0] = np.inf, np.nan
    with pytest.raises(ValueError, match=r"Z must be finite: 2 non-finite entries, the first \(inf\) at index \(1, 2\)"):
        finite_array(bad, "Z")


@pytest.mark.parametrize("Ls, match", [
    ([5, 3], "increasing"),
    ([2, 2, 4], "increasing"),
    ([0, 4], ">= 1"),
    ([-1], ">= 1"),
    ([2, 11], "exceeds"),
    ([], "non-empty"),
    ([1.5, 3], "integer"),
])
def test_prompt_length_errors(Ls, match):
    Z, U, V, q = _ok()  # 10 tokens
    with pytest.raises(ValueError, match=match) as info:
        softmax_attention_prefix(Z, U, V, q, Ls)
    assert "prompt length" in str(info.value) or "Ls" in str(info.value)


def test_check_prompt_lengths_accepts_integral_floats():
    out = check_prompt_lengths([1.0, 4.0, 9.0], L_max=9)
    assert out.dtype == np.int64 and out.tolist() == [1, 4, 9]


def test_limit_attention_shape_errors():
    law = Gaussian(cov=1.0, D=3)
    with pytest.raises(ValueError, match=r"\bU\b"):
        limit_attention(law, np.eye(2), np.eye(3), np.ones(3))
    with pytest.raises(ValueError, match=r"\bV\b"):
        limit_attention(law, np.eye(3), np.eye(2), np.ones(3))


def test_asymptotic_mse_rejects_laws_without_a_limit():
    """Student-t tokens have no exponential moments: no limit, no constant."""
    with pytest.raises(ValueError, match="StudentT"):
        asymptotic_mse(StudentT(5.0, 1.0, D=2), np.eye(2), np.eye(2), np.ones(2), 10)


def test_asymptotic_mse_shape_errors():
    law = Gaussian(cov=1.0, D=2)
    with pytest.raises(ValueError, match=r"\bU\b"):
        asymptotic_mse(law, np.eye(3), np.eye(2), np.ones(2), 10)
    with pytest.raises(ValueError, match=r"\bV\b"):
        asymptotic_mse(law, np.eye(2), np.eye(3), np.ones(2), 10)


def test_asymptotic_mse_rejects_L_below_one():
    with pytest.raises(ValueError, match=r"\bL\b"):
        asymptotic_mse(Gaussian(cov=1.0, D=2), np.eye(2), np.eye(2), np.ones(2), [0, 10])
