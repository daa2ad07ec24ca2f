"""netCDF storage: a file readable without sfxlin, provenance, atomic writes, opening results."""
from __future__ import annotations

import datetime as dt
import errno
import hashlib
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

import sfxlin
from sfxlin.engine.experiments import get as get_experiment
from sfxlin.engine.schema import RENAMED, SCHEMA_VERSION, upgrade
from sfxlin.testing import assert_same_results
from sfxlin.engine.storage import ResultsError, changed_input_files, input_files, open_results, provenance, save

PROVENANCE_KEYS = ("experiment", "profile", "config", "sfxlin_version", "sfxlin_schema_version", "git_revision",
                   "library_versions", "created", "wall_seconds", "scheduler", "history")


@pytest.fixture
def results(toy, toy_computed):
    """The computed toy dataset with its provenance attached."""
    ds = toy_computed.copy()
    config = toy.EXPERIMENT.configure("quick")
    ds.attrs.update(provenance("toy", config, call="sfxlin run toy"), wall_seconds=1.25, scheduler="synchronous")
    return ds


@pytest.fixture(autouse=True)
def _elsewhere(tmp_path, monkeypatch):
    """Run from an empty folder, without $SFXLIN_RESULTS: a default folder is the working
    directory's (./datasets), never the source tree's."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    monkeypatch.delenv("SFXLIN_RESULTS", raising=False)


def _listing(folder):
    return sorted(p.name for p in Path(folder).iterdir())


# --------------------------------------------------------------------------------------------
# provenance and the file format
# --------------------------------------------------------------------------------------------
def test_provenance_attrs(toy):
    config = toy.EXPERIMENT.configure("quick", ["n_seeds=3"])
    attrs = provenance("toy", config, call="sfxlin run toy --profile quick --set n_seeds=3")
    assert set(PROVENANCE_KEYS) - {"wall_seconds", "scheduler"} <= set(attrs)  # those come with the computation
    assert json.loads(attrs["config"]) == json.loads(config.to_json()) == {**toy.make_config(), "n_seeds": 3}
    assert attrs["profile"] == "quick" and json.loads(attrs["overrides"]) == ["n_seeds=3"]
    assert attrs["sfxlin_version"] == sfxlin.__version__
    assert attrs["sfxlin_schema_version"] == SCHEMA_VERSION
    created = dt.datetime.fromisoformat(attrs["created"])
    assert created.tzinfo is not None
    assert abs((dt.datetime.now(dt.timezone.utc) - created).total_seconds()) < 60
    assert attrs["history"].startswith(attrs["created"])
    assert "sfxlin run toy --profile quick" in attrs["history"] and sfxlin.__version__ in attrs["history"]
    plain = provenance("toy", toy.make_config())  # a plain mapping: a custom configuration
    assert plain["profile"] == "custom" and json.loads(plain["overrides"]) == []
    assert attrs["git_revision"]
    versions = json.loads(attrs["library_versions"])
    assert {"numpy", "xarray", "dask", "netCDF4", "python"} <= set(versions)
    import jax
    import jaxlib
    import optax

    assert (versions["jax"], versions["jaxlib"], versions["optax"]) == (jax.__version__, jaxlib.__version__,
                                                                        optax.__version__)
    assert versions["blas"].startswith("openblas ")   # the numpy wheels' BLAS
    for value in attrs.values():  # every attr is netCDF-storable
        assert isinstance(value, (str, int, float)), value


READER = r"""
import json, sys
sys.modules["sfxlin"] = None  # any import of sfxlin now fails
import xarray as xr
ds = xr.open_dataset(sys.argv[1])
out = {
    "sizes": dict(ds.sizes),
    "coords": {k: ds[k].values.tolist() for k in ds.coords},
    "coord_attrs": {k: dict(ds[k].attrs) for k in ds.coords},
    "var_dims": {k: list(v.dims) for k, v in ds.data_vars.items()},
    "var_attrs": {k: dict(v.attrs) for k, v in ds.data_vars.items()},
    "attrs": {k: (v.item() if hasattr(v, "item") else v) for k, v in ds.attrs.items()},
    "value_sum": float(ds["value"].sum()),
    "flagged_nan": int(ds["flagged"].isnull().sum()),
    "sfxlin_loaded": any(m.startswith("sfxlin") and sys.modules[m] is not None for m in sys.modules),
}
print(json.dumps(out, default=str))
"""


def test_saved_file_is_readable_without_sfxlin(results, toy, tmp_path):
    path = save(results, tmp_path / "out" / "toy.nc")
    assert path == tmp_path / "out" / "toy.nc" and path.is_file()
    proc = subprocess.run([sys.executable, "-c", READER, str(path)], capture_output=True, text=True,
                          cwd=tmp_path, env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, timeout=120)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    assert not got["sfxlin_loaded"]
    assert got["sizes"] == {"d": 2, "U_norm": 3, "seed": 4, "L": 3, "query": 5}
    assert got["coords"] == {"d": [2, 3], "U_norm": [0.25, 0.5, 1.0], "seed": [0, 1, 2, 3], "L": [8, 16, 32],
                             "query": [0, 1, 2, 3, 4]}
    assert got["coord_attrs"]["L"]["units"] == "1"
    for var in toy.VARIABLES:
        assert got["var_dims"][var.name] == list(var.dims)
        assert got["var_attrs"][var.name]["long_name"] == var.long_name
        assert got["var_attrs"][var.name]["description"] == var.description
    assert got["var_attrs"]["value"]["units"] == "1"
    attrs = got["attrs"]
    for key in PROVENANCE_KEYS:
        assert key in attrs, key
        assert str(attrs[key]) == str(results.attrs[key]), key
    assert json.loads(attrs["config"]) == toy.make_config()
    assert attrs["experiment"] == "toy" and attrs["profile"] == "quick" and attrs["scheduler"] == "synchronous"
    assert attrs["wall_seconds"] == 1.25
    assert attrs["sfxlin_version"] == sfxlin.__version__
    assert got["value_sum"] == pytest.approx(float(results["value"].sum()), rel=1e-15)
    assert got["flagged_nan"] == 2 * 3 * 3  # seed-0 cells, by design


def test_round_trip_is_exact(results, tmp_path):
    path = save(results, tmp_path / "toy.nc")
    with open_results(path) as back:
        xr.testing.assert_identical(back.load(), results)
        for name in results.data_vars:
            assert back[name].dtype == np.float64
            assert np.array_equal(back[name].values, results[name].values, equal_nan=True)


def test_save_computes_a_lazy_dataset(toy, tmp_path, toy_computed):
    from sfxlin.engine.sweep import build

    save(build(toy.EXPERIMENT, toy.make_config()), tmp_path / "lazy.nc")
    with xr.open_dataset(tmp_path / "lazy.nc") as back:
        assert_same_results(back.load(), toy_computed)


# --------------------------------------------------------------------------------------------
# atomic writes
# --------------------------------------------------------------------------------------------
def _failing_to_netcdf(exc):
    def to_netcdf(self, path=None, *args, **kwargs):
        Path(path).write_bytes(b"\x89HDF\r\n\x1a\n" + b"\0" * 100)  # a partial file
        raise exc

    return to_netcdf


@pytest.mark.parametrize("exc, expected", [
    (RuntimeError("simulated crash"), RuntimeError),
    (KeyboardInterrupt(), KeyboardInterrupt),
    (OSError(errno.ENOSPC, "No space left on device"), ResultsError),
])
def test_failed_write_leaves_nothing(results, tmp_path, monkeypatch, exc, expected):
    folder = tmp_path / "res"
    folder.mkdir()
    monkeypatch.setattr(xr.Dataset, "to_netcdf", _failing_to_netcdf(exc))
    with pytest.raises(expected) as info:
        save(results, folder / "toy.nc")
    assert _listing(folder) == []  # no final file, no leftover temporary file
    if expected is ResultsError:
        assert str(folder / "toy.nc") in str(info.value) and "No space left" in str(info.value)


def test_failed_write_does_not_clobber_a_good_file(results, tmp_path, monkeypatch):
    path = save(results, tmp_path / "toy.nc")
    good = path.read_bytes()
    monkeypatch.setattr(xr.Dataset, "to_netcdf", _failing_to_netcdf(RuntimeError("crash")))
    with pytest.raises(RuntimeError):
        save(results.isel(seed=[0]), path)
    monkeypatch.undo()
    assert path.read_bytes() == good
    assert _listing(tmp_path) == ["cwd", "toy.nc"]
    with open_results(path) as back:
        assert back.sizes["seed"] == 4


def test_the_temporary_file_is_in_the_target_folder(results, tmp_path, monkeypatch):
    """Same folder, so the final rename is atomic (no cross-device move)."""
    seen = []
    real = xr.Dataset.to_netcdf

    def spy(self, path=None, *args, **kwargs):
        seen.append(Path(path))
        return real(self, path, *args, **kwargs)

    monkeypatch.setattr(xr.Dataset, "to_netcdf", spy)
    path = save(results, tmp_path / "toy.nc")
    # the data, then the records group into the same temporary file
    assert len(seen) == 2 and seen[0] == seen[1] and seen[0].parent == path.parent and seen[0] != path
    assert not seen[0].exists() and path.exists()


def test_save_overwrites_atomically(results, tmp_path):
    path = save(results, tmp_path / "toy.nc")
    save(results.isel(seed=[1, 2]), path)
    with open_results(path) as back:
        assert back["seed"].values.tolist() == [1, 2]
    assert _listing(tmp_path) == ["cwd", "toy.nc"]


def test_unwritable_folder_names_the_folder(results, tmp_path):
    blocker = tmp_path / "x" / "file.txt"
    blocker.parent.mkdir()
    blocker.write_text("a regular file, not a folder")
    for target in (blocker / "sub" / "toy.nc", blocker / "toy.nc"):
        with pytest.raises(ResultsError) as info:
            save(results, target)
        assert str(target.parent) in str(info.value)
    assert blocker.read_text() == "a regular file, not a folder"


def test_read_only_folder_names_the_folder(results, tmp_path):
    """A folder its user may not write in: a 0o500 folder, or for root (who ignores permission
    bits, as CI runs) a process folder of /proc, which nobody may write in."""
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o500)
    if os.geteuid() == 0:
        folder = Path("/proc/1")
        assert folder.is_dir() and not os.access(folder, os.W_OK)
    try:
        with pytest.raises(ResultsError, match=f"output folder {folder} is not writable"):
            save(results, folder / "toy.nc")
    finally:
        (tmp_path / "ro").chmod(0o700)


# --------------------------------------------------------------------------------------------
# opening results
# --------------------------------------------------------------------------------------------
@pytest.fixture
def results_dir(results, tmp_path):
    folder = tmp_path / "datasets"
    save(results, folder / "toy.nc")
    other = results.isel(seed=[0])
    other.attrs = {**results.attrs, "experiment": "c9_other"}  # a new dict: isel shares attrs
    save(other, folder / "c9_other.nc")
    (folder / "README.md").write_text("schema notes")
    (folder / ".toy.nc.1234.partial").write_bytes(b"left over")
    return folder


def test_open_by_name_path_and_listing(results_dir, results):
    assert open_results(results_dir=results_dir) == ["c9_other", "toy"]
    with open_results("toy", results_dir=results_dir) as ds:
        xr.testing.assert_identical(ds.load(), results)
    for path in (results_dir / "c9_other.nc", str(results_dir / "c9_other.nc")):
        with open_results(path) as ds:
            assert ds.attrs["experiment"] == "c9_other" and ds.sizes["seed"] == 1


def test_default_results_dir_from_environment(results_dir, monkeypatch):
    monkeypatch.setenv("SFXLIN_RESULTS", str(results_dir))
    assert open_results() == ["c9_other", "toy"]
    with open_results("toy") as ds:
        assert ds.attrs["experiment"] == "toy"


def test_missing_results_name_lists_what_exists(results_dir):
    with pytest.raises(ResultsError) as info:
        open_results("c1_limit", results_dir=results_dir)
    message = str(info.value)
    assert "c1_limit" in message and str(results_dir) in message
    assert "c9_other" in message and "toy" in message


@pytest.mark.parametrize("fraction", [0.5, 0.9, 0.02])
def test_truncated_file(results, tmp_path, fraction):
    path = save(results, tmp_path / "toy.nc")
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * fraction)])
    with pytest.raises(ResultsError, match="toy.nc"):
        open_results(path)


def test_not_a_netcdf_file(tmp_path):
    path = tmp_path / "junk.nc"
    path.write_text("this is not netCDF")
    with pytest.raises(ResultsError, match="junk.nc"):
        open_results(path)


@pytest.mark.parametrize("version", [None, SCHEMA_VERSION + 1, 0, "banana"])
def test_other_schema_version(results, tmp_path, version):
    ds = results.copy()
    if version is None:
        del ds.attrs["sfxlin_schema_version"]
    else:
        ds.attrs["sfxlin_schema_version"] = version
    path = tmp_path / "other.nc"
    ds.to_netcdf(path)
    with pytest.raises(ResultsError) as info:
        open_results(path)
    message = str(info.value)
    assert "schema version" in message and repr(version) in message and str(SCHEMA_VERSION) in message
    path.unlink()  # the file was closed: it can be removed and rewritten


def test_a_version_1_file_is_read_as_version_2_with_its_variables_renamed(tmp_path):
    """A c3_landscape file of schema version 1 (its max over t named ``D_inf``, its value at T ``risk_heldout``)
    opens with the version-2 names and the same values; a version-2 file is returned as it is."""
    old = xr.Dataset({"D_inf": ("L", [0.5, 0.25]), "risk_heldout": ("L", [1.0, 2.0]), "limit_gap": ((), 0.1)},
                     coords={"L": [8, 16]}, attrs={"experiment": "c3_landscape", "sfxlin_schema_version": 1})
    old.to_netcdf(tmp_path / "old.nc")
    ds = open_results(tmp_path / "old.nc")
    assert set(ds.data_vars) == {"D_inf_max", "risk_heldout_T", "limit_gap"}
    np.testing.assert_array_equal(ds.D_inf_max.values, [0.5, 0.25])
    assert ds.attrs["sfxlin_schema_version"] == SCHEMA_VERSION == 2 and ds.attrs["schema_upgraded_from"] == 1
    assert upgrade(ds) is ds
    assert set(RENAMED) == {"c3_landscape", "c3_horizon", "c3_dim", "c3_shift"}
    assert all(new in {v.name for v in get_experiment(name).variables} for name, renamed in RENAMED.items()
               for new in renamed.values())


def test_the_default_results_folder_is_the_working_directorys_datasets(results, tmp_path):
    """open_results and results_path read ./datasets of the working directory (the source tree's
    datasets/ only when run from there)."""
    save(results, Path("datasets") / "toy.nc")
    assert open_results() == ["toy"]
    with open_results("toy") as ds:
        assert ds.attrs["experiment"] == "toy"
    os.chdir(tmp_path)  # the fixture restores the working directory
    assert open_results() == []
    with pytest.raises(ResultsError) as info:
        open_results("toy")
    assert str(info.value) == (f"no results file 'toy' in {tmp_path / 'datasets'} (no such folder); give its path, "
                               f"or set $SFXLIN_RESULTS to the folder that holds it")


def test_a_missing_path_is_named_absolute(tmp_path):
    with pytest.raises(ResultsError) as info:
        open_results(Path("sub") / "gone.nc")
    assert str(info.value) == f"no results file {str(tmp_path / 'cwd' / 'sub' / 'gone.nc')!r}: no such file"


def test_an_output_folder_that_cannot_be_made_is_named_absolute(results, tmp_path):
    Path("blocker").write_text("a regular file")
    with pytest.raises(ResultsError) as info:
        save(results, Path("blocker") / "sub" / "toy.nc")
    assert str(info.value).startswith(f"cannot create output folder {tmp_path / 'cwd' / 'blocker' / 'sub'}: ")



@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"),
                    reason="OPENBLAS_CORETYPE names x86-64 kernels (Haswell, Sandybridge)")
@pytest.mark.parametrize("kernel", ["Haswell", "Sandybridge"])
def test_the_blas_kernel_recorded_is_the_one_openblas_was_told_to_use(kernel):
    """The file records the kernel that computed it: a process started with ``OPENBLAS_CORETYPE``
    (OpenBLAS's own switch, the independent truth here) records that kernel."""
    code = "from sfxlin.engine.storage import blas_kernel; print(blas_kernel())"
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "OPENBLAS_CORETYPE": kernel},
                         capture_output=True, text=True, check=True).stdout.strip()
    assert out.startswith("openblas ") and out.endswith(" " + kernel), out


def test_the_blas_recorded_is_numpys_whatever_was_imported_before():
    """scipy loads its own OpenBLAS when imported (statsmodels, the quadratures): the record names
    numpy's alone, the same whether scipy came first or not at all."""
    code = ("import sys\nif sys.argv[1] == 'scipy':\n    import scipy.linalg\n"
            "from sfxlin.engine.storage import blas_kernel; print(blas_kernel())")
    out = {first: subprocess.run([sys.executable, "-c", code, first], capture_output=True, text=True,
                                 check=True).stdout.strip() for first in ("scipy", "numpy")}
    assert out["scipy"] == out["numpy"] and ";" not in out["numpy"], out


def test_the_blas_filter_keeps_numpys_library_in_any_order(monkeypatch):
    import threadpoolctl

    from sfxlin.engine.storage import blas_kernel

    site = Path(np.__file__).resolve().parent.parent
    numpys = {"user_api": "blas", "internal_api": "openblas", "version": "0.3.31", "architecture": "Haswell",
              "filepath": str(site / "numpy.libs" / "libscipy_openblas64_.so")}
    scipys = {"user_api": "blas", "internal_api": "openblas", "version": "0.3.30", "architecture": "Zen",
              "filepath": str(site / "scipy.libs" / "libscipy_openblas.so")}
    omp = {"user_api": "openmp", "internal_api": "openmp", "version": None, "filepath": "/usr/lib/libgomp.so"}
    for libs in ([numpys, scipys, omp], [omp, scipys, numpys]):
        monkeypatch.setattr(threadpoolctl, "threadpool_info", lambda libs=libs: libs)
        assert blas_kernel() == "openblas 0.3.31 Haswell"
    monkeypatch.setattr(threadpoolctl, "threadpool_info", lambda: [scipys, omp])   # numpy's not told apart
    assert blas_kernel() == "openblas 0.3.30 Zen"
    monkeypatch.setattr(threadpoolctl, "threadpool_info", lambda: [omp])
    assert blas_kernel() == "none found"
