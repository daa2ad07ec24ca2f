"""Peak memory of one forward pass of a deep softmax model: blocked vs full (L x L) attention.

``bench_deep_memory()`` runs, each in a fresh Python process (so one configuration's peak does
not hide another's), one forward pass (:func:`sfxlin.models.predict_layers`, compilation
included) of a ``n_layers = 2``, ``n_heads = 2`` softmax :class:`sfxlin.models.Transformer`
(``D = 4``: the C3 tokens, d = 3 covariates and the label) on one Gaussian prompt of ``L`` tokens
with 2 queries, and prints the process's peak resident memory (``resource.getrusage``
``ru_maxrss``) and the wall time of a second, compiled, forward pass. The first row is a
baseline: the same process at ``L = 8`` (the footprint of Python, numpy and JAX themselves).
Blocked: ``L = 4096, 8192, 16384`` (``Transformer.block``, default :data:`sfxlin.models.transformer.BLOCK`);
full (``block=None``): ``L = 4096, 8192``. ``--blocks 256 512 1024``: also the blocked path at
``L = 4096`` for each block size (how the default was chosen).

    python -m sfxlin.benchmarks.deep_memory [--blocks 256 512 1024 2048]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys

__all__ = ["bench_deep_memory", "measure", "one_configuration"]

D, N_LAYERS, N_HEADS, N_QUERIES = 4, 2, 2, 2


def one_configuration(L, block, seed=0):
    """In this process: one forward pass at prompt length ``L`` with ``block`` (``None``: full);
    returns ``{"L", "block", "peak_mb", "seconds"}`` (peak: ``ru_maxrss`` after the first pass,
    compilation included; seconds: a second pass)."""
    import resource
    import time
    import warnings

    import numpy as np

    from sfxlin import models

    rng = np.random.default_rng([seed, L])
    Z = rng.standard_normal((1, L, D))
    z_q = rng.standard_normal((1, N_QUERIES, D))
    model = models.Transformer(D, N_LAYERS, N_HEADS, block=block)
    params = model.init(np.random.default_rng([seed, 1]), U_scale=0.3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", models.RateConditionWarning)
        out = models.predict_layers(model, "softmax", params, Z, z_q)
        peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss       # KiB on Linux
        start = time.perf_counter()
        again = models.predict_layers(model, "softmax", params, Z, z_q)
        seconds = time.perf_counter() - start
    if not np.array_equal(out, again) or not np.all(np.isfinite(out)):
        raise RuntimeError("two forward passes differ or are not finite")
    return {"L": L, "block": block, "peak_mb": peak_kb / 1024, "seconds": seconds}


def measure(L, block):
    """:func:`one_configuration` in a fresh subprocess (its own peak)."""
    code = ("import json, sys; from sfxlin.benchmarks.deep_memory import one_configuration as f; "
            f"print(json.dumps(f({L!r}, {block!r})))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if proc.returncode:
        return {"L": L, "block": block, "peak_mb": float("nan"), "seconds": float("nan"),
                "error": (proc.stderr.strip().splitlines() or ["killed"])[-1]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def bench_deep_memory(blocks=()):
    """Print (and return) the rows: baseline, blocked at 4096/8192/16384, full at 4096/8192, and
    the blocked path at ``L = 4096`` for each of ``blocks``."""
    from sfxlin.models.transformer import BLOCK

    configs = [(8, BLOCK)] + [(L, BLOCK) for L in (4096, 8192, 16384)] + [(L, None) for L in (4096, 8192)]
    configs += [(4096, b) for b in blocks if b != BLOCK]
    print(f"bench deep memory: one forward pass, softmax, {N_LAYERS} layers x {N_HEADS} heads, D = {D}, "
          f"1 prompt, {N_QUERIES} queries; fresh process per row (ru_maxrss, compilation included)")
    rows = []
    for L, block in configs:
        r = measure(L, block)
        rows.append(r)
        path = "full" if block is None else f"block {block}"
        note = f"  ({r['error']})" if "error" in r else ""
        print(f"  L = {L:6d}  {path:>10}: peak {r['peak_mb']:8.0f} MB, forward {r['seconds']:7.3f} s{note}")
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, nargs="*", default=[],
                        help="block sizes to compare at L = 4096 (besides the default)")
    args = parser.parse_args(argv)
    bench_deep_memory(args.blocks)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
