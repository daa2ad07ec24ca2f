"""How much a cell amplifies rounding (sfxlin.engine.sensitivity): a toy whose cells amplify a perturbation by
a known factor (tests/declared/unstable_pipeline.py) against the closed form; what the engine declares for a
perturbed part; the step perturbation itself; the trainers' hook against an independent loop; the families'
runs that opt in."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from sfxlin import gradient_gap, icl, laws, training
from sfxlin.engine.experiments import experiments, get
from sfxlin.engine.sensitivity import (AMPLIFICATION, StepPerturbation, amplification, perturbing,
                                       step_perturbation, variable_name)
from sfxlin.engine.sweep import CellError, run_cell

sys.path.insert(0, str(Path(__file__).resolve().parent / "declared"))
import unstable_pipeline as toy  # noqa: E402

TOY = toy.EXPERIMENT


def _config(**values):
    return TOY.configure(None, values={**{p.name: p.value for p in toy.PARAMS}, **values})


def closed_form(config, r):
    """``|x_0| max_t |r|^t / max_t |y_t|``, ``y_t = x_star + r^t delta``: the toy's amplification."""
    t = np.arange(config["n_steps"] + 1)
    x0 = config["x_star"] + config["delta"]
    y = config["x_star"] + float(r) ** t * config["delta"]
    return abs(x0) * np.max(np.abs(float(r)) ** t) / np.max(np.abs(y))


@pytest.mark.parametrize("r", [-1.5, -1.1, 0.5, 0.9])
def test_the_amplification_of_a_step_past_the_edge_is_its_closed_form(r):
    config = _config(r=[r])
    out = run_cell(TOY, config, {"r": r})
    expected = closed_form(config, r)
    assert out["x_amplification"] == pytest.approx(expected, rel=1e-4)
    assert out["constant_amplification"] == 0.0                     # no trajectory reaches it
    if r == -1.5:
        assert expected > 700                                       # 1.5^20 1.001 / (1 + 1.5^20 delta) = 770


def test_the_outputs_do_not_depend_on_the_amplification_run():
    on, off = _config(), _config(**{AMPLIFICATION: 0.0})
    a, b = run_cell(TOY, on, {"r": -1.5}), run_cell(TOY, off, {"r": -1.5})
    np.testing.assert_array_equal(a["x"], b["x"])
    assert np.isnan(b["x_amplification"]) and np.isnan(b["constant_amplification"])    # not measured
    skipped = run_cell(TOY, on, {"r": -1.5}, amplification=False)                       # verify's way
    np.testing.assert_array_equal(skipped["x"], a["x"])
    assert np.isnan(skipped["x_amplification"])
    assert TOY.cell_inputs(on, {"r": -1.5})[AMPLIFICATION] == 1e-10   # it is part of what the cell computes


def test_a_perturbed_part_whose_kernel_applies_no_perturbation_is_refused():
    with pytest.raises(CellError, match=r"unstable\[r=-1.5\].*applied no step perturbation"):
        run_cell(TOY, _config(forget=True), {"r": -1.5})
    out = run_cell(TOY, _config(forget=True, **{AMPLIFICATION: 0.0}), {"r": -1.5})   # off: nothing to refuse
    assert np.isnan(out["x_amplification"])


def test_the_engine_declares_the_parameter_and_one_variable_per_output():
    declared = {v.name: v for v in TOY.variables}
    for output in ("x", "constant"):
        var = declared[variable_name(output)]
        assert var.dims == ("r",) and var.units == "1" and var.part == "" and var.allow_nonfinite
        assert var.long_name == f"amplification of rounding in {output}" and "eps = amplification_eps" in var.description
    assert TOY.amplified("") == {"x": "x_amplification", "constant": "constant_amplification"}
    (eps,) = [p for p in TOY.params if p.name == AMPLIFICATION]
    assert eps.value == 1e-10 and eps.parts == ("",)
    recorded = {p.name: p.value for p in toy.PARAMS if p.name != AMPLIFICATION}   # a file written before it existed
    assert TOY.configure(None, values=recorded)[AMPLIFICATION] == 0.0
    import dataclasses

    again = dataclasses.replace(TOY, name="unstable_copy")                         # declared once, not twice
    assert [v.name for v in again.variables] == [v.name for v in TOY.variables]


def test_a_perturbed_part_names_its_grid_dims():
    from sfxlin.engine.sweep import Experiment, Part

    with pytest.raises(ValueError, match="perturbed part '' must name its grid dims"):
        Experiment(name="x", params=toy.PARAMS, inner_coords=toy.inner_coords, variables=TOY.variables[:2],
                   parts=(Part("", toy.grid, toy.kernel, perturbed=True),))



def test_an_output_that_fails_only_in_the_amplification_run_names_that_run():
    from sfxlin.engine.sweep import Experiment, Part

    def overflowing(cell, rng, config):            # finite unperturbed, not finite perturbed
        out = toy.kernel(cell, rng, config)
        return {**out, "x": out["x"] * np.inf} if step_perturbation() is not None else out

    broken = Experiment(name="unstable", params=toy.PARAMS, inner_coords=toy.inner_coords,
                        variables=TOY.variables[:2],
                        parts=(Part("", toy.grid, overflowing, perturbed=True, grid_dims=("r",)),))
    out = run_cell(broken, _config(), {"r": 0.5}, amplification=False)      # the outputs alone: valid
    assert np.isfinite(out["x"]).all()
    with pytest.raises(CellError, match=r"^unstable\[r=0.5\] \(amplification run, eps 1e-10\): non-finite values in x$"):
        run_cell(broken, _config(), {"r": 0.5})

def test_the_step_perturbation_moves_every_entry_by_eps_and_keeps_zeros():
    a = np.array([[1.5, -2.0, 0.0], [3.25, 0.0, 1e-300]])
    eps = 2.0**-20
    p = StepPerturbation(np.random.default_rng(3), eps)
    (b,) = p(a)
    nonzero = a != 0
    np.testing.assert_array_equal(np.abs(b[nonzero] / a[nonzero] - 1), eps)
    assert np.all(b[~nonzero] == 0)
    b2, c2 = p(a, a[0])                         # several arrays, fresh signs each call
    assert p.calls == 2 and b2.shape == a.shape and c2.shape == (3,)
    (again,) = StepPerturbation(np.random.default_rng(3), eps)(a)
    np.testing.assert_array_equal(again, b)     # the same generator, the same perturbation
    signs = np.sign(np.stack([StepPerturbation(np.random.default_rng(s), eps)(np.ones(1000))[0] - 1
                              for s in range(2)]))
    assert 400 < np.sum(signs[0] > 0) < 600 and not np.array_equal(signs[0], signs[1])
    with pytest.raises(ValueError, match="positive"):
        StepPerturbation(np.random.default_rng(0), 0.0)


def test_amplification_is_the_largest_change_over_the_cells_scale():
    base = np.array([2.0, -4.0, np.nan])
    assert amplification(base, base.copy(), 1e-13) == 0.0
    moved = np.array([2.0 + 2.0**-38, -4.0, np.nan])                             # exact: 2 + 2^-38
    assert amplification(base, moved, 1e-13) == 2.0**-38 / 4.0 / 1e-13
    assert amplification(base, np.array([2.0, -4.0, 0.0]), 1e-13) == np.inf      # a NaN moved
    assert amplification(np.zeros(2), np.array([0.0, 1e-30]), 1e-13) == np.inf     # a zero output moved
    assert amplification(np.zeros(2), np.zeros(2), 1e-13) == 0.0


def test_step_perturbation_is_active_only_inside_its_block():
    p = StepPerturbation(np.random.default_rng(0), 1e-13)
    assert step_perturbation() is None
    with perturbing(p):
        assert step_perturbation() is p
    assert step_perturbation() is None


# ------------------------------------------------------------------ the trainers' hook


def _tasks(d=3, n_pairs=3, L_max=32, seed=1):
    return icl.make_tasks(np.random.default_rng(seed), d, n_pairs, 2, L_max, laws.covariate_law("gaussian", np.eye(d)))


class Recorder:
    """A perturbation that multiplies every array by ``factor`` and counts its calls."""

    def __init__(self, factor=1.0):
        self.factor, self.calls = factor, 0

    def __call__(self, *arrays):
        self.calls += 1
        return tuple(a * self.factor for a in arrays)


def test_train_all_arrays_applies_the_perturbation_after_every_update():
    tasks, Ls = _tasks(), (8, 16, 32)
    plain = training.train_all_arrays(tasks, Ls, n_steps=30, ckpt_every=10)
    identity = Recorder()
    same = training.train_all_arrays(tasks, Ls, n_steps=30, ckpt_every=10, perturb=identity)
    assert identity.calls == 30 * 3                                 # every step, every model
    for m in icl.MODELS:
        for k in ("U", "v", "risk"):
            np.testing.assert_array_equal(same[m][k], plain[m][k])
    moved = training.train_all_arrays(tasks, Ls, n_steps=30, ckpt_every=10, perturb=Recorder(1 + 2.0**-30))
    assert not np.array_equal(moved["softmax"]["U"][:, -1], plain["softmax"]["U"][:, -1])


def test_the_perturbed_trajectory_is_that_of_a_loop_of_perturbed_steps():
    """Independent: one step at a time from the last parameters, the factor applied by hand in between (the
    linear models' steps carry no state from one call to the next)."""
    tasks, factor = _tasks(), 1 + 2.0**-12
    run = training.train_all_arrays(tasks, (), models=("linear_inf",), n_steps=12, ckpt_every=1,
                                    perturb=Recorder(factor))["linear_inf"]
    U, v = icl.init_theta(tasks.d, tasks.second_moment)
    for t in range(1, 13):
        step = training.train_all_arrays(tasks, (), models=("linear_inf",), n_steps=1, ckpt_every=1, U0=U, v0=v)
        U, v = step["linear_inf"]["U"][-1] * factor, step["linear_inf"]["v"][-1] * factor
        np.testing.assert_array_equal(run["U"][t], U)
        np.testing.assert_array_equal(run["v"][t], v)


def test_the_simple_trainer_and_train_until_take_the_perturbation():
    tasks = _tasks()
    rec = Recorder()
    plain = training.train("linear", tasks, 16, n_steps=15, ckpt_every=5)
    same = training.train("linear", tasks, 16, n_steps=15, ckpt_every=5, perturb=rec)
    assert rec.calls == 15 and np.array_equal(same.U.values, plain.U.values)
    rec = Recorder()
    training.train_until(tasks, lambda U, v: False, max_steps=20, check_every=5, perturb=rec)
    assert rec.calls == 20


@pytest.mark.parametrize("trainer", gradient_gap.TRAINERS)
def test_the_gap_run_passes_the_perturbation_to_its_trainer(trainer):
    kw = dict(n_pairs=2, n_queries=2, n_replicates=1, lr=0.01, n_steps=10, ckpt_every=5, trainer=trainer)
    rec = Recorder()
    plain = gradient_gap.gradient_gap_trajectory(np.random.default_rng(2), np.eye(2), [8, 16, 32], **kw)
    same = gradient_gap.gradient_gap_trajectory(np.random.default_rng(2), np.eye(2), [8, 16, 32], perturb=rec, **kw)
    assert rec.calls == 10
    np.testing.assert_array_equal(same["g"], plain["g"])


# ------------------------------------------------------------------ the families' runs that opt in


def _perturbed_parts():
    for name, experiment in experiments().items():
        for part in experiment.parts:
            if part.perturbed:
                yield name, part.name


@pytest.mark.parametrize("name, part", list(_perturbed_parts()))
def test_every_perturbed_part_measures_its_cells_and_keeps_their_bits(name, part):
    """The first cell of every perturbed part at the quick profile: its kernel takes the perturbation (the
    engine refuses one that does not), every output's amplification is measured, and the outputs are
    those of the run without it, bit for bit."""
    experiment = get(name)
    on = experiment.configure("quick", [f"{AMPLIFICATION}=1e-13"])
    off = experiment.configure("quick")
    grid = experiment.part(part).grid(on)
    cell = {dim: values[0] for dim, values in grid.items()}
    a, b = run_cell(experiment, on, cell, part), run_cell(experiment, off, cell, part)
    amplified = experiment.amplified(part)
    assert amplified and set(amplified.values()) <= set(a)
    for output, name_amp in amplified.items():
        np.testing.assert_array_equal(a[output], b[output])
        assert a[name_amp] >= 0 and not np.isnan(a[name_amp]), (output, a[name_amp])
        assert np.isnan(b[name_amp])


def test_the_families_unstable_cell_amplifies_rounding_to_its_own_size():
    """c2_threshold's families cell at kms:0.5, tau 0.75 (quick profile) runs past the edge of stability:
    a perturbation of 1e-13 moves g_family by percents (amplification > 1e10); at tau = 14.8 it does not."""
    E = get("c2_threshold")
    config = E.configure("quick", [f"{AMPLIFICATION}=1e-13"])
    unstable = run_cell(E, config, {"family": "kms:0.5", "tau": 0.75, "family_seed": 0}, "families")
    stable = run_cell(E, config, {"family": "kms:0.5", "tau": max(config["tau"]), "family_seed": 0}, "families")
    assert unstable["g_family_amplification"] > 1e10
    assert stable["g_family_amplification"] < 1e3
    assert unstable["off_block_family_amplification"] == 0.0      # exact zeros stay zero (pairs summed first)


def test_the_amplification_run_doubles_the_cost_of_the_perturbed_parts_only():
    E = get("c2_threshold")
    off, on = E.configure("paper", [f"{AMPLIFICATION}=0"]), E.configure("paper")
    assert on[AMPLIFICATION] > 0
    for part in E.parts:
        cell = {dim: values[0] for dim, values in part.grid(on).items()}
        runs = 2 if part.perturbed else 1
        assert E.cost(on, part.name, cell) == runs * E.cost(off, part.name, cell), part.name


def test_the_paper_profile_measures_amplification_where_it_was_decided():
    """docs/performance.md section 10: the paper files of these experiments state it per cell."""
    measured = {name for name, e in experiments().items()
                if any(p.perturbed for p in e.parts) and e.configure("paper")[AMPLIFICATION] > 0}
    assert measured == {"c2_threshold", "c2_concentration", "c3_transfer", "c3_landscape", "c3_real"}
    assert all(e.configure("quick").get(AMPLIFICATION, 0.0) == 0.0 for e in experiments().values())



def test_a_cells_amplification_is_its_own_whatever_the_grid_around_it():
    """The perturbation draws from a generator keyed by the cell's coordinate values (as its own draws): the
    same cell in another grid gives the same bits, here where the response depends on the signs drawn (a cell
    past the edge of stability)."""
    E = get("c2_threshold")
    cell = {"family": "kms:0.5", "tau": 0.75, "family_seed": 0}
    wide = E.configure("quick", [f"{AMPLIFICATION}=1e-13"])
    other = E.configure("quick", [f"{AMPLIFICATION}=1e-13", "tau=0.5,0.75,1,2,4,8", "families=power_law:1.0,kms:0.5"])
    a, b = run_cell(E, wide, cell, "families"), run_cell(E, other, cell, "families")   # another place in the grid
    assert a["g_family_amplification"] == b["g_family_amplification"]
