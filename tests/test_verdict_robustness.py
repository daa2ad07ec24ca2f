"""Verdicts beyond PASS / FAIL: robustness over resampled units, NOT JUDGED at a profile, the
declared class of a non-PASS verdict, and many criteria at once (chance FAILs, Holm).

Each is checked against an independent computation: exact enumeration of the bootstrap
resamples, a plain numpy Monte Carlo of the m-out-of-n bootstrap, Holm's step-down by hand.
"""
from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
import xarray as xr

from sfxlin.analysis.verdicts import (
    CLASSES,
    FAIL,
    NOT_JUDGED,
    PASS,
    Criteria,
    NotJudged,
    criteria_from_attrs,
    multiplicity,
    multiplicity_line,
    judged_where,
    resample_indices,
    resampled,
    substream_key,
)


def declared(quick=None, fails_as=None, units=("seed",)):
    """A claim with one criterion, ``mean(x) > 0``."""
    crit = Criteria("CX", units=units)

    @crit("CX-mean", "mean of x over the seeds", ">", 0.0, quick=quick, fails_as=fails_as)
    def _mean(ds):
        return ds.x.mean("seed")

    return crit


def results(x, crit, profile="paper"):
    return xr.Dataset({"x": ("seed", np.asarray(x, dtype=float))}, coords={"seed": np.arange(len(x))},
                      attrs={"criteria": json.dumps([c.to_dict() for c in crit]), "profile": profile})


def exact_bootstrap_agreement(x, verdict_pass: bool) -> float:
    """Fraction of all n^n equally likely resamples with replacement whose mean gives the verdict."""
    x = np.asarray(x, dtype=float)
    means = [x[list(idx)].mean() for idx in itertools.product(range(x.size), repeat=x.size)]
    return float(np.mean([(m > 0) == verdict_pass for m in means]))


@pytest.mark.parametrize("x", [[1.0, 2.0, 3.0, 4.0], [3.0, -1.0, -1.0, -0.5], [2.0, -1.5, 0.4, -0.6]])
def test_robustness_is_the_bootstrap_fraction_of_resamples_keeping_the_verdict(x):
    crit = declared()
    (row,) = crit.verdicts(results(x, crit), resamples=1000)
    exact = exact_bootstrap_agreement(x, row.verdict == PASS)
    # Monte Carlo of 1000 resamples: SE <= sqrt(0.25 / 1000) = 0.016; 3.2 SE
    assert row.robustness == pytest.approx(exact, abs=0.05)
    assert row.fragile == (row.robustness < 0.8)


def test_robustness_is_the_same_at_every_call_and_none_without_units():
    crit = declared()
    ds = results([2.0, -1.5, 0.4, -0.6], crit)
    assert crit.verdicts(ds)[0].robustness == crit.verdicts(ds)[0].robustness
    one = results([2.0], crit)
    (row,) = crit.verdicts(one)
    assert row.robustness is None and "one independent unit" in row.robustness_note
    (row,) = crit.verdicts(results([1.0, 2.0], crit), resamples=0)
    assert row.robustness is None


def test_resample_indices_are_every_resample_or_the_keyed_draws():
    """At most ``resamples`` distinct resamples: each once (the exact bootstrap); more: the draws of a
    generator keyed by the claim, unit dim after unit dim within a resample."""
    every = resample_indices({"seed": 2, "query": 2}, 100, "CX")
    assert every["seed"].dims == ("resample", "seed") and every["seed"].shape == (16, 2)
    pairs = {(tuple(s), tuple(q)) for s, q in zip(every["seed"].values, every["query"].values)}
    assert pairs == {(s, q) for s in itertools.product(range(2), repeat=2) for q in itertools.product(range(2),
                                                                                                      repeat=2)}
    drawn = resample_indices({"seed": 4, "query": 3}, 50, "CX", size={"seed": 8, "query": 3})
    rng = np.random.default_rng(substream_key("CX"))
    for r in range(50):
        np.testing.assert_array_equal(drawn["seed"].values[r], rng.integers(0, 4, 8))
        np.testing.assert_array_equal(drawn["query"].values[r], rng.integers(0, 3, 3))


def test_resampled_units_are_a_dimension_drawn_with_replacement_without_their_labels():
    ds = xr.Dataset({"x": ("seed", [10.0, 20.0, 30.0]), "y": ("L", [1.0, 2.0])}, coords={"seed": [5, 6, 7]})
    idx = resample_indices({"seed": 3}, 12, "CX", size={"seed": 12})
    out = resampled(ds, idx)
    assert out.x.dims == ("resample", "seed") and out.sizes["seed"] == 12 and "seed" not in out.coords
    np.testing.assert_array_equal(out.x.values, ds.x.values[idx["seed"].values])
    assert out.y.dims == ("L",)  # a variable without the unit dim is not replicated


def test_a_vectorised_measure_is_called_once_for_every_resample():
    """A measure that reads its values along the resample dim is called once for the file and once for
    all its resamples, and the robustness is the exact bootstrap fraction, as with one call each."""
    calls = []
    crit = Criteria("CX", units=("seed",))

    @crit("CX-mean", "mean of x over the seeds", ">", 0.0)
    def _mean(ds):
        calls.append(dict(ds.sizes))
        return ds.x.mean("seed")

    x = [3.0, -1.0, -1.5]
    (row,) = crit.verdicts(results(x, crit), resamples=100)
    assert row.robustness == exact_bootstrap_agreement(x, row.verdict == PASS)
    assert len(calls) == 2 and calls[1] == {"resample": 27, "seed": 3}


def test_a_measure_that_drops_the_resample_dim_is_refused_by_name():
    """A measure that flattens its values (``.values.ravel()``) loses the resample dim: its values
    would be judged as one resample's; the robustness refuses it, naming the criterion."""
    crit = Criteria("CX", units=("seed",))

    @crit("CX-each", "x of every seed", ">", -10.0)
    def _each(ds):
        return ds.x.values.ravel()

    with pytest.raises(ValueError, match="'CX-each' returned 81 values without a 'resample' dim"):
        crit.verdicts(results([1.0, -1.0, 2.0], crit), resamples=100)


@pytest.mark.parametrize("kind, threshold", [("in", (-1.0, 1.0)), (">", 0.0), ("<=", 0.5)])
def test_the_cells_a_resample_keeps_are_judged_by_their_ends(kind, threshold):
    """judged_where: on a file, the kept values; on resamples (the kept cells differ between them), the
    smallest and largest kept value, which every comparison judges as it judges all of them (checked
    against evaluate() of each resample's kept values), NaN (INCONCLUSIVE) where none is kept or a kept
    one is not finite."""
    from sfxlin.analysis.verdicts import Criterion, evaluate
    from sfxlin.analysis.verdicts import _resample_verdicts

    rng = np.random.default_rng(7)
    values = xr.DataArray(rng.uniform(-1.5, 1.5, (40, 6)), dims=("resample", "cell"))
    keep = xr.DataArray(rng.uniform(size=(40, 6)) < 0.5, dims=("resample", "cell"))
    values[3, :] = np.where(keep[3], np.nan, values[3])
    keep[5, :] = False
    crit = Criterion(id="CX-w", claim="CX", description="d", kind=kind, threshold=threshold)
    ends = judged_where(values, keep, ["cell"], "none kept")
    together = _resample_verdicts(crit, ends, 40, 6)
    for r in range(40):
        kept = values.values[r][keep.values[r]]
        alone = evaluate([crit], {"CX-w": kept if kept.size else None})[0].verdict
        assert together[r] == alone, r
    file = judged_where(values.isel(resample=0), keep.isel(resample=0), ["cell"], "none kept")
    np.testing.assert_array_equal(file, values.values[0][keep.values[0]])
    assert judged_where(values.isel(resample=5), keep.isel(resample=5), ["cell"], "none kept").reason == "none kept"


def test_a_flag_can_hold_in_some_resamples_only():
    """``inconclusive`` may flag a criterion in some resamples (a boolean over the resample dim):
    those resamples are INCONCLUSIVE, so they disagree with the file's PASS."""
    crit = Criteria("CX", units=("seed",),
                    inconclusive=lambda ds: {"CX-mean": ds.x.min("seed") < 0} if "resample" in ds.dims else {})

    @crit("CX-mean", "mean of x over the seeds", ">", -10.0)
    def _mean(ds):
        return ds.x.mean("seed")

    (row,) = crit.verdicts(results([1.0, -1.0], crit), resamples=100)
    assert row.verdict == PASS and row.robustness == 0.25   # (0, 0) is the one resample without -1


def test_seeds_needed_is_the_smallest_m_out_of_n_bootstrap_size_reaching_the_target():
    x = np.array([2.0, -1.5, 0.4, -0.6, 1.1, 0.5])  # mean 0.32 > 0: PASS, fragile at 6 seeds
    rng = np.random.default_rng(0)
    agree = {m: float(np.mean(x[rng.integers(0, x.size, (40000, m))].mean(1) > 0)) for m in (6, 12, 24)}
    # the independent bootstrap: 6 -> 0.755, 12 -> 0.839, 24 -> 0.916 (SE 0.002): 12 seeds are enough
    assert agree[6] < 0.78 and 0.82 < agree[12]
    crit = declared()
    ds = results(x, crit)
    (row,) = crit.verdicts(ds, resamples=1000)  # Monte Carlo SE 0.014 of each fraction: margins >= 3 SE
    assert row.verdict == PASS and row.fragile
    assert row.robustness == pytest.approx(agree[6], abs=0.045)
    assert crit.seeds_needed(ds, resamples=1000) == {"CX-mean": {"seed": 12}}
    assert crit.seeds_needed(results([1.0, 2.0, 3.0], crit), resamples=50) == {}  # nothing fragile


def test_a_profile_that_cannot_judge_gives_not_judged_with_its_reason():
    crit = declared(quick="2 seeds: the mean's sign is noise")
    (row,) = crit.verdicts(results([-1.0, -2.0], crit, profile="quick"))
    assert row.verdict == NOT_JUDGED and "2 seeds: the mean's sign is noise" in row.note
    assert row.robustness is None
    (row,) = crit.verdicts(results([-1.0, -2.0], crit, profile="paper"))
    assert row.verdict == FAIL


def test_a_quick_calibration_judges_quick_files_only_and_survives_the_file():
    crit = declared(quick=-5.0)
    ds = results([-1.0, -2.0], crit, profile="quick")
    assert crit.verdicts(ds)[0].verdict == PASS  # -1.5 > -5
    assert crit.verdicts(ds.assign_attrs(profile="paper"))[0].verdict == FAIL
    (stored,) = criteria_from_attrs(ds)
    assert stored.quick == -5.0
    nj = declared(quick="too few L")
    (stored,) = criteria_from_attrs(results([1.0], nj))
    assert stored.quick == NotJudged("too few L")


def test_the_declared_class_goes_with_non_pass_verdicts_only():
    crit = declared(fails_as=("pre-asymptotic", "the mean is still negative at these sizes"))
    (fail,) = crit.verdicts(results([-1.0, -2.0], crit))
    assert fail.fails_as[0] == "pre-asymptotic" and "pre-asymptotic: the mean" in fail.class_str
    (ok,) = crit.verdicts(results([1.0, 2.0], crit))
    assert ok.fails_as is None and ok.class_str == ""
    with pytest.raises(ValueError, match="fails_as class"):
        declared(fails_as=("bad luck", "why"))
    assert "finding" in CLASSES


def holm_by_hand(p):
    """Holm's step-down adjusted p-values: sorted ascending, (m - j) p_(j) made monotone, capped at 1."""
    p = np.asarray(p, dtype=float)
    order = np.argsort(p)
    m = p.size
    adj = np.maximum.accumulate([(m - j) * p[i] for j, i in enumerate(order)])
    out = np.empty(m)
    out[order] = np.minimum(adj, 1.0)
    return out


def test_multiplicity_counts_chance_fails_and_the_holm_view():
    crit = Criteria("CT", units=())
    pvals = {"CT-a": 0.004, "CT-b": 0.03, "CT-c": 0.5}
    for cid, p in pvals.items():
        crit(cid, "a z-test", ">", 0.01, level=0.01, pvalue=lambda data, p=p: p)(lambda data, p=p: p)

    @crit("CT-d", "not a test", "<", 1.0)
    def _d(data):
        return 0.5

    ds = xr.Dataset(attrs={"criteria": json.dumps([c.to_dict() for c in crit]), "profile": "paper"})
    rows = crit.verdicts(ds)
    m = multiplicity(rows)
    assert m["judged"] == 4 and m["tests"] == 3
    assert m["chance_fails"] == pytest.approx(0.03)
    assert m["fails"] == 1  # CT-a: 0.004 <= 0.01
    hand = holm_by_hand(list(pvals.values()))
    assert [m["holm"][k] for k in pvals] == pytest.approx(hand)
    assert m["holm_fails"] == int(np.sum(hand < 0.01))  # 0.012: none after Holm
    assert multiplicity_line(rows).startswith("4 criteria judged, 1 FAIL; of the 4, 3 are statistical tests at a "
                                              "stated level (the other one compares an")
    assert "chance alone would give 0.03 FAILs among the 3 tests (the sum of their levels); they give 1 (0 after " \
        "Holm)" in multiplicity_line(rows)
    assert m["with_robustness"] == 0 and m["flips"] == 0.0  # no units: no robustness


def test_expected_flips_are_the_sum_of_one_minus_robustness():
    crit = declared()
    rows = crit.verdicts(results([2.0, -1.0], crit)) + crit.verdicts(results([3.0, -1.0, -1.5], crit))
    m = multiplicity(rows)
    exact = [exact_bootstrap_agreement(x, v) for x, v in (([2.0, -1.0], True), ([3.0, -1.0, -1.5], True))]
    assert m["with_robustness"] == 2 and m["flips"] == pytest.approx(sum(1 - e for e in exact), rel=1e-12)
    assert "would change about" in multiplicity_line(rows)
    with pytest.raises(ValueError, match="both its level and its pvalue"):
        crit("CT-e", "half a test", ">", 0.01, level=0.01)


def test_two_or_three_units_are_judged_on_every_resample_exactly():
    """G^G <= resamples: every equally likely resample is judged once (2 seeds: 4, 3 seeds: 27)."""
    crit = declared()
    for x in ([2.0, -1.0], [3.0, -1.0, -1.5], [1.0, -5.0, 0.5]):
        (row,) = crit.verdicts(results(x, crit), resamples=100)
        assert row.robustness == exact_bootstrap_agreement(x, row.verdict == PASS)


def test_a_not_judged_row_carries_no_class():
    crit = declared(quick="too few L", fails_as=("pre-asymptotic", "curvature"))
    (row,) = crit.verdicts(results([-1.0, -2.0], crit, profile="quick"))
    assert row.verdict == NOT_JUDGED and row.fails_as is None
