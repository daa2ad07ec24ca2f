"""Sweeps that survive: a SIGKILLed run resumes from its kept cells and gives the same bits."""
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import xarray as xr

from sfxlin.engine.cellstore import CellStore
from sfxlin.pipelines import c1_limit
from sfxlin.engine.sweep import build
from sfxlin.testing import assert_same_results

#: 9 cells (8 and the quadrature check) of ~0.4 CPU s each, one after the other: a kill after the
#: third leaves six unfinished (~2 CPU s of cells), and the three runs stay cheap
SLOW_QUICK = ["--no-figure", "--set", "n_prompts=32", "--set", "L=16,64,256,1024,4096", "--local-scheduler", "synchronous"]


def sfxlin(*args, **kwargs):
    return [sys.executable, "-m", "sfxlin.cli", *args]


def _data(path):
    with xr.open_dataset(path) as ds:
        return {k: v.values for k, v in ds.data_vars.items()}


#: attrs that say when and how long a run took: the only ones that differ between two runs
TIME_STAMPS = ("created", "wall_seconds", "history", "cell_timeline", "cell_seconds")


def _assert_same_results(a_path, b_path):
    """Data bit for bit, and every attr but the time stamps (what the README claims of a resume)."""
    assert_same_results(xr.load_dataset(a_path), xr.load_dataset(b_path), ignore=TIME_STAMPS)


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
    assert 3 <= kept < 9, f"kill landed after {kept} of 9 cells (8 and the quadrature check)"
    assert not (run_dir / "c1_limit.nc").exists()

    res = subprocess.run(sfxlin("run", "c1", "--out", str(run_dir), *SLOW_QUICK), capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert f"({kept} kept from earlier runs in {cells}, {9 - kept} to compute)" in res.stdout
    _assert_same_results(ref_dir / "c1_limit.nc", run_dir / "c1_limit.nc")
    assert len(list(cells.glob("cell_*.npz"))) == 9, "every cell is kept for the next run"


def _cell0(config):
    return {dim: values[0] for dim, values in c1_limit.EXPERIMENT.part("").grid(config).items()}


def test_kept_cells_are_served_instead_of_recomputed(tmp_path):
    config = c1_limit.EXPERIMENT.configure("quick")
    store = CellStore(tmp_path / "cells", c1_limit.EXPERIMENT, config)
    first = build(c1_limit.EXPERIMENT, config, store=store).compute(scheduler="synchronous")
    assert store.count() == 9  # 8 cells and the quadrature check
    # tamper with one kept cell: the next build must serve it as kept, proving it is not recomputed
    cell = _cell0(config)
    tampered = dict(store.load(cell))
    tampered["mse"] = tampered["mse"] * 0 + 123.0
    store.save(cell, tampered)
    second = build(c1_limit.EXPERIMENT, config, store=store).compute(scheduler="synchronous")
    assert np.all(second.mse.isel(d=0, U_norm=0, seed=0) == 123.0)
    xr.testing.assert_identical(first.mse.isel(d=1), second.mse.isel(d=1))


def test_cells_of_another_configuration_are_not_served(tmp_path):
    config = c1_limit.EXPERIMENT.configure("quick")
    CellStore(tmp_path / "cells", c1_limit.EXPERIMENT, config).save(_cell0(config), {"x": np.zeros(2)})
    other = CellStore(tmp_path / "cells", c1_limit.EXPERIMENT, {**config, "n_prompts": 9})
    assert other.count() == 0 and other.load(_cell0(config)) is None
    assert CellStore(tmp_path / "cells", c1_limit.EXPERIMENT, config).count() == 1  # still kept for its own
    fresh = CellStore(tmp_path / "cells", c1_limit.EXPERIMENT, config, fresh=True)
    assert fresh.count() == 0 and not (tmp_path / "cells").exists()


@pytest.mark.parametrize("damage", ["junk", "truncated", "emptied"])
def test_a_damaged_cell_file_is_recomputed(tmp_path, damage):
    config = c1_limit.EXPERIMENT.configure("quick")
    store = CellStore(tmp_path / "cells", c1_limit.EXPERIMENT, config)
    cell = _cell0(config)
    store.save(cell, {"x": np.arange(5000.0)})
    path = store._path(cell)
    whole = path.read_bytes()
    path.write_bytes({"junk": b"not a zip file", "truncated": whole[: len(whole) // 2], "emptied": b""}[damage])
    assert store.load(cell) is None and not path.exists()


def test_a_cell_file_under_another_name_is_not_served(tmp_path):
    """A kept file copied over another cell's name (its fingerprint inside says whose it is)."""
    config = c1_limit.EXPERIMENT.configure("quick")
    store = CellStore(tmp_path / "cells", c1_limit.EXPERIMENT, config)
    a, b = _cell0(config), {**_cell0(config), "seed": 1}
    store.save(a, {"x": np.zeros(2)})
    store._path(a).replace(store._path(b))
    assert store.load(b) is None


_SLOW_WRITER = """
import sys, time
import numpy as np
import numpy.lib.format as fmt
from sfxlin.engine.cellstore import CellStore
from sfxlin.pipelines import c1_limit

real = fmt.write_array
def write_then_stall(fp, array, *args, **kwargs):   # the first array goes out, then the writer stalls
    real(fp, array, *args, **kwargs)
    fp.flush() if hasattr(fp, "flush") else None
    print("writing", flush=True)
    time.sleep(600)
fmt.write_array = write_then_stall
config = c1_limit.EXPERIMENT.configure("quick")
cell = {dim: values[0] for dim, values in c1_limit.EXPERIMENT.part("").grid(config).items()}
CellStore(sys.argv[1], c1_limit.EXPERIMENT, config).save(cell, {"mse": np.ones(1000), "other": np.ones(1000)})
"""


@pytest.mark.slow
def test_a_writer_killed_mid_write_leaves_no_file_under_the_final_name(tmp_path):
    folder = tmp_path / "cells"
    proc = subprocess.Popen([sys.executable, "-c", _SLOW_WRITER, str(folder)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "writing"
        assert any(p.name.endswith(".partial.npz") for p in folder.iterdir()), "the write had started"
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    config = c1_limit.EXPERIMENT.configure("quick")
    store = CellStore(folder, c1_limit.EXPERIMENT, config)
    assert not list(folder.glob("cell_*.npz")) and store.count() == 0 and store.load(_cell0(config)) is None


def test_a_run_that_fails_before_any_cell_leaves_no_store(tmp_path):
    res = subprocess.run(sfxlin("run", "c1", "--quiet", "--out", str(tmp_path), "--chunks", "zeta=2"),
                         capture_output=True, text=True)
    assert res.returncode == 2 and not (tmp_path / ".c1_limit.cells").exists()


def test_an_extended_sweep_computes_only_its_new_cells(tmp_path):
    """d = 3 first, then d = 2, 3 listed the other way round: the d = 3 cells are reused, not
    recomputed, and the two files agree on them bit for bit."""
    small, large = tmp_path / "small", tmp_path / "large"
    base = ["--no-figure", "--set", "U_norm=0.5", "--set", "n_seeds=2", "--set", "L=16,64,256"]
    subprocess.run(sfxlin("run", "c1", "--quiet", "--out", str(small), "--set", "d=3", *base), check=True)
    large.mkdir()
    (small / ".c1_limit.cells").rename(large / ".c1_limit.cells")
    res = subprocess.run(sfxlin("run", "c1", "--out", str(large), "--set", "d=3,2", *base),
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    # 4 cells and the quadrature check; the d = 3 cells and the check (same inputs) are kept
    assert "5 cells (3 kept from earlier runs" in res.stdout and "2 to compute)" in res.stdout
    with xr.open_dataset(small / "c1_limit.nc") as a, xr.open_dataset(large / "c1_limit.nc") as b:
        for name in a.data_vars:
            if "d" in a[name].dims:
                np.testing.assert_array_equal(a[name].sel(d=3).values, b[name].sel(d=3).values, err_msg=name)
