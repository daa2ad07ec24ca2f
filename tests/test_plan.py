"""``sfxlin run EXP --plan``: cells, kept cells, expected CPU and wall seconds, nothing computed."""
import json
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

from sfxlin.cli import main
from sfxlin.engine.experiments import get
from sfxlin.engine.plan import (POOL_PAYS_CPU_SECONDS, CostLaw, PartPlan, Plan, fit_part, make_plan, shipped_file,
                                small_sweep_scheduler, timeline_rows)
from sfxlin.engine.sweep import Experiment, Part, Variable


def test_fit_part_recovers_a_power_law_and_its_mean():
    """Seconds = 0.3 * d^0.7 * m^-0.2 exactly: the OLS on logs returns it (residuals 0, smearing 1)."""
    rows = [({"d": d, "m": m, "law": "x"}, 0.3 * d ** 0.7 * m ** -0.2) for d in (2, 5, 10) for m in (1.0, 4.0)]
    law = fit_part("", rows)
    assert set(law.slopes) == {"d", "m"}  # a string dim gets no slope
    assert law.slopes["d"] == pytest.approx(0.7, rel=1e-9) and law.slopes["m"] == pytest.approx(-0.2, rel=1e-9)
    assert law.scale == pytest.approx(0.3, rel=1e-9)
    assert law.seconds({"d": 20, "m": 2.0}) == pytest.approx(0.3 * 20 ** 0.7 * 2 ** -0.2, rel=1e-9)


def test_smearing_gives_the_mean_seconds_and_work_scales_linearly():
    """Without a numeric dim the law is the arithmetic mean of the cells (their sum / count, what
    the plan adds up), and a declared work ratio multiplies it."""
    rows = [({"seed": s}, t) for s, t in zip([0, 0, 0], [1.0, 2.0, 6.0])]  # one seed value: no slope
    law = fit_part("", rows)
    assert law.slopes == {} and law.scale == pytest.approx(3.0, rel=1e-12)
    scaled = CostLaw("", 3.0, {}, work_ref=100.0, n_cells=3, source="")
    assert scaled.seconds({}, work=25.0) == pytest.approx(0.75, rel=1e-12)


def test_timeline_rows_parse_parts_and_blocks():
    ds = xr.Dataset(coords={"d": [2, 5], "tau": [0.5, 1.0]})
    ds.attrs["cell_timeline"] = json.dumps([["d[1:2],tau[0:1]", "w0", 0.0, 2.0],
                                            ["other:tau[0:2]", "w1", 1.0, 5.0]])
    rows = timeline_rows(ds)
    assert rows[0] == ("", {"d": 5, "tau": 0.5}, 2.0)
    assert rows[1] == ("other", None, 2.0)  # a block of 2 cells: 4 s split evenly


def _toy():
    def kernel(cell, rng, inputs):
        return {"y": np.array(float(cell["a"]))}

    return Experiment(name="toy_plan", inner_coords=lambda c: {}, variables=(Variable("y", ("a",), "y", "y."),),
                      parts=(Part("", lambda c: {"a": [1, 2, 3]}, kernel),))


def test_plan_without_a_shipped_file_says_so(tmp_path):
    toy = _toy()
    assert shipped_file(toy, tmp_path) is None
    plan = make_plan(toy, {"root_seed": 0}, tmp_path / "out", workers=4, results_dir=tmp_path)
    assert (plan.cells, plan.kept, plan.to_compute) == (3, 0, 3)
    assert plan.cpu_seconds is None and plan.wall_seconds is None
    assert any("no cost law" in n for n in plan.notes)
    assert not (tmp_path / "out").exists()


def test_wall_is_cpu_over_the_busy_workers(tmp_path):
    """CPU / min(workers, cells to compute): 3 cells on 8 workers run 3 at a time."""
    law = CostLaw("", 2.0, {}, None, 1, "")
    toy = _toy()
    plan = make_plan(toy, {"root_seed": 0}, tmp_path, workers=8, results_dir=tmp_path)
    plan = type(plan)(plan.experiment, "", tuple(type(p)(p.part, p.cells, p.kept, 6.0, law) for p in plan.parts),
                      8, plan.kept_folder, "x")
    assert plan.cpu_seconds == 6.0 and plan.wall_seconds == pytest.approx(2.0)


C1 = get("c1_limit")
needs_shipped = pytest.mark.skipif(shipped_file(C1) is None, reason="no shipped datasets/c1_limit.nc")


#: the runs of these tests: quick, one cell at a time (``synchronous``: a timeline's seconds are a
#: cell's own, not two cells sharing the cores)
RUN = ["--profile", "quick", "--local-scheduler", "synchronous", "--quiet"]


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    """One c1_limit quick run with 16 prompts (a few seconds): its folder, config and the plan made before it."""
    out = tmp_path_factory.mktemp("plan") / "q"
    config = C1.configure("quick", ["n_prompts=16"])
    before = make_plan(C1, config, out, workers=2)
    assert main(["run", "c1_limit", *RUN, "--set", "n_prompts=16", "--out", str(out)]) == 0
    return out, config, before


def test_plan_computes_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "q"
    assert main(["run", "c1_limit", "--profile", "quick", "--out", str(out), "--plan"]) == 0
    text = capsys.readouterr().out
    assert "cells: 9" in text and "kept: 0" in text and "to compute: 9" in text
    assert "expected CPU seconds" in text and "expected wall seconds" in text
    assert not out.exists()  # no results file, no kept cell, not even the folder


@needs_shipped
def test_plan_reports_the_cells_kept_by_a_run(quick_run, capsys):
    out, config, before = quick_run
    assert (before.kept, before.to_compute) == (0, 9)
    assert main(["run", "c1_limit", "--profile", "quick", "--set", "n_prompts=16", "--out", str(out), "--plan"]) == 0
    text = capsys.readouterr().out
    assert "kept: 9" in text and "to compute: 0" in text
    assert "expected CPU seconds: 0.0 s" in text
    after = make_plan(C1, config, out, workers=2, fresh=True)  # --fresh would discard them: all to compute
    assert after.kept == 0 and after.cpu_seconds == pytest.approx(before.cpu_seconds)


def _cell_seconds(path):
    with xr.open_dataset(path) as ds:
        return {part: sum(s for p, _c, s in timeline_rows(ds) if p == part) for part in ("", "quadrature")}


def test_estimate_within_a_factor_3_of_the_real_run(quick_run, tmp_path):
    """The plan of a run with 4x the prompts, its cost law fitted on the first run's timeline made on
    this machine a moment before (``results_dir``: the law re-measures itself on whatever file it
    is given; the shipped files' laws are in the seconds of the machine and load that made them),
    against the cell seconds the real run records."""
    first, _config, _before = quick_run
    second = tmp_path / "second"
    config = C1.configure("quick", ["n_prompts=64"])
    plan = make_plan(C1, config, second, workers=1, results_dir=first)
    assert plan.parts[0].law.work_ref is not None                  # the work ratio is in the estimate
    assert main(["run", "c1_limit", *RUN, "--set", "n_prompts=64", "--out", str(second)]) == 0
    measured = _cell_seconds(second / "c1_limit.nc")
    for p in plan.parts:
        assert 1 / 3 < p.cpu_seconds / measured[p.part] < 3, (p.part, p.cpu_seconds, measured[p.part])
    assert 1 / 3 < plan.cpu_seconds / sum(measured.values()) < 3


@pytest.mark.parametrize("cpu, scheduler", [(None, "processes"), (0.0, "threads"), (9.99, "threads"),
                                            (POOL_PAYS_CPU_SECONDS, "processes"), (500.0, "processes")])
def test_a_sweep_too_small_for_a_process_pool_runs_on_threads(cpu, scheduler):
    """Below POOL_PAYS_CPU_SECONDS of expected CPU (a quick profile, a rerun whose cells are kept)
    threads; at or above it, or with no estimate, the declared processes."""
    part = PartPlan("", cells=4, kept=0, cpu_seconds=cpu, law=None)
    chosen, why = small_sweep_scheduler(Plan("c3_transfer", "quick", (part,), 2, Path("."), None))
    assert chosen == scheduler
    assert ("no cost estimate" in why) == (cpu is None)


def test_a_truncated_kept_cell_is_not_counted_as_kept(tmp_path, capsys):
    """A cell file cut short (a kill mid-copy, a full disk) is counted as to compute by --plan,
    by the store and so by an interrupted run's message, and the run recomputes it."""
    from sfxlin.engine.cellstore import CellStore

    out = tmp_path / "q"
    args = ["run", "c1_limit", "--profile", "quick", "--set", "n_prompts=2", "--set", "U_norm=0.5", "--out", str(out)]
    assert main([*args, "--quiet"]) == 0
    cells = sorted((out / ".c1_limit.cells").glob("cell_*.npz"))
    victim = cells[0]
    victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 2])
    capsys.readouterr()
    assert main([*args, "--plan"]) == 0
    assert f"kept: {len(cells) - 1} in" in capsys.readouterr().out
    config = C1.configure("quick", ["n_prompts=2", "U_norm=0.5"])
    assert CellStore(out / ".c1_limit.cells", C1, config).count() == len(cells) - 1
    assert main([*args, "--force"]) == 0
    assert f"({len(cells) - 1} kept from earlier runs" in capsys.readouterr().out
