"""A JAX cell's bits on one machine do not depend on XLA's CPU thread pool, on which process
compiled a program, nor on whether it was compiled or loaded from the cache (sfxlin.models._jax:
``PJRT_NPROC=1``)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("jax")

from sfxlin.models._jax import POOL_THREADS, pool_threads  # noqa: E402

# linear attention at L = 16384 with the token moments: its products contract over the tokens, which
# XLA's CPU backend splits into partial sums by its pool's threads (pools of 1, 2, 4 and 8 threads
# gave four different results). bits() returns the float64 bits as hex
SOURCE = """
import numpy as np
from sfxlin import icl, laws, models

def bits():
    rng = np.random.default_rng(0)
    model = models.Transformer(4, 2, 2)
    params = model.init(rng, 0.25, 0.1, 1.0)
    tasks = icl.make_tasks(rng, 3, 2, 2, 16384, laws.covariate_law("gaussian", np.eye(3)))
    pred, G = models.predict_layers(model, "linear", params, tasks.prompt(16384), tasks.z_q, moments=True,
                                    check_rate=False)
    return [np.asarray(a).tobytes().hex() for a in (pred, G)]
"""

# a child: bits() with the pool size it was given and the programs it asked the cache for and found
CHILD = """
import json, os
from jax import monitoring
events = []
monitoring.register_event_listener(lambda event, **kw: events.append(event))
""" + SOURCE + """
out = bits()
print(json.dumps({"bits": out, "pool": os.environ.get("PJRT_NPROC"),
                  "requests": events.count("/jax/compilation_cache/compile_requests_use_cache"),
                  "hits": events.count("/jax/compilation_cache/cache_hits")}))
"""

# a child on one CPU (an XLA pool of one thread, were PJRT_NPROC not set)
PINNED = "import os; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})\n" + CHILD


def _env(**env):
    """This environment less the pool and cache variables (a child sets its own), plus ``env``."""
    full = {k: v for k, v in os.environ.items()
            if k not in ("PJRT_NPROC", "NPROC", "SFXLIN_JAX_CACHE", "JAX_COMPILATION_CACHE_DIR")}
    full.update(env)
    return full


def _start(code, **env):
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=_env(**env))


def _result(child):
    out, err = child.communicate(timeout=300)
    assert child.returncode == 0, err
    return json.loads(out.splitlines()[-1])


def _reference():
    namespace = {}
    exec(SOURCE, namespace)
    return namespace["bits"]()


def test_the_pool_has_one_thread_unless_the_user_sized_it():
    assert POOL_THREADS == 1
    assert pool_threads({}) == "1" and pool_threads({"NPROC": "4"}) == "1"
    assert pool_threads({"PJRT_NPROC": "4"}) is None
    assert os.environ["PJRT_NPROC"] == "1", "this process's backend was given another pool"


@pytest.mark.slow
def test_processes_compiling_and_loading_together_get_the_bits_of_this_process(tmp_path):
    folder = str(tmp_path / "cache")
    pinned = PINNED if hasattr(os, "sched_setaffinity") else CHILD
    # started together on one fresh folder: each compiles or loads what another just wrote
    cold = [_start(CHILD, SFXLIN_JAX_CACHE=folder), _start(CHILD, SFXLIN_JAX_CACHE=folder, NPROC="4"),
            _start(pinned, SFXLIN_JAX_CACHE=folder)]
    cold = [_result(child) for child in cold]
    warm = _result(_start(CHILD, SFXLIN_JAX_CACHE=folder, NPROC="4"))
    reference = _reference()
    for i, run in enumerate(cold + [warm]):
        assert run["bits"] == reference, f"process {i} (cold 0-2, warm 3) got other bits"
    assert all(run["pool"] == "1" for run in cold + [warm])
    assert any(run["hits"] < run["requests"] for run in cold), "no process compiled"
    assert warm["hits"] == warm["requests"] > 0, "the warm process compiled a program again"


def test_the_users_pool_size_is_kept_and_a_started_backend_is_named():
    code = "import os, sfxlin.models._jax; print(os.environ['PJRT_NPROC'])"
    own = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env(PJRT_NPROC="2"),
                         timeout=300)
    assert own.returncode == 0 and own.stdout.strip() == "2", own.stderr
    late = subprocess.run([sys.executable, "-c", "import jax; jax.devices(); " + code], capture_output=True,
                          text=True, env=_env(), timeout=300)
    assert late.returncode == 0 and late.stdout.strip() == "1", late.stderr
    assert "backend started before sfxlin.models was imported" in late.stderr
