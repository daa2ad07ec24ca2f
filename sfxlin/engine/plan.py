"""What a run would cost, before any work: ``sfxlin run EXP --plan``.

For each part of an experiment under a configuration: its cells, those already kept in the
run's ``--out`` (:mod:`sfxlin.engine.cellstore`: a later run serves them instead of computing
them), those left to compute, and their expected CPU seconds from the part's *cost law*; then
the expected wall seconds on the cores available, ``CPU / min(workers, cells to compute)``.
Nothing is computed and no dask graph is built: the cells come from the parts' grids, the kept
ones from their fingerprints (:func:`~sfxlin.engine.cellstore.cell_fingerprint`).

The cost law of a part is fitted when the plan is made, from the seconds per cell that the
experiment's shipped paper file records (:func:`timeline_rows`: its ``cell_seconds``, else its
``cell_timeline``; the file is ``datasets/EXP.nc``, or ``$SFXLIN_RESULTS``, the repository's
``datasets`` otherwise): the seconds of one cell are

    a * prod_dim value_dim ** slope_dim * work(config) / work(paper config)

with one slope per numeric grid dim that takes at least two positive values in the timeline (an
ordinary least-squares fit of log seconds; a and the slopes re-measure themselves whenever the
paper files are regenerated, ``make reproduce``), and ``work`` the per-cell work in the
parameters that are not grid dims (prompts, queries, tokens, steps, ...) that the experiment's
pipeline module declares as ``cell_work(config, part) -> float`` (proportional to the work of
one cell of ``part``; a part it returns None for, or a module without it, is taken to cost what
its paper cells cost). The fit's ``a`` is the arithmetic mean (log-normal smearing: the mean of
``exp(residual)``), so the sum over cells estimates the summed task seconds. A timeline's
durations are wall seconds per task as the scheduler saw them, with one task per core: CPU
seconds on an otherwise idle machine.
"""
from __future__ import annotations

import itertools
import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .protocol import cell_work

__all__ = ["CostLaw", "PartPlan", "Plan", "POOL_PAYS_CPU_SECONDS", "fit_laws", "format_plan", "make_plan",
           "shipped_file", "small_sweep_scheduler", "timeline_rows"]

_RANGE = re.compile(r"(\w+)\[(\d+):(\d+)\]")
_PART = re.compile(r"^(\w+):")


def timeline_rows(ds):
    """``[(part, coords or None, seconds per cell)]`` of the results Dataset ``ds``.

    From its ``cell_seconds`` attr where it has one (``sfxlin run`` writes it: every cell with the
    seconds its kernel took when it was computed, by that run or, for a cell served from the kept
    cells, by the earlier run that computed it; a kept cell with no record is left out, never
    counted at the seconds it took to read). Otherwise from its ``cell_timeline`` (schema of
    :func:`sfxlin.benchmarks.cell_costs.timeline`: ``[block, worker, start, end]``, ``block`` =
    ``"part:dim[a:b],..."`` or ``"dim[a:b],..."`` for the main part); ``coords`` is None for a
    block of several cells, whose seconds are split evenly. ``[]`` for a file that records neither."""
    if "cell_seconds" in ds.attrs:
        return [(part, coords, float(seconds)) for part, coords, seconds in json.loads(ds.attrs["cell_seconds"])
                if seconds is not None]
    rows = []
    for block, _worker, start, end in json.loads(ds.attrs.get("cell_timeline", "[]")):
        named = _PART.match(block)
        part, where = (named.group(1), block[named.end():]) if named else ("", block)
        ranges = {dim: (int(a), int(b)) for dim, a, b in _RANGE.findall(where)}
        n = math.prod(b - a for a, b in ranges.values())
        coords = ({dim: ds[dim].values[a].item() for dim, (a, _b) in ranges.items()} if n == 1 else None)
        rows.append((part, coords, (float(end) - float(start)) / max(n, 1)))
    return rows


def _positive_number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0


@dataclass(frozen=True)
class CostLaw:
    """Seconds of one cell of ``part``: ``scale * prod(cell[dim] ** slopes[dim]) * work / work_ref``."""

    part: str
    scale: float
    slopes: dict
    work_ref: float | None
    n_cells: int
    source: str

    def seconds(self, cell, work=None) -> float:
        """Expected seconds of ``cell`` (its grid values); ``work``: :func:`cell_work` of the
        planned configuration (None: the paper cells' work)."""
        s = self.scale
        for dim, slope in self.slopes.items():
            value = cell.get(dim)
            if _positive_number(value):
                s *= float(value) ** slope
        if work is not None and self.work_ref:
            s *= work / self.work_ref
        return s

    def describe(self) -> str:
        slopes = "".join(f" * {dim}^{slope:.2f}" for dim, slope in self.slopes.items())
        scaled = " * work/work_paper" if self.work_ref else ""
        return f"{self.scale:.3g} s{slopes}{scaled} (from {self.n_cells} paper cells)"


def fit_part(part, rows, work_ref=None, source="") -> CostLaw | None:
    """The :class:`CostLaw` of ``part`` from its timeline ``rows`` ``[(coords, seconds)]``, or None without rows."""
    if not rows:
        return None
    seconds = np.array([max(s, 1e-6) for _c, s in rows])
    single = [c for c, _s in rows if c is not None]
    dims = []
    if len(single) == len(rows) and single:
        for dim in single[0]:
            values = {c[dim] for c in single}
            if len(values) >= 2 and all(_positive_number(v) for v in values):
                dims.append(dim)
    X = np.column_stack([np.ones(len(rows))] + [np.log([float(c[dim]) for c in single]) for dim in dims])
    y = np.log(seconds)
    beta, *_ = np.linalg.lstsq(X, y, rcond=None)
    smear = float(np.mean(np.exp(y - X @ beta)))
    return CostLaw(part, float(np.exp(beta[0]) * smear), dict(zip(dims, map(float, beta[1:]))), work_ref,
                   len(rows), source)


def shipped_file(experiment, results_dir=None) -> Path | None:
    """The experiment's paper results file with a ``cell_timeline``: in ``results_dir``
    (default: ``$SFXLIN_RESULTS`` or ``./datasets``), else the repository's ``datasets``."""
    from .storage import default_results_dir

    repo = Path(__file__).resolve().parents[2] / "datasets"
    for folder in ([Path(results_dir)] if results_dir else [default_results_dir(), repo]):
        path = folder / f"{experiment.name}.nc"
        if path.is_file():
            return path
    return None


def fit_laws(experiment, path) -> dict:
    """``{part name: CostLaw}`` fitted on the seconds per cell the results file ``path`` records
    (:func:`timeline_rows`; parts absent from them are absent here); ``{}`` for a file that records none."""
    import xarray as xr

    from .params import Config

    with xr.open_dataset(path, engine="netcdf4") as ds:
        rows = timeline_rows(ds)
        if not rows or ds.attrs.get("experiment") != experiment.name:
            return {}
        recorded = json.loads(ds.attrs["config"])
    try:
        paper = experiment.configure(None, values=recorded) if experiment.params else recorded
    except (ValueError, TypeError):
        paper = None
    if paper is not None and not isinstance(paper, Config) and experiment.params:
        paper = None
    laws = {}
    for part in experiment.parts:
        mine = [(c, s) for p, c, s in rows if p == part.name]
        work_ref = cell_work(experiment, paper, part.name) if paper is not None else None
        law = fit_part(part.name, mine, work_ref, str(path))
        if law is not None:
            laws[part.name] = law
    return laws


@dataclass(frozen=True)
class PartPlan:
    part: str
    cells: int
    kept: int
    cpu_seconds: float | None  # of the cells to compute; None without a cost law
    law: CostLaw | None

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
    source: str | None
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
        """Expected CPU seconds of the cells to compute (None when a part to compute has no law)."""
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


def make_plan(experiment, config, out_dir, workers=None, fresh=False, results_dir=None) -> Plan:
    """The :class:`Plan` of running ``experiment`` under ``config`` into ``out_dir``: reads the
    kept cells' names and the shipped timeline, writes and computes nothing. ``workers``: the
    run's (default: every local core); ``fresh``: the run would discard the kept cells."""
    from .cellstore import cell_fingerprint, holds_cell

    folder = Path(out_dir) / f".{experiment.name}.cells"
    path = shipped_file(experiment, results_dir)
    laws = fit_laws(experiment, path) if path is not None else {}
    notes = []
    if path is None:
        notes.append(f"no shipped results file {experiment.name}.nc: no cost law")
    elif not laws:
        notes.append(f"{path} records no seconds per cell (cell_seconds, cell_timeline) of {experiment.name}: no cost law")
    parts = []
    for part in experiment.parts:
        grid = part.grid(config)
        law = laws.get(part.name)
        work = cell_work(experiment, config, part.name) if law is not None and law.work_ref else None
        cells = kept = 0
        cpu = 0.0 if law is not None else None
        for values in itertools.product(*grid.values()):
            cell = dict(zip(grid, values))
            cells += 1
            if not fresh and holds_cell(folder / f"cell_{cell_fingerprint(experiment, config, cell, part.name)}.npz"):
                kept += 1
            elif law is not None:
                cpu += law.seconds(cell, work)
        if law is None and cells - kept and laws:
            notes.append(f"part {part.name or 'main'!r} has no cells in the shipped timeline: no cost law")
        parts.append(PartPlan(part.name, cells, kept, cpu, law))
    return Plan(experiment.name, config.profile if hasattr(config, "profile") else "", tuple(parts),
                int(workers or os.cpu_count() or 1), folder, None if path is None else str(path), fresh, tuple(notes))


#: expected CPU seconds of a sweep below which a local process pool costs more than it saves: its
#: two workers' start-up (about 2.5 CPU s and 1-2 s of wall on the quick profiles) against the ~30%
#: that a cell of many small numpy calls loses to the GIL beside another on threads
#: (docs/performance.md section 8): 0.15 E = 1.5 s at E = 10 s
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
        law = p.law.describe() if p.law else "no cost law"
        lines.append(f"  part {p.part or 'main'!r}: {p.cells} cells, {p.kept} kept, {p.to_compute} to compute, "
                     f"expected {_secs(p.cpu_seconds)} CPU; per cell {law}")
    kept_where = (f" (--fresh discards the cells kept in {plan.kept_folder})" if plan.fresh
                  else f" in {plan.kept_folder}")
    lines.append(f"cells: {plan.cells}")
    lines.append(f"kept: {plan.kept}{kept_where}")
    lines.append(f"to compute: {plan.to_compute}")
    lines.append(f"expected CPU seconds: {_secs(plan.cpu_seconds)}"
                 + (f" (cost laws fitted on the cell_timeline of {plan.source})" if plan.source else ""))
    lines.append(f"expected wall seconds: {_secs(plan.wall_seconds)} on {plan.workers} workers "
                 f"(CPU / min(workers {plan.workers}, cells to compute {plan.to_compute}))")
    lines += [f"note: {n}" for n in plan.notes]
    return "\n".join(lines)


def time_cell(experiment, config, cell, part="", repeats=3) -> float:
    """The smallest CPU seconds (``time.process_time``) of ``repeats`` computations of ``cell``
    of ``part`` in this process (the first warms the imports and caches): what
    :func:`main` prints to re-measure a pipeline's ``cell_work`` constants."""
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
    one cell's declared work, its measured warm CPU seconds and the cost law's prediction (the
    command that re-measures a pipeline's ``cell_work`` constants)."""
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
    path = shipped_file(experiment)
    law = (fit_laws(experiment, path) if path else {}).get(args.part)
    work = cell_work(experiment, config, args.part)
    measured = time_cell(experiment, config, cell, args.part, args.repeats)
    predicted = "no cost law" if law is None else f"{law.seconds(cell, work if law.work_ref else None):.4f} s"
    print(f"{experiment.name} part {args.part or 'main'!r} cell {cell}: work {work}, measured {measured:.4f} CPU s "
          f"(best of {args.repeats}), law {predicted}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
