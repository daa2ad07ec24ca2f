"""Behaviour of ``sfxlin run`` and ``sfxlin report`` a user relies on.

* configurations the analysis cannot use are refused before any work (too few prompt lengths for
  a slope, too few tau values for the hinge, repeated values in a list);
* the exit status does not depend on ``--quiet`` (the analysis runs either way);
* ``sfxlin report --out``: the suffix says which file is which, a bad results file is skipped
  with a line saying why, the report files are written atomically;
* a run never silently replaces the file of another configuration (``--force``, ``--name``);
* Ctrl-C says how many cells are kept and which command resumes;
* progress written to a file or a pipe is whole lines, not carriage-return fragments.
"""
from __future__ import annotations

import errno
import io
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import dask
import pytest
import xarray as xr

import sfxlin.engine.sweep
from sfxlin.analysis import c1 as c1_analysis
from sfxlin.cli import main
from sfxlin.engine.experiments import get as get_experiment
from sfxlin.engine.execution import CellProgress
from sfxlin.engine.sweep import build

# a small C1 configuration: a couple of seconds in-process
TINY = ["--local-scheduler", "synchronous", "--set", "d=2", "--set", "U_norm=0.1", "--set", "L=16,32,64",
        "--set", "n_seeds=1", "--set", "n_queries=3", "--set", "n_prompts=2"]
README = Path(__file__).resolve().parent.parent / "README.md"


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
    monkeypatch.setattr(sfxlin.engine.sweep, "run_cell", refuse)


# --------------------------------------------------------------------------------------------
# 1. what the analysis needs is checked before any work
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("experiment, sets, fragments", [
    ("c1", ["L=16,32"], ["L", "at least 3 values", "log-log slopes", "[16, 32]"]),
    ("c2", ["L=8,16"], ["L", "at least 3 values", "log-log slopes"]),
    ("c2_threshold", ["L=8,16"], ["L", "at least 3 values", "log-log slopes"]),
    ("c3", ["L=8,16"], ["L", "at least 3 values", "log-log slopes"]),
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
    with pytest.raises(ValueError) as info:
        get_experiment(experiment).configure("quick", sets)  # the declarations refuse it
    for fragment in fragments:
        assert fragment in str(info.value), (fragment, str(info.value))
    out = tmp_path / "out"
    args = [x for s in sets for x in ("--set", s)]
    assert main(["run", experiment, "--out", str(out), *args]) == 2
    captured = capsys.readouterr()
    error_line(captured.err, *fragments)
    assert captured.out == "" and listing(tmp_path) == []  # not even the output folder


# --------------------------------------------------------------------------------------------
# 2. one exit status, with or without --quiet
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("quiet", [False, True])
def test_the_analysis_runs_and_decides_the_exit_status_with_or_without_quiet(tmp_path, monkeypatch, capsys, quiet):
    def broken(ds, resamples=None):
        raise ValueError("the verdicts cannot be computed")
    monkeypatch.setattr(c1_analysis, "verdicts", broken)
    status = main(["run", "c1", *TINY, "--no-figure", "--out", str(tmp_path), *(["--quiet"] if quiet else [])])
    assert status == 2
    assert "sfxlin: error: the verdicts cannot be computed" in capsys.readouterr().err


def test_quiet_prints_nothing_but_still_draws_the_figure(tmp_path, capsys):
    assert main(["run", "c1", *TINY, "--out", str(tmp_path), "--quiet"]) == 0
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == ""
    assert (tmp_path / "c1_limit.png").exists()


# --------------------------------------------------------------------------------------------
# 3. sfxlin report: suffixes, bad files skipped, atomic writes
# --------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("results")
    assert main(["run", "c1", *TINY, "--quiet", "--no-figure", "--out", str(out)]) == 0
    return out


# --------------------------------------------------------------------------------------------
# 2b. --strict: exit status 1 when a verdict FAILs (INCONCLUSIVE and NOT JUDGED do not)
# --------------------------------------------------------------------------------------------
def _judged(*verdicts):
    """Verdict rows with the given statuses (PASS, FAIL, INCONCLUSIVE, NOT JUDGED), one criterion each."""
    from sfxlin.analysis.verdicts import NOT_JUDGED, Criterion, VerdictRow, evaluate

    rows = []
    for i, v in enumerate(verdicts):
        crit = Criterion(id=f"C1-x{i}", claim="C1", description="x", kind="<", threshold=1.0)
        if v == NOT_JUDGED:
            rows.append(VerdictRow(crit, None, "n/a", NOT_JUDGED, "not judged at this profile"))
        else:
            rows += evaluate([crit], {crit.id: {"PASS": 0.5, "FAIL": 2.0, "INCONCLUSIVE": None}[v]})
    return rows


@pytest.mark.parametrize("verdicts, strict, status", [
    (("PASS", "FAIL"), True, 1),
    (("PASS", "FAIL"), False, 0),
    (("PASS", "INCONCLUSIVE", "NOT JUDGED"), True, 0),
])
def test_run_strict_exits_1_when_a_verdict_fails(tmp_path, monkeypatch, capsys, verdicts, strict, status):
    monkeypatch.setattr(c1_analysis, "verdicts", lambda ds, resamples=None: _judged(*verdicts))
    assert main(["run", "c1", *TINY, "--quiet", "--no-figure", "--out", str(tmp_path), *(["--strict"] if strict else [])]) == status
    err = capsys.readouterr().err
    if status:
        assert err == (f"sfxlin: --strict: 1 verdict FAIL in {tmp_path / 'c1_limit.nc'} (C1-x1): exit status 1\n")
    else:
        assert err == ""
    assert (tmp_path / "c1_limit.nc").exists()  # the run is written either way


def test_report_strict_writes_the_report_then_exits_1_when_a_verdict_fails(results, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(c1_analysis, "verdicts", lambda ds, resamples=None: _judged("FAIL", "PASS", "FAIL"))
    out = tmp_path / "report.html"
    assert main(["report", "--results", str(results), "--out", str(out)]) == 0
    assert main(["report", "--results", str(results), "--out", str(out), "--strict"]) == 1
    captured = capsys.readouterr()
    assert out.exists() and captured.out.count("wrote ") == 2
    assert captured.err == (f"sfxlin: --strict: 2 verdicts FAIL in {results / 'c1_limit.nc'} (C1-x0, C1-x2): "
                            "exit status 1\n")
    monkeypatch.setattr(c1_analysis, "verdicts",
                        lambda ds, resamples=None: _judged("PASS", "INCONCLUSIVE", "NOT JUDGED"))
    assert main(["report", "--results", str(results), "--out", str(out), "--strict"]) == 0


def test_strict_is_documented_with_its_exit_status(capsys):
    for command in ("run", "rerun", "report"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        text = " ".join(capsys.readouterr().out.split())
        assert "--strict exit with status 1 when a verdict" in text and "NOT JUDGED do not" in text, command


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
# 4. another configuration never silently replaces a results file
# --------------------------------------------------------------------------------------------
def test_a_run_of_another_configuration_does_not_replace_the_file(tmp_path, capsys, monkeypatch):
    assert main(["run", "c1", *TINY, "--quiet", "--no-figure", "--out", str(tmp_path)]) == 0
    first = (tmp_path / "c1_limit.nc").read_bytes()
    cells = listing(tmp_path / ".c1_limit.cells")
    computed = []
    real_run_cell = sfxlin.engine.sweep.run_cell
    monkeypatch.setattr(sfxlin.engine.sweep, "run_cell", lambda *a: computed.append(a) or real_run_cell(*a))

    other = [a if a != "n_prompts=2" else "n_prompts=3" for a in TINY]  # each parameter is given once
    assert main(["run", "c1", *other, "--quiet", "--fresh", "--out", str(tmp_path)]) == 2
    line = error_line(capsys.readouterr().err, str(tmp_path / "c1_limit.nc"), "another configuration",
                      "n_prompts", "--force", "--name")
    assert "n_prompts: 2 -> 3" in line
    assert computed == [] and (tmp_path / "c1_limit.nc").read_bytes() == first
    assert listing(tmp_path / ".c1_limit.cells") == cells  # --fresh did not discard the kept cells

    # --name writes beside it
    assert main(["run", "c1", *other, "--quiet", "--name", "more_prompts", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "c1_limit.nc").read_bytes() == first
    assert {"more_prompts.nc", "more_prompts.png"} <= set(os.listdir(tmp_path))
    with xr.open_dataset(tmp_path / "more_prompts.nc") as ds:
        assert '"n_prompts": 3' in ds.attrs["config"] and ds.attrs["experiment"] == "c1_limit"

    # the same configuration again (a rerun) may overwrite; --force replaces another one
    assert main(["run", "c1", *TINY, "--quiet", "--no-figure", "--out", str(tmp_path)]) == 0
    assert main(["run", "c1", *other, "--quiet", "--no-figure", "--force", "--out", str(tmp_path)]) == 0
    with xr.open_dataset(tmp_path / "c1_limit.nc") as ds:
        assert '"n_prompts": 3' in ds.attrs["config"]


def test_a_file_of_another_experiment_under_the_name_is_not_replaced(results, tmp_path, capsys, no_cell_computed):
    (tmp_path / "c3_transfer.nc").write_bytes((results / "c1_limit.nc").read_bytes())
    assert main(["run", "c3", "--quiet", "--out", str(tmp_path)]) == 2
    error_line(capsys.readouterr().err, str(tmp_path / "c3_transfer.nc"), "c1_limit", "--force")


@pytest.mark.parametrize("name", ["", "a/b", "../up", ".hidden", "mine.nc", "white space"])
def test_bad_names_are_usage_errors(tmp_path, capsys, name):
    with pytest.raises(SystemExit) as info:
        main(["run", "c1", "--name", name, "--out", str(tmp_path / "out")])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: sfxlin") and "--name" in err.splitlines()[-1]
    assert listing(tmp_path) == []


# --------------------------------------------------------------------------------------------
# 5. Ctrl-C says what is kept and how to resume
# --------------------------------------------------------------------------------------------
#: 9 cells (8 and the quadrature check) of ~0.2-0.3 CPU s each, one after the other: a signal after the
#: first leaves eight unfinished
SLOW_QUICK = ["--set", "n_prompts=16", "--set", "L=16,64,256,1024,4096", "--local-scheduler", "synchronous"]


@pytest.mark.slow
def test_ctrl_c_says_how_many_cells_are_kept_and_the_command_that_resumes(tmp_path):
    out = tmp_path / "out"
    cells = out / ".c1_limit.cells"
    args = ["run", "c1", "--quiet", "--no-figure", "--fresh", "--out", str(out), *SLOW_QUICK]
    # the child must start with SIGINT's default disposition, as from a shell: an ignored SIGINT
    # (SIG_IGN, set at the C level by a library earlier in the test process) passes to the child,
    # whose Python then installs no KeyboardInterrupt handler. Re-installing Python's handler here
    # makes SIGINT caught, and a caught signal is reset to the default in the exec'd child (no
    # preexec_fn: forking a process that runs JAX threads is unsafe)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    proc = subprocess.Popen([sys.executable, "-m", "sfxlin.cli", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while time.time() < deadline and not list(cells.glob("cell_*.npz")):
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr
    kept = len(list(cells.glob("cell_*.npz")))
    assert 1 <= kept < 9, f"the interrupt landed after {kept} of 9 cells"
    assert "Traceback" not in stderr and stdout == ""
    resume = shlex.join(["sfxlin", *[a for a in args if a != "--fresh"]])  # --fresh would discard them
    assert stderr == f"sfxlin: interrupted; {kept} of 9 cells kept in {cells}; the same command resumes: {resume}\n"
    assert not (out / "c1_limit.nc").exists()


# --------------------------------------------------------------------------------------------
# 6. progress to a file or a pipe: whole lines
# --------------------------------------------------------------------------------------------
class Terminal(io.StringIO):
    def isatty(self):
        return True


def _progress(stream, toy, toy_config, **kwargs):
    ds = build(toy.EXPERIMENT, toy_config, chunks={"seed": 2})
    n_blocks = (ds.attrs["n_cells"] - 1) // 2 + 1  # pairs of seeds, and the global part's one cell
    with CellProgress(toy.EXPERIMENT.name, n_blocks, stream=stream, **kwargs), \
            dask.config.set(scheduler="synchronous"):
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
    bar = CellProgress("exp", 1000, stream=stream)
    bar._start({})
    for i in range(1000):
        bar._posttask(f"exp-block-seed[{i}:{i + 1}]-0123abcd", None, {}, {}, 0)
    bar._finish({}, {}, False)
    lines = stream.getvalue().splitlines()
    assert 20 <= len(lines) <= 22 and lines[-1].startswith("1000/1000 tasks of cells")


def test_progress_to_a_terminal_is_a_bar(toy, toy_config):
    text, n = _progress(Terminal(), toy, toy_config)
    assert text.count("\r") >= n and f"[{'#' * 30}] {n}/{n} tasks of cells" in text


# --------------------------------------------------------------------------------------------
# 7. the README says what a resume gives and what the kept cells are
# --------------------------------------------------------------------------------------------
def test_readme_says_what_is_identical_after_a_resume_and_what_the_kept_cells_are():
    from test_resume import TIME_STAMPS  # the attrs test_resume lets differ between the two files

    paragraph = next(p for p in README.read_text().split("\n\n") if "OUT/.EXP.cells/" in p)
    paragraph = " ".join(paragraph.split())
    assert "bit for bit" not in paragraph  # the time stamps differ: not the whole file
    for stamp in TIME_STAMPS:
        assert f"`{stamp}`" in paragraph, stamp
    assert "--fresh" in paragraph and "extended sweep" in paragraph and "new cells" in paragraph
