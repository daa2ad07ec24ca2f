"""The ``.sfx`` accessors and reprs used from IPython."""
import numpy as np
import pytest
import xarray as xr

import sfxlin
from sfxlin.analysis import c1
from sfxlin.analysis.fits import loglog_slope
from sfxlin.analysis.tables import to_text
from sfxlin.cli import main


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    out = tmp_path_factory.mktemp("acc")
    assert main(["run", "c1", "--quiet", "--out", str(out)]) == 0
    return sfxlin.open_results(out / "c1_limit.nc")


def test_dataarray_accessor_is_the_fit_function(ds):
    err = ds.mse.sel(law="gaussian").mean("seed")
    xr.testing.assert_identical(err.sfx.loglog_slope("L"), loglog_slope(err, "L"))
    p = err.sfx.power_law("L")
    np.testing.assert_allclose(p.p, loglog_slope(err, "L").slope)


def test_dataset_accessor_gives_verdicts_fits_figure_and_provenance(ds, tmp_path):
    frame = ds.sfx.verdicts(resamples=0)
    assert frame.index[0] == "C1-quadrature" and set(frame.verdict) <= {"PASS", "FAIL", "INCONCLUSIVE", "NOT JUDGED"}
    assert list(frame.columns) == ["claim", "description", "measured", "threshold", "reference", "verdict", "note",
                                   "robustness", "fragile", "class", "class_reason"]
    assert frame.loc["C1-quadrature", "verdict"] == "PASS"
    assert "PASS" in ds.sfx.verdict_table(resamples=0)
    assert "slope" in ds.sfx.fit_table() and ds.sfx.fit_table() == to_text(ds.sfx.fit_tables())
    np.testing.assert_array_equal(ds.sfx.fit_tables()["slopes"].slope.values, c1.slopes(ds).slope.values)
    assert ds.sfx.figure(tmp_path / "f.png").stat().st_size > 10_000
    assert ds.sfx.config["L"] == ds.L.values.tolist()
    assert ds.sfx.experiment == "c1_limit"
    text = repr(ds.sfx)
    assert "c1_limit" in text and ".verdicts()" in text and ".fit_tables()" in text and ".multiplicity()" in text


def test_verdicts_frame_shows_each_verdicts_robustness_and_class(ds):
    """The frame's robustness, fragile and class columns are those of the verdict rows (robustness
    over the resamples asked; the class and reason of a non-PASS verdict as its criterion declares)."""
    from sfxlin.analysis.verdicts import FAIL, PASS

    rows = c1.CRITERIA.verdicts(ds, resamples=8)
    frame = ds.sfx.verdicts(resamples=8)
    for r in rows:
        got = frame.loc[r.id]
        assert got.verdict == r.verdict
        if r.verdict in (PASS, FAIL):
            assert got.robustness == f"{r.robustness:.2f}" and 0.0 <= r.robustness <= 1.0
            assert got.fragile == ("yes" if r.robustness < 0.8 else "")
        assert (got["class"], got.class_reason) == (r.fails_as or ("", ""))
    assert frame.loc[[r.id for r in rows if r.verdict == PASS], "class"].eq("").all()
    assert ds.sfx.verdicts(resamples=0).robustness.eq("").all()  # none asked: none shown


def test_multiplicity_is_that_of_the_files_verdicts(ds):
    from sfxlin.analysis.verdicts import multiplicity, multiplicity_line

    rows = c1.CRITERIA.verdicts(ds, resamples=0)
    m = ds.sfx.multiplicity()
    assert m == {**multiplicity(rows), "line": multiplicity_line(rows)}
    assert m["judged"] == sum(r.verdict in ("PASS", "FAIL") for r in rows)


def test_open_results_without_argument_lists_names(ds, monkeypatch, tmp_path):
    monkeypatch.setenv("SFXLIN_RESULTS", str(tmp_path))
    (tmp_path / "x.nc").write_bytes(b"")
    assert sfxlin.open_results() == ["x"]


def test_experiment_repr_names_its_variables():
    from sfxlin.pipelines import c1_limit

    text = repr(c1_limit.EXPERIMENT)
    assert text.startswith("Experiment('c1_limit'") and "mse_asymptotic" in text and "<function" not in text
