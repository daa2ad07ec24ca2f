"""Tests of sfxlin.analysis.verdicts: criteria as data, PASS / FAIL / INCONCLUSIVE, tables."""
from __future__ import annotations

import json

import numpy as np
import pytest
import xarray as xr

from sfxlin.analysis.verdicts import (
    FAIL,
    INCONCLUSIVE,
    PASS,
    Criteria,
    Criterion,
    Shared,
    NOT_JUDGED,
    count_verdicts,
    evaluate,
    format_table,
    to_markdown,
)

SLOPES = Criterion(
    id="C1-slopes",
    claim="C1",
    description="log-log slope of E||f_L - f_inf||^2 in L, 9 settings",
    kind="in",
    threshold=(-1.1, -0.9),
    reference="-0.982 .. -1.027",
)
QUAD = Criterion(
    id="C1-quadrature",
    claim="C1",
    description="max |quadrature - closed form|",
    kind="<",
    threshold=1e-8,
    reference="2.9e-15",
)
INCREASES = Criterion(id="C3a-increases", claim="C3", description="increases of D(L)", kind="<=", threshold=1)
CONTROL = Criterion(id="C3e-ii", claim="C3", description="control slope, last four L", kind=">", threshold=-0.25)
RATIO = Criterion(id="C3e-i", claim="C3", description="D(8) / D(4096)", kind=">=", threshold=5)
ALL = [SLOPES, QUAD, INCREASES, CONTROL, RATIO]


def verdicts(rows):
    return {r.id: r.verdict for r in rows}


def test_criterion_validation():
    with pytest.raises(ValueError, match="kind"):
        Criterion(id="x", claim="C1", description="", kind="==", threshold=1)
    with pytest.raises(ValueError, match=r"\(low, high\)"):
        Criterion(id="x", claim="C1", description="", kind="in", threshold=1.0)
    with pytest.raises(ValueError, match="low <= high"):
        Criterion(id="x", claim="C1", description="", kind="in", threshold=(1.0, -1.0))
    with pytest.raises(ValueError, match="one number"):
        Criterion(id="x", claim="C1", description="", kind="<", threshold=(1.0, 2.0))
    with pytest.raises(ValueError, match="finite"):
        Criterion(id="x", claim="C1", description="", kind="<", threshold=np.inf)
    with pytest.raises(TypeError):
        Criterion("x", "C1", "", "<", 1.0)  # keywords only: criteria read as data
    assert SLOPES.threshold == (-1.1, -0.9) and isinstance(QUAD.threshold, float)
    with pytest.raises(AttributeError):
        QUAD.threshold = 2.0  # frozen


def test_scalar_comparisons_pass_and_fail_at_the_boundary():
    rows = evaluate(
        ALL,
        {"C1-slopes": -0.9, "C1-quadrature": 1e-8, "C3a-increases": 1, "C3e-ii": -0.25, "C3e-i": 5.0},
    )
    # "in" and "<=", ">=" include the boundary; "<" and ">" do not
    assert verdicts(rows) == {
        "C1-slopes": PASS,
        "C1-quadrature": FAIL,
        "C3a-increases": PASS,
        "C3e-ii": FAIL,
        "C3e-i": PASS,
    }
    rows = evaluate(
        ALL,
        {"C1-slopes": -1.2, "C1-quadrature": 2.9e-15, "C3a-increases": 2, "C3e-ii": 0.1, "C3e-i": 4.99},
    )
    assert verdicts(rows) == {
        "C1-slopes": FAIL,
        "C1-quadrature": PASS,
        "C3a-increases": FAIL,
        "C3e-ii": PASS,
        "C3e-i": FAIL,
    }


def test_array_in_range_all_or_fail_and_measured_string():
    slopes = np.array([-0.982, -1.027, -0.99, -1.0, -1.01, -0.995, -1.02, -0.985, -1.005])
    (row,) = evaluate([SLOPES], {"C1-slopes": slopes})
    assert row.verdict == PASS
    assert row.measured_str == "-1.03 .. -0.982 (9/9 in range)"
    bad = slopes.copy()
    bad[4] = -0.85
    (row,) = evaluate([SLOPES], {"C1-slopes": bad})
    assert row.verdict == FAIL
    assert row.measured_str == "-1.03 .. -0.85 (8/9 in range)"
    # DataArray and list inputs
    (row,) = evaluate([SLOPES], {"C1-slopes": xr.DataArray(slopes.reshape(3, 3), dims=("d", "U_norm"))})
    assert row.verdict == PASS and "(9/9 in range)" in row.measured_str
    (row,) = evaluate([INCREASES], {"C3a-increases": [0, 1, 3]})
    assert row.verdict == FAIL and row.measured_str == "0 .. 3 (2/3 <= 1)"


def test_a_fail_of_a_labelled_measure_names_where_it_fails():
    """A DataArray that FAILs: the note names the coordinates of its failing values (positions for a dim
    without coordinates), the first three and how many more; a PASS, or a plain array, has no note."""
    slopes = np.full((2, 3), -1.0)
    da = xr.DataArray(slopes, dims=("setting", "d"), coords={"setting": ["iso", "aniso"], "d": [3, 8, 16]})
    bad = da.copy()
    bad.loc["aniso", 16] = -0.5
    (row,) = evaluate([SLOPES], {"C1-slopes": bad})
    assert row.verdict == FAIL and row.note == "fails at setting = aniso, d = 16"
    worse = bad.copy(data=np.full((2, 3), 0.0))
    (row,) = evaluate([SLOPES], {"C1-slopes": worse})
    assert row.note == "fails at setting = iso, d = 3; setting = iso, d = 8; setting = iso, d = 16 and 3 more"
    (row,) = evaluate([SLOPES], {"C1-slopes": xr.DataArray([-1.0, -0.2], dims=("seed",))})
    assert row.note == "fails at seed = 1"
    assert evaluate([SLOPES], {"C1-slopes": bad.values})[0].note == ""
    assert evaluate([SLOPES], {"C1-slopes": da})[0].note == ""


def test_inconclusive_when_missing_nonfinite_or_flagged():
    rows = evaluate(
        ALL,
        {"C1-slopes": np.array([-1.0, np.nan]), "C1-quadrature": None, "C3e-ii": np.inf, "C3e-i": []},
    )
    v = verdicts(rows)
    assert v == {k: INCONCLUSIVE for k in v}
    by_id = {r.id: r for r in rows}
    assert by_id["C1-slopes"].note == "1/2 non-finite"
    assert by_id["C1-quadrature"].note == "not measured" and by_id["C1-quadrature"].measured_str == "n/a"
    assert by_id["C3a-increases"].note == "not measured"  # absent from the dict
    assert by_id["C3e-i"].note == "no measured values"
    # explicit flag overrides a value that would pass, keeps the figure, records the reason
    rows = evaluate([QUAD, RATIO], {"C1-quadrature": 1e-15, "C3e-i": 8.0}, inconclusive={"C3e-i": "bound vacuous"})
    assert verdicts(rows) == {"C1-quadrature": PASS, "C3e-i": INCONCLUSIVE}
    assert rows[1].measured_str == "8" and "bound vacuous" in rows[1].note
    rows = evaluate([QUAD], {"C1-quadrature": 1e-15}, inconclusive=["C1-quadrature"])
    assert rows[0].verdict == INCONCLUSIVE


def test_evaluate_rejects_typos_and_duplicates():
    with pytest.raises(ValueError, match="unknown criteria.*C1-slope'"):
        evaluate(ALL, {"C1-slope": -1.0})
    with pytest.raises(ValueError, match="inconclusive flags for unknown"):
        evaluate(ALL, {}, inconclusive=["nope"])
    with pytest.raises(ValueError, match="duplicate"):
        evaluate([QUAD, QUAD], {})
    with pytest.raises(TypeError, match="C1-quadrature"):
        evaluate([QUAD], {"C1-quadrature": "small"})


def test_format_table_aligned_with_all_columns():
    rows = evaluate(ALL, {"C1-slopes": [-1.03, -0.97], "C1-quadrature": 2.9e-15, "C3a-increases": 0, "C3e-ii": -0.1})
    text = format_table(rows)
    lines = text.splitlines()
    assert len(lines) == 2 + len(ALL)
    header = lines[0]
    for col in ("criterion", "measured", "threshold", "reference", "verdict", "note"):
        assert col in header
    # every column starts at the same offset in the header and in each row
    starts = [header.index(c) for c in ("measured", "threshold", "reference", "verdict")]
    row = next(line for line in lines if line.startswith("C1-slopes"))
    assert row[starts[0]:].startswith("-1.03 .. -0.97 (2/2 in range)")
    assert row[starts[1]:].startswith("in [-1.1, -0.9]")
    assert row[starts[2]:].startswith("-0.982 .. -1.027")
    assert row[starts[3]:].startswith("PASS")
    quad = next(line for line in lines if line.startswith("C1-quadrature"))
    assert quad[starts[0]:].startswith("2.9e-15") and quad[starts[1]:].startswith("< 1e-08")
    ratio = next(line for line in lines if line.startswith("C3e-i "))
    assert ratio[starts[3]:].startswith("INCONCLUSIVE") and ratio.endswith("not measured")
    assert set(lines[1]) <= {"-", " "}
    # no note column when nothing needs one
    text = format_table(evaluate([QUAD], {"C1-quadrature": 1e-12}))
    assert "note" not in text.splitlines()[0]


def test_to_markdown_and_counts():
    rows = evaluate(ALL, {"C1-slopes": -1.0, "C1-quadrature": 1.0, "C3e-ii": 0.0})
    md = to_markdown(rows).splitlines()
    assert md[0].startswith("| criterion | measured | threshold | reference | verdict")
    assert set(md[1]) <= {"|", "-"}
    assert len(md) == 2 + len(ALL)
    assert all(line.startswith("|") and line.endswith("|") for line in md)
    assert md[2].count("|") == md[0].count("|")
    odd = Criterion(id="a|b", claim="C9", description="", kind="<", threshold=1)
    assert "a\\|b" in to_markdown(evaluate([odd], {"a|b": 0.5}))
    assert count_verdicts(rows) == {PASS: 2, FAIL: 1, INCONCLUSIVE: 2, NOT_JUDGED: 0, "fragile": 0}
    d = rows[0].to_dict()
    assert d["criterion"] == "C1-slopes" and d["verdict"] == PASS and d["reference"] == "-0.982 .. -1.027"


def test_format_spec_used_for_measured_figure():
    crit = Criterion(id="r", claim="C3", description="", kind="<", threshold=0.02, fmt=".2%")
    (row,) = evaluate([crit], {"r": 0.0095})
    assert row.measured_str == "0.95%" and row.verdict == PASS


def test_shared_computes_each_function_of_the_file_once():
    calls = []

    def mean_over(ds, dim):
        calls.append(dim)
        return ds.x.mean(dim)

    ds = xr.Dataset({"x": (("a", "b"), np.arange(6.0).reshape(2, 3))})
    sh = Shared(ds)
    assert float(sh(mean_over, "a")[0]) == 1.5 and float(sh(mean_over, "b")[1]) == 4.0
    assert sh(mean_over, "a") is sh(mean_over, "a")
    assert calls == ["a", "b"]


def _criteria_with_a_flag():
    """Two criteria measured from one shared fit, a flag hook that marks the second one, and the
    number of times the shared fit was made."""
    made = []

    def fit(ds):
        made.append(1)
        return float(ds.x.mean())

    crit = Criteria("T", prepare=Shared, inconclusive=lambda sh: {"T-b": f"fit {sh(fit):g} undecided", "T-c": "x"})
    crit("T-a", "mean", "<", 10.0, reason="r")(lambda sh: sh(fit))
    crit("T-b", "mean again", ">", 0.0, reason="r")(lambda sh: sh(fit))
    ds = xr.Dataset({"x": ("i", [1.0, 2.0])}, attrs={"criteria": json.dumps([c.to_dict() for c in crit])})
    return crit, ds, made


def test_criteria_flags_from_the_shared_data_and_from_the_caller():
    """The hook's flags reach the stored criteria (T-c is not stored: ignored), the caller's are
    added, and one Shared serves the measures and the hook: the fit is made once."""
    crit, ds, made = _criteria_with_a_flag()
    rows = {r.id: r for r in crit.verdicts(ds)}
    assert (rows["T-a"].verdict, rows["T-b"].verdict) == (PASS, INCONCLUSIVE)
    assert rows["T-b"].note == "flagged inconclusive: fit 1.5 undecided" and len(made) == 1
    rows = {r.id: r for r in crit.verdicts(ds, inconclusive={"T-a": "caller"})}
    assert rows["T-a"].note == "flagged inconclusive: caller" and rows["T-b"].verdict == INCONCLUSIVE
    assert crit.measures(ds) == {"T-a": 1.5, "T-b": 1.5}
