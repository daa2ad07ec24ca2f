"""A family declared once and its variants (sfxlin.engine.family): the vocabulary taken with a variant's
values, swept parameters, the variables' dims, the inner coordinates, the checks and the cost model."""
import numpy as np
import pytest

from sfxlin.engine.family import COMMON, Cells, Cost, Family, grid_of, multiples
from sfxlin.engine.params import Param, Profiles
from sfxlin.engine.sweep import Out, Variable, build, run_cell


def _kernel(cell, rng, inputs):
    return {"y": Out(np.full(len(inputs["L"]), float(cell["d"])), ("L",)), "z": np.float64(inputs["n"])}


TOY = Family("toy", (Param("d", "int", "dimension", 2, low=1), Param("n", "int", "draws", 1, low=1),
                     Param("n_steps", "int", "steps", 4, low=0), Param("every", "int", "spacing", 2, low=1)),
             (Variable("y", ("L",), "y", "y per L."), Variable("z", (), "z", "z.")),
             coords={"L": lambda c: c["L"]}, checks=(multiples(("n_steps", "every")),),
             cost=Cost({"draw": 0.5, "cell": 1.0}, lambda config, part, cell: {"draw": config["n"] * cell["d"],
                                                                                 "cell": 1}))


def _variant(**kw):
    values = dict(d=Profiles(quick=[2, 3], paper=[2, 3, 4]), n=Profiles(quick=2, paper=5), L=[4, 8, 16],
                  n_seeds=2, root_seed=7)
    return TOY.variant("toy_variant", values=values, sweep=("d",),
                       cells=(Cells({"d": "d", "seed": "n_seeds"}, _kernel, ("y", "z")),), **kw)


def test_the_vocabulary_is_declared_once_and_common_is_joined():
    assert {p.name for p in COMMON} <= {p.name for p in TOY.params}
    with pytest.raises(ValueError, match=r"the parameter\(s\) \['d'\] are declared more than once"):
        Family("bad", (Param("d", "int", "a", 1), Param("d", "int", "b", 2)), ())
    with pytest.raises(ValueError, match="declares no parameter 'x'"):
        TOY.param("x")


def test_a_variant_takes_the_family_parameters_with_its_values():
    exp = _variant(changes={"n": {"doc": "draws of this variant", "high": 9}})
    params = {p.name: p for p in exp.params}
    assert set(params) == {"d", "n", "L", "n_seeds", "root_seed"}
    assert params["d"].kind == "int_list" and params["d"].grid and params["d"].unique   # swept
    assert params["n"].doc == "draws of this variant" and params["n"].high == 9 and params["n"].low == 1
    assert exp.configure("paper")["n"] == 5 and exp.configure("quick")["d"] == (2, 3)
    with pytest.raises(ValueError, match="changes name parameters not taken"):
        TOY.take({"d": 3}, {"n": {"doc": "x"}})


def test_variables_are_grid_then_inner_or_in_the_declared_order():
    exp = _variant()
    assert {v.name: v.dims for v in exp.variables} == {"y": ("d", "seed", "L"), "z": ("d", "seed")}
    ordered = _variant(order=("d", "L", "seed"))
    assert {v.name: v.dims for v in ordered.variables}["y"] == ("d", "L", "seed")
    assert TOY.output("y", over=("law",)).dims == ("law", "L") and TOY.output("y").dims == ("L",)


def test_the_module_is_the_callers_and_the_inner_coords_are_the_used_dims():
    exp = _variant()
    assert exp.module == __name__
    config = exp.configure("quick")
    assert exp.inner_coords(config) == {"L": [4, 8, 16]}
    ds = build(exp, config).compute(scheduler="synchronous")
    np.testing.assert_array_equal(ds.y.sel(d=3, seed=1).values, [3.0, 3.0, 3.0])
    assert run_cell(exp, config, {"d": 2, "seed": 0})["z"] == 2.0


def test_an_inner_dim_without_coordinates_is_refused():
    with pytest.raises(ValueError, match=r"no coordinates declared for the dims \['query'\]"):
        TOY.variant("toy_bad", values={"n": 1}, cells=(Cells({}, _kernel, (Variable("q", ("query",), "q", "q."),)),))


def test_the_family_checks_and_cost_model_reach_every_variant():
    exp = TOY.variant(
        "toy_steps", values=dict(n=1, n_steps=5, every=2, L=[4, 8, 16], n_seeds=1, root_seed=0, d=2),
        cells=(Cells({"seed": "n_seeds"}, lambda cell, rng, inputs: {"z": np.float64(1)}, ("z",)),))
    with pytest.raises(ValueError, match="n_steps: 5 must be a multiple of every = 2"):
        exp.configure("quick")
    variant = _variant()
    assert variant.cost(variant.configure("quick"), "", {"d": 3, "seed": 0}) == 0.5 * 2 * 3 + 1.0
    mine = _variant(cost=TOY.cost.counting(lambda config, part, cell: {"cell": 4}))
    assert mine.cost(mine.configure("quick"), "", {"d": 3, "seed": 0}) == 4.0


def test_a_grid_is_declared_by_its_sources():
    grid = grid_of({"a": "n", "b": "list", "c": ("x", "y"), "e": lambda c: [c["n"] * 10]})
    assert grid({"n": 3, "list": (0.5, 1.5)}) == {"a": [0, 1, 2], "b": [0.5, 1.5], "c": ["x", "y"], "e": [30]}
