"""The sweep engine: an experiment's declarations -> a lazy, dask-backed, labelled ``xr.Dataset``.

An :class:`Experiment` declares once

* its parameters (:class:`sfxlin.engine.params.Param`: kind, bounds, unit, doc, value per profile) and
  the checks that tie several together; :meth:`Experiment.configure` gives the frozen
  configuration;
* its parts (:class:`Part`): each a grid of cells (``grid(config) -> {dim: values}``, one cell
  per combination, ``{}`` for a single cell) and a kernel ``kernel(cell, rng, inputs) ->
  {name: Out(array, dims) or ndarray}``: ``cell`` maps every grid dim to the cell's coordinate
  value, ``inputs`` is the read-only part of the configuration that reaches the cell
  (:meth:`Experiment.cell_inputs`), so nothing outside a cell's fingerprint can change it;
* its inner coordinates (``inner_coords(config)``): dims a kernel returns whole (``L``,
  ``query``, ``law``, ...), vectorised numpy inside the cell;
* its output :class:`Variable` s (dims, ``long_name``, ``units``, ``description``, part): the
  one declaration of each output's dims. A kernel names the axes of what it returns
  (:class:`Out`) in whatever order it computed them; the engine transposes them to the declared
  order and refuses other names (a plain array is taken to be in the declared order).

:func:`build` turns that into a Dataset whose variables are dask arrays: one dask task per
block of cells (one cell per block by default), nothing computed until asked. Each cell
draws from ``np.random.default_rng([*hashes of its coordinate values, tag, root_seed])``
(:func:`cell_rng`): a cell's numbers depend on its coordinate *values* and its inputs only, never
on its position in the grid, so they are bit-identical whatever the chunking, scheduler, worker
count, execution order, the order in which the grid lists its values, or the other values in the
grid. A cell can be rerun alone, a sweep extended without changing what it computed, two runs
merged.
"""
from __future__ import annotations

import copy
import dataclasses
import hashlib
import itertools
import json
import math
import sys
import time
import types
import zlib
from dataclasses import dataclass, field
from typing import Callable, Mapping

import numpy as np

from . import sensitivity
from .params import digest_key, file_digests
from .protocol import load_analysis
from ..realdata import check_unchanged
from .schema import CONVENTIONS, coord_attrs
from .. import softmax_core
from ..threads import single_threaded_blas

__all__ = ["Variable", "Part", "Experiment", "CellError", "Out", "build", "cell_label", "check_chunks", "cell_rng", "coordinate_key",
           "coordinate_text", "criteria_of", "run_cell", "substream"]


#: the units a variable may declare (UDUNITS strings): dimensionless, or seconds
UNITS = frozenset({"1", "s"})


class CellError(RuntimeError):
    """A cell produced an invalid result (non-finite, wrong shape); names the cell."""


@dataclass(frozen=True)
class Variable:
    """One output variable, declared once and copied onto the stored array.

    ``part`` names the :class:`Part` whose cells compute it (``""``: the main part); its dims
    hold every grid dim of that part, in any order, and inner dims of the experiment. ``dtype``
    is the stored type (kernels return floats; a flag is an integer type). ``flag_meanings``
    makes it a CF flag: value ``k`` means ``flag_meanings[k]`` (one word each). ``yardstick``, for a
    quantity that is zero in exact arithmetic, whose stored values are rounding (the risk of least squares
    on noiseless labels, 1e-30) and so no scale of their own, gives it one too (``sfxlin verify`` judges a
    recomputation relative to the larger): another float variable, by name, whose largest value in the
    file is the scale, or a positive number, the size of the quantities it is the error of."""

    name: str
    dims: tuple[str, ...]
    long_name: str
    description: str
    units: str | None = None
    allow_nonfinite: bool = False
    part: str = ""
    dtype: str = "float64"
    flag_meanings: tuple[str, ...] = ()
    yardstick: str | float | None = None

    def __post_init__(self):
        if self.yardstick == self.name:
            raise ValueError(f"{self.name}: a variable is not its own yardstick")
        if not isinstance(self.yardstick, (str, type(None))) and not (
                isinstance(self.yardstick, (int, float)) and math.isfinite(self.yardstick) and self.yardstick > 0):
            raise ValueError(f"{self.name}: a yardstick is a variable's name or a positive number, got "
                             f"{self.yardstick!r}")
        if self.flag_meanings and np.dtype(self.dtype).kind not in "iu":
            raise ValueError(f"{self.name}: a flag (flag_meanings) is stored as an integer type, got dtype "
                             f"{self.dtype!r}")
        if self.flag_meanings and self.units is not None:
            raise ValueError(f"{self.name}: a flag has no units (CF), got {self.units!r}")
        if self.units is not None and self.units not in UNITS:
            raise ValueError(f"{self.name}: units {self.units!r} is not one of {sorted(UNITS)} (UDUNITS strings; a "
                             "count such as tokens or steps is dimensionless, '1', and says what it counts in its "
                             "long_name)")

    def attrs(self):
        """The variable's CF attributes: ``long_name``, ``description``, ``units`` (declared, else
        ``"1"``: every quantity here but seconds is dimensionless), ``flag_values`` / ``flag_meanings``
        for a flag (which has no units)."""
        out = {"long_name": self.long_name, "description": self.description}
        if not self.flag_meanings:
            out["units"] = self.units or "1"
        if self.flag_meanings:
            out["flag_values"] = np.arange(len(self.flag_meanings), dtype=self.dtype)
            out["flag_meanings"] = " ".join(self.flag_meanings)
        return out


@dataclass(frozen=True)
class Out:
    """A kernel output with its axes named: ``Out(sq_err.mean(axis=1), ("query", "L"))``.

    ``dims`` names every axis of ``array`` once, in the array's order; they are the inner dims
    of the output's :class:`Variable` (its dims less the grid's) in any order. The engine
    transposes ``array`` to the declared order (no value changes) and raises a :class:`CellError`
    for any other names."""

    array: object
    dims: tuple[str, ...]


@dataclass(frozen=True)
class Part:
    """One grid of cells and its kernel.

    ``grid(config) -> {dim: values}`` (``{}``: a single cell, e.g. a quadrature check);
    ``kernel(cell, rng, inputs) -> {variable: Out(array, dims) or array}``; ``inputs(config,
    cell)``, where given, says exactly what reaches a cell (default: every parameter that is not a
    grid parameter and reaches this part, see :attr:`sfxlin.engine.params.Param.parts`); either way the
    digest of every file parameter it holds joins it (:func:`sfxlin.engine.params.file_digests`). The
    main part is named ``""``; another part's cells draw from generators tagged
    ``"<experiment>/<part>"``. ``perturbed``: the kernel trains gradient-descent trajectories and passes
    :func:`sfxlin.engine.sensitivity.step_perturbation` to them, so the engine can measure how much each
    cell amplifies rounding (:mod:`sfxlin.engine.sensitivity`); such a part names its grid dims,
    ``grid_dims`` (the amplification variables are declared over them before any configuration exists).
    """

    name: str
    grid: Callable[[Mapping], dict]
    kernel: Callable
    inputs: Callable[[Mapping, Mapping], dict] | None = None
    perturbed: bool = False
    grid_dims: tuple[str, ...] | None = None


@dataclass(frozen=True)
class Experiment:
    """Declarative description of one experiment (see module docstring).

    ``params`` (:class:`sfxlin.engine.params.Param`) and ``checks`` declare and validate the inputs;
    ``parts`` the grids of cells and their kernels; ``inner_coords(config)`` the coordinates a
    kernel returns whole; ``variables`` the outputs. ``short`` is the command-line alias
    (``c1``), ``title`` the heading of the report, ``analysis`` the module that declares what is
    concluded (criteria, fits, figure) from the results file. ``scheduler`` is the local dask
    scheduler ``sfxlin run`` uses when none is asked (None: threads); ``"processes"`` for a few long
    cells made of many small numpy calls, which contend for the GIL on two threads (C3: a cell takes
    ~30% longer beside another on threads; docs/performance.md). The bits do not depend on it.
    ``cost(config, part, cell)`` is the expected CPU seconds of one cell of ``part`` (None: no
    estimate), from the declarations alone (a family's cost model, :mod:`sfxlin.engine.family`):
    ``sfxlin run --plan`` adds it up and a run that declares processes picks threads for a sweep too small
    to pay for the pool (:mod:`sfxlin.engine.plan`). ``module`` names the module that declares the
    experiment (default: the module whose code calls ``Experiment(...)``, as for a ``namedtuple``); with
    its kernels' and analysis modules it is where the cell store starts the import closure it
    fingerprints (:func:`sfxlin.engine.cellstore.experiment_code`).
    """

    name: str
    inner_coords: Callable[[Mapping], dict]
    variables: tuple[Variable, ...]
    parts: tuple[Part, ...]
    params: tuple = ()
    checks: tuple[Callable, ...] = ()
    description: str = ""
    short: str | None = None
    title: str = ""
    analysis: str | None = None
    scheduler: str | None = None
    cost: Callable | None = field(default=None, compare=False)
    module: str | None = field(default=None, compare=False)

    def __post_init__(self):
        if self.module is None:   # frames: this method, the generated __init__, the caller
            object.__setattr__(self, "module", sys._getframe(2).f_globals.get("__name__"))
        if self.scheduler not in (None, "threads", "synchronous", "processes"):
            raise ValueError(f"{self.name}: scheduler must be None, 'threads', 'synchronous' or 'processes', "
                             f"got {self.scheduler!r}")
        names = [p.name for p in self.parts]
        if len(set(names)) != len(names):
            raise ValueError(f"{self.name}: part names must be unique, got {names}")
        self._declare_amplification()
        floats = {v.name for v in self.variables if np.dtype(v.dtype).kind == "f" and not v.flag_meanings}
        for var in self.variables:
            if var.part not in names:
                raise ValueError(f"{self.name}.{var.name}: no part named {var.part!r} (parts: {names})")
            if isinstance(var.yardstick, str) and var.yardstick not in floats:
                raise ValueError(f"{self.name}.{var.name}: its yardstick {var.yardstick!r} is not a float variable of "
                                 "the experiment")

    def _declare_amplification(self):
        """For the perturbed parts, the engine's parameter ``amplification_eps`` (unless declared, with
        another value, by :func:`sensitivity.param`), the amplification variable of every float output
        (:func:`sensitivity.variables`) and the cost of the amplification run in the cost model
        (:class:`sensitivity.AmplifiedCost`), once: a copy made by ``dataclasses.replace`` has them already."""
        perturbed = [p for p in self.parts if p.perturbed]
        if not perturbed:
            return
        for part in perturbed:
            if part.grid_dims is None:
                raise ValueError(f"{self.name}: the perturbed part {part.name!r} must name its grid dims (grid_dims): "
                                 "its amplification variables are declared over them")
        params = tuple(self.params)
        if sensitivity.AMPLIFICATION not in {p.name for p in params}:
            params += (sensitivity.param(),)
        reach = tuple(p.name for p in perturbed)   # the parameter reaches the perturbed parts' cells only
        params = tuple(dataclasses.replace(p, parts=reach) if p.name == sensitivity.AMPLIFICATION else p
                       for p in params)
        names = {v.name for v in self.variables}
        measured = {sensitivity.variable_name(v.name) for v in self.variables} & names   # declared already
        added = tuple(a for part in perturbed for a in sensitivity.variables(
            [v for v in self.variables if v.part == part.name and v.name not in measured], part.grid_dims, part.name)
            if a.name not in names)
        object.__setattr__(self, "params", params)
        object.__setattr__(self, "variables", tuple(self.variables) + added)
        if self.cost is not None and not isinstance(self.cost, sensitivity.AmplifiedCost):
            object.__setattr__(self, "cost", sensitivity.AmplifiedCost(self.cost, reach))

    def amplified(self, part_name="") -> dict:
        """``{output: its amplification variable}`` of the part ``part_name`` (empty unless it is perturbed)."""
        if not self.part(part_name).perturbed:
            return {}
        names = {v.name for v in self.variables}
        return {v.name: sensitivity.variable_name(v.name) for v in self.part_variables(part_name)
                if sensitivity.variable_name(v.name) in names}

    def __repr__(self):
        return (f"Experiment({self.name!r}: {', '.join(v.name for v in self.variables)}; "
                f"{self.description})")

    # ------------------------------------------------------------------ configuration
    @property
    def profiles(self) -> tuple[str, ...]:
        """The profiles every parameter has a value for (``quick``, ``paper``)."""
        from .params import Profiles

        names = None
        for p in self.params:
            if isinstance(p.value, Profiles):
                names = list(p.value) if names is None else [n for n in names if n in p.value]
        return tuple(names or ("quick",))

    def configure(self, profile="quick", overrides=(), values=None):
        """The validated, frozen configuration (:func:`sfxlin.engine.params.configure`)."""
        from .params import configure

        if profile is not None and profile not in self.profiles:
            raise ValueError(f"unknown profile {profile!r} for {self.name}; expected one of {list(self.profiles)}")
        return configure(self.params, profile, overrides, values, self.checks, name=self.name)

    # ------------------------------------------------------------------ parts and cells
    def part(self, name=""):
        for part in self.parts:
            if part.name == name:
                return part
        raise ValueError(f"{self.name}: no part named {name!r}")

    def part_variables(self, part_name=""):
        return [v for v in self.variables if v.part == part_name]

    def rng_name(self, part_name=""):
        """The tag of a part's cell generators: the experiment's name, ``"<name>/<part>"`` for others."""
        return self.name if not part_name else f"{self.name}/{part_name}"

    def cell_inputs(self, config, cell, part_name="") -> dict:
        """The part of ``config`` that reaches the kernel of ``cell`` (and its fingerprint), with
        the digest (``<name>_sha256``) of every file parameter among it."""
        part = self.part(part_name)
        if part.inputs is not None:
            inputs = dict(part.inputs(config, cell))
        elif not self.params:
            inputs = dict(config)
        else:
            inputs = {p.name: config[p.name] for p in self.params
                      if not p.grid and (p.parts is None or part_name in p.parts)}
        if part.perturbed:   # whether the cell measures its amplification is part of what it computes
            inputs[sensitivity.AMPLIFICATION] = config[sensitivity.AMPLIFICATION]
        return {**inputs, **file_digests(self.params, config, inputs)}

    def check_files(self, inputs) -> None:
        """Check that every file parameter in a cell's ``inputs`` names the file its digest was
        taken of (:func:`sfxlin.realdata.check_unchanged`: a ValueError naming the parameter)."""
        for p in self.params:
            if p.kind == "file" and inputs.get(p.name):
                check_unchanged(inputs[p.name], inputs[digest_key(p.name)], p.name)

    def n_cells(self, config) -> int:
        return sum(math.prod(len(v) for v in part.grid(config).values()) for part in self.parts)


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


def run_cell(experiment: Experiment, config: Mapping, cell: Mapping, part: str = "", amplification: bool = True) -> dict:
    """Compute one cell of ``part``, given by its coordinate values (``{"d": 3, "U_norm": 0.5,
    "seed": 1}``), and validate its outputs. The same cell gives the same bits in any grid and with
    any number of cores (the kernel runs with one BLAS thread). A file parameter whose file changed
    since ``config`` was made is a ValueError naming the cell and the parameter, before any work.

    A perturbed part (``Part.perturbed``) with ``amplification_eps > 0`` in ``config`` computes the cell a
    second time under the step perturbation (:mod:`sfxlin.engine.sensitivity`) and returns the
    amplification of every output beside it; ``amplification=False`` skips that run (its variables are
    NaN: ``sfxlin verify`` reads them from the file). The outputs do not depend on either."""
    spec = experiment.part(part)
    grid = spec.grid(config)
    if set(cell) != set(grid):
        raise ValueError(f"{experiment.name}: a cell names every grid dim {list(grid)}, got {dict(cell)}")
    if spec.grid_dims is not None and set(spec.grid_dims) != set(grid):
        raise ValueError(f"{experiment.name}: part {part!r} declares the grid dims {list(spec.grid_dims)}, its grid "
                         f"has {list(grid)}")
    cell = {dim: cell[dim] for dim in grid}
    inner = experiment.inner_coords(config)
    name = experiment.rng_name(part)
    label = cell_label(name, cell)
    inputs = experiment.cell_inputs(config, cell, part)
    try:
        experiment.check_files(inputs)
    except ValueError as exc:
        raise ValueError(f"{label}: {exc}") from None
    amplified = experiment.amplified(part)
    own = [v for v in experiment.part_variables(part) if v.name not in amplified.values()]
    out = _checked(_kernel_outputs(spec, cell, cell_rng(name, cell, config["root_seed"]), inputs, label), own, inner,
                   grid, label)
    eps = config[sensitivity.AMPLIFICATION] if amplified else 0.0
    if not (amplification and eps > 0):
        return {**out, **{a: np.float64(np.nan) for a in amplified.values()}}
    perturbation = sensitivity.StepPerturbation(cell_rng(f"{name}/amplification", cell, config["root_seed"]), eps)
    again_label = f"{label} (amplification run, eps {eps:g})"
    again = _checked(_kernel_outputs(spec, cell, cell_rng(name, cell, config["root_seed"]), inputs, again_label,
                                     perturbation), own, inner, grid, again_label)
    if perturbation.calls == 0:
        if all(np.isnan(out[o]).all() for o in amplified):   # a cell that computes nothing (outside a protocol)
            return {**out, **{a: np.float64(np.nan) for a in amplified.values()}}
        raise CellError(f"{label}: part {part!r} is declared perturbed but its kernel applied no step perturbation: "
                        "pass sfxlin.engine.sensitivity.step_perturbation() to every trajectory it trains")
    return {**out, **{a: np.float64(sensitivity.amplification(out[o], again[o], eps)) for o, a in amplified.items()}}


def _kernel_outputs(part, cell, rng, inputs, label, perturbation=None):
    """What ``part``'s kernel returns for ``cell`` from the generator ``rng`` and a private copy of
    ``inputs``, under the step ``perturbation`` (None: none); a CellError naming ``label`` for a
    floating-point error."""
    inputs = types.MappingProxyType(copy.deepcopy(inputs))
    try:
        with single_threaded_blas(), sensitivity.perturbing(perturbation):   # one BLAS thread: sfxlin.threads
            return part.kernel(cell, rng, inputs)
    except (FloatingPointError, ArithmeticError) as exc:
        raise CellError(f"{label}: {exc}") from exc


def _checked(out, variables, inner, grid, label):
    """Validate kernel outputs against their declarations: present, named, shaped, finite; each
    returned with its axes in the declared order."""
    checked = {}
    for var in variables:
        if var.name not in out:
            raise CellError(f"{label}: kernel did not return variable {var.name!r}")
        inner_dims = tuple(d for d in var.dims if d not in grid)
        arr = _in_declared_order(out[var.name], var, inner_dims, label)
        shape = tuple(len(inner[d]) for d in inner_dims)
        if arr.shape != shape:
            raise CellError(f"{label}: {var.name} has shape {arr.shape}, declared {shape}")
        if not var.allow_nonfinite and not np.all(np.isfinite(arr)):
            raise CellError(f"{label}: non-finite values in {var.name}")
        checked[var.name] = _as_declared(arr, var, label)
    return checked


def _in_declared_order(value, var, inner_dims, label) -> np.ndarray:
    """The float array of one kernel output with its axes in the order ``inner_dims`` (``var``'s
    dims less the grid's): an :class:`Out` transposed by its names, a plain array as it is. A
    CellError naming the variable and both dims when the names are not ``inner_dims``."""
    if not isinstance(value, Out):
        return np.asarray(value, dtype=float)
    dims, arr = tuple(value.dims), np.asarray(value.array, dtype=float)
    if sorted(dims) != sorted(inner_dims):
        raise CellError(f"{label}: {var.name} was returned with dims {dims}, declared {inner_dims} (the dims "
                        f"{var.dims} less the grid's)")
    if arr.ndim != len(dims):
        raise CellError(f"{label}: {var.name} has shape {arr.shape}, but its dims name {len(dims)} axes {dims}")
    return arr.transpose([dims.index(d) for d in inner_dims])


def _as_declared(arr, var, label):
    """``arr`` in the declared dtype of ``var``; a CellError if a value does not survive the cast
    or is not one of a flag's ``flag_values``."""
    if arr.dtype == var.dtype:
        return arr
    typed = arr.astype(var.dtype)
    if not np.array_equal(typed, arr):
        raise CellError(f"{label}: {var.name} has values that are not {var.dtype}: {arr.ravel()[:5].tolist()}")
    if var.flag_meanings and not np.isin(typed, np.arange(len(var.flag_meanings))).all():
        raise CellError(f"{label}: {var.name} is a flag with values 0..{len(var.flag_meanings) - 1}, "
                        f"got {np.unique(typed).tolist()}")
    return typed


def _run_block(experiment, config, part, ranges, store=None):
    """Compute a block of cells of ``part`` (or load the ones ``store`` kept, keeping each new one
    there); returns ``{name: array(block shape + inner shape)}``."""
    shape = tuple(len(r) for r in ranges)
    grid = experiment.part(part).grid(config)
    results = []
    for idx in itertools.product(*ranges):
        cell = _cell_at(grid, idx)
        out = store.load(cell, part) if store is not None else None
        if out is None:
            start, n_exp = time.perf_counter(), softmax_core.exponentials()
            out = run_cell(experiment, config, cell, part)
            if store is not None:
                from .storage import blas_kernel

                store.save(cell, out, part, seconds=time.perf_counter() - start,
                           exponentials=softmax_core.exponentials() - n_exp, blas=blas_kernel())
        results.append(out)
    out = {}
    for var in experiment.part_variables(part):
        stacked = np.stack([r[var.name] for r in results])
        out[var.name] = stacked.reshape(shape + stacked.shape[1:])
    return out


def _chunk_ranges(n, size):
    return [range(start, min(start + size, n)) for start in range(0, n, size)]


def build(experiment: Experiment, config: Mapping, chunks: Mapping | None = None, store=None,
          call: str | None = None) -> xr.Dataset:
    """Lazy Dataset of ``experiment`` under ``config``; computes nothing.

    ``config``: a :class:`~sfxlin.engine.params.Config` from ``experiment.configure(...)``, or a mapping
    of every parameter (validated here). ``chunks`` maps grid dims to cells per task (default 1:
    one task per cell). Variables carry their declared attrs; dims are ordered as declared;
    every dim has its coordinate. ``store`` (a :class:`~sfxlin.engine.cellstore.CellStore`) keeps every
    finished cell on disk and serves kept cells instead of recomputing them. The Dataset's attrs
    carry the configuration, the predeclared criteria of the experiment's analysis, the schema
    version and the provenance (:func:`sfxlin.engine.storage.provenance`): a file saved from it is as
    complete as one written by ``sfxlin run``; ``call`` is the command recorded in its ``history``
    (default: this process's command line).
    """
    from .params import Config

    if experiment.params and not isinstance(config, Config):
        config = experiment.configure(profile=None, values=config)
    inner = experiment.inner_coords(config)
    grids = {part.name: part.grid(config) for part in experiment.parts}
    coords = dict(inner)
    for part_name, grid in grids.items():
        for dim, values in grid.items():
            if dim in coords and list(coords[dim]) != list(values):
                raise ValueError(f"{experiment.name}: coordinate {dim!r} has values {list(values)} in part "
                                 f"{part_name!r} but {list(coords[dim])} elsewhere")
            coords[dim] = values
    for dim, values in coords.items():
        repeated = sorted({coordinate_text(v) for v in values if list(values).count(v) > 1})
        if repeated:
            raise ValueError(f"{experiment.name}: coordinate {dim!r} repeats the value(s) {', '.join(repeated)}; "
                             "every cell and every inner slice must have its own coordinate value")
    chunks = check_chunks(experiment, config, chunks)
    import xarray as xr   # after every check: a refused build imports nothing heavy

    data_vars = {}
    for part in experiment.parts:
        data_vars.update(_part_variables(experiment, config, part.name, grids[part.name], inner, chunks, store))
    ds = xr.Dataset(data_vars, coords={dim: xr.Variable(dim, np.asarray(values), attrs=_coordinate_attrs(dim, values))
                                       for dim, values in coords.items()})
    ds.attrs.update(_declared_attrs(experiment, config, call))
    return ds


def _coordinate_attrs(dim, values) -> dict:
    """The CF attributes of a coordinate: the vocabulary's (:func:`.schema.coord_attrs`), with
    ``units`` ``"1"`` for a numeric one that declares none (a label, a count, an index); text has none."""
    attrs = coord_attrs(dim)
    if np.asarray(values).dtype.kind in "iuf" and "units" not in attrs:
        attrs["units"] = "1"
    return attrs


def check_chunks(experiment, config, chunks) -> dict:
    """``chunks`` (grid dim -> cells per dask task) checked against the grid dims of ``experiment``
    under ``config``: a ValueError naming a dim that is not one, or a size that is not a positive
    integer. Returns it as a dict (``{}`` for None)."""
    chunks = dict(chunks or {})
    grid_dims = {dim for part in experiment.parts for dim in part.grid(config)}
    unknown = set(chunks) - grid_dims
    if unknown:
        raise ValueError(f"chunks names dims {sorted(unknown)} that are not grid dims {sorted(grid_dims)}")
    for dim, size in chunks.items():
        if not isinstance(size, (int, np.integer)) or size < 1:
            raise ValueError(f"chunk size for {dim!r} must be a positive integer, got {size!r}")
    return chunks


def _part_variables(experiment, config, part, grid, inner, chunks, store):
    """The lazy arrays of one part: one dask task per block of its cells."""
    import dask
    import xarray as xr
    per_dim = [_chunk_ranges(len(values), chunks.get(dim, 1)) for dim, values in grid.items()]
    prefix = f"{experiment.rng_name(part)}-block-"
    blocks = {}
    for combo in itertools.product(*[range(len(p)) for p in per_dim]):
        ranges = tuple(per_dim[k][c] for k, c in enumerate(combo))
        where = ",".join(f"{dim}[{r.start}:{r.stop}]" for dim, r in zip(grid, ranges))
        key = f"{prefix}{where}-{dask.base.tokenize(experiment.name, part, config, ranges)}"
        blocks[combo] = dask.delayed(_run_block, pure=True)(experiment, config, part, ranges, store,
                                                            dask_key_name=key)
    out = {}
    grid_dims = list(grid)
    for var in experiment.part_variables(part):
        if not all(d in var.dims for d in grid_dims):
            raise ValueError(f"{experiment.name}.{var.name}: dims {var.dims} must include every grid dim "
                             f"{grid_dims} of part {part!r}")
        inner_dims = [d for d in var.dims if d not in grid]
        missing = [d for d in inner_dims if d not in inner]
        if missing:
            raise ValueError(f"{experiment.name}.{var.name}: dims {missing} have no coordinates")
        inner_shape = tuple(len(inner[d]) for d in inner_dims)

        def piece(combo, var=var, inner_shape=inner_shape):
            import dask.array as da

            shape = tuple(len(per_dim[k][c]) for k, c in enumerate(combo)) + inner_shape
            return da.from_delayed(blocks[combo][var.name], shape=shape, dtype=var.dtype)

        arr = _assemble([piece(c) for c in blocks], [len(p) for p in per_dim])
        out[var.name] = xr.Variable(grid_dims + inner_dims, arr, attrs=var.attrs()).transpose(*var.dims)
    return out


def _declared_attrs(experiment, config, call=None):
    """What a results file says of itself before any work: the conventions it follows (CF), name,
    configuration, criteria, schema version and provenance (``wall_seconds`` and ``scheduler`` are
    set by the computation)."""
    from .storage import provenance

    attrs = {"Conventions": CONVENTIONS, "experiment": experiment.name, "description": experiment.description,
             "title": experiment.title or experiment.name, "n_cells": experiment.n_cells(config)}
    if experiment.analysis:
        attrs["analysis"] = experiment.analysis
        attrs["criteria"] = json.dumps(criteria_of(experiment))
    attrs.update(provenance(experiment.name, config, call))
    return attrs


def criteria_of(experiment) -> list[dict]:
    """The predeclared criteria of ``experiment``, as data, from its analysis module's
    ``CRITERIA`` (imported by name and checked against the plug-in protocol,
    :func:`.protocol.load_analysis`: the engine never imports analysis code statically)."""
    return load_analysis(experiment.analysis).criteria()


def _assemble(flat, sizes, axis=0):
    """Concatenate a row-major list of blocks over a grid of ``sizes`` blocks (leading axes)."""
    import dask.array as da  # see _part_variables

    if not sizes:  # a part without grid dims: one block, one cell
        return flat[0]
    if len(sizes) == 1:
        return da.concatenate(flat, axis=axis)
    step = math.prod(sizes[1:])
    parts = [_assemble(flat[i * step:(i + 1) * step], sizes[1:], axis + 1) for i in range(sizes[0])]
    return da.concatenate(parts, axis=axis)
