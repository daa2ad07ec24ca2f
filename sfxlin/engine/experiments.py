"""Experiments found by name: every module of ``sfxlin.pipelines`` (not its packages, such as
``sfxlin.pipelines.families``, which hold what the experiments share, nor a module whose name starts
with ``_``), and the modules named in ``$SFXLIN_PIPELINES`` (comma-separated importable module names: a
researcher's own experiments, outside this repository).

Nothing else lists experiments: ``sfxlin list``, ``sfxlin run``, ``sfxlin reproduce`` and the
schema document find them here, and the report finds each file's analysis module from the
file's own ``analysis`` attr. Adding an experiment is writing its two declaration modules; each
module found here is a pipeline module, checked against the plug-in protocol
(:data:`.protocol.PIPELINE`) as it is loaded, and the analysis module it names must be importable.
"""
from __future__ import annotations

import difflib

import importlib.util
import os
import pkgutil

from .protocol import load_pipeline

__all__ = ["experiments", "get", "ENV"]

#: environment variable naming extra pipeline modules
ENV = "SFXLIN_PIPELINES"


def _modules():
    from .. import pipelines

    names = [f"{pipelines.__name__}.{m.name}" for m in pkgutil.iter_modules(pipelines.__path__)
             if not m.ispkg and not m.name.startswith("_")]
    names += [n.strip() for n in os.environ.get(ENV, "").split(",") if n.strip()]
    return names


def _analysis_found(experiment, module_name):
    """Refuse an experiment whose analysis module cannot be found (its exports are checked when it
    is imported: :func:`.protocol.load_analysis`, by ``build()`` and the report)."""
    name = experiment.analysis
    try:
        found = name is None or importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise ValueError(f"the experiment {experiment.name!r} ({module_name}) names the analysis module {name!r}, "
                         f"which cannot be found")


def experiments() -> dict:
    """``{name: Experiment}`` of every experiment found, sorted by name (the claims' order)."""
    found = {}
    for module_name in _modules():
        experiment = load_pipeline(module_name, hint=f"; check ${ENV}")
        _analysis_found(experiment, module_name)
        for other in found.values():
            if experiment.name == other.name or (experiment.short and experiment.short in (other.name, other.short)):
                raise ValueError(f"two experiments are named {experiment.name!r} / {experiment.short!r} "
                                 f"({module_name} and another module)")
        found[experiment.name] = experiment
    return dict(sorted(found.items()))


def get(name):
    """The experiment called ``name`` or whose short name is ``name`` (``c1``)."""
    table = experiments()
    for experiment in table.values():
        if name in (experiment.name, experiment.short):
            return experiment
    names = sorted({n for e in table.values() for n in (e.name, e.short) if n})
    close = difflib.get_close_matches(str(name), names, n=2, cutoff=0.75)
    hint = f"; did you mean {' or '.join(map(repr, close))}?" if close else ""
    listed = ", ".join(f"{e.name} ({e.short})" if e.short not in (None, e.name) else e.name for e in table.values())
    raise ValueError(f"unknown experiment {name!r}{hint} (the experiments, with their short names: {listed})")
