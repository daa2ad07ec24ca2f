"""A run of an experiment into a folder, as ``sfxlin run`` makes it and :func:`run` from Python:
configure, refuse to replace another configuration's file, keep every finished cell (and serve the
kept ones: an interrupted run resumes), compute, save the file, draw its figure and judge it.

    import sfxlin
    ds = sfxlin.run("c1", out="runs/mine", d=[2, 4], U_norm=[0.2, 0.4])   # keyword parameters as Python values
    ds.sfx.verdict_table()

The command line and :func:`run` share :func:`execute`: the same cell store, the same refusals, the
same file and verdicts.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from .engine.params import Param
from .engine.storage import changed_input_files, default_results_dir, ensure_writable, record_cell_kernels, ResultsError, save

__all__ = ["run", "execute", "judge", "Outcome", "RunInterrupted", "default_out", "check_replaceable", "override_text"]


def default_out(profile, overrides) -> Path:
    """The default output folder of a run (:data:`sfxlin.engine.storage.FOLDER_RULE`): the paper results'
    folder (:func:`sfxlin.engine.storage.default_results_dir`) for the paper profile without
    overrides, ``runs/PROFILE`` of the working directory otherwise."""
    return default_results_dir() if profile == "paper" and not overrides else Path("runs") / profile


def check_replaceable(path, experiment, config):
    """Refuse, before any work, to replace a results file made by another experiment or under
    another configuration (its ``experiment`` and ``config`` attrs, and the sha256 of every token
    file in its ``input_files``: a file whose content changed under the same path is another
    configuration), or one that is not a results file at all. The same configuration (a rerun)
    may replace it."""
    path = Path(path)
    if not path.exists():
        return
    import xarray as xr

    hint = "--force (force=True) replaces it, --name NAME (name=NAME) writes NAME.nc beside it"
    try:
        with xr.open_dataset(path, engine="netcdf4") as old:
            made_by, made_with = old.attrs.get("experiment"), json.loads(old.attrs["config"])
            made_from = old.attrs.get("input_files")
    except Exception as exc:  # netCDF4/HDF5 raise OSError, ValueError, KeyError for foreign files
        raise ResultsError(f"{path} exists and is not a results file of sfxlin "
                           f"({type(exc).__name__}: {exc}); {hint}") from None
    if made_by != experiment:
        raise ResultsError(f"{path} holds a {made_by} run, not {experiment}; {hint}")
    plain = json.loads(config.to_json())
    changed = [f"{key}: {json.dumps(made_with.get(key))} -> {json.dumps(plain.get(key))}"
               for key in sorted(set(made_with) | set(plain)) if made_with.get(key) != plain.get(key)]
    changed += changed_input_files(made_from, config)
    if changed:
        raise ResultsError(f"{path} holds a run under another configuration ({'; '.join(changed)}); {hint}")


def override_text(param: Param, value) -> str:
    """``value`` (a Python value of ``param``'s kind: ``[2, 4]``, ``0.5``, ``True``, a path) as the
    text of ``--set NAME=TEXT`` that gives it (lists and matrices as JSON), checked first: a
    ValueError naming the parameter when it is not a valid value. A run given typed values is the
    run of those ``--set`` overrides: the same configuration, the same file attrs."""
    import numpy as np

    checked = param.check(value)
    if param.kind == "matrix" or param.kind.endswith("_list"):
        return json.dumps(np.asarray(checked).tolist())
    if param.kind == "bool":
        return "true" if checked else "false"
    if param.kind == "float":
        return repr(float(checked))
    text = os.fspath(checked) if param.kind == "file" else str(checked)
    if text.lstrip().startswith("["):
        raise ValueError(f"{param.name}: a value starting with '[' is read as a JSON list; got {text!r}")
    return text


@dataclass(frozen=True)
class Outcome:
    """What a run made: the computed Dataset ``ds`` (as saved), the file's ``path``, the verdict
    rows, the figure's path (None when not drawn), the cells kept from earlier runs and the wall
    seconds and label of the computation."""

    ds: object
    path: Path
    rows: list
    figure: Path | None
    kept: int
    wall: float
    scheduler: str


class RunInterrupted(KeyboardInterrupt):
    """A run stopped by Ctrl-C or a terminating signal: ``kept`` of ``total`` cells are kept in
    ``folder`` and the same call resumes."""

    def __init__(self, kept, total, folder):
        super().__init__(f"{kept} of {total} cells kept in {folder}")
        self.kept, self.total, self.folder = kept, total, folder


def execute(experiment, config, out_dir, *, name=None, force=False, fresh=False, chunks=None, scheduler=None,
            workers=None, address=None, quiet=False, verbose=False, figure=True, call=None, resamples=None,
            choose_scheduler=None, terminated=None) -> Outcome:
    """Compute ``experiment`` under ``config`` into ``out_dir/NAME.nc`` (``name`` default: the
    experiment's) and its figure beside it (``figure``), keeping every finished cell in
    ``out_dir/.EXP.cells``, then judge it (printing the tables unless ``quiet``).

    Refused before any work: a file under the path made by another experiment or configuration
    (unless ``force``). ``fresh`` discards the kept cells first. ``scheduler`` (a local one),
    ``workers`` (a new LocalCluster) or ``address`` (an existing cluster) pick where the cells run;
    with none, the experiment's declared local scheduler, through ``choose_scheduler(scheduler) ->
    (scheduler, why)`` when given (the command line's rule for small sweeps). An interruption raises
    :class:`RunInterrupted` with the count of kept cells, as does any failure once ``terminated()``
    (the command line's: a SIGTERM arrived) says the run is being ended."""
    from .engine.cellstore import CellStore
    from .engine.sweep import build, check_chunks

    name = name or experiment.name
    path = Path(out_dir) / f"{name}.nc"
    if not force:
        check_replaceable(path, experiment.name, config)  # before fresh discards any kept cell
    chunks = check_chunks(experiment, config, chunks)
    ensure_writable(out_dir)  # after every check of the input (a bad one creates nothing), before any work
    store = CellStore(Path(out_dir) / f".{experiment.name}.cells", experiment, config, fresh=fresh)
    lazy = build(experiment, config, chunks=chunks, store=store, call=call)
    from .engine.execution import compute   # the schedulers: imported once the input is accepted
    n_cells, kept = lazy.attrs["n_cells"], store.count()
    if not quiet:
        print(f"{experiment.name}: profile {config.profile}, {n_cells} cells"
              + (f" ({kept} kept from earlier runs in {store.folder}, {n_cells - kept} to compute)" if kept else ""),
              flush=True)
    try:
        local = scheduler or (None if workers or address else experiment.scheduler)
        if local == "processes" and scheduler is None and choose_scheduler is not None:
            local, why = choose_scheduler(local)
            if not quiet:
                print(f"local scheduler: {local}: {why}", flush=True)
        ds, wall, label = compute(lazy, scheduler=local, workers=workers, address=address, progress=not quiet,
                                  verbose=verbose, store=store)
        ds.attrs["cell_seconds"] = json.dumps(store.cell_seconds())   # what each cell cost when computed
        ds.attrs["cell_exponentials"] = json.dumps(store.cell_exponentials())
        record_cell_kernels(ds, store.blas_kernels())
        save(ds, path)
        if not quiet:
            print(f"wrote {path} in {wall:.1f} s ({label})\n")
        drawn = path.with_suffix(".png") if figure else None
        rows = judge(ds, drawn, quiet=quiet, resamples=resamples)
    except BaseException as exc:
        # a failure that follows a terminating signal (a pool worker killed by the same signal) is the termination
        if isinstance(exc, KeyboardInterrupt) or (terminated is not None and terminated()):
            raise RunInterrupted(store.count(), n_cells, store.folder) from None
        raise
    return Outcome(ds, path, rows, drawn, kept, wall, label)


def judge(ds, figure=None, quiet=False, resamples=None):
    """Analyse a results Dataset: draw its figure at ``figure`` (None: none) and compute its fit
    and verdict tables, printed unless ``quiet``; returns the verdict rows. The analysis runs
    either way: ``quiet`` only silences it, so a failing analysis fails the run with or without
    it. ``resamples``: of each verdict's robustness (default: the analysis module's)."""
    from .analysis.report import analysis_for, fit_tables, verdicts
    from .analysis.tables import to_text
    from .analysis.verdicts import calibration_note, format_table

    module = analysis_for(ds)
    if figure is not None:
        figure = Path(figure)
        # drawn beside its final name and renamed, as the results file is (storage.save): a full disk or
        # an interruption while matplotlib writes never leaves a truncated PNG under the final name
        tmp = figure.with_name(f".{figure.stem}.{os.getpid()}.partial.png")
        try:
            module.figure(ds, tmp)
            os.replace(tmp, figure)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
    fits = to_text(fit_tables(ds, module))
    rows = verdicts(ds, module, resamples=resamples)
    note = calibration_note(ds)
    if not quiet:
        print(fits)
        print()
        print(format_table(rows))
        if note:
            print(note)
        if figure is not None:
            print(f"\nfigure: {figure}")
    return rows


def run(experiment, profile="quick", out=None, *, name=None, scheduler=None, workers=None, address=None,
        chunks=None, force=False, fresh=False, figure=True, quiet=True, verbose=False, **params):
    """Run ``experiment`` (an experiment or its name or short name, as ``sfxlin list`` shows them)
    at ``profile`` with ``params`` (keyword parameters as Python values, ``d=[2, 4]``, each checked
    as ``--set`` checks it) into ``out`` (default: the command line's rule, ``runs/PROFILE``, or the
    paper results' folder for the paper profile without parameters), and return the computed
    Dataset, saved there with its figure (``figure=False``: none).

    The Python face of ``sfxlin run``, with the same cell store (a run stopped midway, by Ctrl-C or
    an error, keeps its finished cells and the same call computes only the rest), the same refusal
    to replace a file of another configuration (``force=True`` replaces it, ``name`` writes
    ``NAME.nc`` beside it) and the same verdicts (``ds.sfx.verdicts()``; ``quiet=False`` prints
    the progress and every table as the command does). ``scheduler`` (``"threads"``,
    ``"processes"``, ``"synchronous"``), ``workers`` (a new LocalCluster of that many processes) or
    ``address`` (an existing dask cluster) pick where the cells run; ``chunks``: cells per dask
    task along grid dims. A KeyboardInterrupt says how many cells were kept."""
    from .engine.experiments import get

    exp = get(experiment) if isinstance(experiment, str) else experiment
    table = {p.name: p for p in exp.params}
    unknown = sorted(set(params) - set(table))
    if unknown:
        raise TypeError(f"run() got unknown parameter(s) {unknown} of {exp.name}; known: {sorted(table)}")
    overrides = [f"{key}={override_text(table[key], value)}" for key, value in params.items()]
    config = exp.configure(profile, overrides)
    out_dir = Path(out) if out is not None else default_out(profile, overrides)
    call = f"sfxlin.run({exp.name!r}, profile={profile!r}" + "".join(f", {k}={v!r}" for k, v in params.items()) + ")"
    return execute(exp, config, out_dir, name=name, force=force, fresh=fresh, chunks=chunks, scheduler=scheduler,
                   workers=workers, address=address, quiet=quiet, verbose=verbose, figure=figure, call=call).ds
