"""Cells computed on a dask cluster, kept by the client.

On a cluster the workers' folders, file systems and installs are not the client's. So:

* **the client writes every cell** (:func:`fill`): the workers return each cell's arrays with
  what computed them, and the client keeps the cell in the run's store (``--out``) as it arrives.
  Ctrl-C, a dead worker or a dead client lose only the cells in flight; ``--plan``, the count an
  interrupted run prints and a resume all read the one store. (The alternative, workers writing
  to an absolute path on a shared file system, needs that file system and loses the cells of a
  worker that cannot reach it; the client's store needs nothing of the cluster.)
* **workers run the client's code** (:func:`origin`): every cell carries the code fingerprint of
  the process that computed it (:func:`sfxlin.engine.cellstore.experiment_code`) and the versions
  of the libraries that compute (numpy, jax, jaxlib, optax) and the BLAS kernel. Before any work
  the client asks every connected worker; a worker that joins later is checked at its first cell.
  Another fingerprint or version is refused, naming the worker and both values, before anything
  is stored (:class:`WorkerMismatch`). A BLAS kernel other than the client's is allowed (a cluster
  of mixed CPUs; results agree to 1e-10, docs/performance.md section 10) and recorded per cell.
* **inputs are checked where they are read**: every file a cell reads is given to the workers by
  its absolute path (resolved in the client's folder) and checked on every connected worker
  before any work, against the digest taken when the run was configured (:class:`WorkerMismatch`
  naming the path and the worker).

One dask task per missing cell (``--chunks`` is a local scheduling matter: a cell's bits do not
depend on it). Progress counts cells, as locally (:class:`~sfxlin.engine.execution.LineProgress`).
"""
from __future__ import annotations

import dataclasses
import os
import socket
import sys
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import numpy as np

from .. import softmax_core
from .._version import __version__
from .cellstore import experiment_code
from .params import Config
from .sweep import run_cell

__all__ = ["WorkerMismatch", "origin", "fill", "absolute_inputs"]

#: the libraries whose versions must agree between the client and every worker
PINNED = ("numpy", "jax", "jaxlib", "optax")


class WorkerMismatch(RuntimeError):
    """A worker that cannot compute this run's cells as the client would: other code, other
    library versions, or an input file it cannot read."""


def _version(name):
    try:
        return version(name)
    except PackageNotFoundError:
        return "not installed"


def origin(experiment) -> dict:
    """What computes ``experiment``'s cells in this process: ``code`` (the experiment's code
    fingerprint), ``sfxlin``, the :data:`PINNED` library versions, ``blas`` (the BLAS kernel) and
    ``where`` (the dask worker's address, else host and pid)."""
    from .storage import blas_kernel

    where = f"{socket.gethostname()} pid {os.getpid()}"
    worker = sys.modules.get("distributed.worker")   # a dask worker has imported it; a local run need not (~1 s)
    if worker is not None:
        try:
            where = worker.get_worker().address
        except ValueError:   # distributed imported, but this is no worker's task
            pass
    return {"code": experiment_code(experiment), "sfxlin": __version__,
            **{name: np.__version__ if name == "numpy" else _version(name) for name in PINNED},
            "blas": blas_kernel(), "where": where}


def mismatch(expected, got) -> list[str]:
    """``"code: CLIENT (client) != WORKER (worker)"`` for each of ``code`` and the :data:`PINNED`
    versions that differ between two :func:`origin` records."""
    return [f"{key}: {expected[key]} (client) != {got.get(key)} (worker)"
            for key in ("code", "sfxlin", *PINNED) if got.get(key) != expected[key]]


def _refuse(expected, got):
    wrong = mismatch(expected, got)
    if wrong:
        raise WorkerMismatch(f"worker {got.get('where')} runs other code than this client ({'; '.join(wrong)}); "
                             "every worker needs the client's install (the same sfxlin checkout and library "
                             "versions): its cells are refused, none was kept")


def absolute_inputs(config):
    """``config`` with every file parameter's path made absolute in this process's folder (a
    ``file.nc:variable`` keeps its variable): what the workers read. The digests are the ones
    taken when ``config`` was made, so a worker reading another file is caught."""
    if not isinstance(config, Config) or not config.digests:
        return config
    values = dict(config.values)
    for name in config.digests:
        text = os.fspath(values[name])
        head, sep, var = text.rpartition(":")
        path, tail = (head, sep + var) if sep and head.endswith(".nc") else (text, "")
        values[name] = str(Path(path).absolute()) + tail
    return dataclasses.replace(config, values=values)


def _check_worker(experiment, files):
    """Run on a worker: its :func:`origin` and, for each ``{name: (spec, sha256)}``, why it cannot
    read that file as configured (``{}`` when it can)."""
    from ..realdata import source_sha256

    problems = {}
    for name, (spec, sha256) in files.items():
        try:
            now = source_sha256(spec, name)
        except (OSError, ValueError) as exc:
            problems[name] = f"cannot read {spec!r} ({exc})"
            continue
        if now != sha256:
            problems[name] = f"{spec!r} has sha256 {now[:12]}, not the configured {sha256[:12]}"
    return origin(experiment), problems


def check_workers(client, experiment, config, expected):
    """Ask every connected worker for its :func:`origin` and whether it reads every input file of
    ``config`` as configured: :class:`WorkerMismatch` naming the first that does not."""
    files = {name: (config[name], sha256) for name, sha256 in getattr(config, "digests", {}).items()}
    try:
        answers = client.run(_check_worker, experiment, files)
    except Exception as exc:   # a worker that cannot even load the experiment's code
        raise WorkerMismatch(f"a worker cannot load {experiment.name}'s code ({type(exc).__name__}: {exc}); every "
                             "worker needs the client's install (the same sfxlin checkout, the same outside "
                             "experiment modules on its path)") from exc
    for address, (got, problems) in sorted(answers.items()):
        _refuse(expected, {**got, "where": address})
        for name, why in problems.items():
            raise WorkerMismatch(f"{name}: worker {address} {why}; on a cluster every input file must be readable by "
                                 "every worker at the same absolute path (a shared file system)")


def compute_cell(experiment, config, cell, part):
    """Run on a worker: one cell's outputs, the seconds and softmax-core exponentials it took, and
    the :func:`origin` of the process that computed it."""
    start, n_exp = time.perf_counter(), softmax_core.exponentials()
    out = run_cell(experiment, config, cell, part)
    return out, time.perf_counter() - start, softmax_core.exponentials() - n_exp, origin(experiment)


def fill(client, store, progress=None, stream=None) -> set:
    """Compute every cell ``store`` does not keep on the cluster of ``client`` and keep each one in
    ``store`` as it arrives (the client writes: see the module doc). Workers are checked first
    (:func:`check_workers`) and every cell's origin before it is kept (:class:`WorkerMismatch`).
    ``progress``: a :class:`~sfxlin.engine.execution.LineProgress` over the missing cells (None:
    silent). Returns the BLAS kernels that computed the new cells."""
    from distributed import as_completed

    experiment, config = store.experiment, store.config
    expected = origin(experiment)
    remote = absolute_inputs(config)
    check_workers(client, experiment, remote, expected)
    todo = store.missing()
    if progress is not None:
        progress.begin(len(todo))
    futures = {}
    for part, cell in todo:
        key = f"{experiment.rng_name(part)}-cell-{store.fingerprint(cell, part)}"
        futures[client.submit(compute_cell, experiment, remote, cell, part, key=key, pure=False)] = (part, cell)
    kernels = set()
    try:
        for future in as_completed(futures):
            part, cell = futures[future]
            out, seconds, exponentials, got = future.result()
            _refuse(expected, got)
            store.save(cell, out, part, seconds=seconds, exponentials=exponentials, blas=got["blas"])
            kernels.add(got["blas"])
            future.release()   # kept: the worker may forget it
            if progress is not None:
                progress.advance()
    finally:
        client.cancel(list(futures))
        if progress is not None:
            progress.end()
    return kernels
