"""diffattn.gpu (the Triton kernels) against a float64 materialised oracle written here and
against the C++ kernels (diffattn's NumPy API), for every variant: V1 (scalar and per-pair
lambda), V2 (shared keys, per-token lambda), standard attention; GQA; causal and not; Tq != Tk
(Tq > Tk causal: rows that see no key); varlen; paged decode; float32, float16, bfloat16.

Without a GPU the kernels run on CPU tensors under TRITON_INTERPRET=1 (conftest.py sets it
before triton is imported); with one, on CUDA tensors. Shapes are small and awkward (1, 17, 97,
odd Tq != Tk, D not a power of two) so the tiles' edges and the causal diagonal are crossed.

Accuracy rule (FlashAttention's): for each output and gradient,
    |kernel - ref64| <= 2 |torch_lowp - ref64| + floor
ref64 is the oracle on the inputs (as rounded to their dtype) in float64; torch_lowp the same
oracle computed by PyTorch in the inputs' dtype (float32, bfloat16 or float16). The floor is
4 float32 epsilons of the largest reference value, plus half a unit in the last place of the
result's own dtype there (the rounding of the stored result, which at these small shapes can
outweigh every error before it).
"""

import math

import numpy as np
import pytest
import torch

import diffattn.gpu as gpu
from diffattn.gpu import _configs
from diffattn.gpu._common import INTERPRET
from diffattn.gpu._configs import Tiles

if INTERPRET:
    DEVICE = "cpu"
elif torch.cuda.is_available():
    DEVICE = "cuda"
else:
    DEVICE = None
pytestmark = pytest.mark.skipif(DEVICE is None, reason="no CUDA device and TRITON_INTERPRET is "
                                "not set: the Triton kernels cannot run here")
needs_cuda = pytest.mark.skipif(DEVICE != "cuda", reason="needs a CUDA device")

try:
    import diffattn._core as _core
    CORE_ERROR = None
except ImportError as e:  # a GPU machine with the sources only
    _core, CORE_ERROR = None, e

EPS32 = float(torch.finfo(torch.float32).eps)
DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}


# ------------------------------------------------------------------ the oracle


def _mask(Tq, Tk, causal, device):
    if not causal:
        return torch.ones(Tq, Tk, dtype=torch.bool, device=device)
    i = torch.arange(Tq, device=device)[:, None]
    j = torch.arange(Tk, device=device)[None, :]
    return j <= i + (Tk - Tq)  # bottom-right


def _softmax_map(q, k, v, mask, s):
    """One softmax map: q (B, Tq, H, D), k (B, Tk, H, D), v (B, Tk, H, Dv) (heads already
    repeated for GQA) -> o (B, Tq, H, Dv), lse (B, H, Tq) (+inf for a row that sees no key)."""
    sc = torch.einsum("bqhd,bkhd->bhqk", q, k) * s
    sc = sc.masked_fill(~mask, float("-inf"))
    if sc.shape[-1] == 0:  # no keys at all
        m = sc.new_zeros(sc.shape[:-1] + (1,))
    else:
        m = sc.amax(-1, keepdim=True).detach()
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    e = torch.exp(sc - m)
    z = e.sum(-1, keepdim=True)
    seen = z > 0
    p = e / torch.where(seen, z, torch.ones_like(z))
    lse = torch.where(seen, m + torch.log(torch.where(seen, z, torch.ones_like(z))),
                      torch.full_like(z, float("inf")))
    return torch.einsum("bhqk,bkhd->bqhd", p, v), lse[..., 0]


def oracle(q, k, v, lam, causal, scale=None):
    """Differential attention (lam given) or standard attention (lam None), in the inputs'
    dtype, differentiable: returns out, lse, o2 (o2 None for standard)."""
    B, Tq, QH, D = q.shape
    Tk, G = k.shape[1], v.shape[2]
    s = 1.0 / math.sqrt(D) if scale is None else scale
    mask = _mask(Tq, Tk, causal, q.device)
    if lam is None:
        rep = QH // G
        o, lse = _softmax_map(q, k.repeat_interleave(rep, 2), v.repeat_interleave(rep, 2), mask, s)
        return o, lse, None
    H = QH // 2
    rep = H // G
    k1, k2 = (k[:, :, 0::2], k[:, :, 1::2]) if k.shape[2] == 2 * G else (k, k)
    vr = v.repeat_interleave(rep, 2)
    o1, l1 = _softmax_map(q[:, :, 0::2], k1.repeat_interleave(rep, 2), vr, mask, s)
    o2, l2 = _softmax_map(q[:, :, 1::2], k2.repeat_interleave(rep, 2), vr, mask, s)
    lamb = lam[..., None] if lam.dim() == 3 else (lam[:, None] if lam.dim() == 1 else lam)
    out = o1 - lamb * o2                                           # arXiv:2410.05258, Eq. (1)
    lse = torch.stack([l1, l2], 2).reshape(B, 2 * H, Tq)
    return out, lse, o2


def oracle_grads(inputs, dout, causal, scale, dtype):
    """Outputs and gradients of the oracle with every input cast to dtype, on the CPU."""
    xs = [None if x is None else x.detach().cpu().to(dtype).requires_grad_() for x in inputs]
    q, k, v, lam = xs
    out, lse, o2 = oracle(q, k, v, lam, causal, scale)
    wrt = [x for x in xs if x is not None]
    grads = torch.autograd.grad(out, wrt, dout.detach().cpu().to(dtype))
    return out.detach(), lse.detach(), None if o2 is None else o2.detach(), grads


# ------------------------------------------------------------------ the rule


def check(name, got, ref64, lowp):
    """FlashAttention's rule; infinite entries (lse of rows that see no key) must match."""
    half_ulp = 0.5 * torch.finfo(got.dtype).eps if got.dtype != torch.float32 else 0.0
    got = got.detach().cpu().double()
    lowp = lowp.detach().cpu().double()
    inf = torch.isinf(ref64)
    assert torch.equal(torch.isinf(got), inf), f"{name}: infinite entries differ from the oracle"
    assert not torch.isnan(got).any(), f"{name}: NaN"
    fin = ~inf
    if not fin.any():
        return
    err = (got[fin] - ref64[fin]).abs().max().item()
    naive = (lowp[fin] - ref64[fin]).abs().max().item()
    floor = (4 * EPS32 + half_ulp) * max(ref64[fin].abs().max().item(), 1.0)
    assert err <= 2 * naive + floor, (
        f"{name}: error {err:.3e} against float64 exceeds 2x the plain PyTorch error "
        f"{naive:.3e} + {floor:.1e}")


def make_lam(kind, B, Tq, H, gen):
    """Lambdas that are negative or above 1 (nothing clamps them)."""
    if kind == "scalar":
        return torch.tensor(0.8)
    if kind == "pair":
        return torch.linspace(-0.4, 1.3, H)
    return torch.rand(B, Tq, H, generator=gen) * 1.8 - 0.4


def make_inputs(B, Tq, Tk, H, G, D, Dv, kind, lam_kind, seed):
    """q, k, v, lam in float32 (CPU) for a case; kind "v1", "v2" or "std"."""
    gen = torch.Generator().manual_seed(seed)
    QH = H if kind == "std" else 2 * H
    KH = 2 * G if kind == "v1" else G
    q = torch.randn(B, Tq, QH, D, generator=gen)
    k = torch.randn(B, Tk, KH, D, generator=gen)
    v = torch.randn(B, Tk, G, Dv, generator=gen)
    lam = None if kind == "std" else make_lam(lam_kind, B, Tq, H, gen)
    return q, k, v, lam, gen


def run_gpu(q, k, v, lam, dout, causal, scale=None, deterministic=False):
    """Forward and backward through diffattn.gpu: (out, lse, o2), (dq, dk, dv[, dlam])."""
    if lam is None:
        out, lse = gpu.attention_fwd(q, k, v, causal=causal, scale=scale)
        grads = gpu.attention_bwd(dout, q, k, v, out, lse, causal=causal, scale=scale,
                                  deterministic=deterministic)
        return (out, lse, None), grads
    out, lse, o2 = gpu.diff_attention_fwd(q, k, v, lam, causal=causal, scale=scale)
    grads = gpu.diff_attention_bwd(dout, q, k, v, lam, out, lse, o2, causal=causal, scale=scale,
                                   deterministic=deterministic)
    return (out, lse, o2), grads


def check_case(q, k, v, lam, dout, causal, dtype, scale=None, deterministic=False, tag=""):
    """Run the kernels on (q, k, v) rounded to dtype and check every output and gradient."""
    dev = DEVICE
    qd, kd, vd = (x.to(dtype).to(dev) for x in (q, k, v))
    lamd = None if lam is None else lam.to(dev)
    doutd = dout.to(dtype).to(dev)
    (out, lse, o2), grads = run_gpu(qd, kd, vd, lamd, doutd, causal, scale, deterministic)
    assert out.dtype == dtype and lse.dtype == torch.float32
    inputs = [qd, kd, vd, lamd]
    r64 = oracle_grads(inputs, doutd, causal, scale, torch.float64)
    rlp = oracle_grads(inputs, doutd, causal, scale, dtype)
    check(f"{tag} out", out, r64[0], rlp[0])
    check(f"{tag} lse", lse, r64[1], rlp[1])
    if o2 is not None:
        check(f"{tag} o2", o2, r64[2], rlp[2])
    names = ("dq", "dk", "dv", "dlam")
    for name, g, g64, glp in zip(names, grads, r64[3], rlp[3]):
        assert g.shape == g64.shape, f"{tag} {name}: shape {tuple(g.shape)}"
        if name == "dlam":
            assert g.dtype == lamd.dtype
        else:
            assert g.dtype == dtype
        check(f"{tag} {name}", g, g64, glp)
    return (out, lse, o2), grads


# ------------------------------------------------------------------ dense forward and backward

# id, B, Tq, Tk, H (pairs or heads), G, D, Dv, kind, lam, causal, dtype
# (Tk - Tq = 30 puts a causal diagonal two keys short of a 32-key tile's edge)
CASES = [
    ("v1_pair_gqa", 2, 17, 17, 2, 1, 16, 32, "v1", "pair", False, "f32"),
    ("v1_pair_causal_97", 1, 97, 97, 2, 2, 16, 32, "v1", "pair", True, "f32"),
    ("v1_scalar_causal_tq_gt_tk", 2, 33, 17, 2, 1, 16, 32, "v1", "scalar", True, "f32"),
    ("v1_causal_tq_lt_tk_3pairs", 1, 5, 37, 3, 1, 64, 128, "v1", "pair", True, "f32"),
    ("v1_d24_dv48", 1, 13, 21, 2, 2, 24, 48, "v1", "pair", False, "f32"),
    ("v1_d128_dv256", 1, 19, 35, 1, 1, 128, 256, "v1", "scalar", True, "f32"),
    ("v2_token_gqa", 2, 23, 41, 4, 2, 16, 16, "v2", "token", False, "f32"),
    ("std_gqa_causal_diag30", 2, 17, 47, 4, 2, 16, 16, "std", None, True, "f32"),
    ("std_one_row", 3, 1, 1, 2, 2, 16, 32, "std", None, False, "f32"),
    ("v1_pair_f16", 1, 33, 50, 2, 1, 64, 128, "v1", "pair", False, "f16"),
    ("v1_row_bf16_causal", 2, 1, 19, 2, 1, 16, 32, "v1", "pair", True, "bf16"),
    ("v2_token_causal_bf16", 1, 41, 41, 2, 1, 64, 64, "v2", "token", True, "bf16"),
    ("std_causal_tq_gt_tk_bf16", 1, 65, 33, 2, 1, 64, 64, "std", None, True, "bf16"),
    ("std_f16", 2, 18, 9, 2, 1, 16, 16, "std", None, False, "f16"),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_forward_backward_match_oracle(case):
    name, B, Tq, Tk, H, G, D, Dv, kind, lam_kind, causal, dt = case
    q, k, v, lam, gen = make_inputs(B, Tq, Tk, H, G, D, Dv, kind, lam_kind, seed=len(name))
    dout = torch.randn(B, Tq, H, Dv, generator=gen)
    check_case(q, k, v, lam, dout, causal, DTYPES[dt], tag=name)


def test_deterministic_backward_matches_oracle_and_repeats():
    """deterministic=True: the dQ kernel of its own; the same bits on a second run (on a GPU
    the atomic path is not bound to)."""
    q, k, v, lam, gen = make_inputs(2, 31, 45, 4, 2, 16, 32, "v1", "token", seed=5)
    dout = torch.randn(2, 31, 4, 32, generator=gen)
    _, g1 = check_case(q, k, v, lam, dout, True, torch.float32, deterministic=True, tag="det")
    _, g2 = check_case(q, k, v, lam, dout, True, torch.float32, deterministic=True, tag="det")
    for a, b in zip(g1, g2):
        assert torch.equal(a, b)


def test_other_tilings_and_split_pairs():
    """BLOCK_M > BLOCK_N everywhere, a scale given, and the key-block backward with a group's
    pairs split over programs (partials summed after)."""
    # Tk - Tq = 14: a causal diagonal two keys short of a 16-key tile edge
    q, k, v, lam, gen = make_inputs(1, 37, 51, 4, 1, 16, 32, "v1", "pair", seed=9)
    dout = torch.randn(1, 37, 4, 32, generator=gen)
    with _configs.force(fwd=Tiles(32, 16, 1, 1), bwd_dkdv=Tiles(32, 16, 1, 1),
                        bwd_dq=Tiles(16, 32, 1, 1), bwd_splits=3):
        check_case(q, k, v, lam, dout, True, torch.float32, scale=0.3, tag="tiles")
        check_case(q, k, v, lam, dout, False, torch.float32, deterministic=True, tag="tiles det")


def test_strided_views_read_in_place():
    """q, k, v as x.transpose(1, 2) of (B, heads, T, D) tensors, lam a strided slice, dout
    expanded: the results equal those of contiguous copies (deterministic dQ: on a GPU the
    atomic adds would reorder the sums)."""
    gen = torch.Generator().manual_seed(3)
    B, T, H, G, D, Dv = 2, 21, 2, 1, 16, 32
    qh = torch.randn(B, 2 * H, T, D, generator=gen)
    kh = torch.randn(B, 2 * G, T, D, generator=gen)
    vh = torch.randn(B, G, T, Dv, generator=gen)
    lam_full = torch.randn(B, T, 2 * H, generator=gen)
    # moved to the device first: .to() of a strided CPU view copies it contiguous
    q, k, v = (x.to(DEVICE).transpose(1, 2) for x in (qh, kh, vh))
    lam = lam_full.to(DEVICE)[:, :, ::2]
    assert not q.is_contiguous() and not lam.is_contiguous()
    dout = torch.randn(1, T, H, Dv, generator=gen).to(DEVICE).expand(B, T, H, Dv)
    (a, a_lse, a_o2), ga = run_gpu(q, k, v, lam, dout, True, deterministic=True)
    cq, ck, cv, cl, cd = (x.contiguous() for x in (q, k, v, lam, dout))
    (b, b_lse, b_o2), gb = run_gpu(cq, ck, cv, cl, cd, True, deterministic=True)
    for x, y in zip((a, a_lse, a_o2) + tuple(ga), (b, b_lse, b_o2) + tuple(gb)):
        assert torch.equal(x, y)


def test_backward_reads_the_saved_statistics():
    """The backward takes P from the saved lse (no statistics recomputed): raising every lse by
    ln 2 halves both maps' probabilities, so dV halves."""
    q, k, v, lam, gen = make_inputs(1, 19, 19, 2, 1, 16, 16, "v2", "pair", seed=4)
    q, k, v, lam = (x.to(DEVICE) for x in (q, k, v, lam))
    dout = torch.randn(1, 19, 2, 16, generator=gen).to(DEVICE)
    out, lse, o2 = gpu.diff_attention_fwd(q, k, v, lam)
    dv = gpu.diff_attention_bwd(dout, q, k, v, lam, out, lse, o2)[2]
    dv_half = gpu.diff_attention_bwd(dout, q, k, v, lam, out, lse + math.log(2.0), o2)[2]
    torch.testing.assert_close(dv_half, dv / 2, rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------ against the C++ kernels


needs_core = pytest.mark.skipif(_core is None, reason=f"the compiled core diffattn._core is not "
                                f"importable ({CORE_ERROR}); the C++ comparison needs it")


@needs_core
@pytest.mark.parametrize("kind,lam_kind,causal", [("v1", "pair", True), ("v1", "scalar", False),
                                                  ("v2", "token", True), ("std", None, True)])
def test_matches_cpp_kernels(kind, lam_kind, causal):
    """Forward (out, lse, o2) and backward against diffattn.diff_attention(...) /
    diffattn.attention(...) in float32: within twice the sum of both kernels' own rule."""
    import diffattn
    B, Tq, Tk, H, G, D, Dv = 2, 29, 43, 4, 2, 16, 32
    q, k, v, lam, gen = make_inputs(B, Tq, Tk, H, G, D, Dv, kind, lam_kind, seed=11)
    dout = torch.randn(B, Tq, H, Dv, generator=gen)
    dev = [x if x is None else x.to(DEVICE) for x in (q, k, v, lam, dout)]
    (out, lse, o2), grads = run_gpu(*dev, causal)
    n = [x.numpy() for x in (q, k, v, dout)]
    r64 = oracle_grads([q, k, v, lam], dout, causal, None, torch.float64)
    r32 = oracle_grads([q, k, v, lam], dout, causal, None, torch.float32)
    if kind == "std":
        c_out, c_lse = diffattn.attention(n[0], n[1], n[2], causal=causal, return_stats=True)
        c_grads = diffattn.attention_backward(n[0], n[1], n[2], n[3], causal=causal, out=c_out,
                                              lse=c_lse)
        mine, theirs, refs, naive = ((out, lse), (c_out, c_lse), r64[:2], r32[:2])
    else:
        lam_np = (lam.expand(H) if lam.dim() == 0 else lam).contiguous().numpy()
        c_out, c_lse, c_o2 = diffattn.diff_attention(n[0], n[1], n[2], lam_np, causal=causal,
                                                     return_stats=True)
        c_grads = list(diffattn.diff_attention_backward(n[0], n[1], n[2], lam_np, n[3],
                                                        causal=causal, out=c_out, lse=c_lse,
                                                        o2=c_o2))
        if lam.dim() == 0:
            c_grads[3] = np.asarray(c_grads[3]).sum()
        mine, theirs, refs, naive = ((out, lse, o2), (c_out, c_lse, c_o2), r64[:3], r32[:3])
    mine = tuple(mine) + tuple(grads)
    theirs = tuple(torch.as_tensor(np.asarray(x)) for x in theirs) + tuple(
        torch.as_tensor(np.asarray(g)).reshape(r.shape) for g, r in zip(c_grads, r64[3]))
    refs, naive = tuple(refs) + tuple(r64[3]), tuple(naive) + tuple(r32[3])
    for i, (a, b, r, lp) in enumerate(zip(mine, theirs, refs, naive)):
        a, b = a.detach().cpu().double(), b.double()
        fin = torch.isfinite(r)
        assert torch.equal(torch.isinf(a), torch.isinf(b)), f"output {i}: inf pattern"
        tol = 4 * (lp.double()[fin] - r[fin]).abs().max().item() + 8 * EPS32 * max(
            r[fin].abs().max().item(), 1.0)
        diff = (a[fin] - b[fin]).abs().max().item()
        assert diff <= tol, f"output {i}: Triton vs C++ differ by {diff:.3e} (allowed {tol:.1e})"


# ------------------------------------------------------------------ varlen


def _cu(lens):
    return torch.tensor([0] + np.cumsum(lens).tolist(), dtype=torch.int32)


@pytest.mark.parametrize("kind,lam_kind,causal,dt,det", [
    ("v1", "pair", True, "f32", False), ("v2", "token", False, "f32", True),
    ("std", None, True, "bf16", True), ("v1", "scalar", False, "bf16", False)])
def test_varlen_matches_per_sequence_oracle(kind, lam_kind, causal, dt, det):
    """Packed sequences of their own lengths (one with no keys, one with no queries): each
    sequence's rows and gradients match the oracle on that sequence alone; a group's two pairs
    split over two key-block programs."""
    dtype = DTYPES[dt]
    lens_q, lens_k = [5, 17, 0, 1, 3], [9, 17, 6, 0, 3]
    H, G, D, Dv = 2, 1, 16, 32
    Tq, Tk = sum(lens_q), sum(lens_k)
    q, k, v, _, gen = make_inputs(1, Tq, Tk, H, G, D, Dv, kind, None, seed=7)
    q, k, v = (x[0].to(dtype).to(DEVICE) for x in (q, k, v))
    lam = None if kind == "std" else make_lam(lam_kind, 1, Tq, H, gen)
    if lam is not None and lam.dim() == 3:
        lam = lam[0]
    lam = None if lam is None else lam.to(DEVICE)
    dout = torch.randn(Tq, H, Dv, generator=gen).to(dtype).to(DEVICE)
    cu_q, cu_k = _cu(lens_q).to(DEVICE), _cu(lens_k).to(DEVICE)
    args = (cu_q, cu_k, max(lens_q), max(lens_k))
    with _configs.force(bwd_splits=2):
        if lam is None:
            out, lse = gpu.attention_varlen_fwd(q, k, v, *args, causal=causal)
            grads = gpu.attention_varlen_bwd(dout, q, k, v, out, lse, *args, causal=causal,
                                             deterministic=det)
            o2 = None
        else:
            out, lse, o2 = gpu.diff_attention_varlen_fwd(q, k, v, lam, *args, causal=causal)
            grads = gpu.diff_attention_varlen_bwd(dout, q, k, v, lam, out, lse, o2, *args,
                                                  causal=causal, deterministic=det)
    assert out.shape == (Tq, H, Dv) and lse.shape == ((1 if lam is None else 2) * H, Tq)
    dlam64 = 0.0
    dlam_lp = 0.0
    for b in range(len(lens_q)):
        qs = slice(int(cu_q[b]), int(cu_q[b + 1]))
        ks = slice(int(cu_k[b]), int(cu_k[b + 1]))
        if qs.start == qs.stop:
            continue
        lam_b = None if lam is None else (lam[qs][None] if lam.dim() == 2 else lam)
        inputs = [q[qs][None], k[ks][None], v[ks][None], lam_b]
        r64 = oracle_grads(inputs, dout[qs][None], causal, None, torch.float64)
        rlp = oracle_grads(inputs, dout[qs][None], causal, None, dtype)
        check(f"seq {b} out", out[qs], r64[0][0], rlp[0][0])
        check(f"seq {b} lse", lse[:, qs], r64[1][0], rlp[1][0])
        if o2 is not None:
            check(f"seq {b} o2", o2[qs], r64[2][0], rlp[2][0])
        for name, g, sl, g64, glp in zip(("dq", "dk", "dv"), grads, (qs, ks, ks), r64[3], rlp[3]):
            check(f"seq {b} {name}", g[sl], g64[0], glp[0])
        if lam is not None:
            if lam.dim() == 2:
                check(f"seq {b} dlam", grads[3][qs], r64[3][3][0], rlp[3][3][0])
            else:
                dlam64 = dlam64 + r64[3][3]
                dlam_lp = dlam_lp + rlp[3][3].double()
    if lam is not None and lam.dim() != 2:
        check("dlam", grads[3], dlam64, dlam_lp)
    for b, n in enumerate(lens_k):  # keys of a sequence with no queries get zero gradients
        if lens_q[b] == 0:
            ks = slice(int(cu_k[b]), int(cu_k[b + 1]))
            assert not grads[1][ks].any() and not grads[2][ks].any()


# ------------------------------------------------------------------ paged decode


def _paged(k, v, lens, block_size, gen):
    """Scatter dense caches (B, Tk, heads, dim) into a block pool in a random block order:
    returns k_cache, v_cache (num_blocks, block_size, ...), block_table (B, max_blocks)."""
    B, Tk = k.shape[:2]
    max_blocks = -(-Tk // block_size)
    num_blocks = B * max_blocks + 3                     # spare blocks never referenced
    order = torch.randperm(num_blocks, generator=gen)[:B * max_blocks].reshape(B, max_blocks)
    kc = torch.randn((num_blocks, block_size) + k.shape[2:], generator=gen).to(k.dtype)
    vc = torch.randn((num_blocks, block_size) + v.shape[2:], generator=gen).to(v.dtype)
    pad = max_blocks * block_size - Tk
    pages = (B, max_blocks, block_size)
    kp = torch.nn.functional.pad(k, (0, 0, 0, 0, 0, pad)).reshape(pages + k.shape[2:])
    vp = torch.nn.functional.pad(v, (0, 0, 0, 0, 0, pad)).reshape(pages + v.shape[2:])
    for b in range(B):
        kc[order[b]] = kp[b]
        vc[order[b]] = vp[b]
    return kc, vc, order.to(torch.int32)


DECODE_CASES = [
    # id, B, Tq, Tk_max, H, G, D, Dv, kind, lam, dtype, block_size (0: contiguous), splits
    ("v1_pair_paged_bs4_f16", 3, 1, 70, 4, 2, 16, 32, "v1", "pair", "f16", 4, 0),
    ("v1_scalar_paged_bs32_bf16_split3", 3, 1, 70, 2, 1, 16, 32, "v1", "scalar", "bf16", 32, 3),
    ("v2_token_paged_tq3_gqa8_bf16", 4, 3, 45, 8, 1, 16, 16, "v2", "token", "bf16", 8, 2),
    ("v1_tq2_contig_f32", 2, 2, 40, 2, 2, 64, 128, "v1", "pair", "f32", 0, 0),
    ("std_paged_gqa_f16", 3, 1, 50, 4, 1, 16, 16, "std", None, "f16", 16, 4),
    ("std_tq4_contig_bf16", 2, 4, 33, 2, 2, 16, 32, "std", None, "bf16", 0, 0),
]


@pytest.mark.parametrize("case", DECODE_CASES, ids=[c[0] for c in DECODE_CASES])
def test_decode_matches_oracle(case):
    """Ragged cache_seqlens (0, fewer than Tq, full), random block tables; out and lse against
    the oracle on each sequence's gathered cache (causal bottom-right). 8 pairs per group with
    3 query rows stack 24 rows per map, more than one interpreted program takes (16)."""
    name, B, Tq, Tk, H, G, D, Dv, kind, lam_kind, dt, bs, splits = case
    dtype = DTYPES[dt]
    q, k, v, lam, gen = make_inputs(B, Tq, Tk, H, G, D, Dv, kind, lam_kind, seed=len(name))
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    lens = torch.randint(Tq, Tk + 1, (B,), generator=gen)
    lens[0] = Tk
    # a diagonal two keys short of a 16-key tile edge: (n - Tq + 2) % 16 == 0
    lens[1] = max(n for n in range(Tq, Tk + 1) if (n - Tq + 2) % 16 == 0)
    if B > 2:
        lens[-1] = 0
    if B > 3:
        lens[2] = max(Tq - 1, 0)             # fewer keys than queries: some rows see none
    lens = lens.to(torch.int32)
    if bs:
        kc, vc, table = _paged(k, v, lens, bs, gen)
        table = table.to(DEVICE)
    else:
        kc, vc, table = k, v, None
    dev = lambda x: None if x is None else x.to(DEVICE)  # noqa: E731
    if lam is None:
        out, lse = gpu.attention_with_kvcache(dev(q), dev(kc), dev(vc), dev(lens), table,
                                              return_softmax_lse=True, num_splits=splits)
    else:
        out, lse = gpu.diff_attention_with_kvcache(dev(q), dev(kc), dev(vc), dev(lam), dev(lens),
                                                   table, return_softmax_lse=True,
                                                   num_splits=splits)
    assert out.shape == (B, Tq, H, Dv) and out.dtype == dtype
    for b in range(B):
        n = int(lens[b])
        lam_b = None if lam is None else (lam[b:b + 1] if lam.dim() == 3 else lam)
        inputs = [q[b:b + 1], k[b:b + 1, :n], v[b:b + 1, :n], lam_b]
        r64 = oracle(*[None if x is None else x.double() for x in inputs], True)
        rlp = oracle(*inputs, True)
        check(f"{name} seq {b} out", out[b:b + 1], r64[0], rlp[0])
        check(f"{name} seq {b} lse", lse[b:b + 1], r64[1], rlp[1])


# ------------------------------------------------------------------ argument errors


def test_errors_name_the_argument():
    dev = DEVICE
    q = torch.randn(1, 4, 4, 16, device=dev)
    k = torch.randn(1, 6, 2, 16, device=dev)
    v = torch.randn(1, 6, 1, 32, device=dev)
    lam = torch.ones(2, device=dev)
    with pytest.raises(ValueError, match="k must have 2G = 2"):
        gpu.diff_attention_fwd(q, torch.randn(1, 6, 3, 16, device=dev), v, lam)
    with pytest.raises(ValueError, match="lam must have shape"):
        gpu.diff_attention_fwd(q, k, v, torch.ones(3, device=dev))
    with pytest.raises(TypeError, match="q, k and v must share one dtype"):
        gpu.diff_attention_fwd(q.half(), k, v, lam)
    with pytest.raises(TypeError, match="causal must be a bool"):
        gpu.diff_attention_fwd(q, k, v, lam, causal=1)
    with pytest.raises(ValueError, match="q must hold 2H sub-heads"):
        gpu.diff_attention_fwd(q[:, :, :3], k, v, lam)
    with pytest.raises(ValueError, match="v head dim Dv = 300"):
        gpu.attention_fwd(q, k[:, :, :1], torch.randn(1, 6, 1, 300, device=dev))
    with pytest.raises(TypeError, match="q has dtype torch.int32"):
        gpu.attention_fwd(q.int(), k, v)
    with pytest.raises(ValueError, match="k and v must hold the same keys"):
        gpu.attention_fwd(q, k[:, :, :1], v[:, :5])
    out, lse, o2 = gpu.diff_attention_fwd(q, k, v, lam)
    with pytest.raises(ValueError, match=r"lse must have shape \(1, 4, 4\)"):
        gpu.diff_attention_bwd(out, q, k, v, lam, out, lse[:, :2], o2)
    with pytest.raises(TypeError, match="deterministic must be a bool"):
        gpu.diff_attention_bwd(out, q, k, v, lam, out, lse, o2, deterministic=None)
    cu = torch.tensor([0, 4], dtype=torch.int32, device=dev)
    with pytest.raises(TypeError, match="cu_seqlens_k must be int32"):
        gpu.attention_varlen_fwd(q[0], k[0, :, :1], v[0], cu, cu.long(), 4, 6)
    if dev == "cpu":
        with pytest.raises(ValueError, match="cu_seqlens_k must rise from 0 to the 6"):
            gpu.attention_varlen_fwd(q[0], k[0, :, :1], v[0], cu, cu, 4, 6)
        with pytest.raises(ValueError, match="max_seqlen_q = 3 is below"):
            gpu.attention_varlen_fwd(q[0], k[0, :, :1], v[0], cu, torch.tensor(
                [0, 6], dtype=torch.int32), 3, 6)
    kc = torch.randn(5, 4, 2, 16, device=dev)
    vc = torch.randn(5, 4, 1, 32, device=dev)
    lens = torch.tensor([3], dtype=torch.int32, device=dev)
    table = torch.tensor([[0, 4]], dtype=torch.int32, device=dev)
    with pytest.raises(ValueError, match="block_table must have shape"):
        gpu.diff_attention_with_kvcache(q, kc, vc, lam, lens, table[0])
    with pytest.raises(TypeError, match="cache_seqlens must be int32"):
        gpu.diff_attention_with_kvcache(q, kc, vc, lam, lens.float(), table)
    with pytest.raises(ValueError, match="without block_table, k_cache must be"):
        gpu.diff_attention_with_kvcache(q, kc, vc, lam, lens)
    if dev == "cpu":
        with pytest.raises(ValueError, match=r"cache_seqlens must lie in 0..8"):
            gpu.diff_attention_with_kvcache(q, kc, vc, lam, lens + 6, table)
        with pytest.raises(ValueError, match="block_table holds block numbers outside 0..4"):
            gpu.diff_attention_with_kvcache(q, kc, vc, lam, lens + 4, table + 1)


# ------------------------------------------------------------------ CUDA only


@needs_cuda
@pytest.mark.parametrize("dt", ["bf16", "f16"])
def test_cuda_long_grouped_shapes(dt):
    """T = 1024 with 8 pairs per key/value group on the GPU: long float32 accumulations
    (dK/dV over every query row of a group) against the oracle."""
    B, T, H, G, D, Dv = 1, 1024, 8, 1, 64, 128
    q, k, v, lam, gen = make_inputs(B, T, T, H, G, D, Dv, "v1", "pair", seed=21)
    dout = torch.randn(B, T, H, Dv, generator=gen)
    check_case(q, k, v, lam, dout, True, DTYPES[dt], tag=f"cuda {dt}")


@needs_cuda
def test_cuda_deterministic_bits_and_atomic_agree():
    B, T, H, G, D, Dv = 2, 700, 8, 2, 128, 256
    q, k, v, lam, gen = make_inputs(B, T, T, H, G, D, Dv, "v1", "token", seed=22)
    q, k, v = (x.to(torch.bfloat16).cuda() for x in (q, k, v))
    lam = lam.cuda()
    dout = torch.randn(B, T, H, Dv, generator=gen).to(torch.bfloat16).cuda()
    (out, lse, o2), _ = run_gpu(q, k, v, lam, dout, True)
    det = [gpu.diff_attention_bwd(dout, q, k, v, lam, out, lse, o2, causal=True,
                                  deterministic=True) for _ in range(2)]
    for a, b in zip(*det):
        assert torch.equal(a, b)
    atomic = gpu.diff_attention_bwd(dout, q, k, v, lam, out, lse, o2, causal=True)
    for a, b in zip(det[0], atomic):
        torch.testing.assert_close(a.float(), b.float(), rtol=2e-2, atol=2e-2)


@needs_cuda
def test_cuda_autotune_keeps_results():
    q, k, v, lam, gen = make_inputs(1, 300, 300, 4, 2, 64, 128, "v1", "pair", seed=23)
    q, k, v, lam = (x.cuda() for x in (q, k, v, lam))
    q, k, v = q.half(), k.half(), v.half()
    base = gpu.diff_attention_fwd(q, k, v, lam, causal=True)
    _configs.autotune(True)
    try:
        tuned = gpu.diff_attention_fwd(q, k, v, lam, causal=True)
    finally:
        _configs.autotune(False)
    for a, b in zip(base, tuned):
        torch.testing.assert_close(a.float(), b.float(), rtol=1e-2, atol=1e-2)
