"""C3 dimension: the stop rule of sfxlin.training.train_until (a run that converges, one that cannot,
one that stops at the init), the bit-identity of its trajectory with a joint run, the step size of a cell
(faithful: from its curvature, a whole number of steps a check; or fixed) and the faithful step's first-order
agreement with the gradient flow, the count of risk rises (none on a faithful step, some beyond the stable
one), one cell against an independent recomputation (plain per-L loop, the closed-form population risk), the
analysis on a synthetic file with a known answer and on a file of the fixed-step protocol, the criteria's
behaviour, the quick profile end to end."""

import numpy as np
import pytest
import xarray as xr

from sfxlin import covariance, curvature, icl, laws, training
from sfxlin.analysis import c3_dim as analysis
from sfxlin.analysis.verdicts import FAIL, INCONCLUSIVE, NOT_JUDGED, PASS
from sfxlin.engine import storage
from sfxlin.engine.execution import compute
from sfxlin.engine.sweep import build, cell_rng, run_cell
from sfxlin.pipelines import c3_dim as c3d
from sfxlin.pipelines.families.c3 import MODELS
from sfxlin.testing import reference_c3
from synthetic import C3_DIM_L as L_SYN, c3_dim as synthetic

EXPERIMENT = c3d.EXPERIMENT


def _tasks(d, pairs, L=8, seed=5, spec="isotropic"):
    Sigma = covariance.from_spec(spec, d)
    return icl.make_tasks(np.random.default_rng(seed), d, pairs, 2, L, laws.covariate_law("gaussian", Sigma)), Sigma


def _rule(tasks, Sigma, tol):
    U0, v0 = icl.init_theta(tasks.d, tasks.second_moment)
    r0 = icl.linear_inf_risk(U0, v0, Sigma)
    return lambda U, v: icl.linear_inf_risk(U, v, Sigma) <= tol * r0


# --------------------------------------------------------------------------- the stop rule


def test_a_run_that_converges_stops_at_the_first_check_meeting_the_rule():
    """18 pairs x 2 queries at d = 3 (36 equations on 9 unknowns): the rule is met; the run stops at the
    first check where it holds, found independently on one uninterrupted run to max_steps."""
    tasks, Sigma = _tasks(3, 18)
    stop = _rule(tasks, Sigma, 0.01)
    out = training.train_until(tasks, stop, lr=0.01, max_steps=3000, check_every=25)
    full = training.train_all_arrays(tasks, (), models=("linear_inf",), lr=0.01, n_steps=3000, ckpt_every=25)
    meets = np.array([stop(U, v) for U, v in zip(full["linear_inf"]["U"], full["linear_inf"]["v"])])
    assert meets.any() and out["converged"]
    k = int(np.argmax(meets))
    assert out["T"] == full["t"][k] and out["T"] < 3000
    np.testing.assert_array_equal(out["t"], full["t"][: k + 1])
    for key in ("U", "v", "risk"):   # the same arithmetic: bit for bit
        np.testing.assert_array_equal(out[key], full["linear_inf"][key][: k + 1], err_msg=key)


def test_an_under_determined_run_is_flagged_not_converged():
    """2 pairs x 2 queries at d = 3: 4 equations on 9 unknowns; the training risk goes to 0 at a point
    that is not theta_star, so the population risk stays far above 1% of the init's: flagged."""
    tasks, Sigma = _tasks(3, 2)
    out = training.train_until(tasks, _rule(tasks, Sigma, 0.01), lr=0.01, max_steps=2000, check_every=50)
    assert not out["converged"] and out["T"] == 2000 and out["t"][-1] == 2000 and len(out["t"]) == 41
    assert out["risk"][-1] < 1e-3 * out["risk"][0]                       # training risk: almost solved
    assert icl.linear_inf_risk(out["U"][-1], out["v"][-1], Sigma) > 0.05 * icl.linear_inf_risk(
        out["U"][0], out["v"][0], Sigma)                                   # population risk: not


def test_a_rule_met_at_the_init_trains_nothing_and_bad_steps_are_refused():
    tasks, _ = _tasks(2, 3)
    out = training.train_until(tasks, lambda U, v: True, max_steps=100, check_every=10)
    assert out["T"] == 0 and out["converged"] and out["U"].shape[0] == 1 and out["risk"].shape == (1,)
    assert out["risk"][0] == pytest.approx(float(icl.risk("linear_inf", out["U"][0], out["v"][0], tasks)), rel=1e-12)
    with pytest.raises(ValueError, match="multiple of ckpt_every"):
        training.train_until(tasks, lambda U, v: False, max_steps=105, check_every=10)


def test_population_risk_of_block_parameters_is_the_plug_in_error():
    """The stop rule's risk (sfxlin.icl.linear_inf_risk) for block-structured parameters against the
    closed form 1/2 tr(B Sigma B^T), B = v_y Sigma A - I, and a Monte Carlo over (w, x_q)."""
    d = 4
    Sigma = covariance.from_spec("power_law:1.0", d)
    rng = np.random.default_rng(2)
    U = np.zeros((d + 1, d + 1))
    U[:d, :d] = rng.standard_normal((d, d)) * 0.3 + np.eye(d)
    v = np.zeros(d + 1)
    v[d] = 0.8
    B = v[d] * Sigma @ U[:d, :d] - np.eye(d)
    exact = float(icl.linear_inf_risk(U, v, Sigma))
    assert exact == pytest.approx(0.5 * np.trace(B @ Sigma @ B.T), rel=1e-12)
    n = 400_000
    w = rng.standard_normal((n, d))
    x = rng.standard_normal((n, d)) @ np.linalg.cholesky(Sigma).T
    err = np.einsum("ni,ij,nj->n", w, B, x)                          # the error w^T B x_q (B = M^T - I)
    mc = 0.5 * err**2
    assert abs(mc.mean() - exact) < 5 * mc.std() / np.sqrt(n)


# --------------------------------------------------------------------------- one cell

SMALL = dict(settings=["power_law:1.0"], d=[2], L_caps=[16], n_seeds=1, L=[4, 8, 16, 32], lr_rule="0.01",
             flow_max=3.0, check_flow=0.2, heldout_pairs=3, heldout_queries=2, task_ratio=3.0)


def test_task_count_scales_with_d_squared():
    assert [c3d.n_pairs(d, 4.0, 2) for d in (3, 8, 16)] == [18, 128, 512]
    assert c3d.n_pairs(3, 2.0, 2) == 9 and c3d.n_pairs(2, 3.0, 2) == 6
    config = EXPERIMENT.configure("quick", values=dict(SMALL, d=[2, 3], L_caps=[16, 8]))
    assert c3d.cell_L(config, 2) == [4, 8, 16] and c3d.cell_L(config, 3) == [4, 8]
    with pytest.raises(ValueError, match="one cap per d"):
        EXPERIMENT.configure("quick", values=dict(SMALL, L_caps=[16, 32]))


def test_kernel_matches_an_independent_recomputation():
    """One cell: its T from the stop rule applied to a plain per-step loop (sfxlin.testing.reference_c3),
    distances, held-out and population risks recomputed from the reference trajectories; NaN above
    the cap; the two linear(inf) runs identical."""
    config = EXPERIMENT.configure("quick", values=SMALL)
    cell = {"setting": "power_law:1.0", "d": 2, "seed": 0}
    out = run_cell(EXPERIMENT, config, cell)
    rng = cell_rng(c3d.NAME, cell, config["root_seed"])
    Sigma = covariance.from_spec("power_law:1.0", 2)
    law = laws.covariate_law("gaussian", Sigma)
    tasks = icl.make_tasks(rng, 2, 6, 2, 16, law)
    held = icl.make_tasks(rng, 2, 3, 2, 16, law)
    U0, v0 = icl.init_theta(2, tasks.second_moment)
    ref = reference_c3.train_reference_all(tasks, (4, 8, 16), lr=0.01, n_steps=300, ckpt_every=20, U0=U0, v0=v0)
    Ui, vi = ref["linear_inf"]["U"], ref["linear_inf"]["v"]
    B = vi[:, 2, None, None] * Sigma @ Ui[:, :2, :2] - np.eye(2)         # block parameters: the plug-in error
    rel = np.einsum("tij,jk,tik->t", B, Sigma, B) / np.einsum("ij,jk,ik->", B[0], Sigma, B[0])
    k = int(np.argmax(rel <= 0.01)) if np.any(rel <= 0.01) else len(rel) - 1
    assert out["T_conv"] == 20 * k and out["converged"] == int(np.any(rel <= 0.01))
    assert out["lr"] == 0.01 and out["flow_time"] == pytest.approx(0.2 * k, rel=1e-12)
    np.testing.assert_allclose(out["rel_risk_inf"][: k + 1], rel[: k + 1], rtol=1e-9)
    assert np.all(np.isnan(out["rel_risk_inf"][k + 1:]))
    assert out["risk_rises"] == np.count_nonzero(np.diff(rel[: k + 1]) > c3d.RISE_TOL)
    assert out["inf_rerun_diff"] == 0.0 and out["n_pairs"] == 6
    for i, m in enumerate(MODELS):
        U, v = ref[m]["U"][:, : k + 1], ref[m]["v"][:, : k + 1]
        D = np.sqrt(((U - Ui[None, : k + 1]) ** 2).sum(axis=(-2, -1)) + ((v - vi[None, : k + 1]) ** 2).sum(axis=-1))
        np.testing.assert_allclose(out["D_inf_max"][i, :3], D.max(axis=-1), rtol=1e-8)
        np.testing.assert_allclose(out["D_inf_T"][i, :3], D[:, -1], rtol=1e-8)
        assert np.isnan(out["D_inf_max"][i, 3]) and np.isnan(out["risk_heldout_T"][i, 3])   # L = 32 > cap
    for j, L in enumerate((4, 8, 16)):
        U, v = ref["linear"]["U"][j, k], ref["linear"]["v"][j, k]
        pred = icl.linear_predict(U, v, icl.Ghat(held.Z, L), held.z_q)
        assert out["risk_heldout_T"][1, j] == pytest.approx(0.5 * np.mean((pred - held.y_q) ** 2), rel=1e-9)
        pred = icl.softmax_predict(ref["softmax"]["U"][j, k], ref["softmax"]["v"][j, k], held.prompt(L), held.z_q)
        assert out["risk_heldout_T"][0, j] == pytest.approx(0.5 * np.mean((pred - held.y_q) ** 2), rel=1e-9)
    assert out["risk_pop_inf"] == pytest.approx(0.5 * np.einsum("ij,jk,ik->", B[k], Sigma, B[k]), rel=1e-9)
    assert np.all(out["off_block_max"][:, :3] == 0.0)
    # the step against the curvature along the reference trajectories (sfxlin.curvature, tested on its own)
    H = curvature.linear_inf_training_hessian(tasks, Ui[: k + 1], vi[: k + 1])
    assert out["lr_lambda_init_inf"] == pytest.approx(0.01 * np.linalg.eigvalsh(H[0])[-1], rel=1e-9)
    assert out["lr_lambda_max_inf"] == pytest.approx(0.01 * np.linalg.eigvalsh(H)[:, -1].max(), rel=1e-9)
    assert out["lr_lambda_block_max_inf"] == pytest.approx(0.01 * curvature.lambda_max(H, 2).max(), rel=1e-9)
    for j, L in enumerate((4, 8, 16)):
        HL = curvature.linear_training_hessian(tasks, L, ref["linear"]["U"][j, : k + 1], ref["linear"]["v"][j, : k + 1])
        assert out["lr_lambda_block_max_linear"][j] == pytest.approx(0.01 * curvature.lambda_max(HL, 2).max(), rel=1e-9)
    assert np.isnan(out["lr_lambda_block_max_linear"][3])


# --------------------------------------------------------------------------- the step size and the flow


def test_a_cell_step_is_faithful_lowered_to_whole_steps_a_check_or_the_fixed_one():
    config = EXPERIMENT.configure("paper")
    for d, spec in ((3, "isotropic"), (16, "power_law:1.0")):
        Sigma = covariance.from_spec(spec, d)
        lr, steps = c3d.cell_lr(config, d, Sigma)
        lr_f, lam = curvature.faithful_lr(d, Sigma, margin=config["lr_margin"])
        assert steps * lr == pytest.approx(config["check_flow"], rel=1e-14) and lr <= lr_f < lr * steps / (steps - 1)
        assert lr * lam <= 2 * config["lr_margin"]
    fixed = EXPERIMENT.configure("paper", values={"lr_rule": "0.01"})
    assert c3d.cell_lr(fixed, 16, covariance.from_spec("isotropic", 16)) == (0.01, 25)
    assert EXPERIMENT.inner_coords(config)["t_flow"] == [0.25 * k for k in range(101)]


@pytest.mark.parametrize("values, match", [
    ({"lr_rule": "fast"}, "expected 'faithful' or a positive number"), ({"lr_rule": "-0.1"}, "positive number"),
    ({"lr_rule": "0.03"}, "must divide check_flow"), ({"flow_max": 10.1}, "multiple of check_flow"),
    ({"lr_margin": 0.6}, "lr_margin"), ({"L_caps": [16, 32]}, "one cap per d")])
def test_bad_steps_and_flow_times_are_refused(values, match):
    with pytest.raises(ValueError, match=match):
        EXPERIMENT.configure("quick", values={**SMALL, **values})


def test_risk_rises_count_only_rises_beyond_rounding():
    rel = np.array([1.0, 0.5, 0.5 + 1e-11, 0.6, 0.3, 0.3, 0.31])
    assert c3d.risk_rises(rel) == 2
    assert c3d.risk_rises(np.array([1.0])) == 0


def test_halving_the_faithful_step_moves_the_flow_by_first_order():
    """linear(inf) at d = 3 (power_law:1.0, 18 pairs) at the faithful lr, lr / 2 and lr / 4, compared at the same
    flow times (every 0.1 to 3): gradient descent is a first-order discretisation of the gradient flow, so the
    difference of lr and lr / 2 is twice that of lr / 2 and lr / 4 (the ratio 2 + O(lr lambda); lr lambda <= 0.03
    at the init here), and it is small: <= 1e-2 of ||theta|| at the faithful step (measured: 7.2e-4, the ratio 2.015)."""
    d, spec = 3, "power_law:1.0"
    Sigma = covariance.from_spec(spec, d)
    config = EXPERIMENT.configure("quick")
    lr, steps = c3d.cell_lr(config, d, Sigma)
    tasks = icl.make_tasks(np.random.default_rng(11), d, 18, 2, 4, laws.covariate_law("gaussian", Sigma))
    theta = []
    for k in range(3):
        r = training.train_all_arrays(tasks, (), models=("linear_inf",), lr=lr / 2**k, n_steps=30 * steps * 2**k,
                                      ckpt_every=steps * 2**k)["linear_inf"]
        theta.append(np.concatenate([r["U"].reshape(31, -1), r["v"]], axis=1))
    e1 = np.linalg.norm(theta[0] - theta[1], axis=1).max()
    e2 = np.linalg.norm(theta[1] - theta[2], axis=1).max()
    assert 1.9 < e1 / e2 < 2.1
    assert e1 <= 1e-2 * np.linalg.norm(theta[1], axis=1).max()


def test_a_step_beyond_the_stable_one_raises_the_risk_and_fails_the_flow_criterion():
    """d = 2, power_law:1.0: lr = 0.6 takes linear(inf)'s block curvature beyond 2 / lr on the way (the
    population risk rises at some checks: counted, and C3D-flow FAILs naming the cell); the faithful step on
    the same tasks never raises it."""
    values = dict(SMALL, flow_max=24.0, check_flow=2.4)
    cell = {"setting": "power_law:1.0", "d": 2, "seed": 0}
    big = run_cell(EXPERIMENT, EXPERIMENT.configure("quick", values=dict(values, lr_rule="0.6")), cell)
    assert big["risk_rises"] >= 1 and big["lr_lambda_block_max_inf"] > 2
    assert np.count_nonzero(np.diff(big["rel_risk_inf"][np.isfinite(big["rel_risk_inf"])]) > 0) == big["risk_rises"]
    calm = run_cell(EXPERIMENT, EXPERIMENT.configure("quick", values=dict(values, lr_rule="faithful")), cell)
    assert calm["risk_rises"] == 0 and calm["lr_lambda_block_max_inf"] < 0.2 and calm["lr"] < 0.02


# --------------------------------------------------------------------------- synthetic, known answers

def test_slopes_and_T_growth_recover_the_known_answer():
    s = analysis.slopes(synthetic())
    np.testing.assert_allclose(s.slope.sel(quantity="D").values, -0.3, atol=1e-12)
    np.testing.assert_allclose(s.slope.sel(quantity="excess").values, -1.0, atol=1e-12)
    # the seeds differ by a factor only: every seed has the same slope, so the clustered SE is 0 (to rounding)
    np.testing.assert_allclose(s.se.values, 0.0, atol=1e-6)
    np.testing.assert_array_equal(s.n_L.sel(d=16).values, 5)
    np.testing.assert_array_equal(s.n_L.sel(d=3).values, 7)
    g = analysis.T_growth(synthetic())
    np.testing.assert_allclose(g.slope.values, -0.5, atol=1e-12)
    assert np.all(g.ci_low <= -0.5) and np.all(g.ci_high >= -0.5)
    assert float(g.T_median.sel(setting="isotropic", d=3)) == pytest.approx(4.0)


def test_clustered_se_follows_the_seed_to_seed_spread():
    """Seeds with their own slopes -0.2, -0.3, -0.4: the slope is that of the log of the seed mean
    (np.polyfit), its clustered SE sd(b_g) / sqrt(G) with b_g the slope of seed g's linearised
    log-mean z_g = log ybar + (y_g - ybar) / ybar (fits.loglog_slope with units; up to the CR1 factor)."""
    ds = synthetic()
    L = L_SYN.astype(float)
    Y = np.stack([(L / 8) ** b for b in (-0.2, -0.3, -0.4)])          # (seed, L)
    ds.D_inf_max[:, :2, :, 0] = Y
    s = analysis.slopes(ds).sel(quantity="D", d=3)
    ybar = Y.mean(axis=0)
    np.testing.assert_allclose(s.slope.values, np.polyfit(np.log(L), np.log(ybar), 1)[0], rtol=1e-10)
    z = np.log(ybar) + (Y - ybar) / ybar
    b = np.array([np.polyfit(np.log(L), zg, 1)[0] for zg in z])
    np.testing.assert_allclose(s.se.values, b.std(ddof=1) / np.sqrt(3), rtol=0.05)


def _verdict(ds, cid):
    return next(r for r in analysis.verdicts(ds, resamples=8) if r.id == cid)


def test_criteria_pass_on_the_known_good_answer():
    rows = {r.id: r.verdict for r in analysis.verdicts(synthetic(), resamples=8)}
    assert rows == {c.id: PASS for c in analysis.CRITERIA}


def test_criteria_fail_where_they_must():
    assert _verdict(synthetic(not_converged=2), "C3D-converged").verdict == FAIL
    assert _verdict(synthetic(D_slope=0.1), "C3D-D-slope").verdict == FAIL
    assert _verdict(synthetic(excess_slope=0.2), "C3D-risk-slope").verdict == FAIL
    assert _verdict(synthetic(T_slope=1.0), "C3D-T-isotropic").verdict == FAIL
    ds = synthetic()
    ds["inf_rerun_diff"][0, 0, 0] = 1e-16
    assert _verdict(ds, "C3D-rerun").verdict == FAIL
    row = _verdict(synthetic(rises=2), "C3D-flow")
    assert row.verdict == FAIL and row.note == "fails at setting = power_law:1.0, d = 16, seed = 1"


def test_a_file_of_the_fixed_step_protocol_is_read_in_flow_time():
    """A file made before the faithful step (T_conv at one lr, checks t in steps, no flow_time, lr or
    risk_rises): its flow times are T_conv x its lr, its flow_max T_max x lr; C3D-flow is INCONCLUSIVE, saying
    why; the tables and the figure are made."""
    new = synthetic()
    old = new.drop_vars(["flow_time", "lr", "risk_rises"]).drop_dims("t_flow").assign_coords(t=np.arange(0, 1001, 25))
    old["T_conv"] = new.flow_time / 0.01
    old.attrs["config"] = '{"lr": 0.01, "tol": 0.01}'
    flow, flow_max = analysis.flow_times(old)
    np.testing.assert_allclose(flow.values, new.flow_time.values, rtol=1e-12)
    assert flow_max == pytest.approx(10.0)
    np.testing.assert_allclose(analysis.T_growth(old).slope.values, -0.5, atol=1e-12)
    row = _verdict(old, "C3D-flow")
    assert row.verdict == INCONCLUSIVE and "fixed-step protocol" in row.note
    assert "rises" not in analysis.fit_tables(old)["steps"]
    assert "rises" in analysis.fit_tables(new)["steps"]


def test_an_excess_on_the_floor_is_inconclusive_with_its_reason():
    ds = synthetic()
    ds.risk_heldout_T[0, 0, :, 0, -1] = 0.0                             # below theta_inf's risk at L = 512
    row = _verdict(ds, "C3D-risk-slope")
    assert row.verdict == INCONCLUSIVE and "L = 512" in row.note
    one = synthetic().isel(seed=[0])
    assert _verdict(one, "C3D-D-slope").verdict == INCONCLUSIVE


# --------------------------------------------------------------------------- quick profile end to end


def test_quick_profile_end_to_end(tmp_path):
    ds, _, _ = compute(build(EXPERIMENT, EXPERIMENT.configure("quick")), scheduler="synchronous", progress=False)
    path = storage.save(ds, tmp_path / "c3_dim.nc")
    with xr.open_dataset(path) as f:
        back = f.load()
    assert set(back.T_conv.dims) == {"setting", "d", "seed"} and back.converged.dtype == np.int8
    assert np.all(back.inf_rerun_diff == 0.0) and np.all(back.risk_rises == 0)
    np.testing.assert_allclose(back.flow_time, back.T_conv * back.lr, rtol=1e-15)
    rows = analysis.verdicts(back, resamples=4)
    assert {r.verdict for r in rows} <= {PASS, NOT_JUDGED}
    assert all(isinstance(t, xr.Dataset) for t in analysis.fit_tables(back).values())
    analysis.figure(back, tmp_path / "c3_dim.png")
    assert (tmp_path / "c3_dim.png").stat().st_size > 10_000
