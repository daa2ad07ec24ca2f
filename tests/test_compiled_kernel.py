"""The compiled-kernel benchmark's arms compute the core's sums (a broken arm would time a wrong kernel)."""
import numpy as np

from sfxlin import softmax_core
from sfxlin.benchmarks import compiled_kernel


def test_every_arm_agrees_with_the_core_and_is_timed():
    res = compiled_kernel.bench_compiled(repeats=1, verbose=False)
    xla = [name for name in res["agreement"] if name.startswith("XLA")]
    assert len(xla) == 1                                   # JAX is a dependency: the XLA arm always runs
    assert set(res["agreement"]) <= set(res["ms"]) and "np.exp floor" in res["ms"]
    # float64 sums of <= 4096 positive terms: relative agreement far inside 1e-13
    assert all(err < 1e-13 for err in res["agreement"].values()), res["agreement"]
    assert res["n_exp"] == 48 * 2 * sum(compiled_kernel.LS)


def test_around_np_exp_matches_a_plain_loop():
    """The numba-free half of the "around np.exp" arm's block logic: its chunking visits every
    (group, column, token) of a column's reach once; checked with numpy stand-ins for the loops."""
    A, X, phi, reach = compiled_kernel._workload(G=5, q=2, d=3, F=4)

    def logits(A, X, g0, g1, c0, t0, t1, out):
        out[...] = A[g0:g1, c0:] @ X[g0:g1, :, t0:t1]

    def moments(w, P, g0, g1, c0, t0, t1, out):
        out[g0:g1, c0:] += w @ np.swapaxes(P[g0:g1, :, t0:t1], 1, 2)

    out = np.empty((5, A.shape[1], 4))
    compiled_kernel._around_np_exp(A, X, phi, reach, logits, moments, out, {}, cache_bytes=4096)
    ends = np.asarray(compiled_kernel.LS)[reach]
    expect = np.empty_like(out)
    for g in range(5):
        for c in range(A.shape[1]):
            e = np.exp(A[g, c] @ X[g, :, :ends[c]])
            expect[g, c] = phi[g, :, :ends[c]] @ e
    _, P = softmax_core.prefix_moments(phi, (0,) + compiled_kernel.LS, A=A, X=X, reach=reach, shifted=True,
                                       at_reach=True)
    # sums of <= 4096 terms, |P| >= the sum of the weights (feature 0 is 1): ~1e-15 typical
    for other in (expect, P):
        assert np.max(np.abs(out - other)) <= 1e-12 * np.max(np.abs(other))


def test_the_generated_specialised_kernel_computes_the_cores_sums_for_every_swept_shape():
    """The source the specialised numba kernels are compiled from, run as plain Python (math.exp
    for its exponential) on 2 groups, against the core."""
    import math

    for K, F in compiled_kernel.SHAPES:
        A, X, phi, reach = compiled_kernel._workload(G=2, d=K - 1, F=F, shift=True)
        namespace = {"fexp": math.exp}
        exec(compiled_kernel.specialised_source(K, F), namespace)
        out = np.zeros((2, A.shape[1], F))
        namespace["kernel"](A, X, phi, np.asarray(compiled_kernel.LS)[reach], out)
        _, P = softmax_core.prefix_moments(phi, (0,) + compiled_kernel.LS, A=A, X=X, reach=reach, shifted=True,
                                           at_reach=True)
        assert np.max(np.abs(out - P)) <= 1e-12 * np.max(np.abs(P))   # sums of <= 4096 terms: ~1e-15 typical
