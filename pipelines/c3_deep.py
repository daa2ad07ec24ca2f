"""C3 deep: deep multi-head residual attention and its exact deep linear limit, the deep family's variant. Part
(a) ``heads x seed``: a fixed random model against its limit; part ``train`` (b) ``depth x heads x seed``:
softmax(L), linear(L) and the limit model trained from one initialisation. The protocol: docs/deep.md."""
from __future__ import annotations

from sfxlin.engine import Cells, Profiles

from .families.deep import DEEP, limit_cell, train_cell

NAME = "c3_deep"
_A, _B = ("",), ("train",)

EXPERIMENT = DEEP.variant(
    NAME, short="c3_deep", analysis="sfxlin.analysis.c3_deep",
    values=dict(d=3, heads=Profiles(quick=[1], paper=[1, 2]), n_seeds=Profiles(quick=1, paper=4), U_scale=0.25,
                V_scale=0.1, v_scale=1.0, depth_max=Profiles(quick=2, paper=4),
                L=Profiles(quick=[8, 16, 32], paper=[2**k for k in range(4, 15)]), lambda_cap=0.2,
                n_pairs=Profiles(quick=2, paper=12), n_queries=Profiles(quick=2, paper=8),
                depths=Profiles(quick=[1], paper=[1, 2]), L_train=Profiles(quick=[4, 8, 16], paper=[8, 16, 32, 64, 128]),
                train_pairs=Profiles(quick=2, paper=16), train_queries=Profiles(quick=4, paper=16),
                heldout_pairs=Profiles(quick=4, paper=64), method="adam", lr=0.01, n_steps=Profiles(quick=10, paper=200),
                ckpt_every=Profiles(quick=5, paper=20), root_seed=20261130),
    changes={"L": {"doc": "(a) nested prompt lengths", "parts": _A},
             "n_pairs": {"doc": "(a) antithetic task pairs per cell", "parts": _A},
             "n_queries": {"doc": "(a) queries per task", "parts": _A},
             "heldout_pairs": {"doc": "(b) antithetic held-out task pairs", "parts": _B},
             "lr": {"doc": "(b) step size", "parts": _B},
             "n_steps": {"doc": "(b) optimiser steps (a multiple of ckpt_every)", "low": 0, "parts": _B},
             "ckpt_every": {"doc": "(b) steps between checkpoints", "parts": _B}},
    cells=(Cells({"heads": "heads", "seed": "n_seeds"}, limit_cell,
                 ("err", "err_median", "cov_err", "out_sq", "lambda_drawn", "lambda_max", "U_shrink")),
           Cells({"depth": "depths", "heads": "heads", "seed": "n_seeds"}, train_cell,
                 ("D_inf", "D_linL", "risk", "risk_inf", "risk_heldout", "risk_heldout_inf", "norm_inf"),
                 name="train")),
    scheduler="processes",   # JAX runs each compiled program on one thread (sfxlin.models._jax): threads share it
    title="C3 deep: deep multi-head attention and its exact deep linear limit",
    description="C3 deep: depth x heads x L, error to the deep linear limit and training")
