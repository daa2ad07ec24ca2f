"""Where a sweep's time went, read from its results file: each cell's duration (the
``cell_timeline`` attribute written on a local scheduler), how busy the cores were, the serial
tail, and how a cell's cost grows along each numeric grid dim (the log-log slope of its duration,
with the other grid dims as fixed effects, and its standard error: statsmodels OLS).

    python -m sfxlin.benchmarks.cell_costs datasets/*.nc

Durations are wall seconds of each task as the scheduler saw it (on processes: pickling
included); on a shared machine they carry its load. Only blocks of one cell enter the fits.

And how far the cells are from the ``np.exp`` floor (:func:`floor_share`): a file of ``sfxlin run``
records each cell's kernel seconds (``cell_seconds``) and the logits it exponentiated in the
softmax core (``cell_exponentials``); ``np.exp`` of that many logits, timed in this process
(:func:`exp_seconds_per_logit`), is the least any exact float64 engine computing them could take.
The JAX models' softmax is not counted (it runs in XLA, not in the core).
"""
from __future__ import annotations

import argparse
import json
import re
import sys

import numpy as np

__all__ = ["exp_seconds_per_logit", "floor_share", "growth", "summary", "timeline", "utilisation"]

_RANGE = re.compile(r"(\w+)\[(\d+):(\d+)\]")
_PART = re.compile(r"^(\w+):")


def timeline(ds):
    """``[{part, coords, worker, start, end}]`` from ``ds.attrs["cell_timeline"]``; ``coords`` maps
    each grid dim to its value (blocks of one cell) or None (a block of several cells)."""
    if "cell_timeline" not in ds.attrs:
        raise ValueError("the file has no cell_timeline attribute (computed on a dask cluster, or by an older "
                         "sfxlin): nothing to read")
    rows = []
    for block, worker, start, end in json.loads(ds.attrs["cell_timeline"]):
        named = _PART.match(block)           # "part:d[0:1],..." (another part) or "d[0:1],..." (the main one)
        part, where = (named.group(1), block[named.end():]) if named else ("", block)
        ranges = {dim: (int(a), int(b)) for dim, a, b in _RANGE.findall(where)}
        single = all(b - a == 1 for a, b in ranges.values())
        coords = {dim: ds[dim].values[a].item() for dim, (a, b) in ranges.items()} if single else None
        rows.append(dict(part=part, coords=coords, worker=worker, start=float(start), end=float(end)))
    return rows


def utilisation(rows):
    """``(cell_seconds, n_workers, span, busy, tail)``: the summed task time, the workers seen, the
    span from the first start to the last end, the fraction of ``n_workers x span`` spent in tasks,
    and the tail: the seconds at the end during which fewer than ``n_workers`` tasks ran."""
    cell_seconds = sum(r["end"] - r["start"] for r in rows)
    n_workers = len({r["worker"] for r in rows})
    t0, t1 = min(r["start"] for r in rows), max(r["end"] for r in rows)
    span = t1 - t0
    # starts before ends at the same instant: a worker that takes its next task at once never idles
    events = sorted([(r["start"], -1) for r in rows] + [(r["end"], 1) for r in rows])
    running, tail_from = 0, t1
    for time, minus_step in events:
        before, running = running, running - minus_step
        if before >= n_workers > running:
            tail_from = time           # the last drop below every worker busy
        elif running >= n_workers:
            tail_from = t1
    busy = cell_seconds / (n_workers * span) if span > 0 else 1.0
    return cell_seconds, n_workers, span, busy, t1 - tail_from


def growth(rows, dim):
    """Log-log slope of a cell's duration along ``dim`` with the other grid dims of these rows as
    fixed effects: ``(slope, standard error, n_cells, values)``, or None when ``dim`` is not numeric
    and positive with >= 3 values."""
    import statsmodels.api as sm

    cells = [r for r in rows if r["coords"] is not None and dim in r["coords"]]
    values = sorted({r["coords"][dim] for r in cells})
    numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 for v in values)
    if len(values) < 3 or not numeric:
        return None
    X = [np.log([r["coords"][dim] for r in cells])]
    for other in sorted(set(cells[0]["coords"]) - {dim}):
        levels = sorted({str(r["coords"][other]) for r in cells})
        X += [np.array([str(r["coords"][other]) == level for r in cells], dtype=float) for level in levels[1:]]
    design = sm.add_constant(np.column_stack(X), has_constant="add")
    y = np.log([max(r["end"] - r["start"], 1e-6) for r in cells])
    fit = sm.OLS(y, design).fit()
    return float(fit.params[1]), float(fit.bse[1]), len(cells), values


def exp_seconds_per_logit(n=785_664, repeats=20):
    """Seconds of ``np.exp`` per float64 logit on this machine now: the best of ``repeats`` calls
    on ``n`` logits in [-10, 0] (the size of one C3 engine step, as ``sfxlin bench c3``'s floor)."""
    import time

    x = np.random.default_rng(0).uniform(-10.0, 0.0, n)
    out = np.empty_like(x)
    best = np.inf
    for _ in range(repeats):
        start = time.perf_counter()
        np.exp(x, out=out)
        best = min(best, time.perf_counter() - start)
    return best / n


def floor_share(ds, per_logit):
    """``(cell seconds, logits, floor seconds)`` of the cells that record both (``cell_seconds``
    and ``cell_exponentials``), the floor being ``logits * per_logit``; None when the file records
    no exponentials (made before they were counted, or merged)."""
    if "cell_exponentials" not in ds.attrs or "cell_seconds" not in ds.attrs:
        return None
    key = lambda part, coords: (part, json.dumps(coords, sort_keys=True))
    seconds = {key(p, c): s for p, c, s in json.loads(ds.attrs["cell_seconds"])}
    pairs = [(seconds.get(key(p, c)), n) for p, c, n in json.loads(ds.attrs["cell_exponentials"])]
    pairs = [(s, n) for s, n in pairs if s is not None and n is not None]
    cell_seconds, logits = sum(s for s, _n in pairs), sum(n for _s, n in pairs)
    return cell_seconds, logits, logits * per_logit


def summary(ds, per_logit=None):
    """The lines :func:`main` prints for one results file (with the floor when ``per_logit``, the
    seconds of ``np.exp`` per logit, is given)."""
    rows = timeline(ds)
    cell_seconds, n_workers, span, busy, tail = utilisation(rows)
    lines = [f"{ds.attrs.get('experiment', '?')}: wall {float(ds.attrs.get('wall_seconds', np.nan)):.1f} s "
             f"({ds.attrs.get('scheduler', '?')}), {len(rows)} tasks on {n_workers} workers, {cell_seconds:.1f} "
             f"task-seconds, cores busy {busy:.0%}, tail {tail:.1f} s with a core idle"]
    for part in sorted({r["part"] for r in rows}):
        mine = [r for r in rows if r["part"] == part]
        durations = np.array([r["end"] - r["start"] for r in mine])
        line = (f"  part {part or 'main'!r}: {len(mine)} tasks, {durations.sum():.1f} s, per task median "
                f"{np.median(durations):.2f} s (min {durations.min():.2f}, max {durations.max():.2f})")
        fits = []
        dims = sorted({d for r in mine if r["coords"] for d in r["coords"]})
        for dim in dims:
            g = growth(mine, dim)
            if g is not None:
                fits.append(f"{dim} {g[0]:+.2f} +- {g[1]:.2f} (values {', '.join(f'{v:g}' for v in g[3])})")
        lines.append(line + ("; cost ~ " + "; ".join(fits) if fits else ""))
    share = None if per_logit is None else floor_share(ds, per_logit)
    if share is not None:
        cell_seconds, logits, floor = share
        lines.append(f"  floor: {logits:,} logits exponentiated in the softmax core; np.exp of as many takes "
                     f"{floor:.1f} s here ({per_logit * 1e9:.2f} ns a logit), {floor / cell_seconds:.1%} of the "
                     f"cells' {cell_seconds:.1f} kernel seconds")
    elif per_logit is not None:
        lines.append("  floor: the file records no cell_exponentials")
    return lines


def main(argv=None):
    from sfxlin.engine.storage import load

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", help="results files (.nc) written by sfxlin run")
    args = parser.parse_args(argv)
    per_logit = exp_seconds_per_logit()
    for path in args.files:
        ds = load(path)   # the file's records (cell_timeline, cell_seconds, ...) among its attrs
        try:
            print("\n".join(summary(ds, per_logit)))
        except ValueError as exc:
            print(f"{path}: {exc}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
