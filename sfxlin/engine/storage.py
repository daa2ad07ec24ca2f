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

__all__ = ["save", "load", "content_digests", "digested", "RECORDS", "RECORDS_GROUP", "ensure_writable", "blas_kernel", "record_cell_kernels", "open_results", "results_path", "provenance", "input_files",
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


#: the file's records of its run: JSON attrs of a Dataset that a results file keeps as text variables of
#: its group :data:`RECORDS_GROUP` (``ncdump -h`` prints their declarations, not their kilobytes), restored
#: as attrs by :func:`load`; ``content_sha256`` is added there by :func:`save`. The provenance and the
#: criteria stay global attributes: they are what a reader of the file with any tool needs
RECORDS = {
    "cell_seconds": "seconds of each cell's kernel when it was computed, [[part, {dim: value}, seconds], ...] (JSON)",
    "cell_exponentials": "logits each cell's kernel exponentiated in the softmax core, rows as cell_seconds (JSON)",
    "cell_timeline": "when each block of cells ran in this run, [[block, thread, start, end], ...] (JSON)",
    "merged_from": "each input of a merged file: path, sha256, created, git_revision and its run records (JSON)",
    "content_sha256": "sha256 of every variable's values as written, {name: hex} (JSON): checked on read",
}
RECORDS_GROUP = "records"


def content_digests(ds) -> dict:
    """``{variable name: sha256 hex}`` of every variable of ``ds`` (coordinates included): its dtype
    kind, shape and values in C order (text as UTF-8), so that any changed value, NaN included,
    changes the digest, and a value that survives the netCDF round trip unchanged keeps it."""
    import hashlib

    out = {}
    for name, var in ds.variables.items():
        values = np.asarray(var.values)
        text = values.dtype.kind in "OUS"   # written as characters, read back as objects: one kind
        h = hashlib.sha256(f"{'T' if text else values.dtype.str}{values.shape}".encode())
        if text:
            h.update("\x00".join(str(v.decode() if isinstance(v, bytes) else v) for v in values.ravel()).encode())
        else:
            h.update(np.ascontiguousarray(values).tobytes())
        out[name] = h.hexdigest()
    return out


def _encoding(ds) -> dict:
    """How each variable is written: coordinates without ``_FillValue`` (CF: a coordinate has no
    missing values); text as characters (CF 1.8 has no variable-length strings); every array of at
    least one dimension with HDF5's Fletcher-32 checksum, so that a corrupted value fails on read."""
    enc = {}
    for name, var in ds.variables.items():
        e = {}
        if name in ds.coords:
            e["_FillValue"] = None
        if var.dtype.kind in "OUS":
            e["dtype"] = "S1"
        if var.ndim:
            e["fletcher32"] = True
        enc[name] = e
    return enc


def save(ds, path) -> Path:
    """Write ``ds`` to ``path`` (netCDF4, CF) atomically: a temporary file in the same folder,
    flushed, then renamed; an interrupted write never leaves a file under ``path``. The records
    (:data:`RECORDS`) among its attrs go to the group :data:`RECORDS_GROUP` as text variables, with
    the digest of every variable's values (``content_sha256``, checked by :func:`load`); every
    array carries a Fletcher-32 checksum (:func:`_encoding`)."""
    import xarray as xr

    path = Path(path)
    ensure_writable(path.parent)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.partial")
    root = ds.compute()   # computed once (a lazy ds), for its digests and its writing
    root.attrs = {k: v for k, v in ds.attrs.items() if k not in RECORDS}
    kept = {k: ds.attrs[k] for k in RECORDS if k in ds.attrs}
    kept["content_sha256"] = json.dumps(content_digests(root), sort_keys=True)
    records = xr.Dataset({k: xr.Variable((), str(text), attrs={"long_name": k, "description": RECORDS[k]})
                          for k, text in kept.items()},
                         attrs={"description": "the records of this results file (sfxlin.engine.storage.RECORDS); "
                                               "sfxlin reads them back as the file's attrs"})
    try:
        root.to_netcdf(tmp, engine="netcdf4", encoding=_encoding(root))
        records.to_netcdf(tmp, mode="a", group=RECORDS_GROUP, engine="netcdf4", encoding=_encoding(records))
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        tmp.unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise ResultsError(f"could not write {path}: {exc.strerror or exc}") from exc
        raise
    return path


def load(path, check: bool = True):
    """The Dataset of the results file ``path``, loaded into memory and closed, its records
    (:data:`RECORDS`) back among its attrs: what :func:`save` was given. With ``check``, every
    variable's values are checked against the digest the file records (``content_sha256``; a file
    written before it was recorded has none), and a Fletcher-32 checksum that fails on read is an
    error too: :class:`ResultsError` naming the file and the variable. Files of any schema."""
    import xarray as xr

    path = Path(path)
    try:
        # loaded into memory and closed at once: results files are small, and a netCDF handle left
        # open could be closed by the garbage collector in a dask worker thread while another
        # thread uses the (not thread-safe) netCDF/HDF5 library (pydata/xarray#10783)
        ds = xr.load_dataset(path, engine="netcdf4")
        records = _records(path)
    except Exception as exc:  # netCDF4/HDF5 raise OSError, RuntimeError, ValueError, KeyError for damaged files
        raise ResultsError(f"{path} is not a readable netCDF file ({type(exc).__name__}: {exc})") from exc
    ds = _text_as_unicode(ds)
    digests = json.loads(records.pop("content_sha256", "{}"))
    if check and digests:
        found = content_digests(ds)
        changed = sorted(name for name, digest in digests.items() if found.get(name) != digest)
        if changed:
            raise ResultsError(f"{path}: the values of {', '.join(changed)} are not those written (their sha256 "
                               "differs from the file's record): the file is damaged")
    ds.attrs.update(records)
    return ds


def _text_as_unicode(ds):
    """``ds`` with its text variables (characters on disk, objects once decoded) as numpy unicode,
    the dtype they had when written (a variable-length string variable of an earlier file too)."""
    text = [name for name, var in ds.variables.items()
            if var.dtype.kind == "O" and all(isinstance(v, str) for v in var.values.ravel())]
    if not text:
        return ds
    coords = {name: ds[name].astype(str) for name in text if name in ds.coords}
    out = ds.assign_coords(coords) if coords else ds
    return out.assign({name: ds[name].astype(str) for name in text if name not in ds.coords})


def digested(path) -> list:
    """The variables of the results file ``path`` whose values it records a sha256 of (``content_sha256``,
    checked by :func:`load`): every variable of a file :func:`save` wrote, none of an earlier file."""
    return sorted(json.loads(_records(path).get("content_sha256", "{}")))


def _records(path) -> dict:
    """The text records of the file's :data:`RECORDS_GROUP` group (``{}`` when it has none)."""
    import netCDF4

    with netCDF4.Dataset(path) as nc:
        if RECORDS_GROUP not in nc.groups:
            return {}
    import xarray as xr

    group = xr.load_dataset(path, group=RECORDS_GROUP, engine="netcdf4")
    return {name: str(group[name].values.item()) for name in group.data_vars}


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
    ds = load(path)
    if version_of(ds) not in READS:
        version = ds.attrs.get("sfxlin_schema_version")
        version = version.item() if hasattr(version, "item") else version  # netCDF gives numpy scalars
        ds.close()
        raise ResultsError(f"{path} has schema version {version!r}; this sfxlin reads version {SCHEMA_VERSION}")
    return upgrade(ds)
