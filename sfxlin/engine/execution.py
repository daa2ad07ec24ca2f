"""Where and how a lazy Dataset is computed: local threads, processes, or a dask cluster.

Threads on all local cores by default (numpy releases the GIL); ``workers=N`` starts a
``dask.distributed.LocalCluster`` with N single-threaded worker processes; ``address`` joins an
existing cluster (``tcp://host:8786``; dask-jobqueue clusters on SLURM/PBS expose one).

The local process pool's workers follow the process that started them: each watches its parent
(:func:`follow_parent`) and exits when it dies (SIGKILL, a crash), so no worker is left
behind computing cells nobody will collect.
"""
from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import sys
import threading
import time

import dask
import xarray as xr
from dask.callbacks import Callback

__all__ = ["compute", "scheduler_label", "CellProgress", "LineProgress", "follow_parent"]

LOCAL_SCHEDULERS = ("threads", "synchronous", "processes")

#: seconds between two looks of a pool worker at its parent
PARENT_POLL_SECONDS = 0.25


def follow_parent(parent_pid):
    """Initializer of a process-pool worker started by ``parent_pid``: starts a daemon thread that
    ends the worker (``os._exit``) as soon as its parent is no longer ``parent_pid`` (the parent
    died and the worker was re-parented); returns None."""
    if os.getppid() != parent_pid:  # the parent died before this worker started
        os._exit(1)
    threading.Thread(target=_exit_when_orphaned, args=(parent_pid,), name="sfxlin-follow-parent",
                     daemon=True).start()


def _exit_when_orphaned(parent_pid):
    while os.getppid() == parent_pid:
        time.sleep(PARENT_POLL_SECONDS)
    os._exit(1)


def scheduler_label(scheduler=None, workers=None, address=None):
    if address:
        return f"distributed:{address}"
    if workers:
        return f"distributed:LocalCluster(n_workers={workers})"
    return scheduler or f"threads({os.cpu_count()})"


@contextlib.contextmanager
def _client(workers=None, address=None):
    if not workers and not address:
        yield None
        return
    from distributed import Client, LocalCluster

    if address:
        with Client(address, timeout="20s") as client:
            yield client
        return
    with LocalCluster(n_workers=int(workers), threads_per_worker=1, processes=True,
                      dashboard_address=None) as cluster, Client(cluster) as client:
        yield client


class LineProgress:
    """Progress in counted units (cells, or tasks of cells) with elapsed time and ETA.

    On a terminal, one bar redrawn in place (``\\r``); written to a file or a pipe
    (``stream.isatty()`` false), whole lines: one at the start, then one each time another
    ``LINE_FRACTION`` of the units has finished or ``LINE_SECONDS`` have passed since the last
    line, and one when the last finishes, so a log (a SLURM job's, a CI run's) stays short and
    readable. Between :meth:`begin` and :meth:`end` a heartbeat redraws it every ``LINE_SECONDS``
    even while no unit finishes (a long cell), so a log never falls silent for longer.
    ``verbose`` adds one line per finished unit that :meth:`advance` names.
    """

    LINE_FRACTION = 0.05
    LINE_SECONDS = 30.0

    def __init__(self, unit="cells", stream=None, verbose=False, width=30):
        self.unit, self.verbose, self.width = unit, verbose, width
        self.stream = stream or sys.stderr
        isatty = getattr(self.stream, "isatty", None)
        self.tty = bool(isatty and isatty())
        self.total, self.done, self.start = 0, 0, None
        self._line_done, self._line_time = 0, None
        self._lock, self._stop, self._beat = threading.Lock(), threading.Event(), None

    def begin(self, total):
        self.total, self.done = total, 0
        self.start, self._line_done, self._line_time = time.perf_counter(), 0, None
        self._draw()
        self._stop.clear()
        self._beat = threading.Thread(target=self._heartbeat, name="sfxlin-progress", daemon=True)
        self._beat.start()

    def _heartbeat(self):
        while not self._stop.wait(self.LINE_SECONDS):
            self._draw()

    def advance(self, what=None):
        """One more unit finished (``what``: its name, for the verbose line)."""
        with self._lock:
            self.done += 1
            if self.verbose and what is not None:
                line = f"  finished {what} at {time.perf_counter() - self.start:.1f} s"
                self.stream.write(f"\r{line}{' ' * 30}\n" if self.tty else f"{line}\n")
        self._draw()

    def end(self):
        self._stop.set()
        if self._beat is not None:
            self._beat.join()
            self._beat = None
        with self._lock:
            if self.tty:
                self.stream.write("\n")
            self.stream.flush()

    def _draw(self):
        with self._lock:
            now = time.perf_counter()
            elapsed = now - (self.start or now)
            frac = self.done / self.total if self.total else 1.0
            if self.tty:
                eta = f"ETA {elapsed / frac * (1 - frac):5.0f} s" if 0 < frac < 1 else " " * 9
                bar = "#" * int(round(self.width * frac))
                self.stream.write(f"\r[{bar:<{self.width}}] {self.done}/{self.total} {self.unit}, "
                                  f"{elapsed:5.0f} s elapsed, {eta}")
            else:
                due = (self._line_time is None or self.done == self.total
                       or self.done - self._line_done >= self.LINE_FRACTION * self.total
                       or now - self._line_time >= self.LINE_SECONDS)
                if not due:
                    return
                self._line_done, self._line_time = self.done, now
                eta = f", ETA {elapsed / frac * (1 - frac):.0f} s" if 0 < frac < 1 else ""
                self.stream.write(f"{self.done}/{self.total} {self.unit}, {elapsed:.0f} s elapsed{eta}\n")
            self.stream.flush()


class CellProgress(Callback):
    """:class:`LineProgress` of a local sweep, counting the tasks of blocks of cells of
    ``experiment`` (the engine names every block ``<experiment>[/<part>]-block-<cells>-<token>``,
    :func:`block_name`), not dask tasks."""

    def __init__(self, experiment, total, stream=None, verbose=False, width=30):
        super().__init__()
        self.experiment, self.total = experiment, total
        self.lines = LineProgress("tasks of cells", stream, verbose, width)

    def _start(self, dsk):
        self.lines.begin(self.total)

    def _posttask(self, key, result, dsk, state, worker_id):
        name = key if isinstance(key, str) else str(key[0]) if isinstance(key, tuple) else str(key)
        cells = block_name(name, self.experiment)
        if cells is not None:
            self.lines.advance(f"cells {cells}")

    def _finish(self, dsk, state, errored):
        self.lines.end()


def block_name(key, experiment):
    """``"part:d[0:1],seed[2:3]"`` for the task key of a block of cells of ``experiment``, else None.

    Searched anywhere in the key: dask's graph optimisation fuses a block with the one task that
    reads it (a part with a single variable) under a longer name that still contains it."""
    match = re.search(rf"(?:^|-){re.escape(experiment)}(?:/(\w+))?-block-((?:[\w.]+\[\d+:\d+\],?)*)", key)
    if match is None:
        return None
    part, where = match.groups()
    return f"{part}:{where}" if part else where


def _n_block_tasks(ds, experiment):
    keys = ds.__dask_graph__().keys()
    return sum(1 for k in keys if block_name(k if isinstance(k, str) else str(k), experiment) is not None)


class CellTimeline(Callback):
    """When each block of cells ran, on which thread: ``[[block, thread, start, end], ...]``
    (seconds from the start of the computation). Where a run spends its time, and whether every
    core stayed busy to the end (no serial tail), is read off it."""

    def __init__(self, experiment):
        super().__init__()
        self.experiment, self.rows, self._open = experiment, [], {}

    def _start(self, dsk):
        self.t0 = time.perf_counter()

    def _pretask(self, key, dsk, state):
        self._open[key] = time.perf_counter() - self.t0

    def _posttask(self, key, result, dsk, state, worker_id):
        name = key if isinstance(key, str) else str(key[0]) if isinstance(key, tuple) else str(key)
        block = block_name(name, self.experiment)
        start = self._open.pop(key, None)
        if block is not None and start is not None:
            thread = 0 if worker_id is None else int(worker_id)  # the synchronous scheduler has none
            self.rows.append([block, thread, round(start, 3), round(time.perf_counter() - self.t0, 3)])


def compute(ds: xr.Dataset, scheduler=None, workers=None, address=None, progress=True, verbose=False, store=None):
    """Compute ``ds`` and return ``(computed_ds, wall_seconds, scheduler_label)``; the result's
    attrs record ``wall_seconds``, ``scheduler`` and, on a local scheduler, ``cell_timeline``
    (JSON of :class:`CellTimeline`: each block of cells with its thread, start and end).

    At most one of ``scheduler`` (a local one), ``workers`` (a new LocalCluster of that many
    processes) and ``address`` (an existing cluster) is given: ValueError otherwise, since the
    others would be ignored.

    ``store``: the :class:`~sfxlin.engine.cellstore.CellStore` ``ds`` was built with. On a cluster
    (``workers`` or ``address``) it is required when ``ds`` has one: the cluster computes the cells
    the store lacks and the client keeps each as it arrives (:func:`sfxlin.engine.cluster.fill`,
    which also refuses workers running other code), then ``ds`` is assembled from the store here.
    Without a store the cluster computes ``ds`` itself and the arrays come back to the client.

    Shows progress in cells with an ETA (:class:`LineProgress`: a bar on a terminal, a line per 5%
    in a file or pipe) unless ``progress`` is False; on an existing cluster it first prints the
    address of its dashboard.
    """
    if scheduler is not None and scheduler not in LOCAL_SCHEDULERS:
        raise ValueError(f"unknown scheduler {scheduler!r}; expected one of {LOCAL_SCHEDULERS}")
    if workers is not None and int(workers) < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    chosen = [name for name, value in (("scheduler", scheduler), ("workers", workers), ("address", address))
              if value is not None]
    if len(chosen) > 1:   # each picks where the cells run: a second one would be silently ignored
        raise ValueError(f"give at most one of scheduler, workers and address, got {' and '.join(chosen)}")
    label = scheduler_label(scheduler, workers, address)
    start = time.perf_counter()
    name = ds.attrs.get("experiment", "")
    with _client(workers, address) as client:
        if client is not None and progress and address:
            print(f"dask dashboard: {_dashboard(client)}", file=sys.stderr, flush=True)
        if client is not None and store is not None:
            from .cluster import fill

            fill(client, store, LineProgress("cells", verbose=verbose) if progress else None)
            # every cell is kept now: the blocks only read them (a file damaged meanwhile is recomputed here)
            with dask.config.set({"scheduler": "synchronous"}):
                result = ds.compute()
        elif client is not None:
            persisted = ds.persist()
            if progress:
                _follow(persisted, LineProgress("tasks", verbose=verbose))
            result = persisted.compute()
        else:
            bar = contextlib.nullcontext()
            if progress:
                bar = CellProgress(name, _n_block_tasks(ds, name), verbose=verbose)
            timeline = CellTimeline(name)
            # chunksize 1: dask's process pool otherwise hands up to 6 ready tasks to one process at a
            # time, which ran a sweep of <= 6 cells (C3's paper profile) on one core
            # the processes scheduler runs on this run's own pool (_process_pool), ended with the run
            with bar, timeline, _process_pool(scheduler) as pool, \
                    dask.config.set({"scheduler": scheduler or "threads", "chunksize": 1, "pool": pool}):
                result = ds.compute()
            result.attrs["cell_timeline"] = json.dumps(sorted(timeline.rows, key=lambda row: row[2]))
    wall = time.perf_counter() - start
    result.attrs.update(wall_seconds=float(wall), scheduler=label)
    return result, wall, label


@contextlib.contextmanager
def _process_pool(scheduler):
    """The pool of the ``processes`` scheduler (None for another), as dask's own but with workers that
    follow this process (:func:`follow_parent`), and ended at once when the run is: on an exception
    (Ctrl-C, SIGTERM, a failed cell) its workers are terminated, not awaited, since a worker's cell
    can run for an hour and its result would be thrown away (the cells kept so far are in the store).
    dask's pool would wait for every running cell on the way out."""
    if scheduler != "processes":
        yield None
        return
    from concurrent.futures import ProcessPoolExecutor

    from dask.multiprocessing import get_context, initialize_worker_process
    from dask.system import CPU_COUNT

    if os.environ.get("PYTHONHASHSEED") in (None, "0"):   # as dask.multiprocessing.get: one hash seed for all
        os.environ["PYTHONHASHSEED"] = "6640"
    initializer = functools.partial(initialize_worker_process,
                                    user_initializer=functools.partial(follow_parent, os.getpid()))
    pool = ProcessPoolExecutor(dask.config.get("num_workers", None) or CPU_COUNT, mp_context=get_context(),
                               initializer=initializer)
    try:
        yield pool
    except BaseException:
        for worker in list((getattr(pool, "_processes", None) or {}).values()):
            worker.terminate()
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown()


def _follow(persisted, lines):
    """Count the tasks of ``persisted`` (a Dataset persisted on a cluster) on ``lines`` as they finish."""
    from distributed import as_completed, futures_of

    futures = futures_of(persisted)
    lines.begin(len(futures))
    try:
        for _ in as_completed(futures):
            lines.advance()
    finally:
        lines.end()


def _dashboard(client, timeout=2.0):
    """The address of the cluster's dashboard if its page answers, else why there is none (the
    scheduler's web server runs without it when bokeh is not installed there, or with
    ``--no-dashboard``)."""
    import urllib.error
    import urllib.request

    link = client.dashboard_link
    try:
        with urllib.request.urlopen(link, timeout=timeout) as page:
            if page.status == 200:
                return link
    except (OSError, ValueError, urllib.error.URLError):
        pass
    return f"none served at {link} (the scheduler needs bokeh installed, and no --no-dashboard)"
