"""Real token sets: files of tokens, and the data sets bundled with scikit-learn, standardised
and projected.

* :func:`read_tokens`: an ``(n, D)`` float64 array from an array, a ``.npy`` file or a netCDF
  variable (``"file.nc:variable"``), with its rows checked (no NaN or inf row, not empty);
* :func:`parse_file_source`, :func:`parse_token_source`, :func:`file_sha256`,
  :func:`source_sha256`, :func:`check_unchanged`: where a file parameter's source lives, its
  checksum (what enters a cell's fingerprint and a results file's provenance) and the check that
  its file is still the one the configuration hashed;
* :data:`DATASETS`, :func:`load_dataset`: the feature matrices of the data sets that ship inside
  the scikit-learn wheel (no download at run time);
* :func:`standardise`, :func:`pca_whiten`, :func:`token_set`: the deterministic map from a data
  set to a token set on ``R^D`` with mean 0 and covariance ``I_D``.
"""
from __future__ import annotations

import functools
import hashlib
import os
from pathlib import Path

import numpy as np

from .threads import single_threaded_blas

__all__ = ["DATASETS", "TOKEN_SUFFIXES", "read_tokens", "parse_file_source", "parse_token_source", "file_sha256",
           "source_sha256", "check_unchanged", "load_dataset", "standardise", "pca_whiten", "token_set"]

DATASETS = ("digits", "wine", "breast_cancer", "diabetes")
"""The data sets bundled with scikit-learn (``sklearn.datasets.load_<name>``) used as token sets."""


TOKEN_SUFFIXES = (".npy", ".nc")
"""The forms of a token file: a ``.npy`` array, or a variable of a netCDF file (``file.nc:variable``)."""


#: how to turn a weight file that no installed reader opens (no safetensors, no torch) into a .npy file
CONVERT = {
    ".safetensors": "; sfxlin reads no .safetensors file (its reader is not installed): convert the tensor with "
                    "`python -c \"import numpy as np; from safetensors.numpy import load_file; "
                    "np.save('W.npy', load_file('model.safetensors')['TENSOR_NAME'].astype('float64'))\"`",
    ".pt": "; sfxlin reads no PyTorch file (torch is not installed): convert the tensor where torch is, with "
           "`np.save('W.npy', torch.load('model.pt')['TENSOR_NAME'].double().numpy())`",
}
CONVERT[".pth"] = CONVERT[".bin"] = CONVERT[".pt"]


def _forms(suffixes) -> str:
    """``"a .npy file or 'file.nc:variable'"``: the accepted forms in words."""
    return " or ".join("'file.nc:variable'" if s == ".nc" else f"a {s} file" for s in suffixes)


def parse_file_source(spec, name, suffixes=None):
    """``"path"`` -> ``(Path, None)``; ``"path.nc:variable"`` -> ``(Path, "variable")``.

    ``suffixes``: the endings the file's path may have (None: any); ``.nc`` among them stands for
    ``file.nc:variable`` (a netCDF file then needs its variable). ``ValueError`` naming ``name`` for
    another form or a file that does not exist."""
    if not isinstance(spec, (str, os.PathLike)):
        raise ValueError(f"{name} must be a path{' to ' + _forms(suffixes) if suffixes else ''}, got {spec!r}")
    text = os.fspath(spec)
    head, sep, var = text.rpartition(":")
    if sep and head.endswith(".nc"):
        if not var:
            raise ValueError(f"{name}: {text!r} names no variable after ':' (expected 'file.nc:variable')")
        path, variable = Path(head), var
    elif suffixes and ".nc" in suffixes and text.endswith(".nc"):
        raise ValueError(f"{name}: a netCDF file needs a variable: '{text}:variable'")
    else:
        path, variable = Path(text), None
    if suffixes and not str(path).endswith(tuple(suffixes)):
        hint = CONVERT.get(path.suffix, "")
        raise ValueError(f"{name} must be {_forms(suffixes)}, got {text!r}{hint}")
    if not path.is_file():
        raise ValueError(f"{name}: no such file {str(path)!r}")
    return path, variable


def parse_token_source(spec, name="tokens"):
    """``"path.npy"`` -> ``(Path, None)``; ``"path.nc:variable"`` -> ``(Path, "variable")``
    (:func:`parse_file_source` with :data:`TOKEN_SUFFIXES`).

    ``ValueError`` naming ``name`` for another form or a file that does not exist."""
    return parse_file_source(spec, name, TOKEN_SUFFIXES)


def file_sha256(path) -> str:
    """The sha256 (hex) of the file's bytes. Cached in this process by (resolved path, inode, size,
    modification and change times), so a run reads a large file's bytes once; an edit that keeps
    the size and lands within the same tick of the file system's clock as the previous write
    would be missed by a process that hashed the file in between."""
    p = Path(path).resolve()
    st = p.stat()
    return _sha256(str(p), st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


@functools.lru_cache(maxsize=16)
def _sha256(path, inode, size, mtime_ns, ctime_ns):
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def source_sha256(spec, name, suffixes=None) -> str:
    """The sha256 (hex) of the file a source ``spec`` names (``path`` or ``file.nc:variable``,
    :func:`parse_file_source`): the whole file, every variable of a netCDF file included."""
    return file_sha256(parse_file_source(spec, name, suffixes)[0])


def check_unchanged(spec, sha256, name) -> None:
    """Check that the file ``spec`` names still has the digest ``sha256``: a ``ValueError`` naming
    ``name``, the file and both digests (12 hex digits) when it changed since that digest was taken
    (when the run was configured)."""
    now = source_sha256(spec, name)
    if now != sha256:
        raise ValueError(f"{name}: {os.fspath(spec)!r} changed since the run was configured (sha256 {sha256[:12]} -> "
                         f"{now[:12]}); configure the run again to use its new content")


def read_tokens(source, name="samples", feature_dim=None) -> np.ndarray:
    """Tokens as an ``(n, D)`` float64 array, one token per row.

    ``source``: an array-like ``(n, D)``; a path to a ``.npy`` file holding one; or
    ``"file.nc:variable"``, a two-dimensional netCDF variable whose dims are (token, feature)
    in that order, or any order when ``feature_dim`` names its feature dim. A ``ValueError``
    naming ``name`` for a missing file or variable, a ``.npy`` file that is not a plain numeric
    array (pickled objects, strings, not a ``.npy`` file), a variable whose dim names look
    transposed (``(feature, token)``), another number of dims, an empty array, or NaN or inf
    entries (with the number of such rows and the first one).
    """
    if isinstance(source, (str, os.PathLike)):
        path, variable = parse_token_source(source, name)
        if variable is None:
            if feature_dim is not None:
                raise ValueError(f"{name}: feature_dim names a netCDF dim; a .npy array has none")
            X = _read_npy(path, name)
        else:
            X = _read_netcdf(path, variable, name, feature_dim)
    else:
        if feature_dim is not None:
            raise ValueError(f"{name}: feature_dim names a netCDF dim; an array has none")
        X = source
    try:
        X = np.asarray(X, dtype=float)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name} must be a numeric (n, D) array: {exc}") from None
    if X.ndim != 2:
        raise ValueError(f"{name} must be an (n, D) array, one token per row, got shape {X.shape}")
    if X.shape[0] == 0 or X.shape[1] == 0:
        raise ValueError(f"{name} is empty (shape {X.shape}): a token law needs at least one token of D >= 1")
    bad = ~np.isfinite(X).all(axis=1)
    if bad.any():
        rows = np.flatnonzero(bad)
        raise ValueError(f"{name} must be finite: {rows.size} row(s) hold NaN or inf, the first is row {rows[0]} "
                         f"({X[rows[0]]})")
    return np.ascontiguousarray(X)


def _read_npy(path, name) -> np.ndarray:
    """The array of the ``.npy`` file ``path``; a ``ValueError`` naming ``name`` and the file, and
    how to write one that can be read, for anything but a plain numeric array."""
    try:
        X = np.load(path, allow_pickle=False)
    except EOFError:
        raise ValueError(_not_plain_npy(name, path, "the file is empty or truncated")) from None
    except ValueError:  # numpy: object arrays, pickles, and bytes that are no .npy header
        raise ValueError(_not_plain_npy(name, path, "it holds pickled Python objects, or is not a .npy file at "
                                                    "all")) from None
    if not isinstance(X, np.ndarray):  # an .npz archive under a .npy name
        X.close()
        raise ValueError(_not_plain_npy(name, path, "it is an .npz archive"))
    if X.dtype.kind not in "biuf":
        raise ValueError(_not_plain_npy(name, path, f"its dtype is {X.dtype}"))
    return X


def _not_plain_npy(name, path, reason) -> str:
    return (f"{name}: {path} is not a plain numeric .npy array ({reason}); save it with np.save(path, array) "
            "from a float array")


#: dim names that say "one token per row" or "one feature per column"
TOKEN_DIMS = frozenset({"token", "tokens", "sample", "samples", "n", "row", "rows", "item", "items", "word", "words",
                        "position", "positions", "obs", "observation", "observations", "seq", "sequence"})
FEATURE_DIMS = frozenset({"feature", "features", "feat", "dim", "dims", "d", "D", "embedding", "embed", "emb",
                          "hidden", "channel", "channels", "component", "components", "col", "cols", "column",
                          "columns"})


def _looks_transposed(dims) -> bool:
    """Whether the dim names of a two-dimensional variable say features first, tokens last."""
    first, last = (str(d) for d in dims)
    said_transposed = first in FEATURE_DIMS or last in TOKEN_DIMS
    said_upright = first in TOKEN_DIMS or last in FEATURE_DIMS
    return said_transposed and not said_upright


def _read_netcdf(path, variable, name, feature_dim):
    import xarray as xr

    with xr.open_dataset(path) as ds:
        if variable not in ds.variables:
            raise ValueError(f"{name}: {str(path)!r} has no variable {variable!r}; it has {sorted(ds.variables)}")
        da = ds[variable]
        if da.ndim != 2:
            raise ValueError(f"{name}: variable {variable!r} has dims {da.dims}; expected two, (token, feature)")
        if feature_dim is not None:
            if feature_dim not in da.dims:
                raise ValueError(f"{name}: feature_dim {feature_dim!r} is not a dim of {variable!r} {da.dims}")
            da = da.transpose(*[d for d in da.dims if d != feature_dim], feature_dim)
        elif _looks_transposed(da.dims):
            token_dim, feat_dim = da.dims[1], da.dims[0]
            raise ValueError(f"{name}: variable {variable!r} of {path} has dims {da.dims}, which look transposed: "
                             f"tokens are the rows and features the last dim, ({token_dim!r}, {feat_dim!r}); write "
                             f"it as ds[{variable!r}].transpose({token_dim!r}, {feat_dim!r})")
        return da.values.astype(float)


def load_dataset(name) -> np.ndarray:
    """The feature matrix ``(n_samples, n_features)`` of a data set of :data:`DATASETS`, read from
    the files inside the installed scikit-learn (nothing is downloaded)."""
    if name not in DATASETS:
        raise ValueError(f"dataset must be one of {list(DATASETS)}, got {name!r}")
    from sklearn import datasets

    return np.asarray(getattr(datasets, f"load_{name}")(return_X_y=True)[0], dtype=float)


def standardise(X) -> np.ndarray:
    """Each column centred and divided by its standard deviation (population, ``ddof=0``); columns
    that are constant (standard deviation 0, e.g. border pixels of ``digits``) are dropped."""
    X = read_tokens(X, "X")
    sd = X.std(axis=0)
    keep = sd > 0
    return (X[:, keep] - X[:, keep].mean(axis=0)) / sd[keep]


def pca_whiten(X, D) -> np.ndarray:
    """The top-``D`` principal components of ``X``, each scaled to unit variance: an ``(n, D)``
    array with mean 0 and covariance ``I_D`` (population). Deterministic: components in
    decreasing order of variance, the sign of each fixed so that its largest-magnitude loading
    is positive. ``ValueError`` when ``D`` exceeds the number of components of positive variance."""
    X = read_tokens(X, "X")
    if isinstance(D, bool) or not isinstance(D, (int, np.integer)) or D < 1:
        raise ValueError(f"D must be an integer >= 1, got {D!r}")
    Xc = X - X.mean(axis=0)
    lam, vec = np.linalg.eigh(Xc.T @ Xc / X.shape[0])
    lam, vec = lam[::-1], vec[:, ::-1]
    rank = int(np.sum(lam > X.shape[1] * np.finfo(float).eps * lam[0]))
    if D > rank:
        raise ValueError(f"D = {D} exceeds the {rank} principal components of positive variance")
    vec = vec[:, :D] * np.sign(vec[np.argmax(np.abs(vec[:, :D]), axis=0), np.arange(D)])
    return (Xc @ vec) / np.sqrt(lam[:D])


@functools.lru_cache(maxsize=32)
def _token_set(name, D):
    with single_threaded_blas():   # cached: the same bits whether first made inside a cell or not
        Z = pca_whiten(standardise(load_dataset(name)), D)
    Z.flags.writeable = False
    return Z


def token_set(name, D) -> np.ndarray:
    """The token set of data set ``name`` on ``R^D``: :func:`standardise`, then :func:`pca_whiten`
    (cached per process; a read-only array)."""
    return _token_set(name, D)
