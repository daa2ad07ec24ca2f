"""The ``sfxlin`` command: run experiments, benchmark the engines, inspect results files.

    sfxlin run c1 [--profile quick|paper] [--set KEY=VALUE ...] [--out DIR] [--name NAME] [--force]
                  [--workers N | --scheduler ADDR]
    sfxlin bench c1 | c3 [--protocol [--steps N] [--heldout-every N]]
    sfxlin list
    sfxlin report [--results DIR] [--out FILE.html|FILE.md]
    sfxlin info FILE

Errors (bad input, unreadable files, a cell that failed) print one line ``sfxlin: error: ...``
and exit with status 2, without a traceback; the exit status never depends on ``--quiet``.
Ctrl-C exits with status 130 and, during a run, says how many cells are kept and which command
resumes.
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

from .experiments import ENV, experiments
from .experiments import get as get_experiment
from .storage import ResultsError, ensure_writable, results_path, save

__all__ = ["main"]

BENCHES = {"c1": "sfxlin.benchmarks.c1:bench_c1", "c3": "sfxlin.benchmarks.c3:bench_c3"}


def _positive_int(text):
    """argparse type of ``--workers``: refused with the usage line, before any work starts."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _file_stem(text):
    """argparse type of ``--name``: a plain file stem (``NAME.nc`` and ``NAME.png`` are written)."""
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", text) or text.lower().endswith((".nc", ".png")):
        raise argparse.ArgumentTypeError(f"expected a file stem of letters, digits, '.', '_' or '-', without folder "
                                         f"or suffix (NAME.nc and NAME.png are written), got {text!r}")
    return text


def _parse_chunks(items):
    chunks = {}
    for item in items or []:
        dim, _, size = item.partition("=")
        if not size.isdigit():
            raise ValueError(f"--chunks expects DIM=N with N a positive integer, got {item!r}")
        chunks[dim] = int(size)
    return chunks


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during a run; the message says what is kept and which command resumes."""


def check_replaceable(path, experiment, config):
    """Refuse, before any work, to replace a results file made by another experiment or under
    another configuration (its ``experiment`` and ``config`` attrs), or one that is not a results
    file at all. The same configuration (a rerun) may replace it."""
    path = Path(path)
    if not path.exists():
        return
    import xarray as xr

    hint = "--force replaces it, --name NAME writes NAME.nc beside it"
    try:
        with xr.open_dataset(path, engine="netcdf4") as old:
            made_by, made_with = old.attrs.get("experiment"), json.loads(old.attrs["config"])
    except Exception as exc:  # netCDF4/HDF5 raise OSError, ValueError, KeyError for foreign files
        raise ResultsError(f"{path} exists and is not a results file of sfxlin "
                           f"({type(exc).__name__}: {exc}); {hint}") from None
    if made_by != experiment:
        raise ResultsError(f"{path} holds a {made_by} run, not {experiment}; {hint}")
    config = json.loads(config.to_json())
    if made_with != config:
        changed = "; ".join(f"{key}: {json.dumps(made_with.get(key))} -> {json.dumps(config.get(key))}"
                            for key in sorted(set(made_with) | set(config)) if made_with.get(key) != config.get(key))
        raise ResultsError(f"{path} holds a run under another configuration ({changed}); {hint}")


def resume_command(argv):
    """The command line that resumes an interrupted run: the same one, less ``--fresh`` (which
    would discard the cells kept so far; argparse also accepts it abbreviated)."""
    return shlex.join(["sfxlin", *(a for a in argv if not (len(a) > 3 and "--fresh".startswith(a)))])


def report(ds, figure, quiet=False):
    """Analyse a results Dataset: save its figure at ``figure`` and compute its fit and verdict
    tables, printed unless ``quiet``. The analysis runs either way: ``quiet`` only silences it,
    so a failing analysis fails the command with or without ``--quiet``."""
    from .analysis.report import analysis_for
    from .analysis.verdicts import calibration_note, format_table

    module = analysis_for(ds)
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
    fits = module.fit_table(ds)
    verdicts = format_table(module.verdicts(ds))
    note = calibration_note(ds)
    if not quiet:
        print(fits)
        print()
        print(verdicts)
        if note:
            print(note)
        print(f"\nfigure: {figure}")


def cmd_run(args):
    from .cellstore import CellStore
    from .execution import compute
    from .sweep import build

    experiment = get_experiment(args.experiment)
    config = experiment.configure(args.profile, args.set)
    out_dir = Path(args.out or ("datasets" if args.profile == "paper" and not args.set else f"runs/{args.profile}"))
    path = out_dir / f"{args.name or experiment.name}.nc"
    if not args.force:
        check_replaceable(path, experiment.name, config)  # before --fresh discards any kept cell
    store = CellStore(out_dir / f".{experiment.name}.cells", experiment, config, fresh=args.fresh)
    lazy = build(experiment, config, chunks=_parse_chunks(args.chunks), store=store,
                 call=shlex.join(["sfxlin", *args.argv]))
    ensure_writable(out_dir)  # after every check of the command line (a bad one creates nothing), before any work
    n_cells = lazy.attrs["n_cells"]
    if not args.quiet:
        kept = store.count()
        print(f"{experiment.name}: profile {args.profile}, {n_cells} cells"
              + (f" ({kept} kept from earlier runs in {store.folder}, {n_cells - kept} to compute)"
                 if kept else ""), flush=True)
    try:
        local = args.local_scheduler or (None if args.workers or args.scheduler else experiment.scheduler)
        ds, wall, label = compute(lazy, scheduler=local, workers=args.workers,
                                  address=args.scheduler, progress=not args.quiet, verbose=args.verbose)
        save(ds, path)
        if not args.quiet:
            print(f"wrote {path} in {wall:.1f} s ({label})\n")
        report(ds, path.with_suffix(".png"), quiet=args.quiet)
    except KeyboardInterrupt:
        raise Interrupted(f"{store.count()} of {n_cells} cells kept in {store.folder}; "
                          f"the same command resumes: {resume_command(args.argv)}") from None


# glibc returns large freed blocks to the OS by default, so a reference that allocates fresh
# multi-MB temporaries every step pays page faults each time (2x its best time here). Benchmarks
# run with these settings, in the same process for both arms: the reference at its best.
BENCH_MALLOC = {"MALLOC_MMAP_THRESHOLD_": "1000000000", "MALLOC_TRIM_THRESHOLD_": "2000000000"}


def cmd_bench(args):
    target = BENCHES.get(args.experiment)
    if target is None:
        raise ValueError(f"no benchmark {args.experiment!r}; expected one of {sorted(BENCHES)}")
    if args.protocol:
        if args.experiment != "c3":
            raise ValueError(f"--protocol: only the c3 protocol has an end-to-end benchmark, got {args.experiment!r}")
        from .benchmarks.protocol import bench_protocol

        bench_protocol(args.steps, args.heldout_every)
        return 0
    if args.steps is not None or args.heldout_every is not None:
        raise ValueError("--steps and --heldout-every go with --protocol")
    if any(os.environ.get(k) != v for k, v in BENCH_MALLOC.items()):
        env = {**os.environ, **BENCH_MALLOC}
        return subprocess.call([sys.executable, "-m", "sfxlin.cli", "bench", args.experiment], env=env)
    print("(allocator: " + ", ".join(f"{k}={v}" for k, v in BENCH_MALLOC.items()) + ", for both arms)")
    mod, _, fn = target.partition(":")
    getattr(importlib.import_module(mod), fn)()


def cmd_report(args):
    from .analysis.report import write_report

    html_path, md_path = write_report(args.results, args.out)
    print(f"wrote {html_path} and {md_path}")


def cmd_reproduce(args):
    """Every experiment found (sfxlin list) at its paper profile into ``--out`` (replacing the
    files there: regenerating them is the point), then the report."""
    for experiment in experiments().values():
        if "paper" not in experiment.profiles:
            print(f"{experiment.name}: no paper profile, skipped")
            continue
        status = main(["run", experiment.name, "--profile", "paper", "--out", str(args.out), "--force"]
                      + (["--quiet"] if args.quiet else []))
        if status:
            return status
    return main(["report", "--results", str(args.out), "--out", str(Path(args.out) / "report.html")])


def cmd_list(args):
    for experiment in experiments().values():
        print(f"{experiment.short or experiment.name} ({experiment.name}): {experiment.description}")
        print(f"  profiles: {', '.join(experiment.profiles)}; local scheduler: {experiment.scheduler or 'threads'}")
        for p in experiment.params:
            values = "; ".join(f"{name}: {_plain(p.default(name))}" for name in experiment.profiles)
            print(f"  {p.name:18s} {p.doc} [{p.rule()}]; {values}")


def _plain(value):
    return json.dumps(value) if isinstance(value, (list, tuple)) else value


def cmd_info(args):
    """Describe any netCDF file: dims, coordinates, variables, provenance; for a file sfxlin did
    not write (or of another schema), what the analysis would need."""
    import xarray as xr

    from .schema import SCHEMA_VERSION

    path = results_path(args.file)
    try:
        ds = xr.load_dataset(path, engine="netcdf4")
    except Exception as exc:  # netCDF4/HDF5 raise OSError, ValueError, KeyError for damaged files
        raise ResultsError(f"{args.file} is not a readable netCDF file ({type(exc).__name__}: {exc})") from None
    print(f"{args.file}: experiment {ds.attrs.get('experiment')!r}, profile {ds.attrs.get('profile')!r}")
    print("dims: " + ", ".join(f"{k}={v}" for k, v in ds.sizes.items()))
    for name, coord in ds.coords.items():
        values = coord.values.tolist()
        shown = values if len(values) <= 12 else values[:6] + ["..."] + values[-3:]
        print(f"  coord {name}: {shown}")
    for name, var in ds.data_vars.items():
        print(f"  {name}{tuple(var.dims)}: {var.attrs.get('long_name', '')}")
    for key in ("created", "wall_seconds", "scheduler", "git_revision", "sfxlin_version", "history", "config"):
        if key in ds.attrs:
            print(f"  {key}: {ds.attrs[key]}")
    for line in analysis_needs(ds, SCHEMA_VERSION):
        print(line)


def analysis_needs(ds, schema_version):
    """Lines saying what ``sfxlin report`` / ``.sfx`` would need that this file lacks (none for
    a complete results file)."""
    missing = [k for k in ("experiment", "analysis", "criteria", "config") if k not in ds.attrs]
    out = []
    if missing:
        out.append(f"not analysable as it is: attrs {missing} are missing (a results file of sfxlin carries "
                   "them: build() writes them)")
    version = ds.attrs.get("sfxlin_schema_version")
    version = version.item() if hasattr(version, "item") else version  # netCDF gives numpy scalars
    if version is None or str(version) != str(schema_version):
        out.append(f"schema version {version!r}; this sfxlin reads version {schema_version}")
    name = ds.attrs.get("experiment")
    if name is not None:
        try:
            experiment = get_experiment(name)
        except ValueError:
            out.append(f"no experiment {name!r} is known here (set ${ENV} to its pipeline module)")
        else:
            absent = [v.name for v in experiment.variables if v.name not in ds.data_vars]
            if absent:
                out.append(f"variables the {name} analysis reads that the file lacks: {absent}")
    return out


def _md(text):
    return text.replace("|", "\\|")


def schema_markdown():
    """Markdown of every experiment's file schema, generated from the declarations."""
    from .schema import COORDS, SCHEMA_VERSION

    lines = ["# datasets", "",
             "Results of the paper profiles (`make reproduce`), one netCDF file per experiment, with the",
             "figure drawn from it beside. Generated by `sfxlin schema` from the variable declarations",
             f"(schema version {SCHEMA_VERSION}); a test keeps this file in step with the code.", "",
             "Every file carries the provenance attrs `experiment`, `profile`, `overrides`, `config` (JSON of",
             "every parameter: `sfxlin run EXP --profile P` with these values reruns it), `sfxlin_version`,",
             "`sfxlin_schema_version`, `git_revision`, `library_versions`, `created` (UTC), `wall_seconds`,",
             "`scheduler`, `history`, and `criteria` (JSON: the predeclared criteria of the verdict table).", "",
             "## Coordinates", "", "| dim | long_name | units | description |", "|---|---|---|---|"]
    for dim, attrs in COORDS.items():
        lines.append(f"| `{dim}` | {_md(attrs['long_name'])} | {attrs.get('units', '')} | {_md(attrs['description'])} |")
    for experiment in experiments().values():
        lines += ["", f"## `{experiment.name}.nc`", "", experiment.description, "",
                  "| variable | dims | long_name | description |", "|---|---|---|---|"]
        for var in experiment.variables:
            dims = ", ".join(var.dims)
            lines.append(f"| `{var.name}` | ({dims}) | {_md(var.long_name)} | {_md(var.description)} |")
    return "\n".join(lines) + "\n"


def cmd_schema(args):
    print(schema_markdown(), end="")


def parser():
    p = argparse.ArgumentParser(prog="sfxlin", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="compute an experiment, save it as netCDF, print fits and verdicts")
    run.add_argument("experiment", help="an experiment's name or short name (sfxlin list)")
    run.add_argument("--profile", default="quick", help="quick (seconds) or paper (the reference protocol)")
    run.add_argument("--out", help="output folder (default: datasets/ for the paper profile without --set, "
                                   "runs/PROFILE/ otherwise, so a quick run never replaces the paper results)")
    where = run.add_mutually_exclusive_group()
    where.add_argument("--workers", type=_positive_int, help="start a dask.distributed LocalCluster with N workers")
    where.add_argument("--scheduler", help="address of an existing dask.distributed scheduler (tcp://host:8786)")
    where.add_argument("--local-scheduler", choices=["threads", "synchronous", "processes"],
                       help="a local dask scheduler (default: the experiment's, threads on all cores unless it "
                            "declares processes: sfxlin list)")
    run.add_argument("--set", action="append", metavar="KEY=VALUE",
                     help="override a parameter of the profile (lists comma-separated), e.g. --set d=2,3")
    run.add_argument("--chunks", action="append", metavar="DIM=N", help="cells per dask task along a grid dim")
    run.add_argument("--name", type=_file_stem,
                     help="file stem of the results: NAME.nc and NAME.png in --out (default: the experiment's "
                          "full name, e.g. c1_limit)")
    run.add_argument("--force", action="store_true",
                     help="replace a results file of the same name made under another configuration (by "
                          "default refused before any work; a rerun of the same configuration replaces it)")
    run.add_argument("--fresh", action="store_true",
                     help="discard the kept cells of this experiment in --out (by default a cell computed by an "
                          "earlier or interrupted run with the same inputs and code is reused)")
    talk = run.add_mutually_exclusive_group()
    talk.add_argument("--quiet", action="store_true",
                      help="no progress bar or tables (the analysis still runs: same exit status)")
    talk.add_argument("--verbose", action="store_true", help="also one line per finished block of cells")
    run.set_defaults(func=cmd_run)
    bench = sub.add_parser("bench", help="benchmark an engine against its reference, ratio in one run")
    bench.add_argument("experiment", help=f"one of {sorted(BENCHES)}")
    bench.add_argument("--protocol", action="store_true",
                       help="c3 only: the paper protocol end to end (sfxlin run) against a seed-style per-L loop, "
                            "same tasks, both wall times and their ratio")
    bench.add_argument("--steps", type=_positive_int, help="with --protocol: n_steps of both arms (shorter run)")
    bench.add_argument("--heldout-every", type=_positive_int, help="with --protocol: heldout_every of both arms")
    bench.set_defaults(func=cmd_bench)
    lst = sub.add_parser("list", help="experiments, their parameters and profiles")
    lst.set_defaults(func=cmd_list)
    rep = sub.add_parser("report", help="one self-contained HTML page (and Markdown) of every claim")
    rep.add_argument("--results", default="datasets", help="folder of results files (default: datasets)")
    rep.add_argument("--out", default="datasets/report.html",
                     help="FILE.html (the Markdown goes beside it as FILE.md) or FILE.md (the HTML beside it)")
    rep.set_defaults(func=cmd_report)
    rep = sub.add_parser("reproduce", help="every experiment at its paper profile, then the report")
    rep.add_argument("--out", default="datasets", help="folder of the results (default: datasets)")
    rep.add_argument("--quiet", action="store_true", help="no progress bars or tables")
    rep.set_defaults(func=cmd_reproduce)
    schema = sub.add_parser("schema", help="markdown schema of every results file (datasets/README.md)")
    schema.set_defaults(func=cmd_schema)
    info = sub.add_parser("info", help="dims, coordinates, variables and provenance of a results file")
    info.add_argument("file")
    info.set_defaults(func=cmd_info)
    return p


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser().parse_args(argv)
    args.argv = argv
    try:
        status = args.func(args)
    except BrokenPipeError:  # output piped into head & co.
        return 0
    except KeyboardInterrupt as exc:  # Interrupted: "; N of M cells kept in ...; the same command resumes: ..."
        print("sfxlin: interrupted" + (f"; {exc}" if str(exc) else ""), file=sys.stderr)
        return 130
    except (ValueError, TypeError, ResultsError, RuntimeError, OSError) as exc:
        print(f"sfxlin: error: {exc}", file=sys.stderr)
        return 2
    return status or 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
