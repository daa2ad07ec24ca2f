"""Combining runs: results files of one experiment over parts of its grid -> one results file.

``sfxlin run c1 --set d=2,3`` and ``--set d=4,5`` computed the cells of one sweep over d = 2..5:
every cell draws from a generator keyed by its coordinate values (:func:`sfxlin.engine.sweep.cell_rng`),
so the merged file holds exactly what one run over d = 2..5 computes. :func:`merge` checks that
the files can be one run and combines them:

* the same ``experiment`` and schema version, the same predeclared ``criteria`` and token files
  (``input_files``), and the same value of every parameter but the grid parameters
  (:attr:`sfxlin.engine.params.Param.grid`: they only say which cells exist); the code revision may
  differ (each file's is kept in ``merged_from``);
* the merged configuration: a list-valued grid parameter is the union of the files' values
  (sorted when the parameter declares an ``order``, else in order of first appearance), a scalar
  one (``n_seeds``) the one value whose grid holds exactly the files' coordinates; its grid must
  be filled by the files' cells (no cell left empty);
* the data: each variable keeps its own dims, every value lands at its coordinates; a cell held
  by several files must be identical in each (then kept once), and a variable outside the grid
  (a quadrature check) equal in every file.

The merged attrs: ``config``, ``profile``, ``overrides`` (the ``--set`` that rerun the merged
configuration) and ``n_cells`` of the merged grid; ``history`` the files' lines plus one for the
merge; ``git_revision``, ``sfxlin_version`` and ``library_versions`` the common value or
``"mixed: a, b"``; ``merged_from`` (JSON) each input's path, sha256, creation, revision and the
per-run attrs that no longer describe the merged file (``cell_timeline``, ``cell_seconds``,
``cell_exponentials``, ``wall_seconds``, ``scheduler``). Anything else comes from the first file. A refusal is a
:class:`~sfxlin.engine.storage.ResultsError` of one line naming the file(s) and what differs.
"""
from __future__ import annotations

import datetime as _dt
import itertools
import json
from pathlib import Path

import numpy as np
import xarray as xr

from .._version import __version__
from .experiments import get as get_experiment
from ..realdata import file_sha256
from .schema import SCHEMA_VERSION
from .storage import ResultsError, open_results, results_path, save
from .sweep import coordinate_text

__all__ = ["merge", "merge_files"]

#: attrs that must be equal in every file (beyond the configuration)
MUST_AGREE = ("criteria", "input_files")
#: attrs of one run's execution: kept per input in ``merged_from``, not at the top
PER_RUN = ("cell_timeline", "cell_seconds", "cell_exponentials", "wall_seconds", "scheduler")
#: provenance attrs recorded per input in ``merged_from``
PROVENANCE = ("created", "git_revision", "sfxlin_version", "profile", "overrides", "library_versions")


def merge_files(paths, out) -> Path:
    """Merge the results files ``paths`` (:func:`merge`) and write the result to ``out``
    atomically (:func:`sfxlin.engine.storage.save`); returns the path written. Every input is read
    whole and hashed before anything is written, so ``out`` may name one of them."""
    datasets, sources = [], []
    for name in paths:
        datasets.append(open_results(name))
        path = results_path(name).resolve()
        sources.append({"path": str(path), "sha256": file_sha256(path)})
    return save(merge(datasets, sources), out)


def merge(datasets, sources=None) -> xr.Dataset:
    """One results Dataset from the results Datasets ``datasets`` of one experiment over parts
    of its grid (module docstring: what is checked, how data and attrs combine).

    ``sources``: one ``{"path", "sha256"}`` per Dataset, the file it was read from
    (:func:`merge_files` gives them); by default each Dataset's ``encoding["source"]``, unhashed.
    Raises :class:`~sfxlin.engine.storage.ResultsError` when the files cannot be one run."""
    datasets = list(datasets)
    if len(datasets) < 2:
        raise ResultsError(f"merge needs at least two results files, got {len(datasets)}")
    if sources is None:
        sources = [{"path": ds.encoding.get("source"), "sha256": None} for ds in datasets]
    if len(sources) != len(datasets):
        raise ValueError(f"sources: one per Dataset, got {len(sources)} for {len(datasets)} Datasets")
    names = [src["path"] or f"dataset {i}" for i, src in enumerate(sources)]
    experiment = _common_experiment(datasets, names)
    for key in MUST_AGREE:
        _check_agree(datasets, names, key)
    _check_same_variables(datasets, names)
    configs = [_config_of(ds, name) for ds, name in zip(datasets, names)]
    _check_parameters(experiment, configs, names)
    config, coords = _merged_config(experiment, datasets, configs, names)
    data_vars = {var: _merged_variable(experiment, config, var, datasets, names, coords)
                 for var in datasets[0].data_vars}
    first = datasets[0]
    merged = xr.Dataset(data_vars, coords={dim: xr.Variable(dim, np.asarray(values), attrs=first[dim].attrs)
                                           for dim, values in coords.items()})
    merged.attrs = _merged_attrs(experiment, config, datasets, sources, names)
    return merged


# ------------------------------------------------------------------ what must agree
def _common_experiment(datasets, names):
    """The :class:`~sfxlin.engine.sweep.Experiment` every Dataset is a run of (same schema version)."""
    for ds, name in zip(datasets, names):
        version = ds.attrs.get("sfxlin_schema_version")
        version = version.item() if hasattr(version, "item") else version  # netCDF gives numpy scalars
        if str(version) != str(SCHEMA_VERSION):
            raise ResultsError(f"{name} has schema version {version!r}; this sfxlin merges version {SCHEMA_VERSION}")
    made_by = [ds.attrs.get("experiment") for ds in datasets]
    for name, other in zip(names[1:], made_by[1:]):
        if other != made_by[0]:
            raise ResultsError(f"{name} holds a {other} run, {names[0]} a {made_by[0]} run: only runs of one "
                               "experiment merge")
    try:
        return get_experiment(made_by[0])
    except ValueError as exc:
        raise ResultsError(f"{names[0]}: {exc}") from None


def _check_agree(datasets, names, key):
    """ResultsError unless attr ``key`` is the same (or absent) in every Dataset."""
    values = [ds.attrs.get(key) for ds in datasets]
    for name, value in zip(names[1:], values[1:]):
        if value != values[0]:
            raise ResultsError(f"attr {key!r} differs between {names[0]} and {name}: runs judged or fed "
                               f"differently do not merge")


def _check_same_variables(datasets, names):
    """ResultsError unless every Dataset has the same variables, each with the same dims."""
    first = datasets[0]
    for ds, name in zip(datasets[1:], names[1:]):
        alone = sorted(set(ds.data_vars) ^ set(first.data_vars))
        if alone:
            raise ResultsError(f"variable(s) {alone} are in one of {names[0]} and {name} only")
        for var in first.data_vars:
            if ds[var].dims != first[var].dims:
                raise ResultsError(f"variable {var} has dims {first[var].dims} in {names[0]}, {ds[var].dims} in {name}")


def _config_of(ds, name) -> dict:
    try:
        return json.loads(ds.attrs["config"])
    except (KeyError, TypeError, json.JSONDecodeError):
        raise ResultsError(f"{name} has no readable 'config' attr: not a results file of sfxlin") from None


def _check_parameters(experiment, configs, names):
    """ResultsError naming the first parameter other than a grid parameter whose value differs
    (or that one file lacks), with its value in each file."""
    grid = [p.name for p in experiment.params if p.grid]
    keys = [p.name for p in experiment.params] + sorted(set().union(*configs) - {p.name for p in experiment.params})
    for key in keys:
        values = [config.get(key, "<absent>") for config in configs]
        if key in grid and "<absent>" not in values:
            continue
        if any(value != values[0] for value in values[1:]):
            each = ", ".join(f"{json.dumps(value)} in {name}" for value, name in zip(values, names))
            raise ResultsError(f"parameter {key} differs: {each} (only the grid parameters {', '.join(grid)} "
                               "may differ)")


# ------------------------------------------------------------------ the merged configuration
def _merged_config(experiment, datasets, configs, names):
    """``(config, coords)``: the one configuration whose coordinates are the union of the
    files' coordinates, and those coordinates ``{dim: values}`` in its order."""
    union = _coordinate_union(datasets)
    fixed, choices = dict(configs[0]), {}
    for p in experiment.params:
        values = [config[p.name] for config in configs]
        if not p.grid or all(value == values[0] for value in values):
            continue
        if p.kind.endswith("_list"):
            fixed[p.name] = _union(values, p.order)
        else:
            choices[p.name] = [v for i, v in enumerate(values) if v not in values[:i]]
    found = []
    for combo in itertools.product(*choices.values()):
        try:
            config = experiment.configure(profile=None, values={**fixed, **dict(zip(choices, combo))})
        except ValueError as exc:
            if not choices:
                raise ResultsError(f"the merged configuration of {', '.join(names)} is not valid: {exc}") from None
            continue
        coords = _coordinates(experiment, config)
        if {dim: {coordinate_text(v) for v in column} for dim, column in coords.items()} == union:
            found.append((config, coords))
    differ = "; ".join(f"{key}: {' / '.join(map(str, values))}" for key, values in choices.items())
    if not found:
        raise ResultsError(f"no configuration of {experiment.name} has exactly the cells of {', '.join(names)}"
                           + (f" ({differ})" if differ else ""))
    if len(found) > 1:
        raise ResultsError(f"the cells of {', '.join(names)} fit several configurations of {experiment.name} "
                           f"({differ}): the merged file could not say which it is")
    return found[0]


def _union(lists, order):
    """The values of ``lists`` once each: sorted by ``order`` (``"increasing"`` /
    ``"decreasing"``), else in order of first appearance."""
    values = list(dict.fromkeys(v for items in lists for v in items))
    if order is None:
        return values
    return sorted(values, reverse=order == "decreasing")


def _coordinate_union(datasets) -> dict:
    """``{dim: {exact text of every value}}`` over every Dataset."""
    union = {}
    for ds in datasets:
        for dim in ds.dims:
            union.setdefault(dim, set()).update(coordinate_text(v) for v in ds[dim].values)
    return union


def _coordinates(experiment, config) -> dict:
    """``{dim: values}`` of a run of ``experiment`` under ``config``: its inner coordinates and
    every part's grid, as :func:`sfxlin.engine.sweep.build` lays them out."""
    coords = dict(experiment.inner_coords(config))
    for part in experiment.parts:
        coords.update(part.grid(config))
    return {dim: list(values) for dim, values in coords.items()}


# ------------------------------------------------------------------ the data
def _merged_variable(experiment, config, name, datasets, names, coords) -> xr.Variable:
    """Variable ``name`` on the merged coordinates: every file's values at their coordinates;
    ResultsError if two files hold a cell with different values or no file holds one."""
    first = datasets[0][name]
    dims = first.dims
    index = {dim: {coordinate_text(v): i for i, v in enumerate(coords[dim])} for dim in dims}
    shape = tuple(len(coords[dim]) for dim in dims)
    data = np.zeros(shape, np.result_type(*(ds[name].dtype for ds in datasets)))
    owner = np.full(shape, -1)
    cell_dims = _cell_dims(experiment, config, name, dims)
    for k, ds in enumerate(datasets):
        where = np.ix_(*[[index[dim][coordinate_text(v)] for v in ds[dim].values] for dim in dims])
        values = ds[name].values
        clash = (owner[where] >= 0) & ~_identical(data[where], values)
        if clash.any():
            at = tuple(np.argwhere(clash)[0])
            other = names[owner[where][at]]
            if not cell_dims:
                raise ResultsError(f"{name} has no grid dim and differs between {other} and {names[k]}: a variable "
                                   "outside the grid must be equal in every file")
            raise ResultsError(f"{other} and {names[k]} both hold the cell {_cell_text(ds, dims, cell_dims, at)} with "
                               f"different values of {name}: an overlapping cell must be identical in every file")
        data[where] = values
        owner[where] = k
    if (owner < 0).any():
        at = tuple(np.argwhere(owner < 0)[0])
        cell = ", ".join(f"{dim}={coords[dim][i]!r}" for dim, i in zip(dims, at) if dim in cell_dims)
        raise ResultsError(f"no file holds the cell {cell} of {name}: the files' cells do not fill the grid of "
                           f"the merged configuration ({', '.join(names)})")
    return xr.Variable(dims, data, attrs=first.attrs)


def _cell_dims(experiment, config, name, dims) -> list:
    """The dims of ``name`` that say which cell a value belongs to: its part's grid dims."""
    declared = {v.name: v for v in experiment.variables}
    if name in declared:
        return list(experiment.part(declared[name].part).grid(config))
    grids = {dim for part in experiment.parts for dim in part.grid(config)}
    return [dim for dim in dims if dim in grids]


def _identical(a, b):
    """Elementwise: equal values, NaN equal to NaN."""
    same = a == b
    if a.dtype.kind == "f" or b.dtype.kind == "f":
        same |= np.isnan(a) & np.isnan(b)
    return same


def _cell_text(ds, dims, cell_dims, at):
    """``"d=3, U_norm=0.5, seed=0"``: the cell of position ``at`` of ``ds``'s values."""
    return ", ".join(f"{dim}={ds[dim].values[i].item()!r}" for dim, i in zip(dims, at) if dim in cell_dims)


# ------------------------------------------------------------------ the attrs
def _merged_attrs(experiment, config, datasets, sources, names) -> dict:
    """The first file's attrs, less the per-run ones, with the configuration, provenance and
    history of the merged file."""
    created = _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat()
    profile, overrides = _profile_and_overrides(experiment, datasets, config)
    attrs = {k: v for k, v in datasets[0].attrs.items() if k not in PER_RUN}
    attrs.update(profile=profile, overrides=json.dumps(overrides), config=config.to_json(),
                 n_cells=experiment.n_cells(config), created=created,
                 git_revision=_joined(ds.attrs.get("git_revision", "unknown") for ds in datasets),
                 sfxlin_version=_joined(ds.attrs.get("sfxlin_version", "unknown") for ds in datasets),
                 library_versions=json.dumps(_library_versions(datasets), sort_keys=True),
                 history=_history(datasets, names, created),
                 merged_from=json.dumps([_input_record(ds, src) for ds, src in zip(datasets, sources)]))
    return attrs


def _profile_and_overrides(experiment, datasets, config):
    """``(profile, overrides)``: the files' common profile and the ``--set KEY=VALUE`` that give
    ``config`` from it; ``("custom", [])`` when the files name different profiles."""
    profiles = {ds.attrs.get("profile", "custom") for ds in datasets}
    profile = profiles.pop() if len(profiles) == 1 else "custom"
    if profile not in experiment.profiles:
        return "custom", []
    default, merged = json.loads(experiment.configure(profile).to_json()), json.loads(config.to_json())
    return profile, [f"{p.name}={_set_text(merged[p.name])}" for p in experiment.params
                     if merged[p.name] != default[p.name]]


def _set_text(value) -> str:
    """The ``--set`` text of a configuration value (:func:`sfxlin.engine.params.parse_text` reads it
    back): a scalar as typed, a list comma-separated, a matrix or a list of strings with a
    comma as JSON."""
    if isinstance(value, list):
        if any(isinstance(v, list) or (isinstance(v, str) and "," in v) for v in value):
            return json.dumps(value)
        return ",".join(_set_text(v) for v in value)
    if isinstance(value, bool):
        return "true" if value else "false"
    return coordinate_text(value)


def _joined(values) -> str:
    """The one value of ``values``, or ``"mixed: a, b"`` (in order of first appearance)."""
    unique = list(dict.fromkeys(str(v) for v in values))
    return unique[0] if len(unique) == 1 else "mixed: " + ", ".join(unique)


def _library_versions(datasets) -> dict:
    """``{library: version}``, ``"mixed: ..."`` where the files were computed with several."""
    tables = [json.loads(ds.attrs.get("library_versions", "{}")) for ds in datasets]
    names = sorted(set().union(*tables))
    return {name: _joined(table.get(name, "unknown") for table in tables) for name in names}


def _history(datasets, names, created) -> str:
    """Every file's history lines (each once, in order), then the line of this merge."""
    lines = dict.fromkeys(line for ds in datasets for line in str(ds.attrs.get("history", "")).splitlines() if line)
    return "\n".join([*lines, f"{created}: sfxlin merge of {', '.join(names)} (sfxlin {__version__})"])


def _input_record(ds, source) -> dict:
    """One entry of ``merged_from``: the input's file and hash, its provenance and per-run attrs."""
    record = dict(source)
    for key in (*PROVENANCE, *PER_RUN, "merged_from"):
        if key in ds.attrs:
            value = ds.attrs[key]
            value = value.item() if hasattr(value, "item") else value
            record[key] = json.loads(value) if key in ("overrides", "library_versions", "cell_timeline", "cell_seconds",
                                                       "cell_exponentials",
                                                       "merged_from") else value
    return record
