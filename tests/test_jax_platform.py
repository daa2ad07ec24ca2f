"""The platform of the model family (``sfxlin.models._jax.platforms``): the CPU by default, the
tested one, even where JAX would find another; ``SFXLIN_JAX_PLATFORMS`` asks for others, and JAX's
own ``JAX_PLATFORMS`` wins over both."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("jax")

from sfxlin.models._jax import platforms  # noqa: E402

SHOW = "import sfxlin.models._jax, jax; print(jax.config.jax_platforms, jax.default_backend())"


def _python(code, **env):
    """``code`` run by a fresh Python, both platform variables removed, then ``env`` set."""
    full = {k: v for k, v in os.environ.items() if k not in ("SFXLIN_JAX_PLATFORMS", "JAX_PLATFORMS")}
    full.update(env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full, timeout=300)


def test_the_rules():
    assert platforms({}) == "cpu" and platforms({"SFXLIN_JAX_PLATFORMS": " "}) == "cpu"
    assert platforms({"SFXLIN_JAX_PLATFORMS": "cuda,cpu"}) == "cuda,cpu"
    assert platforms({"JAX_PLATFORMS": "cpu", "SFXLIN_JAX_PLATFORMS": "cuda"}) is None   # JAX's own wins


def test_the_model_family_runs_on_the_cpu_unless_asked():
    done = _python(SHOW)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["cpu", "cpu"]


def test_a_platform_jax_cannot_start_fails_at_import_naming_the_variable():
    """Asked for CUDA: where JAX has it (a GPU machine with JAX's CUDA wheels) the backend is the
    GPU; where not, the import fails with the variable and the remedy, not JAX's bare error."""
    done = _python(SHOW, SFXLIN_JAX_PLATFORMS="cuda")
    if done.returncode == 0:
        assert done.stdout.split() == ["cuda", "gpu"]
    else:
        last = done.stderr.strip().splitlines()[-1]
        assert last.startswith("RuntimeError: SFXLIN_JAX_PLATFORMS=cuda: JAX cannot start it"), done.stderr
        assert "jax[cuda12]" in last and "unset the variable to run on the CPU" in last


def test_jaxs_own_variable_wins():
    done = _python(SHOW, SFXLIN_JAX_PLATFORMS="cuda", JAX_PLATFORMS="cpu")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["cpu", "cpu"]
