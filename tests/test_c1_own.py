"""c1_own (bring your own head): cells against independent computations, the bad-file messages,
window sampling on an AR(1) file whose integrated factor is the closed-form series of docs/models.md, the analysis."""
from __future__ import annotations

import numpy as np
import pytest
import xarray as xr

from sfxlin.analysis import c1_own as analysis
from sfxlin.cli import main
from sfxlin.dependence import batch_means, influence, integrated_factor, window_mse
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
        np.testing.assert_array_equal(idx, (idx[:, :1] + np.arange(64)) % len(Z))  # contiguous, read circularly
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


def test_the_default_heads_scale_is_in_the_tokens_own_units(tmp_path):
    """Tokens whose variances are 1, 4, 25 (mean variance s^2 = 10) and the same tokens times 3: the
    default head satisfies ||S^{1/2} U S^{1/2}||_F = s^2 ||U||_F = U_norm for S = s^2 I, so U scales as
    1 / 3^2 with the tokens and the logits z^T U q over the file are the same numbers (every test file
    elsewhere has unit-variance tokens, where a head missing the 1 / s^2 would pass)."""
    Z = np.random.default_rng(8).standard_normal((500, 3)) * np.array([1.0, 2.0, 5.0])
    setups = [c1_own.setup(EXP.configure("quick", [f"tokens={_save(tmp_path / f't{c}.npy', c * Z)}", "U_norm=0.7",
                                                   "n_queries=4"])) for c in (1, 3)]
    for s, c in zip(setups, (1, 3)):
        s2 = np.trace(np.cov(c * Z.T, bias=True)) / 3
        np.testing.assert_allclose(s2, 10 * c**2, rtol=0.15)    # the premise: not unit variance
        np.testing.assert_allclose(np.linalg.norm(s.U) * s2, 0.7, rtol=1e-12)
    np.testing.assert_allclose(setups[1].U, setups[0].U / 9, rtol=1e-12)
    logits = [s.tokens @ s.U @ s.q.T for s in setups]
    np.testing.assert_allclose(logits[1], logits[0], rtol=1e-10)


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
                     "weight_ratio": 1.0, "tau": 1.0, "n_tokens": 1e4}, coords={"sampling": ["iid"], "L": L})
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



# ----------------------------------------------------------------------------- a finite file
def _window_softmax(rows, a):
    s = rows @ a
    w = np.exp(s - s.max())
    return w @ rows / w.sum()


def _naive_window_mse(Z, A, V, L):
    """Every circular window of L tokens of Z, a softmax per window (no prefix sums), mean over starts and queries."""
    n, err = len(Z), 0.0
    for a in A:
        f = _exact_limit(Z, a)
        for s in range(n):
            err += np.sum((V @ (_window_softmax(Z[(s + np.arange(L)) % n], a) - f)) ** 2)
    return err / (n * len(A))


def test_window_mse_is_the_mean_over_every_circular_window():
    """Against a softmax per window, at every start (a file of 60 tokens); a window of the whole file has
    error 0 (to rounding); a length outside 1 .. n is refused."""
    rng = np.random.default_rng(4)
    Z = rng.standard_normal((60, 3))
    Z[:, 1] = np.exp(Z[:, 1])
    A, V = 0.6 * rng.standard_normal((3, 3)), rng.standard_normal((2, 3))
    f_inf = np.array([_exact_limit(Z, a) for a in A])
    Ls = [1, 5, 17, 59, 60]
    got = window_mse(Z, A, f_inf, V, Ls)
    np.testing.assert_allclose(got[:-1], [_naive_window_mse(Z, A, V, L) for L in Ls[:-1]], rtol=1e-10)
    assert got[-1] < 1e-28 * got[0]
    for bad in ([0, 5], [5, 61], [2.5]):
        with pytest.raises(ValueError, match="integers in 1 .. n = 60"):
            window_mse(Z, A, f_inf, V, bad)


def test_window_mse_of_an_exchangeable_file_has_the_finite_population_correction():
    """docs/own_head.md: to first order a window of an exchangeable file is a sample without replacement, so
    E L window_mse / tr C = (n - L) / (n - 1) over files (tr C the file's own SNIS constant). 400 random files
    of n = 200 i.i.d. Gaussian tokens, a small head (weight ratio ~1.05, so the O(w / L) remainder is ~1% at
    L = 8): the mean ratio over files at each L against (n - L) / (n - 1) within 4 SE + 0.03; at L = n / 2
    it is half the i.i.d. constant, not the constant."""
    rng = np.random.default_rng(12)
    n, Ls = 200, np.array([8, 50, 100, 150])
    ratios = []
    for _ in range(400):
        Z = rng.standard_normal((n, 2))
        A = 0.15 * rng.standard_normal((2, 2))
        f_inf = np.array([_exact_limit(Z, a) for a in A])
        trC = np.mean([np.mean(np.sum(influence(Z, a, f, np.eye(2)) ** 2, axis=1)) for a, f in zip(A, f_inf)])
        ratios.append(Ls * window_mse(Z, A, f_inf, np.eye(2), Ls) / trC)
    ratios = np.array(ratios)
    mean, se = ratios.mean(axis=0), ratios.std(axis=0, ddof=1) / np.sqrt(len(ratios))
    want = (n - Ls) / (n - 1)
    assert np.all(np.abs(mean - want) < 4 * se + 0.03), (mean, want, se)
    assert abs(mean[2] - 0.5) < 0.05


@pytest.fixture(scope="module")
def finite_run(tmp_path_factory):
    """A file of 2000 i.i.d. tokens, windows and i.i.d. prompts up to L = n."""
    root = tmp_path_factory.mktemp("finite")
    Z = np.random.default_rng(21).standard_normal((2000, 2))
    tokens = _save(root / "finite.npy", Z)
    config = EXP.configure("quick", [f"tokens={tokens}", "sampling=iid,window", "U_norm=0.5", "n_queries=4",
                                     "L=16,32,64,100,200,500,1000,2000", "n_prompts=60", "n_seeds=2",
                                     "prompt_chunk=20", "eps=0.3,0.1,0.03"])
    ds, _, _ = compute(build(EXP, config), scheduler="synchronous", progress=False)
    return ds, Z, config


def test_window_cells_measure_the_files_exact_window_error(finite_run):
    """The known answer of a finite file: the stored window errors' unit mean at each L against the exact
    expectation over every start (window_mse, itself checked against a softmax per window above) within 4
    SE of the 120 units; at L = n every window is the whole file: error 0 in every prompt."""
    ds, Z, config = finite_run
    s = c1_own.setup(config)
    a = s.q @ s.U.T
    exact = window_mse(Z, a, np.array([_exact_limit(Z, x) for x in a]), s.V, ds.L.values)
    np.testing.assert_allclose(ds.window_mse.values, exact, rtol=1e-9, atol=1e-30)
    w = ds.mse.sel(sampling="window").stack(unit=analysis.UNITS)
    mean, se = w.mean("unit").values[:-1], w.std("unit", ddof=1).values[:-1] / np.sqrt(w.sizes["unit"])
    assert np.all(np.abs(mean - exact[:-1]) < 4 * se), (mean, exact, se)
    assert float(w.sel(L=2000).max()) < 1e-25 * float(ds.limit_sq)


def test_the_analysis_fits_windows_only_where_the_file_is_large_and_reports_no_Lstar_beyond_it(finite_run):
    """Windows are fitted at L <= n / 20 = 100 only (the slope over every L is far steeper than -1: the
    file's finite-population correction, the issue this rule answers), the constant is read at the regime's
    last L, no L* exceeds its reach (n for iid, n / 20 for windows), and the file's L* is where the exact
    window error crosses eps^2 limit_sq."""
    ds, _, _ = finite_run
    keep = analysis.regime(ds)
    assert int(ds.L.where(keep.sel(sampling="window")).max()) == 100
    assert bool(keep.sel(sampling="iid", L=2000))                # with replacement: no finite population
    steep = analysis.loglog_slope(ds.mse.sel(sampling="window").where(ds.L >= 64), "L", units=analysis.UNITS,
                                  skipna=True)
    assert float(steep.slope) < -1.3                             # what fitting every L would report
    c = analysis.constants(ds)
    w = ds.mse.sel(sampling="window", L=100)
    np.testing.assert_allclose(float(c.constant.sel(sampling="window")), 100 * float(w.mean()), rtol=1e-12)
    np.testing.assert_allclose(float(c.file.sel(sampling="window")), 100 * float(ds.window_mse.sel(L=100)),
                               rtol=1e-12)
    ls = analysis.lstar(ds)
    far = analysis.reach(ds)
    np.testing.assert_allclose(far.values, [2000, 100])
    for v in ("L_star", "L_star_low", "L_star_high", "L_star_sharp", "L_star_gauss"):
        assert bool(((ls[v] <= far) | np.isnan(ls[v])).all()), v
    target = np.array([0.3, 0.1, 0.03]) ** 2 * float(ds.limit_sq)
    np.testing.assert_allclose(ls.L_star_file.sel(sampling="window").values,
                               analysis.window_crossing(ds.window_mse.values, ds.L.values, target), rtol=1e-12)
    assert np.all(np.isnan(ls.L_star_file.sel(sampling="iid").values))
    # the eps whose sharp L* exceeds the file: none reported for iid
    sharp = float(ds.const_sharp) / target
    assert np.all(np.isnan(ls.L_star.sel(sampling="iid").values[sharp > 2000 * 1.5]))


def test_window_crossing_on_known_curves():
    """On a power law C / L the log-log interpolation is exact (L* = C / t); a curve that reaches 0 at its
    last L (a window of the whole file) is interpolated linearly; no crossing within the L, or one at the
    first L already, is NaN."""
    L = np.array([10.0, 20, 40, 80])
    np.testing.assert_allclose(analysis.window_crossing(6.0 / L, L, [6.0 / 13, 6.0 / 55]), [13, 55], rtol=1e-12)
    curve = np.array([0.4, 0.2, 0.1, 0.0])
    np.testing.assert_allclose(analysis.window_crossing(curve, L, [0.05]), [60.0], rtol=1e-12)
    assert np.all(np.isnan(analysis.window_crossing(6.0 / L, L, [1.0, 0.01])))


@pytest.mark.slow
def test_the_constant_se_follows_the_design(tmp_path):
    """Monte Carlo SE against an exact value (issue #38): the constant L * mse at the regime's last L with its
    SE over the seed x prompt units (constants), against the file's exact window error for window prompts
    (window_mse: exact, every start) and the sharp i.i.d. constant for i.i.d. prompts (the delta method's
    remainder, O(weight_ratio / L) with a weight ratio of about 1.3, is 0.5% at L = 256, a tenth of the SE).
    A file of 20000 i.i.d. N(0, I_2) tokens, 48 runs (root_seed 1 .. 48: a head, queries and prompts each) of
    2 x 40 prompts: K = 96 z-scores, each a t with 79 dof (the units' spread: squared errors, skewed, so the
    test reads the share inside the central 50% and the signs, not z^2), which a right SE passes with
    probability >= 0.9972."""
    from sfxlin.testing.calibration import assert_se_follows_design

    tokens = _save(tmp_path / "iid.npy", np.random.default_rng(5).standard_normal((20000, 2)))
    z = []
    for root in range(1, 49):
        config = EXP.configure("quick", [f"tokens={tokens}", "sampling=iid,window", "n_queries=4", "L=64,128,256",
                                         "n_prompts=40", "n_seeds=2", "prompt_chunk=40", f"root_seed={root}"])
        c = analysis.constants(compute(build(EXP, config), scheduler="synchronous", progress=False)[0])
        z += [float(((c.constant - c.predicted) / c.constant_se).sel(sampling="iid")),
              float(((c.constant - c.file) / c.constant_se).sel(sampling="window"))]
    assert_se_follows_design(z, 79, "c1_own constant")
