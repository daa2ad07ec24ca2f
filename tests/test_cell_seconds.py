"""What each cell cost to compute survives a rerun that serves kept cells: the kept cell files record
the seconds of their kernel, ``sfxlin run`` writes them as the results file's ``cell_seconds``, and
``sfxlin verify`` picks the cheapest cells by them (a rerun used to record the seconds it took to *read*
the kept cells)."""
import json
import time

import numpy as np
import xarray as xr

from sfxlin.engine.storage import load

from sfxlin.cli import main
from sfxlin.engine.cellstore import CellStore
from sfxlin.engine.execution import compute
from sfxlin.engine.sweep import Experiment, Part, Variable, build
from sfxlin.engine.verify import timeline_rows

PAUSE = 0.05   # seconds each toy cell's kernel sleeps: a lower bound of what computing it costs


def _toy():
    def kernel(cell, rng, inputs):
        time.sleep(PAUSE)
        return {"y": np.array(float(cell["a"]))}

    return Experiment(name="toy_seconds", inner_coords=lambda c: {}, variables=(Variable("y", ("a",), "y", "y."),),
                      parts=(Part("", lambda c: {"a": [1, 2, 3]}, kernel),))


def test_a_kept_cell_records_what_its_kernel_took_and_a_rerun_reads_it_back(tmp_path):
    toy, config = _toy(), {"root_seed": 0}
    store = CellStore(tmp_path / "cells", toy, config)
    assert [s for _p, _c, s in store.cell_seconds()] == [None, None, None]      # nothing kept yet
    compute(build(toy, config, store=store), scheduler="synchronous", progress=False)
    first = store.cell_seconds()
    assert [(p, c) for p, c, _s in first] == [("", {"a": 1}), ("", {"a": 2}), ("", {"a": 3})]
    assert all(s >= PAUSE for _p, _c, s in first)
    again = CellStore(tmp_path / "cells", toy, config)
    start = time.perf_counter()
    compute(build(toy, config, store=again), scheduler="synchronous", progress=False)
    assert time.perf_counter() - start < 3 * PAUSE       # every cell served, none slept
    assert again.cell_seconds() == first                 # the seconds of the run that computed them


def test_a_cell_kept_without_a_record_is_none_never_its_reading_time(tmp_path):
    toy, config = _toy(), {"root_seed": 0}
    store = CellStore(tmp_path / "cells", toy, config)
    store.save({"a": 1}, {"y": np.array(1.0)})                    # as kept by a version that recorded none
    store.save({"a": 2}, {"y": np.array(2.0)}, seconds=1.5)
    assert [s for _p, _c, s in store.cell_seconds()] == [None, 1.5, None]
    ds = xr.Dataset(coords={"a": [1, 2, 3]})
    ds.attrs["cell_seconds"] = json.dumps(store.cell_seconds())
    ds.attrs["cell_timeline"] = json.dumps([["a[0:1]", 0, 0.0, 0.001]])   # ignored when cell_seconds is there
    assert timeline_rows(ds) == [("", {"a": 2}, 1.5)]


def test_a_rerun_serving_every_cell_keeps_the_first_runs_cell_seconds(tmp_path):
    run = ["run", "c1_limit", "--profile", "quick", "--set", "n_prompts=16", "--local-scheduler", "synchronous",
           "--quiet", "--out", str(tmp_path)]
    assert main(run) == 0
    with load(tmp_path / "c1_limit.nc") as ds:
        seconds, timeline = ds.attrs["cell_seconds"], json.loads(ds.attrs["cell_timeline"])
        exponentials = ds.attrs["cell_exponentials"]
    counts = json.loads(exponentials)
    assert [(p, c) for p, c, _n in counts] == [(p, c) for p, c, _s in json.loads(seconds)]
    assert all(n > 0 for p, _c, n in counts if p == "") and all(n == 0 for p, _c, n in counts if p)
    assert main(run) == 0                                  # every cell kept: read, not computed
    with load(tmp_path / "c1_limit.nc") as ds:
        assert ds.attrs["cell_seconds"] == seconds
        assert ds.attrs["cell_exponentials"] == exponentials
        reread = json.loads(ds.attrs["cell_timeline"])
    assert sum(e - s for _b, _w, s, e in reread) < sum(e - s for _b, _w, s, e in timeline)
