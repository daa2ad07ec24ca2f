"""``sfxlin run EXP --plan``: cells, kept cells, expected CPU and wall seconds, nothing computed."""
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

from sfxlin.engine.storage import load

from sfxlin.cli import main
from sfxlin.engine.experiments import get
from sfxlin.engine.plan import POOL_PAYS_CPU_SECONDS, PartPlan, Plan, make_plan, small_sweep_scheduler
from sfxlin.engine.sweep import Experiment, Part, Variable
from sfxlin.engine.verify import timeline_rows


def _toy(cost=None):
    def kernel(cell, rng, inputs):
        return {"y": np.array(float(cell["a"]))}

    return Experiment(name="toy_plan", inner_coords=lambda c: {}, variables=(Variable("y", ("a",), "y", "y."),),
                      parts=(Part("", lambda c: {"a": [1, 2, 3]}, kernel),), cost=cost)


def test_plan_without_a_cost_model_says_so(tmp_path):
    plan = make_plan(_toy(), {"root_seed": 0}, tmp_path / "out", workers=4)
    assert (plan.cells, plan.kept, plan.to_compute) == (3, 0, 3)
    assert plan.cpu_seconds is None and plan.wall_seconds is None
    assert any("declares no cost model" in n for n in plan.notes)
    assert not (tmp_path / "out").exists()


def test_the_plan_adds_up_the_declared_cost_of_each_cell(tmp_path):
    """The cost model sees each cell's coordinates; CPU / min(workers, cells to compute): 3 cells on 8
    workers run 3 at a time."""
    plan = make_plan(_toy(lambda config, part, cell: 1.0 * cell["a"]), {"root_seed": 0}, tmp_path, workers=8)
    assert plan.cpu_seconds == 6.0 and plan.wall_seconds == pytest.approx(2.0) and not plan.notes


C1 = get("c1_limit")


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
    with load(path) as ds:
        return {part: sum(s for p, _c, s in timeline_rows(ds) if p == part) for part in ("", "quadrature")}


def test_the_model_scales_as_the_real_runs_do(quick_run, tmp_path):
    """The declared cost of a run with 4x the prompts over that of the quick run beside the ratio of the
    cell seconds the two runs record on this machine (the rates are the reference machine's: a ratio
    is what holds anywhere): within a factor of 3 for the main part, whose work grows."""
    first, config, before = quick_run
    second = tmp_path / "second"
    bigger = C1.configure("quick", ["n_prompts=64"])
    plan = make_plan(C1, bigger, second, workers=1)
    assert main(["run", "c1_limit", *RUN, "--set", "n_prompts=64", "--out", str(second)]) == 0
    measured = _cell_seconds(second / "c1_limit.nc")[""] / _cell_seconds(first / "c1_limit.nc")[""]
    modelled = plan.parts[0].cpu_seconds / before.parts[0].cpu_seconds
    assert modelled > 1.5 and 1 / 3 < modelled / measured < 3, (modelled, measured)


@pytest.mark.parametrize("cpu, scheduler", [(None, "processes"), (0.0, "threads"), (9.99, "threads"),
                                            (POOL_PAYS_CPU_SECONDS, "processes"), (500.0, "processes")])
def test_a_sweep_too_small_for_a_process_pool_runs_on_threads(cpu, scheduler):
    """Below POOL_PAYS_CPU_SECONDS of expected CPU (a quick profile, a rerun whose cells are kept)
    threads; at or above it, or with no estimate, the declared processes."""
    part = PartPlan("", cells=4, kept=0, cpu_seconds=cpu)
    chosen, why = small_sweep_scheduler(Plan("c3_transfer", "quick", (part,), 2, Path(".")))
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
