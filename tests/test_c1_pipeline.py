"""End to end: the C1 quick profile through the CLI, the file it writes, and its analysis."""
import hashlib
import json
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import xarray as xr

from sfxlin.analysis import c1 as c1_analysis
from sfxlin.attention import asymptotic_mse, softmax_attention
from sfxlin.cli import main
from sfxlin.laws import Gaussian, GaussianAR1, NoLimitError, Rademacher, StudentT, Uniform
from sfxlin.pipelines import c1_limit
from sfxlin.engine.sweep import build, run_cell


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("c1")
    assert main(["run", "c1", "--profile", "quick", "--out", str(out), "--quiet"]) == 0
    return out


def test_quick_run_writes_a_self_describing_file(quick_run):
    # opened by plain xarray in a fresh interpreter: no sfxlin import needed
    code = (
        "import xarray as xr, json; ds = xr.open_dataset(r'%s');"
        "print(json.dumps({'dims': dict(ds.sizes), 'L': ds.L.values.tolist(), 'attrs': sorted(ds.attrs),"
        "'var_attrs': {k: sorted(v.attrs) for k, v in ds.data_vars.items()}}))" % (quick_run / "c1_limit.nc")
    )
    info = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
    cfg = c1_limit.EXPERIMENT.configure("quick")
    assert info["L"] == list(cfg["L"])
    assert info["dims"]["d"] == len(cfg["d"]) and info["dims"]["seed"] == cfg["n_seeds"]
    for key in ("experiment", "profile", "config", "sfxlin_version", "git_revision", "created", "wall_seconds",
                "scheduler", "history", "criteria", "library_versions", "analysis", "title", "overrides"):
        assert key in info["attrs"]
    for name, attrs in info["var_attrs"].items():
        assert {"long_name", "description"} <= set(attrs), name
    assert (quick_run / "c1_limit.png").stat().st_size > 10_000


def test_quick_run_config_reruns_the_file(quick_run):
    ds = xr.load_dataset(quick_run / "c1_limit.nc")
    config = json.loads(ds.attrs["config"])
    again = build(c1_limit.EXPERIMENT, config).isel(d=[0], U_norm=[1], seed=[1]).compute()
    xr.testing.assert_equal(again.mse, ds.mse.isel(d=[0], U_norm=[1], seed=[1]))


def test_cell_matches_an_independent_recomputation():
    """One cell recomputed with plain loops over queries and laws from the same draws."""
    config = c1_limit.EXPERIMENT.configure("quick")
    cell = {"d": config["d"][1], "U_norm": config["U_norm"][0], "seed": 1}
    out = run_cell(c1_limit.EXPERIMENT, config, cell)
    from sfxlin.engine.sweep import cell_rng

    rng = cell_rng(c1_limit.NAME, cell, config["root_seed"])
    d, Ls = config["d"][1], np.array(config["L"])
    U = rng.standard_normal((d, d))
    U *= config["U_norm"][0] / np.linalg.norm(U)
    gauss = Gaussian(cov=1.0, D=d)
    q = gauss.sample(rng, config["n_queries"])
    df = config["student_df"]
    laws = {"gaussian": Gaussian(cov=1.0, D=d), "rademacher": Rademacher(1.0, D=d), "uniform": Uniform(1.0, D=d),
            "student_t": StudentT(df, np.sqrt((df - 2) / df), D=d)}  # covariance I_d each
    laws |= {f"ar1:{rho!r}": GaussianAR1(rho, cov=1.0, D=d) for rho in config["ar1_rho"]}  # one per rho
    assert list(laws) == c1_limit.law_names(config)
    # each law draws from its own substream, keyed "law=<name>" under the cell's seed sequence,
    # query chunk after query chunk
    seq = rng.bit_generator.seed_seq
    law_rng = {name: np.random.default_rng(np.random.SeedSequence(seq.entropy, spawn_key=(
        int.from_bytes(hashlib.sha256(f"law={name}".encode()).digest()[:8], "little"),))) for name in laws}
    errors = {name: [] for name in laws}
    for start in range(0, config["n_queries"], config["query_chunk"]):
        stop = min(start + config["query_chunk"], config["n_queries"])
        for name in laws:
            Z = laws[name].sample(law_rng[name], (stop - start, config["n_prompts"], Ls[-1]))
            for j in range(stop - start):
                for L in Ls:
                    f = softmax_attention(Z[j, :, :L, :], U, np.eye(d), q[start + j])
                    errors[name].append(np.sum((f - U @ q[start + j]) ** 2, axis=-1).mean())
    for i, name in enumerate(laws):
        ref = np.array(errors[name]).reshape(config["n_queries"], len(Ls)).mean(axis=0)
        np.testing.assert_allclose(out["mse"][i], ref, rtol=1e-10)
    np.testing.assert_allclose(out["mse_asymptotic"], asymptotic_mse(gauss, U, np.eye(d), q[:, None], Ls).mean(0))
    assert np.isnan(out["bias_exact"][3]) and np.all(np.isfinite(out["bias_exact"][:3]))
    assert out["bias_exact"][0] == pytest.approx(0.0, abs=1e-30) and np.all(out["bias_exact"][4:] == 0.0)
    # the AR(1) laws' prediction: the dependent constant (sum over lags) / L
    for i, name in enumerate(laws):
        if name.startswith("ar1:"):
            np.testing.assert_allclose(out["mse_predicted"][i],
                                       asymptotic_mse(laws[name], U, np.eye(d), q[:, None], Ls).mean(0), rtol=1e-12)


def test_analysis_reports_every_criterion(quick_run):
    ds = xr.load_dataset(quick_run / "c1_limit.nc")
    rows = c1_analysis.verdicts(ds)
    assert [r.id for r in rows] == [c.id for c in c1_analysis.CRITERIA]
    by_id = {r.id: r for r in rows}
    # robust even at quick size: exact checks and the 1/L rate
    for key in ("C1-quadrature", "C1-slopes", "C1-student-t-grows", "C1-sqrtL-grows"):
        assert by_id[key].verdict == "PASS", by_id[key]
    table = ds.sfx.fit_table()
    assert "paper form" in table and "slope" in table


def test_gaussian_slopes_recover_one_over_L(quick_run):
    fit = c1_analysis.slopes(xr.load_dataset(quick_run / "c1_limit.nc"))
    assert np.all(np.abs(fit.slope - (-1.0)) < 4 * fit.slope_se + 0.03)


@pytest.mark.parametrize("bad, message", [
    ({"L": [16, 8, 32]}, "L: must be strictly increasing"),
    ({"L": [0, 8, 16]}, "L: must be >= 1"),
    ({"L": [8, 16]}, "L: needs at least 3 values"),
    ({"d": [0]}, "d: must be >= 1"),
    ({"U_norm": [-0.1]}, "U_norm: must be > 0"),
    ({"student_df": 2.0}, "student_df: must be > 2"),
    ({"laws": ["uniform", "student_t"]}, "laws: 'gaussian' is needed"),
    ({"laws": ["gaussian", "cauchy"]}, r"laws: expected one of \['gaussian'"),
])
def test_bad_configuration_is_refused(bad, message):
    with pytest.raises(ValueError, match=message):
        c1_limit.EXPERIMENT.configure(profile=None, values={**c1_limit.EXPERIMENT.configure("quick"), **bad})


def test_a_new_law_joins_c1_by_name_and_leaves_the_others_unchanged():
    """A law of sfxlin.laws (here the Gaussian mixture) is one more value of ``laws``: its own slice
    (finite exact bias, plateau criterion) and every other law's prompts bit-identical."""
    base = c1_limit.EXPERIMENT.configure("quick", ["d=2", "U_norm=0.5", "n_seeds=1", "L=16,64,256"])
    more = c1_limit.EXPERIMENT.configure("quick", ["d=2", "U_norm=0.5", "n_seeds=1", "L=16,64,256",
                                                   "laws=gaussian,rademacher,uniform,student_t,ar1,gaussian_mixture"])
    a = build(c1_limit.EXPERIMENT, base).compute(scheduler="synchronous")
    b = build(c1_limit.EXPERIMENT, more).compute(scheduler="synchronous")
    np.testing.assert_array_equal(a.mse.values, b.mse.sel(law=list(a.law.values)).values)
    assert np.isfinite(b.bias_exact.sel(law="gaussian_mixture")).all()
    assert "gaussian_mixture" in c1_analysis.own_limit_laws(b)


def test_student_t_has_no_limit_and_bounded_laws_have_exact_snis_constants():
    """Monte-Carlo check of the exact SNIS constants used by mse_predicted (CLT tolerance)."""
    rng = np.random.default_rng(7)
    U = np.array([[0.6, 0.2], [-0.3, 0.5]])
    q = np.array([1.0, -0.7])
    L, P = 1000, 6000
    for law in (Gaussian(cov=1.0, D=2), Rademacher(1.0, D=2), Uniform(1.0, D=2)):
        Z = law.sample(rng, (P, L))
        e = L * np.sum((softmax_attention(Z, U, np.eye(2), q) - law.tilted_mean(U @ q)) ** 2, axis=-1)
        predicted = asymptotic_mse(law, U, np.eye(2), q, 1)
        # 5 standard errors plus an O(1/L) allowance for the delta method's remainder
        assert abs(e.mean() - predicted) < 5 * e.std() / np.sqrt(P) + 5 * predicted / L, law
    with pytest.raises(NoLimitError, match="no exponential moments"):
        asymptotic_mse(StudentT(3.0, D=2), U, np.eye(2), q)


# --------------------------------------------------------------------------- uncertainty and the quick profile


def test_the_quick_profile_of_a_correct_install_fails_nothing(quick_run):
    """The quick profile is judged by its own calibration (the file says so): no FAIL, every
    criterion PASS but the sharp constant, NOT JUDGED with its reason; the slope table says how its
    SE was taken and over how many units."""
    ds = xr.load_dataset(quick_run / "c1_limit.nc")
    assert ds.attrs["profile"] == "quick"
    rows = {r.id: r for r in c1_analysis.verdicts(ds)}
    assert {k: r.verdict for k, r in rows.items() if r.verdict != "PASS"} == {"C1-sharp-constant": "NOT JUDGED",
                                                                               "C1-ar1-constant": "NOT JUDGED"}
    assert "heavy-tailed" in rows["C1-sharp-constant"].note
    assert "one query of large ||Uq||" in rows["C1-ar1-constant"].note
    assert "SE cluster-robust over 2 units (seed)" in ds.sfx.fit_table()


def test_a_broken_kernel_fails_the_quick_profile(monkeypatch):
    """Planted bug: the logits divided by sqrt(d), the transformer habit, where the paper's attention
    (and every closed form here) uses raw logits. Attention then converges to sigma^2 U q / sqrt(d),
    not to sigma^2 U q: the error plateaus at the bias, which the quick calibration catches through
    the 1/L rate and the bounded laws' predicted plateau; the closed-form check, which does not run
    attention, still passes."""
    import sfxlin.attention

    raw = sfxlin.attention._logits
    monkeypatch.setattr(sfxlin.attention, "_logits", lambda Z, U, q: raw(Z, U, q) / np.sqrt(Z.shape[-1]))
    ds = build(c1_limit.EXPERIMENT, c1_limit.EXPERIMENT.configure("quick")).compute(scheduler="synchronous")
    verdict = {r.id: r.verdict for r in c1_analysis.verdicts(ds, resamples=0)}
    assert ds.attrs["profile"] == "quick"
    assert verdict["C1-slopes"] == verdict["C1-plateau"] == "FAIL", verdict
    assert verdict["C1-quadrature"] == "PASS"


def test_the_slope_measure_is_the_seed_mean_fit(quick_run):
    """The criterion reads the slopes of slopes(ds), the table's: the OLS slope of the log seed mean
    (the same with the plain SE), one function for both."""
    ds = xr.load_dataset(quick_run / "c1_limit.nc")
    xr.testing.assert_identical(c1_analysis.measures(ds)["C1-slopes"], c1_analysis.slopes(ds).slope)
    plain = c1_analysis.slopes(ds, cov_type="nonrobust")
    np.testing.assert_allclose(plain.slope, c1_analysis.slopes(ds).slope, rtol=1e-12)
    assert plain.cov_type.item() == "nonrobust" and c1_analysis.slopes(ds).cov_type.item() == "cluster"


def _between_seed_se(ds):
    """``sd(per-seed slopes) / sqrt(G)`` per (d, U_norm): each seed's OLS slope of log mse on log L by
    numpy least squares, independent of the fit code."""
    logy = np.log(ds.mse.sel(law="gaussian").transpose("L", "d", "U_norm", "seed").values)
    X = np.column_stack([np.ones(ds.sizes["L"]), np.log(ds.L.values.astype(float))])
    per_seed = np.linalg.lstsq(X, logy.reshape(ds.sizes["L"], -1), rcond=None)[0][1].reshape(logy.shape[1:])
    return per_seed.std(axis=-1, ddof=1) / np.sqrt(ds.sizes["seed"])


def test_shipped_slope_ses_are_the_between_seed_ses():
    """datasets/c1_limit.nc (paper, 4 seeds): the cluster SE of every (d, U_norm) slope is within a
    factor 1.5 of the between-seed SE (the per-seed slopes are independent draws of the same
    estimator, so their spread is the reference), where the plain OLS SE of the seed-mean line is not
    (it reads the smooth residuals of nested prompts as a tight fit)."""
    ds = xr.load_dataset(pathlib.Path(__file__).parents[1] / "datasets" / "c1_limit.nc")
    between = _between_seed_se(ds)
    ratio = c1_analysis.slopes(ds).slope_se.transpose("d", "U_norm").values / between
    plain = c1_analysis.slopes(ds, cov_type="nonrobust").slope_se.transpose("d", "U_norm").values / between
    print("\ncluster SE / between-seed SE:", np.round(ratio, 3).ravel(), "\nplain OLS SE / between-seed SE:",
          np.round(plain, 3).ravel())
    assert np.all((ratio > 1 / 1.5) & (ratio < 1.5)), ratio
    assert plain.min() < 1 / 1.5


def test_the_seed_se_of_the_constant_follows_the_design():
    """Monte Carlo SE against an exact value (issue #38): the ratio L mse / tr C at the largest L with its SE
    over the seeds (ar1_fits' ratio_iid, i.i.d. Gaussian tokens as ar1 at rho = 0) against its value 1: at
    U_norm <= 0.1 the softmax weights are within exp(+-0.1 |z|) of uniform and the remainder beyond tr C / L
    is O(|a|^2 / L) relative, below 1e-3 at L = 128, a tenth of the smallest SE (0.0098 in these runs).
    4 runs (root_seed 1 .. 4) of 9 d x 2 U_norm cells with 4 seeds each: K = 72 z-scores, each a t with 3
    dof when the per-seed ratios are independent units; sfxlin.testing.calibration checks the share inside
    the central 50% and the signs, which a right SE passes with probability >= 0.9974."""
    from sfxlin.testing.calibration import assert_se_follows_design

    z = []
    for root in (1, 2, 3, 4):
        config = c1_limit.EXPERIMENT.configure("quick", [
            "laws=gaussian,ar1", "ar1_rho=0.0", "d=2,3,4,5,6,7,8,9,10", "U_norm=0.05,0.1", "L=32,64,128", "n_seeds=4",
            "n_queries=6", "n_prompts=8", f"root_seed={root}"])
        ds = build(c1_limit.EXPERIMENT, config).compute(scheduler="synchronous")
        fit = c1_analysis.ar1_fits(ds)
        z.append(((fit.ratio_iid - 1) / fit.ratio_iid_se).values.ravel())
    assert_se_follows_design(np.concatenate(z), 3, "c1_limit ratio_iid")
