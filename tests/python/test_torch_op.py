"""diffattn.torch's autograd operators: forward and gradients against the independent float64
formulation (torch_reference.py) under FlashAttention's rule (error at most 2x plain float32
PyTorch's, plus a few ulps), a finite-difference check of the kernel's own gradient, one forward
and one backward kernel per training step, zero-copy strided views, dtypes and bad input."""

import numpy as np
import pytest
import torch

import diffattn
import diffattn.torch as dt
import torch_reference as tr

EPS32 = float(np.finfo(np.float32).eps)


def check_rule(name, got, ref64, torch32):
    """|got - ref64| <= 2 |torch32 - ref64| + 4 eps32 max|ref64| (test_precision.py's rule)."""
    got, ref64, torch32 = (np.asarray(x.detach().double() if torch.is_tensor(x) else x, np.float64)
                           for x in (got, ref64, torch32))
    naive = float(np.abs(torch32 - ref64).max())
    err = float(np.abs(got - ref64).max())
    eps = 4 * EPS32 * float(np.abs(ref64).max())
    assert err <= 2 * naive + eps, f"{name}: error {err:.3e}, float32 torch {naive:.3e}, eps {eps:.1e}"


def make(B, Tq, Tk, H, G, D, Dv, shared, lam_token, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, Tq, 2 * H, D, generator=g)
    k = torch.randn(B, Tk, G if shared else 2 * G, D, generator=g)
    v = torch.randn(B, Tk, G, Dv, generator=g)
    lam = 0.1 + 0.8 * torch.rand((B, Tq, H) if lam_token else (H,), generator=g)
    dout = torch.randn(B, Tq, H, Dv, generator=g)
    return q, k, v, lam, dout


def transposed(x):
    """Same values, laid out (B, heads, T, D) in memory: what attention code hands over."""
    return x.transpose(1, 2).contiguous().transpose(1, 2)


def run(fn, xs, dout, dtype):
    leaves = [x.detach().to(dtype).requires_grad_() for x in xs]
    out = fn(*leaves)
    grads = torch.autograd.grad(out, leaves, dout.to(dtype))
    return out.detach(), [g.detach() for g in grads]


# name, B, Tq, Tk, H, G, D, Dv, shared keys (V2), lambda per token, causal
CASES = [
    ("v1_causal_gqa", 2, 37, 37, 4, 2, 8, 16, False, False, True),
    ("v1_noncausal", 1, 20, 20, 2, 2, 8, 16, False, False, False),
    ("v2_token_lam", 2, 33, 33, 4, 1, 16, 16, True, True, True),
    ("tq_lt_tk", 1, 7, 29, 2, 1, 8, 8, False, True, True),
    ("tq_gt_tk", 1, 19, 6, 2, 2, 4, 8, True, False, True),  # rows that see no key
    ("long_mqa", 1, 300, 300, 4, 1, 32, 32, True, True, True),
    ("decode_path", 1, 2, 300, 2, 1, 8, 16, False, True, True),  # split-KV forward
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_diff_attention_matches_float64_reference(case):
    _, B, Tq, Tk, H, G, D, Dv, shared, lam_token, causal = case
    q, k, v, lam, dout = make(B, Tq, Tk, H, G, D, Dv, shared, lam_token)
    ref = lambda q, k, v, lam: tr.diff_attention(q, k, v, lam, causal=causal)  # noqa: E731
    o64, g64 = run(ref, (q, k, v, lam), dout, torch.float64)
    o32, g32 = run(ref, (q, k, v, lam), dout, torch.float32)
    # the kernels read the transposed layouts in place
    leaves = [transposed(q).requires_grad_(), transposed(k).requires_grad_(),
              transposed(v).requires_grad_(), lam.clone().requires_grad_()]
    out = dt.diff_attention(*leaves, causal=causal)
    out.backward(dout)
    check_rule("out", out, o64, o32)
    for name, x, r, n in zip(("dq", "dk", "dv", "dlam"), leaves, g64, g32):
        assert x.grad.shape == x.shape and x.grad.dtype == torch.float32
        check_rule(name, x.grad, r, n)


@pytest.mark.parametrize("causal", [False, True])
def test_attention_matches_float64_reference(causal):
    g = torch.Generator().manual_seed(5)
    q, k, v = torch.randn(2, 41, 6, 8, generator=g), torch.randn(2, 41, 2, 8, generator=g), \
        torch.randn(2, 41, 2, 12, generator=g)
    dout = torch.randn(2, 41, 6, 12, generator=g)
    ref = lambda q, k, v: tr.attention(q, k, v, causal=causal)  # noqa: E731
    o64, g64 = run(ref, (q, k, v), dout, torch.float64)
    o32, g32 = run(ref, (q, k, v), dout, torch.float32)
    out, grads = run(lambda q, k, v: dt.attention(q, k, v, causal=causal), (q, k, v), dout,
                     torch.float32)
    check_rule("out", out, o64, o32)
    for name, x, r, n in zip(("dq", "dk", "dv"), grads, g64, g32):
        check_rule(name, x, r, n)


def test_gradient_matches_finite_differences_of_the_kernel():
    """The kernel's gradient against central differences of the kernel's own float32 forward.
    Allowed: the truncation error the float64 reference shows at the same step, plus the
    rounding of the float32 sums over the step (8 eps32 sum|w * out| / h)."""
    q, k, v, lam, w = make(1, 13, 13, 2, 1, 8, 16, False, True, seed=3)
    h = 1e-2

    def f32(xs):
        with torch.no_grad():
            return float((dt.diff_attention(*xs, causal=True).double() * w.double()).sum())

    def f64(xs):
        with torch.no_grad():
            return float((tr.diff_attention(*[x.double() for x in xs], causal=True)
                          * w.double()).sum())

    xs = [q, k, v, lam]
    _, g32 = run(lambda *a: dt.diff_attention(*a, causal=True), xs, w, torch.float32)
    _, g64 = run(lambda *a: tr.diff_attention(*a, causal=True), xs, w, torch.float64)
    size = float((tr.diff_attention(*[x.double() for x in xs], causal=True).abs()
                  * w.double().abs()).sum())
    gen = torch.Generator().manual_seed(9)
    for i, name in enumerate(("q", "k", "v", "lam")):
        d = torch.randn(xs[i].shape, generator=gen)
        plus = [x + h * d if j == i else x for j, x in enumerate(xs)]
        minus = [x - h * d if j == i else x for j, x in enumerate(xs)]
        fd32 = (f32(plus) - f32(minus)) / (2 * h)
        fd64 = (f64([p.double() for p in plus]) - f64([m.double() for m in minus])) / (2 * h)
        an32 = float((g32[i].double() * d.double()).sum())
        an64 = float((g64[i] * d.double()).sum())
        bound = 2 * abs(fd64 - an64) + 8 * EPS32 * size / h + 8 * EPS32 * abs(an64)
        assert abs(fd32 - an32) <= bound, f"d{name}: fd {fd32:.6g}, analytic {an32:.6g}, bound {bound:.2e}"


def test_one_forward_and_one_backward_kernel_per_step():
    q, k, v, lam, dout = make(2, 24, 24, 2, 1, 8, 16, False, False)
    leaves = [transposed(x).requires_grad_() for x in (q, k, v)] + [lam.requires_grad_()]
    before = diffattn.kernel_calls()
    dt.diff_attention(*leaves, causal=True).backward(dout)
    after = diffattn.kernel_calls()
    assert after["forward"] - before["forward"] == 1
    assert after["backward"] - before["backward"] == 1
    assert after["decode"] == before["decode"]
    qs = q[:, :, :2].clone().requires_grad_()
    before = diffattn.kernel_calls()
    dt.attention(qs, k[:, :, :1], v, causal=True).sum().backward()  # expanded (stride-0) dout
    after = diffattn.kernel_calls()
    assert (after["forward"] - before["forward"], after["backward"] - before["backward"]) == (1, 1)


def test_strided_float32_views_reach_the_kernel_without_copy():
    # the tensors the C++ kernels get are the caller's own (no copy): address and strides
    from diffattn.torch import ops
    x = torch.randn(2, 4, 10, 8).transpose(1, 2)  # (B, T, heads, D) view of (B, heads, T, D)
    assert ops._kernel_inputs("diff_attention", "auto", x)[0] is x
    assert ops._raw(x) == (x.data_ptr(), tuple(x.shape), x.stride())
    buf = torch.randn(1, 10, 48)  # one fused QKV buffer; q is a slice of every row
    qs = buf[:, :, :32].view(1, 10, 4, 8)
    assert ops._kernel_inputs("diff_attention", "auto", qs)[0] is qs
    assert ops._raw(qs)[0] == buf.data_ptr()
    # results are bit-identical to contiguous inputs
    q, k, v, lam, _ = make(1, 10, 10, 2, 1, 8, 16, False, False)
    assert torch.equal(dt.diff_attention(transposed(q), transposed(k), transposed(v), lam),
                       dt.diff_attention(q, k, v, lam))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.bfloat16])
def test_other_dtypes_compute_in_float32_and_come_back_in_their_dtype(dtype):
    q, k, v, lam, dout = make(1, 16, 16, 2, 1, 8, 16, False, False)
    q, k, v = (x.to(dtype) for x in (q, k, v))  # values exactly representable in dtype
    lam, dout = lam.to(dtype), dout.to(dtype)
    want, wgrads = run(lambda *a: dt.diff_attention(*a, causal=True),
                       [x.float() for x in (q, k, v, lam)], dout.float(), torch.float32)
    leaves = [x.clone().requires_grad_() for x in (q, k, v, lam)]
    out = dt.diff_attention(*leaves, causal=True)
    assert out.dtype == dtype
    out.backward(dout)
    assert torch.equal(out, want.to(dtype))
    for x, g in zip(leaves, wgrads):
        assert x.grad.dtype == dtype and torch.equal(x.grad, g.to(dtype))


def test_bad_input_is_a_clear_error():
    q, k, v, lam, _ = make(1, 8, 8, 2, 1, 4, 8, False, False)
    with pytest.raises(TypeError, match="diff_attention: q must be a torch.Tensor"):
        dt.diff_attention(q.numpy(), k, v, lam)
    with pytest.raises(ValueError, match="k is on device meta"):
        dt.diff_attention(q, k.to("meta"), v, lam)
    with pytest.raises(TypeError, match="v has dtype torch.int64"):
        dt.diff_attention(q, k, v.long(), lam)
    with pytest.raises(TypeError, match="q, k and v must share one dtype"):
        dt.diff_attention(q, k.double(), v, lam)
    with pytest.raises(ValueError, match=r"q must have 4 dimensions, got shape \(8, 4, 4\)"):
        dt.diff_attention(q[0], k, v, lam)
    with pytest.raises(ValueError, match=r"lam must have 1 or 3 dimensions"):
        dt.diff_attention(q, k, v, lam.view(1, 2))
    with pytest.raises(ValueError, match="lam"):
        dt.diff_attention(q, k, v, torch.ones(3))  # 3 lambdas for 2 pairs
    with pytest.raises(ValueError, match="k"):
        dt.diff_attention(q, k[:, :5], v, lam)  # Tk of k and v differ
    with pytest.raises(ValueError, match="scale must be finite and non-zero"):
        dt.diff_attention(q, k, v, lam, scale=0.0)
    with pytest.raises(TypeError, match="causal must be a bool"):
        dt.attention(q, k, v, causal="yes")


def test_same_numbers_as_the_numpy_operator_and_the_cpp_oracle():
    """diffattn.torch is the NumPy operator's kernels: bit for bit the same outputs and
    gradients; and the C++ reference backend meets the same rule on the same problem."""
    q, k, v, lam, dout = make(2, 29, 29, 2, 1, 8, 16, True, True, seed=4)
    n = [x.numpy() for x in (q, k, v, lam, dout)]
    want = diffattn.diff_attention(*n[:4], causal=True)
    wgrads = diffattn.diff_attention_backward(*n, causal=True)
    out, grads = run(lambda *a: dt.diff_attention(*a, causal=True), (q, k, v, lam), dout,
                     torch.float32)
    assert np.array_equal(out.numpy(), want)
    for g, w in zip(grads, wgrads):
        assert np.array_equal(g.numpy(), w)
    ref = lambda q, k, v, lam: tr.diff_attention(q, k, v, lam, causal=True)  # noqa: E731
    o64, g64 = run(ref, (q, k, v, lam), dout, torch.float64)
    o32, g32 = run(ref, (q, k, v, lam), dout, torch.float32)
    check_rule("oracle out", diffattn.diff_attention(*n[:4], causal=True, backend="reference"),
               o64, o32)
    oracle = diffattn.diff_attention_backward(*n, causal=True, backend="reference")
    for name, g, r, n32 in zip(("dq", "dk", "dv", "dlam"), oracle, g64, g32):
        check_rule("oracle " + name, g, r, n32)
        check_rule("torch " + name, grads[("dq", "dk", "dv", "dlam").index(name)], r, n32)


def test_expanded_inputs_get_summed_gradients():
    """k shared by the batch through expand() (stride 0): the kernels need distinct elements
    for the gradient they write in k's layout, so it is materialised and autograd sums dk."""
    q, k, v, lam, dout = make(2, 12, 12, 2, 1, 8, 16, False, False, seed=6)
    k0 = k[:1].clone().requires_grad_()
    out = dt.diff_attention(q, k0.expand(2, -1, -1, -1), v, lam, causal=True)
    out.backward(dout)
    k1 = k0.detach().expand(2, -1, -1, -1).clone().requires_grad_()
    dt.diff_attention(q, k1, v, lam, causal=True).backward(dout)
    assert torch.equal(k0.grad, k1.grad.sum(0, keepdim=True))
