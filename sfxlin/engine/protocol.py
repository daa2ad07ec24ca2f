"""The plug-in protocol: what an experiment's two declaration modules export, written once.

An experiment is two modules, found by name: a **pipeline module** (every module of
``sfxlin.pipelines``, and those named in ``$SFXLIN_PIPELINES``: :mod:`.experiments`) and the
**analysis module** its ``EXPERIMENT.analysis`` names. :data:`PIPELINE` and :data:`ANALYSIS` list
what each exports. The engine checks a module against its list when it loads it (a pipeline
module when :func:`.experiments.experiments` finds it, an analysis module when ``build()`` stores
its criteria or a results file is analysed) and refuses one that lacks a required export, or
exports one in another form, with a :class:`ProtocolError` (a ``TypeError``) naming the module and
every export at fault. Nothing else looks a module's exports up: :class:`Analysis` is an analysis module as the
engine, the report and the command line use it, its optional exports filled with their defaults.
"""
from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass
from typing import Callable

__all__ = ["ANALYSIS", "Analysis", "Export", "PIPELINE", "Protocol", "ProtocolError", "load_analysis", "load_pipeline"]


class ProtocolError(TypeError):
    """A declaration module that does not follow the plug-in protocol (the message names it and
    every export at fault)."""

    def __init__(self, role: str, name: str, problems):
        super().__init__(f"the {role} module {name!r} does not follow the plug-in protocol (docs/extending.md): "
                         + "; ".join(problems))


@dataclass(frozen=True)
class Export:
    """One name a declaration module exports.

    ``form`` is how it is used (``"figure(ds, path)"``; a bare name for a value), ``what`` what it
    is. ``required``: a module without it is refused; ``instead``: an older name accepted in its
    place (``fit_table`` for ``fit_tables``); ``keyword``: a keyword argument the function must
    accept; ``value``: for a value, not a function, ``value(found)`` says what is wrong with it
    (``None``: nothing)."""

    name: str
    form: str
    what: str
    required: bool = True
    instead: str | None = None
    keyword: str | None = None
    value: Callable[[object], str | None] | None = None


class Protocol:
    """The exports of one kind of declaration module (``role``: ``"pipeline"``, ``"analysis"``)."""

    def __init__(self, role: str, exports: tuple[Export, ...]):
        self.role = role
        self.exports = exports

    def problems(self, module) -> list[str]:
        """What is wrong with ``module`` against this protocol, one phrase per export (none: it follows it)."""
        out = []
        for export in self.exports:
            found = self.get(module, export.name)
            if found is None:
                if export.required:
                    older = f" (or {export.instead})" if export.instead else ""
                    out.append(f"it does not export {export.name}{older}: {export.form}, {export.what}")
                continue
            if export.value is not None:
                wrong = export.value(found)
                if wrong:
                    out.append(f"its {export.name} {wrong}")
            elif not callable(found):
                out.append(f"its {export.name} is not a function ({export.form})")
            elif export.keyword and not _accepts(found, export.keyword):
                out.append(f"its {export.name} does not accept the keyword {export.keyword!r} ({export.form})")
        return out

    def check(self, module):
        """``module``, or a :class:`ProtocolError` naming it and every export at fault."""
        problems = self.problems(module)
        if problems:
            raise ProtocolError(self.role, getattr(module, "__name__", repr(module)), problems)
        return module

    def get(self, module, name: str):
        """The export ``name`` of ``module`` (or the older name it stands for), or None."""
        export = next(e for e in self.exports if e.name == name)
        found = getattr(module, export.name, None)
        if found is None and export.instead:
            found = getattr(module, export.instead, None)
        return found


def _accepts(func, keyword: str) -> bool:
    try:
        params = inspect.signature(func).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature: taken at its word
        return True
    return any(p.kind is p.VAR_KEYWORD or (p.name == keyword and p.kind is not p.POSITIONAL_ONLY) for p in params)


def _an_experiment(value) -> str | None:
    from .sweep import Experiment

    return None if isinstance(value, Experiment) else f"is a {type(value).__name__}, not an sfxlin.engine.Experiment"


def _criteria(value) -> str | None:
    """What keeps ``value`` from serving as ``CRITERIA`` (an ``sfxlin.analysis.verdicts.Criteria``):
    criteria to iterate, each with ``to_dict()``, and ``measures`` and ``verdicts`` of its own."""
    lacks = [name for name in ("__iter__", "measures", "verdicts") if not callable(getattr(value, name, None))]
    if lacks:
        return f"is a {type(value).__name__}, not an sfxlin.analysis.verdicts.Criteria (it has no {', '.join(lacks)})"
    if not all(callable(getattr(c, "to_dict", None)) for c in value):
        return "holds something that is not a criterion (sfxlin.analysis.verdicts.Criterion)"
    return None


#: the exports of a pipeline module
PIPELINE = Protocol("pipeline", (
    Export("EXPERIMENT", "EXPERIMENT", "the experiment (an sfxlin.engine.Experiment: parameters, parts and their "
                                       "kernels, variables, the name of its analysis module)", value=_an_experiment),
))

#: the exports of an analysis module
ANALYSIS = Protocol("analysis", (
    Export("CRITERIA", "CRITERIA", "the predeclared criteria, each declared beside its measure (an "
                                   "sfxlin.analysis.verdicts.Criteria)", value=_criteria),
    Export("figure", "figure(ds, path)", "draws the results file's figure into path (a file name or a binary "
                                         "buffer)"),
    Export("fit_tables", "fit_tables(ds)", "the fit tables as data, {name: Dataset} (a module written before the "
                                           "tables were data may export fit_table(ds), their text, instead)",
           instead="fit_table"),
    Export("verdicts", "verdicts(ds, resamples=...)", "the verdict rows of the file (default: CRITERIA.verdicts; "
                                                      "a module's own may add flags of its own)",
           required=False, keyword="resamples"),
    Export("measures", "measures(ds)", "{criterion id: measured value} (default: CRITERIA.measures)",
           required=False),
))


def _import(name: str, role: str, hint: str = ""):
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise ValueError(f"cannot import the {role} module {name!r} ({exc}){hint}") from exc


def load_pipeline(name: str, hint: str = ""):
    """The ``EXPERIMENT`` of the pipeline module ``name``, imported and checked (:data:`PIPELINE`);
    a ``ValueError`` (ending with ``hint``) when it cannot be imported, a :class:`ProtocolError` when
    it does not follow the protocol."""
    return PIPELINE.check(_import(name, "pipeline", hint)).EXPERIMENT


class Analysis:
    """An analysis module checked against :data:`ANALYSIS`, as the engine, the report and the
    command line use it: its optional exports (``verdicts``, ``measures``) default to its
    ``CRITERIA``'s; ``fit_tables`` is the module's own, or the text of its older ``fit_table``."""

    def __init__(self, module):
        self.module = ANALYSIS.check(module)

    def criteria(self) -> list[dict]:
        """The predeclared criteria as data: what ``build()`` stores in a results file's ``criteria`` attr."""
        return [c.to_dict() for c in self.module.CRITERIA]

    def verdicts(self, ds, resamples: int | None = None) -> list:
        """The verdict rows of the results Dataset ``ds``; ``resamples`` (default: the module's) of
        the independent units for each verdict's robustness."""
        judge = ANALYSIS.get(self.module, "verdicts") or self.module.CRITERIA.verdicts
        return judge(ds) if resamples is None else judge(ds, resamples=resamples)

    def measures(self, ds) -> dict:
        """``{criterion id: measured value}`` on ``ds``."""
        return (ANALYSIS.get(self.module, "measures") or self.module.CRITERIA.measures)(ds)

    def fit_tables(self, ds):
        """The fit tables of ``ds``: ``{name: Dataset}`` (text, from a module with the older ``fit_table``)."""
        return ANALYSIS.get(self.module, "fit_tables")(ds)

    def figure(self, ds, path):
        """Draw the figure of ``ds`` into ``path``."""
        return self.module.figure(ds, path)


def load_analysis(name: str) -> Analysis:
    """The analysis module ``name``, imported and checked (:class:`Analysis`); a ``ValueError`` when it
    cannot be imported, a :class:`ProtocolError` when it does not follow the protocol."""
    return Analysis(_import(name, "analysis"))
