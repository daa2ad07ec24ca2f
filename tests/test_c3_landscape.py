"""C3 landscape: the quick profile end to end, one cell against an independent recomputation (the simple
per-L trainer, plain icl risks, per-task numpy.linalg baselines), the non-centred control, bad input."""
import json
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

from sfxlin import bayes, covariance, icl, training
from sfxlin.engine import storage
from sfxlin.analysis import c3_landscape as analysis
from sfxlin.analysis.verdicts import NOT_JUDGED, PASS, format_table
from sfxlin.engine.execution import compute
from sfxlin.pipelines import c3_landscape as c3l
from sfxlin.engine.sweep import build, cell_rng, run_cell

EXPERIMENT = c3l.EXPERIMENT
SMALL = dict(covariances=["kms:0.5"], noises=[0.5], d=[2], mean_norms=[0.0], n_pairs=2, n_queries=2,
             L=[4, 8, 16, 32], n_steps=40, ckpt_every=10, heldout_pairs=3, heldout_queries=2)


def test_quick_profile_end_to_end(tmp_path):
    config = EXPERIMENT.configure("quick")
    ds, _, _ = compute(build(EXPERIMENT, config), progress=False)
    path = storage.save(ds, tmp_path / "c3_landscape.nc")
    with xr.open_dataset(path) as f:
        ds = f.load()
    assert ds.D_inf_max.dims == ("covariance", "noise", "d", "mean_norm", "seed", "model", "L")
    assert ds.covariance.values.tolist() == ["isotropic", "kms:0.5"] and ds.mean_norm.values.tolist() == [0.0, 1.0]
    assert json.loads(ds.attrs["criteria"])[0]["id"] == "C3L-risk-slope"
    # the covariance summary figures, from sfxlin.covariance
    kms = covariance.summary(covariance.from_spec("kms:0.5", 2))
    assert float(ds.Sigma_condition.sel(covariance="kms:0.5", d=2)) == pytest.approx(kms["condition"], rel=1e-12)
    assert float(ds.Sigma_tr_inv2.sel(covariance="isotropic", d=2)) == pytest.approx(2.0, rel=1e-12)
    # centred: the two limits coincide (rounding); non-centred: they do not
    gap = ds.limit_gap.max("seed")
    assert float(gap.sel(mean_norm=0.0).max()) < 1e-20 < 1e-3 < float(gap.sel(mean_norm=1.0).min())
    assert float(ds.off_block_max.max()) == 0.0                 # exact antithetic cancellation, noise included
    # closed forms: NaN exactly where documented
    assert np.isnan(ds.risk_pgd_theory.sel(mean_norm=1.0)).all() and np.isfinite(ds.risk_pgd_theory.sel(mean_norm=0.0)).all()
    assert np.isfinite(ds.risk_bayes_theory.sel(noise=0.0)).all() and np.isnan(ds.risk_bayes_theory.sel(noise=0.5)).all()
    assert np.isfinite(ds.risk_ridge_asymptotic.sel(covariance="isotropic", mean_norm=0.0)).all()
    assert np.isnan(ds.risk_ridge_asymptotic.sel(covariance="kms:0.5")).all()
    np.testing.assert_allclose(ds.risk_floor_inf.sel(noise=0.5), 0.125, rtol=1e-15)
    rows = analysis.verdicts(ds)
    assert [r.id for r in rows] == [c.id for c in analysis.CRITERIA]
    assert "C3L-block" in format_table(rows)
    # the smoke test: no FAIL; the exact symmetry and the closed-form limit gap are judged, the rates not
    assert {r.id: r.verdict for r in rows if r.verdict != NOT_JUDGED} == {"C3L-block": PASS, "C3L-control-gap": PASS}
    assert all(r.robustness is None and r.robustness_note.startswith("one seed (n_seeds = 1)") for r in rows
               if r.verdict == PASS)
    assert "excess slope" in ds.sfx.fit_table()
    assert Path(analysis.figure(ds, tmp_path / "c3l.png")).stat().st_size > 10_000


@pytest.mark.parametrize("mean_norm", [0.0, 1.0])
def test_kernel_matches_an_independent_recomputation(mean_norm):
    config = EXPERIMENT.configure("quick", values={**SMALL, "mean_norms": [mean_norm]})
    cell = {"covariance": "kms:0.5", "noise": 0.5, "d": 2, "mean_norm": mean_norm, "seed": 0}
    out = run_cell(EXPERIMENT, config, cell)
    rng = cell_rng(c3l.NAME, cell, config["root_seed"])
    Sigma = np.array([[1.0, 0.5], [0.5, 1.0]])
    m = np.full(2, mean_norm / np.sqrt(2))
    from sfxlin.laws import Gaussian
    law = Gaussian(mean=m, cov=Sigma)
    tasks = icl.make_tasks(rng, 2, 2, 2, 32, law, noise=0.5, query_noise=0.5)
    held = icl.make_tasks(rng, 2, 3, 2, 32, law, noise=0.5, query_noise=0.5)
    kw = dict(lr=0.01, n_steps=40, ckpt_every=10)
    inf = training.train("linear_inf", tasks, **kw)
    for i, model in enumerate(("softmax", "linear")):
        for j, L in enumerate(config["L"]):
            ref = training.train(model, tasks, L, **kw)
            D = icl.theta_distance(ref.U.values, ref.v.values, inf.U.values, inf.v.values).max()
            assert out["D_inf_max"][i, j] == pytest.approx(D, rel=1e-8)
            assert out["risk_heldout_T"][i, j] == pytest.approx(
                float(icl.risk(model, ref.U.values[-1], ref.v.values[-1], held, L)), rel=1e-9)
            assert out["risk_heldout_init"][i, j] == pytest.approx(
                float(icl.risk(model, ref.U.values[0], ref.v.values[0], held, L)), rel=1e-9)
    assert out["risk_heldout_inf_T"] == pytest.approx(float(icl.risk("linear_inf", inf.U.values[-1], inf.v.values[-1], held)),
                                                    rel=1e-9)
    # baselines: per task, numpy.linalg
    for j, L in enumerate(config["L"]):
        X, y = held.Z[:, :L, :2], held.Z[:, :L, 2]
        w_ls = np.array([np.linalg.lstsq(Xi, yi, rcond=None)[0] for Xi, yi in zip(X, y)])
        w_b = np.array([np.linalg.solve(Xi.T @ Xi + 0.25 * np.eye(2), Xi.T @ yi) for Xi, yi in zip(X, y)])
        for name, w in (("risk_min_norm", w_ls), ("risk_bayes_ridge", w_b)):
            r = 0.5 * np.mean((np.einsum("nqi,ni->nq", held.x_q, w) - held.y_q) ** 2)
            assert out[name][j] == pytest.approx(r, rel=1e-9)
    # the limit gap: softmax's affine limit against linear(inf)'s, at theta_inf(T)
    U, v = inf.U.values[-1], inf.v.values[-1]
    Ez = np.concatenate([np.broadcast_to(m, held.w.shape), (held.w @ m)[:, None]], axis=1)          # (n, D)
    C = Gaussian(mean=np.zeros(3), cov=bayes.task_covariance(Sigma, held.w[0], 0.5)).cov              # task 0
    assert np.allclose(C[:2, :2], Sigma) and C[2, 2] == pytest.approx(held.w[0] @ Sigma @ held.w[0] + 0.25)
    Cs = bayes.task_covariance(Sigma, held.w, 0.5)
    sm = np.einsum("nqi,i->nq", Ez[:, None, :] + np.einsum("nij,nqj->nqi", Cs, held.z_q @ U.T), v)
    lin = icl.linear_predict(U, v, icl.Gamma_w(Sigma, held.w, m, 0.5), held.z_q)
    assert out["limit_gap"] == pytest.approx(0.5 * np.mean((sm - lin) ** 2), rel=1e-9, abs=1e-30)
    assert (out["limit_gap"] > 1e-4) == (mean_norm > 0)


def test_bad_covariance_spec_is_refused_before_any_cell():
    with pytest.raises(ValueError, match="covariances"):
        EXPERIMENT.configure("quick", values={"covariances": ["kms:1.5"]})


# --------------------------------------------------------------------------- units, SEs, resamples


def _seeds_apart(ds):
    """``ds`` (synthetic.c3l) with seed 1's softmax held-out risk, D and D_linL tilted by ``(L / 8)^0.1``."""
    out = ds.copy(deep=True)
    tilt = (out.L / 8.0) ** (0.1 * (out.seed == 1))
    out["D_inf_max"] = out.D_inf_max * tilt
    out["D_linL_max"] = out.D_linL_max * tilt
    excess = (out.risk_heldout_T - out.risk_bayes_ridge).sel(model="softmax") * tilt
    out["risk_heldout_T"].loc[dict(model="softmax")] = (out.risk_bayes_ridge + excess).transpose(
        *out.risk_heldout_T.sel(model="softmax").dims)
    return out


def test_measures_equal_the_slopes_and_their_se_is_cluster_robust():
    """The criteria read the slopes of slopes(); their SE is cluster-robust over the seeds (the hand computation of test_measures_extensions), the plain
    SE by name."""
    from test_measures_extensions import cluster_slope_se, ols_slope_se

    import synthetic
    ds = _seeds_apart(synthetic.c3l())
    m, sl, plain = analysis.measures(ds), analysis.slopes(ds), analysis.slopes(ds, cov_type="nonrobust")
    centred, shifted = dict(mean_norm=0.0), dict(mean_norm=1.0)
    np.testing.assert_allclose(np.ravel(m["C3L-risk-slope"]), sl.excess.sel(centred).values.ravel(), rtol=1e-12)
    np.testing.assert_allclose(np.ravel(m["C3L-D-slope"]), sl.D_inf.sel(centred).values.ravel(), rtol=1e-12)
    np.testing.assert_allclose(np.ravel(m["C3L-DlinL-slope"]), sl.D_linL.sel(centred).values.ravel(), rtol=1e-12)
    np.testing.assert_allclose(np.ravel(m["C3L-control-plateau"]), sl.D_inf_tail.sel(shifted).values.ravel(), atol=1e-12)
    assert int(sl.n_units) == 2
    x = np.log(ds.L.values.astype(float))
    at = dict(covariance="kms:0.5", noise=0.5, d=2, mean_norm=0.0)
    Y = ds.D_inf_max.sel(dict(at, model="softmax")).transpose("L", "seed").values
    slope, se = cluster_slope_se(x, Y)
    assert float(sl.D_inf.sel(at)) == pytest.approx(slope, rel=1e-10) and se > 1e-3
    assert float(sl.D_inf_se.sel(at)) == pytest.approx(se, rel=1e-9)
    assert float(plain.D_inf_se.sel(at)) == pytest.approx(ols_slope_se(x, np.log(Y.mean(axis=1)))[1], rel=1e-10)
    rows = analysis.verdicts(ds, resamples=20)
    assert all(r.robustness is not None and not r.robustness_note for r in rows)


def test_one_seed_has_no_se_and_no_robustness_and_says_why():
    """The shipped file has one seed: its tasks are trained jointly and stored as means, so nothing in it
    is an independent replicate; the table shows 'n/a (1 seed)' for the SEs, the verdicts say why they
    carry no robustness."""
    import synthetic
    from sfxlin.analysis.tables import to_text

    ds = synthetic.c3l().isel(seed=[0])
    sl = analysis.slopes(ds)
    assert int(sl.n_units) == 1 and np.isnan(sl.D_inf_se).all() and np.isfinite(sl.D_inf).all()
    assert np.isfinite(analysis.slopes(ds, cov_type="nonrobust").D_inf_se).all()
    text = to_text(analysis.fit_tables(ds))
    assert "n/a (1 seed)" in text and "one seed: no SE over independent runs" in text
    rows = analysis.verdicts(ds)
    assert {r.verdict for r in rows} == {PASS}
    assert all(r.robustness is None and "no independent unit to resample" in r.robustness_note for r in rows)
