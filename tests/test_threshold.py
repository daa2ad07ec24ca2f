"""Threshold (hinge) regression: recovery of known breaks, LR-inversion CI, weights, errors."""
from __future__ import annotations

import numpy as np
import statsmodels.api as sm
import pytest

from sfxlin.analysis.threshold import ThresholdFit, hansen_lr_crit, threshold_regression

# ------------------------------------------------------------------------------------------
# threshold_regression
# ------------------------------------------------------------------------------------------
def hinge_data(noise, seed=0, n=40, c=4.0):
    rng = np.random.default_rng([seed, 11])
    x = np.linspace(0.75, 15.0, n)
    y = 0.01 + 0.0 * x - 0.035 * np.maximum(0.0, x - c) + noise * rng.standard_normal(n)
    return y, x


def test_hansen_crit():
    assert hansen_lr_crit(0.05) == pytest.approx(7.352, abs=1e-3)
    assert hansen_lr_crit(0.10) == pytest.approx(5.94, abs=1e-2)
    assert hansen_lr_crit(0.01) == pytest.approx(10.59, abs=1e-2)


def test_threshold_recovers_break_with_covering_ci():
    y, x = hinge_data(0.003)
    fit = threshold_regression(y, x)
    assert isinstance(fit, ThresholdFit)
    assert abs(fit.c_hat - 4.0) < 0.4
    assert fit.c_ci_low <= 4.0 <= fit.c_ci_high
    assert fit.lr_crit == pytest.approx(7.352, abs=1e-3)
    assert fit.slope_left == pytest.approx(0.0, abs=3e-3)
    assert fit.slope_right == pytest.approx(-0.035, abs=3e-3)
    assert fit.n == 40 and not fit.weighted and not fit.ci_truncated
    assert "ignore" in fit.note and "uncertainty" in fit.note


def test_threshold_ci_width_grows_with_noise():
    widths = {}
    for noise in (0.001, 0.02):
        y, x = hinge_data(noise, seed=4)
        fit = threshold_regression(y, x)
        widths[noise] = fit.c_ci_high - fit.c_ci_low
    assert widths[0.001] < 0.5
    assert widths[0.02] > 3 * widths[0.001]


def test_threshold_profile_matches_bruteforce_lstsq():
    y, x = hinge_data(0.01, seed=2)
    fit = threshold_regression(y, x)
    j = int(np.argmin(fit.ssr_profile))
    assert fit.grid[j] == fit.c_hat
    Z = np.column_stack([np.ones_like(x), x, np.maximum(0, x - fit.c_hat)])
    beta, *_ = np.linalg.lstsq(Z, y, rcond=None)
    ssr = np.sum((y - Z @ beta) ** 2)
    assert fit.ssr_profile[j] == pytest.approx(ssr, rel=1e-10)
    assert fit.ssr == pytest.approx(ssr, rel=1e-10)
    np.testing.assert_allclose([fit.b0, fit.b1, fit.b2], beta, rtol=1e-8, atol=1e-12)
    # brute force over the same grid: same minimiser
    brute = [np.sum((y - Zc @ np.linalg.lstsq(Zc, y, rcond=None)[0]) ** 2)
             for Zc in (np.column_stack([np.ones_like(x), x, np.maximum(0, x - c)]) for c in fit.grid)]
    np.testing.assert_allclose(fit.ssr_profile, brute, rtol=1e-9)
    # SEs at c_hat, and slope_right SE from the covariance of b1 + b2
    e = y - Z @ beta
    cov = (e @ e) / (len(y) - 3) * np.linalg.inv(Z.T @ Z)
    assert fit.b2_se == pytest.approx(np.sqrt(cov[2, 2]), rel=1e-8)
    assert fit.slope_left_se == pytest.approx(np.sqrt(cov[1, 1]), rel=1e-8)
    assert fit.slope_right_se == pytest.approx(np.sqrt(cov[1, 1] + cov[2, 2] + 2 * cov[1, 2]), rel=1e-8)
    # LR profile and CI by inversion
    lr = len(y) * (fit.ssr_profile - ssr) / ssr
    np.testing.assert_allclose(fit.lr_profile, lr, rtol=1e-8, atol=1e-10)
    inside = fit.grid[lr <= hansen_lr_crit(0.05)]
    assert fit.c_ci_low == inside.min() and fit.c_ci_high == inside.max()


def test_threshold_grid_is_trimmed_and_contains_observed_x():
    y, x = hinge_data(0.01)
    fit = threshold_regression(y, x, trim=0.2, n_grid=50)
    lo, hi = np.quantile(x, 0.2), np.quantile(x, 0.8)
    assert fit.grid.min() == pytest.approx(lo) and fit.grid.max() == pytest.approx(hi)
    assert np.isin(x[(x >= lo) & (x <= hi)], fit.grid).all()
    assert np.all(np.diff(fit.grid) > 0)


def test_threshold_weights_equal_row_scaling():
    y, x = hinge_data(0.01, seed=6)
    w = np.linspace(0.5, 2.0, y.size)
    fit = threshold_regression(y, x, weights=w)
    assert fit.weighted
    sw = np.sqrt(w)
    Z = np.column_stack([np.ones_like(x), x, np.maximum(0, x - fit.c_hat)])
    beta, *_ = np.linalg.lstsq(Z * sw[:, None], y * sw, rcond=None)
    np.testing.assert_allclose([fit.b0, fit.b1, fit.b2], beta, rtol=1e-8, atol=1e-12)
    assert fit.ssr == pytest.approx(np.sum(w * (y - Z @ beta) ** 2), rel=1e-10)
    # zero weight on an outlier = dropping it (coefficients, SEs, breakpoint, CI)
    y2 = y.copy()
    y2[5] += 10.0
    w0 = np.ones_like(y)
    w0[5] = 0.0
    a = threshold_regression(y2, x, weights=w0)
    b = threshold_regression(np.delete(y, 5), np.delete(x, 5))
    assert a.n == 39 == b.n
    assert (a.c_hat, a.c_ci_low, a.c_ci_high) == (b.c_hat, b.c_ci_low, b.c_ci_high)
    np.testing.assert_allclose([a.b0, a.b1, a.b2, a.slope_right_se], [b.b0, b.b1, b.b2, b.slope_right_se], rtol=1e-9)
    # the weights matter: strongly different weights move the fit
    c = threshold_regression(y, x, weights=np.exp(np.linspace(0.0, 8.0, y.size)))
    assert abs(c.b0 - fit.b0) > 1e-6


def test_threshold_result_export_and_repr():
    y, x = hinge_data(0.003)
    fit = threshold_regression(y, x)
    text = repr(fit)
    assert "c_hat" in text and "95% CI" in text and "slope_right" in text and "note" in text
    assert len(text) < 2000  # no arrays dumped
    d = fit.to_dict()
    assert d["c_hat"] == fit.c_hat and "grid" not in d
    assert len(fit.to_dict(include_profile=True)["grid"]) == fit.grid.size
    ds = fit.to_dataset()
    assert ds.c_hat.item() == fit.c_hat
    assert ds.ssr_profile.dims == ("c_grid",) and ds.sizes["c_grid"] == fit.grid.size
    assert ds.coords["lr_crit"].item() == fit.lr_crit
    assert "ignore" in ds.attrs["note"]
    with pytest.raises(AttributeError):
        fit.c_hat = 1.0  # frozen


def test_threshold_lr_crit_override_narrows_ci():
    y, x = hinge_data(0.01, seed=8)
    wide = threshold_regression(y, x)
    narrow = threshold_regression(y, x, lr_crit=3.84)
    assert narrow.c_ci_low >= wide.c_ci_low and narrow.c_ci_high <= wide.c_ci_high
    assert narrow.c_hat == wide.c_hat


def test_threshold_errors():
    y, x = hinge_data(0.01)
    with pytest.raises(ValueError, match="at least 6 points"):
        threshold_regression(y[:5], x[:5])
    with pytest.raises(ValueError, match="same shape"):
        threshold_regression(y, x[:-1])
    with pytest.raises(ValueError, match="1-D"):
        threshold_regression(y.reshape(4, 10), x.reshape(4, 10))
    yb = y.copy()
    yb[7] = np.nan
    with pytest.raises(ValueError, match="y must be finite.*index 7"):
        threshold_regression(yb, x)
    xb = x.copy()
    xb[3] = np.inf
    with pytest.raises(ValueError, match="x must be finite.*index 3"):
        threshold_regression(y, xb)
    w = np.ones_like(y)
    w[2] = -1.0
    with pytest.raises(ValueError, match="non-negative.*index 2"):
        threshold_regression(y, x, weights=w)
    with pytest.raises(ValueError, match="weights must have the shape"):
        threshold_regression(y, x, weights=np.ones(3))
    w = np.zeros_like(y)
    w[:5] = 1.0
    with pytest.raises(ValueError, match="at least 6 points"):
        threshold_regression(y, x, weights=w)
    with pytest.raises(ValueError, match="trim"):
        threshold_regression(y, x, trim=0.6)
    with pytest.raises(ValueError, match="singular"):
        threshold_regression(np.arange(8.0), np.array([0, 0, 0, 0, 1, 1, 1, 1.0]))


def test_reexported_from_the_analysis_package():
    import sfxlin.analysis

    assert sfxlin.analysis.threshold_regression is threshold_regression
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        sfxlin.analysis.nope


def statsmodels_hinge_ssr(y, x, c, weights=None) -> float:
    """The oracle: the (weighted) SSR of statsmodels' WLS (OLS without weights) of y on the hinge basis
    [1, x, max(0, x - c)] over the positive-weight points; inf where that design is rank deficient."""
    w = np.ones(len(y)) if weights is None else np.asarray(weights)
    Z = np.column_stack([np.ones(x.size), x, np.maximum(0.0, x - c)])[w > 0]
    if np.linalg.matrix_rank(Z) < 3:
        return np.inf
    return float(sm.WLS(y[w > 0], Z, weights=w[w > 0]).fit().ssr)


def test_vectorised_ssr_profile_equals_the_statsmodels_fit_per_breakpoint():
    # hinge_ssr_profile_np (every breakpoint at once, batched QR) against one statsmodels WLS per breakpoint,
    # weighted and not, with breakpoints outside the data (singular: inf) and on observed x, and every cell of a
    # batch of regressions (a bootstrap's resamples) at once; the SSRs are of order 1e-2 .. 1 here, so relative
    # 1e-9 is far above rounding and far below any grid step's change
    from sfxlin.analysis.threshold import hinge_ssr_profile_np

    y, x = hinge_data(0.01, seed=7, n=14)
    grid = np.concatenate([np.linspace(-1.0, 17.0, 41), x[2:5]])
    w = np.random.default_rng(1).uniform(0.5, 2.0, x.size)
    w[3] = 0.0
    for weights in (None, w):
        got = hinge_ssr_profile_np(y, x, grid, weights)
        want = np.array([statsmodels_hinge_ssr(y, x, c, weights) for c in grid])
        np.testing.assert_array_equal(np.isinf(got), np.isinf(want))
        assert np.isinf(got).any() and np.isfinite(got).sum() > 20
        np.testing.assert_allclose(got[np.isfinite(got)], want[np.isfinite(want)], rtol=1e-9)
    ys = y + 0.01 * np.random.default_rng(2).standard_normal((3, y.size))
    ws = w * np.random.default_rng(3).uniform(0.5, 2.0, (3, y.size))
    batch = hinge_ssr_profile_np(ys, x, grid, ws)
    for k in range(3):
        want = np.array([statsmodels_hinge_ssr(ys[k], x, c, ws[k]) for c in grid])
        np.testing.assert_allclose(batch[k][np.isfinite(want)], want[np.isfinite(want)], rtol=1e-9)


def test_break_search_of_many_regressions_is_each_regression():
    """break_search over a batch (the resamples of a bootstrap) gives, cell by cell, the breakpoint, its
    LR set and the slopes at it of threshold_regression on that cell alone."""
    from sfxlin.analysis.threshold import break_search

    y, x = hinge_data(0.05, seed=11)
    ys = y + 0.05 * np.random.default_rng(4).standard_normal((5, y.size))
    w = np.random.default_rng(5).uniform(0.5, 2.0, (5, y.size))
    found = break_search(ys, x, w)
    for k in range(5):
        fit = threshold_regression(ys[k], x, weights=w[k])
        assert found["c_hat"][k] == fit.c_hat and found["ci_truncated"][k] == fit.ci_truncated
        assert (found["c_ci_low"][k], found["c_ci_high"][k]) == (fit.c_ci_low, fit.c_ci_high)
        assert found["ssr"][k] == pytest.approx(fit.ssr, rel=1e-12)
        assert found["slope_left"][k] == pytest.approx(fit.slope_left, rel=1e-9)
        assert found["slope_right"][k] == pytest.approx(fit.slope_right, rel=1e-9)


def test_lr_pvalue_inverts_the_confidence_set():
    from sfxlin.analysis.threshold import hansen_lr_pvalue, threshold_lr_pvalue

    for alpha in (0.01, 0.05, 0.10):
        assert hansen_lr_pvalue(hansen_lr_crit(alpha)) == pytest.approx(alpha, rel=1e-12)
    assert hansen_lr_pvalue(0.0) == 1.0 and hansen_lr_pvalue(-1.0) == 1.0
    y, x = hinge_data(0.01, seed=3)
    fit = threshold_regression(y, x)
    # at every grid point away from the critical value (|LR - crit| > 1e-6 relative), p >= alpha iff the point is
    # in the LR set {LR <= crit}
    p = np.array([threshold_lr_pvalue(fit, y, x, c) for c in fit.grid])
    clear = np.abs(fit.lr_profile - fit.lr_crit) > 1e-6 * fit.lr_crit
    np.testing.assert_array_equal((p >= 0.05)[clear], (fit.lr_profile <= fit.lr_crit)[clear])
    assert threshold_lr_pvalue(fit, y, x, fit.c_hat) == pytest.approx(1.0, abs=1e-9)
    assert threshold_lr_pvalue(fit, y, x, 100.0) == 0.0          # no point right of c: singular design
