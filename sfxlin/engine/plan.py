"""What a run would cost, before any work: ``sfxlin run EXP --plan``, and the local scheduler of a run
that declares processes.

For each part of an experiment under a configuration: its cells, those already kept in the run's
``--out`` (:mod:`sfxlin.engine.cellstore`: a later run serves them instead of computing them), those
left to compute, and their expected CPU seconds from the experiment's declared cost model
(``Experiment.cost``: a family's :class:`~sfxlin.engine.family.Cost`, what each cell does in units of
work, each with its seconds on the reference machine); then the expected wall seconds on the cores
available, ``CPU / min(workers, cells to compute)``. Nothing is computed, no dask graph is built and no
results file is read: a run decides how to run from its declarations alone. The cells come from the
parts' grids, the kept ones from their fingerprints (:func:`~sfxlin.engine.cellstore.cell_fingerprint`).
"""
from __future__ import annotations

import itertools
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["PartPlan", "Plan", "POOL_PAYS_CPU_SECONDS", "format_plan", "make_plan", "small_sweep_scheduler",
           "time_cell"]


@dataclass(frozen=True)
class PartPlan:
    part: str
    cells: int
    kept: int
    cpu_seconds: float | None  # of the cells to compute; None without a cost model for the part

    @property
    def to_compute(self) -> int:
        return self.cells - self.kept


@dataclass(frozen=True)
class Plan:
    experiment: str
    profile: str
    parts: tuple
    workers: int
    kept_folder: Path
    fresh: bool = False
    notes: tuple = field(default=())

    @property
    def cells(self) -> int:
        return sum(p.cells for p in self.parts)

    @property
    def kept(self) -> int:
        return sum(p.kept for p in self.parts)

    @property
    def to_compute(self) -> int:
        return self.cells - self.kept

    @property
    def cpu_seconds(self) -> float | None:
        """Expected CPU seconds of the cells to compute (None when a part to compute has no estimate)."""
        if any(p.cpu_seconds is None and p.to_compute for p in self.parts):
            return None
        return float(sum(p.cpu_seconds or 0.0 for p in self.parts))

    @property
    def wall_seconds(self) -> float | None:
        """``cpu_seconds / min(workers, cells to compute)`` (0 with nothing to compute)."""
        cpu = self.cpu_seconds
        if cpu is None:
            return None
        return cpu / min(self.workers, self.to_compute) if self.to_compute else 0.0


def make_plan(experiment, config, out_dir, workers=None, fresh=False) -> Plan:
    """The :class:`Plan` of running ``experiment`` under ``config`` into ``out_dir``: reads the kept
    cells' names, writes and computes nothing. ``workers``: the run's (default: every local core);
    ``fresh``: the run would discard the kept cells."""
    from .cellstore import cell_fingerprint, holds_cell

    folder = Path(out_dir) / f".{experiment.name}.cells"
    parts, notes = [], []
    for part in experiment.parts:
        grid = part.grid(config)
        cells = kept = 0
        cpu = 0.0
        for values in itertools.product(*grid.values()):
            cell = dict(zip(grid, values))
            cells += 1
            if not fresh and holds_cell(folder / f"cell_{cell_fingerprint(experiment, config, cell, part.name)}.npz"):
                kept += 1
            elif cpu is not None:
                seconds = experiment.cost(config, part.name, cell) if experiment.cost is not None else None
                cpu = None if seconds is None else cpu + seconds
        if cpu is None:
            notes.append(f"part {part.name or 'main'!r} declares no cost model: no estimate")
        parts.append(PartPlan(part.name, cells, kept, cpu))
    return Plan(experiment.name, config.profile if hasattr(config, "profile") else "", tuple(parts),
                int(workers or os.cpu_count() or 1), folder, fresh, tuple(notes))


#: expected CPU seconds of a sweep below which a local process pool costs more than it saves: its
#: two workers' start-up against the share of a cell of many small numpy calls lost to the GIL beside
#: another on threads (docs/performance.md, section 8)
POOL_PAYS_CPU_SECONDS = 10.0


def small_sweep_scheduler(plan: Plan) -> tuple[str, str]:
    """The local scheduler for a run of an experiment that declares processes, when the run names
    none: ``("threads", why)`` when the plan expects the cells to compute to cost less than
    :data:`POOL_PAYS_CPU_SECONDS` of CPU (a quick profile, a rerun whose cells are kept), else
    ``("processes", why)``; processes also when the plan has no estimate. The bits are the same on
    either (the determinism contract): only the time changes."""
    cpu = plan.cpu_seconds
    if cpu is None:
        return "processes", "the experiment's; no cost estimate for this sweep"
    if cpu < POOL_PAYS_CPU_SECONDS:
        return "threads", (f"this sweep is expected to cost {cpu:.1f} CPU s and the experiment's process pool pays "
                           f"from {POOL_PAYS_CPU_SECONDS:g} s; --local-scheduler processes forces it")
    return "processes", f"the experiment's; this sweep is expected to cost {cpu:.0f} CPU s"


def _secs(value):
    return "unknown" if value is None else f"{value:.1f} s"


def format_plan(plan: Plan) -> str:
    """The lines ``sfxlin run EXP --plan`` prints."""
    lines = [f"{plan.experiment}: profile {plan.profile}, plan only (nothing computed)"]
    for p in plan.parts:
        lines.append(f"  part {p.part or 'main'!r}: {p.cells} cells, {p.kept} kept, {p.to_compute} to compute, "
                     f"expected {_secs(p.cpu_seconds)} CPU")
    kept_where = (f" (--fresh discards the cells kept in {plan.kept_folder})" if plan.fresh
                  else f" in {plan.kept_folder}")
    lines.append(f"cells: {plan.cells}")
    lines.append(f"kept: {plan.kept}{kept_where}")
    lines.append(f"to compute: {plan.to_compute}")
    lines.append(f"expected CPU seconds: {_secs(plan.cpu_seconds)} (the experiment's declared cost model, seconds "
                 "on the reference machine: docs/performance.md, \"Cost models\")")
    lines.append(f"expected wall seconds: {_secs(plan.wall_seconds)} on {plan.workers} workers "
                 f"(CPU / min(workers {plan.workers}, cells to compute {plan.to_compute}))")
    lines += [f"note: {n}" for n in plan.notes]
    return "\n".join(lines)


def time_cell(experiment, config, cell, part="", repeats=3) -> float:
    """The smallest CPU seconds (``time.process_time``) of ``repeats`` computations of ``cell``
    of ``part`` in this process (the first warms the imports and caches)."""
    import time

    from .sweep import run_cell

    best = math.inf
    for _ in range(repeats):
        start = time.process_time()
        run_cell(experiment, config, cell, part)
        best = min(best, time.process_time() - start)
    return best


def _parse_cell(text, grid):
    cell = {}
    for item in filter(None, (text or "").split(",")):
        dim, _, value = item.partition("=")
        if dim not in grid:
            raise ValueError(f"--cell names {dim!r}, not a grid dim of {list(grid)}")
        matches = [v for v in grid[dim] if str(v) == value]
        if not matches:
            raise ValueError(f"--cell {dim}={value}: not one of the grid's values {list(grid[dim])}")
        cell[dim] = matches[0]
    return {dim: cell.get(dim, values[0]) for dim, values in grid.items()}


def main(argv=None):
    """``python -m sfxlin.engine.plan EXP [--profile P] [--set K=V ...] [--part NAME] [--cell d=2,...]``:
    one cell's measured warm CPU seconds beside its cost model's (the command that re-measures a
    family's rates, docs/performance.md, "Cost models")."""
    import argparse

    from .experiments import get

    p = argparse.ArgumentParser(description=main.__doc__.splitlines()[0])
    p.add_argument("experiment")
    p.add_argument("--profile", default="quick")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--part", default="")
    p.add_argument("--cell", default="", help="grid values, DIM=VALUE,... (default: each dim's first value)")
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    experiment = get(args.experiment)
    config = experiment.configure(args.profile, args.set)
    cell = _parse_cell(args.cell, experiment.part(args.part).grid(config))
    measured = time_cell(experiment, config, cell, args.part, args.repeats)
    model = experiment.cost(config, args.part, cell) if experiment.cost is not None else None
    print(f"{experiment.name} part {args.part or 'main'!r} cell {cell}: measured {measured:.4f} CPU s (best of "
          f"{args.repeats}), cost model {'none' if model is None else f'{model:.4f} s'}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
