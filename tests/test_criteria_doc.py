"""docs/criteria.md states how each profile judges each criterion: its tables must say what the
analysis modules declare (the paper threshold and the quick profile's calibration)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from sfxlin.analysis import c1, c1_kernels, c1_own, c1_real, c2, c2_threshold, c3, c3_deep, c3_dim, c3_horizon, c3_landscape, c3_real, c3_shift
from sfxlin.analysis.verdicts import NotJudged

DOC = Path(__file__).resolve().parent.parent / "docs" / "criteria.md"
MODULES = (c1, c1_kernels, c1_own, c1_real, c2, c2_threshold, c3, c3_deep, c3_dim, c3_horizon, c3_landscape, c3_real, c3_shift)


def documented_rows() -> dict:
    """``{id: (threshold cell, quick cell)}`` of every criterion row of the doc's tables."""
    rows = {}
    for line in DOC.read_text().splitlines():
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        if len(cells) >= 7 and re.match(r"^C\d", cells[0]):  # a reason may hold a bare |
            rows[cells[0]] = (cells[2], cells[5].replace("\\|", "|"))
    return rows


def quick_cell(criterion) -> str:
    if criterion.quick is None:
        return "same"
    if isinstance(criterion.quick, NotJudged):
        return f"NOT JUDGED: {criterion.quick.reason}"
    return f"`{criterion.at_threshold(criterion.quick).threshold_str}`"


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.__name__.rsplit(".", 1)[-1])
def test_the_doc_states_every_criterion_as_declared(module):
    rows = documented_rows()
    for criterion in module.CRITERIA:
        assert criterion.id in rows, f"{criterion.id} is not in docs/criteria.md"
        threshold, quick = rows[criterion.id]
        assert quick == quick_cell(criterion), criterion.id
        low_high = re.findall(r"-?[\d.]+(?:e-?\d+)?", threshold)
        expected = criterion.threshold if criterion.kind == "in" else (criterion.threshold,)
        assert [float(v) for v in low_high] == pytest.approx(list(expected)), criterion.id
