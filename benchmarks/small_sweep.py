"""Small sweeps on threads against the process pool, end to end.

``python -m sfxlin.benchmarks.small_sweep [EXP ...] [--pairs N]``: for each experiment (default
:data:`EXPERIMENTS`, the ones that declare processes and whose quick sweep the cost preview puts
under :data:`sfxlin.engine.plan.POOL_PAYS_CPU_SECONDS`), two commands as child processes, run in
turn (A B A B ...) so that a drift of the machine's speed moves both arms alike:

* **A**, the default: ``sfxlin run EXP --profile quick --fresh --quiet`` (threads, since the
  sweep is small: :func:`sfxlin.engine.plan.small_sweep_scheduler`);
* **B**, the pool: the same with ``--local-scheduler processes``.

Prints the median wall and CPU seconds of each arm (CPU: user + system of the child and its
processes, the operating system's accounting) and the median of the pairwise ratios A / B, and
checks that the two arms' files carry the same data in every variable (the scheduler changes no
bit: the determinism contract).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

from ._child import run_child

__all__ = ["EXPERIMENTS", "bench_small_sweeps", "paired", "same_data", "summary"]

EXPERIMENTS = ("c3_transfer", "c2_concentration", "c3_real", "c3_horizon")


def paired(cmd_a, cmd_b, pairs):
    """Run ``cmd_a`` and ``cmd_b`` in turn, ``pairs`` times each: ``{"a": [(wall, cpu), ...], "b": [...]}``."""
    runs = {"a": [], "b": []}
    for _ in range(int(pairs)):
        runs["a"].append(run_child(cmd_a)[:2])
        runs["b"].append(run_child(cmd_b)[:2])
    return runs


def summary(runs):
    """Medians of :func:`paired`'s runs: ``a_wall, a_cpu, b_wall, b_cpu`` and the medians of the
    pairwise ratios ``wall_ratio``, ``cpu_ratio`` (A / B, pair by pair)."""
    (a_wall, a_cpu), (b_wall, b_cpu) = zip(*runs["a"]), zip(*runs["b"])
    return {"a_wall": statistics.median(a_wall), "a_cpu": statistics.median(a_cpu),
            "b_wall": statistics.median(b_wall), "b_cpu": statistics.median(b_cpu),
            "wall_ratio": statistics.median(x / y for x, y in zip(a_wall, b_wall)),
            "cpu_ratio": statistics.median(x / y for x, y in zip(a_cpu, b_cpu))}


def same_data(path_a, path_b) -> list[str]:
    """The names of the data variables and coordinates in which two results files differ (values,
    NaNs in place, dims; the file attrs, such as the scheduler, are not compared): [] when none."""
    import numpy as np
    import xarray as xr

    a, b = xr.load_dataset(path_a), xr.load_dataset(path_b)
    names = sorted(set(a.variables) | set(b.variables))
    return [n for n in names if n not in a.variables or n not in b.variables or a[n].dims != b[n].dims
            or not np.array_equal(a[n].values, b[n].values, equal_nan=a[n].dtype.kind in "fc")]


def bench_small_sweeps(experiments=EXPERIMENTS, pairs=3, verbose=True):
    """Time each experiment's quick sweep as it runs by default and on the process pool (module
    doc): ``{experiment: summary(...)}``. AssertionError if the two arms' files differ."""
    results = {}
    for name in experiments:
        with tempfile.TemporaryDirectory() as tmp:
            base = [sys.executable, "-m", "sfxlin.cli", "run", name, "--profile", "quick", "--fresh", "--quiet"]
            runs = paired(base + ["--out", f"{tmp}/a"], base + ["--out", f"{tmp}/b", "--local-scheduler", "processes"],
                          pairs)
            stem = next(Path(tmp, "a").glob("*.nc")).name
            differ = same_data(Path(tmp, "a", stem), Path(tmp, "b", stem))
        if differ:
            raise AssertionError(f"{name}: the default and the process-pool runs differ in {', '.join(differ)}")
        results[name] = res = summary(runs)
        if verbose:
            print(f"{name:18s} default {res['a_wall']:6.2f} s wall {res['a_cpu']:6.2f} s CPU | processes "
                  f"{res['b_wall']:6.2f} s wall {res['b_cpu']:6.2f} s CPU | default / processes: wall "
                  f"{res['wall_ratio']:.2f}, CPU {res['cpu_ratio']:.2f} (median of {pairs} pairs); files equal",
                  flush=True)
    if verbose:
        print(f"load average (1, 5, 15 min): {', '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} cores")
    return results


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("experiments", nargs="*", default=list(EXPERIMENTS))
    p.add_argument("--pairs", type=int, default=3)
    args = p.parse_args(argv)
    if args.pairs < 1:
        raise SystemExit(f"--pairs must be >= 1, got {args.pairs}")
    bench_small_sweeps(args.experiments, args.pairs)
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
