"""The public functions of diffattn.gpu: argument checks, output allocation and kernel launches.

Layouts follow docs/DESIGN.md, "The operator contract" (flash-attn's (batch, seq, head, dim)):

    q    (B, Tq, 2H, D)     pair h: sub-heads 2h (map 1) and 2h + 1 (map 2)
    k    (B, Tk, 2G, D)     V1, separate keys per map; or (B, Tk, G, D): V2, shared keys
    v    (B, Tk, G, Dv)
    lam  () or (H) or (B, Tq, H)
    out  (B, Tq, H, Dv) = softmax(s Q1 K1^T) V - lam softmax(s Q2 K2^T) V    (arXiv:2410.05258)
    lse  (B, 2H, Tq) float32, natural log;  o2 (B, Tq, H, Dv) = A2 V
    standard attention: q (B, Tq, H, D), k (B, Tk, G, D), v (B, Tk, G, Dv); lse (B, H, Tq)

Inputs are float16, bfloat16 or float32 (one dtype for q, k, v); products accumulate in float32;
out, o2 and the gradients come back in the inputs' dtypes (dlam in lam's), lse in float32.
q, k, v, dout, out and o2 may be strided views; only a non-contiguous last dimension is copied.
Tensors live on a CUDA device, or on the CPU when TRITON_INTERPRET=1 was set before Triton was
imported (Triton's interpreter: slow, for tests). The contents of cu_seqlens, cache_seqlens and
block_table are checked when they are CPU tensors; on a GPU they are trusted (as flash-attn
does), so that no call waits for the device.
"""

import contextlib
import math

import torch
import triton

from . import _configs
from ._bwd import attn_bwd_dkdv_kernel, attn_bwd_dq_kernel, attn_bwd_preprocess_kernel
from ._common import INTERPRET, LOG2E, dot_precision, next_pow2
from ._decode import attn_decode_merge_kernel, attn_decode_split_kernel
from ._fwd import attn_fwd_kernel

__all__ = [
    "diff_attention_fwd",
    "diff_attention_bwd",
    "attention_fwd",
    "attention_bwd",
    "diff_attention_varlen_fwd",
    "diff_attention_varlen_bwd",
    "attention_varlen_fwd",
    "attention_varlen_bwd",
    "diff_attention_with_kvcache",
    "attention_with_kvcache",
]

_DTYPES = {torch.float16: "float16", torch.bfloat16: "bfloat16", torch.float32: "float32"}
MAX_D = 128      # q/k head dim
MAX_DV = 256     # v head dim


# ------------------------------------------------------------------ argument checks


def _tensor(op, name, x, ndim, layout):
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() != ndim:
        raise ValueError(f"{op}: {name} must be {layout}, got shape {tuple(x.shape)}")


def _float(op, name, x):
    if x.dtype not in _DTYPES:
        raise TypeError(f"{op}: {name} has dtype {x.dtype}; expected float16, bfloat16 or float32")


def _device(op, q):
    """The device the kernels run on: CUDA, or the CPU under the interpreter."""
    if q.device.type == "cuda":
        if INTERPRET:
            raise ValueError(f"{op}: q is on {q.device} but TRITON_INTERPRET=1 is set; the "
                             f"interpreter runs CPU tensors only")
        return q.device
    if q.device.type == "cpu":
        if not INTERPRET:
            raise ValueError(f"{op}: q is a CPU tensor; the Triton kernels run on CUDA tensors, or "
                             f"on CPU tensors when TRITON_INTERPRET=1 is set before triton is "
                             f"imported (the compiled CPU kernels are diffattn.torch's)")
        return q.device
    raise ValueError(f"{op}: q is on {q.device}; the Triton kernels run on CUDA devices "
                     f"(or on the CPU under TRITON_INTERPRET=1)")


def _on(device):
    """Launches go to the tensors' GPU, not whichever is current (several GPUs, one process)."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


def _same_device(op, device, **xs):
    for name, x in xs.items():
        if x is not None and x.device != device:
            raise ValueError(f"{op}: {name} is on {x.device} but q is on {device}; all tensors "
                             f"must be on one device")


def _same_dtype(op, **xs):
    dtypes = {n: x.dtype for n, x in xs.items()}
    if len(set(dtypes.values())) > 1:
        got = ", ".join(f"{n} {d}" for n, d in dtypes.items())
        names = list(dtypes)
        raise TypeError(f"{op}: {', '.join(names[:-1])} and {names[-1]} must share one dtype, "
                        f"got {got}")


def _rows(x):
    """x with a contiguous last dimension (the kernels read rows); other strides are kept."""
    return x if x.shape[-1] <= 1 or x.stride(-1) == 1 else x.contiguous()


def _flags(op, causal, scale, D):
    if not isinstance(causal, bool):
        raise TypeError(f"{op}: causal must be a bool, got {type(causal).__name__}")
    if scale is None:
        return 1.0 / math.sqrt(D)
    if isinstance(scale, bool) or not isinstance(scale, (int, float)):
        raise TypeError(f"{op}: scale must be a number or None, got {type(scale).__name__}")
    scale = float(scale)
    if not math.isfinite(scale) or scale == 0.0:
        raise ValueError(f"{op}: scale must be finite and non-zero, got {scale}")
    return scale


def _head_dims(op, D, Dv):
    if not 1 <= D <= MAX_D:
        raise ValueError(f"{op}: q and k head dim D = {D} is outside 1..{MAX_D}")
    if not 1 <= Dv <= MAX_DV:
        raise ValueError(f"{op}: v head dim Dv = {Dv} is outside 1..{MAX_DV}")


class _Problem:
    """One call's sizes and options, derived from q, k, v once checked. Dense tensors are
    (B, T, heads, dim); varlen ones (total, heads, dim) with batch stride 0 and rows offset
    by cu_seqlens inside the kernels."""

    def __init__(self, op, q, k, v, maps, varlen, causal, scale):
        self.op = op
        self.maps = maps
        self.varlen = varlen
        pre = "(total_q, " if varlen else "(B, Tq, "
        prek = "(total_k, " if varlen else "(B, Tk, "
        qh = "2H" if maps == 2 else "H"
        nd = 3 if varlen else 4
        _tensor(op, "q", q, nd, pre + qh + ", D)")
        _tensor(op, "k", k, nd, prek + ("2G or G" if maps == 2 else "G") + ", D)")
        _tensor(op, "v", v, nd, prek + "G, Dv)")
        for name, x in (("q", q), ("k", k), ("v", v)):
            _float(op, name, x)
        _same_dtype(op, q=q, k=k, v=v)
        self.device = _device(op, q)
        _same_device(op, self.device, k=k, v=v)
        if varlen:
            q4, k4, v4 = q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0)
        else:
            q4, k4, v4 = q, k, v
        B, Tq, QH, D = q4.shape
        Bk, Tk, KH, Dk = k4.shape
        Bv, Tkv, G, Dv = v4.shape
        if not varlen and (Bk != B or Bv != B):
            raise ValueError(f"{op}: q, k and v must share the batch size B; got q "
                             f"{tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
        if Tkv != Tk:
            raise ValueError(f"{op}: k and v must hold the same keys; got k {tuple(k.shape)} and "
                             f"v {tuple(v.shape)}")
        if Dk != D:
            raise ValueError(f"{op}: k must have q's head dim D = {D}; got k {tuple(k.shape)}")
        if maps == 2 and QH % 2:
            raise ValueError(f"{op}: q must hold 2H sub-heads (pair h: 2h and 2h + 1), an even "
                             f"number; got q {tuple(q.shape)}")
        H = QH // maps
        if G < 1 or H % G:
            raise ValueError(f"{op}: v's {G} key/value heads must divide the {H} "
                             f"{'pairs' if maps == 2 else 'query heads'} of q; got q "
                             f"{tuple(q.shape)}, v {tuple(v.shape)}")
        if maps == 2 and KH == 2 * G:
            shared = False
        elif KH == G:
            shared = maps == 2
        else:
            want = f"2G = {2 * G} (V1) or G = {G} (V2, shared keys)" if maps == 2 else f"G = {G}"
            raise ValueError(f"{op}: k must have {want} heads (G from v {tuple(v.shape)}); got k "
                             f"{tuple(k.shape)}")
        _head_dims(op, D, Dv)
        self.scale = _flags(op, causal, scale, D)
        self.causal = causal
        self.B, self.Tq, self.Tk, self.H, self.G, self.D, self.Dv = B, Tq, Tk, H, G, D, Dv
        self.QPG = H // G
        self.shared = shared
        self.dtype = q.dtype
        self.q, self.k, self.v = _rows(q4), _rows(k4), _rows(v4)

    def strides(self, x4):
        """(batch, row, head) element strides of a 4-D view; batch 0 for varlen."""
        return (0 if self.varlen else x4.stride(0)), x4.stride(1), x4.stride(2)

    def check_lam(self, lam):
        return _check_lam(self.op, lam, self.H, self.B, self.Tq, self.varlen, self.device)


def _check_lam(op, lam, H, B, Tq, varlen, device):
    """lam as () / (H) / (B, Tq, H) (varlen: (total_q, H)); returns (lam, its (batch, row,
    pair) strides, 0 where it broadcasts)."""
    per_token = "(total_q, H)" if varlen else "(B, Tq, H)"
    if not isinstance(lam, torch.Tensor):
        raise TypeError(f"{op}: lam must be a torch.Tensor of shape (), (H) or {per_token}, got "
                        f"{type(lam).__name__}")
    if not lam.is_floating_point():
        raise TypeError(f"{op}: lam must be a floating tensor, got dtype {lam.dtype}")
    _same_device(op, device, lam=lam)
    if lam.dtype == torch.float64:
        lam = lam.to(torch.float32)
    if lam.dim() == 0:
        return lam, (0, 0, 0)
    if lam.dim() == 1 and lam.shape[0] == H:
        return lam, (0, 0, lam.stride(0))
    if varlen and lam.dim() == 2 and tuple(lam.shape) == (Tq, H):
        return lam, (0, lam.stride(0), lam.stride(1))
    if not varlen and lam.dim() == 3 and tuple(lam.shape) == (B, Tq, H):
        return lam, lam.stride()
    want = f"(), ({H}) or ({Tq}, {H})" if varlen else f"(), ({H}) or ({B}, {Tq}, {H})"
    raise ValueError(f"{op}: lam must have shape {want} (H = {H} pairs), got {tuple(lam.shape)}")


def _check_cu_seqlens(op, p, cu_q, cu_k, max_q, max_k):
    """cu_seqlens_q/k: int32 (B + 1) offsets into the packed rows, as flash-attn takes them."""
    for name, cu in (("cu_seqlens_q", cu_q), ("cu_seqlens_k", cu_k)):
        if not isinstance(cu, torch.Tensor):
            raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(cu).__name__}")
        if cu.dtype != torch.int32:
            raise TypeError(f"{op}: {name} must be int32, got {cu.dtype}")
        if cu.dim() != 1 or cu.shape[0] < 2:
            raise ValueError(f"{op}: {name} must be (B + 1) offsets with B >= 1, got shape "
                             f"{tuple(cu.shape)}")
        _same_device(op, p.device, **{name: cu})
    if cu_q.shape[0] != cu_k.shape[0]:
        raise ValueError(f"{op}: cu_seqlens_q and cu_seqlens_k must have the same length B + 1, "
                         f"got {cu_q.shape[0]} and {cu_k.shape[0]}")
    for name, m in (("max_seqlen_q", max_q), ("max_seqlen_k", max_k)):
        if isinstance(m, bool) or not isinstance(m, int) or m < 0:
            raise TypeError(f"{op}: {name} must be a non-negative int, got {m!r}")
    if p.device.type == "cpu":
        for name, cu, total, m in (("cu_seqlens_q", cu_q, p.Tq, max_q),
                                   ("cu_seqlens_k", cu_k, p.Tk, max_k)):
            c = cu.tolist()
            lens = [b - a for a, b in zip(c, c[1:])]
            if c[0] != 0 or min(lens) < 0 or c[-1] != total:
                raise ValueError(f"{op}: {name} must rise from 0 to the {total} packed rows, got "
                                 f"{c}")
            if max(lens) > m:
                raise ValueError(f"{op}: max_seqlen_{name[-1]} = {m} is below the longest "
                                 f"sequence ({max(lens)} rows)")
    p.B = cu_q.shape[0] - 1


def _launch_plan(kernel, p, run):
    """Pick a tiling (see _configs) and return it."""
    cands = _configs.candidates(kernel, p.maps, max(16, next_pow2(p.D)), max(16, next_pow2(p.Dv)),
                                p.q.element_size())
    key = (p.maps, p.shared, p.causal, p.varlen, p.D, p.Dv, str(p.dtype),
           min(next_pow2(max(p.Tq, p.Tk)), 1 << 14))
    return _configs.pick(kernel, key, cands, run, p.device)


def _meta(p, tiles):
    return dict(MAPS=p.maps, SHARED_K=p.shared, CAUSAL=p.causal, VARLEN=p.varlen, D=p.D, DV=p.Dv,
                BLOCK_D=max(16, next_pow2(p.D)), BLOCK_DV=max(16, next_pow2(p.Dv)),
                BLOCK_M=tiles.BLOCK_M, BLOCK_N=tiles.BLOCK_N,
                DOT_PREC=dot_precision(_DTYPES[p.dtype]), num_warps=tiles.num_warps,
                num_stages=tiles.num_stages)


# ------------------------------------------------------------------ forward


def _forward(p, lam, lam_strides, cu_q, cu_k):
    """out (B, Tq, H, Dv) [varlen: (1, total_q, ...)], lse, o2 (None for standard)."""
    B, Tq, H, Dv = p.B, p.Tq, p.H, p.Dv   # varlen: B sequences, Tq packed rows
    nb = 1 if p.varlen else B
    out = torch.empty((nb, Tq, H, Dv), dtype=p.dtype, device=p.device)
    o2 = torch.empty_like(out) if p.maps == 2 else None
    lse = torch.empty((nb, p.maps * H, Tq), dtype=torch.float32, device=p.device)
    if out.numel() == 0:
        lse.fill_(float("inf"))
        return out, lse, o2
    qk_scale = p.scale * LOG2E
    s_lse = (0 if p.varlen else lse.stride(0)), lse.stride(1)
    max_q = p.max_q if p.varlen else Tq
    max_k = p.max_k if p.varlen else p.Tk

    def run(tiles):
        grid = (H, triton.cdiv(max_q, tiles.BLOCK_M), B)
        attn_fwd_kernel[grid](
            p.q, p.k, p.v, lam, out, o2, lse, cu_q, cu_k, qk_scale,
            *p.strides(p.q), *p.strides(p.k), *p.strides(p.v), *lam_strides,
            *p.strides(out), *s_lse, max_q, max_k, p.QPG, **_meta(p, tiles))

    if max_q > 0:
        with _on(p.device):
            run(_launch_plan("fwd", p, run))
    return out, lse, o2


def diff_attention_fwd(q, k, v, lam, causal=False, scale=None):
    """Differential attention forward (arXiv:2410.05258, Eq. 1).

    q (B, Tq, 2H, D), k (B, Tk, 2G, D) [V1] or (B, Tk, G, D) [V2, shared keys], v (B, Tk, G, Dv),
    lam () or (H) or (B, Tq, H). Returns (out, lse, o2): out, o2 (B, Tq, H, Dv) in q's dtype,
    lse (B, 2H, Tq) float32. causal: query i sees key j iff j <= i + Tk - Tq."""
    op = "diff_attention_fwd"
    p = _Problem(op, q, k, v, 2, False, causal, scale)
    lam, lam_strides = p.check_lam(lam)
    return _forward(p, lam, lam_strides, None, None)


def attention_fwd(q, k, v, causal=False, scale=None):
    """Standard attention forward: q (B, Tq, H, D), k (B, Tk, G, D), v (B, Tk, G, Dv).
    Returns (out (B, Tq, H, Dv) in q's dtype, lse (B, H, Tq) float32)."""
    op = "attention_fwd"
    p = _Problem(op, q, k, v, 1, False, causal, scale)
    out, lse, _ = _forward(p, None, (0, 0, 0), None, None)
    return out, lse


def _varlen_problem(op, q, k, v, maps, cu_q, cu_k, max_q, max_k, causal, scale):
    p = _Problem(op, q, k, v, maps, True, causal, scale)
    _check_cu_seqlens(op, p, cu_q, cu_k, max_q, max_k)
    p.max_q, p.max_k = max_q, max_k
    return p


def diff_attention_varlen_fwd(q, k, v, lam, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                              max_seqlen_k, causal=False, scale=None):
    """Differential attention over packed sequences (flash-attn's varlen layout): q
    (total_q, 2H, D), k (total_k, 2G|G, D), v (total_k, G, Dv), lam () or (H) or (total_q, H);
    sequence b holds rows cu_seqlens_q[b]:cu_seqlens_q[b + 1] (int32). Returns out, o2
    (total_q, H, Dv) and lse (2H, total_q) float32; causal is bottom-right per sequence."""
    op = "diff_attention_varlen_fwd"
    p = _varlen_problem(op, q, k, v, 2, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                        max_seqlen_k, causal, scale)
    lam, lam_strides = p.check_lam(lam)
    out, lse, o2 = _forward(p, lam, lam_strides, cu_seqlens_q, cu_seqlens_k)
    return out[0], lse[0], o2[0]


def attention_varlen_fwd(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                         causal=False, scale=None):
    """Standard attention over packed sequences: q (total_q, H, D), k (total_k, G, D),
    v (total_k, G, Dv). Returns (out (total_q, H, Dv), lse (H, total_q) float32)."""
    op = "attention_varlen_fwd"
    p = _varlen_problem(op, q, k, v, 1, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                        max_seqlen_k, causal, scale)
    out, lse, _ = _forward(p, None, (0, 0, 0), cu_seqlens_q, cu_seqlens_k)
    return out[0], lse[0]


# ------------------------------------------------------------------ backward


def _saved(op, p, name, x, shape, dtype=None):
    _tensor(op, name, x, len(shape), str(shape))
    if tuple(x.shape) != tuple(shape):
        raise ValueError(f"{op}: {name} must have shape {tuple(shape)}, got {tuple(x.shape)}")
    if dtype is not None and x.dtype != dtype:
        raise TypeError(f"{op}: {name} must be {dtype}, got {x.dtype}")
    if dtype is None:
        _float(op, name, x)
    _same_device(op, p.device, **{name: x})
    return _rows(x)


def _bwd_splits(p, tiles):
    """How many programs share a group's pairs in the key-block kernel: enough programs to fill
    the GPU (two per multiprocessor) when the grid of key blocks x groups x batch is small."""
    forced = _configs.forced("bwd_splits")
    if forced is not None:
        return max(1, min(int(forced), p.QPG))
    if p.device.type != "cuda":
        return 1
    sms = torch.cuda.get_device_properties(p.device).multi_processor_count
    max_k = p.max_k if p.varlen else p.Tk
    programs = triton.cdiv(max_k, tiles.BLOCK_N) * p.G * p.B
    return max(1, min(p.QPG, triton.cdiv(2 * sms, max(programs, 1))))


def _backward(p, dout, out, lse, o2, lam, lam_strides, deterministic, cu_q, cu_k):
    """(dq, dk, dv, delta) in the 4-D (varlen: leading 1) layouts; delta (nb, MAPS*H, rows)."""
    op = p.op
    if not isinstance(deterministic, bool):
        raise TypeError(f"{op}: deterministic must be a bool, got {type(deterministic).__name__}")
    B, H, Dv, maps = p.B, p.H, p.Dv, p.maps
    nb = 1 if p.varlen else B
    rows = p.Tq
    o_shape = (rows, H, Dv) if p.varlen else (B, rows, H, Dv)
    s_shape = (maps * H, rows) if p.varlen else (B, maps * H, rows)
    dout = _saved(op, p, "dout", dout, o_shape)
    out = _saved(op, p, "out", out, o_shape)
    lse = _saved(op, p, "lse", lse, s_shape, torch.float32).contiguous()
    if maps == 2:
        o2 = _saved(op, p, "o2", o2, o_shape)
    if p.varlen:
        dout, out, lse = dout.unsqueeze(0), out.unsqueeze(0), lse.unsqueeze(0)
        o2 = o2.unsqueeze(0) if maps == 2 else None
    max_q = p.max_q if p.varlen else p.Tq
    max_k = p.max_k if p.varlen else p.Tk

    dq = torch.empty(p.q.shape, dtype=p.dtype, device=p.device)
    dk = torch.empty(p.k.shape, dtype=p.dtype, device=p.device)
    dv = torch.empty(p.v.shape, dtype=p.dtype, device=p.device)
    delta = torch.zeros((nb, maps * H, rows), dtype=torch.float32, device=p.device)
    if p.q.numel() == 0 or p.k.numel() == 0 or p.v.numel() == 0 or max_q == 0 or max_k == 0:
        dq.zero_(), dk.zero_(), dv.zero_()
        return dq, dk, dv, delta
    s_lse = (0 if p.varlen else lse.stride(0)), lse.stride(1)
    scale = p.scale
    qk_scale = scale * LOG2E

    # preprocess: D1 = rowsum(dout (out + lam o2)), R2 = rowsum(dout o2)
    # (standard attention: D = rowsum(dout out))
    # ~96 float32 values of dout, out and o2 per thread of 4 warps
    pre_m = 16 if INTERPRET else max(16, min(64, 4096 // max(16, next_pow2(Dv))))
    attn_bwd_preprocess_kernel[(H, triton.cdiv(max_q, pre_m), B)](
        dout, out, o2, lam, delta, cu_q,
        *p.strides(dout), *p.strides(out), *(p.strides(o2) if maps == 2 else (0, 0, 0)),
        *lam_strides, *s_lse, max_q,
        MAPS=maps, VARLEN=p.varlen, DV=Dv, BLOCK_DV=max(16, next_pow2(Dv)), BLOCK_M=pre_m,
        num_warps=4)

    atomic = not deterministic
    dq_acc = torch.zeros(p.q.shape, dtype=torch.float32, device=p.device) if atomic else None
    common = (p.q, p.k, p.v, lam, dout, lse, delta)

    def run_dkdv(tiles, splits, dk_out, dv_out):
        meta = _meta(p, tiles)
        # (split, batch, row, head) strides; split 0 when writing dk, dv themselves
        if splits > 1:
            s_dk = (dk_out.stride(0),) + p.strides(dk_out[0])
            s_dv = (dv_out.stride(0),) + p.strides(dv_out[0])
        else:
            s_dk, s_dv = (0,) + p.strides(dk_out), (0,) + p.strides(dv_out)
        grid = (triton.cdiv(max_k, tiles.BLOCK_N), p.G * splits, B)
        attn_bwd_dkdv_kernel[grid](
            *common, dq_acc, dk_out, dv_out, cu_q, cu_k, qk_scale, scale,
            *p.strides(p.q), *p.strides(p.k), *p.strides(p.v), *lam_strides, *p.strides(dout),
            *s_lse, *(p.strides(dq_acc) if atomic else (0, 0, 0)), *s_dk, *s_dv,
            max_q, max_k, p.QPG, splits, ATOMIC_DQ=atomic, **meta)

    def tune_dkdv(tiles):
        run_dkdv(tiles, 1, dk, dv)

    tiles = _launch_plan("bwd_dkdv", p, tune_dkdv)
    if atomic:
        dq_acc.zero_()  # tuning runs (if any) added to it
    splits = _bwd_splits(p, tiles)
    if splits == 1:
        run_dkdv(tiles, 1, dk, dv)
    else:
        dk_part = torch.empty((splits,) + tuple(p.k.shape), dtype=torch.float32, device=p.device)
        dv_part = torch.empty((splits,) + tuple(p.v.shape), dtype=torch.float32, device=p.device)
        run_dkdv(tiles, splits, dk_part, dv_part)
        dk.copy_(dk_part.sum(0))  # in split order: deterministic
        dv.copy_(dv_part.sum(0))

    if atomic:
        dq.copy_(dq_acc.mul_(scale))
    else:
        def run_dq(tiles):
            grid = (H, triton.cdiv(max_q, tiles.BLOCK_M), B)
            attn_bwd_dq_kernel[grid](
                *common, dq, cu_q, cu_k, qk_scale, scale,
                *p.strides(p.q), *p.strides(p.k), *p.strides(p.v), *lam_strides,
                *p.strides(dout), *s_lse, *p.strides(dq), max_q, max_k, p.QPG, **_meta(p, tiles))

        run_dq(_launch_plan("bwd_dq", p, run_dq))
    return dq, dk, dv, delta


def _dlam(lam, delta, varlen):
    """dlam = -rowsum(dout o o2) = -R2, shaped like lam: summed over tokens (and pairs)."""
    r2 = delta[:, 1::2, :]                                         # (nb, H, rows)
    if lam.dim() == 0:
        g = -r2.sum()
    elif lam.dim() == 1:
        g = -r2.sum(dim=(0, 2))
    else:
        g = -r2.permute(0, 2, 1)                                   # (B, Tq, H)
        if varlen:
            g = g[0]                                               # (total_q, H)
    return g.to(lam.dtype).contiguous()


def diff_attention_bwd(dout, q, k, v, lam, out, lse, o2, causal=False, scale=None,
                       deterministic=False):
    """Gradients of diff_attention_fwd from its saved (out, lse, o2); no forward is rerun.
    dout (B, Tq, H, Dv). Returns (dq, dk, dv, dlam) shaped like (q, k, v, lam). deterministic:
    dQ by its own kernel instead of atomic adds (the same result on every run)."""
    op = "diff_attention_bwd"
    p = _Problem(op, q, k, v, 2, False, causal, scale)
    lam_in = lam
    lam, lam_strides = p.check_lam(lam)
    with _on(p.device):
        dq, dk, dv, delta = _backward(p, dout, out, lse, o2, lam, lam_strides,
                                      deterministic, None, None)
    return dq, dk, dv, _dlam(lam_in, delta, False)


def attention_bwd(dout, q, k, v, out, lse, causal=False, scale=None, deterministic=False):
    """Gradients of attention_fwd from its saved (out, lse): returns (dq, dk, dv)."""
    op = "attention_bwd"
    p = _Problem(op, q, k, v, 1, False, causal, scale)
    with _on(p.device):
        dq, dk, dv, _ = _backward(p, dout, out, lse, None, None, (0, 0, 0), deterministic,
                                  None, None)
    return dq, dk, dv


def diff_attention_varlen_bwd(dout, q, k, v, lam, out, lse, o2, cu_seqlens_q, cu_seqlens_k,
                              max_seqlen_q, max_seqlen_k, causal=False, scale=None,
                              deterministic=False):
    """Gradients of diff_attention_varlen_fwd: dout (total_q, H, Dv), lse (2H, total_q).
    Returns (dq, dk, dv, dlam) shaped like (q, k, v, lam)."""
    op = "diff_attention_varlen_bwd"
    p = _varlen_problem(op, q, k, v, 2, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                        max_seqlen_k, causal, scale)
    lam_in = lam
    lam, lam_strides = p.check_lam(lam)
    with _on(p.device):
        dq, dk, dv, delta = _backward(p, dout, out, lse, o2, lam, lam_strides,
                                      deterministic, cu_seqlens_q, cu_seqlens_k)
    return dq[0], dk[0], dv[0], _dlam(lam_in, delta, True)


def attention_varlen_bwd(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                         max_seqlen_k, causal=False, scale=None, deterministic=False):
    """Gradients of attention_varlen_fwd: returns (dq, dk, dv)."""
    op = "attention_varlen_bwd"
    p = _varlen_problem(op, q, k, v, 1, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                        max_seqlen_k, causal, scale)
    with _on(p.device):
        dq, dk, dv, _ = _backward(p, dout, out, lse, None, None, (0, 0, 0), deterministic,
                                  cu_seqlens_q, cu_seqlens_k)
    return dq[0], dk[0], dv[0]


# ------------------------------------------------------------------ decode against a KV cache


def _decode(op, maps, q, k_cache, v_cache, lam, cache_seqlens, block_table, scale, causal,
            return_softmax_lse, num_splits):
    qh = "2H" if maps == 2 else "H"
    _tensor(op, "q", q, 4, f"(B, Tq, {qh}, D)")
    paged = block_table is not None
    kl = "(num_blocks, block_size, " if paged else "(B, Tk_max, "
    _tensor(op, "k_cache", k_cache, 4, kl + ("2G or G" if maps == 2 else "G") + ", D)")
    _tensor(op, "v_cache", v_cache, 4, kl + "G, Dv)")
    for name, x in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        _float(op, name, x)
    _same_dtype(op, q=q, k_cache=k_cache, v_cache=v_cache)
    device = _device(op, q)
    _same_device(op, device, k_cache=k_cache, v_cache=v_cache)
    B, Tq, QH, D = q.shape
    NB, BS, KH, Dk = k_cache.shape
    NBv, BSv, G, Dv = v_cache.shape
    if (NBv, BSv) != (NB, BS):
        raise ValueError(f"{op}: k_cache and v_cache must have the same first two dims, got "
                         f"k_cache {tuple(k_cache.shape)} and v_cache {tuple(v_cache.shape)}")
    if Dk != D:
        raise ValueError(f"{op}: k_cache must have q's head dim D = {D}; got k_cache "
                         f"{tuple(k_cache.shape)}")
    if maps == 2 and QH % 2:
        raise ValueError(f"{op}: q must hold 2H sub-heads (pair h: 2h and 2h + 1), an even "
                         f"number; got q {tuple(q.shape)}")
    H = QH // maps
    if G < 1 or H % G:
        raise ValueError(f"{op}: v_cache's {G} key/value heads must divide the {H} "
                         f"{'pairs' if maps == 2 else 'query heads'} of q; got q {tuple(q.shape)}, "
                         f"v_cache {tuple(v_cache.shape)}")
    if maps == 2 and KH == 2 * G:
        shared = False
    elif KH == G:
        shared = maps == 2
    else:
        want = f"2G = {2 * G} (V1) or G = {G} (V2)" if maps == 2 else f"G = {G}"
        raise ValueError(f"{op}: k_cache must have {want} heads; got k_cache "
                         f"{tuple(k_cache.shape)}")
    _head_dims(op, D, Dv)
    scale = _flags(op, causal, scale, D)
    if not isinstance(return_softmax_lse, bool):
        raise TypeError(f"{op}: return_softmax_lse must be a bool, got "
                        f"{type(return_softmax_lse).__name__}")
    if isinstance(num_splits, bool) or not isinstance(num_splits, int) or num_splits < 0:
        raise ValueError(f"{op}: num_splits must be an int >= 0 (0: chosen here), got "
                         f"{num_splits!r}")
    if not isinstance(cache_seqlens, torch.Tensor):
        raise TypeError(f"{op}: cache_seqlens must be a torch.Tensor (B,) int32, got "
                        f"{type(cache_seqlens).__name__}")
    if cache_seqlens.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"{op}: cache_seqlens must be int32, got {cache_seqlens.dtype}")
    if tuple(cache_seqlens.shape) != (B,):
        raise ValueError(f"{op}: cache_seqlens must have shape ({B},), got "
                         f"{tuple(cache_seqlens.shape)}")
    _same_device(op, device, cache_seqlens=cache_seqlens)
    if paged:
        if not isinstance(block_table, torch.Tensor):
            raise TypeError(f"{op}: block_table must be a torch.Tensor (B, max_blocks) int32 or "
                            f"None, got {type(block_table).__name__}")
        if block_table.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"{op}: block_table must be int32, got {block_table.dtype}")
        if block_table.dim() != 2 or block_table.shape[0] != B:
            raise ValueError(f"{op}: block_table must have shape ({B}, max_blocks), got "
                             f"{tuple(block_table.shape)}")
        _same_device(op, device, block_table=block_table)
        capacity = block_table.shape[1] * BS
    else:
        if NB != B:
            raise ValueError(f"{op}: without block_table, k_cache must be (B, Tk_max, heads, D) "
                             f"with B = {B}; got k_cache {tuple(k_cache.shape)}")
        capacity = BS
    if device.type == "cpu":
        lens = cache_seqlens.tolist()
        if lens and (min(lens) < 0 or max(lens) > capacity):
            raise ValueError(f"{op}: cache_seqlens must lie in 0..{capacity} (the cache's "
                             f"capacity per sequence), got {lens}")
        if paged and block_table.numel():
            used = [block_table[b, :triton.cdiv(n, BS)] for b, n in enumerate(lens)]
            used = torch.cat(used) if used else block_table.new_zeros(0)
            if used.numel() and (int(used.min()) < 0 or int(used.max()) >= NB):
                raise ValueError(f"{op}: block_table holds block numbers outside 0..{NB - 1} "
                                 f"(k_cache has {NB} blocks)")

    if maps == 2:
        lam, lam_strides = _check_lam(op, lam, H, B, Tq, False, device)
    else:
        lam, lam_strides = None, (0, 0, 0)

    q, k_cache, v_cache = _rows(q), _rows(k_cache), _rows(v_cache)
    QPG = H // G
    out = torch.empty((B, Tq, H, Dv), dtype=q.dtype, device=device)
    lse = torch.empty((B, maps * H, Tq), dtype=torch.float32, device=device)
    if out.numel() == 0:
        lse.fill_(float("inf"))
        return (out, lse) if return_softmax_lse else out

    block_dv = max(16, next_pow2(Dv))
    cands = _configs.candidates("decode", maps, max(16, next_pow2(D)), block_dv, q.element_size())
    rows = QPG * Tq

    def plan(tiles):
        block_r = min(max(16, next_pow2(rows)), max(16, tiles.BLOCK_M))
        n_rb = triton.cdiv(rows, block_r)
        n_tiles = max(1, triton.cdiv(capacity, tiles.BLOCK_N))
        splits = num_splits or _configs.forced("decode_splits", 0)
        if not splits:
            sms = (torch.cuda.get_device_properties(device).multi_processor_count
                   if device.type == "cuda" else 2)
            # enough programs for ~4 per multiprocessor, each at least 4 tiles of keys
            splits = min(triton.cdiv(4 * sms, B * G * n_rb), triton.cdiv(n_tiles, 4))
        splits = max(1, min(splits, n_tiles))
        keys_per_split = triton.cdiv(n_tiles, splits) * tiles.BLOCK_N
        splits = triton.cdiv(max(capacity, 1), keys_per_split)
        return block_r, n_rb, splits, keys_per_split

    def run(tiles):
        block_r, n_rb, splits, kps = plan(tiles)
        lse_part = torch.empty((B, G * n_rb, splits, maps, block_r), dtype=torch.float32,
                               device=device)
        o_part = torch.empty(lse_part.shape + (block_dv,), dtype=torch.float32, device=device)
        bt = block_table if paged else None
        s_blk = (k_cache.stride(0), k_cache.stride(1), k_cache.stride(2))
        s_vblk = (v_cache.stride(0), v_cache.stride(1), v_cache.stride(2))
        attn_decode_split_kernel[(splits, G * n_rb, B)](
            q, k_cache, v_cache, cache_seqlens, bt, o_part, lse_part, scale * LOG2E,
            q.stride(0), q.stride(1), q.stride(2), *s_blk, *s_vblk,
            block_table.stride(0) if paged else 0, *lse_part.stride()[:4],
            Tq, QPG, n_rb, kps, BS,
            MAPS=maps, SHARED_K=shared, CAUSAL=causal, PAGED=paged, D=D, DV=Dv,
            BLOCK_D=max(16, next_pow2(D)), BLOCK_DV=block_dv, BLOCK_R=block_r,
            BLOCK_N=tiles.BLOCK_N, DOT_PREC=dot_precision(_DTYPES[q.dtype]),
            num_warps=tiles.num_warps, num_stages=tiles.num_stages)
        block_c = min(block_dv, _configs.MERGE_BLOCK_C)
        attn_decode_merge_kernel[(G * n_rb, B, block_dv // block_c)](
            o_part, lse_part, cache_seqlens, lam, out, lse, *lse_part.stride()[:4],
            *lam_strides, *out.stride()[:3], lse.stride(0), lse.stride(1), Tq, QPG, n_rb, kps,
            MAPS=maps, DV=Dv, BLOCK_DV=block_dv, BLOCK_R=block_r, BLOCK_C=block_c, num_warps=4)

    key = (maps, shared, causal, paged, D, Dv, str(q.dtype), QPG * Tq,
           min(next_pow2(capacity), 1 << 17))
    with _on(device):
        run(_configs.pick("decode", key, cands, run, device))
    return (out, lse) if return_softmax_lse else out


def diff_attention_with_kvcache(q, k_cache, v_cache, lam, cache_seqlens, block_table=None,
                                scale=None, causal=True, return_softmax_lse=False, num_splits=0):
    """Differential attention of the Tq newest tokens against a KV cache (flash-attn's
    flash_attn_with_kvcache names). q (B, Tq, 2H, D) with small Tq (1 for decode); k_cache
    (num_blocks, block_size, 2G|G, D) and v_cache (num_blocks, block_size, G, Dv) with
    block_table (B, max_blocks) int32, or without block_table (B, Tk_max, 2G|G, D) and
    (B, Tk_max, G, Dv); cache_seqlens (B,) int32 keys held per sequence, the query tokens
    included (causal: query t sees keys j <= t + cache_seqlens[b] - Tq). lam () or (H) or
    (B, Tq, H). Returns out (B, Tq, H, Dv) in q's dtype, and lse (B, 2H, Tq) float32 with
    return_softmax_lse. num_splits: key splits per sequence (0: chosen from the cache's size)."""
    return _decode("diff_attention_with_kvcache", 2, q, k_cache, v_cache, lam, cache_seqlens,
                   block_table, scale, causal, return_softmax_lse, num_splits)


def attention_with_kvcache(q, k_cache, v_cache, cache_seqlens, block_table=None, scale=None,
                           causal=True, return_softmax_lse=False, num_splits=0):
    """Standard attention against a KV cache: q (B, Tq, H, D), k_cache (.., G, D), v_cache
    (.., G, Dv); as diff_attention_with_kvcache otherwise (lse (B, H, Tq))."""
    return _decode("attention_with_kvcache", 1, q, k_cache, v_cache, None, cache_seqlens,
                   block_table, scale, causal, return_softmax_lse, num_splits)
