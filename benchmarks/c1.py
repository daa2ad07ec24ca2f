"""Benchmarks: each engine against its reference on the same inputs, ratio measured in one run."""
from __future__ import annotations

import time

import numpy as np

from sfxlin.attention import softmax_attention, softmax_attention_prefix

__all__ = ["bench_c1", "best_time"]


def best_time(fn, repeat=5, clock=time.perf_counter):
    """Best time of ``repeat`` calls (the least disturbed by a shared machine) and the last result;
    wall time, or another ``clock`` (``time.process_time``: the CPU seconds of the process)."""
    best, out = np.inf, None
    for _ in range(repeat):
        start = clock()
        out = fn()
        best = min(best, clock() - start)
    return best, out


def bench_c1(d=5, n_prompts=64, n_queries=4, L_max=16384, repeat=5, seed=0):
    """Prefix evaluation of all nested prompt lengths vs a per-L loop over the same prompts.

    Two grids of 11 prompt lengths up to ``L_max``: doubling (2^4 .. 2^14, sum L ~ 2 L_max) and
    evenly spaced (sum L ~ 6 L_max). Checks both give the same outputs, prints times and ratios.
    """
    rng = np.random.default_rng(seed)
    Z = rng.standard_normal((n_queries, n_prompts, L_max, d))
    q = rng.standard_normal((n_queries, 1, d))
    U = rng.standard_normal((d, d))
    U *= 0.5 / np.linalg.norm(U)
    V = np.eye(d)
    grids = {"doubling": [L_max >> k for k in range(10, -1, -1)],
             "evenly spaced": np.linspace(L_max / 11, L_max, 11).astype(int).tolist()}
    print(f"bench c1: softmax attention at 11 nested prompt lengths, L_max = {L_max}, d = {d}, "
          f"{n_queries} queries x {n_prompts} prompts, best of {repeat}")
    rows = []
    for name, Ls in grids.items():
        t_prefix, prefix = best_time(lambda: softmax_attention_prefix(Z, U, V, q, Ls), repeat)
        t_loop, loop = best_time(lambda: np.stack([softmax_attention(Z[..., :L, :], U, V, q) for L in Ls], -2), repeat)
        err = float(np.max(np.abs(prefix - loop)))
        if not err <= 1e-12:
            raise RuntimeError(f"prefix and per-L outputs differ by {err:.3g}")
        ratio = t_loop / t_prefix
        print(f"  {name:14s} sum L = {sum(Ls):6d}: per-L loop {t_loop * 1e3:8.1f} ms, prefix {t_prefix * 1e3:8.1f} ms, "
              f"ratio {ratio:5.2f}x, max |difference| {err:.1e}")
        rows.append((name, t_loop, t_prefix, ratio, err))
    return rows
