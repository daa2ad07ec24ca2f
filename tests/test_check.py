"""``sfxlin check``: every experiment's quick profile as a smoke test of the install.

The experiments checked here are variants of the random walk of tests/declared/walk_pipeline.py
(a second of computation each), judged by the criteria below (this module is their analysis
module): the walk's diffusion constant, which a broken kernel (steps of the wrong variance)
makes FAIL, one criterion NOT JUDGED at the quick profile and one INCONCLUSIVE, neither of
which may fail the check.

Why the diffusion criterion separates a correct kernel from a broken one: per cell, msd / scale^2
is a mean of n_walks = 200 values (sum of L steps)^2 / (L scale^2), each chi-square with one degree
of freedom (mean 1, variance 2), so its SE is sqrt(2 / 200) = 0.1, and over the 2 seeds of the quick
profile 0.071: the band [0.7, 1.3] is 4.2 SE wide on either side of 1. Steps of variance 2 scale^2
(the planted bug) give 2 +- 0.14, 5 SE above the band.
"""
from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import numpy as np
import pytest

import sfxlin.cli as cli
from sfxlin.analysis.verdicts import Criteria, Inconclusive, NotJudged
from sfxlin.cli import FAILED, main

sys.path.insert(0, str(Path(__file__).resolve().parent / "declared"))
import walk_pipeline  # noqa: E402

CRITERIA = Criteria("W")


@CRITERIA("W-diffusion", "msd / scale^2, seed mean, every (scale, L)", "in", (0.7, 1.3), reference="1 exactly",
          reason="E (sum of L steps)^2 / L = scale^2; SE 0.071 over 200 walks x 2 seeds (module docstring)",
          profile="any")
def _diffusion(ds):
    return ds.msd.mean("seed") / ds.scale**2


@CRITERIA("W-long", "msd / scale^2 at L >= 4096", "in", (0.9, 1.1), reason="a long walk",
          quick=NotJudged("the quick grid stops at L = 64"))
def _long(ds):
    return ds.msd.sel(L=ds.L[ds.L >= 4096]).mean("seed") / ds.scale**2


@CRITERIA("W-flagged", "a figure the file cannot give", "<", 1.0, profile="any")
def _flagged(ds):
    return Inconclusive("never measurable here")


def verdicts(ds, resamples=100):
    return CRITERIA.verdicts(ds, resamples=resamples)


def fit_tables(ds):
    return "msd / scale^2: " + ", ".join(f"{v:.3f}" for v in np.ravel(_diffusion(ds)))


def figure(ds, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(2, 2))
    ax.plot(ds.L, ds.msd.mean("seed").T)
    fig.savefig(path)
    plt.close(fig)
    return path


def _broken_kernel(cell, rng, config):
    """The walk's kernel with steps of variance 2 scale^2: the planted bug."""
    out = walk_pipeline.kernel(cell, rng, config)
    return {"msd": 2.0 * out["msd"]}


def _walk(name, broken=False):
    part = walk_pipeline.EXPERIMENT.parts[0]
    return dataclasses.replace(walk_pipeline.EXPERIMENT, name=name, analysis=__name__,
                               parts=(dataclasses.replace(part, kernel=_broken_kernel) if broken else part,))


@pytest.fixture
def walks(monkeypatch):
    """``walks(*experiments)``: ``sfxlin check`` sees exactly these experiments."""
    def use(*found):
        monkeypatch.setattr(cli, "experiments", lambda: {e.name: e for e in found})
    return use


def test_exits_0_when_no_verdict_fails_and_inconclusive_or_not_judged_do_not_fail_it(walks, tmp_path, capsys):
    walks(_walk("walk_a"), _walk("walk_b"))
    assert main(["check", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    lines = {line.split()[0]: line for line in out.splitlines() if line.startswith("walk_")}
    assert sorted(lines) == ["walk_a", "walk_b"]
    for line in lines.values():  # one line per experiment: verdict counts and seconds
        assert "1 PASS, 0 FAIL, 1 INCONCLUSIVE, 1 NOT JUDGED" in line and line.rstrip().endswith(" s)")
    assert "no FAIL in 2 experiments" in out and "FAIL at the quick profile" not in out
    assert (tmp_path / "walk_a.nc").exists() and (tmp_path / "walk_b.png").exists()  # --out keeps the files


def test_a_broken_kernel_fails_the_check_with_its_verdict_table(walks, tmp_path, capsys):
    walks(_walk("walk_a"), _walk("walk_broken", broken=True))
    assert main(["check", "--out", str(tmp_path)]) == FAILED == 1
    out = capsys.readouterr().out
    assert "walk_a" in out and "walk_broken" in out
    broken_line = next(line for line in out.splitlines() if line.startswith("walk_broken "))
    assert "0 PASS, 1 FAIL" in broken_line
    table = out.split("walk_broken: FAIL at the quick profile\n")[1]
    assert "W-diffusion" in table.splitlines()[2] and "FAIL" in table.splitlines()[2]
    assert "walk_a: FAIL" not in out  # only the failing experiment's table
    assert "FAIL in walk_broken" in out.splitlines()[-1] and "exit status 1" in out.splitlines()[-1]
    # the measured figure is the planted factor: 2 within 5 of its SEs (2 x 0.071, module docstring)
    import xarray as xr

    with xr.open_dataset(tmp_path / "walk_broken.nc") as bad:
        measured = (bad.msd.mean("seed") / bad.scale**2).values
    assert np.all(np.abs(measured - 2.0) < 5 * 2 * np.sqrt(2 / 200) / np.sqrt(2)), measured


def test_runs_every_experiment_at_its_quick_profile_in_a_temporary_folder_removed_after(monkeypatch, tmp_path,
                                                                                       capsys):
    """Without --out: every experiment sfxlin knows (sfxlin list), at the quick profile, into one
    temporary folder that is gone afterwards. The runs are recorded, not computed."""
    import tempfile

    from sfxlin.analysis.verdicts import Criterion, evaluate
    from sfxlin.engine.experiments import experiments

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    seen = []

    def run_experiment(experiment, config, out_dir, name, args):
        seen.append((experiment.name, config.profile, out_dir, name, args.quiet, args.force, args.resamples))
        assert out_dir.is_dir() and out_dir.parent == tmp_path
        crit = Criterion(id="X", claim="C0", description="x", kind="<", threshold=1.0)
        return evaluate([crit], {"X": 0.5})

    monkeypatch.setattr(cli, "run_experiment", run_experiment)
    assert main(["check"]) == 0
    names = list(experiments())
    assert [s[0] for s in seen] == names and len(names) >= 8
    assert all(s[1] == "quick" and s[3] == s[0] and s[4] and not s[5] and s[6] == 0 for s in seen)
    assert len({s[2] for s in seen}) == 1 and list(tmp_path.iterdir()) == []  # one folder, removed
    out = capsys.readouterr().out
    assert "temporary folder" in out and f"no FAIL in {len(names)} experiments" in out


def test_an_experiment_that_cannot_run_is_an_error_and_the_others_are_still_checked(walks, tmp_path, capsys,
                                                                                   monkeypatch):
    def crash(cell, rng, config):
        raise FloatingPointError("the kernel crashed")

    part = walk_pipeline.EXPERIMENT.parts[0]
    crashing = dataclasses.replace(_walk("walk_crash"), parts=(dataclasses.replace(part, kernel=crash),))
    walks(crashing, _walk("walk_z"))
    assert main(["check", "--out", str(tmp_path)]) == 2
    captured = capsys.readouterr()
    crash_line = next(line for line in captured.out.splitlines() if line.startswith("walk_crash "))
    assert "error:" in crash_line and "the kernel crashed" in crash_line
    assert any(line.startswith("walk_z ") and "1 PASS" in line for line in captured.out.splitlines())
    assert "sfxlin: error: 1 experiment could not be run (walk_crash)" in captured.err
    assert "Traceback" not in captured.err


def test_robustness_is_computed_only_when_resamples_are_asked(walks, tmp_path, capsys):
    import xarray as xr

    from sfxlin.analysis.verdicts import count_verdicts

    walks(_walk("walk_a"))
    assert main(["check", "--out", str(tmp_path)]) == 0
    line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("walk_a "))
    assert "fragile" not in line
    assert main(["check", "--out", str(tmp_path), "--resamples", "20"]) == 0
    line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("walk_a "))
    rows = CRITERIA.verdicts(xr.load_dataset(tmp_path / "walk_a.nc"), resamples=20)
    assert rows[0].robustness is not None  # 2 seeds: resampled
    assert f"{count_verdicts(rows)['fragile']} fragile" in line


def test_help_says_it_is_the_command_to_run_after_installing(capsys):
    with pytest.raises(SystemExit):
        main(["check", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "after installing" in text and "exit status 1 on any FAIL" in text and "NOT JUDGED do not" in text


def test_readme_opens_with_check_beside_make_reproduce_and_make_test():
    head = (Path(__file__).resolve().parent.parent / "README.md").read_text().split("```")[1]
    assert "make reproduce" in head and "make test" in head and "sfxlin check" in head


@pytest.mark.parametrize("out", [False, True])
def test_ctrl_c_says_how_many_experiments_were_checked_and_what_is_kept(walks, tmp_path, capsys, monkeypatch, out):
    walks(_walk("walk_a"), _walk("walk_b"))
    real = cli.run_experiment

    def interrupted_second(experiment, *args):
        if experiment.name == "walk_b":
            raise KeyboardInterrupt
        return real(experiment, *args)

    monkeypatch.setattr(cli, "run_experiment", interrupted_second)
    argv = ["check", *(["--out", str(tmp_path / "kept")] if out else [])]
    assert main(argv) == 130
    err = capsys.readouterr().err
    assert err.startswith("sfxlin: interrupted; 1 of 2 experiments checked; ") and "Traceback" not in err
    if out:
        assert f"kept in {tmp_path / 'kept'}: the same command resumes: sfxlin check --out {tmp_path / 'kept'}" in err
    else:
        assert "the temporary folder is removed (--out DIR keeps the cells for a resume)" in err
