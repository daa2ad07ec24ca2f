"""C3 on real covariates: the quick profile end to end, one cell against an independent recomputation
(the simple per-model trainer and plain icl risks), the criteria on synthetic files, the measures
against the labelled fits."""
import json

import numpy as np
import pytest
import xarray as xr

from sfxlin import curvature, icl, laws, training
from sfxlin.analysis import c3_real as analysis
from sfxlin.analysis.verdicts import FAIL, INCONCLUSIVE, NOT_JUDGED, PASS
from sfxlin.engine.sweep import build, cell_rng, run_cell
from sfxlin.pipelines import c3_real
from sfxlin.realdata import token_set
from synthetic import c3_real as synthetic_file

EXPERIMENT = c3_real.EXPERIMENT
SMALL = dict(datasets=["wine"], d=[2], n_seeds=1, n_pairs=1, n_queries=2, L=[4, 8, 16], n_steps=40, ckpt_every=10,
             heldout_pairs=2, heldout_queries=2, heldout_every=20)


def test_quick_profile_end_to_end(tmp_path):
    ds = build(EXPERIMENT, EXPERIMENT.configure("quick")).compute(scheduler="synchronous")
    assert ds.D_sinf.dims == ("dataset", "d", "seed", "L", "t")
    assert ds.dataset.values.tolist() == ["wine", "diabetes"]
    assert json.loads(ds.attrs["criteria"])[0]["id"] == "C3R-vanish-slope"
    assert float(ds.off_block_sinf.max()) == 0.0          # exact antithetic cancellation on the support too
    np.testing.assert_array_equal(ds.D_sinf.isel(t=0), 0.0)  # the same init for every model
    rows = analysis.verdicts(ds)
    assert [r.id for r in rows] == [c.id for c in analysis.CRITERIA]
    assert not [r for r in rows if r.verdict == FAIL], rows
    assert {r.id for r in rows if r.verdict == NOT_JUDGED} == {"C3R-vanish-ci", "C3R-heldout-limit"}
    assert "gap/|th_lin|" in ds.sfx.fit_table()
    assert analysis.figure(ds, tmp_path / "c3_real.png").stat().st_size > 10_000


def test_one_cell_against_an_independent_recomputation():
    """The kernel's distances and risks from the simple trainer (one model and L at a time, icl's
    analytic gradients) and plain icl risks on the held-out tasks."""
    config = EXPERIMENT.configure("quick", values=SMALL)
    cell = {"dataset": "wine", "d": 2, "seed": 0}
    out = run_cell(EXPERIMENT, config, cell)
    law = laws.Empirical(token_set("wine", 2))
    rng = cell_rng(c3_real.NAME, cell, config["root_seed"])
    tasks = icl.make_tasks(rng, 2, 1, 2, 16, law)
    held = icl.make_tasks(rng, 2, 2, 2, 16, law)
    kw = dict(n_steps=40, ckpt_every=10, lr=config["lr"])
    sinf = training.train("softmax_inf", tasks, x_law=law, **kw)
    linf = training.train("linear_inf", tasks, **kw)
    runs = [training.train("softmax", tasks, L, **kw) for L in config["L"]]
    for i, run in enumerate(runs):
        np.testing.assert_allclose(out["D_sinf"][i], icl.theta_distance(run.U, run.v, sinf.U, sinf.v), atol=1e-12)
        np.testing.assert_allclose(out["D_linf"][i], icl.theta_distance(run.U, run.v, linf.U, linf.v), atol=1e-12)
        np.testing.assert_allclose(out["risk_train"][i], run.risk, rtol=1e-11)
        np.testing.assert_allclose(out["risk_heldout"][i],
                                   icl.risk("softmax", run.U.values[::2], run.v.values[::2], held, config["L"][i]),
                                   rtol=1e-11)
    np.testing.assert_allclose(out["gap"], icl.theta_distance(sinf.U, sinf.v, linf.U, linf.v), atol=1e-12)
    np.testing.assert_allclose(out["risk_train_sinf"], sinf.risk, rtol=1e-11)
    np.testing.assert_allclose(out["norm_linf"], np.sqrt((linf.U**2).sum(("row", "col")) + (linf.v**2).sum("row")),
                               rtol=1e-12)
    at = slice(None, None, 2)   # t_heldout = 0, 20, 40 among t = 0, 10, .., 40
    np.testing.assert_allclose(out["risk_heldout_sinf"], icl.risk("softmax_inf", sinf.U.values[at], sinf.v.values[at],
                                                                  held, x_law=law), rtol=1e-11)
    np.testing.assert_allclose(out["risk_heldout_linf_as_sinf"],
                               icl.risk("softmax_inf", linf.U.values[at], linf.v.values[at], held, x_law=law), rtol=1e-11)
    np.testing.assert_allclose(out["risk_heldout_linf"],
                               icl.risk("linear_inf", linf.U.values[at], linf.v.values[at], held), rtol=1e-12)
    lam = np.linalg.eigvalsh(curvature.linear_inf_training_hessian(tasks, linf.U.values, linf.v.values))
    assert out["lr_lambda_init_inf"] == pytest.approx(config["lr"] * lam[0, -1], rel=1e-9)
    assert out["lr_lambda_max_inf"] == pytest.approx(config["lr"] * lam[:, -1].max(), rel=1e-9)


def test_criteria_on_synthetic_files():
    ds = synthetic_file()
    rows = {r.id: r for r in analysis.verdicts(ds)}
    assert all(r.verdict == PASS for r in rows.values()), rows
    np.testing.assert_allclose(analysis.measures(ds)["C3R-vanish-slope"], -0.5, rtol=1e-12)
    np.testing.assert_allclose(analysis.relative_gap(ds), 0.2, rtol=1e-12)
    flat = ds.copy(deep=True)                      # a limit that is not softmax(L)'s: D does not vanish
    flat["D_sinf"] = flat.D_sinf.isel(L=[0] * ds.sizes["L"]).assign_coords(L=ds.L)
    verdict = {r.id: r.verdict for r in analysis.verdicts(flat)}
    assert verdict["C3R-vanish-slope"] == FAIL and verdict["C3R-vanish-ci"] == FAIL
    near = ds.copy(deep=True)                      # the limits coincide: softmax(L) is as near one as the other
    near["D_linf"] = near.D_sinf
    assert {r.id: r.verdict for r in analysis.verdicts(near)}["C3R-own-limit"] == FAIL
    worse = ds.copy(deep=True)
    worse["risk_heldout_linf_as_sinf"] = worse.risk_heldout_linf_as_sinf * 0.5
    assert {r.id: r.verdict for r in analysis.verdicts(worse)}["C3R-right-limit"] == FAIL
    one = ds.isel(seed=[0])
    assert {r.id: r.verdict for r in analysis.verdicts(one)}["C3R-vanish-ci"] == INCONCLUSIVE
    short = ds.isel(L=[0, 1])
    assert {r.id: r.verdict for r in analysis.verdicts(short)}["C3R-vanish-slope"] == INCONCLUSIVE


def test_the_measures_are_the_fits():
    """The criteria read the slope and the cluster interval of slopes() and the ratios of summaries()."""
    ds = synthetic_file()
    ds["D_sinf"] = ds.D_sinf * xr.DataArray([1.0, 1.3, 0.9, 1.1, 0.95], dims="L") * xr.DataArray(
        [1.0, 0.7, 1.4], dims="seed")
    m = analysis.measures(ds)
    fit = analysis.slopes(ds).sel(quantity="D")
    assert fit.cov_type.item() == "cluster" and int(fit.n_units) == 3
    np.testing.assert_allclose(np.ravel(m["C3R-vanish-slope"]), fit.slope.values.ravel(), rtol=1e-12)
    np.testing.assert_allclose(np.ravel(m["C3R-vanish-ci"]), fit.slope_ci_high.values.ravel(), rtol=1e-10)
    s = analysis.summaries(ds).mean("seed")
    np.testing.assert_allclose(np.ravel(m["C3R-own-limit"]), (s.D / s.D_lin).isel(L=-1).values.ravel(), rtol=1e-12)
    np.testing.assert_allclose(np.ravel(m["C3R-heldout-limit"]),
                               (s.risk_heldout.isel(L=-1) / s.risk_heldout_sinf).values.ravel(), rtol=1e-12)
    np.testing.assert_allclose(np.ravel(m["C3R-right-limit"]), (s.risk_heldout_sinf / s.risk_heldout_linf_as_sinf).values.ravel(),
                               rtol=1e-12)


def test_bad_configuration_is_refused():
    with pytest.raises(ValueError, match="heldout_every"):
        EXPERIMENT.configure("quick", values={"heldout_every": 30})
    with pytest.raises(ValueError, match="datasets"):
        EXPERIMENT.configure("quick", values={"datasets": ["iris"]})
