"""c3_deep: one cell of each part against independent numpy computations, determinism in threads,
the analysis on a synthetic file with known rates and constants.

Independent computations: deep linear attention maps every token by ``I + sum_h V_h Ghat U_h``,
so its read-outs are the closed form with ``Sigma_1 = Ghat_L`` (numpy loop below), the limit the
closed form with ``Gamma_w``; softmax by a plain loop. Same float64 sums in other orders: 1e-12.
"""
from __future__ import annotations

import threading
import warnings

import numpy as np
import xarray as xr
import pytest

import synthetic
from sfxlin import icl
from sfxlin.analysis import c3_deep as A
from sfxlin.analysis.verdicts import FAIL, NOT_JUDGED, PASS
from sfxlin.engine.sweep import cell_rng, run_cell

M = pytest.importorskip("sfxlin.models")
from sfxlin.pipelines import c3_deep  # noqa: E402
from sfxlin.pipelines.families import deep  # noqa: E402

SMALL = {"heads": [1], "n_seeds": 1, "depth_max": 2, "L": [4, 8, 16], "n_pairs": 2, "n_queries": 2, "depths": [1],
         "L_train": [4, 8, 16], "train_pairs": 2, "train_queries": 4, "heldout_pairs": 4, "n_steps": 4, "ckpt_every": 2}


def _config(**kw):
    quick = dict(c3_deep.EXPERIMENT.configure("quick"))
    return c3_deep.EXPERIMENT.configure(profile=None, values={**quick, **SMALL, **kw})


def _closed_form(p, Sigma, z_q, K, H):
    """(preds (K, n, q), Sigma_l (K, n, D, D)) of the residual deep linear model, numpy loops."""
    D = Sigma.shape[-1]
    preds, sigs = np.empty((K,) + z_q.shape[:2]), np.empty((K,) + Sigma.shape)
    for n in range(Sigma.shape[0]):
        S, q = Sigma[n], z_q[n].T
        for l in range(K):
            sigs[l, n] = S
            A_l = np.eye(D) + sum(p["V"][l, h] @ S @ p["U"][l, h] for h in range(H))
            q, S = A_l @ q, A_l @ S @ A_l.T
            preds[l, n] = p["v"] @ q
    return preds, sigs


def _softmax_loop(p, Z, zq, K, H):
    for l in range(K):
        def attend(x, Z=Z, l=l):
            out = np.zeros(len(x))
            for h in range(H):
                s = Z @ (p["U"][l, h] @ x)
                w = np.exp(s - s.max())
                out += p["V"][l, h] @ (w @ Z / w.sum())
            return out
        Z, zq = np.array([z + attend(z) for z in Z]), np.array([q + attend(q) for q in zq])
    return zq @ p["v"]


def _draws(config, cell, part):
    """The cell's parameters and tasks, in the documented draw order."""
    rng = cell_rng(c3_deep.EXPERIMENT.rng_name(part), cell, config["root_seed"])
    d = config["d"]
    if part == "":
        model = M.Transformer(d + 1, config["depth_max"], cell["heads"])
        p = model.init(rng, config["U_scale"], config["V_scale"], config["v_scale"])
        tasks = deep.tasks_of(rng, d, config["n_pairs"], config["n_queries"], config["L"][-1])
        return M.cap_lambdas(model, p, icl.Gamma_w(tasks.Sigma, tasks.w), config["lambda_cap"])[0], tasks
    model = M.Transformer(d + 1, cell["depth"], cell["heads"])
    p = model.init(rng, config["U_scale"], config["V_scale"], config["v_scale"])
    L = config["L_train"][-1]
    tasks = deep.tasks_of(rng, d, config["train_pairs"], config["train_queries"], L)
    return p, tasks, deep.tasks_of(rng, d, config["heldout_pairs"], config["train_queries"], L)


def test_part_a_cell_against_numpy():
    """Also: the drawn model breaks the softmax 1/L condition (lambda >= 1/2, docs/deep.md), and the
    cell measures it capped at lambda_cap (every layer's largest lambda at the cap, none above), without
    a warning (the cap holds for the population covariances the warning cannot see)."""
    config = _config()
    cell = {"heads": 1, "seed": 0}
    with warnings.catch_warnings():
        warnings.simplefilter("error", M.RateConditionWarning)
        out = run_cell(c3_deep.EXPERIMENT, config, cell)
    p, tasks = _draws(config, cell, "")
    K = config["depth_max"]
    assert out["lambda_drawn"].max() > M.LAMBDA_BOUND
    # layer 1 sees Gamma_w whatever the cap does: its largest lambda is the drawn one, capped
    np.testing.assert_allclose(out["lambda_max"][0], min(out["lambda_drawn"][0], config["lambda_cap"]), rtol=1e-10)
    assert np.all(out["lambda_max"] <= config["lambda_cap"] * (1 + 1e-10)) and np.all(out["U_shrink"] <= 1)
    model = M.Transformer(config["d"] + 1, K, 1)
    lam = M.head_lambdas(model, p, icl.Gamma_w(tasks.Sigma, tasks.w)).max(axis=(1, 2))
    np.testing.assert_allclose(lam, out["lambda_max"], rtol=1e-12)
    lim, Sig = _closed_form(p, icl.Gamma_w(tasks.Sigma, tasks.w), tasks.z_q, K, 1)
    np.testing.assert_allclose(out["out_sq"], np.mean(lim**2, axis=(1, 2)), rtol=1e-12)
    lin = deep.KERNELS.index("linear")
    for j, L in enumerate(config["L"]):
        pred, mom = _closed_form(p, icl.Ghat(tasks.prompt(L)), tasks.z_q, K, 1)
        np.testing.assert_allclose(out["err"][lin, :, j], np.mean((pred - lim) ** 2, axis=(1, 2)), rtol=1e-10)
        np.testing.assert_allclose(out["err_median"][lin, :, j], np.median((pred - lim) ** 2, axis=(1, 2)),
                                   rtol=1e-10)
        rel = np.linalg.norm(mom - Sig, axis=(-2, -1)) / np.linalg.norm(Sig, axis=(-2, -1))
        np.testing.assert_allclose(out["cov_err"][lin, :, j], rel.mean(axis=-1), rtol=1e-10)
    L = config["L"][0]
    sm = np.array([_softmax_loop(p, tasks.prompt(L)[n], tasks.z_q[n], K, 1) for n in range(tasks.n_tasks)])
    np.testing.assert_allclose(out["err"][deep.KERNELS.index("softmax"), -1, 0], np.mean((sm - lim[-1]) ** 2),
                               rtol=1e-10)


def _risk(pred, y):
    return 0.5 * np.mean((pred - y) ** 2)


def test_part_b_cell_against_numpy():
    config = _config()
    cell = {"depth": 1, "heads": 1, "seed": 0}
    out = run_cell(c3_deep.EXPERIMENT, config, cell, "train")
    p, tasks, held = _draws(config, cell, "train")
    # same initialisation: every distance is exactly 0 at t = 0, and the runs move
    assert np.all(out["D_inf"][..., 0] == 0) and np.all(out["D_linL"][:, 0] == 0)
    assert np.all(out["D_inf"][..., -1] > 0)
    lim = _closed_form(p, icl.Gamma_w(tasks.Sigma, tasks.w), tasks.z_q, 1, 1)[0][-1]
    assert abs(out["risk_inf"][0] - _risk(lim, tasks.y_q)) <= 1e-12 * out["risk_inf"][0]
    lim_h = _closed_form(p, icl.Gamma_w(held.Sigma, held.w), held.z_q, 1, 1)[0][-1]
    assert abs(out["risk_heldout_inf"][0] - _risk(lim_h, held.y_q)) <= 1e-12 * out["risk_heldout_inf"][0]
    lin, initial = deep.KERNELS.index("linear"), deep.STAGES.index("initial")
    for j, L in enumerate(config["L_train"]):
        pred = _closed_form(p, icl.Ghat(held.prompt(L)), held.z_q, 1, 1)[0][-1]
        assert abs(out["risk_heldout"][lin, j, initial] - _risk(pred, held.y_q)) <= 1e-12 * _risk(pred, held.y_q)
    assert np.all(out["risk"][..., -1] < out["risk"][..., 0])


def test_heldout_pairs_must_be_a_multiple_of_train_pairs():
    with pytest.raises(ValueError, match="heldout_pairs"):
        _config(heldout_pairs=3)


@pytest.mark.filterwarnings("ignore::sfxlin.models.RateConditionWarning")   # part (a)'s cell: see above
def test_cells_in_threads_give_the_same_bits():
    config = _config()
    cells = [({"heads": 1, "seed": 0}, ""), ({"depth": 1, "heads": 1, "seed": 0}, "train")]
    serial = [run_cell(c3_deep.EXPERIMENT, config, c, part) for c, part in cells]
    out = [None] * 4

    def run(i):
        c, part = cells[i % 2]
        out[i] = run_cell(c3_deep.EXPERIMENT, config, c, part)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, o in enumerate(out):
        for k, a in serial[i % 2].items():
            np.testing.assert_array_equal(o[k], a, err_msg=k)


def test_a_part_a_cell_in_one_thread_never_silences_the_warnings_of_another():
    """Part (a) skips the rate check (``check_rate=False``) instead of wrapping its calls in
    ``warnings.catch_warnings``, which changes the process-wide filters: a part (b) cell in another
    thread (the default scheduler) lost its RateConditionWarning while a part (a) cell ran."""
    model = M.Transformer.single_head(4)
    bad = {"U": 3.0 * np.eye(4)[None, None], "v": np.ones(4)}            # lambda ~ 9 on N(0, I) tokens
    rng = np.random.default_rng(0)
    Z, z_q = rng.standard_normal((1, 16, 4)), rng.standard_normal((1, 2, 4))
    config, done, calls = _config(), threading.Event(), [0]

    def part_a():
        run_cell(c3_deep.EXPERIMENT, config, {"heads": 1, "seed": 0})
        done.set()

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", M.RateConditionWarning)
        M.predict(model, "softmax", bad, Z, z_q)                             # compiled before the race
        worker = threading.Thread(target=part_a)
        worker.start()
        while not done.is_set() or calls[0] < 20:
            M.predict(model, "softmax", bad, Z, z_q)
            calls[0] += 1
        worker.join()
    got = [w for w in caught if issubclass(w.category, M.RateConditionWarning)]
    assert len(got) == calls[0] + 1, f"{calls[0] + 1 - len(got)} of {calls[0] + 1} warnings lost"


def test_analysis_recovers_the_synthetic_rates_and_constants(tmp_path):
    ds = synthetic.c3_deep()
    r = A.rates(ds)
    np.testing.assert_allclose(r.slope, -1.0, atol=1e-12)
    np.testing.assert_allclose(r.cov_slope, -0.5, atol=1e-12)
    np.testing.assert_allclose(r.median_slope, -1.0, atol=1e-12)
    # err = c_l 16 / L with c_l = 2^(l-1): C = 16 c_l, growth 2^(l-1)
    np.testing.assert_allclose(r.growth.sel(heads=1, kernel="softmax"), [1.0, 2.0, 4.0], rtol=1e-12)
    np.testing.assert_allclose(r.constant.sel(heads=1, kernel="softmax", layer=1), 16.0, rtol=1e-12)
    rows = {row.criterion.id: row.verdict for row in A.verdicts(ds)}
    assert set(rows.values()) == {PASS}
    bad = ds.copy(deep=True)
    bad["err"].loc[dict(layer=3)] = bad.err.sel(layer=3) * (bad.L / 16.0) ** 0.5   # rate -1/2 at depth 3
    assert {row.criterion.id: row.verdict for row in A.verdicts(bad)}["C3D-a-slope"] == FAIL
    text = ds.sfx.fit_table()
    assert "C(l) / C(1)" in text and "held-out" in text
    A.figure(ds, tmp_path / "c3_deep.png")
    assert (tmp_path / "c3_deep.png").stat().st_size > 0


def test_fit_range_is_the_largest_half():
    assert list(A.fit_range([16, 32, 64, 128, 256, 512, 1024])) == [4, 5, 6]
    assert list(A.fit_range(list(range(8)))) == [4, 5, 6, 7]
    assert list(A.fit_range([4, 8, 16])) == [0, 1, 2]


# --------------------------------------------------------------------------- units, SEs, resamples, quick


def _seeds_apart(ds):
    """``ds`` with seed 1's curves tilted by ``(x / x_min)^0.1`` along L and L_train: the seeds' slopes differ."""
    out = ds.copy(deep=True)
    for var, dim in (("err", "L"), ("err_median", "L"), ("cov_err", "L"), ("D_inf", "L_train")):
        tilt = (out[dim] / out[dim][0]) ** (0.1 * (out.seed == 1))
        out[var] = out[var] * tilt
    return out


def test_measures_equal_the_labelled_fits():
    """The criteria read the tables' functions: rates(), training_slopes() and training()."""
    ds = _seeds_apart(synthetic.c3_deep())
    m, r, tr = A.measures(ds), A.rates(ds), A.training(ds)
    xr.testing.assert_identical(m["C3D-a-slope"], r.slope)
    xr.testing.assert_identical(m["C3D-a-median-slope"], r.median_slope)
    xr.testing.assert_identical(m["C3D-a-cov-slope"], r.cov_slope)
    xr.testing.assert_identical(m["C3D-b-slope"], A.training_slopes(ds).slope.sel(curve="softmax"))
    xr.testing.assert_identical(m["C3D-b-heldout"], tr.heldout_ratio.sel(model="softmax").isel(L_train=-1))
    xr.testing.assert_identical(m["C3D-b-heldout-limit"], tr.heldout_ratio_inf)
    assert not np.allclose(A.rates(ds).slope_se, 0)          # the seeds differ: a cluster SE to see


def test_one_seed_has_no_se_and_no_robustness():
    """The quick profile runs one seed: the slopes are that run's, the cluster SE cannot be computed
    (NaN, 'n/a (1 seed)' in the tables), nor the robustness (the row says why)."""
    from sfxlin.analysis.tables import to_text

    ds = synthetic.c3_deep().isel(seed=[0])
    r = A.rates(ds)
    assert int(r.n_units) == 1 and np.isnan(r.slope_se).all() and np.isfinite(r.slope).all()
    np.testing.assert_allclose(A.rates(ds, cov_type="nonrobust").slope, r.slope, rtol=0)
    assert np.isfinite(A.rates(ds, cov_type="nonrobust").slope_se).all()     # one curve's plain SE, by name
    assert np.isnan(A.training_slopes(ds).slope_se).all()
    text = to_text(A.fit_tables(ds))
    assert "n/a (1 seed)" in text and "one seed: no SE" in text
    rows = A.verdicts(ds)
    assert {r.verdict for r in rows} == {PASS}
    assert all(r.robustness is None and r.robustness_note == "one independent unit: no resample" for r in rows)


def test_two_seeds_give_a_robustness():
    rows = A.verdicts(synthetic.c3_deep(), resamples=20)
    assert all(r.robustness == 1.0 for r in rows)              # proportional seeds: every resample agrees


def test_the_quick_profile_judges_the_limit_model_only():
    ds = synthetic.c3_deep()
    ds.attrs["profile"] = "quick"
    rows = {r.id: r for r in A.verdicts(ds, resamples=0)}
    assert {i for i, r in rows.items() if r.verdict == PASS} == {"C3D-b-heldout-limit"}
    assert {r.verdict for i, r in rows.items() if i != "C3D-b-heldout-limit"} == {NOT_JUDGED}
    assert rows["C3D-b-heldout-limit"].threshold_str == "< 1"
