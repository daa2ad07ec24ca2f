"""The sweep engine: laziness, one task per cell, labels, determinism across chunkings and
schedulers, single-cell reruns, validation of kernel outputs."""
from __future__ import annotations

import hashlib
import itertools
import zlib

import dask
import numpy as np
import pytest
import xarray as xr

from conftest import DaskComputed, raise_if_dask_computes
from sfxlin.pipelines import c1_limit
from sfxlin.engine.sweep import CellError, Experiment, Variable, build, cell_rng, run_cell
from sfxlin.testing import assert_same_results


def _cell(experiment, config, index):
    """The cell at an integer position of the grid, as the ``{dim: value}`` mapping run_cell takes."""
    return {dim: values[i] for (dim, values), i in zip(experiment.part().grid(config).items(), index)}

GRID_DIMS = ("d", "U_norm", "seed")


def _block_keys(ds, name):
    keys = set()
    for key in ds.__dask_graph__():
        k = key[0] if isinstance(key, tuple) else key
        if isinstance(k, str) and k.startswith(f"{name}-block-"):
            keys.add(k)
    return keys


def _assert_bitwise_identical(a, b):
    assert_same_results(a, b)


# --------------------------------------------------------------------------------------------
# laziness and the task graph
# --------------------------------------------------------------------------------------------
def test_raise_if_dask_computes_guard_works(toy, toy_config):
    ds = build(toy.EXPERIMENT, toy_config)
    with pytest.raises(DaskComputed), raise_if_dask_computes():
        ds.compute()


def test_build_computes_nothing(toy, toy_config):
    before = toy.CALLS[0]
    with raise_if_dask_computes():
        ds = build(toy.EXPERIMENT, toy_config)
        ds = build(toy.EXPERIMENT, toy_config, chunks={"seed": 2})
        ds = build(c1_limit.EXPERIMENT, c1_limit.EXPERIMENT.configure("quick"))
    assert toy.CALLS[0] == before
    for name in ds.data_vars:
        assert isinstance(ds[name].data, dask.array.Array), name


@pytest.mark.parametrize("chunks, n_blocks", [
    (None, 2 * 3 * 4),
    ({}, 2 * 3 * 4),
    ({"seed": 2}, 2 * 3 * 2),
    ({"U_norm": 2}, 2 * 2 * 4),  # uneven: blocks of 2 and 1
    ({"d": 2, "U_norm": 3, "seed": 4}, 1),
])
def test_one_task_per_block_of_cells(toy, toy_config, chunks, n_blocks):
    ds = build(toy.EXPERIMENT, toy_config, chunks=chunks)
    assert len(_block_keys(ds, toy.NAME)) == n_blocks
    for name in ds.data_vars:  # every cell variable reads every block
        if name != "log_L":
            assert len(_block_keys(ds[[name]], toy.NAME)) == n_blocks, name


def test_each_cell_runs_once_for_all_variables(toy, toy_config):
    ds = build(toy.EXPERIMENT, toy_config)
    before = toy.CALLS[0]
    ds.compute(scheduler="synchronous")
    assert toy.CALLS[0] - before == 24 and ds.attrs["n_cells"] == 24 + 1  # + the global part's cell


def test_c1_quick_has_one_task_per_cell():
    config = c1_limit.EXPERIMENT.configure("quick")
    ds = build(c1_limit.EXPERIMENT, config)
    n_cells = len(config["d"]) * len(config["U_norm"]) * config["n_seeds"]
    assert ds.attrs["n_cells"] == n_cells + 1  # and the quadrature check's one cell
    assert len(_block_keys(ds, c1_limit.NAME)) == n_cells


# --------------------------------------------------------------------------------------------
# labels
# --------------------------------------------------------------------------------------------
def test_dims_and_coords_carry_real_values(toy, toy_config):
    ds = build(toy.EXPERIMENT, toy_config)
    assert dict(ds.sizes) == {"d": 2, "U_norm": 3, "seed": 4, "L": 3, "query": 5}
    assert ds["d"].values.tolist() == [2, 3]
    assert ds["U_norm"].values.tolist() == [0.25, 0.5, 1.0]
    assert ds["seed"].values.tolist() == [0, 1, 2, 3]
    assert ds["L"].values.tolist() == [8, 16, 32]
    assert ds["query"].values.tolist() == [0, 1, 2, 3, 4]
    for var in toy.VARIABLES:  # dims ordered as declared
        assert ds[var.name].dims == var.dims
    assert ds["L"].attrs["long_name"] == "prompt length (tokens)" and ds["L"].attrs["units"] == "1"
    assert ds.attrs["experiment"] == "toy"
    assert ds.attrs["description"] == toy.EXPERIMENT.description


@pytest.mark.parametrize("experiment, config", [
    (c1_limit.EXPERIMENT, c1_limit.EXPERIMENT.configure("quick")),
    (c1_limit.EXPERIMENT, c1_limit.EXPERIMENT.configure("paper")),
    ("toy", None),
])
def test_every_variable_and_dim_is_labelled(toy, experiment, config):
    if experiment == "toy":
        experiment, config = toy.EXPERIMENT, toy.make_config()
    ds = build(experiment, config)
    assert set(ds.data_vars) == {v.name for v in experiment.variables}
    for name, arr in ds.data_vars.items():
        assert arr.attrs.get("long_name"), name
        assert arr.attrs.get("description"), name
        assert arr.dtype == np.float64, name
    for dim in ds.dims:
        assert dim in ds.coords, dim
        assert ds[dim].size == ds.sizes[dim]
    grid = experiment.part().grid(config)
    inner = experiment.inner_coords(config)
    for dim, values in {**grid, **inner}.items():
        assert ds[dim].values.tolist() == list(values), dim
    for dim in {"d", "U_norm", "L", "seed", "law", "query"} & set(ds.dims):
        assert ds[dim].attrs.get("long_name"), dim


# --------------------------------------------------------------------------------------------
# determinism
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("chunks", [{"seed": 2}, {"U_norm": 2, "seed": 3}, {"d": 2, "U_norm": 3, "seed": 4}])
def test_values_do_not_depend_on_chunking(toy, toy_config, toy_computed, chunks):
    other = build(toy.EXPERIMENT, toy_config, chunks=chunks).compute(scheduler="synchronous")
    _assert_bitwise_identical(toy_computed, other)


def test_values_do_not_depend_on_scheduler(toy, toy_config, toy_computed):
    ds = build(toy.EXPERIMENT, toy_config)
    for scheduler in ("threads", "processes"):
        _assert_bitwise_identical(toy_computed, ds.compute(scheduler=scheduler))


def test_c1_quick_does_not_depend_on_chunking_or_scheduler():
    config = c1_limit.EXPERIMENT.configure("quick")
    one = build(c1_limit.EXPERIMENT, config).compute(scheduler="synchronous")
    blocked = build(c1_limit.EXPERIMENT, config, chunks={"U_norm": 2, "seed": 2}).compute(scheduler="threads")
    _assert_bitwise_identical(one, blocked)
    # non-finite values only in variables flagged for them (never a silent NaN)
    for var in c1_limit.EXPERIMENT.variables:
        if not var.allow_nonfinite:
            assert np.isfinite(one[var.name]).all(), var.name


def test_values_do_not_depend_on_execution_order(toy, toy_config, toy_computed):
    """Computing cells one at a time, in reverse order, gives the same numbers."""
    ds = build(toy.EXPERIMENT, toy_config)
    cells = list(itertools.product(range(2), range(3), range(4)))
    for i, j, k in reversed(cells):
        part = ds.isel(d=i, U_norm=j, seed=k).compute(scheduler="synchronous")
        _assert_bitwise_identical(toy_computed.isel(d=i, U_norm=j, seed=k), part)


def test_cells_draw_from_their_own_generator(toy, toy_config, toy_computed):
    """Independent recomputation of the seeding rule and of the kernel's arithmetic."""
    grid = toy.grid(toy_config)
    Ls = np.asarray(toy_config["L"])
    tag = zlib.crc32(b"toy")

    def key(dim, value):  # sha256 of "dim=<exact text>", first 8 bytes, little-endian
        return int.from_bytes(hashlib.sha256(f"{dim}={value}".encode()).digest()[:8], "little")

    for index in itertools.product(*(range(len(v)) for v in grid.values())):
        d, U_norm, seed = (grid[dim][i] for dim, i in zip(grid, index))
        rng = np.random.default_rng([key("d", str(d)), key("U_norm", repr(U_norm)), key("seed", str(seed)),
                                     tag, toy_config["root_seed"]])
        noise, shift = toy.draws(rng, toy_config)
        value = U_norm * np.cumsum(noise, axis=1)[:, Ls - 1] / Ls + d * shift[:, None]
        got = toy_computed["value"].isel(d=index[0], U_norm=index[1], seed=index[2])
        assert got.dims == ("L", "query")
        assert np.array_equal(got.values, value.T)
        assert np.array_equal(toy_computed["first"].isel(d=index[0], U_norm=index[1], seed=index[2]).values,
                              value[:, 0])
    a = cell_rng("toy", {"d": 3, "U_norm": 0.5, "seed": 1}, 1234).standard_normal(5)
    b = np.random.default_rng([key("d", "3"), key("U_norm", "0.5"), key("seed", "1"), tag, 1234]).standard_normal(5)
    assert np.array_equal(a, b)
    # distinct cells, distinct root seeds and distinct experiments give distinct streams; a value is
    # keyed with its dim (seed=1 is not d=1) and by its exact text (the float 1.0 is not the integer 1)
    cells = [{"d": 0, "seed": 0}, {"d": 0, "seed": 1}, {"d": 1, "seed": 0}, {"d": 1.0, "seed": 0}]
    draws = {cell_rng(n, c, r).standard_normal() for n in ("toy", "other") for c in cells for r in (1, 2)}
    assert len(draws) == 16


@pytest.mark.parametrize("index", [(0, 0, 0), (1, 2, 3), (0, 1, 2), (1, 0, 1)])
def test_run_cell_reproduces_the_slice(toy, toy_config, toy_computed, index):
    out = run_cell(toy.EXPERIMENT, toy_config, _cell(toy.EXPERIMENT, toy_config, index))
    assert set(out) == {"value", "first", "grid_sum", "flagged"}
    cell = toy_computed.isel(dict(zip(GRID_DIMS, index)))
    for var in toy.EXPERIMENT.part_variables():
        inner_dims = [d for d in var.dims if d not in GRID_DIMS]
        expected = cell[var.name].transpose(*inner_dims).values
        assert np.array_equal(out[var.name], expected, equal_nan=True), var.name
    assert out["grid_sum"] == toy_config["d"][index[0]] + toy_config["U_norm"][index[1]] + index[2]


def test_run_cell_reproduces_a_c1_cell():
    config = c1_limit.EXPERIMENT.configure("quick")
    full = build(c1_limit.EXPERIMENT, config).compute(scheduler="threads")
    out = run_cell(c1_limit.EXPERIMENT, config, {"d": 3, "U_norm": 0.1, "seed": 1})
    cell = full.isel(d=1, U_norm=0, seed=1)
    for var in c1_limit.EXPERIMENT.part_variables():
        inner_dims = [d for d in var.dims if d not in ("d", "U_norm", "seed")]
        assert np.array_equal(out[var.name], cell[var.name].transpose(*inner_dims).values, equal_nan=True)


# --------------------------------------------------------------------------------------------
# validation of kernel outputs
# --------------------------------------------------------------------------------------------
FAULT_CELL = {"d": 3, "U_norm": 0.5, "seed": 2}


def _names_the_cell(message):
    return "toy[" in message and "d=3" in message and "U_norm=0.5" in message and "seed=2" in message


@pytest.mark.parametrize("fault, match", [
    ("nan", "non-finite values in value"),
    ("inf", "non-finite values in first"),
    ("shape", r"value has shape \(5, 3\), declared \(3, 5\)"),
    ("missing", "did not return variable 'first'"),
    ("fperror", "divide by zero"),
])
def test_invalid_cell_raises_cell_error(toy, fault, match):
    config = toy.make_config(fault=fault, fault_cell=FAULT_CELL)
    with pytest.raises(CellError, match=match) as info:
        run_cell(toy.EXPERIMENT, config, FAULT_CELL)
    assert _names_the_cell(str(info.value)), str(info.value)
    run_cell(toy.EXPERIMENT, config, {**FAULT_CELL, "seed": 1})  # the neighbour cell is fine
    ds = build(toy.EXPERIMENT, config)  # building stays lazy and silent
    for scheduler in ("synchronous", "threads"):
        with pytest.raises(CellError, match=match) as info:
            ds.compute(scheduler=scheduler)
        assert _names_the_cell(str(info.value)), str(info.value)


def test_cell_error_crosses_process_boundaries(toy):
    config = toy.make_config(fault="nan", fault_cell=FAULT_CELL)
    with pytest.raises(CellError) as info:
        build(toy.EXPERIMENT, config).compute(scheduler="processes")
    assert _names_the_cell(str(info.value))


def test_allow_nonfinite_variables_keep_their_nan(toy_computed):
    flagged = toy_computed["flagged"]
    assert np.isnan(flagged.sel(seed=0)).all()
    assert np.isfinite(flagged.sel(seed=[1, 2, 3])).all()
    for name in ("value", "first", "grid_sum", "log_L"):
        assert np.isfinite(toy_computed[name]).all(), name


def test_global_variables(toy, toy_config, toy_computed):
    ds = build(toy.EXPERIMENT, toy_config)
    assert [v.name for v in toy.EXPERIMENT.part_variables("global")] == ["log_L"]
    assert ds["log_L"].dims == ("L",)
    assert ds["log_L"].attrs["long_name"] == "log prompt length"
    np.testing.assert_array_equal(toy_computed["log_L"].values, np.log([8.0, 16.0, 32.0]))
    # one task for the part without grid dims
    globals_ = {k[0] if isinstance(k, tuple) else k for k in ds.__dask_graph__()}
    assert len({k for k in globals_ if isinstance(k, str) and k.startswith("toy/global-block-")}) == 1


def test_global_kernel_output_is_validated(toy):
    config = toy.make_config(fault="global_nan")
    with pytest.raises(CellError, match=r"toy/global\[\]: non-finite values in log_L"):
        build(toy.EXPERIMENT, config).compute(scheduler="synchronous")


def test_c1_global_quadrature_check():
    ds = build(c1_limit.EXPERIMENT, c1_limit.EXPERIMENT.configure("quick"))
    err = ds["quadrature_error"].compute(scheduler="synchronous")
    assert err.dims == ("D_quad",) and err.sizes["D_quad"] == 4
    assert float(err.max()) < 1e-8


# --------------------------------------------------------------------------------------------
# declaration errors
# --------------------------------------------------------------------------------------------
def _experiment(toy, **kw):
    fields = dict(name="toy", params=toy.PARAMS, inner_coords=toy.inner_coords, variables=toy.VARIABLES,
                  parts=toy.EXPERIMENT.parts)
    fields.update(kw)
    return Experiment(**fields)


def test_a_variable_of_an_undeclared_part_is_refused(toy):
    with pytest.raises(ValueError, match=r"toy.log_L: no part named 'global'"):
        _experiment(toy, parts=toy.EXPERIMENT.parts[:1])


def test_variable_missing_a_grid_dim(toy, toy_config):
    bad = toy.VARIABLES + (Variable("partial", ("d", "L"), "partial", "misses U_norm and seed"),)
    with pytest.raises(ValueError, match="partial"):
        build(_experiment(toy, variables=bad), toy_config)


def test_variable_with_unknown_inner_dim(toy, toy_config):
    bad = toy.VARIABLES + (Variable("odd", ("d", "U_norm", "seed", "row"), "odd", "row has no coordinate"),)
    with pytest.raises(ValueError, match="row"):
        build(_experiment(toy, variables=bad), toy_config)


@pytest.mark.parametrize("chunks, match", [
    ({"L": 2}, "not grid dims"),
    ({"seed": 0}, "positive integer"),
    ({"seed": 1.5}, "positive integer"),
])
def test_bad_chunks(toy, toy_config, chunks, match):
    with pytest.raises(ValueError, match=match):
        build(toy.EXPERIMENT, toy_config, chunks=chunks)


def test_substreams_depend_on_the_seed_and_the_key_only():
    """A substream is keyed by its values under the cell's seed: it does not move when the parent
    generator draws or when other substreams exist, and distinct keys or seeds give distinct streams."""
    from sfxlin.engine.sweep import substream

    fresh = cell_rng("toy", {"d": 2}, 5)
    used = cell_rng("toy", {"d": 2}, 5)
    used.standard_normal(100)
    substream(used, law="gaussian").standard_normal(7)
    a = substream(fresh, law="uniform").standard_normal(5)
    np.testing.assert_array_equal(a, substream(used, law="uniform").standard_normal(5))
    others = [substream(fresh, law="gaussian"), substream(fresh, scale=1.0), substream(fresh, scale=2.0),
              substream(cell_rng("toy", {"d": 3}, 5), law="uniform"), substream(cell_rng("toy", {"d": 2}, 6), law="uniform")]
    assert len({a[0], *(g.standard_normal() for g in others)}) == 6


# --------------------------------------------------------------------------------------------
# labelled kernel outputs: the Variable's dims are the one declaration of an output's layout
# --------------------------------------------------------------------------------------------
SEED = {"root_seed": 0}


def _labelled(returned_dims, shape):
    """A one-part experiment over ``seed`` whose kernel returns ``M[i, j] = 100 seed + 10 i + j`` for
    ``a = i`` (3 values), ``b = j`` (3 or 4), axes in the order ``returned_dims`` (as an :class:`Out`),
    declared ``(b, seed, a)``."""
    from sfxlin.engine.sweep import Out, Part

    def kernel(cell, rng, inputs):
        i, j = np.meshgrid(np.arange(3), np.arange(shape[1]), indexing="ij")
        M = 100.0 * cell["seed"] + 10 * i + j                            # axes (a, b)
        order = [("a", "b").index(d) for d in returned_dims if d in ("a", "b")]
        return {"M": Out(M.transpose(order) if len(order) == 2 else M, returned_dims)}

    return Experiment(name="labelled", inner_coords=lambda config: {"a": [0, 1, 2], "b": list(range(shape[1]))},
                      variables=(Variable("M", ("b", "seed", "a"), "M", "100 seed + 10 a + b"),),
                      parts=(Part("", lambda config: {"seed": [0, 1]}, kernel),))


@pytest.mark.parametrize("returned_dims", [("a", "b"), ("b", "a")])
@pytest.mark.parametrize("shape", [(3, 4), (3, 3)])   # square: a shape check alone could not tell a from b
def test_a_kernel_names_its_axes_and_the_engine_puts_them_in_the_declared_order(returned_dims, shape):
    exp = _labelled(returned_dims, shape)
    j, i = np.meshgrid(np.arange(shape[1]), np.arange(3), indexing="ij")  # declared inner order (b, a)
    out = run_cell(exp, SEED, {"seed": 1})
    np.testing.assert_array_equal(out["M"], 100.0 + 10 * i + j)
    ds = build(exp, SEED).compute(scheduler="synchronous")
    assert ds.M.dims == ("b", "seed", "a")
    for seed in (0, 1):
        for a in range(3):
            for b in range(shape[1]):
                assert ds.M.sel(seed=seed, a=a, b=b).item() == 100 * seed + 10 * a + b


@pytest.mark.parametrize("returned_dims, match", [
    (("a", "c"), r"labelled\[seed=0\]: M was returned with dims \('a', 'c'\), declared \('b', 'a'\) \(the dims "
                 r"\('b', 'seed', 'a'\) less the grid's\)"),
    (("a",), r"M was returned with dims \('a',\), declared \('b', 'a'\)"),
    (("a", "b", "seed"), r"M was returned with dims \('a', 'b', 'seed'\), declared \('b', 'a'\)"),
])
def test_a_kernel_output_with_other_dim_names_is_a_cell_error(returned_dims, match):
    with pytest.raises(CellError, match=match):
        run_cell(_labelled(returned_dims, (3, 4)), SEED, {"seed": 0})


def test_dim_names_that_do_not_fit_the_array_are_a_cell_error():
    from sfxlin.engine.sweep import Out, Part

    def flat(cell, rng, inputs):
        return {"M": Out(np.zeros(6), ("b", "a"))}

    exp = Experiment(name="flat", inner_coords=lambda config: {"a": [0, 1, 2], "b": [0, 1]},
                     variables=(Variable("M", ("a", "b"), "M", "a (3, 2) array"),),
                     parts=(Part("", lambda config: {}, flat),))
    with pytest.raises(CellError, match=r"flat\[\]: M has shape \(6,\), but its dims name 2 axes \('b', 'a'\)"):
        run_cell(exp, SEED, {})
