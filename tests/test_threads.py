"""One BLAS thread inside every cell (sfxlin.threads): a cell's bits do not depend on the core count."""
from __future__ import annotations

import os
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from threadpoolctl import threadpool_info

from sfxlin.threads import single_threaded_blas

# a c1_real cell: its Gaussian surrogate fits the covariance of 1797 x 5 tokens with a BLAS product
# large enough for OpenBLAS to split across threads; before the limit, 1 and 2 threads differed by
# 1 ulp in mse_gauss and bias_gauss
CELL = """
import hashlib, numpy as np
from sfxlin.pipelines import c1_real
from sfxlin.sweep import run_cell
exp = c1_real.EXPERIMENT
cfg = exp.configure("quick")
out = run_cell(exp, cfg, {"dataset": "digits", "D": 5, "U_norm": cfg["U_norm"][-1], "seed": 0})
print(hashlib.sha256(b"".join(np.ascontiguousarray(out[k]).tobytes() for k in sorted(out))).hexdigest())
"""


def _blas_threads():
    return [lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"]


def test_a_cell_has_the_same_bits_with_one_and_two_blas_threads():
    digests = []
    for n in ("1", "2"):
        env = {**os.environ, "OPENBLAS_NUM_THREADS": n}
        run = subprocess.run([sys.executable, "-c", CELL], env=env, capture_output=True, text=True, check=True)
        digests.append(run.stdout.strip())
    assert digests[0] == digests[1]


def test_the_limit_holds_while_any_thread_is_inside_and_is_restored_after():
    before = _blas_threads()
    inside, release = threading.Event(), threading.Event()
    seen = {}

    def holder():
        with single_threaded_blas():
            inside.set()
            release.wait(10)

    t = threading.Thread(target=holder)
    t.start()
    inside.wait(10)
    with single_threaded_blas():
        seen["nested"] = _blas_threads()
    seen["other_left"] = _blas_threads()      # the first holder is still inside
    release.set()
    t.join()
    assert set(seen["nested"]) == {1} and set(seen["other_left"]) == {1}
    assert _blas_threads() == before


def test_the_limit_is_restored_when_the_block_raises():
    before = _blas_threads()
    try:
        with single_threaded_blas():
            raise ValueError("boom")
    except ValueError:
        pass
    assert _blas_threads() == before


def test_a_pin_from_another_thread_works_after_a_pool_thread_pinned_and_lives_on():
    """dask's pool threads outlive their cells; threadpoolctl would let only the first pinning
    thread change OpenBLAS's limit (a later pin from the main thread silently did nothing)."""
    before = _blas_threads()
    with ThreadPoolExecutor(1) as pool:                  # the pool thread stays alive below
        inside = pool.submit(lambda: _pinned_threads()).result()
        assert _blas_threads() == before                 # restored by the pool thread
        with single_threaded_blas():
            from_main = _blas_threads()
        assert _blas_threads() == before                 # restored by the main thread
        assert pool.submit(lambda: _pinned_threads()).result() == inside
    assert set(inside) == {1} and set(from_main) == {1}


def _pinned_threads():
    with single_threaded_blas():
        return _blas_threads()
