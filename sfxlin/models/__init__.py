"""JAX models (docs/deep.md): deep multi-head attention with any kernel, its exact deep linear
limit on Gaussian tokens, and training with optax.

Importing this package imports JAX and switches on its float64 mode (a JAX-wide setting that
touches nothing outside JAX); ``import sfxlin`` and the command line never import it.
"""
from .optimise import METHODS, train
from .transformer import (KERNELS, LINEAR_LIMIT, Kernel, Transformer, flatten, kernel, limit_layers, predict,
                          predict_layers, risk, risk_and_grad)

__all__ = ["KERNELS", "LINEAR_LIMIT", "METHODS", "Kernel", "Transformer", "flatten", "kernel", "limit_layers",
           "predict", "predict_layers", "risk", "risk_and_grad", "train"]
