"""The SLURM path for real: a one-node SLURM (Debian's slurm-wlm with munge, started by
``.ci/slurm``) runs dask workers as batch jobs through ``dask_jobqueue.SLURMCluster``; ``sfxlin run
c1 --scheduler`` on them gives the bits of a local run, and keeps every cell in ``--out``.

The jobs run in another working directory than the client's, as on a real cluster (where a job
starts in the folder ``sbatch`` ran in on the login node, or wherever ``--chdir`` says): what the
run needs travels as absolute paths (``--out``) and the jobs' Python is the client's
(``python=sys.executable``), the recipe README.md's "Scaling out" gives.

A machine with slurm-wlm and munge installed gets its SLURM started by the module (as root;
stopped again at its end) or uses the one running. Without them (or not root, with SLURM not
running) the tests skip saying why, except under CI (``CI=true``, where ``.ci/run`` runs
``.ci/slurm`` first, and the module runs it too): there that is a failure, with the reason.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import xarray as xr

from sfxlin.engine.cellstore import CellStore
from sfxlin.engine.experiments import get as get_experiment
from sfxlin.testing import assert_same_results

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / ".ci" / "slurm"
SLURM_DIR = Path(os.environ.get("SFXLIN_SLURM_DIR", "/var/tmp/sfxlin-slurm"))
CONF = SLURM_DIR / "slurm.conf"
IN_CI = os.environ.get("CI", "").lower() in ("true", "1")


def _unavailable(why):
    """Skip saying why; under CI, fail: there SLURM must be up."""
    if IN_CI:
        pytest.fail(f"CI=true but {why}")
    pytest.skip(why)


#: the states of a node that takes jobs
UP = ("idle", "mixed", "allocated")


def _node_state():
    """What ``sinfo`` says of the node (or its error); '' without sinfo."""
    if shutil.which("sinfo") is None:
        return ""
    proc = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=20,
                          env={**os.environ, "SLURM_CONF": str(CONF)})
    return proc.stdout.strip() or proc.stderr.strip()


@pytest.fixture(scope="module")
def slurm():
    """SLURM up, its configuration in ``SLURM_CONF`` for this module (sbatch, squeue, scancel)."""
    try:
        import dask_jobqueue  # noqa: F401
    except ImportError:
        _unavailable("dask-jobqueue not installed (it is in the test extras: pip install -e '.[test]')")
    if not sys.platform.startswith("linux"):
        _unavailable(f"the one-node SLURM of .ci/slurm runs on Debian/Linux, not {sys.platform}")
    missing = [name for name in ("slurmctld", "slurmd", "sinfo", "munged") if shutil.which(name) is None]
    if missing and not IN_CI:  # a test run installs no system package; .ci/run does (as for Chromium)
        _unavailable(f"SLURM not installed (no {', '.join(missing)}): run .ci/slurm as root, which installs "
                     "slurm-wlm and munge with apt-get and starts a one-node SLURM")
    started = False
    if os.geteuid() == 0:
        # starts what is not running (under CI, installs slurm-wlm and munge when absent), waits for the node
        start = time.perf_counter()
        try:
            proc = subprocess.run([str(SCRIPT)], capture_output=True, text=True, timeout=300)
        except subprocess.TimeoutExpired as exc:
            _unavailable(f".ci/slurm did not finish in {exc.timeout:.0f} s")
        if proc.returncode != 0:
            if ".ci/slurm: started " in proc.stdout:  # half up: not left running
                subprocess.run([str(SCRIPT), "stop"], capture_output=True, timeout=60)
            _unavailable(f".ci/slurm failed (exit status {proc.returncode}): {proc.stderr.strip()[-2000:]}")
        started = ".ci/slurm: started " in proc.stdout
        print(f".ci/slurm in {time.perf_counter() - start:.1f} s: {proc.stdout.strip()}")
    else:
        # not root: the daemons are root's; use them when someone has started them
        if missing or not CONF.exists():
            _unavailable(f"no one-node SLURM here ({', '.join(missing) or CONF} missing) and not root to set one "
                         "up: run .ci/slurm as root")
        state = _node_state()
        if state not in UP:
            _unavailable(f"SLURM node not idle (sinfo: {state!r}): run .ci/slurm as root")
    saved = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = str(CONF)
    try:
        yield CONF
    finally:
        if saved is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = saved
        if started:  # what this module started does not outlive it (a SLURM found running is left so)
            subprocess.run([str(SCRIPT), "stop"], capture_output=True, timeout=60)


def _squeue():
    return subprocess.run(["squeue", "-o", "%i %j %T %R"], capture_output=True, text=True, timeout=20).stdout


def _cli(*args, cwd, timeout):
    """``sfxlin ARGS`` as a user runs it, from ``cwd``; fails the test with its output on an error."""
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "sfxlin.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, f"sfxlin {' '.join(args)}: exit status {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return time.perf_counter() - start


@pytest.fixture(scope="module")
def jobs(slurm, tmp_path_factory):
    """Two dask workers in two SLURM jobs, started in ``jobs/``; the client's folder is ``client/``:
    ``(cluster, client_dir, jobs_dir)``. Closed, and any job left cancelled, at the end."""
    from dask_jobqueue import SLURMCluster
    from distributed import Client

    root = tmp_path_factory.mktemp("slurm")
    client_dir, jobs_dir = root / "client", root / "jobs"  # the jobs start elsewhere than the client
    client_dir.mkdir()
    jobs_dir.mkdir()
    job_name = f"sfxlin-test-{os.getpid()}"
    cluster = SLURMCluster(
        cores=1, processes=1, memory="4GB", queue="debug", walltime="00:10:00", job_name=job_name,
        python=sys.executable,                 # the client's install, whatever the job's PATH
        interface="lo",                        # workers and nannies listen on 127.0.0.1 only
        scheduler_options={"host": "127.0.0.1", "dashboard_address": "127.0.0.1:0"},
        job_extra_directives=[f"--chdir={jobs_dir}"],
        log_directory=str(jobs_dir / "logs"),
    )
    print(f"SLURMCluster: {cluster.scheduler_address}")
    try:
        with Client(cluster, timeout="20s") as client:
            start = time.perf_counter()
            cluster.scale(jobs=2)
            try:
                client.wait_for_workers(2, timeout=60)
            except TimeoutError:
                logs = "\n".join(f"{p.name}: {p.read_text()[-1500:]}" for p in sorted((jobs_dir / "logs").glob("*")))
                pytest.fail(f"2 SLURM jobs did not give 2 dask workers in 60 s\nsqueue:\n{_squeue()}\n{logs}")
            print(f"2 SLURM jobs, 2 workers up in {time.perf_counter() - start:.1f} s")
            dirs = set(client.run(os.getcwd).values())
            assert dirs == {str(jobs_dir)}, f"the workers run in {dirs}, not in the jobs' folder {jobs_dir}"
            yield cluster, client_dir, jobs_dir
    finally:
        cluster.close(timeout=30)
        # a job the close missed (a slow scancel, a job still pending) is not left behind
        subprocess.run(["scancel", f"--name={job_name}"], capture_output=True, timeout=20)


@pytest.fixture(scope="module")
def local_run(tmp_path_factory):
    """``sfxlin run c1`` on this machine's default scheduler: the bits to match."""
    out = tmp_path_factory.mktemp("local-out")
    wall = _cli("run", "c1", "--out", str(out), "--quiet", "--no-figure", cwd=out, timeout=120)
    print(f"sfxlin run c1 here: {wall:.1f} s")
    with xr.open_dataset(out / "c1_limit.nc") as ds:
        return ds.load()


def _check_run(out, local_run, jobs_dir):
    """``out`` keeps every cell of the run (none strayed into the jobs' working directory), and its
    results file has the local run's bits: data, coordinates and attrs (the cells' exponential
    counts among them, read from the kept cells), time stamps aside."""
    with xr.open_dataset(out / "c1_limit.nc") as ds:
        remote = ds.load()
    assert remote.attrs["scheduler"].startswith("distributed:tcp://127.0.0.1:")
    n_cells = int(remote.attrs["n_cells"])
    experiment = get_experiment("c1")
    store = CellStore(out / f".{experiment.name}.cells", experiment, experiment.configure("quick"))
    kept = sorted(store.folder.glob("cell_*.npz"))
    stray = sorted(str(p.relative_to(jobs_dir)) for p in jobs_dir.rglob("cell_*.npz"))
    assert len(kept) == n_cells and store.count() == n_cells, (
        f"{len(kept)} cell files ({store.count()} of this run's) in {store.folder}, expected {n_cells}; "
        f"{len(stray)} in the jobs' folder {jobs_dir}: {stray[:2]}{' ...' if len(stray) > 2 else ''}")
    assert_same_results(remote, local_run)


def test_absolute_out_gives_the_local_bits_and_keeps_every_cell(jobs, local_run):
    """The recipe of README.md: ``--out`` an absolute path on the filesystem the jobs share."""
    cluster, client_dir, jobs_dir = jobs
    out = client_dir.parent / "slurm-out"
    wall = _cli("run", "c1", "--out", str(out), "--scheduler", cluster.scheduler_address, "--quiet", "--no-figure",
                cwd=client_dir, timeout=120)
    print(f"sfxlin run c1 --out ABSOLUTE on 2 SLURM jobs: {wall:.1f} s")
    _check_run(out, local_run, jobs_dir)


def test_relative_out_is_the_clients_folder_not_the_jobs(jobs, local_run):
    """``--out`` relative to the client's working directory: the file and every cell land there,
    whatever folder the jobs run in."""
    cluster, client_dir, jobs_dir = jobs
    wall = _cli("run", "c1", "--out", "relative-out", "--scheduler", cluster.scheduler_address, "--quiet", "--no-figure",
                cwd=client_dir, timeout=120)
    print(f"sfxlin run c1 --out relative-out on 2 SLURM jobs: {wall:.1f} s")
    _check_run(client_dir / "relative-out", local_run, jobs_dir)
