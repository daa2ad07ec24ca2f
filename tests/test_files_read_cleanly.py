"""Results files read cleanly in every netCDF tool: ``ncdump -h`` prints a short header (the run's
records, kilobytes of JSON, sit as text variables of the group ``records``, restored as attrs by
sfxlin; the predeclared criteria stay a global attribute), every data variable has CF ``units`` (UDUNITS; ``1`` for a dimensionless quantity or a
count) but flags, coordinates carry no ``_FillValue``, the CF checker (cfchecker, with local tables:
it fetches the standard-name table from the network otherwise) finds no error, and a file with one
flipped byte in a stored value is refused on read (HDF5's Fletcher-32 checksum of every array, and
the sha256 of every variable's values the file records)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import netCDF4
import numpy as np
import pytest
import xarray as xr

from sfxlin.engine.storage import RECORDS, RECORDS_GROUP, ResultsError, load, open_results, save
from sfxlin.engine.sweep import UNITS

TABLES = {
    "sn.xml": '<?xml version="1.0"?>\n<standard_name_table><version_number>84</version_number>'
              '<last_modified>2024-01-19T15:55:10Z</last_modified><institution>sfxlin tests</institution>'
              '<contact>none</contact></standard_name_table>\n',
    "area.xml": '<?xml version="1.0"?>\n<area_type_table><version_number>10</version_number>'
                '<date>2024-01-01</date></area_type_table>\n',
    "region.xml": '<?xml version="1.0"?>\n<standardized_region_list><version_number>4</version_number>'
                  '<date>2024-01-01</date></standardized_region_list>\n',
}


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """A quick run of c1_own (text, integer, float coordinates; a flag-free file) and c3_transfer
    (a flag, a protocol's NaN cells), written by the command line."""
    out = tmp_path_factory.mktemp("files")
    for name in ("c1_own", "c3_transfer"):
        proc = subprocess.run([str(Path(sys.executable).with_name("sfxlin")), "run", name, "--out", str(out),
                               "--quiet", "--no-figure"], capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def _need(tool, install):
    """The path of ``tool``; skip where it is missing (a fresh machine), failing under CI (``.ci/run`` installs it)."""
    found = shutil.which(tool) or (str(Path(sys.executable).with_name(tool))
                                   if Path(sys.executable).with_name(tool).exists() else None)
    if found:
        return found
    why = f"`{tool}` not installed ({install}; .ci/run does)"
    if os.environ.get("CI", "").lower() in ("true", "1"):
        pytest.fail(f"CI=true but {why}")
    pytest.skip(why)


@pytest.mark.parametrize("name", ["c1_own", "c3_transfer"])
def test_ncdump_prints_a_short_header_with_the_records_as_declarations(written, name):
    ncdump = _need("ncdump", "apt-get install -y netcdf-bin")
    header = subprocess.run([ncdump, "-h", str(written / f"{name}.nc")], capture_output=True, text=True,
                            check=True).stdout
    # every line short but the criteria's (the predeclared criteria stay a global attribute: what a reader
    # of the file with any tool needs to judge it)
    assert max(len(line) for line in header.splitlines() if ":criteria = " not in line) < 1000
    root, _, group = header.partition(f"group: {RECORDS_GROUP} {{")
    assert group, header[-2000:]
    for record in ("cell_seconds", "cell_exponentials", "content_sha256"):
        assert f":{record} = " not in root and f"char {record}(" in group
    assert ":criteria = " in root


@pytest.mark.parametrize("name", ["c1_own", "c3_transfer"])
def test_every_data_variable_has_units_and_no_coordinate_a_fill_value(written, name):
    with netCDF4.Dataset(written / f"{name}.nc") as nc:
        assert nc.Conventions == "CF-1.8"
        dims = set(nc.dimensions)
        for var in nc.variables.values():
            attrs = var.ncattrs()
            if var.name in dims or var.name.startswith("string"):
                assert "_FillValue" not in attrs, var.name
            if "flag_meanings" in attrs:
                assert "units" not in attrs, var.name
            elif var.dtype != str and var.dtype.kind != "S":
                assert var.getncattr("units") in UNITS, var.name
            if var.ndim:
                assert var.filters()["fletcher32"], var.name
        assert not set(RECORDS) & set(nc.ncattrs())


def test_sfxlin_reads_the_records_back_as_attrs_and_xarray_alone_does_not(written):
    path = written / "c1_own.nc"
    ds = open_results(path)
    assert json.loads(ds.attrs["cell_exponentials"]) and json.loads(ds.attrs["cell_seconds"])
    assert "content_sha256" not in ds.attrs
    with xr.open_dataset(path) as plain:
        assert "cell_seconds" not in plain.attrs and json.loads(plain.attrs["criteria"])
    with xr.open_dataset(path, group=RECORDS_GROUP) as records:
        assert json.loads(records.cell_seconds.item()) == json.loads(ds.attrs["cell_seconds"])


def test_a_saved_dataset_comes_back_with_its_values_and_attrs(written, tmp_path):
    ds = open_results(written / "c3_transfer.nc")
    again = load(save(ds, tmp_path / "again.nc"))
    assert dict(again.attrs) == dict(ds.attrs)
    for name, var in ds.variables.items():
        assert np.array_equal(var.values, again[name].values, equal_nan=var.dtype.kind == "f"), name


def _flip_a_byte_of(path, values, out):
    """A copy of ``path`` with one bit flipped inside the stored bytes of ``values`` (float64)."""
    raw = bytearray(Path(path).read_bytes())
    needle = np.ascontiguousarray(values, dtype="<f8").tobytes()[:16]
    at = raw.find(needle)
    assert at >= 0, "the values' bytes are not in the file"
    raw[at + 5] ^= 0x10
    Path(out).write_bytes(bytes(raw))
    return out


def test_a_flipped_byte_in_an_array_is_refused_on_read(written, tmp_path):
    path = written / "c1_own.nc"
    mse = np.asarray(open_results(path).mse.values).ravel()
    bad = _flip_a_byte_of(path, mse, tmp_path / "bad.nc")
    with pytest.raises(ResultsError, match="bad.nc"):
        open_results(bad)


def test_a_flipped_byte_in_a_scalar_is_refused_by_the_recorded_digest(tmp_path):
    """A 0-d variable is stored contiguous, without an HDF5 checksum: the file's record of every
    variable's sha256 still refuses it, naming the variable."""
    ds = xr.Dataset({"x": ("L", np.linspace(0.1, 0.9, 9)), "c": ((), 0.123456789012345)},
                    coords={"L": np.arange(1, 10)}, attrs={"sfxlin_schema_version": 2})
    path = save(ds, tmp_path / "ok.nc")
    assert float(load(path).c) == 0.123456789012345
    bad = _flip_scalar(path, 0.123456789012345, tmp_path / "bad.nc")
    with pytest.raises(ResultsError, match=r"the values of c are not those written"):
        load(bad)


def _flip_scalar(path, value, out):
    """A copy of ``path`` with one bit flipped in the stored bytes of the float64 ``value``."""
    raw = bytearray(Path(path).read_bytes())
    at = raw.find(np.array([value], dtype="<f8").tobytes())
    assert at >= 0
    raw[at + 3] ^= 0x01
    Path(out).write_bytes(bytes(raw))
    return out


@pytest.mark.parametrize("name", ["c1_own", "c3_transfer"])
def test_the_cf_checker_finds_no_error(written, name, tmp_path):
    cfchecks = _need("cfchecks", "pip install cfchecker, with apt-get install -y libudunits2-0")
    for table, text in TABLES.items():
        (tmp_path / table).write_text(text)
    proc = subprocess.run([cfchecks, "-s", str(tmp_path / "sn.xml"), "-a", str(tmp_path / "area.xml"), "-r",
                           str(tmp_path / "region.xml"), str(written / f"{name}.nc")],
                          capture_output=True, text=True, timeout=300)
    report = proc.stdout + proc.stderr
    assert "ERRORS detected: 0" in report, report[-3000:]
    warnings = {line for line in report.splitlines() if line.startswith("WARN:")}
    # text coordinates are character arrays (CF 1.8 has no variable-length strings): the checker
    # calls a two-dimensional coordinate variable a possible mistake, and nothing else is warned of
    assert warnings <= {"WARN: (5): Possible incorrect declaration of a coordinate variable."}, report[-3000:]
