"""The measures of every experiment judge all the resamples of a file's units in one call.

For each synthetic results file (tests/synthetic.py, one per experiment) and each shipped one:
the verdicts of every criterion on the resampled data (:func:`~sfxlin.analysis.verdicts.resampled`,
the resamples along a dim, each measure called once) are the verdicts of that criterion on each
resample judged alone, as a file (the measures called once per resample, without a resample dim).
"""
from __future__ import annotations

from pathlib import Path

import pytest

import synthetic
from sfxlin.analysis.verdicts import RESAMPLE, criteria_from_attrs, resample_indices, resampled
from sfxlin.engine.protocol import load_analysis
from sfxlin.engine.storage import open_results

SHIPPED = sorted((Path(__file__).resolve().parent.parent / "datasets").glob("*.nc"))


def _same_verdicts_alone_and_together(ds, resamples):
    criteria = load_analysis(ds.attrs["analysis"]).module.CRITERIA
    units = {u: ds.sizes[u] for u in criteria.units if u in ds.dims}
    if not units or max(units.values()) < 2:   # nothing to resample: every verdict says so instead
        rows = criteria.verdicts(ds)
        judged = [r for r in rows if r.verdict in ("PASS", "FAIL")]
        assert judged and all(r.robustness is None and "no independent unit" in r.robustness_note for r in judged)
        return
    data = resampled(ds, resample_indices(units, resamples, "test", {u: n + 1 for u, n in units.items()}))
    stored = criteria_from_attrs(ds)
    together = criteria._judge_resamples(data, stored, None, {})
    for r in range(data.sizes[RESAMPLE]):
        alone = {row.id: row.verdict for row in criteria._judge(data.isel({RESAMPLE: r}), stored, None)}
        for cid, verdicts in together.items():
            assert verdicts[r] == alone[cid], (cid, r)


@pytest.mark.parametrize("name", sorted(synthetic.FACTORIES))
def test_synthetic_files(name):
    _same_verdicts_alone_and_together(synthetic.FACTORIES[name](), 6)


@pytest.mark.parametrize("path", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_shipped_files(path):
    _same_verdicts_alone_and_together(open_results(path), 6)
