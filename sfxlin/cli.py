"""The ``sfxlin`` command: run experiments, benchmark the engines, inspect results files.

    sfxlin check [--out DIR] [--fresh] [--resamples N]
    sfxlin run EXP [--profile quick|paper] [--set KEY=VALUE ...] [--out DIR] [--name NAME] [--force]
                   [--fresh] [--workers N | --scheduler ADDR | --local-scheduler S] [--chunks DIM=N]
                   [--quiet | --verbose] [--no-figure] [--strict] [--plan]
    sfxlin rerun FILE.nc [--out DIR] [--name NAME] [the options of run but --profile and --set]
    sfxlin merge A.nc B.nc [...] -o C.nc
    sfxlin cells OUT [--experiment EXP] [--prune [--all]]
    sfxlin bench c1 | c3 [--protocol [--steps N] [--heldout-every N] | --d 3,8,16]
    sfxlin list [EXP]
    sfxlin report [--results DIR] [--out FILE.html|FILE.md] [--strict]
    sfxlin reproduce [EXP ...] [--profile P] [--out DIR] [--quiet]
    sfxlin schema
    sfxlin info FILE|NAME
    sfxlin verify FILE|NAME [...] [--cells N|all] [--most-amplified K] [--rtol R]
    sfxlin --version

Default folders are relative to the current working directory (``storage.FOLDER_RULE``):
``./datasets``, or ``$SFXLIN_RESULTS`` when set, for the paper results; ``./runs/PROFILE`` for
other runs. A report goes beside the results it reads unless ``--out`` says otherwise.

``sfxlin check`` is the command to run after installing: every experiment's quick profile (a
smoke test, about a minute on 2 cores), one line per experiment, the verdict table of any FAIL.

Exit status: 0; 1 (:data:`FAILED`) when a verdict FAILs, for ``check`` always and for ``run``,
``rerun`` and ``report`` with ``--strict`` (INCONCLUSIVE and NOT JUDGED never do). Errors (bad
input, unreadable files, a cell that failed) print one line ``sfxlin: error: ...`` and exit with
status 2, without a traceback; the exit status never depends on ``--quiet``.
Ctrl-C exits with status 130, SIGTERM (SLURM, ``timeout``, ``kill``) with 143; during a run,
both say how many cells are kept and which command resumes. A reader that goes away (``| head``)
never stops a command: the rest of its output is dropped, and a run still writes its file.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from ._version import __version__
from .engine.experiments import ENV, experiments
from .engine.experiments import get as get_experiment
from .runs import default_out
from .engine.storage import FOLDER_RULE, RESULTS_ENV, ResultsError, changed_input_files, default_results_dir, results_path

__all__ = ["main"]

BENCHES = {"c1": "sfxlin.benchmarks.c1:bench_c1", "c3": "sfxlin.benchmarks.c3:bench_c3"}

#: exit status of ``sfxlin check``, and of ``run`` / ``rerun`` / ``report --strict``, when a verdict FAILs
FAILED = 1


def _int_at_least(low: int, what: str):
    """An argparse type: an integer >= ``low``, refused with the usage line before any work starts."""

    def parse(text):
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
        return value

    return parse


#: ``--workers``, ``--steps``, ``--heldout-every``; ``--resamples``
_positive_int = _int_at_least(1, "a positive integer")


def _cells(text):
    """``sfxlin verify --cells``: a positive integer, or ``all`` (None: every cell)."""
    return None if text == "all" else _int_at_least(1, "a positive integer or 'all'")(text)


def _dims(text):
    """The covariate dimensions of ``sfxlin bench c3 --d 3,8,16``; ValueError naming the workloads."""
    from .benchmarks.c3 import DIM_WORKLOADS

    try:
        ds = [int(x) for x in text.split(",")]
    except ValueError:
        raise ValueError(f"--d: expected comma-separated integers such as 3,8,16, got {text!r}") from None
    unknown = [d for d in ds if d not in DIM_WORKLOADS]
    if unknown:
        raise ValueError(f"--d: no workload for d = {unknown}; the benchmark has d in {sorted(DIM_WORKLOADS)}")
    return ds
_non_negative_int = _int_at_least(0, "an integer >= 0")


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
    """Ctrl-C or SIGTERM during a run; the message says what is kept and which command resumes,
    ``status`` is the exit status (130 for Ctrl-C, 143 for SIGTERM)."""

    def __init__(self, message="", status=130):
        super().__init__(message)
        self.status = status


class Terminated(KeyboardInterrupt):
    """SIGTERM received: handled as Ctrl-C is, with exit status 143 (128 + 15)."""

    status = 128 + signal.SIGTERM


#: set by the SIGTERM handler: a failure that follows it (a pool worker killed by the same
#: signal) is reported as the termination it is
TERMINATED = threading.Event()


def _raise_terminated(signum, frame):
    TERMINATED.set()
    raise Terminated()


@contextlib.contextmanager
def sigterm_as_interrupt():
    """While inside, SIGTERM raises :class:`Terminated` in the main thread (as SIGINT raises
    KeyboardInterrupt); the previous handler is restored on leaving. Only the main thread can
    install a handler: elsewhere this does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


class ClosedPipeSafe:
    """A text stream whose reader may go away (``sfxlin run ... | head -3``): the first
    BrokenPipeError points the stream's file descriptor at ``os.devnull`` and drops the text, so
    the rest of the output, and the interpreter's last flush, go nowhere and the command carries
    on. Everything else is the wrapped stream's."""

    def __init__(self, stream):
        self.stream = stream
        self.dropping = False  # a stream without a file descriptor to redirect: drop what follows

    def write(self, text):
        """Write ``text`` (dropped once the reader is gone); returns its length."""
        if not self.dropping:
            try:
                self.stream.write(text)
            except BrokenPipeError:
                self._reader_gone()
        return len(text)

    def flush(self):
        if not self.dropping:
            try:
                self.stream.flush()
            except BrokenPipeError:
                self._reader_gone()

    def _reader_gone(self):
        try:
            fd = self.stream.fileno()
        except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is both
            self.dropping = True
            return
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, fd)
        os.close(devnull)
        with contextlib.suppress(OSError, ValueError):
            self.stream.flush()  # what is left in the buffer goes to os.devnull

    def __getattr__(self, name):
        return getattr(self.stream, name)


@contextlib.contextmanager
def output_never_stops_work():
    """While inside, ``sys.stdout`` and ``sys.stderr`` are :class:`ClosedPipeSafe`; both are
    flushed (through it) and restored on leaving."""
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = (s if s is None or isinstance(s, ClosedPipeSafe) else ClosedPipeSafe(s) for s in saved)
    try:
        yield
    finally:
        for stream in (sys.stdout, sys.stderr):
            if stream is not None:
                stream.flush()
        sys.stdout, sys.stderr = saved


def resume_command(argv):
    """The command line that resumes an interrupted run: the same one, less ``--fresh`` (which
    would discard the cells kept so far; argparse also accepts it abbreviated)."""
    return shlex.join(["sfxlin", *(a for a in argv if not (len(a) > 3 and "--fresh".startswith(a)))])


def strict_status(rows, what) -> int:
    """``--strict``: :data:`FAILED` when a verdict among ``rows`` FAILs (saying which on stderr), else 0."""
    from .analysis.verdicts import FAIL

    failed = [r.id for r in rows if r.verdict == FAIL]
    if not failed:
        return 0
    print(f"sfxlin: --strict: {len(failed)} verdict{'s' * (len(failed) > 1)} FAIL in {what} ({', '.join(failed)}): "
          f"exit status {FAILED}", file=sys.stderr)
    return FAILED


def cmd_run(args):
    experiment = get_experiment(args.experiment)
    config = experiment.configure(args.profile, args.set)
    out_dir = Path(args.out) if args.out else default_out(args.profile, args.set)
    name = args.name or experiment.name
    if getattr(args, "plan", False):
        from .engine.plan import format_plan, make_plan

        workers = args.workers or (1 if args.local_scheduler == "synchronous" else None)
        print(format_plan(make_plan(experiment, config, out_dir, workers=workers, fresh=args.fresh)))
        return 0
    rows = run_experiment(experiment, config, out_dir, name, args)
    return strict_status(rows, out_dir / f"{name}.nc") if args.strict else 0


def _declared_processes(experiment, config, out_dir, fresh):
    """``(scheduler, why)`` for an experiment that declares processes, run without a scheduler:
    threads for a sweep too small to pay for the pool (:func:`sfxlin.engine.plan.small_sweep_scheduler`)."""
    from .engine.plan import make_plan, small_sweep_scheduler

    try:
        plan = make_plan(experiment, config, out_dir, fresh=fresh)
    except Exception as exc:  # an estimate that cannot be made never stops the run: it keeps the declaration
        return "processes", f"the experiment's; no cost estimate ({type(exc).__name__}: {exc})"
    return small_sweep_scheduler(plan)


def run_experiment(experiment, config, out_dir, name, args):
    """Compute ``experiment`` under ``config`` into ``out_dir/name.nc`` (and its figure), keeping
    every finished cell in ``out_dir/.EXP.cells``, then print its tables (:func:`sfxlin.runs.execute`);
    ``args`` holds the run options (``--force``, ``--fresh``, ``--chunks``, the scheduler,
    ``--quiet``/``--verbose``, ``--no-figure``) and ``argv``, the command line that resumes. Returns the
    verdict rows."""
    from .runs import RunInterrupted, execute

    try:
        outcome = execute(
            experiment, config, out_dir, name=name, force=args.force, fresh=args.fresh,
            chunks=_parse_chunks(args.chunks), scheduler=args.local_scheduler, workers=args.workers,
            address=args.scheduler, quiet=args.quiet, verbose=args.verbose, figure=not getattr(args, "no_figure", False),
            call=shlex.join(["sfxlin", *args.argv]), resamples=getattr(args, "resamples", None),
            choose_scheduler=lambda _declared: _declared_processes(experiment, config, out_dir, args.fresh),
            terminated=TERMINATED.is_set)
    except RunInterrupted as exc:
        status = Terminated.status if TERMINATED.is_set() else 130
        raise Interrupted(f"{exc}; the same command resumes: {resume_command(args.argv)}", status) from None
    return outcome.rows


def cmd_rerun(args):
    """Rerun a results file from its provenance attrs (``experiment``, ``profile``,
    ``overrides``, ``config``), into ``--out`` under ``--name`` (default: the run rule's
    folder, the file's own stem). Refused when a token file it read has changed since."""
    path = results_path(args.file)
    attrs = _provenance_attrs(path)
    experiment = get_experiment(attrs["experiment"])
    config, note = rerun_configuration(experiment, attrs)
    changed = changed_input_files(attrs.get("input_files"), config)
    if changed:
        raise ResultsError(f"{path} read token files that changed since ({'; '.join(changed)}): a rerun would not "
                           "give the same results")
    if note and not args.quiet:
        print(note)
    out_dir = Path(args.out) if args.out else default_out(config.profile, config.overrides)
    name = args.name or path.stem
    rows = run_experiment(experiment, config, out_dir, name, args)
    return strict_status(rows, out_dir / f"{name}.nc") if args.strict else 0


def _provenance_attrs(path) -> dict:
    """The attrs of the results file ``path``; ResultsError unless it records at least its
    ``experiment`` and ``config``."""
    import xarray as xr

    try:
        with xr.open_dataset(path, engine="netcdf4") as ds:
            attrs = dict(ds.attrs)
    except Exception as exc:  # netCDF4/HDF5 raise OSError, ValueError, KeyError for damaged files
        raise ResultsError(f"{path} is not a readable netCDF file ({type(exc).__name__}: {exc})") from None
    missing = [key for key in ("experiment", "config") if key not in attrs]
    if missing:
        raise ResultsError(f"{path} records no {' and no '.join(missing)} attr: not a results file of sfxlin")
    return attrs


def rerun_configuration(experiment, attrs):
    """``(config, note)``: the configuration a results file was made with. Its profile and
    overrides when they still give the recorded ``config`` (the new file then records them too),
    else the recorded values themselves (profile ``custom``), with a note saying so."""
    recorded = json.loads(attrs["config"])
    profile, overrides = attrs.get("profile"), json.loads(attrs.get("overrides") or "[]")
    if profile in experiment.profiles:
        try:
            config = experiment.configure(profile, overrides)
        except ValueError:  # a parameter renamed or a rule tightened since: the recorded values decide
            config = None
        if config is not None and json.loads(config.to_json()) == recorded:
            return config, ""
    return (experiment.configure(None, values=recorded),
            f"note: profile {profile!r} with overrides {overrides} no longer gives the recorded configuration; "
            "rerunning the recorded values")


def cmd_merge(args):
    missing = [p for p in args.files if not Path(p).is_file()]
    if missing:   # refused before any heavy import
        raise ResultsError(f"no results file {', '.join(repr(str(Path(p).absolute())) for p in missing)}: no such file")
    from .engine.merge import merge_files  # written beside this module

    out = merge_files([Path(p) for p in args.files], Path(args.out))
    print(f"wrote {out} ({merged_cells(out)} cells)")


def merged_cells(path) -> int:
    """The number of cells of the results file ``path``: per part of its experiment, the product
    of the sizes of the part's grid dims in the file (a part without grid dims is one cell)."""
    import xarray as xr

    with xr.open_dataset(path, engine="netcdf4") as ds:
        experiment = get_experiment(ds.attrs["experiment"])
        config = json.loads(ds.attrs["config"])
        sizes = dict(ds.sizes)
    total = 0
    for part in experiment.parts:
        cells = 1
        for dim, values in part.grid(config).items():
            cells *= sizes.get(dim, len(values))
        total += cells
    return total


def cmd_cells(args):
    """For each experiment with kept cells in ``OUT`` (or ``--experiment``'s), one line: how many,
    their size, how many the current code computed (the others are stale: never served again);
    ``--prune`` removes the stale ones, ``--prune --all`` every one."""
    from .engine.cellstore import KeptCells, prune, survey

    if args.all and not args.prune:
        raise ValueError("--all goes with --prune (sfxlin cells OUT --prune --all removes every kept cell)")
    folder = Path(args.out)
    if not folder.is_dir():
        raise ResultsError(f"no folder {folder.absolute()}: give the --out folder of a run")
    names = ([get_experiment(args.experiment).name] if args.experiment else
             sorted(p.name[1:-len(".cells")] for p in folder.glob(".*.cells") if p.is_dir()))
    if not names:
        print(f"no kept cells in {folder.absolute()}")
    for name in names:
        try:
            experiment = get_experiment(name)
        except ValueError:
            print(f"{name}: not an experiment known here (set ${ENV} to its pipeline module); skipped")
            continue
        kept = survey(folder / f".{name}.cells", experiment)
        print(f"{name}: {len(kept.current) + len(kept.stale)} cells, "
              f"{human_bytes(KeptCells.size(kept.current + kept.stale))} in {kept.folder}: "
              f"{len(kept.current)} of the current code, {len(kept.stale)} stale")
        if args.prune:
            removed, freed = prune(kept, everything=args.all)
            print(f"  removed {removed} {'' if args.all else 'stale '}cells ({human_bytes(freed)})")


def human_bytes(n) -> str:
    """``n`` bytes in B, kB, MB or GB (powers of 1000)."""
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


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
    if args.d is not None and args.experiment != "c3":
        raise ValueError(f"--d: only the c3 engine has a benchmark per dimension, got {args.experiment!r}")
    ds = None if args.d is None else _dims(args.d)
    if any(os.environ.get(k) != v for k, v in BENCH_MALLOC.items()):
        env = {**os.environ, **BENCH_MALLOC}
        again = ["--d", args.d] if ds else []
        return subprocess.call([sys.executable, "-m", "sfxlin.cli", "bench", args.experiment, *again], env=env)
    print("(allocator: " + ", ".join(f"{k}={v}" for k, v in BENCH_MALLOC.items()) + ", for both arms)")
    if ds:
        from .benchmarks.c3 import bench_c3_dims

        bench_c3_dims(tuple(ds))
        return 0
    mod, _, fn = target.partition(":")
    getattr(importlib.import_module(mod), fn)()


def cmd_report(args):
    """The report of the results in ``--results`` (default: the paper results' folder), written
    beside them unless ``--out`` says otherwise (never into another folder's report)."""
    folder = Path(args.results) if args.results else default_results_dir()
    point = f"--results DIR (or ${RESULTS_ENV}) points elsewhere"
    if not folder.is_dir():
        raise ResultsError(f"no results folder {folder.absolute()}; {point}")
    if not any(not p.name.startswith(".") for p in folder.glob("*.nc")):
        raise ResultsError(f"no results files (*.nc) in {folder.absolute()}; {point}")
    from .analysis.report import write_report
    judged = []
    html_path, md_path = write_report(folder, args.out, on_verdicts=lambda path, rows: judged.append((path, rows)))
    print(f"wrote {html_path} and {md_path}")
    if not args.strict:
        return 0
    return max([strict_status(rows, path) for path, rows in judged], default=0)


def cmd_check(args):
    """Every experiment's quick profile (``sfxlin run EXP --quiet`` into ``--out``, or a temporary
    folder removed after), one line per experiment (its verdict counts and seconds), then the
    verdict table of every experiment with a FAIL. Exit status :data:`FAILED` on any FAIL, 2 when
    an experiment could not be run (the others are still checked), else 0."""
    import tempfile
    import time
    import warnings

    from .analysis.verdicts import FAIL, NOT_JUDGED, VERDICTS, count_verdicts, format_table

    found = list(experiments().values())
    with contextlib.ExitStack() as stack:
        if args.out:
            out = Path(args.out)
            where = f"into {out}"
        else:
            out = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="sfxlin-check-")))
            where = "into a temporary folder (removed after; --out DIR keeps the files)"
        print(f"sfxlin check: the quick profile of {len(found)} experiments, a smoke test of the install, {where}; "
              f"{'no robustness' if not args.resamples else f'robustness over {args.resamples} resamples'}",
              flush=True)
        run_args = argparse.Namespace(force=False, fresh=args.fresh, chunks=None, workers=None, scheduler=None,
                                      local_scheduler=None, quiet=True, verbose=False, argv=args.argv,
                                      resamples=args.resamples)
        width = max((len(e.name) for e in found), default=0)
        failed, errors, done, start_all = [], [], 0, time.perf_counter()
        for experiment in found:
            if "quick" not in experiment.profiles:
                print(f"{experiment.name:<{width}}  no quick profile, skipped", flush=True)
                continue
            start = time.perf_counter()
            try:
                with warnings.catch_warnings(record=True) as caught:  # counted on its line, not printed
                    config = experiment.configure("quick", [])
                    rows = run_experiment(experiment, config, out, experiment.name, run_args)
            except KeyboardInterrupt as exc:
                kept = (f"the cells computed so far are kept in {out}: the same command resumes: "
                        f"{resume_command(args.argv)}" if args.out else
                        "the temporary folder is removed (--out DIR keeps the cells for a resume)")
                raise Interrupted(f"{done} of {len(found)} experiments checked; {kept}",
                                  getattr(exc, "status", 130)) from None
            except Exception as exc:  # any failure of one experiment: reported, the others still checked
                errors.append(experiment.name)
                print(f"{experiment.name:<{width}}  error: {type(exc).__name__}: {exc}  "
                      f"({time.perf_counter() - start:.1f} s)", flush=True)
                continue
            done += 1
            counts = count_verdicts(rows)
            shown = ", ".join(f"{counts[v]} {v}" for v in VERDICTS if counts[v] or v != NOT_JUDGED)
            fragile = f", {counts['fragile']} fragile" if args.resamples else ""
            kinds = sorted({w.category.__name__ for w in caught})
            warned = (f"; {len(caught)} warning{'s' * (len(caught) > 1)}, {', '.join(kinds)}: sfxlin run "
                      f"{experiment.short or experiment.name} shows them" if caught else "")
            print(f"{experiment.name:<{width}}  {shown}{fragile}  ({time.perf_counter() - start:.1f} s{warned})",
                  flush=True)
            if counts[FAIL]:
                failed.append((experiment, rows))
        for experiment, rows in failed:
            print(f"\n{experiment.name}: FAIL at the quick profile")
            print(format_table(rows))
        total = time.perf_counter() - start_all
        verdict = (f"FAIL in {', '.join(e.name for e, _ in failed)}" if failed else
                   f"no FAIL in {done} experiment{'s' * (done != 1)}")
        status = f": exit status {FAILED}" if failed and not errors else ""
        print(f"\nsfxlin check: {verdict} ({total:.0f} s){status}")
        if errors:
            print(f"sfxlin: error: {len(errors)} experiment{'s' * (len(errors) > 1)} could not be run "
                  f"({', '.join(errors)}); see the lines above", file=sys.stderr)
            return 2
        return FAILED if failed else 0


def cmd_reproduce(args):
    """Every experiment found (sfxlin list), or those named, at ``--profile`` (default: paper) into
    ``--out`` (replacing the files there: regenerating them is the point), then the report, then
    the table of what each run cost (:func:`reproduce_table`)."""
    from .engine.cellstore import CellStore

    chosen = [get_experiment(name) for name in args.experiments] if args.experiments else experiments().values()
    lacking = [e.name for e in chosen if args.profile not in e.profiles]
    if args.experiments and lacking or len(lacking) == len(chosen):
        raise ValueError(f"no {args.profile!r} profile in {', '.join(lacking)}")
    rows = []
    for experiment in chosen:
        if args.profile not in experiment.profiles:
            print(f"{experiment.name}: no {args.profile} profile, skipped")
            continue
        store = CellStore(Path(args.out) / f".{experiment.name}.cells", experiment,
                          experiment.configure(args.profile))
        kept, start, cpu = store.count(), time.perf_counter(), _cpu_seconds()
        status = main(["run", experiment.name, "--profile", args.profile, "--out", str(args.out), "--force"]
                      + (["--quiet"] if args.quiet else []))
        if status:
            return status
        logits = [n for _part, _cell, n in store.cell_exponentials()]
        rows.append(dict(experiment=experiment.name, wall=time.perf_counter() - start, cpu=_cpu_seconds() - cpu,
                         cells=len(logits), kept=kept,
                         logits=None if kept or None in logits else sum(logits)))
    status = main(["report", "--results", str(args.out), "--out", str(Path(args.out) / "report.html")])
    from .benchmarks.cell_costs import exp_seconds_per_logit

    print("\n" + reproduce_table(rows, exp_seconds_per_logit()))
    return status


def _cpu_seconds() -> float:
    """CPU seconds of this process and of its children that have exited (a process pool's workers
    are reaped when its run ends), user and system."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def reproduce_table(rows, per_logit) -> str:
    """The table ``sfxlin reproduce`` prints at its end: per experiment its wall and CPU seconds,
    its cells (and how many were kept from an earlier run, not computed), and the share of its CPU
    that ``np.exp`` of the logits its cells exponentiated would take (``per_logit``: seconds of
    ``np.exp`` per logit here, :func:`sfxlin.benchmarks.cell_costs.exp_seconds_per_logit`), the floor
    of an exact engine; ``n/a`` where cells were kept (their logits were not computed by this run).
    Then the total."""
    lines = [f"{'experiment':18s} {'wall':>9s} {'CPU':>9s} {'cells':>6s} {'kept':>5s} {'np.exp floor':>13s}"]

    def line(name, wall, cpu, cells, kept, logits):
        floor = "n/a" if logits is None or cpu <= 0 else f"{logits * per_logit / cpu:.1%} of CPU"
        return f"{name:18s} {wall:8.1f}s {cpu:8.1f}s {cells:6d} {kept:5d} {floor:>13s}"

    for r in rows:
        lines.append(line(r["experiment"], r["wall"], r["cpu"], r["cells"], r["kept"], r["logits"]))
    total = {k: sum(r[k] for r in rows) for k in ("wall", "cpu", "cells", "kept")}
    logits = None if any(r["logits"] is None for r in rows) else sum(r["logits"] for r in rows)
    lines.append(line("total", total["wall"], total["cpu"], total["cells"], total["kept"], logits)
                 + f"  ({total['wall'] / 60:.1f} min wall; np.exp {per_logit * 1e9:.2f} ns a logit here)")
    return "\n".join(lines)


def cmd_list(args):
    """Every experiment (or only ``EXP``): its profiles, scheduler and parameters with their rules."""
    for experiment in [get_experiment(args.experiment)] if args.experiment else experiments().values():
        print(f"{experiment.short or experiment.name} ({experiment.name}): {experiment.description}")
        print(f"  profiles: {', '.join(experiment.profiles)}; local scheduler: {experiment.scheduler or 'threads'}")
        for p in experiment.params:
            values = "; ".join(f"{name}: {_plain(p.default(name))}" for name in experiment.profiles)
            print(f"  {p.name:18s} {p.doc} [{p.rule()}]; {values}")


def _plain(value):
    return json.dumps(value) if isinstance(value, (list, tuple)) else value


def _verify_verdict(check, rtol):
    """The verdict of a recomputed cell (:class:`sfxlin.engine.verify.CellCheck`) against ``rtol`` times each
    output's recorded amplification, and its kind: ``"bit-identical"``, ``"within"`` (``rtol``),
    ``"amplified"`` (within ``rtol`` times an amplification) or ``"beyond"``; a violation names each output
    beyond, with its difference and amplification."""
    worst = check.worst
    if check.identical:
        return f"bit-identical ({len(check.variables)} variables)", "bit-identical"
    if check.within(rtol):
        amplified = [v for v in check.variables if v.error > rtol]
        if not amplified:
            return f"within {rtol:g} (largest {worst.error:.2g}, {worst.name})", "within"
        top = max(amplified, key=lambda v: v.error)
        more = f"; {len(amplified)} outputs beyond {rtol:g}, each within its amplification" if len(amplified) > 1 else ""
        return (f"within {rtol:g} x amplification {top.amplification:.2g} (largest {top.error:.2g}, {top.name}"
                f"{more})"), "amplified"
    bad = [v for v in check.variables if not v.within(rtol)]
    said = [f"{v.name} (difference {v.error:.2g}" + (f", amplification {v.amplification:.2g}: tolerance "
                                                      f"{v.tolerance(rtol):.2g})" if v.amplification is not None else ")")
            for v in bad]
    scaled = " x amplification" if any(v.amplification is not None for v in bad) else ""
    return f"DIFFERS beyond {rtol:g}{scaled}: {', '.join(said)}", "beyond"


def cmd_verify(args):
    """``sfxlin verify FILE...``: one line per recomputed cell, exit status 1 when a cell is beyond
    ``--rtol`` times its outputs' recorded amplification (:mod:`sfxlin.engine.verify`)."""
    from .engine.sweep import cell_label
    from .engine.storage import digested
    from .engine.verify import DEFAULT_RTOL, iter_verify, kernel_note

    rtol = DEFAULT_RTOL if args.rtol is None else args.rtol
    if not rtol >= 0:
        raise ValueError(f"--rtol must be >= 0, got {args.rtol}")
    status = 0
    for name in args.files:
        path = results_path(name)

        def say_file(attrs, stem=path.stem, path=path):
            stored = digested(path)   # read: its digests held (a changed value is a ResultsError)
            print(f"{stem}: " + (f"the values of its {len(stored)} variables (coordinates included) are those "
                                 "written (sha256 checked on read)" if stored else "no sha256 of its values (written "
                                 "before they were recorded): only the recomputed cells check them"), flush=True)
            note = kernel_note(attrs)
            if note:
                print(f"{stem}: {note}", flush=True)

        tally = {"bit-identical": 0, "within": 0, "amplified": 0, "beyond": 0}
        for check in iter_verify(path, cells=args.cells, on_open=say_file, most_amplified=args.most_amplified):
            where = cell_label(path.stem + (f"/{check.part}" if check.part else ""), check.cell)
            verdict, kind = _verify_verdict(check, rtol)
            if kind == "beyond":
                status = FAILED
            tally[kind] += 1
            if check.absent:
                verdict += f"; not in the file (added since): {', '.join(check.absent)}"
            print(f"{where}: {verdict}, recomputed in {check.seconds:.1f} s", flush=True)
        print(f"{path.stem}: {sum(tally.values())} cells recomputed: {tally['bit-identical']} bit-identical, "
              f"{tally['within']} within {rtol:g}, {tally['amplified']} within {rtol:g} x their amplification, "
              f"{tally['beyond']} beyond", flush=True)
    return status


def cmd_info(args):
    """Describe any netCDF file: dims, coordinates, variables, provenance; for a file sfxlin did
    not write (or of another schema), what the analysis would need."""
    path = results_path(args.file)   # a missing file is refused before any heavy import
    from .engine.schema import SCHEMA_VERSION
    from .engine.storage import load

    ds = load(path)   # its records back among its attrs; a damaged value is refused
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
    from .engine.schema import READS, upgrade, version_of

    if version_of(ds) not in READS:
        version = ds.attrs.get("sfxlin_schema_version")
        version = version.item() if hasattr(version, "item") else version  # netCDF gives numpy scalars
        out.append(f"schema version {version!r}; this sfxlin reads version {schema_version}")
    ds = upgrade(ds)
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
    from .engine.schema import CONVENTIONS, COORDS, RENAMED, SCHEMA_VERSION
    from .engine.storage import RECORDS, RECORDS_GROUP

    lines = ["# datasets", "",
             "Results of the paper profiles (`make reproduce`), one netCDF file per experiment, with the",
             "figure drawn from it beside. Generated by `sfxlin schema` from the variable declarations",
             f"(schema version {SCHEMA_VERSION}); a test keeps this file in step with the code.", "",
             "Every file carries the provenance attrs `experiment`, `profile`, `overrides`, `config` (JSON of",
             "every parameter: `sfxlin run EXP --profile P` with these values reruns it), `sfxlin_version`,",
             "`sfxlin_schema_version`, `git_revision`, `library_versions` (JSON: python, numpy, xarray, dask,",
             "netCDF4, scikit-learn, jax, jaxlib, optax, and `blas`, the BLAS and the kernel it ran, e.g.",
             "`openblas 0.3.31.188.0 SkylakeX`: `sfxlin verify` says when it recomputes under another),",
             "`created` (UTC), `wall_seconds`, `scheduler`, `history`, and `criteria` (JSON: the predeclared",
             "criteria of the verdict table).", "",
             f"The records of its run sit in the netCDF group `{RECORDS_GROUP}`, one text variable each holding JSON (`ncdump -h`",
             "prints their declarations, not their kilobytes); `sfxlin.open_results` and `sfxlin.engine.storage.load`",
             f"give them back as attrs, `xr.open_dataset(FILE, group=\"{RECORDS_GROUP}\")` reads them directly:",
             "", *(f"* `{name}`: {text}." for name, text in RECORDS.items()), "",
             "`cell_seconds` and `cell_exponentials` hold a row per cell (null for a cell kept without a record);",
             "`cell_timeline` is written on a local scheduler; `merged_from` by `sfxlin merge A.nc B.nc -o C.nc`",
             "(`sfxlin.engine.merge`), whose file has the merged `config`, `overrides` and `n_cells` and one more",
             "`history` line and carries no run records of its own.", "",
             f"The files follow the CF conventions (attr `Conventions = \"{CONVENTIONS}\"`; `ncdump -h FILE.nc`",
             "shows them; a test runs the CF checker on them): every coordinate and variable has a `long_name` and a",
             "`description` (sentences ending with a full stop), and every variable but a flag `units` (UDUNITS:",
             "`1` for a dimensionless quantity or a count such as tokens or steps, which its long_name names; `s`",
             "for seconds); coordinates have no `_FillValue`; text is stored as characters; a flag is an integer",
             "variable with `flag_values` and `flag_meanings` (`in_protocol` of `c3_transfer.nc`: int8, 0",
             "`outside_protocol`, 1 `in_protocol`). Every array carries HDF5's Fletcher-32 checksum, and",
             "`content_sha256` the digest of every variable's values: a damaged value is refused on read.", "",
             "A file of schema version 1 is read as version 2 (`sfxlin.engine.schema.upgrade`: no value changes),",
             "its variables renamed so that a name has one meaning in its family (`_max`: the maximum over the",
             "checkpoints, `_T`: the value at the end of training):", "",
             *(f"* `{name}.nc`: " + ", ".join(f"`{old}` -> `{new}`" for old, new in renamed.items())
               for name, renamed in RENAMED.items()), "",
             "## Coordinates", "", "| dim | long_name | units | description |", "|---|---|---|---|"]
    for dim, attrs in COORDS.items():
        lines.append(f"| `{dim}` | {_md(attrs['long_name'])} | {attrs.get('units', '')} | {_md(attrs['description'])} |")
    for experiment in experiments().values():
        lines += ["", f"## `{experiment.name}.nc`", "", experiment.description, "",
                  "| variable | dims | long_name | units | description |", "|---|---|---|---|---|"]
        for var in experiment.variables:
            dims = ", ".join(var.dims)
            units = var.attrs().get("units", "flag")
            lines.append(f"| `{var.name}` | ({dims}) | {_md(var.long_name)} | {units} | {_md(var.description)} |")
    return "\n".join(lines) + "\n"


def cmd_schema(args):
    print(schema_markdown(), end="")


def _run_options(sub):
    """The options ``run`` and ``rerun`` share: where the results go and how they are computed."""
    sub.add_argument("--out", help="output folder (default: ./datasets, or $SFXLIN_RESULTS, for the paper profile "
                                   "without --set; ./runs/PROFILE otherwise, so a quick run never replaces the "
                                   "paper results)")
    where = sub.add_mutually_exclusive_group()
    where.add_argument("--workers", type=_positive_int, help="start a dask.distributed LocalCluster with N workers")
    where.add_argument("--scheduler", help="address of an existing dask.distributed scheduler (tcp://host:8786)")
    where.add_argument("--local-scheduler", choices=["threads", "synchronous", "processes"],
                       help="a local dask scheduler (default: the experiment's, threads on all cores unless it "
                            "declares processes: sfxlin list; a sweep expected to cost under 10 CPU s runs on "
                            "threads even then)")
    sub.add_argument("--chunks", action="append", metavar="DIM=N", help="cells per dask task along a grid dim")
    sub.add_argument("--strict", action="store_true",
                     help=f"exit with status {FAILED} when a verdict FAILs (INCONCLUSIVE and NOT JUDGED do not; "
                          "errors exit with 2)")
    sub.add_argument("--name", type=_file_stem,
                     help="file stem of the results: NAME.nc and NAME.png in --out (default: the experiment's "
                          "full name, e.g. c1_limit; for rerun, the file's own)")
    sub.add_argument("--force", action="store_true",
                     help="replace a results file of the same name made under another configuration (by "
                          "default refused before any work; a rerun of the same configuration replaces it)")
    sub.add_argument("--fresh", action="store_true",
                     help="discard the kept cells of this experiment in --out (by default a cell computed by an "
                          "earlier or interrupted run with the same inputs and code is reused)")
    talk = sub.add_mutually_exclusive_group()
    talk.add_argument("--quiet", action="store_true",
                      help="no progress bar or tables (the analysis still runs: same exit status)")
    talk.add_argument("--verbose", action="store_true", help="also one line per finished block of cells")
    sub.add_argument("--no-figure", action="store_true",
                     help="draw no figure (sfxlin report, or ds.sfx.figure(PATH), draws it when asked)")


def parser():
    p = argparse.ArgumentParser(prog="sfxlin", description=__doc__.split("\n")[0], epilog=FOLDER_RULE)
    p.add_argument("--version", action="version", version=f"sfxlin {__version__}")
    sub = p.add_subparsers(dest="command", required=True)

    def command(name, help, func):
        parsed = sub.add_parser(name, help=help, description=help, epilog=FOLDER_RULE)
        parsed.set_defaults(func=func)
        return parsed

    check = command("check", "after installing, run this: every experiment's quick profile as a smoke test "
                             "(about a minute on 2 cores), one line per experiment, the verdict table of any FAIL; "
                             f"exit status {FAILED} on any FAIL (INCONCLUSIVE and NOT JUDGED do not fail it), 2 when "
                             "an experiment cannot be run", cmd_check)
    check.add_argument("--out", metavar="DIR", help="keep the results files and their cells in DIR (default: a temporary folder, "
                                     "removed after); a file of another configuration there is not replaced")
    check.add_argument("--fresh", action="store_true",
                       help="with --out: discard the cells kept there by an earlier check (computed afresh)")
    check.add_argument("--resamples", type=_non_negative_int, default=0,
                       help="resamples of the independent units for each verdict's robustness (default 0: none; "
                            "the verdicts, and so the exit status, do not depend on it)")
    run = command("run", "compute an experiment, save it as netCDF, print fits and verdicts", cmd_run)
    run.add_argument("experiment", help="an experiment's name or short name (sfxlin list)")
    run.add_argument("--profile", default="quick", help="quick (seconds) or paper (the reference protocol)")
    run.add_argument("--set", action="append", metavar="KEY=VALUE",
                     help="override a parameter of the profile, each at most once (lists comma-separated), "
                          "e.g. --set d=2,3")
    _run_options(run)
    run.add_argument("--plan", action="store_true",
                     help="print the cells, those kept in --out by earlier runs, those to compute and their expected "
                          "CPU and wall seconds (cost laws fitted on the seconds per cell the shipped paper files record), "
                          "then exit 0: nothing is computed or written")
    rerun = command("rerun", "rerun a results file from its stored experiment, profile and configuration", cmd_rerun)
    rerun.add_argument("file", help="a results file (FILE.nc), or an experiment name in the paper results' folder")
    _run_options(rerun)
    merge = command("merge", "combine results files of compatible configurations into one", cmd_merge)
    merge.add_argument("files", nargs="+", metavar="FILE.nc", help="the results files to combine")
    merge.add_argument("-o", "--out", required=True, metavar="OUT.nc", help="the combined file (written atomically)")
    cells = command("cells", "the kept cells of the runs in a folder: count, size, stale or not; prune them",
                    cmd_cells)
    cells.add_argument("out", help="the --out folder of the runs (it holds .EXP.cells/)")
    cells.add_argument("--experiment", help="only this experiment's cells (default: every experiment's)")
    cells.add_argument("--prune", action="store_true",
                       help="remove the stale cells (computed by other code: never served again)")
    cells.add_argument("--all", action="store_true", help="with --prune: remove every kept cell")
    bench = command("bench", "benchmark an engine against its reference, ratio in one run", cmd_bench)
    bench.add_argument("experiment", help=f"one of {sorted(BENCHES)}")
    bench.add_argument("--protocol", action="store_true",
                       help="c3 only: the paper protocol end to end (sfxlin run) against a seed-style per-L loop, "
                            "same tasks, both wall times and their ratio")
    bench.add_argument("--steps", type=_positive_int, help="with --protocol: n_steps of both arms (shorter run)")
    bench.add_argument("--heldout-every", type=_positive_int, help="with --protocol: heldout_every of both arms")
    bench.add_argument("--d", metavar="D,D,...",
                       help="c3 only: the softmax engine's step at each of these d against its floor (np.exp of the "
                            "logits and the multiply-adds at one large matmul's rate), e.g. --d 3,8,16")
    lst = command("list", "experiments, their parameters and profiles", cmd_list)
    lst.add_argument("experiment", nargs="?", help="only this experiment (name or short name)")
    rep = command("report", "one self-contained HTML page (and Markdown) of every claim", cmd_report)
    rep.add_argument("--results", help="folder of results files (default: ./datasets, or $SFXLIN_RESULTS)")
    rep.add_argument("--out", help="FILE.html (the Markdown goes beside it as FILE.md) or FILE.md (the HTML beside "
                                   "it); default: report.html and report.md in the --results folder")
    rep.add_argument("--strict", action="store_true",
                     help=f"exit with status {FAILED} when a verdict of any file FAILs (the report is written "
                          "first; INCONCLUSIVE and NOT JUDGED do not; errors exit with 2)")
    rep = command("reproduce", "every experiment at its paper profile, then the report and a table of each run's "
                               "wall and CPU seconds", cmd_reproduce)
    rep.add_argument("experiments", nargs="*", help="only these experiments (default: every one, sfxlin list)")
    rep.add_argument("--profile", default="paper", help="the profile of every run (default: paper)")
    rep.add_argument("--out", default=default_results_dir(),
                     help="folder of the results (default: ./datasets, or $SFXLIN_RESULTS)")
    rep.add_argument("--quiet", action="store_true", help="no progress bars or verdict tables (the table of each "
                     "run's cost is printed)")
    command("schema", "markdown schema of every results file (datasets/README.md)", cmd_schema)
    ver = command("verify", "recompute the cheapest cells of results files with the installed code and compare "
                            f"them with the files: bit-identical, within --rtol, or not (exit status {FAILED})",
                  cmd_verify)
    ver.add_argument("files", nargs="+", metavar="FILE",
                     help="results files (FILE.nc), or experiment names in ./datasets (or $SFXLIN_RESULTS)")
    ver.add_argument("--cells", type=_cells, default=1, metavar="N|all",
                     help="the N cheapest cells recomputed per part of each file, or all of them (default 1)")
    ver.add_argument("--most-amplified", type=_int_at_least(0, "an integer >= 0"), default=0, metavar="K",
                     help="also the K cells per part whose recorded amplification of rounding is largest (default 0)")
    ver.add_argument("--rtol", type=float, default=None,
                     help="largest |new - stored| / the variable's largest value in the file, times the amplification "
                          "the file records for that output and cell where it records one (default 1e-10: what the "
                          "determinism contract promises across versions and CPUs)")
    info = command("info", "dims, coordinates, variables and provenance of a results file", cmd_info)
    info.add_argument("file", help="a netCDF file, or an experiment name in ./datasets (or $SFXLIN_RESULTS)")
    return p


def main(argv=None):
    """Run the command line ``argv`` (default: ``sys.argv[1:]``); returns the exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    TERMINATED.clear()
    with output_never_stops_work(), sigterm_as_interrupt():
        args = parser().parse_args(argv)
        args.argv = argv
        try:
            status = args.func(args)
        except KeyboardInterrupt as exc:  # Interrupted: "; N of M cells kept in ...; the same command resumes: ..."
            status = getattr(exc, "status", 130)
            what = "terminated (SIGTERM)" if status == Terminated.status else "interrupted"
            print(f"sfxlin: {what}" + (f"; {exc}" if str(exc) else ""), file=sys.stderr)
            return status
        except (ValueError, TypeError, ResultsError, RuntimeError, OSError) as exc:
            print(f"sfxlin: error: {exc}", file=sys.stderr)
            return 2
    return status or 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
