"""C1 analysis: fits, verdicts and the figure, from a ``c1_limit`` results file alone.

Reads only the documented schema (datasets/README.md): ``mse(law, d, U_norm, L, seed)``,
``mse_asymptotic``, ``bias_exact``, ``mse_query``, ``Uq_sq``, ``mse_scaled_U``,
``quadrature_error`` and the ``criteria`` / ``config`` attrs.

A criterion whose figure cannot be taken from the file (a slope from fewer than 3 prompt lengths,
a change along L from one) is INCONCLUSIVE with the reason; the fit table says the same and shows
the rest.
"""
from __future__ import annotations

import json

import numpy as np
import xarray as xr

from .fits import MIN_LINE_POINTS, loglog_slope, paper_form_fit, too_few
from .verdicts import criteria_from_attrs, evaluate, measure_unless

__all__ = ["slopes", "slope_shortfall", "measures", "verdicts", "fit_table", "figure", "paper_form"]


def slopes(ds: xr.Dataset) -> xr.Dataset:
    """Log-log slope (OLS, SE, 95% CI) of the seed-mean Gaussian error in L, per (d, U_norm)."""
    return loglog_slope(ds.mse.sel(law="gaussian").mean("seed"), "L", test_exponent=-1.0)


def slope_shortfall(ds: xr.Dataset) -> str | None:
    """Why :func:`slopes` cannot be fitted (fewer than 3 prompt lengths), or None."""
    return too_few(ds.sizes["L"], MIN_LINE_POINTS, "prompt lengths", "a log-log slope")


def _growth(da):
    return float((da.isel(L=-1) / da.isel(L=0)).max())


def measures(ds: xr.Dataset) -> dict:
    """Measured figure of every C1 criterion (:class:`~.verdicts.Inconclusive` with the reason
    where the file has too few prompt lengths for it)."""
    gauss = ds.mse.sel(law="gaussian").mean("seed")
    monotone = (gauss.diff("L") < 0).all("L")
    ratio = (ds.mse.sel(law="gaussian") / ds.mse_asymptotic).isel(L=-1).mean("seed")
    top = ds.U_norm.max()
    bounded = dict(law=["rademacher", "uniform"], U_norm=top)
    mse_end = ds.mse.sel(**bounded).isel(L=-1).mean("seed")
    no_step = too_few(ds.sizes["L"], 2, "prompt lengths", "a change along L")
    return {
        "C1-quadrature": float(ds.quadrature_error.max()),
        "C1-slopes": measure_unless(slope_shortfall(ds), lambda: slopes(ds).slope.values.ravel()),
        "C1-monotone": measure_unless(no_step, lambda: float(monotone.mean())),
        "C1-sharp-constant": ratio.values.ravel(),
        "C1-student-t-grows": measure_unless(
            no_step, lambda: _growth(ds.mse.sel(law="student_t", U_norm=top).mean("seed"))),
        "C1-sqrtL-grows": measure_unless(no_step, lambda: _growth(ds.mse_scaled_U.sel(U_norm=top).mean("seed"))),
        "C1-plateau": (mse_end / ds.mse_predicted.sel(**bounded).isel(L=-1).mean("seed")).values.ravel(),
    }


def verdicts(ds: xr.Dataset):
    """PASS / FAIL / INCONCLUSIVE rows of the predeclared criteria."""
    return evaluate(criteria_from_attrs(ds), measures(ds))


def paper_form(ds: xr.Dataset) -> xr.Dataset:
    """Paper-form fit ``L mse_q = c1 exp(c2 sigma^2 ||Uq||^2)`` at the largest L, pooled."""
    sigma = json.loads(ds.attrs["config"])["sigma"]
    L_max = ds.L.values[-1]
    L_mse = L_max * ds.mse_query.isel(L=-1)
    return paper_form_fit(L_mse, sigma**2 * ds.Uq_sq)


def fit_table(ds: xr.Dataset) -> str:
    """Plain-text table of the slopes with SE (or why they are not fitted) and the paper-form fit."""
    ratio = (ds.mse.sel(law="gaussian") / ds.mse_asymptotic).isel(L=-1).mean("seed")
    reason = slope_shortfall(ds)
    fit = None if reason else slopes(ds)
    if fit is None:
        lines = [f"log-log slopes in L: not fitted, {reason}", f"{'d':>3} {'U_norm':>7}  mse/asympt(L_max)"]
    else:
        lines = [f"{'d':>3} {'U_norm':>7} {'slope':>8} {'SE':>7} {'95% CI':>18} {'r2':>7}  mse/asympt(L_max)"]
    for d in ds.d.values:
        for u in ds.U_norm.values:
            cells = f"{d:>3} {u:>7.2f}"
            if fit is not None:
                f = fit.sel(d=d, U_norm=u)
                ci = f"[{float(f.slope_ci_low):.3f}, {float(f.slope_ci_high):.3f}]"
                cells += f" {float(f.slope):>8.3f} {float(f.slope_se):>7.3f} {ci:>18} {float(f.r2):>7.4f}"
            lines.append(f"{cells}  {float(ratio.sel(d=d, U_norm=u)):.3f}")
    n_points = ds.Uq_sq.size
    if n_points >= 3:
        pf = paper_form(ds)
        lines.append(f"paper form L*mse = c1 exp(c2 sigma^2 ||Uq||^2) at L = {int(ds.L.values[-1])}: "
                     f"c2 = {float(pf.c2):.3f} +- {float(pf.c2_se):.3f} (SE), c1 = {float(pf.c1):.3g}, "
                     f"n = {int(pf.n)}")
    else:
        lines.append(f"paper form fit: not fitted ({n_points} queries in all, 3 needed)")
    return "\n".join(lines)


def figure(ds: xr.Dataset, path):
    """Two panels: Gaussian error vs L per (d, U_norm) with the sharp asymptotic line;
    negative controls (Student-t, U ~ sqrt(L), bounded laws with their exact bias)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.8))
    L = ds.L.values
    colors = plt.cm.viridis(np.linspace(0, 0.9, ds.sizes["d"] * ds.sizes["U_norm"]))
    k = 0
    for d in ds.d.values:
        for u in ds.U_norm.values:
            y = ds.mse.sel(law="gaussian", d=d, U_norm=u).mean("seed")
            ax1.loglog(L, y, "o", ms=3, color=colors[k], label=f"d={d}, |U|={u:g}")
            ax1.loglog(L, ds.mse_asymptotic.sel(d=d, U_norm=u).mean("seed"), "-", lw=0.8, color=colors[k])
            k += 1
    ax1.set(xlabel="prompt length L", ylabel=r"$E\|f_L(q) - f_\infty(q)\|^2$",
            title="C1: Gaussian tokens (dots) vs sharp asymptotics (lines)")
    ax1.legend(fontsize=6, ncol=2)
    # the setting where the bounded laws' bias is largest relative to their final error
    share = (ds.bias_exact.sel(law="rademacher") / ds.mse.sel(law="rademacher").isel(L=-1)).mean("seed")
    best = share.where(share == share.max(), drop=True)
    sel = dict(d=best.d.values[0], U_norm=best.U_norm.values[0])
    for law, style in [("gaussian", "k-o"), ("rademacher", "b-s"), ("uniform", "g-^"), ("student_t", "r-v")]:
        ax2.loglog(L, ds.mse.sel(law=law, **sel).mean("seed"), style, ms=3, label=f"{law} tokens")
    for law, c in [("rademacher", "b"), ("uniform", "g")]:
        ax2.axhline(float(ds.bias_exact.sel(law=law, **sel).mean("seed")), color=c, ls=":", lw=1,
                    label=f"{law}: exact bias")
        ax2.loglog(L, ds.mse_predicted.sel(law=law, **sel).mean("seed"), color=c, lw=0.8,
                   label=f"{law}: bias + own SNIS constant / L")
    ax2.loglog(L, ds.mse_scaled_U.sel(**sel).mean("seed"), "m--", label=r"Gaussian, $U \propto \sqrt{L}$")
    ax2.set(xlabel="prompt length L", title=f"controls (d={sel['d']}, |U|={sel['U_norm']:g}), error to the Gaussian limit")
    ax2.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
