"""Experiments found by name: every module of ``sfxlin.pipelines`` that defines ``EXPERIMENT``,
and the modules named in ``$SFXLIN_PIPELINES`` (comma-separated importable module names: a
researcher's own experiments, outside this repository).

Nothing else lists experiments: ``sfxlin list``, ``sfxlin run``, ``sfxlin reproduce`` and the
schema document find them here, and the report finds each file's analysis module from the
file's own ``analysis`` attr. Adding an experiment is writing its two declaration modules.
"""
from __future__ import annotations

import importlib
import os
import pkgutil

__all__ = ["experiments", "get", "ENV"]

#: environment variable naming extra pipeline modules
ENV = "SFXLIN_PIPELINES"


def _modules():
    from .. import pipelines

    names = [f"{pipelines.__name__}.{m.name}" for m in pkgutil.iter_modules(pipelines.__path__)
             if not m.name.startswith("_")]
    names += [n.strip() for n in os.environ.get(ENV, "").split(",") if n.strip()]
    return names


def experiments() -> dict:
    """``{name: Experiment}`` of every experiment found, sorted by name (the claims' order)."""
    found = {}
    for module_name in _modules():
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise ValueError(f"cannot import the pipeline module {module_name!r} ({exc}); "
                             f"check ${ENV}") from exc
        experiment = getattr(module, "EXPERIMENT", None)
        if experiment is None:
            continue
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
    known = sorted(e.short or e.name for e in table.values())
    raise ValueError(f"unknown experiment {name!r}; expected one of {known}")
