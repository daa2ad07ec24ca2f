"""sfxlin.covariance: each generator's matrix against an independent construction, its summary
figures (closed forms against numpy), seeded generators' laws by Monte Carlo, spec strings and
their error messages."""
from __future__ import annotations

import math

import numpy as np
import pytest

from sfxlin import covariance as cov
from sfxlin.engine.params import Param, configure

# Tolerances: the figures come from eigvalsh (backward stable): relative error a few ulps times the
# condition number; 1e-10 relative covers condition numbers up to ~1e5 used here.
RTOL = 1e-10


def numpy_figures(S):
    """Figures by a route other than summary's eigvalsh: traces of products and inverses, the
    2-norm by SVD."""
    Sinv = np.linalg.inv(S)
    return {"trace": np.trace(S), "op_norm": np.linalg.norm(S, 2), "condition": np.linalg.cond(S, 2),
            "tr_inv2": np.trace(Sinv @ Sinv)}


def assert_figures(got, want, rtol=RTOL):
    for key in cov.SUMMARY_KEYS:
        if key in want:
            assert got[key] == pytest.approx(want[key], rel=rtol), key


# ------------------------------------------------------------------------------------------ generators

@pytest.mark.parametrize("d,s", [(1, 0.3), (3, 2.0), (7, 0.45)])
def test_isotropic(d, s):
    S = cov.isotropic(d, s)
    np.testing.assert_array_equal(S, s * np.eye(d))
    assert_figures(cov.summary(S), {"trace": d * s, "op_norm": s, "condition": 1.0, "tr_inv2": d / s**2})
    assert_figures(cov.closed_form(f"isotropic:{s}", d), numpy_figures(S))
    np.testing.assert_array_equal(cov.from_spec("isotropic", d), np.eye(d))


def test_diagonal_and_spec():
    S = cov.from_spec("diagonal:3/1/0.5", 3)
    np.testing.assert_array_equal(S, np.diag([3.0, 1.0, 0.5]))
    want = {"trace": 4.5, "op_norm": 3.0, "condition": 6.0, "tr_inv2": 1 / 9 + 1 + 4}
    assert_figures(cov.summary(S), want)
    assert_figures(cov.closed_form("diagonal:3/1/0.5", 3), want)
    assert_figures(numpy_figures(S), want)


@pytest.mark.parametrize("d,a", [(1, 1.0), (5, 1.0), (6, 0.5), (8, 2.0), (4, -1.0)])
def test_power_law(d, a):
    S = cov.power_law(d, a)
    lam = np.diag(S)
    np.testing.assert_array_equal(S, np.diag(lam))
    k = np.arange(1, d + 1)
    np.testing.assert_allclose(lam[0] / lam, k ** a, rtol=1e-13)     # lambda_k ∝ k^-a
    assert lam.sum() == pytest.approx(d, rel=1e-13)
    fig = cov.summary(S)
    assert_figures(fig, numpy_figures(S))
    assert fig["condition"] == pytest.approx(float(d) ** abs(a), rel=1e-12)
    assert_figures(cov.closed_form(f"power_law:{a}", d), fig)


@pytest.mark.parametrize("d", [1, 2, 3, 5, 10])
def test_geometric_is_the_geomspace_diagonal(d):
    """``geometric:2:0.5`` is ``diag(geomspace(2, 0.5, d))`` bit for bit (C2's anisotropic setting;
    ``diag(2, 1, 0.5)`` at d = 3), and its closed forms are its spectrum's."""
    S = cov.from_spec("geometric:2:0.5", d)
    np.testing.assert_array_equal(S, np.diag(np.geomspace(2.0, 0.5, d)))
    assert_figures(cov.closed_form("geometric:2:0.5", d), cov.summary(S))
    if d == 3:
        np.testing.assert_array_equal(S, cov.from_spec("diagonal:2/1/0.5", 3))
    with pytest.raises(ValueError, match="top and bottom must be > 0"):
        cov.from_spec("geometric:2:0", d)


@pytest.mark.parametrize("d", [1, 2, 5, 9])
def test_linear_spectrum(d):
    lam = np.diag(cov.linear_spectrum(d))
    np.testing.assert_allclose(np.diff(lam), -2.0 / (d + 1), rtol=1e-12)   # equally spaced, decreasing
    assert lam.sum() == pytest.approx(d, rel=1e-13)
    fig = cov.summary(cov.from_spec("linear", d))
    # closed forms: condition d, tr_inv2 = ((d + 1) / 2)^2 sum_k k^-2
    assert fig["condition"] == pytest.approx(d, rel=1e-12)
    assert fig["tr_inv2"] == pytest.approx(((d + 1) / 2) ** 2 * sum(1 / k**2 for k in range(1, d + 1)), rel=1e-12)
    assert_figures(cov.closed_form("linear", d), numpy_figures(np.diag(lam)))


@pytest.mark.parametrize("d,rho", [(1, 0.5), (2, 0.5), (3, 0.5), (6, -0.7), (10, 0.9), (5, 0.0)])
def test_kms_matrix_inverse_and_closed_forms(d, rho):
    S = cov.kms(d, rho)
    naive = np.array([[rho ** abs(i - j) for j in range(d)] for i in range(d)])
    np.testing.assert_allclose(S, naive, rtol=1e-14, atol=0)
    P = cov.kms_inverse(d, rho)
    cond = np.linalg.cond(S)
    np.testing.assert_allclose(P @ S, np.eye(d), atol=1e-14 * cond)
    np.testing.assert_allclose(P, np.linalg.inv(S), atol=1e-13 * cond)
    fig = cov.summary(S)
    assert_figures(fig, numpy_figures(S), rtol=1e-9)
    closed = cov.closed_form(f"kms:{rho}", d)
    assert closed["trace"] == d
    assert closed["tr_inv2"] == pytest.approx(np.sum(np.linalg.inv(S) ** 2), rel=1e-12 * cond)
    assert closed["tr_inv2"] == pytest.approx(fig["tr_inv2"], rel=1e-12 * cond)
    assert closed["logdet"] == pytest.approx(np.linalg.slogdet(S)[1], rel=1e-12, abs=1e-13)


def test_kms_operator_norm_bound():
    # the symbol of KMS is (1 - rho^2) / (1 - 2 rho cos t + rho^2): every eigenvalue lies strictly in
    # ((1 - |rho|) / (1 + |rho|), (1 + |rho|) / (1 - |rho|)) and the extremes approach the bounds as d grows
    for rho in (0.5, -0.5):
        hi = (1 + abs(rho)) / (1 - abs(rho))
        small, big = cov.summary(cov.kms(4, rho)), cov.summary(cov.kms(300, rho))
        assert small["op_norm"] < big["op_norm"] < hi
        assert big["op_norm"] > hi - 1e-3          # gap O(1/d^2)
        assert big["condition"] == pytest.approx(hi ** 2, rel=1e-3)


def test_rotated_keeps_the_spectrum_and_is_reproducible():
    lam = cov.power_law_eigs(5, 1.0)
    S = cov.rotated(lam, 3)
    np.testing.assert_allclose(np.linalg.eigvalsh(S), np.sort(lam), rtol=1e-12)
    assert np.abs(S - np.diag(np.diag(S))).max() > 0.05          # really rotated
    np.testing.assert_array_equal(S, cov.rotated(lam, 3))           # same seed, same matrix
    assert not np.allclose(S, cov.rotated(lam, 4))
    np.testing.assert_array_equal(cov.from_spec("rotated:power_law:1.0:seed=3", 5), S)
    assert_figures(cov.closed_form("rotated:power_law:1.0:seed=3", 5), numpy_figures(S), rtol=1e-9)
    # pinned value: default_rng(3)'s stream is the same on every machine; 1e-10 leaves room for LAPACK
    assert S[0, 1] == pytest.approx(PINNED_ROTATED_01, rel=1e-10)
    # a rotation of KMS keeps KMS's spectrum
    np.testing.assert_allclose(np.linalg.eigvalsh(cov.from_spec("rotated:kms:0.5:seed=1", 4)),
                               np.linalg.eigvalsh(cov.kms(4, 0.5)), rtol=1e-12)


# pinned entries (computed once): a change of generator, stream or construction moves them
PINNED_ROTATED_01 = -0.12688936673684265
PINNED_WISHART_02 = 1.1748101582411943


def test_haar_rotation_law():
    # Haar Q: the first column is uniform on the sphere, so E[Q] = 0 and E[Q_ij^2] = 1/d; and a rotated
    # spectrum has E[Sigma] = mean(eigs) I. Monte Carlo over n seeds, 5 standard errors.
    d, n = 3, 3000
    Qs = np.array([cov._haar(np.random.default_rng(s), d) for s in range(n)])
    se = 1 / math.sqrt(d * n)
    assert np.abs(Qs.mean(axis=0)).max() < 5 * se
    np.testing.assert_allclose((Qs ** 2).mean(axis=0), 1 / d, atol=5 * Qs.var(axis=0).max() ** 0.5 / math.sqrt(n) * 2)
    lam = np.array([3.0, 1.0, 0.5])
    Ss = np.array([cov.rotated(lam, s) for s in range(n)])
    mean, sd = Ss.mean(axis=0), Ss.std(axis=0)
    assert np.all(np.abs(mean - lam.mean() * np.eye(d)) < 5 * sd / math.sqrt(n) + 1e-15)


def test_inverse_wishart_law():
    # (dof - d - 1) W^-1 with W ~ Wishart(dof, I): E Sigma = I and, since E W^2 = dof (dof + d + 1) I,
    # E tr(Sigma^-2) = dof d (dof + d + 1) / (dof - d - 1)^2. Monte Carlo, 5 standard errors.
    d, dof, n = 3, 10, 4000
    Ss = np.array([cov.inverse_wishart(d, dof, s) for s in range(n)])
    mean, sd = Ss.mean(axis=0), Ss.std(axis=0)
    assert np.all(np.abs(mean - np.eye(d)) < 5 * sd / math.sqrt(n))
    t = np.array([cov.summary(S)["tr_inv2"] for S in Ss])
    want = dof * d * (dof + d + 1) / (dof - d - 1) ** 2
    assert abs(t.mean() - want) < 5 * t.std() / math.sqrt(n)
    S = cov.from_spec("inverse_wishart:dof=10:seed=1", 3)
    np.testing.assert_array_equal(S, cov.inverse_wishart(3, 10, 1))
    assert S[0, 2] == pytest.approx(PINNED_WISHART_02, rel=1e-10)
    assert_figures(cov.summary(S), numpy_figures(S), rtol=1e-9)
    assert cov.closed_form("inverse_wishart:dof=10:seed=1", 3) == {}


@pytest.mark.parametrize("spec", ["isotropic", "kms:0.5", "power_law:1.0", "rotated:linear:seed=2",
                                  "inverse_wishart:dof=9:seed=0"])
@pytest.mark.parametrize("target", [0.75, 4.0, 14.8])
def test_scaled_hits_the_target(spec, target):
    S = cov.from_spec(spec, 4)
    T = cov.scaled(S, target)
    Tinv = np.linalg.inv(T)
    assert np.trace(Tinv @ Tinv) == pytest.approx(target, rel=1e-10)
    c = T[0, 0] / S[0, 0]
    np.testing.assert_allclose(T, c * S, rtol=1e-14)
    assert c == pytest.approx(math.sqrt(cov.summary(S)["tr_inv2"] / target), rel=1e-14)


# ------------------------------------------------------------------------------------------ errors

@pytest.mark.parametrize("spec,d,words", [
    ("kms:1.5", 3, "rho must be in (-1, 1)"),
    ("kms:-1", 3, "rho must be in (-1, 1)"),
    ("diagonal:1/-1/2", 3, "eigs must be finite and > 0"),
    ("diagonal:1/0/2", 3, "eigs must be finite and > 0"),
    ("gaussian", 3, "unknown covariance family 'gaussian'"),
    ("diagonal:1/2", 3, "expected d = 3"),
    ("kms", 3, "kms needs rho"),
    ("kms:0.5:2", 3, "kms takes 1 argument"),
    ("kms:abc", 3, "rho must be a finite number"),
    ("power_law:x=1", 3, "power_law has no argument 'x'"),
    ("rotated:kms:0.5", 3, "expected rotated:<spec>:seed=N"),
    ("rotated:foo:seed=1", 3, "unknown covariance family 'foo'"),
    ("inverse_wishart:dof=3:seed=1", 3, "dof must be an integer > d + 1"),
    ("inverse_wishart:dof=10", 3, "inverse_wishart needs seed"),
    ("isotropic:-2", 3, "scale must be > 0"),
    ("kms:0.5,power_law:1", 3, "without spaces, ',' or ';'"),
    ("kms:0.5", 0, "d must be a positive integer"),
])
def test_bad_specs_give_one_clear_message(spec, d, words):
    with pytest.raises(ValueError) as err:
        cov.from_spec(spec, d)
    msg = str(err.value)
    assert msg.startswith("covariance spec ") and repr(spec) in msg, msg
    assert words in msg, msg


def test_bad_matrices():
    with pytest.raises(ValueError, match="symmetric"):
        cov.summary(np.array([[1.0, 0.5], [0.0, 1.0]]))
    with pytest.raises(ValueError, match="positive definite"):
        cov.summary(np.array([[1.0, 2.0], [2.0, 1.0]]))
    with pytest.raises(ValueError, match="finite"):
        cov.summary(np.array([[1.0, np.nan], [np.nan, 1.0]]))
    with pytest.raises(ValueError, match="target"):
        cov.scaled(np.eye(2), 0.0)
    with pytest.raises(ValueError, match="seed"):
        cov.rotated([1.0, 2.0], -1)


def test_spec_check_validates_a_configuration():
    params = (Param("d", "int", "dimension", 3, low=1),
              Param("families", "str_list", "covariance specs", ["isotropic", "kms:0.5"]))
    check = cov.spec_check("families")
    assert configure(params, overrides=["families=power_law:1.0,rotated:kms:0.3:seed=2"],
                     checks=(check,))["families"] == ("power_law:1.0", "rotated:kms:0.3:seed=2")
    with pytest.raises(ValueError, match=r"^families: covariance spec 'kms:1.5': rho must be in \(-1, 1\)"):
        configure(params, overrides=["families=isotropic,kms:1.5"], checks=(check,))
    with pytest.raises(ValueError, match=r"families: covariance spec 'diagonal:1/2'.*expected d = 3 .*\(d = 3\)"):
        configure(params, overrides=["families=diagonal:1/2"], checks=(check,))
