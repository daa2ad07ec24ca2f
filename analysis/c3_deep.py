"""C3 deep analysis: rates and constants of the error to the deep linear limit, the training
measures, verdicts and the figure, from a ``c3_deep`` results file alone.

Reads only the documented schema (pipelines/c3_deep.py): part (a) ``err(heads, seed, kernel, layer,
L)``, ``cov_err`` (same dims), ``out_sq(heads, seed, layer)``; part (b) ``D_inf(depth, heads, seed,
model, L_train, t)``, ``D_linL``, ``risk``, ``risk_inf``, ``risk_heldout(..., stage)``,
``risk_heldout_inf``, ``norm_inf``; and the ``criteria`` attr.

(a) Rates: OLS log-log slope in ``L`` of the seed-mean squared error (resp. of its median over
tasks and queries, and of the token-moment error),
per heads, kernel and layer, over the largest half of the ``L`` grid (at least 3 values: the
asymptotic rate, not the pre-asymptotic bend). Constant: ``C = geometric mean of L * err`` over the
same ``L`` (the constant of ``err ~ C / L``), also relative to the mean squared limit output
``out_sq``; its growth with depth is ``C(l) / C(1)``.

(b) C3 measures per depth and heads (seed means): ``max_t D_inf`` (softmax, linear), ``max_t
D_linL``, their slopes in ``L_train``, and held-out risk final / initial at the largest ``L_train``
(softmax; the limit model).
"""
from __future__ import annotations

import numpy as np
import xarray as xr

from .fits import MIN_LINE_POINTS, loglog_slope, not_fitted, too_few
from .tables import column, make_table
from .verdicts import Criteria, Shared, measure_unless

__all__ = ["CRITERIA", "fit_range", "rates", "training", "measures", "verdicts", "fit_tables", "figure"]


def fit_range(L) -> np.ndarray:
    """Indices of the fitted prompt lengths: the largest half of the grid, at least 3 (all if fewer)."""
    n = len(L)
    return np.arange(n - min(n, max(MIN_LINE_POINTS, n // 2)), n)


def rates(ds: xr.Dataset) -> xr.Dataset:
    """Per heads, kernel, layer: ``slope``, ``slope_se`` of the seed-mean error, ``median_slope``,
    ``median_slope_se`` (of the seed-mean of the median over tasks and queries), ``cov_slope``,
    ``constant`` (geometric mean of ``L err``), ``rel_constant`` (over the seed-mean ``out_sq``)
    and ``growth`` (``constant / constant at layer 1``), over :func:`fit_range`."""
    idx = fit_range(ds.L.values)
    err = ds.err.mean("seed").isel(L=idx)
    fit = loglog_slope(err, "L")
    cov = loglog_slope(ds.cov_err.mean("seed").isel(L=idx), "L")
    med = loglog_slope(ds.err_median.mean("seed").isel(L=idx), "L")
    const = np.exp(np.log(err * err.L).mean("L"))
    out = xr.Dataset({"slope": fit.slope, "slope_se": fit.slope_se, "median_slope": med.slope,
                      "median_slope_se": med.slope_se, "cov_slope": cov.slope, "constant": const,
                      "rel_constant": const / ds.out_sq.mean("seed"), "growth": const / const.isel(layer=0)})
    return out.drop_vars([c for c in out.coords if c not in ("heads", "kernel", "layer")])


def training(ds: xr.Dataset) -> xr.Dataset:
    """Seed means per depth and heads: ``D_inf`` (max over t, per model and L_train), ``D_linL``,
    ``heldout_ratio`` (final / initial held-out risk, per model and L_train), ``heldout_ratio_inf``."""
    h = ds.risk_heldout
    hi = ds.risk_heldout_inf
    out = xr.Dataset({"D_inf": ds.D_inf.max("t"), "D_linL": ds.D_linL.max("t"),
                      "heldout_ratio": h.sel(stage="final") / h.sel(stage="initial"),
                      "heldout_ratio_inf": hi.sel(stage="final") / hi.sel(stage="initial"),
                      "heldout_final": h.sel(stage="final"), "heldout_final_inf": hi.sel(stage="final")})
    out = out.mean("seed")
    return out.drop_vars([c for c in out.coords if c not in ("depth", "heads", "model", "L_train")])


def _no_a(ds):
    return too_few(ds.sizes["L"], MIN_LINE_POINTS, "prompt lengths", "a log-log slope")


def _no_b(ds):
    return too_few(ds.sizes["L_train"], MIN_LINE_POINTS, "training prompt lengths", "a log-log slope")


CRITERIA = Criteria("C3", prepare=Shared)


@CRITERIA("C3D-a-slope", "log-log slope in L of the seed-mean squared error to the deep limit (largest half of L), "
          "every heads, kernel (softmax, linear) and depth", "in", (-1.2, -0.8), reference="-1 (one layer: C1)",
          reason="ours: the output is a smooth function of the layers' empirical attention, whose fluctuations are "
                 "O(L^-1/2), so the squared error keeps the 1/L rate at every depth; +-0.2 for the seed noise of a "
                 "mean of squared errors")
def _a_slope(sh):
    return measure_unless(_no_a(sh.ds), lambda: sh(rates).slope.values.ravel())


@CRITERIA("C3D-a-median-slope", "supplementary (added after the first paper run): log-log slope in L of the "
          "seed-mean median squared error to the deep limit (largest half of L), every heads, kernel and depth", "in",
          (-1.2, -0.8), reference="-1",
          reason="ours: the median over tasks and queries is not moved by the heavy tail of the softmax constant "
                 "exp(a^T Gamma_w a) over (w, x_q) that made the mean erratic; same band as C3D-a-slope")
def _a_median(sh):
    return measure_unless(_no_a(sh.ds), lambda: sh(rates).median_slope.values.ravel())


@CRITERIA("C3D-a-cov-slope", "log-log slope in L of the seed-mean relative error of the tokens' second moment "
          "entering each layer against Sigma_l (Gaussian pushforward), every heads, kernel and layer", "in",
          (-0.65, -0.35), reference="-1/2",
          reason="ours: an empirical second moment converges at the root-L rate; the band of C3a")
def _a_cov(sh):
    return measure_unless(_no_a(sh.ds), lambda: sh(rates).cov_slope.values.ravel())


@CRITERIA("C3D-b-slope", "log-log slope in L_train of the seed-mean max_t D_inf (softmax), every depth and heads",
          "in", (-0.65, -0.35), reference="C3 (one layer): -0.134 / -0.176",
          reason="C3a's band: the distance is driven by the gradient gap, whose rate is -1/2")
def _b_slope(sh):
    return measure_unless(_no_b(sh.ds), lambda: loglog_slope(sh(training).D_inf.sel(model="softmax"),
                                                        "L_train").slope.values.ravel())


@CRITERIA("C3D-b-heldout", "final / initial held-out risk of softmax(L) at the largest L_train (seed mean), every "
          "depth and heads", "<", 0.5, reference="(C3, one layer: 0.95% after 2500 steps)",
          reason="ours: the short training run must at least halve the held-out risk at the largest L")
def _b_heldout(sh):
    return measure_unless(None, lambda: sh(training).heldout_ratio.sel(model="softmax").isel(L_train=-1)
                          .values.ravel())


@CRITERIA("C3D-b-heldout-limit", "final / initial held-out risk of the deep limit model (seed mean), every depth "
          "and heads", "<", 0.5, reference="", reason="ours: as C3D-b-heldout, for the limit model it approximates")
def _b_heldout_inf(sh):
    return measure_unless(None, lambda: sh(training).heldout_ratio_inf.values.ravel())


measures, verdicts = CRITERIA.measures, CRITERIA.verdicts


def fit_tables(ds: xr.Dataset) -> dict:
    """``rates``: (a) per heads, kernel and layer the rates and constants of :func:`rates` (left out
    with the reason when they cannot be fitted); ``training``: (b) per depth and heads the slopes
    in L_train of max_t D_inf (softmax, linear) and of max_t D_linL, and at the largest L_train
    D_inf, D_linL / D_inf and the held-out risks (:func:`training`)."""
    return {"rates": _rates_table(ds), "training": _training_table(ds)}


def _rates_table(ds):
    L = ds.L.values[fit_range(ds.L.values)]
    no_a = _no_a(ds)
    title = (f"(a) squared error to the deep limit, err ~ C / L: slopes over L = {int(L[0])}..{int(L[-1])} (seed "
             "means; SE from OLS; median: of the median over tasks and queries), C = geometric mean of L err, "
             "C / mean pred_inf^2, C(l) / C(1), slope of the token-moment error")
    if no_a:
        return make_table({}, title=f"{title}: not fitted, {no_a}")
    r = rates(ds)
    spec = (("slope", "slope", ".3f"), ("slope_se", "SE", ".3f"), ("median_slope", "median", ".3f"),
            ("median_slope_se", "SE", ".3f"), ("constant", "C", ".3g"), ("rel_constant", "C/out^2", ".3g"),
            ("growth", "C(l)/C(1)", ".3g"), ("cov_slope", "cov slope", ".3f"))
    return make_table({k: column(r[k].transpose("heads", "kernel", "layer"), head, fmt) for k, head, fmt in spec},
                      title=title)


def _training_table(ds):
    tr = training(ds)
    no_b = _no_b(ds)
    cols = {}
    for key, curve, head in (("slope_softmax", tr.D_inf.sel(model="softmax"), "sl sm"),
                             ("slope_linear", tr.D_inf.sel(model="linear"), "sl lin"),
                             ("slope_linL", tr.D_linL, "sl linL")):
        slope = xr.full_like(curve.isel(L_train=0, drop=True), np.nan) if no_b else loglog_slope(curve, "L_train").slope
        cols[key] = column(slope.reset_coords(drop=True), head, ".3f")
    end = tr.isel(L_train=-1)
    d_sm = end.D_inf.sel(model="softmax")
    cols.update(D_inf=column(d_sm, "D_inf", ".3g"), linL_ratio=column(end.D_linL / d_sm, "linL/D", ".3f"),
                heldout_softmax=column(end.heldout_ratio.sel(model="softmax"), "ho sm", ".3f"),
                heldout_linear=column(end.heldout_ratio.sel(model="linear"), "ho lin", ".3f"),
                heldout_limit=column(tr.heldout_ratio_inf, "ho inf", ".3f"),
                risk_softmax=column(end.heldout_final.sel(model="softmax"), "R sm", ".3g"),
                risk_linear=column(end.heldout_final.sel(model="linear"), "R lin", ".3g"),
                risk_limit=column(tr.heldout_final_inf, "R inf", ".3g"))
    Lt = ds.L_train.values
    return make_table({k: v.transpose("depth", "heads") for k, v in cols.items()},
                      title=f"(b) training (seed means; L_train = {int(Lt[0])}..{int(Lt[-1])}): slopes in L_train of "
                            "max_t D_inf (softmax, linear) and of max_t D_linL; at the largest L_train: D_inf, "
                            "D_linL / D_inf(softmax), held-out risk final / initial (softmax, linear, limit), final "
                            "held-out risks" + (f"; slopes not fitted, {no_b}" if no_b else ""))


def figure(ds: xr.Dataset, path):
    """(a) seed-mean squared error vs L per layer (softmax solid, linear dashed), most heads;
    (b) softmax with the fewest heads, mean vs median squared error; (c) the constant relative to
    the output scale vs depth; (d) max_t D_inf vs L_train per depth (softmax solid, linear
    dashed); (e) held-out risk final / initial vs L_train."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 5, figsize=(25, 4.6))
    err = ds.err.mean("seed")
    layers = ds.layer.values
    colors = plt.cm.viridis(np.linspace(0, 0.9, layers.size))
    ax = axes[0]
    h = ds.heads.values[-1]
    for i, lay in enumerate(layers):
        for k, ls in (("softmax", "-"), ("linear", "--")):
            ax.loglog(ds.L, err.sel(heads=h, kernel=k, layer=lay), ls, marker="o", ms=3, color=colors[i],
                      label=f"depth {int(lay)}, {k}")
    L = ds.L.values.astype(float)
    ax.loglog(L, err.sel(heads=h, kernel="softmax", layer=layers[0]).values[0] * L[0] / L, "k:", lw=1, label="1/L")
    ax.set(xlabel="L", ylabel=r"mean $(\mathrm{pred}_L - \mathrm{pred}_\infty)^2$",
           title=f"(a) error to the deep limit, H = {int(h)}")
    ax.legend(fontsize=6, ncol=2)
    ax = axes[1]
    h1 = ds.heads.values[0]
    med = ds.err_median.mean("seed")
    for i, lay in enumerate(layers):
        ax.loglog(ds.L, err.sel(heads=h1, kernel="softmax", layer=lay), "-", marker="o", ms=3, color=colors[i],
                  label=f"depth {int(lay)}, mean")
        ax.loglog(ds.L, med.sel(heads=h1, kernel="softmax", layer=lay), ":", marker="s", ms=3, color=colors[i],
                  label=f"depth {int(lay)}, median")
    ax.set(xlabel="L", ylabel="squared error over tasks and queries",
           title=f"(b) softmax, H = {int(h1)}: mean vs median")
    ax.legend(fontsize=6, ncol=2)
    ax = axes[2]
    no_a = _no_a(ds)
    if no_a:
        not_fitted(ax, no_a)
    else:
        rel = rates(ds).rel_constant
        for hh in ds.heads.values:
            for k, ls in (("softmax", "-"), ("linear", "--")):
                ax.semilogy(layers, rel.sel(heads=hh, kernel=k), ls, marker="o",
                            label=f"H = {int(hh)}, {k}")
        ax.set(xlabel="depth", ylabel=r"$C / \mathrm{mean\ pred}_\infty^2$, err ~ C / L",
               title="(c) constant of the 1/L rate vs depth")
        ax.legend(fontsize=7)
    tr = training(ds)
    dcol = plt.cm.plasma(np.linspace(0, 0.8, ds.depth.size))
    for ax, what in ((axes[3], "D"), (axes[4], "R")):
        for i, dep in enumerate(ds.depth.values):
            for hh, mk in zip(ds.heads.values, "os^v"):
                t = tr.sel(depth=dep, heads=hh)
                if what == "D":
                    ax.loglog(ds.L_train, t.D_inf.sel(model="softmax"), "-", marker=mk, color=dcol[i],
                              label=f"K = {int(dep)}, H = {int(hh)}")
                    ax.loglog(ds.L_train, t.D_inf.sel(model="linear"), "--", marker=mk, color=dcol[i])
                else:
                    ax.semilogx(ds.L_train, t.heldout_ratio.sel(model="softmax"), "-", marker=mk, color=dcol[i],
                                label=f"K = {int(dep)}, H = {int(hh)}")
                    ax.axhline(float(t.heldout_ratio_inf), color=dcol[i], ls=":", lw=1)
    axes[3].set(xlabel="L_train", ylabel=r"$\max_t \|\theta_L(t) - \theta_\infty(t)\|$",
                title="(d) distance to the limit model (softmax solid, linear dashed)")
    axes[4].set(xlabel="L_train", ylabel="held-out risk final / initial",
                title="(e) held-out risk, softmax(L) (dotted: limit model)")
    axes[3].legend(fontsize=7)
    axes[4].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
