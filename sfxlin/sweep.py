"""The sweep engine: an experiment's grid -> a lazy, dask-backed, labelled ``xr.Dataset``.

An :class:`Experiment` declares once

* its outer grid (``grid(config) -> {dim: coordinate values}``): one cell per combination;
* its inner coordinates (``inner_coords(config)``): dims a cell's kernel returns whole
  (``L``, ``query``, ``law``, ...), vectorised numpy inside the cell;
* its output :class:`Variable` s (dims, ``long_name``, ``units``, ``description``);
* its kernel ``kernel(cell, rng, inputs) -> {name: ndarray}``: ``cell`` maps every grid dim
  to the cell's coordinate value, ``inputs`` is the read-only part of the configuration that
  reaches the cell (:meth:`Experiment.cell_inputs`: the configuration less ``grid_keys``, the
  keys that only say which cells exist), so nothing outside a cell's fingerprint can change it;
* optionally a ``global_kernel(config) -> {name: ndarray}`` for variables over no grid dim
  (checks that do not depend on the cell, e.g. a quadrature check), run as one more task.

:func:`build` turns that into a Dataset whose variables are dask arrays: one dask task per
block of cells (one cell per block by default), nothing computed until asked. Each cell
draws from ``np.random.default_rng([*hashes of its coordinate values, experiment tag, root_seed])``
(:func:`cell_rng`): a cell's numbers depend on its coordinate *values* and its inputs only, never
on its position in the grid, so they are bit-identical whatever the chunking, scheduler, worker
count, execution order, the order in which the grid lists its values, or the other values in the
grid. A cell can be rerun alone, a sweep extended without changing what it computed, two runs
merged.
"""
from __future__ import annotations

import copy
import hashlib
import itertools
import math
import types
import zlib
from dataclasses import dataclass
from typing import Callable, Mapping

import dask
import dask.array as da
import numpy as np
import xarray as xr

from .schema import coord_attrs

__all__ = ["Variable", "Experiment", "CellError", "build", "cell_rng", "coordinate_key", "coordinate_text", "run_cell",
           "substream"]


class CellError(RuntimeError):
    """A cell produced an invalid result (non-finite, wrong shape); names the cell."""


@dataclass(frozen=True)
class Variable:
    """One output variable, declared once and copied onto the stored array."""

    name: str
    dims: tuple[str, ...]
    long_name: str
    description: str
    units: str | None = None
    allow_nonfinite: bool = False

    def attrs(self):
        out = {"long_name": self.long_name, "description": self.description}
        if self.units is not None:
            out["units"] = self.units
        return out


@dataclass(frozen=True)
class Experiment:
    """Declarative description of one experiment (see module docstring)."""

    name: str
    grid: Callable[[Mapping], dict]
    inner_coords: Callable[[Mapping], dict]
    variables: tuple[Variable, ...]
    kernel: Callable
    description: str = ""
    global_kernel: Callable[[Mapping], dict] | None = None
    grid_keys: tuple[str, ...] = ()
    cell_config: Callable[[Mapping, Mapping], dict] | None = None

    def cell_inputs(self, config, cell) -> dict:
        """The part of ``config`` that reaches the kernel of ``cell`` (and its fingerprint).

        ``cell_config(config, cell)`` where the experiment declares one (a cell that needs only
        some of the keys, e.g. the covariance of its own setting); otherwise every key but the
        ``grid_keys`` (those only say which cells the grid has: ``d``, ``n_seeds``, ...).
        """
        if self.cell_config is not None:
            return dict(self.cell_config(config, cell))
        return {k: v for k, v in config.items() if k not in self.grid_keys}

    def cell_variables(self, config):
        grid = self.grid(config)
        return [v for v in self.variables if any(d in grid for d in v.dims)]

    def global_variables(self, config):
        grid = self.grid(config)
        return [v for v in self.variables if not any(d in grid for d in v.dims)]

    def __repr__(self):
        return (f"Experiment({self.name!r}: {', '.join(v.name for v in self.variables)}; "
                f"{self.description})")

    @property
    def tag(self) -> int:
        """Integer stream tag of this experiment for the per-cell RNG."""
        return zlib.crc32(self.name.encode())


def coordinate_text(value) -> str:
    """The exact text of a coordinate value: an integer in decimal, a float by its ``repr``
    (shortest round-trip, so ``0.1`` is ``'0.1'`` and ``3.0`` is not ``3``), a string as is."""
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"a coordinate value must be an integer, a float or a string, got the bool {value!r}")
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    if isinstance(value, (float, np.floating)):
        return repr(float(value))
    if isinstance(value, str):
        return value
    raise TypeError(f"a coordinate value must be an integer, a float or a string, got {value!r} "
                    f"({type(value).__name__})")


def coordinate_key(dim: str, value) -> int:
    """64-bit integer key of one coordinate value: a hash of ``"dim=<exact text>"``."""
    text = f"{dim}={coordinate_text(value)}"
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")


def cell_rng(experiment_name: str, cell: Mapping, root_seed: int) -> np.random.Generator:
    """The generator of one cell, keyed by its coordinate values (never by grid positions):
    ``default_rng([*coordinate_key(dim, value) for each grid dim, tag(experiment), root_seed])``."""
    tag = zlib.crc32(experiment_name.encode())
    return np.random.default_rng([*(coordinate_key(dim, value) for dim, value in cell.items()), tag, int(root_seed)])


def substream(rng: np.random.Generator, **coords) -> np.random.Generator:
    """An independent generator for one inner slice of a cell, keyed by its coordinate values
    (``substream(rng, law="uniform")``): derived from the seed of ``rng``, not from its state, so
    it neither depends on nor changes what ``rng`` or any other substream draws. Adding a law or a
    scale to an inner list then leaves the draws of the others unchanged."""
    seq = rng.bit_generator.seed_seq
    key = (*seq.spawn_key, *(coordinate_key(dim, value) for dim, value in coords.items()))
    return np.random.Generator(type(rng.bit_generator)(np.random.SeedSequence(seq.entropy, spawn_key=key)))


def cell_label(experiment_name: str, cell: Mapping) -> str:
    """``"c1_limit[d=3, U_norm=0.5, seed=1]"``: how errors and logs name a cell."""
    return f"{experiment_name}[{', '.join(f'{dim}={value!r}' for dim, value in cell.items())}]"


def _cell_at(grid, index):
    return {dim: values[i] for (dim, values), i in zip(grid.items(), index)}


def run_cell(experiment: Experiment, config: Mapping, cell: Mapping) -> dict:
    """Compute one cell, given by its coordinate values (``{"d": 3, "U_norm": 0.5, "seed": 1}``),
    and validate its outputs. The same cell gives the same bits whatever grid it belongs to."""
    grid = experiment.grid(config)
    if set(cell) != set(grid):
        raise ValueError(f"{experiment.name}: a cell names every grid dim {list(grid)}, got {dict(cell)}")
    cell = {dim: cell[dim] for dim in grid}
    inner = experiment.inner_coords(config)
    rng = cell_rng(experiment.name, cell, config["root_seed"])
    label = cell_label(experiment.name, cell)
    inputs = types.MappingProxyType(copy.deepcopy(experiment.cell_inputs(config, cell)))
    try:
        out = experiment.kernel(cell, rng, inputs)
    except (FloatingPointError, ArithmeticError) as exc:
        raise CellError(f"{label}: {exc}") from exc
    return _checked(out, experiment.cell_variables(config), inner, grid, label)


def _checked(out, variables, inner, grid, label):
    """Validate kernel outputs against their declarations: present, shaped, finite."""
    checked = {}
    for var in variables:
        if var.name not in out:
            raise CellError(f"{label}: kernel did not return variable {var.name!r}")
        arr = np.asarray(out[var.name], dtype=float)
        shape = tuple(len(inner[d]) for d in var.dims if d not in grid)
        if arr.shape != shape:
            raise CellError(f"{label}: {var.name} has shape {arr.shape}, declared {shape}")
        if not var.allow_nonfinite and not np.all(np.isfinite(arr)):
            raise CellError(f"{label}: non-finite values in {var.name}")
        checked[var.name] = arr
    return checked


def _run_global(experiment, config):
    """Compute the variables over no grid dim (one task)."""
    inner = experiment.inner_coords(config)
    out = experiment.global_kernel(config)
    return _checked(out, experiment.global_variables(config), inner, {}, f"{experiment.name}[global]")


def _run_block(experiment, config, ranges, store=None):
    """Compute a block of cells (or load the ones ``store`` kept, keeping each new one there);
    returns ``{name: array(block shape + inner shape)}``."""
    shape = tuple(len(r) for r in ranges)
    grid = experiment.grid(config)
    results = []
    for idx in itertools.product(*ranges):
        cell = _cell_at(grid, idx)
        out = store.load(cell) if store is not None else None
        if out is None:
            out = run_cell(experiment, config, cell)
            if store is not None:
                store.save(cell, out)
        results.append(out)
    out = {}
    for var in experiment.cell_variables(config):
        stacked = np.stack([r[var.name] for r in results])
        out[var.name] = stacked.reshape(shape + stacked.shape[1:])
    return out


def _chunk_ranges(n, size):
    return [range(start, min(start + size, n)) for start in range(0, n, size)]


def build(experiment: Experiment, config: Mapping, chunks: Mapping | None = None, store=None) -> xr.Dataset:
    """Lazy Dataset of ``experiment`` under ``config``; computes nothing.

    ``chunks`` maps grid dims to cells per task (default 1: one task per cell). Variables
    carry their declared attrs; dims are ordered as declared; every dim has its coordinate.
    ``store`` (a :class:`~sfxlin.cellstore.CellStore`) keeps every finished cell on disk and
    serves kept cells instead of recomputing them (resume after an interruption).
    """
    grid = experiment.grid(config)
    inner = experiment.inner_coords(config)
    for dim, values in {**grid, **inner}.items():
        repeated = sorted({coordinate_text(v) for v in values if list(values).count(v) > 1})
        if repeated:
            raise ValueError(f"{experiment.name}: coordinate {dim!r} repeats the value(s) {', '.join(repeated)}; "
                             "every cell and every inner slice must have its own coordinate value")
    chunks = dict(chunks or {})
    unknown = set(chunks) - set(grid)
    if unknown:
        raise ValueError(f"chunks names dims {sorted(unknown)} that are not grid dims {list(grid)}")
    for dim, size in chunks.items():
        if not isinstance(size, (int, np.integer)) or size < 1:
            raise ValueError(f"chunk size for {dim!r} must be a positive integer, got {size!r}")
    per_dim = [_chunk_ranges(len(values), chunks.get(dim, 1)) for dim, values in grid.items()]
    blocks = {}
    for combo in itertools.product(*[range(len(p)) for p in per_dim]):
        ranges = tuple(per_dim[k][c] for k, c in enumerate(combo))
        where = ",".join(f"{dim}[{r.start}:{r.stop}]" for dim, r in zip(grid, ranges))
        key = f"{experiment.name}-block-{where}-{dask.base.tokenize(experiment.name, config, ranges)}"
        blocks[combo] = dask.delayed(_run_block, pure=True)(experiment, config, ranges, store, dask_key_name=key)

    data_vars = {}
    grid_dims = list(grid)
    global_vars = experiment.global_variables(config)
    if global_vars:
        if experiment.global_kernel is None:
            raise ValueError(f"{experiment.name}: {[v.name for v in global_vars]} have no grid dim but no global_kernel")
        key = f"{experiment.name}-global-{dask.base.tokenize(experiment.name, config)}"
        global_task = dask.delayed(_run_global, pure=True)(experiment, config, dask_key_name=key)
        for var in global_vars:
            shape = tuple(len(inner[d]) for d in var.dims)
            arr = da.from_delayed(global_task[var.name], shape=shape, dtype=float)
            data_vars[var.name] = xr.Variable(var.dims, arr, attrs=var.attrs())
    for var in experiment.cell_variables(config):
        inner_dims = [d for d in var.dims if d not in grid]
        missing = [d for d in inner_dims if d not in inner]
        if missing:
            raise ValueError(f"{experiment.name}.{var.name}: dims {missing} have no coordinates")
        inner_shape = tuple(len(inner[d]) for d in inner_dims)

        def piece(combo, var=var, inner_shape=inner_shape):
            shape = tuple(len(per_dim[k][c]) for k, c in enumerate(combo)) + inner_shape
            return da.from_delayed(blocks[combo][var.name], shape=shape, dtype=float)

        arr = _assemble([piece(c) for c in blocks], [len(p) for p in per_dim])
        if not all(d in var.dims for d in grid_dims):
            raise ValueError(f"{experiment.name}.{var.name}: dims {var.dims} must include every grid dim {grid_dims}")
        stored_dims = grid_dims + inner_dims
        data_vars[var.name] = xr.Variable(stored_dims, arr, attrs=var.attrs()).transpose(*var.dims)

    coords = {dim: xr.Variable(dim, np.asarray(values), attrs=coord_attrs(dim)) for dim, values in {**grid, **inner}.items()}
    ds = xr.Dataset(data_vars, coords=coords)
    ds.attrs["experiment"] = experiment.name
    ds.attrs["description"] = experiment.description
    ds.attrs["n_cells"] = int(math.prod(len(v) for v in grid.values()))
    return ds


def _assemble(flat, sizes, axis=0):
    """Concatenate a row-major list of blocks over a grid of ``sizes`` blocks (leading axes)."""
    if len(sizes) == 1:
        return da.concatenate(flat, axis=axis)
    step = math.prod(sizes[1:])
    parts = [_assemble(flat[i * step:(i + 1) * step], sizes[1:], axis + 1) for i in range(sizes[0])]
    return da.concatenate(parts, axis=axis)
