"""A tiny synthetic experiment for the sweep / storage / execution tests.

Module-level functions only, so the experiment pickles into worker processes
(``scheduler="processes"``, ``LocalCluster``). Faults are injected through the config,
which keeps the kernel a pure function of ``(cell, rng, config)``:

* ``config["fault"]`` in ``{None, "nan", "inf", "shape", "missing", "fperror", "global_nan"}``;
* ``config["fault_cell"]`` = ``{"d": ..., "U_norm": ..., "seed": ...}``, the cell that fails.
"""
from __future__ import annotations

import threading

import numpy as np

from sfxlin.sweep import Experiment, Variable

NAME = "toy"

#: number of kernel calls made in *this* process (the engine tests count cells with it)
CALLS = [0]
_LOCK = threading.Lock()


def make_config(**overrides):
    config = {"d": [2, 3], "U_norm": [0.25, 0.5, 1.0], "n_seeds": 4, "L": [8, 16, 32],
              "n_queries": 5, "root_seed": 1234, "fault": None, "fault_cell": None}
    config.update(overrides)
    return config


def grid(config):
    return {"d": list(config["d"]), "U_norm": list(config["U_norm"]), "seed": list(range(config["n_seeds"]))}


def inner_coords(config):
    return {"L": list(config["L"]), "query": list(range(config["n_queries"]))}


def draws(rng, config):
    """The kernel's random draws, in order: reused by the tests to recompute a cell."""
    Ls = np.asarray(config["L"])
    noise = rng.standard_normal((config["n_queries"], Ls[-1]))  # (query, L_max)
    shift = rng.uniform(size=config["n_queries"])
    return noise, shift


def _is_fault_cell(cell, config):
    target = config.get("fault_cell")
    return target is not None and all(cell[k] == v for k, v in target.items())


def kernel(cell, rng, config):
    with _LOCK:
        CALLS[0] += 1
    d, U_norm = int(cell["d"]), float(cell["U_norm"])
    Ls = np.asarray(config["L"])
    noise, shift = draws(rng, config)
    csum = np.cumsum(noise, axis=1)[:, Ls - 1]  # (query, L): nested prompt sums
    value = U_norm * csum / Ls + d * shift[:, None]  # (query, L)
    out = {
        "value": value.T,  # declared (d, U_norm, L, seed, query) -> inner shape (L, query)
        "first": value[:, 0],  # (query,)
        "grid_sum": np.array(d + U_norm + cell["seed"]),  # scalar per cell
        # allowed NaN by design in the seed-0 cells
        "flagged": np.where(cell["seed"] == 0, np.nan, shift.sum()) * np.ones(len(Ls)),
    }
    fault = config.get("fault")
    if fault is not None and _is_fault_cell(cell, config):
        if fault == "nan":
            out["value"] = out["value"].copy()
            out["value"][1, 2] = np.nan
        elif fault == "inf":
            out["first"] = np.full_like(out["first"], np.inf)
        elif fault == "shape":
            out["value"] = value  # transposed: (query, L) instead of (L, query)
        elif fault == "missing":
            del out["first"]
        elif fault == "fperror":
            with np.errstate(divide="raise"):
                np.float64(1.0) / np.float64(0.0)
    return out


def global_kernel(config):
    Ls = np.asarray(config["L"], dtype=float)
    out = {"log_L": np.log(Ls)}
    if config.get("fault") == "global_nan":
        out["log_L"] = out["log_L"] * np.nan
    return out


VARIABLES = (
    Variable("value", ("d", "U_norm", "L", "seed", "query"), "toy value",
             "U_norm * (mean of the first L standard normal draws) + d * uniform shift", units="1"),
    Variable("first", ("query", "d", "U_norm", "seed"), "value at the smallest L",
             "the value at L = L[0], declared query-first to exercise the transpose"),
    Variable("grid_sum", ("d", "U_norm", "seed"), "sum of the grid coordinates", "d + U_norm + seed"),
    Variable("flagged", ("d", "U_norm", "seed", "L"), "flagged outcome",
             "sum of the shifts, NaN by design in the seed-0 cells", allow_nonfinite=True),
    Variable("log_L", ("L",), "log prompt length", "natural log of L (global kernel, no grid dim)"),
)

EXPERIMENT = Experiment(name=NAME, grid=grid, inner_coords=inner_coords, variables=VARIABLES, kernel=kernel,
                        description="toy experiment for the engine tests", global_kernel=global_kernel,
                        grid_keys=("d", "U_norm", "n_seeds"))
