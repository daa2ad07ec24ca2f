"""Statistical fits of results files: one vectorised line fitter, and the log-log slope, power law
and paper-form fit built on it. (Threshold regression lives in :mod:`.threshold`.)

Layout (the xskillscore habit): one numpy kernel, :func:`_line_np`, fits every line of its input at
once (the observations on the last axis, every leading axis a cell); one labelled wrapper,
:func:`ols_line`, handles the dims and calls it through ``xr.apply_ufunc(..., dask="parallelized")``,
so a fit runs over every dim that is not an observation dim (a ``resample`` dim of the robustness
included), numpy- and dask-backed alike. The settings of a fit (``method``, ``cov_type``,
``alpha``, ``test_exponent``) travel with the result as scalar coordinates.

The estimators are statsmodels' ``OLS(y, [1, x]).fit(cov_type=..., use_t=True)`` in closed form
(tests/test_fits.py holds statsmodels as their oracle): ``"nonrobust"`` ``s^2 (X'X)^-1``,
``"HC0".."HC3"``, and ``"cluster"`` (CR1: ``G/(G-1) (N-1)/(N-2)`` times the sandwich of the
cluster scores, Student-t with ``G - 1`` dof). A non-finite or non-positive input to a logarithm
is an error naming the offending coordinate, never a silent NaN. This module reads results only:
it imports numpy, scipy and xarray, never the simulation code.
"""
from __future__ import annotations

import numpy as np
import xarray as xr
from scipy.special import stdtr, stdtrit   # Student t: what scipy.stats.t calls, without its import

__all__ = ["COV_TYPES", "LINE_FIELDS", "MIN_LINE_POINTS", "check_alpha", "check_cov_type", "loglog_slope",
           "not_fitted", "ols_line", "paper_form_fit", "power_law_fit", "se_line", "se_note", "slope_shortfall",
           "too_few", "unit_slopes"]

#: covariance estimators of the fits (statsmodels' names). ``"cluster"`` is cluster-robust over the
#: independent units of a fit (``units=``): the default wherever a fit has them.
COV_TYPES = ("cluster", "nonrobust", "HC0", "HC1", "HC2", "HC3")

#: fewest points of a line fit with standard errors.
MIN_LINE_POINTS = 3

#: the variables of :func:`ols_line` (and of :func:`loglog_slope`), with their long name and description.
LINE_FIELDS = {
    "slope": ("slope", "OLS slope of y on x"),
    "slope_se": ("standard error of the slope", "from the covariance estimator cov_type"),
    "slope_ci_low": ("lower confidence limit of the slope", "Student-t interval, level 1 - alpha"),
    "slope_ci_high": ("upper confidence limit of the slope", "Student-t interval, level 1 - alpha"),
    "intercept": ("intercept", "OLS intercept, y at x = 0"),
    "intercept_se": ("standard error of the intercept", "from the covariance estimator cov_type"),
    "intercept_ci_low": ("lower confidence limit of the intercept", "Student-t interval, level 1 - alpha"),
    "intercept_ci_high": ("upper confidence limit of the intercept", "Student-t interval, level 1 - alpha"),
    "r2": ("coefficient of determination", "R^2 of the OLS fit (NaN when y is constant)"),
    "n": ("number of points in the fit", "finite points pooled over the observation dims"),
    "pvalue_slope": ("p-value of slope == 0", "two-sided Student-t test (df n - 2; clusters - 1 for cluster)"),
    "t_test_pvalue": ("p-value of slope == test_exponent", "two-sided Student-t test, df as pvalue_slope"),
}


def check_cov_type(cov_type: str) -> None:
    """Raise ValueError unless ``cov_type`` is one of :data:`COV_TYPES`."""
    if cov_type not in COV_TYPES:
        raise ValueError(f"cov_type must be one of {COV_TYPES}, got {cov_type!r}")


def check_alpha(alpha: float) -> float:
    """``alpha`` as a float; ValueError unless it lies in (0, 1)."""
    alpha = float(alpha)
    if not (0.0 < alpha < 1.0):
        raise ValueError(f"alpha must be in (0, 1), got {alpha!r}")
    return alpha


def too_few(n: int, need: int, what: str, purpose: str) -> str | None:
    """Why a fit cannot be done, or None: ``too_few(1, 3, "prompt lengths", "a log-log slope")`` is
    ``"needs >= 3 prompt lengths for a log-log slope, got 1"`` (the reason of an INCONCLUSIVE verdict)."""
    return f"needs >= {need} {what} for {purpose}, got {n}" if n < need else None


def slope_shortfall(ds, dim: str = "L", what: str = "prompt lengths") -> str | None:
    """Why a log-log slope along ``dim`` of ``ds`` cannot be fitted (fewer than 3 values), or None."""
    return too_few(ds.sizes[dim], MIN_LINE_POINTS, what, "a log-log slope")


def not_fitted(ax, reason: str) -> None:
    """Mark a matplotlib panel whose fit could not be done: ``"not fitted: <reason>"`` at its centre."""
    ax.text(0.5, 0.5, f"not fitted:\n{reason}", transform=ax.transAxes, ha="center", va="center", fontsize=9,
            wrap=True, bbox=dict(facecolor="white", edgecolor="0.6"))


# --------------------------------------------------------------------------------- the kernel


def _line_np(y, x, *, G: int, cov_type: str, alpha: float, test) -> tuple:
    """Every OLS line of ``y`` on ``[1, x]`` at once: ``y``, ``x`` of shape ``(..., N)`` (observations
    last; a non-finite point drops out of its line), the observations of cluster ``g`` those at
    positions ``k N/G + g`` (the units are the last observation dims). Returns the arrays of
    :data:`LINE_FIELDS` over the leading cells, in that order (``t_test_pvalue`` NaN without ``test``).

    Maths in the centred basis ``[1, x - xbar]``, where ``X'X = diag(n, Sxx)``: ``b = Sxy / Sxx``,
    ``a = ybar - b xbar``; residual ``e``; the covariance of ``(a_c, b)`` (``a_c`` the intercept at
    ``xbar``) is ``s^2 diag(1/n, 1/Sxx)`` (nonrobust, ``s^2 = SSR / (n - 2)``) or the sandwich
    ``diag(1/n, 1/Sxx) M diag(1/n, 1/Sxx)`` with ``M`` the sum of the scores ``[e, (x - xbar) e]``'s
    outer products: per point (HC0; HC1 times ``n / (n - 2)``; HC2, HC3 with ``e / (1 - h)^(1/2)``,
    ``e / (1 - h)``, leverage ``h = 1/n + (x - xbar)^2 / Sxx``) or per cluster (CR1); then
    ``var(a) = var(a_c) - 2 xbar cov(a_c, b) + xbar^2 var(b)``. A line with fewer than 3 points or
    one x value is NaN throughout; a cluster fit with one cluster has NaN SEs."""
    y, x = np.broadcast_arrays(np.asarray(y, dtype=np.float64), np.asarray(x, dtype=np.float64))
    with np.errstate(all="ignore"):
        w = np.isfinite(y) & np.isfinite(x)
        n = w.sum(axis=-1).astype(np.float64)
        x0, y0 = np.where(w, x, 0.0), np.where(w, y, 0.0)
        xm, ym = x0.sum(axis=-1) / n, y0.sum(axis=-1) / n
        dx, dy = np.where(w, x0 - xm[..., None], 0.0), np.where(w, y0 - ym[..., None], 0.0)
        sxx, tss = (dx * dx).sum(axis=-1), (dy * dy).sum(axis=-1)
        b = (dx * dy).sum(axis=-1) / sxx
        a = ym - b * xm
        e = dy - b[..., None] * dx
        ssr = (e * e).sum(axis=-1)
        if cov_type == "nonrobust":
            s2 = ssr / (n - 2.0)
            v_ac, v_b, c_ab = s2 / n, s2 / sxx, np.zeros_like(s2)
            df = n - 2.0
        else:
            if cov_type == "cluster":
                s0 = e.reshape(e.shape[:-1] + (-1, G)).sum(axis=-2)
                s1 = (dx * e).reshape(e.shape[:-1] + (-1, G)).sum(axis=-2)
                present = w.reshape(w.shape[:-1] + (-1, G)).any(axis=-2).sum(axis=-1).astype(np.float64)
                scale = present / (present - 1.0) * (n - 1.0) / (n - 2.0)
                df = present - 1.0
            else:
                h = 1.0 / n[..., None] + dx * dx / sxx[..., None]
                s0 = e / {"HC0": 1.0, "HC1": 1.0, "HC2": np.sqrt(1.0 - h), "HC3": 1.0 - h}[cov_type]
                s1 = dx * s0
                scale = n / (n - 2.0) if cov_type == "HC1" else np.ones_like(n)
                df = n - 2.0
            v_ac = scale * (s0 * s0).sum(axis=-1) / (n * n)
            v_b = scale * (s1 * s1).sum(axis=-1) / (sxx * sxx)
            c_ab = scale * (s0 * s1).sum(axis=-1) / (n * sxx)
        fitted = (n >= MIN_LINE_POINTS) & (sxx > 0)
        df = np.where(fitted & (df >= 1), df, np.nan)
        v_a = v_ac - 2.0 * xm * c_ab + xm * xm * v_b
        se_b = np.where(np.isnan(df), np.nan, np.sqrt(v_b))
        se_a = np.where(np.isnan(df), np.nan, np.sqrt(np.maximum(v_a, 0.0)))
        q = stdtrit(df, 1.0 - alpha / 2.0)
        r2 = np.where(tss > 0, 1.0 - ssr / tss, np.nan)
        out = [b, se_b, b - q * se_b, b + q * se_b, a, se_a, a - q * se_a, a + q * se_a, r2, n,
               _t_pvalue(b, se_b, 0.0, df), _t_pvalue(b, se_b, test, df) if test is not None else np.nan * b]
    return tuple(np.where(fitted, v, np.nan) if k != 9 else n for k, v in enumerate(out))


def _t_pvalue(value, se, tested, df):
    """Two-sided Student-t p-value of ``value == tested`` (an SE of 0: 1 if they are equal, else 0)."""
    with np.errstate(all="ignore"):
        p = 2.0 * stdtr(df, -np.abs(value - tested) / se)
    return np.where(se == 0, np.where(value == tested, 1.0, 0.0), p) if np.ndim(se) else p


# --------------------------------------------------------------------------------- the labelled fitter


def _dims(dims) -> tuple[str, ...]:
    return () if dims is None else (dims,) if isinstance(dims, str) else tuple(dims)


def ols_line(y: xr.DataArray, x, dim, *, units=None, cov_type: str | None = None, alpha: float = 0.05,
             test_slope: float | None = None) -> xr.Dataset:
    """OLS of ``y`` on ``[1, x]`` pooled over the observation dims ``dim`` (one dim or several), for
    every cell of the other dims of ``y`` (a ``resample`` dim included).

    ``x`` is a DataArray (or a number) broadcast against ``y``; a point where ``y`` or ``x`` is not
    finite drops out of its line. ``units``: the dims of ``dim`` whose cells are the independent
    units (their points form one cluster each); with them ``cov_type`` is ``"cluster"`` by default
    (:func:`_line_np` gives the estimators), without ``"nonrobust"``.

    Returns
    -------
    xr.Dataset over the other dims with the variables of :data:`LINE_FIELDS` (``n`` int64, the
    points of each line; ``t_test_pvalue`` with ``test_slope`` only) and the settings as scalar
    coordinates ``method``, ``cov_type``, ``alpha`` (``test_exponent``; with ``units``, ``units``
    and ``n_units``). Lazy for dask input.
    """
    dims, units = _dims(dim), _dims(units)
    cov_type = ("cluster" if units else "nonrobust") if cov_type is None else cov_type
    check_cov_type(cov_type)
    alpha = check_alpha(alpha)
    missing = [d for d in dims if d not in y.dims]
    if missing:
        raise ValueError(f"dimension {missing[0]!r} not in the DataArray's dims {y.dims}")
    if not set(units) <= set(dims):
        raise ValueError(f"units {units} must be among the observation dims {dims}")
    if cov_type == "cluster" and not units:
        raise ValueError("cov_type='cluster' needs the independent units of the fit (units=, e.g. 'seed')")
    x = x if isinstance(x, xr.DataArray) else xr.DataArray(x)
    core = [d for d in dims if d not in units] + list(units)
    G = int(np.prod([y.sizes[u] for u in units], dtype=np.int64))
    test = None if test_slope is None else float(test_slope)

    def kernel(yv, xv):
        shape = yv.shape[:yv.ndim - len(core)] + (-1,)
        return _line_np(yv.reshape(shape), xv.reshape(shape), G=G, cov_type=cov_type, alpha=alpha, test=test)

    fields = [k for k in LINE_FIELDS if k != "t_test_pvalue" or test is not None]
    settings = dict(method="OLS", cov_type=cov_type, alpha=alpha, **({} if test is None else {"test_exponent": test}),
                    **({"units": ",".join(units), "n_units": G} if units else {}))
    if y.chunks is None and _within(x, y):
        # x's dims and coordinates are y's own: the arrays go to the kernel as apply_ufunc would pass them (the
        # other dims first, the observations last), without the labelled broadcast and merges (same bits)
        other = [d for d in y.dims if d not in core]
        arrays = kernel(y.transpose(*other, *core).values, _spread(x, other + core, y))
        coords = {c: v.variable for c, v in y.coords.items() if not set(v.dims) & set(core)}
    else:
        y, x = xr.broadcast(y, x)
        if y.chunks is not None:
            y, x = y.chunk({d: -1 for d in core}), x.chunk({d: -1 for d in core})
        outs = xr.apply_ufunc(kernel, y, x, input_core_dims=[core, core], output_core_dims=[[]] * len(LINE_FIELDS),
                              dask="parallelized", output_dtypes=[np.float64] * len(LINE_FIELDS))
        other, arrays = outs[0].dims, [v.data for v in outs]
        coords = {c: v.variable for c, v in outs[0].coords.items()}
    out = dict(zip(LINE_FIELDS, arrays))
    return xr.Dataset({k: (other, out[k].astype(np.int64) if k == "n" else out[k],
                           dict(zip(("long_name", "description"), LINE_FIELDS[k]))) for k in fields},
                      coords={**coords, **settings})


def _within(x: xr.DataArray, y: xr.DataArray) -> bool:
    """Whether ``x`` adds nothing to ``y``'s labels: its dims among ``y``'s with their sizes, every coordinate of
    it one of ``y``'s, identical (then broadcasting ``x`` against ``y`` only repeats its values)."""
    return (set(x.dims) <= set(y.dims) and all(x.sizes[d] == y.sizes[d] for d in x.dims)
            and all(c in y.coords and v.variable.identical(y.coords[c].variable) for c, v in x.coords.items()))


def _spread(x: xr.DataArray, order: list, y: xr.DataArray) -> np.ndarray:
    """The values of ``x`` (dims among ``order``) repeated over ``y``'s other dims, in the dim order ``order``."""
    values = x.transpose(*[d for d in order if d in x.dims]).values
    return np.broadcast_to(values.reshape([y.sizes[d] if d in x.dims else 1 for d in order]),
                           [y.sizes[d] for d in order])


# --------------------------------------------------------------------------------- log-log lines


def _format_coord(value) -> str:
    """Readable form of one coordinate value (numpy scalars unwrapped)."""
    if isinstance(value, np.generic):
        value = value.item()
    return repr(value) if isinstance(value, str) else f"{value:g}" if isinstance(value, float) else str(value)


def _locate(da: xr.DataArray, index) -> str:
    """``'L=64, d=5, U_norm=0.3'``: the labels of one position of ``da`` (index if a dim has no coordinate)."""
    return ", ".join(f"{d}={_format_coord(da[d].values[i])}" if d in da.coords else f"{d}[{i}]"
                     for d, i in zip(da.dims, index))


def _coordinate_values(da, dim: str) -> np.ndarray:
    """The float values of the fitted coordinate ``dim``: TypeError unless ``da`` is a DataArray with a
    numeric coordinate ``dim``; ValueError unless it has >= 3 positive, finite, distinct values."""
    if not isinstance(da, xr.DataArray):
        raise TypeError(f"loglog_slope expects an xr.DataArray, got {type(da).__name__}")
    if dim not in da.dims:
        raise ValueError(f"dimension {dim!r} not in the DataArray's dims {da.dims}")
    if da.sizes[dim] < MIN_LINE_POINTS:
        raise ValueError(f"loglog_slope needs at least {MIN_LINE_POINTS} points along {dim!r}, got {da.sizes[dim]}")
    if dim not in da.coords:
        raise ValueError(f"dimension {dim!r} has no coordinate: the fit needs its real values")
    try:
        xv = np.asarray(da[dim].values, dtype=np.float64)
    except (TypeError, ValueError):
        raise TypeError(f"loglog_slope: the coordinate {dim!r} must be numeric, got dtype {da[dim].dtype}") from None
    bad = ~(np.isfinite(xv) & (xv > 0))
    if bad.any():
        i = int(np.argmax(bad))
        raise ValueError(f"loglog_slope: the coordinate {dim!r} must be positive and finite to take its log; "
                         f"found {dim}={_format_coord(da[dim].values[i])} at position {i}")
    if np.ptp(xv) == 0:
        raise ValueError(f"loglog_slope: the coordinate {dim!r} must take at least two distinct values")
    return xv


def _as_real(da: xr.DataArray) -> xr.DataArray:
    """``da`` with real values: as it is when numeric, float64 for an object array of numbers;
    TypeError for strings, complex, dates."""
    if da.dtype.kind in "biuf":
        return da
    if da.dtype.kind != "O":
        raise TypeError(f"loglog_slope: {da.name if da.name is not None else 'da'} must be numeric, got dtype {da.dtype}")
    try:
        return da.astype(np.float64)
    except (TypeError, ValueError):
        raise TypeError(f"loglog_slope: {da.name if da.name is not None else 'da'} must be numeric, got an object array "
                        "holding non-numbers") from None


def _log_points(da: xr.DataArray, dim: str, units: tuple, skipna: bool) -> tuple[xr.DataArray, xr.DataArray]:
    """``(z, log_mean)``: the points a log-log fit pools and the log of the curve it fits. Without
    ``units`` both are ``log y``. With them, ``log_mean`` is the log of the unit mean and ``z`` the
    linearised pseudo-observations ``log ybar + (y - ybar) / ybar`` over ``dim`` and the units, whose
    pooled line is the unit-mean line and whose clusters give its delta-method SE. With ``skipna`` a
    unit NaN at every point is absent and a point where a present unit is NaN drops out; else a value
    that is not positive and finite (a unit mean, with units) is a ValueError naming its coordinates
    (for dask input, at compute)."""
    name = da.name if da.name is not None else "y"
    other = [d for d in da.dims if d != dim and d not in units]
    shape = tuple(da.sizes[d] for d in other)
    cell = xr.DataArray(np.arange(int(np.prod(shape, dtype=np.int64))).reshape(shape), dims=other)
    labels = xr.DataArray(np.empty(shape, dtype=np.int8), dims=other, coords={d: da[d] for d in other if d in da.coords})
    xlabels = da[dim].values
    if da.chunks is not None:
        da = da.chunk({dim: -1, **{u: -1 for u in units}})
        cell = cell.chunk({d: da.chunksizes[d] for d in other})

    def fail(what, cell_id, i):
        where = _locate(labels, np.unravel_index(int(cell_id), shape)) if shape else ""
        raise ValueError(f"loglog_slope: {what} at {dim}={_format_coord(xlabels[i])}" + (f", {where}" if where else ""))

    def kernel(y, cell_id):
        """``y (..., n, *units)`` -> ``(z (..., n, *units), log mean (..., n))``."""
        with np.errstate(all="ignore"):
            if not units:
                bad = ~(np.isfinite(y) & (y > 0)) & ~(skipna & np.isnan(y))
                if bad.any():
                    at = np.unravel_index(int(np.argmax(bad)), y.shape)
                    fail(f"{name} must be positive and finite to take its log; found {name}={float(y[at]):g}",
                         cell_id[at[:-1]], at[-1])
                return np.log(y), np.log(y)
            flat = y.reshape(y.shape[:y.ndim - len(units)] + (-1,))
            present = np.isfinite(flat).any(axis=-2, keepdims=True) if skipna else np.ones(flat.shape, bool)
            used = np.where(present, np.isfinite(flat), True).all(axis=-1, keepdims=True)
            vals = np.where(present & used, flat, np.nan)
            finite = np.isfinite(vals)
            ybar = (np.where(finite, vals, 0.0).sum(axis=-1, keepdims=True) / finite.sum(axis=-1, keepdims=True)
                    if skipna else flat.mean(axis=-1, keepdims=True))
            bad = ~(np.isfinite(ybar[..., 0]) & (ybar[..., 0] > 0)) & ~(skipna & np.isnan(ybar[..., 0]))
            if bad.any():
                at = np.unravel_index(int(np.argmax(bad)), bad.shape)
                fail(f"{name} must be finite with a positive mean over {', '.join(units)} to take the log of that "
                     f"mean; found mean {float(ybar[at][0]):g}", cell_id[at[:-1]], at[-1])
            return (np.log(ybar) + (vals - ybar) / ybar).reshape(y.shape), np.log(ybar[..., 0])

    return xr.apply_ufunc(kernel, da, cell, input_core_dims=[[dim, *units], []],
                          output_core_dims=[[dim, *units], [dim]], dask="parallelized",
                          output_dtypes=[np.float64, np.float64])


_LOGLOG_ATTRS = {
    "slope": ("log-log slope", "OLS slope of log(y) on log(x)"),
    "intercept": ("log-log intercept", "OLS intercept of log(y) on log(x), i.e. log(y) at x = 1"),
    "r2": ("coefficient of determination", "R^2 of the log-log OLS fit (NaN when log(y) is constant)"),
    "n": ("number of points in the fit", "points along the fitted dimension"),
}


def loglog_slope(da: xr.DataArray, dim: str = "L", *, units=None, cov_type: str | None = None, alpha: float = 0.05,
                 test_exponent: float | None = None, skipna: bool = False) -> xr.Dataset:
    """Log-log slope of ``da`` against its coordinate ``dim``, for every cell of the other dims
    (a ``resample`` dim included): :func:`ols_line` of ``log y`` on ``log x``, the slope the exponent
    ``p`` of ``y ~ x^p``.

    With ``units`` (dims of ``da``: its independent replicates, e.g. ``"seed"``) the curve fitted is
    the mean over the units, and the SE is cluster-robust over them by default: the pooled line of
    the linearised pseudo-observations ``log ybar + (y - ybar) / ybar`` is the unit-mean line, and its
    CR1 covariance over the units the delta-method SE of that slope (``sd_g(b_g) / sqrt(G)`` up to
    ``(nG - 1) / (nG - 2)``): the units' draws are shared along ``dim`` (nested prompts, one run along
    t), so the plain OLS SE of the mean curve (``cov_type="nonrobust"``, by name; or HC0..HC3)
    understates the spread. ``r2`` and ``n`` are those of the unit-mean line.

    ``skipna``: a unit that is NaN at every point is absent (a seed outside a protocol), and a point
    where a present unit is NaN drops out of the line (a length not trained, a horizon never reached);
    a line left with fewer than 3 points is NaN, a cluster SE with one unit NaN. Without it a value
    that is not positive and finite (a unit mean, with units) is a ValueError naming its coordinates
    (for dask input, at compute).

    Returns :func:`ols_line`'s Dataset (``test_exponent``: ``t_test_pvalue`` of slope ==
    test_exponent), ``method`` ``"OLS log-log"``; ValueError for ``dim`` missing, fewer than 3 points,
    an x coordinate that is not positive and finite, units that are not other dims of ``da`` or fewer
    than 2 of them.
    """
    xvals = _coordinate_values(da, dim)
    units = _dims(units)
    bad = [u for u in units if u not in da.dims or u == dim]
    if bad:
        raise ValueError(f"units {bad} must be dims of the DataArray other than {dim!r}; its dims are {da.dims}")
    G = int(np.prod([da.sizes[u] for u in units], dtype=np.int64))
    if units and G < 2:
        raise ValueError(f"a fit over independent units needs at least 2 of them; {', '.join(units)} has {G}")
    cov_type = ("cluster" if units else "nonrobust") if cov_type is None else cov_type
    check_cov_type(cov_type)
    if cov_type == "cluster" and not units:
        raise ValueError("cov_type='cluster' needs the independent units of the fit (units=, e.g. 'seed')")
    name = da.name if da.name is not None else "y"
    z, log_mean = _log_points(_as_real(da), dim, units, skipna)
    logx = xr.DataArray(np.log(xvals), dims=dim)
    if cov_type == "cluster":
        out = ols_line(z, logx, (dim, *units), units=units, alpha=alpha, test_slope=test_exponent)
        of_mean = ols_line(log_mean, logx, dim)
        out["r2"], out["n"] = of_mean.r2, of_mean.n
    else:
        out = ols_line(log_mean, logx, dim, cov_type=cov_type, alpha=alpha, test_slope=test_exponent)
        if units:
            out = out.assign_coords(units=",".join(units), n_units=G)
    out = out.assign_coords(method="OLS log-log")
    for k, (what, how) in _LOGLOG_ATTRS.items():
        out[k].attrs = {"long_name": what, "description": how}
    mean = f"mean of {name} over {', '.join(units)}" if units else name
    out.attrs = {"fit": f"OLS of log({mean}) on log({dim}) over {dim}" + (
        "; SE cluster-robust over the units (linearised log-mean)" if cov_type == "cluster" else
        f"; SE {cov_type}" + (f", ignoring that the units' draws are shared along {dim}" if units else "")),
        "fitted_dim": dim, "source_variable": str(name)}
    return out


def unit_slopes(da: xr.DataArray, units, dim: str = "L", *, cov_type: str | None = None, **kw) -> xr.Dataset:
    """The log-log slope along ``dim`` of the mean of ``da`` over ``units`` (a dim or several):
    :func:`loglog_slope` with ``units``, SE cluster-robust over them by default (``cov_type=
    "nonrobust"``: the plain OLS SE of the mean curve, by name); with one unit, the plain OLS fit of
    its curve (no spread to read). The scalar coordinates ``cov_type``, ``units`` and ``n_units`` say
    which; ``kw`` as in :func:`loglog_slope`."""
    units = _dims(units)
    n = int(np.prod([da.sizes[u] for u in units]))
    if n >= 2:
        return loglog_slope(da, dim, units=units, cov_type=cov_type, **kw)
    return loglog_slope(da.mean(units), dim, cov_type=None if cov_type == "cluster" else cov_type,
                        **kw).assign_coords(units=",".join(units), n_units=n)


def se_note(fit: xr.Dataset) -> str:
    """How the SE of a :func:`unit_slopes` fit was taken, for a table title: ``"SE cluster-robust over
    4 units (seed)"``, or ``"SE nonrobust OLS, 1 unit (seed)"``."""
    units, n = str(fit.units.item()).replace(",", " x "), int(fit.n_units)
    kind = "cluster-robust over" if fit.cov_type.item() == "cluster" else f"{fit.cov_type.item()} OLS,"
    return f"SE {kind} {n} unit{'s' if n != 1 else ''} ({units})"



def se_line(G: int, what: str, why: str, *, line: str = "pooled line", ols: bool = True) -> str:
    """The line of a table's notes that says what its SEs are over ``G`` units ``what`` (``"seeds"``)
    and ``why`` they are clustered; ``ols``: and what its ``SE OLS`` column is (the plain OLS SE of the
    ``line``)."""
    if G >= 2:
        return (f"SE: cluster-robust over the {G} {what} ({why}), Student-t with {G - 1} dof"
                + (f"; SE OLS: the plain OLS SE of the {line}, which ignores that sharing" if ols else ""))
    return (f"SE: plain OLS of the one {what[:-1]}'s line (one unit: no cluster-robust SE; {why})"
            + ("; SE OLS: the same" if ols else ""))

def power_law_fit(da: xr.DataArray, dim: str = "L", *, units=None, cov_type: str | None = None,
                  alpha: float = 0.05) -> xr.Dataset:
    """Power law ``y = c * x^p`` fitted along ``dim`` (x = the coordinate ``dim``), built on
    :func:`loglog_slope`: ``p`` is the log-log slope, ``c = exp(intercept)`` with the delta-method SE
    ``c * se(intercept)`` and the interval ``exp`` of the intercept's (asymmetric, positive).

    Returns an xr.Dataset over the remaining dims with ``p``, ``p_se``, ``p_ci_low``, ``p_ci_high``,
    ``c``, ``c_se``, ``c_ci_low``, ``c_ci_high``, ``log_c``, ``log_c_se``, ``r2``, ``n``; lazy for
    dask input; the scalar coordinates of :func:`loglog_slope`."""
    fit = loglog_slope(da, dim, units=units, cov_type=cov_type, alpha=alpha)
    c = np.exp(fit["intercept"])
    parts = {
        "p": (fit.slope, "power-law exponent", "log-log OLS slope"),
        "p_se": (fit.slope_se, "standard error of the exponent", "from the covariance estimator cov_type"),
        "p_ci_low": (fit.slope_ci_low, "lower confidence limit of the exponent", "Student-t interval"),
        "p_ci_high": (fit.slope_ci_high, "upper confidence limit of the exponent", "Student-t interval"),
        "c": (c, "power-law prefactor", "exp(log-log intercept)"),
        "c_se": (c * fit.intercept_se, "standard error of the prefactor", "delta method: c * se(intercept)"),
        "c_ci_low": (np.exp(fit.intercept_ci_low), "lower confidence limit of the prefactor", "exp of the "
                                                                                              "intercept's"),
        "c_ci_high": (np.exp(fit.intercept_ci_high), "upper confidence limit of the prefactor", "exp of the "
                                                                                                "intercept's"),
        "log_c": (fit.intercept, "log of the prefactor", "log-log OLS intercept"),
        "log_c_se": (fit.intercept_se, "standard error of log c", "from the covariance estimator cov_type"),
        "r2": (fit.r2, "coefficient of determination", "R^2 of the log-log OLS fit"),
        "n": (fit.n, "number of points in the fit", "points along the fitted dimension"),
    }
    out = xr.Dataset({k: v.assign_attrs(long_name=ln, description=d) for k, (v, ln, d) in parts.items()})
    out = out.assign_coords(method="power law via OLS log-log")
    out.attrs = dict(fit.attrs, fit=f"y = c * {dim}^p by OLS of log y on log {dim}; c_se by the delta method")
    return out


def _labelled(values, name: str) -> xr.DataArray:
    """``values`` as a DataArray (a numpy array gets dims ``dim_0, ...`` and no coordinates)."""
    return values if isinstance(values, xr.DataArray) else xr.DataArray(np.asarray(values, dtype=np.float64),
                                                                        name=name)


def _first_bad(da: xr.DataArray, bad: np.ndarray) -> str:
    """Where the first flagged value of ``da`` lies: its labels, or ``index (i, ...)`` without coordinates."""
    at = np.unravel_index(int(np.argmax(bad)), bad.shape)
    if not bad.shape:
        return "(scalar)"
    return _locate(da, at) if da.coords else f"index {tuple(int(i) for i in at)}"


def paper_form_fit(L_mse, x, *, units=None, cov_type: str | None = None, alpha: float = 0.05) -> xr.Dataset:
    """Paper-form fit of claim C1 (docs/claims.md): ``L * E||f_L - f_inf||^2 = c1 * exp(c2 * x)``, pooled OLS.

    :func:`ols_line` of ``log(L_mse)`` on ``x = sigma^2 ||U q||^2`` over every point pooled: ``log
    c1`` is the intercept, ``c2`` the slope, ``c1 = exp(log c1)`` with the delta-method SE ``c1 se(log
    c1)``. The paper only asserts ``c2 > 0``: ``pvalue_c2_positive`` is the one-sided p-value of H0
    ``c2 <= 0``. ``L_mse``, ``x``: arrays of one shape, or DataArrays (aligned exactly and
    broadcast); ``L_mse`` positive and finite, ``x`` finite, >= 3 points. ``units``: dims whose cells
    are independent draws (the queries of a ``(d, U_norm, seed)`` cell share its prompts): the SE is
    cluster-robust over them by default.

    Returns an xr.Dataset of scalars ``c1``, ``c1_se``, ``c1_ci_low``, ``c1_ci_high``, ``log_c1``,
    ``log_c1_se``, ``c2``, ``c2_se``, ``c2_ci_low``, ``c2_ci_high``, ``pvalue_c2_positive``, ``r2``,
    ``n``; scalar coordinates ``method``, ``cov_type``, ``alpha`` (with units ``units``, ``n_units``)."""
    units = _dims(units)
    if units and not (isinstance(L_mse, xr.DataArray) and isinstance(x, xr.DataArray)):
        raise ValueError("paper_form_fit: units name dims, so L_mse and x must be DataArrays")
    if isinstance(L_mse, xr.DataArray) and isinstance(x, xr.DataArray):
        try:
            L_mse, x = xr.align(L_mse, x, join="exact")
        except ValueError as err:
            raise ValueError(f"paper_form_fit: L_mse and x have different coordinates: {err}") from err
        L_mse, x = xr.broadcast(L_mse, x)
        x = x.transpose(*L_mse.dims)
    elif np.shape(L_mse) != np.shape(x):
        raise ValueError(f"paper_form_fit: L_mse and x must have the same shape, got {np.shape(L_mse)} and {np.shape(x)}")
    L_mse, x = _labelled(L_mse, "L_mse"), _labelled(x, "x")
    if L_mse.size < 3:
        raise ValueError(f"paper_form_fit needs at least 3 points, got {L_mse.size}")
    for name, da, bad in (("L_mse must be positive and finite to take its log", L_mse,
                           ~(np.isfinite(L_mse.values) & (L_mse.values > 0))),
                          ("x must be finite", x, ~np.isfinite(x.values))):
        if bad.any():
            found = float(da.values[np.unravel_index(int(np.argmax(bad)), bad.shape)])
            raise ValueError(f"paper_form_fit: {name}; found {found:g} at {_first_bad(da, bad)}")
    missing = [u for u in units if u not in L_mse.dims]
    if missing:
        raise ValueError(f"paper_form_fit: units {missing} are not dims of L_mse {L_mse.dims}")
    fit = ols_line(np.log(L_mse), x, L_mse.dims, units=units if cov_type in (None, "cluster") else None,
                   cov_type=cov_type, alpha=alpha)
    c2, p2 = float(fit.slope), float(fit.pvalue_slope)
    c1 = np.exp(fit.intercept)
    values = {
        "c1": (c1, "prefactor c1", "exp(intercept) of log(L * mse) on x"),
        "c1_se": (c1 * fit.intercept_se, "standard error of c1", "delta method: c1 * se(log c1)"),
        "c1_ci_low": (np.exp(fit.intercept_ci_low), "lower confidence limit of c1", "exp of the intercept's limit"),
        "c1_ci_high": (np.exp(fit.intercept_ci_high), "upper confidence limit of c1", "exp of the intercept's limit"),
        "log_c1": (fit.intercept, "log c1", "OLS intercept"),
        "log_c1_se": (fit.intercept_se, "standard error of log c1", "from the covariance estimator cov_type"),
        "c2": (fit.slope, "exponential rate c2", "OLS slope of log(L * mse) on sigma^2 ||U q||^2"),
        "c2_se": (fit.slope_se, "standard error of c2", "from the covariance estimator cov_type"),
        "c2_ci_low": (fit.slope_ci_low, "lower confidence limit of c2", "Student-t interval, level 1 - alpha"),
        "c2_ci_high": (fit.slope_ci_high, "upper confidence limit of c2", "Student-t interval, level 1 - alpha"),
        "pvalue_c2_positive": (p2 / 2.0 if c2 > 0 else 1.0 - p2 / 2.0, "p-value of H0 c2 <= 0",
                               "one-sided Student-t test, df = n - 2 (clusters - 1 with the cluster SE)"),
        "r2": (fit.r2, "coefficient of determination", "R^2 of the pooled OLS fit"),
        "n": (fit.n, "number of points in the fit", "all points pooled"),
    }
    ds = xr.Dataset({k: xr.DataArray(v).reset_coords(drop=True).assign_attrs(long_name=ln, description=d)
                     for k, (v, ln, d) in values.items()})
    ds = ds.assign_coords(method="OLS log(L*mse) on x, pooled", cov_type=str(fit.cov_type.values), alpha=alpha)
    if "units" in fit.coords:
        ds = ds.assign_coords(units=fit.units, n_units=fit.n_units)
    ds.attrs = {"fit": "L * E||f_L - f_inf||^2 = c1 * exp(c2 * sigma^2 ||U q||^2), OLS on the log, pooled"}
    return ds
