"""diffattn's operators against the independent PyTorch formulation (torch_reference.py):
forward in every mode and layout, and gradients by autograd, over awkward shapes.

Tolerances are relative to the error of the same computation done naively in float32 by
PyTorch (the float64 result is the truth), not one flat number.
"""

import zlib

import numpy as np
import pytest
import torch

import diffattn
import torch_reference as tr

EPS32 = float(np.finfo(np.float32).eps)


def check_close(name, got, truth64, naive32, floor=1e-30):
    """got must be within a few times the naive float32 error of the float64 truth.

    floor: the size of the terms the values are sums of, for tensors that cancel to exactly 0
    in exact arithmetic (dq and dk of a row with a single visible key) but not in float."""
    scale = max(float(np.abs(truth64).max()) if truth64.size else 0.0, floor)
    naive_err = float(np.abs(naive32 - truth64).max())
    err = float(np.abs(got.astype(np.float64) - truth64).max())
    bound = 8.0 * naive_err + 32.0 * EPS32 * scale
    assert err <= bound, f"{name}: max error {err:.3e} > bound {bound:.3e} (naive f32 {naive_err:.3e})"


def make(rng, B, Tq, Tk, H, G, D, Dv, shared, lam_token, lam_range=(0.1, 0.9)):
    q = rng.standard_normal((B, Tq, 2 * H, D), dtype=np.float32)
    k = rng.standard_normal((B, Tk, G if shared else 2 * G, D), dtype=np.float32)
    v = rng.standard_normal((B, Tk, G, Dv), dtype=np.float32)
    shape = (B, Tq, H) if lam_token else (H,)
    lam = rng.uniform(*lam_range, size=shape).astype(np.float32)
    return q, k, v, lam


def torch_fwd(fn, arrays, dtype, **kw):
    with torch.no_grad():
        return fn(*[torch.tensor(a, dtype=dtype) for a in arrays], **kw).numpy()


# name, B, Tq, Tk, H, G, D, Dv, shared keys (V2), lambda per token, causal
CASES = [
    ("v1_basic", 2, 16, 16, 2, 2, 8, 16, False, False, False),
    ("v1_causal", 1, 33, 33, 4, 2, 8, 16, False, False, True),
    ("v1_gqa_g1", 1, 17, 17, 4, 1, 6, 12, False, False, True),
    ("v2_shared_token_lam", 2, 19, 19, 2, 1, 8, 8, True, True, True),
    ("v2_noncausal", 1, 12, 12, 4, 4, 4, 4, True, True, False),
    ("odd_d", 1, 11, 11, 2, 1, 5, 7, False, True, True),
    ("tq_lt_tk_causal", 1, 5, 21, 2, 1, 8, 16, False, False, True),
    ("tq_gt_tk_causal", 1, 21, 5, 2, 2, 8, 8, True, True, True),
    ("tq_ne_tk", 2, 7, 13, 3, 1, 4, 8, False, True, False),
    ("t1", 1, 1, 1, 2, 1, 8, 16, False, False, True),
    ("t2", 1, 2, 2, 1, 1, 3, 6, True, False, True),
    ("t97", 1, 97, 97, 2, 1, 16, 32, False, True, True),
    ("t1025", 1, 1025, 1025, 1, 1, 8, 16, False, False, True),
    ("decode_like", 2, 1, 300, 4, 2, 16, 32, False, False, True),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("mode", ["signed", "clamp"])
def test_diff_forward_matches_torch(case, mode):
    _, B, Tq, Tk, H, G, D, Dv, shared, lam_token, causal = case
    rng = np.random.default_rng(zlib.crc32(case[0].encode()))
    arrays = make(rng, B, Tq, Tk, H, G, D, Dv, shared, lam_token)
    got = diffattn.diff_attention(*arrays, causal=causal, mode=mode)
    assert got.shape == (B, Tq, H, Dv) and got.dtype == np.float32
    truth = torch_fwd(tr.diff_attention, arrays, torch.float64, causal=causal, mode=mode)
    naive = torch_fwd(tr.diff_attention, arrays, torch.float32, causal=causal, mode=mode)
    check_close("out", got, truth, naive)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_diff_backward_matches_autograd(case):
    _, B, Tq, Tk, H, G, D, Dv, shared, lam_token, causal = case
    rng = np.random.default_rng(zlib.crc32(case[0].encode()) + 1)
    arrays = make(rng, B, Tq, Tk, H, G, D, Dv, shared, lam_token)
    dout = rng.standard_normal((B, Tq, H, Dv), dtype=np.float32)
    got = diffattn.diff_attention_backward(*arrays, dout, causal=causal)
    fn = lambda q, k, v, lam: tr.diff_attention(q, k, v, lam, causal=causal)  # noqa: E731
    truth = tr.grads(fn, arrays, dout)
    # The naive float32 run: autograd in float32.
    xs = [torch.tensor(a, requires_grad=True) for a in arrays]
    (fn(*xs) * torch.tensor(dout)).sum().backward()
    naive = [x.grad.numpy().astype(np.float64) for x in xs]
    terms = max(float(np.abs(t).max()) for t in truth[:3])
    for name, g, t, n, a in zip(["dq", "dk", "dv", "dlam"], got, truth, naive, arrays):
        assert g.shape == a.shape, name
        check_close(name, g, t, n, floor=terms)


STD_CASES = [
    ("basic", 2, 16, 16, 4, 4, 8, 8, False),
    ("causal_gqa", 1, 40, 40, 4, 1, 16, 16, True),
    ("odd", 1, 9, 14, 3, 3, 5, 3, True),
    ("t1", 1, 1, 1, 1, 1, 4, 4, True),
    ("t1025", 1, 1025, 1025, 1, 1, 8, 8, True),
]


@pytest.mark.parametrize("case", STD_CASES, ids=[c[0] for c in STD_CASES])
def test_standard_attention_matches_torch(case):
    _, B, Tq, Tk, H, G, D, Dv, causal = case
    rng = np.random.default_rng(7)
    q = rng.standard_normal((B, Tq, H, D), dtype=np.float32)
    k = rng.standard_normal((B, Tk, G, D), dtype=np.float32)
    v = rng.standard_normal((B, Tk, G, Dv), dtype=np.float32)
    got = diffattn.attention(q, k, v, causal=causal)
    truth = torch_fwd(tr.attention, (q, k, v), torch.float64, causal=causal)
    naive = torch_fwd(tr.attention, (q, k, v), torch.float32, causal=causal)
    check_close("out", got, truth, naive)
    dout = rng.standard_normal(got.shape, dtype=np.float32)
    dq, dk, dv = diffattn.attention_backward(q, k, v, dout, causal=causal)
    fn = lambda q, k, v: tr.attention(q, k, v, causal=causal)  # noqa: E731
    truth_g = tr.grads(fn, (q, k, v), dout)
    xs = [torch.tensor(a, requires_grad=True) for a in (q, k, v)]
    (fn(*xs) * torch.tensor(dout)).sum().backward()
    terms = max(float(np.abs(t).max()) for t in truth_g)
    for name, g, t, x in zip(["dq", "dk", "dv"], (dq, dk, dv), truth_g, xs):
        check_close(name, g, t, x.grad.numpy(), floor=terms)


def test_scale_option_and_maps():
    rng = np.random.default_rng(3)
    q, k, v, lam = make(rng, 1, 6, 9, 2, 1, 4, 8, False, False)
    for scale in (None, 0.3, -1.1):
        got = diffattn.diff_attention(q, k, v, lam, scale=scale)
        truth = torch_fwd(tr.diff_attention, (q, k, v, lam), torch.float64, scale=scale)
        naive = torch_fwd(tr.diff_attention, (q, k, v, lam), torch.float32, scale=scale)
        check_close(f"out scale={scale}", got, truth, naive)
    a1, a2 = diffattn.diff_attention_maps(q, k, v, lam, causal=True)
    t1, t2 = tr.diff_maps(*[torch.tensor(x, dtype=torch.float64) for x in (q, k, v)], causal=True)
    np.testing.assert_allclose(a1, t1.numpy(), atol=1e-6)
    np.testing.assert_allclose(a2, t2.numpy(), atol=1e-6)


def test_huge_logits_are_finite_and_match_torch():
    rng = np.random.default_rng(5)
    q, k, v, lam = make(rng, 1, 8, 8, 2, 1, 4, 8, False, True, (-0.5, 1.5))
    for sign in (1.0, -1.0):
        qq = (q * 4e3 * sign).astype(np.float32)  # scores around +-1e4
        out = diffattn.diff_attention(qq, k, v, lam, causal=True)
        assert np.isfinite(out).all()
        truth = torch_fwd(tr.diff_attention, (qq, k, v, lam), torch.float64, causal=True)
        np.testing.assert_allclose(out, truth, atol=1e-4)
        grads = diffattn.diff_attention_backward(qq, k, v, lam, np.ones_like(out), causal=True)
        assert all(np.isfinite(g).all() for g in grads)


def test_clamp_row_of_all_zeros_is_zero_not_nan():
    rng = np.random.default_rng(9)
    q, k, v, _ = make(rng, 1, 5, 5, 1, 1, 4, 8, False, False)
    q[:, :, 1] = q[:, :, 0]  # map 2 identical to map 1
    k[:, :, 1] = k[:, :, 0]
    out = diffattn.diff_attention(q, k, v, np.array([1.5], np.float32), mode="clamp")
    assert np.array_equal(out, np.zeros_like(out))


def test_reference_backend_can_be_forced():
    rng = np.random.default_rng(4)
    arrays = make(rng, 1, 10, 10, 2, 1, 8, 16, False, False)
    a = diffattn.diff_attention(*arrays, causal=True, backend="reference")
    b = diffattn.diff_attention(*arrays, causal=True)
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
