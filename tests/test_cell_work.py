"""Every pipeline's ``cell_work``: what ``sfxlin run --plan`` scales its cost laws by.

Unit checks of each declared formula (the parameters it is proportional to, its None parts), and,
for the cheapest experiments, the plan of a quick run with larger non-grid parameters against the
seconds per cell that run records, its laws fitted on a quick run recorded a moment before on this
machine (as tests/test_plan.py does for c1_limit).
"""
import importlib
import json

import pytest
import xarray as xr

from sfxlin.engine.cellstore import CellStore
from sfxlin.engine.execution import compute
from sfxlin.engine.experiments import experiments, get
from sfxlin.engine.plan import cell_work, make_plan, timeline_rows
from sfxlin.engine.storage import save
from sfxlin.engine.sweep import build


def _work(name, part="", sets=()):
    experiment = get(name)
    return cell_work(experiment, experiment.configure("quick", list(sets)), part)


def _module(name):
    return importlib.import_module(get(name).part("").kernel.__module__)


#: parts whose cost is what their paper cells cost (a docstring says why)
UNDECLARED = {("c1_limit", "quadrature"), ("c2_concentration", "trajectory_constants"), ("c2_threshold", "constants"),
              ("c2_threshold", "family_constants"), ("c3_landscape", "covariance"), ("c3_dim", ""),
              ("c3_deep", "train")}


@pytest.mark.parametrize("name", sorted(experiments()))
def test_every_part_declares_a_positive_work_or_none(name):
    experiment = get(name)
    assert callable(getattr(_module(name), "cell_work", None)), name
    for config in (experiment.configure("quick"), experiment.configure("paper")):
        for part in experiment.parts:
            work = cell_work(experiment, config, part.name)
            if (name, part.name) in UNDECLARED:
                assert work is None, (name, part.name)
            else:
                assert work > 0, (name, part.name, work)


#: (experiment, part, its fixed cost's name, the quick profile's value of a parameter, that value doubled):
#: the work less the fixed cost doubles
LINEAR = [
    ("c1_kernels", "", "MAIN_OVERHEAD_WORK", "n_prompts=8", "n_prompts=16"),
    ("c1_kernels", "rf", "RF_OVERHEAD_WORK", "rf_draws=200", "rf_draws=400"),
    ("c1_kernels", "stein", "STEIN_OVERHEAD_WORK", "Sigma=1.5,1.0", "Sigma=1.5,1.0,0.5,0.25"),   # nodes ** D: squared
    ("c1_real", "", "CELL_OVERHEAD_WORK", "n_queries=6", "n_queries=12"),
    ("c1_own", "", "MAIN_OVERHEAD_WORK", "n_prompts=12", "n_prompts=24"),
    ("c1_own", "exact", "EXACT_OVERHEAD_WORK", "n_queries=8", "n_queries=16"),
    ("c3_horizon", "", "CELL_OVERHEAD_WORK", "n_steps=60", "n_steps=120"),
]


@pytest.mark.parametrize("name, part, fixed, base, doubled", LINEAR)
def test_work_less_its_fixed_cost_scales_with_the_parameter(name, part, fixed, base, doubled):
    overhead = getattr(_module(name), fixed)
    ratio = (_work(name, part, [doubled]) - overhead) / (_work(name, part, [base]) - overhead)
    assert ratio == pytest.approx(60 ** 2 if name == "c1_kernels" and part == "stein" else 2.0, rel=1e-12)


#: (experiment, part, a change of a non-grid parameter that adds work to every cell of the part)
GROWS = [
    ("c2_concentration", "", "tail_prompts=512"), ("c2_concentration", "", "clt_draws=40000"),
    ("c2_concentration", "", "grad_draws=8"), ("c2_concentration", "trajectory", "traj_steps=200"),
    ("c2_concentration", "trajectory", "traj_replicates=2"),
    ("c2_threshold", "", "n_steps=400"), ("c2_threshold", "", "n_replicates=4"),
    ("c2_threshold", "families", "family_steps=400"), ("c2_threshold", "families", "n_pairs=8"),
    ("c3_transfer", "", "n_steps=400"), ("c3_transfer", "", "heldout_pairs=16"), ("c3_transfer", "", "L_eval=256"),
    ("c3_landscape", "", "n_steps=200"), ("c3_landscape", "", "heldout_pairs=16"),
    ("c3_real", "", "n_steps=200"), ("c3_real", "", "datasets=digits,wine"), ("c3_real", "", "heldout_pairs=8"),
    ("c3_shift", "", "n_steps=80"), ("c3_shift", "", "shifts=none,scale:2,subspace:2,rotate:1"),
    ("c3_shift", "", "L_eval=8,16,32,64"),
    ("c3_deep", "", "depth_max=3"), ("c3_deep", "", "n_pairs=4"), ("c3_deep", "", "L=8,16,32,64"),
]


@pytest.mark.parametrize("name, part, change", GROWS)
def test_more_of_a_parameter_is_more_work(name, part, change):
    assert _work(name, part, [change]) > _work(name, part)


def test_the_c3_engine_work_is_linear_in_steps_pairs_and_token_visits():
    """``train_work``: ``n_steps`` times (pairs x queries x (sum L + BLOCK_WORK per L) + STEP_WORK)."""
    from sfxlin.pipelines.c3_transfer import BLOCK_WORK, STEP_WORK, train_work

    Ls = [8, 16, 32]
    assert train_work(10, 4, 2, Ls) == 10 * (8 * (56 + 3 * BLOCK_WORK) + STEP_WORK)
    assert train_work(20, 4, 2, Ls) == 2 * train_work(10, 4, 2, Ls)
    assert train_work(10, 4, 2, Ls, support=100) - train_work(10, 4, 2, Ls) == 10 * 8 * (100 + BLOCK_WORK)


# --------------------------------------------------------------------------- the plan against a run


def _record(name, sets, out):
    """Compute ``name``'s quick cells under ``--set sets`` one at a time and save them as ``sfxlin run``
    does (its ``cell_seconds``), without the analysis: the file a cost law is fitted on."""
    experiment = get(name)
    config = experiment.configure("quick", list(sets))
    store = CellStore(out / f".{name}.cells", experiment, config, fresh=True)
    ds, _wall, _label = compute(build(experiment, config, store=store), scheduler="synchronous", progress=False)
    ds.attrs["cell_seconds"] = json.dumps(store.cell_seconds())
    save(ds, out / f"{name}.nc")
    with xr.open_dataset(out / f"{name}.nc") as saved:
        rows = timeline_rows(saved)
    return config, {part.name: sum(s for p, _c, s in rows if p == part.name) for part in experiment.parts}


#: (experiment, the calibration run's --set, the planned run's --set: several times its work per cell)
SCALED = [
    ("c1_real", ["n_prompts=8"], ["n_prompts=32", "n_queries=12"]),
    ("c3_shift", ["n_steps=40"], ["n_steps=160", "heldout_pairs=16"]),
    ("c2_threshold", ["n_steps=200"], ["n_steps=600", "n_replicates=4", "family_steps=600"]),
]


@pytest.mark.parametrize("name, base, scaled", SCALED)
def test_plan_of_a_scaled_run_within_a_factor_3(name, base, scaled, tmp_path):
    """The plan of the scaled run, its laws fitted on the calibration run recorded just before
    (``results_dir``), against the seconds per cell the scaled run records: per declared part and in
    total."""
    experiment = get(name)
    _record(name, base, tmp_path / "base")
    config = experiment.configure("quick", scaled)
    plan = make_plan(experiment, config, tmp_path / "scaled", workers=1, results_dir=tmp_path / "base")
    _config, measured = _record(name, scaled, tmp_path / "scaled")
    for p in plan.parts:
        if (name, p.part) in UNDECLARED:
            continue
        assert p.law.work_ref is not None and cell_work(experiment, config, p.part) > p.law.work_ref
        assert 1 / 3 < p.cpu_seconds / measured[p.part] < 3, (p.part, p.cpu_seconds, measured[p.part])
    assert 1 / 3 < plan.cpu_seconds / sum(measured.values()) < 3
