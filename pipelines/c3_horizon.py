"""C3 horizon, a variant of the C3 family: the horizon ``T(L)`` up to which softmax(L) training follows
``theta_inf(t)``. Grid ``setting x seed``; the family's run for ``T_max`` steps, its parameters kept on a
log-spaced grid of checkpoints (``per_octave`` a doubling). The protocol: docs/protocols.md, "c3_horizon"."""
from __future__ import annotations

import numpy as np

from sfxlin import icl, training
from sfxlin.engine import Cells, Param, Profiles, Variable

from .families.c3 import C3, GAUSSIAN, STEP_CURVATURE, Run, draw, finite, kept, named, setting_inputs, setting_law

NAME = "c3_horizon"


def checkpoints(config):
    """The checkpoint steps ``t`` of a run: :func:`sfxlin.training.log_checkpoint_steps`."""
    return training.log_checkpoint_steps(config["n_steps"], config["per_octave"])


def kernel(cell, rng, config):
    d, Ls = config["d"], config["L"]
    law, Sigma = setting_law(cell["setting"], config)
    tasks, _ = draw(rng, d, law, config["n_pairs"], config["n_queries"], Ls[-1])
    run = Run(tasks, Ls, "horizon run", lr=config["lr"], n_steps=config["n_steps"], checkpoints=checkpoints(config))
    traj = run.trajectory(Sigma)
    U_star, v_star = icl.bayes_optimum(Sigma)
    return finite({
        **kept(traj, t=("D_inf", "norm_inf", "risk_train", "risk_inf", "conservation_inf"), max_t=("off_block",)),
        "dist_star": traj["dist_bayes"], "dist_star_inf": traj["dist_bayes_inf"],
        "norm_star": np.sqrt(np.sum(U_star**2) + np.sum(v_star**2)), **run.step_curvature(),
        "n_exact_shift_steps": np.float64(run.res["n_exact_shift_steps"]),
    })


OWN = (
    Variable("dist_star", ("model", "L", "t"), "distance of theta_L(t) to theta_star", "sqrt(||U_L(t) - U*||_F^2 + "
             "||v_L(t) - v*||^2), (U*, v*) the Bayes optimum of Remark 5.2 for the setting's Sigma (the limit of "
             "the gradient flow of linear(inf))."),
    Variable("dist_star_inf", ("t",), "distance of theta_inf(t) to theta_star", "sqrt(||U_inf(t) - U*||_F^2 + "
             "||v_inf(t) - v*||^2): falls to the floor set by gradient descent's drift of ||U||_F^2 - ||v||^2."),
)

EXPERIMENT = C3.variant(
    NAME, short="c3h", analysis="sfxlin.analysis.c3_horizon",
    values=dict(d=3, **named(*GAUSSIAN), n_seeds=Profiles(quick=2, paper=4), n_pairs=Profiles(quick=3, paper=48),
                n_queries=2, L=Profiles(quick=[8, 16, 32], paper=[8 * 2**k for k in range(12)]), lr=0.01,
                n_steps=Profiles(quick=60, paper=8000), root_seed=20261202),
    changes={"settings": {"choices": GAUSSIAN}, "n_steps": {"doc": "gradient-descent steps T_max (the last checkpoint)"}},
    params=(Param("per_octave", "int", "checkpoints per doubling of t (log-spaced grid; every step while they are "
                  "closer than one apart)", Profiles(quick=4, paper=16), low=1),),
    cells=(Cells({"setting": "settings", "seed": "n_seeds"}, kernel,
                 ("D_inf", "norm_inf", OWN[0], OWN[1], "norm_star", "risk_train", "risk_inf", "conservation_inf",
                  "off_block_max", *STEP_CURVATURE, "n_exact_shift_steps"), inputs=setting_inputs, perturbed=True),),
    coords={"t": lambda c: checkpoints(c).tolist()},
    scheduler="processes",   # long cells of many small numpy calls (the GIL): docs/performance.md, section 8
    title="C3 horizon: the horizon T(L) up to which softmax(L) training follows theta_inf(t)",
    description="C3 transfer horizon T*(L, eps), its growth in L, and the best-horizon distance to the Bayes optimum")
