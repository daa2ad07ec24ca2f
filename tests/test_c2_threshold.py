"""End to end: the C2 threshold quick profile through sweep.build + execution.compute, the file
it writes (schema), its analysis (exponents, threshold regression, verdicts, figure), and the
analysis on a synthetic file with a known break."""
import json

import numpy as np
import pytest
import xarray as xr

from conftest import raise_if_dask_computes
from sfxlin.analysis import c2_threshold as analysis
from sfxlin.analysis.verdicts import FAIL, INCONCLUSIVE, PASS, format_table
from sfxlin.execution import compute
from sfxlin.pipelines import c2_threshold
from sfxlin.storage import save
from sfxlin.sweep import build, run_cell
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
        table = analysis.fit_table(ds)
        assert "threshold regression" in table and "sensitivity" in table
        rows = analysis.verdicts(ds)
        assert [r.id for r in rows] == [c.id for c in analysis.CRITERIA]
        assert all(r.verdict in (PASS, FAIL, INCONCLUSIVE) for r in rows)
        assert "C2T-break-covers-4" in format_table(rows)
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
    ({"x_law": "student_t"}, r"^x_law: expected one of \['gaussian', 'rademacher'\]"),
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
    assert {p.name for p in c2_threshold.PARAMS if p.grid} == {"tau", "n_seeds"}
    inputs = EXPERIMENT.cell_inputs(paper, {"tau": 0.75, "seed": 0})
    assert "tau" not in inputs and "n_seeds" not in inputs and inputs["d"] == 3


def _synthetic(break_tau=4.0, n_seeds=3, seed=0):
    """A c2_threshold-schema file with known exponents: fixed -1/2 (t = 0); uniform (t > 0, larger,
    so the sup over t picks it) a hinge in tau from -0.1 at tau = 1 down to -0.4 at break_tau, flat
    beyond; lognormal noise of 10%."""
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
    # the analysis ignores g_risk when absent and prints every tau
    assert len(analysis.fit_table(ds).splitlines()) > ds.tau.size
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
