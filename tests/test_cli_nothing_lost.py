"""Nothing lost, nothing silently replaced: the command line under closed pipes and SIGTERM, a
report that stays beside its results, a token file changed under the same path, and the
conveniences (``--version``, ``list EXP``, ``rerun``, ``cells``, ``merge``) that keep runs
findable and reproducible."""
from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import types
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

import sfxlin
import sfxlin.cli as cli
import sfxlin.engine.execution
import sfxlin.engine.sweep
from sfxlin.cli import main
from sfxlin.engine.storage import ResultsError
from test_cli_behaviour import error_line

TINY = ["--local-scheduler", "synchronous", "--set", "d=2", "--set", "U_norm=0.1", "--set", "L=16,32,64",
        "--set", "n_seeds=1", "--set", "n_queries=3", "--set", "n_prompts=2"]
#: 9 cells (8 and the quadrature check) of ~0.2-0.3 CPU s each, one after the other: a signal after the
#: first leaves eight unfinished
SLOW_QUICK = ["--set", "n_prompts=16", "--set", "L=16,64,256,1024,4096", "--local-scheduler", "synchronous"]
README = Path(__file__).resolve().parent.parent / "README.md"


def sfxlin_cli(*args):
    return [sys.executable, "-m", "sfxlin.cli", *args]


def data_of(path):
    with xr.open_dataset(path) as ds:
        return {name: var.values for name, var in ds.data_vars.items()}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A results file of the TINY configuration (and its kept cells) in a folder of its own."""
    out = tmp_path_factory.mktemp("tiny")
    assert main(["run", "c1", *TINY, "--quiet", "--no-figure", "--out", str(out)]) == 0
    return out / "c1_limit.nc"


@pytest.fixture
def count_cells(monkeypatch):
    """The cells computed from here on (a list of run_cell's arguments)."""
    computed = []
    real = sfxlin.engine.sweep.run_cell
    monkeypatch.setattr(sfxlin.engine.sweep, "run_cell", lambda *a: computed.append(a) or real(*a))
    return computed


# --------------------------------------------------------------------------------------------
# 1. a reader that goes away never stops a run
# --------------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("closed", ["both", "stderr"])
def test_a_closed_pipe_never_stops_a_run(tmp_path, closed):
    """``sfxlin run ... 2>&1 | head -0`` (both streams) and ``2>/closed-pipe`` (the progress bar's
    stream only): the run completes, writes its file and exits 0; the stream still read gets
    every line."""
    args = sfxlin_cli("run", "c1", *TINY, "--out", str(tmp_path), "--name", "pipe")
    if closed == "both":
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        proc.stdout.close()  # the reader is gone before the first line
        stdout = b""
    else:
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        proc.stderr.close()
        stdout = proc.stdout.read()
        proc.stdout.close()
    assert proc.wait(timeout=300) == 0
    assert {"pipe.nc", "pipe.png"} <= set(os.listdir(tmp_path))
    assert data_of(tmp_path / "pipe.nc")["mse"].shape[0] == 5  # the five laws (ar1 among them): a whole file
    if closed == "stderr":
        text = stdout.decode()
        assert f"wrote {tmp_path / 'pipe.nc'}" in text and "C1-slopes" in text and "figure:" in text


def test_a_stream_whose_reader_is_gone_drops_the_rest(tmp_path):
    """:class:`ClosedPipeSafe` on a real pipe: the write that meets EPIPE and every later one
    are dropped (the descriptor now points at os.devnull), nothing is raised."""
    read_end, write_end = os.pipe()
    stream = open(write_end, "w", buffering=1)
    safe = cli.ClosedPipeSafe(stream)
    safe.write("first line\n")
    assert os.read(read_end, 100) == b"first line\n"
    os.close(read_end)
    assert safe.write("to nobody\n") == len("to nobody\n")
    safe.flush()
    safe.write("x" * 100_000)
    safe.flush()
    assert os.path.samestat(os.fstat(stream.fileno()), os.stat(os.devnull))
    stream.close()


# --------------------------------------------------------------------------------------------
# 2. a report goes beside the results it reads
# --------------------------------------------------------------------------------------------
def test_a_report_goes_beside_its_results_and_never_replaces_another(tiny, tmp_path, monkeypatch, capsys):
    shipped = tmp_path / "cwd" / "datasets"
    shipped.mkdir(parents=True)
    (shipped / "report.html").write_text("the shipped report")
    (shipped / "report.md").write_text("the shipped report")
    monkeypatch.chdir(tmp_path / "cwd")
    results = tmp_path / "quick"
    results.mkdir()
    shutil.copy(tiny, results / "c1_limit.nc")
    assert main(["report", "--results", str(results)]) == 0
    assert capsys.readouterr().out == f"wrote {results / 'report.html'} and {results / 'report.md'}\n"
    assert (results / "report.html").read_text().startswith("<!doctype html>")
    assert (results / "report.md").read_text().startswith("# sfxlin report")
    assert (shipped / "report.html").read_text() == (shipped / "report.md").read_text() == "the shipped report"


# --------------------------------------------------------------------------------------------
# 3. a token file changed under the same path is another configuration
# --------------------------------------------------------------------------------------------
def _rewrite(path, Z):
    """Save ``Z`` over ``path`` as a later edit would (the modification time moves on: checksums
    are cached per process by path, size and times)."""
    st = os.stat(path)
    np.save(path, Z)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))


def test_a_token_file_changed_under_the_same_path_does_not_replace_the_results(tmp_path, capsys, count_cells):
    tokens = tmp_path / "emb.npy"
    Z = np.random.default_rng(5).standard_normal((40, 2))
    np.save(tokens, Z)
    args = ["run", "c1", *TINY, "--set", f"tokens={tokens}", "--quiet", "--no-figure", "--out", str(tmp_path / "out")]
    assert main(args) == 0
    path = tmp_path / "out" / "c1_limit.nc"
    first, old = path.read_bytes(), hashlib.sha256(tokens.read_bytes()).hexdigest()
    _rewrite(tokens, Z[::-1] * 2.0)
    new = hashlib.sha256(tokens.read_bytes()).hexdigest()
    computed_before = len(count_cells)

    assert main(args) == 2
    line = error_line(capsys.readouterr().err, str(path), "another configuration", "--force", "--name")
    assert f"tokens: sha256 {old[:12]} -> {new[:12]}" in line and len(line) < 300
    assert path.read_bytes() == first and len(count_cells) == computed_before  # refused before any work

    assert main([*args, "--name", "edited"]) == 0  # beside it
    assert path.read_bytes() == first
    assert main([*args, "--force"]) == 0
    with xr.open_dataset(path) as ds:
        assert json.loads(ds.attrs["input_files"])["tokens"]["sha256"] == new


# --------------------------------------------------------------------------------------------
# 4. SIGTERM is Ctrl-C with status 143
# --------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_sigterm_keeps_the_cells_says_how_to_resume_and_exits_143(tmp_path):
    out = tmp_path / "out"
    cells = out / ".c1_limit.cells"
    args = ["run", "c1", "--quiet", "--no-figure", "--out", str(out), *SLOW_QUICK]
    proc = subprocess.Popen(sfxlin_cli(*args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while time.time() < deadline and not list(cells.glob("cell_*.npz")):
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 143, stderr
    kept = len(list(cells.glob("cell_*.npz")))
    assert 1 <= kept < 9, f"SIGTERM landed after {kept} of 9 cells"
    assert stdout == "" and not (out / "c1_limit.nc").exists()
    assert stderr == (f"sfxlin: terminated (SIGTERM); {kept} of 9 cells kept in {cells}; "
                      f"the same command resumes: {shlex.join(['sfxlin', *args])}\n")

    resumed = subprocess.run(sfxlin_cli(*[a for a in args if a != "--quiet"]), capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr
    assert f"({kept} kept from earlier runs in {cells}, {9 - kept} to compute)" in resumed.stdout
    assert data_of(out / "c1_limit.nc")["mse"].shape == (5, 2, 2, 5, 2)  # law, d, U_norm, L, seed: complete


def test_a_failure_that_follows_a_sigterm_is_reported_as_the_termination(tmp_path, monkeypatch, capsys):
    """A pool worker killed by the same SIGTERM (SLURM signals every process of the job) can fail
    the computation before the parent's own handler runs: the exit is still 143 with the resume
    line, not an error."""
    def compute(*args, **kwargs):
        cli.TERMINATED.set()  # the SIGTERM arrived ...
        raise RuntimeError("A child process terminated abruptly")  # ... and the pool broke first

    monkeypatch.setattr(sfxlin.engine.execution, "compute", compute)
    assert main(["run", "c1", *TINY, "--quiet", "--out", str(tmp_path)]) == 143
    err = capsys.readouterr().err
    assert err.startswith("sfxlin: terminated (SIGTERM); 0 of 2 cells kept in ") and "the same command resumes" in err


# --------------------------------------------------------------------------------------------
# 8. one rule for default folders
# --------------------------------------------------------------------------------------------
def test_report_from_elsewhere_names_the_absolute_folder_and_how_to_point_elsewhere(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SFXLIN_RESULTS", raising=False)
    assert main(["report"]) == 2
    error_line(capsys.readouterr().err, f"no results folder {tmp_path / 'datasets'}", "--results", "$SFXLIN_RESULTS")
    (tmp_path / "datasets").mkdir()
    assert main(["report"]) == 2
    error_line(capsys.readouterr().err, f"no results files (*.nc) in {tmp_path / 'datasets'}", "--results")


def test_info_by_name_reads_the_working_directorys_datasets(tiny, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SFXLIN_RESULTS", raising=False)
    (tmp_path / "datasets").mkdir()
    shutil.copy(tiny, tmp_path / "datasets" / "mine.nc")
    assert main(["info", "mine"]) == 0
    assert "experiment 'c1_limit'" in capsys.readouterr().out
    monkeypatch.setenv("SFXLIN_RESULTS", str(tmp_path / "elsewhere"))
    assert main(["info", "mine"]) == 2
    error_line(capsys.readouterr().err, f"no results file 'mine' in {tmp_path / 'elsewhere'}", "$SFXLIN_RESULTS")


def test_a_paper_run_goes_to_sfxlin_results_when_set(tmp_path, monkeypatch, capsys):
    """The paper profile without --set writes into $SFXLIN_RESULTS (else ./datasets); any other
    run into ./runs/PROFILE of the working directory. Stopped at once: only where it goes is checked."""
    def compute(*args, **kwargs):
        raise KeyboardInterrupt
    monkeypatch.setattr(sfxlin.engine.execution, "compute", compute)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SFXLIN_RESULTS", str(tmp_path / "paper"))
    expected = {("--profile", "paper"): tmp_path / "paper",
                ("--profile", "paper", "--set", "n_seeds=1"): Path("runs") / "paper",
                ("--set", "n_seeds=1"): Path("runs") / "quick"}
    for extra, folder in expected.items():
        assert main(["run", "c1", "--quiet", *extra]) == 130
        assert f"cells kept in {(tmp_path / folder) / '.c1_limit.cells'};" in capsys.readouterr().err  # absolute
        assert (tmp_path / folder).is_dir()


def _commands():
    """The subcommands ``sfxlin --help`` lists."""
    usage = subprocess.run(sfxlin_cli("--help"), capture_output=True, text=True).stdout
    return re.search(r"\{([a-z,]+)\}", usage).group(1).split(",")


def test_every_commands_help_states_the_folder_rule_and_the_docstring_lists_it(capsys):
    commands = _commands()
    assert {"run", "rerun", "merge", "cells", "list", "report", "reproduce", "info"} <= set(commands)
    for command in commands:
        with pytest.raises(SystemExit):
            main([command, "--help"])
        text = " ".join(capsys.readouterr().out.split())
        assert "relative to the current working directory" in text and "$SFXLIN_RESULTS" in text, command
        assert f"sfxlin {command}" in cli.__doc__, command
    readme = " ".join(README.read_text().split())
    section = readme.split("## Where files go, and signals")[1].split("## ")[0]
    for fragment in ("current working directory", "$SFXLIN_RESULTS", "./runs/PROFILE", "SIGTERM", "143",
                     "beside the results"):
        assert fragment in section, fragment


# --------------------------------------------------------------------------------------------
# 9. conveniences
# --------------------------------------------------------------------------------------------
def test_version(capsys):
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0 and capsys.readouterr().out == f"sfxlin {sfxlin.__version__}\n"


def test_list_one_experiment(capsys):
    from sfxlin.pipelines import c1_limit

    assert main(["list", "c1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("c1 (c1_limit): ") and len(lines) == 2 + len(c1_limit.EXPERIMENT.params)
    assert main(["list", "c9"]) == 2
    error_line(capsys.readouterr().err, "unknown experiment 'c9'")


def test_rerun_gives_the_same_results_elsewhere(tiny, tmp_path, capsys, count_cells):
    assert main(["rerun", str(tiny), "--quiet", "--out", str(tmp_path)]) == 0
    assert len(count_cells) == 2  # recomputed (another folder: no kept cell), not copied
    again = tmp_path / "c1_limit.nc"
    a, b = data_of(tiny), data_of(again)
    assert a.keys() == b.keys()
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)
    with xr.open_dataset(tiny) as old, xr.open_dataset(again) as new:
        for key in ("experiment", "profile", "overrides", "config"):
            assert old.attrs[key] == new.attrs[key], key
        assert new.attrs["history"].endswith(f"sfxlin rerun {tiny} --quiet --out {tmp_path} (sfxlin {sfxlin.__version__})")
    assert capsys.readouterr().out == ""


def test_rerun_of_values_its_profile_no_longer_gives_reruns_the_values(tiny):
    from sfxlin.pipelines import c1_limit

    with xr.open_dataset(tiny) as ds:
        attrs = dict(ds.attrs)
    config, note = cli.rerun_configuration(c1_limit.EXPERIMENT, attrs)
    assert note == "" and config.profile == "quick" and json.loads(config.to_json()) == json.loads(attrs["config"])
    attrs["overrides"] = json.dumps(["n_seeds=1"])  # as if the other overrides had since become the defaults
    config, note = cli.rerun_configuration(c1_limit.EXPERIMENT, attrs)
    assert config.profile == "custom" and json.loads(config.to_json()) == json.loads(attrs["config"])
    assert "no longer gives the recorded configuration" in note


def test_rerun_refuses_a_file_whose_token_file_changed(tmp_path, capsys):
    tokens = tmp_path / "emb.npy"
    np.save(tokens, np.random.default_rng(6).standard_normal((30, 2)))
    assert main(["run", "c1", *TINY, "--set", f"tokens={tokens}", "--quiet", "--no-figure", "--out", str(tmp_path)]) == 0
    _rewrite(tokens, np.zeros((30, 2)))
    assert main(["rerun", str(tmp_path / "c1_limit.nc"), "--out", str(tmp_path / "again")]) == 2
    error_line(capsys.readouterr().err, "tokens: sha256", "would not give the same results")
    assert not (tmp_path / "again").exists()


def test_rerun_of_a_file_that_is_not_a_results_file(tmp_path, capsys):
    xr.Dataset({"x": ("t", [1.0])}).to_netcdf(tmp_path / "other.nc")
    assert main(["rerun", str(tmp_path / "other.nc")]) == 2
    error_line(capsys.readouterr().err, str(tmp_path / "other.nc"), "records no experiment and no config attr")


def _stale_copy(cell, name, code):
    """A copy of the kept cell file ``cell`` under ``name``, recording the code fingerprint
    ``code`` (None: a file from before files recorded it)."""
    with np.load(cell) as data:
        arrays = {k: data[k] for k in data.files if k != "__code_fingerprint__"}
    if code is not None:
        arrays["__code_fingerprint__"] = np.array(code)
    np.savez(cell.with_name(name), **arrays)


def test_cells_lists_and_prunes_the_kept_cells(tiny, tmp_path, capsys):
    out = tmp_path / "out"
    shutil.copytree(tiny.parent, out)
    folder = out / ".c1_limit.cells"
    current = sorted(folder.glob("cell_*.npz"))
    assert len(current) == 2
    _stale_copy(current[0], "cell_000000000000000000000001.npz", "0123456789abcdef")  # other code
    _stale_copy(current[0], "cell_000000000000000000000002.npz", None)  # an older sfxlin's file
    size = sum(p.stat().st_size for p in folder.glob("cell_*.npz"))
    stale_size = size - sum(p.stat().st_size for p in current)

    assert main(["cells", str(out)]) == 0
    assert capsys.readouterr().out == (f"c1_limit: 4 cells, {cli.human_bytes(size)} in {folder}: "
                                       f"2 of the current code, 2 stale\n")
    assert main(["cells", str(out), "--experiment", "c1", "--prune"]) == 0
    assert capsys.readouterr().out.endswith(f"\n  removed 2 stale cells ({cli.human_bytes(stale_size)})\n")
    assert sorted(folder.glob("cell_*.npz")) == current
    # what is left is what a run of the configuration is served
    assert main(["run", "c1", *TINY, "--no-figure", "--out", str(out)]) == 0
    assert "(2 kept from earlier runs" in capsys.readouterr().out
    assert main(["cells", str(out), "--prune", "--all"]) == 0
    assert "removed 2 cells" in capsys.readouterr().out and not folder.exists()
    assert main(["cells", str(out)]) == 0
    assert capsys.readouterr().out == f"no kept cells in {out}\n"


@pytest.mark.parametrize("args, message", [
    (["--all"], "--all goes with --prune"),
    (["--experiment", "c9"], "unknown experiment 'c9'"),
])
def test_cells_refuses_bad_options(tmp_path, capsys, args, message):
    assert main(["cells", str(tmp_path), *args]) == 2
    error_line(capsys.readouterr().err, message)
    assert main(["cells", str(tmp_path / "none")]) == 2
    error_line(capsys.readouterr().err, f"no folder {tmp_path / 'none'}")


# --------------------------------------------------------------------------------------------
# 10. sfxlin merge calls sfxlin.engine.merge.merge_files
# --------------------------------------------------------------------------------------------
@pytest.fixture
def stand_in_merge(monkeypatch):
    """A stand-in ``sfxlin.engine.merge`` recording its calls: copies the first file to ``out``, or
    raises ResultsError when a file is named ``incompatible.nc``."""
    calls = []

    def merge_files(paths, out):
        calls.append((list(paths), out))
        if any(p.name == "incompatible.nc" for p in paths):
            raise ResultsError(f"{paths[1]}: d differs from {paths[0]}'s grid in U_norm too")
        shutil.copy(paths[0], out)
        return out

    module = types.ModuleType("sfxlin.engine.merge")
    module.merge_files = merge_files
    monkeypatch.setitem(sys.modules, "sfxlin.engine.merge", module)
    return calls


def test_merge_writes_and_says_how_many_cells(tiny, tmp_path, capsys, stand_in_merge):
    out = tmp_path / "C.nc"
    assert main(["merge", str(tiny), str(tiny), "-o", str(out)]) == 0
    assert stand_in_merge == [([tiny, tiny], out)]
    assert capsys.readouterr().out == f"wrote {out} (2 cells)\n"  # 1 x 1 x 1 main cells and the quadrature check


def test_merge_of_incompatible_files_is_one_error_line(tiny, tmp_path, capsys, stand_in_merge):
    bad = tmp_path / "incompatible.nc"
    shutil.copy(tiny, bad)
    assert main(["merge", str(tiny), str(bad), "-o", str(tmp_path / "C.nc")]) == 2
    error_line(capsys.readouterr().err, "d differs")
    assert not (tmp_path / "C.nc").exists()


def test_merged_cells_counts_the_grid_in_the_file(tiny, tmp_path):
    """Four seeds in the file (as a merge of seeds 0-1 and 2-3 would write) are four cells,
    whatever the config attr says."""
    with xr.open_dataset(tiny) as ds:
        wide = xr.concat([ds.load().assign_coords(seed=[s]) for s in range(4)], dim="seed", data_vars="minimal")
    wide.attrs = ds.attrs
    wide.to_netcdf(tmp_path / "wide.nc")
    assert cli.merged_cells(tmp_path / "wide.nc") == 4 + 1


def test_merge_through_the_real_module(tmp_path, capsys):
    """Two runs over d = 2 and d = 3, merged by sfxlin.engine.merge: the line counts the merged grid's
    cells as the merged file's own n_cells attr does."""
    pytest.importorskip("sfxlin.engine.merge")
    at = TINY.index("d=2")
    base = TINY[:at - 1] + TINY[at + 1:]  # TINY without its --set d=2
    for d in (2, 3):
        assert main(["run", "c1", *base, "--set", f"d={d}", "--quiet", "--no-figure", "--out", str(tmp_path / f"d{d}")]) == 0
    out = tmp_path / "both.nc"
    assert main(["merge", str(tmp_path / "d2" / "c1_limit.nc"), str(tmp_path / "d3" / "c1_limit.nc"), "-o", str(out)]) == 0
    with xr.open_dataset(out) as ds:
        assert ds.sizes["d"] == 2 and int(ds.attrs["n_cells"]) == 3  # two main cells and the quadrature check
    assert capsys.readouterr().out == f"wrote {out} (3 cells)\n"


def _pool_workers(pid):
    """The process-pool workers of the process ``pid`` (its children running multiprocessing's spawn)."""
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return [c for c in children if "spawn_main" in Path(f"/proc/{c}/cmdline").read_bytes().decode(errors="replace")]


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="reads a process's children from /proc (Linux)")
def test_a_signal_to_the_run_alone_ends_its_process_pool_at_once(tmp_path):
    """SIGINT sent to the run's process only (kill PID, a job runner), not to its process group as a
    terminal's Ctrl-C is: the pool's workers are in cells of minutes (c3 quick at 400000 steps: 6 cells,
    about 14 CPU-minutes by the cost model), whose results the interrupted run would throw away; the
    run ends in seconds, says what it kept, and leaves no worker behind (dask's own pool waited for
    every running cell)."""
    out = tmp_path / "out"
    args = ["run", "c3", "--set", "n_steps=400000", "--local-scheduler", "processes", "--quiet", "--out", str(out)]
    proc = subprocess.Popen(sfxlin_cli(*args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None and not _pool_workers(proc.pid):
        time.sleep(0.1)
    workers = _pool_workers(proc.pid)
    assert workers, "the pool never started"
    time.sleep(3)                                       # the workers are inside their first cells
    proc.send_signal(signal.SIGINT)
    try:
        stdout, stderr = proc.communicate(timeout=60)   # dask's pool: minutes, until the running cells end
    finally:
        for pid in [proc.pid, *workers] if proc.poll() is None else []:   # no run of minutes left behind
            os.kill(int(pid), signal.SIGKILL)
    assert proc.returncode == 130, stderr
    assert re.match(r"sfxlin: interrupted; [01] of 6 cells kept in ", stderr), stderr   # 1: the control's NaN cell
    time.sleep(1)
    assert not [w for w in workers if Path(f"/proc/{w}").exists()], "a pool worker outlived its run"
