"""C3 horizon: the log-spaced checkpoints of the fast trainer against the plain per-L reference, one
cell against an independent recomputation, T* and gamma on synthetic trajectories with a known
answer, the criteria's behaviour, the quick profile end to end."""
import json
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

from sfxlin import icl, laws, training
from sfxlin.analysis import c3_horizon as analysis
from sfxlin.analysis.verdicts import FAIL, INCONCLUSIVE, NOT_JUDGED, PASS
from sfxlin.engine import storage
from sfxlin.engine.execution import compute
from sfxlin.engine.sweep import build, cell_rng, run_cell
from sfxlin.pipelines import c3_horizon as c3h
from sfxlin.pipelines.families.c3 import MODELS
from sfxlin.testing import reference_c3
from synthetic import (C3_HORIZON_K as K, C3_HORIZON_L as L_SYN, C3_HORIZON_PER_OCTAVE as PER_OCTAVE,
                       C3_HORIZON_RATE as RATE, C3_HORIZON_T_MAX as T_MAX, c3_horizon as synthetic)

EXPERIMENT = c3h.EXPERIMENT
SMALL = dict(settings=["anisotropic"], n_seeds=1, n_pairs=2, n_queries=2, L=[4, 8, 16], n_steps=50, per_octave=4)


# --------------------------------------------------------------------------- checkpoints


@pytest.mark.parametrize("n_steps, per_octave", [(8000, 16), (60, 4), (1, 3), (1000, 1)])
def test_log_checkpoints_are_every_step_then_per_octave_per_doubling(n_steps, per_octave):
    t = training.log_checkpoint_steps(n_steps, per_octave)
    assert t[0] == 0 and t[-1] == n_steps and np.all(np.diff(t) > 0) and t.dtype.kind == "i"
    ratio = 2.0 ** (1.0 / per_octave)
    dense = int(np.floor(1.0 / (ratio - 1.0)))              # while the geometric steps are < 1 apart
    np.testing.assert_array_equal(t[: min(dense, n_steps) + 1], np.arange(min(dense, n_steps) + 1))
    for top in (2 ** k for k in range(int(np.log2(n_steps)) + 1) if 2 ** k > 4 * dense):
        assert abs(np.count_nonzero((t > top / 2) & (t <= top)) - per_octave) <= 1, top


def test_bad_checkpoints_are_refused_with_the_rule():
    with pytest.raises(ValueError, match="per_octave >= 1"):
        training.log_checkpoint_steps(100, 0)
    with pytest.raises(TypeError, match="n_steps must be an integer"):
        training.log_checkpoint_steps(100.0, 4)
    for bad in ([1, 5, 10], [0, 5, 5, 10], [0, 5, 9], [0.0, 10.0]):
        with pytest.raises(ValueError, match="checkpoints must"):
            training.given_checkpoints(bad, 10)


def test_trainer_on_log_checkpoints_matches_the_plain_reference():
    """Every model, every L, at every log-spaced checkpoint: the fast engine against the plain per-L,
    per-step loop of sfxlin.testing.reference_c3 (recorded every step), to 1e-10 relative."""
    Sigma = np.diag([2.0, 1.0, 0.5])
    rng = np.random.default_rng(7)
    tasks = icl.make_tasks(rng, 3, 3, 2, 32, laws.covariate_law("gaussian", Sigma))
    Ls, T = (4, 8, 32), 90
    steps = training.log_checkpoint_steps(T, 8)
    fast = training.train_all_arrays(tasks, Ls, lr=0.05, n_steps=T, checkpoints=steps)
    U0, v0 = icl.init_theta(3, Sigma)
    ref = reference_c3.train_reference_all(tasks, Ls, lr=0.05, n_steps=T, ckpt_every=1, U0=U0, v0=v0)
    np.testing.assert_array_equal(fast["t"], steps)
    for m in ("softmax", "linear", "linear_inf"):
        for k in ("U", "v", "risk"):
            want = np.take(ref[m][k], steps, axis=0 if m == "linear_inf" else 1)   # (L,) t, ...
            scale = np.max(np.abs(want))
            np.testing.assert_allclose(fast[m][k], want, rtol=0, atol=1e-10 * scale, err_msg=f"{m} {k}")


def test_kernel_matches_an_independent_recomputation():
    """One cell: its distances, norms and risks from the reference trajectories (plain loop) and the
    Remark 5.2 optimum written out by hand."""
    config = EXPERIMENT.configure("quick", values=SMALL)
    cell = {"setting": "anisotropic", "seed": 0}
    out = run_cell(EXPERIMENT, config, cell)
    rng = cell_rng(c3h.NAME, cell, config["root_seed"])
    Sigma = np.diag([2.0, 1.0, 0.5])
    tasks = icl.make_tasks(rng, 3, 2, 2, 16, laws.covariate_law("gaussian", Sigma))
    U0, v0 = icl.init_theta(3, Sigma)
    ref = reference_c3.train_reference_all(tasks, (4, 8, 16), lr=0.01, n_steps=50, ckpt_every=1, U0=U0, v0=v0)
    t = training.log_checkpoint_steps(50, 4)
    c = np.linalg.norm(np.diag([0.5, 1.0, 2.0])) ** 0.5           # ||Sigma^-1||_F^(1/2)
    U_star = np.zeros((4, 4))
    U_star[:3, :3] = np.diag([0.5, 1.0, 2.0]) / c
    v_star = np.array([0.0, 0.0, 0.0, c])

    def dist(U, v, U2, v2):
        return np.sqrt(((U - U2) ** 2).sum(axis=(-2, -1)) + ((v - v2) ** 2).sum(axis=-1))

    Ui, vi = ref["linear_inf"]["U"][t], ref["linear_inf"]["v"][t]
    np.testing.assert_allclose(out["norm_inf"], np.sqrt((Ui**2).sum(axis=(1, 2)) + (vi**2).sum(axis=1)), rtol=1e-10)
    np.testing.assert_allclose(out["dist_star_inf"], dist(Ui, vi, U_star, v_star), rtol=1e-10)
    np.testing.assert_allclose(out["risk_inf"], ref["linear_inf"]["risk"][t], rtol=1e-10)
    np.testing.assert_allclose(out["conservation_inf"], (Ui**2).sum(axis=(1, 2)) - (vi**2).sum(axis=1),
                               rtol=1e-9, atol=1e-14)
    assert out["norm_star"] == pytest.approx(np.sqrt(2.0) * c, rel=1e-14)
    for i, m in enumerate(MODELS):
        U, v = ref[m]["U"][:, t], ref[m]["v"][:, t]
        D = dist(U, v, Ui[None], vi[None])
        np.testing.assert_allclose(out["D_inf"][i], D, rtol=1e-9, atol=1e-13 * D.max())
        np.testing.assert_allclose(out["dist_star"][i], dist(U, v, U_star, v_star), rtol=1e-10)
        np.testing.assert_allclose(out["risk_train"][i], ref[m]["risk"][:, t], rtol=1e-10)
    assert np.all(out["D_inf"][:, :, 0] == 0.0)                 # one init for every model and L
    assert np.all(out["off_block_max"] == 0.0)


def test_theta_star_is_the_zero_risk_point_that_theta_inf_approaches():
    """Remark 5.2: v*^T Gamma_w U* z_q = w^T x_q for every task (risk 0 to rounding) on the balanced
    manifold ||U*||_F = ||v*||. Gradient descent on linear(inf) reaches zero risk at a point whose
    distance to it is the drift of the balance, O(lr): halving the step halves the gap, so theta_star
    is the limit of the gradient flow."""
    U, v = icl.bayes_optimum(np.eye(3))
    rng = np.random.default_rng(3)
    tasks = icl.make_tasks(rng, 3, 24, 2, 4, laws.covariate_law("gaussian", np.eye(3)))
    assert float(icl.risk("linear_inf", U, v, tasks)) < 1e-28
    assert np.sum(U**2) == pytest.approx(np.sum(v**2), rel=1e-14)
    gaps = []
    for lr, T in ((0.1, 1000), (0.05, 2000)):
        r = training.train_all_arrays(tasks, None, models=("linear_inf",), lr=lr, n_steps=T,
                                      checkpoints=training.log_checkpoint_steps(T, 2))["linear_inf"]
        d = icl.theta_distance(r["U"], r["v"], U, v)
        assert r["risk"][-1] < 1e-25 and np.all(np.diff(d[len(d) // 2:]) <= 1e-12)
        gaps.append(d[-1])
    assert gaps[0] < 1e-2 * np.sqrt(2 * np.sum(v**2)) and 1.7 < gaps[0] / gaps[1] < 2.5


# --------------------------------------------------------------------------- synthetic, known answers

def true_horizon(eps, gamma_true=0.5):
    """The first integer step with D > eps, per (seed, L): floor(x) + 1 for the threshold x."""
    x = eps * (L_SYN[None, :] / 8.0) ** gamma_true / (RATE * K[:, None])
    return np.floor(x) + 1.0


def test_first_exceedance_brackets_the_true_first_step():
    t = np.array([0, 1, 2, 4, 8, 16])
    D = np.array([[0.0, 0.1, 0.2, 0.4, 0.8, 1.6], [0.0] * 6, [0.0, 0.0, 0.0, 0.0, 0.0, 0.9]])
    lo, hi = analysis.first_exceedance_np(D, 1.0, t, 0.3)
    np.testing.assert_array_equal(lo, [3.0, np.nan, 9.0])
    np.testing.assert_array_equal(hi, [4.0, np.nan, 16.0])
    assert analysis.resolution(t) == pytest.approx(16 / 9)
    with pytest.raises(ValueError, match="eps must be positive"):
        analysis.first_exceedance_np(D, 1.0, t, 0.0)


def test_horizons_and_gamma_recover_the_known_answer():
    ds = synthetic()
    h = analysis.horizons(ds)
    assert h.attrs["resolution"] == pytest.approx(analysis.resolution(ds.t.values)) and h.attrs["T_max"] == T_MAX
    assert 1.0 < h.attrs["resolution"] < 2 ** (1 / PER_OCTAVE) + 1e-3
    for e in analysis.EPS:
        true = true_horizon(e)
        sm = h.sel(eps=e, setting="isotropic", model="softmax")
        never = true > T_MAX
        np.testing.assert_array_equal(sm.never.values, never)
        ok = ~never
        assert np.all(sm.T_lo.values[ok] <= true[ok]) and np.all(true[ok] <= sm.T_hi.values[ok])
        assert np.all(sm.T_hi.values[ok] / sm.T_lo.values[ok] <= h.attrs["resolution"] + 1e-12)
        assert h.never.sel(eps=e, model="linear").all()
    g = analysis.gamma(ds)
    never_02 = int((true_horizon(0.2) > T_MAX).sum())
    assert never_02 == 2 and (true_horizon(0.1) <= T_MAX).all()
    np.testing.assert_array_equal(g.n_never.sel(eps=0.2), never_02)
    np.testing.assert_array_equal(g.n_L.sel(eps=0.05), L_SYN.size)
    np.testing.assert_array_equal(g.n_L.sel(eps=0.2), L_SYN.size - 1)      # the L with a never is left out
    # within the checkpoint resolution: log T* is off by at most log(resolution) at each L
    bound = np.log(g.attrs["resolution"]) / np.log(L_SYN[-1] / L_SYN[0]) * 2
    np.testing.assert_allclose(g.gamma, 0.5, atol=bound)
    assert np.all(g.gamma_ci_low < g.gamma) and np.all(g.gamma < g.gamma_ci_high)
    assert np.all(g.gamma_censored.sel(eps=0.2) < g.gamma.sel(eps=0.2))     # T_max is below the true horizon


def test_gamma_se_is_cluster_robust_over_the_seeds():
    from test_measures_extensions import cluster_slope_se

    ds = synthetic()
    ds["D_inf"].loc[dict(seed=2, model="softmax")] = ds.D_inf.sel(seed=2, model="softmax") * (ds.L / 8.0) ** 0.2
    g = analysis.gamma(ds)
    h = analysis.horizons(ds).sel(eps=0.05, setting="anisotropic", model="softmax")
    slope, se = cluster_slope_se(np.log(L_SYN.astype(float)), h.T_star.transpose("L", "seed").values)
    assert float(g.gamma.sel(setting="anisotropic", eps=0.05)) == pytest.approx(slope, rel=1e-10)
    assert float(g.gamma_se.sel(setting="anisotropic", eps=0.05)) == pytest.approx(se, rel=1e-8) and se > 1e-3
    m = analysis.measures(ds)
    np.testing.assert_allclose(m["C3H-gamma-0.05"], g.gamma_ci_low.sel(eps=0.05).values, rtol=1e-12)


def test_best_horizon_and_its_slopes():
    ds = synthetic()
    b = analysis.best_horizon(ds).sel(model="softmax")
    T_best = 100 * (L_SYN / 8.0) ** 0.25
    t = ds.t.values
    nearest = t[np.argmin(np.abs(np.log(np.maximum(t, 1e-300))[None, :] - np.log(T_best)[:, None]), axis=1)]
    np.testing.assert_array_equal(b.T_best.sel(setting="isotropic", seed=0), nearest)
    assert not b.at_end.any() and not b.at_start.any()
    s = analysis.best_slopes(ds)
    np.testing.assert_allclose(s.best_slope, -0.3, atol=1e-3)
    np.testing.assert_allclose(s.T_best_slope, 0.25, atol=0.02)
    np.testing.assert_array_equal(s.n_L_T_best, L_SYN.size)


# --------------------------------------------------------------------------- criteria


def _verdicts(ds, resamples=0):
    return {r.id: r for r in analysis.verdicts(ds, resamples=resamples)}


def test_the_known_answer_passes_every_criterion_robustly():
    rows = analysis.verdicts(synthetic(), resamples=20)
    assert [r.id for r in rows] == [c.id for c in analysis.CRITERIA]
    assert {r.id: r.verdict for r in rows} == {r.id: PASS for r in rows}
    assert all(r.robustness == 1.0 for r in rows)


def test_a_shrinking_horizon_fails_gamma_and_a_receding_best_fails_the_slopes():
    # a horizon that shrinks with L (gamma = -0.3; an exactly flat one fits a slope of 0 +- rounding,
    # whose interval's sign would rest on the BLAS kernel)
    flat = _verdicts(synthetic(gamma_true=-0.3))
    assert all(flat[f"C3H-gamma-{e:g}"].verdict == FAIL for e in (0.05, 0.1))
    ds = synthetic()
    # the curves in reverse L order: the best distance grows with L and T_best falls (not exactly flat,
    # for the same reason as above)
    axis = ds.dist_star.dims.index("L")
    ds["dist_star"] = ds.dist_star.copy(data=np.flip(ds.dist_star.values, axis=axis))
    rows = _verdicts(ds)
    assert rows["C3H-best-slope"].verdict == FAIL and rows["C3H-Tbest-slope"].verdict == FAIL
    assert rows["C3H-gamma-0.05"].verdict == PASS


def test_theta_inf_not_converged_or_off_the_optimum_fails():
    ds = synthetic()
    ds["risk_inf"].loc[dict(setting="anisotropic")] = ds.risk_inf.sel(setting="anisotropic") + 1e-5
    ds["dist_star_inf"] = ds.dist_star_inf + 0.1
    ds["off_block_max"] = ds.off_block_max + 1e-6
    rows = _verdicts(ds)
    assert rows["C3H-inf-converged"].verdict == FAIL and rows["C3H-inf-converged"].measured_str.endswith("(1/2 <= 1e-06)")
    assert rows["C3H-inf-star"].verdict == FAIL and rows["C3H-block"].verdict == FAIL


def test_too_few_horizons_or_one_seed_is_inconclusive_with_the_reason():
    ds = synthetic()
    sm = dict(model="softmax", setting="isotropic")
    ds["D_inf"].loc[sm] = ds.D_inf.sel(sm).where(ds.L < 32, 0.0)               # never beyond L = 16
    rows = _verdicts(ds)
    r = rows["C3H-gamma-0.05"]
    assert r.verdict == INCONCLUSIVE and "isotropic: T* defined in every seed at 2 of 7 L" in r.note
    one = _verdicts(synthetic(n_seeds=1))
    for id_ in ("C3H-gamma-0.1", "C3H-best-slope", "C3H-Tbest-slope"):
        assert one[id_].verdict == INCONCLUSIVE and "one seed" in one[id_].note
    assert one["C3H-inf-converged"].verdict == PASS
    ds = synthetic()
    ds["dist_star"].loc[dict(model="softmax")] = (1.0 - 0.5 * ds.t / T_MAX).broadcast_like(ds.dist_star.sel(
        model="softmax")).transpose(*ds.dist_star.sel(model="softmax").dims)    # closest at T_max
    assert "argmin inside the run in every seed at 0 of 7 L" in _verdicts(ds)["C3H-Tbest-slope"].note


# --------------------------------------------------------------------------- end to end


def test_quick_profile_end_to_end(tmp_path):
    config = EXPERIMENT.configure("quick")
    ds, _, _ = compute(build(EXPERIMENT, config), scheduler="synchronous", progress=False)
    path = storage.save(ds, tmp_path / "c3_horizon.nc")
    with xr.open_dataset(path) as f:
        ds = f.load()
    assert ds.D_inf.dims == ("setting", "seed", "model", "L", "t")
    np.testing.assert_array_equal(ds.t, training.log_checkpoint_steps(60, 4))
    assert json.loads(ds.attrs["criteria"])[0]["id"] == "C3H-gamma-0.05"
    rows = analysis.verdicts(ds)
    assert {r.id: r.verdict for r in rows if r.verdict != NOT_JUDGED} == {"C3H-block": PASS}
    text = ds.sfx.fit_table()
    assert "Horizon growth" in text and "never" in text
    assert Path(analysis.figure(ds, tmp_path / "c3h.png")).stat().st_size > 10_000


def test_bad_sigma_is_refused_before_any_cell():
    with pytest.raises(ValueError, match="Sigma_anisotropic"):
        EXPERIMENT.configure("quick", values={"Sigma_anisotropic": [1.0, 2.0]})
