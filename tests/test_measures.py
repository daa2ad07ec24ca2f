"""Every criterion's measure, through the real code path ``module.verdicts(ds)``, on synthetic
results files with known answers (:mod:`synthetic`).

For every criterion: the synthetic file passes; one bad cell, setting, seed or checkpoint among
good ones makes it fail where the criterion says "every" or "max over" (so an ``all`` that became
an ``any``, a ``max`` that became a ``min``, a wrong ``sel`` or ``isel`` flips a verdict); every
``in`` interval is probed just inside and just outside both ends, every ``<``, ``>`` at its bound.
Values the criterion must ignore (other laws, models, settings, checkpoints, prompt lengths, seeds
outside the protocol) are set to values that would fail it. Then files with too few prompt lengths
or tau values: INCONCLUSIVE with the reason, a fit table and a figure all the same.
"""
from __future__ import annotations

import numpy as np
import pytest
import xarray as xr
from statsmodels.stats.proportion import proportion_confint

import synthetic
from sfxlin.analysis import c1, c2, c2_threshold, c3
from sfxlin.analysis.tables import to_text
from sfxlin.analysis.verdicts import FAIL, INCONCLUSIVE, PASS, Criterion, Inconclusive, evaluate

HAIR = 1e-6     # relative step across a bound: far above rounding, far below any bound's meaning


def rows(module, ds):
    """``{criterion id: VerdictRow}`` of ``module.verdicts(ds)``: the CLI's code path."""
    return {r.id: r for r in module.verdicts(ds)}


def put(ds, var, value, **sel):
    """``ds[var].loc[sel] = value`` in place (``value`` may be a function of the current values);
    returns ``ds``."""
    target = ds[var].loc[sel]
    if callable(value):
        value = value(target)
    if isinstance(value, xr.DataArray):
        value = value.transpose(*target.dims).values
    ds[var].loc[sel] = value
    return ds


def tilt(dp):
    """Multiply a curve along L by ``(L / L_min)^dp``: its log-log slope moves by ``dp``."""
    return lambda da: da * (da.L / da.L[0]) ** dp


def case(name, cid, expected, mutate):
    """One parametrized case: ``mutate`` the synthetic file, then ``cid`` is ``expected``."""
    return pytest.param(cid, mutate, expected, id=name)


@pytest.mark.parametrize("module, make", [(c1, synthetic.c1), (c2, synthetic.c2), (c2_threshold, synthetic.c2t),
                                          (c3, synthetic.c3)], ids=["c1", "c2", "c2_threshold", "c3"])
def test_synthetic_files_pass_every_criterion(module, make):
    got = rows(module, make())
    assert {k: r.verdict for k, r in got.items()} == {k: PASS for k in got}


def test_measures_equal_the_analytic_answers():
    L1, L3 = synthetic.c1().L.values, np.array(synthetic.C3_L, dtype=float)
    m = c1.measures(synthetic.c1())
    np.testing.assert_allclose(m["C1-slopes"], -1.0, rtol=0, atol=1e-12)
    np.testing.assert_allclose(m["C1-sharp-constant"], 1.0, rtol=1e-12)
    np.testing.assert_allclose(m["C1-plateau"], 1.0, rtol=1e-12)
    growth = (L1[-1] / L1[0]) ** 0.5
    assert (m["C1-quadrature"], m["C1-monotone"]) == (4e-15, 1.0)
    assert m["C1-student-t-grows"] == pytest.approx(growth, rel=1e-12) and m["C1-sqrtL-grows"] == pytest.approx(growth)
    m = c2.measures(synthetic.c2())
    assert (m["C2-tail-violations"], m["C2-grad-violations"]) == (0, 0)
    np.testing.assert_allclose(m["C2-tail-clt"], 1.0, rtol=1e-12)
    np.testing.assert_allclose(m["C2-grad-slopes"], -1.0, rtol=0, atol=1e-12)
    np.testing.assert_allclose(m["C2-traj-fixed"], -0.5, rtol=0, atol=1e-12)
    np.testing.assert_allclose(m["C2-traj-uniform"], -0.45, rtol=0, atol=1e-12)
    m = c2_threshold.measures(synthetic.c2t())
    np.testing.assert_allclose(m["C2T-fixed-exponent"], -0.5, rtol=0, atol=1e-12)
    assert m["C2T-uniform-low-tau"] == pytest.approx(-0.025, abs=1e-12)
    assert m["C2T-uniform-high-tau"] == pytest.approx(-0.3, abs=1e-12)
    assert m["C2T-separation-low-tau"] == pytest.approx(0.475, abs=1e-12)
    assert (m["C2T-uniform-trend"], m["C2T-break-location"], m["C2T-break-covers-4"]) == (-1.0, 4.0, 1.0)
    m = c3.measures(synthetic.c3())
    for cid in ("C3a-monotone", "C3b-monotone", "C3d-inf", "C3d-softmax"):
        assert np.ravel(m[cid]).tolist() == [0.0, 0.0], cid
    np.testing.assert_allclose(m["C3a-slope"], -0.5, rtol=0, atol=1e-12)
    np.testing.assert_allclose(m["C3a-final"], 0.5 * 512**-0.5, rtol=1e-12)
    np.testing.assert_allclose(m["C3b-final"], 0.01 * 512**-0.7 / 1.09, rtol=1e-12)
    np.testing.assert_allclose(m["C3c"], 512**-0.3, rtol=1e-12)
    np.testing.assert_allclose(m["C3-inf-risk"], 1e-12, rtol=1e-12)
    np.testing.assert_allclose(m["C3-inf-bayes"], 1e-4, rtol=1e-12)
    np.testing.assert_allclose(np.ravel(m["C3-linL-gap"]), np.full(6, 0.01), rtol=1e-9)
    control = 0.2 + 2.0 * (L3 / 8) ** -2
    assert float(m["C3e-drop"]) == pytest.approx(control[0] / control[-1], rel=1e-12)
    assert float(m["C3e-plateau"]) == pytest.approx(np.polyfit(np.log(L3[-4:]), np.log(control[-4:]), 1)[0], rel=1e-9)


def test_an_inconclusive_measure_carries_its_reason():
    crit = Criterion(id="x", claim="C1", description="", kind="<", threshold=1.0)
    (row,) = evaluate([crit], {"x": Inconclusive("needs >= 3 prompt lengths for a log-log slope, got 1")})
    assert (row.verdict, row.measured_str, row.note) == (INCONCLUSIVE, "n/a",
                                                         "needs >= 3 prompt lengths for a log-log slope, got 1")
    (row,) = evaluate([crit], {"x": Inconclusive("why")}, inconclusive={"x": "flag"})
    assert row.verdict == INCONCLUSIVE and "flag" in row.note


# --------------------------------------------------------------------------- C1

G33 = dict(law="gaussian", d=3, U_norm=0.5)
L_MAX_C1 = synthetic.c1().L.values[-1]


def _sharp(r):
    """C1 Gaussian error / sharp asymptotics = r at the largest L in setting (d=3, U_norm=0.5)."""
    return lambda ds: put(ds, "mse_asymptotic", lambda a: ds.mse.sel(**G33).loc[dict(L=L_MAX_C1)] / r,
                          d=3, U_norm=0.5, L=L_MAX_C1)


def _plateau(r, U_norm=0.5):
    """C1-plateau ratio r for the uniform law at d = 3 (at ``U_norm``)."""
    sel = dict(law="uniform", d=3, U_norm=U_norm, L=L_MAX_C1)
    return lambda ds: put(ds, "mse_predicted", lambda p: ds.mse.loc[sel] / r, **sel)


def _flat_student_t(ds, d=(2, 3)):
    """Student-t error constant in L (growth exactly 1) at the largest U_norm for ``d``."""
    for dv in d:
        put(ds, "mse", lambda m, v=float(dv): m * 0 + v, law="student_t", d=dv, U_norm=0.5)
    return ds


C1_CASES = [
    case("quadrature-at-bound", "C1-quadrature", FAIL, lambda ds: put(ds, "quadrature_error", 1e-8, D_quad=3)),
    case("quadrature-below", "C1-quadrature", PASS, lambda ds: put(ds, "quadrature_error", 1e-8 * (1 - HAIR), D_quad=3)),
    case("slopes-one-setting-off", "C1-slopes", FAIL, lambda ds: put(ds, "mse", tilt(0.2), **G33)),
    case("slopes-low-inside", "C1-slopes", PASS, lambda ds: put(ds, "mse", tilt(-0.1 + HAIR), **G33)),
    case("slopes-low-outside", "C1-slopes", FAIL, lambda ds: put(ds, "mse", tilt(-0.1 - HAIR), **G33)),
    case("slopes-high-inside", "C1-slopes", PASS, lambda ds: put(ds, "mse", tilt(0.1 - HAIR), **G33)),
    case("slopes-high-outside", "C1-slopes", FAIL, lambda ds: put(ds, "mse", tilt(0.1 + HAIR), **G33)),
    case("slopes-other-laws-ignored", "C1-slopes", PASS,
         lambda ds: put(ds, "mse", tilt(0.3), law=["rademacher", "uniform"])),
    case("monotone-one-flat-step", "C1-monotone", FAIL,
         lambda ds: put(ds, "mse", lambda m: ds.mse.sel(**G33).isel(L=1).values, **G33, L=ds.L.values[2])),
    case("monotone-one-increase", "C1-monotone", FAIL,
         lambda ds: put(ds, "mse", lambda m: 1.01 * ds.mse.sel(**G33).isel(L=1).values, **G33, L=ds.L.values[2])),
    case("monotone-other-laws-ignored", "C1-monotone", PASS, lambda ds: put(ds, "mse", tilt(2.0), law="uniform")),
    case("sharp-low-inside", "C1-sharp-constant", PASS, _sharp(0.9 * (1 + HAIR))),
    case("sharp-low-outside", "C1-sharp-constant", FAIL, _sharp(0.9 * (1 - HAIR))),
    case("sharp-high-inside", "C1-sharp-constant", PASS, _sharp(1.1 * (1 - HAIR))),
    case("sharp-high-outside", "C1-sharp-constant", FAIL, _sharp(1.1 * (1 + HAIR))),
    case("student-t-no-growth", "C1-student-t-grows", FAIL, _flat_student_t),
    case("student-t-growth-in-one-d", "C1-student-t-grows", PASS, lambda ds: _flat_student_t(ds, d=(2,))),
    case("student-t-growth-at-small-U-only", "C1-student-t-grows", FAIL,
         lambda ds: put(_flat_student_t(ds), "mse", tilt(2.0), law="student_t", U_norm=0.1)),
    case("sqrtL-no-growth", "C1-sqrtL-grows", FAIL, lambda ds: put(ds, "mse_scaled_U", lambda m: m * 0 + 1.0, U_norm=0.5)),
    case("sqrtL-growth-at-small-U-only", "C1-sqrtL-grows", FAIL,
         lambda ds: put(put(ds, "mse_scaled_U", lambda m: m * 0 + 1.0, U_norm=0.5), "mse_scaled_U", tilt(2.0),
                        U_norm=0.1)),
    case("plateau-low-inside", "C1-plateau", PASS, _plateau(0.9 * (1 + HAIR))),
    case("plateau-low-outside", "C1-plateau", FAIL, _plateau(0.9 * (1 - HAIR))),
    case("plateau-high-inside", "C1-plateau", PASS, _plateau(1.1 * (1 - HAIR))),
    case("plateau-high-outside", "C1-plateau", FAIL, _plateau(1.1 * (1 + HAIR))),
    case("plateau-small-U-ignored", "C1-plateau", PASS, _plateau(2.0, U_norm=0.1)),
]


@pytest.mark.parametrize("cid, mutate, expected", C1_CASES)
def test_c1_criteria(cid, mutate, expected):
    ds = mutate(synthetic.c1())
    assert rows(c1, ds)[cid].verdict == expected


# --------------------------------------------------------------------------- C2

CELL = dict(d=3, U_norm=0.5, setting="anisotropic", scale=2.0)
TEST = dict(d=3, U_norm=0.5, seed=1, query=0, L=64, level=0.125)
CLT = dict(d=2, U_norm=0.1, L=128, level=0.03125)      # largest L; expected count n * level = 128 per test
CI_LOW = float(proportion_confint(512, 4096, alpha=0.05, method="beta")[0])   # count 512 of n = 4096
C2_LOW_LEVEL = synthetic.C2_LEVELS[-1]                                        # below the CLT criterion's 1e-3


def _clt_counts(first, rest):
    """C2-tail-clt at CLT: count ``first`` in one (seed, query) and ``rest`` in the other three."""
    return lambda ds: put(put(ds, "tail_count", float(rest), **CLT), "tail_count", float(first), seed=0, query=0, **CLT)


def _traj(t, p, c):
    """C2 trajectory gap of the anisotropic setting at checkpoint ``t``: ``c (L/8)^p`` per seed factor."""
    factors = xr.DataArray(synthetic.SEED_FACTORS, dims="traj_seed")
    return lambda ds: put(ds, "traj_g", lambda g: c * (g.L / g.L[0]) ** p * factors, setting="anisotropic", t=t)


C2_CASES = [
    case("tail-one-violation", "C2-tail-violations", FAIL, lambda ds: put(ds, "tail_bound", 0.01, **TEST)),
    case("tail-bound-at-ci-low", "C2-tail-violations", PASS, lambda ds: put(ds, "tail_bound", CI_LOW, **TEST)),
    case("tail-bound-below-ci-low", "C2-tail-violations", FAIL,
         lambda ds: put(ds, "tail_bound", CI_LOW * (1 - HAIR), **TEST)),
    case("tail-some-vacuous", "C2-tail-violations", PASS, lambda ds: put(ds, "tail_bound", 1.0, **TEST)),
    case("tail-all-vacuous", "C2-tail-violations", INCONCLUSIVE, lambda ds: put(ds, "tail_bound", 1.0)),
    case("clt-high-end", "C2-tail-clt", PASS, _clt_counts(256, 256)),
    case("clt-above", "C2-tail-clt", FAIL, _clt_counts(257, 256)),
    case("clt-low-end", "C2-tail-clt", PASS, _clt_counts(64, 64)),
    case("clt-below", "C2-tail-clt", FAIL, _clt_counts(63, 64)),
    case("clt-small-L-ignored", "C2-tail-clt", PASS, lambda ds: put(ds, "tail_count", 0.0, L=64)),
    case("clt-low-level-ignored", "C2-tail-clt", PASS, lambda ds: put(ds, "tail_count", 0.0, level=C2_LOW_LEVEL)),
    case("grad-one-violation", "C2-grad-violations", FAIL,
         lambda ds: put(ds, "grad_log_bound", lambda b: np.log(ds.grad_gap_sq.loc[dict(seed=1, L=32, **CELL)]) - HAIR,
                        seed=1, L=32, **CELL)),
    case("grad-bound-equal-gap", "C2-grad-violations", PASS,
         lambda ds: put(ds, "grad_log_bound", lambda b: np.log(ds.grad_gap_sq.loc[dict(seed=1, L=32, **CELL)]),
                        seed=1, L=32, **CELL)),
    case("grad-slopes-one-cell-off", "C2-grad-slopes", FAIL, lambda ds: put(ds, "grad_gap_sq", tilt(0.2), **CELL)),
    case("grad-slopes-low-inside", "C2-grad-slopes", PASS, lambda ds: put(ds, "grad_gap_sq", tilt(-0.15 + HAIR), **CELL)),
    case("grad-slopes-low-outside", "C2-grad-slopes", FAIL, lambda ds: put(ds, "grad_gap_sq", tilt(-0.15 - HAIR), **CELL)),
    case("grad-slopes-high-inside", "C2-grad-slopes", PASS, lambda ds: put(ds, "grad_gap_sq", tilt(0.15 - HAIR), **CELL)),
    case("grad-slopes-high-outside", "C2-grad-slopes", FAIL, lambda ds: put(ds, "grad_gap_sq", tilt(0.15 + HAIR), **CELL)),
    case("traj-fixed-low-inside", "C2-traj-fixed", PASS, _traj(0, -0.6 + HAIR, 1.0)),
    case("traj-fixed-low-outside", "C2-traj-fixed", FAIL, _traj(0, -0.6 - HAIR, 1.0)),
    case("traj-fixed-high-inside", "C2-traj-fixed", PASS, _traj(0, -0.4 - HAIR, 1.0)),
    case("traj-fixed-high-outside", "C2-traj-fixed", FAIL, _traj(0, -0.4 + HAIR, 1.0)),
    case("traj-uniform-low-inside", "C2-traj-uniform", PASS, _traj(20, -0.6 + HAIR, 10.0)),
    case("traj-uniform-low-outside", "C2-traj-uniform", FAIL, _traj(20, -0.6 - HAIR, 10.0)),
    case("traj-uniform-high-inside", "C2-traj-uniform", PASS, _traj(20, -0.4 - HAIR, 10.0)),
    case("traj-uniform-high-outside", "C2-traj-uniform", FAIL, _traj(20, -0.4 + HAIR, 10.0)),
]


@pytest.mark.parametrize("cid, mutate, expected", C2_CASES)
def test_c2_criteria(cid, mutate, expected):
    ds = mutate(synthetic.c2())
    got = rows(c2, ds)[cid]
    assert got.verdict == expected, got.measured_str
    if expected == INCONCLUSIVE:
        assert got.note == "flagged inconclusive: every tail bound is vacuous (>= 1)"


# --------------------------------------------------------------------------- C2 threshold

TAU = np.array(synthetic.C2T_TAU)


def _uniform(i, value):
    """Hinge exponents (break at 4) with the one at tau index ``i`` replaced by ``value``."""
    u = synthetic.hinge(TAU)
    u[i] = value
    return u


def _ranks(*swaps):
    """Uniform exponents decreasing in tau, then with the given pairs of positions swapped."""
    p = np.arange(TAU.size)
    for i, j in swaps:
        p[[i, j]] = p[[j, i]]
    return -0.1 - 0.02 * p


def _fixed(i, value):
    """Fixed-parameter exponents -1/2 with the one at tau index ``i`` replaced by ``value``."""
    f = np.full(TAU.size, -0.5)
    f[i] = value
    return f


C2T_CASES = [
    ("fixed-one-tau-off", "C2T-fixed-exponent", FAIL, dict(fixed=_fixed(5, -0.3))),
    ("fixed-low-inside", "C2T-fixed-exponent", PASS, dict(fixed=_fixed(5, -0.65 + HAIR))),
    ("fixed-low-outside", "C2T-fixed-exponent", FAIL, dict(fixed=_fixed(5, -0.65 - HAIR))),
    ("fixed-high-inside", "C2T-fixed-exponent", PASS, dict(fixed=_fixed(12, -0.35 - HAIR))),
    ("fixed-high-outside", "C2T-fixed-exponent", FAIL, dict(fixed=_fixed(12, -0.35 + HAIR))),
    ("low-tau-just-above", "C2T-uniform-low-tau", PASS, dict(uniform=_uniform(0, -0.1 + HAIR))),
    ("low-tau-just-below", "C2T-uniform-low-tau", FAIL, dict(uniform=_uniform(0, -0.1 - HAIR))),
    ("high-tau-just-below", "C2T-uniform-high-tau", PASS, dict(uniform=_uniform(-1, -0.25 - HAIR))),
    ("high-tau-just-above", "C2T-uniform-high-tau", FAIL, dict(uniform=_uniform(-1, -0.25 + HAIR))),
    ("trend-rho-minus-0.802", "C2T-uniform-trend", PASS, dict(uniform=_ranks((0, 6)))),
    ("trend-rho-minus-0.797", "C2T-uniform-trend", FAIL, dict(uniform=_ranks((0, 6), (8, 9)))),
    ("separation-just-above", "C2T-separation-low-tau", PASS, dict(uniform=_uniform(0, -0.3 + HAIR))),
    ("separation-just-below", "C2T-separation-low-tau", FAIL, dict(uniform=_uniform(0, -0.3 - HAIR))),
    ("break-at-2", "C2T-break-location", PASS, dict(uniform=synthetic.hinge(TAU, 2.0))),
    ("break-at-1.9", "C2T-break-location", FAIL, dict(uniform=synthetic.hinge(TAU, 1.9))),
    ("break-at-8", "C2T-break-location", PASS, dict(uniform=synthetic.hinge(TAU, 8.0))),
    ("break-at-8.1", "C2T-break-location", FAIL, dict(uniform=synthetic.hinge(TAU, 8.1))),
    ("break-at-6-misses-4", "C2T-break-covers-4", FAIL, dict(uniform=synthetic.hinge(TAU, 6.0))),
]
NO_BREAK = -0.03 * TAU + 0.02 * (-1.0) ** np.arange(TAU.size)   # no kink: the break's CI reaches the grid's ends


@pytest.mark.parametrize("cid, kwargs, expected", [case(*c) for c in C2T_CASES])
def test_c2_threshold_criteria(cid, kwargs, expected):
    got = rows(c2_threshold, synthetic.c2t(**kwargs))[cid]
    assert got.verdict == expected, got.measured_str


def test_c2_threshold_break_criteria_inconclusive_when_no_break_is_located():
    got = rows(c2_threshold, synthetic.c2t(uniform=NO_BREAK))
    for cid in c2_threshold.BREAK_CRITERIA:
        assert got[cid].verdict == INCONCLUSIVE
        assert got[cid].note.startswith("flagged inconclusive: the 95% CI of the break")
    assert got["C2T-uniform-trend"].verdict == PASS


# --------------------------------------------------------------------------- C3

SM = dict(model="softmax")
L_C3 = np.array(synthetic.C3_L)


def _bump(setting, *at, var="D_inf", t=20, **sel):
    """Make a curve rise at the given L indices: the value there is 1.2x the previous L's."""
    def mutate(ds):
        where = dict(setting=setting, t=t, **sel) if t is not None else dict(setting=setting, **sel)
        for i in at:
            put(ds, var, lambda v: 1.2 * ds[var].loc[dict(where, L=L_C3[i - 1])].values, **where, L=L_C3[i])
        return ds
    return mutate


def _flat(setting, i, **sel):
    """Make D(L) of ``setting`` flat at the ``i``-th L step (equal to the previous L): no increase."""
    where = dict(setting=setting, **sel)
    return lambda ds: put(ds, "D_inf", lambda v: ds.D_inf.loc[dict(where, L=L_C3[i - 1])].values, **where, L=L_C3[i])


def _gauss(var, value, **sel):
    return lambda ds: put(ds, var, value, setting="anisotropic", **sel)


def _control_D(values):
    """Control's D(L) (softmax, seed 0, at the sup t = 20) set to ``values``."""
    return lambda ds: put(ds, "D_inf", np.asarray(values, dtype=float), setting="rademacher", seed=0, t=20, **SM)


def _plateau_slope(p):
    """Control: steep first six L, then ``(L / 512)^p`` over the last four."""
    return _control_D(np.r_[[4.0, 3.5, 3.0, 2.5, 2.0, 1.5], (L_C3[-4:] / L_C3[-4]) ** p])


C3_CASES = [
    case("monotone-one-increase", "C3a-monotone", PASS, _bump("anisotropic", 3, **SM)),
    case("monotone-two-increases-one-setting", "C3a-monotone", FAIL, _bump("anisotropic", 3, 6, **SM)),
    case("monotone-flat-step-is-no-increase", "C3a-monotone", PASS,
         lambda ds: _flat("anisotropic", 6, **SM)(_bump("anisotropic", 3, **SM)(ds))),
    case("monotone-linear-model-ignored", "C3a-monotone", PASS, _bump("anisotropic", 3, 5, 7, model="linear")),
    case("monotone-control-ignored", "C3a-monotone", PASS, _bump("rademacher", 3, 5, 7, **SM)),
    case("slope-one-setting-off", "C3a-slope", FAIL, _gauss("D_inf", tilt(0.2), **SM)),
    case("slope-low-inside", "C3a-slope", PASS, _gauss("D_inf", tilt(-0.15 + HAIR), **SM)),
    case("slope-low-outside", "C3a-slope", FAIL, _gauss("D_inf", tilt(-0.15 - HAIR), **SM)),
    case("slope-high-inside", "C3a-slope", PASS, _gauss("D_inf", tilt(0.15 - HAIR), **SM)),
    case("slope-high-outside", "C3a-slope", FAIL, _gauss("D_inf", tilt(0.15 + HAIR), **SM)),
    case("final-at-bound", "C3a-final", FAIL, _gauss("D_inf", 0.05, t=20, L=4096, **SM)),
    case("final-below", "C3a-final", PASS, _gauss("D_inf", 0.05 * (1 - HAIR), t=20, L=4096, **SM)),
    case("final-cell-outside-protocol-ignored", "C3a-final", PASS,
         lambda ds: put(put(ds, "in_protocol", 0.0, setting="isotropic", seed=1), "D_inf", 1e3,
                        setting="isotropic", seed=1)),
    case("heldout-monotone-one-increase", "C3b-monotone", PASS, _bump("isotropic", 4, var="risk_heldout", t=None,
                                                                      t_heldout=40, **SM)),
    case("heldout-monotone-two-increases", "C3b-monotone", FAIL, _bump("isotropic", 4, 8, var="risk_heldout", t=None,
                                                                       t_heldout=40, **SM)),
    case("heldout-monotone-linear-ignored", "C3b-monotone", PASS, _bump("isotropic", 2, 4, 8, var="risk_heldout",
                                                                        t=None, t_heldout=40, model="linear")),
    case("heldout-final-at-bound", "C3b-final", FAIL,
         lambda ds: put(_gauss("risk_heldout", 1.0, L=4096, t_heldout=0, **SM)(ds), "risk_heldout", 0.02,
                        setting="anisotropic", L=4096, t_heldout=40, **SM)),
    case("heldout-final-below", "C3b-final", PASS,
         lambda ds: put(_gauss("risk_heldout", 1.0, L=4096, t_heldout=0, **SM)(ds), "risk_heldout", 0.02 * (1 - HAIR),
                        setting="anisotropic", L=4096, t_heldout=40, **SM)),
    case("bayes-ratio-at-bound", "C3c", FAIL,
         lambda ds: put(_gauss("dist_bayes", 1.0, L=8, t=40, **SM)(ds), "dist_bayes", 0.25, setting="anisotropic",
                        L=4096, t=40, **SM)),
    case("bayes-ratio-below", "C3c", PASS,
         lambda ds: put(_gauss("dist_bayes", 1.0, L=8, t=40, **SM)(ds), "dist_bayes", 0.25 * (1 - HAIR),
                        setting="anisotropic", L=4096, t=40, **SM)),
    case("offblock-inf-one-seed-one-t-at-bound", "C3d-inf", FAIL, _gauss("off_block_inf", 1e-8, seed=1, t=20)),
    case("offblock-inf-below", "C3d-inf", PASS, _gauss("off_block_inf", 1e-8 * (1 - HAIR), seed=1, t=20)),
    case("offblock-inf-control-ignored", "C3d-inf", PASS,
         lambda ds: put(ds, "off_block_inf", 1.0, setting="rademacher", seed=0)),
    case("offblock-softmax-one-seed-one-t-at-bound", "C3d-softmax", FAIL,
         _gauss("off_block", 1e-2, seed=0, t=20, L=4096, **SM)),
    case("offblock-softmax-below", "C3d-softmax", PASS, _gauss("off_block", 1e-2 * (1 - HAIR), seed=0, t=20, L=4096, **SM)),
    case("offblock-softmax-small-L-ignored", "C3d-softmax", PASS, _gauss("off_block", 1.0, L=8, **SM)),
    case("offblock-linear-ignored", "C3d-softmax", PASS, _gauss("off_block", 1.0, model="linear")),
    case("drop-at-bound", "C3e-drop", PASS, _control_D(np.r_[1.25, np.full(8, 0.5), 0.25])),
    case("drop-below", "C3e-drop", FAIL, _control_D(np.r_[1.25 * (1 - HAIR), np.full(8, 0.5), 0.25])),
    case("drop-seed-outside-protocol-ignored", "C3e-drop", PASS,
         lambda ds: put(ds, "D_inf", 1.0, setting="rademacher", seed=1)),
    case("plateau-just-above", "C3e-plateau", PASS, _plateau_slope(-0.25 + HAIR)),
    case("plateau-just-below", "C3e-plateau", FAIL, _plateau_slope(-0.25 - HAIR)),
    case("inf-risk-at-bound", "C3-inf-risk", PASS, _gauss("risk_inf", 1e-6, seed=1, t=40)),
    case("inf-risk-one-seed-above", "C3-inf-risk", FAIL, _gauss("risk_inf", 1e-6 * (1 + HAIR), seed=1, t=40)),
    case("inf-bayes-at-bound", "C3-inf-bayes", PASS, _gauss("dist_bayes_inf", 2e-3, seed=0, t=40)),
    case("inf-bayes-one-seed-above", "C3-inf-bayes", FAIL, _gauss("dist_bayes_inf", 2e-3 * (1 + HAIR), seed=0, t=40)),
    case("linL-gap-inside", "C3-linL-gap", PASS, _gauss("D_linL", lambda v: v / 1.01 * 1.0499, L=2048)),
    case("linL-gap-outside", "C3-linL-gap", FAIL, _gauss("D_linL", lambda v: v / 1.01 * 1.0501, L=2048)),
    case("linL-gap-outside-below", "C3-linL-gap", FAIL, _gauss("D_linL", lambda v: v / 1.01 * 0.9499, L=4096)),
    case("linL-gap-small-L-ignored", "C3-linL-gap", PASS, _gauss("D_linL", lambda v: 2 * v, L=512)),
]


@pytest.mark.parametrize("cid, mutate, expected", C3_CASES)
def test_c3_criteria(cid, mutate, expected):
    got = rows(c3, mutate(synthetic.c3()))[cid]
    assert got.verdict == expected, got.measured_str


# --------------------------------------------------------------------------- fits that cannot be done

SLOPE = "needs >= 3 prompt lengths for a log-log slope, got {}"

FEW = [
    pytest.param(c1, lambda: synthetic.c1(L=(16,)), {
        "C1-slopes": SLOPE.format(1),
        "C1-monotone": "needs >= 2 prompt lengths for a change along L, got 1",
        "C1-student-t-grows": "needs >= 2 prompt lengths for a change along L, got 1",
        "C1-sqrtL-grows": "needs >= 2 prompt lengths for a change along L, got 1",
        "C1-ar1-slopes": SLOPE.format(1)}, id="c1-L1"),
    pytest.param(c1, lambda: synthetic.c1(L=(16, 32)), {"C1-slopes": SLOPE.format(2), "C1-ar1-slopes": SLOPE.format(2)},
                 id="c1-L2"),
    pytest.param(c2, lambda: synthetic.c2(L=(8,)), {k: SLOPE.format(1) for k in ("C2-grad-slopes", "C2-traj-fixed",
                                                                          "C2-traj-uniform")}, id="c2-L1"),
    pytest.param(c2, lambda: synthetic.c2(L=(8, 16)), {k: SLOPE.format(2) for k in ("C2-grad-slopes", "C2-traj-fixed",
                                                                             "C2-traj-uniform")}, id="c2-L2"),
    pytest.param(c2_threshold, lambda: synthetic.c2t(tau=(1.0, 2.0, 4.0, 8.0, 12.0)), {
        k: "needs >= 6 tau values for the threshold regression, got 5" for k in c2_threshold.BREAK_CRITERIA},
        id="c2_threshold-tau5"),
    # the constant ratios are read at the largest L alone: measurable with one prompt length
    pytest.param(c2_threshold, lambda: synthetic.c2t(L=(8,)), {c.id: SLOPE.format(1) for c in c2_threshold.CRITERIA
                                                               if "constant-ratio" not in c.id}, id="c2_threshold-L1"),
    pytest.param(c2_threshold, lambda: synthetic.c2t(L=(8, 16)), {c.id: SLOPE.format(2) for c in c2_threshold.CRITERIA
                                                                  if "constant-ratio" not in c.id},
                 id="c2_threshold-L2"),
    pytest.param(c3, lambda: synthetic.c3(L=(8,)), {
        "C3a-monotone": "needs >= 3 prompt lengths for a count of increases along L, got 1",
        "C3a-slope": SLOPE.format(1),
        "C3b-monotone": "needs >= 3 prompt lengths for a count of increases along L, got 1",
        "C3c": "needs >= 2 prompt lengths for a ratio of L_max to L_min, got 1",
        "C3e-drop": "needs >= 2 prompt lengths for a ratio of L_max to L_min, got 1",
        "C3e-plateau": "needs >= 4 prompt lengths for the slope over the last four, got 1",
        "C3-linL-gap": "no prompt length >= 1024 in this file (largest 8)"}, id="c3-L1"),
    pytest.param(c3, lambda: synthetic.c3(L=(8, 16)), {
        "C3a-monotone": "needs >= 3 prompt lengths for a count of increases along L, got 2",
        "C3a-slope": SLOPE.format(2),
        "C3b-monotone": "needs >= 3 prompt lengths for a count of increases along L, got 2",
        "C3e-plateau": "needs >= 4 prompt lengths for the slope over the last four, got 2",
        "C3-linL-gap": "no prompt length >= 1024 in this file (largest 16)"}, id="c3-L2"),
]


@pytest.mark.parametrize("module, make, reasons", FEW)
def test_a_fit_that_cannot_be_done_is_inconclusive_with_its_reason(module, make, reasons, tmp_path):
    ds = make()
    got = rows(module, ds)
    assert {k: (r.verdict, r.note) for k, r in got.items() if k in reasons} == {
        k: (INCONCLUSIVE, why) for k, why in reasons.items()}
    assert not any(r.verdict == INCONCLUSIVE for k, r in got.items() if k not in reasons), \
        {k: r.note for k, r in got.items() if r.verdict == INCONCLUSIVE}
    table = to_text(module.fit_tables(ds))
    assert any(why in table for why in reasons.values())
    png = module.figure(ds, tmp_path / "x.png")
    assert png.stat().st_size > 1000 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_c2_secondary_fit_over_the_upper_half_needs_three_prompt_lengths():
    """3 prompt lengths: the criterion's slopes are fitted, the upper-half fit (2 points) is not."""
    ds = synthetic.c2(L=(8, 16, 32))
    assert {r.verdict for r in c2.verdicts(ds)} == {PASS}
    assert "secondary, L >= 16: not fitted, needs >= 3 prompt lengths >= 16 for a log-log slope, got 2" \
        in to_text(c2.fit_tables(ds))


def test_c3_plateau_needs_the_last_four_prompt_lengths():
    got = rows(c3, synthetic.c3(L=(8, 16, 32)))
    assert got["C3e-plateau"].note == "needs >= 4 prompt lengths for the slope over the last four, got 3"
    assert got["C3a-slope"].verdict == PASS
