"""``sfxlin.run``: the Python face of ``sfxlin run``, used as a researcher would in a notebook (a
script of cells run in a fresh process): keyword parameters as Python values, the command line's
file bit for bit, the same cell store (a second call computes nothing), the same refusal to
replace a file of another configuration, typed values checked as ``--set`` checks them."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

from sfxlin.engine.storage import load

from sfxlin.engine.params import Param, parse_text
from sfxlin.runs import override_text
from sfxlin.testing import assert_same_results

BIN = Path(sys.executable).parent
IGNORE = ("created", "history", "wall_seconds", "scheduler", "git_revision", "cell_timeline", "cell_seconds",
          "overrides", "profile")

NOTEBOOK = '''
# cell 1: a sweep of my own, parameters as Python values
import sfxlin
ds = sfxlin.run("c1_own", out="mine", tokens="own/tokens.npy", L=[16, 32, 64], n_seeds=2, U_norm=0.4,
                figure=False)
print("CELLS", ds.attrs["n_cells"], "MSE", ds.mse.dims)
ds.to_netcdf("cell1.nc")
print("VERDICTS", len(ds.sfx.verdicts()))

# cell 2: the same call again: every cell is kept, none computed
again = sfxlin.run("c1_own", out="mine", tokens="own/tokens.npy", L=[16, 32, 64], n_seeds=2, U_norm=0.4,
                   figure=False, quiet=False)
print("SAME", bool((again.mse == ds.mse).all()))

# cell 3: another configuration into the same folder is refused, then replaces it when asked
try:
    sfxlin.run("c1_own", out="mine", tokens="own/tokens.npy", L=[16, 32, 64], n_seeds=2, U_norm=0.3, figure=False)
except ValueError as exc:
    print("REFUSED", exc)
other = sfxlin.run("c1o", out="mine", tokens="own/tokens.npy", L=[16, 32, 64], n_seeds=2, U_norm=0.3, force=True)
print("FORCED", other.attrs["config"])

# cell 4: mistakes are named
for bad in (dict(L=[64, 16]), dict(n_seeds=1.5), dict(sampling="iid"), dict(lr=0.1)):
    try:
        sfxlin.run("c1_own", out="mine", tokens="own/tokens.npy", **bad)
    except (ValueError, TypeError) as exc:
        print("BAD", type(exc).__name__, exc)
'''


@pytest.fixture(scope="module")
def notebook(tmp_path_factory):
    """The notebook run in a fresh process, and the command line's run of cell 1's configuration."""
    folder = tmp_path_factory.mktemp("notebook")
    (folder / "own").mkdir()
    np.save(folder / "own/tokens.npy", np.random.default_rng(3).standard_normal((3000, 3)))
    (folder / "notebook.py").write_text(NOTEBOOK)
    proc = subprocess.run([sys.executable, "notebook.py"], cwd=folder, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    cli = subprocess.run([str(BIN / "sfxlin"), "run", "c1_own", "--out", "cli", "--set", "tokens=own/tokens.npy",
                          "--set", "L=16,32,64", "--set", "n_seeds=2", "--set", "U_norm=0.4", "--quiet"],
                         cwd=folder, capture_output=True, text=True, timeout=300)
    assert cli.returncode == 0, cli.stderr[-3000:]
    return folder, proc.stdout


def test_cell_one_gives_the_command_lines_file_bit_for_bit(notebook):
    folder, out = notebook
    assert "CELLS 3 " in out and "VERDICTS " in out
    with load(folder / "cli/c1_own.nc") as cli, load(folder / "cell1.nc") as mine:
        assert_same_results(mine.load(), cli.load(), ignore=IGNORE)
        assert json.loads(mine.attrs["config"]) == json.loads(cli.attrs["config"])
    assert (folder / "mine/c1_own.png").exists()   # drawn by cell 3's run (figure=True by default)


def test_the_second_call_serves_every_cell_from_the_store(notebook):
    _folder, out = notebook
    assert "(3 kept from earlier runs in" in out and ", 0 to compute)" in out
    assert "SAME True" in out


def test_another_configuration_is_refused_and_force_replaces_it(notebook):
    _folder, out = notebook
    refused = next(line for line in out.splitlines() if line.startswith("REFUSED"))
    assert "holds a run under another configuration (U_norm: 0.4 -> 0.3)" in refused and "force=True" in refused
    assert '"U_norm": 0.3' in next(line for line in out.splitlines() if line.startswith("FORCED"))


def test_mistakes_are_named(notebook):
    _folder, out = notebook
    bad = [line for line in out.splitlines() if line.startswith("BAD")]
    assert len(bad) == 4, out[-2000:]
    assert bad[0].startswith("BAD ValueError L: must be strictly increasing")
    assert bad[1].startswith("BAD ValueError n_seeds: expected an integer, got 1.5")
    assert bad[2].startswith("BAD ValueError sampling: expected a list, got 'iid'")
    assert bad[3].startswith("BAD TypeError run() got unknown parameter(s) ['lr'] of c1_own")


def test_the_python_run_is_the_command_lines_run(tmp_path):
    """In process: the file of ``sfxlin.run`` equals the command line's for the same values, and
    records the same configuration."""
    import sfxlin

    ds = sfxlin.run("c1_own", out=tmp_path / "py", L=[16, 32, 64], n_seeds=1, U_norm=0.25, figure=False)
    cli = subprocess.run([str(BIN / "sfxlin"), "run", "c1_own", "--out", str(tmp_path / "cli"), "--set",
                          "L=16,32,64", "--set", "n_seeds=1", "--set", "U_norm=0.25", "--quiet", "--no-figure"],
                         capture_output=True, text=True, timeout=300)
    assert cli.returncode == 0, cli.stderr[-3000:]
    with load(tmp_path / "cli/c1_own.nc") as other:
        assert_same_results(ds, other.load(), ignore=IGNORE)
        assert json.loads(ds.attrs["config"]) == json.loads(other.attrs["config"])
    assert not (tmp_path / "cli/c1_own.png").exists() and not (tmp_path / "py/c1_own.png").exists()


@pytest.mark.parametrize("kind, value", [("int_list", [2, 4]), ("float_list", [0.1, 0.25]), ("float", 0.1),
                                         ("int", 3), ("bool", True), ("bool", False), ("str", "iid"),
                                         ("matrix", [[2.0, 0.5], [0.5, 1.0]]), ("matrix", [1.0, 2.0]),
                                         ("str_list", ["a", "b"])])
def test_a_typed_value_is_the_text_that_gives_it(kind, value):
    p = Param("x", kind, "a parameter", value)
    assert parse_text(p, override_text(p, value)) == p.check(value)


def test_a_string_that_would_read_as_json_is_refused():
    with pytest.raises(ValueError, match="x: a value starting with '\\[' is read as a JSON list"):
        override_text(Param("x", "str", "a parameter", ""), "[a]")
