"""An experiment is two declaration modules: a toy experiment written in exactly two files
(tests/declared/walk_pipeline.py, walk_analysis.py), outside the package, is found by
``sfxlin list``, run by ``sfxlin run``, reported by ``sfxlin report`` and documented by
``sfxlin schema`` with no other file touched: only ``$SFXLIN_PIPELINES`` names it."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import xarray as xr

from sfxlin.engine.experiments import ENV

DECLARED = Path(__file__).resolve().parent / "declared"


def sfxlin(*args, cwd):
    env = {**os.environ, ENV: "walk_pipeline", "PYTHONPATH": f"{DECLARED}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    return subprocess.run([sys.executable, "-m", "sfxlin.cli", *args], capture_output=True, text=True, env=env,
                          cwd=cwd)


@pytest.mark.slow
def test_a_toy_experiment_in_two_files_is_listed_run_reported_and_documented(tmp_path):
    listed = sfxlin("list", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert "walk (walk): toy: mean squared displacement" in listed.stdout
    assert "n_walks" in listed.stdout and "c1 (c1_limit)" in listed.stdout  # beside the shipped ones

    out = tmp_path / "out"
    run = sfxlin("run", "walk", "--out", str(out), cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert "W-diffusion" in run.stdout and "PASS" in run.stdout
    with xr.open_dataset(out / "walk.nc") as ds:
        assert ds.attrs["analysis"] == "walk_analysis" and "W-diffusion" in ds.attrs["criteria"]
        assert ds.msd.dims == ("scale", "seed", "L")
    assert (out / "walk.png").stat().st_size > 1000

    report = sfxlin("report", "--results", str(out), "--out", str(out / "report.html"), cwd=tmp_path)
    assert report.returncode == 0, report.stderr
    md = (out / "report.md").read_text()
    assert "## A random walk's diffusion constant" in md and "W-diffusion" in md

    schema = sfxlin("schema", cwd=tmp_path)
    assert schema.returncode == 0 and "## `walk.nc`" in schema.stdout and "| `msd` | (scale, seed, L) |" in schema.stdout
    info = sfxlin("info", str(out / "walk.nc"), cwd=tmp_path)
    assert info.returncode == 0 and "not analysable" not in info.stdout


def test_an_unimportable_pipeline_module_is_one_clear_error(tmp_path):
    env = {**os.environ, ENV: "no_such_pipeline_module"}
    res = subprocess.run([sys.executable, "-m", "sfxlin.cli", "list"], capture_output=True, text=True, env=env)
    assert res.returncode == 2 and "cannot import the pipeline module 'no_such_pipeline_module'" in res.stderr
    assert "Traceback" not in res.stderr
