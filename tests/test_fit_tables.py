"""Fit tables as data (every analysis module's ``fit_tables``) and their one renderer
(:mod:`sfxlin.analysis.tables`): text, Markdown and HTML of small tables built here, the tables
of every module against the module's own fit functions, the C3L table with few prompt lengths,
and no reach-in to another analysis module's private names."""
from __future__ import annotations

import ast
import importlib
import pathlib
from types import SimpleNamespace

import numpy as np
import pytest
import xarray as xr

import synthetic
from sfxlin.analysis import c1, c1_kernels, c1_real, c2, c2_threshold, c3, c3_deep, c3_landscape, tables
from sfxlin.analysis.report import fit_table, fit_tables, verdicts
from sfxlin.analysis.tables import column, make_table, to_html, to_markdown, to_text
from sfxlin.engine.experiments import experiments

#: ``{experiment: (its analysis module, its synthetic file's factory)}`` of every experiment
ANALYSES = {name: (importlib.import_module(experiments()[name].analysis), make)
            for name, make in synthetic.FACTORIES.items()}


def small():
    """Two rows (d = 2, 5) by U_norm (0.1, 0.3): a float column with a NaN, an int column over d
    only, a template column with its own missing text, a boolean and a text column."""
    coords = {"d": [2, 5], "U_norm": [0.1, 0.3]}
    slope = xr.DataArray([[-1.23456, np.nan], [0.5, -4.5]], dims=("d", "U_norm"), coords=coords)
    return make_table({"slope": column(slope, "slope", ".3f"),
                       "n": column(xr.DataArray([3, 12], dims="d", coords={"d": [2, 5]}), "n", "d"),
                       "log10": column(slope * 2, "loose", "1e{:.1f}", missing="n/a (why)"),
                       "ok": column(slope < 0, "ok", ""),
                       "who": column(xr.DataArray([["a|b", "<c&d>"], ["e", "f"]], dims=("d", "U_norm"),
                                                  coords=coords), "who", "")},
                      title="T <1> & |x|", notes="first note\nsecond | note", formats={"U_norm": ".2f"})


def test_text_of_a_small_table():
    """Title, headers, rows in the order of the dims (numbers right-aligned, text left), NaN as
    n/a (or the column's own missing text), the notes."""
    assert to_text(small()) == "\n".join([
        "T <1> & |x|",
        "d  U_norm   slope   n      loose   ok  who",
        "2    0.10  -1.235   3     1e-2.5  yes  a|b",
        "2    0.30     n/a   3  n/a (why)   no  <c&d>",
        "5    0.10   0.500  12      1e1.0   no  e",
        "5    0.30  -4.500  12     1e-9.0  yes  f",
        "first note",
        "second | note"])


def test_markdown_of_a_small_table_escapes_the_pipe():
    assert to_markdown(small()) == "\n".join([
        "T <1> & |x|", "",
        "| d | U_norm | slope | n | loose | ok | who |",
        "|---:|---:|---:|---:|---:|---:|---|",
        "| 2 | 0.10 | -1.235 | 3 | 1e-2.5 | yes | a\\|b |",
        "| 2 | 0.30 | n/a | 3 | n/a (why) | no | <c&d> |",
        "| 5 | 0.10 | 0.500 | 12 | 1e1.0 | no | e |",
        "| 5 | 0.30 | -4.500 | 12 | 1e-9.0 | yes | f |", "",
        "first note", "", "second | note"])


def test_html_of_a_small_table_is_escaped_in_a_scrolling_box():
    page = to_html(small())
    assert page.startswith("<div class='fit-table'><p class='fit-title'>T &lt;1&gt; &amp; |x|</p>"
                           "<div class='fit-scroll'><table class='fit'><thead><tr><th>d</th><th>U_norm</th>")
    assert "<tr><td class='num'>2</td><td class='num'>0.30</td><td class='num'>n/a</td><td class='num'>3</td>" \
           "<td class='num'>n/a (why)</td><td class='num'>no</td><td>&lt;c&amp;d&gt;</td></tr>" in page
    assert page.endswith("<p class='fit-notes'>first note<br>second | note</p></div>")
    assert "<c&d>" not in page and "<1>" not in page


def test_a_spread_dim_gives_one_column_per_value_under_the_variable():
    ratio = xr.DataArray([[1.0, 2.0, 3.0]], dims=("d", "level"), coords={"d": [2], "level": [0.1, 0.03, 0.01]})
    t = make_table({"tests": column(xr.DataArray([400], dims="d", coords={"d": [2]}), "tests", "d"),
                    "ratio": column(ratio, "ratio by level", ".2f")}, column_dim="level", title="spread")
    assert to_text(t) == "\n".join(["spread",
                                    "          ratio by level",
                                    "d  tests   0.1  0.03  0.01",
                                    "2    400  1.00  2.00  3.00"])
    assert "| d | tests | ratio by level 0.1 | ratio by level 0.03 | ratio by level 0.01 |" in to_markdown(t)
    assert ("<tr><th rowspan='2'>d</th><th rowspan='2'>tests</th><th colspan='3'>ratio by level</th></tr>"
            "<tr><th>0.1</th><th>0.03</th><th>0.01</th></tr>") in to_html(t)


def test_a_scalar_table_is_one_row_an_empty_one_its_title_and_a_text_passes_through():
    scalar = make_table({"c2": column(1.14449, "c2", ".3f"), "n": column(1152, "n", "d")}, title="fit")
    empty = make_table({}, title="not fitted, needs >= 3 points")
    assert to_text({"a": scalar, "b": empty}) == "fit\n   c2     n\n1.144  1152\n\nnot fitted, needs >= 3 points"
    assert to_html(empty) == "<div class='fit-table'><p class='fit-title'>not fitted, needs &gt;= 3 points</p></div>"
    assert to_text("as <is>") == "as <is>" and to_markdown("x") == "```\nx\n```"
    assert to_html("a <b>") == "<pre>a &lt;b&gt;</pre>"


@pytest.mark.parametrize("name", sorted(ANALYSES))
def test_every_module_gives_labelled_tables(name):
    """Every table a Dataset with a title, every column with a header and a format; the three
    renderings of the lot work and the generic ``fit_table`` is their text."""
    module, make = ANALYSES[name]
    ds = make()
    got = module.fit_tables(ds)
    assert got and all(isinstance(t, xr.Dataset) for t in got.values())
    for key, t in got.items():
        assert t.attrs["title"], key
        for var in t.data_vars.values():
            assert var.attrs["long_name"] and "format" in var.attrs, (key, var.name)
        assert set(t.coords) <= set(t.dims), (key, "no stray coordinates")
    assert fit_table(ds) == to_text(got)
    assert "<table class='fit'>" in to_html(got) and "|---" in to_markdown(got)


@pytest.mark.parametrize("name", sorted(ANALYSES))
def test_one_mechanism_for_measures_verdicts_and_the_text(name):
    """A module's measures and verdicts are its CRITERIA's; its text is the generic renderer's
    (no per-module fit_table)."""
    module, _ = ANALYSES[name]
    assert module.measures == module.CRITERIA.measures and module.verdicts == module.CRITERIA.verdicts
    assert not hasattr(module, "fit_table")


def test_the_generic_lookups_honour_a_module_written_outside():
    """A module with a verdicts of its own (flags of its own) is judged by it; one without goes
    through its CRITERIA; one with a text fit_table and no tables gives that text."""
    ds = synthetic.c1()
    own = SimpleNamespace(CRITERIA=c1.CRITERIA, verdicts=lambda ds, resamples=100: ["own rows"],
                          fit_table=lambda ds: "own text", figure=c1.figure)
    assert verdicts(ds, own) == ["own rows"] and fit_tables(ds, own) == "own text"
    plain = SimpleNamespace(CRITERIA=c1.CRITERIA, fit_tables=c1.fit_tables, figure=c1.figure)
    assert [r.verdict for r in verdicts(ds, plain)] == [r.verdict for r in c1.CRITERIA.verdicts(ds)]
    assert list(fit_tables(ds, plain)) == ["slopes", "paper_form", "ar1"]


def _equal(table_column, values):
    np.testing.assert_array_equal(table_column.transpose(*values.dims).values, values.values)


def test_c1_tables_are_its_fits():
    ds = synthetic.c1()
    got = c1.fit_tables(ds)
    fit = c1.slopes(ds)
    for var in ("slope", "slope_se", "slope_ci_low", "slope_ci_high", "r2"):
        _equal(got["slopes"][var], fit[var])
    _equal(got["slopes"].sharp_ratio, c1.sharp_ratio(ds))
    pf = c1.paper_form(ds)
    assert [float(got["paper_form"][k]) for k in ("c2", "c2_se", "c1", "n")] == [float(pf[k]) for k in
                                                                               ("c2", "c2_se", "c1", "n")]
    # the SEs are cluster-robust over the independent units, and the tables say over how many
    assert fit.cov_type.item() == pf.cov_type.item() == "cluster"
    assert int(got["paper_form"].n_units) == int(pf.n_units) == 8                  # (d, U_norm, seed) cells
    assert "SE cluster-robust over 2 units (seed)" in got["slopes"].attrs["title"]
    assert "cluster-robust over the 8 (d, U_norm, seed) cells" in got["paper_form"].attrs["title"]


def test_c1_slope_table_against_least_squares():
    """The slope column is the OLS slope of log error on log L (numpy lstsq on the seed means)."""
    ds = synthetic.c1()
    ds["mse"] = ds.mse * xr.DataArray([1.0, 1.3, 0.8, 1.1, 0.9], dims="L")   # bumpy, so not exactly -1
    table = c1.fit_tables(ds)["slopes"]
    y = ds.mse.sel(law="gaussian").mean("seed")
    X = np.column_stack([np.ones(ds.sizes["L"]), np.log(ds.L.values)])
    for d in ds.d.values:
        for u in ds.U_norm.values:
            want = np.linalg.lstsq(X, np.log(y.sel(d=d, U_norm=u).values), rcond=None)[0][1]
            assert float(table.slope.sel(d=d, U_norm=u)) == pytest.approx(want, rel=1e-10)


def test_c1_kernels_tables_are_its_fits():
    ds = synthetic.c1_kernels()
    got = c1_kernels.fit_tables(ds)
    _equal(got["kernels"].slope, c1_kernels.slopes(ds).slope)
    _equal(got["kernels"].slope_se, c1_kernels.slopes(ds).slope_se)
    _equal(got["random_features"].slope_se_mc, c1_kernels.rf_slopes(ds, units="rf_draw").slope_se)
    assert "cluster-robust over 4 units (seed x query)" in got["kernels"].attrs["title"]
    _equal(got["kernels"].gain_z, c1_kernels.gain_z(ds))
    _equal(got["random_features"].slope, c1_kernels.rf_slopes(ds).slope)
    _equal(got["stein"].error, ds.stein_error)
    rf = got["random_features"]
    assert np.isinf(rf.constant.sel(rf_sigma2=2.0)) and np.isnan(rf.ratio.sel(rf_sigma2=2.0))  # m mse / inf: n/a
    last = ds.sel(rf_sigma2=0.1).isel(rf_m=-1)
    assert float(rf.ratio.sel(rf_sigma2=0.1)) == float(last.rf_m * last.rf_sq_error.mean("rf_draw") / last.rf_constant)
    assert "n/a (constant inf)" in to_text(rf)


def test_c1_real_tables_are_its_fits():
    ds = synthetic.c1_real()
    got = c1_real.fit_tables(ds)
    _equal(got["settings"].slope, c1_real.slopes(ds).slope)
    _equal(got["settings"].slope_se, c1_real.slopes(ds).slope_se)
    assert "cluster-robust over 2 units (seed)" in got["settings"].attrs["title"]
    _equal(got["settings"].relative_bias, c1_real.relative_bias(ds))
    _equal(got["settings"].crossover_L, c1_real.crossover_L(ds))
    _equal(got["settings"].judged, c1_real.in_regime(ds))
    _equal(got["bias_order"].order, c1_real.bias_order(ds))


def test_c2_tables_are_its_fits():
    ds = synthetic.c2()
    got = c2.fit_tables(ds)
    _equal(got["gradients"].slope, c2.gradient_slopes(ds).slope)
    _equal(got["gradients"].slope_hi, c2.gradient_slopes(ds, L_min=c2.upper_half_L(ds)).slope)
    _equal(got["gradients"].slope_se, c2.gradient_slopes(ds).slope_se)                 # cluster-robust over seeds
    _equal(got["gradients"].slope_se_ols, c2.gradient_slopes(ds, cov_type="nonrobust").slope_se)
    tr, tr_ols = c2.trajectory_exponents(ds), c2.trajectory_exponents(ds, cov_type="nonrobust")
    _equal(got["trajectory"].fixed, tr.fixed)
    _equal(got["trajectory"].uniform, tr.uniform)
    for var in ("fixed_se", "uniform_se"):
        _equal(got["trajectory"][var], tr[var])
        _equal(got["trajectory"][f"{var}_ols"], tr_ols[var])
    assert "over the 2 seeds" in got["gradients"].attrs["notes"]
    assert "over the 2 trajectory seeds" in got["trajectory"].attrs["notes"]
    _equal(got["trajectory_per_seed"].uniform, tr.uniform_seed)
    summary = c2.tail_summary(ds)
    assert {k: float(got["tail_summary"][k]) for k in summary} == pytest.approx(summary, nan_ok=True)
    _equal(got["tails"].clt_ratio, c2.clt_ratio(ds).ratio)


def test_c2_threshold_tables_are_its_fits():
    ds = synthetic.c2t()
    got = c2_threshold.fit_tables(ds)
    ex = c2_threshold.exponents(ds)
    for var in ("fixed", "fixed_se", "fixed_se_ols", "uniform", "uniform_se", "uniform_se_ols", "argmax_t"):
        _equal(got["exponents"][var], ex[var])
    assert "over the 2 seeds" in got["exponents"].attrs["notes"]
    for fit, se in (("threshold regression", "cluster"), ("sensitivity: OLS SE", "nonrobust"),
                    ("sensitivity: seed SE", "seed")):
        th = c2_threshold.threshold(ds, se=se)
        row = got["threshold"].sel(fit=fit)
        assert (float(row.break_tau), float(row.ci_low), float(row.ci_high)) == (th["break_tau"], *th["ci_tau"])
        assert float(row.slope_left) == th["fit"].slope_left and bool(row.covers_4) == th["covers_4"]
    boot = c2_threshold.threshold_bootstrap(ds)
    assert float(got["threshold_bootstrap"].break_se) == boot["break_se"]


def test_c3_tables_are_its_fits():
    ds = synthetic.c3()
    got = c3.fit_tables(ds)
    fit = c3.slopes(ds)     # quantities in the same order, labelled in the table by what they are
    assert got["slopes"].quantity.values[0] == "max_t D_inf (softmax)" and fit.quantity.values[0] == "D_inf"
    np.testing.assert_array_equal(got["slopes"].slope.transpose("quantity", "setting").values, fit.slope.values)
    D = c3.seed_summaries(ds).D_inf.sel(setting=c3.CONTROL)
    _equal(got["control"].D, D)


def test_c3_deep_tables_are_its_fits():
    ds = synthetic.c3_deep()
    got = c3_deep.fit_tables(ds)
    r = c3_deep.rates(ds)
    for var in ("slope", "median_slope", "constant", "growth", "cov_slope"):
        _equal(got["rates"][var], r[var])
    tr = c3_deep.training(ds)
    _equal(got["training"].risk_limit, tr.heldout_final_inf)


def test_c3_landscape_table_is_its_slopes():
    ds = synthetic.c3l()
    table = c3_landscape.fit_tables(ds)["settings"]
    sl = c3_landscape.slopes(ds)
    for col, var in (("excess_slope", "excess"), ("D_slope", "D_inf"), ("DlinL_slope", "D_linL"),
                     ("D_tail_slope", "D_inf_tail")):
        _equal(table[col], sl[var])


def test_c3_landscape_table_with_two_prompt_lengths_says_what_is_missing():
    """Two prompt lengths: no slope at all (the table used to crash in slopes()); the slope columns
    say they need 3, the tail slope that it needs 4; the rest of the table is shown."""
    ds = synthetic.c3l(L=(8, 16))
    table = c3_landscape.settings_table(ds)
    assert np.isnan(table.D_slope).all() and np.isnan(table.D_tail_slope).all()
    text = to_text(table)
    assert "n/a (needs 3 L)" in text and "n/a (needs 4 L)" in text
    np.testing.assert_array_equal(table.D_last.transpose(*c3_landscape.summaries(ds).D_inf.isel(L=-1).dims).values,
                                  c3_landscape.summaries(ds).D_inf.isel(L=-1).values)


def test_c3_landscape_tail_slope_needs_four_prompt_lengths():
    """Three prompt lengths: the slopes over every L are fitted (against lstsq); the tail slope,
    defined over the last four, is n/a (it used to fit the three there were)."""
    ds = synthetic.c3l(L=(8, 16, 32))
    ds["D_inf_max"] = ds.D_inf_max * xr.DataArray([1.0, 1.2, 0.9], dims="L")
    table = c3_landscape.settings_table(ds)
    assert np.isnan(c3_landscape.slopes(ds).D_inf_tail).all() and np.isnan(table.D_tail_slope).all()
    assert "n/a (needs 4 L)" in to_text(table) and "n/a (needs 3 L)" not in to_text(table)
    at = dict(covariance=ds.covariance.values[0], noise=ds.noise.values[0], d=ds.d.values[0], mean_norm=0.0)
    D = ds.D_inf_max.sel(model="softmax").sel(at).mean("seed").values
    X = np.column_stack([np.ones(3), np.log([8.0, 16.0, 32.0])])
    assert float(table.D_slope.sel(at)) == pytest.approx(np.linalg.lstsq(X, np.log(D), rcond=None)[0][1], rel=1e-10)


# ------------------------------------------------------------------------------------------ layering


def _private_reach_ins(tree: ast.Module) -> list:
    """``from .x import _name`` and ``module._name`` (``module`` imported here) in a module's AST."""
    found, modules = [], set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module != "__future__":
            found += [f"from {'.' * node.level}{node.module or ''} import {a.name}" for a in node.names
                      if a.name.startswith("_")]
            modules |= {a.asname or a.name for a in node.names if node.module is None}
        elif isinstance(node, ast.Import):
            modules |= {(a.asname or a.name).split(".")[0] for a in node.names}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in modules \
                and node.attr.startswith("_") and not node.attr.startswith("__"):
            found.append(f"{node.value.id}.{node.attr}")
    return found


def test_no_analysis_module_reaches_into_another_ones_private_names():
    root = pathlib.Path(tables.__file__).parent
    bad = {p.name: _private_reach_ins(ast.parse(p.read_text())) for p in sorted(root.glob("*.py"))}
    assert {k: v for k, v in bad.items() if v} == {}


def test_the_reach_in_check_sees_both_forms():
    tree = ast.parse("from .fits import _check_alpha, loglog_slope\nfrom . import fits\nfits._locate(1)\nnp.__name__")
    assert _private_reach_ins(tree) == ["from .fits import _check_alpha", "fits._locate"]
