"""Threshold (hinge) regression: ``y = b0 + b1 x + b2 max(0, x - c)``.

The breakpoint ``c`` is profiled over a trimmed grid (the SSR of a WLS fit at each candidate, every
candidate at once: :func:`hinge_ssr_profile_np`), its confidence set is obtained by likelihood-ratio
inversion (Hansen 2000), and the slopes are reported with their SEs at the chosen ``c`` (statsmodels
WLS; they ignore its uncertainty: the result's ``note`` says so). Statsmodels has no built-in
threshold regression. :func:`break_search` runs the profile for many regressions at once (every
leading cell of ``y``: the resamples of a bootstrap), :func:`threshold_regression` for one.
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, fields

import numpy as np
import statsmodels.api as sm
import xarray as xr

from .fits import check_alpha, check_cov_type

__all__ = ["MIN_HINGE_POINTS", "ThresholdFit", "break_search", "threshold_regression", "hinge_design_np",
           "hinge_ssr_profile_np", "hansen_lr_crit", "hansen_lr_pvalue", "threshold_lr_pvalue"]

#: fewest points (with positive weight) of :func:`threshold_regression`: three coefficients and a breakpoint.
MIN_HINGE_POINTS = 6
#: the array fields of a :class:`ThresholdFit`
_PROFILES = ("grid", "ssr_profile", "lr_profile")


def hinge_design_np(x: np.ndarray, c: float) -> np.ndarray:
    """Hinge basis ``[1, x, max(0, x - c)]`` (n x 3) of the continuous threshold model."""
    x = np.asarray(x, dtype=np.float64)
    return np.column_stack([np.ones(x.size), x, np.maximum(0.0, x - c)])


def hansen_lr_crit(alpha: float = 0.05) -> float:
    """Hansen (2000) asymptotic critical value of the threshold LR statistic.

    Under homoskedasticity the LR statistic at the true threshold converges to a law with
    distribution function ``P(xi <= z) = (1 - exp(-z/2))^2``; inverting it gives
    ``crit(alpha) = -2 log(1 - sqrt(1 - alpha))`` (5.94 for alpha = 0.10, 7.35 for 0.05,
    10.59 for 0.01).
    """
    alpha = check_alpha(alpha)
    return -2.0 * math.log(1.0 - math.sqrt(1.0 - alpha))


def hansen_lr_pvalue(lr) -> np.ndarray | float:
    """Hansen's (2000) asymptotic p-value of the threshold LR statistic: ``P(xi > lr) = 1 - (1 -
    exp(-lr/2))^2`` (the law whose quantile is :func:`hansen_lr_crit`); 1 at ``lr <= 0``."""
    lr = np.maximum(np.asarray(lr, dtype=np.float64), 0.0)
    with np.errstate(over="ignore"):
        p = 1.0 - (1.0 - np.exp(-lr / 2.0)) ** 2
    return float(p) if p.ndim == 0 else p


def threshold_lr_pvalue(fit: "ThresholdFit", y, x, c: float, weights=None) -> float:
    """p-value of H0 ``breakpoint = c`` for the data ``(y, x, weights)`` of ``fit`` (a
    :func:`threshold_regression` of them): ``LR(c) = n (SSR(c) - SSR(c_hat)) / SSR(c_hat)`` with
    Hansen's asymptotic law (:func:`hansen_lr_pvalue`), so that ``c`` lies in the LR confidence set
    at level ``1 - alpha`` iff the p-value is >= ``alpha`` (up to the grid's resolution of the set's hull).
    ``SSR(c)`` is :func:`hinge_ssr_profile_np` at ``c`` (``inf`` where the design is singular: p-value 0)."""
    y, x, w = _checked_data(y, x, weights)
    keep = w > 0
    ssr_c = float(hinge_ssr_profile_np(y[keep], x[keep], np.array([float(c)]),
                                       None if weights is None else w[keep])[0])
    if not math.isfinite(ssr_c):
        return 0.0
    if fit.ssr <= 0:
        return 1.0 if ssr_c <= 0 else 0.0
    return hansen_lr_pvalue(fit.n * (ssr_c - fit.ssr) / fit.ssr)


_THRESHOLD_NOTE = (
    "slope SEs (b0, b1, b2, slope_left, slope_right) are computed at the chosen breakpoint c_hat "
    "as if it were known: they ignore its uncertainty. The CI of c is the grid set "
    "{c : LR(c) <= crit}, LR(c) = n (SSR(c) - SSR(c_hat)) / SSR(c_hat), reported as its hull, "
    "with Hansen's (2000) asymptotic critical value (derived for homoskedastic errors and a "
    "discontinuous threshold; for a continuous kink it is conservative); its resolution is the grid's."
)


@dataclass(frozen=True, eq=False, repr=False)
class ThresholdFit:
    """Result of :func:`threshold_regression` (hinge ``y = b0 + b1 x + b2 max(0, x - c)``): the breakpoint
    ``c_hat`` (argmin of the weighted SSR over the grid), the hull ``[c_ci_low, c_ci_high]`` of ``{c in grid :
    LR(c) <= lr_crit}`` (LR inversion, Hansen 2000; ``ci_truncated`` when it reaches an end of the trimmed grid,
    the true CI may be wider), the coefficients at ``c_hat`` with their SEs, ``slope_left = b1`` and
    ``slope_right = b1 + b2`` (SE ``sqrt(V11 + V22 + 2 V12)``), the fit at ``c_hat`` (``ssr``, ``r2``: weighted
    when weighted; ``n``: the points with w > 0), the settings, the profiles over ``grid`` (``inf`` where the
    hinge design is singular) and the ``note`` on the SEs and the CI."""

    c_hat: float
    c_ci_low: float
    c_ci_high: float
    ci_truncated: bool
    alpha: float
    lr_crit: float
    b0: float
    b0_se: float
    b1: float
    b1_se: float
    b2: float
    b2_se: float
    slope_left: float
    slope_left_se: float
    slope_right: float
    slope_right_se: float
    ssr: float
    r2: float
    n: int
    cov_type: str
    weighted: bool
    trim: float
    grid: np.ndarray
    ssr_profile: np.ndarray
    lr_profile: np.ndarray
    note: str = _THRESHOLD_NOTE

    def __repr__(self) -> str:
        level = f"{100 * (1 - self.alpha):g}%"
        trunc = " (truncated at the grid's end)" if self.ci_truncated else ""
        return (
            f"ThresholdFit(y = b0 + b1 x + b2 max(0, x - c); {'WLS' if self.weighted else 'OLS'}, "
            f"n={self.n}, cov_type={self.cov_type!r})\n"
            f"  c_hat       = {self.c_hat:.6g}   {level} CI [{self.c_ci_low:.6g}, {self.c_ci_high:.6g}]{trunc}"
            f" (LR inversion, crit {self.lr_crit:.3g})\n"
            f"  slope_left  = {self.slope_left:.6g} +- {self.slope_left_se:.3g}\n"
            f"  slope_right = {self.slope_right:.6g} +- {self.slope_right_se:.3g}\n"
            f"  b0 = {self.b0:.6g} +- {self.b0_se:.3g}, b1 = {self.b1:.6g} +- {self.b1_se:.3g}, "
            f"b2 = {self.b2:.6g} +- {self.b2_se:.3g}\n"
            f"  SSR = {self.ssr:.6g}, R2 = {self.r2:.6g}, grid of {self.grid.size} breakpoints, trim {self.trim:g}\n"
            f"  note: {self.note}"
        )

    def to_dict(self, include_profile: bool = False) -> dict:
        """The scalars (and, with ``include_profile``, the grid and the profiles as lists) in a plain dict."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in _PROFILES}
        return out | ({k: getattr(self, k).tolist() for k in _PROFILES} if include_profile else {})

    def to_dataset(self) -> xr.Dataset:
        """The scalars as 0-d variables, ``ssr_profile`` and ``lr_profile`` over dim ``c_grid``; the settings
        (``alpha``, ``lr_crit``, ``cov_type``, ``trim``, ``weighted``) as scalar coordinates, ``note`` an attribute."""
        settings = {"alpha", "lr_crit", "cov_type", "trim", "weighted", "note"}
        data = {k: xr.DataArray(int(v) if isinstance(v, bool) else v) for k, v in self.to_dict().items()
                if k not in settings}
        data["ssr_profile"] = xr.DataArray(self.ssr_profile, dims="c_grid",
                                           attrs={"long_name": "SSR(c)", "description": "profiled (weighted) SSR"})
        data["lr_profile"] = xr.DataArray(self.lr_profile, dims="c_grid", attrs={
            "long_name": "LR(c)", "description": "n (SSR(c) - SSR(c_hat)) / SSR(c_hat)"})
        ds = xr.Dataset(data, coords={"c_grid": self.grid}).assign_coords(
            method="hinge threshold regression", alpha=self.alpha, lr_crit=self.lr_crit, cov_type=self.cov_type,
            trim=self.trim, weighted=int(self.weighted))
        ds.attrs = {"note": self.note, "model": "y = b0 + b1 x + b2 max(0, x - c)"}
        return ds


def threshold_regression(y, x, weights=None, *, trim: float = 0.15, n_grid: int = 200, alpha: float = 0.05,
                         cov_type: str = "nonrobust", lr_crit: float | None = None) -> ThresholdFit:
    """Continuous threshold (hinge) regression with an unknown breakpoint.

    Model: ``y_i = b0 + b1 x_i + b2 max(0, x_i - c) + e_i``: slope ``b1`` left of ``c``, ``b1 + b2``
    right of it, continuous at ``c``. ``c`` is profiled: the (weighted) SSR of the hinge fit (WLS with
    ``weights``, OLS without) at each candidate of a grid of ``n_grid`` equally spaced points between the
    ``trim`` and ``1 - trim`` quantiles of ``x`` together with the observed ``x`` inside that range;
    ``c_hat = argmin SSR(c)``. Its confidence set is the LR inversion of Hansen (2000): ``LR(c) = n (SSR(c)
    - SSR(c_hat)) / SSR(c_hat)``, ``CI = {c : LR(c) <= crit}`` with :func:`hansen_lr_crit` unless
    ``lr_crit`` is given (e.g. 3.84 = chi2_1 for a continuous kink). The coefficients and their SEs
    (statsmodels, ``cov_type``) are those of the fit at ``c_hat``: they ignore its uncertainty.

    Numerics: the fits run on ``x' = (x - m_x) / s_x`` and ``y' = (y - m_y) / s_y`` (midrange of x, median
    of y, half-range scales) and are mapped back exactly (the model is affine-equivariant: ``max(0, x - c)
    = s_x max(0, x' - c')``): the rank test and the solves are scale-relative, so ``x ~ 1e-20`` or ``x =
    1e11 + O(1)`` would otherwise be declared singular, and a tiny ``y`` would underflow its SSR to 0.

    ``y``, ``x``: 1-D, one length, finite; ``weights``: optional, non-negative and finite (e.g. 1 / se^2),
    zero-weight points dropped; at least 6 points of positive weight; ``trim`` in (0, 0.5); ``n_grid`` >= 2.
    """
    check_cov_type(cov_type)
    y, x, w = _checked_data(y, x, weights)
    found = break_search(y, x, weights=None if weights is None else w, trim=trim, n_grid=n_grid, alpha=alpha,
                         lr_crit=lr_crit)
    if found["singular"]:
        raise ValueError("threshold_regression: the hinge design is singular at every candidate breakpoint "
                         "(too few distinct x values on one side of the trimmed grid)")
    xs, ys, grid_s, wts, scales = found["standardised"]
    j = int(found["index"])
    params, bse, right, right_se, r2 = _fit_at_break(ys, xs, grid_s[j], wts, cov_type, scales)
    coefficients = {f"b{i}": float(params[i]) for i in range(3)} | {f"b{i}_se": float(bse[i]) for i in range(3)}
    return ThresholdFit(
        c_hat=float(found["c_hat"]), c_ci_low=float(found["c_ci_low"]), c_ci_high=float(found["c_ci_high"]),
        ci_truncated=bool(found["ci_truncated"]), alpha=check_alpha(alpha), lr_crit=found["lr_crit"], **coefficients,
        slope_left=float(params[1]), slope_left_se=float(bse[1]), slope_right=right, slope_right_se=right_se,
        ssr=float(found["ssr"]), r2=r2, n=int(found["n"]), cov_type=cov_type, weighted=weights is not None,
        trim=float(trim), grid=found["grid"], ssr_profile=found["ssr_profile"], lr_profile=found["lr_profile"])

def break_search(y, x, weights=None, *, trim: float = 0.15, n_grid: int = 200, alpha: float = 0.05,
                 lr_crit: float | None = None) -> dict:
    """The breakpoint search of :func:`threshold_regression` for every leading cell of ``y`` at once.

    ``y`` (..., n) and ``weights`` (its shape, or None) over the points ``x`` (n,); the points of
    positive weight must be the same in every cell (zero-weight points drop out). Returns arrays over
    the leading cells: ``c_hat``, ``c_ci_low``, ``c_ci_high``, ``ci_truncated``, ``ssr`` (at ``c_hat``),
    ``singular`` (True where the design is singular at every candidate: the other figures are then
    meaningless), ``index`` (of ``c_hat`` in ``grid``), ``ssr_profile``, ``lr_profile`` (..., grid), ``slope_left``,
    ``slope_right`` (the hinge's slopes at ``c_hat``, WLS); and ``grid``, ``n``, ``lr_crit`` and the
    ``standardised`` data of the fits (module doc of :func:`threshold_regression`, Numerics)."""
    alpha = check_alpha(alpha)
    y = np.asarray(y, dtype=np.float64)
    x = np.asarray(x, dtype=np.float64)
    w = np.ones_like(y) if weights is None else np.broadcast_to(np.asarray(weights, dtype=np.float64), y.shape)
    positive = (w > 0).reshape(-1, y.shape[-1])
    if not (positive == positive[:1]).all():
        raise ValueError("break_search: the points of positive weight must be the same in every cell")
    keep = positive[0]
    n = int(keep.sum())
    crit = _checked_settings(n, trim, n_grid, alpha, lr_crit)
    x, y, w = x[keep], y[..., keep], w[..., keep]
    grid = _breakpoint_grid(x, trim, n_grid)
    mx, sx, my, sy = _standardisation(x, y)
    xs, ys, grid_s = (x - mx) / sx, (y - my[..., None]) / sy[..., None], (grid - mx) / sx
    wts = None if weights is None else w
    ssr_s = hinge_ssr_profile_np(ys, xs, grid_s, wts)
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        ssr = np.where(np.isfinite(ssr_s), ssr_s * (sy**2)[..., None], np.inf)  # sy**2 may underflow: inf * 0
    j = np.argmin(ssr_s, axis=-1)
    best = np.take_along_axis(ssr_s, j[..., None], axis=-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        lr = np.where(best > 0, n * (ssr_s - best) / best, np.where(ssr_s <= 0, 0.0, np.inf))
    inside = lr <= crit
    lo, hi = np.argmax(inside, axis=-1), grid.size - 1 - np.argmax(inside[..., ::-1], axis=-1)
    slopes = _slopes_at(ys, xs, grid_s[j], wts, sy / sx)
    return {"c_hat": grid[j], "c_ci_low": grid[lo], "c_ci_high": grid[hi],
            "ci_truncated": (lo == 0) | (hi == grid.size - 1), "ssr": np.take_along_axis(ssr, j[..., None], -1)[..., 0],
            "singular": ~np.isfinite(ssr_s).any(axis=-1),
            "index": j, "ssr_profile": ssr, "lr_profile": lr, "slope_left": slopes[0], "slope_right": slopes[1],
            "grid": grid, "n": n, "lr_crit": crit, "standardised": (xs, ys, grid_s, wts, (mx, sx, my, sy))}


def _slopes_at(ys, xs, c_s, wts, k) -> tuple[np.ndarray, np.ndarray]:
    """``(slope_left, slope_right)`` = ``k (b1', b1' + b2')`` of the (W)LS hinge fit of the standardised
    ``ys`` (..., n) on ``xs`` at the standardised breakpoints ``c_s`` (...), every cell at once."""
    Z = np.stack(np.broadcast_arrays(np.ones_like(ys), xs, np.maximum(0.0, xs - c_s[..., None])), axis=-1)
    sw = np.ones_like(ys) if wts is None else np.sqrt(wts)
    with np.errstate(all="ignore"):
        Q, R = np.linalg.qr(Z * sw[..., None])
        rhs = np.einsum("...nk,...n->...k", Q, sw * ys)
        try:
            p = np.linalg.solve(R, rhs[..., None])[..., 0]
        except np.linalg.LinAlgError:          # a singular cell: its figures are not read (ssr is inf)
            p = np.full(rhs.shape, np.nan)
    return k * p[..., 1], k * (p[..., 1] + p[..., 2])


def _checked_data(y, x, weights) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(y, x, w)`` as float64 arrays (``w`` all ones without ``weights``); ValueError naming the
    first entry that is not 1-D of one shape, finite and (for a weight) non-negative."""
    y = np.asarray(y, dtype=np.float64)
    x = np.asarray(x, dtype=np.float64)
    if y.ndim != 1 or x.ndim != 1:
        raise ValueError(f"threshold_regression: y and x must be 1-D, got shapes {y.shape} and {x.shape}")
    if y.shape != x.shape:
        raise ValueError(f"threshold_regression: y and x must have the same shape, got {y.shape} and {x.shape}")
    w = np.ones_like(y) if weights is None else np.asarray(weights, dtype=np.float64)
    if w.shape != y.shape:
        raise ValueError(f"threshold_regression: weights must have the shape of y {y.shape}, got {w.shape}")
    for name, arr, bad in (("y", y, "finite"), ("x", x, "finite"), ("weights", w, "finite"),
                           ("weights", w, "non-negative")):
        wrong = ~np.isfinite(arr) if bad == "finite" else arr < 0
        if wrong.any():
            i = int(np.argmax(wrong))
            raise ValueError(f"threshold_regression: {name} must be {bad}; found {arr[i]:g} at index {i}")
    return y, x, w

def _checked_settings(n: int, trim: float, n_grid: int, alpha: float, lr_crit) -> float:
    """The LR critical value (Hansen's at ``alpha`` unless ``lr_crit``); ValueError when there are
    fewer than :data:`MIN_HINGE_POINTS` points of positive weight or a setting is out of range."""
    if n < MIN_HINGE_POINTS:
        raise ValueError(f"threshold_regression needs at least {MIN_HINGE_POINTS} points (with positive weight) for "
                         f"a 3-parameter hinge and a breakpoint, got {n}")
    if not (0.0 < trim < 0.5):
        raise ValueError(f"threshold_regression: trim must be in (0, 0.5), got {trim!r}")
    if int(n_grid) < 2:
        raise ValueError(f"threshold_regression: n_grid must be >= 2, got {n_grid!r}")
    crit = hansen_lr_crit(alpha) if lr_crit is None else float(lr_crit)
    if not (math.isfinite(crit) and crit > 0):
        raise ValueError(f"threshold_regression: lr_crit must be positive and finite, got {lr_crit!r}")
    return crit


def _breakpoint_grid(x: np.ndarray, trim: float, n_grid: int) -> np.ndarray:
    """Candidate breakpoints: ``n_grid`` equally spaced between the ``trim`` and ``1 - trim``
    quantiles of ``x``, with the observed ``x`` inside that range, sorted and unique."""
    lo, hi = np.quantile(x, trim), np.quantile(x, 1.0 - trim)
    return np.unique(np.concatenate([np.linspace(lo, hi, int(n_grid)), x[(x >= lo) & (x <= hi)]]))


def _standardisation(x: np.ndarray, y: np.ndarray) -> tuple:
    """``(mx, sx, my, sy)``: midrange and half-range of ``x``, median of ``y`` (..., n) and its largest
    deviation from it per cell (1 where a scale is 0), so that the fits run on numbers of order 1."""
    # halves first, so neither the midrange nor the range overflows
    mx, sx = x.max() / 2 + x.min() / 2, x.max() / 2 - x.min() / 2
    my = np.median(y, axis=-1)
    sy = np.abs(y - my[..., None]).max(axis=-1)  # sy**2 may overflow to inf (an honest SSR > 1e308), not raise
    return mx, (sx if sx > 0 else np.float64(1.0)), my, np.where(sy > 0, sy, 1.0)


def hinge_ssr_profile_np(y: np.ndarray, x: np.ndarray, grid: np.ndarray,
                         weights: np.ndarray | None = None) -> np.ndarray:
    """The (weighted) SSR ``sum_i w_i (y_i - yhat_i)^2`` of the hinge fit ``y = b0 + b1 x + b2 max(0, x - c)``
    at every breakpoint ``c`` of ``grid``, for every leading cell of ``y`` (..., n) and ``weights``
    (its shape, or None) at once: shape (..., grid); ``inf`` where the hinge design restricted to the
    positive-weight points is rank deficient (``c`` leaves too few points on one side), so such a
    ``c`` can never be the minimiser.

    The designs ``sqrt(w) [1, x, max(0, x - c)]`` (``x`` mapped affinely onto [-1, 1], which leaves the
    SSR unchanged and makes the rank test independent of x's units) are stacked over ``c``; the rank
    test is numpy's ``matrix_rank`` of the positive-weight rows, and the SSR the squared norm of the
    residual of ``sqrt(w) y`` after its projection on the columns of the design (a batched reduced QR).
    tests/test_threshold.py holds one statsmodels WLS per breakpoint as its oracle."""
    y = np.asarray(y, dtype=np.float64)
    x = np.asarray(x, dtype=np.float64)
    grid = np.asarray(grid, dtype=np.float64)
    if x.size:
        mid, half = x.max() / 2 + x.min() / 2, x.max() / 2 - x.min() / 2
        half = half if half > 0 else 1.0
        x, grid = (x - mid) / half, (grid - mid) / half
    w = np.ones_like(y) if weights is None else np.broadcast_to(np.asarray(weights, dtype=np.float64), y.shape)
    Z = np.empty((grid.size, x.size, 3))
    Z[..., 0] = 1.0
    Z[..., 1] = x
    Z[..., 2] = np.maximum(0.0, x[None, :] - grid[:, None])
    positive = (w > 0)[..., None, :, None]
    singular = np.linalg.svd(Z * positive, compute_uv=False)                     # (..., grid, 3)
    tol = singular.max(axis=-1) * np.maximum((w > 0).sum(axis=-1), 3)[..., None] * np.finfo(np.float64).eps
    rank = (singular > tol[..., None]).sum(axis=-1)
    sw = np.sqrt(w)
    A = Z * sw[..., None, :, None]
    b = sw * y
    with np.errstate(all="ignore"):
        Q, _ = np.linalg.qr(A)
        r = b[..., None, :] - np.einsum("...gnk,...gk->...gn", Q, np.einsum("...gnk,...n->...gk", Q, b))
        ssr = np.einsum("...gn,...gn->...g", r, r)
    return np.where(rank < 3, np.inf, ssr)


def _fit_at_break(ys, xs, c_s, wts, cov_type: str, scales) -> tuple:
    """``(params, bse, slope_right, slope_right_se, r2)`` of the hinge fit at the standardised
    breakpoint ``c_s`` (WLS with ``wts``, OLS without), mapped back to the original units
    ``scales = (mx, sx, my, sy)`` (module doc of :func:`threshold_regression`, Numerics)."""
    mx, sx, my, sy = scales
    Z = hinge_design_np(xs, c_s)
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        model = sm.OLS(ys, Z) if wts is None else sm.WLS(ys, Z, weights=wts)
        res = model.fit(cov_type=cov_type)
        p_s = np.asarray(res.params)
        V = np.asarray(res.cov_params())
        r2 = float(res.rsquared)
        # back to the original units: b1 = (sy/sx) b1', b2 = (sy/sx) b2', b0 = my + sy b0' - b1 mx
        k = sy / sx
        params = np.array([my + sy * p_s[0] - k * p_s[1] * mx, k * p_s[1], k * p_s[2]])
        r = mx / sx
        bse = np.array([sy * math.sqrt(max(V[0, 0] - 2.0 * r * V[0, 1] + r * r * V[1, 1], 0.0)),
                        k * math.sqrt(max(V[1, 1], 0.0)), k * math.sqrt(max(V[2, 2], 0.0))])
        right = float(params[1] + params[2])
        right_se = k * math.sqrt(max(V[1, 1] + V[2, 2] + 2.0 * V[1, 2], 0.0))
    return params, bse, right, right_se, r2
