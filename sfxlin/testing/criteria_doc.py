"""The criteria tables of ``docs/criteria.md``, generated from the analysis modules' ``CRITERIA``.

The page is prose written by hand around one generated table per experiment. Each table lies
between two markers::

    <!-- generated: the criteria of c1_limit (python -m sfxlin.testing.generate --write) -->
    | id | measured | threshold | reference | calibr. | quick profile | reason for the threshold |
    ...
    <!-- end generated -->

:func:`criteria_doc` rewrites what lies between the markers from the declarations (one row per
criterion: its id, description, threshold, reference, the profile its threshold is calibrated for,
how the quick profile judges it and the reason for the threshold) and keeps everything else.
An experiment with no table yet gets a section of its own at the end of the page, for its prose
to be written around it; a table of an experiment that is not found is an error.
"""
from __future__ import annotations

import re

__all__ = ["BEGIN", "END", "PATH", "criteria_doc", "quick_cell", "table"]

#: where the page is committed, relative to the repository's root
PATH = "docs/criteria.md"

BEGIN = "<!-- generated: the criteria of {name} (python -m sfxlin.testing.generate --write) -->"
END = "<!-- end generated -->"

_BLOCK = re.compile(re.escape(BEGIN).replace(re.escape("{name}"), r"(?P<name>[\w.]+)") + r"\n.*?"
                    + re.escape(END), re.S)

HEADER = ("| id | measured | threshold | reference | calibr. | quick profile | reason for the threshold |",
          "|---|---|---|---|---|---|---|")


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def quick_cell(criterion) -> str:
    """How the quick profile judges a criterion: ``same`` (by its paper threshold), a threshold
    calibrated for it, or ``NOT JUDGED: <reason>``."""
    from ..analysis.verdicts import NotJudged

    if criterion.quick is None:
        return "same"
    if isinstance(criterion.quick, NotJudged):
        return f"NOT JUDGED: {criterion.quick.reason}"
    return f"`{criterion.at_threshold(criterion.quick).threshold_str}`"


def table(experiment) -> str:
    """The generated block of one experiment: its markers around the table of its criteria."""
    from ..engine.protocol import load_analysis

    rows = [f"| {c.id} | {_cell(c.description)} | `{c.threshold_str}` | {_cell(c.reference) or '—'} | {c.profile} "
            f"| {_cell(quick_cell(c))} | {_cell(c.reason)} |"
            for c in load_analysis(experiment.analysis).module.CRITERIA]
    return "\n".join([BEGIN.format(name=experiment.name), *HEADER, *rows, END])


def criteria_doc(current: str) -> str:
    """The page ``current`` (its committed text) with every generated table rewritten from the
    declarations, and a new section for each experiment that has none."""
    from ..engine.experiments import experiments

    found = {name: e for name, e in experiments().items() if e.analysis}
    seen = []

    def fresh(match):
        name = match.group("name")
        if name not in found:
            raise ValueError(f"{PATH} has a table of {name!r}, which is no experiment (found: {sorted(found)}): "
                             f"remove its section")
        seen.append(name)
        return table(found[name])

    text = _BLOCK.sub(fresh, current)
    for name in found:
        if name not in seen:
            text = text.rstrip("\n") + f"\n\n## {name}\n\n{table(found[name])}\n"
    return text
