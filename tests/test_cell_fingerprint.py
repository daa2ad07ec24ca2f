"""The fingerprint of a kept cell names its part: two parts of one experiment with the same grid
and the same inputs but different kernels keep their cells apart in a :class:`CellStore`.

No shipped experiment has such a pair (their parts differ in grid or inputs), so only this
custom experiment shows it: were the part left out of :func:`cell_fingerprint`, the second part's
cells would overwrite the first's files and a run from the kept cells would serve one part's
outputs to the other (or fail on a missing variable).
"""
from __future__ import annotations

import threading

import numpy as np

from sfxlin.engine.cellstore import CellStore, cell_fingerprint
from sfxlin.engine.params import Param
from sfxlin.engine.sweep import Experiment, Part, Variable, build, cell_rng

PARAMS = (
    Param("n_seeds", "int", "replicates", 3, low=1, grid=True),
    Param("n_draws", "int", "draws per cell", 4, low=1),
    Param("root_seed", "int", "root seed", 7),
)

#: kernel calls per part in this process (a run from kept cells makes none)
CALLS = {"": 0, "twin": 0}
_LOCK = threading.Lock()


def grid(config):
    return {"seed": list(range(config["n_seeds"]))}


def inner_coords(config):
    return {"draw": list(range(config["n_draws"]))}


def _count(part):
    with _LOCK:
        CALLS[part] += 1


def kernel_sum(cell, rng, inputs):
    """Main part: the cell's standard normal draws plus its seed."""
    _count("")
    return {"x": rng.standard_normal(inputs["n_draws"]) + cell["seed"]}


def kernel_square(cell, rng, inputs):
    """Twin part (same grid, same inputs): 100 + the square of its draws, never equal to ``x``."""
    _count("twin")
    return {"y": 100.0 + rng.standard_normal(inputs["n_draws"]) ** 2}


EXPERIMENT = Experiment(
    name="twin_parts", params=PARAMS, inner_coords=inner_coords,
    variables=(Variable("x", ("seed", "draw"), "main part's value", "normal draw + seed"),
               Variable("y", ("seed", "draw"), "twin part's value", "100 + squared normal draw", part="twin")),
    parts=(Part("", grid, kernel_sum), Part("twin", grid, kernel_square)),
    description="two parts with one grid and one set of inputs, different kernels")


def _expected(config):
    """``x`` and ``y`` recomputed from each part's generator (tags ``twin_parts``, ``twin_parts/twin``)."""
    n = config["n_draws"]
    seeds = range(config["n_seeds"])
    x = [cell_rng("twin_parts", {"seed": s}, config["root_seed"]).standard_normal(n) + s for s in seeds]
    y = [100.0 + cell_rng("twin_parts/twin", {"seed": s}, config["root_seed"]).standard_normal(n) ** 2
         for s in seeds]
    return np.array(x), np.array(y)


def test_two_parts_with_one_grid_and_one_set_of_inputs_keep_their_own_cells(tmp_path):
    config = EXPERIMENT.configure("quick")
    cells = [{"seed": s} for s in range(config["n_seeds"])]
    for cell in cells:   # the premise: nothing but the part tells the two cells apart
        assert EXPERIMENT.cell_inputs(config, cell, "") == EXPERIMENT.cell_inputs(config, cell, "twin")
    main = {cell_fingerprint(EXPERIMENT, config, cell, "") for cell in cells}
    twin = {cell_fingerprint(EXPERIMENT, config, cell, "twin") for cell in cells}
    assert len(main) == len(twin) == len(cells) and not main & twin

    x, y = _expected(config)
    runs = []
    for _ in range(2):   # the second run from the cells the first kept
        CALLS.update({"": 0, "twin": 0})
        store = CellStore(tmp_path, EXPERIMENT, config)
        ds = build(EXPERIMENT, config, store=store).compute(scheduler="synchronous")
        runs.append(dict(CALLS))
        np.testing.assert_array_equal(ds.x.transpose("seed", "draw").values, x)
        np.testing.assert_array_equal(ds.y.transpose("seed", "draw").values, y)
    assert runs == [{"": 3, "twin": 3}, {"": 0, "twin": 0}]
    assert len(list(tmp_path.glob("cell_*.npz"))) == 2 * len(cells) == store.count()
