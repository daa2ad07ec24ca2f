"""C1 for your own head: fits, L*(eps), verdicts and the figure, from a ``c1_own`` results file alone.

Per sampling mode (``iid``, ``window``): the regime of the 1/L law (:func:`regime`), the log-log line of
the error to the tokens' exact limit over it with its SE clustered over the seed x prompt units, the constant
``L * mse`` against the predicted one (``const_sharp``; ``tau * const_sharp`` for windows), and ``L*(eps)``,
where the relative error ``sqrt(mse / limit_sq)`` is eps, with its predictions; none beyond the sampling's
:func:`reach`, where the finite file bends the error (windows: the finite-population correction ``1 - L/n``).
The definitions and why: docs/own_head.md, "A finite file" and "How to read it".
"""
from __future__ import annotations

import json

import numpy as np
import xarray as xr
from scipy.special import stdtrit

from .c1 import panels, saved
from .fits import MIN_LINE_POINTS, loglog_slope, ols_line, too_few
from .tables import column, make_table
from .verdicts import Criteria, Inconclusive, judged_where

__all__ = ["CRITERIA", "UNITS", "REGIME", "EXTRAPOLATION", "FILE_SHARE", "predicted_constant", "reach",
           "regime", "last_regime_L", "unit_lines", "lstar_of", "window_crossing", "slopes",
           "constants", "lstar", "measures", "verdicts", "fit_tables", "figure"]

#: the dims of the independent units: every prompt of every seed (the head and the query set are
#: fixed by the file; a prompt is shared by the queries and nested along L)
UNITS = ("seed", "prompt")

#: the regime of the 1/L law: L >= REGIME x the effective-sample factor (see :func:`regime`)
REGIME = 10.0

#: C1O-Lstar judges the eps whose predicted L* is at most this many times the regime's largest L
EXTRAPOLATION = 4.0

#: windows are fitted (slope, constant, the line's L*) only at ``L <= FILE_SHARE * n``: the finite-population
#: correction ``1 - L/n`` stays >= 0.95 there, and bends the local slope by at most 0.053
FILE_SHARE = 0.05


def _tau_used(ds) -> xr.DataArray:
    """The factor of the constant per sampling: ``tau`` for windows, 1 for i.i.d. prompts."""
    return xr.where(ds.sampling == "window", ds.tau, 1.0)


def predicted_constant(ds) -> xr.DataArray:
    """``const_sharp`` (i.i.d.) or ``tau * const_sharp`` (windows), per sampling."""
    return ds.const_sharp * _tau_used(ds)


def reach(ds) -> xr.DataArray:
    """Per sampling, the longest prompt a fit or an ``L*`` may speak for: ``n`` (``n_tokens``) for i.i.d.
    prompts (beyond, an eps finer than the file resolves its own limit), ``FILE_SHARE * n`` for windows."""
    return xr.where(ds.sampling == "window", FILE_SHARE, 1.0) * ds.n_tokens


def regime(ds) -> xr.DataArray:
    """``REGIME * weight_ratio * max(tau, 1) <= L`` (tau for windows; 1 for i.i.d.), and for windows
    ``L <= FILE_SHARE * n`` (:func:`reach`), per (sampling, L)."""
    short = ds.L >= REGIME * ds.weight_ratio * np.maximum(_tau_used(ds), 1.0)
    return short & ((ds.sampling != "window") | (ds.L <= reach(ds)))


def last_regime_L(ds) -> xr.DataArray:
    """Per sampling, the regime's largest L (NaN where the regime is empty)."""
    return ds.L.astype(float).where(regime(ds)).max("L")


def _at_last(ds, da) -> xr.DataArray:
    """``da`` (with an ``L`` dim) at the regime's largest L, per sampling (NaN where the regime is empty)."""
    return da.where(ds.L == last_regime_L(ds)).sum("L", min_count=1)


def unit_lines(ds) -> xr.Dataset:
    """Per sampling: the log-log line ``log mse = c + s log L`` of the unit mean over the regime's L
    and the covariance of ``(c, s)`` across the units.

    Each unit ``g`` (a prompt of a seed) has the line ``(c_g, s_g)`` (:func:`~.fits.ols_line`) of its
    pseudo-observations ``log ybar + (y_g - ybar) / ybar`` (the linearisation of the unit mean, as
    in :func:`~.fits.loglog_slope`); their mean is the unit-mean line exactly, so its covariance is
    the units' sample covariance over ``G``: statsmodels' CR1 cluster covariance of the pooled fit but
    its factor ``(nG - 1) / (nG - 2)``. Returns ``c``, ``s``, ``var_c``, ``var_s``, ``cov_cs`` and ``G``
    (NaN where fewer than 3 L are in the regime)."""
    keep = regime(ds)
    ybar = ds.mse.mean(UNITS)
    z = (np.log(ybar) + (ds.mse - ybar) / ybar).where(keep)
    lines = ols_line(z, np.log(ds.L.astype(float)), "L")
    c, s = lines.intercept.drop_attrs(), lines.slope.drop_attrs()
    G = int(np.prod([ds.sizes[u] for u in UNITS]))
    moment = lambda a, b: ((a - a.mean(UNITS)) * (b - b.mean(UNITS))).sum(UNITS) / ((G - 1) * G)  # noqa: E731
    out = xr.Dataset({"c": c.mean(UNITS), "s": s.mean(UNITS), "var_c": moment(c, c), "var_s": moment(s, s),
                      "cov_cs": moment(c, s)})
    return out.reset_coords(drop=True).assign_coords(G=G)


def lstar_of(lines: xr.Dataset, target, alpha: float = 0.05) -> xr.Dataset:
    """``L*`` where the line ``log y = c + s log L`` of :func:`unit_lines` meets ``log target``, with its
    ``1 - alpha`` interval (delta method on ``log L* = (log target - c) / s``, Student-t with ``G - 1``
    dof): ``L_star``, ``L_star_low``, ``L_star_high``; NaN where the line does not fall (``s >= 0``) or
    ``target <= 0``."""
    s, c = lines.s, lines.c
    with np.errstate(all="ignore"):
        g = (np.log(target) - c) / s
        var = (lines.var_c + 2 * g * lines.cov_cs + g * g * lines.var_s) / (s * s)
    half = stdtrit(max(int(lines.G) - 1, 1), 1 - alpha / 2) * np.sqrt(np.maximum(var, 0.0))
    ok = (s < 0) & (target > 0)
    return xr.Dataset({"L_star": np.exp(g), "L_star_low": np.exp(g - half),
                       "L_star_high": np.exp(g + half)}).where(ok).drop_attrs()


def _few(n):
    return too_few(n, MIN_LINE_POINTS, "prompt lengths in the regime", "a log-log slope")


def _per_sampling(ds, values):
    """``values`` (over sampling), or Inconclusive naming the first sampling with too few regime L."""
    for s, n in zip(ds.sampling.values, regime(ds).sum("L").values):
        if _few(int(n)):
            where = f" x tau, L <= {FILE_SHARE:g} n" if s == "window" else ""
            return Inconclusive(f"{s}: {_few(int(n))} (L >= {REGIME:g} x weight_ratio{where})")
    return values()


def _slope_gap(ds, alpha=0.05):
    """Distance from -1 to the ``1 - alpha`` interval of the unit-mean slope (0 when it holds -1), per
    sampling: the interval ``s +- t(G - 1) sqrt(var_s)`` of :func:`unit_lines`."""
    lines = unit_lines(ds)
    half = stdtrit(max(int(lines.G) - 1, 1), 1 - alpha / 2) * np.sqrt(lines.var_s)
    return np.maximum(np.maximum((lines.s - half) + 1.0, -1.0 - (lines.s + half)), 0.0)


CRITERIA = Criteria("C1", units=UNITS)


@CRITERIA("C1O-slope", "log-log slope in L of the error to the tokens' exact limit over the regime "
          "(L >= 10 x weight_ratio, x tau for windows; windows at L <= n / 20), every sampling", "in", (-1.15, -0.85),
          reference="-1 (law of large numbers; for windows, of a stationary mixing sequence)",
          reason="the error is const / L + O(1/L^2) once the effective sample L / (weight_ratio tau) is >= 10; "
                 "+-0.15 covers the O(weight_ratio tau / L) curvature left at the regime's start and the slope's "
                 "Monte Carlo SE (~0.02-0.04 with 256 units)",
          quick=(-1.5, -0.5))
def _slope(ds):
    return _per_sampling(ds, lambda: unit_lines(ds).s)


@CRITERIA("C1O-slope-interval", "distance from -1 to the 95% interval of that slope (clustered over seed x "
          "prompt; 0 when the interval holds -1), every sampling", "<=", 0.0, reference="0",
          reason="the interval follows the design (units = prompts, nested along L) and widens with fewer units: "
                 "a correct 1/L law puts -1 inside it in 95% of the runs per sampling, at every profile",
          profile="any")
def _slope_interval(ds):
    return _per_sampling(ds, lambda: _slope_gap(ds))


@CRITERIA("C1O-constant", "L * mse at the regime's largest L / predicted constant (tr V C_mu V^T i.i.d., x tau "
          "for windows), every sampling", "in", (0.75, 1.33), reference="1 (SNIS delta method; docs/models.md)",
          reason="1 + O(weight_ratio tau / L); the unit mean of 256 squared errors has a relative SE of 5-10% "
                 "(heavier than chi-square: shared prompts, tilted weights) and the batch-means tau of a few "
                 "thousand tokens 5-15%: the band is ~3 SE of their combination",
          quick=(0.4, 2.5))
def _constant(ds):
    return _per_sampling(ds, lambda: constants(ds).ratio)


@CRITERIA("C1O-Lstar", "L*(eps) on the fitted line / the sharp prediction const / (eps^2 limit_sq), every "
          "(sampling, eps) whose predicted L* is at most 4 x the regime's largest L and within the file's reach (n "
          "i.i.d., n / 20 windows)", "in", (0.67, 1.5), reference="1",
          reason="L* is defined (the line falls) and agrees with the prediction: within the measured range the "
                 "line's value is the constant's (C1O-constant band); extrapolating by up to 4x (log 4 = 1.4) adds "
                 "1.4 x the slope's error (<= 0.15) to log L*: the band is their sum; beyond 4x or the reach, shown "
                 "(within the reach), not judged",
          quick=(0.3, 3.0))
def _lstar(ds):
    def ratio():
        ls = lstar_of(unit_lines(ds), _target(ds))  # at every eps, whatever the reach
        sharp = _lstar_sharp(ds)
        near = (sharp <= EXTRAPOLATION * last_regime_L(ds)) & (sharp <= reach(ds))
        return judged_where(ls.L_star / sharp, near, ["sampling", "eps"],
                            f"every predicted L*(eps) lies beyond {EXTRAPOLATION:g} x the regime's largest L or the "
                            "file's reach (shown, not judged)")
    return _per_sampling(ds, ratio)


@CRITERIA("C1O-decomposition", "mse to the Gaussian surrogate / (bias_gauss + mse to the exact limit) at the "
          "largest L, every sampling", "in", (0.85, 1.15), reference="1",
          reason="E||f_L - f_g||^2 = E||f_L - f_inf||^2 + ||f_inf - f_g||^2 + 2 E<f_L - f_inf, f_inf - f_g>: the "
                 "cross term's mean is O(1/L) and its noise a few % of the sum with 256 units",
          quick=(0.6, 1.4))
def _decomposition(ds):
    last = ds.isel(L=-1)
    return last.mse_gauss.mean(UNITS) / (ds.bias_gauss + last.mse.mean(UNITS))


measures, verdicts = CRITERIA.measures, CRITERIA.verdicts


# ------------------------------------------------------------------------------------ labelled fits
def slopes(ds) -> xr.Dataset:
    """Per sampling: the log-log line of the error over the regime's L
    (:func:`sfxlin.analysis.fits.loglog_slope`, SE cluster-robust over seed x prompt); NaN where
    fewer than 3 L are in the regime."""
    return loglog_slope(ds.mse.where(regime(ds)), "L", units=UNITS, test_exponent=-1.0, skipna=True)


def constants(ds) -> xr.Dataset:
    """Per sampling: ``L * mse`` at the regime's largest L (unit mean) and its SE over the units, the
    predicted constant (:func:`predicted_constant`), their ratio, and ``L * window_mse`` there (the file's
    exact window error, NaN for i.i.d. prompts): what the finite file gives where the prediction is the
    infinite sequence's."""
    last = _at_last(ds, ds.L * ds.mse)
    mean, se = last.mean(UNITS), last.std(UNITS, ddof=1) / np.sqrt(np.prod([ds.sizes[u] for u in UNITS]))
    pred = predicted_constant(ds)
    file = _at_last(ds, ds.L * ds.window_mse).where(ds.sampling == "window")
    return xr.Dataset({"constant": mean, "constant_se": se, "predicted": pred, "ratio": mean / pred,
                       "file": file})


def _eps(ds) -> xr.DataArray:
    """The relative errors of ``L*(eps)`` (the ``eps`` of the file's configuration), along ``eps``."""
    eps = np.asarray(json.loads(ds.attrs["config"])["eps"], dtype=float)
    return xr.DataArray(eps, dims="eps", coords={"eps": eps})


def _target(ds) -> xr.DataArray:
    """``eps^2 limit_sq`` per eps: the squared error at which the relative error is eps."""
    return _eps(ds) ** 2 * ds.limit_sq


def _lstar_sharp(ds) -> xr.DataArray:
    """``predicted_constant / (eps^2 limit_sq)`` per (sampling, eps), whatever the reach."""
    return predicted_constant(ds) / _target(ds)


def window_crossing(window_mse, L, target) -> np.ndarray:
    """Per value of ``target``, the prompt length at which the exact window error ``window_mse`` (over the
    lengths ``L``) first falls to it, interpolated between the two measured L around the crossing
    (log-log; linear where the later error is 0, a window of the whole file); NaN where it does not fall
    to it within the measured L, or is already there at the first."""
    wm, L = np.asarray(window_mse, dtype=float), np.asarray(L, dtype=float)
    out = np.full(np.shape(target), np.nan)
    if not np.all(np.isfinite(wm)):
        return out
    for i, t in np.ndenumerate(np.asarray(target, dtype=float)):
        below = np.flatnonzero(wm <= t)
        if below.size == 0 or below[0] == 0:
            continue
        j = below[0]
        if wm[j] > 0:
            frac = np.log(wm[j - 1] / t) / np.log(wm[j - 1] / wm[j])
            out[i] = np.exp(np.log(L[j - 1]) + frac * np.log(L[j] / L[j - 1]))
        else:
            out[i] = L[j - 1] + (wm[j - 1] - t) / wm[j - 1] * (L[j] - L[j - 1])
    return out


def lstar(ds, alpha: float = 0.05) -> xr.Dataset:
    """Per (sampling, eps): ``L_star`` (fitted line) with its interval (:func:`lstar_of`), the sharp
    prediction ``L_star_sharp = predicted_constant / (eps^2 limit_sq)``, the Gaussian picture's
    ``L_star_gauss = const_gauss / (eps^2 limit_sq_gauss)``, and ``L_star_surrogate``, where the
    fitted error plus the surrogate's exact squared bias meets ``eps^2 limit_sq`` (inf when the bias
    alone exceeds it): each NaN where it exceeds the sampling's :func:`reach` (never an L* beyond the
    file's length). ``L_star_file`` (windows): where the file's exact window error ``window_mse`` meets
    ``eps^2 limit_sq`` (:func:`window_crossing`), within the measured L; NaN for i.i.d. prompts."""
    eps, target = _eps(ds), _target(ds)
    lines = unit_lines(ds)
    rest = target - ds.bias_gauss
    surrogate = xr.where(rest > 0, lstar_of(lines, rest.where(rest > 0), alpha).L_star, np.inf)
    far = reach(ds)
    line = lstar_of(lines, target, alpha)
    line = line.where(~(line.L_star > far))  # a line's L* beyond the reach is not shown, nor its interval
    out = line.assign(L_star_sharp=_lstar_sharp(ds), L_star_gauss=ds.const_gauss / (eps**2 * ds.limit_sq_gauss),
                      L_star_surrogate=surrogate).drop_vars("G")
    out = out.map(lambda v: v.where(np.isinf(v) | ~(v > far)))  # inf: never (the surrogate's bias), shown
    file = xr.DataArray(window_crossing(ds.window_mse.values, ds.L.values, target.values), dims="eps",
                        coords={"eps": eps.values})
    return out.assign(L_star_file=file.where(ds.sampling == "window")).transpose("sampling", "eps", ...)


def fit_tables(ds) -> dict:
    """``fits``: per sampling the regime, slope (SE, interval), constant and its prediction;
    ``lstar``: per (sampling, eps) L* with its interval and the predictions; ``law``: the head on
    these tokens (weight ratio, tau, the surrogate's relative bias)."""
    fit, const, ls = slopes(ds), constants(ds), lstar(ds)
    first = ds.L.astype(float).where(regime(ds)).min("L")
    fits = make_table({"L_from": column(first, "regime L from", ".0f"),
                       "L_to": column(last_regime_L(ds), "to", ".0f"), "slope": column(fit.slope, "slope", ".3f"),
                       "slope_se": column(fit.slope_se, "SE", ".3f"),
                       "low": column(fit.slope_ci_low, "95% low", ".3f"),
                       "high": column(fit.slope_ci_high, "95% high", ".3f"),
                       "constant": column(const.constant, "L*mse", ".4g"),
                       "constant_se": column(const.constant_se, "SE", ".2g"),
                       "predicted": column(const.predicted, "predicted", ".4g"),
                       "ratio": column(const.ratio, "ratio", ".3f"),
                       "file": column(const.file, "file's exact", ".4g", missing="-")},
                      title=f"per sampling: log-log line of the error to the exact limit over the regime (SE "
                            f"cluster-robust over {ds.sizes['seed']} x {ds.sizes['prompt']} units, seed x prompt), "
                            "L * mse at the regime's largest L against the prediction",
                      notes=f"regime: L >= {REGIME:g} x weight_ratio (x tau for window) and, for window, L <= "
                            f"{FILE_SHARE:g} n (the finite file: 1 - L/n >= {1 - FILE_SHARE:g}); predicted: tr V "
                            "C_mu V^T (the sharp i.i.d. constant) for iid, x tau for window (an infinite sequence); file's "
                            "exact: L * window_mse there, the expected error of a window of this file")
    lst = make_table({"L_star": column(ls.L_star, "L*", ".4g"), "low": column(ls.L_star_low, "95% low", ".4g"),
                      "high": column(ls.L_star_high, "95% high", ".4g"),
                      "sharp": column(ls.L_star_sharp, "L* sharp", ".4g"),
                      "gauss": column(ls.L_star_gauss, "L* Gaussian", ".4g"),
                      "surrogate": column(ls.L_star_surrogate, "L* to surrogate", ".4g", missing="n/a"),
                      "file": column(ls.L_star_file, "L* of the file", ".4g", missing="-")},
                     title="L*(eps): the prompt length at which sqrt(mse / limit_sq) = eps, on the fitted line",
                     notes="limit_sq = mean_q ||V (f_inf(q) - m)||^2; sharp: predicted / (eps^2 limit_sq); Gaussian: "
                           "const_gauss / (eps^2 limit_sq_gauss); to surrogate: error to m + Sigma U q below eps "
                           "(inf: its bias alone exceeds eps); n/a: the line does not fall, or beyond the reach (n "
                           f"for iid: a finer eps than the file resolves its own limit; {FILE_SHARE:g} n for window: "
                           "the finite file bends the error below the line); of the file (window): where the file's "
                           "exact window error meets eps, within the measured L")
    law = make_table({"n": column(ds.n_tokens, "tokens", ".0f"), "w": column(ds.weight_ratio, "w_ratio", ".4g"),
                      "const": column(ds.const_sharp, "tr C", ".4g"),
                      "const_gauss": column(ds.const_gauss, "const Gaussian", ".4g"),
                      "tau": column(ds.tau, "tau", ".3f"), "tau_se": column(ds.tau_se, "SE", ".2g"),
                      "rel_bias": column(np.sqrt(ds.bias_gauss / ds.limit_sq), "rel. bias", ".3g")},
                     title="the head on these tokens: weight ratio, i.i.d. constant, the influence function's "
                           "integrated autocorrelation along the file (batch means), the surrogate's relative bias")
    return {"fits": fits, "lstar": lst, "law": law}


def figure(ds, path):
    """Two panels: the error to the exact limit vs L per sampling with its predictions, fitted line and (windows)
    the file's exact window error; the relative errors against the eps levels with L*(eps) marked
    (docs/own_head.md, "How to read it")."""
    _, fig, axes = panels(2, 12)
    L = ds.L.values.astype(float)
    Lx = np.geomspace(L[0], L[-1] * 4, 50)
    colors = dict(zip(ds.sampling.values.tolist(), ["C0", "C3"]))
    ls, lines, far = lstar(ds), unit_lines(ds), reach(ds)
    ax = axes[0]
    for s, c in colors.items():
        y = ds.mse.sel(sampling=s).stack(unit=UNITS)
        se = y.std("unit", ddof=1) / np.sqrt(y.sizes["unit"])
        ax.errorbar(L, y.mean("unit"), yerr=2 * se, fmt="o", ms=3, color=c, label=f"{s}: measured (2 SE)")
        Ls = Lx[Lx <= float(far.sel(sampling=s))]
        ax.loglog(Ls, float(predicted_constant(ds).sel(sampling=s)) / Ls, "-", lw=1, color=c,
                  label=f"{s}: {'tau ' if s == 'window' else ''}tr C / L")
        c0, s0 = float(lines.c.sel(sampling=s)), float(lines.s.sel(sampling=s))
        if np.isfinite(s0):
            ax.loglog(Ls, np.exp(c0) * Ls**s0, ":", color=c, lw=1.5, label=f"{s}: fit {s0:.2f}")
        if s == "window":
            ax.loglog(L, ds.window_mse, "x-", ms=5, lw=0.6, color=c, label="window: this file, exact")
            if float(far.sel(sampling=s)) <= Lx[-1]:
                ax.axvline(float(far.sel(sampling=s)), color=c, lw=0.6, ls="-.",
                           label=f"window: reach {FILE_SHARE:g} n")
    if np.isfinite(float(ds.const_gauss)):
        ax.loglog(Lx, float(ds.const_gauss) / Lx, "k--", lw=0.8, label="Gaussian picture")
    ax.set(xscale="log", yscale="log", xlabel="prompt length L", ylabel=r"$E\|V(f_L(q) - f_\infty(q))\|^2$",
           title="error to the exact limit of the tokens' law")
    ax.legend(fontsize=7)
    ax = axes[1]
    lim = float(ds.limit_sq)
    for s, c in colors.items():
        ax.loglog(L, np.sqrt(ds.mse.sel(sampling=s).mean(UNITS) / lim), "-o", ms=3, color=c, label=f"{s}: to exact")
        ax.loglog(L, np.sqrt(ds.mse_gauss.sel(sampling=s).mean(UNITS) / lim), "--s", ms=3, color=c, alpha=0.6,
                  label=f"{s}: to surrogate")
        c0, s0 = float(lines.c.sel(sampling=s)), float(lines.s.sel(sampling=s))
        if np.isfinite(s0):
            Lf = np.geomspace(L[0], max(L[-1], float(np.nanmax(ls.L_star.sel(sampling=s).values, initial=L[-1]))), 50)
            ax.loglog(Lf, np.sqrt(np.exp(c0) * Lf**s0 / lim), ":", color=c, lw=1, label=f"{s}: fitted line")
        for e in ls.eps.values:
            for var, mark in (("L_star", "v"), ("L_star_file", "x")):
                v = float(ls[var].sel(sampling=s, eps=e))
                if np.isfinite(v):
                    ax.plot([v], [e], mark, color=c, ms=7)
    for e in ls.eps.values:
        ax.axhline(e, color="grey", lw=0.6, ls=":")
    ax.axhline(np.sqrt(float(ds.bias_gauss) / lim), color="k", lw=0.8, ls="--", label="surrogate's relative bias")
    ax.set(xlabel="prompt length L", ylabel=r"relative error $\sqrt{mse / limit\_sq}$",
           title="relative error; L*(eps): on the fitted line (v), of the file's windows (x)")
    ax.legend(fontsize=7)
    return saved(fig, path)
