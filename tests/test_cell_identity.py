"""A cell is its coordinate values and its inputs: the same cell gives the same bits in any grid,
and a kept cell is only ever served to a run whose kernel would recompute the same bits.

For every experiment: a cell computed in two different grids (other values, another order) is
bit-identical; and every parameter, perturbed alone, either changes the fingerprint of the
cells it reaches (they are recomputed) or leaves their outputs bit-identical (they may be
served from the store). The perturbation tables must name every declared parameter, so a new
parameter cannot escape the test.
"""
from __future__ import annotations

import itertools
import tempfile
from pathlib import Path

import numpy as np
import pytest

from sfxlin.engine.cellstore import CellStore, cell_fingerprint
from sfxlin.pipelines import (c1_kernels, c1_limit, c1_real, c2_concentration, c2_threshold, c3_deep, c3_landscape,
                              c3_transfer)
from sfxlin.engine.sweep import build, run_cell
from sfxlin.testing import TIME_STAMPS, assert_same_results

C1 = {**c1_limit.EXPERIMENT.configure("quick"), "d": [2], "U_norm": [0.5], "n_seeds": 1, "L": [4, 8, 16], "n_queries": 2,
      "n_prompts": 2, "query_chunk": 1}
C1K = {**c1_kernels.EXPERIMENT.configure("quick"), "kernels": ["relu"], "r": [0.5], "L": [4, 8, 16], "n_queries": 2,
       "n_prompts": 2, "rf_sigma2": [0.5], "rf_m": [2, 4, 8], "rf_draws": 3, "stein_nodes": 6}
C2 = {**c2_concentration.EXPERIMENT.configure("quick"), "d": [2], "U_norm": [0.5], "n_seeds": 1, "L": [4, 8, 16],
      "tail_queries": 1, "tail_prompts": 8, "prompt_chunk": 4, "clt_draws": 2000, "tail_levels": [0.1, 0.03],
      "grad_pairs": 1, "grad_queries": 1, "grad_draws": 2, "grad_scales": [1.0], "traj_pairs": 1, "traj_steps": 10,
      "traj_ckpt_every": 10, "traj_seeds": 1, "traj_replicates": 1}
C2T = {**c2_threshold.EXPERIMENT.configure("quick"), "tau": [1.0, 2.0, 4.0, 6.0, 8.0, 10.0], "n_seeds": 1, "L": [4, 8, 16],
       "n_pairs": 1, "n_queries": 1, "n_replicates": 1, "n_steps": 20, "ckpt_every": 10, "families": ["kms:0.5"],
       "n_family_seeds": 1, "family_steps": 20, "family_ckpt_every": 10, "gap_samples": 64}
C3 = {**c3_transfer.EXPERIMENT.configure("quick"), "settings": ["isotropic", "rademacher"], "n_seeds": 1, "n_seeds_control": 1,
      "n_pairs": 1, "n_queries": 1, "L": [4, 8, 16], "n_steps": 20, "ckpt_every": 10, "heldout_pairs": 1,
      "heldout_queries": 1, "L_eval": 32, "heldout_every": 20}
C3L = {**c3_landscape.EXPERIMENT.configure("quick"), "covariances": ["isotropic"], "noises": [0.5], "d": [2],
       "mean_norms": [0.0], "n_seeds": 1, "n_pairs": 1, "n_queries": 1, "L": [4, 8, 16, 32], "n_steps": 20,
       "ckpt_every": 10, "heldout_pairs": 1, "heldout_queries": 1}
C1R = {**c1_real.EXPERIMENT.configure("quick"), "datasets": ["wine"], "D": [2], "U_norm": [0.1], "n_seeds": 1,
       "L": [4, 8, 16], "n_queries": 2, "n_prompts": 2, "query_chunk": 1}


def _token_file():
    """A small token file on R^2 (the c1 ``tokens`` perturbation), written once per machine."""
    path = Path(tempfile.gettempdir()) / "sfxlin-cell-identity-tokens-d2.npy"
    if not path.exists():
        np.save(path, np.random.default_rng(3).standard_normal((64, 2)))
    return str(path)

def _covariate_file():
    """A small covariate file on R^3 (the c3 ``covariates`` perturbation), written once per machine."""
    path = Path(tempfile.gettempdir()) / "sfxlin-cell-identity-covariates-d3.npy"
    if not path.exists():
        np.save(path, np.random.default_rng(4).standard_normal((64, 3)))
    return str(path)

C3D = {**c3_deep.EXPERIMENT.configure("quick"), "heads": [1], "n_seeds": 1, "depth_max": 2, "L": [4, 8, 16],
       "n_pairs": 1, "n_queries": 1, "depths": [1], "L_train": [4, 8, 16], "train_pairs": 1, "train_queries": 2,
       "heldout_pairs": 2, "n_steps": 2, "ckpt_every": 1}

#: experiment -> (small configuration, the same cells in a larger grid listed in another order)
GRIDS = {
    "c1": (c1_limit, C1, {"d": [3, 2], "U_norm": [0.1, 0.5], "n_seeds": 2}),
    "c1_kernels": (c1_kernels, C1K, {"kernels": ["sigmoid", "relu"], "r": [1.0, 0.5], "n_seeds": 2,
                                     "rf_sigma2": [2.0, 0.5], "rf_m": [2, 4, 8, 16]}),
    "c2": (c2_concentration, C2, {"d": [3, 2], "U_norm": [0.1, 0.5], "n_seeds": 2, "traj_seeds": 2}),
    "c2_threshold": (c2_threshold, C2T, {"tau": [0.75, 1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 10.0], "n_seeds": 2,
                                         "families": ["power_law:1.0", "kms:0.5"], "n_family_seeds": 2}),
    "c3": (c3_transfer, C3, {"settings": ["anisotropic", "rademacher", "isotropic"], "n_seeds": 2}),
    "c3_landscape": (c3_landscape, C3L, {"covariances": ["kms:0.5", "isotropic"], "noises": [0.0, 0.5],
                                         "mean_norms": [1.0, 0.0], "n_seeds": 2}),
    "c1_real": (c1_real, C1R, {"datasets": ["diabetes", "wine"], "D": [3, 2], "U_norm": [0.4, 0.1], "n_seeds": 2}),
    "c3_deep": (c3_deep, C3D, {"heads": [1, 2], "n_seeds": 2, "depths": [1, 2]}),
}

#: experiment -> parameter -> a perturbed value (valid on its own)
PERTURBATIONS = {
    "c1_kernels": {"kernels": ["relu", "softmax"], "Sigma": [1.0, 2.0, 0.5], "r": [0.5, 0.25], "L": [4, 8, 32],
                   "n_seeds": 2, "n_queries": 3, "n_prompts": 3, "sigmoid_bias": -1.0, "rf_m_attention": 8,
                   "rf_sigma2": [0.5, 1.0], "rf_m": [2, 4, 16], "rf_a": 0.3, "rf_draws": 4, "stein_nodes": 7,
                   "root_seed": 7},
    "c1": {"d": [2, 3], "U_norm": [0.5, 0.25], "L": [4, 8, 32], "n_seeds": 2, "n_queries": 3, "n_prompts": 3,
           "laws": ["gaussian", "uniform"], "ar1_rho": [0.3], "sigma": 1.5, "student_df": 4.0, "root_seed": 7,
           "query_chunk": 2,
           "tokens": _token_file()},
    "c1_real": {"datasets": ["wine", "diabetes"], "D": [2, 3], "U_norm": [0.1, 0.2], "L": [4, 8, 32], "n_seeds": 2,
                "n_queries": 3, "n_prompts": 3, "root_seed": 7, "query_chunk": 2},
    "c2": {"d": [2, 3], "U_norm": [0.5, 0.25], "L": [4, 8, 32], "n_seeds": 2, "sigma": 1.5, "tail_queries": 2,
           "tail_prompts": 9, "tail_levels": [0.1, 0.05], "prompt_chunk": 3, "clt_draws": 2001,
           "tail_log_c1_per_d": 0.5, "tail_c2": 0.25, "grad_scales": [1.0, 2.0], "grad_pairs": 2,
           "grad_queries": 2, "grad_draws": 3, "grad_c": 2.0, "traj_d": 2, "traj_pairs": 2, "traj_queries": 3,
           "traj_replicates": 2, "traj_lr": 0.02, "traj_steps": 20, "traj_ckpt_every": 5, "traj_seeds": 2,
           "amplification_eps": 1e-13, "root_seed": 7},
    "c2_threshold": {"d": 2, "tau": [1.0, 2.0, 4.0, 6.0, 8.0, 12.0], "L": [4, 8, 32], "n_seeds": 2,
                     "n_pairs": 2, "n_queries": 2, "n_replicates": 2, "lr": 0.02, "n_steps": 30, "ckpt_every": 5,
                     "x_law": "rademacher", "trainer": "simple", "root_seed": 7,
                     "families": ["kms:0.5", "power_law:1.0"], "n_family_seeds": 2, "family_steps": 30,
                     "family_ckpt_every": 5, "gap_samples": 65, "amplification_eps": 1e-13},
    "c3": {"d": 2, "settings": ["isotropic", "anisotropic", "rademacher"], "Sigma_isotropic": [1.0, 1.0, 2.0],
           "Sigma_anisotropic": [3.0, 1.0, 0.5], "Sigma_rademacher": [1.0, 2.0, 1.0], "n_seeds": 2,
           "n_seeds_control": 2, "n_pairs": 2, "n_queries": 2, "L": [4, 8, 32], "lr": 0.02, "n_steps": 40,
           "ckpt_every": 20, "heldout_pairs": 2, "heldout_queries": 2, "L_eval": 64, "heldout_every": 10,
           "ridge_lam": 0.1, "perturbation": 1e-10, "perturbed_run": False, "amplification_eps": 1e-13,
           "root_seed": 7,
           "covariates": _covariate_file()},
    "c3_landscape": {"covariances": ["isotropic", "kms:0.5"], "noises": [0.5, 0.2], "d": [2, 3],
                     "mean_norms": [0.0, 1.0], "n_seeds": 2, "n_pairs": 2, "n_queries": 2, "L": [4, 8, 16, 64],
                     "lr": 0.02, "n_steps": 40, "ckpt_every": 5, "heldout_pairs": 2, "heldout_queries": 2,
                     "amplification_eps": 1e-13, "root_seed": 7},
    "c3_deep": {"d": 2, "heads": [1, 2], "n_seeds": 2, "U_scale": 0.3, "V_scale": 0.2, "v_scale": 0.5, "lambda_cap": 0.3,
                "depth_max": 3, "L": [4, 8, 32], "n_pairs": 2, "n_queries": 2, "depths": [1, 2], "L_train": [4, 8, 32],
                "train_pairs": 2, "train_queries": 3, "heldout_pairs": 4, "method": "gd", "lr": 0.02, "n_steps": 4,
                "ckpt_every": 2, "root_seed": 7},
}
# d changes the shape of Sigma_* in c3: perturb it with matching covariances
_C3_D2 = {"Sigma_isotropic": [1.0, 1.0], "Sigma_anisotropic": [2.0, 1.0], "Sigma_rademacher": [1.0, 1.0]}


def _configure(module, values):
    return module.EXPERIMENT.configure(profile=None, values=values)


def _cells(module, config):
    """``(part, cell)`` of every cell of every part."""
    out = []
    for part in module.EXPERIMENT.parts:
        grid = part.grid(config)
        out += [(part.name, dict(zip(grid, values))) for values in itertools.product(*grid.values())]
    return out


def _assert_same_outputs(a, b, label):
    assert a.keys() == b.keys(), label
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=f"{label}: {name}")


@pytest.mark.parametrize("name", sorted(GRIDS))
def test_a_cell_computed_in_two_grids_is_bit_identical(name):
    module, small, extension = GRIDS[name]
    small, large = _configure(module, small), _configure(module, {**small, **extension})
    a = build(module.EXPERIMENT, small).compute(scheduler="synchronous")
    b = build(module.EXPERIMENT, large)
    b = b.sel({dim: a[dim].values.tolist() for dim in a.dims}).compute(scheduler="synchronous")
    assert_same_results(a, b, ignore=TIME_STAMPS + ("config", "n_cells"))


@pytest.mark.parametrize("name", sorted(PERTURBATIONS))
def test_every_parameter_perturbed_alone_changes_the_fingerprint_or_not_the_bits(name):
    module, base, _ = GRIDS[name]
    exp = module.EXPERIMENT
    table = PERTURBATIONS[name]
    assert sorted(table) == sorted(p.name for p in exp.params), "every declared parameter needs a perturbation here"
    base = _configure(module, base)
    reused = []
    for key, value in table.items():
        other = {**base, key: value}
        if name == "c3" and key == "d":
            other.update(_C3_D2)
        other = _configure(module, other)
        assert other[key] != base[key]
        shared = [c for c in _cells(module, base) if c in _cells(module, other)]
        assert shared, f"{key}: the perturbed grid shares no cell with the base grid"
        for part, cell in shared:
            if cell_fingerprint(exp, base, cell, part) == cell_fingerprint(exp, other, cell, part):
                _assert_same_outputs(run_cell(exp, base, cell, part), run_cell(exp, other, cell, part),
                                     f"{key} at {part}{cell}")
                reused.append(key)
    # the grid's own parameters (which cells exist) keep the shared cells: what an extension reuses
    assert {p.name for p in exp.params if p.grid} <= set(reused)


def test_the_store_serves_a_cell_only_to_its_own_fingerprint(tmp_path):
    store = CellStore(tmp_path, c1_limit.EXPERIMENT, C1)
    build(c1_limit.EXPERIMENT, C1, store=store).compute(scheduler="synchronous")
    assert store.count() == 2  # the cell and the quadrature check
    assert CellStore(tmp_path, c1_limit.EXPERIMENT, {**C1, "d": [2, 3]}).count() == 2      # extension: reused
    assert CellStore(tmp_path, c1_limit.EXPERIMENT, {**C1, "n_prompts": 3}).count() == 1   # only the check
    assert CellStore(tmp_path, c1_limit.EXPERIMENT, {**C1, "root_seed": 1}).count() == 0


def test_eleven_and_more_values_on_one_dimension(tmp_path):
    """Twelve seeds: every cell lands at its own coordinate, with its own kept file."""
    from toy_experiment import EXPERIMENT, make_config

    config = make_config(d=[2], U_norm=[0.5], n_seeds=12)
    store = CellStore(tmp_path, EXPERIMENT, config)
    ds = build(EXPERIMENT, config, store=store).compute(scheduler="threads")
    assert store.count() == 13 and len(list(tmp_path.glob("cell_*.npz"))) == 13  # and the global part's cell
    for seed in range(12):
        cell = {"d": 2, "U_norm": 0.5, "seed": seed}
        np.testing.assert_array_equal(ds.value.sel(cell).transpose("L", "query").values,
                                      run_cell(EXPERIMENT, config, cell)["value"])
    firsts = ds["first"].isel(query=0).values.ravel()
    assert len(set(firsts.tolist())) == 12
