"""The command line: clear one-line errors with a non-zero exit, list and info."""
import subprocess
import sys

import pytest

from sfxlin.cli import main
from sfxlin.engine.experiments import experiments


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "sfxlin.cli", *args], capture_output=True, text=True)


@pytest.mark.parametrize("args, message", [
    (["run", "c9"], "unknown experiment 'c9'"),
    (["run", "c1_limt"], "unknown experiment 'c1_limt'; did you mean 'c1_limit'? (the experiments, with their "
                         "short names: c1_kernels, c1_limit (c1), "),
    (["run", "c1", "--profile", "huge"], "unknown profile 'huge'"),
    (["run", "c1", "--chunks", "seed=x"], "--chunks expects DIM=N"),
    (["run", "c1", "--chunks", "zeta=2"], "not grid dims"),
    (["bench", "c7"], "no benchmark 'c7'"),
    (["bench", "c1", "--protocol"], "--protocol: only the c3 protocol"),
    (["bench", "c3", "--steps", "40"], "--steps and --heldout-every go with --protocol"),
    (["bench", "c1", "--d", "3"], "--d: only the c3 engine has a benchmark per dimension"),
    (["bench", "c3", "--d", "3,4"], "--d: no workload for d = [4]; the benchmark has d in [3, 8, 16]"),
    (["bench", "c3", "--d", "3;8"], "--d: expected comma-separated integers"),
    (["info", "/nonexistent/file.nc"], "no results file"),
])
def test_bad_input_gives_one_clear_line_and_exit_2(args, message):
    res = run_cli(*args)
    assert res.returncode == 2
    assert message in res.stderr
    assert "Traceback" not in res.stderr
    assert res.stderr.count("\n") == 1


def test_unknown_option_exits_non_zero_without_traceback():
    res = run_cli("run", "c1", "--frobnicate")
    assert res.returncode != 0 and "Traceback" not in res.stderr and "unrecognized arguments" in res.stderr


def test_unwritable_output_folder(tmp_path):
    blocker = tmp_path / "file.txt"
    blocker.write_text("not a folder")
    res = run_cli("run", "c1", "--quiet", "--out", str(blocker / "sub"))
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert "sub" in res.stderr


def test_list_shows_experiments_parameters_and_profiles(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert "c1 (c1_limit)" in out and "profiles: quick, paper; local scheduler: threads" in out and "U_norm" in out
    assert "profiles: quick, paper; local scheduler: processes" in out.split("(c3_transfer)")[1].split("\n")[1]
    seeds = [line for line in out.splitlines() if line.strip().startswith("root_seed ")]
    assert len(seeds) == len(experiments()), "every experiment seeds its cells"
    assert all("[int, >= 0]" in line for line in seeds), seeds  # numpy takes no negative seed: the rule is shown


def test_run_takes_the_experiments_scheduler_unless_one_is_asked(tmp_path, monkeypatch, capsys):
    """c3_transfer declares processes, which its paper sweep keeps (about 80 CPU s expected) and
    its quick sweep (about 1 s) replaces by threads, saying why; --local-scheduler and --workers
    take precedence."""
    import sfxlin.engine.execution as execution

    seen = []

    def compute(ds, scheduler=None, workers=None, **kw):   # records the choice, computes nothing
        seen.append((scheduler, workers))
        raise KeyboardInterrupt

    monkeypatch.setattr(execution, "compute", compute)
    for extra in (["--profile", "paper"], ["--local-scheduler", "threads"], ["--workers", "2"], ["--profile", "quick"],
                  ["--profile", "quick", "--local-scheduler", "processes"]):
        main(["run", "c3", "--quiet", "--out", str(tmp_path), "--fresh", *extra])
    main(["run", "c1", "--quiet", "--out", str(tmp_path), "--fresh"])
    assert seen == [("processes", None), ("threads", None), (None, 2), ("threads", None), ("processes", None),
                    (None, None)]
    main(["run", "c3", "--profile", "quick", "--out", str(tmp_path), "--fresh"])
    said = [line for line in capsys.readouterr().out.splitlines() if line.startswith("local scheduler:")]
    assert len(said) == 1 and said[0].startswith("local scheduler: threads: this sweep is expected to cost ")
    assert "--local-scheduler processes forces it" in said[0]


def test_a_sweep_whose_cost_cannot_be_estimated_keeps_the_declared_processes(tmp_path, monkeypatch, capsys):
    import sfxlin.engine.execution as execution
    import sfxlin.engine.plan as plan

    seen = []

    def compute(ds, scheduler=None, workers=None, **kw):
        seen.append(scheduler)
        raise KeyboardInterrupt

    def make_plan(*args, **kw):
        raise OSError("the shipped file is unreadable")

    monkeypatch.setattr(execution, "compute", compute)
    monkeypatch.setattr(plan, "make_plan", make_plan)
    main(["run", "c3", "--profile", "quick", "--out", str(tmp_path), "--fresh"])
    assert seen == ["processes"]
    assert ("local scheduler: processes: the experiment's; no cost estimate (OSError: the shipped file is unreadable)"
            in capsys.readouterr().out)


def test_info_prints_dims_coordinates_and_provenance(tmp_path, capsys):
    assert main(["run", "c1", "--quiet", "--no-figure", "--out", str(tmp_path)]) == 0
    assert main(["info", str(tmp_path / "c1_limit.nc")]) == 0
    out = capsys.readouterr().out
    assert "coord L: [16, 32, 64, 128, 256, 512, 1024]" in out
    assert "git_revision" in out and "mse('law', 'd', 'U_norm', 'L', 'seed')" in out


def test_datasets_readme_documents_the_current_schema():
    from pathlib import Path

    from sfxlin.cli import schema_markdown

    readme = Path(__file__).resolve().parent.parent / "datasets" / "README.md"
    assert readme.read_text() == schema_markdown(), "regenerate with: sfxlin schema > datasets/README.md"


def test_quick_runs_never_replace_the_paper_results(tmp_path):
    # where the file goes is checked, not what it holds: a small quick run (2 cells)
    small = ["--set", "n_seeds=1", "--set", "d=2", "--set", "U_norm=0.1", "--set", "L=16,32,64"]
    res = subprocess.run([sys.executable, "-m", "sfxlin.cli", "run", "c1", "--quiet", "--no-figure", *small],
                         capture_output=True, text=True, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "runs" / "quick" / "c1_limit.nc").exists()
    assert not (tmp_path / "datasets").exists()
