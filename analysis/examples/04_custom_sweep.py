"""Run a small custom sweep on a dask.distributed LocalCluster, then analyse it.

``sfxlin.run`` is ``sfxlin run`` from Python: the parameters as Python values, every finished cell
kept in ``OUT_DIR/.c1_limit.cells`` (run it twice: the second run computes nothing), the file and its
figure saved in ``OUT_DIR``. The same code runs on an existing cluster: pass address="tcp://host:8786"
instead of workers.
Run: python analysis/examples/04_custom_sweep.py [OUT_DIR]
"""
import sys

import sfxlin


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "runs/custom"
    # the quick profile with a few values changed, each checked against its declared parameter
    ds = sfxlin.run("c1", out=out, d=[2, 4], U_norm=[0.2, 0.4], n_seeds=2, workers=2)
    print(f"computed {ds.attrs['n_cells']} cells on {ds.attrs['scheduler']}; saved in {out}")
    print(ds.mse.sel(law="gaussian").mean("seed").sfx.loglog_slope("L")[["slope", "slope_se"]].to_dataframe().round(3))
    print(ds.sfx.verdict_table())


if __name__ == "__main__":  # worker processes re-import this file: start the cluster only here
    main()
