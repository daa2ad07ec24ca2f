"""docs/criteria.md states how each profile judges each criterion: its tables are generated from
the analysis modules' declarations (sfxlin.testing.criteria_doc), the prose around them is kept."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from sfxlin.engine.experiments import experiments
from sfxlin.engine.protocol import load_analysis
from sfxlin.testing import criteria_doc
from sfxlin.testing.criteria_doc import quick_cell
from sfxlin.testing.generate import COMMAND, difference

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / criteria_doc.PATH


def test_the_doc_is_generated_from_the_declarations():
    diff = difference(ROOT, criteria_doc.PATH)
    assert not diff, f"{criteria_doc.PATH} differs from the declared criteria: regenerate it ({COMMAND}).\n{diff}"


def documented_rows() -> dict:
    """``{id: (threshold cell, quick cell)}`` of every criterion row of the doc's tables."""
    rows = {}
    for line in DOC.read_text().splitlines():
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        if len(cells) >= 7 and re.match(r"^C\d", cells[0]):
            rows[cells[0]] = (cells[2], cells[5].replace("\\|", "|"))
    return rows


@pytest.mark.parametrize("name", sorted(experiments()))
def test_the_doc_states_every_criterion_as_declared(name):
    """Read back from the committed page: a row per criterion, with its threshold and its quick cell."""
    rows = documented_rows()
    for criterion in load_analysis(experiments()[name].analysis).module.CRITERIA:
        assert criterion.id in rows, f"{criterion.id} is not in {criteria_doc.PATH}: {COMMAND}"
        threshold, quick = rows[criterion.id]
        assert quick == quick_cell(criterion), criterion.id
        low_high = re.findall(r"-?[\d.]+(?:e-?\d+)?", threshold)
        expected = criterion.threshold if criterion.kind == "in" else (criterion.threshold,)
        assert [float(v) for v in low_high] == pytest.approx(list(expected)), criterion.id


def _blocks_removed(text: str) -> str:
    return re.sub(r"<!-- generated: .*?<!-- end generated -->", "", text, flags=re.S)


def test_the_prose_around_the_tables_is_kept():
    text = DOC.read_text()
    regenerated = criteria_doc.criteria_doc(text.replace("| C1-slopes |", "| C1-slopes edited by hand |"))
    assert regenerated == text
    assert _blocks_removed(regenerated) == _blocks_removed(text)


def test_an_experiment_without_a_table_gets_a_section_of_its_own():
    text = DOC.read_text()
    begin = criteria_doc.BEGIN.format(name="c3_dim")
    block = text[text.index(begin):text.index(criteria_doc.END, text.index(begin)) + len(criteria_doc.END)]
    regenerated = criteria_doc.criteria_doc(text.replace(block, ""))
    assert regenerated.endswith(f"\n\n## c3_dim\n\n{block}\n")
    assert "| C3D-D-slope |" in regenerated.split("## c3_dim\n\n")[-1]


def test_a_table_of_no_experiment_is_refused():
    page = "# Criteria\n\n" + criteria_doc.BEGIN.format(name="c9_gone") + "\n" + criteria_doc.END + "\n"
    with pytest.raises(ValueError, match="a table of 'c9_gone', which is no experiment"):
        criteria_doc.criteria_doc(page)
