"""Finished cells kept on disk: an interrupted sweep resumes, an extended sweep reuses them.

One small ``.npz`` file per cell, named by the cell's *fingerprint*: a hash of the experiment,
the cell's coordinate values, every input that reaches its kernel
(:meth:`~sfxlin.engine.sweep.Experiment.cell_inputs`), the schema version and the experiment's
code: the source of ``sfxlin`` and its pipelines, and for an experiment declared elsewhere the
modules of its own that its kernels, declaring and analysis modules import (:func:`import_closure`).
Two runs whose configurations share a cell (the same d = 3 cell in
a sweep over d = 3 and in one over d = 2, 3) share its file; a change of any input of a cell,
or of the code that computes it, gives another name, so a kept cell is never served to a run
it does not belong to. The kept cells outlive the run (``--fresh`` discards them).

Each file also records the seconds its kernel took when it was computed (:meth:`CellStore.cell_seconds`:
a run that serves kept cells records what they cost to compute, not what it cost to read them,
so the cost laws of ``sfxlin run --plan`` survive a rerun), the logits its kernel exponentiated
in the softmax core (:meth:`CellStore.cell_exponentials`: its distance from the ``np.exp`` floor)
and the code fingerprint it was computed with, so :func:`survey` tells the
cells the current code can still serve from the stale ones (``sfxlin cells``), and
:func:`prune` removes those.

Every file is written atomically (temporary file + rename), and a writer killed mid-write leaves
no file under the final name. A damaged file (truncated, foreign) is recomputed. On the local
schedulers the process that computed a cell writes it (the folder is absolute, so a pool worker
writes where the run asked); on a dask cluster the client does, as each cell arrives
(:mod:`sfxlin.engine.cluster`): a worker never writes, so the cells land in ``--out`` whatever
the workers' folders or file systems, and a worker that tries is refused
(:class:`WorkerWriteError`). Each file records the BLAS kernel that computed it too.
"""
from __future__ import annotations

import functools
import hashlib
import importlib
import itertools
import json
import os
import shutil
import sys
import threading
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .closure import import_closure, in_sfxlin
from .schema import SCHEMA_VERSION
from .sweep import coordinate_text

__all__ = ["CellStore", "KeptCells", "WorkerWriteError", "cell_fingerprint", "code_files", "code_fingerprint",
           "experiment_code",
           "holds_cell", "prune", "survey"]

_FINGERPRINT_KEY = "__cell_fingerprint__"
_CODE_KEY = "__code_fingerprint__"
_SECONDS_KEY = "__seconds__"
_EXPONENTIALS_KEY = "__exponentials__"
_BLAS_KEY = "__blas__"
_META_KEYS = (_FINGERPRINT_KEY, _CODE_KEY, _SECONDS_KEY, _EXPONENTIALS_KEY, _BLAS_KEY)


class WorkerWriteError(RuntimeError):
    """A cell store written from a dask.distributed worker: on a cluster the client writes the cells
    (``compute(ds, address=..., store=store)``), since a worker's folder may not be the run's."""


def code_files(extra_modules=()) -> list:
    """``[(name, path)]`` of the source files :func:`code_fingerprint` hashes: every ``.py`` file of
    ``sfxlin`` (every subpackage: the mathematics, the models, the engine) and of ``sfxlin.pipelines`` (the
    families of ``sfxlin.pipelines.families`` with the experiments), then the :func:`import_closure` of
    ``extra_modules``."""
    paths = [(f"{package}/{path.relative_to(folder).as_posix()}", path)
             for package in ("sfxlin", "sfxlin.pipelines")
             for folder in map(Path, importlib.import_module(package).__path__) for path in sorted(folder.rglob("*.py"))]
    return paths + list(import_closure(extra_modules).items())


@functools.lru_cache(maxsize=None)
def code_fingerprint(extra_modules=()) -> str:
    """Hash of :func:`code_files` of ``extra_modules`` (the modules of an experiment declared elsewhere,
    e.g. found through ``$SFXLIN_PIPELINES``: its kernels, its declaring and analysis modules), each file
    by its module name: the code of every kernel."""
    digest = hashlib.sha256()
    for name, path in code_files(extra_modules):
        digest.update(f"{name}\0".encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def experiment_code(experiment) -> str:
    """The code fingerprint of ``experiment``'s cells: :func:`code_fingerprint` with the modules
    outside ``sfxlin`` of its parts' kernels, of its declaration (``Experiment.module``) and of its
    analysis."""
    names = {p.kernel.__module__ for p in experiment.parts} | {experiment.module, experiment.analysis}
    return code_fingerprint(tuple(sorted(n for n in names - {None, "__main__"} if not in_sfxlin(n))))


def cell_fingerprint(experiment, config, cell, part="") -> str:
    """The fingerprint of one cell of ``part`` (see the module docstring): equal fingerprints,
    equal bits."""
    payload = {"experiment": experiment.rng_name(part), "schema": SCHEMA_VERSION, "code": experiment_code(experiment),
               "cell": {dim: coordinate_text(value) for dim, value in cell.items()},
               "inputs": experiment.cell_inputs(config, cell, part)}
    text = json.dumps(payload, sort_keys=True, default=_json_default)
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def _json_default(value):
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"a configuration value must be JSON data, got {value!r} ({type(value).__name__})")


class CellStore:
    """The kept cells of one experiment under one configuration, in ``folder``.

    ``folder`` may hold cells of other configurations too (earlier runs of the same experiment):
    only the cells whose fingerprint this configuration gives are served.
    """

    def __init__(self, folder, experiment, config, fresh: bool = False):
        self.folder = Path(folder).absolute()   # the caller's folder, whichever process writes
        self.experiment, self.config = experiment, config
        self.experiment_name = experiment.name
        self.code = experiment_code(experiment)
        self._names, self._cells = {}, {}
        for part in experiment.parts:
            grid = part.grid(config)
            for values in itertools.product(*grid.values()):
                cell = dict(zip(grid, values))
                key = _cell_key(cell, part.name)
                self._names[key] = cell_fingerprint(experiment, config, cell, part.name)
                self._cells[key] = (part.name, cell)
        if fresh and self.folder.exists():
            shutil.rmtree(self.folder)

    def __repr__(self):
        return f"CellStore({str(self.folder)!r}, {self.count()} of {len(self._names)} cells kept)"

    def fingerprint(self, cell, part="") -> str:
        """The fingerprint of ``cell`` of ``part`` (its file's name)."""
        return self._names[_cell_key(cell, part)]

    def _path(self, cell, part="") -> Path:
        return self._path_of_key(_cell_key(cell, part))

    def _path_of_key(self, key) -> Path:
        return self.folder / f"cell_{self._names[key]}.npz"

    def load(self, cell, part=""):
        """The kept outputs of ``cell`` (a ``{dim: value}`` mapping) of ``part``, or None.

        A file that cannot be read whole (truncated by a crash, overwritten) is removed and
        None returned: the cell is recomputed."""
        path = self._path(cell, part)
        if not path.exists():
            return None
        try:
            with np.load(path, allow_pickle=False) as data:
                if str(data[_FINGERPRINT_KEY]) != path.stem[len("cell_"):]:
                    raise ValueError("fingerprint does not match the file name")
                return {k: data[k] for k in data.files if k not in _META_KEYS}
        except (OSError, EOFError, KeyError, ValueError, zipfile.BadZipFile, zlib.error):
            path.unlink(missing_ok=True)
            return None

    def is_kept(self, cell, part="") -> bool:
        """Whether ``cell`` of ``part`` is kept (:func:`holds_cell`)."""
        return holds_cell(self._path(cell, part))

    def missing(self) -> list:
        """``[(part, cell), ...]``: the cells of this configuration not kept (:meth:`is_kept`), in
        grid order."""
        return [(part, cell) for part, cell in self._cells.values() if not self.is_kept(cell, part)]

    def save(self, cell, outputs, part="", seconds=None, exponentials=None, blas=None):
        """Keep one finished cell of ``part`` (the folder is made by the first save), with the
        ``seconds`` its kernel took, the ``exponentials`` it computed in the softmax core
        (:func:`sfxlin.softmax_core.exponentials`) and the ``blas`` kernel that computed it when
        given. Refused in a dask.distributed worker (:class:`WorkerWriteError`)."""
        _refuse_in_a_worker(self.folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self._path(cell, part)
        tmp = path.with_name(f".{path.stem}.{os.getpid()}.{threading.get_ident()}.partial.npz")
        meta = {_FINGERPRINT_KEY: np.array(path.stem[len("cell_"):]), _CODE_KEY: np.array(self.code)}
        if blas is not None:
            meta[_BLAS_KEY] = np.array(blas)
        if seconds is not None:
            meta[_SECONDS_KEY] = np.float64(seconds)
        if exponentials is not None:
            meta[_EXPONENTIALS_KEY] = np.int64(exponentials)
        try:
            np.savez(tmp, **meta, **outputs)
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    def cell_seconds(self) -> list:
        """``[[part, {dim: value}, seconds or None], ...]`` for every cell of this configuration:
        the seconds its kernel took when it was computed, by this run or an earlier one; None for a
        cell not kept, or kept by a version that did not record them."""
        return self._recorded_rows(_SECONDS_KEY, float)

    def cell_exponentials(self) -> list:
        """``[[part, {dim: value}, count or None], ...]``: the logits each cell's kernel exponentiated
        in the softmax core when it was computed (None as in :meth:`cell_seconds`)."""
        return self._recorded_rows(_EXPONENTIALS_KEY, int)

    def blas_kernels(self) -> set:
        """The BLAS kernels recorded by this configuration's cells, with None for a cell that
        records none (not kept, or kept before cells recorded them)."""
        return {row[2] for row in self._recorded_rows(_BLAS_KEY, str)}

    def _recorded_rows(self, key, cast):
        return [[part, {dim: _json_default(v) if isinstance(v, np.generic) else v for dim, v in cell.items()},
                 _recorded(self._path_of_key(name), key, cast)] for name, (part, cell) in self._cells.items()]

    def count(self) -> int:
        """How many cells of this configuration are kept (:func:`holds_cell`: a truncated file is not)."""
        return sum(1 for key in self._names if holds_cell(self._path_of_key(key)))

    def discard(self):
        shutil.rmtree(self.folder, ignore_errors=True)


def holds_cell(path) -> bool:
    """Whether the kept cell file ``path`` opens and names the fingerprint in its own name (read
    without its outputs; a file truncated by a kill has no zip directory and is not kept;
    :meth:`CellStore.load` still recomputes one damaged inside)."""
    path = Path(path)
    try:
        with np.load(path, allow_pickle=False) as data:
            return str(data[_FINGERPRINT_KEY]) == path.stem[len("cell_"):]
    except (OSError, EOFError, KeyError, ValueError, zipfile.BadZipFile, zlib.error):
        return False


def _refuse_in_a_worker(folder):
    """:class:`WorkerWriteError` when called in a dask.distributed worker's task."""
    worker = sys.modules.get("distributed.worker")
    if worker is None:
        return
    try:
        address = worker.get_worker().address
    except ValueError:   # not in a worker's task
        return
    raise WorkerWriteError(f"the cell store {folder} is written by the client on a dask cluster, not by worker "
                           f"{address} (whose folder may not be the run's): compute(ds, address=..., store=store)")


def _cell_key(cell, part=""):
    return (part, *((dim, coordinate_text(value)) for dim, value in cell.items()))



@dataclass(frozen=True)
class KeptCells:
    """The kept cell files of one experiment in ``folder``: ``current`` (computed by the current
    code, servable to a run of some configuration) and ``stale`` (computed by other code, or
    unreadable: never served again)."""

    folder: Path
    current: tuple
    stale: tuple

    @staticmethod
    def size(paths) -> int:
        """Total bytes of ``paths`` (files removed meanwhile count 0)."""
        return sum(p.stat().st_size for p in paths if p.exists())


def _recorded_code(path):
    """The code fingerprint a kept cell file records, or None (unreadable, or written before
    files recorded it)."""
    try:
        with np.load(path, allow_pickle=False) as data:
            return str(data[_CODE_KEY]) if _CODE_KEY in data.files else None
    except (OSError, EOFError, KeyError, ValueError, zipfile.BadZipFile, zlib.error):
        return None


def _recorded(path, key, cast):
    """The value a kept cell file records under ``key`` (as ``cast``), or None (absent, unreadable,
    or written before files recorded it)."""
    try:
        with np.load(path, allow_pickle=False) as data:
            return cast(data[key]) if key in data.files else None
    except (OSError, EOFError, KeyError, ValueError, zipfile.BadZipFile, zlib.error):
        return None


def survey(folder, experiment) -> KeptCells:
    """The kept cells of ``experiment`` in ``folder`` (its ``OUT/.EXP.cells``), split by whether
    the current code computed them (:class:`KeptCells`)."""
    folder = Path(folder)
    code = experiment_code(experiment)
    paths = sorted(folder.glob("cell_*.npz")) if folder.is_dir() else []
    is_current = [_recorded_code(p) == code for p in paths]
    return KeptCells(folder, tuple(p for p, ok in zip(paths, is_current) if ok),
                     tuple(p for p, ok in zip(paths, is_current) if not ok))


def prune(kept: KeptCells, everything: bool = False) -> tuple[int, int]:
    """Remove the stale cells of ``kept`` (every cell, and the folder, when ``everything``);
    returns ``(files removed, bytes freed)``."""
    doomed = kept.current + kept.stale if everything else kept.stale
    freed = KeptCells.size(doomed)
    for path in doomed:
        path.unlink(missing_ok=True)
    if everything:
        shutil.rmtree(kept.folder, ignore_errors=True)
    return len(doomed), freed
