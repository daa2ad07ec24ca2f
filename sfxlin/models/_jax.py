"""The one place sfxlin imports JAX: with float64 enabled before any array is made, on the CPU
unless asked otherwise, and compiled programs kept on disk between processes.

``import sfxlin`` and the command line never import this module; :mod:`sfxlin.models` does, and
the JAX weights of :mod:`sfxlin.kernels` at their first call.
``jax_enable_x64`` is a JAX-wide switch: it changes the default dtype of JAX arrays made in this
process (to float64) and nothing outside JAX.

**Platform.** The model family runs on the CPU, the platform its tests run on, even where JAX would
find another: :func:`platforms` gives JAX ``"cpu"`` unless ``SFXLIN_JAX_PLATFORMS`` names others
(``cuda``, ``cuda,cpu``: JAX's ``jax_platforms`` syntax), or the user set JAX's own
``JAX_PLATFORMS``. Nothing in :mod:`sfxlin.models` is specific to the CPU, so the same code runs
where JAX sees a GPU (``pip install 'jax[cuda12]'``, then ``SFXLIN_JAX_PLATFORMS=cuda``); that path is
not tested here (no GPU), and its float64 results are held to the 1e-10 of the determinism
contract, not to the CPU's bits. A platform JAX cannot start fails at import, naming the variable.

**Compilation cache.** Every process that runs the model family compiles its programs anew: a
quick ``c3_deep`` run compiles about 20, in every pool worker, each under JAX's own 1 s threshold
for its persistent cache (switched on alone, that cache kept none of them). Unless the user
configured JAX's cache (``JAX_COMPILATION_CACHE_DIR``), this module turns it on in
:func:`cache_dir` with no compile-time threshold, so later processes load the compiled programs
(docs/performance.md section 9 has the measured gain). A loaded program is the compiled one: the
bits do not change (tests/test_jax_cache.py). JAX keys an entry on the program, its compile
options, the backend and the jax/jaxlib versions.

``SFXLIN_JAX_CACHE=off`` turns it off; ``SFXLIN_JAX_CACHE=DIR`` moves it. A cache folder is
trusted code: keep it where only you write (JAX's own warning). A quick ``c3_deep`` run adds about
300 kB; the folder is bounded by :data:`CACHE_MAX_BYTES` and can be deleted at any time.

**One thread inside a program.** XLA's CPU backend runs a compiled program's matrix products
(Eigen) and YNNPACK fusions on an intra-op thread pool sized when the backend starts:
``PJRT_NPROC``, else ``NPROC``, else the CPUs the process may run on. A product with a long
contracted dimension (``Z^T Z`` over 16384 tokens: linear attention, the token moments) is summed
in pieces by thread, so its bits followed the pool: pools of 1, 2, 4 and 8 threads gave four
different results, and a cache entry runs on the pool of the process that loads it. Unless the
user set ``PJRT_NPROC``, this module sets it to :data:`POOL_THREADS` (one) in ``os.environ`` before
JAX starts its backend; pool workers and subprocesses inherit it. Every sum of a compiled program
then runs on one thread in one order, whatever the cores, ``NPROC``, load, scheduler or cache
state; cells run in parallel on the engine's threads or processes instead. ``XLA_FLAGS`` is left
as the user set it (``--xla_cpu_multi_thread_eigen=false`` does not reach the products of XLA's
thunk runtime). A backend started before this import keeps its pool, with a warning. docs/deep.md
has the measurements.
"""
from __future__ import annotations

import os
import warnings
from pathlib import Path

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402  (after the float64 switch)

__all__ = ["jax", "jnp", "cache_dir", "platforms", "pool_threads", "CACHE_MAX_BYTES", "POOL_THREADS"]

#: bound of the cache folder: JAX evicts the least recently used programs beyond it. Setting a bound
#: also makes JAX take a file lock (the ``filelock`` package) around every read and write of the
#: folder, so a worker never reads an entry another worker is still writing
CACHE_MAX_BYTES = 1 << 30

#: the threads of XLA's CPU thread pool (``PJRT_NPROC``) in every process of the model family
POOL_THREADS = 1


def pool_threads(environ=os.environ):
    """The ``PJRT_NPROC`` this module gives XLA's CPU backend: :data:`POOL_THREADS` as a string;
    None when the user set ``PJRT_NPROC`` (then the user's pool size applies, and the bits follow it)."""
    if environ.get("PJRT_NPROC"):
        return None
    return str(POOL_THREADS)


def _set_pool_threads(chosen, environ=os.environ):
    """Set ``PJRT_NPROC`` to ``chosen`` for the backend JAX starts later; warn when it has started."""
    environ["PJRT_NPROC"] = chosen
    from jax._src import xla_bridge

    if xla_bridge.backends_are_initialized():
        warnings.warn(f"sfxlin: JAX's backend started before sfxlin.models was imported; its CPU thread pool keeps "
                      f"its size instead of PJRT_NPROC={chosen}, so a cell's bits may depend on the number of "
                      "cores (import sfxlin.models before any JAX work)", stacklevel=3)


def cache_dir(environ=os.environ):
    """The folder of the compilation cache this module sets up: ``$SFXLIN_JAX_CACHE``, else
    ``$XDG_CACHE_HOME/sfxlin/jax`` (``~/.cache/sfxlin/jax``); None when ``SFXLIN_JAX_CACHE=off``
    or when the user set JAX's own ``JAX_COMPILATION_CACHE_DIR`` (then JAX's settings apply)."""
    if environ.get("JAX_COMPILATION_CACHE_DIR"):
        return None
    chosen = environ.get("SFXLIN_JAX_CACHE", "")
    if chosen.lower() == "off":
        return None
    if chosen:
        return Path(chosen).expanduser()
    return Path(environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "sfxlin" / "jax"


def _enable_cache(folder):
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        warnings.warn(f"sfxlin: JAX compilation cache off: cannot create {folder} ({exc}); programs are compiled "
                      "in every process (SFXLIN_JAX_CACHE=DIR moves the cache, =off silences this)", stacklevel=3)
        return
    jax.config.update("jax_compilation_cache_dir", str(folder))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_compilation_cache_max_size", CACHE_MAX_BYTES)


def platforms(environ=os.environ):
    """The platforms this module gives JAX (its ``jax_platforms``): ``$SFXLIN_JAX_PLATFORMS``, else
    ``"cpu"``; None when the user set JAX's own ``JAX_PLATFORMS`` (then JAX's setting applies)."""
    if environ.get("JAX_PLATFORMS"):
        return None
    return environ.get("SFXLIN_JAX_PLATFORMS", "").strip() or "cpu"


def _set_platforms(chosen):
    # ignored by JAX if the process already started a backend (the user's own JAX work came first)
    jax.config.update("jax_platforms", chosen)
    if chosen == "cpu":
        return
    try:
        jax.devices()
    except Exception as exc:   # a missing plugin raises a bare AssertionError in jax 0.10
        why = type(exc).__name__ + (f": {exc}" if str(exc) else "")
        raise RuntimeError(f"SFXLIN_JAX_PLATFORMS={chosen}: JAX cannot start it ({why}); "
                           "a GPU needs JAX's CUDA wheels (pip install 'jax[cuda12]'); unset the variable to run "
                           "on the CPU") from exc


_threads = pool_threads()
if _threads is not None:
    _set_pool_threads(_threads)

_chosen = platforms()
if _chosen is not None:
    _set_platforms(_chosen)

_folder = cache_dir()
if _folder is not None and not jax.config.jax_compilation_cache_dir:
    _enable_cache(_folder)
