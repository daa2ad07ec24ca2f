"""Off-block curvature of stored C3 trajectories against the stored perturbed run.

``python -m sfxlin.benchmarks.curvature_agreement FILE [N]``: for every protocol cell of the C3
results file ``FILE`` (made with ``perturbed_run`` on, e.g. ``datasets/c3_transfer.nc``), redraws
the cell's training tasks from its generator, computes the off-block Hessian of softmax(L) at the
last ``N`` checkpoints (default 6) of the stored main run (:mod:`sfxlin.curvature`) and prints,
per L: the range of ``lr lambda_max``, the predicted per-step growth factor
``rho = max |1 - lr lambda|``, the measured per-step factor of the stored perturbed run over each
checkpoint interval, and the final off-block mass over the perturbation (near 1e-4 and below the
perturbation sits at the rounding floor, ~1e-16, and its measured factor is noise).
"""
from __future__ import annotations

import json
import sys

import numpy as np

__all__ = ["agreement"]


def agreement(path, n_last=6):
    """Rows ``(setting, seed, L, lr*lambda_max range, rho range, measured range, final/eps)``."""
    import xarray as xr

    from sfxlin import covariance, curvature, icl, laws
    from sfxlin.pipelines import c3_transfer as c3
    from sfxlin.pipelines.families.c3 import SETTINGS
    from sfxlin.engine.sweep import cell_rng

    with xr.open_dataset(path) as ds:
        ds = ds.load()
    cfg = dict(c3.EXPERIMENT.configure(None, values=json.loads(ds.attrs["config"])))   # a version-1 matrix: a spec
    Ls, lr = cfg["L"], cfg["lr"]
    if "off_block_perturbed" not in ds or not np.all(np.isfinite(ds.off_block_perturbed.sel(model="softmax")
                                                                 .where(ds.in_protocol == 1, 1.0))):
        raise ValueError(f"{path}: needs the perturbed run (a file made with perturbed_run on)")
    dt = int(ds.t[1] - ds.t[0])
    tsel = slice(-int(n_last), None)
    rows = []
    for setting in cfg["settings"]:
        for seed in range(c3.seeds_of(cfg, setting)):
            rng = cell_rng(c3.NAME, {"setting": setting, "seed": seed}, cfg["root_seed"])
            Sigma = covariance.from_spec(cfg[f"Sigma_{setting}"], cfg["d"])
            tasks = icl.make_tasks(rng, cfg["d"], cfg["n_pairs"], cfg["n_queries"], Ls[-1],
                                   laws.covariate_law(SETTINGS[setting], Sigma))
            cell = ds.sel(setting=setting, seed=seed, model="softmax")
            H = curvature.off_block_hessian("softmax", tasks, Ls, cell.U.values[:, tsel], cell.v.values[:, tsel])
            lo, hi = curvature.curvature_extremes(H)
            rho = curvature.spectral_radius(lo, hi, lr)
            p = cell.off_block_perturbed.values[:, tsel]
            measured = (p[:, 1:] / p[:, :-1]) ** (1 / dt)
            final = cell.off_block_perturbed.values[:, -1] / cell.off_block_perturbed.values[:, 0]
            for i, L in enumerate(Ls):
                rows.append((setting, seed, L, (lr * hi[i].min(), lr * hi[i].max()), (rho[i].min(), rho[i].max()),
                             (measured[i].min(), measured[i].max()), final[i]))
    return rows


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if not 1 <= len(argv) <= 2:
        print(__doc__.splitlines()[2], file=sys.stderr)
        return 2
    for st, seed, L, e, r, m, f in agreement(argv[0], int(argv[1]) if len(argv) > 1 else 6):
        print(f"{st:11s} seed {seed} L {L:5d}: lr*lambda_max {e[0]:.3f}..{e[1]:.3f}  rho {r[0]:.4f}..{r[1]:.4f}  "
              f"measured growth/step {m[0]:.4f}..{m[1]:.4f}  final/eps {f:.2g}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
