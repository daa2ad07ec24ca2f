"""Nothing lost, nothing silently replaced: combining runs (sfxlin.engine.merge), and the CF labels of
every results file.

Merging: two C1 runs over parts of one grid (d = 2 and d = 3) merged hold exactly the data, the
configuration and the analysis of the one run over d = 2, 3 (cells draw from generators keyed by
their coordinate values, so the bits agree by construction); what cannot be one run is refused
with one line naming what differs, and nothing is written.

CF: every coordinate of every declared output has a long_name, a description ending with a full
stop (and units where the quantity has one); every variable description ends with one; a built
Dataset says ``Conventions = "CF-1.8"``; a flag is an integer variable with ``flag_values`` /
``flag_meanings``, on disk too.
"""
from __future__ import annotations

import functools
import hashlib
import json

import netCDF4
import numpy as np
import pytest
import xarray as xr

from sfxlin.analysis.report import analysis_for
from sfxlin.cli import main
from sfxlin.engine.execution import compute
from sfxlin.engine.experiments import experiments
from sfxlin.engine.merge import merge, merge_files
from sfxlin.engine.params import Param
from sfxlin.pipelines import c1_limit, c3_transfer
from sfxlin.engine.schema import COORDS
from sfxlin.engine.storage import ResultsError, open_results, save
from sfxlin.engine.sweep import CellError, Experiment, Part, Variable, build, run_cell

C1 = c1_limit.EXPERIMENT
#: the smallest C1 run the analysis reads: one U_norm, one seed, three prompt lengths
SMALL = ("U_norm=0.5", "n_seeds=1", "L=16,32,64", "n_queries=2", "n_prompts=2", "query_chunk=1")


@functools.lru_cache(maxsize=None)
def _run(*sets) -> xr.Dataset:
    """A computed quick C1 run with the ``--set`` items ``SMALL``, those of ``sets`` replacing theirs
    (computed once per session)."""
    items = list({item.partition("=")[0]: item for item in SMALL + sets}.values())
    config = C1.configure("quick", items)
    ds, _, _ = compute(build(C1, config, call=f"sfxlin run c1 --set {' '.join(items)}"),
                       scheduler="synchronous", progress=False)
    return ds


def run(*sets) -> xr.Dataset:
    """A copy of :func:`_run` (a test may change it)."""
    return _run(*sets).copy(deep=True)


def _assert_same_data(a, b):
    """Same variables, dims, coordinates and variable attrs, values bit for bit (NaN equal to NaN)."""
    xr.testing.assert_identical(a.drop_attrs(deep=False), b.drop_attrs(deep=False))
    for name in a.variables:
        assert a[name].dtype == b[name].dtype, name
        assert np.array_equal(a[name].values, b[name].values, equal_nan=a[name].dtype.kind == "f"), name


def _saved(tmp_path, **datasets):
    """Save each Dataset as ``tmp_path/<name>.nc``; returns the paths in order."""
    return [save(ds, tmp_path / f"{name}.nc") for name, ds in datasets.items()]


# --------------------------------------------------------------------------------------------
# merging
# --------------------------------------------------------------------------------------------
def test_two_runs_merged_equal_the_one_run_over_their_grid():
    single = run("d=2,3")
    merged = merge([run("d=2"), run("d=3")])
    _assert_same_data(merged, single)
    assert json.loads(merged.attrs["config"]) == json.loads(single.attrs["config"])
    assert merged.attrs["n_cells"] == single.attrs["n_cells"] == 3  # two main cells and the quadrature check
    for key in ("experiment", "analysis", "criteria", "sfxlin_schema_version", "Conventions", "profile"):
        assert merged.attrs[key] == single.attrs[key], key


def test_a_grid_list_without_declared_order_follows_the_files():
    """``d`` declares no order: merged B then A, d is [3, 2], the run over d = 3, 2."""
    merged = merge([run("d=3"), run("d=2")])
    assert json.loads(merged.attrs["config"])["d"] == [3, 2]
    _assert_same_data(merged, run("d=2,3").sel(d=[3, 2]))


def test_an_overlapping_identical_cell_is_kept_once():
    single = run("d=2,3")
    _assert_same_data(merge([single, run("d=3")]), single)


def test_a_scalar_grid_parameter_takes_the_value_whose_grid_holds_every_cell():
    """n_seeds = 1 and n_seeds = 2 (seed 0 in both, identical): the merged run has n_seeds = 2."""
    two = run("d=2", "n_seeds=2")
    merged = merge([run("d=2"), two])
    assert json.loads(merged.attrs["config"]) == json.loads(two.attrs["config"])
    _assert_same_data(merged, two)


def test_the_merged_overrides_rerun_the_merged_configuration():
    merged = merge([run("d=2", "n_seeds=2"), run("d=3", "n_seeds=2")])
    rerun = C1.configure(merged.attrs["profile"], json.loads(merged.attrs["overrides"]))
    assert rerun.to_json() == merged.attrs["config"]
    assert json.loads(merged.attrs["config"])["d"] == [2, 3]


def test_the_merged_file_reads_and_analyses_like_the_single_run(tmp_path, capsys):
    a, b = _saved(tmp_path, a=run("d=2"), b=run("d=3"))
    out = merge_files([a, b], tmp_path / "merged.nc")
    assert out == tmp_path / "merged.nc"
    ds, single = open_results(out), run("d=2,3")
    _assert_same_data(ds, single)
    module = analysis_for(ds)
    assert ds.sfx.fit_table() == single.sfx.fit_table()
    assert [r.verdict for r in module.verdicts(ds)] == [r.verdict for r in module.verdicts(single)]
    assert str(module.measures(ds)) == str(module.measures(single))
    assert main(["info", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "experiment 'c1_limit'" in printed and "not analysable" not in printed and "d=2" in printed


def test_the_merged_file_records_its_inputs_and_drops_per_run_attrs(tmp_path):
    a, b = _saved(tmp_path, a=run("d=2"), b=run("d=3"))
    ds = open_results(merge_files([a, b], tmp_path / "merged.nc"))
    inputs = [open_results(a), open_results(b)]
    records = json.loads(ds.attrs["merged_from"])
    assert [r["path"] for r in records] == [str(a.resolve()), str(b.resolve())]
    assert [r["sha256"] for r in records] == [hashlib.sha256(p.read_bytes()).hexdigest() for p in (a, b)]
    for record, source in zip(records, inputs):
        for key in ("created", "git_revision", "sfxlin_version", "profile", "wall_seconds", "scheduler"):
            assert record[key] == source.attrs[key], key
        assert record["cell_timeline"] == json.loads(source.attrs["cell_timeline"])
        assert record["overrides"] == json.loads(source.attrs["overrides"])
    for key in ("cell_timeline", "wall_seconds", "scheduler"):
        assert key not in ds.attrs, key
    lines = ds.attrs["history"].split("\n")
    assert lines[:2] == [inputs[0].attrs["history"], inputs[1].attrs["history"]]
    assert lines[2].startswith(ds.attrs["created"]) and f"merge of {a.resolve()}, {b.resolve()}" in lines[2]


def test_mixed_code_revisions_merge_and_are_recorded():
    a, b = run("d=2"), run("d=3")
    b.attrs["git_revision"], b.attrs["sfxlin_version"] = "0123abc", "0.0.9"
    merged = merge([a, b])
    assert merged.attrs["git_revision"] == f"mixed: {a.attrs['git_revision']}, 0123abc"
    assert merged.attrs["sfxlin_version"] == f"mixed: {a.attrs['sfxlin_version']}, 0.0.9"
    assert [r["git_revision"] for r in json.loads(merged.attrs["merged_from"])] == [a.attrs["git_revision"], "0123abc"]


def test_a_differing_parameter_is_refused_naming_it_and_its_values(tmp_path):
    a, b = _saved(tmp_path, a=run("d=2"), b=run("d=3", "n_prompts=3"))
    with pytest.raises(ResultsError, match=rf"^parameter n_prompts differs: 2 in {a.resolve()}, 3 in {b.resolve()} "
                                           r"\(only the grid parameters d, U_norm, n_seeds may differ\)$"):
        merge_files([a, b], tmp_path / "merged.nc")
    assert not (tmp_path / "merged.nc").exists()


def test_another_experiment_is_refused():
    other = run("d=3")
    other.attrs["experiment"] = "c1_real"
    with pytest.raises(ResultsError, match=r"dataset 1 holds a c1_real run, dataset 0 a c1_limit run"):
        merge([run("d=2"), other])


def test_another_schema_version_is_refused():
    other = run("d=3")
    other.attrs["sfxlin_schema_version"] = 0
    with pytest.raises(ResultsError, match=r"dataset 1 has schema version 0; this sfxlin merges version 2"):
        merge([run("d=2"), other])


def test_an_overlapping_cell_with_other_values_is_refused_naming_it():
    other = run("d=3")
    other["mse"].loc[{"law": "uniform", "L": 32}] = np.nextafter(other["mse"].sel(law="uniform", L=32), np.inf)
    with pytest.raises(ResultsError, match=r"dataset 0 and dataset 1 both hold the cell d=3, U_norm=0.5, seed=0 "
                                           r"with different values of mse"):
        merge([run("d=2,3"), other])


@pytest.mark.parametrize("nan_first", [True, False])
def test_an_overlapping_cell_that_is_nan_in_one_file_and_a_number_in_the_other_is_refused(nan_first):
    """NaN is never "the same value" as a number, whichever file holds it: the cell d=3 of one run
    made NaN (a cell a run did not finish, or a flagged outcome) against its number in the other."""
    other = run("d=3")
    other["mse"].loc[{"law": "uniform", "L": 32}] = np.nan
    files = [other, run("d=2,3")] if nan_first else [run("d=2,3"), other]
    with pytest.raises(ResultsError, match=r"both hold the cell d=3, U_norm=0.5, seed=0 with different values of mse"):
        merge(files)


DESCENDING = """
import numpy as np
from sfxlin.engine.params import Param
from sfxlin.engine.sweep import Experiment, Part, Variable

def grid(config):
    return {"h": list(config["h"]), "seed": list(range(config["n_seeds"]))}

def kernel(cell, rng, config):
    return {"x": cell["h"] + rng.standard_normal(3)}

EXPERIMENT = Experiment(
    name="descending", inner_coords=lambda config: {"draw": [0, 1, 2]},
    params=(Param("h", "float_list", "bandwidths, largest first", [0.5, 0.2, 0.1], low=0, low_open=True,
                  order="decreasing", grid=True),
            Param("n_seeds", "int", "replicates", 1, low=1, grid=True),
            Param("root_seed", "int", "root seed", 3)),
    variables=(Variable("x", ("h", "seed", "draw"), "h plus a normal draw", "h + a standard normal draw."),),
    parts=(Part("", grid, kernel),), description="a grid list declared decreasing")
"""


def test_a_grid_list_declared_decreasing_keeps_its_order(tmp_path, monkeypatch):
    """``h`` declares ``order="decreasing"``: runs over h = 0.2 and h = 0.5, 0.1 merge into the run over
    h = 0.5, 0.2, 0.1 (its configuration and its coordinates in that order, the bits of the one run),
    whichever file comes first."""
    from sfxlin.engine.experiments import ENV

    (tmp_path / "descending.py").write_text(DESCENDING)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv(ENV, "descending")
    from descending import EXPERIMENT

    def ran(h):
        return build(EXPERIMENT, EXPERIMENT.configure("quick", [f"h={h}"])).compute(scheduler="synchronous")

    single = ran("0.5,0.2,0.1")
    for files in ([ran("0.2"), ran("0.5,0.1")], [ran("0.5,0.1"), ran("0.2")]):
        merged = merge(files)
        assert json.loads(merged.attrs["config"])["h"] == [0.5, 0.2, 0.1]
        assert merged.h.values.tolist() == [0.5, 0.2, 0.1]
        _assert_same_data(merged, single)


def test_a_variable_outside_the_grid_must_be_equal_in_every_file():
    other = run("d=3")
    other["quadrature_error"][0] += 1e-16
    with pytest.raises(ResultsError, match=r"quadrature_error has no grid dim and differs between dataset 0 and "
                                           r"dataset 1"):
        merge([run("d=2"), other])


def test_cells_that_do_not_fill_the_merged_grid_are_refused():
    """d = 2 at U_norm 0.5 and d = 3 at U_norm 0.1: the grid d x U_norm has two cells no file holds."""
    with pytest.raises(ResultsError, match=r"no file holds the cell d=2, U_norm=0.1, seed=0 of mse"):
        merge([run("d=2"), run("d=3", "U_norm=0.1")])


def test_a_scalar_grid_parameter_the_cells_do_not_determine_is_refused():
    """n_seeds_control = 1 and 2 over the isotropic setting alone: the same cells (the control's seed
    count reaches no isotropic cell), so the merged file could not say which value it has."""
    sets = ["settings=isotropic", "n_seeds=1", "n_pairs=1", "n_queries=1", "L=4,8,16", "n_steps=10", "ckpt_every=10",
            "heldout_pairs=1", "heldout_queries=1", "L_eval=16", "heldout_every=10"]
    runs = [build(c3_transfer.EXPERIMENT, c3_transfer.EXPERIMENT.configure("quick", sets + [f"n_seeds_control={n}"]))
            .compute(scheduler="synchronous") for n in (1, 2)]
    _assert_same_data(runs[0], runs[1])
    with pytest.raises(ResultsError, match=r"^the cells of dataset 0, dataset 1 fit several configurations of "
                                           r"c3_transfer \(n_seeds_control: 1 / 2\): the merged file could not say"):
        merge(runs)


def test_sources_name_every_dataset():
    with pytest.raises(ValueError, match="sources: one per Dataset, got 1 for 2 Datasets"):
        merge([run("d=2"), run("d=3")], sources=[{"path": "a.nc", "sha256": None}])


def test_a_single_file_is_refused():
    with pytest.raises(ResultsError, match="merge needs at least two results files, got 1"):
        merge([run("d=2")])


# --------------------------------------------------------------------------------------------
# CF conventions
# --------------------------------------------------------------------------------------------
def _declared_dims():
    return sorted({dim for experiment in experiments().values() for var in experiment.variables for dim in var.dims})


@pytest.mark.parametrize("dim", _declared_dims())
def test_every_coordinate_of_every_declared_output_is_labelled(dim):
    attrs = COORDS[dim]
    assert attrs["long_name"] and attrs["description"].endswith("."), attrs


def test_a_coordinate_named_after_a_parameter_says_what_it_counts():
    """``L`` and ``L_train`` are declared in tokens: their coordinates are counts, CF units ``1``, whose
    long_name names the tokens; every training step coordinate is a count of steps."""
    checked = 0
    for experiment in experiments().values():
        for p in experiment.params:
            if p.unit and p.name in COORDS:
                assert COORDS[p.name]["units"] == "1", (experiment.name, p.name)
                assert p.unit.rstrip("s") in COORDS[p.name]["long_name"], (experiment.name, p.name)
                checked += 1
    assert checked >= 2
    assert all(COORDS[dim]["units"] == "1" and "step" in COORDS[dim]["long_name"]
               for dim in ("t", "t_heldout", "t_family"))


def test_every_variable_description_ends_with_a_full_stop():
    for experiment in experiments().values():
        for var in experiment.variables:
            assert var.long_name and var.description.endswith("."), (experiment.name, var.name, var.description)


def test_the_protocol_note_of_c3_is_its_own_sentence():
    noted = [v.description for v in c3_transfer.EXPERIMENT.variables if "NaN where in_protocol = 0" in v.description]
    assert len(noted) > 30
    assert all(". NaN where in_protocol = 0" in text for text in noted)


@pytest.mark.parametrize("name", sorted(experiments()))
def test_a_built_dataset_follows_the_cf_conventions(name):
    experiment = experiments()[name]
    ds = build(experiment, experiment.configure("quick"))
    assert ds.attrs["Conventions"] == "CF-1.8"
    for dim in ds.coords:
        assert ds[dim].attrs["long_name"] and ds[dim].attrs["description"].endswith("."), dim
        # the vocabulary's units, else "1" for a number (an index, a count); text has none
        default = "1" if ds[dim].dtype.kind in "iuf" else None
        assert ds[dim].attrs.get("units") == COORDS.get(dim, {}).get("units", default), dim
    for var in ds.data_vars.values():
        if "flag_meanings" in var.attrs:
            assert var.dtype.kind in "iub", var.name
            assert var.attrs["flag_values"].dtype == var.dtype
            assert len(var.attrs["flag_values"]) == len(var.attrs["flag_meanings"].split())
            assert "units" not in var.attrs, var.name
        else:
            assert var.dtype == np.float64 or var.dtype.kind in "iu", var.name   # a quantity, or a count
            assert var.attrs["units"] in ("1", "s"), var.name


def test_in_protocol_is_an_int8_flag_in_the_file(tmp_path):
    config = c3_transfer.EXPERIMENT.configure("quick", [
        "settings=isotropic,rademacher", "n_seeds=2", "n_seeds_control=1", "n_pairs=1", "n_queries=1", "L=4,8,16",
        "n_steps=10", "ckpt_every=10", "heldout_pairs=1", "heldout_queries=1", "L_eval=16", "heldout_every=10"])
    ds = build(c3_transfer.EXPERIMENT, config).compute(scheduler="synchronous")
    path = save(ds, tmp_path / "c3.nc")
    with netCDF4.Dataset(path) as nc:
        flag = nc["in_protocol"]
        assert flag.dtype == np.int8 and nc.Conventions == "CF-1.8"
        assert flag.flag_values.tolist() == [0, 1] and flag.flag_meanings == "outside_protocol in_protocol"
        assert flag[:].tolist() == [[1, 1], [1, 0]]   # the control's second seed is outside the protocol
    back = open_results(path)
    assert back.in_protocol.dtype == np.int8
    assert bool(np.isnan(back.D_inf.sel(setting="rademacher", seed=1)).all())
    assert bool(np.isfinite(back.D_inf.where(back.in_protocol == 1, 0.0)).all())
    analysis_for(back).verdicts(back)   # the C3 analysis reads the int8 flag



def _flagged(value):
    """A one-cell experiment whose kernel returns ``value`` for its int8 flag ``ok``."""
    flag = Variable("ok", (), "cell succeeded", "1 if it did.", dtype="int8", flag_meanings=("failed", "succeeded"))
    return Experiment(name="flagged", inner_coords=lambda config: {}, variables=(flag,),
                      parts=(Part("", lambda config: {}, lambda cell, rng, inputs: {"ok": value}),),
                      params=(Param("root_seed", "int", "root of the cell's generator", 1),))


def test_a_flag_is_stored_in_its_declared_integer_type():
    experiment = _flagged(np.float64(1.0))
    out = run_cell(experiment, experiment.configure("quick"), {})
    assert out["ok"].dtype == np.int8 and out["ok"] == 1
    assert build(experiment, experiment.configure("quick")).ok.dtype == np.int8


@pytest.mark.parametrize("value, match", [(0.5, r"flagged\[\]: ok has values that are not int8: \[0.5\]"),
                                          (2, r"flagged\[\]: ok is a flag with values 0..1, got \[2\]")])
def test_a_flag_value_outside_its_flag_values_is_a_cell_error(value, match):
    experiment = _flagged(value)
    with pytest.raises(CellError, match=match):
        run_cell(experiment, experiment.configure("quick"), {})


def test_a_flag_must_be_declared_with_an_integer_type():
    with pytest.raises(ValueError, match="ok: a flag \\(flag_meanings\\) is stored as an integer type, got dtype 'float64'"):
        Variable("ok", (), "cell succeeded", "1 if it did.", flag_meanings=("failed", "succeeded"))
