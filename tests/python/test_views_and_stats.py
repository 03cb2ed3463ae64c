"""Strided views and saved statistics at the Python surface.

q, k, v are read in place through their strides: a (B, heads, T, D) array transposed to
(B, T, heads, D) and a slice of a fused QKV buffer give bit-identical results to contiguous
copies, and the gradients come back with their input's layout. The forwards return their saved
statistics and the backwards take them back without running a forward (counted by
diffattn.kernel_calls())."""

import numpy as np
import pytest

import diffattn


def transposed(x):
    """The same values as x (B, T, heads, D), laid out (B, heads, T, D) in memory."""
    return np.ascontiguousarray(x.transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3)


def problem(B=2, T=67, H=4, G=2, D=16, Dv=32, shared=False, per_token=False, seed=0):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((B, T, 2 * H, D), dtype=np.float32)
    k = rng.standard_normal((B, T, G if shared else 2 * G, D), dtype=np.float32)
    v = rng.standard_normal((B, T, G, Dv), dtype=np.float32)
    lam = (rng.uniform(0.1, 0.9, (B, T, H)) if per_token else rng.uniform(0.1, 0.9, (H,)))
    dout = rng.standard_normal((B, T, H, Dv), dtype=np.float32)
    return q, k, v, lam.astype(np.float32), dout


@pytest.mark.parametrize("backend", ["fused", "reference"])
@pytest.mark.parametrize("shared,per_token", [(False, False), (True, True)], ids=["v1", "v2"])
def test_transposed_views_are_bit_identical(backend, shared, per_token):
    q, k, v, lam, dout = problem(shared=shared, per_token=per_token)
    qt, kt, vt = transposed(q), transposed(k), transposed(v)
    assert not qt.flags.c_contiguous and np.array_equal(qt, q)
    want = diffattn.diff_attention(q, k, v, lam, causal=True, backend=backend)
    got = diffattn.diff_attention(qt, kt, vt, lam, causal=True, backend=backend)
    assert np.array_equal(got, want)
    gw = diffattn.diff_attention_backward(q, k, v, lam, dout, causal=True, backend=backend)
    gg = diffattn.diff_attention_backward(qt, kt, vt, lam, dout, causal=True, backend=backend)
    for name, a, b, x in zip(("dq", "dk", "dv", "dlam"), gg, gw, (qt, kt, vt, lam)):
        assert np.array_equal(a, b), name
        assert a.strides == x.strides, name  # the gradient takes its input's layout


@pytest.mark.parametrize("backend", ["fused", "reference"])
def test_standard_attention_on_transposed_views_and_decode(backend):
    rng = np.random.default_rng(3)
    for Tq, Tk in ((45, 45), (1, 700), (3, 700)):  # tiled, then the split-KV decode path
        q = rng.standard_normal((1, Tq, 6, 8), dtype=np.float32)
        k = rng.standard_normal((1, Tk, 2, 8), dtype=np.float32)
        v = rng.standard_normal((1, Tk, 2, 8), dtype=np.float32)
        want = diffattn.attention(q, k, v, causal=True, backend=backend)
        got = diffattn.attention(transposed(q), transposed(k), transposed(v), causal=True,
                                 backend=backend)
        assert np.array_equal(got, want), (Tq, Tk)


def test_fused_qkv_buffer_slices_are_read_in_place():
    q, k, v, lam, dout = problem(B=1, T=50, H=2, G=1, D=8, Dv=16)
    # One (B, T, n_proj) activation buffer: q, k, v side by side in every row.
    nq, nk, nv = q.shape[2] * 8, k.shape[2] * 8, v.shape[2] * 16
    buf = np.concatenate([q.reshape(1, 50, nq), k.reshape(1, 50, nk), v.reshape(1, 50, nv)], -1)
    qs = buf[:, :, :nq].reshape(1, 50, 4, 8)
    ks = buf[:, :, nq:nq + nk].reshape(1, 50, 2, 8)
    vs = buf[:, :, nq + nk:].reshape(1, 50, 1, 16)
    assert np.shares_memory(qs, buf) and not qs.flags.c_contiguous
    assert np.array_equal(diffattn.diff_attention(qs, ks, vs, lam, causal=True),
                          diffattn.diff_attention(q, k, v, lam, causal=True))
    got = diffattn.diff_attention_backward(qs, ks, vs, lam, dout, causal=True)
    want = diffattn.diff_attention_backward(q, k, v, lam, dout, causal=True)
    for a, b in zip(got, want):
        assert np.array_equal(a, b)


@pytest.mark.parametrize("backend", ["fused", "reference"])
def test_backward_with_saved_statistics_runs_no_forward(backend):
    q, k, v, lam, dout = problem(shared=True, per_token=True)
    out, lse, o2 = diffattn.diff_attention(q, k, v, lam, causal=True, backend=backend,
                                           return_stats=True)
    assert np.array_equal(out, diffattn.diff_attention(q, k, v, lam, causal=True, backend=backend))
    assert lse.shape == (2, 8, 67) and o2.shape == out.shape
    before = diffattn.kernel_calls()
    got = diffattn.diff_attention_backward(q, k, v, lam, dout, causal=True, backend=backend,
                                           out=out, lse=lse, o2=o2)
    after = diffattn.kernel_calls()
    assert after["forward"] == before["forward"] and after["decode"] == before["decode"]
    assert after["backward"] == before["backward"] + 1
    want = diffattn.diff_attention_backward(q, k, v, lam, dout, causal=True, backend=backend)
    assert diffattn.kernel_calls()["forward"] == after["forward"] + 1  # without them: one forward
    for a, b in zip(got, want):
        assert np.array_equal(a, b)

    qs, ks, vs = q[:, :, :4].copy(), k.copy(), v[..., :16].copy()
    out, lse = diffattn.attention(qs, ks, vs, causal=True, backend=backend, return_stats=True)
    before = diffattn.kernel_calls()["forward"]
    got = diffattn.attention_backward(qs, ks, vs, dout[:, :, :, :16].copy(), causal=True,
                                      backend=backend, out=out, lse=lse)
    assert diffattn.kernel_calls()["forward"] == before
    want = diffattn.attention_backward(qs, ks, vs, dout[:, :, :, :16].copy(), causal=True,
                                       backend=backend)
    for a, b in zip(got, want):
        assert np.array_equal(a, b)


def test_saved_statistics_are_checked():
    q, k, v, lam, dout = problem(B=1, T=9, H=2, G=1, D=4, Dv=8)
    out, lse, o2 = diffattn.diff_attention(q, k, v, lam, return_stats=True)
    with pytest.raises(ValueError, match=r"pass all of the forward's saved statistics \(out, lse, o2\)"):
        diffattn.diff_attention_backward(q, k, v, lam, dout, out=out, lse=lse)
    with pytest.raises(ValueError, match=r"lse has shape \(1, 4, 8\), expected"):
        diffattn.diff_attention_backward(q, k, v, lam, dout, out=out, lse=lse[:, :, :8].copy(),
                                         o2=o2)
    with pytest.raises(ValueError, match=r"o2 must be float32"):
        diffattn.diff_attention_backward(q, k, v, lam, dout, out=out, lse=lse,
                                         o2=o2.astype(np.float64))


def test_strided_dout_is_accepted():
    q, k, v, lam, dout = problem(B=1, T=30, H=2, G=1, D=8, Dv=16)
    got = diffattn.diff_attention_backward(q, k, v, lam, transposed(dout), causal=True)
    want = diffattn.diff_attention_backward(q, k, v, lam, dout, causal=True)
    for a, b in zip(got, want):
        assert np.array_equal(a, b)


def test_overlapping_gradient_layout_is_an_error():
    q, k, v, lam, dout = problem(B=1, T=10, H=2, G=1, D=8, Dv=16)
    # A broadcast view reads fine (each row the same keys) but its gradient would overlap.
    kb = np.broadcast_to(k[:, :1], k.shape)
    out = diffattn.diff_attention(q, kb, v, lam)
    assert np.array_equal(out, diffattn.diff_attention(q, np.ascontiguousarray(kb), v, lam))
    with pytest.raises(ValueError, match=r"dk \(k's layout\) has shape .* its elements overlap"):
        diffattn.diff_attention_backward(q, kb, v, lam, dout)
