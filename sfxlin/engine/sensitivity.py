"""How much a cell amplifies rounding: its outputs recomputed with the floating-point path of its
trajectories perturbed at rounding level, output by output (the determinism contract,
docs/performance.md section 10).

The contract: on one machine and install a cell's bits do not depend on the scheduler, the chunking,
the workers, the cores, the grid or the order; across versions and CPUs (BLAS kernels, which round
products differently) its outputs agree with the independent references to 1e-10 relative, or within
1e-10 times the amplification measured here, stated per cell in the results file.

**What is perturbed.** Another BLAS kernel changes the last bits of the products along a cell's path.
In a gradient-descent trajectory those differences enter at every step and are carried, damped or
amplified, to the outputs. The amplification run recomputes the cell from the same draws with the
parameters of every trajectory multiplied entrywise, after every update, by ``1 + eps s``, ``s = +-1``
drawn afresh for every entry and step (:class:`StepPerturbation`): a last-bits difference at every
step, as a kernel makes, of a known relative size ``eps`` (the parameter ``amplification_eps``; 1e-13,
about 1000 units of rounding, dominates the run's own rounding and stays far below the scale at which
a stable trajectory responds nonlinearly). Then, for each output ``y`` (all its values in the cell),

    amplification = max |y' - y| / max |y| / eps,

0 where the output did not move. Why not the other perturbations:

* the init alone perturbed measures the sensitivity to the start; a kernel's differences enter at every
  step, also after a contracting phase has damped the init's, just before an unstable phase (a step
  past the edge of stability, a saddle) that amplifies them: the init's perturbation reaches it damped,
  the step's does not;
* every step's gradient perturbed relatively (``g (1 + eps s)``) vanishes as the gradient does near a
  minimum, where a kernel still changes the update's last bits (the gradient is a sum of large terms
  that cancel, and the update ``theta - lr g`` rounds at the scale of ``theta``): the parameters'
  scale is the scale of the differences;
* the cell rerun under another OpenBLAS kernel in a child process (``OPENBLAS_CORETYPE``) measures one
  pair of kernels on one CPU, with a perturbation of unknown size (no ratio to take), is 0 wherever the
  two kernels happen to round a cell alike, and exists for OpenBLAS only: it is a check of the contract
  (``sfxlin verify`` under another kernel), not a measure of the amplification.

Entries that are exactly 0 stay 0 (the off-block coordinates of a block-structured trajectory), as they
do under any kernel: their zeros come from exact cancellations, which every kernel rounds alike.

**Who opts in.** A part whose kernel trains gradient-descent trajectories declares ``perturbed=True``
(:class:`sfxlin.engine.sweep.Part`, :class:`sfxlin.engine.family.Cells`) and passes
:func:`step_perturbation` to every trajectory it trains (``sfxlin.training.train_all_arrays(perturb=...)``,
``sfxlin.gradient_gap.gradient_gap_trajectory(perturb=...)``). The engine then declares, once for every
experiment, the parameter ``amplification_eps`` (:func:`param`: 0 means not measured) and, per float
output of the part, the variable ``<output>_amplification`` over the part's grid dims (:func:`variables`);
:func:`sfxlin.engine.sweep.run_cell` runs the cell a second time under the perturbation when the
configuration asks (one more run of the cell), and refuses a kernel that applied no perturbation. The
evaluations along a trajectory (gaps, held-out risks) are not perturbed: each is one pass, its kernel
differences rounding-level, within the contract's 1e-10 unamplified.
"""
from __future__ import annotations

import contextlib
import contextvars

import numpy as np

from .params import Param

__all__ = ["AMPLIFICATION", "DEFAULT_EPS", "AmplifiedCost", "StepPerturbation", "amplification", "param", "perturbing",
           "step_perturbation", "variable_name", "variables"]

#: the parameter of every experiment with a perturbed part: the relative size of the perturbation, 0: off
AMPLIFICATION = "amplification_eps"
#: the relative size of the step perturbation where a profile measures the amplification
DEFAULT_EPS = 1e-13

_ACTIVE = contextvars.ContextVar("sfxlin_step_perturbation", default=None)


def param(value=0.0) -> Param:
    """The engine's declaration of ``amplification_eps`` with ``value`` (a number, or a
    :class:`~sfxlin.engine.params.Profiles`): the one declaration an experiment may take to give it another
    value than 0 (off); the engine adds it at 0 to an experiment with a perturbed part that does not."""
    return Param(AMPLIFICATION, "float", "relative size eps of the step perturbation of the amplification run "
                 "(sfxlin.engine.sensitivity: every trajectory's parameters times 1 + eps s, s = +-1, after every "
                 "update; the cell is computed a second time); 0: no amplification run, the <output>_amplification "
                 "variables are NaN", value, low=0, high=1e-6, absent=0.0)


def variable_name(output: str) -> str:
    """``"<output>_amplification"``: the variable holding the amplification of ``output``."""
    return f"{output}_amplification"


def variables(outputs, grid_dims, part="") -> tuple:
    """The amplification variables of the float ``outputs`` (:class:`~sfxlin.engine.sweep.Variable` s) of a
    perturbed part with grid dims ``grid_dims``: one per output, over the grid dims, units ``"1"``."""
    from .sweep import Variable

    return tuple(Variable(variable_name(o.name), tuple(grid_dims), f"amplification of rounding in {o.name}",
                          f"max |y' - y| / max |y| / eps over the cell's values y of {o.name}, y' the cell "
                          "recomputed from the same draws with every trajectory's parameters times 1 + eps s (s = "
                          "+-1 per entry and step) after every update, eps = amplification_eps "
                          "(sfxlin.engine.sensitivity); 0: unchanged; inf: the values that are not finite moved, or "
                          "a zero output did; NaN where amplification_eps = 0 (not measured).", units="1",
                          allow_nonfinite=True, part=part)
                 for o in outputs if np.dtype(o.dtype).kind == "f")


class AmplifiedCost:
    """An experiment's cost model (``cost(config, part, cell) -> seconds or None``) with the amplification run
    counted: twice the seconds of a cell of the ``parts`` (the perturbed ones) when ``amplification_eps > 0``."""

    def __init__(self, cost, parts):
        self.cost, self.parts = cost, tuple(parts)

    def __call__(self, config, part, cell):
        seconds = self.cost(config, part, cell)
        runs = 2 if part in self.parts and config.get(AMPLIFICATION, 0.0) > 0 else 1
        return None if seconds is None else runs * seconds


class StepPerturbation:
    """``perturb(*arrays) -> arrays``: each array times ``1 + eps s``, ``s = +-1`` drawn from ``rng`` per entry
    and call (each draw in call order, so a cell's perturbation is the same on every run). ``calls`` counts
    the calls (the engine refuses a perturbed part whose kernel made none)."""

    def __init__(self, rng: np.random.Generator, eps: float):
        if not (np.isfinite(eps) and eps > 0):
            raise ValueError(f"the step perturbation's eps must be a positive number, got {eps!r}")
        self.rng, self.eps, self.calls = rng, float(eps), 0

    def __call__(self, *arrays):
        self.calls += 1
        out = []
        for a in arrays:
            a = np.asarray(a, dtype=float)
            signs = self.rng.integers(0, 2, size=a.shape) * 2.0 - 1.0
            out.append(a * (1.0 + self.eps * signs))
        return tuple(out)


def step_perturbation():
    """The step perturbation of the amplification run in progress in this thread (a
    :class:`StepPerturbation`), None otherwise: what a perturbed part's kernel passes to the trajectories
    it trains (``perturb=step_perturbation()``)."""
    return _ACTIVE.get()


@contextlib.contextmanager
def perturbing(perturbation):
    """Within the block, :func:`step_perturbation` returns ``perturbation`` (None: no perturbation)."""
    token = _ACTIVE.set(perturbation)
    try:
        yield perturbation
    finally:
        _ACTIVE.reset(token)


def amplification(base, perturbed, eps) -> float:
    """``max |perturbed - base| / max |base| / eps`` over the finite values of one output of a cell; 0 where
    nothing moved; ``inf`` where the non-finite values differ (place or value) or an output that is 0
    everywhere moved."""
    base, perturbed = np.asarray(base, dtype=float), np.asarray(perturbed, dtype=float)
    finite = np.isfinite(base)
    if not (np.array_equal(finite, np.isfinite(perturbed))
            and np.array_equal(base[~finite], perturbed[~finite], equal_nan=True)):
        return float("inf")
    diff = float(np.max(np.abs(perturbed[finite] - base[finite]), initial=0.0))
    if diff == 0.0:
        return 0.0
    scale = float(np.max(np.abs(base[finite]), initial=0.0))
    return float("inf") if scale == 0.0 else diff / scale / float(eps)
