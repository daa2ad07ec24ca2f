"""A toy experiment declared in one module, outside sfxlin: the mean of a Gaussian random walk.

What it computes (and nothing else): per cell (``scale x seed``), ``n_walks`` walks of ``L_max``
standard normal steps times ``scale``; the mean squared end point divided by ``L`` at every
nested ``L`` (exactly ``scale^2`` in expectation). Found by ``sfxlin`` through
``$SFXLIN_PIPELINES``; its analysis is ``walk_analysis``.
"""
import numpy as np

from sfxlin.engine.params import Param, Profiles
from sfxlin.engine.sweep import Experiment, Part, Variable

PARAMS = (
    Param("scale", "float_list", "step scales", Profiles(quick=[0.5, 2.0], paper=[0.5, 1.0, 2.0]), low=0,
          low_open=True, grid=True),
    Param("n_seeds", "int", "replicates per scale", 2, low=1, grid=True),
    Param("L", "int_list", "nested walk lengths", [4, 16, 64], low=1, order="increasing", min_len=2),
    Param("n_walks", "int", "walks per cell", 200, low=2),
    Param("root_seed", "int", "root of every cell's generator", 7),
)


def grid(config):
    return {"scale": list(config["scale"]), "seed": list(range(config["n_seeds"]))}


def inner_coords(config):
    return {"L": list(config["L"])}


def kernel(cell, rng, config):
    steps = cell["scale"] * rng.standard_normal((config["n_walks"], config["L"][-1]))
    ends = np.cumsum(steps, axis=1)[:, np.asarray(config["L"]) - 1]
    return {"msd": np.mean(ends**2, axis=0) / np.asarray(config["L"])}


EXPERIMENT = Experiment(
    name="walk", params=PARAMS, inner_coords=inner_coords, analysis="walk_analysis",
    variables=(Variable("msd", ("scale", "seed", "L"), "mean squared end point over L",
                        "mean over walks of (sum of the first L steps)^2 / L"),),
    parts=(Part("", grid, kernel),), title="A random walk's diffusion constant",
    description="toy: mean squared displacement of a Gaussian random walk, over L")
