"""Tests of sfxlin.analysis.fits against independent computations: statsmodels (the fitter's
oracle: ``OLS(...).fit(cov_type=..., use_t=True)`` on random data, every estimator, several shapes),
closed forms by hand, scipy's t distribution."""
from __future__ import annotations

import ast
import pathlib

import dask
import numpy as np
import pytest
import scipy.stats
import xarray as xr
from hypothesis import given, settings
from hypothesis import strategies as st

from sfxlin.analysis import fits
import statsmodels.api as sm

from sfxlin.analysis.fits import COV_TYPES, loglog_slope, ols_line, paper_form_fit, power_law_fit

L = np.array([8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096], dtype=float)
D = np.array([2, 5, 10])
UN = np.array([0.1, 0.3, 0.5])


def raise_if_dask_computes():
    """dask config under which any compute fails (the flox habit)."""

    def scheduler(dsk, keys, **kwargs):
        raise RuntimeError("dask computed although the function should be lazy")

    return dask.config.set(scheduler=scheduler)


def power_law_da(noise: float = 0.0, seed: int = 0) -> xr.DataArray:
    """y = c(d, U) L^p(d, U) * exp(noise * eps), dims (d, U_norm, L)."""
    rng = np.random.default_rng([seed, 7])
    p = -1.0 + 0.05 * np.arange(9).reshape(3, 3) / 8  # -1 .. -0.95
    c = np.exp(np.linspace(-3, 1, 9)).reshape(3, 3)
    y = c[..., None] * L ** p[..., None]
    y = y * np.exp(noise * rng.standard_normal(y.shape))
    return xr.DataArray(
        y, dims=("d", "U_norm", "L"), coords={"d": D, "U_norm": UN, "L": L}, name="mse"
    ), p, c


def ols_by_hand(x, y, hc3=False):
    """Closed-form OLS of y on [1, x]: beta, cov (nonrobust s^2 (X'X)^-1 or HC3 sandwich)."""
    X = np.column_stack([np.ones_like(x), x])
    XtX_inv = np.linalg.inv(X.T @ X)
    beta = XtX_inv @ X.T @ y
    e = y - X @ beta
    n = len(y)
    if hc3:
        h = np.einsum("ij,jk,ik->i", X, XtX_inv, X)
        meat = X.T @ (X * (e**2 / (1 - h) ** 2)[:, None])
        cov = XtX_inv @ meat @ XtX_inv
    else:
        cov = (e @ e) / (n - 2) * XtX_inv
    return beta, cov, e


# ------------------------------------------------------------------------------------------
# loglog_slope
# ------------------------------------------------------------------------------------------
def test_loglog_exact_power_law():
    da, p, c = power_law_da()
    ds = loglog_slope(da, "L")
    assert set(ds.dims) == {"d", "U_norm"}
    np.testing.assert_allclose(ds.slope.transpose("d", "U_norm").values, p, rtol=0, atol=1e-12)
    np.testing.assert_allclose(ds.intercept.transpose("d", "U_norm").values, np.log(c), rtol=0, atol=1e-11)
    np.testing.assert_allclose(ds.r2.values, 1.0, atol=1e-12)
    assert (ds.n.values == L.size).all() and ds.n.dtype == np.int64
    assert (ds.slope_se.values < 1e-12).all()
    for v in ("slope", "slope_se", "slope_ci_low", "slope_ci_high", "intercept", "intercept_se", "r2", "n", "pvalue_slope"):
        assert v in ds and "long_name" in ds[v].attrs
    assert "t_test_pvalue" not in ds
    # labels kept
    np.testing.assert_array_equal(ds.d.values, D)
    np.testing.assert_array_equal(ds.U_norm.values, UN)


def test_loglog_settings_travel_as_scalar_coords():
    da, _, _ = power_law_da(noise=0.1)
    ds = loglog_slope(da, cov_type="HC3", alpha=0.1, test_exponent=-1.0)
    assert ds.coords["cov_type"].item() == "HC3"
    assert ds.coords["alpha"].item() == 0.1
    assert ds.coords["test_exponent"].item() == -1.0
    assert "OLS" in ds.coords["method"].item()
    assert ds.coords["cov_type"].ndim == 0


def test_loglog_noisy_matches_closed_form_ols():
    da, _, _ = power_law_da(noise=0.2, seed=3)
    ds = loglog_slope(da, "L", alpha=0.05)
    x = np.log(L)
    tq = scipy.stats.t.ppf(0.975, L.size - 2)
    for i in range(3):
        for j in range(3):
            y = np.log(da.values[i, j])
            beta, cov, e = ols_by_hand(x, y)
            cell = ds.isel(d=i, U_norm=j)
            se = np.sqrt(np.diag(cov))
            np.testing.assert_allclose(cell.slope.item(), beta[1], rtol=1e-10)
            np.testing.assert_allclose(cell.slope_se.item(), se[1], rtol=1e-10)
            np.testing.assert_allclose(cell.intercept.item(), beta[0], rtol=1e-10)
            np.testing.assert_allclose(cell.intercept_se.item(), se[0], rtol=1e-10)
            np.testing.assert_allclose(cell.slope_ci_low.item(), beta[1] - tq * se[1], rtol=1e-9)
            np.testing.assert_allclose(cell.slope_ci_high.item(), beta[1] + tq * se[1], rtol=1e-9)
            r2 = 1 - (e @ e) / np.sum((y - y.mean()) ** 2)
            np.testing.assert_allclose(cell.r2.item(), r2, rtol=1e-10)
            pv = 2 * scipy.stats.t.sf(abs(beta[1] / se[1]), L.size - 2)
            np.testing.assert_allclose(cell.pvalue_slope.item(), pv, rtol=1e-6, atol=1e-300)


def test_loglog_alpha_changes_ci_width():
    da, _, _ = power_law_da(noise=0.2, seed=3)
    w95 = loglog_slope(da, alpha=0.05)
    w80 = loglog_slope(da, alpha=0.20)
    ratio = (w95.slope_ci_high - w95.slope_ci_low) / (w80.slope_ci_high - w80.slope_ci_low)
    expected = scipy.stats.t.ppf(0.975, 8) / scipy.stats.t.ppf(0.9, 8)
    np.testing.assert_allclose(ratio.values, expected, rtol=1e-9)


def test_loglog_hc3_matches_sandwich_and_differs_from_nonrobust():
    rng = np.random.default_rng(11)
    x = np.log(L)
    # heteroscedastic: noise grows strongly with L
    y = np.exp(0.5 - 0.8 * x + 0.05 * np.exp(0.45 * x) * rng.standard_normal(L.size) / 10)
    da = xr.DataArray(y, dims="L", coords={"L": L})
    hc3 = loglog_slope(da, cov_type="HC3")
    plain = loglog_slope(da)
    beta, cov_hc3, _ = ols_by_hand(x, np.log(y), hc3=True)
    _, cov_plain, _ = ols_by_hand(x, np.log(y))
    np.testing.assert_allclose(hc3.slope.item(), beta[1], rtol=1e-10)
    np.testing.assert_allclose(hc3.slope_se.item(), np.sqrt(cov_hc3[1, 1]), rtol=1e-9)
    np.testing.assert_allclose(hc3.intercept_se.item(), np.sqrt(cov_hc3[0, 0]), rtol=1e-9)
    np.testing.assert_allclose(plain.slope_se.item(), np.sqrt(cov_plain[1, 1]), rtol=1e-9)
    assert abs(hc3.slope_se.item() / plain.slope_se.item() - 1) > 0.2
    assert hc3.slope.item() == pytest.approx(plain.slope.item(), rel=1e-12)
    # robust fits keep Student-t intervals (use_t=True)
    tq = scipy.stats.t.ppf(0.975, L.size - 2)
    np.testing.assert_allclose(hc3.slope_ci_high.item() - hc3.slope.item(), tq * np.sqrt(cov_hc3[1, 1]), rtol=1e-9)


def test_loglog_t_test_exponent_matches_hand():
    da, _, _ = power_law_da(noise=0.2, seed=5)
    ds = loglog_slope(da, test_exponent=-1.0)
    x = np.log(L)
    y = np.log(da.values[1, 2])
    beta, cov, _ = ols_by_hand(x, y)
    t = (beta[1] + 1.0) / np.sqrt(cov[1, 1])
    p = 2 * scipy.stats.t.sf(abs(t), L.size - 2)
    np.testing.assert_allclose(ds.t_test_pvalue.isel(d=1, U_norm=2).item(), p, rtol=1e-8)


def test_loglog_dask_equals_numpy_and_is_lazy():
    da, _, _ = power_law_da(noise=0.1, seed=1)
    ref = loglog_slope(da, test_exponent=-1.0)
    lazy_in = da.chunk({"d": 1, "U_norm": 2, "L": 3})  # L split over chunks on purpose
    with raise_if_dask_computes():
        lazy = loglog_slope(lazy_in, test_exponent=-1.0)
        pw = power_law_fit(lazy_in)
    assert lazy.slope.chunks is not None and pw.c.chunks is not None
    with pytest.raises(RuntimeError, match="should be lazy"):
        with raise_if_dask_computes():
            lazy.slope.compute()
    got = lazy.compute()
    xr.testing.assert_allclose(got, ref, rtol=1e-14, atol=0)
    assert got.n.dtype == np.int64


def test_loglog_dims_order_and_scalar_input():
    da, p, _ = power_law_da()
    ds = loglog_slope(da.transpose("L", "U_norm", "d"))
    np.testing.assert_allclose(ds.slope.transpose("d", "U_norm").values, p, atol=1e-12)
    one = loglog_slope(da.isel(d=0, U_norm=0))
    assert one.slope.ndim == 0
    assert one.slope.item() == pytest.approx(p[0, 0], abs=1e-12)


@settings(max_examples=15, deadline=None)
@given(
    p=st.floats(-3, 3, allow_nan=False),
    logc=st.floats(-5, 5, allow_nan=False),
    chunk=st.integers(1, 3),
)
def test_loglog_property_exact_numpy_and_dask(p, logc, chunk):
    y = np.exp(logc) * L[None, :] ** (p * np.array([1.0, 0.5, 0.25])[:, None])
    da = xr.DataArray(y, dims=("seed", "L"), coords={"seed": [0, 1, 2], "L": L})
    a = loglog_slope(da)
    b = loglog_slope(da.chunk({"seed": chunk})).compute()
    np.testing.assert_allclose(a.slope.values, p * np.array([1.0, 0.5, 0.25]), atol=1e-11)
    np.testing.assert_allclose(a.intercept.values, logc, atol=1e-9)
    xr.testing.assert_allclose(a, b, rtol=1e-14, atol=0)


@pytest.mark.parametrize("bad", [-1e-3, 0.0, np.nan, np.inf])
def test_loglog_bad_value_names_coordinate(bad):
    da, _, _ = power_law_da()
    da = da.copy()
    da.loc[dict(d=5, U_norm=0.3, L=64)] = bad
    with pytest.raises(ValueError, match=r"L=64.*d=5.*U_norm=0\.3"):
        loglog_slope(da)
    lazy = loglog_slope(da.chunk({"d": 1}))  # dask: raised at compute, same message
    with pytest.raises(ValueError, match=r"L=64.*d=5.*U_norm=0\.3"):
        lazy.compute()


def test_loglog_input_errors():
    da, _, _ = power_law_da()
    with pytest.raises(ValueError, match="at least 3 points"):
        loglog_slope(da.isel(L=slice(0, 2)))
    with pytest.raises(ValueError, match="'t' not in"):
        loglog_slope(da, "t")
    with pytest.raises(ValueError, match="coordinate 'L' must be positive"):
        loglog_slope(da.assign_coords(L=L - 8))
    with pytest.raises(ValueError, match="no coordinate"):
        loglog_slope(da.drop_vars("L"))
    with pytest.raises(ValueError, match="cov_type"):
        loglog_slope(da, cov_type="HC9")
    with pytest.raises(ValueError, match="alpha"):
        loglog_slope(da, alpha=1.5)
    with pytest.raises(TypeError):
        loglog_slope(da.values)


def statsmodels_line(y, x, cov_type, groups=None, alpha=0.05, test=None):
    """The oracle: statsmodels' OLS of y on [1, x] with ``cov_type`` (``use_t=True``), as a dict."""
    kw = {} if groups is None else {"cov_kwds": {"groups": groups}}
    res = sm.OLS(y, sm.add_constant(x)).fit(cov_type=cov_type, use_t=True, **kw)
    ci = np.asarray(res.conf_int(alpha=alpha))
    out = {"slope": res.params[1], "slope_se": res.bse[1], "slope_ci_low": ci[1, 0], "slope_ci_high": ci[1, 1],
           "intercept": res.params[0], "intercept_se": res.bse[0], "intercept_ci_low": ci[0, 0],
           "intercept_ci_high": ci[0, 1], "r2": res.rsquared, "pvalue_slope": res.pvalues[1]}
    if test is not None:
        out["t_test_pvalue"] = float(np.squeeze(res.t_test((np.array([[0.0, 1.0]]), np.array([test]))).pvalue))
    return out


@pytest.mark.parametrize("cov_type", COV_TYPES)
@pytest.mark.parametrize("n, G, cells", [(5, 3, 4), (12, 5, 3), (30, 2, 2), (4, 8, 6)])
def test_ols_line_is_statsmodels_on_random_data(cov_type, n, G, cells):
    """Every line of a vectorised fit (the cells are a leading dim) is statsmodels' fit of that cell's
    points, to 1e-10 relative, pooled over two observation dims (L, seed); clustered over the seeds."""
    rng = np.random.default_rng([n, G, cells, COV_TYPES.index(cov_type)])
    y = rng.standard_normal((cells, n, G)) * rng.uniform(0.2, 3.0, (cells, 1, G)) + np.linspace(-1, 2, n)[:, None]
    x = rng.uniform(-2.0, 3.0, (n, G))
    Y = xr.DataArray(y, dims=("cell", "L", "seed"))
    X = xr.DataArray(x, dims=("L", "seed"))
    units = "seed" if cov_type == "cluster" else None
    fit = ols_line(Y, X, ("L", "seed"), units=units, cov_type=cov_type, alpha=0.1, test_slope=0.3)
    assert fit.cov_type.item() == cov_type and fit.alpha.item() == 0.1 and fit.test_exponent.item() == 0.3
    groups = np.tile(np.arange(G), n) if cov_type == "cluster" else None
    for c in range(cells):
        want = statsmodels_line(y[c].ravel(), x.ravel(), cov_type, groups, alpha=0.1, test=0.3)
        got = fit.isel(cell=c)
        for k, v in want.items():
            assert float(got[k]) == pytest.approx(v, rel=1e-10, abs=1e-300), (k, c)
        assert int(got.n) == n * G


def test_ols_line_is_vectorised_over_every_other_dim_and_lazy_for_dask():
    """A fit over (L) of y (resample, d, L): every (resample, d) cell the fit of its own line; dask
    input stays lazy and gives the same numbers."""
    rng = np.random.default_rng(4)
    y = xr.DataArray(rng.standard_normal((7, 3, 9)), dims=("resample", "d", "L"))
    x = xr.DataArray(np.linspace(0.0, 2.0, 9), dims="L")
    fit = ols_line(y, x, "L", cov_type="HC3")
    for r, d in ((0, 0), (6, 2), (3, 1)):
        want = statsmodels_line(y.values[r, d], x.values, "HC3")
        assert float(fit.slope_se[r, d]) == pytest.approx(want["slope_se"], rel=1e-10)
    with raise_if_dask_computes():
        lazy = ols_line(y.chunk({"resample": 2}), x, "L", cov_type="HC3")
    xr.testing.assert_allclose(lazy.compute(), fit, rtol=1e-14, atol=0)


@pytest.mark.parametrize("cov_type, units", [("nonrobust", None), ("HC1", None), ("cluster", "seed")])
def test_ols_line_on_numpy_is_the_labelled_broadcast_bit_for_bit(cov_type, units):
    """Eager input whose x only repeats y's labels skips xarray's broadcast: the Dataset is identical (values
    bit for bit, dims, coordinates, attrs) to the one the labelled path gives dask input of the same data:
    index, scalar and non-index coordinates kept where they do not lie along the fitted dims, dropped where
    they do; x with y's L coordinate, without it, or a number."""
    rng = np.random.default_rng(21)
    y = xr.DataArray(rng.standard_normal((2, 5, 3, 4)), dims=("d", "L", "resample", "seed"),
                     coords={"d": [3, 8], "L": [8, 16, 32, 64, 128], "seed": np.arange(4), "setting": "iso",
                             "lr": ("d", [0.1, 0.2]), "L_cap": ("L", [1, 1, 0, 0, 1])}, attrs={"units": "1"})
    y[0, 2, 1, 3] = np.nan
    obs = ("L", "seed") if units else "L"
    for x in (np.log(y.L.astype(float)), xr.DataArray(np.log(y.L.values), dims="L"), 2.0 * y.seed + y.L,
              xr.DataArray(0.5)):
        eager = ols_line(y, x, obs, units=units, cov_type=cov_type, test_slope=-0.5)
        lazy = ols_line(y.chunk({"d": 1}), x, obs, units=units, cov_type=cov_type, test_slope=-0.5).compute()
        xr.testing.assert_identical(eager, lazy)
        assert list(eager.coords) == list(lazy.coords) and list(eager.data_vars) == list(lazy.data_vars)


def test_ols_line_drops_missing_points_and_counts_present_clusters():
    """A NaN point leaves its line (statsmodels on the rest); a cluster with no finite point does not
    count: G - 1 dof and CR1 factor of the clusters present; one cluster left: no SE."""
    rng = np.random.default_rng(8)
    y = rng.standard_normal((6, 4))
    x = np.tile(np.linspace(0, 1, 6)[:, None], (1, 4))
    y[2, 1] = np.nan
    y[:, 3] = np.nan                                      # the 4th cluster is absent
    fit = ols_line(xr.DataArray(y, dims=("L", "seed")), xr.DataArray(x, dims=("L", "seed")), ("L", "seed"),
                   units="seed")
    keep = np.isfinite(y.ravel())
    want = statsmodels_line(y.ravel()[keep], x.ravel()[keep], "cluster", np.tile(np.arange(4), 6)[keep])
    for k, v in want.items():
        assert float(fit[k]) == pytest.approx(v, rel=1e-10), k
    assert int(fit.n) == keep.sum()
    one = ols_line(xr.DataArray(y[:, :1], dims=("L", "seed")), xr.DataArray(x[:, :1], dims=("L", "seed")),
                   ("L", "seed"), units="seed")
    assert np.isfinite(float(one.slope)) and np.isnan(float(one.slope_se))
    short = ols_line(xr.DataArray([1.0, 2.0, np.nan], dims="L"), xr.DataArray([0.0, 1.0, 2.0], dims="L"), "L")
    assert np.isnan(float(short.slope)) and int(short.n) == 2


def test_ols_line_errors():
    y = xr.DataArray(np.ones((3, 4)), dims=("L", "seed"))
    with pytest.raises(ValueError, match="'t' not in"):
        ols_line(y, 1.0, "t")
    with pytest.raises(ValueError, match="needs the independent units"):
        ols_line(y, 1.0, "L", cov_type="cluster")
    with pytest.raises(ValueError, match="among the observation dims"):
        ols_line(y, 1.0, "L", units="seed")
    with pytest.raises(ValueError, match="cov_type"):
        ols_line(y, 1.0, "L", cov_type="HC9")


# ------------------------------------------------------------------------------------------
# power_law_fit, paper_form_fit
# ------------------------------------------------------------------------------------------
def test_power_law_fit_exact_and_delta_method():
    da, p, c = power_law_da()
    pw = power_law_fit(da, "L")
    np.testing.assert_allclose(pw.p.transpose("d", "U_norm").values, p, atol=1e-12)
    np.testing.assert_allclose(pw.c.transpose("d", "U_norm").values, c, rtol=1e-10)
    noisy, _, _ = power_law_da(noise=0.2, seed=9)
    pw = power_law_fit(noisy)
    ll = loglog_slope(noisy)
    np.testing.assert_allclose(pw.c_se.values, np.exp(ll.intercept.values) * ll.intercept_se.values, rtol=1e-12)
    np.testing.assert_allclose(pw.c_ci_low.values, np.exp(ll.intercept_ci_low.values), rtol=1e-12)
    assert (pw.c_ci_low < pw.c).all() and (pw.c < pw.c_ci_high).all()
    np.testing.assert_allclose(pw.p_se.values, ll.slope_se.values)


def _paper_form_data(noise, seed=0):
    rng = np.random.default_rng([seed, 3])
    x = xr.DataArray(
        rng.uniform(0.0, 1.5, size=(3, 3, 10)),
        dims=("d", "U_norm", "L"),
        coords={"d": D, "U_norm": UN, "L": L},
    )
    y = 0.8 * np.exp(1.17 * x) * np.exp(noise * rng.standard_normal(x.shape))
    return y, x


def test_paper_form_fit_exact_and_vs_lstsq():
    y, x = _paper_form_data(0.0)
    fit = paper_form_fit(y, x)
    assert fit.c1.item() == pytest.approx(0.8, rel=1e-12)
    assert fit.c2.item() == pytest.approx(1.17, rel=1e-12)
    assert fit.n.item() == 90
    y, x = _paper_form_data(0.1, seed=2)
    fit = paper_form_fit(y.values, x.values)  # plain numpy works too
    beta, cov, _ = ols_by_hand(x.values.ravel(), np.log(y.values.ravel()))
    assert fit.c2.item() == pytest.approx(beta[1], rel=1e-10)
    assert fit.c2_se.item() == pytest.approx(np.sqrt(cov[1, 1]), rel=1e-9)
    assert fit.c1.item() == pytest.approx(np.exp(beta[0]), rel=1e-10)
    assert fit.c1_se.item() == pytest.approx(np.exp(beta[0]) * np.sqrt(cov[0, 0]), rel=1e-9)
    tq = scipy.stats.t.ppf(0.975, 88)
    assert fit.c2_ci_low.item() == pytest.approx(beta[1] - tq * np.sqrt(cov[1, 1]), rel=1e-9)
    t = beta[1] / np.sqrt(cov[1, 1])
    assert fit.pvalue_c2_positive.item() == pytest.approx(scipy.stats.t.sf(t, 88), rel=1e-6, abs=1e-300)
    assert fit.coords["cov_type"].item() == "nonrobust"


def test_paper_form_fit_errors():
    y, x = _paper_form_data(0.0)
    bad = y.copy()
    bad.loc[dict(d=10, U_norm=0.1, L=256)] = 0.0
    with pytest.raises(ValueError, match=r"d=10, U_norm=0\.1, L=256"):
        paper_form_fit(bad, x)
    badx = x.copy()
    badx.loc[dict(d=2, U_norm=0.5, L=8)] = np.nan
    with pytest.raises(ValueError, match=r"x must be finite.*d=2, U_norm=0\.5, L=8"):
        paper_form_fit(y, badx)
    with pytest.raises(ValueError, match="same shape"):
        paper_form_fit(np.ones(5), np.ones(4))
    with pytest.raises(ValueError, match="index \\(1,\\)"):
        paper_form_fit(np.array([1.0, -1.0, 2.0]), np.array([0.0, 1.0, 2.0]))
    with pytest.raises(ValueError, match="different coordinates"):
        paper_form_fit(y, x.assign_coords(L=L * 2))
    with pytest.raises(ValueError, match="at least 3"):
        paper_form_fit(np.ones(2), np.arange(2.0))


# ------------------------------------------------------------------------------------------
# layering
# ------------------------------------------------------------------------------------------
def test_analysis_modules_import_no_simulation_code():
    """analysis/ reads results files only: no sfxlin core, no pipelines (relative imports stay
    inside the analysis package), except ``sfxlin.engine.storage``, the reader of the file contract (netCDF
    I/O and its schema check), and ``sfxlin.engine.protocol``, the plug-in protocol an analysis module
    is checked against (neither imports simulation code). The tutorial scripts in examples/
    are user code, not modules."""
    root = pathlib.Path(fits.__file__).parent
    for path in sorted(root.glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level == 2 and node.module in ("engine.storage", "engine.protocol"):
                    continue  # the file contract's reader, the plug-in protocol
                assert node.level <= 1, f"{path.name}: relative import out of analysis/"
                names = [node.module or ""] if node.level == 0 else []
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                assert top not in ("pipelines",), f"{path.name} imports {name}"
                assert top != "sfxlin" or name.startswith("sfxlin.analysis"), f"{path.name} imports {name}"


def nested_da(G=4, seed=3):
    """mse(d, L, seed) = L^-1 (1 + e), e correlated along L within a seed."""
    rng = np.random.default_rng(seed)
    e = np.cumsum(rng.standard_normal((2, L.size, G)), axis=1) * 0.05
    return xr.DataArray(L[None, :, None] ** -1.0 * np.exp(e), dims=("d", "L", "seed"),
                        coords={"d": [2, 5], "L": L, "seed": np.arange(G)}, name="mse")


def test_units_fit_the_unit_mean_with_a_cluster_se_by_default_and_ols_by_name():
    da = nested_da()
    clustered = loglog_slope(da, "L", units="seed")
    plain = loglog_slope(da, "L", units="seed", cov_type="nonrobust")
    of_mean = loglog_slope(da.mean("seed"), "L")
    np.testing.assert_allclose(clustered.slope, of_mean.slope, rtol=1e-12)
    np.testing.assert_allclose(plain.slope_se, of_mean.slope_se, rtol=1e-12)
    assert clustered.cov_type.item() == "cluster" and clustered.units.item() == "seed"
    assert clustered.n_units.item() == 4 and plain.cov_type.item() == "nonrobust"
    assert not np.allclose(clustered.slope_se, plain.slope_se)
    lazy = loglog_slope(da.chunk({"d": 1}), "L", units="seed")
    np.testing.assert_allclose(lazy.slope_se.compute(), clustered.slope_se, rtol=1e-12)


def test_units_are_checked_before_any_fit():
    da = nested_da()
    with pytest.raises(ValueError, match="units"):
        loglog_slope(da, "L", units="query")
    with pytest.raises(ValueError, match="at least 2"):
        loglog_slope(da.isel(seed=[0]), "L", units="seed")
    with pytest.raises(ValueError, match="needs the independent units"):
        loglog_slope(da.mean("seed"), "L", cov_type="cluster")
    bad = da.copy(data=da.values.copy())
    bad[0, 3, :] = -1.0
    with pytest.raises(ValueError, match=r"positive mean over seed.*L=64, d=2"):
        loglog_slope(bad, "L", units="seed")


def test_paper_form_clusters_the_queries_of_a_cell():
    rng = np.random.default_rng(5)
    x = xr.DataArray(rng.uniform(0, 1, (3, 4, 6)), dims=("d", "seed", "query"))
    cell = rng.normal(0, 0.3, (3, 4, 1))  # shared by the queries of a (d, seed) cell
    y = np.exp(0.5 + 1.5 * x + cell + 0.05 * rng.standard_normal(x.shape))
    fit = paper_form_fit(y, x, units=("d", "seed"))
    plain = paper_form_fit(y, x)
    np.testing.assert_allclose(fit.c2, plain.c2, rtol=1e-12)
    assert fit.cov_type.item() == "cluster" and fit.n_units.item() == 12
    # by hand: CR1 sandwich over the 12 cells
    X = np.column_stack([np.ones(x.size), x.values.ravel()])
    yv = np.log(y.values.ravel())
    beta, *_ = np.linalg.lstsq(X, yv, rcond=None)
    e = yv - X @ beta
    g = np.repeat(np.arange(12), 6)
    meat = sum(np.outer(X[g == k].T @ e[g == k], X[g == k].T @ e[g == k]) for k in range(12))
    bread = np.linalg.inv(X.T @ X)
    n, G = x.size, 12
    cov = G / (G - 1) * (n - 1) / (n - 2) * bread @ meat @ bread
    assert float(fit.c2_se) == pytest.approx(np.sqrt(cov[1, 1]), rel=1e-10)


def test_parallel_units_give_a_zero_cluster_se_not_a_nan():
    """Units whose curves differ by a constant factor have one slope: its cluster variance is 0 up
    to rounding (statsmodels' sandwich may round it to -1e-35, whose square root is NaN; the closed
    form is a sum of squares): a finite SE at rounding level, an interval around the slope of that width."""
    y = np.exp(-np.log(L))[:, None] * np.array([1.0, 2.0, 3.0])
    fit = loglog_slope(xr.DataArray(y, dims=("L", "seed"), coords={"L": L}), "L", units="seed")
    assert float(fit.slope) == pytest.approx(-1.0, rel=1e-12)
    assert np.isfinite(float(fit.slope_se)) and 0.0 <= float(fit.slope_se) < 1e-7
    assert fit.slope_ci_low <= fit.slope <= fit.slope_ci_high
    assert float(fit.slope_ci_high - fit.slope_ci_low) < 1e-5
    assert np.isfinite(float(fit.intercept_se)) and float(fit.intercept_se) > 0


def test_unit_mean_line_is_statsmodels_cluster_fit_of_the_pseudo_observations():
    """With units the slope is the unit-mean line's, and its SE statsmodels' CR1 of the pooled
    pseudo-observations log ybar + (y - ybar) / ybar clustered over the units (1e-10 relative),
    vectorised over a resample dim as over any other; r2 and n those of the unit-mean line."""
    da = nested_da(G=5)
    stacked = xr.concat([da, da * np.exp(0.01 * np.arange(L.size))[:, None]], dim="resample")
    fit = loglog_slope(stacked, "L", units="seed", test_exponent=-1.0)
    for r in range(2):
        for i in range(2):
            y = stacked.isel(resample=r, d=i).transpose("L", "seed").values
            ybar = y.mean(axis=1)
            z = np.log(ybar)[:, None] + (y - ybar[:, None]) / ybar[:, None]
            want = statsmodels_line(z.ravel(), np.repeat(np.log(L), 5), "cluster", np.tile(np.arange(5), L.size),
                                    test=-1.0)
            got = fit.isel(resample=r, d=i)
            for k, v in want.items():
                if k != "r2":
                    assert float(got[k]) == pytest.approx(v, rel=1e-10), k
            assert float(got.r2) == pytest.approx(statsmodels_line(np.log(ybar), np.log(L), "nonrobust")["r2"],
                                                  rel=1e-12)
            assert int(got.n) == L.size


def test_skipna_drops_absent_units_and_points_where_a_present_unit_is_missing():
    """skipna: a seed NaN everywhere is not a unit (the mean and the clusters are over the others); a
    length where a present seed is NaN drops out of the line; without it, a NaN is an error."""
    da = nested_da(G=4).isel(d=0, drop=True)
    holes = da.copy(data=da.values.copy())
    holes[:, 3] = np.nan                      # seed 3 absent
    holes[4, 1] = np.nan                      # L = 128 missing in seed 1
    fit = loglog_slope(holes, "L", units="seed", skipna=True)
    keep = np.delete(np.arange(L.size), 4)
    want = loglog_slope(da.isel(seed=[0, 1, 2], L=keep), "L", units="seed")
    for k in ("slope", "slope_se", "intercept", "intercept_se", "r2", "n", "pvalue_slope"):
        assert float(fit[k]) == pytest.approx(float(want[k]), rel=1e-12), k
    with pytest.raises(ValueError, match="positive mean over seed"):
        loglog_slope(holes, "L", units="seed")


