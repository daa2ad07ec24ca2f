"""The predeclared criteria, pinned: the literal table below is the protocol (docs/criteria.md).

Every criterion of every experiment (id, claim, kind, threshold), in order, as the documented
protocol states it (docs/criteria.md; the reference reproduction's predeclared criteria: C1 quadrature < 1e-8,
C1 slopes in [-1.1, -0.9]; C3a <= 1 increase, slope in [-0.65, -0.35], final distance < 5% of
||theta_inf||; C3b <= 1 increase, risk(4096) < 2% of the initial; C3c distance to Bayes at 4096 <
25% of that at 8; C3d off-block < 1e-8 (theta_inf), < 1e-2 (softmax at 4096); C3e(i) D(8) >=
5 D(4096); C3e(ii) control slope over the last four L > -0.25). An experiment whose declared
criteria (its analysis module's CRITERIA, as build() stores them) differ from this table in any of
these fields fails here: changing a direction or a bound is a change of
the protocol and must change this file too. Each criterion must also have a measure in its
analysis module, and each measure a criterion.
"""
from __future__ import annotations

import json

import pytest
import xarray as xr

import synthetic
from sfxlin.analysis import c1, c1_kernels, c1_own, c1_real, c2, c2_threshold, c3, c3_deep, c3_landscape
from sfxlin.analysis.verdicts import FAIL, PASS, Criterion, criteria_from_attrs, evaluate
from sfxlin.engine.sweep import criteria_of
from sfxlin.pipelines import c1_kernels as c1_kernels_pipeline
from sfxlin.pipelines import c1_limit, c2_concentration, c2_threshold as c2_threshold_pipeline, c3_transfer
from sfxlin.pipelines import c1_own as c1_own_pipeline
from sfxlin.pipelines import c1_real as c1_real_pipeline, c3_deep as c3_deep_pipeline
from sfxlin.pipelines import c3_landscape as c3_landscape_pipeline

PINNED = {
    "c1_kernels": [
        ("C1K-stein-smooth", "C1", "<", 1e-8),
        ("C1K-stein-kinked", "C1", "<", 1e-3),
        ("C1K-slopes", "C1", "in", (-1.15, -0.85)),
        ("C1K-sharp-constant", "C1", "in", (0.85, 1.15)),
        ("C1K-limit-mc", "C1", "in", (0.4, 2.5)),
        ("C1K-gain", "C1", "<", 4.0),
        ("C1K-rf-rate", "C1", "in", (-1.15, -0.85)),
        ("C1K-rf-constant", "C1", "in", (0.8, 1.2)),
        ("C1K-rf-slow", "C1", ">", -0.85),
    ],
    "c1_own": [
        ("C1O-slope", "C1", "in", (-1.15, -0.85)),
        ("C1O-slope-interval", "C1", "<=", 0.0),
        ("C1O-constant", "C1", "in", (0.75, 1.33)),
        ("C1O-Lstar", "C1", "in", (0.67, 1.5)),
        ("C1O-decomposition", "C1", "in", (0.85, 1.15)),
    ],
    "c1_limit": [
        ("C1-quadrature", "C1", "<", 1e-8),
        ("C1-slopes", "C1", "in", (-1.1, -0.9)),
        ("C1-monotone", "C1", ">=", 1.0),
        ("C1-sharp-constant", "C1", "in", (0.9, 1.1)),
        ("C1-student-t-grows", "C1", ">", 1.0),
        ("C1-sqrtL-grows", "C1", ">", 1.0),
        ("C1-plateau", "C1", "in", (0.9, 1.1)),
        ("C1-ar1-slopes", "C1", "in", (-1.1, -0.9)),
        ("C1-ar1-constant", "C1", "in", (0.9, 1.1)),
        ("C1-ar1-iid-rejected", "C1", ">", 1.1),
    ],
    "c2_concentration": [
        ("C2-tail-violations", "C2", "<=", 0),
        ("C2-tail-clt", "C2", "in", (0.5, 2.0)),
        ("C2-grad-violations", "C2", "<=", 0),
        ("C2-grad-slopes", "C2", "in", (-1.15, -0.85)),
        ("C2-traj-fixed", "C2", "in", (-0.6, -0.4)),
        ("C2-traj-uniform", "C2", "in", (-0.6, -0.4)),
    ],
    "c2_threshold": [
        ("C2T-fixed-exponent", "C2", "in", (-0.65, -0.35)),
        ("C2T-uniform-low-tau", "C2", ">", -0.1),
        ("C2T-uniform-high-tau", "C2", "<", -0.25),
        ("C2T-uniform-trend", "C2", "<=", -0.8),
        ("C2T-separation-low-tau", "C2", ">", 0.2),
        ("C2T-break-location", "C2", "in", (2.0, 8.0)),
        ("C2T-break-covers-4", "C2", ">=", 1.0),
        ("C2T-families-agree", "C2", "<=", 0.1),
        ("C2T-constant-ratio", "C2", "in", (0.5, 2.0)),
        ("C2T-constant-ratio-families", "C2", "in", (0.5, 2.0)),
        ("C2T-growth-below-4", "C2", ">", 0.0),
    ],
    "c1_real": [
        ("C1R-slopes", "C1", "in", (-1.1, -0.9)),
        ("C1R-sharp-constant", "C1", "in", (0.8, 1.2)),
        ("C1R-gauss-decomposition", "C1", "in", (0.85, 1.15)),
        ("C1R-bias-order", "C1", "in", (3.5, 4.5)),
    ],
    "c3_transfer": [
        ("C3a-monotone", "C3", "<=", 1),
        ("C3a-slope", "C3", "in", (-0.65, -0.35)),
        ("C3a-final", "C3", "<", 0.05),
        ("C3b-monotone", "C3", "<=", 1),
        ("C3b-final", "C3", "<", 0.02),
        ("C3c", "C3", "<", 0.25),
        ("C3d-inf", "C3", "<", 1e-8),
        ("C3d-softmax", "C3", "<", 1e-2),
        ("C3e-drop", "C3", ">=", 5.0),
        ("C3e-plateau", "C3", ">", -0.25),
        ("C3-inf-risk", "C3", "<=", 1e-6),
        ("C3-inf-bayes", "C3", "<=", 2e-3),
        ("C3-linL-gap", "C3", "<", 0.05),
    ],
    "c3_landscape": [
        ("C3L-risk-slope", "C3L", "in", (-1.2, -0.3)),
        ("C3L-D-slope", "C3L", "<=", -0.1),
        ("C3L-DlinL-slope", "C3L", "<=", -0.1),
        ("C3L-DlinL-ratio", "C3L", "in", (0.8, 1.25)),
        ("C3L-block", "C3L", "<", 1e-8),
        ("C3L-control-plateau", "C3L", ">", -0.25),
        ("C3L-control-gap", "C3L", ">", 1e-3),
    ],
    "c3_deep": [
        ("C3D-a-slope", "C3", "in", (-1.2, -0.8)),
        ("C3D-a-median-slope", "C3", "in", (-1.2, -0.8)),
        ("C3D-a-cov-slope", "C3", "in", (-0.65, -0.35)),
        ("C3D-b-slope", "C3", "in", (-0.65, -0.35)),
        ("C3D-b-heldout", "C3", "<", 0.5),
        ("C3D-b-heldout-limit", "C3", "<", 0.5),
    ],
}

#: the quick profile's calibration of the C3 experiments (``quick=`` of each criterion, in order): a
#: threshold of the criterion's kind, or NOT_JUDGED (the reason is free text, not pinned). The paper
#: thresholds above do not move; changing a quick bound is a change of the smoke test and must change this.
NOT_JUDGED_AT_QUICK = "not judged"
PINNED_QUICK_C3 = {
    "c3_transfer": [
        ("C3a-monotone", NOT_JUDGED_AT_QUICK),
        ("C3a-slope", NOT_JUDGED_AT_QUICK),
        ("C3a-final", 1.0),
        ("C3b-monotone", NOT_JUDGED_AT_QUICK),
        ("C3b-final", 1.0),
        ("C3c", NOT_JUDGED_AT_QUICK),
        ("C3d-inf", 1e-8),
        ("C3d-softmax", 1e-2),
        ("C3e-drop", 5.0 ** (1 / 3)),
        ("C3e-plateau", NOT_JUDGED_AT_QUICK),
        ("C3-inf-risk", NOT_JUDGED_AT_QUICK),
        ("C3-inf-bayes", NOT_JUDGED_AT_QUICK),
        ("C3-linL-gap", NOT_JUDGED_AT_QUICK),
    ],
    "c3_landscape": [
        ("C3L-risk-slope", NOT_JUDGED_AT_QUICK),
        ("C3L-D-slope", NOT_JUDGED_AT_QUICK),
        ("C3L-DlinL-slope", NOT_JUDGED_AT_QUICK),
        ("C3L-DlinL-ratio", NOT_JUDGED_AT_QUICK),
        ("C3L-block", 1e-8),
        ("C3L-control-plateau", NOT_JUDGED_AT_QUICK),
        ("C3L-control-gap", 1e-3),
    ],
    "c3_deep": [
        ("C3D-a-slope", NOT_JUDGED_AT_QUICK),
        ("C3D-a-median-slope", NOT_JUDGED_AT_QUICK),
        ("C3D-a-cov-slope", NOT_JUDGED_AT_QUICK),
        ("C3D-b-slope", NOT_JUDGED_AT_QUICK),
        ("C3D-b-heldout", NOT_JUDGED_AT_QUICK),
        ("C3D-b-heldout-limit", 1.0),
    ],
}

#: the quick profile's calibration of the C1 experiments (``quick=`` of each criterion, in order; the
#: analysis modules give each bound's replicate-run justification). None: a criterion of profile "any",
#: whose figure does not depend on the grid, judged by its own threshold at every profile.
PINNED_QUICK_C1 = {
    "c1_limit": [
        ("C1-quadrature", None),
        ("C1-slopes", (-1.5, -0.5)),
        ("C1-monotone", 0.75),
        ("C1-sharp-constant", NOT_JUDGED_AT_QUICK),
        ("C1-student-t-grows", 1.0),
        ("C1-sqrtL-grows", 1.0),
        ("C1-plateau", (0.6, 1.5)),
        ("C1-ar1-slopes", (-1.5, -0.45)),
        ("C1-ar1-constant", NOT_JUDGED_AT_QUICK),
        ("C1-ar1-iid-rejected", 1.1),
    ],
    "c1_kernels": [
        ("C1K-stein-smooth", None),
        ("C1K-stein-kinked", None),
        ("C1K-slopes", (-1.5, -0.4)),
        ("C1K-sharp-constant", (0.25, 3.0)),
        ("C1K-limit-mc", (0.0, 25.0)),
        ("C1K-gain", 6.0),
        ("C1K-rf-rate", (-1.15, -0.85)),
        ("C1K-rf-constant", (0.75, 1.25)),
        ("C1K-rf-slow", -0.85),
    ],
    "c1_own": [
        ("C1O-slope", (-1.5, -0.5)),
        ("C1O-slope-interval", None),
        ("C1O-constant", (0.4, 2.5)),
        ("C1O-Lstar", (0.3, 3.0)),
        ("C1O-decomposition", (0.6, 1.4)),
    ],
    "c1_real": [
        ("C1R-slopes", (-1.35, -0.65)),
        ("C1R-sharp-constant", (0.4, 2.0)),
        ("C1R-gauss-decomposition", (0.55, 1.45)),
        ("C1R-bias-order", (2.5, 6.5)),
    ],
}

#: the quick profile's calibration of the C2 experiments (``quick=`` of each criterion, in order): a bound of
#: the criterion's kind (the analysis modules give each one's spread over 7 quick files) or NOT_JUDGED_AT_QUICK.
PINNED_QUICK_C2 = {
    "c2_concentration": [
        ("C2-tail-violations", 0),
        ("C2-tail-clt", NOT_JUDGED_AT_QUICK),
        ("C2-grad-violations", 0),
        ("C2-grad-slopes", (-1.6, -0.2)),
        ("C2-traj-fixed", (-0.95, -0.05)),
        ("C2-traj-uniform", NOT_JUDGED_AT_QUICK),
    ],
    "c2_threshold": [
        ("C2T-fixed-exponent", (-0.8, -0.15)),
        ("C2T-uniform-low-tau", NOT_JUDGED_AT_QUICK),
        ("C2T-uniform-high-tau", 0.0),
        ("C2T-uniform-trend", NOT_JUDGED_AT_QUICK),
        ("C2T-separation-low-tau", NOT_JUDGED_AT_QUICK),
        ("C2T-break-location", NOT_JUDGED_AT_QUICK),
        ("C2T-break-covers-4", NOT_JUDGED_AT_QUICK),
        ("C2T-families-agree", 0.4),
        ("C2T-constant-ratio", NOT_JUDGED_AT_QUICK),
        ("C2T-constant-ratio-families", NOT_JUDGED_AT_QUICK),
        ("C2T-growth-below-4", NOT_JUDGED_AT_QUICK),
    ],
}

PIPELINES = {p.NAME: p for p in (c1_kernels_pipeline, c1_limit, c2_concentration, c2_threshold_pipeline,
                                 c3_transfer, c3_landscape_pipeline, c1_real_pipeline, c3_deep_pipeline,
                                 c1_own_pipeline)}


def _stored(name):
    """The criteria as build() stores them in a results file (JSON data of the analysis declarations)."""
    return criteria_of(PIPELINES[name].EXPERIMENT)
ANALYSES = {"c1_kernels": (c1_kernels, synthetic.c1_kernels), "c1_limit": (c1, synthetic.c1),
            "c2_concentration": (c2, synthetic.c2), "c2_threshold": (c2_threshold, synthetic.c2t),
            "c3_transfer": (c3, synthetic.c3), "c3_landscape": (c3_landscape, synthetic.c3l),
            "c1_real": (c1_real, synthetic.c1_real), "c1_own": (c1_own, synthetic.c1_own),
            "c3_deep": (c3_deep, synthetic.c3_deep)}


def _pinned_form(criterion: dict) -> tuple:
    """(id, claim, kind, threshold) with an ``in`` interval as a tuple (the pipelines write lists)."""
    thr = criterion["threshold"]
    return (criterion["id"], criterion["claim"], criterion["kind"], tuple(thr) if isinstance(thr, list) else thr)


def test_the_pinned_table_covers_every_experiment():
    assert set(PINNED) == set(PIPELINES) == set(ANALYSES)


@pytest.mark.parametrize("name", sorted(PINNED))
def test_pipeline_criteria_equal_the_pinned_table(name):
    criteria = _stored(name)
    assert [_pinned_form(c) for c in criteria] == PINNED[name]
    for c in criteria:
        # exact types: a bound written as a string or an interval as a scalar is a different criterion
        thr = c["threshold"]
        if c["kind"] == "in":
            assert isinstance(thr, list) and len(thr) == 2 and all(type(x) in (int, float) for x in thr), c["id"]
        else:
            assert type(thr) in (int, float), c["id"]
        assert isinstance(c["description"], str) and c["description"], c["id"]
        assert set(c) <= {"id", "claim", "description", "kind", "threshold", "reference", "reason", "profile",
                          "fmt", "quick"}, c["id"]
        assert c["reason"], f"{c['id']}: every criterion says why its threshold is set where it is"


PINNED_QUICK = {**PINNED_QUICK_C1, **PINNED_QUICK_C2, **PINNED_QUICK_C3}


def _quick_form(quick):
    """A stored quick calibration as pinned: NOT_JUDGED_AT_QUICK, an interval as a tuple, a bound, or None."""
    return NOT_JUDGED_AT_QUICK if isinstance(quick, dict) else tuple(quick) if isinstance(quick, list) else quick


def test_every_experiment_pins_its_quick_calibration():
    assert set(PINNED_QUICK) == set(PINNED)


@pytest.mark.parametrize("name", sorted(PINNED_QUICK))
def test_quick_calibration_equals_the_pinned_table(name):
    """Each criterion's quick calibration as build() stores it: a bound of the criterion's kind, NOT
    JUDGED with a reason, or none (a criterion of profile "any", judged alike at every profile); read
    back from the file attribute, a quick file is judged by it and a paper file by the pinned paper
    threshold."""
    from sfxlin.analysis.verdicts import NotJudged

    criteria = _stored(name)
    assert [(c["id"], _quick_form(c.get("quick"))) for c in criteria] == PINNED_QUICK[name]
    for c in criteria:
        quick = c.get("quick")
        if isinstance(quick, dict):
            assert set(quick) == {"not_judged"} and quick["not_judged"], c["id"]
        elif quick is None:
            assert c["profile"] == "any", c["id"]
        else:
            bound = quick if isinstance(quick, list) else [quick]
            assert all(type(x) in (int, float) for x in bound), c["id"]
    read = criteria_from_attrs(xr.Dataset(attrs={"criteria": json.dumps(criteria)}))
    for crit, (cid, quick) in zip(read, PINNED_QUICK[name]):
        judged = crit.for_profile("quick")
        if quick == NOT_JUDGED_AT_QUICK:
            assert isinstance(judged, NotJudged) and judged.reason, cid
        else:
            assert (judged.kind, judged.threshold) == (crit.kind, crit.threshold if quick is None else quick), cid
        assert crit.for_profile("paper") is crit


@pytest.mark.parametrize("name", sorted(PINNED))
def test_criteria_survive_the_results_file_attribute(name):
    """As the CLI stores them (JSON in attrs['criteria']) and the analysis reads them back."""
    read = criteria_from_attrs(xr.Dataset(attrs={"criteria": json.dumps(_stored(name))}))
    assert [(c.id, c.claim, c.kind, c.threshold) for c in read] == PINNED[name]


@pytest.mark.parametrize("name", sorted(PINNED))
def test_every_criterion_has_a_measure_and_every_measure_a_criterion(name):
    module, make = ANALYSES[name]
    measured = module.measures(make())
    assert set(measured) == {row[0] for row in PINNED[name]}


def _hair(x: float) -> float:
    """A step far below any bound's meaning and far above rounding: 1e-6 relative (1e-9 at 0)."""
    return 1e-6 * abs(x) or 1e-9


@pytest.mark.parametrize("name", sorted(PINNED))
def test_bounds_are_strict_or_not_as_pinned(name):
    """Every criterion evaluated at its own bound: '<' and '>' fail there, '<=', '>=' and both ends
    of 'in' pass; a hair beyond fails, a hair inside passes."""
    for cid, claim, kind, thr in PINNED[name]:
        crit = Criterion(id=cid, claim=claim, description="", kind=kind, threshold=thr)
        if kind == "in":
            low, high = thr
            cases = [(low, PASS), (high, PASS), (low - _hair(low), FAIL), (low + _hair(low), PASS),
                     (high - _hair(high), PASS), (high + _hair(high), FAIL)]
        else:
            up, down = thr + _hair(thr), thr - _hair(thr)
            cases = {"<": [(thr, FAIL), (down, PASS), (up, FAIL)], "<=": [(thr, PASS), (down, PASS), (up, FAIL)],
                     ">": [(thr, FAIL), (up, PASS), (down, FAIL)], ">=": [(thr, PASS), (up, PASS), (down, FAIL)]}[kind]
        for value, expected in cases:
            assert evaluate([crit], {cid: float(value)})[0].verdict == expected, (cid, value)
