"""A dask.distributed worker killed mid-sweep: the sweep still completes, with identical bits."""
import os
import time

import numpy as np
import pytest

from sfxlin.pipelines import c1_limit
from sfxlin.sweep import build

distributed = pytest.importorskip("distributed")


def _kill(pid):
    os.kill(pid, 9)


@pytest.mark.slow
def test_killing_a_worker_mid_sweep_changes_nothing():
    config = {**c1_limit.EXPERIMENT.configure("quick"), "n_prompts": 40, "L": [16, 64, 256, 1024, 4096]}
    reference = build(c1_limit.EXPERIMENT, config).compute(scheduler="threads")
    lazy = build(c1_limit.EXPERIMENT, config)
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster, \
            distributed.Client(cluster) as client:
        persisted = lazy.persist()
        futures = distributed.futures_of(persisted.mse)  # one chunk per cell
        assert len(futures) == 8
        deadline = time.time() + 60
        while time.time() < deadline and sum(f.done() for f in futures) < 2:
            time.sleep(0.02)
        done_before = sum(f.done() for f in futures)
        assert done_before < len(futures), "the sweep finished before a worker could be killed"
        victim = list(client.scheduler_info()["workers"])[0]
        pid = client.run(os.getpid, workers=[victim])[victim]
        _kill(pid)  # SIGKILL: no goodbye, the scheduler notices the lost connection
        result = persisted.compute()
    for name in reference.data_vars:
        np.testing.assert_array_equal(result[name].values, reference[name].values, err_msg=name)
