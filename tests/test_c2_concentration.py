"""C2 pipeline and analysis: per-cell kernels against independent computations, the trajectory part as
cells of their own (kept, one dask task each), the quick profile end to end (build, compute, save,
open, tables, verdicts, figure), the bound parameters and the declared parameter rules."""
import json
import math

import numpy as np
import pytest
import xarray as xr

from sfxlin import concentration, covariance, icl
from sfxlin.analysis import c2 as c2_analysis
from sfxlin.analysis.verdicts import NOT_JUDGED, PASS, NotJudged, format_table
from sfxlin.attention import softmax_attention
from sfxlin.engine.cellstore import CellStore
from sfxlin.engine.execution import compute
from sfxlin.laws import Gaussian
from sfxlin.pipelines import c2_concentration as c2
from sfxlin.gradient_gap import concentration_constant, gradient_gap_trajectory
from sfxlin.engine.storage import open_results, save
from sfxlin.engine.sweep import build, cell_rng, run_cell

from conftest import raise_if_dask_computes

TINY = c2.EXPERIMENT.configure("quick", values={
    "d": [2], "U_norm": [0.5], "n_seeds": 1, "L": [4, 8, 16], "tail_queries": 2, "tail_prompts": 10,
    "prompt_chunk": 4, "clt_draws": 20000, "grad_pairs": 2, "grad_queries": 2, "grad_draws": 3, "grad_scales": [1.5],
    "traj_pairs": 2, "traj_steps": 20, "traj_ckpt_every": 10, "traj_seeds": 2})
CELL0 = {"d": 2, "U_norm": 0.5, "seed": 0}   # TINY's one main cell


# --------------------------------------------------------------------------- independent references


def chi2_sf(x, k):
    """``P(chi^2_k > x)`` by the finite series (even k: Poisson sum; odd k: erfc plus a sum)."""
    h = x / 2.0
    if k % 2 == 0:
        return math.exp(-h) * sum(h**j / math.factorial(j) for j in range(k // 2))
    total = math.erfc(math.sqrt(h))
    for j in range(1, (k - 1) // 2 + 1):
        total += math.exp(-h) * h ** (j - 0.5) / math.gamma(j + 0.5)
    return total


def naive_item_gradients(U, v, Z, z_q, y_q):
    """Softmax-attention gradient of 1/2 (pred - y)^2 for one prompt and one query, token by token."""
    a = U @ z_q
    s = np.array([z @ a for z in Z])
    p = np.exp(s - s.max())
    p /= p.sum()
    mbar = sum(pk * z for pk, z in zip(p, Z))
    second = sum(pk * np.outer(z, z) for pk, z in zip(p, Z))
    C = second - np.outer(mbar, mbar)
    r = v @ mbar - y_q
    return r * np.outer(C @ v, z_q), r * mbar


def naive_limit_gradients(U, v, Gamma, z_q, y_q):
    h = Gamma @ U @ z_q
    r = v @ h - y_q
    return r * np.outer(Gamma @ v, z_q), r * h


# --------------------------------------------------------------------------- (b) gradient gap


def test_gradient_gap_matches_a_naive_per_task_loop():
    d, n_pairs, n_q, Ls, n_draws = 2, 2, 2, [3, 5, 9], 3
    Sigma = 1.5 * covariance.from_spec("geometric:2:0.5", d)
    U, v = concentration.gradient_parameters(Sigma, 0.4)
    tasks, gap_sq, inf_sq = concentration.gradient_gaps(np.random.default_rng(11), Sigma, U, v, Ls, n_pairs, n_q, n_draws)

    # the documented draw order: w, prompt covariates, query covariates, then one prompt set per draw
    rng = np.random.default_rng(11)
    law = Gaussian(cov=Sigma)
    w = rng.standard_normal((n_pairs, d))
    xs = [law.sample(rng, (n_pairs, Ls[-1]))]
    xq = law.sample(rng, (n_pairs, n_q))
    xs += [law.sample(rng, (n_pairs, Ls[-1])) for _ in range(n_draws - 1)]
    items = [(s * w[i], i) for i in range(n_pairs) for s in (1.0, -1.0)]  # antithetic pairs
    n_items = len(items) * n_q
    gU_inf, gv_inf = np.zeros((d + 1, d + 1)), np.zeros(d + 1)
    for wi, i in items:
        Gamma = np.block([[Sigma, (Sigma @ wi)[:, None]], [(wi @ Sigma)[None, :], np.array([[wi @ Sigma @ wi]])]])
        for k in range(n_q):
            gU, gv = naive_limit_gradients(U, v, Gamma, np.append(xq[i, k], 0.0), wi @ xq[i, k])
            gU_inf += gU / n_items
            gv_inf += gv / n_items
    assert inf_sq == pytest.approx(np.sum(gU_inf**2) + np.sum(gv_inf**2), rel=1e-10)
    for r, x in enumerate(xs):
        for j, L in enumerate(Ls):
            gU_L, gv_L = np.zeros((d + 1, d + 1)), np.zeros(d + 1)
            for wi, i in items:
                Z = np.column_stack([x[i, :L], x[i, :L] @ wi])
                for k in range(n_q):
                    gU, gv = naive_item_gradients(U, v, Z, np.append(xq[i, k], 0.0), wi @ xq[i, k])
                    gU_L += gU / n_items
                    gv_L += gv / n_items
            expected = np.sum((gU_L - gU_inf) ** 2) + np.sum((gv_L - gv_inf) ** 2)
            assert gap_sq[r, j] == pytest.approx(expected, rel=1e-9, abs=1e-15)
    np.testing.assert_array_equal(tasks.w[0::2], w)


def test_gradient_log_bound_constant_matches_a_per_item_loop():
    d = 3
    Sigma = covariance.from_spec("isotropic:2", d)
    U, v = concentration.gradient_parameters(Sigma, 0.3)
    tasks = icl.make_tasks(np.random.default_rng(3), d, 3, 2, 4, Gaussian(cov=Sigma))
    log_c, log_K, log_K_sharp, max_quad = concentration.gradient_log_bound_constant(tasks, U, v)
    KP, Ks, Kf = [], [], []
    for n in range(tasks.n_tasks):
        w = tasks.w[n]
        G = np.block([[Sigma, (Sigma @ w)[:, None]], [(w @ Sigma)[None, :], np.array([[w @ Sigma @ w]])]])
        lam = np.max(np.linalg.eigvalsh(G))
        for k in range(tasks.n_queries):
            zq = tasks.z_q[n, k]
            a = U @ zq
            m = G @ a
            r = v @ m - tasks.y_q[n, k]
            K = math.exp(4 * lam * a @ a)
            P = np.trace(G) * ((abs(r) + np.linalg.norm(v) * np.linalg.norm(m)) ** 2
                               + (zq @ zq) * (v @ v) * (lam * abs(r) + np.linalg.norm(G @ v)) ** 2)
            KP.append(K * P)
            Kf.append(K)
            Ks.append(math.exp(a @ G @ a))
    assert math.exp(log_c) == pytest.approx(np.mean(KP), rel=1e-10)
    assert math.exp(log_K) == pytest.approx(np.mean(Kf), rel=1e-10)
    assert math.exp(log_K_sharp) == pytest.approx(np.mean(Ks), rel=1e-10)
    assert math.exp(max_quad) == pytest.approx(np.max(Ks), rel=1e-10)
    # the parameters sit on the balanced manifold, along the Bayes direction
    assert np.linalg.norm(U) == pytest.approx(0.3) and np.linalg.norm(v) == pytest.approx(0.3)


# --------------------------------------------------------------------------- (a) tails


@pytest.mark.parametrize("d", [1, 2, 3, 5])
def test_clt_monte_carlo_matches_the_chi_square_tail(d):
    """C = c I_d: ||N(0, C)||^2 = c chi^2_d, whose tail has a closed form."""
    c, n = 1.7, 200_000
    C = np.broadcast_to(c * np.eye(d), (2, d, d))
    levels = np.array([0.1, 0.01, 0.001])
    radii = concentration.clt_radii(np.random.default_rng(5), C, levels, n)
    exact_at_radii = np.array([[chi2_sf(r**2 / c, d) for r in row] for row in radii])
    # the Monte-Carlo quantiles sit where the exact tail equals the level (binomial tolerance)
    rtol = 5 * np.sqrt(1 / (n * levels)).max()
    np.testing.assert_allclose(exact_at_radii, levels[None].repeat(2, 0), atol=0, rtol=rtol)
    fixed = np.array([[1.0, 2.5, 4.0], [0.5, 3.0, 5.0]]) * np.sqrt(c * d)
    mc = concentration.clt_tail(np.random.default_rng(6), C, fixed, n)
    exact = np.array([[chi2_sf(r**2 / c, d) for r in row] for row in fixed])
    se = np.sqrt(exact * (1 - exact) / n)
    assert np.all(np.abs(mc - exact) <= 5 * se + 1e-12)


def test_tail_cell_counts_match_direct_counting():
    """A whole cell's tail outputs recomputed from its documented draws with the per-L operator."""
    config = TINY
    out = run_cell(c2.EXPERIMENT, config, CELL0)
    rng_tail, _, _ = cell_rng(c2.NAME, CELL0, config["root_seed"]).spawn(3)
    d, U_norm, sigma = 2, 0.5, config["sigma"]
    law = Gaussian(cov=sigma**2, D=d)
    U = rng_tail.standard_normal((d, d))
    U *= U_norm / np.linalg.norm(U)
    q = law.sample(rng_tail, config["tail_queries"])
    t = out["tail_threshold"]                             # (query, L, level)
    Ls = np.array(config["L"])
    np.testing.assert_allclose(t * np.sqrt(Ls)[None, :, None], np.repeat(t[:, :1] * np.sqrt(Ls[0]), len(Ls), 1))
    counts = np.zeros_like(t)
    for i in range(config["tail_queries"]):
        n_left = config["tail_prompts"]
        while n_left:
            m = min(config["prompt_chunk"], n_left)
            Z = law.sample(rng_tail, (m, Ls[-1]))
            for p in range(m):
                for j, L in enumerate(Ls):
                    err = np.linalg.norm(softmax_attention(Z[p, :L], U, np.eye(d), q[i]) - sigma**2 * U @ q[i])
                    counts[i, j] += err > t[i, j]
            n_left -= m
    np.testing.assert_array_equal(out["tail_count"], counts)
    assert out["tail_n"] == config["tail_prompts"]
    # the stored bound is the documented formula with the stored constants
    K = np.exp(4 * sigma**2 * np.sum((q @ U.T) ** 2, axis=-1))
    np.testing.assert_allclose(out["tail_K"], K)
    c1, c2_ = math.exp(config["tail_log_c1_per_d"] * d), config["tail_c2"] / sigma**2
    assert (out["tail_c1_eff"], out["tail_c2_eff"]) == (pytest.approx(c1), pytest.approx(c2_))
    np.testing.assert_allclose(out["tail_bound"], c1 * np.exp(-c2_ * Ls[None, :, None] * t**2 / K[:, None, None]))


def test_bound_constants_scale_the_bounds_as_documented():
    base = run_cell(c2.EXPERIMENT, TINY, CELL0)
    other = c2.EXPERIMENT.configure(profile=None, values={
        **TINY, "tail_log_c1_per_d": TINY["tail_log_c1_per_d"] + math.log(3.0) / 2, "grad_c": 10.0})
    other = run_cell(c2.EXPERIMENT, other, CELL0)  # d = 2: c1 three times larger
    np.testing.assert_allclose(other["tail_bound"], 3.0 * base["tail_bound"])
    np.testing.assert_allclose(other["grad_log_bound"], base["grad_log_bound"] + np.log(10.0))
    np.testing.assert_array_equal(other["tail_count"], base["tail_count"])  # draws unchanged


# --------------------------------------------------------------------------- (c) trajectory part

TRAJ_TAG = "c2_concentration/trajectory"


@pytest.mark.parametrize("setting", c2.SETTINGS)
def test_trajectory_cell_is_the_gap_trajectory_of_its_keyed_generator(setting):
    """One (setting, traj_seed) cell: gradient_gap.gradient_gap_trajectory on Sigma_setting at d =
    traj_d, drawing from cell_rng("c2_concentration/trajectory", {setting, traj_seed}, root_seed)."""
    out = run_cell(c2.EXPERIMENT, TINY, {"setting": setting, "traj_seed": 1}, part="trajectory")
    Sigma = np.eye(3) if setting == "isotropic" else np.diag([2.0, 1.0, 0.5])
    rng = cell_rng(TRAJ_TAG, {"setting": setting, "traj_seed": 1}, TINY["root_seed"])
    res = gradient_gap_trajectory(rng, Sigma, [4, 8, 16], n_pairs=2, n_queries=2, n_replicates=1, lr=0.01, n_steps=20,
                                  ckpt_every=10, x_law="gaussian")
    for var, key in (("traj_g", "g"), ("traj_g_risk", "g_risk"), ("traj_risk_inf", "risk_inf"),
                     ("traj_dist_bayes", "dist_bayes"), ("traj_logit_factor", "logit_factor")):
        np.testing.assert_array_equal(out[var], res[key], err_msg=var)
    np.testing.assert_array_equal(out["traj_U_norm"], np.linalg.norm(res["U_inf"], axis=(-2, -1)))
    assert out["traj_g"].shape == (3, 3)                                   # (L, t): t = 0, 10, 20
    # another trajectory seed is another task draw
    other = run_cell(c2.EXPERIMENT, TINY, {"setting": setting, "traj_seed": 0}, part="trajectory")
    assert not np.array_equal(other["traj_g"], out["traj_g"])


def test_trajectory_constants_per_setting():
    """tr(Sigma^-2) and the concentration constant: +inf for I_3 (tr = 3 <= 4), the closed form
    (1 - 2 tr^-1/2)^(-d/2) for diag(2, 1, 0.5) (tr = 5.25)."""
    iso = run_cell(c2.EXPERIMENT, TINY, {"setting": "isotropic"}, part="trajectory_constants")
    aniso = run_cell(c2.EXPERIMENT, TINY, {"setting": "anisotropic"}, part="trajectory_constants")
    assert iso["traj_trace_inv_sq"] == 3.0 and np.isposinf(iso["traj_concentration_constant"])
    assert aniso["traj_trace_inv_sq"] == pytest.approx(5.25, rel=1e-14)
    assert aniso["traj_concentration_constant"] == pytest.approx((1 - 2 / math.sqrt(5.25)) ** -1.5, rel=1e-12)
    assert aniso["traj_concentration_constant"] == concentration_constant(np.diag([2.0, 1.0, 0.5]))


def test_each_part_receives_only_its_own_parameters():
    """A change of a tail or gradient parameter keeps every trajectory cell, and the other way round."""
    exp = c2.EXPERIMENT
    traj = exp.cell_inputs(TINY, {"setting": "isotropic", "traj_seed": 0}, "trajectory")
    assert set(traj) == {"L", "root_seed", "traj_d", "traj_pairs", "traj_queries", "traj_replicates", "traj_lr",
                         "traj_steps", "traj_ckpt_every", "amplification_eps"}
    main = set(exp.cell_inputs(TINY, CELL0))
    assert main == {"L", "root_seed", "sigma", "tail_queries", "tail_prompts", "tail_levels", "prompt_chunk",
                    "clt_draws", "tail_log_c1_per_d", "tail_c2", "grad_scales", "grad_pairs", "grad_queries",
                    "grad_draws", "grad_c"}
    assert exp.cell_inputs(TINY, {"setting": "isotropic"}, "trajectory_constants") == {"traj_d": 3}


def test_trajectory_cells_are_kept_and_computed_as_their_own_tasks(tmp_path):
    """Every part's cells go to the cell store; each (setting, traj_seed) is one dask task that
    computes that cell alone."""
    from dask.callbacks import Callback

    n_main = len(TINY["d"]) * len(TINY["U_norm"]) * TINY["n_seeds"]
    n_traj = len(c2.SETTINGS) * TINY["traj_seeds"]
    n_const = len(c2.SETTINGS)
    assert (n_main, n_traj) == (1, 4) and c2.EXPERIMENT.n_cells(TINY) == n_main + n_traj + n_const
    with raise_if_dask_computes():
        lazy = build(c2.EXPERIMENT, TINY, store=CellStore(tmp_path, c2.EXPERIMENT, TINY))
    keys = [str(k) for k in lazy.__dask_graph__()]
    traj_tasks = sorted(k for k in keys if k.startswith(f"{TRAJ_TAG}-block-"))
    assert len(traj_tasks) == n_traj
    assert len([k for k in keys if k.startswith(f"{TRAJ_TAG}_constants-block-")]) == n_const
    assert len([k for k in keys if k.startswith(f"{c2.NAME}-block-")]) == n_main
    assert lazy.traj_g.data.chunks[:2] == ((1, 1), (1, 1))               # (setting, traj_seed): a cell a chunk

    ran = {}

    class Seen(Callback):
        def _posttask(self, key, result, dsk, state, worker_id):
            if str(key).startswith(f"{TRAJ_TAG}-block-"):
                ran[str(key)] = result["traj_g"].shape

    with Seen():
        ds = lazy.compute(scheduler="threads")
    assert sorted(ran) == traj_tasks and set(ran.values()) == {(1, 1, 3, 3)}   # one cell per task

    store = CellStore(tmp_path, c2.EXPERIMENT, TINY)
    assert store.count() == n_main + n_traj + n_const
    assert len(list(tmp_path.glob("cell_*.npz"))) == n_main + n_traj + n_const
    for setting in c2.SETTINGS:
        for seed in range(TINY["traj_seeds"]):
            kept = store.load({"setting": setting, "traj_seed": seed}, "trajectory")
            np.testing.assert_array_equal(kept["traj_g"], ds.traj_g.sel(setting=setting, traj_seed=seed).values)
    # served from the store: a rebuild recomputes no cell (no kept file is written again)
    files = {path.name: (path.stat().st_ino, path.stat().st_mtime_ns) for path in tmp_path.glob("cell_*.npz")}
    again = build(c2.EXPERIMENT, TINY, store=store).compute(scheduler="threads")
    xr.testing.assert_identical(again.drop_attrs(deep=False), ds.drop_attrs(deep=False))
    assert {path.name: (path.stat().st_ino, path.stat().st_mtime_ns) for path in tmp_path.glob("cell_*.npz")} == files


# --------------------------------------------------------------------------- analysis rules


def test_tail_test_rules_against_closed_form_clopper_pearson():
    """count = n: CP lower end (alpha/2)^(1/n); count = 0: never violated, looseness undefined."""
    n, alpha = 50, 0.05
    dims = ("d", "U_norm", "seed", "query", "L", "level")
    shape = (1, 1, 1, 1, 1, 3)
    coords = {"d": [2], "U_norm": [0.5], "seed": [0], "query": [0], "L": [64], "level": [0.1, 0.01, 0.001]}
    lo_full = (alpha / 2) ** (1 / n)
    ds = xr.Dataset({
        "tail_count": (dims, np.array([n, 0, 5.0]).reshape(shape)),
        "tail_n": (("d", "U_norm", "seed"), np.full((1, 1, 1), float(n))),
        "tail_bound": (dims, np.array([lo_full * 0.999, 1e-9, 0.5]).reshape(shape)),
        "tail_clt": (dims, np.array([0.1, 0.01, 0.001]).reshape(shape)),
        "tail_threshold": (dims, np.ones(shape)),
        "tail_c1_eff": (("d", "U_norm", "seed"), np.full((1, 1, 1), 4.0)),
    }, coords=coords)
    tt = c2_analysis.tail_tests(ds, alpha=alpha)
    assert float(tt.ci_low.isel(level=0).squeeze()) == pytest.approx(lo_full, rel=1e-10)
    assert float(tt.ci_high.isel(level=1).squeeze()) == pytest.approx(1 - (alpha / 2) ** (1 / n), rel=1e-10)
    assert tt.violated.values.ravel().tolist() == [True, False, False]
    assert np.isnan(tt.looseness.isel(level=1)).all()
    assert float(tt.looseness.isel(level=2).squeeze()) == pytest.approx(0.5 / 0.1)


# --------------------------------------------------------------------------- end to end


@pytest.fixture(scope="module")
def quick_file(tmp_path_factory):
    config = c2.EXPERIMENT.configure("quick")
    with raise_if_dask_computes():
        lazy = build(c2.EXPERIMENT, config)  # lazy: nothing computed yet
    ds, wall, label = compute(lazy, scheduler="threads", progress=False)
    ds.attrs.update(wall_seconds=wall, scheduler=label)
    return save(ds, tmp_path_factory.mktemp("c2") / "c2_concentration.nc")


@pytest.fixture(scope="module")
def quick_ds(quick_file):
    """The saved file, opened by name-or-path, loaded into memory and closed (no HDF5 handle
    stays open while later tests compute in threads)."""
    with open_results(quick_file) as ds:
        return ds.load()


def test_quick_profile_end_to_end(quick_file, quick_ds):
    ds = quick_ds
    cfg = c2.EXPERIMENT.configure("quick")
    assert ds.attrs["experiment"] == c2.NAME and ds.attrs["profile"] == "quick" and ds.sizes["L"] == len(cfg["L"])
    assert ds.attrs["analysis"] == "sfxlin.analysis.c2" and c2.EXPERIMENT.short == "c2"
    assert ds.attrs["title"] == "C2: non-asymptotic concentration of outputs and gradients"
    assert ds.sizes["t"] == cfg["traj_steps"] // cfg["traj_ckpt_every"] + 1
    assert ds.sizes["traj_seed"] == cfg["traj_seeds"] and ds.setting.values.tolist() == list(c2.SETTINGS)
    assert ds.traj_trace_inv_sq.dims == ("setting",) and ds.traj_concentration_constant.dims == ("setting",)
    for name, var in ds.data_vars.items():
        assert {"long_name", "description"} <= set(var.attrs), name
    # counts are integers within [0, n] and decrease with the threshold (smaller level, larger t)
    counts = ds.tail_count.values
    assert np.all(counts == np.round(counts)) and np.all((counts >= 0) & (counts <= cfg["tail_prompts"]))
    assert np.all(np.diff(counts, axis=-1) <= 0)
    rows = c2_analysis.verdicts(ds)
    assert [r.id for r in rows] == [c.id for c in c2_analysis.CRITERIA]
    # the quick profile is a smoke test: its calibrated criteria PASS, the others are NOT JUDGED, with the reason
    not_judged = {c.id for c in c2_analysis.CRITERIA if isinstance(c.quick, NotJudged)}
    assert {r.id for r in rows if r.verdict == NOT_JUDGED} == not_judged == {"C2-tail-clt", "C2-traj-uniform"}
    assert all(r.verdict == PASS for r in rows if r.id not in not_judged), format_table(rows)
    table = ds.sfx.fit_table()
    for part in ("(a) output tails", "(b) gradient gap", "(c) gradient gap g_L(t)", "ASSUMED"):
        assert part in table
    assert "criterion" in format_table(rows)
    path = c2_analysis.figure(ds, quick_file.with_suffix(".png"))
    assert path.stat().st_size > 10_000


def test_bound_parameters_travel_in_attrs(quick_ds):
    ds = quick_ds
    config = json.loads(ds.attrs["config"])
    for key in ("tail_log_c1_per_d", "tail_c2", "grad_c"):
        assert config[key] == c2.EXPERIMENT.configure("quick")[key]
    assert "OUR assumption" in ds.tail_bound.attrs["description"]
    assert "OUR assumption" in ds.grad_log_bound.attrs["description"]
    d = ds.d.broadcast_like(ds.tail_c1_eff)
    np.testing.assert_allclose(ds.tail_c1_eff, np.exp(config["tail_log_c1_per_d"] * d))
    np.testing.assert_allclose(ds.tail_c2_eff, config["tail_c2"] / config["sigma"] ** 2)
    criteria = json.loads(ds.attrs["criteria"])
    assert criteria == [c.to_dict() for c in c2_analysis.CRITERIA]
    assert all(c["reference"] and c["reason"] and c["profile"] == "paper" for c in criteria)


def test_rerun_from_attrs_reproduces_a_cell(quick_ds):
    ds = quick_ds
    again = build(c2.EXPERIMENT, json.loads(ds.attrs["config"]))
    main = again.isel(d=[1], U_norm=[0], seed=[1])[["tail_count", "grad_gap_sq"]].compute(scheduler="synchronous")
    xr.testing.assert_equal(main.tail_count, ds.tail_count.isel(d=[1], U_norm=[0], seed=[1]))
    xr.testing.assert_equal(main.grad_gap_sq, ds.grad_gap_sq.isel(d=[1], U_norm=[0], seed=[1]))
    traj = again.traj_g.isel(setting=[1], traj_seed=[0]).compute(scheduler="synchronous")
    xr.testing.assert_equal(traj, ds.traj_g.isel(setting=[1], traj_seed=[0]))


BAD = [
    ({"L": [8, 16]}, r"^L: needs at least 3 values"),
    ({"L": [16, 8, 32]}, r"^L: must be strictly increasing"),
    ({"tail_levels": [0.01, 0.1]}, r"^tail_levels: must be strictly decreasing"),
    ({"tail_levels": [0.1, 0.0]}, r"^tail_levels: must be > 0"),
    ({"tail_levels": [1.0, 0.1]}, r"^tail_levels: must be < 1"),
    ({"clt_draws": 100}, r"^clt_draws: 100 is too few for the tail level 0.001"),
    ({"tail_c2": 0.0}, r"^tail_c2: must be > 0"),
    ({"traj_steps": 105}, r"^traj_steps: 105 must be a multiple of traj_ckpt_every = 20"),
    ({"traj_steps": -20}, r"^traj_steps: must be >= 0"),
    ({"grad_draws": 0}, r"^grad_draws: must be >= 1"),
    ({"traj_seeds": 0}, r"^traj_seeds: must be >= 1"),
    ({"n_seeds": 1.5}, r"^n_seeds: expected an integer"),
    ({"d": [2, 2]}, r"^d: repeats the value 2:"),
    ({"grad_scales": [1.0, 1.0]}, r"^grad_scales: repeats the value 1.0:"),
]


@pytest.mark.parametrize("bad, message", BAD)
def test_bad_configuration_is_refused(bad, message):
    with pytest.raises(ValueError, match=message):
        c2.EXPERIMENT.configure("quick", values=bad)
    with pytest.raises(ValueError, match=message):                      # values given whole
        c2.EXPERIMENT.configure(profile=None, values={**c2.EXPERIMENT.configure("quick"), **bad})


@pytest.mark.parametrize("override, message", [
    ("L=8,16", r"^--set L: needs at least 3 values"),
    ("tail_levels=0.1,0", r"^--set tail_levels: must be > 0"),
    ("clt_draws=100", r"^clt_draws: 100 is too few"),
    ("traj_steps=105", r"^traj_steps: 105 must be a multiple"),
    ("traj_ckpt_every=30", r"^traj_steps: 100 must be a multiple of traj_ckpt_every = 30"),
])
def test_bad_override_is_refused(override, message):
    with pytest.raises(ValueError, match=message):
        c2.EXPERIMENT.configure("quick", overrides=[override])


def test_profiles_are_typed_and_valid():
    for profile in ("quick", "paper"):
        config = c2.EXPERIMENT.configure(profile)
        assert isinstance(config["L"], tuple) and all(type(L) is int for L in config["L"])
        assert type(config["traj_lr"]) is float and type(config["traj_seeds"]) is int
    assert c2.EXPERIMENT.profiles == ("quick", "paper")


# --------------------------------------------------------------------------- design-following SEs, fast measures


def _noisy_c2(seed=0):
    """The synthetic c2 file with 20% lognormal noise on every gap (so the fits have residuals and
    the units differ), four trajectory seeds and heavy-ish noise along t."""
    import synthetic

    ds = synthetic.c2().copy(deep=True)
    rng = np.random.default_rng(seed)
    ds["grad_gap_sq"] = ds.grad_gap_sq * np.exp(0.2 * rng.standard_normal(ds.grad_gap_sq.shape))
    g = ds.traj_g.isel(traj_seed=[0, 1, 0, 1]).assign_coords(traj_seed=[0, 1, 2, 3])
    ds = ds.drop_dims("traj_seed").assign(
        traj_g=g * np.exp(0.2 * rng.standard_normal(g.shape)),
        traj_g_risk=0.5 * g * np.exp(0.2 * rng.standard_normal(g.shape)),
        traj_risk_inf=(("setting", "traj_seed", "t"), np.ones((2, 4, g.sizes["t"]))),
        traj_dist_bayes=(("setting", "traj_seed", "t"), np.ones((2, 4, g.sizes["t"]))))
    ds["tail_count"] = ds.tail_count + rng.integers(0, 30, ds.tail_count.shape)
    return ds


def test_trajectory_exponents_are_clustered_over_trajectory_seeds():
    from sfxlin.analysis.fits import loglog_slope

    ds = _noisy_c2()
    tr = c2_analysis.trajectory_exponents(ds)
    assert tr.n_units.item() == 4 and tr.cov_type.item() == "cluster"
    pooled = np.sqrt((ds.traj_g**2).mean("traj_seed"))
    # point estimates: the slopes of the seed-pooled RMS gap, as before
    np.testing.assert_allclose(tr.fixed, loglog_slope(pooled.isel(t=0), "L").slope, rtol=0, atol=1e-12)
    np.testing.assert_allclose(tr.uniform, loglog_slope(pooled.max("t"), "L").slope, rtol=0, atol=1e-12)
    # SEs: log sqrt(mean g^2) = log(mean g^2) / 2, clustered over the trajectory seeds by statsmodels; the sup's
    # linearisation reads g^2 at the pooled curve's argmax (its seed mean is the squared sup)
    g2 = ds.traj_g**2
    want_fixed = loglog_slope(g2.isel(t=0), "L", units="traj_seed").slope_se / 2
    np.testing.assert_allclose(tr.fixed_se, want_fixed, rtol=1e-9)
    t_star = pooled.argmax("t")
    at_sup = np.array([[g2.sel(setting=s, L=Lv).isel(t=int(t_star.sel(setting=s, L=Lv))).values
                        for Lv in ds.L.values] for s in ds.setting.values])          # (setting, L, traj_seed)
    np.testing.assert_allclose((at_sup.mean(axis=-1)), pooled.max("t").values ** 2, rtol=1e-12)
    want_unif = loglog_slope(xr.DataArray(at_sup, dims=("setting", "L", "traj_seed"), coords={"L": ds.L}), "L",
                             units="traj_seed").slope_se / 2
    np.testing.assert_allclose(tr.uniform_se, want_unif, rtol=1e-9)
    ols = c2_analysis.trajectory_exponents(ds, cov_type="nonrobust")
    np.testing.assert_allclose(ols.fixed_se, loglog_slope(pooled.isel(t=0), "L").slope_se, rtol=1e-9)
    np.testing.assert_allclose(ols.uniform, tr.uniform, rtol=1e-12)
    # one trajectory seed: the plain OLS line of that run, said so
    one = c2_analysis.trajectory_exponents(ds.isel(traj_seed=[1]))
    assert one.cov_type.item() == "nonrobust" and one.n_units.item() == 1
    np.testing.assert_allclose(one.fixed_se, loglog_slope(ds.traj_g.isel(traj_seed=1, t=0), "L").slope_se, rtol=1e-9)


def test_gradient_slopes_are_clustered_over_seeds():
    from sfxlin.analysis.fits import loglog_slope

    ds = _noisy_c2()
    fit = c2_analysis.gradient_slopes(ds)
    want = loglog_slope(ds.grad_gap_sq, "L", units="seed", test_exponent=-1.0)
    for var in ("slope", "slope_se", "slope_ci_low", "t_test_pvalue"):
        np.testing.assert_allclose(fit[var], want[var].transpose(*fit[var].dims), rtol=1e-9, err_msg=var)
    assert fit.n_units.item() == 2 and fit.units.item() == "seed"
    ols = c2_analysis.gradient_slopes(ds, cov_type="nonrobust")
    np.testing.assert_allclose(ols.slope_se, loglog_slope(ds.grad_gap_sq.mean("seed"), "L").slope_se.transpose(
        *ols.slope_se.dims), rtol=1e-9)
    tables = c2_analysis.fit_tables(ds)
    np.testing.assert_array_equal(tables["gradients"].slope_se_ols.values, ols.slope_se.values)
    assert "cluster-robust over the 2 seeds" in tables["gradients"].attrs["notes"]
    assert "cluster-robust over the 4 trajectory seeds" in tables["trajectory"].attrs["notes"]


def test_the_measures_are_the_tables_functions():
    # the measures read what the tables show: the tail tests, the CLT ratios, the gradient summary and slopes,
    # the trajectory exponents
    ds = _noisy_c2()
    m = c2_analysis.measures(ds)
    assert int(m["C2-tail-violations"]) == int(c2_analysis.tail_tests(ds).violated.sum()) > 0
    ratio = c2_analysis.clt_ratio(ds).ratio
    xr.testing.assert_identical(m["C2-tail-clt"], ratio.sel(level=ds.level[ds.level >= 1e-3]))
    assert int(m["C2-grad-violations"]) == int(c2_analysis.gradient_summary(ds).violated.sum())
    xr.testing.assert_identical(m["C2-grad-slopes"], c2_analysis.gradient_slopes(ds).slope)
    tr = c2_analysis.trajectory_exponents(ds)
    xr.testing.assert_identical(m["C2-traj-fixed"], tr.fixed)
    xr.testing.assert_identical(m["C2-traj-uniform"], tr.uniform)
    # the Clopper-Pearson ends computed once per distinct (count, n) are statsmodels' own, value by value
    from statsmodels.stats.proportion import proportion_confint

    count, n = ds.tail_count.values, np.broadcast_to(4096.0, ds.tail_count.shape)
    for got, want in zip(c2_analysis.clopper_pearson(count, n), proportion_confint(count, n, alpha=0.05, method="beta")):
        np.testing.assert_array_equal(got, want)


def test_robustness_resamples_seeds_and_trajectory_seeds():
    ds = _noisy_c2()
    assert c2_analysis.CRITERIA.units == ("seed", "traj_seed")
    rows = {r.id: r for r in c2_analysis.verdicts(ds, resamples=20)}
    for r in rows.values():
        if r.verdict in ("PASS", "FAIL"):
            assert r.robustness is not None and 0.0 <= r.robustness <= 1.0
    # a file with one of each unit: no resample, said so
    one = {r.id: r for r in c2_analysis.verdicts(ds.isel(seed=[0], traj_seed=[0]), resamples=5)}
    assert all(r.robustness_note == "one independent unit: no resample"
               for r in one.values() if r.verdict in ("PASS", "FAIL"))


def test_the_tail_tests_follow_the_design():
    """Monte Carlo SE against an exact value (issue #38): at U_norm = 1e-6 the softmax weights are uniform to
    1e-6, so f_L is the mean of L i.i.d. N(0, I_d) tokens and the exact probability that a prompt exceeds a
    stored threshold t is chi2.sf(L t^2, d). Each tail test counts the exceedances of tail_n independent
    prompts (each query draws its own): the count is Binomial(n, p), which the analysis' Clopper-Pearson
    interval assumes. At L = 32 and level 0.1 (n p of about 102), d = 2, 3 x 20 seeds x 5 queries: K = 200
    z-scores (count - n p) / sqrt(n p (1 - p)), normal to the binomial's skew; the share inside the central
    50%, the signs and the mean of z^2 pass with probability >= 0.9952 for binomial counts; the
    Clopper-Pearson intervals (coverage >= 0.95 each) cover the exact p in at least the 0.1% quantile of
    Binomial(200, 0.95) of the tests."""
    from scipy import stats

    from sfxlin.testing.calibration import assert_se_follows_design

    config = c2.EXPERIMENT.configure("quick", [
        "d=2,3", "U_norm=1e-6", "L=8,16,32", "n_seeds=20", "tail_queries=5", "tail_prompts=1024", "grad_pairs=1",
        "grad_queries=1", "grad_draws=2", "traj_seeds=1", "traj_steps=20", "traj_ckpt_every=20", "traj_pairs=1",
        "traj_replicates=1"])
    ds = build(c2.EXPERIMENT, config).compute(scheduler="synchronous")
    one = ds.sel(L=32, level=0.1)
    n = float(ds.tail_n.max())
    exact = stats.chi2.sf(32 * one.tail_threshold**2, one.d.broadcast_like(one.tail_threshold))   # sigma = 1
    assert_se_follows_design(((one.tail_count - n * exact) / np.sqrt(n * exact * (1 - exact))).values, None,
                             "c2 tail counts")
    tt = c2_analysis.tail_tests(ds).sel(L=32, level=0.1)
    covered = int(((tt.ci_low <= exact) & (exact <= tt.ci_high)).sum())
    assert covered >= stats.binom.ppf(0.001, tt.ci_low.size, 0.95), covered
