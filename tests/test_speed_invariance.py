"""Speed changes leave the results alone: the C3 diagnostic computed by curvature instead of a
second training run, checked against independent computations and against the perturbed run.

* the off-block Hessian of :mod:`sfxlin.curvature` (closed form from the softmax moments)
  against central differences of the analytic per-L gradients
  ``icl.risk_grad`` (an independent implementation);
* a C3 cell with and without the perturbed run: every variable other than the perturbed run's
  is bit-identical (the diagnostic reads the main run, never changes it), and the trajectories
  agree with the plain per-L reference loop (:mod:`sfxlin.testing.reference_c3`);
* where the perturbed run was informative, the two diagnostics agree: an off-block perturbation
  grows (by more than 10x) exactly in the cells whose curvature crossed the edge 2 / lr;
* the softmax engine's shared pass over antithetic partners with the plain sums (the held-out
  evaluation) against the partner-by-partner pass it replaced (``share_pairs = False``, the code
  before the change): bit-identical engine steps and bit-identical C3 cells.
"""
import dataclasses

import numpy as np
import pytest

from sfxlin import covariance, curvature, icl, laws, training
from sfxlin.engine import storage
from sfxlin.analysis import c3 as c3_analysis
from sfxlin.benchmarks.protocol import seed_loop
from sfxlin.engine.execution import compute
from sfxlin.pipelines import c3_transfer as c3
from sfxlin.engine.sweep import build, cell_rng, run_cell
from sfxlin.testing import reference_c3

EXPERIMENT = c3.EXPERIMENT
ANISO = np.diag([2.0, 1.0, 0.5])


def _risk_grad_hessian(model, tasks, L, U, v, h=1e-5):
    """Off-block Hessian ``(T, 2d, 2d)`` by central differences of ``icl.risk_grad`` (the plain
    per-L gradients): exact to O(h^2) ~ 1e-10 (the risk is smooth), rounding u / h ~ 1e-11."""
    d = tasks.d
    H = np.empty(U.shape[:1] + (2 * d, 2 * d))
    for j in range(2 * d):
        dU, dv = np.zeros_like(U), np.zeros_like(v)
        if j < d:
            dU[:, d, j] = h
        else:
            dv[:, j - d] = h
        _, gUp, gvp = icl.risk_grad(model, U + dU, v + dv, tasks, L)
        _, gUm, gvm = icl.risk_grad(model, U - dU, v - dv, tasks, L)
        H[:, :, j] = (curvature.off_block_coordinates(gUp, gvp) - curvature.off_block_coordinates(gUm, gvm)) / (2 * h)
    return H


def _max_rel(H, refs):
    return max(np.max(np.abs(H[i] - ref)) / np.max(np.abs(ref)) for i, ref in enumerate(refs))


def test_off_block_hessian_matches_central_differences_of_the_per_L_gradients():
    """The closed form against central differences of ``icl.risk_grad``. The linear risks are
    quadratic, so the reference is exact up to rounding (~u / h ~ 1e-11 at h = 1e-5, measured
    2e-12). The softmax reference errs by O(h^2) (the third derivative; measured 1.4e-7 at
    h = 1e-4, 1.4e-9 at h = 1e-5): asserted 1e-8 at h = 1e-5, and the softmax discrepancy must fall
    by ~100x from h = 1e-4 to 1e-5 (between 30x and 300x), i.e. the reference converges to the
    closed form and not to something within the tolerance of it."""
    tasks = icl.make_tasks(np.random.default_rng(5), 3, 4, 2, 32, laws.Gaussian(cov=ANISO))
    Ls = (4, 8, 32)
    res = training.train_all_arrays(tasks, Ls, lr=0.05, n_steps=40, ckpt_every=10)
    for m in icl.MODELS:
        U, v = res[m]["U"], res[m]["v"]
        if m == "linear_inf":
            H = curvature.off_block_hessian(m, tasks, None, U[None], v[None])
            refs = {h: [_risk_grad_hessian(m, tasks, None, U, v, h)] for h in (1e-4, 1e-5)}
        else:
            H = curvature.off_block_hessian(m, tasks, Ls, U, v)
            refs = {h: [_risk_grad_hessian(m, tasks, L, U[i], v[i], h) for i, L in enumerate(Ls)] for h in (1e-4, 1e-5)}
        tol = 1e-8 if m == "softmax" else 1e-10
        assert _max_rel(H, refs[1e-5]) <= tol, m
        if m == "softmax":
            assert 30 <= _max_rel(H, refs[1e-4]) / _max_rel(H, refs[1e-5]) <= 300
            # one partner per antithetic pair (the default) against every task: equal terms, so the
            # means differ by rounding only
            unpaired = dataclasses.replace(tasks, paired=False)
            assert _max_rel(H, curvature.off_block_hessian(m, unpaired, Ls, U, v)) <= 1e-13
    lo, hi = curvature.curvature_extremes(H)
    assert np.all(lo <= hi)
    np.testing.assert_allclose(curvature.spectral_radius(lo, hi, 0.05),
                               np.max(np.abs(np.linalg.eigvalsh(np.eye(6) - 0.05 * H)), axis=-1), rtol=1e-12)


def test_off_block_hessian_refuses_parameters_off_the_block_structure():
    tasks = icl.make_tasks(np.random.default_rng(1), 3, 2, 2, 8, laws.Gaussian(cov=np.eye(3)))
    U, v = icl.init_theta(3, np.eye(3))
    U = np.broadcast_to(U, (1, 2, 4, 4)).copy()
    v = np.broadcast_to(v, (1, 2, 4)).copy()
    U[0, 1, 3, 0] = 1e-3
    with pytest.raises(ValueError, match="block structured"):
        curvature.off_block_hessian("softmax", tasks, (8,), U, v)
    with pytest.raises(ValueError, match="model"):
        curvature.off_block_hessian("cubic", tasks, (8,), U[:, :1], v[:, :1])
    with pytest.raises(ValueError, match="prompt lengths"):
        curvature.off_block_hessian("linear", tasks, (4, 8), U[:, :1], v[:, :1])


def _config(**values):
    return EXPERIMENT.configure("quick", values=dict(dict(n_steps=200, heldout_every=100, L=[8, 16, 64]), **values))


@pytest.fixture(scope="module")
def both_diagnostics():
    """Two cells of the quick profile (shortened), with and without the perturbed run."""
    out = {}
    for setting in ("isotropic", "anisotropic"):
        cell = {"setting": setting, "seed": 0}
        out[setting] = (run_cell(EXPERIMENT, _config(perturbed_run=True), cell),
                        run_cell(EXPERIMENT, _config(perturbed_run=False), cell), cell)
    return out


def test_every_variable_but_the_perturbed_runs_is_bit_identical_without_it(both_diagnostics):
    for with_run, without, _ in both_diagnostics.values():
        for name in with_run:
            if name in c3._PERTURBED:
                assert np.all(np.isfinite(with_run[name])) and np.all(np.isnan(without[name])), name
            else:
                assert np.array_equal(with_run[name], without[name], equal_nan=True), name   # NaN: not measured


def test_trajectories_agree_with_the_per_L_reference_loop(both_diagnostics):
    """The main run against the plain per-L loop on the cell's own tasks (same draws): the same
    maths summed in another order, so agreement to rounding (1e-10 relative, the engine's bench
    tolerance; measured ~1e-13). Entries that are 0 by symmetry (the off-block part) hold only
    rounding, and a rounding-sized off-block perturbation grows by the factor ``G`` that the
    cell's perturbed run measures (4.8e4 for isotropic softmax(L = 64) here, lr lambda_max > 2):
    their absolute tolerance is ``1e-13 G`` per model and L (the reference's off-block noise then
    depends on the BLAS kernel: 1e-11 on Sandybridge kernels, 0 on others)."""
    config = _config()
    for setting, (out, _, cell) in both_diagnostics.items():
        p = out["off_block_perturbed"]                       # (model, L, t)
        growth = np.maximum(1.0, p.max(axis=-1) / p[..., 0])
        rng = cell_rng(c3.NAME, cell, config["root_seed"])
        Sigma = covariance.from_spec(config[f"Sigma_{setting}"], 3)
        tasks = icl.make_tasks(rng, 3, config["n_pairs"], config["n_queries"], config["L"][-1],
                               laws.covariate_law("gaussian", Sigma))
        U0, v0 = icl.init_theta(3, Sigma)
        ref = reference_c3.train_reference_all(tasks, config["L"], lr=config["lr"], n_steps=config["n_steps"],
                                               ckpt_every=config["ckpt_every"], U0=U0, v0=v0)
        for i, m in enumerate(c3.MODELS):
            for j, G in enumerate(growth[i]):
                np.testing.assert_allclose(out["U"][i, j], ref[m]["U"][j], rtol=1e-10, atol=1e-13 * G)
                np.testing.assert_allclose(out["v"][i, j], ref[m]["v"][j], rtol=1e-10, atol=1e-13 * G)
            np.testing.assert_allclose(out["risk_train"][i], ref[m]["risk"], rtol=1e-10)
        np.testing.assert_allclose(out["U_inf"], ref["linear_inf"]["U"], rtol=1e-10, atol=1e-13)


def test_curvature_and_perturbed_run_agree_where_the_perturbed_run_is_informative(both_diagnostics):
    """An off-block perturbation evolves by ``I - lr H_off(theta_t)``: it grows past the rounding of
    its own decay only where ``lr lambda_max`` exceeds 2 (growth ``rho > 1`` per step, sign
    flipping); below the edge the only expansion is the slow saddle near the init (measured <= 1.5x).
    So growth > 10x must coincide with a crossing of the edge. Measured here: isotropic
    softmax(L = 64) crosses it (lr lambda_max = 2.52, over 2 from t = 120) and its perturbation
    grows 6.6e4-fold; every other model, L and setting stays below (lr lambda_max <= 1.38) and its
    perturbation never exceeds 1.52x."""
    lr = _config()["lr"]
    crossed, grew = [], []
    for out, _, _ in both_diagnostics.values():
        p = out["off_block_perturbed"]
        grew.append((p.max(axis=-1) / p[..., 0]) > 10)
        crossed.append((lr * out["off_block_curvature_max"]).max(axis=-1) > 2)
        inf = out["off_block_perturbed_inf"]
        assert (inf.max() / inf[0] > 10) == (lr * out["off_block_curvature_max_inf"].max() > 2)
    crossed, grew = np.array(crossed), np.array(grew)
    assert crossed.any(), "the check needs a cell over the edge (isotropic softmax(L = 64) at these settings)"
    assert np.array_equal(crossed, grew), (crossed, grew)


def test_the_protocol_benchmark_loop_reproduces_the_sweep_file(tmp_path):
    """The seed-style arm of ``sfxlin bench c3 --protocol`` (plain per-L loop, its own held-out
    risks) on a quick sweep's file: same tasks, same numbers to rounding (1e-10 relative; measured
    ~1e-15), so the benchmark compares two ways of computing one protocol."""
    config = EXPERIMENT.configure("quick", values=dict(settings=["isotropic", "rademacher"], n_seeds=1, n_steps=40,
                                                       heldout_every=20, L=[8, 16, 32], perturbed_run=False))
    ds, _, _ = compute(build(EXPERIMENT, config), progress=False)
    path = storage.save(ds, tmp_path / "c3_transfer.nc")
    assert seed_loop(path) <= 1e-10
    # without the perturbed run the fit table shows the curvature diagnostic only, and its
    # numbers are the stored eigenvalues' maxima (recomputed here with numpy)
    table = ds.sfx.fit_table()
    assert "Off-block curvature" in table and "Perturbation diagnostic" not in table
    lr = config["lr"]
    stab = c3_analysis.off_block_stability(ds, lr)
    hi, lo = ds.off_block_curvature_max.values, ds.off_block_curvature_min.values   # (setting, seed, model, L, t)
    np.testing.assert_array_equal(stab.edge.transpose("setting", "model", "L").values, (lr * hi).max(axis=(1, 4)))
    rho = np.maximum(np.abs(1 - lr * hi), np.abs(1 - lr * lo)).max(axis=(1, 4))
    np.testing.assert_allclose(stab.rho.transpose("setting", "model", "L").values, rho, rtol=1e-15)


def _engine_pair(tasks, Ls, share):
    eng = training.SoftmaxPrefixEngine(tasks, Ls)
    eng.share_pairs = share           # an instance attribute: the class default stays untouched
    return eng


def test_shared_partner_pass_with_plain_sums_is_bit_identical_to_the_partner_by_partner_pass():
    """Partners share a pass only while their logits AND shifts are bitwise equal: after a step
    with U[d, :d] != 0 the shifts differ (each partner's own log-sum-exp) and the next
    block-structured step must not share (an earlier draft shared there and changed the
    curvature's bits). Exact equality: the same floating-point operations on the same numbers."""
    tasks = icl.make_tasks(np.random.default_rng(3), 3, 4, 2, 64, laws.Gaussian(cov=ANISO))
    Ls = (8, 16, 64)
    U0, v0 = icl.init_theta(3, ANISO)
    U = np.repeat(U0[None], 3, axis=0) * np.array([1.0, 1.3, 0.7])[:, None, None]
    v = np.repeat(v0[None], 3, axis=0)
    Up = U.copy()
    Up[:, 3, 0] = 1e-3                 # off the block structure: the partners' logits differ
    vq = v.copy()
    vq[:, 0] = 1e-3                    # block-structured U, quadratic features
    new, old = _engine_pair(tasks, Ls, True), _engine_pair(tasks, Ls, False)
    shared = []
    for Ut, vt in ((U, v), (U * 1.01, v), (Up, v), (U, v), (U, vq), (U, v)):
        before = new.n_shared
        for a, b in zip(new.step(Ut, vt), old.step(Ut, vt)):
            assert np.array_equal(a, b)
        shared.append(new.n_shared - before)
    assert old.n_shared == 0
    # shared: the first two block steps; not after the off-block step (its shifts differ per
    # partner) nor while they still differ
    assert shared[:3] == [1, 1, 0] and shared[3] == 0, shared


def test_c3_cell_is_bit_identical_to_the_partner_by_partner_heldout_pass(monkeypatch):
    """A whole quick-profile C3 cell (main run, held-out risks, curvature, perturbed run) with the
    shared partner pass and with the code before it (``share_pairs = False``)."""
    config = _config(perturbed_run=True)
    cell = {"setting": "anisotropic", "seed": 1}
    new = run_cell(EXPERIMENT, config, cell)
    monkeypatch.setattr(training.SoftmaxPrefixEngine, "share_pairs", False)
    old = run_cell(EXPERIMENT, config, cell)
    assert set(new) == set(old)
    for name in new:
        assert np.array_equal(new[name], old[name], equal_nan=True), name   # NaN: an amplification not measured


def test_c3_landscape_noisy_cell_is_bit_identical_to_the_partner_by_partner_heldout_pass(monkeypatch):
    """The other caller of ``heldout_risks``: noisy labels run the engine embedded in d + 1
    covariate dimensions (``_embed_noise``), whose inner engine shares the pass the same way.
    NaN entries (declared non-finite outcomes) compare equal to NaN."""
    from sfxlin.pipelines import c3_landscape

    exp = c3_landscape.EXPERIMENT
    config = exp.configure("quick")
    part = exp.parts[0]
    grid = part.grid(config)
    cell = {dim: values[-1] for dim, values in grid.items()}    # the last cell: noisy, shifted mean
    assert cell["noise"] > 0
    new = run_cell(exp, config, cell, part.name)
    monkeypatch.setattr(training.SoftmaxPrefixEngine, "share_pairs", False)
    old = run_cell(exp, config, cell, part.name)
    for name in new:
        assert np.array_equal(new[name], old[name], equal_nan=True), name
