"""``python -m sfxlin.testing.generate``: the files generated from the declarations follow the
experiments found, and the command says when a committed one is out of date and rewrites it."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from sfxlin.engine.experiments import ENV
from sfxlin.testing import criteria_doc, pins
from sfxlin.testing.generate import COMMAND, GENERATED, difference, main

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def with_walk(monkeypatch):
    """The walk of tests/declared found beside the shipped experiments ($SFXLIN_PIPELINES)."""
    monkeypatch.syspath_prepend(str(ROOT / "tests" / "declared"))
    monkeypatch.setenv(ENV, "walk_pipeline")


@pytest.fixture
def root(tmp_path):
    """A copy of the repository's generated files, to be rewritten."""
    for path in GENERATED:
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / path, tmp_path / path)
    return tmp_path


def test_a_new_experiment_is_missing_from_every_generated_file_until_it_is_regenerated(with_walk, root):
    assert '+    "walk": [' in difference(root, pins.PATH)
    assert "+## walk" in difference(root, criteria_doc.PATH)
    assert main(["--root", str(root)]) == 1
    assert main(["--root", str(root), "--write"]) == 0
    assert all(not difference(root, path) for path in GENERATED)
    walk = json.loads((root / pins.PATH).read_text())["experiments"]["walk"]
    assert walk == [{"id": "W-diffusion", "claim": "W", "kind": "in", "threshold": [0.7, 1.3], "profile": "quick",
                     "quick": None}]
    assert "| W-diffusion | msd / scale^2, seed mean, every (scale, L) | `in [0.7, 1.3]` | 1 exactly | quick | same |" \
        in (root / criteria_doc.PATH).read_text()


def test_the_command_says_which_file_is_stale_and_how_to_regenerate_it(root, capsys):
    assert main(["--root", str(root)]) == 0
    text = (root / pins.PATH).read_text()
    (root / pins.PATH).write_text(text.replace('"threshold": [-1.1, -0.9]', '"threshold": [-1.2, -0.9]', 1))
    assert main(["--root", str(root)]) == 1
    out, err = capsys.readouterr()
    assert '-      {"id": "C1-slopes"' in out and '+      {"id": "C1-slopes"' in out
    assert f"1 file(s) out of date: {COMMAND}" in err


def test_the_command_refuses_a_folder_that_is_not_the_repository(tmp_path):
    with pytest.raises(SystemExit):
        main(["--root", str(tmp_path)])
