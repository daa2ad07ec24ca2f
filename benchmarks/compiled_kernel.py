"""Should the softmax core be compiled?  A side-by-side benchmark on the C3 workload.

One step of the C3 paper engine exponentiates 785,664 logits (48 antithetic pairs x 2 queries x
sum of L = 8 .. 4096) and takes 7 moments of each (the ``[x y, 1, x]`` features). This
benchmark times, in one process and interleaved (best of ``repeats``):

* ``np.exp`` alone on that many logits (the floor of any exact float64 engine that calls it);
* the package's core, :func:`sfxlin.softmax_core.prefix_moments` (numpy: a batched product for
  the logits, an in-place ``np.exp``, a product for the moments);
* with numba installed (it is not a dependency: ``pip install numba`` to run this part), two
  compiled kernels fusing logits, exponential and moments in one pass over the tokens, with an
  exponential of their own (Cody-Waite reduction, degree-13 Taylor polynomial, exponent by bit
  manipulation: 1 ulp, vectorised by LLVM; numba's wheels have no SVML):
  - *specialised*: the logit coefficients and the moment accumulators written out as scalars, a
    kernel generated per (logit coordinates, features) (the fastest form found);
  - *generic*: any number of features, through a cache-sized buffer of exponentials.

* with numba, *around np.exp*: the core's blocks and chunks, its two products written as numba
  loops (logits, then the moments) and numpy's own exponential between them (the form that keeps
  the fastest ``exp`` and fuses the rest);
* *XLA (JAX, CPU)*: the same block sums as one jitted JAX function (``einsum`` for the logits and
  the moments, ``jnp.exp`` between), compiled once before timing, on one XLA thread.

Whether numba could use Intel's vectorised SVML exponential instead of its own is printed too:
numba needs an llvmlite built with SVML support (``llvmlite.binding.targets.has_svml()``), not only
the SVML library (``intel-cmplr-lib-rt`` on PyPI).

All compute the same sums; their agreement with the core is printed. Then, with numba, the
feature sweep (:func:`feature_sweep`): the core against the specialised kernel for the feature
counts the package uses (``K`` logit coordinates including the carried shift, ``F`` features:
C3 at d = 3 has ``K = 4`` and ``F = 7`` or ``10``, at d = 8 ``K = 9`` and ``F = 17``), each on
the same C3 prompt structure, since a compiled kernel pays only while its accumulators stay in
registers. ``python -m sfxlin.benchmarks.compiled_kernel``.
"""
from __future__ import annotations

import math
import os
import time

import numpy as np

from sfxlin import softmax_core

__all__ = ["bench_compiled", "feature_sweep", "specialised_source"]

#: (K logit coordinates, F features) of the feature sweep
SHAPES = ((3, 4), (4, 7), (4, 10), (4, 15), (9, 17))

LS = tuple(8 * 2**k for k in range(10))


def _workload(seed=0, G=48, q=2, d=3, F=7, shift=False):
    """``A (G, C, K), X (G, K, T), phi (G, F, T), reach (C,)`` of the C3 prompt structure; with
    ``shift`` the first logit coordinate is the constant 1 (the carried shift: ``K = d + 1``)."""
    rng = np.random.default_rng(seed)
    T = LS[-1]
    X = rng.standard_normal((G, d, T))
    phi = rng.standard_normal((G, F, T))
    phi[:, 0] = 1.0
    C = len(LS) * q
    A = 0.3 * rng.standard_normal((G, C, d))
    if shift:
        X = np.concatenate([np.ones((G, 1, T)), X], axis=1)
        A = np.concatenate([np.full((G, C, 1), -0.5), A], axis=2)
    reach = np.repeat(np.arange(len(LS)), q)
    return A, X, phi, reach


def specialised_source(K, F):
    """Python source of ``kernel(A, X, P, ends, out)`` for ``K`` logit coefficients and ``F``
    moments: ``out[g, c, f] = sum_{t < ends[c]} fexp(A[g, c] . X[g, :, t]) P[g, f, t]``, its
    coefficients, feature rows and accumulators written out as scalars (``fexp`` is looked up in
    the namespace it is executed in)."""
    acc = [f"a{f}" for f in range(F)]
    lines = ["def kernel(A, X, P, ends, out):",
             "    for g in range(A.shape[0]):",
             "        " + "".join(f"x{k}, " for k in range(K)) + "= " + ", ".join(f"X[g, {k}]" for k in range(K)),
             "        " + "".join(f"p{f}, " for f in range(F)) + "= " + ", ".join(f"P[g, {f}]" for f in range(F)),
             "        for col in range(A.shape[1]):",
             "            " + "".join(f"b{k}, " for k in range(K)) + "= " + ", ".join(f"A[g, col, {k}]" for k in range(K)),
             "            " + " = ".join(acc) + " = 0.0",
             "            for t in range(ends[col]):",
             "                e = fexp(" + " + ".join(f"b{k} * x{k}[t]" for k in range(K)) + ")"]
    lines += [f"                {a} += e * p{f}[t]" for f, a in enumerate(acc)]
    lines += [f"            out[g, col, {f}] = {a}" for f, a in enumerate(acc)]
    return "\n".join(lines)


def _numba_kernels():
    """``(specialised(K, F) -> kernel, generic kernel, (logits, moments) loops)``, or None without numba."""
    try:
        from llvmlite import ir
        from numba import njit, types
        from numba.extending import intrinsic
    except ImportError:
        return None

    @intrinsic
    def as_int(typingctx, x):
        return types.int64(types.float64), lambda ctx, b, sig, args: b.bitcast(args[0], ir.IntType(64))

    @intrinsic
    def as_float(typingctx, x):
        return types.float64(types.int64), lambda ctx, b, sig, args: b.bitcast(args[0], ir.DoubleType())

    ln2_hi, ln2_lo, log2e, magic, one = 6.93147180369123816490e-01, 1.90821492927058770002e-10, \
        1.44269504088896338700e+00, 6755399441055744.0, 1023 << 52
    c = tuple(1.0 / math.factorial(i) for i in range(14))

    @njit(nogil=True, inline="always")
    def fexp(x):
        y = min(max(x, -708.0), 709.0)
        t = y * log2e + magic
        k = t - magic
        r = (y - k * ln2_hi) - k * ln2_lo
        p = c[13]
        for i in range(12, -1, -1):
            p = p * r + c[i]
        return p * as_float((as_int(t) << 52) + one)

    def specialised(K, F):
        """The kernel of :func:`specialised_source` for ``K`` and ``F``, compiled at its first call."""
        namespace = {"fexp": fexp}
        exec(specialised_source(K, F), namespace)
        return njit(nogil=True, fastmath={"reassoc", "contract"})(namespace["kernel"])

    @njit(nogil=True, fastmath={"reassoc", "contract"})
    def generic(A, X, P, ends, out):
        chunk = 256
        s = np.empty(chunk)
        for g in range(A.shape[0]):
            for col in range(A.shape[1]):
                out[g, col] = 0.0
                for t0 in range(0, ends[col], chunk):
                    n = min(chunk, ends[col] - t0)
                    s[:n] = 0.0
                    for k in range(A.shape[2]):
                        a, x = A[g, col, k], X[g, k, t0:t0 + n]
                        for i in range(n):
                            s[i] += a * x[i]
                    for i in range(n):
                        s[i] = fexp(s[i])
                    for f in range(P.shape[1]):
                        p, r = P[g, f, t0:t0 + n], 0.0
                        for i in range(n):
                            r += s[i] * p[i]
                        out[g, col, f] += r

    @njit(nogil=True, fastmath={"reassoc", "contract"})
    def logits(A, X, g0, g1, c0, t0, t1, out):
        for g in range(g0, g1):
            for col in range(c0, A.shape[1]):
                o = out[g - g0, col - c0]
                x, a = X[g, 0, t0:t1], A[g, col, 0]
                for i in range(o.size):
                    o[i] = a * x[i]
                for k in range(1, A.shape[2]):
                    x, a = X[g, k, t0:t1], A[g, col, k]
                    for i in range(o.size):
                        o[i] += a * x[i]

    @njit(nogil=True, fastmath={"reassoc", "contract"})
    def moments(w, P, g0, g1, c0, t0, t1, out):
        for g in range(g0, g1):
            for col in range(w.shape[1]):
                e = w[g - g0, col]
                for f in range(P.shape[1]):
                    p, r = P[g, f, t0:t1], 0.0
                    for i in range(e.size):
                        r += e[i] * p[i]
                    out[g, c0 + col, f] += r

    return specialised, generic, (logits, moments)


def _around_np_exp(A, X, phi, reach, logits, moments, out, work, cache_bytes=softmax_core.CACHE_BYTES):
    """The core's blocks and group chunks (whole column suffixes, no column split), the logits and
    the moments by the numba loops ``logits`` and ``moments``, ``np.exp`` in place between."""
    G, C, _ = A.shape
    out[...] = 0.0
    first = np.searchsorted(reach, np.arange(len(LS)), side="left")
    for b, (lo, hi) in enumerate(zip((0,) + LS[:-1], LS)):
        c0 = int(first[b])
        step = max(1, min(hi - lo, cache_bytes // (8 * (C - c0))))
        gc = max(1, min(G, cache_bytes // (8 * (C - c0) * step)))
        for t0 in range(lo, hi, step):
            t1 = min(hi, t0 + step)
            for g0 in range(0, G, gc):
                g1 = min(G, g0 + gc)
                s = work.setdefault((g1 - g0, C - c0, t1 - t0), np.empty((g1 - g0, C - c0, t1 - t0)))
                logits(A, X, g0, g1, c0, t0, t1, s)
                np.exp(s, out=s)
                moments(s, phi, g0, g1, c0, t0, t1, out)
    return out


def _xla_arm(A, X, phi, reach):
    """The block sums as one jitted JAX function on one XLA thread, or None without JAX; and the
    device JAX runs on."""
    os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")
    try:
        from sfxlin.models._jax import jax, jnp
    except ImportError:
        return None
    first = np.searchsorted(reach, np.arange(len(LS)), side="left")

    def block_sums(A, X, phi):
        P = jnp.zeros((A.shape[0], A.shape[1], phi.shape[1]))
        for b, (lo, hi) in enumerate(zip((0,) + LS[:-1], LS)):
            c0 = int(first[b])
            w = jnp.exp(jnp.einsum("gck,gkt->gct", A[:, c0:], X[:, :, lo:hi]))
            P = P.at[:, c0:].add(jnp.einsum("gct,gft->gcf", w, phi[:, :, lo:hi]))
        return P

    fn, args = jax.jit(block_sums), [jnp.asarray(a) for a in (A, X, phi)]
    return (lambda: fn(*args).block_until_ready()), str(jax.devices()[0])


def _svml_usable():
    """Whether numba's llvmlite was built with SVML support (None without numba)."""
    try:
        import llvmlite.binding
    except ImportError:
        return None
    return bool(getattr(llvmlite.binding.targets, "has_svml", lambda: False)())


def _best(fn, repeats):
    best = math.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return 1e3 * best


def bench_compiled(repeats=20, verbose=True):
    """Times (ms, best of ``repeats``, interleaved) of the four ways; returns a dict with the
    times, the ratios to the ``np.exp`` floor and the agreement with the core."""
    A, X, phi, reach = _workload()
    edges = (0,) + LS
    n_exp = int(A.shape[0] * sum(LS) * 2)
    s = np.random.default_rng(1).uniform(-10.0, 0.0, n_exp)
    out_exp = np.empty_like(s)
    work = {}
    core = lambda: softmax_core.prefix_moments(phi, edges, A=A, X=X, reach=reach, shifted=True,
                                               at_reach=True, work=work)[1]
    ref = core()
    arms = {"np.exp floor": lambda: np.exp(s, out=out_exp), "softmax_core (numpy)": core}
    kernels = _numba_kernels()
    agree = {}

    def check(name, value):
        agree[name] = float(np.max(np.abs(np.asarray(value) - ref)) / np.max(np.abs(ref)))

    if kernels is not None:
        ends = np.asarray(LS)[reach].astype(np.int64)
        outs = {name: np.zeros(ref.shape) for name in ("numba specialised", "numba generic", "numba around np.exp")}
        for name, k in zip(outs, (kernels[0](A.shape[2], phi.shape[1]), kernels[1])):
            k(A, X, phi, ends, outs[name])                     # compile
            check(name, outs[name])
            arms[name] = (lambda k=k, o=outs[name]: k(A, X, phi, ends, o))
        around = (lambda o=outs["numba around np.exp"], w={}: _around_np_exp(A, X, phi, reach, *kernels[2], o, w))
        check("numba around np.exp", around())                 # compiles
        arms["numba around np.exp"] = around
    xla = _xla_arm(A, X, phi, reach)
    if xla is not None:
        name = f"XLA (JAX, {xla[1]})"
        check(name, xla[0]())                                  # compiles
        arms[name] = xla[0]
    times = {name: math.inf for name in arms}
    for _ in range(repeats):
        for name, fn in arms.items():
            times[name] = min(times[name], _best(fn, 1))
    floor = times["np.exp floor"]
    if verbose:
        print(f"softmax moments of one C3 engine step ({n_exp:,} logits, 7 features), best of {repeats}, interleaved:")
        for name, t in times.items():
            extra = f"   agrees with the core to {agree[name]:.1e}" if name in agree else ""
            print(f"  {name:<24} {t:7.3f} ms   {t / floor:5.2f}x the floor   {times['softmax_core (numpy)'] / t:5.2f}x "
                  f"the core's speed{extra}")
        if kernels is None:
            print("  (numba not installed: pip install numba to time the compiled kernels)")
        else:
            print(f"  numba with Intel SVML possible here: {_svml_usable()} (llvmlite.binding.targets.has_svml)")
    return dict(ms=times, ratio_to_floor={k: v / floor for k, v in times.items()}, agreement=agree, n_exp=n_exp)


def feature_sweep(shapes=SHAPES, repeats=20, verbose=True):
    """The core against the specialised kernel per ``(K, F)`` of ``shapes`` (with the carried
    shift), each beside the ``np.exp`` floor, interleaved (best of ``repeats``); None without
    numba, else ``{(K, F): dict(core=..., specialised=..., agreement=...)}`` (times in ms)."""
    kernels = _numba_kernels()
    if kernels is None:
        return None
    n_exp = 48 * 2 * sum(LS)
    s = np.random.default_rng(1).uniform(-10.0, 0.0, n_exp)
    out_exp = np.empty_like(s)
    result = {}
    for K, F in shapes:
        A, X, phi, reach = _workload(d=K - 1, F=F, shift=True)
        work, ends = {}, np.asarray(LS)[reach].astype(np.int64)
        core = lambda: softmax_core.prefix_moments(phi, (0,) + LS, A=A, X=X, reach=reach, shifted=True,
                                                   at_reach=True, work=work)[1]
        ref, out, kernel = core(), np.zeros((A.shape[0], A.shape[1], F)), kernels[0](K, F)
        kernel(A, X, phi, ends, out)                           # compile
        arms = {"floor": lambda: np.exp(s, out=out_exp), "core": core,
                "specialised": lambda: kernel(A, X, phi, ends, out)}
        times = {name: math.inf for name in arms}
        for _ in range(repeats):
            for name, fn in arms.items():
                times[name] = min(times[name], _best(fn, 1))
        agree = float(np.max(np.abs(out - ref)) / np.max(np.abs(ref)))
        result[(K, F)] = dict(times, agreement=agree)
        if verbose:
            f = times["floor"]
            print(f"  K = {K}, F = {F:2d}: floor {f:.3f} ms, core {times['core'] / f:5.2f}x the floor, specialised "
                  f"{times['specialised'] / f:5.2f}x ({times['core'] / times['specialised']:.2f}x the core's speed), "
                  f"agrees to {agree:.1e}")
    return result


if __name__ == "__main__":  # pragma: no cover
    bench_compiled()
    print("feature sweep: the core against a specialised compiled kernel per feature count (C3 prompts, carried shift):")
    if feature_sweep() is None:
        print("  (numba not installed)")
