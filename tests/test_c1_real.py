"""C1 on real data: the token sets against scikit-learn's own PCA, one cell against an independent
recomputation, a small run through the analysis, and the criteria on synthetic files."""
import numpy as np
import pytest
import xarray as xr

import synthetic
from sfxlin.analysis import c1_real as analysis
from sfxlin.analysis.fits import loglog_slope
from sfxlin.analysis.verdicts import FAIL, INCONCLUSIVE, PASS
from sfxlin.pipelines import c1_real
from sfxlin.realdata import DATASETS, load_dataset, pca_whiten, standardise, token_set
from sfxlin.engine.sweep import build, cell_rng, run_cell

SMALL = {"datasets": ["wine", "diabetes"], "D": [2], "U_norm": [0.05, 0.1, 0.8], "n_seeds": 1, "L": [16, 32, 64, 128],
         "n_queries": 3, "n_prompts": 4, "query_chunk": 2}


def _config(**values):
    quick = c1_real.EXPERIMENT.configure("quick")
    return c1_real.EXPERIMENT.configure(profile=None, values={**quick, **SMALL, **values})


@pytest.mark.parametrize("name", DATASETS)
def test_token_sets_are_scikit_learns_whitened_pca(name):
    """sklearn's StandardScaler + PCA(whiten=True) (SVD, sample variance with n - 1) gives the same
    components up to sign and the factor sqrt(n / (n - 1)); mean 0 and covariance I_D exactly."""
    from sklearn.decomposition import PCA
    from sklearn.preprocessing import StandardScaler

    X = load_dataset(name)
    n = X.shape[0]
    for D in (2, 5):
        Z = token_set(name, D)
        ref = PCA(n_components=D, whiten=True, svd_solver="full").fit_transform(StandardScaler().fit_transform(X))
        ref *= np.sqrt(n / (n - 1))
        ref *= np.sign(np.sum(ref * Z, axis=0))  # the sign of each component is a convention
        np.testing.assert_allclose(Z, ref, rtol=0, atol=1e-8)  # eigh vs SVD: ~1e-12 here
        np.testing.assert_allclose(Z.mean(axis=0), 0, atol=1e-13)
        np.testing.assert_allclose(Z.T @ Z / n, np.eye(D), atol=1e-12)
    assert not token_set(name, 2).flags.writeable


def test_constant_columns_are_dropped_and_D_is_checked():
    X = np.column_stack([np.arange(6.0), np.ones(6), np.arange(6.0) ** 2])
    assert standardise(X).shape == (6, 2)
    with pytest.raises(ValueError, match="D = 3 exceeds the 2 principal components"):
        pca_whiten(standardise(X), 3)
    with pytest.raises(ValueError, match="dataset must be one of"):
        load_dataset("iris_download")


def test_one_cell_against_an_independent_recomputation():
    config = _config()
    cell = {"dataset": "wine", "D": 2, "U_norm": 0.8, "seed": 0}
    out = run_cell(c1_real.EXPERIMENT, config, cell)
    T = token_set("wine", 2)
    n, Ls, P = T.shape[0], np.asarray(config["L"]), config["n_prompts"]
    shared = cell_rng("c1_real/direction", {"dataset": "wine", "D": 2, "seed": 0}, config["root_seed"])
    U = shared.standard_normal((2, 2))
    U *= 0.8 / np.linalg.norm(U)
    q = T[shared.integers(0, n, size=3)]
    rng = cell_rng("c1_real", cell, config["root_seed"])
    a = q @ U.T

    def softmax_mean(Z, b):  # a plain softmax average of the rows of Z with logits Z b
        w = np.exp(Z @ b - np.max(Z @ b))
        return w @ Z / w.sum()

    f_inf = np.array([softmax_mean(T, b) for b in a])
    m, S = T.mean(axis=0), np.cov(T.T, bias=True)
    f_gauss = m + a @ S
    err, err_g = np.zeros(len(Ls)), np.zeros(len(Ls))
    for start in range(0, 3, 2):  # the kernel's query chunks
        k = min(start + 2, 3) - start
        Z = T[rng.integers(0, n, size=(k, P, Ls[-1]))]
        for i in range(k):
            for p in range(P):
                for j, L in enumerate(Ls):
                    f = softmax_mean(Z[i, p, :L], a[start + i])
                    err[j] += np.sum((f - f_inf[start + i]) ** 2) / (3 * P)
                    err_g[j] += np.sum((f - f_gauss[start + i]) ** 2) / (3 * P)
    np.testing.assert_allclose(out["mse"], err, rtol=1e-10)
    np.testing.assert_allclose(out["mse_gauss"], err_g, rtol=1e-10)
    np.testing.assert_allclose(out["bias_gauss"], np.mean(np.sum((f_inf - f_gauss) ** 2, axis=1)), rtol=1e-9)
    np.testing.assert_allclose(out["limit_sq"], np.mean(np.sum((f_inf - m) ** 2, axis=1)), rtol=1e-12)
    # SNIS constant: sum_i w_i^2 ||z_i - f_inf||^2 / (sum_i w_i)^2 with uniform atoms (n in both)
    trC = []
    for b, f in zip(a, f_inf):
        w = np.exp(T @ b - np.max(T @ b))
        trC.append(n * np.sum(w**2 * np.sum((T - f) ** 2, axis=1)) / np.sum(w) ** 2)
    np.testing.assert_allclose(out["mse_asymptotic"], np.mean(trC) / Ls, rtol=1e-10)
    ratio = [n * np.sum(w**2) / np.sum(w) ** 2 for w in (np.exp(T @ b - np.max(T @ b)) for b in a)]
    np.testing.assert_allclose(out["weight_ratio"], np.mean(ratio), rtol=1e-12)


def test_U_direction_and_queries_are_shared_across_U_norm():
    """The bias at two U_norm of one seed is one function of the scale: at small U_norm its
    log-log slope is 4 (third cumulant), with no Monte Carlo noise in between."""
    config = _config(L=[4, 8, 16], n_queries=4, n_prompts=1)
    small = [run_cell(c1_real.EXPERIMENT, config, {"dataset": "wine", "D": 2, "U_norm": u, "seed": 0})["bias_gauss"]
             for u in (0.01, 0.02)]
    assert 3.9 < np.log(small[1] / small[0]) / np.log(2) < 4.1


def test_a_small_run_through_the_analysis(tmp_path):
    ds = build(c1_real.EXPERIMENT, _config(datasets=["wine"])).compute(scheduler="synchronous")
    rows = {r.id: r for r in analysis.verdicts(ds)}
    assert set(rows) == {"C1R-slopes", "C1R-sharp-constant", "C1R-gauss-decomposition", "C1R-bias-order"}
    assert rows["C1R-bias-order"].verdict == PASS  # exact, no Monte Carlo: holds at any size
    table = ds.sfx.fit_table()
    assert "wine" in table and "order of bias_gauss" in table
    assert analysis.figure(ds, tmp_path / "c1_real.png").stat().st_size > 10_000


def test_criteria_on_synthetic_files():
    ds = synthetic.c1_real()
    assert all(r.verdict == PASS for r in analysis.verdicts(ds)), analysis.verdicts(ds)
    np.testing.assert_allclose(analysis.bias_order(ds), 4.0, rtol=1e-12)
    # a bad slope inside the near-uniform regime fails; the heavy-tilt settings are not judged
    bad = ds.copy(deep=True)
    bad["mse"].loc[dict(dataset="wine", D=2, U_norm=0.1)] *= (bad.L / 16.0) ** 0.5
    rows = {r.id: r.verdict for r in analysis.verdicts(bad)}
    assert rows["C1R-slopes"] == FAIL
    none = ds.copy(deep=True)
    none["weight_ratio"][:] = 2.0
    assert {r.id: r.verdict for r in analysis.verdicts(none)}["C1R-slopes"] == INCONCLUSIVE
    odd = ds.copy(deep=True)
    odd["bias_gauss"].loc[dict(U_norm=0.1)] *= 4.0  # order 6
    assert {r.id: r.verdict for r in analysis.verdicts(odd)}["C1R-bias-order"] == FAIL


def test_the_provenance_names_the_scikit_learn_that_shipped_the_data():
    import json

    import sklearn

    ds = build(c1_real.EXPERIMENT, _config())
    assert json.loads(ds.attrs["library_versions"])["scikit-learn"] == sklearn.__version__


def test_slopes_cluster_over_the_seeds_and_fall_back_to_plain_ols_with_one():
    """Two seeds (synthetic): the slope of the seed mean with a cluster SE over the 2 seeds (t with 1
    dof: a wide interval); one seed: the plain OLS fit, and the table says which."""
    ds = synthetic.c1_real()
    fit = analysis.slopes(ds)
    assert fit.cov_type.item() == "cluster" and int(fit.n_units) == 2
    plain = analysis.slopes(ds, cov_type="nonrobust")
    np.testing.assert_allclose(plain.slope, fit.slope, rtol=1e-12)
    one = ds.isel(seed=[0])
    single = analysis.slopes(one)
    assert single.cov_type.item() == "nonrobust" and int(single.n_units) == 1
    np.testing.assert_allclose(single.slope, loglog_slope(one.mse.isel(seed=0), "L").slope, rtol=1e-12)
    assert "nonrobust OLS, 1 unit (seed)" in one.sfx.fit_table()
    assert "cluster-robust over 2 units (seed)" in ds.sfx.fit_table()


def test_the_measures_are_the_fits():
    """The criteria read the slopes of slopes() and the ratios of the public functions, at the
    settings in the regime."""
    ds = synthetic.c1_real()
    ds["mse"] = ds.mse * xr.DataArray([1.0, 1.2, 0.9, 1.1, 0.95], dims="L")   # not exactly -1
    m = analysis.measures(ds)
    keep = analysis.in_regime(ds).values
    np.testing.assert_allclose(m["C1R-slopes"], analysis.slopes(ds).slope.values[keep], rtol=1e-12)
    np.testing.assert_allclose(m["C1R-sharp-constant"], analysis.sharp_ratio(ds).values[keep], rtol=1e-12)
    np.testing.assert_allclose(m["C1R-gauss-decomposition"], analysis.decomposition(ds).values[keep], rtol=1e-12)
    xr.testing.assert_identical(m["C1R-bias-order"], analysis.bias_order(ds))


@pytest.mark.slow
def test_the_slope_se_follows_the_design():
    """Monte Carlo SE against an exact value (issue #38): at U_norm = 0.025 the weights are uniform to
    O(0.025 |z|), so the error to the exact empirical limit is the i.i.d. sample mean's, tr Cov / L to
    O(|a|^2 / L): the seed-mean slope's exact value is -1, and ``(slope + 1) / slope_se`` (cluster-robust over
    the seeds, the prompts nested along L) is a t with n_seeds - 1 = 7 dof. 6 runs (root_seed 1 .. 6) of the
    4 data sets x D = 2, 5, 10, 8 seeds each: K = 72 z-scores; the share inside the central 50% and the signs,
    which a right SE passes with probability >= 0.9974."""
    from sfxlin.testing.calibration import assert_se_follows_design

    EXP = c1_real.EXPERIMENT
    z = []
    for root in range(1, 7):
        config = EXP.configure("quick", ["D=2,5,10", "U_norm=0.025", "L=16,32,64,128,256", "n_seeds=8", "n_queries=2",
                                         "n_prompts=8", f"root_seed={root}"])
        fit = analysis.slopes(build(EXP, config).compute(scheduler="synchronous"))
        z.append(((fit.slope + 1) / fit.slope_se).values.ravel())
    assert_se_follows_design(np.concatenate(z), 7, "c1_real slope")
