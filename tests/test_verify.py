"""``sfxlin verify``: a results file's cheapest cells recomputed by the installed code and compared
with the file (bit-identical, within --rtol, or not: exit status 1)."""
import dataclasses
import json

import numpy as np
import pytest
import xarray as xr

from sfxlin.cli import main
from sfxlin.engine.experiments import get
from sfxlin.engine.storage import default_results_dir, load
from sfxlin.engine.verify import _compare, choose_cells, verify_file

SHIPPED = default_results_dir()
#: shipped files whose cheapest cell costs a few seconds: the suite recomputes one cell of each
#: (the others' cells take 10 s to minutes: ``sfxlin verify datasets/*.nc`` checks them by hand)
CHEAP_SHIPPED = ("c1_kernels", "c1_real", "c1_own", "c2_threshold", "c3_dim", "c3_landscape")


@pytest.fixture(scope="module")
def quick_file(tmp_path_factory):
    out = tmp_path_factory.mktemp("verify")
    assert main(["run", "c1_kernels", "--profile", "quick", "--local-scheduler", "synchronous", "--quiet",
                 "--out", str(out)]) == 0
    return out / "c1_kernels.nc"


def _perturbed(src, dst, variable, rel):
    """``variable`` moved by ``rel`` of its largest value in the file, everywhere."""
    ds = load(src)
    ds[variable] = ds[variable] + rel * float(np.abs(ds[variable]).max())
    ds.to_netcdf(dst)
    return dst


def test_a_fresh_file_is_bit_identical(quick_file, capsys):
    assert main(["verify", str(quick_file)]) == 0
    digest, *lines, count = capsys.readouterr().out.splitlines()
    with load(quick_file) as ds:
        n = len(ds.variables)
    assert digest == (f"c1_kernels: the values of its {n} variables (coordinates included) are those written "
                      "(sha256 checked on read)")
    assert lines and all("bit-identical" in line for line in lines)
    assert {line.split("[")[0] for line in lines} == {"c1_kernels", "c1_kernels/stein", "c1_kernels/rf"}
    assert count == (f"c1_kernels: {len(lines)} cells recomputed: {len(lines)} bit-identical, 0 within 1e-10, "
                     "0 within 1e-10 x their amplification, 0 beyond")


def _with_blas(src, dst, blas):
    """``src`` with its recorded BLAS kernel replaced by ``blas`` (None: removed, as in files written
    before the kernel was recorded)."""
    ds = load(src)
    versions = json.loads(ds.attrs["library_versions"])
    versions.pop("blas")
    if blas is not None:
        versions["blas"] = blas
    ds.attrs["library_versions"] = json.dumps(versions)
    ds.to_netcdf(dst)
    return dst


def test_a_file_of_another_blas_kernel_says_so_before_its_cells(quick_file, tmp_path, capsys):
    here = json.loads(load(quick_file).attrs["library_versions"])["blas"]
    other = _with_blas(quick_file, tmp_path / "other.nc", "openblas 0.3.0 Imaginary")
    assert main(["verify", str(other)]) == 0            # the same bits: the note explains, it does not fail
    digest, *lines = capsys.readouterr().out.splitlines()     # first the whole file's check, then the kernel
    assert digest.startswith("other: no sha256 of its values")   # a copy written by to_netcdf: no digests
    assert lines[0].startswith("other: computed under BLAS openblas 0.3.0 Imaginary, recomputed under " + here)
    assert "section 10" in lines[0] and all("bit-identical" in line for line in lines[1:])
    older = _with_blas(quick_file, tmp_path / "older.nc", None)
    assert main(["verify", str(older)]) == 0            # a file that records no kernel: nothing to say
    assert all("bit-identical" in line for line in capsys.readouterr().out.splitlines()[1:])


def test_a_value_moved_beyond_rtol_fails_naming_the_variable(quick_file, tmp_path, capsys):
    moved = _perturbed(quick_file, tmp_path / "moved.nc", "mse", 1e-8)
    assert main(["verify", str(moved)]) == 1
    text = capsys.readouterr().out
    assert "DIFFERS beyond 1e-10: mse" in text
    assert main(["verify", str(moved), "--rtol", "1e-7"]) == 0     # 1e-8 of the scale: within 1e-7
    text = capsys.readouterr().out
    assert "within 1e-07 (largest 1e-08, mse)" in text and text.splitlines()[-1].endswith("0 beyond")


def test_an_output_added_since_the_file_was_made_is_named_not_compared(quick_file, tmp_path, capsys):
    """A file that lacks one of the code's outputs (made before it was added): the variables it holds are
    compared as ever, the missing one is named on the cell's line, and the file still verifies."""
    ds = xr.load_dataset(quick_file)
    ds.drop_vars("mse").to_netcdf(tmp_path / "older.nc")
    check = verify_file(tmp_path / "older.nc")[0]
    assert check.absent == ("mse",) and check.identical and "mse" not in [v.name for v in check.variables]
    assert main(["verify", str(tmp_path / "older.nc")]) == 0
    first = capsys.readouterr().out.splitlines()[1]   # after the whole file's line
    assert "bit-identical" in first and first.endswith("not in the file (added since): mse, recomputed in " +
                                                       first.rsplit("recomputed in ", 1)[1])


def test_a_last_bits_change_is_within_the_contract_not_identical(quick_file, tmp_path, capsys):
    moved = _perturbed(quick_file, tmp_path / "bits.nc", "mse", 1e-13)
    assert main(["verify", str(moved)]) == 0
    first = capsys.readouterr().out.splitlines()[1]   # after the whole file's line
    assert "within 1e-10" in first and "mse" in first and "bit-identical" not in first


def test_the_yardstick_is_the_variables_largest_value_in_the_file(quick_file, tmp_path, capsys):
    """A cell whose values are tiny beside the file's largest (noiseless least squares: 1e-30 of
    rounding where other cells hold O(1)) is judged on the file's scale, not on its own."""
    ds = load(quick_file)
    cheapest = verify_file(quick_file)[0].cell
    tiny = ds["mse"].copy()
    tiny.loc[cheapest] = tiny.loc[cheapest] * 1e-20                    # this cell: rounding-level values
    ds["mse"] = tiny
    ds.to_netcdf(tmp_path / "tiny.nc")
    check = verify_file(tmp_path / "tiny.nc")[0]                        # recomputed: O(1e-20) of the file scale off
    assert check.cell == cheapest
    assert not check.within(1e-10) and check.worst.name == "mse"      # the recomputed values are the real ones
    assert _compare("x", np.array([1e-30, 2e-30]), np.array([3e-30, 1e-30]), scale=1.0).error == pytest.approx(2e-30)


def test_compare_scales_by_the_variable_and_never_lets_nan_through():
    stored = np.array([1.0, 1e-17, np.nan])
    assert _compare("x", stored, stored.copy()).identical
    near_zero = _compare("x", stored, np.array([1.0, 3e-17, np.nan]))      # 2e-17 of a scale of 1
    assert not near_zero.identical and near_zero.error == pytest.approx(2e-17)
    assert _compare("x", stored, np.array([1.0, 1e-17, 0.0])).error == np.inf        # NaN replaced
    assert _compare("x", stored[:2], stored).error == np.inf                          # shape
    assert _compare("n", np.array([1, 2]), np.array([1, 3])).error == np.inf           # integers: exact
    assert _compare("x", np.array([0.0, 0.0]), np.array([0.0, 1e-300])).error == np.inf  # no scale: any change


def test_the_cheapest_cells_come_first(quick_file):
    C = get("c1_kernels")
    with load(quick_file) as ds:
        config = C.configure(None, values=json.loads(ds.attrs["config"]))
        rows = json.loads(ds.attrs["cell_seconds"])
        chosen = choose_cells(C, config, ds, cells=2)
    main_rows = sorted((s, json.dumps(c, sort_keys=True)) for p, c, s in rows if p == "")
    assert [json.dumps(c, sort_keys=True) for p, c in chosen if p == ""] == [c for _s, c in main_rows[:2]]


def test_a_file_that_is_not_sfxlins_is_refused(tmp_path):
    xr.Dataset({"a": ("x", [1.0])}).to_netcdf(tmp_path / "foreign.nc")
    with pytest.raises(ValueError, match="records no experiment"):
        verify_file(tmp_path / "foreign.nc")
    assert main(["verify", str(tmp_path / "foreign.nc")]) == 2


#: c2_threshold's families cells at kms:0.5, tau 0.75 (the part's cheapest) run past the edge of stability
#: and amplify the last bits of a BLAS product to a few percent (docs/performance.md section 10): a file
#: that records their amplification is judged within 1e-10 x it on any kernel; the shipped file, made before
#: files recorded it, is checked at a stable tau.
STABLE = {"c2_threshold": lambda ds: {"tau": float(ds.tau.max())}}


@pytest.mark.parametrize("name", CHEAP_SHIPPED)
def test_a_shipped_file_comes_from_this_code(name):
    """The shipped paper file's cheapest cell, recomputed: within 1e-10 (times the amplification the file
    records, where it records one) of the file on any CPU and BLAS kernel (bit-identical on the machine that
    made it; not asserted, the kernel may differ)."""
    path = SHIPPED / f"{name}.nc"
    assert path.is_file(), f"{path} is not shipped"
    with load(path) as ds:
        where = STABLE[name](ds) if name in STABLE else None
    for check in verify_file(path, where=where):
        assert check.within(1e-10), (check.part, check.cell, check.worst)


def test_a_file_of_an_earlier_protocol_is_refused_naming_its_parameters(tmp_path):
    """A results file whose recorded configuration holds parameters its experiment no longer declares (here
    c3_dim's fixed-step protocol, lr, T_max and check_every, which the faithful step replaced) cannot be
    recomputed by this code: verify says so, naming them, before any cell is computed."""
    with load(SHIPPED / "c3_dim.nc") as ds:
        ds = ds.load()
    config = json.loads(ds.attrs["config"])
    for name in ("lr_rule", "lr_margin", "flow_max", "check_flow"):
        config.pop(name, None)
    ds.attrs["config"] = json.dumps({**config, "lr": 0.01, "T_max": 5400, "check_every": 25})
    path = tmp_path / "c3_dim.nc"
    ds.to_netcdf(path)
    with pytest.raises(ValueError, match=r"unknown parameter\(s\) \['T_max', 'check_every', 'lr'\] of c3_dim"):
        verify_file(path)


# ------------------------------------------------------------------ the tolerance scaled by the amplification


@pytest.fixture
def unstable_file(tmp_path, monkeypatch):
    """A results file of the toy that amplifies a perturbation by a known factor
    (tests/declared/unstable_pipeline.py), cells r = 0.5 (amplification 1) and r = -1.5 (770), found by name."""
    from pathlib import Path

    from sfxlin.engine.execution import compute
    from sfxlin.engine.experiments import ENV
    from sfxlin.engine.storage import save
    from sfxlin.engine.sweep import build

    declared = str(Path(__file__).resolve().parent / "declared")
    monkeypatch.syspath_prepend(declared)
    monkeypatch.setenv(ENV, "unstable_pipeline")
    import unstable_pipeline as toy

    config = toy.EXPERIMENT.configure(None, values={**{p.name: p.value for p in toy.PARAMS}, "r": [0.5, -1.5]})
    ds, _wall, _label = compute(build(toy.EXPERIMENT, config), scheduler="synchronous", progress=False)
    return save(ds, tmp_path / "unstable.nc")


def _moved_in_cell(src, dst, variable, cell, rel, amplification=None):
    """``variable`` moved by ``rel`` of its largest value in the file in ``cell`` only; the cell's recorded
    amplification replaced by ``amplification`` where given."""
    ds = xr.load_dataset(src)
    moved = ds[variable].copy()
    moved.loc[cell] = moved.loc[cell] + rel * float(np.abs(ds[variable]).max())
    ds[variable] = moved
    if amplification is not None:
        ds[f"{variable}_amplification"].loc[cell] = amplification
    ds.to_netcdf(dst)
    return dst


def test_the_file_records_the_amplification_verify_judges_by(unstable_file):
    with xr.open_dataset(unstable_file) as ds:
        recorded = ds.x_amplification.sel(r=[0.5, -1.5]).values
        assert ds.x_amplification.attrs["units"] == "1"
    assert recorded[0] == pytest.approx(1.0, rel=1e-4) and recorded[1] == pytest.approx(769.57, rel=1e-4)
    checks = {c.cell["r"]: c for c in verify_file(unstable_file, cells=None)}
    assert set(checks) == {0.5, -1.5} and all(c.identical for c in checks.values())
    assert {v.name for c in checks.values() for v in c.variables} == {"x", "constant"}   # the yardstick: not recomputed
    assert [checks[r].variables[0].amplification for r in (0.5, -1.5)] == pytest.approx(list(recorded))


def _lines_by_cell(text):
    """``{cell label: verdict}`` of ``sfxlin verify``'s lines (the cells come cheapest first)."""
    return dict(line.split(": ", 1) for line in text.splitlines())


def test_a_recomputation_within_the_amplified_tolerance_passes_and_beyond_it_fails(unstable_file, tmp_path, capsys):
    inside = _moved_in_cell(unstable_file, tmp_path / "inside.nc", "x", {"r": -1.5}, 1e-8)   # 1e-8 < 770e-10
    assert main(["verify", str(inside), "--cells", "all"]) == 0
    lines = _lines_by_cell(capsys.readouterr().out)
    assert lines["inside[r=0.5]"].startswith("bit-identical")
    assert lines["inside[r=-1.5]"].startswith("within 1e-10 x amplification 7.7e+02 (largest 1e-08, x)")
    assert lines["inside"] == ("2 cells recomputed: 1 bit-identical, 0 within 1e-10, 1 within 1e-10 x their "
                               "amplification, 0 beyond")   # the file's last line: the cells counted by verdict
    outside = _moved_in_cell(unstable_file, tmp_path / "outside.nc", "x", {"r": -1.5}, 1e-6)   # 1e-6 > 770e-10
    assert main(["verify", str(outside), "--cells", "all"]) == 1
    lines = _lines_by_cell(capsys.readouterr().out)
    assert lines["outside[r=-1.5]"].startswith(
        "DIFFERS beyond 1e-10 x amplification: x (difference 1e-06, amplification 7.7e+02: tolerance 7.7e-08)")
    assert lines["outside"].endswith("1 bit-identical, 0 within 1e-10, 0 within 1e-10 x their amplification, 1 beyond")
    stable = _moved_in_cell(unstable_file, tmp_path / "stable.nc", "x", {"r": 0.5}, 1e-8)     # amplification 1 there
    assert main(["verify", str(stable), "--cells", "all"]) == 1
    assert _lines_by_cell(capsys.readouterr().out)["stable[r=0.5]"].startswith(
        "DIFFERS beyond 1e-10 x amplification: x (difference 1e-08, amplification 1: tolerance 1e-10)")


def test_a_cell_without_a_measured_amplification_is_held_to_rtol(unstable_file, tmp_path, capsys):
    unmeasured = _moved_in_cell(unstable_file, tmp_path / "nan.nc", "x", {"r": -1.5}, 1e-8, amplification=np.nan)
    assert main(["verify", str(unmeasured), "--cells", "all"]) == 1
    assert _lines_by_cell(capsys.readouterr().out)["nan[r=-1.5]"].startswith("DIFFERS beyond 1e-10: x (difference 1e-08)")
    assert main(["verify", str(unmeasured), "--cells", "all", "--rtol", "1e-7"]) == 0


def test_nan_where_the_file_has_a_number_is_never_excused_by_an_amplification(unstable_file, tmp_path):
    ds = xr.load_dataset(unstable_file)
    ds["x"].loc[{"r": -1.5, "t": 3}] = np.nan
    ds["x_amplification"].loc[{"r": -1.5}] = np.inf
    ds.to_netcdf(tmp_path / "nan_moved.nc")
    (check,) = [c for c in verify_file(tmp_path / "nan_moved.nc", cells=None) if c.cell == {"r": -1.5}]
    assert check.variables[0].error == np.inf and not check.within(1e-10)


def test_most_amplified_adds_the_cells_whose_recorded_amplification_is_largest(unstable_file, tmp_path):
    ds = xr.load_dataset(unstable_file)
    ds.attrs["cell_seconds"] = json.dumps([["", {"r": 0.5}, 1.0], ["", {"r": -1.5}, 2.0]])   # r = 0.5 the cheapest
    ds.to_netcdf(tmp_path / "costed.nc")
    assert [c.cell for c in verify_file(tmp_path / "costed.nc")] == [{"r": 0.5}]
    assert [c.cell for c in verify_file(tmp_path / "costed.nc", most_amplified=1)] == [{"r": 0.5}, {"r": -1.5}]
    assert [c.cell for c in verify_file(tmp_path / "costed.nc", cells=None, most_amplified=1)] == [{"r": 0.5},
                                                                                                    {"r": -1.5}]


def test_cells_all_and_most_amplified_are_checked_on_the_command_line(unstable_file, capsys):
    assert main(["verify", str(unstable_file), "--most-amplified", "1"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 4   # the whole file's line, two cells, their count
    with pytest.raises(SystemExit):
        main(["verify", str(unstable_file), "--cells", "some"])
    assert "expected a positive integer or 'all'" in capsys.readouterr().err


def test_a_stored_value_changed_since_it_was_written_fails_before_any_cell(quick_file, tmp_path, capsys):
    """The whole-file check first: one flipped bit in a stored value is refused on read (its array's
    Fletcher-32 checksum, the file's sha256 of it), whichever cells the recomputation would pick."""
    from pathlib import Path

    raw = bytearray(Path(quick_file).read_bytes())
    with load(quick_file) as ds:
        needle = np.ascontiguousarray(ds["mse"].values.ravel(), dtype="<f8").tobytes()[:16]
    at = raw.find(needle)
    assert at >= 0
    raw[at + 5] ^= 0x10
    (tmp_path / "bad.nc").write_bytes(bytes(raw))
    assert main(["verify", str(tmp_path / "bad.nc")]) != 0
    out, err = capsys.readouterr()
    assert "bad.nc" in err and "recomputed" not in out


# ------------------------------------------------------------------ a variable that is rounding everywhere


@pytest.fixture(scope="module")
def shift_file(tmp_path_factory):
    out = tmp_path_factory.mktemp("verify_shift")
    assert main(["run", "c3_shift", "--profile", "quick", "--local-scheduler", "synchronous", "--quiet",
                 "--out", str(out), "--no-figure"]) == 0
    return out / "c3_shift.nc"


def _ridge_moved(src, dst, cell, by):
    """c3_shift's ``risk_ridge`` (least squares on noiseless prompts: rounding, ~1e-30, in every cell) moved in
    ``cell`` by ``by(values)``."""
    ds = load(src)
    ridge = ds["risk_ridge"].copy()
    ridge.loc[cell] = ridge.loc[cell] + by(ridge.loc[cell])
    ds["risk_ridge"] = ridge
    ds.to_netcdf(dst)
    return dst


def test_a_variable_rounding_everywhere_is_judged_on_its_yardsticks_scale(shift_file, tmp_path, monkeypatch):
    """Another BLAS kernel moves ``risk_ridge`` by the size of its own rounding values (seen: 0.51 of its largest
    value in the shipped file under Haswell): within 1e-10 of the scale of its yardstick ``risk_pgd_train``, a
    risk of the same prompts; a move of 1e-6 of that scale is not. Judged on its own largest value (the
    declaration without its yardstick), the rounding move fails."""
    with load(shift_file) as ds:
        assert float(np.abs(ds["risk_ridge"]).max()) < 1e-20 < float(np.abs(ds["risk_pgd_train"]).max())
        scale = float(np.abs(ds["risk_pgd_train"]).max())
    cell = verify_file(shift_file)[0].cell
    rounding = _ridge_moved(shift_file, tmp_path / "rounding.nc", cell, lambda v: 0.5 * float(np.abs(v).max()))
    check = verify_file(rounding)[0]
    assert check.cell == cell and check.within(1e-10), check.worst
    real = _ridge_moved(shift_file, tmp_path / "real.nc", cell, lambda v: 1e-6 * scale)
    assert not verify_file(real)[0].within(1e-10)
    experiment = get("c3_shift")
    own = dataclasses.replace(experiment, variables=tuple(
        dataclasses.replace(v, yardstick=None) if v.name == "risk_ridge" else v for v in experiment.variables))
    monkeypatch.setattr("sfxlin.engine.experiments.get", lambda name: own)
    worst = verify_file(rounding)[0].worst
    assert worst.name == "risk_ridge" and worst.error > 1e-10


def test_a_declared_size_is_the_yardstick_of_an_error_of_quantities_of_that_size(tmp_path):
    """c1_limit's ``quadrature_error`` (closed form against quadrature of tilted means of order one: ~1e-15,
    rounding) moved by 0.4 of its own largest value, as Sandybridge moved it, is within 1e-10 of its declared
    size 1; moved by 1e-6 it is not."""
    out = tmp_path / "c1"
    assert main(["run", "c1", "--local-scheduler", "synchronous", "--quiet", "--no-figure", "--out", str(out)]) == 0
    path = out / "c1_limit.nc"
    for rel, within in ((0.4, True), (1e-6 / 2.2e-15, False)):
        ds = load(path)
        ds["quadrature_error"] = ds["quadrature_error"] * (1 + rel)
        ds.to_netcdf(tmp_path / "moved.nc")
        check = [c for c in verify_file(tmp_path / "moved.nc") if c.part == "quadrature"][0]
        assert check.within(1e-10) == within, (rel, check.worst)


def test_a_yardstick_must_name_a_float_variable_or_be_a_positive_size():
    from sfxlin.engine.sweep import Variable

    with pytest.raises(ValueError, match="not its own yardstick"):
        Variable("x", (), "x", "x", yardstick="x")
    for bad in (0.0, -1.0, float("nan"), [1.0]):
        with pytest.raises(ValueError, match="a variable's name or a positive number"):
            Variable("x", (), "x", "x", yardstick=bad)
    experiment = get("c3_shift")
    bad = tuple(dataclasses.replace(v, yardstick="no_such") if v.name == "risk_ridge" else v
                for v in experiment.variables)
    with pytest.raises(ValueError, match="yardstick 'no_such' is not a float variable"):
        dataclasses.replace(experiment, variables=bad)
