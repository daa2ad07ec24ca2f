"""The criteria pins: every criterion of every experiment as committed data (``tests/criteria_pins.json``).

A pin is what a criterion judges by: its id, claim, kind, paper threshold, the profile that
threshold is calibrated for, and how the quick profile judges it (a threshold of the same kind,
``None``: by the paper threshold, or :data:`NOT_JUDGED`; the reason, free text, is not pinned). The
file is generated from the analysis modules' ``CRITERIA`` (:func:`pins_text`, written by
``python -m sfxlin.testing.generate --write``) and a test compares it with a fresh generation: a
change of a criterion's direction or bound is a change of protocol, visible in the file's diff.
"""
from __future__ import annotations

import json

__all__ = ["NOT_JUDGED", "PATH", "pin", "pins", "pins_text"]

#: where the pins are committed, relative to the repository's root
PATH = "tests/criteria_pins.json"

#: the quick profile's pin of a criterion it does not judge
NOT_JUDGED = "not judged"

ABOUT = ("The predeclared criteria of every experiment, as its analysis module's CRITERIA declares them: generated "
         "by python -m sfxlin.testing.generate --write. A change here is a change of the protocol.")


def pin(criterion: dict) -> dict:
    """The pin of a criterion as ``build()`` stores it (:meth:`sfxlin.analysis.verdicts.Criterion.to_dict`)."""
    quick = criterion.get("quick")
    return {"id": criterion["id"], "claim": criterion["claim"], "kind": criterion["kind"],
            "threshold": criterion["threshold"], "profile": criterion["profile"],
            "quick": NOT_JUDGED if isinstance(quick, dict) else quick}


def pins() -> dict:
    """``{experiment: [pin, ...]}`` of every experiment found (:func:`sfxlin.engine.experiments.experiments`),
    its criteria in their declared order (``[]`` for an experiment without an analysis module)."""
    from ..engine.experiments import experiments
    from ..engine.sweep import criteria_of

    return {name: [pin(c) for c in criteria_of(e)] if e.analysis else [] for name, e in experiments().items()}


def pins_text(current: str | None = None) -> str:
    """The pins file: JSON, one criterion a line (so that its diff names the criteria that moved).
    ``current``, the committed text, is not read: the file is generated whole."""
    lines = ["{", f'  "about": {json.dumps(ABOUT)},', '  "experiments": {']
    found = pins()
    for i, (name, rows) in enumerate(found.items()):
        tail = "," if i < len(found) - 1 else ""
        if not rows:
            lines.append(f"    {json.dumps(name)}: []{tail}")
            continue
        lines.append(f"    {json.dumps(name)}: [")
        lines += [f"      {json.dumps(row)}{',' if j < len(rows) - 1 else ''}" for j, row in enumerate(rows)]
        lines.append(f"    ]{tail}")
    return "\n".join(lines + ["  }", "}"]) + "\n"
