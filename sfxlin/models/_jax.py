"""The one place sfxlin imports JAX: with float64 enabled before any array is made.

``import sfxlin`` and the command line never import this module; :mod:`sfxlin.models` does, and
the JAX weights of :mod:`sfxlin.kernels` at their first call.
``jax_enable_x64`` is a JAX-wide switch: it changes the default dtype of JAX arrays made in this
process (to float64) and nothing outside JAX.
"""
from __future__ import annotations

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402  (after the float64 switch)

__all__ = ["jax", "jnp"]
