"""C1 on real data, a variant of the C1 family: softmax attention over a data set's whitened principal components
against the exact limit of their empirical law and the Gaussian surrogate. Grid ``dataset x D x U_norm x seed``;
``U``'s direction and the queries come from ``(dataset, D, seed)`` alone (:func:`direction_rng`), so every
``U_norm`` scales the same ``U``. The protocol: docs/real_data.md."""
from __future__ import annotations

import numpy as np

from sfxlin.attention import asymptotic_mse, weight_ratio
from sfxlin.engine import Cells, Param, Profiles, cell_rng
from sfxlin.laws import Empirical, Gaussian
from sfxlin.realdata import token_set

from .families.c1 import C1, chunks, sq_errors

NAME = "c1_real"


def direction_rng(cell, root_seed):
    """The generator of ``U``'s direction and of the queries: keyed by the cell's ``dataset``, ``D``
    and ``seed`` (not ``U_norm``) and ``root_seed``, under its own tag."""
    keys = {dim: cell[dim] for dim in ("dataset", "D", "seed")}
    return cell_rng(f"{NAME}/direction", keys, root_seed)


def kernel(cell, rng, config):
    D, U_norm = cell["D"], cell["U_norm"]
    Ls = np.asarray(config["L"])
    Q, P = config["n_queries"], config["n_prompts"]
    law = Empirical(token_set(cell["dataset"], D))
    V = np.eye(D)
    shared = direction_rng(cell, config["root_seed"])
    U = shared.standard_normal((D, D))
    U *= U_norm / np.linalg.norm(U)
    q = law.sample(shared, Q)  # (Q, D)
    a = q @ U.T
    f_inf = law.tilted_mean(a)  # exact: softmax-weighted average over the whole set
    f_gauss = Gaussian(law.mean, law.cov).tilted_mean(a)  # Lemma 2.1 with the fitted mean and covariance
    sq_err, sq_err_gauss = np.empty((Q, P, len(Ls))), np.empty((Q, P, len(Ls)))
    for qs in chunks(Q, config["query_chunk"]):
        Z = law.sample(rng, (qs.stop - qs.start, P, Ls[-1]))
        sq_err[qs], sq_err_gauss[qs] = sq_errors(Z, U, V, q[qs, None, :], Ls, f_inf[qs, None, None, :],
                                                 f_gauss[qs, None, None, :])
    return {
        "weight_ratio": np.mean(weight_ratio(a @ law.samples.T)),
        "mse": sq_err.mean(axis=(0, 1)),
        "mse_asymptotic": asymptotic_mse(law, U, V, q[:, None, :], Ls).mean(axis=0),
        "mse_gauss": sq_err_gauss.mean(axis=(0, 1)),
        "bias_gauss": np.mean(np.sum((f_inf - f_gauss) ** 2, axis=-1)),
        "limit_sq": np.mean(np.sum((f_inf - law.mean) ** 2, axis=-1)),
    }


EXPERIMENT = C1.variant(
    NAME, short="c1r", analysis="sfxlin.analysis.c1_real", sweep=("U_norm",),
    values=dict(datasets=C1.param("datasets").value,
                U_norm=Profiles(quick=[0.05, 0.1, 0.8], paper=[0.025, 0.05, 0.1, 0.2, 0.4, 0.8]),
                L=Profiles(quick=[2**k for k in range(4, 11)], paper=[2**k for k in range(4, 14)]),
                n_seeds=Profiles(quick=1, paper=8), n_queries=Profiles(quick=6, paper=16),
                n_prompts=Profiles(quick=8, paper=16), root_seed=20251212, query_chunk=Profiles(quick=3, paper=4)),
    params=(Param("D", "int_list", "token dimensions (principal components kept)",
                  Profiles(quick=[2, 5], paper=[2, 5, 10]), low=1, high=10, grid=True),),
    cells=(Cells({"dataset": "datasets", "D": "D", "U_norm": "U_norm", "seed": "n_seeds"}, kernel,
                 ("mse", "mse_asymptotic", "mse_gauss", "bias_gauss", "weight_ratio", "limit_sq")),),
    order=("dataset", "D", "U_norm", "L", "seed"),
    title="C1 on real data: the exact empirical limit and the Gaussian surrogate's bias",
    description="C1 on real data: softmax attention -> the empirical law's tilted mean; Gaussian surrogate bias")
