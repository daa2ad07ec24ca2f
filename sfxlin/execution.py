"""Where and how a lazy Dataset is computed: local threads, processes, or a dask cluster.

Threads on all local cores by default (numpy releases the GIL); ``workers=N`` starts a
``dask.distributed.LocalCluster`` with N single-threaded worker processes; ``address`` joins an
existing cluster (``tcp://host:8786``; dask-jobqueue clusters on SLURM/PBS expose one).
"""
from __future__ import annotations

import contextlib
import os
import time

import dask
import xarray as xr

__all__ = ["compute", "scheduler_label"]

LOCAL_SCHEDULERS = ("threads", "synchronous", "processes")


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


def compute(ds: xr.Dataset, scheduler=None, workers=None, address=None, progress=True):
    """Compute ``ds`` and return ``(computed_ds, wall_seconds, scheduler_label)``.

    Shows a progress bar of tasks (``dask.diagnostics.ProgressBar`` locally, the
    distributed progress bar under a Client) unless ``progress`` is False.
    """
    if scheduler is not None and scheduler not in LOCAL_SCHEDULERS:
        raise ValueError(f"unknown scheduler {scheduler!r}; expected one of {LOCAL_SCHEDULERS}")
    if workers is not None and int(workers) < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    label = scheduler_label(scheduler, workers, address)
    start = time.perf_counter()
    with _client(workers, address) as client:
        if client is not None:
            persisted = ds.persist()
            if progress:
                from distributed import progress as dist_progress

                dist_progress(persisted, notebook=False)
                print()
            result = persisted.compute()
        else:
            bar = contextlib.nullcontext()
            if progress:
                from dask.diagnostics import ProgressBar

                bar = ProgressBar(dt=1.0)
            with bar, dask.config.set(scheduler=scheduler or "threads"):
                result = ds.compute()
    return result, time.perf_counter() - start, label
