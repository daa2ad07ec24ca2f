"""sfxlin.quadforms: exact Gaussian moments of quadratic forms against their textbook closed forms
(the moments of ``Q = w^T A w``, ``w ~ N(0, I)``, from its cumulants ``2^(k-1) (k-1)! tr A^k``) and a Monte Carlo."""
import numpy as np
import pytest

from sfxlin import quadforms as qf


def _sym(rng, *lead, d=3):
    G = rng.standard_normal(lead + (d, d))
    return 0.5 * (G + np.swapaxes(G, -1, -2))


def _tr(*mats):
    out = mats[0]
    for m in mats[1:]:
        out = out @ m
    return np.trace(out, axis1=-2, axis2=-1)


def test_powers_of_one_form_match_the_closed_forms():
    A = _sym(np.random.default_rng(0))
    t1, t2, t3, t4 = (_tr(*[A] * k) for k in (1, 2, 3, 4))
    Q = qf.form(0)
    Q2 = qf.mul(Q, Q)
    assert qf.expect(Q, [A]) == pytest.approx(t1, rel=1e-12)
    assert qf.expect(Q2, [A]) == pytest.approx(t1**2 + 2 * t2, rel=1e-12)
    assert qf.expect(qf.mul(Q2, Q), [A]) == pytest.approx(t1**3 + 6 * t1 * t2 + 8 * t3, rel=1e-12)
    assert qf.expect(qf.mul(Q2, Q2), [A]) == pytest.approx(
        t1**4 + 12 * t1**2 * t2 + 12 * t2**2 + 32 * t1 * t3 + 48 * t4, rel=1e-12)


def test_joint_cumulants_and_mixed_moments():
    """kappa(A, B) = 2 tr AB, kappa(A, B, C) = 8 tr ABC, kappa of four = 16 (tr ABCD + tr ABDC + tr ACBD);
    E[(c + Q_A)(Q_B + 2 Q_C)] by hand; leading axes broadcast with the coefficients."""
    rng = np.random.default_rng(1)
    A, B, C, D = (_sym(rng, 2) for _ in range(4))
    np.testing.assert_allclose(qf.joint_cumulant([A, B]), 2 * _tr(A, B), rtol=1e-12)
    np.testing.assert_allclose(qf.joint_cumulant([A, B, C]), 8 * _tr(A, B, C), rtol=1e-12)
    np.testing.assert_allclose(qf.joint_cumulant([A, B, C, D]),
                               16 * (_tr(A, B, C, D) + _tr(A, B, D, C) + _tr(A, C, B, D)), rtol=1e-12)
    c = np.array([0.5, -2.0])
    p = qf.mul(qf.add(qf.constant(c), qf.form(0)), qf.add(qf.form(1), qf.form(2, 2.0)))
    tA, tB, tC = _tr(A), _tr(B), _tr(C)
    expect = c * (tB + 2 * tC) + tA * tB + 2 * _tr(A, B) + 2 * (tA * tC + 2 * _tr(A, C))
    got = qf.expect(p, [A, B, C])
    assert got.shape == (2,)
    np.testing.assert_allclose(got, expect, rtol=1e-12)


def test_a_degree_five_polynomial_against_monte_carlo():
    """E[Q_A^2 Q_B^2 Q_C - 3 Q_A Q_C] within 4 SE of 2e5 draws."""
    rng = np.random.default_rng(2)
    A, B, C = (_sym(rng) for _ in range(3))
    p = qf.add(qf.mul(qf.mul(qf.mul(qf.form(0), qf.form(0)), qf.mul(qf.form(1), qf.form(1))), qf.form(2)),
               qf.mul(qf.form(0), qf.form(2, -3.0)))
    w = rng.standard_normal((200_000, 3))
    qa, qb, qc = (np.einsum("ni,ij,nj->n", w, M, w) for M in (A, B, C))
    x = qa**2 * qb**2 * qc - 3 * qa * qc
    assert abs(qf.expect(p, [A, B, C]) - x.mean()) < 4 * x.std() / np.sqrt(x.size)
