"""A tiny synthetic experiment for the sweep / storage / execution tests.

Module-level functions only, so the experiment pickles into worker processes
(``scheduler="processes"``, ``LocalCluster``). Faults are injected through the config,
which keeps the kernel a pure function of ``(cell, rng, config)``:

* ``config["fault"]`` in ``{"none", "nan", "inf", "shape", "missing", "fperror", "global_nan"}``;
* ``config["fault_cell"]`` = ``"d=3,U_norm=0.5,seed=2"``, the cell that fails (``make_config``
  takes it as a dict).
"""
from __future__ import annotations

import threading

import numpy as np

from sfxlin.engine.params import Param
from sfxlin.engine.sweep import Experiment, Part, Variable

NAME = "toy"

#: number of kernel calls made in *this* process (the engine tests count cells with it)
CALLS = [0]
_LOCK = threading.Lock()


PARAMS = (
    Param("d", "int_list", "dimensions", [2, 3], low=1, grid=True),
    Param("U_norm", "float_list", "norms", [0.25, 0.5, 1.0], low=0, low_open=True, grid=True),
    Param("n_seeds", "int", "replicates", 4, low=1, grid=True),
    Param("L", "int_list", "prompt lengths", [8, 16, 32], low=1, order="increasing"),
    Param("n_queries", "int", "queries", 5, low=1),
    Param("root_seed", "int", "root seed", 1234),
    Param("fault", "str", "the fault to inject", "none",
          choices=("none", "nan", "inf", "shape", "missing", "fperror", "global_nan")),
    Param("fault_cell", "str", "the cell that fails, 'd=3,U_norm=0.5,seed=2' ('' for none)", ""),
)


def make_config(**overrides):
    """Every parameter's value, ``overrides`` applied (``fault_cell`` may be a ``{dim: value}`` dict)."""
    config = {p.name: p.value for p in PARAMS}
    config.update(overrides)
    if isinstance(config["fault_cell"], dict):
        config["fault_cell"] = ",".join(f"{k}={v!r}" for k, v in config["fault_cell"].items())
    if config["fault"] is None:
        config["fault"] = "none"
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
    target = config["fault_cell"]
    return bool(target) and target == ",".join(f"{k}={cell[k]!r}" for k in ("d", "U_norm", "seed"))


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
    fault = config["fault"]
    if fault != "none" and _is_fault_cell(cell, config):
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


def no_grid(config):
    return {}


def global_kernel(cell, rng, config):
    Ls = np.asarray(config["L"], dtype=float)
    out = {"log_L": np.log(Ls)}
    if config["fault"] == "global_nan":
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
    Variable("log_L", ("L",), "log prompt length", "natural log of L (a part without grid dims)", part="global"),
)

EXPERIMENT = Experiment(name=NAME, params=PARAMS, inner_coords=inner_coords, variables=VARIABLES,
                        parts=(Part("", grid, kernel), Part("global", no_grid, global_kernel)),
                        description="toy experiment for the engine tests")
