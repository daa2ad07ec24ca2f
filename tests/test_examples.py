"""The tutorial scripts in analysis/examples/ run as a new user would run them."""
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = sorted((Path(__file__).resolve().parent.parent / "analysis" / "examples").glob("*.py"))


@pytest.mark.slow
@pytest.mark.parametrize("script", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_runs(script, tmp_path):
    res = subprocess.run([sys.executable, str(script), str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.strip()


def test_there_are_examples_for_each_tutorial_step():
    names = " ".join(p.stem for p in EXAMPLES)
    for step in ("load_and_slice", "fit_slopes", "figure", "custom_sweep", "own_tokens"):
        assert step in names
