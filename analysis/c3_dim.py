"""C3 dimension analysis: per (setting, d) the slopes in L of the trajectory distance and of the held-out
excess risk, the flow time each run needed and its growth in d, whether each run followed its gradient flow,
verdicts and the figure, from a ``c3_dim`` results file alone (its variables: pipelines/c3_dim.py; what they
show: docs/claims.md, "C3 dimension").

* **Distance slope.** ``max_t D_inf(softmax, L)``, log-log slope in ``L`` of its seed mean per
  ``(setting, d)``, over the ``L`` trained at that ``d`` (finite in every seed).
* **Risk slope.** The held-out excess risk of softmax(L) over ``theta_inf(T)``:
  ``risk_heldout_T(softmax, L) - risk_heldout_inf_T``, both Monte Carlo on the SAME held-out tasks and
  queries (the task-to-task spread cancels; the exact population risk of ``theta_inf(T)`` would leave it
  in): what softmax(L) pays at finite ``L`` over its limit, which the transfer says vanishes as ``L``
  grows. (Over linear(L) the difference has no sign: both estimate the same plug-in from the same
  prompt.) A seed mean ``<= 0`` at some ``L`` has no logarithm: no slope, and the criterion says so.
* **Flow time.** ``flow_time = T_conv x lr`` per ``(setting, d)`` (median, min, max over seeds; runs at
  ``flow_max`` without the stop) and per setting the OLS line of ``log flow_time`` on ``log d`` over
  every run (independent runs), HC1 SE, t interval: the time of the gradient flow, not the steps (cells
  of different ``d`` run different step sizes). A file of the fixed-step protocol (one ``lr``, no
  ``flow_time``: made before the faithful step) is read with ``flow_time = T_conv x`` its ``lr``
  (:func:`flow_times`).
* **Flow.** ``risk_rises`` per run: checks at which the exact population risk of ``theta_inf`` rose (a
  faithful discretisation of the gradient flow never raises it here).

Independent units: a seed of a ``(setting, d)`` is one run whose tasks every ``L`` and both models
share (nested prompts): the slopes' SEs are cluster-robust over the seeds (:func:`~.c3_family.seed_line`),
Student-t with ``seeds - 1`` dof; one seed: no interval.
"""
from __future__ import annotations

import numpy as np
import xarray as xr

from .c3_family import LINE, config, panels, save, seed_line, softmax
from .fits import ols_line, too_few
from .tables import column, make_table
from .verdicts import RESAMPLE, Criteria, Inconclusive, NotJudged, Shared, measure_unless

__all__ = ["CRITERIA", "QUANTITIES", "curves", "slopes", "flow_times", "T_growth", "measures", "verdicts", "fit_tables",
           "figure"]

#: the quantities whose slopes in L are fitted: name -> long name
QUANTITIES = {"D": "max_t ||theta_L(t) - theta_inf(t)|| (softmax)",
              "excess": "held-out risk of softmax(L) - that of theta_inf(T) (same held-out tasks)"}

def curves(ds: xr.Dataset) -> xr.Dataset:
    """The per-seed curves of :data:`QUANTITIES` over ``(setting, d, seed, L)`` (NaN above a ``d``'s cap)."""
    return xr.Dataset({"D": softmax(ds.D_inf_max),
                       "excess": softmax(ds.risk_heldout_T) - ds.risk_heldout_inf_T}).transpose("setting", "d", "seed", "L", ...)


def _no_log(curve: xr.DataArray) -> xr.DataArray:
    """Where the seed mean of ``curve`` is <= 0 at an L trained in every seed (no logarithm)."""
    mean = curve.where(np.isfinite(curve).all("seed")).mean("seed")
    return mean <= 0


def slopes(ds: xr.Dataset) -> xr.Dataset:
    """Per ``(quantity, setting, d)``: ``slope``, ``se``, ``ci_low``, ``ci_high`` (95%, cluster over the
    seeds) and ``n_L`` of the log-log line in ``L`` of the seed mean (:data:`QUANTITIES`) over the L trained
    in every seed (:func:`~.c3_family.seed_line`); NaN with fewer than 3 such L or a seed mean <= 0 at one."""
    c = curves(ds).to_dataarray("quantity")
    bad = _no_log(c).any("L")
    res = seed_line(c.where(~bad, 1.0)).where(~bad).assign(n_L=np.isfinite(c).all("seed").sum("L").astype(float))
    res.attrs.update(fit="OLS of log(seed mean) on log(L) over the L trained at d; SE cluster-robust over the seeds "
                         "(linearised log-mean), Student-t with seeds - 1 dof")
    return res.transpose("quantity", "setting", "d", ...)


def flow_times(ds: xr.Dataset) -> tuple[xr.DataArray, float]:
    """``(flow_time, flow_max)``: each run's flow time to the stop rule ``(setting, d, seed)`` and the longest a
    run could take; in a file of the fixed-step protocol (no ``flow_time``), ``T_conv`` and its ``T_max`` times
    the file's one ``lr``."""
    if "flow_time" in ds:
        return ds.flow_time, float(ds.t_flow.values[-1])
    lr = float(config(ds)["lr"])
    return (ds.T_conv * lr).rename("flow_time"), float(ds.t.values[-1]) * lr


def T_growth(ds: xr.Dataset) -> xr.Dataset:
    """Per setting the line ``flow_time ~ d^b``, OLS of ``log flow_time`` on ``log d`` over every run, HC1 SE
    (NaN with one d): ``slope``, ``se``, ``ci_low``, ``ci_high``; per ``(setting, d)`` the median, min and max
    of the flow time over seeds and ``n_not_converged`` (:func:`flow_times`)."""
    T, _ = flow_times(ds)
    fit = ols_line(np.log(T), np.log(T.d), ("d", "seed"), cov_type="HC1")
    out = xr.Dataset({k: fit[f].reset_coords(drop=True).drop_attrs()
                      for k, f in zip(LINE, ("slope", "slope_se", "slope_ci_low", "slope_ci_high"))})
    out["T_median"] = T.median("seed")
    out["T_min"] = T.min("seed")
    out["T_max"] = T.max("seed")
    out["n_not_converged"] = (ds.converged == 0).sum("seed")
    out.attrs.update(fit="OLS of log flow_time on log d over every run of the setting (independent runs), HC1 SE, "
                         "Student-t interval")
    return out


# --------------------------------------------------------------------------- criteria

CRITERIA = Criteria("C3D", prepare=Shared, units=("seed",))

_QUICK = NotJudged("quick profile: d = 2, 3, L = 8 .. 32, 2 seeds: the pipeline is checked, not the slopes")


def _fit_reason(ds):
    if ds.sizes["seed"] < 2:
        return "one seed: no interval over independent runs (n_seeds >= 2 gives one)"
    return too_few(ds.sizes["L"], 3, "prompt lengths", "a slope in L")


def _why_not(ds, q) -> str | None:
    """Why a file gives no slope of ``q`` at some (setting, d): too few L trained, or a seed mean <= 0."""
    c = curves(ds)[q]
    short = []
    for st in ds.setting.values:
        for d in ds.d.values:
            y = c.sel(setting=st, d=d)
            L = y.L.values[np.isfinite(y).all("seed").values]
            below = L[_no_log(y).sel(L=L).values] if L.size >= 3 else []
            why = (f"{L.size} L trained (need >= 3)" if L.size < 3 else
                   f"seed mean <= 0 at L = {', '.join(str(int(x)) for x in below)} (no logarithm)" if len(below) else None)
            if why:
                short.append(f"{st}, d = {int(d)}: {why}")
    return "no slope for " + "; ".join(short) if short else None


def _slope_measure(sh, q):
    def compute():
        why = None if RESAMPLE in sh.ds.dims else _why_not(sh.ds, q)
        return Inconclusive(why) if why else sh(slopes).ci_high.sel(quantity=q)

    return measure_unless(_fit_reason(sh.ds), compute)


@CRITERIA("C3D-converged", "runs that reached flow_max (T_max in a fixed-step file) without the stop rule (exact "
          "population risk of theta_inf <= tol x its init's), per (setting, d)", "<=", 0,
          reference="a prototype of linear(inf) alone (docs/claims.md, C3 dimension): every cell with >= 2 d^2 "
                    "equations met tol = 0.01 within 5400 steps at lr 0.01 (flow time 54)",
          reason="the premise: the slopes are read on runs trained until theta_inf(t) has converged, so that the "
                 "horizon T is not what bounds them (the issue's question)",
          quick=_QUICK, fails_as=("finding", "flow_max too short for this (setting, d): theta_inf still moving"))
def _converged(sh):
    return (sh.ds.converged == 0).sum("seed")


@CRITERIA("C3D-D-slope", "upper end of the 95% CI (cluster over seeds) of the log-log slope in L of max_t "
          "||theta_L(t) - theta_inf(t)|| (softmax), per (setting, d)", "<", 0.0,
          reference="C3 at d = 3, T = 2500: -0.134 / -0.176; c3_horizon best-horizon distance L^-0.27 .. -0.36",
          reason="Thm 4.3 (transfer): theta_L(t) -> theta_inf(t) as L grows over a horizon; at every d the distance "
                 "must fall with L, its interval excluding 0 (one-sided at 2.5% per (setting, d))",
          quick=_QUICK, fails_as=("finding", "the trajectory distance does not fall measurably with L at this d"))
def _d_slope(sh):
    return _slope_measure(sh, "D")


@CRITERIA("C3D-risk-slope", "upper end of the 95% CI (cluster over seeds) of the log-log slope in L of the held-out "
          "risk of softmax(L) at T minus that of theta_inf(T) (same held-out tasks), per (setting, d)", "<", 0.0,
          reference="c3_landscape (d = 3): excess over the Bayes floor L^-0.72 / -0.76",
          reason="the transfer in risk: softmax(L)'s excess over its limit theta_inf(T) vanishes as L grows (the "
                 "prompt's estimation error falls like 1/L at fixed parameters, the parameter gap like D_inf)",
          quick=_QUICK, fails_as=("finding", "the excess risk over theta_inf(T) does not fall measurably with L"))
def _risk_slope(sh):
    return _slope_measure(sh, "excess")


@CRITERIA("C3D-T-isotropic", "upper end of the 95% CI (HC1) of b in flow_time ~ d^b (flow time T_conv x lr to the "
          "stop rule), isotropic setting (every run)",
          "<", 0.5, reference="a prototype of linear(inf) alone (32 .. 512 pairs, lr 0.01): flow time to 1% 4, 4, 2 at "
                              "d = 3, 8, 16",
          reason="with the equations scaled to d^2 the empirical design's conditioning does not change with d, and "
                 "the product parametrisation speeds up with d (||theta_star||^2 = 2 sqrt(d) for Sigma = I): the flow "
                 "should not need more time as d grows; b < 0.5 (slower than sqrt(d)) is the test that it does not "
                 "need much more",
          quick=_QUICK, fails_as=("finding", "isotropic runs need more flow time as d grows"))
def _T_iso(sh):
    ds = sh.ds
    if "isotropic" not in [str(s) for s in ds.setting.values]:
        return Inconclusive("no isotropic setting in this file")
    if ds.sizes["d"] < 2:
        return Inconclusive("one d: no growth in d")
    return sh(T_growth).ci_high.sel(setting="isotropic")


@CRITERIA("C3D-flow", "rises of the exact population risk of theta_inf between consecutive checks (by more than "
          "1e-10 of the init's), per run", "<=", 0,
          reference="a faithful step at d = 16 power_law:1.0 (lr 0.0011): 0 rises to the stop; at lr = 0.01 the shipped "
                    "run of the fixed-step protocol rose to 2.75 of the init's",
          reason="on a noiseless, well-determined task a faithful discretisation of the gradient flow lowers the "
                 "population risk at every check (the flow does); a rise is a step-size instability (a catapult), "
                 "which also amplifies rounding across BLAS kernels",
          profile="any", fails_as=("finding", "the run is not a faithful discretisation of the gradient flow: its "
                                              "step is beyond the stable one somewhere along it"))
def _flow(sh):
    ds = sh.ds
    if "risk_rises" not in ds:
        return Inconclusive("a file of the fixed-step protocol: no risk_rises (made before the faithful step)")
    return ds.risk_rises


@CRITERIA("C3D-block", "max over runs, models, L and t of the off-block mass of theta_L(t), per (setting, d)",
          "<", 1e-8, reference="c3_transfer, c3_horizon: 0 (exact antithetic cancellation)",
          reason="the odd symmetry under w -> -w is exact at every d")
def _block(sh):
    return sh.ds.off_block_max.max(["seed", "model", "L"])


@CRITERIA("C3D-rerun", "largest entrywise difference between theta_inf(t) of the joint run and of the "
          "linear(inf)-alone run that found T, over every run", "<=", 0.0,
          reference="the same engine and arithmetic in both (sfxlin.training.train_until)",
          reason="the T found by the first run is the T of the trajectory the distances are measured to")
def _rerun(sh):
    return sh.ds.inf_rerun_diff.max(["setting", "d", "seed"])


measures, verdicts = CRITERIA.measures, CRITERIA.verdicts


# --------------------------------------------------------------------------- tables


def fit_tables(ds: xr.Dataset) -> dict:
    """``steps`` (the flow time, T_conv and, in a file of the faithful step, lr and risk rises per setting and
    d), ``T_growth`` (the fit in d), ``slopes`` (per quantity, setting, d),
    ``theta_inf`` (at T: exact relative risk, distance to theta_star)."""
    g = T_growth(ds)
    flow = {"median": column(g.T_median, "flow time median", ".3g"), "min": column(g.T_min, "min", ".3g"),
            "max": column(g.T_max, "max", ".3g"), "never": column(g.n_not_converged, "runs at flow_max", "d"),
            "steps": column(ds.T_conv.median("seed"), "T_conv median (steps)", ".0f")}
    if "lr" in ds:
        flow.update(lr=column(ds.lr.max("seed"), "lr", ".3g"), rises=column(ds.risk_rises.sum("seed"),
                                                                           "risk rises (all seeds)", "d"))
    tables = {"steps": make_table(flow, title=f"Flow time T_conv x lr to the stop rule (exact population risk of "
                                              f"theta_inf <= tol x init), over {ds.sizes['seed']} seeds")}
    tables["T_growth"] = make_table({k: column(g[k], f"b: {k}", ".3f") for k in LINE},
                                    title="flow_time ~ d^b per setting: OLS of log flow_time on log d over every run, "
                                          "HC1 SE, 95% t interval")
    s = slopes(ds)
    tables["slopes"] = make_table({**{k: column(s[k], k, ".3f") for k in LINE}, "n_L": column(s.n_L, "L fitted", "d")},
                                  title="Log-log slopes in L per (setting, d): D = max_t ||theta_L - theta_inf|| "
                                        "(softmax), excess = held-out risk of softmax(L) - theta_inf(T); OLS on seed "
                                        "means, SE cluster-robust over seeds, 95% CI (n/a: no slope, see criteria)")
    rel = ds.risk_pop_inf / ds.risk_pop_init
    tables["theta_inf"] = make_table(
        {"rel": column(rel.max("seed"), "pop. risk / init (max over seeds)", ".3g"),
         "star": column((ds.dist_star_inf_T / ds.norm_star).max("seed"), "||th_inf - th*|| / ||th*|| (max)", ".3g"),
         "train": column(ds.risk_train_inf.max("seed"), "training risk (max)", ".3g"),
         "pairs": column(ds.n_pairs.max("seed"), "pairs", ".0f")},
        title="theta_inf(T_conv): exact population risk relative to the init, distance to theta_star (Remark 5.2), "
              "training risk, training pairs")
    return tables


# --------------------------------------------------------------------------- figure


def figure(ds: xr.Dataset, path):
    """Four panels: (a) ``max_t D_inf`` (softmax, seed mean) against ``L``, one curve per (setting, d);
    (b) the excess risk against ``L``, likewise; (c) the slopes of both against ``d`` with their 95%
    intervals; (d) the flow time to the stop rule against ``d`` per setting (every run, with the fitted ``d^b``).
    ``path``: a file name or a binary file object. Returns ``path``."""
    plt, fig, axes = panels((1, 4), (21, 4.8))
    c, s, g = curves(ds), slopes(ds), T_growth(ds)
    L = ds.L.values.astype(float)
    settings, dims_d = [str(x) for x in ds.setting.values], [int(d) for d in ds.d.values]
    marks = dict(zip(settings, ("o", "s", "^", "v")))
    shades = dict(zip(dims_d, plt.cm.viridis(np.linspace(0, 0.85, len(dims_d)))))
    short = {"D": "max_t D_inf(softmax, L), seed mean", "excess": "excess held-out risk over theta_inf(T), seed mean"}
    for ax, q in zip(axes[:2], QUANTITIES):
        for i, st in enumerate(settings):
            for j, d in enumerate(dims_d):
                y = c[q].isel(setting=i, d=j).mean("seed").values
                ok = np.isfinite(y) & (y > 0)
                ax.loglog(L[ok], y[ok], marks[st] + ("-" if i == 0 else "--"), color=shades[d], ms=4,
                          label=f"{st}, d = {d}")
        ax.set(xlabel="prompt length L", title=short[q])
        ax.legend(fontsize=6, ncol=2)
    axes[0].set_ylabel("max_t D_inf")
    axes[1].set_ylabel("excess held-out risk")
    ax = axes[2]
    dvals = np.asarray(dims_d, dtype=float)
    for k, (q, colour) in enumerate(zip(QUANTITIES, ("C0", "C3"))):
        for i, st in enumerate(settings):
            row = s.sel(quantity=q, setting=st)
            x = dvals * (1 + 0.04 * (2 * k + i - 1.5))
            lo, hi = row.slope - row.ci_low, row.ci_high - row.slope
            err = np.vstack([np.nan_to_num(lo.values), np.nan_to_num(hi.values)])
            ax.errorbar(x, row.slope, yerr=err, fmt=marks[st], color=colour, capsize=3, label=f"{q}, {st}")
    ax.axhline(0, color="0.5", lw=0.8)
    ax.set_xscale("log")
    ax.set_xticks(dvals, [str(d) for d in dims_d])
    ax.minorticks_off()
    ax.set(xlabel="d", ylabel="slope in L (95% CI, cluster over seeds)", title="slopes in L against d")
    ax.legend(fontsize=7)
    ax = axes[3]
    flow, flow_max = flow_times(ds)
    T = flow.transpose("setting", "d", "seed")
    for i, st in enumerate(settings):
        for j, d in enumerate(dims_d):
            ax.loglog(np.full(T.sizes["seed"], d), T.values[i, j], marks[st], color=f"C{i}", ms=5, mfc="none",
                      label=st if j == 0 else None)
        b = float(g.slope.sel(setting=st))
        if np.isfinite(b):
            lm = np.log(T.values[i]).mean()
            xd = np.log(np.repeat(dvals, T.sizes["seed"])).mean()
            ax.loglog(dvals, np.exp(lm + b * (np.log(dvals) - xd)), "-", color=f"C{i}", lw=0.8,
                      label=f"{st}: d^{b:.2f}")
    ax.axhline(flow_max, color="0.5", ls="--", lw=0.8)
    ax.set(xlabel="d", ylabel="flow time T_conv x lr", title="flow time to the stop rule (dashed: flow_max)")
    ax.legend(fontsize=7)
    cfg = config(ds)
    step = (f"lr {cfg['lr_rule']}" + (f" (margin {cfg['lr_margin']})" if cfg["lr_rule"] == "faithful" else "")
            if "lr_rule" in cfg else f"lr {cfg.get('lr', '?')}")
    return save(fig, path, 110, f"C3 dimension ({ds.attrs.get('profile', '?')} profile; {step}, tol "
                                f"{cfg.get('tol', '?')}, task_ratio {cfg.get('task_ratio', '?')}, L caps "
                                f"{cfg.get('L_caps', '?')}, {ds.sizes['seed']} seeds)")
