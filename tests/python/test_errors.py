"""Bad input to the Python operators: a ValueError naming the tensor, the expected and the
actual shape (or dtype, or layout), never a crash or a silent conversion."""

import numpy as np
import pytest

import diffattn


def arrays(B=1, T=5, H=1, G=1, D=2, Dv=4):
    rng = np.random.default_rng(0)
    q = rng.standard_normal((B, T, 2 * H, D), dtype=np.float32)
    k = rng.standard_normal((B, T, 2 * G, D), dtype=np.float32)
    v = rng.standard_normal((B, T, G, Dv), dtype=np.float32)
    lam = np.full((H,), 0.4, np.float32)
    return q, k, v, lam


def raises(match, fn, *args, **kw):
    with pytest.raises(ValueError, match=match):
        fn(*args, **kw)


def test_wrong_rank():
    q, k, v, lam = arrays()
    raises(r"q has shape \(5, 2, 2\) \(rank 3\), expected rank 4 \(B, Tq, 2H, D\)",
           diffattn.diff_attention, q[0], k, v, lam)
    raises(r"v has shape \(5, 1, 4\) \(rank 3\)", diffattn.diff_attention, q, k, v[0], lam)


def test_mismatched_sizes():
    q, k, v, lam = arrays()
    raises(r"k has shape \(1, 5, 3, 2\), expected \(B, Tk, 2G, D\) = \(1, 5, 2, 2\)",
           diffattn.diff_attention, q, np.zeros((1, 5, 3, 2), np.float32), v, lam)
    raises(r"k has shape \(1, 4, 2, 2\)", diffattn.diff_attention, q, k[:, :4].copy(), v, lam)
    raises(r"v has shape \(2, 5, 1, 4\), expected \(B, Tk, G, Dv\) = \(1, 5, 1, 4\)",
           diffattn.diff_attention, q, k, np.zeros((2, 5, 1, 4), np.float32), lam)
    raises(r"lam has shape \(3,\), expected \(H\) = \(1,\)",
           diffattn.diff_attention, q, k, v, np.zeros(3, np.float32))
    raises(r"lam has shape \(1, 4, 1\), expected \(B, Tq, H\) = \(1, 5, 1\)",
           diffattn.diff_attention, q, k, v, np.zeros((1, 4, 1), np.float32))
    raises(r"q has shape \(1, 5, 3, 2\): its head count 3 must be even",
           diffattn.diff_attention, np.zeros((1, 5, 3, 2), np.float32), k, v, lam)
    raises(r"attention: k has shape \(1, 5, 1, 3\), expected \(B, Tk, G, D\) = \(1, 5, 1, 2\)",
           diffattn.attention, np.zeros((1, 5, 1, 2), np.float32),
           np.zeros((1, 5, 1, 3), np.float32), v)


def test_pairs_not_divisible_by_groups():
    q, k, v, lam = arrays(H=3, G=2)
    raises(r"H = 3 pairs .* is not divisible by G = 2 key/value heads", diffattn.diff_attention,
           q, k, v, lam)


def test_wrong_dtype_layout_or_type():
    q, k, v, lam = arrays()
    raises(r"diff_attention: q must be float32, got float64 array of shape \(1, 5, 2, 2\)",
           diffattn.diff_attention, q.astype(np.float64), k, v, lam)
    raises(r"lam must be float32, got float16", diffattn.diff_attention, q, k, v,
           lam.astype(np.float16))
    strided = np.zeros((1, 5, 2, 4), np.float32)[:, :, :, ::2]
    raises(r"k has strides \(40, 8, 4, 2\) .* its last dimension must be contiguous",
           diffattn.diff_attention, q, strided, v, lam)
    raises(r"q has strides .* negative strides are not supported", diffattn.diff_attention,
           q[:, ::-1], k, v, lam)
    raises(r"v must be a NumPy float32 array, got list", diffattn.diff_attention, q, k,
           v.tolist(), lam)
    raises(r"lam must be a NumPy float32 array, got float", diffattn.diff_attention, q, k, v, 0.4)


def test_nan_lambda_and_bad_options():
    q, k, v, lam = arrays()
    raises(r"lam\[0\] is nan .* lambda must be finite", diffattn.diff_attention, q, k, v,
           np.array([np.nan], np.float32))
    raises(r"mode is \"relu\", expected \"signed\" or \"clamp\"", diffattn.diff_attention, q, k,
           v, lam, mode="relu")
    raises(r"backend is \"gpu\", expected", diffattn.diff_attention, q, k, v, lam, backend="gpu")
    raises(r"scale must be finite", diffattn.diff_attention, q, k, v, lam, scale=float("inf"))


def test_backward_checks_dout():
    q, k, v, lam = arrays()
    raises(r"dout has shape \(1, 5, 1, 3\), expected \(B, Tq, H, Dv\) = \(1, 5, 1, 4\)",
           diffattn.diff_attention_backward, q, k, v, lam, np.zeros((1, 5, 1, 3), np.float32))
    raises(r"dout must be float32", diffattn.attention_backward, q[:, :, :1].copy(),
           k[:, :, :1].copy(), v, np.zeros((1, 5, 1, 4)))
