"""The shared vocabulary of dimension names and their CF-style attributes, and the schema version.

One table, so every results file labels ``L``, ``d``, ``U_norm``, ... the same way. Every
coordinate has a ``long_name`` and a ``description`` (a sentence ending with a full stop), and
``units`` where the quantity has one; the files follow the CF conventions named by
:data:`CONVENTIONS` (their ``Conventions`` attribute).

Version 2 gives each variable one meaning per name within a family: a C3 measure per checkpoint keeps its
name, its maximum over the checkpoints ends in ``_max`` and its value at the end of training in ``_T``
(:data:`RENAMED`), and a C3 setting's covariance is a covariance spec. A version-1 file is read as version 2
(:func:`upgrade`: the names only, no value changes), so the files users hold, and the shipped ones until they
are regenerated, keep being analysed and verified.
"""
from __future__ import annotations

SCHEMA_VERSION = 2

#: the schema versions this sfxlin reads (version 1 through :func:`upgrade`)
READS = (1, 2)

#: the variables version 2 renamed, per experiment: ``{old name: new name}``
RENAMED = {
    "c3_landscape": {"D_inf": "D_inf_max", "D_linL": "D_linL_max", "off_block": "off_block_max",
                     "off_block_inf": "off_block_inf_max", "norm_inf": "norm_inf_T", "risk_train": "risk_train_T",
                     "risk_inf": "risk_inf_T", "risk_heldout": "risk_heldout_T", "risk_heldout_inf": "risk_heldout_inf_T"},
    "c3_horizon": {"off_block": "off_block_max"},
    "c3_dim": {"off_block": "off_block_max", "off_block_inf": "off_block_inf_max", "norm_inf": "norm_inf_T",
               "risk_train": "risk_train_T", "risk_heldout": "risk_heldout_T", "risk_heldout_inf": "risk_heldout_inf_T",
               "dist_star_inf": "dist_star_inf_T"},
    "c3_shift": {"risk_train": "risk_train_T"},
}


#: the ``Conventions`` attribute of every results file: CF 1.8, the newest version the CF checker
#: (cfchecker) checks; the files use nothing of a later one
CONVENTIONS = "CF-1.8"

COORDS = {
    "d": {"long_name": "input dimension d", "description": "Dimension of the covariates / tokens."},
    "U_norm": {"long_name": "Frobenius norm of U", "description": "||U||_F of the attention matrix U = K^T Q."},
    "L": {"long_name": "prompt length (tokens)", "units": "1", "description": "Number of tokens in the prompt (nested "
          "prompts)."},
    "seed": {"long_name": "seed index", "description": "Independent replicate; enters the per-cell random generator."},
    "t": {"long_name": "training step", "units": "1", "description": "Gradient-descent step of the checkpoint."},
    "t_flow": {"long_name": "flow time of a check (steps x lr)", "units": "1", "description": "Steps x step size at "
               "a check: the time of the gradient flow a run discretises, common to cells of different step sizes."},
    "t_heldout": {"long_name": "training step of a held-out evaluation", "units": "1",
                  "description": "A subset of t, every heldout_every steps."},
    "tau": {"long_name": "tr(Sigma^-2)", "description": "Trace of the inverse squared covariance; the constant "
            "(1 - 2 tau^(-1/2))^(-d/2) is finite iff tau > 4."},
    "level": {"long_name": "tail level", "description": "Nominal tail probability of the CLT threshold of a tail "
              "test."},
    "scale": {"long_name": "covariance scale", "description": "Factor multiplying the covariate covariance Sigma."},
    "traj_seed": {"long_name": "trajectory seed index", "description": "Replicate of the trajectory-stability part."},
    "law": {"long_name": "token law", "description": "Distribution of the i.i.d. tokens."},
    "setting": {"long_name": "covariate setting", "description": "Covariance / law of the covariates x."},
    "model": {"long_name": "attention model", "description": "softmax(L) or linear(L) attention."},
    "query": {"long_name": "query index", "description": "Index of the query token within a cell."},
    "sampling": {"long_name": "prompt sampling", "description": "How prompts are drawn from a token file: iid (with "
                 "replacement from its empirical law) or window (contiguous windows in the file's order)."},
    "prompt": {"long_name": "prompt index", "description": "Index of an independent prompt within a cell (shared by "
               "its queries, nested along L)."},
    "shift": {"long_name": "test-time shift", "description": "Shift spec of the held-out covariates (sfxlin.shift): "
              "none, scale:C, rotate:SEED, subspace:K or a covariance spec."},
    "theta": {"long_name": "trained parameters", "description": "Which trained theta(T) is evaluated: softmax(L) at its "
              "training L, or linear(inf)."},
    "L_eval": {"long_name": "evaluation prompt length (tokens)", "units": "1",
               "description": "Prompt length at which trained parameters are evaluated on shifted prompts."},
    "i": {"long_name": "row index", "description": "Row of a d x d covariance matrix."},
    "j": {"long_name": "column index", "description": "Column of a d x d covariance matrix."},
    "key_dim": {"long_name": "token component", "description": "Component of a prompt token (key side of U)."},
    "query_dim": {"long_name": "query component", "description": "Component of the query (query side of U)."},
    "out_dim": {"long_name": "output component", "description": "Component of the head's output V f."},
    "D_quad": {"long_name": "quadrature dimension", "description": "Dimension D of the Gaussian in a quadrature "
               "check."},
    "row": {"long_name": "row index", "description": "Row of a parameter matrix."},
    "col": {"long_name": "column index", "description": "Column of a parameter matrix."},
    "kernel": {"long_name": "attention kernel", "description": "Weight function of the attention scores (softmax, "
               "sigmoid, ReLU, ..., or linear)."},
    "r": {"long_name": "query size r", "description": "r = ||a||_Sigma of the logit vector a = U q."},
    "stein_kernel": {"long_name": "kernel of the Stein check", "description": "Attention kernel whose Stein identity "
                     "is checked against quadrature."},
    "rf_sigma2": {"long_name": "token variance of the random-feature study",
                  "description": "Variance s of the tokens, Sigma = s I."},
    "rf_m": {"long_name": "number of random features", "units": "1",
             "description": "Number m of positive random features of the feature average."},
    "rf_draw": {"long_name": "random-feature draw index", "description": "Independent draw of the m features."},
    "dataset": {"long_name": "real data set", "description": "Data set bundled with scikit-learn whose rows are the "
                "tokens."},
    "D": {"long_name": "token dimension D", "description": "Principal components of the data set kept as the token "
          "dimension."},
    "family": {"long_name": "covariance family", "description": "sfxlin.covariance spec string of Sigma, rescaled to "
               "every tau."},
    "family_seed": {"long_name": "family seed index", "description": "Replicate of the covariance-family part."},
    "t_family": {"long_name": "training step of the family part", "units": "1",
                 "description": "Gradient-descent step of a checkpoint of the covariance-family part."},
    "heads": {"long_name": "number of heads H", "description": "Attention heads per layer."},
    "depth": {"long_name": "trained depth K", "description": "Residual layers of the trained model."},
    "layer": {"long_name": "layer index", "description": "Layer l of the fixed random model, 1-based; the depth-l "
              "model is its first l layers."},
    "L_train": {"long_name": "training prompt length (tokens)", "units": "1",
                "description": "Number of tokens in the prompts of the training tasks."},
    "stage": {"long_name": "training stage", "description": "Parameters at the initialisation or at the end of "
              "training."},
    "covariance": {"long_name": "covariate covariance family", "description": "sfxlin.covariance spec string of the "
                   "covariate covariance Sigma."},
    "noise": {"long_name": "label-noise standard deviation", "description": "Standard deviation of the noise added "
              "to the prompt labels and the query targets."},
    "mean_norm": {"long_name": "norm of the covariate mean", "description": "||m|| of the covariate mean m = "
                  "mean_norm (1, ..., 1) / sqrt(d); 0: centred covariates."},
}


def coord_attrs(dim: str) -> dict:
    """Attributes of a coordinate of the shared vocabulary (empty dict if unknown)."""
    return dict(COORDS.get(dim, {}))


def version_of(ds):
    """The ``sfxlin_schema_version`` attr of ``ds`` as an int, or None (absent, or not a number)."""
    version = ds.attrs.get("sfxlin_schema_version")
    version = version.item() if hasattr(version, "item") else version  # netCDF gives numpy scalars
    try:
        return None if version is None else int(version)
    except (TypeError, ValueError):   # e.g. a non-numeric attribute written by another tool
        return None


def upgrade(ds):
    """``ds`` in the current schema (a new Dataset for a version-1 file, ``ds`` itself otherwise): the
    variables of :data:`RENAMED` renamed, the version set to :data:`SCHEMA_VERSION` and
    ``schema_upgraded_from`` to 1. Values are untouched; the recorded configuration needs no change (a
    version-1 ``Sigma_<setting>`` matrix is read as the covariance spec that builds it,
    :mod:`sfxlin.engine.params`)."""
    if version_of(ds) != 1:
        return ds
    renamed = {old: new for old, new in RENAMED.get(ds.attrs.get("experiment"), {}).items() if old in ds.data_vars}
    out = ds.rename_vars(renamed)
    out.attrs.update(sfxlin_schema_version=SCHEMA_VERSION, schema_upgraded_from=1)
    return out
