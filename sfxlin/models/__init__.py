"""JAX models (docs/deep.md): deep multi-head attention with any kernel of :mod:`sfxlin.kernels`
(by name or instance, through its JAX weight), its exact deep linear limit on Gaussian tokens,
and training with optax.

Importing this package imports JAX and switches on its float64 mode (a JAX-wide setting that
touches nothing outside JAX); ``import sfxlin`` and the command line never import it.
"""
from .optimise import METHODS, train
from .transformer import (LAMBDA_BOUND, LINEAR_LIMIT, RateConditionWarning, Transformer, cap_lambdas, flatten,
                          head_lambdas, limit_layers, predict, predict_layers, risk, risk_and_grad)

__all__ = ["LAMBDA_BOUND", "LINEAR_LIMIT", "METHODS", "RateConditionWarning", "Transformer", "cap_lambdas", "flatten",
           "head_lambdas", "limit_layers", "predict", "predict_layers", "risk", "risk_and_grad", "train"]
