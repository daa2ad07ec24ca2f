"""A toy experiment whose cells amplify a perturbation by a known factor: gradient descent on the quadratic
``f(x) = lam (x - x_star)^2 / 2`` with step ``lr``, ``x_{t+1} = x_star + r (x_t - x_star)``, ``r = 1 - lr lam``
(``|r| > 1``: a step past the edge of stability), from ``x_0 = x_star + delta``; the output is the trajectory
``y_t = x_t``, ``t = 0 .. n_steps``, and a constant that no trajectory reaches.

Its kernel perturbs the start alone (one call of the engine's step perturbation on ``x_0``), so the
amplification has a closed form: ``x_0 (1 + eps s)`` moves ``y_t`` by ``r^t x_0 eps s``, hence

    amplification = |x_0| max_t |r|^t / max_t |x_star + r^t delta|

whatever the sign ``s``. ``forget`` makes the kernel train without the perturbation (the engine must refuse
it). Found through ``$SFXLIN_PIPELINES`` (tests/test_sensitivity.py)."""
import numpy as np

from sfxlin.engine.params import Param
from sfxlin.engine.sensitivity import param as amplification_param, step_perturbation
from sfxlin.engine.sweep import Experiment, Part, Variable

PARAMS = (
    Param("r", "float_list", "contraction factors r = 1 - lr lam of the steps", [-1.5, 0.5], grid=True),
    Param("x_star", "float", "the minimiser", 1.0),
    Param("delta", "float", "the start's distance to the minimiser", 1e-3),
    Param("n_steps", "int", "gradient-descent steps", 20, low=0),
    Param("forget", "bool", "train without the engine's step perturbation", False),
    Param("root_seed", "int", "root of every cell's generator", 5),
    amplification_param(1e-10),
)


def grid(config):
    return {"r": list(config["r"])}


def inner_coords(config):
    return {"t": list(range(config["n_steps"] + 1))}


def trajectory(x0, x_star, r, n_steps):
    """``x_0, ..., x_{n_steps}`` of ``x_{t+1} = x_star + r (x_t - x_star)``."""
    xs = [x0]
    for _ in range(n_steps):
        xs.append(x_star + r * (xs[-1] - x_star))
    return np.array(xs)


def kernel(cell, rng, config):
    x0 = np.array(config["x_star"] + config["delta"])
    perturb = None if config["forget"] else step_perturbation()
    if perturb is not None:
        (x0,) = perturb(x0)
    return {"x": trajectory(float(x0), config["x_star"], cell["r"], config["n_steps"]),
            "constant": np.float64(config["x_star"])}


EXPERIMENT = Experiment(
    name="unstable", params=PARAMS, inner_coords=inner_coords,
    variables=(Variable("x", ("r", "t"), "iterate x_t", "gradient descent on lam (x - x_star)^2 / 2, r = 1 - lr lam"),
               Variable("constant", ("r",), "the minimiser", "x_star, reached by no trajectory")),
    parts=(Part("", grid, kernel, perturbed=True, grid_dims=("r",)),),
    description="toy: gradient descent on a quadratic past the edge of stability, its start perturbed")
