"""sfxlin.engine.cluster without an external cluster: the client-side checks of what computed a
cell (a worker that joins after the up-front check is refused at its first cell, nothing kept),
and the absolute paths given to the workers. The real cluster: tests/test_external_cluster.py."""
from __future__ import annotations

import os

import numpy as np
import pytest

import toy_experiment
from sfxlin.engine import cluster
from sfxlin.engine.cellstore import CellStore
from sfxlin.engine.params import configure

distributed = pytest.importorskip("distributed")


def test_mismatch_names_every_field_that_differs():
    client = cluster.origin(toy_experiment.EXPERIMENT)
    assert cluster.mismatch(client, dict(client)) == []
    other = {**client, "code": "0123456789abcdef", "numpy": "0.0.1", "blas": "another kernel"}
    assert cluster.mismatch(client, other) == [f"code: {client['code']} (client) != 0123456789abcdef (worker)",
                                               f"numpy: {client['numpy']} (client) != 0.0.1 (worker)"]


def test_the_workers_get_absolute_paths_and_the_configured_digests(tmp_path, monkeypatch):
    from sfxlin.pipelines import c1_limit

    monkeypatch.chdir(tmp_path)
    (tmp_path / "own").mkdir()
    np.save(tmp_path / "own/t.npy", np.random.default_rng(0).standard_normal((50, 3)))
    config = c1_limit.EXPERIMENT.configure("quick", ["tokens=own/t.npy", "d=3"])
    remote = cluster.absolute_inputs(config)
    assert remote["tokens"] == str(tmp_path / "own/t.npy") and os.path.isabs(remote["tokens"])
    assert remote.digests == config.digests
    assert {k: v for k, v in remote.items() if k != "tokens"} == {k: v for k, v in config.items() if k != "tokens"}
    assert config["tokens"] == "own/t.npy"   # the client's own configuration (and fingerprints) unchanged


def test_a_netcdf_source_keeps_its_variable(tmp_path, monkeypatch):
    import xarray as xr

    from sfxlin.engine.params import Param

    monkeypatch.chdir(tmp_path)
    xr.Dataset({"Z": (("token", "feature"), np.ones((4, 2)))}).to_netcdf(tmp_path / "z.nc")
    config = configure([Param("tokens", "file", "a token file", "", optional=True)], None, values={"tokens": "z.nc:Z"})
    assert cluster.absolute_inputs(config)["tokens"] == f"{tmp_path / 'z.nc'}:Z"


def _impostor(experiment, config, cell, part):
    out, seconds, exponentials, got = cluster_compute_cell(experiment, config, cell, part)
    return out, seconds, exponentials, {**got, "code": "f" * 16}


cluster_compute_cell = cluster.compute_cell


def test_a_worker_with_other_code_is_refused_at_its_first_cell_and_nothing_is_kept(tmp_path, monkeypatch):
    """The up-front check passes (the worker's origin is the client's), then every cell comes back
    with another code fingerprint, as from a worker that joined later with another install."""
    monkeypatch.setattr(cluster, "compute_cell", _impostor)
    exp = toy_experiment.EXPERIMENT
    config = exp.configure(None, values=toy_experiment.make_config())
    store = CellStore(tmp_path / "cells", exp, config)
    with distributed.LocalCluster(n_workers=1, threads_per_worker=2, processes=False, dashboard_address=None) as lc, \
            distributed.Client(lc) as client:
        with pytest.raises(cluster.WorkerMismatch, match=r"worker inproc://.* runs other code than this client "
                                                         r"\(code: \w{16} \(client\) != f{16} \(worker\)\)"):
            cluster.fill(client, store)
    assert store.count() == 0
