"""End to end: the C2 threshold quick profile through sweep.build + execution.compute, the file
it writes (schema), its analysis (exponents, threshold regression, verdicts, figure), and the
analysis on a synthetic file with a known break."""
import json
import math

import numpy as np
import pytest
import xarray as xr

from conftest import raise_if_dask_computes
from sfxlin import covariance, icl, laws
from sfxlin.analysis import c2_threshold as analysis
from sfxlin.analysis.verdicts import FAIL, INCONCLUSIVE, NOT_JUDGED, PASS, NotJudged, format_table
from sfxlin.engine.execution import compute
from sfxlin.pipelines import c2_threshold
from sfxlin.gradient_gap import _gap_integrand, concentration_constant, gap_constant, gradient_gap
from sfxlin.engine.storage import save
from sfxlin.engine.sweep import build, run_cell
from sfxlin.training import checkpoint_steps

EXPERIMENT = c2_threshold.EXPERIMENT


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    config = EXPERIMENT.configure("quick")
    with raise_if_dask_computes():
        lazy = build(EXPERIMENT, config)
    ds, _, _ = compute(lazy, progress=False)   # records wall_seconds and scheduler in the attrs
    path = save(ds, tmp_path_factory.mktemp("c2t") / "c2_threshold.nc")
    return path, config


def test_quick_file_schema(quick):
    path, config = quick
    with xr.open_dataset(path) as ds:
        assert ds.attrs["experiment"] == "c2_threshold" and ds.attrs["profile"] == "quick"
        assert ds.attrs["analysis"] == "sfxlin.analysis.c2_threshold" and EXPERIMENT.short == "c2_threshold"
        assert ds.attrs["title"] == "C2: uniform-in-time stability and the tr(Sigma^-2) > 4 threshold"
        for key in ("profile", "config", "criteria", "git_revision", "created", "wall_seconds", "history"):
            assert key in ds.attrs
        assert json.loads(ds.attrs["config"]) == json.loads(config.to_json())
        for name, var in ds.data_vars.items():
            assert {"long_name", "description"} <= set(var.attrs), name
        for dim in ds.dims:   # every dim has a coordinate with its real values
            assert dim in ds.coords, dim
        np.testing.assert_allclose(ds.tau.values, config["tau"])
        np.testing.assert_array_equal(ds.L.values, config["L"])
        np.testing.assert_array_equal(ds.t.values, checkpoint_steps(config["n_steps"], config["ckpt_every"]))
        np.testing.assert_array_equal(ds.seed.values, np.arange(config["n_seeds"]))
        assert ds.g.dims == ("tau", "seed", "L", "t")
        assert ds.risk_inf.dims == ("tau", "seed", "t")
        assert ds.concentration_constant.dims == ("tau", "seed")
        assert np.all(ds.g > 0) and np.all(np.isfinite(ds.g))
        # s = sqrt(d / tau); the constant is +inf exactly for tau <= 4 and finite above
        np.testing.assert_allclose(ds.s.isel(seed=0), np.sqrt(config["d"] / ds.tau))
        cc = ds.concentration_constant.isel(seed=0).values
        below = ds.tau.values <= 4
        assert np.all(np.isinf(cc[below])) and np.all(np.isfinite(cc[~below]))
        tau = ds.tau.values[~below]
        np.testing.assert_allclose(cc[~below], (1 - 2 / np.sqrt(tau)) ** (-config["d"] / 2))
        # training risk decreases, the trajectory keeps its block structure (never imposed)
        assert np.all(ds.risk_inf.isel(t=-1) < ds.risk_inf.isel(t=0))
        assert float(ds.off_block.max()) < 1e-12
        # families: the spec is the coordinate, the summary figures are covariance.summary of the cell's Sigma
        assert ds.family.values.tolist() == list(config["families"])
        assert ds.g_family.dims == ("family", "tau", "family_seed", "L", "t_family")
        np.testing.assert_array_equal(ds.t_family.values,
                                      checkpoint_steps(config["family_steps"], config["family_ckpt_every"]))
        assert np.all(ds.g_family > 0) and float(ds.off_block_family.max()) < 1e-12
        for fam in config["families"]:
            for tv in config["tau"]:
                want = covariance.summary(covariance.scaled(covariance.from_spec(fam, config["d"]), tv))
                for key in covariance.SUMMARY_KEYS:
                    assert float(ds[f"family_{key}"].sel(family=fam, tau=tv)) == pytest.approx(want[key], rel=1e-12)
        np.testing.assert_allclose(ds.family_tr_inv2, np.broadcast_to(ds.tau, ds.family_tr_inv2.shape), rtol=1e-12)
        # the concentration constant depends on tau alone; the gap constant is +inf exactly at tau <= 4
        np.testing.assert_allclose(ds.concentration_constant_family.isel(family=0), cc, rtol=1e-12)   # tr_inv2 rounding
        for K in (ds.gap_constant.values, ds.gap_constant_family.isel(family=0).values):
            assert np.all(np.isinf(K[below])) and np.all(np.isfinite(K[~below]) & (K[~below] > 0))
        criteria = json.loads(ds.attrs["criteria"])
        assert criteria == [c.to_dict() for c in analysis.CRITERIA]
        assert all(c["reference"] and c["reason"] and c["profile"] == "paper" for c in criteria)


def test_quick_config_reruns_a_cell(quick):
    path, config = quick
    with xr.open_dataset(path) as ds:
        cfg = EXPERIMENT.configure(profile=None, values=json.loads(ds.attrs["config"]))
        assert dict(cfg) == dict(config)
        out = run_cell(EXPERIMENT, cfg, {"tau": cfg["tau"][3], "seed": 0})
        np.testing.assert_array_equal(out["g"], ds.g.isel(tau=3, seed=0).values)
        np.testing.assert_array_equal(out["U_inf"], ds.U_inf.isel(tau=3, seed=0).values)


def test_quick_analysis_tables_verdicts_figure(quick, tmp_path):
    path, _ = quick
    with xr.open_dataset(path) as ds:
        ex = analysis.exponents(ds)
        assert ex.tau.size == ds.tau.size
        assert np.all(np.isfinite(ex.fixed)) and np.all(np.isfinite(ex.uniform))
        assert np.all(ex.fixed < 0)
        th = analysis.threshold(ds)
        assert th["x"] in analysis.X_CHOICES
        lo, hi = th["ci_tau"]
        assert lo <= th["break_tau"] <= hi and ds.tau.min() <= th["break_tau"] <= ds.tau.max()
        assert th["alternative"]["x"] != th["x"]
        table = ds.sfx.fit_table()
        assert "threshold regression" in table and "sensitivity" in table
        rows = analysis.verdicts(ds)
        assert [r.id for r in rows] == [c.id for c in analysis.CRITERIA]
        # the quick profile is a smoke test: its calibrated criteria PASS, the others are NOT JUDGED, with the reason
        not_judged = {c.id for c in analysis.CRITERIA if isinstance(c.quick, NotJudged)}
        assert {r.id for r in rows if r.verdict == NOT_JUDGED} == not_judged
        assert all(r.verdict == PASS for r in rows if r.id not in not_judged), format_table(rows)
        assert not_judged and len(not_judged) < len(rows)
        assert "C2T-break-covers-4" in format_table(rows)
        tables = analysis.fit_tables(ds)       # one seed: plain OLS SEs, no bootstrap, each table says so
        assert "one unit: no cluster-robust SE" in tables["exponents"].attrs["notes"]
        assert "needs >= 2 seeds, got 1" in tables["threshold_bootstrap"].attrs["title"]
        fig = analysis.figure(ds, tmp_path / "c2t.png")
        assert fig.stat().st_size > 10_000


_TAU6 = [0.75, 1.5, 3.0, 4.5, 9.0, 14.8]
BAD = [
    ({"tau": [2.0, 1.0, 3.0, 4.0, 5.0, 6.0]}, r"^tau: must be strictly increasing"),
    ({"tau": [0.0, *_TAU6[1:]]}, r"^tau: must be > 0"),
    ({"tau": _TAU6[:5]}, r"^tau: needs at least 6 values"),
    ({"n_steps": 210}, r"^n_steps: 210 must be a multiple of ckpt_every = 50"),
    ({"n_steps": -50}, r"^n_steps: must be >= 0"),
    ({"ckpt_every": 0}, r"^ckpt_every: must be >= 1"),
    ({"L": [8, 8, 16]}, r"^L: repeats the value 8:"),
    ({"L": [8, 32, 16]}, r"^L: must be strictly increasing"),
    ({"L": [8, 16]}, r"^L: needs at least 3 values"),
    ({"lr": -0.1}, r"^lr: must be > 0"),
    ({"lr": 0.0}, r"^lr: must be > 0"),
    ({"x_law": "cauchy"}, r"^x_law: covariate law 'cauchy': unknown law name 'cauchy'; expected one of \["),
    ({"x_law": "student_t:2"}, r"^x_law: covariate law 'student_t:2': df must be a scalar > 2"),
    ({"x_law": "empirical"}, r"^x_law: covariate law 'empirical': Sigma, mean: an empirical law has its samples' own"),
    ({"n_replicates": 0}, r"^n_replicates: must be >= 1"),
    ({"n_seeds": 1.5}, r"^n_seeds: expected an integer"),
    ({"trainer": "adam"}, r"^trainer: expected one of \['pairs', 'simple'\]"),
    ({"d": 0}, r"^d: must be >= 1"),
]


@pytest.mark.parametrize("bad, message", BAD)
def test_bad_configuration_is_refused(bad, message):
    with pytest.raises(ValueError, match=message):
        EXPERIMENT.configure("quick", values=bad)
    with pytest.raises(ValueError, match=message):                      # values given whole
        EXPERIMENT.configure(profile=None, values={**EXPERIMENT.configure("quick"), **bad})


@pytest.mark.parametrize("override, message", [
    ("tau=1,2,3,4,5", r"^--set tau: needs at least 6 values"),
    ("n_steps=210", r"^n_steps: 210 must be a multiple of ckpt_every = 50"),
    ("ckpt_every=30", r"^n_steps: 200 must be a multiple of ckpt_every = 30"),
    ("trainer=adam", r"^--set trainer: expected one of"),
])
def test_bad_override_is_refused(override, message):
    with pytest.raises(ValueError, match=message):
        EXPERIMENT.configure("quick", overrides=[override])


def test_profiles_are_typed_and_valid():
    for profile in ("quick", "paper"):
        config = EXPERIMENT.configure(profile)
        assert isinstance(config["tau"], tuple) and all(type(t) is float for t in config["tau"])
        assert isinstance(config["L"], tuple) and all(type(L) is int for L in config["L"])
        assert type(config["lr"]) is float and type(config["n_steps"]) is int and type(config["d"]) is int
    paper = EXPERIMENT.configure("paper")
    assert len(paper["tau"]) == 14 and sum(t < 4 for t in paper["tau"]) == 8
    assert paper["tau"][0] == 0.75 and paper["tau"][-1] == round(c2_threshold.TAU_MAX, 4)
    assert EXPERIMENT.profiles == ("quick", "paper")
    # the grid parameters only say which cells exist: they do not reach a cell's kernel
    assert {p.name for p in EXPERIMENT.params if p.grid} == {"tau", "n_seeds", "families", "n_family_seeds"}
    inputs = EXPERIMENT.cell_inputs(paper, {"tau": 0.75, "seed": 0})
    assert "tau" not in inputs and "n_seeds" not in inputs and inputs["d"] == 3


def _synthetic(break_tau=4.0, n_seeds=3, seed=0):
    """A c2_threshold-schema file (without covariance families) with known exponents: fixed -1/2
    (t = 0); uniform (t > 0, larger, so the sup over t picks it) a hinge in tau from -0.1 at tau = 1
    down to -0.4 at break_tau, flat beyond; lognormal noise of 10%; the risk gap half the gap."""
    rng = np.random.default_rng(seed)
    tau = np.geomspace(0.75, 14.81, 14)
    L = 2.0 ** np.arange(3, 13)
    t = np.arange(0, 501, 100)
    p_unif = -0.1 - 0.3 / (break_tau - 1.0) * (np.minimum(tau, break_tau) - 1.0)
    g = np.empty((tau.size, n_seeds, L.size, t.size))
    g[..., 0] = 3.0 * L ** -0.5
    g[..., 1:] = (5.0 * L[None, :, None] ** p_unif[:, None, None])[:, None]
    g *= np.exp(0.1 * rng.standard_normal(g.shape))
    cc = np.full(tau.size, np.inf)
    cc[tau > 4] = (1 - 2 / np.sqrt(tau[tau > 4])) ** -1.5
    ds = xr.Dataset(
        {"g": (("tau", "seed", "L", "t"), g),
         "g_risk": (("tau", "seed", "L", "t"), 0.5 * g),
         "gap_constant": (("tau",), np.where(tau > 4, 3.0, np.inf)),
         "gap_constant_se": (("tau",), np.where(tau > 4, 0.1, np.nan)),
         "s": (("tau", "seed"), np.repeat(np.sqrt(3 / tau)[:, None], n_seeds, 1)),
         "concentration_constant": (("tau", "seed"), np.repeat(cc[:, None], n_seeds, 1))},
        coords={"tau": tau, "seed": np.arange(n_seeds), "L": L.astype(int), "t": t})
    ds.attrs["criteria"] = json.dumps([c.to_dict() for c in analysis.CRITERIA])
    return ds, p_unif


def test_analysis_recovers_a_known_break():
    ds, p_unif = _synthetic()
    ex = analysis.exponents(ds)
    np.testing.assert_allclose(ex.fixed, -0.5, atol=0.03)
    np.testing.assert_allclose(ex.uniform, p_unif, atol=0.03)
    th = analysis.threshold(ds, x="tau")
    assert abs(th["break_tau"] - 4.0) < 0.3
    assert th["ci_tau"][0] <= th["break_tau"] <= th["ci_tau"][1] and th["ci_tau"][1] - th["ci_tau"][0] < 1.0
    assert th["fit"].slope_left == pytest.approx(-0.1, abs=0.02)
    assert th["fit"].slope_right == pytest.approx(0.0, abs=0.02)
    # the tables print every tau
    assert analysis.fit_tables(ds)["exponents"].sizes["tau"] == ds.tau.size
    m = analysis.measures(ds)
    assert m["C2T-uniform-trend"] <= -0.8
    assert m["C2T-break-location"] == pytest.approx(th["break_tau"]) and m["C2T-break-covers-4"] == 1.0
    rows = {r.id: r for r in analysis.verdicts(ds)}
    assert rows["C2T-break-location"].verdict == PASS and rows["C2T-fixed-exponent"].verdict == PASS
    # a break elsewhere is found elsewhere and its CI excludes 4
    ds8, _ = _synthetic(break_tau=8.0)
    th8 = analysis.threshold(ds8, x="tau")
    assert abs(th8["break_tau"] - 8.0) < 1.0 and not th8["covers_4"]
    assert analysis.measures(ds8)["C2T-break-covers-4"] == 0.0


def test_spearman_and_heuristic():
    assert analysis.spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert analysis.spearman([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(0.8)
    np.testing.assert_allclose(analysis.heuristic_exponent([1.0, 4.0, 16.0]), [-0.25, -0.5, -0.5])


# ------------------------------------------------------------------------------------------
# families: configuration, the Bayes optimum and the constants for a non-isotropic Sigma
# ------------------------------------------------------------------------------------------
def test_bad_family_is_refused_before_any_cell():
    with pytest.raises(ValueError, match=r"^families: covariance spec 'kms:1.5': rho must be in \(-1, 1\)"):
        EXPERIMENT.configure("quick", overrides=["families=kms:0.5,kms:1.5"])
    with pytest.raises(ValueError, match=r"^families: covariance spec 'diagonal:1/2': .*expected d = 3"):
        EXPERIMENT.configure("quick", overrides=["families=diagonal:1/2"])
    with pytest.raises(ValueError, match=r"^family_steps: 210 must be a multiple of family_ckpt_every = 50"):
        EXPERIMENT.configure("quick", overrides=["family_steps=210"])
    config = EXPERIMENT.configure("quick", overrides=["families=rotated:power_law:1.0:seed=3,linear"])
    assert config["families"] == ("rotated:power_law:1.0:seed=3", "linear")


KMS = covariance.scaled(covariance.kms(3, 0.5), 30.0)


def test_bayes_optimum_and_concentration_constant_for_a_kms_sigma():
    rng = np.random.default_rng(0)
    U, v = icl.bayes_optimum(KMS)
    tasks = icl.make_tasks(rng, 3, 5, 4, 8, laws.covariate_law("gaussian", KMS))
    pred = np.einsum("i,nij,j...->n...", v, icl.Gamma_w(KMS, tasks.w), U @ tasks.z_q.reshape(-1, 4).T)
    # v*^T Gamma_w U* z_q = w^T x_q exactly (Remark 5.2 holds for any Sigma) and the point is balanced
    np.testing.assert_allclose(pred.reshape(10, 10, 4)[np.arange(10), np.arange(10)], tasks.y_q, atol=1e-12)
    assert np.linalg.norm(U) == pytest.approx(np.linalg.norm(v), rel=1e-14)
    # E exp(x^T Sigma^-1 x / c^2) for x ~ N(0, Sigma) by Monte Carlo (chi-square law of x^T Sigma^-1 x needs
    # nothing of Sigma but its rank): within 5 standard errors
    x = rng.standard_normal((1 << 18, 3)) @ np.linalg.cholesky(KMS).T
    e = np.exp(np.einsum("ni,ij,nj->n", x, np.linalg.inv(KMS), x) / math.sqrt(30.0))
    assert abs(e.mean() - concentration_constant(KMS)) < 5 * e.std() / math.sqrt(e.size)


def test_gap_constant_change_of_measure_against_plain_monte_carlo():
    # the same expectation sampled under the original law (x, x' ~ N(0, Sigma) independent, w ~ N(0, I)),
    # exponential factors included as weights: finite variance at tau = 100 (needs tau > 16); 5 combined SEs
    Sigma, q, n = covariance.scaled(covariance.power_law(3, 1.0), 100.0), 2, 1 << 18
    K, se = gap_constant(Sigma, q, np.random.default_rng(1), n)
    rng = np.random.default_rng(2)
    C = np.linalg.cholesky(Sigma)
    X1, X2 = rng.standard_normal((n, 3)) @ C.T, rng.standard_normal((n, 3)) @ C.T
    W = rng.standard_normal((n, 3))
    P, c2 = np.linalg.inv(Sigma), 10.0
    same = np.exp(np.einsum("ni,ij,nj->n", X1, P, X1) / c2) * _gap_integrand(X1, X1, W, Sigma, c2)
    cross = np.exp(np.einsum("ni,ij,nj->n", X1, P, X2) / c2) * _gap_integrand(X1, X2, W, Sigma, c2)
    terms = same / q + (1 - 1 / q) * cross
    assert abs(terms.mean() - K) < 5 * math.hypot(se, terms.std() / math.sqrt(n))
    assert 0 < se < 0.05 * K
    for tau in (3.9, 4.0):
        assert gap_constant(covariance.scaled(Sigma, tau), q, rng, 16) == (math.inf, 0.0)
    with pytest.raises(ValueError, match="n_queries"):
        gap_constant(Sigma, 0, rng)


def test_gap_constant_integrand_is_the_limit_of_the_measured_gap():
    # for one task pair and its two queries, L E[g_L^2 | w, x_q] by direct simulation of softmax(L) at the
    # Bayes optimum (many prompt sets) against the delta-method kernel sum_{q,q'} e^{x_q Sigma^-1 x_q' / c^2}
    # P(x_q, x_q', w) / q^2 that gap_constant integrates. Tolerance: 4 SE of the simulation plus 6% for the
    # O(1/L) terms the limit drops (measured: +2% to +7% at L = 2048 on three draws)
    Sigma = covariance.scaled(covariance.kms(2, 0.5), 64.0)
    U, v = icl.bayes_optimum(Sigma)
    law = laws.covariate_law("gaussian", Sigma)
    rng = np.random.default_rng(4)
    tasks = icl.make_tasks(rng, 2, 1, 2, 8, law)
    w, xq, c2 = tasks.w[0], tasks.x_q[0], 8.0
    L, R = 1024, 800
    X = np.asarray(law.sample(rng, (R, L)))
    prompts = np.empty((R, 2, L, 3))
    prompts[..., :2] = X[:, None]
    prompts[:, 0, :, 2], prompts[:, 1, :, 2] = X @ w, -(X @ w)
    Lg2 = np.array([L * gradient_gap(U, v, tasks, prompts[r:r + 50], [L])[0, 0] ** 2 for r in range(0, R, 50)])
    P = np.linalg.inv(Sigma)
    want = sum(math.exp(xq[i] @ P @ xq[j] / c2) * _gap_integrand(xq[i][None], xq[j][None], w[None], Sigma, c2)[0]
               for i in range(2) for j in range(2)) / 4
    assert abs(Lg2.mean() - want) < 4 * Lg2.std(ddof=1) / math.sqrt(Lg2.size) + 0.06 * want


# ------------------------------------------------------------------------------------------
# families and the constant: the analysis on a synthetic file with known answers
# ------------------------------------------------------------------------------------------
def _with_families(offsets=(0.05, -0.02), K_scale=1.0):
    """The synthetic file of :func:`_synthetic` plus: families whose uniform exponents are the
    isotropic ones plus ``offsets``; gap constants K chosen so that L g_L(T)^2 / K is known."""
    ds, p_unif = _synthetic(n_seeds=3)
    ds = ds.copy()
    rng = np.random.default_rng(9)
    L = ds.L.values.astype(float)
    fam = ["kms:0.5", "power_law:1.0"][:len(offsets)]
    g = np.empty((len(fam), ds.tau.size, 3, L.size, 3))
    for k, off in enumerate(offsets):
        g[k, ..., 0] = 3.0 * L ** -0.5
        g[k, ..., 1:] = (5.0 * L[None, :, None] ** (p_unif[:, None, None] + off))[:, None]
    g *= np.exp(0.1 * rng.standard_normal(g.shape))
    ds["g_family"] = (("family", "tau", "family_seed", "L", "t_family"), g)
    ds = ds.assign_coords(family=fam, family_seed=[0, 1, 2], t_family=[0, 400, 800])
    above = ds.tau.values > 4
    Lg2 = (ds.g.isel(t=-1) ** 2 * ds.L).mean("seed").isel(L=-1).values
    ds["gap_constant"] = ("tau", np.where(above, K_scale * Lg2, np.inf))
    ds["gap_constant_se"] = ("tau", np.zeros(ds.tau.size))
    Lg2f = (ds.g_family.isel(t_family=-1) ** 2 * ds.L).mean("family_seed").isel(L=-1).values
    ds["gap_constant_family"] = (("family", "tau"), np.where(above, 2.5 * Lg2f, np.inf))
    figs = [[covariance.summary(covariance.scaled(covariance.from_spec(f, 3), tv)) for tv in ds.tau.values] for f in fam]
    for key in covariance.SUMMARY_KEYS:
        ds[f"family_{key}"] = (("family", "tau"), [[x[key] for x in row] for row in figs])
    ds["dist_bayes_family"] = (("family", "tau", "family_seed", "t_family"), np.zeros(g.shape[:3] + (3,)))
    return ds, p_unif


def test_analysis_of_families_and_the_constant():
    ds, p_unif = _with_families()
    fe = analysis.family_exponents(ds)
    # per tau the difference carries the offset plus noise (10% lognormal: slope SE ~0.01); the mean over tau
    # averages 14 of those
    np.testing.assert_allclose(fe.difference.mean("tau"), [0.05, -0.02], atol=0.01)
    assert np.all(np.isfinite(fe.uniform_seed_se))
    rows = {r.id: r for r in analysis.verdicts(ds)}   # one pass of every fit (the threshold regression is slow)
    m = {cid: r.measured for cid, r in rows.items()}
    assert m["C2T-families-agree"] == pytest.approx(float(np.abs(fe.difference.mean("tau")).max()))
    # K was set to the pooled L g^2 at the largest L (isotropic) and to 1/2.5 of it (families)
    cr = analysis.constant_ratio(ds)
    assert cr.tau.values.min() > 4
    np.testing.assert_allclose(cr.iso.isel(L=-1), 1.0, rtol=1e-12)
    np.testing.assert_allclose(cr.families.isel(L=-1), 0.4, rtol=1e-12)
    assert m["C2T-constant-ratio"] == pytest.approx(1.0) and m["C2T-constant-ratio-families"] == pytest.approx(0.4)
    # growth: the end-of-training gap is 5 L^p (x noise), so L g^2 has slope 1 + 2 p at every tau
    gs = analysis.growth_slopes(ds)
    np.testing.assert_allclose(gs, 1 + 2 * p_unif, atol=0.05)
    assert m["C2T-growth-below-4"] == pytest.approx(float(gs.isel(tau=ds.tau.values < 4).min()))
    rows = {cid: r.verdict for cid, r in rows.items()}
    assert rows["C2T-families-agree"] == PASS and rows["C2T-constant-ratio"] == PASS
    assert rows["C2T-constant-ratio-families"] == FAIL and rows["C2T-growth-below-4"] == PASS
    far, _ = _with_families(offsets=(0.2,))
    assert float(np.abs(analysis.family_exponents(far).difference.mean("tau")).max()) == pytest.approx(0.2, abs=0.01)
    table = analysis.family_table(ds)
    assert "family kms:0.5" in table and "family power_law:1.0" in table and "Lg2/K" in table


def test_a_file_without_families_or_a_tau_above_4_is_inconclusive_there(tmp_path):
    ds, _ = _synthetic()
    ds = ds.isel(tau=slice(0, 5))          # 5 tau, all below 4: no threshold regression, no finite constant
    rows = {r.id: r for r in analysis.verdicts(ds)}
    for cid in ("C2T-families-agree", "C2T-constant-ratio-families"):
        assert rows[cid].verdict == INCONCLUSIVE and "the file has no covariance families" in rows[cid].note
    assert rows["C2T-constant-ratio"].verdict == INCONCLUSIVE and "needs a tau > 4" in rows["C2T-constant-ratio"].note
    assert rows["C2T-growth-below-4"].verdict == PASS
    assert "covariance families: not compared" in analysis.family_table(ds)
    assert analysis.figure(ds, tmp_path / "f.png").stat().st_size > 10_000


# ------------------------------------------------------------------------------------------
# the design-following SEs, the threshold regression's weights and its bootstrap
# ------------------------------------------------------------------------------------------
def test_exponent_ses_are_clustered_over_seeds():
    from sfxlin.analysis.fits import loglog_slope

    ds, _ = _synthetic(n_seeds=4, seed=3)
    ex = analysis.exponents(ds)
    assert ex.cov_type.item() == "cluster" and ex.n_units.item() == 4
    sup = ds.g.max("t")
    for var, da in (("fixed", ds.g.isel(t=0)), ("uniform", sup)):
        want = loglog_slope(da, "L", units="seed")        # statsmodels, CR1 over the seeds
        np.testing.assert_allclose(ex[var], want.slope, rtol=0, atol=1e-12)
        np.testing.assert_allclose(ex[f"{var}_se"], want.slope_se, rtol=1e-9)
        np.testing.assert_allclose(ex[f"{var}_se_ols"], loglog_slope(da.mean("seed"), "L").slope_se, rtol=1e-9)
    ols = analysis.exponents(ds, cov_type="nonrobust")
    assert ols.cov_type.item() == "nonrobust"
    np.testing.assert_array_equal(ols.uniform_se.values, ex.uniform_se_ols.values)
    with pytest.raises(ValueError, match="cov_type must be one of"):
        analysis.exponents(ds, cov_type="HC3")
    # the threshold regression is weighted by the clustered SEs by default, by the plain ones by name
    th, tho = analysis.threshold(ds), analysis.threshold(ds, se="nonrobust")
    assert (th["se"], tho["se"]) == ("cluster", "nonrobust")
    np.testing.assert_array_equal(th["data"][2], 1.0 / ex.uniform_se.values ** 2)
    np.testing.assert_array_equal(tho["data"][2], 1.0 / ex.uniform_se_ols.values ** 2)
    with pytest.raises(ValueError, match="se must be one of"):
        analysis.threshold(ds, se="ols")
    # the measures' fast path gives the tables' numbers
    m = analysis.measures(ds)
    assert m["C2T-break-location"] == th["break_tau"]
    np.testing.assert_array_equal(m["C2T-fixed-exponent"], ex.fixed.values)
    table = analysis.fit_tables(ds)["threshold"]
    assert list(table.fit.values[:3]) == ["threshold regression", "sensitivity: other x", "sensitivity: OLS SE"]
    assert table.weights.values[0] == "1/SE_cluster^2"
    # the families' and the growth fits cluster over their seeds too
    fam, _ = _with_families()
    fe = analysis.family_exponents(fam)
    want = loglog_slope(fam.g_family.max("t_family"), "L", units="family_seed")
    np.testing.assert_allclose(fe.uniform_se, want.slope_se.transpose(*fe.uniform_se.dims), rtol=1e-9)
    assert fe.n_units.item() == 3
    Lg2 = fam.g.isel(t=-1) ** 2 * fam.L
    np.testing.assert_allclose(analysis.growth_fit(fam).slope_se, loglog_slope(Lg2, "L", units="seed").slope_se,
                               rtol=1e-9)


def test_threshold_bootstrap_reruns_the_break_search():
    ds, _ = _synthetic(n_seeds=4, seed=5)
    th = analysis.threshold(ds, x="tau")
    b = analysis.threshold_bootstrap(ds, resamples=40, x="tau")
    assert b["done"] == 40 and b["break_tau"].size == 40
    # a sharp break (10% noise, 4 seeds): every resample finds it near 4, its percentile interval holds the full-data
    # break, and the bootstrap slope SEs are of the order of the SEs at the break (same data, same weights)
    assert np.all(np.abs(b["break_tau"] - 4.0) < 0.5) and b["break_ci"][0] <= th["break_tau"] <= b["break_ci"][1]
    assert b["covers_4"] > 0.9 and b["truncated"] < 0.1
    # (4 seeds: a bootstrap SE from 3 dof has a relative SD of ~40%, the WLS SE at the break 11 dof: a factor 5
    # either way is beyond 3 of those SDs on the log scale)
    assert 0.2 < b["slope_left_se"] / th["fit"].slope_left_se < 5
    again = analysis.threshold_bootstrap(ds, resamples=40, x="tau")       # a keyed generator: the same draws
    np.testing.assert_array_equal(b["break_tau"], again["break_tau"])
    assert analysis.threshold_bootstrap(ds.isel(seed=[0])) is None
    table = analysis.fit_tables(ds)["threshold_bootstrap"]
    assert int(table.resamples) == 100 and int(table.seeds) == 4


def test_break_covers_4_is_a_test_at_level_5_percent():
    from sfxlin.analysis.threshold import hansen_lr_crit
    from sfxlin.analysis.verdicts import multiplicity

    for break_tau in (4.0, 8.0):
        ds, _ = _synthetic(break_tau=break_tau, n_seeds=3)
        th = analysis.threshold(ds)
        p = analysis.covers_4_pvalue(th)
        # p >= 5% exactly when LR(4) <= Hansen's 5% critical value, i.e. when 4 is in the LR set
        y, xv, w = th["data"]
        f = th["fit"]
        c4 = 4.0 if th["x"] == "tau" else math.log(4.0)
        from sfxlin.analysis.threshold import hinge_ssr_profile_np
        lr4 = f.n * (float(hinge_ssr_profile_np(y, xv, np.array([c4]), w)[0]) - f.ssr) / f.ssr
        assert (p >= 0.05) == (lr4 <= hansen_lr_crit(0.05)) == th["covers_4"]
        rows = analysis.verdicts(ds, resamples=0)
        row = next(r for r in rows if r.id == "C2T-break-covers-4")
        assert row.level == 0.05 and row.pvalue == pytest.approx(p)
        assert multiplicity(rows)["tests"] == 1


def test_the_cells_a_blas_kernel_moves_are_those_past_the_edge_of_stability():
    """docs/performance.md section 10: of the paper profile's families cells at kms:0.5, tau 0.75, the two that
    move under another BLAS kernel (family_seed 0 and 1) are those whose linear(inf) gradient descent at lr =
    0.01 crosses the edge of stability in its block coordinates (lr lambda_max > 2, sfxlin.curvature.block_edge)
    during its transient, and ends at the edge, at a minimiser off the balanced manifold (||U||_F^2 - ||v||^2
    far from its init's 0); family_seed 2 stays below the edge and ends near the Bayes optimum. The trajectory
    is the cell's own (its draws from the cell's generator, tasks first), checked against the cell."""
    from sfxlin import curvature, training
    from sfxlin.engine.sweep import cell_rng

    config = EXPERIMENT.configure("paper", ["amplification_eps=0"])
    Sigma = c2_threshold.family_sigma("kms:0.5", 0.75, config["d"])
    for seed, crosses in ((0, True), (1, True), (2, False)):
        cell = {"family": "kms:0.5", "tau": 0.75, "family_seed": seed}
        rng = cell_rng(EXPERIMENT.rng_name("families"), cell, config["root_seed"])
        tasks = icl.make_tasks(rng, config["d"], config["n_pairs"], config["n_queries"], max(config["L"]),
                               laws.covariate_law("gaussian", Sigma))
        run = training.train_all_arrays(tasks, (), models=("linear_inf",), lr=config["lr"],
                                        n_steps=config["family_steps"], ckpt_every=20, pair_first=True)
        U, v = run["linear_inf"]["U"], run["linear_inf"]["v"]
        U_star, v_star = icl.bayes_optimum(Sigma)
        dist = icl.theta_distance(U, v, U_star, v_star)
        if seed == 0:   # the cell's own trajectory
            every = config["family_ckpt_every"] // 20
            np.testing.assert_array_equal(dist[::every], run_cell(EXPERIMENT, config, cell, "families")["dist_bayes_family"])
        edge = curvature.block_edge(tasks, U, v, config["lr"])
        balance = np.sum(U[-1] ** 2) - np.sum(v[-1] ** 2)
        assert (edge.max() > 2.2) == crosses and (balance > 0.2) == crosses, (seed, edge.max(), balance)
        assert (1.9 < edge[-1] < 2.0) == crosses and (dist[-1] > 0.1) == crosses, (seed, edge[-1], dist[-1])


@pytest.mark.slow
def test_the_gap_constant_se_follows_the_design():
    """Monte Carlo SE against an exact value (issue #38): the constants part's gap_constant (the gradient-gap
    constant K, a Monte Carlo mean of i.i.d. polynomial moments after the exact change of Gaussian measure) with
    its gap_constant_se (their spread / sqrt(n)), against K of 2^20 draws (its own SE, 1/8 of a cell's, joins
    the z's denominator). tau = 5.9162, 9.362, 14.8148 x root_seed 1 .. 100 at 2^14 draws: K = 300 z-scores.
    The moments are heavy-tailed (kappa = 1 - 2 tau^-1/2 is 0.18 at tau = 5.9, so x ~ N(0, Sigma / kappa) is
    wide): at 2^10 draws the z's are skewed and too wide (mean z^2 1.79), at 2^14 they are near normal, so the
    check reads the share inside the central 50% and the signs (a t with n - 1 dof), not z^2: an SE wrong by a
    factor 1.5 fails it; a right SE passes with probability >= 0.9971."""
    from sfxlin.testing.calibration import assert_se_follows_design

    n = 1 << 14
    EXP = c2_threshold.EXPERIMENT
    z = []
    for tau in (5.9162, 9.362, 14.8148):
        reference = EXP.configure("quick", [f"gap_samples={n}"])
        K, se = gap_constant(c2_threshold.sigma_scale(tau, 3) * np.eye(3), reference["n_queries"],
                             np.random.default_rng([7, int(tau * 1e4)]), 1 << 20)
        for root in range(1, 101):
            out = run_cell(EXP, EXP.configure("quick", [f"gap_samples={n}", f"root_seed={root}"]), {"tau": tau},
                           "constants")
            z.append((out["gap_constant"] - K) / np.hypot(out["gap_constant_se"], se))
    assert_se_follows_design(z, n - 1, "c2_threshold gap constant")
