"""The ``sfxlin`` command: run experiments, benchmark the engines, inspect results files.

    sfxlin run c1 [--profile quick|paper] [--set KEY=VALUE ...] [--out DIR] [--name NAME] [--force]
                  [--workers N | --scheduler ADDR]
    sfxlin bench c1
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

from .storage import ResultsError, ensure_writable, open_results, provenance, save

__all__ = ["main"]

EXPERIMENTS = {"c1": "c1_limit", "c2": "c2_concentration", "c2_threshold": "c2_threshold", "c3": "c3_transfer"}
BENCHES = {"c1": "sfxlin.bench:bench_c1", "c3": "sfxlin.bench_c3:bench_c3"}


def pipeline(name):
    """The pipeline module of an experiment (short name ``c1`` or full name ``c1_limit``)."""
    full = EXPERIMENTS.get(name, name)
    if full not in EXPERIMENTS.values():
        raise ValueError(f"unknown experiment {name!r}; expected one of {sorted(EXPERIMENTS)}")
    return importlib.import_module(f"sfxlin.pipelines.{full}")


def _parse_value(text, like, key):
    """Parse ``text`` as the type of the profile's default ``like`` (lists: comma-separated)."""
    if isinstance(like, list):
        return [_parse_value(item, like[0] if like else 0.0, key) for item in text.split(",") if item != ""]
    kind = type(like)
    try:
        if kind is bool:
            if text.lower() not in ("true", "false", "1", "0"):
                raise ValueError
            return text.lower() in ("true", "1")
        if kind is int:
            return int(text)
        if kind is float:
            return float(text)
        return text
    except ValueError:
        raise ValueError(f"--set {key}: {text!r} is not a valid {kind.__name__}") from None


def config_for(module, profile, overrides=()):
    """The profile's configuration with ``--set KEY=VALUE`` overrides, validated."""
    if profile not in module.PROFILES:
        raise ValueError(f"unknown profile {profile!r} for {module.NAME}; expected one of {sorted(module.PROFILES)}")
    config = json.loads(json.dumps(module.PROFILES[profile]))  # a deep, JSON-clean copy
    for item in overrides or ():
        key, sep, text = item.partition("=")
        if not sep:
            raise ValueError(f"--set expects KEY=VALUE, got {item!r}")
        if key not in module.PARAMETERS:
            raise ValueError(f"--set {key}: unknown parameter of {module.NAME}; known: {sorted(module.PARAMETERS)}")
        config[key] = _parse_value(text, config[key], key)
    module.validate(config)
    return config


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
    from .analysis.verdicts import format_table

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
    if not quiet:
        print(fits)
        print()
        print(verdicts)
        print(f"\nfigure: {figure}")


def cmd_run(args):
    from .cellstore import CellStore
    from .execution import compute
    from .sweep import build

    module = pipeline(args.experiment)
    config = config_for(module, args.profile, args.set)
    out_dir = Path(args.out or ("datasets" if args.profile == "paper" and not args.set else f"runs/{args.profile}"))
    path = out_dir / f"{args.name or module.NAME}.nc"
    if not args.force:
        check_replaceable(path, module.NAME, config)  # before --fresh discards any kept cell
    store = CellStore(out_dir / f".{module.NAME}.cells", module.EXPERIMENT, config, fresh=args.fresh)
    lazy = build(module.EXPERIMENT, config, chunks=_parse_chunks(args.chunks), store=store)
    ensure_writable(out_dir)  # after every check of the command line (a bad one creates nothing), before any work
    n_cells = lazy.attrs["n_cells"]
    if not args.quiet:
        kept = store.count()
        print(f"{module.NAME}: profile {args.profile}, {n_cells} cells"
              + (f" ({kept} kept from earlier runs in {store.folder}, {n_cells - kept} to compute)"
                 if kept else ""), flush=True)
    try:
        ds, wall, label = compute(lazy, scheduler=args.local_scheduler, workers=args.workers,
                                  address=args.scheduler, progress=not args.quiet, verbose=args.verbose)
        ds.attrs.update(provenance(module.NAME, args.profile, config, wall, label))
        ds.attrs["overrides"] = json.dumps(args.set or [])
        ds.attrs["criteria"] = json.dumps(module.CRITERIA)
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


def cmd_list(args):
    for short, full in EXPERIMENTS.items():
        module = pipeline(full)
        print(f"{short} ({full}): {module.EXPERIMENT.description}")
        print(f"  profiles: {', '.join(module.PROFILES)}")
        for key, doc in module.PARAMETERS.items():
            values = {p: module.PROFILES[p][key] for p in module.PROFILES}
            print(f"  {key:12s} {doc}; " + "; ".join(f"{p}: {v}" for p, v in values.items()))


def cmd_info(args):
    ds = open_results(args.file)
    print(f"{args.file}: experiment {ds.attrs.get('experiment')!r}, profile {ds.attrs.get('profile')!r}")
    print("dims: " + ", ".join(f"{k}={v}" for k, v in ds.sizes.items()))
    for name, coord in ds.coords.items():
        values = coord.values.tolist()
        shown = values if len(values) <= 12 else values[:6] + ["..."] + values[-3:]
        print(f"  coord {name}: {shown}")
    for name, var in ds.data_vars.items():
        print(f"  {name}{tuple(var.dims)}: {var.attrs.get('long_name', '')}")
    for key in ("created", "wall_seconds", "scheduler", "git_revision", "sfxlin_version", "history", "config"):
        print(f"  {key}: {ds.attrs.get(key)}")


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
    for full in EXPERIMENTS.values():
        module = pipeline(full)
        lines += ["", f"## `{full}.nc`", "", module.EXPERIMENT.description, "",
                  "| variable | dims | long_name | description |", "|---|---|---|---|"]
        for var in module.VARIABLES:
            dims = ", ".join(var.dims)
            lines.append(f"| `{var.name}` | ({dims}) | {_md(var.long_name)} | {_md(var.description)} |")
    return "\n".join(lines) + "\n"


def cmd_schema(args):
    print(schema_markdown(), end="")


def parser():
    p = argparse.ArgumentParser(prog="sfxlin", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="compute an experiment, save it as netCDF, print fits and verdicts")
    run.add_argument("experiment", help=f"one of {sorted(EXPERIMENTS)}")
    run.add_argument("--profile", default="quick", help="quick (seconds) or paper (the reference protocol)")
    run.add_argument("--out", help="output folder (default: datasets/ for the paper profile without --set, "
                                   "runs/PROFILE/ otherwise, so a quick run never replaces the paper results)")
    where = run.add_mutually_exclusive_group()
    where.add_argument("--workers", type=_positive_int, help="start a dask.distributed LocalCluster with N workers")
    where.add_argument("--scheduler", help="address of an existing dask.distributed scheduler (tcp://host:8786)")
    where.add_argument("--local-scheduler", choices=["threads", "synchronous", "processes"],
                       help="a local dask scheduler (default: threads on all cores)")
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
    bench.set_defaults(func=cmd_bench)
    lst = sub.add_parser("list", help="experiments, their parameters and profiles")
    lst.set_defaults(func=cmd_list)
    rep = sub.add_parser("report", help="one self-contained HTML page (and Markdown) of every claim")
    rep.add_argument("--results", default="datasets", help="folder of results files (default: datasets)")
    rep.add_argument("--out", default="datasets/report.html",
                     help="FILE.html (the Markdown goes beside it as FILE.md) or FILE.md (the HTML beside it)")
    rep.set_defaults(func=cmd_report)
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
