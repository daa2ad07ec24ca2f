"""``sfxlin reproduce``: the runs it makes, the report, and the table of each run's cost it prints at
its end (wall, CPU, cells, kept cells, the share of the CPU that ``np.exp`` of the cells' logits
would take), with the total."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import xarray as xr

from sfxlin.engine.storage import load

from sfxlin.cli import reproduce_table

BIN = Path(sys.executable).parent


def test_the_table_sums_the_runs_and_says_n_a_where_cells_were_kept():
    rows = [dict(experiment="a", wall=10.0, cpu=20.0, cells=4, kept=0, logits=2_000_000_000),
            dict(experiment="b", wall=5.0, cpu=10.0, cells=3, kept=3, logits=None)]
    lines = reproduce_table(rows, per_logit=1e-9).splitlines()
    assert lines[0].split() == ["experiment", "wall", "CPU", "cells", "kept", "np.exp", "floor"]
    assert lines[1].split() == ["a", "10.0s", "20.0s", "4", "0", "10.0%", "of", "CPU"]   # 2 s of np.exp in 20 s
    assert lines[2].split() == ["b", "5.0s", "10.0s", "3", "3", "n/a"]
    assert lines[3].split()[:7] == ["total", "15.0s", "30.0s", "7", "3", "n/a", "(0.2"]
    assert "1.00 ns a logit here" in lines[3]


def test_every_floor_known_gives_the_total_floor():
    rows = [dict(experiment=name, wall=1.0, cpu=4.0, cells=1, kept=0, logits=10**9) for name in ("a", "b")]
    total = reproduce_table(rows, per_logit=1e-9).splitlines()[-1]
    assert total.split()[:7] == ["total", "2.0s", "8.0s", "2", "0", "25.0%", "of"]


def _reproduce(out, *extra):
    proc = subprocess.run([str(BIN / "sfxlin"), "reproduce", "c1_own", "--profile", "quick", "--out", str(out),
                           "--quiet", *extra], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


@pytest.mark.slow
def test_a_named_experiment_at_a_profile_then_the_report_then_its_cost(tmp_path):
    out = _reproduce(tmp_path)
    with load(tmp_path / "c1_own.nc") as ds:
        assert ds.attrs["profile"] == "quick"
        n_cells = int(ds.attrs["n_cells"])
        logits = sum(n for _part, _cell, n in json.loads(ds.attrs["cell_exponentials"]))
    assert (tmp_path / "report.html").exists() and (tmp_path / "report.md").exists()
    row = re.search(r"^c1_own +([\d.]+)s +([\d.]+)s +(\d+) +(\d+) +([\d.]+)% of CPU$", out, re.M)
    assert row, out[-2000:]
    wall, cpu, cells, kept, share = (float(g) for g in row.groups())
    assert wall > 0 and cpu > 0 and cells == n_cells and kept == 0 and 0 <= share < 100 and logits > 0
    assert re.search(r"^total +[\d.]+s +[\d.]+s +%d +0 +[\d.]+%% of CPU  \([\d.]+ min wall; np\.exp [\d.]+ ns a "
                     r"logit here\)$" % n_cells, out, re.M), out[-2000:]
    again = _reproduce(tmp_path)   # every cell kept by the first run: none computed, no floor to state
    assert re.search(r"^c1_own +[\d.]+s +[\d.]+s +%d +%d +n/a$" % (n_cells, n_cells), again, re.M), again[-2000:]


def test_an_unknown_experiment_is_refused_before_any_run(tmp_path):
    proc = subprocess.run([str(BIN / "sfxlin"), "reproduce", "c1_limt", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "c1_limit" in proc.stderr
    assert not list(tmp_path.iterdir())


def test_a_profile_the_named_experiment_lacks_is_refused_before_any_run(tmp_path):
    proc = subprocess.run([str(BIN / "sfxlin"), "reproduce", "c1_own", "--profile", "huge", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "no 'huge' profile in c1_own" in proc.stderr, proc.stderr
    assert not list(tmp_path.iterdir())
