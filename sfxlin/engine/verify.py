"""Does a results file still come from the code? ``sfxlin verify FILE``.

Recomputes a few cells of a results file with the installed code, from the configuration the
file records, and compares every variable of each cell that the file holds with the file's (an output
added since the file was made is named, not compared): bit-identical (the same
machine and version: the determinism contract promises equal bits whatever the scheduler, the
chunking or the grid around the cell), or within the contract across code versions and CPUs, or not.
Element by element the test is ``|new - stored| <= rtol * max(1, A) * max |stored|``: ``rtol`` (default
1e-10), ``A`` the amplification of rounding the file records for that output of that cell
(``<output>_amplification``, :mod:`sfxlin.engine.sensitivity`; 1 where it records none, or less than 1),
and the max over the variable's finite values in the whole file: relative to the variable's scale (the
yardstick of the regeneration notes, docs/performance.md), so that a value that is zero up to rounding
(an off-block mass of 1e-17 where other cells hold O(1)) is not judged by its own size. A variable that is
rounding in every cell (the risk of least squares on noiseless labels, 1e-30 throughout) has no scale of
its own: it declares a ``yardstick`` (:class:`~sfxlin.engine.sweep.Variable`), another variable whose
largest value is its scale too, or the size of the quantities it is the error of. The amplification is
measured against the cell's own largest value, never larger than the file's: a recomputation within its
cell's stated bound always passes. NaN must meet NaN (never excused by an amplification); integers and
flags must be equal. The amplification variables themselves are the yardstick, not recomputed (that is a
second run of the cell): ``run_cell(..., amplification=False)``.

A file records the BLAS kernel that computed it (``library_versions["blas"]``, e.g. ``openblas
0.3.31.188.0 SkylakeX``); where this process runs another (another CPU, or ``OPENBLAS_CORETYPE``),
:func:`kernel_note` says so, since cells whose trajectories amplify rounding then move beyond the
last bits (docs/performance.md section 10).

The cells checked are the cheapest ones by what the file records they cost (its ``cell_seconds``
or ``cell_timeline``, :func:`timeline_rows`), so that a check of every shipped file takes seconds;
``cells`` per part (None: every cell), in grid order where the file records no cost; and, with
``most_amplified``, the cells whose recorded amplification is largest: the cells where another kernel
moves the bits furthest, the ones that test the amplified tolerance.
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

__all__ = ["CellCheck", "VariableCheck", "choose_cells", "iter_verify", "kernel_note", "recorded_amplification",
           "timeline_rows", "verify_file", "DEFAULT_RTOL"]

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
    ``|new - stored| / scale`` (``error``; ``inf`` where NaNs or shapes differ), and the amplification of
    rounding the file records for it in this cell (None: none recorded)."""

    name: str
    identical: bool
    error: float
    amplification: float | None = None

    def tolerance(self, rtol) -> float:
        """``rtol * max(1, amplification)``: what the contract allows this variable in this cell."""
        return rtol * max(1.0, self.amplification) if self.amplification is not None else rtol

    def within(self, rtol) -> bool:
        """Within the contract: a finite ``error`` (NaNs and shapes agree) at most :meth:`tolerance`."""
        return self.error <= self.tolerance(rtol) and math.isfinite(self.error)


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
        """Every variable within the contract (:meth:`VariableCheck.within`)."""
        return all(v.within(rtol) for v in self.variables)


def _compare(name, stored, new, scale=None, amplification=None) -> VariableCheck:
    """``stored`` and ``new`` values of one cell; ``scale``: the variable's largest finite
    ``|value|`` in the file (default: in ``stored``); ``amplification``: the file's for this output and
    cell (None: none)."""
    stored, new = np.asarray(stored), np.asarray(new)
    if stored.shape != new.shape:
        return VariableCheck(name, False, float("inf"), amplification)
    if stored.dtype.kind not in "fc":
        same = np.array_equal(stored, new)
        return VariableCheck(name, bool(same), 0.0 if same else float("inf"), amplification)
    if np.array_equal(stored, new, equal_nan=True):
        return VariableCheck(name, True, 0.0, amplification)
    if not np.array_equal(np.isnan(stored), np.isnan(new)):
        return VariableCheck(name, False, float("inf"), amplification)
    finite = np.isfinite(stored)
    if not np.array_equal(stored[~finite], new[~finite], equal_nan=True):
        return VariableCheck(name, False, float("inf"), amplification)
    if scale is None:
        scale = np.max(np.abs(stored[finite]), initial=0.0)
    diff = np.max(np.abs(new[finite] - stored[finite]), initial=0.0)
    return VariableCheck(name, False, float(diff / scale) if scale > 0 else float("inf"), amplification)


def recorded_amplification(ds, experiment, part, cell) -> dict:
    """``{output: amplification}`` the results Dataset ``ds`` records for ``cell`` of ``part`` (its
    ``<output>_amplification`` variables, :mod:`sfxlin.engine.sensitivity`): the outputs whose
    amplification the file holds as a number (not NaN: not measured)."""
    out = {}
    for output, name in experiment.amplified(part).items():
        if name in ds.data_vars:
            value = float(ds[name].sel(cell).values)
            if not math.isnan(value):
                out[output] = value
    return out


def choose_cells(experiment, config, ds, cells=1, where=None, most_amplified=0) -> list:
    """``[(part, cell)]``: per part of ``experiment``, its ``cells`` cheapest cells (None: every cell)
    among those matching ``where``, by what the file ``ds`` records they cost, in grid order where it
    records none; then its ``most_amplified`` cells of largest recorded amplification (the largest over
    the cell's outputs, :func:`recorded_amplification`) not already chosen."""
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
        mine = order if cells is None else order[:cells]
        if most_amplified and len(mine) < len(every):
            amplified = {i: max(recorded_amplification(ds, experiment, part.name, every[i]).values(), default=None)
                         for i in order if i not in mine}
            ranked = sorted((i for i, a in amplified.items() if a is not None), key=lambda i: (-amplified[i], i))
            mine = mine + ranked[:most_amplified]
        chosen += [(part.name, every[i]) for i in mine]
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
            "amplifies rounding may move further, within 1e-10 x the amplification the file records for it "
            "(docs/performance.md section 10)")


def verify_file(path, cells=1, where=None, most_amplified=0) -> list:
    """The list of :func:`iter_verify`."""
    return list(iter_verify(path, cells, where, most_amplified=most_amplified))


def iter_verify(path, cells=1, where=None, on_open=None, most_amplified=0):
    """Recompute ``cells`` cells per part of the results file ``path`` (and its ``most_amplified`` cells of
    largest recorded amplification: :func:`choose_cells`; only cells whose coordinates match ``where``,
    ``{dim: value}``, where a part has those dims) with the installed code and compare them with the file,
    each output within ``rtol`` times its recorded amplification (:class:`VariableCheck`): yields one
    :class:`CellCheck` as each cell is done. ValueError, before any cell, when the file cannot be checked (no sfxlin provenance, an
    unknown experiment, a token file changed since the run). ``on_open(attrs)``, if given, is called
    with the file's attrs once it is known to be checkable, before the first cell (the command line
    prints :func:`kernel_note` there)."""
    from .experiments import get
    from .schema import upgrade
    from .storage import changed_input_files, load
    from .sweep import run_cell

    path = Path(path)
    ds = upgrade(load(path))   # every stored value checked against its checksums first: a damaged file stops here
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
    for var in experiment.variables:   # a rounding-level variable judged on its yardstick's scale too
        yardstick = scales.get(var.yardstick) if isinstance(var.yardstick, str) else var.yardstick
        if yardstick is not None and scales.get(var.name) is not None:
            scales[var.name] = max(scales[var.name], float(yardstick))
    for part, cell in choose_cells(experiment, config, ds, cells, where, most_amplified):
        start = time.perf_counter()
        out = run_cell(experiment, config, cell, part, amplification=False)
        seconds = time.perf_counter() - start
        measured = experiment.amplified(part)
        recorded = recorded_amplification(ds, experiment, part, cell)
        results, absent = [], []
        for var in experiment.part_variables(part):
            if var.name in measured.values():   # the yardstick, not recomputed
                continue
            if var.name not in ds.data_vars:
                absent.append(var.name)
                continue
            inner = [d for d in var.dims if d not in cell]
            stored = ds[var.name].sel(cell).transpose(*inner).values
            results.append(_compare(var.name, stored, out[var.name], scales[var.name], recorded.get(var.name)))
        yield CellCheck(part, cell, seconds, tuple(results), tuple(absent))
