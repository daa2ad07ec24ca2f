"""Two cells that can finish only if they run at the same time (a rendezvous through files):
the test that a local process pool runs the cells of a small sweep in parallel.

Each cell writes ``<folder>/<seed>`` and waits (up to ``timeout`` seconds) for the other's file;
``met`` is 1 if it saw it. Run one after the other in one process, the first cell times out
(``met = 0``). Module-level functions only, so the experiment pickles into worker processes.
"""
from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np

from sfxlin.engine.params import Param
from sfxlin.engine.sweep import Experiment, Part, Variable

PARAMS = (
    Param("folder", "str", "where the cells leave their files", ""),
    Param("timeout", "float", "seconds a cell waits for the other", 30.0, low=0),
    Param("root_seed", "int", "root seed", 1),
)


def grid(config):
    return {"seed": [0, 1]}


def kernel(cell, rng, config):
    folder = Path(config["folder"])
    (folder / str(cell["seed"])).write_text(str(os.getpid()))
    other = folder / str(1 - cell["seed"])
    deadline = time.monotonic() + config["timeout"]
    while not other.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    return {"met": np.float64(other.exists())}


def inner_coords(config):
    return {}


EXPERIMENT = Experiment(name="rendezvous", params=PARAMS, inner_coords=inner_coords,
                        variables=(Variable("met", ("seed",), "met the other cell", "1 if both ran at once"),),
                        parts=(Part("", grid, kernel),), description="two cells that must run at the same time")
