"""Behaviour of ``sfxlin run`` and ``sfxlin report`` a user relies on.

* configurations the analysis cannot use are refused before any work (too few prompt lengths for
  a slope, too few tau values for the hinge, repeated values in a list);
* ``sfxlin report --out``: the suffix says which file is which, a bad results file is skipped
  with a line saying why, the report files are written atomically;
* progress written to a file or a pipe is whole lines, not carriage-return fragments.
"""
from __future__ import annotations

import errno
import io
import os
import re
from pathlib import Path

import dask
import pytest
import xarray as xr

import sfxlin.sweep
from sfxlin.cli import config_for, main, pipeline
from sfxlin.execution import CellProgress
from sfxlin.sweep import build

# a small C1 configuration: a couple of seconds in-process
TINY = ["--local-scheduler", "synchronous", "--set", "d=2", "--set", "U_norm=0.1", "--set", "L=16,32,64",
        "--set", "n_seeds=1", "--set", "n_queries=3", "--set", "n_prompts=2"]


def listing(folder):
    """Every path below ``folder`` (hidden ones included), relative."""
    folder = Path(folder)
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*")) if folder.exists() else []


def error_line(stderr, *fragments):
    """stderr is one line ``sfxlin: error: ...`` holding every fragment, no traceback."""
    assert "Traceback" not in stderr, stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("sfxlin: error: "), stderr
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    return lines[0]


@pytest.fixture
def no_cell_computed(monkeypatch):
    """Fail the test if any cell is computed."""
    def refuse(*args):
        raise AssertionError(f"a cell was computed: {args[2]}")
    monkeypatch.setattr(sfxlin.sweep, "run_cell", refuse)


# --------------------------------------------------------------------------------------------
# 1. what the analysis needs is checked before any work
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("experiment, sets, fragments", [
    ("c1", ["L=16,32"], ["L", "at least 3 prompt lengths", "[16, 32]"]),
    ("c2", ["L=8,16"], ["L", "at least 3 prompt lengths"]),
    ("c2_threshold", ["L=8,16"], ["L", "at least 3 prompt lengths"]),
    ("c3", ["L=8,16"], ["L", "at least 3 prompt lengths"]),
    ("c2_threshold", ["tau=1,8"], ["tau", "at least 6 values", "threshold regression", "[1.0, 8.0]"]),
    ("c1", ["d=3,3"], ["d", "repeats the value 3"]),
    ("c1", ["U_norm=0.5,0.1,0.5"], ["U_norm", "repeats the value 0.5"]),
    ("c2", ["d=2,2"], ["d", "repeats the value 2"]),
    ("c2", ["U_norm=0.1,0.1"], ["U_norm", "repeats the value 0.1"]),
    ("c2", ["grad_scales=1,1"], ["grad_scales", "repeats the value 1.0"]),
    ("c2", ["tail_levels=0.1,0.1"], ["tail_levels"]),
    ("c2_threshold", ["tau=1,1,2,3,4,5"], ["tau"]),
    ("c3", ["settings=isotropic,isotropic"], ["settings"]),
])
def test_configurations_the_analysis_cannot_use_are_refused_before_any_work(
        tmp_path, capsys, no_cell_computed, experiment, sets, fragments):
    module = pipeline(experiment)
    with pytest.raises(ValueError) as info:
        config_for(module, "quick", sets)  # the pipeline's validate() refuses it
    for fragment in fragments:
        assert fragment in str(info.value), (fragment, str(info.value))
    out = tmp_path / "out"
    args = [x for s in sets for x in ("--set", s)]
    assert main(["run", experiment, "--out", str(out), *args]) == 2
    captured = capsys.readouterr()
    error_line(captured.err, *fragments)
    assert captured.out == "" and listing(tmp_path) == []  # not even the output folder


# --------------------------------------------------------------------------------------------
# 3. sfxlin report: suffixes, bad files skipped, atomic writes
# --------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("results")
    assert main(["run", "c1", *TINY, "--quiet", "--out", str(out)]) == 0
    return out


@pytest.mark.parametrize("name, markdown, page", [("report.html", "report.md", "report.html"),
                                                  ("notes.md", "notes.md", "notes.html")])
def test_report_out_suffix_says_which_file_is_which(results, tmp_path, capsys, name, markdown, page):
    assert main(["report", "--results", str(results), "--out", str(tmp_path / name)]) == 0
    assert (tmp_path / page).read_text().startswith("<!doctype html>")
    assert (tmp_path / markdown).read_text().startswith("# sfxlin report")
    assert sorted(os.listdir(tmp_path)) == sorted({markdown, page})
    assert capsys.readouterr().out == f"wrote {tmp_path / page} and {tmp_path / markdown}\n"


def test_report_refuses_an_unknown_suffix_before_reading_anything(results, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(xr, "load_dataset", lambda *a, **k: pytest.fail("a results file was read"))
    assert main(["report", "--results", str(results), "--out", str(tmp_path / "report.txt")]) == 2
    error_line(capsys.readouterr().err, "report.txt", ".html", ".md")
    assert listing(tmp_path) == []


def test_report_skips_unreadable_and_foreign_files_and_says_why(results, tmp_path, capsys):
    folder = tmp_path / "results"
    folder.mkdir()
    (folder / "c1_limit.nc").write_bytes((results / "c1_limit.nc").read_bytes())
    whole = (results / "c1_limit.nc").read_bytes()
    (folder / "c2_concentration.nc").write_bytes(whole[: len(whole) // 3])  # truncated
    xr.Dataset({"x": ("t", [1.0, 2.0])}).to_netcdf(folder / "other_tool.nc")  # netCDF, not ours
    assert main(["report", "--results", str(folder), "--out", str(tmp_path / "report.html")]) == 0
    captured = capsys.readouterr()
    skipped = captured.err.splitlines()
    assert len(skipped) == 2, captured.err
    assert any(str(folder / "c2_concentration.nc") in line and "not a readable netCDF file" in line for line in skipped)
    assert any(str(folder / "other_tool.nc") in line and "schema version" in line for line in skipped)
    assert all(line.startswith("sfxlin: skipped ") for line in skipped)
    page = (tmp_path / "report.html").read_text()
    assert "C1-slopes" in page and "other_tool.nc" in page  # the skipped files are named in the report too
    assert "C1-slopes" in (tmp_path / "report.md").read_text()


def test_report_fails_only_when_no_file_is_usable(tmp_path, capsys):
    (tmp_path / "c1_limit.nc").write_text("not netCDF")
    assert main(["report", "--results", str(tmp_path), "--out", str(tmp_path / "report.html")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith(f"sfxlin: skipped {tmp_path / 'c1_limit.nc'}: ")
    assert err[1].startswith("sfxlin: error: no usable results files in ")
    assert listing(tmp_path) == ["c1_limit.nc"]


def test_report_files_are_written_atomically(results, tmp_path, capsys, monkeypatch):
    """A full disk while writing leaves the previous report pair whole and no temporary file."""
    (tmp_path / "report.html").write_text("previous html")
    (tmp_path / "report.md").write_text("previous md")
    real_fsync = os.fsync
    calls = []

    def fsync_then_full(fd):
        calls.append(fd)
        if len(calls) == 2:  # the second report file: the first one is complete by now
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_fsync(fd)
    monkeypatch.setattr(os, "fsync", fsync_then_full)
    assert main(["report", "--results", str(results), "--out", str(tmp_path / "report.html")]) == 2
    error_line(capsys.readouterr().err, "No space left on device")
    assert (tmp_path / "report.html").read_text() == "previous html"
    assert (tmp_path / "report.md").read_text() == "previous md"
    assert listing(tmp_path) == ["report.html", "report.md"]


# --------------------------------------------------------------------------------------------
# 6. progress to a file or a pipe: whole lines
# --------------------------------------------------------------------------------------------
class Terminal(io.StringIO):
    def isatty(self):
        return True


def _progress(stream, toy, toy_config, **kwargs):
    ds = build(toy.EXPERIMENT, toy_config, chunks={"seed": 2})
    prefix = f"{toy.EXPERIMENT.name}-block-"
    n_blocks = ds.attrs["n_cells"] // 2
    with CellProgress(prefix, n_blocks, stream=stream, **kwargs), dask.config.set(scheduler="synchronous"):
        ds.compute()
    return stream.getvalue(), n_blocks


def test_progress_to_a_file_or_pipe_is_whole_lines(toy, toy_config):
    text, n = _progress(io.StringIO(), toy, toy_config)
    assert "\r" not in text and text.endswith("\n")
    lines = text.splitlines()
    assert lines[0].startswith(f"0/{n} tasks of cells") and lines[-1].startswith(f"{n}/{n} tasks of cells")
    assert all(re.fullmatch(rf"\d+/{n} tasks of cells, +\d+ s elapsed(, ETA +\d+ s)?", line) for line in lines), lines
    verbose, _ = _progress(io.StringIO(), toy, toy_config, verbose=True)
    assert "\r" not in verbose and verbose.count("finished cells") == n


def test_progress_to_a_file_is_throttled_to_every_5_percent():
    stream = io.StringIO()
    bar = CellProgress("exp-block-", 1000, stream=stream)
    bar._start({})
    for i in range(1000):
        bar._posttask(f"exp-block-seed[{i}:{i + 1}]-token", None, {}, {}, 0)
    bar._finish({}, {}, False)
    lines = stream.getvalue().splitlines()
    assert 20 <= len(lines) <= 22 and lines[-1].startswith("1000/1000 tasks of cells")


def test_progress_to_a_terminal_is_a_bar(toy, toy_config):
    text, n = _progress(Terminal(), toy, toy_config)
    assert text.count("\r") >= n and f"[{'#' * 30}] {n}/{n} tasks of cells" in text


