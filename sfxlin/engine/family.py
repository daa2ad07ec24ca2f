"""A family of experiments declared once, and the experiments that are its variants.

A :class:`Family` holds what the experiments of one claim share (xarray-simlab's processes, reused by
its model variants): the parameter vocabulary (each name declared once, as a
:class:`~sfxlin.engine.params.Param`, with :data:`COMMON`, the engine's ``L``, ``n_seeds`` and
``root_seed``), the outputs (each a :class:`~sfxlin.engine.sweep.Variable` whose dims are those inside a
cell, one meaning per name), the coordinates of those inner dims, the checks that tie parameters together, and the
cost model of a cell. A variant (:meth:`Family.variant`) is an :class:`~sfxlin.engine.sweep.Experiment`:
its grids and kernels (:class:`Cells`), the family's parameters it takes with its values, the
parameters and outputs it adds, its analysis module (its criteria and figure) and its title.
"""
from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass, field
from typing import Callable, Mapping

from .params import Param
from .sweep import Experiment, Part, Variable

__all__ = ["COMMON", "Cells", "Cost", "Family", "grid_of", "multiples", "placed"]

#: the parameters every family shares, declared here once: the nested prompt lengths, the seeds of a grid
#: point and the root of every cell's generator (a variant gives their values)
COMMON = (
    Param("L", "int_list", "nested prompt lengths", [16, 32, 64], unit="tokens", low=1, order="increasing",
          min_len=3, why="the analysis fits log-log slopes in L"),
    Param("n_seeds", "int", "independent replicates (seeds) per grid point", 1, low=1, grid=True),
    Param("root_seed", "int", "root of every cell's random generator", 0),
)


@dataclass(frozen=True)
class Cost:
    """A cost model: the CPU seconds of one cell are ``sum(rates[unit] * n)`` over the ``{unit: n}`` that
    ``counts(config, part, cell)`` gives (token visits, steps, draws, cells: what the cell does; None for
    a part without an estimate). ``rates`` are seconds per unit on the reference machine
    (docs/performance.md, "Cost models"); a variant counts its own work in its family's units
    (:meth:`counting`)."""

    rates: Mapping[str, float]
    counts: Callable | None = None

    def __call__(self, config, part, cell) -> float | None:
        counts = None if self.counts is None else self.counts(config, part, cell)
        return None if counts is None else float(sum(self.rates[unit] * n for unit, n in counts.items()))

    def counting(self, counts) -> Cost:
        """This model with ``counts`` in place of its own (the same rates)."""
        return Cost(self.rates, counts)


def placed(var: Variable, grid_dims, part="", order=()) -> Variable:
    """The family output ``var`` (its dims those inside a cell) as the variable of a part whose grid has
    ``grid_dims``: dims ``grid_dims + var.dims``, sorted by their place in ``order`` where ``order`` names them
    (the others after, in that order)."""
    rank = {dim: i for i, dim in enumerate(order)}
    dims = sorted(tuple(grid_dims) + var.dims, key=lambda dim: (dim not in rank, rank.get(dim, 0)))
    return dataclasses.replace(var, dims=tuple(dims), part=part)


def grid_of(spec: Mapping) -> Callable:
    """``grid(config) -> {dim: values}`` of a declared grid ``{dim: source}``: a source is the name of a
    parameter (a list gives its values, an integer ``n`` the values ``0 .. n - 1``), a tuple of values,
    or a function of the configuration."""
    def grid(config):
        out = {}
        for dim, source in spec.items():
            if callable(source):
                out[dim] = list(source(config))
            elif isinstance(source, str):
                value = config[source]
                out[dim] = list(range(value)) if isinstance(value, int) else list(value)
            else:
                out[dim] = list(source)
        return out
    return grid


def multiples(*pairs) -> Callable:
    """A check (``Experiment.checks``) that ``config[a]`` is a multiple of ``config[b]`` for every pair
    ``(a, b)`` of parameters the configuration holds (a run that ends on a checkpoint); a ValueError
    ``"a: <value> must be a multiple of b = <value>"`` otherwise."""
    def check(config):
        for a, b in pairs:
            if a in config and b in config and config[a] % config[b]:
                raise ValueError(f"{a}: {config[a]} must be a multiple of {b} = {config[b]}")
    return check


@dataclass(frozen=True)
class Cells:
    """One part of a variant: its grid ``{dim: source}`` (:func:`grid_of`), its kernel
    ``kernel(cell, rng, inputs) -> {output: Out or array}``, the outputs it computes (names of the
    family's outputs, or variables of the variant's own, their dims those inside a cell), its part name and,
    where given,
    ``inputs(config, cell)``, what reaches a cell (:class:`~sfxlin.engine.sweep.Part`). ``perturbed``: its
    kernel passes :func:`sfxlin.engine.sensitivity.step_perturbation` to the trajectories it trains (the
    family's run does), so the engine can measure each cell's amplification of rounding."""

    grid: Mapping
    kernel: Callable
    outputs: tuple
    name: str = ""
    inputs: Callable | None = None
    perturbed: bool = False


@dataclass(frozen=True)
class Family:
    """The declarations an experiment family shares (see the module docstring).

    ``params``: the vocabulary, :data:`COMMON` joined to it; ``outputs``: every output a variant may
    name; ``coords``: ``{inner dim: coords(config) -> values}``; ``checks``: ``check(config)`` functions,
    each returning at once where the configuration lacks its parameters; ``cost``: the family's cost model
    (:class:`Cost`: the expected CPU seconds of one cell)."""

    name: str
    params: tuple[Param, ...]
    outputs: tuple[Variable, ...]
    coords: Mapping[str, Callable] = field(default_factory=dict)
    checks: tuple[Callable, ...] = ()
    cost: Cost | None = None

    def __post_init__(self):
        params = (*self.params, *(p for p in COMMON if p.name not in {q.name for q in self.params}))
        object.__setattr__(self, "params", params)
        for kind, names in (("parameter", [p.name for p in params]), ("output", [o.name for o in self.outputs])):
            repeated = sorted({n for n in names if names.count(n) > 1})
            if repeated:
                raise ValueError(f"family {self.name}: the {kind}(s) {repeated} are declared more than once")

    def param(self, name) -> Param:
        """The family's declaration of the parameter ``name``."""
        for p in self.params:
            if p.name == name:
                return p
        raise ValueError(f"family {self.name} declares no parameter {name!r}; it declares "
                         f"{sorted(p.name for p in self.params)}")

    def output(self, name, over=()) -> Variable:
        """The family's declaration of the output ``name``, with the inner dims ``over`` before its own (a
        variant that keeps a law or a prompt dim the family's output averages over)."""
        for o in self.outputs:
            if o.name == name:
                return dataclasses.replace(o, dims=tuple(over) + o.dims)
        raise ValueError(f"family {self.name} declares no output {name!r}")

    def take(self, values: Mapping, changes: Mapping = (), sweep=()) -> tuple[Param, ...]:
        """The family's parameters named in ``values``, each with its value there (a value or a
        :class:`~sfxlin.engine.params.Profiles`), ``changes[name]`` (``{field: value}``: another doc, bound
        or part) applied, and those in ``sweep`` made grid lists (``d`` swept over ``[2, 3]``: kind
        ``int_list``, a grid dim, every value once)."""
        changes = dict(changes)
        out = []
        for name, value in values.items():
            p = self.param(name)
            if name in sweep:
                p = dataclasses.replace(p, kind=f"{p.kind}_list", grid=True, unique=True)
            out.append(dataclasses.replace(p, value=value, **changes.pop(name, {})))
        if changes:
            raise ValueError(f"family {self.name}: changes name parameters not taken: {sorted(changes)}")
        return tuple(out)

    def variant(self, name, *, cells, values, changes=(), sweep=(), params=(), coords=(), order=(), checks=(),
                cost=None, **experiment) -> Experiment:
        """The experiment ``name``, a variant of this family.

        ``cells``: its parts (:class:`Cells`); ``values``, ``changes``, ``sweep``: the family's parameters
        it takes (:meth:`take`); ``params``: the parameters it adds; ``coords``: the coordinates of the
        inner dims it adds; ``order``: the order of the dims of its variables where it is not grid then
        inner (:func:`placed`); ``checks``: its own, after the family's; ``cost``: its cost model
        where it is not the family's (its counts, in the family's rates: :meth:`Cost.counting`);
        ``experiment``: the other fields of the
        :class:`~sfxlin.engine.sweep.Experiment` (``short``, ``analysis``, ``title``, ``description``,
        ``scheduler``, ``inner_coords`` where computed otherwise). The variant's module is its caller's."""
        declared = self.take(values, changes, sweep) + tuple(params)
        variables, parts, inner = [], [], set()
        for c in cells:
            mine = [placed(self.output(o) if isinstance(o, str) else o, tuple(c.grid), c.name, order)
                    for o in c.outputs]
            inner |= {d for v in mine for d in v.dims if d not in c.grid}
            variables += mine
            parts.append(Part(c.name, grid_of(c.grid), c.kernel, c.inputs, perturbed=c.perturbed, grid_dims=tuple(c.grid)))
        table = {**self.coords, **dict(coords)}
        missing = sorted(d for d in inner if d not in table)
        if missing and "inner_coords" not in experiment:
            raise ValueError(f"{name}: no coordinates declared for the dims {missing}")
        experiment.setdefault("inner_coords", lambda config: {d: list(table[d](config)) for d in table if d in inner})
        return Experiment(name=name, params=declared, variables=tuple(variables), parts=tuple(parts),
                          checks=(*self.checks, *checks), cost=cost or self.cost,
                          module=sys._getframe(1).f_globals.get("__name__"), **experiment)
