"""benchmarks/cell_costs.py: where a sweep's time went, read from the file's cell timeline."""
import json

import numpy as np
import pytest
import xarray as xr

from sfxlin.engine.storage import load

from sfxlin.benchmarks import cell_costs
from sfxlin.engine.execution import compute
from sfxlin.engine.sweep import build


def _ds(rows, **coords):
    ds = xr.Dataset(coords={k: (k, v) for k, v in coords.items()})
    ds.attrs.update(cell_timeline=json.dumps(rows), experiment="x", wall_seconds=10.0, scheduler="threads(2)")
    return ds


def test_utilisation_counts_busy_time_and_the_tail_with_a_core_idle():
    # worker 0 busy 0-4 and 4-10; worker 1 busy 0-6 then idle: span 10, busy 16/20, tail 4 s
    rows = [["d[0:1]", 0, 0.0, 4.0], ["d[1:2]", 1, 0.0, 6.0], ["d[2:3]", 0, 4.0, 10.0]]
    tl = cell_costs.timeline(_ds(rows, d=[2, 4, 8]))
    assert [r["coords"] for r in tl] == [{"d": 2}, {"d": 4}, {"d": 8}]
    cell_seconds, n_workers, span, busy, tail = cell_costs.utilisation(tl)
    assert (cell_seconds, n_workers, span, tail) == (16.0, 2, 10.0, 4.0)
    assert busy == pytest.approx(0.8)


def test_growth_recovers_a_power_law_with_the_other_dims_as_fixed_effects():
    """duration = c_seed * d^1.5 exactly: slope 1.5, standard error at rounding."""
    rows, t = [], 0.0
    for i, d in enumerate([2, 4, 8, 16]):
        for s, c in enumerate([1.0, 3.0]):
            dur = c * d**1.5 / 100
            rows.append([f"d[{i}:{i + 1}],seed[{s}:{s + 1}]", 0, t, t + dur])
            t += dur
    rows.append(["quadrature:", 1, 0.0, 0.5])
    tl = cell_costs.timeline(_ds(rows, d=[2, 4, 8, 16], seed=[0, 1]))
    slope, se, n, values = cell_costs.growth([r for r in tl if r["part"] == ""], "d")
    assert slope == pytest.approx(1.5, abs=1e-9) and se < 1e-9 and n == 8 and values == [2, 4, 8, 16]
    assert cell_costs.growth([r for r in tl if r["part"] == ""], "seed") is None   # 2 values only
    assert {r["part"] for r in tl} == {"", "quadrature"}


def test_summary_of_a_real_sweep_and_a_file_without_timeline(toy, toy_config):
    result, _, _ = compute(build(toy.EXPERIMENT, toy_config), scheduler="threads", progress=False)
    lines = cell_costs.summary(result)
    assert lines[0].startswith("toy: wall") and "tasks on" in lines[0]
    assert any("part 'main'" in line and "U_norm" in line for line in lines)
    with pytest.raises(ValueError, match="no cell_timeline"):
        cell_costs.timeline(xr.Dataset())


def test_floor_share_pairs_each_cells_seconds_with_its_logits():
    ds = xr.Dataset()
    ds.attrs["cell_seconds"] = json.dumps([["", {"d": 2}, 1.0], ["", {"d": 4}, 3.0], ["q", {}, None]])
    ds.attrs["cell_exponentials"] = json.dumps([["", {"d": 4}, 600], ["", {"d": 2}, 400], ["q", {}, 50]])
    assert cell_costs.floor_share(ds, 1e-3) == (4.0, 1000, pytest.approx(1.0))   # the unrecorded cell is left out
    assert cell_costs.floor_share(xr.Dataset(attrs={"cell_seconds": "[]"}), 1e-3) is None
    assert 0 < cell_costs.exp_seconds_per_logit(n=1000, repeats=2) < 1e-6


def test_a_runs_file_prints_its_floor(tmp_path):
    from sfxlin.cli import main

    assert main(["run", "c1_kernels", "--profile", "quick", "--quiet", "--out", str(tmp_path)]) == 0
    with load(tmp_path / "c1_kernels.nc") as ds:
        seconds, logits, floor = cell_costs.floor_share(ds, 1e-9)
        lines = cell_costs.summary(ds, 1e-9)
    assert logits > 0 and floor == pytest.approx(logits * 1e-9) and seconds > 0
    assert any(line.startswith("  floor: ") and f"{logits:,} logits" in line for line in lines)
