"""Run a small custom sweep on a dask.distributed LocalCluster, then analyse it.

The same code runs on an existing cluster: pass address="tcp://host:8786" instead of workers.
Run: python analysis/examples/04_custom_sweep.py [OUT_DIR]
"""
import sys
from pathlib import Path

from sfxlin.engine.execution import compute
from sfxlin.pipelines import c1_limit
from sfxlin.engine.storage import save
from sfxlin.engine.sweep import build


def main():
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "runs")
    # the quick profile with a few values changed, checked against the declared parameters
    config = c1_limit.EXPERIMENT.configure("quick", ["d=2,4", "U_norm=0.2,0.4", "n_seeds=2"])
    lazy = build(c1_limit.EXPERIMENT, config)  # nothing computed yet: one dask task per cell
    print(lazy.mse)
    ds, wall, label = compute(lazy, workers=2, progress=False)
    path = save(ds, out / "c1_custom.nc")  # complete: criteria, configuration and provenance came with build()
    print(f"computed {ds.attrs['n_cells']} cells in {wall:.1f} s on {label}; saved {path}")
    print(ds.mse.sel(law="gaussian").mean("seed").sfx.loglog_slope("L")[["slope", "slope_se"]].to_dataframe().round(3))
    print(ds.sfx.verdict_table())


if __name__ == "__main__":  # worker processes re-import this file: start the cluster only here
    main()
