"""One BLAS thread inside every cell (sfxlin.threads): a cell's bits do not depend on the core count."""
from __future__ import annotations

import os
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from threadpoolctl import OpenBLASController, threadpool_info, threadpool_limits

from sfxlin.threads import single_threaded_blas

# a c1_real cell: its Gaussian surrogate fits the covariance of 1797 x 5 tokens with a BLAS product
# large enough for OpenBLAS to split across threads; before the limit, 1 and 2 threads differed by
# 1 ulp in mse_gauss and bias_gauss
CELL = """
import hashlib, numpy as np
from sfxlin.pipelines import c1_real
from sfxlin.engine.sweep import run_cell
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


@pytest.fixture
def two_blas_threads():
    """Every BLAS library at 2 threads for the test (each one's count restored after): a pin to
    1 and its restore are then told apart whatever the machine's core count."""
    if not _blas_threads():
        pytest.skip("no BLAS library loaded that threadpoolctl can see")
    OpenBLASController.clear_controlling_thread(force=True)
    limiter = threadpool_limits(limits=2, user_api="blas")
    OpenBLASController.clear_controlling_thread(force=True)
    try:
        if _threads_now() != {2}:
            pytest.skip(f"the BLAS libraries refuse 2 threads here (have {_blas_threads()})")
        yield 2
    finally:
        OpenBLASController.clear_controlling_thread(force=True)
        limiter.restore_original_limits()
        OpenBLASController.clear_controlling_thread(force=True)


def _threads_now():
    """The set of the BLAS libraries' thread counts: ``{1}`` when every one is pinned."""
    return set(_blas_threads())


def test_the_last_holder_restores_while_the_pinning_thread_lives_on(two_blas_threads):
    """A pins, B (the main thread) enters, A leaves but lives on, B leaves: B's restore must take
    effect though threadpoolctl gives control to A, the thread that pinned; A can pin again after."""
    n = two_blas_threads
    a_in, b_in, a_left, a_again = (threading.Event() for _ in range(4))
    seen = {}

    def thread_a():
        with single_threaded_blas():
            a_in.set()
            b_in.wait(10)
        a_left.set()
        a_again.wait(10)          # alive, outside the block, while B leaves
        with single_threaded_blas():
            seen["A pins again"] = _threads_now()
        seen["A restores again"] = _threads_now()

    a = threading.Thread(target=thread_a)
    a.start()
    a_in.wait(10)
    seen["A pinned"] = _threads_now()
    with single_threaded_blas():
        b_in.set()
        a_left.wait(10)
        seen["A left, B inside"] = _threads_now()
    seen["B left, A alive"] = _threads_now()
    alive = a.is_alive()
    a_again.set()
    a.join()
    assert alive
    assert seen == {"A pinned": {1}, "A left, B inside": {1}, "B left, A alive": {n},
                    "A pins again": {1}, "A restores again": {n}}


def test_pin_and_restore_from_the_main_thread_after_the_pinning_thread_exited(two_blas_threads):
    """A thread pins and exits while the main thread is inside: the main thread's restore, and
    its later pin and restore, take effect."""
    n = two_blas_threads
    entered, main_in = threading.Event(), threading.Event()
    seen = {}

    def pin_then_exit():
        with single_threaded_blas():
            entered.set()
            main_in.wait(10)

    t = threading.Thread(target=pin_then_exit)
    t.start()
    entered.wait(10)
    with single_threaded_blas():
        main_in.set()
        t.join()
        seen["thread gone, main inside"] = _threads_now()
    seen["main left"] = _threads_now()
    with single_threaded_blas():
        seen["main pins"] = _threads_now()
    seen["main restores"] = _threads_now()
    assert seen == {"thread gone, main inside": {1}, "main left": {n}, "main pins": {1}, "main restores": {n}}


def test_a_restore_leaves_no_thread_in_control_of_openblas(two_blas_threads):
    """After a pool thread that lives on pinned and restored, a plain threadpoolctl limit set by
    the main thread takes effect (threadpoolctl ignores it while another live thread controls)."""
    n = two_blas_threads
    with ThreadPoolExecutor(1) as pool:
        assert set(pool.submit(_pinned_threads).result()) == {1}
        with threadpool_limits(limits=1, user_api="blas"):
            inside = _threads_now()
        after = _threads_now()
    assert (inside, after) == ({1}, {n})
