"""netCDF storage: atomic writes with provenance, and opening results by name or path."""
from __future__ import annotations

import datetime as _dt
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from .._version import __version__
from .schema import READS, SCHEMA_VERSION, upgrade, version_of

__all__ = ["save", "ensure_writable", "blas_kernel", "record_cell_kernels", "open_results", "results_path", "provenance", "input_files",
           "changed_input_files", "default_results_dir", "FOLDER_RULE", "RESULTS_ENV", "ResultsError"]

REPO_ROOT = Path(__file__).resolve().parents[2]   # sfxlin/engine/storage.py -> the source tree


class ResultsError(ValueError):
    """A results file is missing, unreadable, or of another schema."""


def _git_revision():
    try:
        rev = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=5)
        # modified or untracked code that produced the file makes it "+dirty"; results files do not
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "sfxlin", "pipelines", "analysis", "setup.cfg"],
                               cwd=REPO_ROOT, capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    if rev.returncode != 0:
        return "unknown"
    return rev.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def blas_kernel() -> str:
    """The BLAS numpy runs in this process and the kernel it chose for this CPU, e.g.
    ``"openblas 0.3.31.188.0 SkylakeX"`` (threadpoolctl's view of the loaded libraries). Only numpy's:
    scipy brings its own OpenBLAS once imported, which computes none of the kernels' products and
    would make the record depend on what was imported before. Where numpy's cannot be told apart
    (a BLAS outside numpy's folders), every loaded BLAS, sorted and joined by ``"; "``; ``"none
    found"`` if none. OpenBLAS picks its kernel per CPU, or as ``OPENBLAS_CORETYPE`` says, and a
    kernel can move the last bits of a product: results agree across kernels to 1e-10, bits only
    under one (docs/performance.md section 10)."""
    from threadpoolctl import threadpool_info

    libs = [lib for lib in threadpool_info() if lib.get("user_api") == "blas"]
    numpy_dir = Path(np.__file__).resolve().parent

    def numpys(lib):   # a wheel's own libraries sit in numpy.libs beside the package (or inside it)
        where = Path(lib["filepath"]).resolve()
        return where.parent.name == "numpy.libs" or numpy_dir in where.parents

    own = [lib for lib in libs if numpys(lib)]
    found = sorted({" ".join(str(lib[key]) for key in ("internal_api", "version", "architecture") if lib.get(key))
                    for lib in own or libs})
    return "; ".join(found) or "none found"


def _library_versions():
    import dask
    import netCDF4
    import xarray as xr

    from importlib.metadata import version

    # scikit-learn: the source of c1_real's bundled data sets; jax, jaxlib and optax: the model family
    # (sfxlin.models); their versions read without importing them
    return {"python": sys.version.split()[0], "numpy": np.__version__, "xarray": xr.__version__,
            "dask": dask.__version__, "netCDF4": netCDF4.__version__, "blas": blas_kernel(),
            **{name: version(name) for name in ("scikit-learn", "jax", "jaxlib", "optax")}}


def record_cell_kernels(ds, kernels) -> None:
    """Make ``library_versions.blas`` of ``ds`` name every BLAS kernel that computed its cells:
    ``kernels`` (:meth:`~sfxlin.engine.cellstore.CellStore.blas_kernels`: those recorded by the kept
    cells, which may differ from this process's on a cluster of mixed CPUs or for cells kept from a
    run under another ``OPENBLAS_CORETYPE``; None, a cell that recorded none, counts as this
    process's), sorted and joined by ``"; "``."""
    versions = json.loads(ds.attrs.get("library_versions", "{}"))
    if versions and kernels:
        versions["blas"] = "; ".join(sorted({versions["blas"] if k is None else k for k in kernels}))
        ds.attrs["library_versions"] = json.dumps(versions, sort_keys=True)


def provenance(experiment, config, call=None):
    """Provenance attrs: enough to rerun the file from its attrs alone.

    ``config``: a :class:`~sfxlin.engine.params.Config` (its profile and ``--set`` overrides are
    recorded) or a plain mapping (profile ``"custom"``). Every ``file`` parameter that names a
    file adds its sha256, taken when the configuration was made, to ``input_files`` (JSON
    ``{parameter: {"source", "sha256"}}``, when there is one: :func:`input_files`). The
    computation adds ``wall_seconds`` and ``scheduler`` (:func:`sfxlin.engine.execution.compute`)."""
    created = _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat()
    call = call or " ".join([Path(sys.argv[0]).name or "python"] + sys.argv[1:])
    plain = json.loads(config.to_json()) if hasattr(config, "to_json") else dict(config)
    attrs = {
        "experiment": experiment,
        "profile": getattr(config, "profile", "custom"),
        "overrides": json.dumps(list(getattr(config, "overrides", ()))),
        "config": json.dumps(plain, sort_keys=True),
        "sfxlin_version": __version__,
        "sfxlin_schema_version": SCHEMA_VERSION,
        "git_revision": _git_revision(),
        "library_versions": json.dumps(_library_versions(), sort_keys=True),
        "created": created,
        "history": f"{created}: {call} (sfxlin {__version__})",
    }
    files = input_files(config)
    if files:
        attrs["input_files"] = json.dumps(files, sort_keys=True)
    return attrs


def input_files(config) -> dict:
    """``{parameter: {"source": value, "sha256": hex}}`` for every parameter declared of kind
    ``file`` that names a file in ``config`` (a :class:`~sfxlin.engine.params.Config`: the digests taken
    when it was made, :attr:`~sfxlin.engine.params.Config.digests`; no file is read). A plain mapping
    declares no kinds: ``{}``."""
    digests = getattr(config, "digests", {})
    return {name: {"source": config[name], "sha256": sha256} for name, sha256 in digests.items()}


def changed_input_files(recorded, config) -> list[str]:
    """One ``"PARAM: sha256 OLD -> NEW"`` per file parameter of ``config`` whose file's content
    differs from ``recorded`` (a results file's ``input_files`` attr: JSON text, a mapping, or None
    for a file that records none); digests shortened to 12 hex digits, ``none`` where absent.
    Empty when every file is the one recorded."""
    recorded = json.loads(recorded) if isinstance(recorded, str) else dict(recorded or {})
    current = input_files(config)

    def digest(files, name):
        return files[name]["sha256"][:12] if name in files else "none"

    return [f"{name}: sha256 {digest(recorded, name)} -> {digest(current, name)}"
            for name in sorted(set(recorded) | set(current)) if digest(recorded, name) != digest(current, name)]


def ensure_writable(folder) -> Path:
    """Create ``folder`` if needed and check it is writable (before, not after, a long run);
    returns it. The messages name its absolute path."""
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ResultsError(f"cannot create output folder {folder.absolute()}: {exc.strerror}") from exc
    if not os.access(folder, os.W_OK):
        raise ResultsError(f"output folder {folder.absolute()} is not writable")
    return folder


def save(ds: "xr.Dataset", path) -> Path:
    """Write ``ds`` to ``path`` (netCDF4 engine) atomically: a temporary file in the same
    folder, flushed, then renamed. An interrupted write never leaves a file under ``path``."""
    path = Path(path)
    ensure_writable(path.parent)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.partial")
    try:
        ds.to_netcdf(tmp, engine="netcdf4")
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        tmp.unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise ResultsError(f"could not write {path}: {exc.strerror or exc}") from exc
        raise
    return path


#: environment variable naming the folder of the paper results (default ``./datasets``)
RESULTS_ENV = "SFXLIN_RESULTS"

FOLDER_RULE = (f"Default folders are relative to the current working directory: ./datasets (or ${RESULTS_ENV} "
               "when set) holds the paper results (run --profile paper, reproduce, report, info NAME, verify NAME, "
               "open_results); other runs go to ./runs/PROFILE.")
"""The one rule for every default folder, stated in each command's ``--help`` and the README."""


def default_results_dir() -> Path:
    """The folder of the paper results: ``$SFXLIN_RESULTS`` if set, else ``datasets`` relative
    to the current working directory (:data:`FOLDER_RULE`)."""
    return Path(os.environ.get(RESULTS_ENV) or "datasets")


def results_path(name_or_path, results_dir=None) -> Path:
    """The file ``name_or_path`` names: a path to an existing file, or an experiment name (a
    stem) in ``results_dir`` (default :func:`default_results_dir`). :class:`ResultsError`
    naming the absolute path looked at, and how to point elsewhere, when there is none."""
    folder = Path(results_dir) if results_dir is not None else default_results_dir()
    path = Path(name_or_path)
    if path.exists():
        return path
    if path.suffix == ".nc" or len(path.parts) > 1:
        raise ResultsError(f"no results file {str(path.absolute())!r}: no such file")
    candidate = folder / f"{name_or_path}.nc"
    if not candidate.exists():
        where = "no such folder" if not folder.is_dir() else f"available: {sorted(p.stem for p in folder.glob('*.nc'))}"
        raise ResultsError(f"no results file {name_or_path!r} in {folder.absolute()} ({where}); give its path, "
                           f"or set ${RESULTS_ENV} to the folder that holds it")
    return candidate


def open_results(name_or_path=None, results_dir=None):
    """Open a results file by path, or by experiment name in ``results_dir`` (default
    :func:`default_results_dir`: ``$SFXLIN_RESULTS``, else ``./datasets``).

    With no argument, returns the sorted list of experiment names available there. The Dataset
    is loaded into memory (the file is closed when this returns).
    A file of an earlier schema this sfxlin reads comes back in the current one
    (:func:`sfxlin.engine.schema.upgrade`). Raises :class:`ResultsError` for a missing, unreadable or
    other-schema file.
    """
    folder = Path(results_dir) if results_dir is not None else default_results_dir()
    if name_or_path is None:
        return sorted(p.stem for p in folder.glob("*.nc"))
    path = results_path(name_or_path, folder)
    import xarray as xr   # here, not at the top: the command line imports this module to name its folders

    try:
        # loaded into memory and closed at once: results files are small, and a netCDF handle left
        # open could be closed by the garbage collector in a dask worker thread while another
        # thread uses the (not thread-safe) netCDF/HDF5 library (pydata/xarray#10783)
        ds = xr.load_dataset(path, engine="netcdf4")
    except Exception as exc:  # netCDF4/HDF5 raise OSError, ValueError, KeyError for damaged files
        raise ResultsError(f"{path} is not a readable netCDF file ({type(exc).__name__}: {exc})") from exc
    if version_of(ds) not in READS:
        version = ds.attrs.get("sfxlin_schema_version")
        version = version.item() if hasattr(version, "item") else version  # netCDF gives numpy scalars
        ds.close()
        raise ResultsError(f"{path} has schema version {version!r}; this sfxlin reads version {SCHEMA_VERSION}")
    return upgrade(ds)
