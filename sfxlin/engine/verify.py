"""Does a results file still come from the code? ``sfxlin verify FILE``.

Recomputes a few cells of a results file with the installed code, from the configuration the
file records, and compares every variable of each cell that the file holds with the file's (an output
added since the file was made is named, not compared): bit-identical (the same
machine and version: the determinism contract promises equal bits whatever the scheduler, the
chunking or the grid around the cell), or within ``rtol`` (default 1e-10, what the contract
promises across code versions and CPUs), or not. Element by element the test is
``|new - stored| <= rtol * max |stored|``, the max over the variable's finite values in the whole
file: relative to the variable's scale (the yardstick of the regeneration notes, docs/performance.md),
so that a value that is zero up to rounding (the risk of least squares on noiseless labels,
1e-30; an off-block mass of 1e-17) is not judged by its own size. NaN must meet NaN; integers and
flags must be equal.

A file records the BLAS kernel that computed it (``library_versions["blas"]``, e.g. ``openblas
0.3.31.188.0 SkylakeX``); where this process runs another (another CPU, or ``OPENBLAS_CORETYPE``),
:func:`kernel_note` says so, since cells whose trajectories amplify rounding then move beyond the
last bits (docs/performance.md section 10).

The cells checked are the cheapest ones by what the file records they cost (its ``cell_seconds``
or ``cell_timeline``, :func:`timeline_rows`), so that a check of every shipped file takes seconds;
``cells`` per part, in grid order where the file records no cost.
"""
from __future__ import annotations

import itertools
import json
import math
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

__all__ = ["CellCheck", "VariableCheck", "choose_cells", "iter_verify", "kernel_note", "timeline_rows", "verify_file",
           "DEFAULT_RTOL"]

#: what the determinism contract promises across code versions and CPUs
DEFAULT_RTOL = 1e-10

_RANGE = re.compile(r"(\w+)\[(\d+):(\d+)\]")
_PART = re.compile(r"^(\w+):")


def timeline_rows(ds):
    """``[(part, coords or None, seconds per cell)]`` of the results Dataset ``ds``.

    From its ``cell_seconds`` attr where it has one (``sfxlin run`` writes it: every cell with the
    seconds its kernel took when it was computed, by that run or, for a cell served from the kept
    cells, by the earlier run that computed it; a kept cell with no record is left out, never
    counted at the seconds it took to read). Otherwise from its ``cell_timeline``
    (``[block, worker, start, end]``, ``block`` = ``"part:dim[a:b],..."`` or ``"dim[a:b],..."`` for the
    main part); ``coords`` is None for a block of several cells, whose seconds are split evenly. ``[]``
    for a file that records neither."""
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


@dataclass(frozen=True)
class VariableCheck:
    """One variable of one recomputed cell: ``identical`` (same bits), else its largest
    ``|new - stored| / scale`` (``error``; ``inf`` where NaNs or shapes differ)."""

    name: str
    identical: bool
    error: float


@dataclass(frozen=True)
class CellCheck:
    """One recomputed cell of ``part``: its coordinates, seconds, every variable's check, and the names of
    the variables the code computes that the file does not hold (``absent``: outputs added since the file
    was made; nothing to compare them with)."""

    part: str
    cell: dict
    seconds: float
    variables: tuple = field(default_factory=tuple)
    absent: tuple = field(default_factory=tuple)

    @property
    def identical(self) -> bool:
        return all(v.identical for v in self.variables)

    @property
    def worst(self) -> VariableCheck | None:
        return max(self.variables, key=lambda v: v.error, default=None)

    def within(self, rtol) -> bool:
        return all(v.error <= rtol for v in self.variables)


def _compare(name, stored, new, scale=None) -> VariableCheck:
    """``stored`` and ``new`` values of one cell; ``scale``: the variable's largest finite
    ``|value|`` in the file (default: in ``stored``)."""
    stored, new = np.asarray(stored), np.asarray(new)
    if stored.shape != new.shape:
        return VariableCheck(name, False, float("inf"))
    if stored.dtype.kind not in "fc":
        same = np.array_equal(stored, new)
        return VariableCheck(name, bool(same), 0.0 if same else float("inf"))
    if np.array_equal(stored, new, equal_nan=True):
        return VariableCheck(name, True, 0.0)
    if not np.array_equal(np.isnan(stored), np.isnan(new)):
        return VariableCheck(name, False, float("inf"))
    finite = np.isfinite(stored)
    if not np.array_equal(stored[~finite], new[~finite], equal_nan=True):
        return VariableCheck(name, False, float("inf"))
    if scale is None:
        scale = np.max(np.abs(stored[finite]), initial=0.0)
    diff = np.max(np.abs(new[finite] - stored[finite]), initial=0.0)
    return VariableCheck(name, False, float(diff / scale) if scale > 0 else float("inf"))


def choose_cells(experiment, config, ds, cells=1, where=None) -> list:
    """``[(part, cell)]``: per part of ``experiment``, its ``cells`` cheapest cells (among those
    matching ``where``) by what the file ``ds`` records they cost, in grid order where it records
    none."""
    costs = {}
    for part, coords, seconds in timeline_rows(ds):
        if coords is not None:
            key = _cell_key(part, coords)
            costs[key] = min(seconds, costs.get(key, seconds))
    chosen = []
    for part in experiment.parts:
        grid = part.grid(config)
        every = [dict(zip(grid, values)) for values in itertools.product(*grid.values())]
        every = [c for c in every if all(c[k] == v for k, v in (where or {}).items() if k in c)]
        order = sorted(range(len(every)), key=lambda i: (costs.get(_cell_key(part.name, every[i]), float("inf")), i))
        chosen += [(part.name, every[i]) for i in order[:cells]]
    return chosen


def _cell_key(part, cell):
    return part, tuple(sorted((dim, v.item() if isinstance(v, np.generic) else v) for dim, v in cell.items()))


def _scale(values):
    """The largest finite ``|value|`` of a float variable in the file; None for integers and flags."""
    if values.dtype.kind not in "fc":
        return None
    return float(np.max(np.abs(values[np.isfinite(values)]), initial=0.0))


def kernel_note(attrs) -> str | None:
    """Why bits may differ here: a sentence when the BLAS kernel the file records (its attrs'
    ``library_versions``) is not the one this process runs; None when they are the same, or the file
    records none (files written before the kernel was recorded)."""
    from .storage import blas_kernel

    recorded = json.loads(attrs.get("library_versions", "{}")).get("blas")
    here = blas_kernel()
    if recorded is None or recorded == here:
        return None
    return (f"computed under BLAS {recorded}, recomputed under {here}: another kernel rounds products "
            "differently, so a cell may be within 1e-10 instead of bit-identical, and a trajectory that "
            "amplifies rounding may move further (docs/performance.md section 10)")


def verify_file(path, cells=1, where=None) -> list:
    """The list of :func:`iter_verify`."""
    return list(iter_verify(path, cells, where))


def iter_verify(path, cells=1, where=None, on_open=None):
    """Recompute ``cells`` cells per part of the results file ``path`` (:func:`choose_cells`; only
    cells whose coordinates match ``where``, ``{dim: value}``, where a part has those dims) with
    the installed code and compare them with the file: yields one :class:`CellCheck` as each cell
    is done. ValueError, before any cell, when the file cannot be checked (no sfxlin provenance, an
    unknown experiment, a token file changed since the run). ``on_open(attrs)``, if given, is called
    with the file's attrs once it is known to be checkable, before the first cell (the command line
    prints :func:`kernel_note` there)."""
    import xarray as xr

    from .experiments import get
    from .schema import upgrade
    from .storage import changed_input_files
    from .sweep import run_cell

    path = Path(path)
    with xr.open_dataset(path, engine="netcdf4") as ds:
        ds = upgrade(ds.load())
    missing = [k for k in ("experiment", "config") if k not in ds.attrs]
    if missing:
        raise ValueError(f"{path} records no {' and no '.join(missing)} attr: not a results file of sfxlin")
    experiment = get(ds.attrs["experiment"])
    config = experiment.configure(None, values=json.loads(ds.attrs["config"])) if experiment.params else {}
    changed = changed_input_files(ds.attrs.get("input_files"), config)
    if changed:
        raise ValueError(f"{path} read token files that changed since ({'; '.join(changed)}): its cells cannot be "
                         "recomputed")
    if on_open is not None:
        on_open(dict(ds.attrs))
    scales = {name: _scale(ds[name].values) for name in ds.data_vars}
    for part, cell in choose_cells(experiment, config, ds, cells, where):
        start = time.perf_counter()
        out = run_cell(experiment, config, cell, part)
        seconds = time.perf_counter() - start
        results, absent = [], []
        for var in experiment.part_variables(part):
            if var.name not in ds.data_vars:
                absent.append(var.name)
                continue
            inner = [d for d in var.dims if d not in cell]
            stored = ds[var.name].sel(cell).transpose(*inner).values
            results.append(_compare(var.name, stored, out[var.name], scales[var.name]))
        yield CellCheck(part, cell, seconds, tuple(results), tuple(absent))
