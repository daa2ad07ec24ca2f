"""The command line's replies that compute nothing import nothing heavy: ``--help``, ``--version``,
``list``, ``list EXP`` and every refusal of bad input load no xarray, pandas, dask, statsmodels,
matplotlib, JAX, scipy or netCDF4 (they reply before numpy could; the timing is the benchmark's,
``python -m sfxlin.benchmarks.startup``), and ``import sfxlin`` alone loads none of them either
while the ``.sfx`` accessors still arrive with xarray, whichever is imported first."""
from __future__ import annotations

import subprocess
import sys

import pytest

HEAVY = ("xarray", "pandas", "dask", "distributed", "statsmodels", "matplotlib", "jax", "scipy", "netCDF4", "sklearn")

PROBE = """
import atexit, sys
atexit.register(lambda: print("HEAVY", sorted(m for m in {heavy!r} if m in sys.modules), file=sys.stderr))
from sfxlin.cli import main
sys.exit(main({args!r}))
"""

REPLIES = {
    "help": (["--help"], 0),
    "version": (["--version"], 0),
    "list": (["list"], 0),
    "list one": (["list", "c3"], 0),
    "unknown experiment": (["run", "c1_limt"], 2),
    "bad --set value": (["run", "c1", "--set", "d=two"], 2),
    "unknown parameter": (["run", "c1", "--set", "lr=0.1"], 2),
    "unknown profile": (["run", "c1", "--profile", "huge"], 2),
    "missing token file": (["run", "c1", "--set", "tokens=no/such.npy"], 2),
    "bad --chunks": (["run", "c1", "--chunks", "nope=2"], 2),
    "bad --workers": (["run", "c1", "--workers", "0"], 2),
    "unwritable --out": (["run", "c1", "--out", "/proc/sfxlin-out"], 2),
    "plan": (["run", "c1", "--plan"], 0),
    "missing file to inspect": (["info", "no/such.nc"], 2),
    "missing files to merge": (["merge", "no/a.nc", "no/b.nc", "-o", "c.nc"], 2),
    "missing results folder": (["report", "--results", "no/such/folder"], 2),
    "missing file to rerun": (["rerun", "no/such.nc"], 2),
    "missing file to verify": (["verify", "no/such.nc"], 2),
}


@pytest.mark.parametrize("name", sorted(REPLIES))
def test_a_reply_that_computes_nothing_imports_nothing_heavy(name, tmp_path):
    args, status = REPLIES[name]
    proc = subprocess.run([sys.executable, "-c", PROBE.format(heavy=HEAVY, args=args)], capture_output=True,
                          text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == status, proc.stderr[-2000:]
    loaded = proc.stderr.strip().splitlines()[-1]
    assert loaded == "HEAVY []", f"{' '.join(args)} imported {loaded}"
    if status == 2:
        assert "error: " in proc.stderr   # sfxlin's one line, or argparse's usage error


def test_import_sfxlin_is_light_and_registers_the_accessors_with_xarray_either_way():
    light = subprocess.run([sys.executable, "-c", f"import sys, sfxlin; print(sorted(m for m in {HEAVY!r} "
                            "if m in sys.modules)); print(sfxlin.__version__)"],
                           capture_output=True, text=True, timeout=120)
    assert light.returncode == 0 and light.stdout.splitlines()[0] == "[]", light.stderr[-2000:]
    check = ("ds = xr.Dataset({'e': ('L', [1.0, 0.5, 0.25])}, coords={'L': [1, 2, 4]}); "
             "print(float(ds.e.sfx.loglog_slope('L').slope), callable(ds.sfx.verdicts))")
    for order in ("import sfxlin; import xarray as xr", "import xarray as xr; import sfxlin"):
        proc = subprocess.run([sys.executable, "-c", f"{order}; {check}"], capture_output=True, text=True,
                              timeout=120)
        assert proc.returncode == 0 and proc.stdout.split() == ["-1.0", "True"], (order, proc.stderr[-2000:])


def test_the_public_names_load_on_first_use():
    proc = subprocess.run([sys.executable, "-c", "import sfxlin; print(sfxlin.run.__module__, "
                           "sfxlin.open_results.__module__, sfxlin.Gaussian.__module__, 'run' in dir(sfxlin)); "
                           "sfxlin.nope"], capture_output=True, text=True, timeout=120)
    assert proc.stdout.split() == ["sfxlin.runs", "sfxlin.engine.storage", "sfxlin.laws", "True"]
    assert "AttributeError: module 'sfxlin' has no attribute 'nope'" in proc.stderr


def test_the_startup_benchmark_runs_every_arm_and_prints_its_ratio(capsys):
    from sfxlin.benchmarks.startup import COMMANDS, bench_startup

    out = bench_startup(rounds=1, commands={k: COMMANDS[k] for k in ("sfxlin --version", "a refused --set")})
    printed = capsys.readouterr().out
    assert set(out) == {"baseline", "sfxlin --version", "a refused --set"}
    assert all(v["wall"] > 0 and v["ratio"] > 0 for v in out.values())
    assert "x numpy" in printed and 'python -c "import numpy"' in printed


def test_the_benchmark_refuses_a_command_that_exits_otherwise():
    from sfxlin.benchmarks.startup import bench_startup

    with pytest.raises(RuntimeError, match="exited 2, not 0"):
        bench_startup(rounds=1, commands={"bad": (["run", "c1_limt"], 0)}, verbose=False)
