"""One workload of the C3 cost laws: ``python -m sfxlin.benchmarks.c3_laws N L_MAX N_PAIRS D``.

Trains the C3 main run (softmax(L) for L = 8, 16, ..., L_MAX doubling, linear(L), linear(inf))
on ``N_PAIRS`` antithetic pairs x 2 queries of ``N(0, I_D)`` covariates for ``N`` steps, and
exits: time the whole process against the same command with ``N = 0`` (start-up, tasks) to get
the cost of the steps (docs/performance.md, section 5).
"""
from __future__ import annotations

import sys

import numpy as np

from sfxlin import icl, laws, training


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 4:
        print(__doc__.splitlines()[0], file=sys.stderr)
        return 2
    n, L_max, n_pairs, d = (int(a) for a in argv)
    Ls = tuple(8 * 2**k for k in range(30) if 8 * 2**k <= L_max)
    tasks = icl.make_tasks(np.random.default_rng(0), d, n_pairs, 2, L_max, laws.Gaussian(cov=np.eye(d)))
    training.train_all_arrays(tasks, Ls, n_steps=n, ckpt_every=max(n, 1))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
