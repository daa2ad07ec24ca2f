"""The shared vocabulary of dimension names and their CF-style attributes.

One table, so every results file labels ``L``, ``d``, ``U_norm``, ... the same way.
"""
from __future__ import annotations

SCHEMA_VERSION = 1

COORDS = {
    "d": {"long_name": "input dimension d", "description": "dimension of the covariates / tokens"},
    "U_norm": {"long_name": "Frobenius norm of U", "description": "||U||_F of the attention matrix U = K^T Q"},
    "L": {"long_name": "prompt length", "units": "tokens", "description": "number of tokens in the prompt (nested prompts)"},
    "seed": {"long_name": "seed index", "description": "independent replicate; enters the per-cell random generator"},
    "t": {"long_name": "training step", "units": "steps", "description": "gradient-descent step of the checkpoint"},
    "t_heldout": {"long_name": "training step of a held-out evaluation", "units": "steps",
                  "description": "a subset of t, every heldout_every steps"},
    "tau": {"long_name": "tr(Sigma^-2)", "description": "trace of the inverse squared covariance; the constant "
            "(1 - 2 tau^(-1/2))^(-d/2) is finite iff tau > 4"},
    "level": {"long_name": "tail level", "description": "nominal tail probability of the CLT threshold of a tail test"},
    "scale": {"long_name": "covariance scale", "description": "factor multiplying the covariate covariance Sigma"},
    "traj_seed": {"long_name": "trajectory seed index", "description": "replicate of the trajectory-stability part"},
    "law": {"long_name": "token law", "description": "distribution of the i.i.d. tokens"},
    "setting": {"long_name": "covariate setting", "description": "covariance / law of the covariates x"},
    "model": {"long_name": "attention model", "description": "softmax(L) or linear(L) attention"},
    "query": {"long_name": "query index", "description": "index of the query token within a cell"},
    "D_quad": {"long_name": "quadrature dimension", "description": "dimension D of the Gaussian in a quadrature check"},
    "row": {"long_name": "row index", "description": "row of a parameter matrix"},
    "col": {"long_name": "column index", "description": "column of a parameter matrix"},
}


def coord_attrs(dim: str) -> dict:
    """Attributes of a coordinate of the shared vocabulary (empty dict if unknown)."""
    return dict(COORDS.get(dim, {}))
