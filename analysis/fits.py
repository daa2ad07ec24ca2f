"""Statistical fits of results files: log-log slopes, power laws, the paper-form fit.

(Threshold regression lives in :mod:`.threshold`.)

Layout (the xskillscore habit):

* pure-numpy kernels (``ols_line_np``): 1-D arrays in, floats out, no labels;
* thin labelled wrappers (``loglog_slope``, ``power_law_fit``, ``paper_form_fit``) that only handle dims and call ``xr.apply_ufunc(...,
  dask="parallelized")``, so numpy- and dask-backed DataArrays both work, the fit loops over
  every dimension other than the fitted one, and dask input stays lazy until computed;
* the settings of every statsmodels call (method, ``cov_type``, ``alpha``, tested exponent)
  travel with the result as scalar coordinates (the xskillscore ``stattests`` habit).

A non-finite or non-positive input to a logarithm is an error naming the offending
coordinate, never a silent NaN. This module reads results only: it imports numpy, xarray and
statsmodels, never the simulation code.
"""
from __future__ import annotations

import math
import warnings

import numpy as np
import statsmodels.api as sm
import xarray as xr

__all__ = [
    "COV_TYPES",
    "MIN_LINE_POINTS",
    "OLS_LINE_FIELDS",
    "check_alpha",
    "check_cov_type",
    "clustered_loglog_np",
    "loglog_slope",
    "loglog_slopes_np",
    "not_fitted",
    "ols_line_np",
    "paper_form_fit",
    "power_law_fit",
    "too_few",
]

#: covariance estimators accepted by the fits (statsmodels names). ``"cluster"`` is cluster-robust
#: over the independent units of a fit (``units=``): the default wherever a fit has them.
COV_TYPES = ("cluster", "nonrobust", "HC0", "HC1", "HC2", "HC3")

#: fewest points of a line fit with standard errors (:func:`ols_line_np`, :func:`loglog_slope`).
MIN_LINE_POINTS = 3

#: names (in order) of the floats returned by :func:`ols_line_np`.
OLS_LINE_FIELDS = (
    "slope",
    "slope_se",
    "slope_ci_low",
    "slope_ci_high",
    "intercept",
    "intercept_se",
    "intercept_ci_low",
    "intercept_ci_high",
    "r2",
    "n",
    "pvalue_slope",
    "t_test_pvalue",
)

_LOGLOG_ATTRS = {
    "slope": ("log-log slope", "OLS slope of log(y) on log(x)"),
    "slope_se": ("standard error of the log-log slope", "from the covariance estimator cov_type"),
    "slope_ci_low": ("lower confidence limit of the log-log slope", "Student-t interval, level 1 - alpha"),
    "slope_ci_high": ("upper confidence limit of the log-log slope", "Student-t interval, level 1 - alpha"),
    "intercept": ("log-log intercept", "OLS intercept of log(y) on log(x), i.e. log(y) at x = 1"),
    "intercept_se": ("standard error of the log-log intercept", "from the covariance estimator cov_type"),
    "intercept_ci_low": ("lower confidence limit of the intercept", "Student-t interval, level 1 - alpha"),
    "intercept_ci_high": ("upper confidence limit of the intercept", "Student-t interval, level 1 - alpha"),
    "r2": ("coefficient of determination", "R^2 of the log-log OLS fit (NaN when log(y) is constant)"),
    "n": ("number of points in the fit", "points along the fitted dimension"),
    "pvalue_slope": ("p-value of slope == 0", "two-sided Student-t test, df = n - 2"),
    "t_test_pvalue": ("p-value of slope == test_exponent", "two-sided Student-t test (statsmodels t_test), df = n - 2"),
}


# ---------------------------------------------------------------------------------------------
# validation helpers
# ---------------------------------------------------------------------------------------------
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


def not_fitted(ax, reason: str) -> None:
    """Mark a matplotlib panel whose fit could not be done: ``"not fitted: <reason>"`` at its centre."""
    ax.text(0.5, 0.5, f"not fitted:\n{reason}", transform=ax.transAxes, ha="center", va="center", fontsize=9,
            wrap=True, bbox=dict(facecolor="white", edgecolor="0.6"))


def _format_coord(value) -> str:
    """Readable form of one coordinate value (numpy scalars unwrapped)."""
    if isinstance(value, np.generic):
        value = value.item()
    return repr(value) if isinstance(value, str) else f"{value:g}" if isinstance(value, float) else str(value)


def _locate(da: xr.DataArray, index: tuple[int, ...]) -> str:
    """``'d=5, U_norm=0.3'``: the labels of one position of ``da`` (index if a dim has no coordinate)."""
    parts = []
    for dim, i in zip(da.dims, index):
        if dim in da.coords:
            parts.append(f"{dim}={_format_coord(da[dim].values[i])}")
        else:
            parts.append(f"{dim}[{i}]")
    return ", ".join(parts)


# ---------------------------------------------------------------------------------------------
# numpy kernels
# ---------------------------------------------------------------------------------------------
def ols_line_np(
    x: np.ndarray,
    y: np.ndarray,
    *,
    cov_type: str = "nonrobust",
    alpha: float = 0.05,
    test_slope: float | None = None,
    groups: np.ndarray | None = None,
) -> tuple[float, ...]:
    """OLS of ``y`` on ``[1, x]`` with statsmodels; 1-D arrays in, a tuple of floats out.

    Model: ``y_i = intercept + slope * x_i + e_i``, fitted by
    ``sm.OLS(y, [1, x]).fit(cov_type=cov_type, use_t=True)``. Standard errors come from the
    chosen covariance estimator (``"nonrobust"``: ``s^2 (X'X)^-1`` with ``s^2 = SSR/(n-2)``;
    ``"HC3"``: ``(X'X)^-1 X' diag(e_i^2 / (1-h_ii)^2) X (X'X)^-1``; ``"cluster"``: the CR1 sandwich
    ``G/(G-1) (n-1)/(n-2) (X'X)^-1 (sum_g X_g' e_g e_g' X_g) (X'X)^-1`` over the ``G`` clusters of
    ``groups``), confidence intervals and p-values use the Student-t distribution with ``n - 2``
    degrees of freedom (``G - 1`` for ``"cluster"``: statsmodels' ``df_resid_inference``).

    Parameters
    ----------
    x, y : 1-D arrays of the same length n >= 3, finite, x with at least two distinct values.
    cov_type : one of :data:`COV_TYPES`.
    alpha : the intervals have level ``1 - alpha``.
    test_slope : if given, ``t_test_pvalue`` is the two-sided p-value of H0 ``slope == test_slope``
        (``res.t_test``); NaN otherwise.
    groups : the cluster label of every point (integers), needed by and only by ``"cluster"``;
        at least 2 clusters.

    Returns
    -------
    tuple of floats in the order of :data:`OLS_LINE_FIELDS`: slope, slope_se, slope_ci_low,
    slope_ci_high, intercept, intercept_se, intercept_ci_low, intercept_ci_high, r2, n,
    pvalue_slope, t_test_pvalue. ``r2`` is NaN when y is constant (R^2 undefined); with an
    exact fit the SEs are 0 and p-values 0.
    """
    check_cov_type(cov_type)
    alpha = check_alpha(alpha)
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if x.ndim != 1 or y.shape != x.shape:
        raise ValueError(f"x and y must be 1-D of the same length, got shapes {x.shape} and {y.shape}")
    n = x.size
    if n < MIN_LINE_POINTS:
        raise ValueError(f"a line fit with standard errors needs at least {MIN_LINE_POINTS} points, got {n}")
    if not (np.all(np.isfinite(x)) and np.all(np.isfinite(y))):
        raise ValueError("x and y must be finite")
    if np.ptp(x) == 0:
        raise ValueError("x must take at least two distinct values to fit a slope")
    fit_kw = _cluster_kwds(cov_type, groups, n)
    X = np.column_stack([np.ones(n), x])
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        res = sm.OLS(y, X).fit(cov_type=cov_type, use_t=True, **fit_kw)
        ci = np.asarray(res.conf_int(alpha=alpha))
        if test_slope is None:
            t_p = math.nan
        else:
            tt = res.t_test((np.array([[0.0, 1.0]]), np.array([float(test_slope)])))
            t_p = float(np.squeeze(tt.pvalue))
        params = np.asarray(res.params)
        bse = np.asarray(res.bse)
        pvals = np.asarray(res.pvalues)
        if cov_type == "cluster" and np.isnan(bse).any():
            ci, bse, pvals, t_p = _exact_cluster_line(res, params, bse, pvals, ci, t_p, test_slope)
        tss = float(np.sum((y - y.mean()) ** 2))
        r2 = math.nan if tss == 0.0 else 1.0 - float(res.ssr) / tss
    return (
        float(params[1]),
        float(bse[1]),
        float(ci[1, 0]),
        float(ci[1, 1]),
        float(params[0]),
        float(bse[0]),
        float(ci[0, 0]),
        float(ci[0, 1]),
        r2,
        float(n),
        float(pvals[1]),
        t_p,
    )


def loglog_slopes_np(y, x) -> np.ndarray:
    """OLS slope of ``log y`` on ``log x`` along the last axis of ``y``: the point estimate of
    :func:`loglog_slope` without its SE, vectorised over the other axes (what the criteria's
    measures read on every resample of the units). NaN where a ``y`` is not positive."""
    with np.errstate(divide="ignore", invalid="ignore"):
        logy = np.log(np.asarray(y, dtype=np.float64))
    lx = np.log(np.asarray(x, dtype=np.float64))
    lx = lx - lx.mean()
    return logy @ lx / (lx @ lx)


def _exact_cluster_line(res, params, bse, pvals, ci, t_p, test_slope):
    """The cluster fit of units whose lines are parallel: the slope's cluster variance is 0 up to
    rounding (statsmodels' square root of a -1e-35 is NaN). Its SE is then 0, its interval the
    point, its p-values 0 (or 1 for a tested value it equals); an SE that is NaN for another reason
    stays NaN."""
    var = np.diag(np.asarray(res.cov_params()))
    scale = max(float(np.max(np.abs(var))), np.finfo(float).tiny)
    tiny = np.isnan(bse) & (var <= 0) & (var >= -1e-12 * scale)
    bse, pvals, ci = bse.copy(), pvals.copy(), ci.copy()
    bse[tiny] = 0.0
    pvals[tiny] = np.where(params[tiny] == 0, 1.0, 0.0)
    ci[tiny] = params[tiny, None]
    if test_slope is not None and tiny[1]:
        t_p = 1.0 if params[1] == float(test_slope) else 0.0
    return ci, bse, pvals, t_p


def _cluster_kwds(cov_type: str, groups, n: int) -> dict:
    """The ``fit`` keywords of ``cov_type``: ``cov_kwds={"groups": groups}`` for ``"cluster"``
    (ValueError without groups, with a length other than ``n`` or fewer than 2 clusters), none
    otherwise (ValueError if groups are given to another estimator: they would be ignored)."""
    if cov_type != "cluster":
        if groups is not None:
            raise ValueError(f"groups are used by cov_type='cluster' only, got cov_type={cov_type!r}")
        return {}
    if groups is None:
        raise ValueError("cov_type='cluster' needs the cluster label of every point (groups=)")
    groups = np.asarray(groups)
    if groups.shape != (n,):
        raise ValueError(f"groups must have one label per point ({n}), got shape {groups.shape}")
    if np.unique(groups).size < 2:
        raise ValueError("a cluster-robust SE needs at least 2 clusters (independent units), got 1")
    return {"cov_kwds": {"groups": groups}}


def clustered_loglog_np(logx: np.ndarray, y: np.ndarray, *, cov_type: str = "cluster", alpha: float = 0.05,
                        test_slope: float | None = None) -> tuple[float, ...]:
    """Log-log line of the unit mean of ``y`` (shape ``(n, G)``: ``n`` x values, ``G`` independent
    units) with an SE that follows the design; a tuple in the order of :data:`OLS_LINE_FIELDS`.

    The point estimate is the OLS line of ``log ybar_i`` on ``[1, logx_i]``, ``ybar_i`` the mean
    over the units (what a fit of the seed means gives). The units' draws are shared along x
    (nested prompts, one run along t), so the residuals of that line are correlated and its plain
    OLS SE assumes they are not. With ``cov_type="cluster"`` the SE is cluster-robust over the
    units through the linearisation of ``log ybar``: the pseudo-observations
    ``z_ig = log ybar_i + (y_ig - ybar_i) / ybar_i`` average over ``g`` to ``log ybar_i`` exactly,
    so their pooled OLS line *is* the seed-mean line, and statsmodels' cluster covariance over
    ``g`` (CR1, Student-t with ``G - 1`` dof) is the delta-method SE of the seed-mean slope:
    ``sd_g(b_g) / sqrt(G)`` up to ``(n G - 1) / (n G - 2)``, ``b_g`` the slope of unit ``g``'s
    ``z``. Any other ``cov_type`` fits ``log ybar`` alone with that estimator (``"nonrobust"``:
    the plain OLS SE, available by name). ``y`` must be finite with ``ybar > 0``; ``n`` above.
    """
    y = np.asarray(y, dtype=np.float64)
    ybar = y.mean(axis=1)
    logy = np.log(ybar)
    if cov_type != "cluster":
        return ols_line_np(logx, logy, cov_type=cov_type, alpha=alpha, test_slope=test_slope)
    n, G = y.shape
    z = logy[:, None] + (y - ybar[:, None]) / ybar[:, None]
    out = ols_line_np(np.repeat(logx, G), z.ravel(), cov_type="cluster", alpha=alpha, test_slope=test_slope,
                      groups=np.tile(np.arange(G), n))
    r2 = ols_line_np(logx, logy, alpha=alpha)[OLS_LINE_FIELDS.index("r2")]
    out = list(out)
    out[OLS_LINE_FIELDS.index("r2")] = r2  # R^2 of the seed-mean line, as without clusters
    out[OLS_LINE_FIELDS.index("n")] = float(n)
    return tuple(out)


# ---------------------------------------------------------------------------------------------
# labelled wrappers
# ---------------------------------------------------------------------------------------------
def loglog_slope(
    da: xr.DataArray,
    dim: str = "L",
    *,
    units: str | tuple[str, ...] | None = None,
    cov_type: str | None = None,
    alpha: float = 0.05,
    test_exponent: float | None = None,
) -> xr.Dataset:
    """Log-log slope of ``da`` against its coordinate ``dim``, for every cell of the other dims.

    Maths: for each cell, OLS of ``log y_i`` on ``[1, log x_i]`` where ``x`` is the coordinate
    ``dim`` and ``y`` the values along it (:func:`ols_line_np`; ``use_t=True``). The slope is
    the exponent ``p`` of ``y ~ x^p``.

    With ``units`` (a dim of ``da``, or several: its independent replicates, e.g. ``"seed"``), ``y``
    is the mean over the units and the SE is cluster-robust over them by default
    (:func:`clustered_loglog_np`): the units' draws are shared along ``dim`` (nested prompts, one
    run along t), so the plain OLS SE of the mean curve understates the spread. ``cov_type=
    "nonrobust"`` gives that plain SE by name, the point estimate unchanged.

    Works on numpy- and dask-backed DataArrays: the fit is an ``xr.apply_ufunc(...,
    vectorize=True, dask="parallelized")``, so dask input gives a lazy Dataset (one task per
    chunk of the other dims; ``dim`` is rechunked to a single chunk).

    Parameters
    ----------
    da : DataArray with dimension ``dim``; values must be positive and finite (with ``units``:
        finite, with a positive mean over the units).
    dim : the fitted dimension; its coordinate values must be positive and finite (n >= 3).
    units : the dims of the independent units (none by default: one fit per cell of every other
        dim); with them, at least 2 units in all.
    cov_type : ``"cluster"`` (the default with ``units``; needs them), ``"nonrobust"`` (the default
        without) or a heteroscedasticity-robust ``"HC0".."HC3"`` (statsmodels).
    alpha : intervals have level ``1 - alpha`` (95% by default).
    test_exponent : if given, also returns ``t_test_pvalue``: two-sided p-value of
        H0 ``slope == test_exponent`` (statsmodels ``res.t_test``).

    Returns
    -------
    xr.Dataset over the remaining dims with variables ``slope``, ``slope_se``,
    ``slope_ci_low``, ``slope_ci_high``, ``intercept``, ``intercept_se``,
    ``intercept_ci_low``, ``intercept_ci_high``, ``r2``, ``n`` (int64), ``pvalue_slope`` and,
    with ``test_exponent``, ``t_test_pvalue``. Scalar coordinates ``method``, ``cov_type``,
    ``alpha`` (and ``test_exponent``; with ``units``, ``units`` and ``n_units``) record the settings.

    Raises
    ------
    ValueError
        ``dim`` missing, fewer than 3 points, a non-positive or non-finite x coordinate, or a
        non-positive / non-finite value (the message names its coordinates; for dask input it
        is raised at compute time).
    """
    xvals = _coordinate_values(da, dim)
    units = _check_units(da, dim, units)
    cov_type = ("cluster" if units else "nonrobust") if cov_type is None else cov_type
    check_cov_type(cov_type)
    if cov_type == "cluster" and not units:
        raise ValueError("cov_type='cluster' needs the independent units of the fit (units=, e.g. 'seed')")
    alpha = check_alpha(alpha)
    da = _as_real(da)
    _check_log_coordinate(da, dim, xvals)
    test = None if test_exponent is None else float(test_exponent)
    name = da.name if da.name is not None else "y"
    da, cell, fit_cell = _cell_fits(da, dim, xvals, name, units=units, cov_type=cov_type, alpha=alpha, test=test)
    k = len(OLS_LINE_FIELDS)
    outs = xr.apply_ufunc(
        fit_cell,
        da,
        cell,
        input_core_dims=[[dim, *units], []],
        output_core_dims=[[]] * k,
        vectorize=True,
        dask="parallelized",
        output_dtypes=[np.float64] * k,
    )
    out = _labelled_loglog(outs, dim, name, cov_type=cov_type, alpha=alpha, test=test)
    if units:
        out = out.assign_coords(units=",".join(units), n_units=int(np.prod([da.sizes[u] for u in units])))
        out.attrs["fit"] = (f"OLS of log(mean of {name} over {', '.join(units)}) on log({dim}) over {dim}; SE "
                            + ("cluster-robust over the units (linearised log-mean); " if cov_type == "cluster" else
                               f"{cov_type}, ignoring that the units' draws are shared along {dim}; ")
                            + "statsmodels, use_t=True")
    return out


def _check_units(da: xr.DataArray, dim: str, units) -> tuple[str, ...]:
    """``units`` as a tuple of dims of ``da`` other than ``dim``, with at least 2 units in all."""
    if units is None:
        return ()
    units = (units,) if isinstance(units, str) else tuple(units)
    bad = [u for u in units if u not in da.dims or u == dim]
    if bad:
        raise ValueError(f"units {bad} must be dims of the DataArray other than {dim!r}; its dims are {da.dims}")
    G = int(np.prod([da.sizes[u] for u in units]))
    if G < 2:
        raise ValueError(f"a fit over independent units needs at least 2 of them; {', '.join(units)} has {G}")
    return units


def _coordinate_values(da, dim: str) -> np.ndarray:
    """The float values of the fitted coordinate ``dim`` of ``da``: TypeError unless ``da`` is a
    DataArray whose coordinate ``dim`` is numeric, ValueError unless it has one with >= 3 points."""
    if not isinstance(da, xr.DataArray):
        raise TypeError(f"loglog_slope expects an xr.DataArray, got {type(da).__name__}")
    if dim not in da.dims:
        raise ValueError(f"dimension {dim!r} not in the DataArray's dims {da.dims}")
    n = da.sizes[dim]
    if n < MIN_LINE_POINTS:
        raise ValueError(f"loglog_slope needs at least {MIN_LINE_POINTS} points along {dim!r}, got {n}")
    if dim not in da.coords:
        raise ValueError(f"dimension {dim!r} has no coordinate: the fit needs its real values")
    try:
        return np.asarray(da[dim].values, dtype=np.float64)
    except (TypeError, ValueError):
        raise TypeError(f"loglog_slope: the coordinate {dim!r} must be numeric, got dtype {da[dim].dtype}") from None


def _as_real(da: xr.DataArray) -> xr.DataArray:
    """``da`` with real values: as it is when numeric, float64 for an object array of numbers (None
    becomes NaN, reported later with its coordinates); TypeError for strings, complex, dates."""
    if da.dtype.kind in "biuf":
        return da
    label = da.name if da.name is not None else "da"
    if da.dtype.kind != "O":
        raise TypeError(f"loglog_slope: {label} must be numeric, got dtype {da.dtype}")
    try:
        return da.astype(np.float64) if da.chunks is not None else da.copy(data=np.asarray(da.values, dtype=np.float64))
    except (TypeError, ValueError):
        raise TypeError(f"loglog_slope: {label} must be numeric, got an object array holding non-numbers") from None


def _check_log_coordinate(da: xr.DataArray, dim: str, xvals: np.ndarray) -> None:
    """ValueError naming the first coordinate value that is not positive and finite (no log), or
    when they do not take two distinct values (no slope)."""
    bad_x = ~(np.isfinite(xvals) & (xvals > 0))
    if bad_x.any():
        i = int(np.argmax(bad_x))
        raise ValueError(
            f"loglog_slope: the coordinate {dim!r} must be positive and finite to take its log; "
            f"found {dim}={_format_coord(da[dim].values[i])} at position {i}"
        )
    if np.ptp(np.log(xvals)) == 0:
        raise ValueError(f"loglog_slope: the coordinate {dim!r} must take at least two distinct values")


def _cell_fits(da: xr.DataArray, dim: str, xvals: np.ndarray, name, *, units: tuple[str, ...], cov_type: str,
               alpha: float, test):
    """``(da, cell, fit_cell)`` for the fit of log ``da`` on log ``xvals`` (the coordinate values
    of ``dim``): ``da`` rechunked to one chunk along ``dim`` and the ``units`` (dask input),
    ``cell`` the flat index of every cell of the other dims (chunked like ``da``), and
    ``fit_cell(y, cell_id)`` the OLS fields of one cell (``y`` over ``dim`` and the units), or a
    ValueError naming the coordinates of its first value that is not positive and finite (with
    units: not finite, or of a unit mean that is not positive)."""
    other = [d for d in da.dims if d != dim and d not in units]
    shape = tuple(da.sizes[d] for d in other)
    cell = xr.DataArray(np.arange(int(np.prod(shape, dtype=np.int64)), dtype=np.int64).reshape(shape), dims=other)
    labels = xr.DataArray(np.empty(shape), dims=other, coords={d: da[d] for d in other if d in da.coords})
    if da.chunks is not None:
        da = da.chunk({dim: -1, **{u: -1 for u in units}})
        cell = cell.chunk({d: da.chunksizes[d] for d in other})

    def first_bad(bad: np.ndarray, cell_id) -> tuple[int, str] | None:
        """The first position along ``dim`` flagged in ``bad`` and its labels, or None."""
        if not bad.any():
            return None
        i = int(np.argmax(bad))
        where = _locate(labels, np.unravel_index(int(cell_id), shape)) if shape else ""
        return i, f"{dim}={_format_coord(xvals[i])}" + (f", {where}" if where else "")

    def fit_cell(y: np.ndarray, cell_id: np.ndarray) -> tuple[float, ...]:
        if units:
            y = y.reshape(y.shape[0], -1)
            with np.errstate(all="ignore"):
                ybar = y.mean(axis=1)
            found = first_bad(~(np.all(np.isfinite(y), axis=1) & (ybar > 0)), cell_id)
            if found:
                raise ValueError(
                    f"loglog_slope: {name} must be finite with a positive mean over {', '.join(units)} to take "
                    f"the log of that mean; found mean {float(ybar[found[0]]):g} at {found[1]}")
            return clustered_loglog_np(logx, y, cov_type=cov_type, alpha=alpha, test_slope=test)
        found = first_bad(~(np.isfinite(y) & (y > 0)), cell_id)
        if found:
            raise ValueError(f"loglog_slope: {name} must be positive and finite to take its log; "
                             f"found {name}={float(y[found[0]]):g} at {found[1]}")
        return ols_line_np(logx, np.log(y), cov_type=cov_type, alpha=alpha, test_slope=test)

    logx = np.log(xvals)
    return da, cell, fit_cell


def _labelled_loglog(outs, dim: str, name, *, cov_type: str, alpha: float, test) -> xr.Dataset:
    """The Dataset of :func:`loglog_slope` from the per-field outputs of the cell fits: fields as
    variables with their long_name and description, ``n`` as int64, the settings as scalar coords."""
    ds = xr.Dataset({field: out for field, out in zip(OLS_LINE_FIELDS, outs)})
    ds["n"] = ds["n"].astype(np.int64)
    if test is None:
        ds = ds.drop_vars("t_test_pvalue")
    for var in ds.data_vars:
        long_name, description = _LOGLOG_ATTRS[var]
        ds[var].attrs = {"long_name": long_name, "description": description}
    coords = {"method": "OLS log-log", "cov_type": cov_type, "alpha": alpha}
    if test is not None:
        coords["test_exponent"] = test
    ds = ds.assign_coords(coords)
    ds.attrs = {
        "fit": f"OLS of log({name}) on log({dim}) over {dim}; statsmodels, use_t=True",
        "fitted_dim": dim,
        "source_variable": str(name),
    }
    return ds


def power_law_fit(
    da: xr.DataArray,
    dim: str = "L",
    *,
    units: str | tuple[str, ...] | None = None,
    cov_type: str | None = None,
    alpha: float = 0.05,
) -> xr.Dataset:
    """Power law ``y = c * x^p`` fitted along ``dim`` (x = the coordinate ``dim``).

    Maths: built on :func:`loglog_slope`: ``p`` is the log-log slope and ``c = exp(intercept)``.
    The standard error of ``c`` is the delta method ``se(c) = c * se(intercept)``; its
    confidence interval is the exact transform ``exp`` of the intercept's interval (so it is
    asymmetric and always positive). ``units`` and ``cov_type`` as in :func:`loglog_slope` (the
    mean over the units is fitted, with a cluster-robust SE by default).

    Returns
    -------
    xr.Dataset over the remaining dims with ``p``, ``p_se``, ``p_ci_low``, ``p_ci_high``,
    ``c``, ``c_se``, ``c_ci_low``, ``c_ci_high``, ``log_c``, ``log_c_se``, ``r2``, ``n``; lazy
    for dask input; same scalar coordinates as :func:`loglog_slope`.
    """
    fit = loglog_slope(da, dim, units=units, cov_type=cov_type, alpha=alpha)
    c = np.exp(fit["intercept"])
    out = xr.Dataset(
        {
            "p": fit["slope"],
            "p_se": fit["slope_se"],
            "p_ci_low": fit["slope_ci_low"],
            "p_ci_high": fit["slope_ci_high"],
            "c": c,
            "c_se": c * fit["intercept_se"],
            "c_ci_low": np.exp(fit["intercept_ci_low"]),
            "c_ci_high": np.exp(fit["intercept_ci_high"]),
            "log_c": fit["intercept"],
            "log_c_se": fit["intercept_se"],
            "r2": fit["r2"],
            "n": fit["n"],
        }
    )
    attrs = {
        "p": ("power-law exponent", "log-log OLS slope"),
        "p_se": ("standard error of the exponent", "from the covariance estimator cov_type"),
        "p_ci_low": ("lower confidence limit of the exponent", "Student-t interval, level 1 - alpha"),
        "p_ci_high": ("upper confidence limit of the exponent", "Student-t interval, level 1 - alpha"),
        "c": ("power-law prefactor", "exp(log-log intercept)"),
        "c_se": ("standard error of the prefactor", "delta method: c * se(intercept)"),
        "c_ci_low": ("lower confidence limit of the prefactor", "exp of the intercept's lower limit"),
        "c_ci_high": ("upper confidence limit of the prefactor", "exp of the intercept's upper limit"),
        "log_c": ("log of the prefactor", "log-log OLS intercept"),
        "log_c_se": ("standard error of log c", "from the covariance estimator cov_type"),
        "r2": ("coefficient of determination", "R^2 of the log-log OLS fit"),
        "n": ("number of points in the fit", "points along the fitted dimension"),
    }
    for var, (long_name, description) in attrs.items():
        out[var].attrs = {"long_name": long_name, "description": description}
    out = out.assign_coords(method="power law via OLS log-log")
    out.attrs = dict(fit.attrs, fit=f"y = c * {dim}^p by OLS of log y on log {dim}; c_se by the delta method")
    return out


def _as_flat(values, name: str) -> tuple[np.ndarray, object]:
    """Float64 flattened values and a locator ``flat index -> str`` for error messages."""
    if isinstance(values, xr.DataArray):
        arr = np.asarray(values.values, dtype=np.float64)
        shape = arr.shape

        def locate(i: int) -> str:
            return _locate(values, np.unravel_index(i, shape)) if shape else "(scalar)"

    else:
        arr = np.asarray(values, dtype=np.float64)
        shape = arr.shape

        def locate(i: int) -> str:
            return f"index {tuple(int(j) for j in np.unravel_index(i, shape))}" if shape else "(scalar)"

    return arr.ravel(), locate


def paper_form_fit(
    L_mse,
    x,
    *,
    units: str | tuple[str, ...] | None = None,
    cov_type: str | None = None,
    alpha: float = 0.05,
) -> xr.Dataset:
    """Paper-form fit of claim C1 (docs/claims.md): ``L * E||f_L - f_inf||^2 = c1 * exp(c2 * x)``, pooled OLS.

    Maths: OLS of ``log(L_mse)`` on ``[1, x]`` over every point pooled, where ``L_mse`` is
    ``L * E||f_L - f_inf||^2`` and ``x = sigma^2 ||U q||^2``; then ``log c1`` is the intercept,
    ``c2`` the slope, ``c1 = exp(log c1)`` with delta-method SE ``c1 * se(log c1)``. The paper
    only asserts ``c2 > 0``: ``pvalue_c2_positive`` is the one-sided Student-t p-value of
    H0 ``c2 <= 0``.

    Parameters
    ----------
    L_mse, x : arrays of the same shape (numpy or DataArray; DataArrays are aligned exactly and
        broadcast). ``L_mse`` positive and finite, ``x`` finite; at least 3 points.
    units : dims of the DataArrays whose cells are independent draws (e.g. ``("d", "U_norm",
        "seed")``; the queries of one cell share its prompts): the points of one cell form a
        cluster, and the SE is cluster-robust over the cells by default.
    cov_type, alpha : as in :func:`loglog_slope` (``"cluster"`` needs ``units``).

    Returns
    -------
    xr.Dataset of scalars ``c1``, ``c1_se``, ``c1_ci_low``, ``c1_ci_high``, ``log_c1``,
    ``log_c1_se``, ``c2``, ``c2_se``, ``c2_ci_low``, ``c2_ci_high``, ``pvalue_c2_positive``,
    ``r2``, ``n``; scalar coordinates ``method``, ``cov_type``, ``alpha``.
    """
    units = () if units is None else (units,) if isinstance(units, str) else tuple(units)
    cov_type = ("cluster" if units else "nonrobust") if cov_type is None else cov_type
    check_cov_type(cov_type)
    alpha = check_alpha(alpha)
    if units and not (isinstance(L_mse, xr.DataArray) and isinstance(x, xr.DataArray)):
        raise ValueError("paper_form_fit: units name dims, so L_mse and x must be DataArrays")
    if cov_type == "cluster" and not units:
        raise ValueError("paper_form_fit: cov_type='cluster' needs the dims of the independent cells (units=)")
    if isinstance(L_mse, xr.DataArray) and isinstance(x, xr.DataArray):
        try:
            L_mse, x = xr.align(L_mse, x, join="exact")
        except ValueError as err:
            raise ValueError(f"paper_form_fit: L_mse and x have different coordinates: {err}") from err
        L_mse, x = xr.broadcast(L_mse, x)
        x = x.transpose(*L_mse.dims)
    elif np.shape(L_mse) != np.shape(x):
        raise ValueError(f"paper_form_fit: L_mse and x must have the same shape, got {np.shape(L_mse)} and {np.shape(x)}")
    yv, locate_y = _as_flat(L_mse, "L_mse")
    xv, locate_x = _as_flat(x, "x")
    if yv.size < 3:
        raise ValueError(f"paper_form_fit needs at least 3 points, got {yv.size}")
    bad = ~(np.isfinite(yv) & (yv > 0))
    if bad.any():
        i = int(np.argmax(bad))
        raise ValueError(
            f"paper_form_fit: L_mse must be positive and finite to take its log; found {yv[i]:g} at {locate_y(i)}"
        )
    bad = ~np.isfinite(xv)
    if bad.any():
        i = int(np.argmax(bad))
        raise ValueError(f"paper_form_fit: x must be finite; found {xv[i]:g} at {locate_x(i)}")
    groups = None
    if units:
        missing = [u for u in units if u not in L_mse.dims]
        if missing:
            raise ValueError(f"paper_form_fit: units {missing} are not dims of L_mse {L_mse.dims}")
        index = np.indices(L_mse.shape).reshape(L_mse.ndim, -1)
        keep = [L_mse.dims.index(u) for u in units]
        groups = np.ravel_multi_index(tuple(index[keep]), tuple(L_mse.shape[k] for k in keep)) if cov_type == "cluster" else None
    fit = dict(zip(OLS_LINE_FIELDS, ols_line_np(xv, np.log(yv), cov_type=cov_type, alpha=alpha, groups=groups)))
    c2, c2_se = fit["slope"], fit["slope_se"]
    p2 = fit["pvalue_slope"]
    p_pos = p2 / 2.0 if c2 > 0 else 1.0 - p2 / 2.0
    c1 = math.exp(fit["intercept"])
    values = {
        "c1": (c1, "prefactor c1", "exp(intercept) of log(L * mse) on x"),
        "c1_se": (c1 * fit["intercept_se"], "standard error of c1", "delta method: c1 * se(log c1)"),
        "c1_ci_low": (math.exp(fit["intercept_ci_low"]), "lower confidence limit of c1", "exp of the intercept's limit"),
        "c1_ci_high": (math.exp(fit["intercept_ci_high"]), "upper confidence limit of c1", "exp of the intercept's limit"),
        "log_c1": (fit["intercept"], "log c1", "OLS intercept"),
        "log_c1_se": (fit["intercept_se"], "standard error of log c1", "from the covariance estimator cov_type"),
        "c2": (c2, "exponential rate c2", "OLS slope of log(L * mse) on sigma^2 ||U q||^2"),
        "c2_se": (c2_se, "standard error of c2", "from the covariance estimator cov_type"),
        "c2_ci_low": (fit["slope_ci_low"], "lower confidence limit of c2", "Student-t interval, level 1 - alpha"),
        "c2_ci_high": (fit["slope_ci_high"], "upper confidence limit of c2", "Student-t interval, level 1 - alpha"),
        "pvalue_c2_positive": (p_pos, "p-value of H0 c2 <= 0", "one-sided Student-t test, df = n - 2 "
                               "(clusters - 1 with the cluster SE)"),
        "r2": (fit["r2"], "coefficient of determination", "R^2 of the pooled OLS fit"),
        "n": (int(fit["n"]), "number of points in the fit", "all points pooled"),
    }
    ds = xr.Dataset(
        {k: xr.DataArray(v, attrs={"long_name": ln, "description": desc}) for k, (v, ln, desc) in values.items()}
    )
    ds = ds.assign_coords(method="OLS log(L*mse) on x, pooled", cov_type=cov_type, alpha=alpha)
    if units:
        ds = ds.assign_coords(units=",".join(units), n_units=int(np.prod([L_mse.sizes[u] for u in units])))
    ds.attrs = {"fit": "L * E||f_L - f_inf||^2 = c1 * exp(c2 * sigma^2 ||U q||^2), OLS on the log, pooled"}
    return ds
