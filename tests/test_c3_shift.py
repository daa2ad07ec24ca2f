"""C3 shift: the exact linear(inf) risk against Monte Carlo, the shift specs and maps, the risks on shifted
prompts against independent computations, one cell against a recomputation, the quick profile end to end."""
import json
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

from sfxlin import baselines, covariance, icl, laws, shift, training
from sfxlin.analysis import c3_shift as analysis
from sfxlin.analysis.verdicts import NOT_JUDGED, format_table
from sfxlin.engine import storage
from sfxlin.engine.execution import compute
from sfxlin.engine.sweep import build, cell_rng, run_cell
from sfxlin.pipelines import c3_shift as c3s
from synthetic import c3_shift as _synthetic

EXPERIMENT = c3s.EXPERIMENT
SIGMA = np.diag([2.0, 1.0, 0.5])


def _random_theta(rng, k, D):
    return 0.5 * rng.standard_normal((k, D, D)), 0.5 * rng.standard_normal((k, D))


# --------------------------------------------------------------------------- the closed form


@pytest.mark.parametrize("singular", [False, True])
@pytest.mark.parametrize("noise,query_noise", [(0.0, 0.0), (0.7, 0.3)])
def test_linear_inf_risk_matches_monte_carlo(singular, noise, query_noise):
    """Any (U, v), not block-structured; w ~ N(0, I), x_q ~ N(0, Sigma) (a singular Sigma too): the
    closed form within 4.5 SE of 2e5 draws of 1/2 (v^T Gamma_w U z_q - y_q)^2."""
    rng = np.random.default_rng(11 + singular)
    d = 3
    G = rng.standard_normal((d, d))
    S = G @ G.T / d
    if singular:
        S[2, :] = S[:, 2] = 0.0
    U, v = _random_theta(rng, 2, d + 1)
    n = 200_000
    w = rng.standard_normal((n, d))
    x = (rng.standard_normal((n, 1, d)) @ np.linalg.cholesky(S + 1e-300 * np.eye(d)).T if not singular else
         np.concatenate([rng.standard_normal((n, 1, 2)) @ np.linalg.cholesky(S[:2, :2]).T, np.zeros((n, 1, 1))], -1))
    z_q = np.concatenate([x, np.zeros((n, 1, 1))], axis=-1)
    y_q = np.einsum("nqi,ni->nq", x, w) + query_noise * rng.standard_normal((n, 1))
    e = 0.5 * (icl.linear_predict(U, v, icl.Gamma_w(S, w, None, noise), z_q) - y_q) ** 2
    mc, se = e.mean(axis=(-2, -1)), e.std(axis=(-2, -1)) / np.sqrt(n)
    exact = icl.linear_inf_risk(U, v, S, noise, query_noise)
    assert exact.shape == (2,)
    assert np.all(np.abs(mc - exact) < 4.5 * se), (mc, exact, se)


def _block_theta(rng, v_y):
    """Block-structured ``(U, v)`` (a random ``A = U[:3, :3]``, ``v = (0, 0, 0, v_y)``), ``Sigma = kms(3, 0.5)`` and
    the plug-in error matrix ``B = v_y Sigma A - I``."""
    U = np.zeros((4, 4))
    U[:3, :3] = rng.standard_normal((3, 3))
    S = covariance.kms(3, 0.5)
    return U, np.array([0.0, 0.0, 0.0, v_y]), S, v_y * S @ U[:3, :3] - np.eye(3)


def test_linear_inf_risk_block_structured_is_the_plug_in_error():
    """Block-structured (U, v): 1/2 tr(B Sigma B^T), B = v_y Sigma A - I; 0 at the Bayes optimum of the
    same Sigma (rounding), c Sigma shifts it to 1/2 (c - 1)^2 tr(c Sigma)... at U* of Sigma: B = (c - 1) I."""
    U, v = icl.bayes_optimum(SIGMA)
    assert icl.linear_inf_risk(U, v, SIGMA) == pytest.approx(0.0, abs=1e-28)
    for c in (0.5, 2.0):
        assert icl.linear_inf_risk(U, v, c * SIGMA) == pytest.approx(0.5 * (c - 1) ** 2 * c * np.trace(SIGMA), rel=1e-12)
    Ub, vb, S, B = _block_theta(np.random.default_rng(3), 0.8)
    assert icl.linear_inf_risk(Ub, vb, S) == pytest.approx(0.5 * np.trace(B @ S @ B.T), rel=1e-12)


def test_linear_inf_risk_refuses_an_indefinite_sigma():
    U, v = icl.bayes_optimum(SIGMA)
    with pytest.raises(ValueError, match="positive semi-definite"):
        icl.linear_inf_risk(U, v, np.diag([1.0, -1.0, 1.0]))


# --------------------------------------------------------------------------- shift specs and maps


def test_shift_specs_give_their_test_covariances():
    S = covariance.kms(3, 0.4) * np.array([2.0, 1.0, 0.5])[:, None] ** 0.5 * np.array([2.0, 1.0, 0.5]) ** 0.5
    np.testing.assert_allclose(shift.shifted_covariance("none", S), S, rtol=1e-14)
    np.testing.assert_allclose(shift.shifted_covariance("scale:2", S), 2 * S, rtol=1e-14)
    R = shift.shifted_covariance("rotate:1", S)
    np.testing.assert_allclose(np.linalg.eigvalsh(R), np.linalg.eigvalsh(S), rtol=1e-12)
    assert not np.allclose(R, S)
    np.testing.assert_allclose(shift.shifted_covariance("rotate:1", np.eye(3)), np.eye(3), atol=1e-14)
    P = shift.shifted_covariance("subspace:2", S)
    np.testing.assert_allclose(P[:2, :2], S[:2, :2], rtol=1e-14)
    assert np.all(P[2] == 0) and np.all(P[:, 2] == 0)
    np.testing.assert_allclose(shift.shifted_covariance("power_law:2.0", S), covariance.power_law(3, 2.0), atol=1e-13)
    assert shift.is_singular("subspace:1", 3) and not shift.is_singular("scale:2", 3)


@pytest.mark.parametrize("spec,match", [("scale:0", "C > 0"), ("scale:x", "C > 0"), ("subspace:3", "1 <= K < d = 3"),
                                        ("rotate:-1", "non-negative integer"), ("none:1", "no argument"),
                                        ("kms:1.5", "not a transform"), ("bogus", "not a transform"),
                                        ("scale:2,3", "without spaces")])
def test_bad_shift_specs_are_refused(spec, match):
    with pytest.raises(ValueError, match=match):
        shift.parse_shift(spec, 3)


def test_bad_shift_is_refused_before_any_cell():
    with pytest.raises(ValueError, match="^shifts: shift spec 'subspace:5'"):
        EXPERIMENT.configure("quick", values={"shifts": ["none", "subspace:5"]})


def _held(rng, n_pairs=5, q=3, L=40, Sigma=SIGMA):
    return icl.make_tasks(rng, 3, n_pairs, q, L, laws.covariate_law("gaussian", Sigma))


def test_shifted_pairs_map_every_covariate_and_relabel():
    held = _held(np.random.default_rng(0))
    A = shift.shift_map("rotate:2", SIGMA)
    P = shift.shifted_pairs(held, A)
    assert P.Z.shape == (held.n_tasks // 2, 4, held.L_max)
    for p in range(held.n_tasks // 2):   # a naive loop over the pairs' first tasks
        n = 2 * p
        for k in range(held.L_max):
            x = A @ held.Z[n, k, :3]
            np.testing.assert_allclose(P.Z[p, :, k], np.append(x, held.w[n] @ x), rtol=1e-12, atol=1e-14)
        for j in range(held.n_queries):
            np.testing.assert_allclose(P.z_q[p, j], np.append(A @ held.x_q[n, j], 0.0), rtol=1e-12, atol=1e-14)
            assert P.y_q[p, j] == pytest.approx(held.w[n] @ (A @ held.x_q[n, j]), rel=1e-12, abs=1e-14)
    np.testing.assert_allclose(P.Sigma, shift.shifted_covariance("rotate:2", SIGMA), rtol=1e-12, atol=1e-14)
    noisy = icl.make_tasks(np.random.default_rng(0), 3, 2, 2, 8, laws.covariate_law("gaussian", SIGMA), noise=0.1)
    with pytest.raises(ValueError, match="noiseless"):
        shift.shifted_pairs(noisy, A)


@pytest.mark.parametrize("block", [False, True])
def test_risks_on_unshifted_prompts_equal_the_icl_and_baselines_risks(block):
    """Shift ``none``: the pair risks average to icl.risk (softmax at every L of one pass, linear(inf)),
    icl.ridge_risk and baselines.pgd's held-out risk on the same Tasks; block-structured parameters (the
    partners share the softmax pass) and others (each partner its own)."""
    rng = np.random.default_rng(5)
    held = _held(rng)
    P = shift.shifted_pairs(held, np.eye(3))
    U, v = _random_theta(rng, 2, 4)
    if block:
        U[:, 3, :] = U[:, :, 3] = v[:, :3] = 0.0
    Ls = [4, 8, 16, 40]
    sm = shift.softmax_pair_risks(U, v, P, Ls)
    assert sm.shape == (2, 4, 5)
    for i, L in enumerate(Ls):
        np.testing.assert_allclose(sm[:, i].mean(-1), icl.risk("softmax", U, v, held, L), rtol=1e-10)
    np.testing.assert_allclose(shift.linear_inf_pair_risks(U, v, P).mean(-1), icl.risk("linear_inf", U, v, held),
                               rtol=1e-10)
    np.testing.assert_allclose(shift.ridge_pair_risks(P, Ls).mean(-1), [icl.ridge_risk(held, L) for L in Ls],
                               rtol=1e-6, atol=1e-24)
    np.testing.assert_allclose(shift.ridge_pair_risks(P, Ls, 0.3).mean(-1), [icl.ridge_risk(held, L, 0.3) for L in Ls],
                               rtol=1e-10)
    np.testing.assert_allclose(shift.pgd_pair_risks(P, Ls, SIGMA).mean(-1),
                               baselines.heldout_risk(held, baselines.pgd(held, Ls)), rtol=1e-10)
    with pytest.raises(ValueError, match="strictly increasing"):
        shift.softmax_pair_risks(U, v, P, [8, 4])


def test_min_norm_recovers_the_task_on_a_subspace():
    """Covariates confined to 2 of 3 dims: pinv(X) y predicts every query in the subspace exactly
    (rounding) once L >= 2; the x_3 direction carries no information."""
    held = _held(np.random.default_rng(2))
    P = shift.shifted_pairs(held, shift.shift_map("subspace:2", SIGMA))
    r = shift.ridge_pair_risks(P, [1, 2, 10])
    assert np.all(r[1:] < 1e-24) and np.all(r[0] > 1e-6)


@pytest.mark.parametrize("noise,query_noise", [(0.0, 0.0), (0.7, 0.3)])
def test_pair_variance_matches_monte_carlo(noise, query_noise):
    """The exact variance of a pair's risk (any (U, v), label noise) within 4 SE of its sample variance over
    2e5 independent pairs of 3 queries, the partners (w, eps), (-w, -eps) sharing the queries."""
    rng = np.random.default_rng(21)
    d, q, n = 3, 3, 200_000
    G = rng.standard_normal((d, d))
    S = G @ G.T / d
    U, v = _random_theta(rng, 2, d + 1)
    w = rng.standard_normal((n, d))
    x = rng.standard_normal((n, q, d)) @ np.linalg.cholesky(S).T
    eps = query_noise * rng.standard_normal((n, q))
    z_q = np.concatenate([x, np.zeros((n, q, 1))], axis=-1)
    r = sum(0.25 * np.mean((icl.linear_predict(U, v, icl.Gamma_w(S, s * w, None, noise), z_q)
                            - s * (np.einsum("nqi,ni->nq", x, w) + eps)) ** 2, axis=-1) for s in (1.0, -1.0))
    dev = r - r.mean(axis=-1, keepdims=True)
    se_var = np.sqrt(np.mean((dev**2 - r.var(axis=-1, keepdims=True)) ** 2, axis=-1) / n)
    exact = icl.linear_inf_pair_variance(U, v, S, q, noise, query_noise)
    assert exact.shape == (2,)
    assert np.all(np.abs(r.var(axis=-1) - exact) < 4 * se_var), (r.var(axis=-1), exact, se_var)


def test_pair_variance_block_structured_closed_form():
    """Block-structured (U, v), noiseless: ((tr K)^2 + 2 tr K^2) / (2 q) + tr K^2 / 2, K = B Sigma B^T, B =
    v_y Sigma A - I (the pair's error w^T B^T x_q is one Gaussian given w)."""
    U, v, S, B = _block_theta(np.random.default_rng(4), 0.6)
    K = B @ S @ B.T
    for q in (1, 4):
        expect = (np.trace(K) ** 2 + 2 * np.trace(K @ K)) / (2 * q) + np.trace(K @ K) / 2
        assert icl.linear_inf_pair_variance(U, v, S, q) == pytest.approx(expect, rel=1e-12)


#: z-spread replicates: the sample SD of 1000 z-scores of unit variance (kurtosis about 3.3) has an SE of about
#: 0.024, so a right SE lands in 0.9 .. 1.1 with probability above 1 - 1e-4 (4 SEs each side)
REPLICATES = 1000


def _z_spread(z):
    """Mean and SD of z-scores over their replicates (axis 0), every statistic at once."""
    return z.mean(axis=0), z.std(axis=0, ddof=1)


def test_c3_shift_linear_inf_monte_carlo_z_spread():
    """The c3_shift estimator (shift.shift_risks at the paper's 256 held-out pairs x 4 queries: risk_linf_mc with
    risk_linf_exact_se) against its exact value over independent replicates: every (shift, theta) z has SD in 0.9 ..
    1.1 and |mean| < 0.15 (about 5 SEs of a right mean). Trained block-structured thetas and one that is not; the
    shifts none, scale:2 and the singular subspace:2. The sample SE (risk_linf_mc_se) is the design's too, but
    from these heavy-tailed risks it is low where the mean is low: that z has SD above 1 and a long left tail."""
    d = 3
    law = laws.covariate_law("gaussian", SIGMA)
    tasks = icl.make_tasks(np.random.default_rng(8), d, 8, 2, 64, law)
    res = training.train_all_arrays(tasks, [16, 64], models=("softmax", "linear_inf"), lr=0.01, n_steps=300,
                                    ckpt_every=300)
    U = np.concatenate([res["softmax"]["U"][:, -1], res["linear_inf"]["U"][-1][None]])
    v = np.concatenate([res["softmax"]["v"][:, -1], res["linear_inf"]["v"][-1][None]])
    U_any, v_any = _random_theta(np.random.default_rng(9), 1, d + 1)
    U, v = np.concatenate([U, 0.5 * U_any]), np.concatenate([v, v_any])
    specs = ("none", "scale:2", "subspace:2")
    z, t = [], []
    for r in range(REPLICATES):
        held = icl.make_tasks(np.random.default_rng([r, 38]), d, 256, 4, 1, law)
        out = [shift.shift_risks(U, v, held, spec, SIGMA, [1]) for spec in specs]
        z.append([(o["risk_linf_mc"] - o["risk_exact"]) / o["risk_linf_exact_se"] for o in out])
        t.append([(o["risk_linf_mc"] - o["risk_exact"]) / o["risk_linf_mc_se"] for o in out])
    mean, sd = _z_spread(np.array(z))
    assert np.all((sd > 0.9) & (sd < 1.1)), sd
    assert np.all(np.abs(mean) < 0.15), mean
    t_mean, _ = _z_spread(np.array(t))
    assert np.all(t_mean < -0.1), t_mean   # the studentised z: biased low (the SE is low where the mean is)


# --------------------------------------------------------------------------- the pipeline

SMALL = dict(settings=["anisotropic"], n_seeds=1, n_pairs=2, L=[4, 8], n_steps=30, shifts=["none", "scale:2",
             "subspace:2", "power_law:2.0"], L_eval=[4, 8, 16], heldout_pairs=3, heldout_queries=2)


def test_kernel_matches_an_independent_recomputation():
    config = EXPERIMENT.configure("quick", values=SMALL)
    cell = {"setting": "anisotropic", "seed": 0}
    out = run_cell(EXPERIMENT, config, cell)
    rng = cell_rng(c3s.NAME, cell, config["root_seed"])
    law = laws.covariate_law("gaussian", SIGMA)
    tasks = icl.make_tasks(rng, 3, 2, 2, 8, law)
    held = icl.make_tasks(rng, 3, 3, 2, 16, law)
    kw = dict(lr=0.01, n_steps=30, ckpt_every=30)
    refs = [training.train("softmax", tasks, L, **kw) for L in (4, 8)] + [training.train("linear_inf", tasks, **kw)]
    U = np.stack([r.U.values[-1] for r in refs])
    v = np.stack([r.v.values[-1] for r in refs])
    np.testing.assert_allclose(out["risk_train_T"], [r.risk.values[-1] for r in refs], rtol=1e-9)
    for s, spec in enumerate(SMALL["shifts"]):
        A = shift.shift_map(spec, SIGMA)
        S = A @ SIGMA @ A.T
        # the shifted held-out tasks rebuilt by hand
        x, xq = held.Z[..., :3] @ A.T, held.x_q @ A.T
        Z = np.concatenate([x, np.einsum("nli,ni->nl", x, held.w)[..., None]], -1)
        z_q = np.concatenate([xq, np.zeros(xq.shape[:-1] + (1,))], -1)
        y_q = np.einsum("nqi,ni->nq", xq, held.w)
        for t in range(3):
            for j, L in enumerate(SMALL["L_eval"]):
                pred = icl.softmax_predict(U[t], v[t], Z[:, :L], z_q)
                assert out["risk_softmax"][s, t, j] == pytest.approx(0.5 * np.mean((pred - y_q) ** 2), rel=1e-9)
            pred = icl.linear_predict(U[t], v[t], icl.Gamma_w(S, held.w), z_q)
            assert out["risk_linf_mc"][s, t] == pytest.approx(0.5 * np.mean((pred - y_q) ** 2), rel=1e-9)
            assert out["risk_exact"][s, t] == pytest.approx(float(icl.linear_inf_risk(U[t], v[t], S)), rel=1e-9)
        for j, L in enumerate(SMALL["L_eval"]):
            X, y = Z[:, :L, :3], Z[:, :L, 3]
            w_ls = np.array([np.linalg.lstsq(Xi, yi, rcond=None)[0] for Xi, yi in zip(X, y)])
            r = 0.5 * np.mean((np.einsum("nqi,ni->nq", z_q[..., :3], w_ls) - y_q) ** 2)
            assert out["risk_ridge"][s, j] == pytest.approx(r, rel=1e-4, abs=1e-20)
        assert np.isnan(out["risk_pgd_test"][s]).all() == (spec == "subspace:2")
    assert np.all(out["risk_softmax_se"] > 0) and np.all(out["diff_se"] >= 0)


def test_quick_profile_end_to_end(tmp_path):
    config = EXPERIMENT.configure("quick")
    ds, _, _ = compute(build(EXPERIMENT, config), scheduler="synchronous", progress=False)
    path = storage.save(ds, tmp_path / "c3_shift.nc")
    with xr.open_dataset(path) as f:
        ds = f.load()
    assert ds.risk_softmax.dims == ("setting", "seed", "shift", "theta", "L_eval")
    assert ds.theta.values.tolist() == ["softmax(8)", "softmax(16)", "linear(inf)"]
    assert json.loads(ds.attrs["criteria"])[0]["id"] == "C3S-exact"
    # the unshifted isotropic rotation is no shift: the test covariance is the training one
    np.testing.assert_allclose(ds.Sigma_test.sel(shift="scale:2"), 2 * ds.Sigma_test.sel(shift="none"), rtol=1e-14)
    rows = analysis.verdicts(ds)
    assert [r.id for r in rows] == [c.id for c in analysis.CRITERIA]
    assert all(r.verdict == NOT_JUDGED for r in rows) and "C3S-falls" in format_table(rows)
    table = analysis.fit_tables(ds)["shifts"]
    s = analysis.summaries(ds).isel(L_eval=-1)
    np.testing.assert_allclose(table.ratio, s.ratio.transpose(*table.ratio.dims), rtol=1e-14)
    assert "|paired-1| slope" in ds.sfx.fit_table()
    assert Path(analysis.figure(ds, tmp_path / "c3s.png")).stat().st_size > 10_000


def test_measures_read_the_declared_quantities():
    """On a synthetic file: the falls measure is the log-log slope of |paired - 1| (exactly -1 here, and
    the slopes() fit agrees, SE 0 for parallel seeds); the ratio and gap at the largest L_eval; z."""
    ds = _synthetic()
    m = analysis.measures(ds)
    np.testing.assert_allclose(m["C3S-falls"], -1.0, rtol=1e-12)
    sl = analysis.slopes(ds)
    np.testing.assert_allclose(sl.slope, -1.0, rtol=1e-12)
    np.testing.assert_allclose(sl.slope_se, 0.0, atol=1e-12)
    last = 1.01 * (1 + 0.5 / 64)          # (L_eval = 1024) / 16 = 64
    np.testing.assert_allclose(m["C3S-ratio"], last, rtol=1e-12)
    np.testing.assert_allclose(m["C3S-gap"], 0.4 * (last - 1) / 1.0, rtol=1e-12)   # tr(I_2) / 2 = 1
    # both seeds' Monte Carlo 0.004 above the closed form, exact SE 0.01 each: 0.008 / sqrt(2 * 0.01^2)
    assert m["C3S-exact"] == pytest.approx(0.008 / np.sqrt(2e-4), rel=1e-12)
    np.testing.assert_allclose(analysis.exact_z(ds), 0.008 / np.sqrt(2e-4), rtol=1e-12)
    older = analysis.measures(ds.drop_vars("risk_linf_exact_se"))["C3S-exact"]   # a file written before it
    assert "risk_linf_exact_se" in older.reason
    # seeds falling at different rates: a cluster-robust SE > 0
    assert float(analysis.slopes(_synthetic((-1.0, -0.5))).slope_se.min()) > 0


def test_ratio_skips_predictions_near_zero():
    ds = _synthetic()
    ds["risk_exact"] = ds.risk_exact.where(ds.theta != "linear(inf)", 1e-4)   # below 0.05 tr(Sigma') / 2
    m = analysis.measures(ds)
    assert np.size(m["C3S-ratio"]) == 2 and np.size(m["C3S-gap"]) == 4
