"""The one softmax-moments core against a plain per-prompt reference (every prompt's softmax
computed from scratch, max-subtracted over the whole prompt)."""
import numpy as np
import pytest

from sfxlin import softmax_core as core


def _naive(phi, edges, s):
    """``P_L / P_L[0]``-free reference: ``sum_t softmax(s[:L])_t phi_t`` and ``log sum exp`` per prompt."""
    G, C, _ = s.shape
    out, lse = [], []
    for L in edges[1:]:
        x = s[..., :L]
        top = x.max(axis=-1, keepdims=True)
        e = np.exp(x - top)
        z = e.sum(axis=-1)
        out.append(np.einsum("gct,gft->gcf", e, phi[..., :L]) / z[..., None])
        lse.append(top[..., 0] + np.log(z))
    return np.stack(out), np.stack(lse)


def _problem(rng, G=5, C=4, K=3, F=4, T=300, scale=1.0):
    A = scale * rng.standard_normal((G, C, K))
    X = rng.standard_normal((G, K, T))
    phi = np.concatenate([np.ones((G, 1, T)), rng.standard_normal((G, F - 1, T))], axis=1)
    return A, X, phi


@pytest.mark.parametrize("scale", [0.1, 3.0, 300.0])
@pytest.mark.parametrize("cache_bytes", [None, 200, 4000])
def test_prefix_moments_match_the_per_prompt_softmax(scale, cache_bytes):
    rng = np.random.default_rng(1)
    A, X, phi = _problem(rng, scale=scale)
    edges = (0, 1, 7, 50, 300)
    M, P = core.prefix_moments(phi, edges, A=A, X=X, cache_bytes=cache_bytes)
    ref, lse = _naive(phi, edges, A @ X)
    np.testing.assert_allclose(P / P[..., :1], ref, rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(M + np.log(P[..., 0]), lse, rtol=1e-13, atol=1e-12 * scale)
    assert np.all(P[..., 0] >= 1.0)                      # every normaliser >= 1 (max-shifted)


def test_given_logits_equal_the_coefficient_path_bit_for_bit():
    rng = np.random.default_rng(2)
    A, X, phi = _problem(rng)
    edges = (0, 3, 40, 300)
    a = core.prefix_moments(phi, edges, A=A, X=X)
    b = core.prefix_moments(phi, edges, logits=np.matmul(A, X))
    np.testing.assert_allclose(b[1], a[1], rtol=1e-13)
    ref, _ = _naive(phi, edges, A @ X)
    np.testing.assert_allclose(b[1] / b[1][..., :1], ref, rtol=1e-12, atol=1e-13)


def test_reach_skips_columns_beyond_their_prompt():
    rng = np.random.default_rng(3)
    A, X, phi = _problem(rng, C=5)
    edges = (0, 4, 20, 100, 300)
    reach = np.array([0, 1, 1, 3, 3])
    M, P = core.prefix_moments(phi, edges, A=A, X=X, reach=reach)
    full_M, full_P = core.prefix_moments(phi, edges, A=A, X=X)
    for c, r in enumerate(reach):
        np.testing.assert_allclose(P[r, :, c], full_P[r, :, c], rtol=1e-13)
        np.testing.assert_array_equal(P[r:, :, c], np.broadcast_to(P[r, :, c], P[r:, :, c].shape))
    Mr, Pr = core.prefix_moments(phi, edges, A=A, X=X, reach=reach, at_reach=True)
    np.testing.assert_array_equal(Pr, P[reach, :, np.arange(5)].transpose(1, 0, 2))
    np.testing.assert_array_equal(Mr, M[reach, :, np.arange(5)].T)
    with pytest.raises(ValueError, match="non-decreasing"):
        core.prefix_moments(phi, edges, A=A, X=X, reach=reach[::-1])


def test_shifted_logits_are_exponentiated_as_given():
    rng = np.random.default_rng(4)
    A, X, phi = _problem(rng)
    edges = (0, 10, 300)
    shift = rng.uniform(-2, 2, A.shape[:2])
    Xc = np.concatenate([np.ones((X.shape[0], 1, X.shape[2])), X], axis=1)
    Ac = np.concatenate([-shift[..., None], A], axis=-1)
    M, P = core.prefix_moments(phi, edges, A=Ac, X=Xc, shifted=True, cache_bytes=800)
    assert np.all(M == 0.0)
    s = A @ X - shift[..., None]
    for B, L in enumerate(edges[1:]):
        ref = np.einsum("gct,gft->gcf", np.exp(s[..., :L]), phi[..., :L])
        np.testing.assert_allclose(P[B], ref, rtol=1e-12)


def test_a_groups_bits_do_not_depend_on_the_groups_around_it():
    # same operands, same shapes, same order: each group's products are the same whatever the chunk
    rng = np.random.default_rng(5)
    A, X, phi = _problem(rng, G=9)
    edges = (0, 16, 300)
    M, P = core.prefix_moments(phi, edges, A=A, X=X, cache_bytes=3000)
    for g in (0, 4, 8):
        Mg, Pg = core.prefix_moments(phi[g:g + 1], edges, A=A[g:g + 1], X=X[g:g + 1], cache_bytes=3000)
        np.testing.assert_array_equal(Pg[:, 0], P[:, g])
        np.testing.assert_array_equal(Mg[:, 0], M[:, g])


def test_workspace_reuse_changes_nothing():
    rng = np.random.default_rng(6)
    A, X, phi = _problem(rng)
    work = {}
    a = core.prefix_moments(phi, (0, 30, 300), A=A, X=X, work=work)
    b = core.prefix_moments(phi, (0, 30, 300), A=A, X=X, work=work)
    assert work
    np.testing.assert_array_equal(a[1], b[1])


@pytest.mark.parametrize("bad, match", [
    (dict(edges=(0, 5, 5)), "strictly increasing"),
    (dict(edges=(1, 5)), "strictly increasing"),
    (dict(edges=(0, 301)), "up to 300"),
    (dict(A=None), "either the logits"),
])
def test_bad_arguments_are_refused(bad, match):
    rng = np.random.default_rng(7)
    A, X, phi = _problem(rng)
    kw = dict(edges=(0, 300), A=A, X=X)
    kw.update(bad)
    edges = kw.pop("edges")
    with pytest.raises(ValueError, match=match):
        core.prefix_moments(phi, edges, **kw)


def test_an_implicit_constant_feature_equals_a_stored_one():
    rng = np.random.default_rng(8)
    A, X, phi = _problem(rng)
    edges = (0, 5, 60, 300)
    M1, P1 = core.prefix_moments(phi, edges, A=A, X=X)
    M2, P2 = core.prefix_moments(phi[:, 1:], edges, A=A, X=X, ones=True)
    np.testing.assert_array_equal(M2, M1)
    np.testing.assert_allclose(P2, P1, rtol=1e-13)


def _naive_weighted(phi, edges, s, omega):
    """Plain per-prompt sums ``sum_t exp(s_t - max s) omega_t phi_t`` (``omega (G, C, nw, T)``, the
    first weight 1) and the max, prompt by prompt."""
    P, top = [], []
    for L in edges[1:]:
        m = s[..., :L].max(axis=-1)
        e = np.exp(s[..., :L] - m[..., None])
        P.append(np.einsum("gct,gcwt,gft->gcwf", e, omega[..., :L], phi[..., :L]))
        top.append(m)
    return np.stack(top), np.stack(P)


@pytest.mark.parametrize("shifted", [False, True])
@pytest.mark.parametrize("cache_bytes", [None, 300, 5000])
def test_weighted_moments_match_per_prompt_sums(shifted, cache_bytes):
    """Column weights (coefficients on X, a weight per column and token) and row weights (per
    token) give the sums of exp(s) omega phi, with the plain sums, for every prompt: against a
    plain loop over prompts. Blocks split into sub-blocks (small cache_bytes) merge online."""
    rng = np.random.default_rng(7)
    G, C, K, F, T = 4, 5, 3, 4, 90
    A, X, phi = _problem(rng, G=G, C=C, K=K, F=F, T=T, scale=2.0)
    Bw = rng.standard_normal((G, C, 2, K))
    Rw = rng.standard_normal((G, 1, T))
    edges = (0, 3, 20, 90)
    s = np.einsum("gck,gkt->gct", A, X)
    omega = np.concatenate([np.ones((G, C, 1, T)), np.einsum("gcsk,gkt->gcst", Bw, X),
                            np.broadcast_to(Rw[:, None], (G, C, 1, T))], axis=2)
    M, P = core.prefix_moments(phi, edges, A=A, X=X, col_weights=Bw, row_weights=Rw, shifted=shifted,
                               cache_bytes=cache_bytes)
    assert P.shape == (3, G, C, 4, F)
    top, ref = _naive_weighted(phi, edges, s, omega)
    if shifted:   # exponentiated as given (no shift): the plain sums times exp(max)
        ref = ref * np.exp(top)[..., None, None]
        np.testing.assert_array_equal(M, 0)
    else:
        np.testing.assert_allclose(M, top, rtol=1e-14)
    np.testing.assert_allclose(P, ref, rtol=1e-13, atol=1e-13 * np.abs(ref).max())
    plain = core.prefix_moments(phi, edges, A=A, X=X, shifted=shifted, cache_bytes=cache_bytes)[1]
    np.testing.assert_allclose(P[..., 0, :], plain, rtol=1e-13, atol=1e-13 * np.abs(plain).max())


def test_weighted_moments_with_reach_and_ones():
    """``at_reach`` keeps each column's own prompt; ``ones`` prepends the sum of each weighted row."""
    rng = np.random.default_rng(8)
    A, X, phi = _problem(rng, G=3, C=4, K=3, F=3, T=60)
    Bw = rng.standard_normal((3, 4, 1, 3))
    Rw = rng.standard_normal((3, 2, 60))
    edges, reach = (0, 10, 60), np.array([0, 0, 1, 1])
    _, full = core.prefix_moments(phi, edges, A=A, X=X, col_weights=Bw, row_weights=Rw, cache_bytes=700)
    M, P = core.prefix_moments(phi, edges, A=A, X=X, col_weights=Bw, row_weights=Rw, reach=reach, at_reach=True,
                               cache_bytes=700)
    assert P.shape == (3, 4, 4, 3)
    own = full[reach, :, np.arange(4)].transpose(1, 0, 2, 3)
    np.testing.assert_allclose(P, own, rtol=1e-13, atol=1e-13 * np.abs(own).max())
    _, with_one = core.prefix_moments(phi[:, 1:], edges, A=A, X=X, col_weights=Bw, row_weights=Rw, ones=True,
                                      cache_bytes=700)
    np.testing.assert_allclose(with_one, full, rtol=1e-13, atol=1e-13 * np.abs(full).max())


def test_a_groups_weighted_bits_do_not_depend_on_the_groups_around_it():
    rng = np.random.default_rng(9)
    A, X, phi = _problem(rng, G=6, C=3, K=4, F=5, T=200)
    Bw, Rw = rng.standard_normal((6, 3, 1, 4)), rng.standard_normal((6, 1, 200))
    edges = (0, 40, 200)
    M, P = core.prefix_moments(phi, edges, A=A, X=X, col_weights=Bw, row_weights=Rw, cache_bytes=20000)
    for g in range(6):
        Mg, Pg = core.prefix_moments(phi[g:g + 1], edges, A=A[g:g + 1], X=X[g:g + 1], col_weights=Bw[g:g + 1],
                                     row_weights=Rw[g:g + 1], cache_bytes=20000)
        np.testing.assert_array_equal(Pg[:, 0], P[:, g])
        np.testing.assert_array_equal(Mg[:, 0], M[:, g])


@pytest.mark.parametrize("kw, match", [
    (dict(col_weights=np.ones((2, 3, 1, 5))), "col_weights must be"),
    (dict(row_weights=np.ones((2, 1, 10))), "row_weights must be"),
    (dict(col_weights=np.ones((2, 3, 1, 4)), logits=np.zeros((2, 3, 40)), A=None, X=None), "coefficients on X"),
])
def test_bad_weights_are_refused(kw, match):
    rng = np.random.default_rng(10)
    A, X, phi = _problem(rng, G=2, C=3, K=4, F=2, T=40)
    args = dict(A=A, X=X)
    args.update(kw)
    with pytest.raises(ValueError, match=match):
        core.prefix_moments(phi, (0, 40), **args)


def test_a_given_shift_is_the_shift_folded_into_a_constant_row():
    """``shift`` subtracts a constant per column before the exponential: the sums of a shift folded
    into the coefficient of a constant feature row, to rounding (plain and weighted sums)."""
    rng = np.random.default_rng(11)
    A, X, phi = _problem(rng, G=3, C=4, K=3, F=3, T=120, scale=2.0)
    shift = rng.uniform(-3, 3, (3, 4))
    Bw, Rw = rng.standard_normal((3, 4, 1, 3)), rng.standard_normal((3, 1, 120))
    A1 = np.concatenate([-shift[..., None], A], axis=-1)
    X1 = np.concatenate([np.ones((3, 1, 120)), X], axis=1)
    Bw1 = np.concatenate([np.zeros((3, 4, 1, 1)), Bw], axis=-1)
    for kw, kw1 in ((dict(), dict()), (dict(col_weights=Bw, row_weights=Rw), dict(col_weights=Bw1, row_weights=Rw))):
        M, P = core.prefix_moments(phi, (0, 30, 120), A=A, X=X, shift=shift, cache_bytes=900, **kw)
        M1, P1 = core.prefix_moments(phi, (0, 30, 120), A=A1, X=X1, shifted=True, cache_bytes=900, **kw1)
        np.testing.assert_array_equal(M, 0)
        np.testing.assert_allclose(P, P1, rtol=1e-13, atol=1e-13 * np.abs(P1).max())
    with pytest.raises(ValueError, match="shift must be"):
        core.prefix_moments(phi, (0, 120), A=A, X=X, shift=shift[:, :2])


@pytest.mark.parametrize("shifted", [False, True])
def test_merged_short_blocks_give_each_columns_own_prompt(shifted):
    """``merge_tokens``: short blocks evaluated as one range, a column's logits past its prompt masked:
    the sums of each column's own prompt (to rounding), weighted ones included; refused without
    ``at_reach``."""
    rng = np.random.default_rng(12)
    A, X, phi = _problem(rng, G=3, C=6, K=3, F=3, T=100, scale=1.5)
    Bw, Rw = rng.standard_normal((3, 6, 1, 3)), rng.standard_normal((3, 1, 100))
    edges, reach = (0, 4, 9, 20, 100), np.array([0, 0, 1, 2, 3, 3])
    kw = dict(A=A, X=X, col_weights=Bw, row_weights=Rw, reach=reach, at_reach=True, shifted=shifted)
    M0, P0 = core.prefix_moments(phi, edges, **kw)
    M1, P1 = core.prefix_moments(phi, edges, merge_tokens=20, **kw)
    assert core._spans(np.array(edges), np.searchsorted(reach, np.arange(4)), 6, 3, core.CACHE_BYTES, 20) == [
        (0, 20, 0), (20, 100, 3)]
    if shifted:
        np.testing.assert_array_equal(M1, 0)
    else:
        np.testing.assert_allclose(M1, M0, rtol=1e-14)
    np.testing.assert_allclose(P1, P0, rtol=1e-13, atol=1e-13 * np.abs(P0).max())
    with pytest.raises(ValueError, match="merge_tokens needs at_reach"):
        core.prefix_moments(phi, edges, A=A, X=X, merge_tokens=20)


def test_hold_tokens_sizes_the_sub_blocks_with_the_tokens_rows_and_keeps_the_sums():
    """``hold_tokens``: a long block of few columns is split so that the tokens' rows (X and phi) fit
    ``cache_bytes`` beside the columns' rows: 12,800 bytes hold 400 tokens of the 2 columns' 2 rows
    each alone, 100 with the 6 + 6 rows of the tokens. The sums are those of a plain loop over the
    prompts, and a group's bits do not depend on the groups around it."""
    rng = np.random.default_rng(10)
    G, C, K, F, T = 5, 2, 6, 6, 1000
    A, X, phi = _problem(rng, G=G, C=C, K=K, F=F, T=T)
    Rw = rng.standard_normal((G, 1, T))
    edges, reach = (0, 200, 1000), np.array([1, 1])
    s = np.einsum("gck,gkt->gct", A, X)
    omega = np.concatenate([np.ones((G, C, 1, T)), np.broadcast_to(Rw[:, None], (G, C, 1, T))], axis=2)
    _, ref = _naive_weighted(phi, edges, s, omega)
    for hold, tokens in ((False, 400), (True, 100)):
        work = {}
        M, P = core.prefix_moments(phi, edges, A=A, X=X, row_weights=Rw, reach=reach, at_reach=True,
                                   cache_bytes=12_800, hold_tokens=hold, work=work)
        assert max(shape[-1] for tag, shape in work if tag == "rows") == tokens
        own = ref[-1]
        np.testing.assert_allclose(P, own, rtol=1e-13, atol=1e-13 * np.abs(own).max())
        for g in range(G):
            _, Pg = core.prefix_moments(phi[g:g + 1], edges, A=A[g:g + 1], X=X[g:g + 1], row_weights=Rw[g:g + 1],
                                        reach=reach, at_reach=True, cache_bytes=12_800, hold_tokens=hold)
            np.testing.assert_array_equal(Pg[0], P[g])
