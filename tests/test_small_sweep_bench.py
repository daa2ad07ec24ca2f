"""``python -m sfxlin.benchmarks.small_sweep``: its arms run in turn, its CPU is the children's,
its summary the medians of the runs and of the pairwise ratios, and its check of the two files
names every variable in which they differ."""
import sys

import numpy as np
import pytest
import xarray as xr

from sfxlin.benchmarks._child import run_child
from sfxlin.benchmarks.small_sweep import paired, same_data, summary

BUSY = "import time\nwhile time.process_time() < 0.3: pass"


def _arm(log, letter, body):
    return [sys.executable, "-c", f"open({str(log)!r}, 'a').write({letter!r})\n{body}"]


def test_the_arms_run_in_turn_and_their_cpu_is_the_childs(tmp_path):
    log = tmp_path / "order"
    runs = paired(_arm(log, "a", BUSY), _arm(log, "b", "import time; time.sleep(0.3)"), 2)
    assert log.read_text() == "abab"
    assert all(cpu >= 0.3 and wall >= 0.3 for wall, cpu in runs["a"])      # the busy child's own CPU
    assert all(cpu < 0.3 <= wall for wall, cpu in runs["b"])               # asleep: wall, little CPU


def test_a_failing_arm_raises_with_its_output():
    with pytest.raises(RuntimeError, match="failed \\(3\\):\n.*gone"):
        run_child([sys.executable, "-c", "import sys; print('gone'); sys.exit(3)"])


def test_the_summary_is_the_medians_and_the_median_of_the_pairwise_ratios():
    runs = {"a": [(1.0, 2.0), (3.0, 1.0), (2.0, 4.0)], "b": [(2.0, 4.0), (2.0, 2.0), (8.0, 2.0)]}
    res = summary(runs)
    assert (res["a_wall"], res["a_cpu"], res["b_wall"], res["b_cpu"]) == (2.0, 2.0, 2.0, 2.0)
    assert res["wall_ratio"] == 0.5 and res["cpu_ratio"] == 0.5        # ratios 0.5, 1.5, 0.25 and 0.5, 0.5, 2


def test_the_files_check_names_each_differing_variable_and_ignores_the_attrs(tmp_path):
    ds = xr.Dataset({"risk": ("L", [1.0, np.nan, 3.0]), "n": ("L", [1, 2, 3])}, coords={"L": [8, 16, 32]},
                    attrs={"scheduler": "threads(2)"})
    ds.to_netcdf(tmp_path / "a.nc")
    ds.assign_attrs(scheduler="processes").to_netcdf(tmp_path / "same.nc")
    assert same_data(tmp_path / "a.nc", tmp_path / "same.nc") == []           # NaN meets NaN; attrs not compared
    moved = ds.copy(deep=True)
    moved["risk"][0] = np.nextafter(1.0, 2.0)                                  # one bit
    moved["extra"] = ("L", [0.0, 0.0, 0.0])
    moved.to_netcdf(tmp_path / "moved.nc")
    assert same_data(tmp_path / "a.nc", tmp_path / "moved.nc") == ["extra", "risk"]
