"""sfxlin: softmax attention as linear attention in the large-prompt regime.

Public API re-exported here; see the modules for the details.
"""
from ._version import __version__
from .attention import (asymptotic_mse, limit_attention, linear_attention, softmax_attention,
                        softmax_attention_prefix)
from .laws import LAWS, Gaussian, GaussianMixture, Law, NoLimitError, Rademacher, StudentT, Uniform
from .engine.storage import open_results, save
from .engine.sweep import Experiment, Variable, build
from .runs import run
from .analysis import accessor as _accessor  # registers the ``.sfx`` accessors  # noqa: F401

__all__ = [
    "__version__", "asymptotic_mse", "limit_attention", "linear_attention", "softmax_attention",
    "softmax_attention_prefix", "Gaussian", "GaussianMixture", "LAWS", "Law", "NoLimitError", "Rademacher",
    "StudentT", "Uniform",
    "open_results", "save", "Experiment", "Variable", "build", "run",
]
