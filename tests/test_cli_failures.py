"""The ``sfxlin`` command under failure: bad command lines, an unwritable or full disk, an
interrupted write, damaged or foreign results files.

Each failure gives one clear message on stderr (``sfxlin: error: ...``; argparse's usage line
and error for a malformed command line), a non-zero exit, no traceback, nothing under the final
file name and no temporary file left behind. ``tests/test_cli.py`` (unknown experiment, profile
and option; ``--out`` below a regular file) and ``tests/test_storage.py`` (``save`` and
``open_results`` on their own) cover the rest.
"""
from __future__ import annotations

import errno
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import matplotlib.figure
import netCDF4
import numpy as np
import pytest
import xarray as xr

import sfxlin.engine.cellstore
import sfxlin.engine.sweep
from sfxlin.cli import main
from sfxlin.engine.schema import SCHEMA_VERSION
from sfxlin.engine.storage import ResultsError, open_results

# a small C1 configuration: one cell per task, synchronous, a couple of seconds in-process
TINY = ["--quiet", "--local-scheduler", "synchronous", "--set", "d=2", "--set", "U_norm=0.1", "--set", "L=16,32,64",
        "--set", "n_seeds=1", "--set", "n_queries=3", "--set", "n_prompts=2"]
ENOSPC = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def cli_command(*args):
    return [sys.executable, "-m", "sfxlin.cli", *args]


def run_cli(*args, **kwargs):
    return subprocess.run(cli_command(*args), capture_output=True, text=True, timeout=600, **kwargs)


def error_line(stderr, *fragments, prefix="sfxlin: error: "):
    """stderr holds exactly one line, ``prefix ...``, with every fragment, and no traceback."""
    assert "Traceback" not in stderr, stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    assert lines[0].startswith(prefix), lines[0]
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    return lines[0]


def listing(folder):
    """Every path below ``folder`` (hidden ones included), relative."""
    folder = Path(folder)
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*")) if folder.exists() else []


def temporaries(folder):
    return [p for p in listing(folder) if "partial" in Path(p).name or Path(p).name.startswith(".tmp")]


@pytest.fixture(scope="module")
def good_file(tmp_path_factory):
    """A genuine results file of the tiny configuration."""
    out = tmp_path_factory.mktemp("good")
    assert main(["run", "c1", *TINY, "--no-figure", "--out", str(out)]) == 0
    return out / "c1_limit.nc"


# --------------------------------------------------------------------------------------------
# malformed command lines: refused before any work, nothing created
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("args, message", [
    (["--set", "bogus=1"], "--set bogus: unknown parameter of c1_limit"),
    (["--set", "n_seeds=x"], "--set n_seeds: 'x' is not a valid int"),
    (["--set", "n_seeds"], "--set expects KEY=VALUE, got 'n_seeds'"),
    (["--set", "L=64,32"], "strictly increasing"),
    (["--set", "U_norm=-1"], "U_norm: must be > 0"),
    (["--set", "root_seed=-1"], "--set root_seed: must be >= 0, got -1"),
    (["--set", "d=2", "--set", "d=3"], "--set d: given twice ('d=2', then 'd=3'); give each parameter once"),
    (["--set", "n_seeds=1", "--set", "d=2", "--set", "n_seeds=1"], "--set n_seeds: given twice"),
    (["--chunks", "seed=0"], "chunk size for 'seed' must be a positive integer"),
    (["--chunks", "zeta=2"], "not grid dims"),
])
def test_bad_settings_fail_before_any_work(tmp_path, capsys, args, message):
    out = tmp_path / "out"
    assert main(["run", "c1", "--quiet", "--out", str(out), *args]) == 2
    captured = capsys.readouterr()
    error_line(captured.err, message)
    assert captured.out == ""
    assert listing(tmp_path) == []  # not even the output folder


@pytest.mark.parametrize("args, message", [
    ([], "the following arguments are required: command"),
    (["frobnicate"], "invalid choice: 'frobnicate'"),
    (["info"], "the following arguments are required: file"),
    (["run", "c1", "--local-scheduler", "bogus"], "invalid choice: 'bogus'"),
    (["run", "c1", "--workers", "x"], "--workers"),
    (["run", "c1", "--workers", "0"], "--workers"),
    (["run", "c1", "--workers", "2", "--scheduler", "tcp://nowhere:1"], "not allowed with argument"),
    (["run", "c1", "--quiet", "--verbose"], "not allowed with argument"),
])
def test_malformed_command_lines_exit_2_with_usage_and_one_error(tmp_path, capsys, args, message):
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as info:
        main([*args, "--out", str(out)] if args[:1] == ["run"] else args)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.startswith("usage: sfxlin")
    last = err.strip().splitlines()[-1]
    assert last.startswith("sfxlin") and ": error: " in last and message in last, last
    assert listing(tmp_path) == []


# --------------------------------------------------------------------------------------------
# an output folder that cannot exist (root ignores permissions: a path below a regular file)
# --------------------------------------------------------------------------------------------
def test_output_folder_that_is_or_lies_below_a_regular_file(tmp_path):
    blocker = tmp_path / "results.txt"
    blocker.write_text("a regular file")
    for out in (blocker, blocker / "sub" / "deeper"):
        res = run_cli("run", "c1", *TINY, "--out", str(out))
        assert res.returncode == 2
        error_line(res.stderr, str(out))
        assert res.stdout == ""
        assert listing(tmp_path) == ["results.txt"] and blocker.read_text() == "a regular file"


# --------------------------------------------------------------------------------------------
# a full disk (simulated in-process) and an interruption
# --------------------------------------------------------------------------------------------
def _partial_then(exc):
    """A writer that leaves a partial file at its target, then fails with ``exc``."""
    def write(self, path=None, *args, **kwargs):
        Path(path).write_bytes(b"\x89HDF\r\n\x1a\n" + b"\0" * 64)
        raise exc
    return write


def test_full_disk_while_writing_the_results_file(tmp_path, monkeypatch, capsys):
    out = tmp_path / "out"
    monkeypatch.setattr(xr.Dataset, "to_netcdf", _partial_then(ENOSPC))
    assert main(["run", "c1", *TINY, "--out", str(out)]) == 2
    error_line(capsys.readouterr().err, "could not write", str(out / "c1_limit.nc"), "No space left on device")
    assert not (out / "c1_limit.nc").exists() and not (out / "c1_limit.png").exists()
    assert temporaries(out) == []
    # the finished cells are kept (and only they): once space is back, the rerun resumes from them
    kept = listing(out / ".c1_limit.cells")
    assert len(kept) == 2 and all(k.startswith("cell_") and k.endswith(".npz") for k in kept)  # and the check
    monkeypatch.undo()
    computed = []
    real_run_cell = sfxlin.engine.sweep.run_cell
    monkeypatch.setattr(sfxlin.engine.sweep, "run_cell", lambda *a: computed.append(a) or real_run_cell(*a))
    assert main(["run", "c1", *TINY, "--out", str(out)]) == 0
    assert computed == []  # served from the kept cell, not recomputed
    assert [p for p in listing(out) if not p.startswith(".")] == ["c1_limit.nc", "c1_limit.png"]
    assert temporaries(out) == []


def test_full_disk_while_keeping_a_finished_cell(tmp_path, monkeypatch, capsys):
    out = tmp_path / "out"
    monkeypatch.setattr(sfxlin.engine.cellstore.np, "savez", lambda file, **arrays: _partial_then(ENOSPC)(None, file))
    assert main(["run", "c1", *TINY, "--out", str(out)]) == 2
    error_line(capsys.readouterr().err, "No space left on device")
    assert not (out / "c1_limit.nc").exists()
    assert temporaries(out) == []


def test_full_disk_while_drawing_the_figure(tmp_path, monkeypatch, capsys):
    """The results file is written (and valid); the figure fails: no partial PNG under its name."""
    out = tmp_path / "out"
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", _partial_then(ENOSPC))
    assert main(["run", "c1", *TINY, "--out", str(out)]) == 2
    error_line(capsys.readouterr().err, "No space left on device")
    assert [p for p in listing(out) if not p.startswith(".c1_limit.cells")] == ["c1_limit.nc"]
    monkeypatch.undo()
    assert main(["info", str(out / "c1_limit.nc")]) == 0


@pytest.mark.parametrize("target", ["to_netcdf", "savefig"])
def test_interrupted_write_leaves_nothing_half_written(tmp_path, monkeypatch, capsys, target):
    out = tmp_path / "out"
    if target == "to_netcdf":
        monkeypatch.setattr(xr.Dataset, "to_netcdf", _partial_then(KeyboardInterrupt()))
    else:
        monkeypatch.setattr(matplotlib.figure.Figure, "savefig", _partial_then(KeyboardInterrupt()))
    assert main(["run", "c1", *TINY, "--out", str(out)]) == 130
    error_line(capsys.readouterr().err, prefix="sfxlin: interrupted")
    assert temporaries(out) == []
    assert not (out / "c1_limit.png").exists()
    assert (out / "c1_limit.nc").exists() == (target == "savefig")


# --------------------------------------------------------------------------------------------
# damaged and foreign results files given to `sfxlin info`
# --------------------------------------------------------------------------------------------
def _damaged_files(good, folder):
    data = good.read_bytes()
    files = {}
    for fraction in (0.0, 0.01, 0.1, 0.5, 0.9, 0.999):
        files[f"truncated_{fraction}"] = data[: int(len(data) * fraction)]
    files["text"] = b"time,value\n0,1\n"
    files["hdf5_magic_only"] = data[:8]
    rng = np.random.default_rng(7)
    for k in range(4):  # random bytes overwritten past the superblock: readable or refused, never a crash
        junk = bytearray(data)
        start = int(rng.integers(64, len(data) - 512))
        junk[start:start + 256] = rng.integers(0, 256, 256, dtype=np.uint8).tobytes()
        files[f"scribbled_{k}"] = bytes(junk)
    paths = {}
    for name, payload in files.items():
        paths[name] = folder / f"{name}.nc"
        paths[name].write_bytes(payload)
    (folder / "a_folder.nc").mkdir()
    paths["a_folder"] = folder / "a_folder.nc"
    return paths


# one process checks every damaged file through main() (a crash of the netCDF/HDF5 library would
# kill it: a negative return code); starting one process per file costs seconds each
INFO_DRIVER = r"""
import contextlib, io, json, sys
from sfxlin.cli import main
report = {}
for path in sys.argv[1:]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(["info", path])
        except SystemExit as exc:
            code = exc.code
    report[path] = [code, out.getvalue(), err.getvalue()]
print(json.dumps(report))
"""


def test_info_on_damaged_files(good_file, tmp_path):
    paths = _damaged_files(good_file, tmp_path)
    before = listing(tmp_path)
    proc = subprocess.run([sys.executable, "-c", INFO_DRIVER, *map(str, paths.values())], capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr  # no crash, no exception escaping main()
    report = json.loads(proc.stdout)
    for name, path in paths.items():
        code, stdout, stderr = report[str(path)]
        assert "Traceback" not in stderr, (name, stderr)
        if name.startswith("scribbled") and code == 0:
            continue  # the damage missed everything `info` reads
        assert code == 2, (name, code, stdout)
        error_line(stderr, str(path))
        assert stdout == ""
    assert listing(tmp_path) == before  # `info` writes nothing


def test_info_on_a_truncated_file_from_the_command_line(good_file, tmp_path):
    path = tmp_path / "c1_limit.nc"
    path.write_bytes(good_file.read_bytes()[: good_file.stat().st_size // 2])
    res = run_cli("info", str(path))
    assert res.returncode == 2 and res.stdout == ""
    error_line(res.stderr, str(path), "is not a readable netCDF file")
    assert listing(tmp_path) == ["c1_limit.nc"]


@pytest.mark.parametrize("version", [SCHEMA_VERSION + 1, 0, "banana", None])
def test_info_on_a_file_of_another_schema_version(good_file, tmp_path, capsys, version):
    path = tmp_path / "other.nc"
    path.write_bytes(good_file.read_bytes())
    with netCDF4.Dataset(path, "a") as nc:  # edit the attribute in place, as another tool would
        if version is None:
            nc.delncattr("sfxlin_schema_version")
        else:
            nc.setncattr("sfxlin_schema_version", version)
    """``info`` describes any netCDF file and says what the analysis would need; opening it as
    results (``open_results``, the report) refuses it with one line."""
    if version == SCHEMA_VERSION + 1:  # once through the real command line
        res = run_cli("info", str(path))
        code, out, err = res.returncode, res.stdout, res.stderr
    else:
        code = main(["info", str(path)])
        out, err = capsys.readouterr()
    assert code == 0 and err == ""
    assert f"schema version {version!r}; this sfxlin reads version {SCHEMA_VERSION}" in out
    assert "dims:" in out and "coord L:" in out
    with pytest.raises(ResultsError, match=f"schema version {re.escape(repr(version))}"):
        open_results(path)
    assert listing(tmp_path) == ["other.nc"]


def test_a_small_but_valid_configuration_reports_without_error(tmp_path, capsys):
    args = [a if a != "n_queries=3" else "n_queries=2" for a in TINY[1:]]
    assert main(["run", "c1", *args, "--out", str(tmp_path)]) == 0, capsys.readouterr().err
