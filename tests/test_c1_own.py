"""c1_own (bring your own head): cells against independent computations, the bad-file messages,
window sampling on an AR(1) file whose integrated factor is the closed-form series of docs/models.md, the analysis."""
from __future__ import annotations

import numpy as np
import pytest
import xarray as xr

from sfxlin.analysis import c1_own as analysis
from sfxlin.cli import main
from sfxlin.dependence import batch_means, influence, integrated_factor
from sfxlin.engine.execution import compute
from sfxlin.engine.sweep import build, cell_rng, run_cell
from sfxlin.pipelines import c1_own

EXP = c1_own.EXPERIMENT
D = 3


def _save(path, array):
    np.save(path, np.asarray(array, dtype=float))
    return str(path)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A small skewed token file and a head in projection form (d_head = 2)."""
    root = tmp_path_factory.mktemp("own")
    rng = np.random.default_rng(7)
    Z = rng.standard_normal((400, D))
    Z[:, 0] = np.exp(0.5 * Z[:, 0])  # skewed: the Gaussian surrogate has a bias
    return {"root": root, "Z": Z, "tokens": _save(root / "tokens.npy", Z),
            "W_Q": _save(root / "wq.npy", 0.4 * rng.standard_normal((2, D))),
            "W_K": _save(root / "wk.npy", 0.4 * rng.standard_normal((2, D))),
            "W_V": _save(root / "wv.npy", rng.standard_normal((2, D))),
            "U": _save(root / "u.npy", 0.2 * rng.standard_normal((D, D)))}


def _config(files, *extra, profile="quick"):
    return EXP.configure(profile, [f"tokens={files['tokens']}", f"W_Q={files['W_Q']}", f"W_K={files['W_K']}",
                                   f"W_V={files['W_V']}", "logit_scale=1/sqrt(d_head)", "n_queries=5",
                                   "L=4,16,64", "n_prompts=5", "prompt_chunk=2", *extra])


def _softmax_mean(Z, U, q):
    """Naive softmax attention of one query over one prompt (no shift tricks beyond the max)."""
    s = np.array([z @ U @ q for z in Z])
    w = np.exp(s - s.max())
    return (w[:, None] * Z).sum(axis=0) / w.sum()


def _exact_limit(Z, a):
    """The empirical tilted mean in closed form: a softmax over the whole file."""
    s = Z @ a
    w = np.exp(s - s.max())
    return w @ Z / w.sum()


@pytest.mark.parametrize("sampling", ["iid", "window"])
def test_a_prompt_cell_against_a_naive_per_prompt_loop(files, sampling):
    config = _config(files, f"sampling={sampling}")
    cell = {"sampling": sampling, "seed": 1}
    out = run_cell(EXP, config, cell)
    Z = files["Z"]
    W_Q, W_K, W_V = (np.load(files[k]) for k in ("W_Q", "W_K", "W_V"))
    U = W_K.T @ W_Q / np.sqrt(2)  # the logit (W_K z).(W_Q q) / sqrt(d_head)
    s = c1_own.setup(config)
    np.testing.assert_allclose(s.U, U, rtol=1e-13)
    idx = c1_own.prompt_indices(cell_rng(c1_own.NAME, cell, config["root_seed"]), sampling, len(Z), 5, 64)
    if sampling == "window":
        assert np.all(np.diff(idx, axis=1) == 1)  # contiguous windows of the file
    for p in range(5):
        for j, L in enumerate((4, 16, 64)):
            err = err_g = 0.0
            for q in s.q:
                f_L = W_V @ _softmax_mean(Z[idx[p, :L]], U, q)
                f_inf = _exact_limit(Z, U @ q)
                f_g = Z.mean(axis=0) + np.cov(Z.T, bias=True) @ U @ q
                err += np.sum((f_L - W_V @ f_inf) ** 2) / len(s.q)
                err_g += np.sum((f_L - W_V @ f_g) ** 2) / len(s.q)
            np.testing.assert_allclose(out["mse"][p, j], err, rtol=1e-9)
            np.testing.assert_allclose(out["mse_gauss"][p, j], err_g, rtol=1e-9)


def test_the_exact_cell_against_closed_forms(files):
    config = _config(files)
    out = run_cell(EXP, config, {}, "exact")
    s = c1_own.setup(config)
    Z, V = files["Z"], np.load(files["W_V"])
    m, S = Z.mean(axis=0), np.cov(Z.T, bias=True)
    lim = bias = const = ratio = 0.0
    for q in s.q:
        a = s.U @ q
        e = np.exp(Z @ a - (Z @ a).max())
        f = e @ Z / e.sum()
        Y = (Z - f) @ V.T
        lim += np.sum((V @ (f - m)) ** 2)
        bias += np.sum((V @ (f - m - S @ a)) ** 2)
        const += len(Z) * np.sum(e[:, None] ** 2 * Y**2) / e.sum() ** 2  # tr V C V^T, pi_i = 1/n
        ratio += len(Z) * np.sum(e**2) / e.sum() ** 2
    Q = len(s.q)
    np.testing.assert_allclose(out["limit_sq"], lim / Q, rtol=1e-10)
    np.testing.assert_allclose(out["bias_gauss"], bias / Q, rtol=1e-8)
    np.testing.assert_allclose(out["const_sharp"], const / Q, rtol=1e-10)
    np.testing.assert_allclose(out["weight_ratio"], ratio / Q, rtol=1e-10)
    assert out["bias_gauss"] > 1e-4 * out["limit_sq"]  # skewed tokens: the surrogate is biased
    np.testing.assert_allclose(out["U_eff"], s.U)


def test_the_measured_constant_is_the_sharp_one_by_monte_carlo(files):
    """L * mse at L = 1024 against tr V C V^T: tolerance 4 SE of the unit mean plus the O(1/L) term."""
    config = EXP.configure("quick", [f"tokens={files['tokens']}", f"U={files['U']}", "n_queries=4", "L=16,128,1024",
                                     "n_prompts=150", "n_seeds=2", "prompt_chunk=50"])
    ds, _, _ = compute(build(EXP, config), scheduler="synchronous", progress=False)
    units = (1024 * ds.mse.sel(sampling="iid", L=1024)).values.ravel()
    se = units.std(ddof=1) / np.sqrt(units.size)
    const = float(ds.const_sharp)
    assert abs(units.mean() - const) < 4 * se + 0.05 * const, (units.mean(), const, se)
    assert se < 0.1 * const  # the test has power


def test_default_head_and_queries_are_shared_by_every_cell_and_documented():
    config = EXP.configure("quick")
    s = c1_own.setup(config)
    assert s.builtin and s.default_head and s.q.shape == (8, 4)
    S = s.law.cov
    U = s.U  # logit scale 1: U_norm * G / (||G|| tr(S)/D)
    np.testing.assert_allclose(np.linalg.norm(U) * np.trace(S) / 4, 0.5, rtol=1e-12)
    assert "default head" in next(v.description for v in EXP.variables if v.name == "U_eff")


def _error(config_args, message):
    with pytest.raises(ValueError, match=message):
        EXP.configure("quick", config_args)


def test_bad_files_get_one_clear_message_before_any_work(files, tmp_path):
    root = files["root"]
    Z = files["Z"].copy()
    Z[17, 1] = np.nan
    nan = _save(tmp_path / "nan.npy", Z)
    tok = f"tokens={files['tokens']}"
    _error([f"tokens={nan}"], r"tokens must be finite: 1 row\(s\) hold NaN or inf, the first is row 17")
    _error([f"tokens={_save(tmp_path / 'flat.npy', np.zeros(5))}"], r"tokens must be an \(n, D\) array")
    _error([tok, f"U={_save(tmp_path / 'u4.npy', np.eye(4))}"],
           r"U must have shape \(3, 3\) to act on the tokens \(dimension D = 3\), got \(4, 4\)")
    _error([tok, f"W_Q={files['W_Q']}"], "W_K: W_Q and W_K come together")
    _error([tok, f"U={files['U']}", f"W_Q={files['W_Q']}", f"W_K={files['W_K']}"], "give either U or the pair")
    _error([tok, f"W_Q={files['W_Q']}", f"W_K={_save(tmp_path / 'wk3.npy', np.ones((3, 3)))}"],
           r"W_K must have shape \(2, 3\)")
    _error([tok, f"V={_save(tmp_path / 'v.npy', np.ones((2, 5)))}"], r"V must have shape \(any, 3\)")
    _error([tok, f"queries={_save(tmp_path / 'q.npy', np.ones((4, 2)))}"], "queries: the query file's rows have "
                                                                           "dimension 2")
    _error([tok, "sampling=window", "L=16,64,512"], "exceeds its 400 tokens")
    _error([tok, "n_queries=401"], "n_queries: 401 distinct queries from a file of 400 tokens")
    _error([tok, "logit_scale=1/sqrt(d_head)"], "needs d_head")
    _error([tok, "logit_scale=-2"], "logit_scale must be a positive finite number")
    _error([tok, "logit_scale=big"], "logit_scale must be one of")
    (root / "w.safetensors").write_bytes(b"0")
    _error([f"U={root / 'w.safetensors'}"], "convert the tensor with")
    _error([tok, f"W_Q={files['W_Q']}", f"W_K={files['W_K']}", "d_head=3"], "d_head = 3 but W_Q has 2 rows")


def test_the_cli_refuses_a_bad_file_with_status_2(files, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["run", "c1_own", "--quiet", "--out", str(out), "--set", f"tokens={files['tokens']}",
                 "--set", f"U={files['W_Q']}"]) == 2
    assert "U must have shape (3, 3)" in capsys.readouterr().err
    assert not out.exists()


def test_logit_scale_number_and_named():
    from sfxlin.heads import parse_logit_scale

    assert parse_logit_scale("1") == 1.0 and parse_logit_scale("0.125") == 0.125
    assert parse_logit_scale("1/sqrt(d_head)", 64) == 0.125


# ----------------------------------------------------------------------------- dependent tokens
def _ar1(n, rho, d, rng):
    """Gaussian AR(1), stationary N(0, I_d): z_k = rho z_{k-1} + sqrt(1 - rho^2) eps_k."""
    from scipy.signal import lfilter

    eps = rng.standard_normal((n, d))
    eps[1:] *= np.sqrt(1 - rho**2)  # z_0 = eps_0 ~ N(0, I): stationary from the start
    return lfilter([1.0], [1.0, -rho], eps, axis=0)


def _series_factor(rho, A, H=400):
    """docs/models.md (dependent tokens): sum_h exp(rho^|h| r^2)(rho^|h| tr Sigma + rho^{2|h|} ||Sigma a||^2), Sigma = I, V = I,
    summed over the queries, over its h = 0 term."""
    r2 = np.sum(A**2, axis=1)
    h = np.arange(-H, H + 1)[:, None]
    g = np.exp(rho ** np.abs(h) * r2) * (rho ** np.abs(h) * A.shape[1] + rho ** (2 * np.abs(h)) * r2)
    return g.sum() / g[H].sum()


@pytest.mark.parametrize("rho", [0.0, 0.6])
def test_integrated_factor_of_an_ar1_file_is_the_series(rho):
    rng = np.random.default_rng(11)
    Z = _ar1(100_000, rho, 2, rng)
    A = 0.4 * rng.standard_normal((3, 2))
    f_inf = np.array([_exact_limit(Z, a) for a in A])
    tau, se, trC, B = integrated_factor(Z, A, f_inf, np.eye(2), 316)
    expect = _series_factor(rho, A)
    assert abs(tau - expect) < 4 * se + 0.03 * expect, (tau, se, expect)
    assert se < 0.1 * expect
    # the influence function has mean 0 and mean squared norm the SNIS constant
    x = influence(Z, A[0], f_inf[0], np.eye(2))
    np.testing.assert_allclose(x.mean(axis=0), 0, atol=1e-12)


def test_batch_means_of_independent_batches():
    x = np.repeat(np.arange(4.0), 5)[:, None]  # 4 batches of 5: xbar_j = j
    lrv, se, B = batch_means(x, 5)
    dev = 5 * (np.arange(4.0) - 1.5) ** 2
    assert B == 4 and np.isclose(lrv, dev.sum() / 3) and np.isclose(se, dev.std(ddof=1) / 2)
    with pytest.raises(ValueError, match="at least 2"):
        batch_means(x, 11)


@pytest.fixture(scope="module")
def ar1_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("ar1")
    Z = _ar1(40_000, 0.6, 2, np.random.default_rng(3))
    tokens = _save(root / "ar1.npy", Z)
    config = EXP.configure("quick", [f"tokens={tokens}", "sampling=iid,window", "U_norm=0.4", "n_queries=4",
                                     "L=64,128,256,512", "n_prompts=40", "n_seeds=2", "prompt_chunk=20"])
    ds, _, _ = compute(build(EXP, config), scheduler="synchronous", progress=False)
    return ds


def test_window_constant_is_tau_times_the_iid_one_and_iid_is_unchanged(ar1_run):
    ds = ar1_run
    c = analysis.constants(ds)
    assert float(ds.tau) > 2.0  # rho = 0.6: the series gives ~ (1 + rho) / (1 - rho) = 4 at small r
    for s in ("iid", "window"):
        ratio, se = float(c.ratio.sel(sampling=s)), float(c.constant_se.sel(sampling=s) / c.predicted.sel(sampling=s))
        assert abs(ratio - 1) < 4 * se + 0.1, (s, ratio, se)
    # dependence multiplies the constant: the window error is tau times the iid one
    assert float(c.constant.sel(sampling="window")) > 2 * float(c.constant.sel(sampling="iid"))


def test_analysis_on_the_ar1_run(ar1_run, tmp_path):
    ds = ar1_run
    m = analysis.measures(ds)
    assert set(m) == {c.id for c in analysis.CRITERIA}
    fits, lines = analysis.slopes(ds), analysis.unit_lines(ds)
    for s in ds.sampling.values:
        if not np.isfinite(float(lines.s.sel(sampling=s))):
            continue
        assert np.isclose(float(lines.s.sel(sampling=s)), float(fits.slope.sel(sampling=s)), rtol=1e-10)
        # the unit lines' SE is the CR1 cluster SE up to its small-sample factor
        G, n = int(lines.G), int(analysis.regime(ds).sel(sampling=s).sum())
        cr1 = np.sqrt((n * G - 1) / (n * G - 2))
        np.testing.assert_allclose(np.sqrt(float(lines.var_s.sel(sampling=s))) * cr1,
                                   float(fits.slope_se.sel(sampling=s)), rtol=1e-6)
    tables = analysis.fit_tables(ds)
    assert set(tables) == {"fits", "lstar", "law"}
    analysis.figure(ds, tmp_path / "f.png")
    assert (tmp_path / "f.png").stat().st_size > 0


def test_unit_lines_and_lstar_on_an_exact_power_law():
    """Two units 3/L and 5/L: the unit-mean line is log 4 - log L; the unit lines of the
    pseudo-observations have slope -1 and intercepts log 4 -+ 1/4, so var_c = 0.125 / 2 and var_s = 0;
    L*(0.01) = 400 inside its interval; a line that does not fall has no L*."""
    L = np.array([16.0, 64, 256])
    ds = xr.Dataset({"mse": (("sampling", "seed", "prompt", "L"), np.stack([3.0 / L, 5.0 / L])[None, None]),
                     "weight_ratio": 1.0, "tau": 1.0}, coords={"sampling": ["iid"], "L": L})
    lines = analysis.unit_lines(ds).sel(sampling="iid")
    assert float(lines.s) == pytest.approx(-1, rel=1e-12) and float(np.exp(lines.c)) == pytest.approx(4, rel=1e-12)
    assert float(lines.var_c) == pytest.approx(0.0625, rel=1e-12) and abs(float(lines.var_s)) < 1e-20
    one = analysis.lstar_of(lines, 0.01)
    assert float(one.L_star) == pytest.approx(400, rel=1e-12) and one.L_star_low <= 400 <= one.L_star_high
    assert np.isnan(float(analysis.lstar_of(lines.assign(s=0.1), 0.01).L_star))


def test_quick_profile_runs_and_is_small():
    ds, wall, _ = compute(build(EXP, EXP.configure("quick")), scheduler="synchronous", progress=False)
    assert set(ds.sampling.values) == {"iid"} and wall < 3
    rows = analysis.verdicts(ds, resamples=5)
    assert {r.id for r in rows} == {c.id for c in analysis.CRITERIA}


def test_measures_of_a_file_with_known_values():
    import synthetic

    m = analysis.measures(synthetic.c1_own())
    np.testing.assert_allclose(m["C1O-slope"], [-1, -1], rtol=1e-12)
    np.testing.assert_allclose(m["C1O-slope-interval"], [0, 0], atol=1e-12)
    np.testing.assert_allclose(m["C1O-constant"], [1, 1], rtol=1e-12)  # window: tau * const_sharp = 4
    np.testing.assert_allclose(m["C1O-Lstar"], 1, rtol=1e-10)
    np.testing.assert_allclose(m["C1O-decomposition"], 1, rtol=1e-12)
    ls = analysis.lstar(synthetic.c1_own())
    np.testing.assert_allclose(ls.L_star.values, ls.L_star_sharp.values, rtol=1e-10)
    # the surrogate: C / L + 1e-3 = eps^2 has L = C / (eps^2 - 1e-3)
    np.testing.assert_allclose(ls.L_star_surrogate.values, np.array([[2.0], [4.0]]) / (np.array([0.09, 0.01]) - 1e-3),
                               rtol=1e-10)


def test_a_query_file_is_the_query_set(files, tmp_path):
    q = files["Z"][:3] + 0.5
    config = EXP.configure("quick", [f"tokens={files['tokens']}", f"queries={_save(tmp_path / 'q.npy', q)}"])
    np.testing.assert_array_equal(c1_own.setup(config).q, q)


def test_eps_reaches_no_cell_and_batch_only_the_exact_one(files):
    config = _config(files)
    main_in = EXP.cell_inputs(config, {"sampling": "iid", "seed": 0})
    exact_in = EXP.cell_inputs(config, {}, "exact")
    assert "eps" not in main_in and "batch" not in main_in and "eps" not in exact_in and "batch" in exact_in
    assert main_in["tokens_sha256"] == exact_in["tokens_sha256"] == config.digests["tokens"]


def test_a_file_changed_after_configuring_is_refused_in_the_cell(tmp_path):
    Z = np.random.default_rng(1).standard_normal((300, 2))
    path = _save(tmp_path / "t.npy", Z)
    config = EXP.configure("quick", [f"tokens={path}", "n_queries=3"])
    _save(tmp_path / "t.npy", Z + 1.0)
    with pytest.raises(Exception, match="changed since the run was configured"):
        run_cell(EXP, config, {"sampling": "iid", "seed": 0})
