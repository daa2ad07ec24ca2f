"""Sweeps that survive: a SIGKILLed run resumes from its kept cells and gives the same bits."""
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import xarray as xr

from sfxlin.cellstore import CellStore
from sfxlin.pipelines import c1_limit
from sfxlin.sweep import build

SLOW_QUICK = ["--set", "n_prompts=48", "--set", "L=16,64,256,1024,4096", "--local-scheduler", "synchronous"]


def sfxlin(*args, **kwargs):
    return [sys.executable, "-m", "sfxlin.cli", *args]


def _data(path):
    with xr.open_dataset(path) as ds:
        return {k: v.values for k, v in ds.data_vars.items()}


@pytest.mark.slow
def test_sigkill_then_rerun_equals_an_uninterrupted_run(tmp_path):
    ref_dir, run_dir = tmp_path / "ref", tmp_path / "run"
    subprocess.run(sfxlin("run", "c1", "--quiet", "--out", str(ref_dir), *SLOW_QUICK), check=True)

    cells = run_dir / ".c1_limit.cells"
    proc = subprocess.Popen(sfxlin("run", "c1", "--quiet", "--out", str(run_dir), *SLOW_QUICK))
    deadline = time.time() + 120
    while time.time() < deadline and (not cells.exists() or len(list(cells.glob("cell_*.npz"))) < 3):
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    kept = len(list(cells.glob("cell_*.npz")))
    assert 3 <= kept < 8, f"kill landed after {kept} of 8 cells"
    assert not (run_dir / "c1_limit.nc").exists()

    res = subprocess.run(sfxlin("run", "c1", "--out", str(run_dir), *SLOW_QUICK), capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert f"({kept} kept from an interrupted run" in res.stdout
    ref, again = _data(ref_dir / "c1_limit.nc"), _data(run_dir / "c1_limit.nc")
    assert ref.keys() == again.keys()
    for name in ref:
        np.testing.assert_array_equal(ref[name], again[name], err_msg=name)
    assert not cells.exists(), "kept cells are removed once the file is written"


def test_kept_cells_are_served_instead_of_recomputed(tmp_path):
    config = c1_limit.PROFILES["quick"]
    store = CellStore(tmp_path / "cells", c1_limit.NAME, config)
    first = build(c1_limit.EXPERIMENT, config, store=store).compute(scheduler="synchronous")
    assert store.count() == 8
    # tamper with one kept cell: the next build must serve it as kept, proving it is not recomputed
    path = store._path((0, 0, 0))
    with np.load(path) as data:
        tampered = {k: data[k] for k in data.files if k != "__config_hash__"}
    tampered["mse"] = tampered["mse"] * 0 + 123.0
    store.save((0, 0, 0), tampered)
    second = build(c1_limit.EXPERIMENT, config, store=store).compute(scheduler="synchronous")
    assert np.all(second.mse.isel(d=0, U_norm=0, seed=0) == 123.0)
    xr.testing.assert_identical(first.mse.isel(d=1), second.mse.isel(d=1))


def test_a_store_of_another_configuration_is_refused(tmp_path):
    config = c1_limit.PROFILES["quick"]
    CellStore(tmp_path / "cells", c1_limit.NAME, config).save((0, 0, 0), {"x": np.zeros(2)})
    with pytest.raises(ValueError, match="another configuration.*--fresh"):
        CellStore(tmp_path / "cells", c1_limit.NAME, {**config, "n_prompts": 9})
    fresh = CellStore(tmp_path / "cells", c1_limit.NAME, {**config, "n_prompts": 9}, fresh=True)
    assert fresh.count() == 0


def test_a_damaged_cell_file_is_recomputed(tmp_path):
    config = c1_limit.PROFILES["quick"]
    store = CellStore(tmp_path / "cells", c1_limit.NAME, config)
    store.save((0, 0, 1), {"x": np.zeros(2)})
    store._path((0, 0, 0)).write_bytes(b"truncated")
    assert store.load((0, 0, 0)) is None and not store._path((0, 0, 0)).exists()


def test_a_run_that_fails_before_any_cell_leaves_no_store(tmp_path):
    res = subprocess.run(sfxlin("run", "c1", "--quiet", "--out", str(tmp_path), "--chunks", "zeta=2"),
                         capture_output=True, text=True)
    assert res.returncode == 2 and not (tmp_path / ".c1_limit.cells").exists()


def test_cli_refuses_a_mismatched_store_with_one_line(tmp_path):
    subprocess.run(sfxlin("run", "c1", "--quiet", "--out", str(tmp_path), "--set", "n_seeds=1"), check=True)
    CellStore(tmp_path / ".c1_limit.cells", c1_limit.NAME, {"other": 1}).save((9, 9, 9), {})
    res = subprocess.run(sfxlin("run", "c1", "--quiet", "--out", str(tmp_path)), capture_output=True, text=True)
    assert res.returncode == 2 and "another configuration" in res.stderr and "Traceback" not in res.stderr
    ok = subprocess.run(sfxlin("run", "c1", "--quiet", "--fresh", "--out", str(tmp_path)), capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
