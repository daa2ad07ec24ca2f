"""Peak memory and set-up time of one ``c3_dim``-like training cell, in a child process.

The cell (``pipelines/c3_dim.py``'s kernel, its training and held-out evaluation): ``d`` covariates,
``n_pairs = ceil(task_ratio d^2 / n_queries)`` antithetic training pairs (``task_ratio = 4``,
``n_queries = 2``: 512 pairs at d = 16) with prompts of ``L_max`` tokens, ``L = 8, 16, ..., L_max``;
held-out ``heldout_pairs x heldout_queries`` (64 x 4) at ``L_max``; softmax(L), linear(L) and
linear(inf) trained together by :func:`sfxlin.training.train_all_arrays` for ``n_steps`` steps (the
footprint does not grow with the steps), then :func:`sfxlin.training.heldout_risks` at the init and
the last step. The child prints its seconds per phase; ``/usr/bin/time -v`` gives its peak resident
memory (``Maximum resident set size``), and the child's own ``ru_maxrss`` is printed beside it.

    python -m sfxlin.benchmarks.c3_memory [--d 16] [--L-max 16384] [--steps 2]

Set-up is drawing the tasks and building the three models' engines (``SoftmaxPrefixEngine``, the
two ``LinearEngine`` with their ``Ghat_L`` and ``Gamma_w``), timed on their own before the run.
"""
from __future__ import annotations

import argparse
import json
import math
import re
import subprocess
import sys

__all__ = ["one_cell", "bench_c3_memory"]


def one_cell(d, L_max, n_steps=2, n_queries=2, task_ratio=4.0, heldout_pairs=64, heldout_queries=4, seed=0):
    """In this process: the cell of the module doc; returns its phases' seconds and ``ru_maxrss``."""
    import resource
    import time

    import numpy as np

    from sfxlin import icl, laws, training

    seconds = {}
    start = time.perf_counter()
    law = laws.covariate_law("gaussian", np.eye(d))
    rng = np.random.default_rng([seed, d])
    n_pairs = int(math.ceil(task_ratio * d * d / n_queries - 1e-9))
    tasks = icl.make_tasks(rng, d, n_pairs, n_queries, L_max, law)
    held = icl.make_tasks(rng, d, heldout_pairs, heldout_queries, L_max, law)
    seconds["tasks"] = time.perf_counter() - start
    Ls = tuple(8 * 2**k for k in range(int(math.log2(L_max // 8)) + 1))
    start = time.perf_counter()
    engines = [training.SoftmaxPrefixEngine(tasks, Ls, pair_first=True),
               training.LinearEngine(tasks, tasks.Ghat(Ls), pair_first=True),
               training.LinearEngine(tasks, icl.model_matrix("linear_inf", tasks)[None], pair_first=True)]
    seconds["engines"] = time.perf_counter() - start
    del engines
    start = time.perf_counter()
    res = training.train_all_arrays(tasks, Ls, models=("softmax", "linear", "linear_inf"), n_steps=n_steps,
                                    ckpt_every=n_steps, label="c3_memory")
    seconds["train"] = time.perf_counter() - start
    start = time.perf_counter()
    ends = [0, -1]
    at_L, _, _, _ = training.heldout_risks(held, Ls, L_max, {m: res[m]["U"][:, ends] for m in ("softmax", "linear")},
                                           {m: res[m]["v"][:, ends] for m in ("softmax", "linear")},
                                           res["linear_inf"]["U"][ends], res["linear_inf"]["v"][ends])
    seconds["heldout"] = time.perf_counter() - start
    if not np.all(np.isfinite(at_L)):
        raise FloatingPointError("non-finite held-out risks")
    return {"d": d, "L_max": L_max, "n_pairs": n_pairs, "seconds": seconds,
            "ru_maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def measure(d, L_max, n_steps=2):
    """:func:`one_cell` in a child process under ``/usr/bin/time -v``: its result and ``peak_mb``."""
    code = ("import json; from sfxlin.benchmarks.c3_memory import one_cell; "
            f"print(json.dumps(one_cell({d!r}, {L_max!r}, {n_steps!r})))")
    proc = subprocess.run(["/usr/bin/time", "-v", sys.executable, "-c", code], capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f"the cell failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    out["peak_mb"] = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", proc.stderr).group(1)) / 1024
    return out


def bench_c3_memory(d=16, L_max=16384, n_steps=2):
    """Print (and return) the peak memory and the phases' seconds of one cell."""
    r = measure(d, L_max, n_steps)
    s = r["seconds"]
    print(f"c3_dim-like cell: d = {d}, {r['n_pairs']} pairs x 2 queries, L = 8 .. {L_max}, softmax + linear + "
          f"linear_inf, {n_steps} steps, held-out 64 pairs x 4 queries at L = {L_max}")
    print(f"  peak resident memory {r['peak_mb']:8.0f} MB (/usr/bin/time -v; ru_maxrss {r['ru_maxrss_mb']:.0f} MB)")
    print(f"  set-up: tasks {s['tasks']:.2f} s, engines {s['engines']:.2f} s; train {s['train']:.2f} s "
          f"({n_steps} steps, set-up included), held-out {s['heldout']:.2f} s")
    return r


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--d", type=int, default=16)
    parser.add_argument("--L-max", type=int, default=16384)
    parser.add_argument("--steps", type=int, default=2)
    args = parser.parse_args(argv)
    bench_c3_memory(args.d, args.L_max, args.steps)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
