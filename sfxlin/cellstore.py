"""Finished cells kept on disk, so an interrupted sweep resumes where it stopped.

One small ``.npz`` file per cell, written atomically (temporary file + rename) by whichever
process computed it: no two processes ever write the same file, and no HDF5 file is shared.
Every file carries the hash of the configuration it was computed under; a store made under
another configuration is refused, never mixed in.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import threading
from pathlib import Path

import numpy as np

from .schema import SCHEMA_VERSION

__all__ = ["CellStore", "config_hash"]


def config_hash(experiment_name: str, config) -> str:
    """Hash of everything that determines a cell's values."""
    payload = json.dumps({"experiment": experiment_name, "config": config, "schema": SCHEMA_VERSION},
                         sort_keys=True, default=str)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


class CellStore:
    """A folder of finished cells of one experiment under one configuration."""

    def __init__(self, folder, experiment_name: str, config, fresh: bool = False):
        self.folder = Path(folder)
        self.hash = config_hash(experiment_name, config)
        self._stamp_text = json.dumps({"hash": self.hash, "experiment": experiment_name, "config": config},
                                      sort_keys=True, default=str)
        if fresh and self.folder.exists():
            shutil.rmtree(self.folder)
        stamp = self.folder / "config.json"
        if stamp.exists():
            kept = json.loads(stamp.read_text())
            if kept.get("hash") != self.hash:
                raise ValueError(
                    f"the kept cells in {self.folder} belong to another configuration "
                    f"(hash {kept.get('hash')}, this run {self.hash}); rerun with --fresh to discard them"
                )

    def __repr__(self):
        return f"CellStore({str(self.folder)!r}, {self.count()} cells kept)"

    def __reduce__(self):  # workers rebuild a light handle, without re-checking the stamp
        return (_reopen, (str(self.folder), self.hash, self._stamp_text))

    def _path(self, index):
        return self.folder / ("cell_" + "_".join(str(int(i)) for i in index) + ".npz")

    def load(self, index):
        """The kept outputs of a cell, or None if it was not finished."""
        path = self._path(index)
        if not path.exists():
            return None
        try:
            with np.load(path, allow_pickle=False) as data:
                if str(data["__config_hash__"]) != self.hash:
                    raise ValueError(f"{path} was computed under another configuration; rerun with --fresh")
                return {k: data[k] for k in data.files if k != "__config_hash__"}
        except (OSError, EOFError, KeyError, ValueError) as exc:
            if "another configuration" in str(exc):
                raise
            path.unlink(missing_ok=True)  # damaged by an interruption: recompute it
            return None

    def save(self, index, outputs):
        """Keep one finished cell (the folder and its stamp are made by the first save)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        stamp = self.folder / "config.json"
        if not stamp.exists():
            _atomic_write_text(stamp, self._stamp_text)
        path = self._path(index)
        tmp = path.with_name(f".{path.stem}.{os.getpid()}.{threading.get_ident()}.partial.npz")
        try:
            np.savez(tmp, __config_hash__=np.array(self.hash), **outputs)
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    def count(self):
        return sum(1 for _ in self.folder.glob("cell_*.npz")) if self.folder.exists() else 0

    def discard(self):
        shutil.rmtree(self.folder, ignore_errors=True)


def _reopen(folder, hash_, stamp_text):
    store = CellStore.__new__(CellStore)
    store.folder, store.hash, store._stamp_text = Path(folder), hash_, stamp_text
    return store


def _atomic_write_text(path, text):
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.partial")
    tmp.write_text(text)
    os.replace(tmp, path)
