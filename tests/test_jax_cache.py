"""The JAX compilation cache of ``sfxlin.models._jax``: where it lives, when it is off, and that a
process loading compiled programs from it gets the bits of a process that compiled them."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("jax")

from sfxlin.models._jax import cache_dir  # noqa: E402

# one risk and gradient of a 2-layer, 2-head softmax model: the float64 bits as hex, the cache
# folder JAX was given, the programs it asked the cache for and how many it found there
PROGRAM = """
import json, sys
import numpy as np
from jax import monitoring
events = []
monitoring.register_event_listener(lambda event, **kw: events.append(event))
import jax
from sfxlin import icl, laws, models
tasks = icl.make_tasks(np.random.default_rng(0), 3, 2, 2, 16, laws.covariate_law("gaussian", np.eye(3)))
model = models.Transformer(4, 2, 2)
p = model.init(np.random.default_rng(1), U_scale=0.3)
r, g = models.risk_and_grad(model, "softmax", p, tasks, 16)
out = [np.float64(r).tobytes().hex()] + [np.ascontiguousarray(g[k]).tobytes().hex() for k in sorted(g)]
print(json.dumps({"bits": out, "dir": jax.config.jax_compilation_cache_dir,
                  "requests": events.count("/jax/compilation_cache/compile_requests_use_cache"),
                  "hits": events.count("/jax/compilation_cache/cache_hits")}))
"""


def _python(code, **env):
    """``code`` run by a fresh Python under this environment less both cache variables, plus
    ``env``: its ``(stdout, stderr)``."""
    full = {k: v for k, v in os.environ.items() if k not in ("SFXLIN_JAX_CACHE", "JAX_COMPILATION_CACHE_DIR")}
    full.update(env)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout, done.stderr


def _run(**env):
    return json.loads(_python(PROGRAM, **env)[0].splitlines()[-1])


def test_the_folder_follows_the_environment(tmp_path):
    home = Path.home()
    assert cache_dir({}) == home / ".cache" / "sfxlin" / "jax"
    assert cache_dir({"XDG_CACHE_HOME": str(tmp_path)}) == tmp_path / "sfxlin" / "jax"
    assert cache_dir({"SFXLIN_JAX_CACHE": str(tmp_path / "c"), "XDG_CACHE_HOME": "/x"}) == tmp_path / "c"
    assert cache_dir({"SFXLIN_JAX_CACHE": "~/jc"}) == home / "jc"
    assert cache_dir({"SFXLIN_JAX_CACHE": "off"}) is None and cache_dir({"SFXLIN_JAX_CACHE": "OFF"}) is None
    # the user's own JAX setting wins: sfxlin then configures nothing
    assert cache_dir({"JAX_COMPILATION_CACHE_DIR": "/j", "SFXLIN_JAX_CACHE": str(tmp_path)}) is None


def _configured(**env):
    """What a fresh process that imports ``sfxlin.models._jax`` under ``env`` configures: JAX's
    cache folder and the process's stderr."""
    out, err = _python("import sfxlin.models._jax as j; print(j.jax.config.jax_compilation_cache_dir)", **env)
    return out.strip(), err


@pytest.mark.slow
def test_a_warm_process_loads_every_program_and_gets_the_same_bits(tmp_path):
    folder = tmp_path / "cache"
    cold = _run(SFXLIN_JAX_CACHE=str(folder))
    entries = sorted(p.name for p in folder.iterdir())
    assert cold["dir"] == str(folder) and cold["requests"] > 0 and cold["hits"] == 0 and entries
    warm = _run(SFXLIN_JAX_CACHE=str(folder))
    assert warm["hits"] == warm["requests"] == cold["requests"], "a program was compiled again"
    assert sorted(p.name for p in folder.iterdir()) == entries
    # the same program compiled (cold) or loaded (warm): the same executable, the same bits
    assert warm["bits"] == cold["bits"]


def test_off_and_jaxs_own_setting_configure_nothing(tmp_path):
    assert _configured(SFXLIN_JAX_CACHE="off")[0] == "None"
    own = tmp_path / "own"
    assert _configured(JAX_COMPILATION_CACHE_DIR=str(own), SFXLIN_JAX_CACHE=str(tmp_path / "ours"))[0] == str(own)
    assert not (tmp_path / "ours").exists()


def test_an_unwritable_folder_warns_and_leaves_the_cache_off(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    folder, err = _configured(SFXLIN_JAX_CACHE=str(blocker / "cache"))
    assert folder == "None"
    assert "JAX compilation cache off: cannot create" in err and "SFXLIN_JAX_CACHE" in err
