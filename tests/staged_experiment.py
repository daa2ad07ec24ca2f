"""A small experiment whose cells finish in stages (``sfxlin.sweep.Part.stages``), for the engine
tests. Module-level functions only, so it pickles into worker processes.

The kernel draws a random walk and returns its end point; stage 1 its running mean, stage 2 its
running maximum, both from the walk passed in the carry. ``fault`` injects a failure:
``"overlap"`` (stage 2 returns the kernel's variable again), ``"dict"`` (the kernel forgets the
carry), ``"stage_fp"`` (stage 1 raises FloatingPointError). Cells with ``seed == skip_seed`` return
every variable from the kernel with carry None (their stages are skipped).
"""
from __future__ import annotations

import threading

import numpy as np

from sfxlin.params import Param
from sfxlin.sweep import Experiment, Part, Variable

#: kernel and stage calls made in *this* process
CALLS = {"kernel": 0, "stage1": 0, "stage2": 0}
_LOCK = threading.Lock()

PARAMS = (
    Param("n_seeds", "int", "cells", 4, low=1, grid=True),
    Param("n_steps", "int", "steps of the walk", 50, low=1),
    Param("skip_seed", "int", "the seed whose kernel returns every variable (-1: none)", -1),
    Param("fault", "str", "the fault to inject", "none", choices=("none", "overlap", "dict", "stage_fp")),
    Param("root_seed", "int", "root seed", 7),
)


def _count(name):
    with _LOCK:
        CALLS[name] += 1


def grid(config):
    return {"seed": list(range(config["n_seeds"]))}


def inner_coords(config):
    return {"step": list(range(config["n_steps"]))}


def walk(rng, config):
    """The kernel's draws: reused by the tests to recompute a cell."""
    return np.cumsum(rng.standard_normal(config["n_steps"]))


def kernel(cell, rng, config):
    _count("kernel")
    x = walk(rng, config)
    if cell["seed"] == config["skip_seed"]:
        return {"end": x[-1], "running_mean": np.zeros_like(x), "running_max": np.zeros_like(x)}, None
    if config["fault"] == "dict":
        return {"end": x[-1]}
    return {"end": x[-1]}, {"x": x}


def running_mean(carry, config):
    _count("stage1")
    if config["fault"] == "stage_fp":
        raise FloatingPointError("overflow in the running mean")
    x = carry["x"]
    return {"running_mean": np.cumsum(x) / np.arange(1, len(x) + 1)}


def running_max(carry, config):
    _count("stage2")
    out = {"running_max": np.maximum.accumulate(carry["x"])}
    if config["fault"] == "overlap":
        out["end"] = carry["x"][-1]
    return out


VARIABLES = (
    Variable("end", ("seed",), "end point of the walk", "x[n_steps - 1] (kernel)"),
    Variable("running_mean", ("seed", "step"), "running mean of the walk", "stage 1"),
    Variable("running_max", ("seed", "step"), "running maximum of the walk", "stage 2"),
)

EXPERIMENT = Experiment(name="staged", params=PARAMS, inner_coords=inner_coords, variables=VARIABLES,
                        parts=(Part("", grid, kernel, stages=(running_mean, running_max)),),
                        description="cells finished in two stages")
