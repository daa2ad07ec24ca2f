"""The one softmax-moments core: un-normalised moments of softmax weights over nested prompts.

Every softmax in the package (attention at nested prompt lengths, the kernels' prefix
evaluations, the C3 training engine, the C2 gradient gap, the off-block curvature, the per-L
risk and gradient, and the exact tilted mean of an empirical law) is one computation:

    groups ``g`` share their tokens ``t``; column ``c`` of a group has the logits
    ``s[g, c, t] = A[g, c] . X[g, :, t]`` (or given logits ``s``) and the caller's features
    ``phi[g, :, t]``; the tokens are split into the blocks ``[L_{b-1}, L_b)`` of the nested
    prompt lengths ``edges = (0, L_1, ..., L_n)``; then

        block sums    S_b[g, c] = sum_{t in block b} exp(s[g, c, t] - m_b[g, c]) phi[g, :, t],
        prefix sums   P_B[g, c] = sum_{b <= B} exp(m_b - M_B) S_b,   M_B = max_{b <= B} m_b,

    ``m_b`` the block's largest logit (online softmax: every exponent is <= 0, every normaliser
    >= 1), or 0 when the caller has already shifted the logits (``shifted=True``: a carried
    shift folded into ``A`` as the coefficient of a constant feature, so the products are the
    only pass over the tokens).

The normalised moments are ``P_B[..., f] / P_B[..., 0]`` when ``phi[0] = 1``; the log-sum-exp of
the logits of prompt ``B`` is ``M_B + log P_B[..., 0]``. Weighted sums ``sum_t exp(s) omega_t phi_t``
come from the same pass: a weight per column and token that is a product like the logits
(``omega[g, c, t] = B[g, c] . X[g, :, t]``), or one per token shared by the columns; their rows are
multiplied by the exponentials and join the moments' product.

How it is computed (float64, numpy): per block, the logits of a chunk of groups are one batched
matrix product, exponentiated in place, and the moments a second product with the features.
A block is split into token sub-blocks (merged with the same online rule) so that the rows of its
active columns fit in ``cache_bytes``, and its groups into chunks whose working set (those rows,
the tokens' coefficients and features) does. Columns are split so that no single BLAS
product exceeds ``gemm_mnk`` (OpenBLAS runs smaller products on one thread). The split of a
block depends only on its column count, token count and feature counts, never on the chunk of
groups: a group's bits are the same whatever the number of groups around it.

Columns that need only the first prompts (``reach[c]``: the last block column ``c`` needs; the
C3 engine, whose parameters differ per prompt length) are skipped beyond it: ``reach`` must be
non-decreasing, so that the columns active in block ``b`` are a suffix. A column's prefix sums
past its reach stay those of its reach; ``at_reach`` returns only those.

Every logit it exponentiates is counted, per thread (:func:`exponentials`): the engine records
the count of each cell next to its seconds (``cell_exponentials``), so a run's distance from the
``np.exp`` floor can be read from its file (``python -m sfxlin.benchmarks.cell_costs``).

Why numpy and not a compiled kernel: measured side by side in one run (docs/performance.md,
section 9, ``python -m sfxlin.benchmarks.compiled_kernel``), a numba kernel fusing logits, an
exponential and the moments in one pass, generated per feature count, is 1.8-2.6x this core's
speed up to 10 features on one machine (1.2x on another) and no faster from 15; it would add a
208 MB compiler, a compile per process and a second code path for the C3 engine's moments.
"""
from __future__ import annotations

import threading

import numpy as np

__all__ = ["exponentials", "prefix_moments", "normalised"]

#: bytes of logits per batched product (keeps the exp / product working set in cache)
CACHE_BYTES = 1 << 20
#: largest M * N * K of one BLAS product: OpenBLAS runs smaller products single-threaded
GEMM_MNK = 200_000
#: bytes of one chunk's working set (its rows, the tokens' coefficients and features): groups per chunk
CHUNK_BYTES = 1 << 20


_tally = threading.local()


def exponentials() -> int:
    """How many logits :func:`prefix_moments` has exponentiated in the calling thread since it
    started: a cost meter (a cell's count is the difference before and after its kernel; every
    softmax of the package but the JAX models' runs through this core)."""
    return getattr(_tally, "n", 0)


def _buffer(work, tag, shape):
    """A float64 array of ``shape`` from the caller's workspace ``work`` (a dict), the one of ``tag``
    reused across calls of the same shape; a new array when ``work`` is None."""
    if work is None:
        return np.empty(shape)
    buf = work.get((tag, shape))
    if buf is None:
        buf = work[tag, shape] = np.empty(shape)
    return buf


def _check(phi, edges, A, X, logits, reach, col_weights, row_weights, shift):
    phi = np.asarray(phi, dtype=float)
    if phi.ndim != 3:
        raise ValueError(f"phi must be (groups, features, tokens), got shape {phi.shape}")
    G, F, T = phi.shape
    edges = np.asarray(edges, dtype=np.int64)
    if edges.ndim != 1 or edges.size < 2 or edges[0] != 0 or np.any(np.diff(edges) <= 0) or edges[-1] > T:
        raise ValueError(f"edges must be (0, L_1, ..., L_n) strictly increasing up to {T} tokens, got {edges.tolist()}")
    if (logits is None) == (A is None):
        raise ValueError("give either the logits or their coefficients A with features X")
    if logits is not None:
        logits = np.asarray(logits, dtype=float)
        if logits.ndim != 3 or logits.shape[0] != G or logits.shape[2] < edges[-1]:
            raise ValueError(f"logits must be ({G}, columns, >= {edges[-1]}), got {logits.shape}")
        C = logits.shape[1]
        if col_weights is not None:
            raise ValueError("col_weights are coefficients on X: give the logits' coefficients A with features X")
    else:
        A, X = np.asarray(A, dtype=float), np.asarray(X, dtype=float)
        if A.ndim != 3 or A.shape[0] != G or X.ndim != 3 or X.shape[:2] != (G, A.shape[2]) or X.shape[2] < edges[-1]:
            raise ValueError(f"A must be ({G}, columns, K) and X ({G}, K, >= {edges[-1]}), got {A.shape}, {X.shape}")
        C = A.shape[1]
    if col_weights is not None:
        col_weights = np.asarray(col_weights, dtype=float)
        if col_weights.ndim != 4 or col_weights.shape[:2] != (G, C) or col_weights.shape[3] != A.shape[2]:
            raise ValueError(f"col_weights must be ({G}, {C}, S, {A.shape[2]}), got {col_weights.shape}")
    if row_weights is not None:
        row_weights = np.asarray(row_weights, dtype=float)
        if row_weights.ndim != 3 or row_weights.shape[0] != G or row_weights.shape[2] < edges[-1]:
            raise ValueError(f"row_weights must be ({G}, R, >= {edges[-1]}), got {row_weights.shape}")
    if shift is not None:
        shift = np.asarray(shift, dtype=float)
        if shift.shape != (G, C):
            raise ValueError(f"shift must be ({G}, {C}), one per group and column, got {shift.shape}")
    nb = edges.size - 1
    if reach is None:
        first = np.zeros(nb, dtype=np.int64)
    else:
        reach = np.asarray(reach)
        if reach.shape != (C,) or np.any(np.diff(reach) < 0) or reach.min() < 0 or reach.max() >= nb:
            raise ValueError(f"reach must be {C} non-decreasing block indices in [0, {nb}), got {reach!r}")
        first = np.searchsorted(reach, np.arange(nb), side="left")
    return phi, edges, A, X, logits, C, first, col_weights, row_weights, shift


def _spans(edges, first, C, nw, cache_bytes, merge_tokens):
    """The token ranges evaluated together: ``(lo, hi, b)`` with ``b`` the first block of the range.
    Consecutive blocks join while the range has at most ``merge_tokens`` tokens and the rows of its
    columns still fit one sub-block (``cache_bytes``); otherwise a range is one block."""
    spans, b, nb = [], 0, edges.size - 1
    while b < nb:
        lo, hi, e = int(edges[b]), int(edges[b + 1]), b + 1
        while e < nb and edges[e + 1] - lo <= min(merge_tokens, cache_bytes // (8 * (C - int(first[b])) * nw)):
            hi, e = int(edges[e + 1]), e + 1
        spans.append((lo, hi, b))
        b = e
    return spans


def prefix_moments(phi, edges, *, A=None, X=None, logits=None, reach=None, shifted=False, at_reach=False,
                   ones=False, col_weights=None, row_weights=None, shift=None, merge_tokens=0, cache_bytes=None,
                   gemm_mnk=None, hold_tokens=False, work=None):
    """Running max logit and un-normalised softmax sums of every nested prompt (module doc).

    ``phi (G, F, T)`` features; logits from ``A (G, C, K)`` and ``X (G, K, T)``, or given as
    ``logits (G, C, T)``; ``edges = (0, L_1, ..., L_n)``; ``reach (C,)`` optional (non-decreasing:
    column ``c`` needs the blocks ``0..reach[c]``); ``shifted``: exponentiate the logits as given
    (the running max is then 0) instead of shifting each block by its own max, or ``shift (G, C)``:
    exponentiate the logits less the column's shift (a carried shift where ``X`` has no constant row
    to fold it into ``A``; implies ``shifted``); ``ones``: feature
    0 is the constant 1, not stored in ``phi`` (``P`` then has ``F + 1`` features, the first the
    sum of the weights), so a caller's tokens can be passed as a view; ``work``: a dict the caller
    keeps to reuse the buffers across calls.

    Weighted moments: ``col_weights (G, C, S, K)``, coefficients of a weight per column and token
    ``omega_s[g, c, t] = col_weights[g, c, s] . X[g, :, t]`` (a product of the logits' shape), and
    ``row_weights (G, R, T)``, weights per token shared by a group's columns, give besides the sums
    of ``exp(s) phi`` those of ``exp(s) omega phi``: ``P`` then has an axis of ``1 + S + R`` sums
    before the features (the plain one, the ``S`` column-weighted, the ``R`` row-weighted), all with
    the same shift and the same online merge. (``E_p[x (x . v)]`` for a ``v`` per column costs
    ``2 K`` multiply-adds a logit this way, not a feature per product ``x_i x_j``.)

    ``hold_tokens``: a token sub-block is also sized so that its tokens' own rows (``X`` and ``phi``)
    fit ``cache_bytes`` beside its columns' rows, not the columns' rows alone: a long block with few
    columns is then not one sub-block of a single column per product, whose products stream the tokens
    from memory once per column and product, but sub-blocks whose tokens the two products of all its
    columns read from cache (the sums are merged in another order: other last bits).

    ``merge_tokens`` (with ``at_reach``): consecutive short blocks, up to this many tokens together,
    are one range of the products, each column's logits past its own prompt masked out (fewer, larger
    products; the sums are then added in another order, so the last bits differ from those of
    ``merge_tokens = 0``).

    Returns ``(M (nb, G, C), P (nb, G, C, [1 + S + R,] F))``, the prefixes of every block edge (a
    column's values past its reach are those of its reach), or with ``at_reach`` only each column's
    own prefix: ``(M (G, C), P (G, C, [1 + S + R,] F))``.

    The blocks are merged into running sums as they are computed (``P <- P exp(M - M') +
    S_b exp(m_b - M')``, ``M' = max(M, m_b)``), so the cost is that of the block sums."""
    phi, edges, A, X, logits, C, first, col_weights, row_weights, shift = _check(
        phi, edges, A, X, logits, reach, col_weights, row_weights, shift)
    shifted = shifted or shift is not None
    cache_bytes = CACHE_BYTES if cache_bytes is None else int(cache_bytes)
    gemm_mnk = GEMM_MNK if gemm_mnk is None else int(gemm_mnk)
    G, F, _ = phi.shape
    K = 0 if A is None else A.shape[2]
    S = 0 if col_weights is None else col_weights.shape[2]
    R = 0 if row_weights is None else row_weights.shape[1]
    nw = 1 + S + R                                            # sums per column: plain, column- and row-weighted
    nb = edges.size - 1
    F_out = F + bool(ones)
    if merge_tokens and not at_reach:
        raise ValueError("merge_tokens needs at_reach: merged blocks have no prefix sums at their inner edges")
    limit = edges[1:][reach] if reach is not None else np.full(C, edges[-1])   # a column's prompt length
    if S:   # the logits' and the column weights' coefficients, stacked: one product gives both
        coef = np.concatenate([A[:, :, None], col_weights], axis=2)   # (G, C, 1 + S, K)
    run_m, run_P = np.zeros((G, C)), np.zeros((G, nw, C, F_out))
    if at_reach:
        out_m, out_P = run_m, run_P          # a column stops changing after its reach
    else:
        out_m, out_P = np.empty((nb, G, C)), np.empty((nb, G, nw, C, F_out))
    for lo, hi, b in _spans(edges, first, C, nw, cache_bytes, merge_tokens):
        c0 = int(first[b])
        Cb = C - c0
        short = [j for j in range(c0, C) if limit[j] < hi]   # (merged blocks) columns whose prompt ends inside
        rows = Cb * nw + (K + F if hold_tokens else 0)                                      # rows a token holds
        step = int(max(1, min(hi - lo, cache_bytes // (8 * rows))))                            # tokens per sub-block
        cc = int(max(1, min(Cb, gemm_mnk // (step * max(F * nw, K * (1 + S), 1)))))           # columns per product
        gc = int(max(1, min(G, CHUNK_BYTES // (8 * step * (cc * nw + F + K)))))                # groups per chunk
        for t0 in range(lo, hi, step):
            t1 = min(hi, t0 + step)
            for j0 in range(c0, C, cc):
                j1 = min(C, j0 + cc)
                m = j1 - j0
                for g0 in range(0, G, gc):
                    g1 = min(G, g0 + gc)
                    w = _buffer(work, "rows", (g1 - g0, nw * m, t1 - t0))   # rows: exp(s) | column- | row-weighted
                    s = w[:, :m]
                    if logits is not None:
                        s[...] = logits[g0:g1, j0:j1, t0:t1]
                    elif S:
                        ab = coef[g0:g1, j0:j1].transpose(0, 2, 1, 3).reshape(g1 - g0, (1 + S) * m, K)
                        np.matmul(ab, X[g0:g1, :, t0:t1], out=w[:, :(1 + S) * m])
                    else:
                        np.matmul(A[g0:g1, j0:j1], X[g0:g1, :, t0:t1], out=s)
                    if shift is not None:
                        s -= shift[g0:g1, j0:j1, None]
                    if not shifted:
                        for j in short:              # past the column's prompt: out of the max
                            if j0 <= j < j1:
                                s[:, j - j0, limit[j] - t0:] = -np.inf
                        mx = s.max(axis=-1)
                        s -= mx[..., None]
                    np.exp(s, out=s)
                    for j in short:                  # past the column's prompt: no weight
                        if j0 <= j < j1:
                            s[:, j - j0, limit[j] - t0:] = 0.0
                    _tally.n = getattr(_tally, "n", 0) + s.size
                    for k in range(S):
                        w[:, (1 + k) * m:(2 + k) * m] *= s
                    for k in range(R):
                        np.multiply(s, row_weights[g0:g1, k, None, t0:t1], out=w[:, (1 + S + k) * m:(2 + S + k) * m])
                    part = _buffer(work, "sums", (g1 - g0, nw * m, F_out))
                    np.matmul(w, np.swapaxes(phi[g0:g1, :, t0:t1], 1, 2), out=part[..., F_out - F:])  # (gc, nw cc, F)
                    if ones:
                        np.sum(w, axis=-1, out=part[..., 0])
                    part = part.reshape(g1 - g0, nw, m, F_out)
                    mm, P = run_m[g0:g1, j0:j1], run_P[g0:g1, :, j0:j1]
                    if shifted:
                        P += part
                    elif t0 == 0:
                        mm[...], P[...] = mx, part
                    else:                                                      # online merge
                        new = np.maximum(mm, mx)
                        P *= np.exp(mm - new)[:, None, :, None]
                        P += part * np.exp(mx - new)[:, None, :, None]
                        mm[...] = new
        if not at_reach:
            out_m[b], out_P[b] = run_m, run_P       # (one block per range without merge_tokens)
    out_P = np.moveaxis(out_P, -3, -2)                       # (..., G, C, nw, F_out)
    return out_m, (out_P if nw > 1 else out_P[..., 0, :])


def normalised(P):
    """``E_p phi_f = P[..., f] / P[..., 0]`` for ``f >= 1`` (feature 0 the constant 1)."""
    return P[..., 1:] / P[..., :1]
