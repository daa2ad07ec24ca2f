"""The C3 family's analysis (c3_transfer, c3_deep, c3_dim, c3_horizon, c3_landscape, c3_real,
c3_shift): what its experiments share.

Every C3 experiment trains models on in-context regression and reads trajectory measures along the
prompt length: a distance of softmax(L)'s parameters to a limit's (its largest over the run), a
held-out risk, their slopes in L on the mean over independent seeds. A seed is one training run,
its tasks shared by every L and model (nested prompts) and its checkpoints one trajectory, so the
points of a curve along L share draws: the slopes' SEs are cluster-robust over the seeds
(:func:`seed_slopes`), Student-t with seeds - 1 dof; with one seed there is no interval (NaN:
``n/a (1 seed)`` in the tables).
"""
from __future__ import annotations

import json

import numpy as np
import xarray as xr

from .fits import loglog_slope

__all__ = ["LINE", "ONE_SEED", "config", "increases", "panels", "positive_slopes", "save", "seed_line", "seed_slopes",
           "softmax"]

#: the variables of :func:`seed_line`'s line
LINE = ("slope", "se", "ci_low", "ci_high")

#: what a table shows for an SE that one seed cannot give
ONE_SEED = "n/a (1 seed)"


def softmax(da: xr.DataArray) -> xr.DataArray:
    """``da`` of the softmax(L) model (its ``model`` coordinate dropped)."""
    return da.sel(model="softmax", drop=True)


def seed_slopes(da: xr.DataArray, dim: str = "L", *, cov_type: str | None = None, alpha: float = 0.05,
                **kw) -> xr.Dataset:
    """The log-log slope along ``dim`` of the seed mean of ``da`` with its SE and interval
    (:func:`~.fits.loglog_slope` ``units="seed"``; ``kw`` as there, e.g. ``skipna=True`` for runs
    outside a protocol or lengths not trained): cluster-robust over the seeds by default
    (``cov_type="nonrobust"``: the plain OLS SE of the mean curve, by name). With one seed (in the
    file, or present), the run's slope and NaN for its cluster SE and interval."""
    if da.sizes["seed"] >= 2:
        return loglog_slope(da, dim, units="seed", cov_type=cov_type, alpha=alpha, **kw)
    cluster = cov_type in (None, "cluster")
    fit = loglog_slope(da.isel(seed=0, drop=True), dim, cov_type="nonrobust" if cluster else cov_type, alpha=alpha,
                       **kw)
    return fit.assign({v: fit[v] * np.nan for v in ("slope_se", "slope_ci_low", "slope_ci_high")}) if cluster else fit


def positive_slopes(da: xr.DataArray, dim: str = "L", **kw) -> xr.Dataset:
    """:func:`seed_slopes` of ``da`` along ``dim`` (its fields, coordinates dropped), NaN where the seed mean of
    ``da`` is not positive and finite at every point along ``dim`` (no log there)."""
    mean = da.mean("seed")
    positive = (np.isfinite(mean) & (mean > 0)).all(dim)
    fit = seed_slopes(da.where(positive, 1.0), dim, **kw)
    return fit[["slope", "slope_se", "slope_ci_low", "slope_ci_high"]].reset_coords(drop=True).where(positive)


def increases(da: xr.DataArray, dim: str = "L") -> xr.DataArray:
    """Number of steps along ``dim`` at which ``da`` increases (NaN where a value along it is not finite)."""
    return (da.diff(dim) > 0).sum(dim).where(np.isfinite(da).all(dim))


def seed_line(T: xr.DataArray, alpha: float = 0.05) -> xr.Dataset:
    """Log-log line in L of the seed mean of ``T`` (dims ``seed``, ``L`` and any other) over the L at
    which ``T`` is finite in every seed: ``slope``, ``se``, ``ci_low``, ``ci_high`` (level ``1 - alpha``,
    cluster-robust over the seeds; with one seed the run's slope and NaN for the rest) and ``n_L`` (the L
    fitted). NaN where fewer than 3 L are fitted (:func:`~.c3_family.seed_slopes`)."""
    every = np.isfinite(T).all("seed")
    fit = seed_slopes(T.where(every), alpha=alpha, skipna=True)
    out = xr.Dataset({k: fit[f] for k, f in zip(LINE, ("slope", "slope_se", "slope_ci_low", "slope_ci_high"))})
    return out.drop_attrs().reset_coords(drop=True).assign(n_L=every.sum("L"))


def config(ds: xr.Dataset) -> dict:
    """The configuration the file was made with (its ``config`` attr; ``{}`` without one)."""
    return json.loads(ds.attrs.get("config", "{}"))


def panels(shape, figsize, **kw):
    """``(plt, fig, axes)``: a matplotlib figure (Agg backend) of ``shape`` panels, ``(columns,)`` or ``(rows,
    columns)``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(*shape, figsize=figsize, **kw)
    return plt, fig, axes


def save(fig, path, dpi: int, title: str | None = None):
    """``fig`` (with the suptitle ``title``) laid out and written to ``path`` (a file name or a writable binary
    file object), then closed; returns ``path``."""
    import matplotlib.pyplot as plt

    if title is not None:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path
