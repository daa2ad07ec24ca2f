"""Behaviour of ``sfxlin run`` and ``sfxlin report`` a user relies on.

* configurations the analysis cannot use are refused before any work (too few prompt lengths for
  a slope, too few tau values for the hinge, repeated values in a list);
* progress written to a file or a pipe is whole lines, not carriage-return fragments.
"""
from __future__ import annotations

import io
import re
from pathlib import Path

import dask
import pytest

import sfxlin.sweep
from sfxlin.cli import config_for, main, pipeline
from sfxlin.execution import CellProgress
from sfxlin.sweep import build


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


