"""The softmax core counts the logits it exponentiates, per thread, and a run records each cell's
count beside its seconds (``cell_exponentials``): what a cell's ``np.exp`` floor is."""
import threading

import numpy as np

from sfxlin import softmax_core
from sfxlin.engine.cellstore import CellStore
from sfxlin.engine.execution import compute
from sfxlin.engine.sweep import Experiment, Part, Variable, build


def _counted(fn):
    before = softmax_core.exponentials()
    fn()
    return softmax_core.exponentials() - before


def _inputs(G=3, C=4, K=2, F=3, T=40, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((G, C, K)), rng.standard_normal((G, K, T)), rng.standard_normal((G, F, T))


def test_the_count_is_every_logit_of_every_columns_reach_whatever_the_chunking():
    A, X, phi = _inputs()
    edges, reach = (0, 5, 17, 40), np.array([0, 1, 1, 2])
    G, C = A.shape[:2]
    # column c sums the tokens of its prompt edges[reach[c] + 1]; without reach every column sums all 40
    expect_reach = G * sum(edges[r + 1] for r in reach)
    for cache_bytes in (None, 256, 64):                   # one product per block, sub-blocks, group chunks
        kw = dict(A=A, X=X, cache_bytes=cache_bytes)
        assert _counted(lambda: softmax_core.prefix_moments(phi, edges, reach=reach, at_reach=True, **kw)) == expect_reach
        assert _counted(lambda: softmax_core.prefix_moments(phi, edges, **kw)) == G * C * 40
    logits = np.einsum("gck,gkt->gct", A, X)
    assert _counted(lambda: softmax_core.prefix_moments(phi, edges, logits=logits, shifted=True)) == G * C * 40


def test_each_thread_has_its_own_count():
    A, X, phi = _inputs()
    seen, start = {}, softmax_core.exponentials()

    def worker():
        seen["before"] = softmax_core.exponentials()
        softmax_core.prefix_moments(phi, (0, 40), A=A, X=X)
        seen["after"] = softmax_core.exponentials()

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    assert seen == {"before": 0, "after": 3 * 4 * 40}
    assert softmax_core.exponentials() == start          # the other thread's logits are not this one's


def _toy():
    A, X, phi = _inputs(T=64)

    def kernel(cell, rng, inputs):
        for _ in range(cell["a"]):                         # a cell of a calls the core a times
            softmax_core.prefix_moments(phi, (0, 64), A=A, X=X)
        return {"y": np.array(float(cell["a"]))}

    return Experiment(name="toy_exponentials", inner_coords=lambda c: {},
                      variables=(Variable("y", ("a",), "y", "y."),),
                      parts=(Part("", lambda c: {"a": [0, 1, 2, 3]}, kernel),))


def test_a_run_records_each_cells_count_on_any_scheduler_and_a_rerun_keeps_it(tmp_path):
    toy, config = _toy(), {"root_seed": 0}
    expect = [["", {"a": a}, a * 3 * 4 * 64] for a in range(4)]
    # cells side by side in threads of one process, in pool processes (a cluster's workers run the
    # same block function in their own processes), in one thread
    for scheduler in ("threads", "processes", "synchronous"):
        store = CellStore(tmp_path / scheduler, toy, config)
        assert [n for _p, _c, n in store.cell_exponentials()] == [None] * 4
        compute(build(toy, config, store=store), scheduler=scheduler, progress=False)
        assert store.cell_exponentials() == expect, scheduler
        again = CellStore(store.folder, toy, config)
        compute(build(toy, config, store=again), scheduler="synchronous", progress=False)   # every cell served
        assert again.cell_exponentials() == expect
