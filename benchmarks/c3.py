"""Benchmark of the C3 training engine against the plain per-L reference, on the same workload.

``bench_c3()`` builds the paper's C3 tasks (d = 3, 48 antithetic pairs x 2 queries, prompts up
to 4096 tokens, L = 8, 16, ..., 4096, lr 0.01), trains softmax(L), linear(L) for every L and
linear(inf) for ``n_steps`` steps with the fast engine (:func:`sfxlin.training.train_all_arrays`)
and with the per-L, per-step reference (:mod:`sfxlin.testing.reference_c3`), checks that every
checkpoint agrees, and reports both timings (ms per gradient step, all models and all L
together) and their ratio. Timings are the best of ``repeats`` runs (wall clock, one process;
the reference, being slow, runs once).

It also times, in the same run, the one cost no exact float64 engine can avoid: ``np.exp`` of
the logits of one step (one per antithetic pair, query, prompt length and token:
``n_pairs * n_queries * sum(Ls)``), and prints the ratio an engine would reach if that were
its only cost.

``bench_c3_dims()`` (``sfxlin bench c3 --d 3,8,16``): the softmax engine alone at each ``d`` against
its floor, in one run: per ``d`` the milliseconds of a step (a 22-step run less a 2-step run, over
20), and the floor of a step, ``np.exp`` of its logits plus its necessary multiply-adds (``d + 2`` a
logit for the logit, ``2 d + 1`` for the moments ``E_p[1, x, x y]``) at the rate of one large
``np.matmul``, with both parts and the ratio.
"""
from __future__ import annotations

import math
import time

import numpy as np
from threadpoolctl import threadpool_limits

from sfxlin import icl, laws, training
from sfxlin.benchmarks.c1 import best_time
from sfxlin.testing import reference_c3

__all__ = ["bench_c3", "bench_c3_dims", "c3_bench_tasks", "exp_floor_ms", "max_rel_diff", "DIM_WORKLOADS"]

PAPER_LS = tuple(8 * 2**k for k in range(10))
#: the workload of :func:`bench_c3_dims` per d: (antithetic pairs, largest L)
DIM_WORKLOADS = {3: (48, 4096), 8: (128, 2048), 16: (512, 1024)}


def c3_bench_tasks(seed=0, setting="isotropic", n_pairs=48, n_queries=2, L_max=4096, d=3):
    """The C3 training tasks of the benchmark (``setting``: ``isotropic`` = I_d or
    ``anisotropic`` = diag(2, 1, 0.5))."""
    Sigma = {"isotropic": np.eye(d), "anisotropic": np.diag([2.0, 1.0, 0.5])}[setting]
    rng = np.random.default_rng([seed, 3])
    return icl.make_tasks(rng, d, n_pairs, n_queries, L_max, laws.Gaussian(cov=Sigma))


def max_rel_diff(fast, ref, models=icl.MODELS):
    """Largest ``max|a - b| / max|b|`` over models and the arrays U, v, risk of two training
    results (:func:`~sfxlin.training.train_all_arrays` layout)."""
    worst = 0.0
    for m in models:
        for k in ("U", "v", "risk"):
            a, b = np.asarray(fast[m][k]), np.asarray(ref[m][k])
            worst = max(worst, float(np.max(np.abs(a - b)) / np.max(np.abs(b))))
    return worst


def exp_floor_ms(n, repeats=5, seed=0):
    """Best-of-``repeats`` wall time (ms) of ``np.exp`` on ``n`` float64 logits drawn uniformly
    in [-10, 0] (the range of shifted logits), written to a preallocated array."""
    s = np.random.default_rng(seed).uniform(-10.0, 0.0, int(n))
    out = np.empty_like(s)
    return 1e3 * best_time(lambda: np.exp(s, out=out), max(1, repeats))[0]


def bench_c3(n_steps=100, *, repeats=3, seed=0, setting="isotropic", Ls=PAPER_LS, ckpt_every=20,
             lr=0.01, pair_first=(False, True), verbose=True):
    """Time the fast engine and the per-L reference on the same C3 workload.

    Returns a dict: ``ms_per_step_reference``, ``ms_per_step_fast`` (for ``pair_first=False``;
    wall time of the whole run, set-up included, over ``n_steps + 1`` evaluations),
    ``ratio`` (reference / fast), ``ms_per_step_fast_pair_first`` and ``ratio_pair_first`` when
    requested, ``ms_setup_fast[_pair_first]`` (a 0-step run: set-up and one evaluation),
    ``max_rel_diff`` (worst over all checkpoints, models and arrays, per engine mode),
    ``n_exp_per_step`` and ``ms_exp_floor`` (the time of ``np.exp`` on that many logits; see
    :func:`exp_floor_ms`), ``ratio_exp_bound`` (reference / floor), and the workload. Raises
    AssertionError if the trajectories disagree beyond 1e-10.

    The machine matters: with glibc's default allocator the reference's large temporaries
    (6 MB at L = 4096) are returned to the OS and page-faulted back every step, which about
    doubles its time; ``MALLOC_MMAP_THRESHOLD_=1000000000 MALLOC_TRIM_THRESHOLD_=2000000000``
    removes that (the fast engine preallocates its buffers and is unaffected).
    """
    tasks = c3_bench_tasks(seed, setting)
    ckpt_every = math.gcd(n_steps, ckpt_every) or 1
    U0, v0 = icl.init_theta(tasks.d, tasks.Sigma)
    kw = dict(lr=lr, n_steps=n_steps, ckpt_every=ckpt_every, U0=U0, v0=v0)
    modes = (pair_first,) if isinstance(pair_first, bool) else tuple(pair_first)
    out = dict(n_steps=n_steps, Ls=list(Ls), n_tasks=tasks.n_tasks, n_queries=tasks.n_queries,
               setting=setting, models=list(icl.MODELS))

    t0 = time.perf_counter()
    ref = reference_c3.train_reference_all(tasks, Ls, **kw)
    t_ref = time.perf_counter() - t0
    out["ms_per_step_reference"] = 1e3 * t_ref / (n_steps + 1)

    for mode in modes:
        best, fast = best_time(
            lambda: training.train_all_arrays(tasks, Ls, pair_first=mode, label="bench_c3", **kw),
            max(1, repeats))
        t0 = time.perf_counter()
        training.train_all_arrays(tasks, Ls, pair_first=mode, **dict(kw, n_steps=0, ckpt_every=1))
        setup = time.perf_counter() - t0          # set-up plus one evaluation
        diff = max_rel_diff(fast, ref)
        suffix = "_pair_first" if mode else ""
        out["ms_per_step_fast" + suffix] = 1e3 * best / (n_steps + 1)
        out["ms_setup_fast" + suffix] = 1e3 * setup
        out["ratio" + suffix] = out["ms_per_step_reference"] / out["ms_per_step_fast" + suffix]
        out["max_rel_diff" + suffix] = diff
        out["n_exact_shift_steps" + suffix] = fast["n_exact_shift_steps"]
        if not diff <= 1e-10:
            raise AssertionError(f"fast engine (pair_first={mode}) disagrees with the reference: "
                                 f"max relative difference {diff:.3g}")
    out["n_exp_per_step"] = tasks.n_tasks // 2 * tasks.n_queries * sum(Ls)
    out["ms_exp_floor"] = exp_floor_ms(out["n_exp_per_step"], repeats=max(5, repeats))
    out["ratio_exp_bound"] = out["ms_per_step_reference"] / out["ms_exp_floor"]
    if verbose:
        print(f"C3 benchmark: {setting}, {tasks.n_tasks} tasks x {tasks.n_queries} queries, "
              f"L = {list(Ls)}, {n_steps} steps, models {list(icl.MODELS)}")
        print(f"  reference (per-L loop)  {out['ms_per_step_reference']:8.2f} ms/step")
        for mode in modes:
            sfx = "_pair_first" if mode else ""
            name = "fast, pair_first" if mode else "fast"
            print(f"  {name:<22} {out['ms_per_step_fast' + sfx]:8.2f} ms/step   "
                  f"ratio {out['ratio' + sfx]:5.1f}x   max rel diff {out['max_rel_diff' + sfx]:.1e}   "
                  f"(set-up + first step {out['ms_setup_fast' + sfx]:.0f} ms, included)")
        print(f"  floor: np.exp alone     {out['ms_exp_floor']:8.2f} ms/step   "
              f"ratio {out['ratio_exp_bound']:5.1f}x   ({out['n_exp_per_step']:,} logits a step, "
              "one per pair, query, L and token: the bound of an engine that computed nothing else)")
    return out



def _cpu_best(fn, repeats):
    """Best CPU seconds of this process over ``repeats`` calls of ``fn``."""
    return best_time(fn, repeats, clock=time.process_time)[0]


def matmul_rate(n=1536, repeats=5, seed=0):
    """Multiply-adds a second of one large ``n x n`` by ``n x n`` ``np.matmul`` (best of ``repeats``,
    CPU seconds)."""
    rng = np.random.default_rng(seed)
    a, b = rng.standard_normal((n, n)), rng.standard_normal((n, n))
    out = np.empty((n, n))
    return n**3 / _cpu_best(lambda: np.matmul(a, b, out=out), repeats)


def bench_c3_dims(ds=(3, 8, 16), *, workloads=None, n_queries=2, steps=(2, 22), repeats=3, seed=0, verbose=True):
    """The softmax(L) engine's step at each ``d`` against the floor of that step, in one run.

    ``workloads``: ``{d: (n_pairs, L_max)}`` (default :data:`DIM_WORKLOADS`), ``L = 8, 16, ...,
    L_max``, isotropic Gaussian covariates, ``n_queries`` queries, the Eq. 9 init, lr 0.01,
    ``models=("softmax",)``. A step's time is the difference of runs of ``steps[1]`` and
    ``steps[0]`` steps over ``steps[1] - steps[0]`` (set-up cancels), each the best of
    ``repeats``. The floor: ``np.exp`` of the step's ``n_pairs * n_queries * sum(L)`` logits (one per
    pair: partners share them), plus ``3 d + 3`` multiply-adds a logit at :func:`matmul_rate`. All
    times are CPU seconds of this process with the BLAS held to one thread (the engine's products
    run on one; other jobs on a shared machine then disturb the times less than the wall clock).

    Returns a list of dicts per ``d``: ``d``, ``n_pairs``, ``L_max``, ``n_logits``, ``ms_step``,
    ``ms_exp``, ``ms_madd``, ``gmadd_per_s``, ``ms_floor``, ``ratio``."""
    workloads = {**DIM_WORKLOADS, **(workloads or {})}
    rows = []
    with threadpool_limits(1):
        rate = matmul_rate()
        for d in ds:
            n_pairs, L_max = workloads[d]
            Ls = tuple(L for L in (8 * 2**k for k in range(32)) if L <= L_max)
            rng = np.random.default_rng([seed, d, 3])
            tasks = icl.make_tasks(rng, d, n_pairs, n_queries, Ls[-1], laws.Gaussian(cov=np.eye(d)))

            def run(n, tasks=tasks, Ls=Ls):
                training.train_all_arrays(tasks, Ls, models=("softmax",), lr=0.01, n_steps=n, ckpt_every=n,
                                          label="bench_c3_dims")

            short, long = np.inf, np.inf
            for _ in range(repeats):        # in turn, so that both see the same machine
                short = min(short, _cpu_best(lambda: run(steps[0]), 1))
                long = min(long, _cpu_best(lambda: run(steps[1]), 1))
            n_logits = n_pairs * n_queries * sum(Ls)
            ms_step = 1e3 * (long - short) / (steps[1] - steps[0])
            logits = np.random.default_rng(seed).uniform(-10.0, 0.0, n_logits)
            exps = np.empty_like(logits)
            ms_exp = 1e3 * _cpu_best(lambda: np.exp(logits, out=exps), max(5, repeats))
            ms_madd = 1e3 * n_logits * (3 * d + 3) / rate
            rows.append(dict(d=d, n_pairs=n_pairs, L_max=Ls[-1], n_logits=n_logits, ms_step=ms_step, ms_exp=ms_exp,
                             ms_madd=ms_madd, gmadd_per_s=rate / 1e9, ms_floor=ms_exp + ms_madd,
                             ratio=ms_step / (ms_exp + ms_madd)))
    if verbose:
        print(f"C3 engine against its floor: softmax(L) alone, {n_queries} queries, L = 8, 16, ..., L_max; a step = "
              f"({steps[1]}-step run - {steps[0]}-step run) / {steps[1] - steps[0]}, best of {repeats}; CPU time of "
              "this process, BLAS on one thread")
        print(f"  floor = np.exp of the step's logits + (3d + 3) multiply-adds a logit at one large np.matmul's rate "
              f"({rows[0]['gmadd_per_s']:.1f} G multiply-adds/s)" if rows else "")
        print(f"  {'d':>3} {'pairs':>6} {'L_max':>6} {'logits':>10} {'ms/step':>9} {'exp ms':>8} {'madd ms':>8} "
              f"{'floor ms':>9} {'ratio':>6}")
        for r in rows:
            print(f"  {r['d']:3d} {r['n_pairs']:6d} {r['L_max']:6d} {r['n_logits']:10,d} {r['ms_step']:9.2f} "
                  f"{r['ms_exp']:8.2f} {r['ms_madd']:8.2f} {r['ms_floor']:9.2f} {r['ratio']:6.2f}")
    return rows


if __name__ == "__main__":  # pragma: no cover
    bench_c3()
