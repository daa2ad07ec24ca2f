"""C3 landscape analysis: slopes in L per cell, verdicts and the figure, from a ``c3_landscape`` results
file alone (its variables: pipelines/c3_landscape.py; what they show: docs/claims.md, "C3 landscape").

A *setting* is one ``(covariance, noise, d, mean_norm)``; seed means throughout. Centred settings
(``mean_norm = 0``) carry the transfer criteria, the non-centred ones the control's. Per setting:

* ``excess(L)``: the final held-out risk of softmax(L) at its training ``L`` minus the Monte Carlo
  Bayes floor of the same held-out tasks (``risk_bayes_ridge``, the posterior mean of ``w``);
* ``D(L) = max_t ||theta_L^softmax - theta_inf||``, ``D_linL(L)``, their ratio at the largest L.

Slopes are log-log slopes in ``L`` of the seed-mean curves; a non-positive seed-mean excess (the
trained model on or below the Monte Carlo floor) has no log: that setting's slope is NaN and its
criterion INCONCLUSIVE with that reason.

Independent units: a ``seed`` of a setting is one training run, its tasks shared by every ``L`` and
both models (nested prompts) and trained jointly (the file stores their means, so they are not
independent units); the settings are different questions, not replicates. With ``n_seeds >= 2`` the
slopes have SEs cluster-robust over the seeds and each verdict a robustness over resampled seeds; with
one seed (the quick profile) neither: the SEs are NaN (``n/a (1 seed)``) and the verdict rows say why
(``robustness_note``).
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import xarray as xr

from .c3_family import ONE_SEED, config, panels, positive_slopes, save, softmax
from .fits import MIN_LINE_POINTS, too_few
from .tables import column, make_table
from .verdicts import FAIL, PASS, RESAMPLE, RESAMPLES, Criteria, Inconclusive, NotJudged, Shared, measure_unless

__all__ = ["CRITERIA", "summaries", "slopes", "settings_table", "measures", "verdicts", "fit_tables", "figure"]

_SETTING = ("covariance", "noise", "d", "mean_norm")
TAIL_POINTS = 4   # prompt lengths of the tail slope of D


def summaries(ds: xr.Dataset) -> xr.Dataset:
    """Seed-mean curves over ``L`` per setting, and the covariance summary figures as coordinates."""
    curves = {
        "excess": softmax(ds.risk_heldout_T) - ds.risk_bayes_ridge,
        "risk_heldout": softmax(ds.risk_heldout_T),
        "risk_heldout_linear": ds.risk_heldout_T.sel(model="linear"),
        "D_inf": softmax(ds.D_inf_max),
        "D_inf_linear": ds.D_inf_max.sel(model="linear"),
        "D_linL": ds.D_linL_max,
        "off_block": softmax(ds.off_block_max),
        "risk_bayes_ridge": ds.risk_bayes_ridge,
        "risk_pgd": ds.risk_pgd,
        "risk_pgd_theory": ds.risk_pgd_theory,
        "limit_gap": ds.limit_gap,
        "norm_inf": ds.norm_inf_T,
    }
    out = xr.Dataset({k: da.drop_vars("model", errors="ignore") for k, da in curves.items()}).mean("seed")
    summ = {k: ds[f"Sigma_{k}"] for k in ("trace", "op_norm", "condition", "tr_inv2")}
    return out.assign_coords(summ)


def slopes(ds: xr.Dataset, *, cov_type: str | None = None, alpha: float = 0.05) -> xr.Dataset:
    """Log-log slopes in ``L`` (all ``L``, at least 3) of the seed-mean ``excess``, ``D_inf`` and
    ``D_linL`` per setting, and of ``D_inf`` over the last four ``L`` (``D_inf_tail``: NaN with fewer
    than four), each with its SE (``<name>_se``: cluster-robust over the seeds; NaN with one seed;
    ``cov_type="nonrobust"``: the plain OLS SE of the mean curve, by name; :func:`~.c3_family.seed_slopes`)
    and ``n_units`` (seeds). A slope is NaN in a setting whose seed-mean curve is not positive and
    finite at every L (an excess on or below the Monte Carlo floor): no log there."""
    curves = {"excess": softmax(ds.risk_heldout_T) - ds.risk_bayes_ridge, "D_inf": softmax(ds.D_inf_max),
              "D_linL": ds.D_linL_max}
    if ds.sizes["L"] >= TAIL_POINTS:
        curves["D_inf_tail"] = curves["D_inf"].isel(L=slice(-TAIL_POINTS, None))
    out = {}
    for name, da in curves.items():
        fit = positive_slopes(da, cov_type=cov_type, alpha=alpha)
        out[name], out[f"{name}_se"] = fit.slope, fit.slope_se
    if "D_inf_tail" not in out:
        out["D_inf_tail"] = out["D_inf_tail_se"] = xr.full_like(out["D_inf"], np.nan)
    return xr.Dataset(out).assign(n_units=xr.DataArray(ds.sizes["seed"]))


def _means(ds, which) -> list:
    """The ``mean_norm`` values of the ``"centred"`` (0) or the ``"shifted"`` (> 0) settings."""
    return [float(m) for m in ds.mean_norm.values if (m == 0 if which == "centred" else m > 0)]


def _few(ds):
    return too_few(ds.sizes["L"], MIN_LINE_POINTS, "prompt lengths", "a slope in L")


def _over(sh: Shared, which, reason, compute):
    """``compute()`` at every centred or shifted (``which``) setting, unless ``reason`` (or no such
    setting) stops it."""
    means = _means(sh.ds, which)
    none = None if means else f"no {'centred' if which == 'centred' else 'non-centred'} setting in this file"
    return measure_unless(reason or none, compute)


class _LandscapeCriteria(Criteria):
    """C3L's criteria with the core's robustness, and the reason it cannot be computed with one seed."""

    def verdicts(self, ds, inconclusive=None, *, resamples: int = RESAMPLES) -> list:
        rows = super().verdicts(ds, inconclusive, resamples=resamples)
        if resamples <= 0 or ds.sizes.get("seed", 0) >= 2:
            return rows
        note = ("one seed (n_seeds = 1): each setting is one training run whose tasks are trained jointly and "
                "stored as means, so no independent unit to resample (--set n_seeds=4 gives some)")
        return [replace(r, robustness_note=note) if r.verdict in (PASS, FAIL) else r for r in rows]


CRITERIA = _LandscapeCriteria("C3L", prepare=Shared, units=("seed",))

# Quick profile: the exact symmetry and the closed-form limit gap are judged (same bounds), not the rates.
_ONE_RUN = NotJudged("one run of 3 task pairs at L = 8 .. 64 and T = 100: one curve per setting, no seed "
                     "average (the quick runs' D slopes spread from -0.84 to -0.03 across settings)")


def _at(ds, which, da):
    """``da`` at the centred (``mean_norm = 0``) or the shifted (``> 0``) settings."""
    return da.isel(mean_norm=(ds.mean_norm.values == 0) if which == "centred" else (ds.mean_norm.values > 0))


def _slope_of(sh, which, name):
    """Slopes of the seed-mean curve ``name`` (:func:`slopes`) at the ``which`` settings, or an
    :class:`Inconclusive` naming a curve that is not positive and finite (a distance of exactly 0, say)."""
    values = _at(sh.ds, which, sh(slopes)[name])
    if RESAMPLE not in values.dims and values.isnull().any():
        curve = _at(sh.ds, which, sh(summaries)["D_inf" if name == "D_inf_tail" else name])
        return Inconclusive(f"the seed-mean {name} must be positive and finite for a log-log slope; found "
                            f"{float(curve.min()):g}")
    return values


@CRITERIA("C3L-risk-slope", "log-log slope in L of the final held-out excess risk of softmax(L) over the Bayes floor "
          "(posterior mean on the same held-out tasks), every centred setting", "in", (-1.2, -0.3),
          reference="C3 (noiseless, d = 3): risk slope -0.722 / -0.757",
          reason="ours: the excess must fall towards the setting's own floor at least like L^-0.3; faster than "
                 "L^-1.2 would beat the parametric rate",
          quick=NotJudged("100 steps on 3 task pairs: softmax(L) is far from its floor at every L (held-out risk "
                          "0.2 .. 1.7 at L = 64), the excess slope measures the unfinished optimisation"))
def _risk_slope(sh):
    return _over(sh, "centred", _few(sh.ds) or _on_the_floor(sh), lambda: _slope_of(sh, "centred", "excess"))


def _on_the_floor(sh):
    """Why the excess slope cannot be taken from a file (an excess <= 0 in some centred setting), or
    None (in a resample such a setting's slope is NaN: INCONCLUSIVE there)."""
    excess = _at(sh.ds, "centred", sh(summaries).excess)
    if RESAMPLE in excess.dims or not _means(sh.ds, "centred"):
        return None
    floor = (excess <= 0).any("L")
    if not floor.any():
        return None
    return (f"the excess risk over the Bayes floor is <= 0 at some L in {int(floor.sum())} of {floor.size} centred "
            "settings (softmax(L) on or below the Monte Carlo floor): no log-log slope there")


@CRITERIA("C3L-D-slope", "log-log slope in L of D(L) = max_t ||theta_L^softmax - theta_inf||, every centred setting",
          "<=", -0.1, reference="C3: -0.134 / -0.176",
          reason="ours: the trajectory distance must fall with L (the C3 reference's own rate is slow)",
          quick=_ONE_RUN)
def _d_slope(sh):
    return _over(sh, "centred", _few(sh.ds), lambda: _slope_of(sh, "centred", "D_inf"))


@CRITERIA("C3L-DlinL-slope", "log-log slope in L of D_linL(L) = max_t ||theta_L^softmax - theta_L^linear||, every "
          "centred setting", "<=", -0.1, reference="C3: D_linL equals D(L) to 3 digits",
          reason="ours: softmax(L) approaches linear(L) as L grows, at D's rate", quick=_ONE_RUN)
def _dlinl_slope(sh):
    return _over(sh, "centred", _few(sh.ds), lambda: _slope_of(sh, "centred", "D_linL"))


@CRITERIA("C3L-DlinL-ratio", "D_linL / D at the largest L, every centred setting", "in", (0.8, 1.25),
          reference="C3: 1.00 (3 digits) at L = 4096",
          reason="ours: at large L the residual gap is the softmax nonlinearity, not covariance-estimation noise; "
                 "the band allows the smaller L and T of this profile",
          quick=NotJudged("at L = 64 and T = 100 the softmax nonlinearity is not small against D (the quick "
                          "runs: D_linL / D 0.75 .. 1.15)"))
def _ratio(sh):
    last = sh(summaries).isel(L=-1)
    return _over(sh, "centred", None, lambda: _at(sh.ds, "centred", last.D_linL / last.D_inf))


@CRITERIA("C3L-block", "max over L and t of the off-block mass of softmax(L), every setting", "<", 1e-8,
          reference="C3: ~1e-17",
          reason="ours: the antithetic symmetry (w, eps) <-> (-w, -eps) is exact, with noise too: rounding only",
          quick=1e-8)   # exact at any size
def _block(sh):
    return sh(summaries).off_block.max("L")


@CRITERIA("C3L-control-plateau", "non-centred control: log-log slope of D(L) over the last four L, every "
          "non-centred setting", ">", -0.25, reference="C3 Rademacher control: plateau at 0.20",
          reason="ours: softmax's limit is affine, linear(inf)'s linear, so D must flatten (C3e-plateau's bound)",
          quick=NotJudged("the plateau is an L -> inf statement: the quick grid's last four L are all of "
                          "8 .. 64, where D can still fall"))
def _control_plateau(sh):
    return _over(sh, "shifted",
                 too_few(sh.ds.sizes["L"], TAIL_POINTS, "prompt lengths", "the slope over the last four"),
                 lambda: _slope_of(sh, "shifted", "D_inf_tail"))


@CRITERIA("C3L-control-gap", "non-centred control: limit gap 1/2 E(softmax_inf - linear_inf)^2 at theta_inf(T) "
          "over the held-out target second moment, every non-centred setting", ">", 1e-3,
          reference="0 when centred (Lemma 2.1)",
          reason="ours: the two limits differ by the affine intercept; 0.1% of the target's scale is a clear gap",
          quick=1e-3)   # a closed form at theta_inf(T), not a rate in L: the same at any size
def _control_gap(sh):
    ds = sh.ds   # scale: linear's initial held-out risk at the largest L, ~ 1/2 E y_q^2
    scale = ds.risk_heldout_init.sel(model="linear").isel(L=-1).mean("seed")
    return _over(sh, "shifted", None, lambda: _at(ds, "shifted", sh(summaries).limit_gap / scale))


measures, verdicts = CRITERIA.measures, CRITERIA.verdicts


def settings_table(ds: xr.Dataset) -> xr.Dataset:
    """The fit table of the settings (rows: covariance, noise, d, mean_norm): the condition number,
    the slopes with their SEs (cluster-robust over the seeds; ``n/a (1 seed)`` with one; ``n/a (needs
    3 L)`` / ``n/a (needs 4 L)`` for the tail slope when the file has too few prompt lengths; ``n/a`` for
    an excess not positive at every L), the number of seeds, the ratio D_linL / D, D, the held-out risk
    and the baselines at the largest L, the limit gap."""
    s = summaries(ds)
    n_L = ds.sizes["L"]
    blank = xr.full_like(s.D_inf.isel(L=0, drop=True), np.nan).reset_coords(drop=True)
    names = ("excess", "D_inf", "D_linL", "D_inf_tail")
    sl = slopes(ds) if n_L >= MIN_LINE_POINTS else xr.Dataset(
        {**{k: blank for k in names}, **{f"{k}_se": blank for k in names}, "n_units": xr.DataArray(ds.sizes["seed"])})
    few = "n/a (needs 3 L)" if n_L < MIN_LINE_POINTS else None
    tail_few = f"n/a (needs {TAIL_POINTS} L)" if n_L < TAIL_POINTS else None
    one = ONE_SEED if ds.sizes["seed"] < 2 else None
    last = s.isel(L=-1)
    cols = {"condition": column(s.condition.broadcast_like(blank), "cond", ".3g"),
            "excess_slope": column(sl.excess, "excess slope", ".3g", missing=few),
            "excess_slope_se": column(sl.excess_se, "SE", ".2g", missing=few or one),
            "D_slope": column(sl.D_inf, "D slope", ".3g", missing=few),
            "D_slope_se": column(sl.D_inf_se, "SE", ".2g", missing=few or one),
            "DlinL_slope": column(sl.D_linL, "D_linL slope", ".3g", missing=few),
            "DlinL_slope_se": column(sl.D_linL_se, "SE", ".2g", missing=few or one),
            "D_tail_slope": column(sl.D_inf_tail, "D tail slope", ".3g", missing=tail_few),
            "D_tail_slope_se": column(sl.D_inf_tail_se, "SE", ".2g", missing=tail_few or one),
            "seeds": column(xr.full_like(blank, ds.sizes["seed"]), "seeds", "d"),
            "ratio": column(last.D_linL / last.D_inf, "D_linL/D", ".3g"),
            "D_last": column(last.D_inf, "D(Lmax)", ".3g"), "risk_last": column(last.risk_heldout, "risk(Lmax)", ".3g"),
            "bayes_last": column(last.risk_bayes_ridge, "Bayes(Lmax)", ".3g"),
            "pgd_last": column(last.risk_pgd, "pgd(Lmax)", ".3g"),
            "pgd_theory_last": column(last.risk_pgd_theory, "pgd exact", ".3g"),
            "limit_gap": column(s.limit_gap, "limit gap", ".3g")}
    se = ("SE cluster-robust over the seeds, each one training run whose tasks every L shares" if one is None else
          "one seed: no SE over independent runs (n/a)")
    return make_table({k: v.broadcast_like(blank).transpose(*_SETTING) for k, v in cols.items()},
                      title=f"C3 landscape, seed means, L = {int(ds.L[0])} .. {int(ds.L[-1])} (excess: softmax(L) "
                            f"held-out risk minus the posterior mean's, final step; {se})")


def fit_tables(ds: xr.Dataset) -> dict:
    """``settings``: :func:`settings_table`."""
    return {"settings": settings_table(ds)}


def figure(ds: xr.Dataset, path):
    """Four panels: (a) held-out excess risk of softmax(L) over the Bayes floor vs L, centred settings;
    (b) D(L) vs L, centred (solid) and non-centred control (dashed); (c) D_linL / D vs L;
    (d) held-out risks vs L for the noisy centred settings: softmax(L), the posterior mean, one step of
    preconditioned GD measured and its exact risk. ``path``: a file name or a binary file object."""
    from matplotlib.lines import Line2D

    plt, fig, ((ax1, ax2), (ax3, ax4)) = panels((2, 2), (13, 9))
    s = summaries(ds)
    L = ds.L.values.astype(float)
    covs = [str(c) for c in ds.covariance.values]
    colors = dict(zip(covs, plt.cm.tab10(np.arange(len(covs)))))
    markers = dict(zip(ds.d.values.tolist(), "osD^v<>"))
    for cov in covs:
        for noise in ds.noise.values:
            for d in ds.d.values:
                ls = "-" if noise == 0 else ":"
                kw = dict(color=colors[cov], marker=markers[int(d)], ms=4)
                for mn in ds.mean_norm.values:
                    c = s.sel(covariance=cov, noise=noise, d=d, mean_norm=mn)
                    label = f"{cov} s={noise:g} d={int(d)}"
                    if mn == 0:
                        ax1.loglog(L, c.excess.where(c.excess > 0), ls=ls, label=label, **kw)
                        ax2.loglog(L, c.D_inf, ls=ls, label=label, **kw)
                        ax3.semilogx(L, c.D_linL / c.D_inf, ls=ls, **kw)
                        if noise > 0:
                            ax4.loglog(L, c.risk_heldout, ls="-", **kw)
                            ax4.loglog(L, c.risk_bayes_ridge, ls="--", color=colors[cov], lw=0.8)
                            ax4.loglog(L, c.risk_pgd, ls="none", marker="x", color=colors[cov], ms=4)
                            ax4.loglog(L, c.risk_pgd_theory, ls=":", color=colors[cov], lw=0.8)
                    else:
                        ax2.loglog(L, c.D_inf, ls="--", color=colors[cov], marker=markers[int(d)], ms=3, alpha=0.6,
                                   mfc="none")
    ax1.loglog(L, float(s.excess.where(s.excess > 0).isel(L=0).max()) * (L / L[0]) ** -1.0, "k:", lw=1,
               label=r"$\propto L^{-1}$")
    ax1.set(xlabel="training prompt length L", ylabel="held-out risk of softmax(L) - Bayes floor (final)",
            title="(a) excess risk over the own Bayes floor (centred; dotted: noisy)")
    ax1.legend(fontsize=6, ncol=2)
    ax2.set(xlabel="L", ylabel=r"$\max_t \|\theta_L^{sm} - \theta_\infty\|$",
            title="(b) distance to linear(inf); dashed, open: non-centred control")
    ax3.axhline(1.0, color="k", lw=0.8)
    ax3.set(xlabel="L", ylabel="D_linL / D", title="(c) softmax-vs-linear(L) gap over the distance to linear(inf)")
    ax4.legend(handles=[Line2D([], [], color="k", ls="-", label="softmax(L), trained"),
                        Line2D([], [], color="k", ls="--", lw=0.8, label="posterior mean (Bayes floor, MC)"),
                        Line2D([], [], color="k", ls="none", marker="x", label="one-step preconditioned GD"),
                        Line2D([], [], color="k", ls=":", lw=0.8, label="its exact risk")], fontsize=7)
    ax4.set(xlabel="L", ylabel="held-out risk", title="(d) noisy centred settings: trained softmax vs baselines")
    cfg = config(ds)
    return save(fig, path, 110, f"C3 landscape ({ds.attrs.get('profile', '?')} profile; lr {cfg.get('lr', '?')}, "
                                f"T = {cfg.get('n_steps', '?')})")
