"""FlashAttention's acceptance rule on long grouped shapes: for every output and gradient,

    |diffattn - ref64| <= 2 |torch32 - ref64| + eps

where ref64 is the float64 autograd result of the independent formulation (torch_reference.py)
and torch32 the same plain PyTorch computation in float32. T >= 1024 with 8 to 24 query heads
per key/value head is where a long float32 accumulation (dK, dV of a key block summed over
every query row of every head of its group) shows; short shapes hide it.

Also: NaN and Inf in the inputs show in the outputs they reach, the same way in both backends.
"""

import numpy as np
import pytest
import torch

import diffattn
import torch_reference as tr

EPS32 = float(np.finfo(np.float32).eps)


def max_err(a, ref):
    return float(np.abs(np.asarray(a, np.float64) - ref).max())


def check_rule(name, got, ref64, torch32):
    """got within 2x the plain float32 error, plus a few float32 ulps of the largest value."""
    naive = max_err(torch32, ref64)
    err = max_err(got, ref64)
    eps = 4 * EPS32 * float(np.abs(ref64).max())
    assert err <= 2 * naive + eps, (
        f"{name}: error {err:.3e} is {err / naive:.2f}x the float32 PyTorch error {naive:.3e} "
        f"(allowed 2x + {eps:.1e})")
    return err / naive


def grads(fn, arrays, dout, dtype):
    xs = [torch.tensor(a, dtype=dtype, requires_grad=True) for a in arrays]
    out = fn(*xs)
    gs = torch.autograd.grad(out, xs, torch.tensor(dout, dtype=dtype))
    return out.detach().numpy(), [g.numpy() for g in gs]


# name, T, H (standard: query heads; diff: pairs), G (key/value heads), D, Dv, shared keys
STANDARD = [
    ("mqa_24_per_kv", 1024, 24, 1, 64, 64),
    ("gqa_8_per_kv", 1024, 16, 2, 64, 64),
]
DIFF = [
    # V1: 2H query heads on 2G key heads and G value heads (8 pairs per group: 16 query heads)
    ("v1_gqa_16_per_kv", 1024, 8, 1, 64, 128, False, False),
    # V2: 2H query heads on G shared key/value heads (24 per head), lambda per token
    ("v2_mqa_24_per_kv", 1024, 12, 1, 64, 64, True, True),
]


@pytest.mark.parametrize("case", STANDARD, ids=[c[0] for c in STANDARD])
@pytest.mark.parametrize("backend", ["fused", "reference"])
def test_standard_attention_meets_flash_rule(case, backend):
    _, T, H, G, D, Dv = case
    rng = np.random.default_rng(11)
    q = rng.standard_normal((1, T, H, D), dtype=np.float32)
    k = rng.standard_normal((1, T, G, D), dtype=np.float32)
    v = rng.standard_normal((1, T, G, Dv), dtype=np.float32)
    dout = rng.standard_normal((1, T, H, Dv), dtype=np.float32)
    fn = lambda q, k, v: tr.attention(q, k, v, causal=True)  # noqa: E731
    o64, g64 = grads(fn, (q, k, v), dout, torch.float64)
    o32, g32 = grads(fn, (q, k, v), dout, torch.float32)
    out = diffattn.attention(q, k, v, causal=True, backend=backend)
    got = diffattn.attention_backward(q, k, v, dout, causal=True, backend=backend)
    check_rule("out", out, o64, o32)
    for name, g, r, n in zip(("dq", "dk", "dv"), got, g64, g32):
        check_rule(name, g, r, n)


@pytest.mark.parametrize("case", DIFF, ids=[c[0] for c in DIFF])
@pytest.mark.parametrize("backend", ["fused", "reference"])
def test_diff_attention_meets_flash_rule(case, backend):
    _, T, H, G, D, Dv, shared, lam_token = case
    rng = np.random.default_rng(12)
    q = rng.standard_normal((1, T, 2 * H, D), dtype=np.float32)
    k = rng.standard_normal((1, T, G if shared else 2 * G, D), dtype=np.float32)
    v = rng.standard_normal((1, T, G, Dv), dtype=np.float32)
    lam = rng.uniform(0.1, 0.9, size=(1, T, H) if lam_token else (H,)).astype(np.float32)
    dout = rng.standard_normal((1, T, H, Dv), dtype=np.float32)
    fn = lambda q, k, v, lam: tr.diff_attention(q, k, v, lam, causal=True)  # noqa: E731
    o64, g64 = grads(fn, (q, k, v, lam), dout, torch.float64)
    o32, g32 = grads(fn, (q, k, v, lam), dout, torch.float32)
    out = diffattn.diff_attention(q, k, v, lam, causal=True, backend=backend)
    got = diffattn.diff_attention_backward(q, k, v, lam, dout, causal=True, backend=backend)
    check_rule("out", out, o64, o32)
    for name, g, r, n in zip(("dq", "dk", "dv", "dlam"), got, g64, g32):
        check_rule(name, g, r, n)


def finite_pattern(fn, backend):
    return np.isfinite(fn(backend)).all(axis=-1)


@pytest.mark.parametrize("where", ["q", "k", "v"])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_nan_and_inf_reach_the_same_outputs_in_both_backends(where, bad):
    rng = np.random.default_rng(3)
    T, H, G, D, Dv = 24, 2, 1, 8, 16
    q = rng.standard_normal((1, T, 2 * H, D), dtype=np.float32)
    k = rng.standard_normal((1, T, 2 * G, D), dtype=np.float32)
    v = rng.standard_normal((1, T, G, Dv), dtype=np.float32)
    lam = np.array([0.3, 0.6], np.float32)
    # Row 9 of the tensor (a query row, or a key/value row) holds one bad value.
    {"q": q, "k": k, "v": v}[where][0, 9, 0, 1] = bad
    for causal in (False, True):
        for mode in ("signed", "clamp"):
            def run(backend):
                return diffattn.diff_attention(q, k, v, lam, causal=causal, mode=mode,
                                               backend=backend)
            ref = finite_pattern(run, "reference")
            fused = finite_pattern(run, "fused")
            assert not ref.all(), f"{where}={bad} did not show in the reference output"
            np.testing.assert_array_equal(fused, ref, err_msg=f"{where}={bad} causal={causal} {mode}")
    std_q = q[:, :, :H].copy()
    for causal in (False, True):
        def run_std(backend):
            return diffattn.attention(std_q, k[:, :, :1].copy(), v, causal=causal, backend=backend)
        np.testing.assert_array_equal(finite_pattern(run_std, "fused"),
                                      finite_pattern(run_std, "reference"))


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_nan_in_the_cache_reaches_only_the_rows_that_see_it_in_decode(bad):
    # A few query rows against a long cache take the split-KV decode path: key 299 is seen by
    # the last row only (bottom-right causal), so only that row's output may be non-finite.
    rng = np.random.default_rng(4)
    Tq, Tk, H, G, D, Dv = 3, 300, 2, 1, 8, 16
    q = rng.standard_normal((1, Tq, 2 * H, D), dtype=np.float32)
    k = rng.standard_normal((1, Tk, 2 * G, D), dtype=np.float32)
    v = rng.standard_normal((1, Tk, G, Dv), dtype=np.float32)
    lam = np.array([0.3, 0.6], np.float32)
    v[0, Tk - 1, 0, 2] = bad
    for backend in ("fused", "reference"):
        out = diffattn.diff_attention(q, k, v, lam, causal=True, backend=backend)
        np.testing.assert_array_equal(np.isfinite(out).all(axis=-1)[0, :, 0], [True, True, False],
                                      err_msg=backend)
