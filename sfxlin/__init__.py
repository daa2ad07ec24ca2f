"""sfxlin: softmax attention as linear attention in the large-prompt regime.

Public API re-exported here; see the modules for the details. The names are loaded on first use
(``sfxlin.run`` imports the engine when called for, not when ``sfxlin`` is imported), so that a
command which computes nothing (``sfxlin --help``, ``sfxlin list``) starts before numpy could; the
``.sfx`` accessors are registered with xarray as soon as both are imported, in either order.
"""
import importlib
import importlib.abc
import importlib.machinery
import sys

from ._version import __version__

#: public name -> the module that holds it
_EXPORTS = {
    **{name: "sfxlin.attention" for name in ("asymptotic_mse", "limit_attention", "linear_attention",
                                             "softmax_attention", "softmax_attention_prefix")},
    **{name: "sfxlin.laws" for name in ("LAWS", "Gaussian", "GaussianMixture", "Law", "NoLimitError",
                                        "Rademacher", "StudentT", "Uniform")},
    "open_results": "sfxlin.engine.storage", "save": "sfxlin.engine.storage",
    "Experiment": "sfxlin.engine.sweep", "Variable": "sfxlin.engine.sweep", "build": "sfxlin.engine.sweep",
    "run": "sfxlin.runs",
}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'sfxlin' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value   # the next lookup is an ordinary attribute
    return value


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))


def _register_accessors():
    importlib.import_module("sfxlin.analysis.accessor")


class _AccessorsWithXarray(importlib.abc.MetaPathFinder):
    """Registers the ``.sfx`` accessors right after xarray is imported (a one-shot post-import hook:
    it finds xarray's spec as the path finder does, wraps its loader so the module is executed as
    usual and the accessors registered after, then leaves ``sys.meta_path``)."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "xarray":
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        execute = loader.exec_module

        def exec_module(module):
            execute(module)
            _register_accessors()

        loader.exec_module = exec_module
        return spec


if "xarray" in sys.modules:
    _register_accessors()
elif not any(isinstance(f, _AccessorsWithXarray) for f in sys.meta_path):
    sys.meta_path.insert(0, _AccessorsWithXarray())
