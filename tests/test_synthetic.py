"""Every experiment has a synthetic results file (tests/synthetic.py), and each is what the module
promises: a file of that experiment, with its declared criteria, on which every criterion PASSES."""
from __future__ import annotations

import pytest

import synthetic
from sfxlin.analysis.verdicts import PASS
from sfxlin.engine.experiments import experiments
from sfxlin.engine.protocol import load_analysis
from sfxlin.engine.sweep import criteria_of


@pytest.mark.parametrize("name", sorted(experiments()))
def test_every_experiment_has_a_synthetic_file(name):
    assert name in synthetic.FACTORIES, (f"tests/synthetic.py has no synthetic results file of {name}: add a "
                                         f"factory, decorated @factory({name!r})")


def test_every_synthetic_file_is_of_an_experiment():
    assert set(synthetic.FACTORIES) <= set(experiments())


@pytest.mark.parametrize("name", sorted(synthetic.FACTORIES))
def test_every_criterion_passes_on_the_synthetic_file(name):
    ds = synthetic.FACTORIES[name]()
    assert ds.attrs["experiment"] == name
    rows = load_analysis(ds.attrs["analysis"]).verdicts(ds, resamples=0)
    assert {r.id: (r.verdict, r.note) for r in rows} == {c["id"]: (PASS, "") for c in criteria_of(experiments()[name])}
