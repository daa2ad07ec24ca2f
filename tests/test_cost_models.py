"""The families' cost models: what ``sfxlin run --plan`` adds up and a run that declares processes decides
its local scheduler by (``Experiment.cost``, :class:`sfxlin.engine.family.Cost`).

Every part of every experiment has a positive estimate from its declarations; more of a parameter is
more cost; and the model's ratio between a scaled quick run and the quick run is within a factor of 3 of
the ratio the two runs' recorded cell seconds show on this machine (the rates are the reference
machine's: a ratio is what holds anywhere).
"""
import json

import pytest
import xarray as xr

from sfxlin.engine.cellstore import CellStore
from sfxlin.engine.execution import compute
from sfxlin.engine.experiments import experiments, get
from sfxlin.engine.plan import make_plan
from sfxlin.engine.storage import save, load
from sfxlin.engine.sweep import build, run_cell
from sfxlin.engine.verify import timeline_rows


def _first_cell(experiment, config, part):
    grid = experiment.part(part).grid(config)
    return {dim: values[0] for dim, values in grid.items()}


def _cost(name, part="", sets=()):
    experiment = get(name)
    config = experiment.configure("quick", list(sets))
    return experiment.cost(config, part, _first_cell(experiment, config, part))


@pytest.mark.parametrize("name", sorted(experiments()))
def test_every_part_has_a_positive_estimate(name):
    experiment = get(name)
    assert experiment.cost is not None, name
    for config in (experiment.configure("quick"), experiment.configure("paper")):
        for part in experiment.parts:
            seconds = experiment.cost(config, part.name, _first_cell(experiment, config, part.name))
            assert isinstance(seconds, float) and seconds > 0, (name, part.name, seconds)


#: (experiment, part, a change of a non-grid parameter that adds work to every cell of the part)
GROWS = [
    ("c1_limit", "", "n_prompts=16"), ("c1_limit", "", "ar1_rho=0.5,0.8"),
    ("c1_kernels", "", "n_prompts=16"), ("c1_kernels", "rf", "rf_draws=400"), ("c1_kernels", "stein", "stein_nodes=80"),
    ("c1_real", "", "n_queries=12"), ("c1_own", "", "n_prompts=24"), ("c1_own", "exact", "n_queries=16"),
    ("c2_concentration", "", "tail_prompts=512"), ("c2_concentration", "", "clt_draws=40000"),
    ("c2_concentration", "", "grad_draws=8"), ("c2_concentration", "trajectory", "traj_steps=200"),
    ("c2_concentration", "trajectory", "traj_replicates=2"),
    ("c2_threshold", "", "n_steps=400"), ("c2_threshold", "", "n_replicates=4"),
    ("c2_threshold", "families", "family_steps=400"), ("c2_threshold", "families", "n_pairs=8"),
    ("c3_transfer", "", "n_steps=400"), ("c3_transfer", "", "heldout_pairs=16"), ("c3_transfer", "", "L_eval=256"),
    ("c3_landscape", "", "n_steps=200"), ("c3_landscape", "", "heldout_pairs=16"), ("c3_horizon", "", "n_steps=120"),
    ("c3_real", "", "n_steps=200"), ("c3_real", "", "heldout_pairs=8"), ("c3_dim", "", "flow_max=4.0"),
    ("c3_dim", "", "lr_margin=0.005"),
    ("c3_dim", "", "task_ratio=8"), ("c3_shift", "", "n_steps=80"), ("c3_shift", "", "shifts=none,scale:2,subspace:2,rotate:1"),
    ("c3_shift", "", "L_eval=8,16,32,64"),
    ("c3_deep", "", "depth_max=3"), ("c3_deep", "", "n_pairs=4"), ("c3_deep", "", "L=8,16,32,64"),
    ("c3_deep", "train", "n_steps=20"),
]


@pytest.mark.parametrize("name, part, change", GROWS)
def test_more_of_a_parameter_is_more_cost(name, part, change):
    assert _cost(name, part, [change]) > _cost(name, part)


def _record(name, sets, out):
    """Compute ``name``'s quick cells under ``--set sets`` one at a time and save them as ``sfxlin run``
    does (its ``cell_seconds``): ``{part: recorded seconds}`` and the plan made before."""
    experiment = get(name)
    config = experiment.configure("quick", list(sets))
    plan = make_plan(experiment, config, out, workers=1, fresh=True)
    store = CellStore(out / f".{name}.cells", experiment, config, fresh=True)
    ds, _wall, _label = compute(build(experiment, config, store=store), scheduler="synchronous", progress=False)
    ds.attrs["cell_seconds"] = json.dumps(store.cell_seconds())
    save(ds, out / f"{name}.nc")
    with load(out / f"{name}.nc") as saved:
        rows = timeline_rows(saved)
    return {p.part: (p.cpu_seconds, sum(s for q, _c, s in rows if q == p.part)) for p in plan.parts}


#: (experiment, the part whose work grows, the scaled run's --set: several times the quick run's work per cell)
SCALED = [
    ("c1_real", "", ["n_prompts=32", "n_queries=12"]),
    ("c3_shift", "", ["n_steps=160", "heldout_pairs=16"]),
    ("c2_threshold", "", ["n_steps=600", "n_replicates=4", "family_steps=600"]),
]


@pytest.mark.parametrize("name, part, scaled", SCALED)
def test_the_model_scales_as_the_runs_do(name, part, scaled, tmp_path):
    experiment = get(name)
    config = experiment.configure("quick")
    run_cell(experiment, config, _first_cell(experiment, config, part), part)   # imports and caches warm first
    # the two runs in turn, up to three rounds, the fastest of each kept: a burst of the shared machine's
    # load in a run (seen: a measured ratio of 9.6 for a model's 2.2, and 8.0 for 2.6 with the faster of two
    # kept at a load of 8 on 2 cores) says nothing of the model; a model off by more than 3x stays off in
    # every round, so a round that agrees ends the test
    runs = []
    for j in range(3):
        runs += [_record(name, sets, tmp_path / f"{i}{j}")[part] for i, sets in enumerate(([], scaled))]
        (model_base, _), (model_scaled, _) = runs[0], runs[1]
        run_base, run_scaled = min(r for _m, r in runs[0::2]), min(r for _m, r in runs[1::2])
        modelled, measured = model_scaled / model_base, run_scaled / run_base
        if 1 / 3 < modelled / measured < 3:
            break
    assert modelled > 1.5 and 1 / 3 < modelled / measured < 3, (modelled, measured)
