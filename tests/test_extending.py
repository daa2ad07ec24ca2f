"""docs/extending.md walks through a new C3 variant end to end: its two code blocks, taken from the page as
they are, are a pipeline and an analysis module that run through ``sfxlin run`` on a tiny profile, a variant
of the C3 family (its parameters C3's declarations), in at most 300 lines together."""
import re
import sys
from pathlib import Path

import pytest
import xarray as xr

from sfxlin.cli import main
from sfxlin.engine.experiments import ENV, get
from sfxlin.pipelines.families.c3 import C3

DOCS = Path(__file__).resolve().parent.parent / "docs" / "extending.md"
BLOCK = re.compile(r"```python\n# file: (\w+\.py)\n(.*?)```", re.S)


@pytest.fixture
def variant(tmp_path, monkeypatch):
    """The page's modules written to a folder on the path and named in $SFXLIN_PIPELINES."""
    files = dict(BLOCK.findall(DOCS.read_text()))
    assert set(files) == {"c3_step.py", "c3_step_analysis.py"}
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv(ENV, "c3_step")
    yield files
    for name in ("c3_step", "c3_step_analysis"):
        sys.modules.pop(name, None)


def test_the_variant_of_extending_md_runs_on_a_tiny_profile(variant, tmp_path, capsys):
    assert sum(text.count("\n") for text in variant.values()) <= 300
    experiment = get("c3_step")
    assert {p.name for p in experiment.params} <= {p.name for p in C3.params}      # C3's vocabulary
    tiny = ["--set", "n_steps=20", "--set", "L=8,16,32", "--out", str(tmp_path / "run")]
    assert main(["run", "c3_step", *tiny, "--local-scheduler", "synchronous"]) == 0
    out = capsys.readouterr().out
    assert "C3ST-slope" in out and "slope in L" in out
    with xr.open_dataset(tmp_path / "run" / "c3_step.nc") as ds:
        assert ds.D_inf_max.dims == ("lr", "seed", "model", "L") and ds.D_rel.dims == ("lr", "seed", "L")
        assert ds.lr.values.tolist() == [0.005, 0.01] and (ds.D_rel > 0).all()
    assert (tmp_path / "run" / "c3_step.png").stat().st_size > 0
    assert main(["run", "c3_step", *tiny, "--plan"]) == 0
    plan = capsys.readouterr().out
    assert "kept: 2" in plan and "to compute: 0" in plan and "expected CPU seconds: 0.0 s" in plan
    assert main(["run", "c3_step", "--plan", "--out", str(tmp_path / "other")]) == 0
    assert "to compute: 2" in capsys.readouterr().out and experiment.cost(                # the family's model
        experiment.configure("quick"), "", {"lr": 0.01, "seed": 0}) > 0


def test_the_law_sections_quick_run_prints_the_table_the_page_shows(tmp_path, capsys):
    """The page's 'Use in C1' output is the command's: each criterion's threshold and verdict, and the note."""
    text = DOCS.read_text()
    block = text.split("The quick run above prints:\n\n```\n")[1].split("```")[0].splitlines()
    assert main(["run", "c1", "--set", "laws=gaussian,gaussian_mixture", "--no-figure", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out.splitlines()
    printed = out[next(i for i, line in enumerate(out) if line.startswith("criterion")):]

    def rows(lines):   # criterion -> (threshold, verdict), by the columns of the table's rule line
        cuts = [i for i, ch in enumerate(lines[1]) if ch == " " and lines[1][i - 1] == "-"]
        fields = lambda line: [line[a:b].strip() for a, b in zip([0, *cuts], [*cuts, None])]  # noqa: E731
        return {f[0]: (f[2], f[4]) for f in map(fields, lines[2:]) if f[0].startswith("C1")}

    assert rows(block) == rows(printed) and len(rows(block)) == 10
    assert block[-1] == next(line for line in printed if line.startswith("note:"))
