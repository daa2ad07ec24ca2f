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
from sfxlin.analysis import c1, c1_kernels, c1_real, c2, c2_threshold, c3, c3_deep, c3_landscape
from sfxlin.analysis.verdicts import FAIL, PASS, Criterion, criteria_from_attrs, evaluate
from sfxlin.engine.sweep import criteria_of
from sfxlin.pipelines import c1_kernels as c1_kernels_pipeline
from sfxlin.pipelines import c1_limit, c2_concentration, c2_threshold as c2_threshold_pipeline, c3_transfer
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
    "c1_limit": [
        ("C1-quadrature", "C1", "<", 1e-8),
        ("C1-slopes", "C1", "in", (-1.1, -0.9)),
        ("C1-monotone", "C1", ">=", 1.0),
        ("C1-sharp-constant", "C1", "in", (0.9, 1.1)),
        ("C1-student-t-grows", "C1", ">", 1.0),
        ("C1-sqrtL-grows", "C1", ">", 1.0),
        ("C1-plateau", "C1", "in", (0.9, 1.1)),
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

PIPELINES = {p.NAME: p for p in (c1_kernels_pipeline, c1_limit, c2_concentration, c2_threshold_pipeline,
                                 c3_transfer, c3_landscape_pipeline, c1_real_pipeline, c3_deep_pipeline)}


def _stored(name):
    """The criteria as build() stores them in a results file (JSON data of the analysis declarations)."""
    return criteria_of(PIPELINES[name].EXPERIMENT)
ANALYSES = {"c1_kernels": (c1_kernels, synthetic.c1_kernels), "c1_limit": (c1, synthetic.c1),
            "c2_concentration": (c2, synthetic.c2), "c2_threshold": (c2_threshold, synthetic.c2t),
            "c3_transfer": (c3, synthetic.c3), "c3_landscape": (c3_landscape, synthetic.c3l),
            "c1_real": (c1_real, synthetic.c1_real),
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
                          "fmt"}, c["id"]
        assert c["reason"], f"{c['id']}: every criterion says why its threshold is set where it is"


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
