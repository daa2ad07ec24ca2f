"""The plug-in protocol (sfxlin.engine.protocol): every experiment follows it, and a declaration
module that does not is refused as it is loaded, with a message naming the module and what it lacks."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from sfxlin.engine.experiments import ENV, experiments
from sfxlin.engine.protocol import ANALYSIS, PIPELINE, ProtocolError, load_analysis
from sfxlin.engine.sweep import build

DOCS = Path(__file__).resolve().parent.parent / "docs" / "extending.md"

PIPELINE_SOURCE = '''\
from walk_pipeline import EXPERIMENT as WALK
import dataclasses

EXPERIMENT = dataclasses.replace(WALK, name="{name}", analysis="{analysis}", module=__name__)
'''

ANALYSIS_SOURCE = '''\
from walk_analysis import CRITERIA, figure, fit_table
'''


@pytest.fixture
def outside(tmp_path, monkeypatch):
    """``outside(name, source)``: writes the module ``name`` in a folder on the path (the walk of
    tests/declared importable beside it)."""
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parent / "declared"))
    monkeypatch.syspath_prepend(str(tmp_path))

    def write(name, source):
        (tmp_path / f"{name}.py").write_text(source)
        return name
    return write


@pytest.mark.parametrize("name", sorted(experiments()))
def test_every_experiment_follows_the_protocol(name):
    analysis = load_analysis(experiments()[name].analysis)
    assert analysis.criteria(), f"{name}: no criteria"


def test_a_pipeline_module_without_experiment_is_refused_naming_what_it_lacks(outside, monkeypatch):
    monkeypatch.setenv(ENV, outside("no_experiment_pipeline", "PARAMS = ()\n"))
    with pytest.raises(ProtocolError, match=r"the pipeline module 'no_experiment_pipeline' does not follow the "
                                            r"plug-in protocol \(docs/extending.md\): it does not export EXPERIMENT"):
        experiments()


def test_an_experiment_that_is_not_one_is_refused(outside, monkeypatch):
    monkeypatch.setenv(ENV, outside("dict_pipeline", "EXPERIMENT = {'name': 'x'}\n"))
    with pytest.raises(ProtocolError) as err:
        experiments()
    assert "its EXPERIMENT is a dict, not an sfxlin.engine.Experiment" in str(err.value)


def test_an_analysis_module_that_cannot_be_found_is_refused_when_the_experiment_is_loaded(outside, monkeypatch):
    monkeypatch.setenv(ENV, outside("lost_pipeline", PIPELINE_SOURCE.format(name="lost", analysis="no_such_analysis")))
    with pytest.raises(ValueError, match="'lost' .* names the analysis module 'no_such_analysis', which cannot be "
                                         "found"):
        experiments()


def test_an_analysis_module_without_criteria_is_refused_before_any_cell(outside, monkeypatch):
    outside("no_criteria_analysis", "from walk_analysis import figure, fit_table\n")
    monkeypatch.setenv(ENV, outside("no_criteria_pipeline",
                                    PIPELINE_SOURCE.format(name="no_criteria", analysis="no_criteria_analysis")))
    experiment = experiments()["no_criteria"]
    with pytest.raises(ProtocolError, match=r"the analysis module 'no_criteria_analysis' does not follow the plug-in "
                                            r"protocol \(docs/extending.md\): it does not export CRITERIA: CRITERIA, "
                                            r"the predeclared criteria"):
        build(experiment, experiment.configure("quick"))


def test_every_fault_of_an_analysis_module_is_named_at_once(outside):
    name = outside("faulty_analysis", "CRITERIA = [1, 2]\n\ndef verdicts(ds):\n    return []\n\nfigure = 'a.png'\n")
    with pytest.raises(ProtocolError) as err:
        load_analysis(name)
    message = str(err.value)
    assert "its CRITERIA is a list, not an sfxlin.analysis.verdicts.Criteria (it has no measures, verdicts)" in message
    assert "its figure is not a function (figure(ds, path))" in message
    assert "it does not export fit_tables (or fit_table): fit_tables(ds)" in message
    assert "its verdicts does not accept the keyword 'resamples' (verdicts(ds, resamples=...))" in message


def test_a_module_that_follows_it_is_used_with_its_defaults(outside):
    """The walk's analysis exports neither verdicts nor measures: its CRITERIA's serve; its older text
    fit_table serves as its fit tables."""
    analysis = load_analysis(outside("walk_like_analysis", ANALYSIS_SOURCE))
    import walk_analysis

    assert [c["id"] for c in analysis.criteria()] == ["W-diffusion"]
    assert analysis.module.CRITERIA is walk_analysis.CRITERIA
    assert ANALYSIS.get(analysis.module, "fit_tables") is walk_analysis.fit_table


def test_the_protocol_is_documented_once_in_extending_md():
    """docs/extending.md lists every export of both modules in the form the protocol states it."""
    text = DOCS.read_text()
    for protocol in (PIPELINE, ANALYSIS):
        for export in protocol.exports:
            assert re.search(rf"`{re.escape(export.form)}`", text), f"docs/extending.md lacks `{export.form}`"
