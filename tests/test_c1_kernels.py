"""c1_kernels: a small run, its values against independent computations, its analysis and figure."""
from __future__ import annotations

import math

import numpy as np
import pytest
import xarray as xr

from sfxlin.analysis import c1_kernels as analysis
from sfxlin.pipelines import c1_kernels
from sfxlin.engine.sweep import build, cell_rng
from test_kernel_exact import reference_mse, snis_constant_by_quadrature

SMALL = {**c1_kernels.EXPERIMENT.configure("quick"), "kernels": ["softmax_sqrtd", "sigmoid_logL", "relu_norm", "rf_softmax"],
         "r": [0.5, 1.0], "L": [16, 64, 256], "n_queries": 2, "n_prompts": 6, "rf_sigma2": [0.1, 2.0],
         "rf_m": [4, 16, 64], "rf_draws": 100, "stein_nodes": 30}


@pytest.fixture(scope="module")
def ds():
    config = c1_kernels.EXPERIMENT.configure(profile=None, values=SMALL)
    return build(c1_kernels.EXPERIMENT, config).compute(scheduler="synchronous")


def test_exact_limit_gains_are_the_closed_forms(ds):
    """softmax at temperature sqrt(3): 1/sqrt(3); sigmoid_logL: exp(r^2/2); normalised ReLU: sqrt(pi/2)/r."""
    r = ds.r.values
    np.testing.assert_allclose(ds.gain_limit.sel(kernel="softmax_sqrtd").isel(seed=0), 1 / math.sqrt(3), rtol=1e-12)
    np.testing.assert_allclose(ds.gain_limit.sel(kernel="sigmoid_logL").isel(seed=0), np.exp(r**2 / 2), rtol=1e-12)
    np.testing.assert_allclose(ds.gain_limit.sel(kernel="relu_norm").isel(seed=0), math.sqrt(math.pi / 2) / r,
                               rtol=1e-12)


def test_predicted_error_is_the_mean_of_the_quadrature_constants_of_the_cells_queries(ds):
    """mse_theory = mean over the cell's queries (drawn first from the cell's generator: directions
    N(0, I), rescaled to ||a||_Sigma = r) of E||f_L - f_inf||^2 by adaptive quadrature
    (tests/test_kernel_exact.py), to 1e-10."""
    S = np.diag(SMALL["Sigma"])
    config = c1_kernels.EXPERIMENT.configure(profile=None, values=SMALL)
    kernels = {"softmax_sqrtd": ("softmax", math.sqrt(3)), "sigmoid_logL": ("sigmoid_logL", 1.0),
               "relu_norm": ("relu_norm", 1.0)}
    for name, (kern, T) in kernels.items():
        for r in ds.r.values:
            rng = cell_rng(c1_kernels.EXPERIMENT.rng_name(""), {"kernel": name, "r": r, "seed": 0}, config["root_seed"])
            a = rng.standard_normal((SMALL["n_queries"], 3))
            a = r * a / np.sqrt(np.einsum("qd,de,qe->q", a, S, a))[:, None]
            for L in ds.L.values:
                want = np.mean([reference_mse(kern, S, ai, float(L), T=T) for ai in a])
                got = float(ds.mse_theory.sel(kernel=name, r=r, L=L).isel(seed=0))
                assert abs(got - want) <= 1e-10 * want, (name, r, L, got, want)
    assert np.isnan(ds.mse_theory.sel(kernel="rf_softmax")).all()


def test_errors_fall_and_the_stein_check_is_at_rounding_level(ds):
    gauss = ds.mse.mean("seed")
    assert (gauss.isel(L=-1) < gauss.isel(L=0)).all()
    assert float(ds.stein_error.sel(stein_kernel=analysis.kernels_of_class(ds, "smooth")).max()) < 1e-8


def test_rf_constant_is_the_snis_expectation_and_infinite_for_heavy_tails(ds):
    a = SMALL["rf_a"] * np.eye(3)[0]
    np.testing.assert_allclose(ds.rf_constant.sel(rf_sigma2=0.1), snis_constant_by_quadrature(0.1 * np.eye(3), a),
                               rtol=1e-10)
    assert np.isinf(ds.rf_constant.sel(rf_sigma2=2.0)).all()
    # 1/m for the light-tailed case: the mean squared error falls by about 16 from m = 4 to 64
    e = ds.rf_sq_error.sel(rf_sigma2=0.1).mean("rf_draw")
    assert 5 < float(e.isel(rf_m=0) / e.isel(rf_m=-1)) < 40


def test_analysis_measures_table_and_figure(ds, tmp_path):
    m = analysis.measures(ds)
    assert set(m) == {c.id for c in analysis.CRITERIA}
    table = ds.sfx.fit_table()
    assert "relu_norm" in table and "rf_sigma2" in table
    assert analysis.figure(ds, tmp_path / "f.png").stat().st_size > 10_000


def test_tail_slopes_read_the_largest_lengths_only():
    """Synthetic errors c / L exactly in their seed mean: slope -1 over any tail; a change at the
    smallest L (outside the 5 largest) moves the full-range slope, not the tail slope."""
    import synthetic

    ds = synthetic.c1_kernels(L=(8, 16, 32, 64, 128, 256))
    np.testing.assert_allclose(analysis.tail_slopes(ds).slope, -1.0, atol=1e-12)
    ds["mse_query"][dict(L=0)] *= 10.0
    np.testing.assert_allclose(analysis.tail_slopes(ds).slope, -1.0, atol=1e-12)
    assert (analysis.slopes(ds).slope < -1.1).all()


def test_a_kernel_is_judged_by_the_class_its_file_declares_not_by_its_name():
    """The Stein criteria read each kernel's smoothness class from the file (stein_smoothness, stored
    from the kernel class): a kernel of a new name declared smooth whose Stein error is at the
    kinked level fails the smooth criterion; declared kinked, it passes the kinked one."""
    import synthetic

    ds = synthetic.c1_kernels()
    names = list(ds.stein_kernel.values)
    ds = ds.assign_coords(stein_kernel=["softplus"] + names[1:])      # a name no list knows
    ds["stein_error"] = ds.stein_error.copy(data=np.r_[1e-6, ds.stein_error.values[1:]])
    rows = {r.id: r for r in analysis.verdicts(ds)}
    assert rows["C1K-stein-smooth"].verdict == "FAIL" and rows["C1K-stein-kinked"].verdict == "PASS"
    ds["stein_smoothness"] = ds.stein_smoothness.copy(data=np.r_[np.int8(1), ds.stein_smoothness.values[1:]])
    rows = {r.id: r for r in analysis.verdicts(ds)}
    assert rows["C1K-stein-smooth"].verdict == "PASS" and rows["C1K-stein-kinked"].verdict == "PASS"
    assert analysis.kernels_of_class(ds, "kinked")[0] == "softplus"


def _clustered_slope_se(logx, y):
    """OLS slope of log(unit mean) on logx and its cluster SE over the units, by numpy alone:
    ``sd(b_g) / sqrt(G) * sqrt((nG - 1) / (nG - 2))``, ``b_g`` the slope of unit g's linearised
    log mean ``log ybar + (y_g - ybar) / ybar``; ``y`` is (n, G)."""
    n, G = y.shape
    ybar = y.mean(axis=1, keepdims=True)
    z = np.log(ybar) + (y - ybar) / ybar
    x = logx - logx.mean()
    b = x @ (z - z.mean(axis=0)) / (x @ x)
    se = b.std(ddof=1) / np.sqrt(G) * np.sqrt((n * G - 1) / (n * G - 2))
    return float(x @ np.log(ybar[:, 0]) / (x @ x)), float(se)


def test_slopes_are_clustered_over_the_seeds_and_queries(ds):
    """The queries of a cell are independent (own direction, own prompts) and its prompts nested
    along L: the slope is that of the mean error (the same as of the seed means of ``mse``), its SE
    cluster-robust over the (seed, query) units, checked against numpy."""
    fit = analysis.slopes(ds)
    assert fit.cov_type.item() == "cluster" and fit.units.item() == "seed,query"
    assert int(fit.n_units) == ds.sizes["seed"] * ds.sizes["query"]
    logx = np.log(ds.L.values.astype(float))
    for kernel in ds.kernel.values:
        for r in ds.r.values:
            y = ds.mse_query.sel(kernel=kernel, r=r).transpose("L", "seed", "query").values.reshape(ds.sizes["L"], -1)
            slope, se = _clustered_slope_se(logx, y)
            of_mse = np.polyfit(logx, np.log(ds.mse.sel(kernel=kernel, r=r).mean("seed").values), 1)[0]
            at = dict(kernel=kernel, r=r)
            assert float(fit.slope.sel(at)) == pytest.approx(slope, rel=1e-10) == pytest.approx(of_mse, rel=1e-10)
            assert float(fit.slope_se.sel(at)) == pytest.approx(se, rel=1e-9)
    plain = analysis.slopes(ds, cov_type="nonrobust")
    np.testing.assert_allclose(plain.slope, fit.slope, rtol=1e-12)
    assert "cluster-robust over 2 units (seed x query)" in ds.sfx.fit_table()


def test_the_measures_are_the_fits_and_robustness_resamples_queries_and_draws(ds):
    """The criteria read the slopes of slopes() / rf_slopes() (the tables' fits) and |gain_z|; one
    seed, but 2 queries and 100 feature draws: every judged verdict has a robustness."""
    m = analysis.measures(ds)
    xr.testing.assert_identical(m["C1K-slopes"], analysis.slopes(ds).slope)
    xr.testing.assert_identical(m["C1K-rf-rate"], analysis.rf_slopes(ds).slope.sel(rf_sigma2=[0.1]))
    xr.testing.assert_identical(m["C1K-rf-slow"], analysis.rf_slopes(ds).slope.sel(rf_sigma2=[2.0]))
    xr.testing.assert_identical(m["C1K-gain"], np.abs(analysis.gain_z(ds)))
    rows = analysis.verdicts(ds, resamples=5)
    assert all(r.robustness is not None for r in rows if r.verdict in ("PASS", "FAIL"))
    assert analysis.CRITERIA.units == ("seed", "query", "rf_draw")


def test_rf_slopes_are_plain_ols_by_default_and_monte_carlo_by_name(ds):
    """The feature draws of different m are independent cells: the default SE is the plain OLS one;
    ``units="rf_draw"`` gives the Monte Carlo SE (cluster-robust over the draws), same slope."""
    plain, mc = analysis.rf_slopes(ds), analysis.rf_slopes(ds, units="rf_draw")
    assert plain.cov_type.item() == "nonrobust" and mc.cov_type.item() == "cluster"
    assert int(mc.n_units) == SMALL["rf_draws"]
    np.testing.assert_allclose(mc.slope, plain.slope, rtol=1e-12)


def test_the_gain_criterion_is_a_test_at_its_level(ds):
    """C1K-gain: level = P(max |z| > 4) over the paper's 36 independent N(0, 1) z-scores; p-value of
    the file's largest |z| by the Sidak formula over its cells."""
    from scipy.stats import norm

    row = {r.id: r for r in analysis.verdicts(ds, resamples=0)}["C1K-gain"]
    assert row.level == pytest.approx(1 - (1 - 2 * norm.sf(4.0)) ** 36, rel=0.01)
    z = np.abs(analysis.gain_z(ds)).values
    assert row.pvalue == pytest.approx(1 - (1 - 2 * norm.sf(z.max())) ** z.size, rel=1e-9)


def test_the_gain_se_follows_the_design():
    """Monte Carlo SE against an exact value (issue #38): an unnormalised kernel's prompt mean is an i.i.d.
    mean whose expectation is its limit at every L (Stein: E kappa(s) z = Sigma a E kappa'(s)), so
    ``(gain_measured - gain_limit) / gain_se`` of a cell is a z-score of an exact value; gain_se must be the
    spread of the prompts' projections on Sigma a (it once summed the components' variances and dropped
    their covariance: 10-17% too small, mean z^2 1.30 here). sigmoid, relu, relu2 x 18 r in [0.3, 2] x 20
    seeds, 3 queries x 64 prompts per cell (an SE of 189 dof: z normal to E z^2 = 1.01): K = 1080 z-scores;
    the share inside the central 50%, the signs and the mean of z^2 (chi-square band), which a right SE
    passes with probability >= 0.9946. The analysis pools the cells' gain_se over the seeds (gain_z)."""
    from sfxlin.engine.sweep import run_cell
    from sfxlin.testing.calibration import assert_se_follows_design

    EXP = c1_kernels.EXPERIMENT
    config = EXP.configure("quick", ["kernels=sigmoid,relu,relu2", "L=16,32,64", "n_queries=3", "n_prompts=64"])
    z = []
    for kernel in ("sigmoid", "relu", "relu2"):
        for r in np.round(np.linspace(0.3, 2.0, 18), 3):
            for seed in range(20):
                out = run_cell(EXP, config, {"kernel": kernel, "r": float(r), "seed": seed})
                z.append((out["gain_measured"] - out["gain_limit"]) / out["gain_se"])
    assert_se_follows_design(z, None, "c1_kernels gain")
