"""The C3 protocol end to end: ``sfxlin run c3 --profile paper`` against a seed-style per-L loop.

Both arms run as child processes of one call, one after the other, on the same tasks:

* **sweep**: ``sfxlin run c3 --profile paper --fresh`` (every protocol cell on the experiment's
  local scheduler, a process per core), ``n_steps`` and ``heldout_every`` overridable to shorten
  both arms alike;
* **seed-style loop** (:func:`seed_loop`, one process, one core): for each protocol cell, the
  same draws from the cell's generator (training and held-out tasks), then, for every prompt
  length, gradient descent on softmax(L) and on linear(L) with the plain per-L, per-step numpy
  reference (:mod:`sfxlin.testing.reference_c3`), linear(inf) once, and the held-out risks of
  every model at its L and at ``L_eval`` at the same checkpoints (``icl.risk``). It checks that
  its trajectories equal the sweep's file (1e-10 relative): the same protocol, not a lookalike.

Prints both wall times, their ratio and the load average. ``python -m sfxlin.benchmarks.protocol
--seed-loop FILE`` runs the loop arm alone against a results file.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

from ._child import run_child

__all__ = ["bench_protocol", "seed_loop"]


def seed_loop(path):
    """The seed-style loop over the protocol cells of the C3 results file ``path`` (its config):
    returns the largest relative difference of its trajectories and held-out risks from the file's."""
    import xarray as xr

    from sfxlin import covariance, icl, laws
    from sfxlin.pipelines import c3_transfer as c3
    from sfxlin.pipelines.families.c3 import SETTINGS
    from sfxlin.engine.sweep import cell_rng
    from sfxlin.testing import reference_c3

    with xr.open_dataset(path) as ds:
        ds = ds.load()
    config = c3.EXPERIMENT.configure(None, values=json.loads(ds.attrs["config"]))   # a version-1 matrix: a spec
    Ls, L_eval = config["L"], config["L_eval"]
    kw = dict(lr=config["lr"], n_steps=config["n_steps"], ckpt_every=config["ckpt_every"])
    worst = 0.0
    for setting in config["settings"]:
        for seed in range(c3.seeds_of(config, setting)):
            rng = cell_rng(c3.NAME, {"setting": setting, "seed": seed}, config["root_seed"])
            Sigma = covariance.from_spec(config[f"Sigma_{setting}"], config["d"])
            law = laws.covariate_law(SETTINGS[setting], Sigma)
            tasks = icl.make_tasks(rng, config["d"], config["n_pairs"], config["n_queries"], Ls[-1], law)
            held = icl.make_tasks(rng, config["d"], config["heldout_pairs"], config["heldout_queries"],
                                  max(Ls[-1], L_eval), law)
            U0, v0 = icl.init_theta(config["d"], Sigma)
            ref = reference_c3.train_reference_all(tasks, Ls, U0=U0, v0=v0, **kw)
            sub = np.flatnonzero(np.isin(ref["softmax"]["t"], ds.t_heldout.values))
            cell = ds.sel(setting=setting, seed=seed)
            for i, m in enumerate(c3.MODELS):
                at_L = np.array([icl.risk(m, ref[m]["U"][j, sub], ref[m]["v"][j, sub], held, L)
                                 for j, L in enumerate(Ls)])
                at_eval = np.array([icl.risk(m, ref[m]["U"][j, sub], ref[m]["v"][j, sub], held, L_eval)
                                    for j in range(len(Ls))])
                for mine, theirs in ((ref[m]["U"], cell.U.values[i]), (ref[m]["risk"], cell.risk_train.values[i]),
                                     (at_L, cell.risk_heldout.values[i]), (at_eval, cell.risk_heldout_eval.values[i])):
                    worst = max(worst, float(np.max(np.abs(mine - theirs)) / np.max(np.abs(theirs))))
            worst = max(worst, float(np.max(np.abs(ref["linear_inf"]["U"] - cell.U_inf.values))
                                     / np.max(np.abs(cell.U_inf.values))))
    return worst


def bench_protocol(n_steps=None, heldout_every=None, out=None, verbose=True):
    """Time the C3 paper protocol as a sweep and as a seed-style loop (see the module docstring);
    returns ``dict(sweep_s, loop_s, ratio, max_rel_diff, load)``. Raises AssertionError if the
    loop's trajectories differ from the sweep's by more than 1e-10 (relative)."""
    sets = []
    if n_steps is not None:
        sets += ["--set", f"n_steps={int(n_steps)}"]
    if heldout_every is not None:
        sets += ["--set", f"heldout_every={int(heldout_every)}"]
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(out or tmp)
        sweep_s, _, _ = run_child([sys.executable, "-m", "sfxlin.cli", "run", "c3", "--profile", "paper", *sets,
                             "--out", str(folder), "--fresh", "--force", "--quiet"])
        loop_s, _, text = run_child([sys.executable, "-m", "sfxlin.benchmarks.protocol", "--seed-loop",
                               str(folder / "c3_transfer.nc")])
    diff = float(text.split()[-1])
    res = dict(sweep_s=sweep_s, loop_s=loop_s, ratio=loop_s / sweep_s, max_rel_diff=diff, load=os.getloadavg())
    if verbose:
        print(f"C3 protocol (paper profile{', ' + ' '.join(sets[1::2]) if sets else ''}), wall seconds, one run each:")
        print(f"  sfxlin run c3 (sweep, both cores)      {sweep_s:8.1f} s")
        print(f"  seed-style per-L loop (one process)    {loop_s:8.1f} s   same tasks: max rel diff {diff:.1e}")
        print(f"  ratio loop / sweep                     {res['ratio']:8.2f}x")
        print(f"  load average (1, 5, 15 min): {', '.join(f'{x:.2f}' for x in res['load'])} on {os.cpu_count()} cores")
    if not diff <= 1e-10:
        raise AssertionError(f"the seed-style loop disagrees with the sweep: max relative difference {diff:.3g}")
    return res


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed-loop", metavar="FILE", help="run the loop arm alone against a C3 results file")
    parser.add_argument("--steps", type=int, help="n_steps of both arms (default: the paper profile's)")
    parser.add_argument("--heldout-every", type=int, help="heldout_every of both arms")
    args = parser.parse_args(argv)
    if args.seed_loop:
        print(f"max relative difference {seed_loop(args.seed_loop):.3e}")
        return 0
    bench_protocol(args.steps, args.heldout_every)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
