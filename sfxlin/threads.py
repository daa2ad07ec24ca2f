"""One BLAS thread inside every cell, so a cell's bits do not depend on the machine's core count.

OpenBLAS splits a large matrix product across its threads, and the split changes the order of
the floating-point sums: the same cell computed with 1 and with 2 BLAS threads can differ in
the last bits (measured on a ``c1_real`` cell: ``mse_gauss`` and ``bias_gauss`` by 1 ulp). Cells
already run in parallel (one dask task each), so the engine runs every cell under
:func:`single_threaded_blas`: the same answer on a laptop, a 2-core CI runner and a cluster node,
and no oversubscription (dask threads x BLAS threads).

The limit is process-wide (OpenBLAS has one thread pool per process); it is held while any cell
of the process runs and the previous limits are restored when the last one finishes. threadpoolctl
lets only one Python thread (the first to set a limit, as long as it lives) change OpenBLAS's
limit and silently ignores the others; dask's pool threads live on, so a pin made by one of them
would make every later pin from another thread a no-op (seen: after a threads-scheduler run, the
main thread's pin left 2 BLAS threads and a c1_real cell changed its last bits). Every pin and
restore here is serialised by one lock and first releases that control (``force=True``).
"""
from __future__ import annotations

import threading
from contextlib import contextmanager

from threadpoolctl import OpenBLASController, threadpool_limits

__all__ = ["single_threaded_blas"]

_lock = threading.Lock()
_holders = 0
_limits = None


@contextmanager
def single_threaded_blas():
    """Limit every loaded BLAS library to one thread while the block runs (re-entrant and safe
    across threads: the limit stays on until the last concurrent holder leaves)."""
    global _holders, _limits
    with _lock:
        if _holders == 0:
            OpenBLASController.clear_controlling_thread(force=True)
            _limits = threadpool_limits(limits=1, user_api="blas")
        _holders += 1
    try:
        yield
    finally:
        with _lock:
            _holders -= 1
            if _holders == 0:
                OpenBLASController.clear_controlling_thread(force=True)   # this thread may not be the pinning one
                _limits.restore_original_limits()
                OpenBLASController.clear_controlling_thread(force=True)
                _limits = None
