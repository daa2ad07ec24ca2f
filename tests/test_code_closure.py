"""The cell store fingerprints all of an experiment's own code: the import closure of its kernels',
declaring and analysis modules outside sfxlin and the installed libraries.

An outside experiment (found through ``$SFXLIN_PIPELINES``) whose kernel calls a helper module
beside it: editing the helper recomputes every cell, whether the kernel's module imports the
helper at its top or inside the kernel. Before, only the kernel's own module was hashed, and the
second run served the first run's cells ("8 kept ..., 0 to compute") with the old code's values.
"""
from __future__ import annotations

import dataclasses
import importlib
import os
import re
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

from sfxlin.engine.cellstore import code_files, code_fingerprint, experiment_code
from sfxlin.engine.closure import import_closure
from sfxlin.engine.experiments import ENV, experiments
from sfxlin.engine.family import Family
from sfxlin.engine.params import Param
from sfxlin.engine.sweep import Experiment, Part, Variable

PIPELINE = '''\
import numpy as np

from sfxlin.engine.params import Param
from sfxlin.engine.sweep import Experiment, Part, Variable
{top}

PARAMS = (Param("x", "float_list", "helper arguments", [1.0, 2.0], grid=True),
          Param("n_seeds", "int", "replicates", 4, low=1, grid=True),
          Param("root_seed", "int", "root seed", 7))


def grid(config):
    return {{"x": list(config["x"]), "seed": list(range(config["n_seeds"]))}}


def inner_coords(config):
    return {{}}


def kernel(cell, rng, inputs):
    {inside}
    return {{"y": np.array(helper.value(cell["x"]))}}


EXPERIMENT = Experiment(
    name="closure_demo", params=PARAMS, inner_coords=inner_coords, analysis="closure_demo_analysis",
    variables=(Variable("y", ("x", "seed"), "helper value", "helper.value(x)"),),
    parts=(Part("", grid, kernel),), description="a kernel that calls a helper module beside it")
'''

ANALYSIS = '''\
from pathlib import Path

from sfxlin.analysis.verdicts import Criteria

CRITERIA = Criteria("CLOSURE")


def fit_table(ds):
    return "no fits"


def figure(ds, path):
    Path(path).write_bytes(b"")
'''

HELPER = "def value(x):\n    return x + 1.0\n"
HELPER_TIMES_10 = "def value(x):\n    return 10 * (x + 1.0)\n"


def _write_experiment(folder: Path, where: str) -> None:
    """The outside experiment ``closure_demo`` in ``folder``: its pipeline module imports
    ``helper`` at its top (``where="top"``) or inside the kernel (``"inside"``)."""
    folder.mkdir()
    top, inside = ("import helper", "pass") if where == "top" else ("", "import helper")
    (folder / "closure_demo_pipeline.py").write_text(PIPELINE.format(top=top, inside=inside))
    (folder / "closure_demo_analysis.py").write_text(ANALYSIS)
    (folder / "helper.py").write_text(HELPER)


def _sfxlin_run(folder: Path, out: Path):
    """``sfxlin run closure_demo --out OUT`` in a fresh process, the experiment found through
    ``$SFXLIN_PIPELINES`` on ``folder``."""
    env = {**os.environ, ENV: "closure_demo_pipeline", "PYTHONDONTWRITEBYTECODE": "1",
           "PYTHONPATH": f"{folder}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    run = subprocess.run([sys.executable, "-m", "sfxlin.cli", "run", "closure_demo", "--out", str(out)],
                         capture_output=True, text=True, env=env, cwd=folder)
    assert run.returncode == 0, run.stderr
    with xr.open_dataset(out / "closure_demo.nc") as ds:
        return run.stdout, ds.y.transpose("x", "seed").values


@pytest.mark.slow
@pytest.mark.parametrize("where", ["top", "inside"])
def test_editing_a_helper_module_recomputes_every_cell(tmp_path, where):
    folder, out = tmp_path / "experiment", tmp_path / "out"
    _write_experiment(folder, where)
    first, y_first = _sfxlin_run(folder, out)
    assert "closure_demo: profile quick, 8 cells\n" in first
    np.testing.assert_array_equal(y_first, np.repeat([[2.0], [3.0]], 4, axis=1))

    (folder / "helper.py").write_text(HELPER_TIMES_10)
    second, y_second = _sfxlin_run(folder, out)
    assert "closure_demo: profile quick, 8 cells\n" in second and "kept" not in second
    np.testing.assert_array_equal(y_second, 10 * y_first)
    assert len(list((out / ".closure_demo.cells").glob("cell_*.npz"))) == 16  # the old code's cells stay, unused


@pytest.fixture
def modules(tmp_path, monkeypatch):
    """Write ``{relative path: source}`` under ``tmp_path`` (on ``sys.path``); the module names
    take a unique suffix (``{u}`` in paths and sources), removed from ``sys.modules`` after."""
    suffix = uuid.uuid4().hex[:8]
    monkeypatch.syspath_prepend(str(tmp_path))

    def write(files):
        for relative, source in files.items():
            path = tmp_path / relative.format(u=suffix)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(textwrap.dedent(source).format(u=suffix))
        importlib.invalidate_caches()
        return suffix

    yield write
    for name in [n for n in sys.modules if suffix in n]:
        del sys.modules[name]


def test_the_closure_follows_every_import_of_own_code_and_nothing_installed(modules, tmp_path):
    u = modules({
        "a_{u}.py": """\
            import json
            import numpy as np
            from sfxlin.engine.sweep import Experiment
            import b_{u}
            """,
        "b_{u}.py": """\
            def f():
                from pkg_{u} import c   # inside a function; a submodule named by from-import
                return c.g()
            """,
        "pkg_{u}/__init__.py": "",
        "pkg_{u}/c.py": """\
            from .d import h   # relative
            from os.path import join

            def g():
                return h()
            """,
        "pkg_{u}/d.py": """\
            try:
                import no_such_module_{u}   # an optional dependency that is missing: skipped
            except ImportError:
                pass

            def h():
                return 1
            """,
    })
    found = import_closure((f"a_{u}",))
    assert found == {f"a_{u}": tmp_path / f"a_{u}.py", f"b_{u}": tmp_path / f"b_{u}.py",
                     f"pkg_{u}": tmp_path / f"pkg_{u}" / "__init__.py", f"pkg_{u}.c": tmp_path / f"pkg_{u}" / "c.py",
                     f"pkg_{u}.d": tmp_path / f"pkg_{u}" / "d.py"}
    assert list(found) == sorted(found)
    assert f"b_{u}" not in sys.modules   # found by reading the source, not by importing it


def test_sfxlin_and_installed_modules_are_not_listed(modules):
    u = modules({"only_{u}.py": "import sfxlin\nimport sfxlin.engine.sweep\nimport numpy.linalg\nimport json\n"})
    assert list(import_closure((f"only_{u}", "sfxlin.engine.sweep"))) == [f"only_{u}"]
    assert import_closure(()) == {}
    # a kernel's module in an installed package is still hashed (as it always was), not what it imports
    assert list(import_closure(("json",))) == ["json"]


def test_an_experiment_names_the_module_that_declares_it():
    declared = Experiment(name="declared_here", inner_coords=dict, variables=(Variable("v", (), "v", "v"),),
                          parts=(Part("", dict, dict),), params=(Param("root_seed", "int", "root seed", 7),))
    assert declared.module == __name__
    assert dataclasses.replace(declared, name="renamed").module == __name__


def test_the_shipped_experiments_hash_sfxlin_alone():
    """Their modules are all inside sfxlin, hashed whole: no closure to walk, the fingerprint of old."""
    shipped = [e for e in experiments().values() if e.module.startswith("sfxlin.pipelines.")]
    assert len(shipped) >= 10
    for experiment in shipped:
        assert experiment_code(experiment) == code_fingerprint(()), experiment.name


def test_a_family_module_is_part_of_every_variants_code(tmp_path, monkeypatch):
    """Every shipped variant's code holds its family's module (sfxlin.pipelines is hashed whole, its
    families package included); so does a variant declared outside the package (the C3 variant of
    docs/extending.md), whose own modules join it: editing a family recomputes every variant's cells."""
    hashed = {path.resolve() for _name, path in code_files()}
    homes = {name: Path(module.__file__).resolve() for name, module in sys.modules.items()
             if name.startswith("sfxlin.pipelines.families.")}
    for experiment in experiments().values():
        family = next(v for v in vars(sys.modules[experiment.module]).values() if isinstance(v, Family))
        home = next(path for name, path in homes.items() if family in vars(sys.modules[name]).values())
        assert home in hashed, experiment.name
    block = re.compile(r"```python\n# file: (\w+)\.py\n(.*?)```", re.S)
    for name, text in block.findall((Path(__file__).parent.parent / "docs" / "extending.md").read_text()):
        (tmp_path / f"{name}.py").write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv(ENV, "c3_step")
    try:
        variant = experiments()["c3_step"]
        files = {path.resolve() for _name, path in code_files(("c3_step", "c3_step_analysis"))}
        assert (tmp_path / "c3_step.py").resolve() in files and hashed <= files
        assert (Path(sys.modules["sfxlin.pipelines.families.c3"].__file__).resolve()) in files
        assert experiment_code(variant) == code_fingerprint(("c3_step", "c3_step_analysis"))
    finally:
        for name in ("c3_step", "c3_step_analysis"):
            sys.modules.pop(name, None)
