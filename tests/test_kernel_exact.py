"""Every quantity sfxlin.kernels calls exact, against an independent computation.

* The five moments ``E kappa, E kappa', E kappa^2, E kappa^2 s, E kappa^2 s^2`` (``s ~ N(0, r^2)``),
  the gains and the error constants of ``kernel_mse`` of every kernel, out to ``r = 10`` (sigmoid:
  several biases; ``sigmoid_logL``: several ``L``), against ``scipy.integrate.quad`` with
  ``points=`` at the kernel's transition and tilted peaks, ``epsrel = 2e-14``: relative 1e-10.
  The kernels are written here from their definitions (docs/kernels.md), the odd moments as
  ``int_0^inf s (h(s) - h(-s)) phi`` with the difference in closed form (no cancellation), the
  error constants through the whitened coordinates ``z = Sigma^(1/2) g`` (not the code's split).
* The closed-form gains of docs/kernels.md, the table of normalised kernels.
* The random-feature constant against a tensor Gauss-Hermite integral of its defining
  self-normalised importance-sampling expectation, at a ``Sigma`` and ``a`` where each of its
  factors moves it by a third or more.
* The refusals outside the range the sigmoid moments are computed over, and overflow.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
from numpy.polynomial.hermite_e import hermegauss
from scipy import integrate
from scipy.special import expit

from sfxlin.kernels import (SIGMOID_BIAS_MAX, SIGMOID_R_MAX, Kernel, kernel_gain, kernel_mse,
                            rf_feature_constant)
from sfxlin.laws import FloatOverflowError

RTOL = 1e-10
R_GRID = np.array([0.1, 0.5, 1.0, 2.0, 3.0, 5.0, 8.0, 10.0])
BIASES = [-20.0, -1.3, 0.0, 2.5, 20.0]
LS = [1.0, 50.0, 1e4]
TINY = 1e-290        # below: float64 underflow, compared absolutely
SIGMA = np.diag([1.5, 1.0, 0.5])
I3 = np.eye(3)
DIRECTION = np.array([0.8, 0.3, -0.5])     # not along an eigenvector of SIGMA


# ------------------------------------------------------------------ the kernels, from their definitions
def _sigmoid_odd_part(s, b):
    """``sigma(s + b) - sigma(b - s)`` for ``s >= 0`` without cancellation:
    ``sinh(s) / (2 cosh((s + b)/2) cosh((s - b)/2))``, whose logarithm is
    ``s - max(s, |b|) + log(1 - e^{-2s}) - log(1 + e^{-|s + b|}) - log(1 + e^{-|s - b|})``."""
    with np.errstate(divide="ignore"):
        return np.exp(s - np.maximum(s, abs(b)) + np.log(-np.expm1(-2 * s)) - np.log1p(np.exp(-np.abs(s + b)))
                      - np.log1p(np.exp(-np.abs(s - b))))


def _definition(name, T=1.0, b=0.0):
    """``(kappa, kappa', [kappa(s) - kappa(-s)], [kappa^2(s) - kappa^2(-s)], transitions, tilts)``
    for ``s > 0`` in the differences; ``tilts``: the rates ``c`` of ``e^{c s}`` factors (peaks at
    ``c r^2``)."""
    if name == "softmax":
        return (lambda s: np.exp(s / T), lambda s: np.exp(s / T) / T, lambda s: 2 * np.sinh(s / T),
                lambda s: 2 * np.sinh(2 * s / T), [], [1 / T, 2 / T])
    if name == "linear":
        return (lambda s: s, lambda s: np.ones_like(s), lambda s: 2 * s, lambda s: 0 * s, [], [])
    if name in ("relu", "relu_norm", "relu2", "relu2_norm"):
        p = 2 if name.startswith("relu2") else 1
        return (lambda s: np.maximum(s, 0.0) ** p, lambda s: p * np.maximum(s, 0.0) ** (p - 1) * (s > 0),
                lambda s: s**p, lambda s: s ** (2 * p), [0.0], [])
    k = lambda s: expit(s + b)  # noqa: E731
    return (k, lambda s: expit(s + b) * expit(-(s + b)), lambda s: _sigmoid_odd_part(s, b),
            lambda s: _sigmoid_odd_part(s, b) * (k(s) + k(-s)), [-b], [1.0, 2.0])


# ------------------------------------------------------------------ adaptive quadrature
def _quad(f, lo, hi, transitions, peaks):
    """``int_lo^hi f`` by scipy.integrate.quad on pieces: +-60 around each transition (where
    ``f`` changes on the unit scale), the rest, with ``points`` at the transitions, +-1 around
    them and the peaks."""
    cuts = sorted({lo, hi, *(c for t in transitions for c in (t - 60, t + 60) if lo < c < hi)})
    total = 0.0
    for a, c in zip(cuts[:-1], cuts[1:]):
        pts = sorted({p for t in transitions for p in (t - 1, t, t + 1)} | set(peaks))
        pts = [p for p in pts if a < p < c]
        total += integrate.quad(f, a, c, points=pts or None, epsabs=0, epsrel=2e-14, limit=2000)[0]
    return total


def _reference_moments(name, r, T=1.0, b=0.0):
    """``E kappa, E kappa', E kappa^2, E kappa^2 s, E kappa^2 s^2`` and ``E kappa s`` for
    ``s ~ N(0, r^2)`` by adaptive quadrature over ``|s| <= 45 r`` (the Gaussian mass beyond is
    below 1e-400)."""
    k, dk, odd_k, odd_k2, transitions, tilts = _definition(name, T, b)
    phi = lambda s: np.exp(-s * s / (2 * r * r)) / (math.sqrt(2 * math.pi) * r)  # noqa: E731
    peaks = [0.0, -r, r] + [c * r * r for c in tilts] + [t - c * r * r for t in transitions for c in tilts]
    full = lambda f: _quad(lambda s: f(s) * phi(s), -45 * r, 45 * r, transitions, peaks)  # noqa: E731
    half_transitions = [abs(t) for t in transitions]
    half_peaks = [p for p in peaks if p > 0]
    half = lambda f: _quad(lambda s: s * f(s) * phi(s), 0.0, 45 * r, half_transitions, half_peaks)  # noqa: E731
    e_k = 0.0 if name == "linear" else full(k)     # linear: an odd weight, E s = 0 (quad cannot reach epsrel at 0)
    return (e_k, full(dk), full(lambda s: k(s) ** 2), half(odd_k2), full(lambda s: k(s) ** 2 * s * s), half(odd_k))


def _assert_close(got, want, what):
    got, want = np.asarray(got, dtype=float), np.asarray(want, dtype=float)
    normal = np.abs(want) >= TINY
    assert np.all(np.abs(got - want)[normal] <= RTOL * np.abs(want)[normal]), (what, got, want)
    assert np.all(np.abs(got - want)[~normal] <= TINY), (what, got, want)


# ------------------------------------------------------------------ moments and gains
@pytest.mark.parametrize("b", BIASES)
def test_sigmoid_moments_and_gain_match_adaptive_quadrature(b):
    """The issue's case: bias -1.3 at r = 5 was 5.3e-5 off with 120-node Gauss-Hermite."""
    k = Kernel("sigmoid", bias=b)
    got = k.moments(R_GRID)
    gain = k.gain(R_GRID)
    for i, r in enumerate(R_GRID):
        want = _reference_moments("sigmoid", r, b=b)
        for j, name in enumerate(("E k", "E k'", "E k^2", "E k^2 s", "E k^2 s^2")):
            _assert_close(got[j][i], want[j], (b, r, name))
        _assert_close(gain[i], want[1], (b, r, "gain = E sigma'(s + b)"))


def test_sigmoid_logL_moments_and_gain_at_finite_L_match_adaptive_quadrature():
    """sigma(s - log L), vectorised over (r, L); gain L E sigma'(s - log L); limit exp(r^2 / 2)."""
    k = Kernel("sigmoid_logL")
    L = np.array(LS)
    got = k.moments(R_GRID[:, None], L[None, :])
    gain = k.gain(R_GRID[:, None], L[None, :])
    assert gain.shape == (len(R_GRID), len(LS))
    for i, r in enumerate(R_GRID):
        for m, Lm in enumerate(LS):
            want = _reference_moments("sigmoid", r, b=-math.log(Lm))
            for j, name in enumerate(("E k", "E k'", "E k^2", "E k^2 s", "E k^2 s^2")):
                _assert_close(got[j][i, m], want[j], (Lm, r, name))
            _assert_close(gain[i, m], Lm * want[1], (Lm, r, "gain"))
    # the L -> inf limit, E e^s by quadrature
    for r in (0.5, 2.0, 5.0):
        want = _quad(lambda s: np.exp(s - s * s / (2 * r * r)) / (math.sqrt(2 * math.pi) * r), -45 * r, 45 * r, [],
                     [0.0, r * r])
        _assert_close(k.gain(r), want, ("limit", r))


def _closed_form_kernel(name, T):
    """The kernel ``name``, softmax at the temperature ``T``."""
    return Kernel(name, temperature=T) if name == "softmax" else Kernel(name)


@pytest.mark.parametrize("name", ["softmax", "relu", "relu_norm", "relu2", "relu2_norm"])
def test_closed_form_moments_match_adaptive_quadrature(name):
    T = 1.7
    got = _closed_form_kernel(name, T).moments(R_GRID)
    for i, r in enumerate(R_GRID):
        want = _reference_moments(name, r, T=T)
        for j, what in enumerate(("E k", "E k'", "E k^2", "E k^2 s", "E k^2 s^2")):
            _assert_close(got[j][i], want[j], (name, r, what))


def test_linear_moments_match_adaptive_quadrature():
    """kappa(s) = s: E 1, E s^2, E s^4 against quadrature; E s^3 in the half-line form of the odd
    moments (kappa^2(s) - kappa^2(-s) = 0) and E s = 0 (symmetry) are exactly 0."""
    got = Kernel("linear").moments(R_GRID)
    for i, r in enumerate(R_GRID):
        want = _reference_moments("linear", r)
        for j, what in enumerate(("E k", "E k'", "E k^2", "E k^2 s", "E k^2 s^2")):
            _assert_close(got[j][i], want[j], ("linear", r, what))


#: the gains of docs/kernels.md section 1, and which kernels divide by the sum of their weights
DOC_GAINS = {"softmax": lambda r, T: np.full_like(r, 1 / T), "relu": lambda r, T: np.full_like(r, 0.5),
             "relu_norm": lambda r, T: np.sqrt(np.pi / 2) / r, "relu2": lambda r, T: r * np.sqrt(2 / np.pi),
             "relu2_norm": lambda r, T: 2 * np.sqrt(2 / np.pi) / r, "linear": lambda r, T: np.ones_like(r)}
DOC_NORMALISED = {"softmax", "relu_norm", "relu2_norm"}


@pytest.mark.parametrize("name", sorted(DOC_GAINS))
def test_closed_form_gains_are_the_documented_ones_and_the_stein_ratio(name):
    """gain = E kappa' / E kappa (normalised) or E kappa' (quadrature) = the closed form of the
    docs; relu2_norm's 2 sqrt(2/pi)/r is not relu2's r sqrt(2/pi) (they meet only at r = sqrt 2)."""
    T = 1.7
    r = np.array([0.3, 1.0, 2.5, 7.0])
    got = _closed_form_kernel(name, T).gain(r)
    np.testing.assert_allclose(got, DOC_GAINS[name](r, T), rtol=1e-14)
    for i, ri in enumerate(r):
        m = _reference_moments(name, ri, T=T)
        _assert_close(got[i], m[1] / m[0] if name in DOC_NORMALISED else m[1], (name, ri))
    assert Kernel(name).normalised == (name in DOC_NORMALISED)
    if name == "relu2_norm":
        assert np.all(np.abs(got / Kernel("relu2").gain(r) - 1) > 0.3)


def test_gain_from_sigma_and_q_is_the_gain_at_the_sigma_norm():
    q = np.array([[0.8, 0.3, -0.5], [0.1, -0.7, 0.2]])
    r = np.sqrt(np.einsum("qi,ij,qj->q", q, SIGMA, q))
    want = [_reference_moments("sigmoid", ri, b=-1.3)[1] for ri in r]
    _assert_close(kernel_gain(Kernel("sigmoid", bias=-1.3), SIGMA, I3, q), want, "kernel_gain")


# ------------------------------------------------------------------ error constants
def _whitened_second_moment(mom, r, Sigma, a, m):
    """``E[kappa^2 |z - m|^2]`` for ``z = S g``, ``S = Sigma^(1/2)``, ``g ~ N(0, I)``: with ``e = S a / r``
    and ``g = g_1 e + g_perp``, ``E|S g|^2 | g_1 = g_1^2 e^T Sigma e + tr Sigma - e^T Sigma e`` and
    ``E[m . S g | g_1] = g_1 m . S e``; ``g_1 = s / r``."""
    lam, Q = np.linalg.eigh(Sigma)
    S = Q @ np.diag(np.sqrt(lam)) @ Q.T
    e = S @ a / r
    eSe = e @ Sigma @ e
    k0, k1, k2, k2s, k2ss, ks = mom
    return eSe * (k2ss / r**2 - k2) + np.trace(Sigma) * k2 - 2 * (m @ S @ e) * k2s / r + (m @ m) * k2


def reference_mse(name, Sigma, a, L, T=1.0, b=0.0):
    """E||f_L - f_inf||^2 (V = I) at the logit vector ``a`` on N(0, Sigma) tokens: an i.i.d.
    (1/L)-mean (unnormalised), the sum of L terms against exp(r^2/2) Sigma a (sigmoid_logL), or the
    self-normalised importance-sampling constant / L (normalised). E[kappa z] = Sigma a E[kappa s] / r^2
    (projection on the logit, E[kappa s] by quadrature: no Stein)."""
    r = math.sqrt(a @ Sigma @ a)
    Sa = Sigma @ a
    if name == "sigmoid_logL":
        mom = _reference_moments("sigmoid", r, b=-math.log(L))
    else:
        mom = _reference_moments(name, r, T=T, b=b)
    mean = Sa * mom[5] / r**2                                     # E kappa z
    if name == "sigmoid_logL":
        var = _whitened_second_moment(mom, r, Sigma, a, np.zeros(len(a))) - mean @ mean
        return np.sum((L * mean - math.exp(r**2 / 2) * Sa) ** 2) + L * var
    if name in DOC_NORMALISED:
        g = mom[5] / r**2 / mom[0]
        return _whitened_second_moment(mom, r, Sigma, a, g * Sa) / mom[0] ** 2 / L
    return (_whitened_second_moment(mom, r, Sigma, a, np.zeros(len(a))) - mean @ mean) / L


@pytest.mark.parametrize("name, T, b, L", [("sigmoid", 1.0, -1.3, 256), ("sigmoid", 1.0, 2.5, 256),
                                           ("sigmoid_logL", 1.0, 0.0, 50), ("sigmoid_logL", 1.0, 0.0, 1e4),
                                           ("relu", 1.0, 0.0, 256), ("relu2", 1.0, 0.0, 256),
                                           ("softmax", 1.7, 0.0, 256), ("relu_norm", 1.0, 0.0, 256),
                                           ("relu2_norm", 1.0, 0.0, 256), ("linear", 1.0, 0.0, 256)])
def test_kernel_mse_matches_its_quadrature_in_whitened_coordinates(name, T, b, L):
    for r in (0.5, 2.0, 5.0, 10.0):
        a = r * DIRECTION / math.sqrt(DIRECTION @ SIGMA @ DIRECTION)
        want = reference_mse(name, SIGMA, a, L, T=T, b=b)
        got = kernel_mse(Kernel(name, temperature=T, bias=b), SIGMA, I3, a, L)
        _assert_close(got, want, (name, r, L))


def test_softmax_mse_constant_at_a_temperature_is_the_tilted_closed_form():
    """Under the tilt e^{2 s / T}, z ~ N(2 Sigma a / T, Sigma): the constant is
    exp(r^2 / T^2) (tr Sigma + |Sigma a|^2 / T^2)."""
    T, a = 1.7, np.array([0.6, 0.2, -0.5])
    r2, B = a @ SIGMA @ a, np.sum((SIGMA @ a) ** 2)
    expected = math.exp(r2 / T**2) * (np.trace(SIGMA) + B / T**2) / 100
    np.testing.assert_allclose(kernel_mse(Kernel("softmax", temperature=T), SIGMA, I3, a, 100), expected, rtol=1e-13)


# ------------------------------------------------------------------ random features
def snis_constant_by_quadrature(S, a, n_nodes=60):
    """``E[rho^2 |M w - Sigma a|^2] / E[rho]^2``, ``w ~ N(0, I_D)``, ``rho = exp(w.a + w^T M w / 2)``,
    ``M = Sigma (I + Sigma)^-1``: the delta-method constant of the self-normalised average
    ``M sum_j rho_j w_j / sum_j rho_j`` (whose mean is ``M E[rho w] / E[rho] = Sigma a``), by a tensor
    Gauss-Hermite rule on ``N(0, I_D)``."""
    D = S.shape[0]
    M = S @ np.linalg.inv(np.eye(D) + S)
    x, w = hermegauss(n_nodes)
    g = np.stack(np.meshgrid(*[x] * D, indexing="ij"), -1).reshape(-1, D)
    wt = np.prod(np.stack(np.meshgrid(*[w / math.sqrt(2 * math.pi)] * D, indexing="ij"), -1).reshape(-1, D), -1)
    rho = np.exp(g @ a + 0.5 * np.einsum("ni,ij,nj->n", g, M, g))
    return wt @ (rho**2 * np.sum((g @ M - S @ a) ** 2, -1)) / (wt @ rho) ** 2


def rotated_sigma(eigenvalues):
    """``Q diag(eigenvalues) Q^T`` for a fixed random rotation ``Q`` of R^3."""
    Q = np.linalg.qr(np.random.default_rng(11).standard_normal((3, 3)))[0]
    return Q @ np.diag(eigenvalues) @ Q.T


def test_rf_feature_constant_is_the_snis_expectation():
    """At Sigma with eigenvalues (0.3, 0.15, 0.05), rotated, and a = (0.7, -0.5, 0.4), the factors of
    the closed form are exp(-0.45), exp(0.51), exp(2.30), exp(-1.00) (log det(I - M), -log det(P)/2,
    2 a^T P^-1 a, -a.mu) and its two traces 0.124 and 0.061: each moves the value by a third or more,
    against a tolerance of 1e-10 (the rule is at rounding level: 40 and 60 nodes agree to 1e-14)."""
    S, a = rotated_sigma([0.3, 0.15, 0.05]), np.array([0.7, -0.5, 0.4])
    want = snis_constant_by_quadrature(S, a)
    assert abs(snis_constant_by_quadrature(S, a, 40) / want - 1) < 1e-13
    np.testing.assert_allclose(rf_feature_constant(S, I3, a), want, rtol=RTOL)
    np.testing.assert_allclose(rf_feature_constant(0.1 * I3, I3, 0.5 * I3[0]),
                               snis_constant_by_quadrature(0.1 * I3, 0.5 * I3[0]), rtol=RTOL)


# ------------------------------------------------------------------ range
def test_sigmoid_moments_at_the_ends_of_the_accepted_range_match_quadrature():
    """r up to SIGMOID_R_MAX and |bias| up to SIGMOID_BIAS_MAX (values below float64's range compare
    absolutely): the graded rule has no r or bias beyond which it stops resolving the transition."""
    for b in (-SIGMOID_BIAS_MAX, -300.0, 300.0, SIGMOID_BIAS_MAX):
        r = np.array([1e-6, 30.0, 1e4, SIGMOID_R_MAX])
        got = Kernel("sigmoid", bias=b).moments(r)
        for i, ri in enumerate(r):
            want = _reference_moments("sigmoid", ri, b=b)
            for j in range(5):
                _assert_close(got[j][i], want[j], (b, ri, j))
    for b in (-30.0, 0.0, 4.0):   # r = 0: s = 0, the moments are kappa(0), kappa'(0), kappa(0)^2, 0, 0
        k0 = expit(b)
        np.testing.assert_allclose(Kernel("sigmoid", bias=b).moments(0.0), [k0, k0 * expit(-b), k0**2, 0, 0],
                                   rtol=1e-14, atol=0)


def test_out_of_range_inputs_are_refused_with_the_argument_named():
    with pytest.raises(ValueError, match="bias"):
        Kernel("sigmoid", bias=SIGMOID_BIAS_MAX * 1.01)
    with pytest.raises(ValueError, match="r: "):
        Kernel("sigmoid").gain(2 * SIGMOID_R_MAX)
    with pytest.raises(ValueError, match="L: "):
        Kernel("sigmoid_logL").gain(1.0, L=1e305)
    with pytest.raises(ValueError, match="L: "):
        Kernel("sigmoid_logL").moments(1.0)
    with pytest.raises(FloatOverflowError, match="overflows"):
        Kernel("softmax").moments(40.0)
    with pytest.raises(FloatOverflowError, match="overflows"):
        Kernel("sigmoid_logL").gain(40.0)
    assert Kernel("softmax", temperature=2.0).gain(1e6) == 0.5
    np.testing.assert_allclose(Kernel("relu2_norm").gain(1e100), 2 * math.sqrt(2 / math.pi) / 1e100, rtol=1e-14)
    with pytest.raises(FloatOverflowError, match="overflows"):
        Kernel("relu2_norm").gain(1e200)
