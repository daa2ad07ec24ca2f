"""c1_kernels: a small run, its values against independent computations, its analysis and figure."""
from __future__ import annotations

import math

import numpy as np
import pytest

from sfxlin.analysis import c1_kernels as analysis
from sfxlin.kernels import Kernel, kernel_mse, rf_feature_constant
from sfxlin.pipelines import c1_kernels
from sfxlin.sweep import build

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


def test_predicted_error_depends_on_the_query_direction_only_through_sigma_a(ds):
    """mse_theory of relu_norm: the delta-method constant of a query with ||a||_Sigma = r; bounded by
    the constants at the extreme directions (eigenvectors of Sigma), computed independently."""
    S = np.diag(SMALL["Sigma"])
    for r in ds.r.values:
        ends = [float(kernel_mse(Kernel("relu_norm"), S, np.eye(3), r / math.sqrt(S[i, i]) * np.eye(3)[i], 256))
                for i in range(3)]
        got = float(ds.mse_theory.sel(kernel="relu_norm", r=r, L=256).isel(seed=0))
        assert min(ends) <= got <= max(ends)
    assert np.isnan(ds.mse_theory.sel(kernel="rf_softmax")).all()


def test_errors_fall_and_the_stein_check_is_at_rounding_level(ds):
    gauss = ds.mse.mean("seed")
    assert (gauss.isel(L=-1) < gauss.isel(L=0)).all()
    assert float(ds.stein_error.sel(stein_kernel=list(analysis.SMOOTH)).max()) < 1e-8


def test_rf_constant_is_the_formula_and_infinite_for_heavy_tails(ds):
    a = SMALL["rf_a"] * np.eye(3)[0]
    np.testing.assert_allclose(ds.rf_constant.sel(rf_sigma2=0.1).isel(rf_m=0),
                               rf_feature_constant(0.1 * np.eye(3), np.eye(3), a), rtol=1e-12)
    assert np.isinf(ds.rf_constant.sel(rf_sigma2=2.0)).all()
    # 1/m for the light-tailed case: the mean squared error falls by about 16 from m = 4 to 64
    e = ds.rf_sq_error.sel(rf_sigma2=0.1).mean("rf_draw")
    assert 5 < float(e.isel(rf_m=0) / e.isel(rf_m=-1)) < 40


def test_analysis_measures_table_and_figure(ds, tmp_path):
    m = analysis.measures(ds)
    assert set(m) == {c.id for c in analysis.CRITERIA}
    table = analysis.fit_table(ds)
    assert "relu_norm" in table and "rf_sigma2" in table
    assert analysis.figure(ds, tmp_path / "f.png").stat().st_size > 10_000


def test_tail_slopes_read_the_largest_lengths_only():
    """Synthetic errors c / L exactly in their seed mean: slope -1 over any tail; a change at the
    smallest L (outside the 5 largest) moves the full-range slope, not the tail slope."""
    import synthetic

    ds = synthetic.c1_kernels(L=(8, 16, 32, 64, 128, 256))
    np.testing.assert_allclose(analysis.tail_slopes(ds).slope, -1.0, atol=1e-12)
    ds["mse"][dict(L=0)] *= 10.0
    np.testing.assert_allclose(analysis.tail_slopes(ds).slope, -1.0, atol=1e-12)
    assert (analysis.slopes(ds).slope < -1.1).all()
