"""The measures of C1K, C1R, C3D and C3L through ``module.verdicts(ds)``, as :mod:`test_measures`
does for C1, C2, C2T and C3: on synthetic files with known answers (:mod:`synthetic`), one bad
cell among good ones fails a criterion that says "every", every ``in`` interval is probed just
inside and just outside both ends and every ``<``, ``>`` at its bound, values the criterion must
ignore are set to values that would fail it; the standard errors the modules report are checked
against the normal equations (or the SE of a mean) computed here on the same numbers; files too
small for a fit are INCONCLUSIVE with the reason.
"""
from __future__ import annotations

import numpy as np
import pytest
import xarray as xr

import synthetic
from sfxlin.analysis import c1_kernels, c1_real, c3_deep, c3_landscape
from sfxlin.analysis.tables import to_text
from sfxlin.analysis.verdicts import FAIL, INCONCLUSIVE, PASS
from test_measures import HAIR, case, put, rows


def tilt(dim, dp):
    """Multiply a curve along ``dim`` by ``(x / x_min)^dp``: its log-log slope in ``dim`` moves by ``dp``."""
    return lambda da: da * (da[dim] / da[dim][0]) ** dp


def ols_slope_se(x, y):
    """Slope of ``y`` on ``[1, x]`` and its SE ``sqrt(s^2 [(X'X)^-1]_11)``, ``s^2 = SSR / (n - 2)``,
    from the normal equations."""
    X = np.column_stack([np.ones_like(x), x])
    XtX = X.T @ X
    beta = np.linalg.solve(XtX, X.T @ y)
    resid = y - X @ beta
    s2 = resid @ resid / (x.size - 2)
    return beta[1], np.sqrt(s2 * np.linalg.inv(XtX)[1, 1])


#: a non-power-law factor along the fitted dim: the fits have a nonzero residual and SE
BUMPS = np.array([1.3, 0.8, 1.1, 0.7, 1.25, 0.9, 1.05])


def bumpy(ds, var, dim):
    """``ds`` with ``var`` multiplied by :data:`BUMPS` along ``dim`` and by a factor growing with
    every other cell (each cell its own slope and SE)."""
    out = ds.copy(deep=True)
    da = out[var]
    bumps = xr.DataArray(BUMPS[: da.sizes[dim]], dims=dim)
    other = [d for d in da.dims if d != dim]
    ramp = xr.DataArray(np.arange(np.prod([da.sizes[d] for d in other])).reshape([da.sizes[d] for d in other]),
                        dims=other)
    out[var] = da * bumps ** (1.0 + 0.3 * ramp) * (da[dim] / da[dim][0]) ** (0.01 * ramp)
    return out


def assert_fit_matches_normal_equations(fit, curves, dim):
    """Every cell of ``fit`` (``slope``, ``slope_se``) equals :func:`ols_slope_se` of log(curve) on log(dim)."""
    stacked = curves.stack(cell=[d for d in curves.dims if d != dim]).transpose("cell", dim)
    x = np.log(curves[dim].values.astype(float))
    for i in range(stacked.sizes["cell"]):
        where = {d: v for d, v in zip(stacked.indexes["cell"].names, stacked.cell.values[i])}
        slope, se = ols_slope_se(x, np.log(stacked.isel(cell=i).values))
        assert se > 1e-3, where                                    # the fit is not exact: an SE to check
        np.testing.assert_allclose(float(fit.slope.sel(where)), slope, rtol=1e-10, err_msg=str(where))
        np.testing.assert_allclose(float(fit.slope_se.sel(where)), se, rtol=1e-10, err_msg=str(where))


def verdict(module, ds, cid):
    """The VerdictRow of criterion ``cid``."""
    return rows(module, ds)[cid]


# --------------------------------------------------------------------------- C1 kernels

#: feature variances: two light-tailed (< 1/3), the boundary 1/3 (in neither set), two heavy (>= 1)
RF_SIGMA2 = (0.1, 0.2, 1.0 / 3.0, 1.0, 2.0)
RF_EXPONENT = (-1.0, -1.0, -1.5, -0.3, -0.5)     # 1/3: would fail rf-rate and rf-slow if judged
RF_C = (0.05, 0.08, 0.1, 1.0, 1.0)
RF_DRAWS = np.array([0.5, 1.0, 1.5])             # draw factors with mean exactly 1


def c1k():
    """:func:`synthetic.c1_kernels` with :data:`RF_SIGMA2`: error ``c m^p`` per draw factor, the
    constant ``c`` for the light tails (``m * error = c``: ratio 1), 1 at 1/3 (ratio 0.006) and inf
    for the heavy tails."""
    ds = synthetic.c1_kernels().drop_vars(["rf_sq_error", "rf_constant", "rf_sigma2"])
    m = ds.rf_m.values.astype(float)
    err = np.array([c * m**p for c, p in zip(RF_C, RF_EXPONENT)])                   # (rf_sigma2, rf_m)
    const = np.array([c if s2 < 1.0 else np.inf for c, s2 in zip(RF_C, RF_SIGMA2)])
    const[2] = 1.0
    return ds.assign(
        rf_sq_error=(("rf_sigma2", "rf_m", "rf_draw"), err[..., None] * RF_DRAWS),
        rf_constant=(("rf_sigma2", "rf_m"), np.repeat(const[:, None], m.size, 1))).assign_coords(
        rf_sigma2=list(RF_SIGMA2))


def gain_se(ds):
    """SE of the seed mean of independent gain estimates: ``sqrt(sum_seed se^2) / n_seed``."""
    return np.sqrt((ds.gain_se.values**2).sum(axis=-1)) / ds.sizes["seed"]


SE0 = float(np.sqrt(2 * 0.01**2) / 2)        # the synthetic file's gain SE: 0.01 per seed, 2 seeds
C1K_LMAX = 128


def _stein(kernel, value):
    return lambda ds: put(ds, "stein_error", value, stein_kernel=kernel)


def _mse(dp, kernel="softmax", r=0.5):
    """Tilt the error of (kernel, r) along L by ``dp`` (every query's, and so the seed's): slope -1 + dp."""
    return lambda ds: put(put(ds, "mse_query", tilt("L", dp), kernel=kernel, r=r), "mse", tilt("L", dp), kernel=kernel,
                          r=r)


def _rf(dp, s2=0.2):
    """Tilt the random-feature error of ``s2`` along m by ``dp``."""
    return lambda ds: put(ds, "rf_sq_error", tilt("rf_m", dp), rf_sigma2=s2)


def _theory_ratio(ratio, kernel="relu", r=0.5):
    """mse / mse_theory = ``ratio`` at the largest L for (kernel, r), in every seed."""
    at = dict(kernel=kernel, r=r, L=C1K_LMAX)
    return lambda ds: put(ds, "mse_theory", lambda t: ds.mse.loc[at] / ratio, **at)


def _z2(mean, kernel="relu", r=1.0):
    """z2 of (kernel, r) with seed mean ``mean`` (seeds 0.5x and 1.5x)."""
    return lambda ds: put(ds, "z2", mean * xr.DataArray(synthetic.SEED_FACTORS, dims="seed"), kernel=kernel, r=r)


def _gain(shift, kernel="softmax", r=0.5):
    """Measured gain of (kernel, r) with seed mean 1 + ``shift`` (seeds scattered), limit 1."""
    return lambda ds: put(ds, "gain_measured", 1.0 + shift * xr.DataArray(synthetic.SEED_FACTORS, dims="seed"),
                          kernel=kernel, r=r)


def _rf_constant(ratio, s2=0.2):
    """m * error / constant = ``ratio`` at the largest m for ``s2`` (c = RF_C at s2)."""
    c = RF_C[RF_SIGMA2.index(s2)]
    return lambda ds: put(ds, "rf_constant", c / ratio, rf_sigma2=s2, rf_m=int(ds.rf_m[-1]))


C1K_CASES = [
    case("stein-smooth-one-kernel-at-bound", "C1K-stein-smooth", FAIL, _stein("sigmoid_logL", 1e-8)),
    case("stein-smooth-below", "C1K-stein-smooth", PASS, _stein("sigmoid_logL", 1e-8 * (1 - HAIR))),
    case("stein-smooth-kinked-ignored", "C1K-stein-smooth", PASS, _stein("relu", 1e-4)),
    case("stein-kinked-one-kernel-at-bound", "C1K-stein-kinked", FAIL, _stein("relu2_norm", 1e-3)),
    case("stein-kinked-below", "C1K-stein-kinked", PASS, _stein("relu2_norm", 1e-3 * (1 - HAIR))),
    case("stein-kinked-smooth-ignored", "C1K-stein-kinked", PASS, _stein("softmax", 1e-2)),
    case("slopes-one-cell-off", "C1K-slopes", FAIL, _mse(0.3, kernel="relu", r=1.0)),
    case("slopes-kernel-without-theory-judged", "C1K-slopes", FAIL, _mse(0.3, kernel="rf_softmax")),
    case("slopes-low-inside", "C1K-slopes", PASS, _mse(-0.15 + HAIR)),
    case("slopes-low-outside", "C1K-slopes", FAIL, _mse(-0.15 - HAIR)),
    case("slopes-high-inside", "C1K-slopes", PASS, _mse(0.15 - HAIR)),
    case("slopes-high-outside", "C1K-slopes", FAIL, _mse(0.15 + HAIR)),
    case("sharp-low-inside", "C1K-sharp-constant", PASS, _theory_ratio(0.85 * (1 + HAIR))),
    case("sharp-low-outside", "C1K-sharp-constant", FAIL, _theory_ratio(0.85 * (1 - HAIR))),
    case("sharp-high-inside", "C1K-sharp-constant", PASS, _theory_ratio(1.15 * (1 - HAIR), kernel="softmax", r=1.0)),
    case("sharp-high-outside", "C1K-sharp-constant", FAIL, _theory_ratio(1.15 * (1 + HAIR), kernel="softmax", r=1.0)),
    case("sharp-smaller-L-ignored", "C1K-sharp-constant", PASS,
         lambda ds: put(ds, "mse_theory", lambda t: 10 * t, kernel="relu", L=16)),
    case("sharp-seed-mean-not-each-seed", "C1K-sharp-constant", PASS,
         lambda ds: put(ds, "mse", lambda m: m * xr.DataArray(synthetic.SEED_FACTORS, dims="seed"), L=C1K_LMAX)),
    case("limit-mc-low-inside", "C1K-limit-mc", PASS, _z2(0.4 * (1 + HAIR))),
    case("limit-mc-low-outside", "C1K-limit-mc", FAIL, _z2(0.4 * (1 - HAIR))),
    case("limit-mc-high-inside", "C1K-limit-mc", PASS, _z2(2.5 * (1 - HAIR), kernel="rf_softmax", r=0.5)),
    case("limit-mc-high-outside", "C1K-limit-mc", FAIL, _z2(2.5 * (1 + HAIR), kernel="rf_softmax", r=0.5)),
    case("gain-just-below-4-SE", "C1K-gain", PASS, _gain(4 * SE0 * (1 - HAIR))),
    case("gain-just-above-4-SE", "C1K-gain", FAIL, _gain(4 * SE0 * (1 + HAIR))),
    case("gain-negative-just-below-4-SE", "C1K-gain", PASS, _gain(-4 * SE0 * (1 - HAIR), kernel="relu", r=1.0)),
    case("gain-negative-just-above-4-SE", "C1K-gain", FAIL, _gain(-4 * SE0 * (1 + HAIR), kernel="relu", r=1.0)),
    case("rf-rate-one-light-off", "C1K-rf-rate", FAIL, _rf(0.3, s2=0.1)),
    case("rf-rate-low-inside", "C1K-rf-rate", PASS, _rf(-0.15 + HAIR)),
    case("rf-rate-low-outside", "C1K-rf-rate", FAIL, _rf(-0.15 - HAIR)),
    case("rf-rate-high-inside", "C1K-rf-rate", PASS, _rf(0.15 - HAIR)),
    case("rf-rate-high-outside", "C1K-rf-rate", FAIL, _rf(0.15 + HAIR)),
    case("rf-constant-low-inside", "C1K-rf-constant", PASS, _rf_constant(0.8 * (1 + HAIR))),
    case("rf-constant-low-outside", "C1K-rf-constant", FAIL, _rf_constant(0.8 * (1 - HAIR))),
    case("rf-constant-high-inside", "C1K-rf-constant", PASS, _rf_constant(1.2 * (1 - HAIR), s2=0.1)),
    case("rf-constant-high-outside", "C1K-rf-constant", FAIL, _rf_constant(1.2 * (1 + HAIR), s2=0.1)),
    case("rf-constant-smaller-m-ignored", "C1K-rf-constant", PASS,
         lambda ds: put(ds, "rf_constant", 100.0, rf_sigma2=0.2, rf_m=4)),
    case("rf-slow-just-above", "C1K-rf-slow", PASS, _rf(0.3 - 0.85 + HAIR, s2=1.0)),    # from slope -0.3
    case("rf-slow-just-below", "C1K-rf-slow", FAIL, _rf(0.3 - 0.85 - HAIR, s2=1.0)),
    case("rf-slow-one-heavy-off", "C1K-rf-slow", FAIL, _rf(-0.5, s2=2.0)),
]


def test_c1_kernels_file_passes_and_its_measures_are_the_known_values():
    ds = c1k()
    assert {r.id: r.verdict for r in c1_kernels.verdicts(ds)} == {c.id: PASS for c in c1_kernels.CRITERIA}
    m = c1_kernels.measures(ds)
    assert (m["C1K-stein-smooth"], m["C1K-stein-kinked"]) == (1e-15, 1e-6)
    np.testing.assert_allclose(np.ravel(m["C1K-slopes"]), np.full(6, -1.0), rtol=0, atol=1e-12)
    np.testing.assert_allclose(np.ravel(m["C1K-sharp-constant"]), np.ones(4), rtol=1e-12)    # softmax, relu x 2 r
    np.testing.assert_array_equal(np.ravel(m["C1K-limit-mc"]), np.ones(6))
    np.testing.assert_array_equal(np.ravel(m["C1K-gain"]), np.zeros(6))
    np.testing.assert_allclose(np.ravel(m["C1K-rf-rate"]), [-1.0, -1.0], rtol=0, atol=1e-12)
    np.testing.assert_allclose(np.ravel(m["C1K-rf-constant"]), [1.0, 1.0], rtol=1e-12)
    np.testing.assert_allclose(np.ravel(m["C1K-rf-slow"]), [-0.3, -0.5], rtol=0, atol=1e-12)


@pytest.mark.parametrize("cid, mutate, expected", C1K_CASES)
def test_c1_kernels_criteria(cid, mutate, expected):
    got = verdict(c1_kernels, mutate(c1k()), cid)
    assert got.verdict == expected, got.measured_str


def test_c1_kernels_gain_z_is_the_difference_over_the_se_of_the_seed_mean():
    """Different SEs per seed and cell: z = (mean measured - mean limit) / (sqrt(sum se^2) / n)."""
    ds = c1k()
    k = np.arange(12).reshape(3, 2, 2)
    ds["gain_se"] = ds.gain_se.copy(data=0.01 * (1 + k))
    ds["gain_measured"] = ds.gain_measured.copy(data=1.0 + 0.003 * (k - 5))
    ds["gain_limit"] = ds.gain_limit.copy(data=1.0 + 0.001 * k**0.5)
    z = (ds.gain_measured.values.mean(-1) - ds.gain_limit.values.mean(-1)) / gain_se(ds)
    np.testing.assert_allclose(c1_kernels.gain_z(ds).transpose("kernel", "r").values, z, rtol=1e-12)
    np.testing.assert_allclose(np.ravel(c1_kernels.measures(ds)["C1K-gain"]), np.abs(z).ravel(), rtol=1e-12)


def assert_cluster_se_matches(fit, da, dim, unit):
    """Every cell of ``fit``: the slope is the OLS slope of the log unit mean of ``da`` on log ``dim``,
    the SE ``sd(b_g) / sqrt(G) * sqrt((nG - 1) / (nG - 2))``, ``b_g`` the slope of unit g's linearised
    log mean ``log ybar + (y_g - ybar) / ybar`` (numpy; the CR1 sandwich over G units reduces to it)."""
    stacked = da.stack(cell=[d for d in da.dims if d not in (dim, unit)]).transpose("cell", dim, unit)
    x = np.log(da[dim].values.astype(float))
    x = x - x.mean()
    n, G = da.sizes[dim], da.sizes[unit]
    for i in range(stacked.sizes["cell"]):
        where = {d: v for d, v in zip(stacked.indexes["cell"].names, stacked.cell.values[i])}
        y = stacked.isel(cell=i).values
        ybar = y.mean(axis=1)
        b = x @ (np.log(ybar)[:, None] + (y - ybar[:, None]) / ybar[:, None]) / (x @ x)
        se = b.std(ddof=1) / np.sqrt(G) * np.sqrt((n * G - 1) / (n * G - 2))
        assert se > 1e-3, where
        np.testing.assert_allclose(float(fit.slope.sel(where)), x @ np.log(ybar) / (x @ x), rtol=1e-10)
        np.testing.assert_allclose(float(fit.slope_se.sel(where)), se, rtol=1e-9, err_msg=str(where))


def test_c1_kernels_slope_se_is_cluster_robust_and_the_normal_equations_by_name():
    """Default: cluster-robust over the (seed, query) units; the plain OLS SE by name is the normal
    equations' on the unit means. Random features: plain OLS (independent m)."""
    ds = bumpy(c1k(), "mse_query", "L")
    units = ds.mse_query.stack(unit=("seed", "query")).reset_index("unit", drop=True)
    assert_cluster_se_matches(c1_kernels.slopes(ds), units, "L", "unit")
    assert_fit_matches_normal_equations(c1_kernels.slopes(ds, cov_type="nonrobust"), units.mean("unit"), "L")
    ds = bumpy(c1k(), "rf_sq_error", "rf_m")
    assert_fit_matches_normal_equations(c1_kernels.rf_slopes(ds), ds.rf_sq_error.mean("rf_draw"), "rf_m")


C1K_FEW = [
    pytest.param(lambda ds: ds.isel(L=[2, 3]), {"C1K-slopes": "needs >= 3 prompt lengths for a log-log slope, got 2"},
                 id="L2"),
    pytest.param(lambda ds: ds.isel(rf_m=[0, 1]), {
        k: "needs >= 3 feature counts m for a log-log slope, got 2" for k in ("C1K-rf-rate", "C1K-rf-slow")}, id="m2"),
    pytest.param(lambda ds: ds.sel(rf_sigma2=list(RF_SIGMA2[2:])), {
        k: "no rf_sigma2 < 1/3 in this file" for k in ("C1K-rf-rate", "C1K-rf-constant")}, id="no-light"),
    pytest.param(lambda ds: ds.sel(rf_sigma2=list(RF_SIGMA2[:3])), {"C1K-rf-slow": "no rf_sigma2 >= 1 in this file"},
                 id="no-heavy"),
    pytest.param(lambda ds: put(ds, "mse_theory", np.nan),
                 {"C1K-sharp-constant": "no kernel with a predicted error in this file"}, id="no-theory"),
]


@pytest.mark.parametrize("shrink, reasons", C1K_FEW)
def test_c1_kernels_a_measure_that_cannot_be_taken_is_inconclusive_with_its_reason(shrink, reasons):
    got = rows(c1_kernels, shrink(c1k()))
    assert {k: (r.verdict, r.note) for k, r in got.items() if k in reasons} == {
        k: (INCONCLUSIVE, why) for k, why in reasons.items()}
    assert {r.verdict for k, r in got.items() if k not in reasons} == {PASS}


# --------------------------------------------------------------------------- C1 on real data

R_LMAX = 256


def _r_slope(dp, dataset="wine", D=2, U_norm=0.1):
    return lambda ds: put(ds, "mse", tilt("L", dp), dataset=dataset, D=D, U_norm=U_norm)


def _r_weight(factors, at=dict(dataset="wine", D=5, U_norm=0.8)):
    """weight_ratio of the heavy setting ``at`` per seed (its slope -1/2 fails C1R-slopes if judged)."""
    return lambda ds: put(ds, "weight_ratio", np.asarray(factors, dtype=float), **at)


def _r_sharp(per_seed, at=dict(dataset="digits", D=2, U_norm=0.05)):
    """mse / mse_asymptotic at the largest L = ``per_seed`` (one value per seed) at ``at``."""
    sel = dict(at, L=R_LMAX)
    ratio = xr.DataArray(np.asarray(per_seed, dtype=float), dims="seed")
    return lambda ds: put(ds, "mse_asymptotic", lambda a: ds.mse.loc[sel] / ratio, **sel)


def _r_decomposition(r, L=R_LMAX, at=dict(dataset="wine", D=5, U_norm=0.1)):
    """mse_gauss / (bias_gauss + mse) = ``r`` at ``L`` in every seed of ``at``."""
    sel = dict(at, L=L)
    return lambda ds: put(ds, "mse_gauss", lambda g: r * (ds.bias_gauss.loc[at] + ds.mse.loc[sel]), **sel)


def _r_order(p, dataset="digits", D=5):
    """The squared bias of (dataset, D) at U_norm = 0.1 set to 2^p times its value at 0.05: order p."""
    at = dict(dataset=dataset, D=D)
    return lambda ds: put(ds, "bias_gauss", lambda b: ds.bias_gauss.loc[dict(at, U_norm=0.05)] * 2.0**p,
                          U_norm=0.1, **at)


C1R_CASES = [
    case("slopes-one-setting-off", "C1R-slopes", FAIL, _r_slope(0.3, "digits", 5, 0.05)),
    case("slopes-low-inside", "C1R-slopes", PASS, _r_slope(-0.1 + HAIR)),
    case("slopes-low-outside", "C1R-slopes", FAIL, _r_slope(-0.1 - HAIR)),
    case("slopes-high-inside", "C1R-slopes", PASS, _r_slope(0.1 - HAIR)),
    case("slopes-high-outside", "C1R-slopes", FAIL, _r_slope(0.1 + HAIR)),
    case("slopes-weight-ratio-at-bound-judged", "C1R-slopes", FAIL, _r_weight([1.0, 1.5])),
    case("slopes-weight-ratio-above-bound-ignored", "C1R-slopes", PASS, _r_weight([1.0, 1.5 * (1 + HAIR)])),
    case("sharp-low-inside", "C1R-sharp-constant", PASS, _r_sharp([0.8 * (1 + HAIR)] * 2)),
    case("sharp-low-outside", "C1R-sharp-constant", FAIL, _r_sharp([0.8 * (1 - HAIR)] * 2)),
    case("sharp-high-inside", "C1R-sharp-constant", PASS, _r_sharp([1.2 * (1 - HAIR)] * 2)),
    case("sharp-high-outside", "C1R-sharp-constant", FAIL, _r_sharp([1.2 * (1 + HAIR)] * 2)),
    case("sharp-seed-mean-not-each-seed", "C1R-sharp-constant", PASS, _r_sharp([0.6, 1.4])),
    case("decomposition-low-inside", "C1R-gauss-decomposition", PASS, _r_decomposition(0.85 * (1 + HAIR))),
    case("decomposition-low-outside", "C1R-gauss-decomposition", FAIL, _r_decomposition(0.85 * (1 - HAIR))),
    case("decomposition-high-inside", "C1R-gauss-decomposition", PASS, _r_decomposition(1.15 * (1 - HAIR))),
    case("decomposition-high-outside", "C1R-gauss-decomposition", FAIL, _r_decomposition(1.15 * (1 + HAIR))),
    case("decomposition-smaller-L-ignored", "C1R-gauss-decomposition", PASS, _r_decomposition(5.0, L=16)),
    case("order-low-inside", "C1R-bias-order", PASS, _r_order(3.5 + HAIR)),
    case("order-low-outside", "C1R-bias-order", FAIL, _r_order(3.5 - HAIR)),
    case("order-high-inside", "C1R-bias-order", PASS, _r_order(4.5 - HAIR, "wine", 2)),
    case("order-high-outside", "C1R-bias-order", FAIL, _r_order(4.5 + HAIR, "wine", 2)),
    case("order-heavy-tilt-judged", "C1R-bias-order", FAIL,
         lambda ds: _r_order(6.0)(put(ds, "weight_ratio", 5.0, dataset="digits", D=5))),
    case("order-largest-U-ignored-in-any-order", "C1R-bias-order", PASS,
         lambda ds: put(ds, "bias_gauss", 1.0, U_norm=0.8).isel(U_norm=[2, 0, 1])),
]


def test_c1_real_measures_are_the_known_values():
    m = c1_real.measures(synthetic.c1_real())
    np.testing.assert_allclose(np.ravel(m["C1R-slopes"]), np.full(8, -1.0), rtol=0, atol=1e-12)
    np.testing.assert_allclose(np.ravel(m["C1R-sharp-constant"]), np.ones(8), rtol=1e-12)
    np.testing.assert_allclose(np.ravel(m["C1R-gauss-decomposition"]), np.ones(8), rtol=1e-12)
    np.testing.assert_allclose(np.ravel(m["C1R-bias-order"]), np.full(4, 4.0), rtol=1e-12)


@pytest.mark.parametrize("cid, mutate, expected", C1R_CASES)
def test_c1_real_criteria(cid, mutate, expected):
    got = verdict(c1_real, mutate(synthetic.c1_real()), cid)
    assert got.verdict == expected, got.measured_str


def test_c1_real_slope_se_is_cluster_robust_and_the_normal_equations_by_name():
    ds = bumpy(synthetic.c1_real(), "mse", "L")
    assert_cluster_se_matches(c1_real.slopes(ds), ds.mse, "L", "seed")
    assert_fit_matches_normal_equations(c1_real.slopes(ds, cov_type="nonrobust"), ds.mse.mean("seed"), "L")


C1R_FEW = [
    pytest.param(lambda ds: ds.isel(L=[3, 4]), {"C1R-slopes": "needs >= 3 prompt lengths for a log-log slope, got 2"},
                 id="L2"),
    pytest.param(lambda ds: ds.isel(U_norm=[0]), {
        "C1R-bias-order": "needs >= 2 values of U_norm for the order of the bias in ||U||, got 1"}, id="U1"),
    pytest.param(lambda ds: put(ds, "weight_ratio", 2.0), {
        k: "no setting has weight_ratio <= 1.25 (near-uniform tilted weights)"
        for k in ("C1R-slopes", "C1R-sharp-constant", "C1R-gauss-decomposition")}, id="all-heavy"),
]


@pytest.mark.parametrize("shrink, reasons", C1R_FEW)
def test_c1_real_a_measure_that_cannot_be_taken_is_inconclusive_with_its_reason(shrink, reasons):
    got = rows(c1_real, shrink(synthetic.c1_real()))
    assert {k: (r.verdict, r.note) for k, r in got.items() if k in reasons} == {
        k: (INCONCLUSIVE, why) for k, why in reasons.items()}
    assert {r.verdict for k, r in got.items() if k not in reasons} == {PASS}


# --------------------------------------------------------------------------- C3 deep

A_CELL = dict(heads=1, kernel="softmax", layer=2)
B_CELL = dict(depth=2, heads=1, model="softmax")
LT_MAX = 128


def _a(var, dp, **at):
    return lambda ds: put(ds, var, tilt("L", dp), **(at or A_CELL))


def _a_small_L(var):
    """``var`` at the smallest half of L (outside the fit range) set to 1: a steep or flat start."""
    return lambda ds: put(ds, var, 1.0, L=[16, 32, 64, 128])


def _b_sup(dp, t=10, **at):
    """Tilt D_inf at checkpoint ``t`` (the sup over t: t = 10) along L_train."""
    return lambda ds: put(ds, "D_inf", tilt("L_train", dp), t=t, **(at or B_CELL))


def _heldout(final, initial=1.0, var="risk_heldout", L_train=LT_MAX, **at):
    """Held-out risk at ``at`` (and ``L_train``): ``final`` per seed at the final stage, ``initial`` at the start."""
    where = dict(at, L_train=L_train) if var == "risk_heldout" else dict(at)

    def mutate(ds):
        put(ds, var, np.asarray(final, dtype=float), stage="final", **where)
        return put(ds, var, float(initial), stage="initial", **where)
    return mutate


HO = dict(depth=2, heads=2, model="softmax")
HO_INF = dict(depth=1, heads=2)

C3D_CASES = [
    case("a-slope-one-cell-off", "C3D-a-slope", FAIL, _a("err", 0.3, heads=2, kernel="linear", layer=3)),
    case("a-slope-low-inside", "C3D-a-slope", PASS, _a("err", -0.2 + HAIR)),
    case("a-slope-low-outside", "C3D-a-slope", FAIL, _a("err", -0.2 - HAIR)),
    case("a-slope-high-inside", "C3D-a-slope", PASS, _a("err", 0.2 - HAIR)),
    case("a-slope-high-outside", "C3D-a-slope", FAIL, _a("err", 0.2 + HAIR)),
    case("a-slope-small-L-ignored", "C3D-a-slope", PASS, _a_small_L("err")),
    case("a-median-one-cell-off", "C3D-a-median-slope", FAIL,
         _a("err_median", -0.3, heads=2, kernel="softmax", layer=1)),
    case("a-median-low-inside", "C3D-a-median-slope", PASS, _a("err_median", -0.2 + HAIR)),
    case("a-median-low-outside", "C3D-a-median-slope", FAIL, _a("err_median", -0.2 - HAIR)),
    case("a-median-high-inside", "C3D-a-median-slope", PASS, _a("err_median", 0.2 - HAIR)),
    case("a-median-high-outside", "C3D-a-median-slope", FAIL, _a("err_median", 0.2 + HAIR)),
    case("a-median-small-L-ignored", "C3D-a-median-slope", PASS, _a_small_L("err_median")),
    case("a-cov-one-cell-off", "C3D-a-cov-slope", FAIL, _a("cov_err", 0.3, heads=1, kernel="linear", layer=3)),
    case("a-cov-low-inside", "C3D-a-cov-slope", PASS, _a("cov_err", -0.15 + HAIR)),
    case("a-cov-low-outside", "C3D-a-cov-slope", FAIL, _a("cov_err", -0.15 - HAIR)),
    case("a-cov-high-inside", "C3D-a-cov-slope", PASS, _a("cov_err", 0.15 - HAIR)),
    case("a-cov-high-outside", "C3D-a-cov-slope", FAIL, _a("cov_err", 0.15 + HAIR)),
    case("a-cov-small-L-ignored", "C3D-a-cov-slope", PASS, _a_small_L("cov_err")),
    case("b-slope-one-cell-off", "C3D-b-slope", FAIL, _b_sup(0.3, depth=1, heads=2, model="softmax")),
    case("b-slope-low-inside", "C3D-b-slope", PASS, _b_sup(-0.15 + HAIR)),
    case("b-slope-low-outside", "C3D-b-slope", FAIL, _b_sup(-0.15 - HAIR)),
    case("b-slope-high-inside", "C3D-b-slope", PASS, _b_sup(0.15 - HAIR)),
    case("b-slope-high-outside", "C3D-b-slope", FAIL, _b_sup(0.15 + HAIR)),
    case("b-slope-linear-ignored", "C3D-b-slope", PASS, _b_sup(0.3, depth=1, heads=1, model="linear")),
    case("b-slope-flat-last-t-below-the-sup-ignored", "C3D-b-slope", PASS,
         lambda ds: put(ds, "D_inf", 0.01, t=20, **B_CELL)),
    case("b-slope-sup-moved-to-the-last-t-judged", "C3D-b-slope", FAIL,
         lambda ds: put(ds, "D_inf", lambda d: 0 * d + 10.0 * (d.L_train / 8.0) ** -0.3, t=20, **B_CELL)),
    case("heldout-seed-mean-just-below", "C3D-b-heldout", PASS, _heldout(np.array([0.3, 0.7]) * (1 - HAIR), **HO)),
    case("heldout-seed-mean-just-above", "C3D-b-heldout", FAIL, _heldout(np.array([0.3, 0.7]) * (1 + HAIR), **HO)),
    case("heldout-a-ratio-not-the-final-risk", "C3D-b-heldout", PASS, _heldout([0.99, 0.99], initial=2.0, **HO)),
    case("heldout-smaller-L-train-ignored", "C3D-b-heldout", PASS, _heldout([1.0, 1.0], L_train=8, **HO)),
    case("heldout-linear-ignored", "C3D-b-heldout", PASS, _heldout([1.0, 1.0], depth=1, heads=1, model="linear")),
    case("heldout-limit-seed-mean-just-below", "C3D-b-heldout-limit", PASS,
         _heldout(np.array([0.3, 0.7]) * (1 - HAIR), var="risk_heldout_inf", **HO_INF)),
    case("heldout-limit-seed-mean-just-above", "C3D-b-heldout-limit", FAIL,
         _heldout(np.array([0.3, 0.7]) * (1 + HAIR), var="risk_heldout_inf", **HO_INF)),
    case("heldout-limit-a-ratio", "C3D-b-heldout-limit", PASS,
         _heldout([0.99, 0.99], initial=2.0, var="risk_heldout_inf", **HO_INF)),
]


def test_c3_deep_measures_are_the_known_values():
    ds = synthetic.c3_deep()
    assert {r.id: r.verdict for r in c3_deep.verdicts(ds)} == {c.id: PASS for c in c3_deep.CRITERIA}
    m = c3_deep.measures(ds)
    for cid, value in [("C3D-a-slope", -1.0), ("C3D-a-median-slope", -1.0), ("C3D-a-cov-slope", -0.5)]:
        np.testing.assert_allclose(np.ravel(m[cid]), np.full(12, value), rtol=0, atol=1e-12)
    np.testing.assert_allclose(np.ravel(m["C3D-b-slope"]), np.full(4, -0.5), rtol=0, atol=1e-12)
    np.testing.assert_allclose(np.ravel(m["C3D-b-heldout"]), np.full(4, 0.1), rtol=1e-12)
    np.testing.assert_allclose(np.ravel(m["C3D-b-heldout-limit"]), np.full(4, 0.2), rtol=1e-12)


@pytest.mark.parametrize("cid, mutate, expected", C3D_CASES)
def test_c3_deep_criteria(cid, mutate, expected):
    got = verdict(c3_deep, mutate(synthetic.c3_deep()), cid)
    assert got.verdict == expected, got.measured_str


def cluster_slope_se(x, Y):
    """Slope of ``log mean_g Y`` on ``[1, x]`` (``Y (n, G)``: G seeds) and its seed-cluster SE, by hand:
    each seed's linearised curve ``z_g = log ybar + (y_g - ybar) / ybar`` has the normal-equation slope
    ``b_g``; the CR1 sandwich of the pooled fit reduces to ``sd(b_g) / sqrt(G) * sqrt((nG - 1) / (nG - 2))``
    (its bread is ``G X'X``, its meat ``sum_g X'X (b_g - b)(b_g - b)' X'X``)."""
    n, G = Y.shape
    ybar = Y.mean(axis=1)
    slope = ols_slope_se(x, np.log(ybar))[0]
    b = np.array([ols_slope_se(x, np.log(ybar) + (Y[:, g] - ybar) / ybar)[0] for g in range(G)])
    return slope, b.std(ddof=1) / np.sqrt(G) * np.sqrt((n * G - 1) / (n * G - 2))


def test_c3_deep_rates_se_and_constant_against_a_hand_computation():
    """Over the fit range (the 3 largest of 7 L): slope of the seed mean and its seed-cluster SE by hand
    (:func:`cluster_slope_se`), the plain SE by name (``cov_type="nonrobust"``) by the normal equations,
    the constant as the geometric mean of L * err, for the mean and the median error."""
    ds = synthetic.c3_deep()
    ds = bumpy(bumpy(ds, "err", "L"), "err_median", "L")
    r = c3_deep.rates(ds)
    plain = c3_deep.rates(ds, cov_type="nonrobust")
    top = dict(L=[256, 512, 1024])
    x = np.log(np.array(top["L"], dtype=float))
    assert int(r.n_units) == 2
    for var, slope, se in (("err", "slope", "slope_se"), ("err_median", "median_slope", "median_slope_se")):
        fit = xr.Dataset({"slope": plain[slope], "slope_se": plain[se]})
        assert_fit_matches_normal_equations(fit, ds[var].mean("seed").sel(top), "L")
        np.testing.assert_allclose(r[slope].values, plain[slope].values, rtol=1e-12)   # same point estimate
        cells = ds[var].sel(top).stack(cell=["heads", "kernel", "layer"]).transpose("cell", "L", "seed")
        for i in range(cells.sizes["cell"]):
            where = dict(zip(cells.indexes["cell"].names, cells.cell.values[i]))
            want_slope, want_se = cluster_slope_se(x, cells.isel(cell=i).values)
            assert want_se > 1e-3, where                                 # the seeds differ: an SE to check
            np.testing.assert_allclose(float(r[slope].sel(where)), want_slope, rtol=1e-10, err_msg=str(where))
            np.testing.assert_allclose(float(r[se].sel(where)), want_se, rtol=1e-9, err_msg=str(where))
    err = ds.err.mean("seed").sel(top).transpose("heads", "kernel", "layer", "L").values
    C = np.exp(np.mean(np.log(err * np.array([256.0, 512.0, 1024.0])), axis=-1))
    np.testing.assert_allclose(r.constant.transpose("heads", "kernel", "layer").values, C, rtol=1e-12)
    np.testing.assert_allclose(r.growth.transpose("heads", "kernel", "layer").values, C / C[:, :, :1], rtol=1e-12)


C3D_FEW = [
    pytest.param(lambda ds: ds.isel(L=[0, 1]), {
        k: "needs >= 3 prompt lengths for a log-log slope, got 2"
        for k in ("C3D-a-slope", "C3D-a-median-slope", "C3D-a-cov-slope")}, id="L2"),
    pytest.param(lambda ds: ds.isel(L_train=[0, 1]), {
        "C3D-b-slope": "needs >= 3 training prompt lengths for a log-log slope, got 2"}, id="L_train2"),
]


@pytest.mark.parametrize("shrink, reasons", C3D_FEW)
def test_c3_deep_a_fit_that_cannot_be_done_is_inconclusive_with_its_reason(shrink, reasons):
    got = rows(c3_deep, shrink(synthetic.c3_deep()))
    assert {k: (r.verdict, r.note) for k, r in got.items() if k in reasons} == {
        k: (INCONCLUSIVE, why) for k, why in reasons.items()}
    assert {r.verdict for k, r in got.items() if k not in reasons} == {PASS}


# --------------------------------------------------------------------------- C3 landscape

SEEDS = xr.DataArray(synthetic.SEED_FACTORS, dims="seed")
CENTRED = dict(covariance="kms:0.5", noise=0.5, d=2, mean_norm=0.0)
SHIFTED = dict(covariance="isotropic", noise=0.5, d=2, mean_norm=1.0)
L_L = np.array([8, 16, 32, 64, 128])


def _excess(p, floor=None, at=CENTRED):
    """Softmax's held-out risk at ``at`` = floor + seeds * (L/8)^p: the excess slope is ``p``
    (``floor``: a new Bayes floor, else the file's)."""
    def mutate(ds):
        if floor is not None:
            put(ds, "risk_bayes_ridge", float(floor), **at)
        return put(ds, "risk_heldout_T", lambda r: ds.risk_bayes_ridge.loc[at] + SEEDS * (r.L / 8.0) ** p,
                   model="softmax", **at)
    return mutate


def _D(var, p, at=CENTRED, L0=8.0, scale=0.5, **model):
    """``var`` at ``at`` = scale * seeds * (L / L0)^p: slope ``p``."""
    return lambda ds: put(ds, var, lambda v: scale * SEEDS * (v.L / L0) ** p, **at, **model)


def _ratio(r, L=128, at=CENTRED):
    """D_linL = ``r`` * D_inf (softmax) at ``L`` in every seed of ``at``."""
    sel = dict(at, L=L)
    return lambda ds: put(ds, "D_linL_max", lambda v: r * ds.D_inf_max.loc[dict(sel, model="softmax")], **sel)


def _off_block(value, at=SHIFTED):
    """Off-block mass of softmax at L = 32 in ``at``: 2 * ``value`` in seed 0, 0 in seed 1 (seed mean ``value``)."""
    return lambda ds: put(ds, "off_block_max", np.array([2 * value, 0.0]), model="softmax", L=32, **at)


def _gap(ratio, scale=1.0, at=SHIFTED):
    """Limit gap / held-out target scale = ``ratio`` at ``at`` (seeds scattered; scale: linear's
    initial held-out risk at the largest L)."""
    def mutate(ds):
        put(ds, "risk_heldout_init", float(scale), model="linear", L=128, **at)
        return put(ds, "limit_gap", ratio * scale * SEEDS, **at)
    return mutate


C3L_CASES = [
    case("risk-one-setting-off", "C3L-risk-slope", FAIL, _excess(0.0, at=dict(CENTRED, covariance="isotropic"))),
    case("risk-low-inside", "C3L-risk-slope", PASS, _excess(-1.2 + HAIR)),
    case("risk-low-outside", "C3L-risk-slope", FAIL, _excess(-1.2 - HAIR)),
    case("risk-high-inside", "C3L-risk-slope", PASS, _excess(-0.3 - HAIR)),
    case("risk-high-outside", "C3L-risk-slope", FAIL, _excess(-0.3 + HAIR)),
    case("risk-over-the-floor-not-the-risk", "C3L-risk-slope", PASS, _excess(-0.7, floor=1.0)),
    case("risk-non-centred-ignored", "C3L-risk-slope", PASS, _excess(0.0, at=SHIFTED)),
    case("D-one-setting-off", "C3L-D-slope", FAIL, _D("D_inf_max", 0.0, at=dict(CENTRED, noise=0.0), model="softmax")),
    case("D-just-below", "C3L-D-slope", PASS, _D("D_inf_max", -0.1 - HAIR, model="softmax")),
    case("D-just-above", "C3L-D-slope", FAIL, _D("D_inf_max", -0.1 + HAIR, model="softmax")),
    case("DlinL-one-setting-off", "C3L-DlinL-slope", FAIL, _D("D_linL_max", 0.2, at=dict(CENTRED, covariance="isotropic"))),
    case("DlinL-just-below", "C3L-DlinL-slope", PASS, _D("D_linL_max", -0.1 - HAIR)),
    case("DlinL-just-above", "C3L-DlinL-slope", FAIL, _D("D_linL_max", -0.1 + HAIR)),
    case("ratio-low-inside", "C3L-DlinL-ratio", PASS, _ratio(0.8 * (1 + HAIR))),
    case("ratio-low-outside", "C3L-DlinL-ratio", FAIL, _ratio(0.8 * (1 - HAIR))),
    case("ratio-high-inside", "C3L-DlinL-ratio", PASS, _ratio(1.25 * (1 - HAIR))),
    case("ratio-high-outside", "C3L-DlinL-ratio", FAIL, _ratio(1.25 * (1 + HAIR))),
    case("ratio-smaller-L-ignored", "C3L-DlinL-ratio", PASS, _ratio(3.0, L=8)),
    case("ratio-non-centred-ignored", "C3L-DlinL-ratio", PASS, _ratio(3.0, at=SHIFTED)),
    case("block-one-L-one-setting-at-bound", "C3L-block", FAIL, _off_block(1e-8)),
    case("block-below", "C3L-block", PASS, _off_block(1e-8 * (1 - HAIR))),
    case("block-centred-setting-judged-too", "C3L-block", FAIL, _off_block(1e-8, at=CENTRED)),
    case("block-linear-ignored", "C3L-block", PASS, lambda ds: put(ds, "off_block_max", 1.0, model="linear")),
    case("plateau-one-setting-off", "C3L-control-plateau", FAIL,
         _D("D_inf_max", -0.5, at=dict(SHIFTED, covariance="kms:0.5"), L0=16.0, scale=0.3, model="softmax")),
    case("plateau-just-above", "C3L-control-plateau", PASS,
         _D("D_inf_max", -0.25 + HAIR, at=SHIFTED, L0=16.0, scale=0.3, model="softmax")),
    case("plateau-just-below", "C3L-control-plateau", FAIL,
         _D("D_inf_max", -0.25 - HAIR, at=SHIFTED, L0=16.0, scale=0.3, model="softmax")),
    case("plateau-first-L-ignored", "C3L-control-plateau", PASS,
         lambda ds: put(ds, "D_inf_max", 100.0, model="softmax", L=8, mean_norm=1.0)),
    case("gap-just-above", "C3L-control-gap", PASS, _gap(1e-3 * (1 + HAIR))),
    case("gap-just-below", "C3L-control-gap", FAIL, _gap(1e-3 * (1 - HAIR))),
    case("gap-over-the-target-scale-above", "C3L-control-gap", PASS, _gap(1e-3 * (1 + HAIR), scale=4.0)),
    case("gap-over-the-target-scale-below", "C3L-control-gap", FAIL, _gap(1e-3 * (1 - HAIR), scale=4.0)),
    case("gap-scale-of-softmax-and-smaller-L-ignored", "C3L-control-gap", PASS,
         lambda ds: put(put(ds, "risk_heldout_init", 1e3, model="softmax"), "risk_heldout_init", 1e3, model="linear",
                        L=[8, 16, 32, 64])),
]


def test_c3_landscape_measures_are_the_known_values():
    ds = synthetic.c3l()
    m = c3_landscape.measures(ds)
    np.testing.assert_allclose(np.ravel(m["C3L-risk-slope"]), np.full(4, -0.7), rtol=0, atol=1e-12)
    np.testing.assert_allclose(np.ravel(m["C3L-D-slope"]), np.full(4, -0.5), rtol=0, atol=1e-12)
    np.testing.assert_allclose(np.ravel(m["C3L-DlinL-slope"]), np.full(4, -0.5), rtol=0, atol=1e-12)
    np.testing.assert_allclose(np.ravel(m["C3L-DlinL-ratio"]), np.ones(4), rtol=1e-12)
    np.testing.assert_array_equal(np.ravel(m["C3L-block"]), np.zeros(8))
    np.testing.assert_allclose(np.ravel(m["C3L-control-plateau"]), np.zeros(4), rtol=0, atol=1e-12)
    np.testing.assert_allclose(np.ravel(m["C3L-control-gap"]), np.full(4, 0.1), rtol=1e-12)


@pytest.mark.parametrize("cid, mutate, expected", C3L_CASES)
def test_c3_landscape_criteria(cid, mutate, expected):
    got = verdict(c3_landscape, mutate(synthetic.c3l()), cid)
    assert got.verdict == expected, got.measured_str


def test_c3_landscape_slopes_against_least_squares():
    """Bumpy curves: the excess slope is the OLS slope of log(risk - floor), the tail slope that of
    the last four L, both by numpy.linalg.lstsq on the seed means."""
    ds = synthetic.c3l()
    ds["risk_heldout_T"] = ds.risk_bayes_ridge + (ds.risk_heldout_T - ds.risk_bayes_ridge) * xr.DataArray(
        BUMPS[:5], dims="L")
    ds["D_inf_max"] = ds.D_inf_max * xr.DataArray(BUMPS[2:7], dims="L")
    sl = c3_landscape.slopes(ds)

    def lstsq_slope(L, y):
        return np.linalg.lstsq(np.column_stack([np.ones(L.size), np.log(L)]), np.log(y), rcond=None)[0][1]

    for cov in ds.covariance.values:
        for noise in ds.noise.values:
            at = dict(covariance=cov, noise=noise, d=2, mean_norm=0.0)
            excess = (ds.risk_heldout_T.sel(model="softmax") - ds.risk_bayes_ridge).sel(at).mean("seed").values
            assert float(sl.excess.sel(at)) == pytest.approx(lstsq_slope(L_L, excess), rel=1e-10)
            at["mean_norm"] = 1.0
            D = ds.D_inf_max.sel(model="softmax").sel(at).mean("seed").values
            assert float(sl.D_inf_tail.sel(at)) == pytest.approx(lstsq_slope(L_L[-4:], D[-4:]), rel=1e-10)


def test_c3_landscape_excess_on_the_floor_is_inconclusive_with_the_reason_and_the_rest_judged():
    """softmax(L) on the Monte Carlo Bayes floor at one L of one centred setting: no log of its
    excess, so the risk slope is INCONCLUSIVE with that reason; the other criteria are judged and
    the fit table prints the slope as n/a."""
    ds = _excess(-0.7)(synthetic.c3l())
    ds["risk_heldout_T"].loc[dict(CENTRED, model="softmax", L=32)] = ds.risk_bayes_ridge.loc[dict(CENTRED, L=32)]
    got = rows(c3_landscape, ds)
    assert (got["C3L-risk-slope"].verdict, got["C3L-risk-slope"].note) == (
        INCONCLUSIVE, "the excess risk over the Bayes floor is <= 0 at some L in 1 of 4 centred settings "
                      "(softmax(L) on or below the Monte Carlo floor): no log-log slope there")
    assert {k: r.verdict for k, r in got.items() if k != "C3L-risk-slope"} == {
        c.id: PASS for c in c3_landscape.CRITERIA if c.id != "C3L-risk-slope"}
    table = c3_landscape.settings_table(ds)
    assert np.isnan(c3_landscape.slopes(ds).excess.sel(CENTRED)) and np.isnan(table.excess_slope.sel(CENTRED))
    assert "n/a" in to_text(table)


C3L_FEW = [
    pytest.param((8, 16), {**{k: "needs >= 3 prompt lengths for a slope in L, got 2"
                              for k in ("C3L-risk-slope", "C3L-D-slope", "C3L-DlinL-slope")},
                           "C3L-control-plateau": "needs >= 4 prompt lengths for the slope over the last four, got 2"},
                 id="L2"),
    pytest.param((8, 16, 32), {"C3L-control-plateau": "needs >= 4 prompt lengths for the slope over the last four, "
                                                      "got 3"}, id="L3"),
]


@pytest.mark.parametrize("L, reasons", C3L_FEW)
def test_c3_landscape_a_fit_that_cannot_be_done_is_inconclusive_with_its_reason(L, reasons):
    got = rows(c3_landscape, synthetic.c3l(L=L))
    assert {k: (r.verdict, r.note) for k, r in got.items() if k in reasons} == {
        k: (INCONCLUSIVE, why) for k, why in reasons.items()}
    assert {r.verdict for k, r in got.items() if k not in reasons} == {PASS}
