"""C2 threshold analysis: exponents of the gradient gap vs tau = tr(Sigma^-2), the threshold
regression, verdicts and the figure, from a ``c2_threshold`` results file alone.

Reads only the documented schema: ``g(tau, seed, L, t)`` (the per-task gradient gap along the
``linear(inf)`` trajectory), ``g_risk`` (same, training-risk gradient), ``concentration_constant
(tau, seed)`` (+inf for tau <= 4), ``logit_factor``, ``dist_bayes`` and the ``criteria`` attr (the
criteria declared below, :data:`CRITERIA`, as stored when the file was made).

Exponents, per tau (log-log OLS slope in L, :func:`fits.loglog_slope`, SE from the OLS residuals):

* fixed-parameter exponent: slope of the seed-mean gap at ``t = 0``;
* uniform exponent: slope of the seed-mean of ``sup_t g_L(t)`` (max over the checkpoints).

Threshold regression (:func:`threshold.threshold_regression`): hinge ``y = b0 + b1 x + b2 max(0, x - c)``
of the uniform exponent ``y`` on ``x``, weighted by ``1 / SE^2``. ``x`` is ``tau`` or ``log tau``.
Which one: the heavy-tail argument below predicts a kink at tau = 4 in either coordinate (the
exponent ``-min(sqrt(tau) / 4, 1/2)`` saturates there), and its left branch is equally curved in
both (its slope changes by the same factor 2.3 over [0.75, 4] in tau and in log tau), so theory
does not choose. The sweep is log-spaced, so log tau spreads the points evenly while tau crowds
them below 4. The rule, neutral about where the break lands: both hinges have three coefficients
and one break on the same ``y`` and weights, so we take the coordinate whose fit has the smaller
weighted SSR (``x="auto"``), and print the other as a sensitivity line. (Paper run: tau, weighted
SSR 98.3 against 114.1 for log tau.) The break and its 95% LR confidence set (Hansen 2000 inversion, grid hull) are
reported in tau units (``exp`` of the log-tau ones); slope SEs at the break ignore its uncertainty.
The OLS SE of a slope measures the scatter about the log-log line only; the between-seed SE
(``se="seed"``) is printed as a sensitivity analysis. When the break's confidence set reaches an
end of the trimmed grid, the data do not locate a break and the two break criteria are reported
INCONCLUSIVE (:func:`inconclusive`), whatever the point estimate.

A fit that cannot be done at all makes its criteria INCONCLUSIVE with the reason, and the tables
and the figure say so and show the rest: the exponents need >= 3 prompt lengths, the threshold
regression >= 6 tau values, the rank correlation >= 3.

Why no sharp break is expected at these L (and none is found in the paper run): the kink at
tau = 4 of the heuristic below is an L -> infinity statement; just above 4 the constant
``(1 - 2 tau^{-1/2})^{-d/2}`` is huge, so L <= 4096 is far from its asymptotic regime there and
the measured exponent moves smoothly with tau.

Heavy-tail heuristic (shown beside the measurements, not a criterion): at the Bayes optimum a
query's finite-L constant carries ``C_q = exp(x_q^T Sigma^-1 x_q / c^2)``, whose tail is
``P(C_q > c) ~ c^{-sqrt(tau)/2}`` (chi-square with ``d`` dof in the exponent). Averaging
``min(C_q / L, 1)`` over queries gives a mean squared gap ``~ L^{-min(sqrt(tau)/2, 1)}``, hence a
gap exponent ``-min(sqrt(tau) / 4, 1/2)`` as L -> infinity (the change at tau = 4 is exactly where
the query-averaged constant becomes finite). It is an asymptotic statement; the range
L = 8..4096 and a finite number of queries make the measured exponents shallower.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import xarray as xr

from .fits import MIN_LINE_POINTS, loglog_slope, not_fitted, too_few
from .tables import column, make_table, to_text
from .threshold import MIN_HINGE_POINTS, threshold_regression
from .verdicts import Criteria, Shared, measure_unless

__all__ = ["CRITERIA", "BREAK_CRITERIA", "exponents", "threshold", "shortfalls", "measures", "verdicts", "inconclusive",
           "fit_tables", "figure", "heuristic_exponent", "spearman", "X_CHOICES", "family_exponents", "constant_ratio",
           "growth_slopes", "family_tables", "family_table"]

X_CHOICES = ("tau", "log_tau")
TAU_STAR = 4.0
_SE_FLOOR = 1e-12   # an exact log-log line has SE 0: floor it so that 1/SE^2 stays finite


def heuristic_exponent(tau):
    """``-min(sqrt(tau) / 4, 1/2)``: the heavy-tail prediction of the uniform exponent (module doc)."""
    return -np.minimum(np.sqrt(np.asarray(tau, dtype=float)) / 4.0, 0.5)


def spearman(x, y) -> float:
    """Spearman rank correlation (average ranks for ties)."""
    def ranks(a):
        a = np.asarray(a, dtype=float)
        order = np.argsort(a, kind="mergesort")
        r = np.empty(a.size)
        r[order] = np.arange(a.size, dtype=float)
        for val in np.unique(a):            # average ties
            tie = a == val
            r[tie] = r[tie].mean()
        return r

    rx, ry = ranks(x), ranks(y)
    if np.ptp(rx) == 0 or np.ptp(ry) == 0:
        return math.nan
    return float(np.corrcoef(rx, ry)[0, 1])


def exponents(ds: xr.Dataset) -> xr.Dataset:
    """Per tau: ``fixed``, ``fixed_se`` (seed-mean gap at t = 0), ``uniform``, ``uniform_se``
    (seed-mean of sup_t g_L(t)), their seed spreads (``*_seed_sd``: SD over seeds of the per-seed
    slopes; NaN with one seed), ``uniform_seed_mean`` and ``uniform_seed_se`` (mean of the per-seed
    uniform slopes and its standard error ``sd / sqrt(n_seeds)``), ``uniform_risk`` (same for the
    training-risk gap ``g_risk``),
    ``argmax_t`` (checkpoint of the sup at the largest L, seed-mean gap) and ``heuristic``."""
    g = ds.g
    fixed = loglog_slope(g.isel(t=0).mean("seed"), "L")
    sup = g.max("t")
    uniform = loglog_slope(sup.mean("seed"), "L")
    per_seed_u = loglog_slope(sup, "L").slope
    per_seed_f = loglog_slope(g.isel(t=0), "L").slope
    ddof = 1 if ds.sizes["seed"] > 1 else 0
    n_seeds = ds.sizes["seed"]
    out = xr.Dataset({
        "fixed": fixed.slope, "fixed_se": fixed.slope_se,
        "uniform": uniform.slope, "uniform_se": uniform.slope_se,
        "fixed_seed_sd": per_seed_f.std("seed", ddof=ddof) if ddof else per_seed_f.isel(seed=0) * np.nan,
        "uniform_seed_sd": per_seed_u.std("seed", ddof=ddof) if ddof else per_seed_u.isel(seed=0) * np.nan,
        "uniform_seed_mean": per_seed_u.mean("seed"),
        "heuristic": ("tau", heuristic_exponent(ds.tau.values)),
        "argmax_t": g.mean("seed").isel(L=-1).idxmax("t"),
    })
    out["uniform_seed_se"] = out.uniform_seed_sd / math.sqrt(n_seeds)
    if "g_risk" in ds:
        out["uniform_risk"] = loglog_slope(ds.g_risk.max("t").mean("seed"), "L").slope
    return out.drop_vars([c for c in out.coords if c not in ("tau",)])


def _fit(ex, x, se_kind="ols"):
    if se_kind == "ols":
        y, se = ex.uniform.values, ex.uniform_se.values
    else:
        y, se = ex.uniform_seed_mean.values, ex.uniform_seed_se.values
        if not np.all(np.isfinite(se)):
            raise ValueError("seed standard errors need at least 2 seeds")
    se = np.maximum(se, _SE_FLOOR)
    xv = ex.tau.values if x == "tau" else np.log(ex.tau.values)
    return threshold_regression(y, xv, weights=1.0 / se**2)


def _to_tau(value, x):
    return float(value) if x == "tau" else float(math.exp(value))


def threshold(ds: xr.Dataset, x: str = "auto", ex: xr.Dataset | None = None, se: str = "ols") -> dict:
    """Threshold regression of the uniform exponent on ``x`` (``"tau"``, ``"log_tau"`` or
    ``"auto"``: the smaller weighted SSR, module doc).

    ``se="ols"`` (the primary analysis): ``y`` = slope of the seed-mean sup-gap, weights ``1/SE^2``
    with the OLS SE of that slope (it measures the scatter about the log-log line only, not the
    variation between seeds). ``se="seed"`` (sensitivity): ``y`` = mean of the per-seed slopes,
    weights ``1/SE^2`` with the between-seed SE ``sd / sqrt(n_seeds)``.

    Returns a dict: ``x`` (chosen coordinate),
    ``fit`` (its :class:`~threshold.ThresholdFit`), ``break_tau``, ``ci_tau`` (low, high), ``covers_4``,
    ``ci_truncated``, and ``alternative`` (the same for the other coordinate, without recursion)."""
    ex = exponents(ds) if ex is None else ex
    if x not in X_CHOICES + ("auto",):
        raise ValueError(f"x must be one of {X_CHOICES + ('auto',)}, got {x!r}")
    if se not in ("ols", "seed"):
        raise ValueError(f"se must be 'ols' or 'seed', got {se!r}")
    fits = {k: _fit(ex, k, se) for k in (X_CHOICES if x == "auto" else (x,))}
    chosen = min(fits, key=lambda k: fits[k].ssr) if x == "auto" else x

    def summary(k):
        f = fits[k]
        lo, hi = _to_tau(f.c_ci_low, k), _to_tau(f.c_ci_high, k)
        return {"x": k, "fit": f, "break_tau": _to_tau(f.c_hat, k), "ci_tau": (lo, hi),
                "covers_4": bool(lo <= TAU_STAR <= hi), "ci_truncated": f.ci_truncated}

    out = summary(chosen)
    out["se"] = se
    others = [k for k in fits if k != chosen]
    out["alternative"] = summary(others[0]) if others else None
    return out


def shortfalls(ds: xr.Dataset) -> dict:
    """Why each fit cannot be done (None when it can): ``exponents`` (slopes in L: >= 3 prompt
    lengths), ``threshold`` (the hinge regression: those exponents at >= 6 tau values), ``trend``
    (the rank correlation: >= 3 tau values)."""
    n_tau = ds.sizes["tau"]
    no_ex = too_few(ds.sizes["L"], MIN_LINE_POINTS, "prompt lengths", "a log-log slope")
    tau = ds.tau.values
    no_fam = None if "g_family" in ds and ds.sizes.get("family", 0) > 0 else \
        "the file has no covariance families (made before the families part, or with none)"
    no_const = None if "gap_constant" in ds else "the file has no gradient-gap constant (made before it was stored)"
    above = "needs a tau > 4 (the constant is finite only there)" if not np.any(tau > TAU_STAR) else None
    below = "needs a tau < 4" if not np.any(tau < TAU_STAR) else None
    return {"exponents": no_ex,
            "threshold": no_ex or too_few(n_tau, MIN_HINGE_POINTS, "tau values", "the threshold regression"),
            "trend": no_ex or too_few(n_tau, 3, "tau values", "a rank correlation"),
            "families": no_ex or no_fam,
            "constant": no_const or above,
            "constant_families": no_fam or no_const or above,
            "growth": no_ex or below}


def family_exponents(ds: xr.Dataset) -> xr.Dataset:
    """Per (family, tau): ``uniform`` (slope in L of the seed-mean of ``sup_t g_family``, OLS SE
    ``uniform_se``), ``uniform_seed_se`` (SD of the per-seed slopes / sqrt(n_family_seeds); NaN with
    one seed), ``difference`` (minus the isotropic ``uniform`` of :func:`exponents` at the same tau)."""
    sup = ds.g_family.max("t_family")
    fit = loglog_slope(sup.mean("family_seed"), "L")
    per_seed = loglog_slope(sup, "L").slope
    n = ds.sizes["family_seed"]
    seed_se = per_seed.std("family_seed", ddof=1) / math.sqrt(n) if n > 1 else per_seed.isel(family_seed=0) * np.nan
    iso = loglog_slope(ds.g.max("t").mean("seed"), "L").slope
    out = xr.Dataset({"uniform": fit.slope, "uniform_se": fit.slope_se, "uniform_seed_se": seed_se,
                      "difference": fit.slope - iso})
    return out.drop_vars([c for c in out.coords if c not in ("family", "tau")])


def _end_Lg2(g, t_dim, seed_dim):
    """``L g_L(T)^2`` at the last checkpoint, mean over seeds (the pooled mean of the squared gap)."""
    return (g.isel({t_dim: -1}) ** 2 * g.L).mean(seed_dim)


def constant_ratio(ds: xr.Dataset) -> xr.Dataset:
    """``L g_L(T)^2 / K`` (seed-pooled ``L g^2`` at the end of training over the gradient-gap
    constant ``K``, :func:`sfxlin.stability.gap_constant`) for every tau > 4 and L: ``iso (tau, L)``
    and, when the file has families, ``families (family, tau, L)``. Tends to 1 as L -> infinity when
    theta_inf(T) is at the Bayes optimum."""
    keep = ds.tau.values > TAU_STAR
    out = xr.Dataset({"iso": (_end_Lg2(ds.g, "t", "seed") / ds.gap_constant).isel(tau=keep)})
    if "g_family" in ds and ds.sizes.get("family", 0) > 0:
        out["families"] = (_end_Lg2(ds.g_family, "t_family", "family_seed") / ds.gap_constant_family).isel(tau=keep)
    return out


def growth_slopes(ds: xr.Dataset) -> xr.DataArray:
    """Per tau: log-log slope in L of the seed-pooled ``L g_L(T)^2`` (isotropic). Below tau = 4 the
    constant is infinite and the heavy-tail argument predicts growth ``L^{1 - sqrt(tau)/2}``; above 4
    the slope tends to 0 as L -> infinity."""
    return loglog_slope(_end_Lg2(ds.g, "t", "seed"), "L").slope


def _worst(ratios) -> float:
    """The ratio farthest from 1 on a log scale."""
    r = np.asarray(ratios, dtype=float).ravel()
    return float(r[np.argmax(np.abs(np.log(r)))])


class _Fits(NamedTuple):
    why: dict                   # shortfalls(ds)
    ex: xr.Dataset | None       # exponents(ds), when they can be fitted
    th: dict | None             # threshold(ds), when it can be done


def _fits(ds: xr.Dataset) -> _Fits:
    """``(shortfalls, exponents or None, threshold or None)``: each fit done once, when it can be."""
    why = shortfalls(ds)
    ex = None if why["exponents"] else exponents(ds)
    th = None if why["threshold"] else threshold(ds, ex=ex)
    return _Fits(why, ex, th)


# --------------------------------------------------------------------------- criteria
# "fixed" exponent: log-log slope in L of the seed-mean gap at t = 0; "uniform" exponent: slope of
# the seed-mean of sup_t g_L(t). The break is the threshold (hinge) regression of the uniform
# exponent on tau (or log tau), weighted by 1/SE^2.


def _break_flags(sh: Shared) -> dict:
    """The break criteria flagged by :func:`inconclusive` (none without a threshold regression)."""
    th = sh(_fits).th
    return {} if th is None else inconclusive(sh.ds, th)


CRITERIA = Criteria("C2", prepare=Shared, inconclusive=_break_flags)


@CRITERIA("C2T-fixed-exponent", "fixed-parameter exponent (slope in L of the seed-mean gap at t = 0), every tau",
          "in", (-0.65, -0.35), reference="near -1/2 at every tau (C2, Sigma = I: -0.526)",
          reason="the fixed-parameter rate is -1/2; +-0.15 because each tau is fitted alone, s = 2 included "
                 "(large logits, pre-asymptotic)")
def _fixed_exponent(sh):
    why, ex, _ = sh(_fits)
    return measure_unless(why["exponents"], lambda: ex.fixed.values)


@CRITERIA("C2T-uniform-low-tau", "uniform exponent (slope in L of the seed-mean sup_t gap) at the smallest tau: "
          "no convergence", ">", -0.1, reference="+0.000 +- 0.029 (tau = 0.75)",
          reason="no convergence means an exponent ~0; -0.1 is ~3.5 reference SEs below 0")
def _uniform_low_tau(sh):
    why, ex, _ = sh(_fits)
    return measure_unless(why["exponents"], lambda: float(ex.uniform.values[0]))


@CRITERIA("C2T-uniform-high-tau", "uniform exponent at the largest tau: uniform convergence", "<", -0.25,
          reference="-0.386 (tau = 14.81)",
          reason="the constant is finite (3.0), so the gap converges uniformly; -0.25 is halfway between none (0) "
                 "and the fixed rate (-1/2)")
def _uniform_high_tau(sh):
    why, ex, _ = sh(_fits)
    return measure_unless(why["exponents"], lambda: float(ex.uniform.values[-1]))


@CRITERIA("C2T-uniform-trend", "Spearman rank correlation of the uniform exponent with tau (monotone decrease)",
          "<=", -0.8, reference="monotone (rank correlation -1)",
          reason="a monotone decrease gives -1; -0.8 tolerates a few neighbour swaps among 14 noisy exponents "
                 "(one-sided p < 1e-3 under no trend)")
def _uniform_trend(sh):
    why, ex, _ = sh(_fits)
    return measure_unless(why["trend"], lambda: spearman(ex.tau.values, ex.uniform.values))


@CRITERIA("C2T-separation-low-tau", "uniform minus fixed-parameter exponent at the smallest tau", ">", 0.2,
          reference="about +0.5 (0.000 vs about -1/2)",
          reason="40% of the reference's separation, several SEs (0.01-0.03) of either exponent")
def _separation_low_tau(sh):
    why, ex, _ = sh(_fits)
    return measure_unless(why["exponents"], lambda: float(ex.uniform.values[0] - ex.fixed.values[0]))


@CRITERIA("C2T-break-location", "break (tau units) of the threshold regression of the uniform exponent", "in",
          (2.0, 8.0), reference="near 4",
          reason="theory puts the kink at tau = 4; a factor 2 either side allows for the smooth finite-L transition "
                 "on a log-spaced grid")
def _break_location(sh):
    why, _, th = sh(_fits)
    return measure_unless(why["threshold"], lambda: th["break_tau"])


@CRITERIA("C2T-break-covers-4", "1 if the 95% LR confidence set of the break contains tau = 4, else 0", ">=", 1.0,
          reference="(expected: tau = 4)", reason="the direct test of the predicted location")
def _break_covers_4(sh):
    why, _, th = sh(_fits)
    return measure_unless(why["threshold"], lambda: 1.0 if th["covers_4"] else 0.0)


@CRITERIA("C2T-families-agree", "largest |mean over tau of (family - isotropic) uniform exponent| over the "
          "covariance families, each rescaled to the same tau = tr(Sigma^-2)", "<=", 0.1,
          reference="0 if only tr(Sigma^-2) matters (the exponential factor of the constant depends on it alone)",
          reason="a 3-seed uniform exponent scatters by about 0.08 between disjoint seed triples (paper isotropic "
                 "run), so a mean over 14 tau of family-minus-isotropic differences has a null SD of about 0.025: "
                 "0.1 is 4 of those, a fifth of the way from no convergence (0) to the fixed rate (-1/2)")
def _families_agree(sh):
    why = sh(_fits).why
    return measure_unless(why["families"],
                          lambda: float(np.abs(family_exponents(sh.ds).difference.mean("tau")).max()))


@CRITERIA("C2T-constant-ratio", "L g_L(T)^2 / K at the largest L and the largest tau (isotropic; K the "
          "gradient-gap constant at the Bayes optimum, docs/models.md)", "in", (0.5, 2.0),
          reference="1 as L -> infinity",
          reason="K is an L -> infinity limit whose per-query terms have infinite variance for tau < 16, so at "
                 "finite L and 1920 queries the pooled mean sits below it: a factor 2 either side")
def _constant_ratio(sh):
    why = sh(_fits).why
    return measure_unless(why["constant"],
                          lambda: float(constant_ratio(sh.ds).iso.isel(tau=-1, L=-1)))


@CRITERIA("C2T-constant-ratio-families", "L g_L(T)^2 / K at the largest L and the largest tau, the family "
          "farthest from 1 (log scale)", "in", (0.5, 2.0), reference="1 as L -> infinity",
          reason="as C2T-constant-ratio, for each covariance family with its own K")
def _constant_ratio_families(sh):
    why = sh(_fits).why
    return measure_unless(why["constant_families"],
                          lambda: _worst(constant_ratio(sh.ds).families.isel(tau=-1, L=-1).values))


@CRITERIA("C2T-growth-below-4", "smallest log-log slope in L of L g_L(T)^2 (isotropic, seed-pooled) over tau < 4",
          ">", 0.0, reference="1 - sqrt(tau)/2 > 0 (heavy-tail argument; infinite constant)",
          reason="below 4 the constant is infinite, so L g^2 must grow with L at every such tau")
def _growth_below_4(sh):
    why = sh(_fits).why
    return measure_unless(why["growth"], lambda: float(
        growth_slopes(sh.ds).isel(tau=sh.ds.tau.values < TAU_STAR).min()))


BREAK_CRITERIA = ("C2T-break-location", "C2T-break-covers-4")


measures, verdicts = CRITERIA.measures, CRITERIA.verdicts


def inconclusive(ds: xr.Dataset, th: dict | None = None) -> dict:
    """Criteria to report INCONCLUSIVE whatever their value: the two break criteria when the 95%
    confidence set of the break reaches an end of the trimmed breakpoint grid (then the data do
    not locate a break: "covers 4" would be vacuous and the point estimate is not identified).
    Empty when the threshold regression cannot be done at all (:func:`measures` gives the reason)."""
    if th is None:
        if shortfalls(ds)["threshold"]:
            return {}
        th = threshold(ds)
    if not th["ci_truncated"]:
        return {}
    lo, hi = th["ci_tau"]
    reason = (f"the 95% CI of the break [{lo:.3g}, {hi:.3g}] reaches the end of the trimmed grid: "
              "the data do not locate a break")
    return {cid: reason for cid in BREAK_CRITERIA}


def fit_tables(ds: xr.Dataset) -> dict:
    """``exponents``: per tau the exponents with SE, their seed spread, the heuristic, the risk
    gap's uniform exponent and the checkpoint of the sup; ``threshold``: the threshold regression
    (chosen coordinate, the other one, and with the between-seed SE); ``trend``: the rank
    correlation; then :func:`family_tables`. A fit that cannot be done is left out, its title
    says why."""
    fits = _fits(ds)
    return {"exponents": _exponent_table(ds, fits), "threshold": _threshold_table(ds, fits),
            "trend": _trend_table(fits), **family_tables(ds)}


def _exponent_table(ds, fits):
    why, ex, _ = fits
    cols = {"s": column(ds.s.isel(seed=0), "s", ".3f"),
            "concentration_constant": column(ds.concentration_constant.isel(seed=0), "C(tau)", ".3g")}
    if ex is not None:
        for key, head, fmt in (("fixed", "fixed", "+.3f"), ("fixed_se", "SE", ".3f"),
                               ("fixed_seed_sd", "sd_seed", ".3f"), ("uniform", "uniform", "+.3f"),
                               ("uniform_se", "SE", ".3f"), ("uniform_seed_sd", "sd_seed", ".3f")):
            cols[key] = column(ex[key], head, fmt)
    cols["heuristic"] = column(xr.DataArray(heuristic_exponent(ds.tau.values), dims="tau", coords={"tau": ds.tau}),
                               "heur.", "+.3f")
    if ex is not None and "uniform_risk" in ex:
        cols["uniform_risk"] = column(ex.uniform_risk, "unif(R)", "+.3f")
    if ex is not None:
        cols["argmax_t"] = column(ex.argmax_t, "argmax t", "d")
    notes = "" if ex is None else (
        "fixed: slope in L of the seed-mean gap at t = 0; uniform: of the seed-mean sup_t gap; SE: OLS; sd_seed: SD "
        "over seeds of per-seed slopes; heur.: -min(sqrt(tau)/4, 1/2); unif(R): uniform exponent of the training-risk "
        "gap g_risk; argmax t: checkpoint of the sup at the largest L")
    return make_table(cols, formats={"tau": ".3f"}, notes=notes,
                      title="per tau: exponents in L of the gradient gap"
                            + (f": not fitted, {why['exponents']}" if ex is None else ""))


_THRESHOLD_COLUMNS = (("x", "x", ""), ("y", "y", ""), ("weights", "weights", ""), ("chosen", "chosen", ""),
                      ("break_tau", "break tau", ".3g"), ("ci_low", "95% CI low", ".3g"),
                      ("ci_high", "95% CI high", ".3g"), ("ci_truncated", "CI at grid end", ""),
                      ("covers_4", "covers 4", ""), ("slope_left", "slope left", "+.4f"),
                      ("slope_left_se", "SE", ".4f"), ("slope_right", "slope right", "+.4f"),
                      ("slope_right_se", "SE", ".4f"), ("ssr", "weighted SSR", ".4g"), ("r2", "R2", ".3f"),
                      ("n", "n", "d"))


def _threshold_row(th, y, weights, chosen) -> dict:
    """The figures of one threshold regression (a :func:`threshold` summary) as a table row."""
    f = th["fit"]
    return {"x": "tau" if th["x"] == "tau" else "log tau", "y": y, "weights": weights, "chosen": chosen,
            "break_tau": th["break_tau"], "ci_low": th["ci_tau"][0], "ci_high": th["ci_tau"][1],
            "ci_truncated": bool(th["ci_truncated"]), "covers_4": bool(th["covers_4"]),
            "slope_left": f.slope_left, "slope_left_se": f.slope_left_se, "slope_right": f.slope_right,
            "slope_right_se": f.slope_right_se, "ssr": f.ssr, "r2": f.r2, "n": int(f.n)}


def _threshold_table(ds, fits):
    why, ex, th = fits
    if th is None:
        return make_table({}, title=f"threshold regression: not fitted, {why['threshold']}")
    rows = {"threshold regression": _threshold_row(th, "uniform", "1/SE_OLS^2", True)}
    if th["alternative"] is not None:
        rows["sensitivity: other x"] = _threshold_row(th["alternative"], "uniform", "1/SE_OLS^2", False)
    if ds.sizes["seed"] > 1:
        ths = threshold(ds, ex=ex, se="seed")
        rows["sensitivity: seed SE"] = _threshold_row(ths, "mean per-seed slope", "1/SE_seed^2", True)
        if ths["alternative"] is not None:
            rows["sensitivity: seed SE, other x"] = _threshold_row(ths["alternative"], "mean per-seed slope",
                                                                   "1/SE_seed^2", False)
    fit = {"fit": list(rows)}
    cols = {key: column(xr.DataArray([r[key] for r in rows.values()], dims="fit", coords=fit), head, fmt)
            for key, head, fmt in _THRESHOLD_COLUMNS}
    return make_table(cols, title="threshold regression of the uniform exponent y on x (hinge, weights 1/SE^2): "
                                  "break in tau units with its 95% LR confidence set, slopes per unit of x",
                      notes="chosen: the coordinate with the smaller weighted SSR; CI at grid end: the confidence "
                            "set reaches the trimmed grid's end (the data do not locate a break)")


def _trend_table(fits):
    why, ex, _ = fits
    if why["trend"]:
        return make_table({}, title=f"Spearman(tau, uniform): not computed, {why['trend']}")
    rho = spearman(ex.tau.values, ex.uniform.values)
    return make_table({"spearman": column(rho, "Spearman(tau, uniform)", "+.3f")},
                      title="rank correlation of the uniform exponent with tau")


def family_tables(ds: xr.Dataset) -> dict:
    """``constant``: the gradient-gap constant and ``L g_L(T)^2 / K`` at the smallest and largest L
    per tau > 4; ``growth``: the growth slope of ``L g_L(T)^2`` per tau (isotropic); per covariance
    family ``family <name>`` (its summary figures) and ``family <name> by tau`` (uniform exponents
    beside the isotropic ones, its constant ratios). A part the file lacks is named with the reason."""
    why = shortfalls(ds)
    tables = {"constant": _constant_table(ds, why["constant"])}
    if not why["growth"]:
        tables["growth"] = make_table({"growth": column(growth_slopes(ds), "tau", "+.3f")}, column_dim="tau",
                                      formats={"tau": ".3g"}, title="growth slope of L g_L(T)^2 in L (isotropic)")
    if why["families"]:
        return {**tables, "families": make_table({}, title=f"covariance families: not compared, {why['families']}")}
    fe = family_exponents(ds)
    for fam in ds.family.values:
        tables[f"family {fam}"] = _family_summary(ds, fam, fe.sel(family=fam))
        tables[f"family {fam} by tau"] = _family_by_tau(ds, fam, fe.sel(family=fam))
    return tables


def family_table(ds: xr.Dataset) -> str:
    """:func:`family_tables` as terminal text."""
    return to_text(family_tables(ds))


def _constant_table(ds, why):
    if why:
        return make_table({}, title=f"gradient-gap constant: not compared, {why}")
    r = constant_ratio(ds).iso
    K, K_se = (ds[k].sel(tau=r.tau) for k in ("gap_constant", "gap_constant_se"))
    return make_table({"K": column(K, "K", ".4g"), "K_se": column(K_se, "K_se", ".2g"),
                       "ratio_first": column(r.isel(L=0), f"Lg2/K L={int(ds.L[0])}", ".3g"),
                       "ratio_last": column(r.isel(L=-1), f"Lg2/K L={int(ds.L[-1])}", ".3g")},
                      formats={"tau": ".3f"}, title="per tau > 4: the gradient-gap constant and L g_L(T)^2 / K",
                      notes="K = lim L E g_L^2 at the Bayes optimum (stability.gap_constant); Lg2: seed-pooled "
                            "L g_L(T)^2 at the end of training")


def _family_summary(ds, fam, f):
    opn = ds.family_op_norm.sel(family=fam)
    return make_table(
        {"condition": column(ds.family_condition.sel(family=fam).isel(tau=0), "condition", ".4g"),
         "op_norm_first": column(opn.isel(tau=0), f"op_norm (tau = {float(ds.tau[0]):.3g})", ".4g"),
         "op_norm_last": column(opn.isel(tau=-1), f"op_norm (tau = {float(ds.tau[-1]):.3g})", ".4g"),
         "tau_error": column(np.max(np.abs(ds.family_tr_inv2.sel(family=fam) / ds.tau - 1)),
                             "max |tr(Sigma^-2) / tau - 1|", ".1e"),
         "mean_difference": column(f.difference.mean(), "mean uniform - isotropic", "+.3f")},
        title=f"family {fam}")


def _family_by_tau(ds, fam, f):
    ratio = (_end_Lg2(ds.g_family, "t_family", "family_seed") / ds.gap_constant_family).sel(family=fam)
    return make_table(
        {"uniform": column(f.uniform, "uniform", "+.3f"),
         "uniform_seed_se": column(f.uniform_seed_se, "SE_seed", ".3f"),
         "isotropic": column(f.uniform - f.difference, "isotropic", "+.3f"),
         "difference": column(f.difference, "diff", "+.3f"),
         "K": column(ds.gap_constant_family.sel(family=fam), "K", ".4g"),
         "ratio": column(ratio.isel(L=-1), "Lg2/K", ".3g"),
         "dist_T": column(ds.dist_bayes_family.sel(family=fam).isel(t_family=-1).max("family_seed"), "dist_T",
                          ".2g")},
        formats={"tau": ".3f"}, title=f"family {fam} by tau",
        notes="uniform: slope in L of the seed-mean sup_t g_family; diff: minus the isotropic uniform exponent; "
              "Lg2/K at the largest L; dist_T: largest distance to the Bayes optimum at the end of training")


def figure(ds: xr.Dataset, path):
    """(a) fixed and uniform exponents vs tau with SE bars, the fitted hinge, the heuristic and a
    vertical line at tau = 4; (b), (c) seed-mean g_L(t) for the smallest tau (below 4) and the
    largest (above 4), one curve per L; (d) uniform exponents vs tau per covariance family beside the
    isotropic ones; (e) ``L g_L(T)^2 / K`` vs L for every tau > 4 (isotropic solid, families dashed),
    1 marked; (f) ``L g_L(T)^2`` vs L for every tau (isotropic), the growth below 4."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    why, ex, th = _fits(ds)
    tau = ds.tau.values
    fig, grid = plt.subplots(2, 3, figsize=(16, 9.6))
    axes = grid[0]
    ax = axes[0]
    if ex is None:
        not_fitted(ax, why["exponents"])
    else:
        ax.errorbar(tau, ex.fixed, yerr=ex.fixed_se, fmt="s", ms=4, capsize=2, color="tab:blue",
                    label="fixed parameters (t = 0)")
        ax.errorbar(tau, ex.uniform, yerr=ex.uniform_se, fmt="o", ms=4, capsize=2, color="tab:red",
                    label="uniform (sup over t)")
    xs = np.geomspace(tau.min(), tau.max(), 200)
    if th is not None:
        f = th["fit"]
        xv = xs if th["x"] == "tau" else np.log(xs)
        ax.plot(xs, f.b0 + f.b1 * xv + f.b2 * np.maximum(0.0, xv - f.c_hat), "r-", lw=1,
                label=f"hinge in {th['x'].replace('_', ' ')}: break {th['break_tau']:.2f} "
                      f"[{th['ci_tau'][0]:.2f}, {th['ci_tau'][1]:.2f}]")
        ax.axvspan(*th["ci_tau"], color="r", alpha=0.08)
    elif ex is not None:
        ax.text(0.02, 0.02, f"threshold regression not fitted: {why['threshold']}", transform=ax.transAxes,
                fontsize=7)
    ax.plot(xs, heuristic_exponent(xs), "k:", lw=1, label=r"heuristic $-\min(\sqrt{\tau}/4, 1/2)$")
    ax.axvline(TAU_STAR, color="gray", ls="--", lw=1, label=r"$\tau = 4$")
    ax.set_xscale("log")
    ax.set(xlabel=r"$\tau = \mathrm{tr}(\Sigma^{-2})$", ylabel="log-log slope in L of the gradient gap",
           title="C2 threshold: exponents of the gradient gap")
    ax.legend(fontsize=7)
    L = ds.L.values
    colors = plt.cm.viridis(np.linspace(0, 0.9, L.size))
    for ax, i in ((axes[1], 0), (axes[2], -1)):
        tv = float(ds.tau.values[i])
        gm = ds.g.isel(tau=i).mean("seed")
        for j, Lj in enumerate(L):
            ax.semilogy(ds.t.values, gm.sel(L=Lj), color=colors[j], lw=1, label=f"L={Lj}")
        side = "below" if tv < TAU_STAR else "above"
        ax.set(xlabel="training step t", ylabel=r"$g_L(t)$ (seed mean)",
               title=f"tau = {tv:.3g} ({side} 4)")
        ax.legend(fontsize=6, ncol=2)
    _family_panels(ds, grid[1], why, ex)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _family_panels(ds, axes, why, ex):
    """Panels (d), (e), (f) of :func:`figure`."""
    import matplotlib.pyplot as plt

    ax = axes[0]
    if why["families"]:
        not_fitted(ax, why["families"])
    else:
        fe = family_exponents(ds)
        ax.errorbar(ds.tau.values, ex.uniform, yerr=ex.uniform_seed_se, fmt="o-", ms=4, capsize=2, color="tab:red",
                    label=f"isotropic ({ds.sizes['seed']} seeds)")
        for k, fam in enumerate(ds.family.values):
            f = fe.sel(family=fam)
            ax.errorbar(ds.tau.values * (1 + 0.02 * (k + 1)), f.uniform, yerr=f.uniform_seed_se, fmt="s--", ms=4,
                        capsize=2, color=("tab:green", "tab:purple", "tab:brown", "tab:olive")[k % 4],
                        label=f"{fam} ({ds.sizes['family_seed']} seeds)")
        ax.legend(fontsize=7)
    ax.axvline(TAU_STAR, color="gray", ls="--", lw=1)
    ax.set_xscale("log")
    ax.set(xlabel=r"$\tau = \mathrm{tr}(\Sigma^{-2})$ (every family rescaled to it)", ylabel="uniform exponent",
           title="uniform exponents across covariance families (bars: seed SE)")
    ax = axes[1]
    if why["constant"]:
        not_fitted(ax, why["constant"])
    else:
        cr = constant_ratio(ds)
        colors = plt.cm.plasma(np.linspace(0, 0.85, cr.sizes["tau"]))
        for i, tv in enumerate(cr.tau.values):
            ax.loglog(cr.L, cr.iso.isel(tau=i), "-o", ms=3, color=colors[i], label=f"tau = {tv:.3g}")
            if "families" in cr:
                for k, fam in enumerate(cr["family"].values):
                    ax.loglog(cr.L, cr.families.isel(family=k, tau=i), ("--", ":", "-.")[k % 3], lw=0.8,
                              color=colors[i], label=str(fam) if i == 0 else None)
        ax.axhline(1.0, color="k", lw=1)
        ax.axhspan(0.5, 2.0, color="g", alpha=0.08)
        ax.legend(fontsize=6, ncol=2)
    ax.set(xlabel="L", ylabel=r"$L\,g_L(T)^2 / K$",
           title=r"$L g_L(T)^2 / K$, tau > 4 (broken lines: families)")
    ax = axes[2]
    if why["growth"]:
        not_fitted(ax, why["growth"])
    else:
        lg = _end_Lg2(ds.g, "t", "seed")
        colors = plt.cm.coolwarm(np.linspace(0, 1, ds.sizes["tau"]))
        for i, tv in enumerate(ds.tau.values):
            ax.loglog(ds.L, lg.isel(tau=i), "-" if tv < TAU_STAR else ":", color=colors[i], lw=1,
                      label=f"tau = {tv:.3g}")
        ax.legend(fontsize=6, ncol=2)
    ax.set(xlabel="L", ylabel=r"$L\,g_L(T)^2$ (seed-pooled)",
           title="growth with L (solid: tau < 4, dotted: tau > 4)")
