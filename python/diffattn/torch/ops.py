"""diffattn.torch.ops: the operators as PyTorch custom ops (torch.library.custom_op, namespace
`diffattn`), with fake (meta) kernels for torch.compile and autograd formulas that hand the
forward's saved statistics to the backward kernel.

    torch.ops.diffattn.diff_attention_fwd(q, k, v, lam, causal, scale, backend) -> (out, lse, o2)
    torch.ops.diffattn.diff_attention_bwd(dout, q, k, v, lam, out, lse, o2, causal, scale,
                                          backend) -> (dq, dk, dv, dlam)
    torch.ops.diffattn.attention_fwd(q, k, v, causal, scale, backend) -> (out, lse)
    torch.ops.diffattn.attention_bwd(dout, q, k, v, out, lse, causal, scale, backend)
                                          -> (dq, dk, dv)
    torch.ops.diffattn.diff_attention_with_kvcache(q, k_cache, v_cache, lam, cache_seqlens,
                                                   block_table, scale, backend) -> out
    torch.ops.diffattn.attention_with_kvcache(q, k_cache, v_cache, cache_seqlens, block_table,
                                              scale, backend) -> out

Layouts (docs/DESIGN.md, "The operator contract"): q (B, Tq, 2H, D), k (B, Tk, 2G, D) (V1) or
(B, Tk, G, D) (V2, shared keys), v (B, Tk, G, Dv), lam (H) or (B, Tq, H); out (B, Tq, H, Dv),
lse (B, 2H, Tq) float32, o2 (B, Tq, H, Dv) map 2's output. Standard attention: q (B, Tq, H, D),
k (B, Tk, G, D). The backward writes each gradient with its input's strides.

Backends: "auto" runs the C++ kernels on CPU tensors and the Triton kernels (diffattn.gpu) on
CUDA tensors; "fused" and "reference" force a C++ kernel (CPU tensors); "triton" forces the
Triton kernels on any device (CPU tensors under TRITON_INTERPRET=1). The C++ kernels take
float32 (the public functions diff_attention/attention convert other dtypes); the Triton
kernels take float32, float16 and bfloat16 and accumulate in float32. Tensors reach the C++
kernels by address, shape and strides: no copy, no NumPy.
"""

from typing import Optional

import torch
from torch import Tensor

from ._checks import (as_f32, check_backend, check_flags, check_same, check_tensor,
                      materialised)

__all__ = ["diff_attention", "attention", "diff_attention_with_kvcache",
           "attention_with_kvcache"]


def _core():
    """The compiled C++ kernels (imported when first needed: the Triton path runs without)."""
    from .. import _core as core
    return core


def _gpu():
    from .. import gpu
    return gpu


def _raw(t):
    """(address, shape, strides in elements) of a float32 CPU tensor, as the C++ side takes it."""
    return (t.data_ptr(), tuple(t.shape), tuple(t.stride()))


def _triton(op, device, backend):
    """Whether this call runs the Triton kernels: backend "triton", or "auto" on CUDA."""
    if backend == "triton":
        return True
    if device.type == "cuda":
        if backend == "auto":
            return True
        raise ValueError(f"{op}: backend {backend!r} runs on CPU tensors; CUDA tensors take "
                         f"'auto' or 'triton'")
    return False


def _cpp_inputs(op, **xs):
    """The C++ kernels read float32 host memory: anything else reaching them is an error here
    (the public functions convert), never a misread buffer."""
    for name, x in xs.items():
        if x is None:
            continue
        if x.device.type != "cpu" or x.dtype != torch.float32:
            raise TypeError(f"{op}: the C++ kernels take float32 CPU tensors; {name} is "
                            f"{x.dtype} on {x.device} (diff_attention/attention convert, or use "
                            f"backend='triton')")


def _op_shapes(op, q, k, v, lam):
    """Sizes of a call (the kernels check every layout again); enough to allocate outputs."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x.dim() != 4:
            raise ValueError(f"{op}: {name} must have 4 dimensions, got shape {tuple(x.shape)}")
    if lam is not None and lam.dim() not in (1, 3):
        raise ValueError(f"{op}: lam must be (H) or (B, Tq, H), got shape {tuple(lam.shape)}")
    B, Tq, Hq, _ = q.shape
    if lam is not None and Hq % 2:
        raise ValueError(f"{op}: q must have 2H sub-heads (an even count), got {Hq}")
    return B, Tq, Hq, v.shape[3]


# ------------------------------------------------------------------ differential attention


def _one_lambda(lam):
    """lam (1) (one lambda for every pair, a V1 layer's) as the Triton interface takes it: a
    0-d tensor (its gradient comes back 0-d and is reshaped to (1))."""
    return lam.reshape(()) if lam.dim() == 1 and lam.shape[0] == 1 else lam


@torch.library.custom_op("diffattn::diff_attention_fwd", mutates_args=())
def diff_attention_fwd(q: Tensor, k: Tensor, v: Tensor, lam: Tensor, causal: bool,
                       scale: Optional[float], backend: str) -> tuple[Tensor, Tensor, Tensor]:
    op = "diff_attention"
    B, Tq, H2, Dv = _op_shapes(op, q, k, v, lam)
    if _triton(op, q.device, backend):
        out, lse, o2 = _gpu().diff_attention_fwd(q, k, v, _one_lambda(lam), causal=causal,
                                                 scale=scale)
        return out.to(q.dtype), lse.float(), o2.to(q.dtype)
    _cpp_inputs(op, q=q, k=k, v=v, lam=lam)
    out = q.new_empty((B, Tq, H2 // 2, Dv))
    lse = q.new_empty((B, H2, Tq))
    o2 = q.new_empty((B, Tq, H2 // 2, Dv))
    lam = lam.contiguous()
    _core()._attention_fwd_raw(_raw(q), _raw(k), _raw(v), _raw(lam), _raw(out), _raw(lse),
                               _raw(o2), causal, scale, backend)
    return out, lse, o2


@diff_attention_fwd.register_fake
def _(q, k, v, lam, causal, scale, backend):
    B, Tq, H2, Dv = _op_shapes("diff_attention", q, k, v, lam)
    out = q.new_empty((B, Tq, H2 // 2, Dv))
    return out, q.new_empty((B, H2, Tq), dtype=torch.float32), torch.empty_like(out)


def _grad_like(x):
    """An uninitialised gradient with x's shape, dtype and strides (the kernels' layout)."""
    return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device=x.device)


def _in_layout(g, x):
    """g (a gradient the Triton kernels returned) in x's layout, as the fake kernel says."""
    if g.stride() == x.stride() and g.dtype == x.dtype:
        return g
    out = _grad_like(x)
    out.copy_(g)
    return out


@torch.library.custom_op("diffattn::diff_attention_bwd", mutates_args=())
def diff_attention_bwd(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, lam: Tensor, out: Tensor,
                       lse: Tensor, o2: Tensor, causal: bool, scale: Optional[float],
                       backend: str) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    op = "diff_attention backward"
    _op_shapes(op, q, k, v, lam)
    if _triton(op, q.device, backend):
        dq, dk, dv, dlam = _gpu().diff_attention_bwd(
            dout, q, k, v, _one_lambda(lam), out, lse, o2, causal=causal, scale=scale,
            deterministic=torch.are_deterministic_algorithms_enabled())
        return (_in_layout(dq, q), _in_layout(dk, k), _in_layout(dv, v),
                dlam.reshape(lam.shape).to(lam.dtype))
    dout = dout.contiguous()
    _cpp_inputs(op, dout=dout, q=q, k=k, v=v, lam=lam, out=out, lse=lse, o2=o2)
    lam = lam.contiguous()
    dq, dk, dv = _grad_like(q), _grad_like(k), _grad_like(v)
    dlam = torch.empty_like(lam)
    _core()._attention_bwd_raw(_raw(q), _raw(k), _raw(v), _raw(lam), _raw(out.contiguous()),
                               _raw(lse.contiguous()), _raw(o2.contiguous()), _raw(dout),
                               _raw(dq), _raw(dk), _raw(dv), _raw(dlam), causal, scale, backend)
    return dq, dk, dv, dlam


@diff_attention_bwd.register_fake
def _(dout, q, k, v, lam, out, lse, o2, causal, scale, backend):
    return _grad_like(q), _grad_like(k), _grad_like(v), torch.empty_like(lam)


def _diff_setup(ctx, inputs, output):
    q, k, v, lam, causal, scale, backend = inputs
    out, lse, o2 = output
    ctx.save_for_backward(q, k, v, lam, out, lse, o2)
    ctx.causal, ctx.scale, ctx.backend = causal, scale, backend
    ctx.mark_non_differentiable(lse, o2)


def _diff_backward(ctx, dout, _dlse, _do2):
    # The saved statistics make the backward one kernel: no forward runs again.
    q, k, v, lam, out, lse, o2 = ctx.saved_tensors
    dq, dk, dv, dlam = diff_attention_bwd(dout, q, k, v, lam, out, lse, o2, ctx.causal,
                                          ctx.scale, ctx.backend)
    return dq, dk, dv, dlam, None, None, None


diff_attention_fwd.register_autograd(_diff_backward, setup_context=_diff_setup)


# ------------------------------------------------------------------ standard attention


@torch.library.custom_op("diffattn::attention_fwd", mutates_args=())
def attention_fwd(q: Tensor, k: Tensor, v: Tensor, causal: bool, scale: Optional[float],
                  backend: str) -> tuple[Tensor, Tensor]:
    op = "attention"
    B, Tq, H, Dv = _op_shapes(op, q, k, v, None)
    if _triton(op, q.device, backend):
        out, lse = _gpu().attention_fwd(q, k, v, causal=causal, scale=scale)
        return out.to(q.dtype), lse.float()
    _cpp_inputs(op, q=q, k=k, v=v)
    out = q.new_empty((B, Tq, H, Dv))
    lse = q.new_empty((B, H, Tq))
    _core()._attention_fwd_raw(_raw(q), _raw(k), _raw(v), None, _raw(out), _raw(lse), None,
                               causal, scale, backend)
    return out, lse


@attention_fwd.register_fake
def _(q, k, v, causal, scale, backend):
    B, Tq, H, Dv = _op_shapes("attention", q, k, v, None)
    return q.new_empty((B, Tq, H, Dv)), q.new_empty((B, H, Tq), dtype=torch.float32)


@torch.library.custom_op("diffattn::attention_bwd", mutates_args=())
def attention_bwd(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
                  causal: bool, scale: Optional[float],
                  backend: str) -> tuple[Tensor, Tensor, Tensor]:
    op = "attention backward"
    _op_shapes(op, q, k, v, None)
    if _triton(op, q.device, backend):
        dq, dk, dv = _gpu().attention_bwd(
            dout, q, k, v, out, lse, causal=causal, scale=scale,
            deterministic=torch.are_deterministic_algorithms_enabled())
        return _in_layout(dq, q), _in_layout(dk, k), _in_layout(dv, v)
    dout = dout.contiguous()
    _cpp_inputs(op, dout=dout, q=q, k=k, v=v, out=out, lse=lse)
    dq, dk, dv = _grad_like(q), _grad_like(k), _grad_like(v)
    _core()._attention_bwd_raw(_raw(q), _raw(k), _raw(v), None, _raw(out.contiguous()),
                               _raw(lse.contiguous()), None, _raw(dout), _raw(dq), _raw(dk),
                               _raw(dv), None, causal, scale, backend)
    return dq, dk, dv


@attention_bwd.register_fake
def _(dout, q, k, v, out, lse, causal, scale, backend):
    return _grad_like(q), _grad_like(k), _grad_like(v)


def _attn_setup(ctx, inputs, output):
    q, k, v, causal, scale, backend = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse)
    ctx.causal, ctx.scale, ctx.backend = causal, scale, backend
    ctx.mark_non_differentiable(lse)


def _attn_backward(ctx, dout, _dlse):
    q, k, v, out, lse = ctx.saved_tensors
    dq, dk, dv = attention_bwd(dout, q, k, v, out, lse, ctx.causal, ctx.scale, ctx.backend)
    return dq, dk, dv, None, None, None


attention_fwd.register_autograd(_attn_backward, setup_context=_attn_setup)


# ------------------------------------------------------------------ the public functions


def _kernel_inputs(op, backend, q, *rest):
    """The tensors as the chosen kernels take them: float32 with distinct elements for the C++
    kernels (other dtypes computed in float32), as they are for Triton (float32, float16 and
    bfloat16; float64 is computed in float32)."""
    if _triton(op, q.device, backend):
        cast = (lambda x: x.float()) if q.dtype == torch.float64 else (lambda x: x)
    else:
        cast = as_f32
    return [materialised(cast(x)) for x in (q, *rest)]


def diff_attention(q, k, v, lam, causal=False, scale=None, backend="auto"):
    """Differential attention (arXiv:2410.05258, Eq. 1), differentiable in q, k, v and lam.

    q (B, Tq, 2H, D): pair h uses sub-heads 2h (map 1) and 2h+1 (map 2)
    k (B, Tk, 2G, D) separate keys per map (V1), or (B, Tk, G, D) shared keys (V2)
    v (B, Tk, G, Dv); lam (H), (1) or (B, Tq, H)              -> out (B, Tq, H, Dv)

    lam (1) is one lambda for every pair (a V1 layer's): its gradient is one sum in double.
    out = softmax(s Q1 K1^T) V - lam softmax(s Q2 K2^T) V, s = scale or 1/sqrt(D);
    causal: query i sees key j iff j <= i + Tk - Tq (bottom-right). The result has q's dtype.
    backend: "auto" (C++ kernels on CPU, Triton on CUDA), "fused", "reference", "triton"."""
    op = "diff_attention"
    check_tensor(op, "q", q, (4,))
    check_tensor(op, "k", k, (4,))
    check_tensor(op, "v", v, (4,))
    check_tensor(op, "lam", lam, (1, 3))
    check_same(op, q=q, k=k, v=v)
    if lam.device != q.device:
        raise ValueError(f"{op}: lam is on {lam.device}, q on {q.device}")
    scale = check_flags(op, causal, scale)
    check_backend(op, backend)
    q2, k2, v2 = _kernel_inputs(op, backend, q, k, v)
    lam2 = as_f32(lam)
    out = diff_attention_fwd(q2, k2, v2, lam2, causal, scale, backend)[0]
    return out if out.dtype == q.dtype else out.to(q.dtype)


def attention(q, k, v, causal=False, scale=None, backend="auto"):
    """Standard softmax attention, differentiable in q, k and v:
    q (B, Tq, H, D), k (B, Tk, G, D), v (B, Tk, G, Dv) -> out (B, Tq, H, Dv); head h reads
    group h // (H // G). Backends as diff_attention."""
    op = "attention"
    check_tensor(op, "q", q, (4,))
    check_tensor(op, "k", k, (4,))
    check_tensor(op, "v", v, (4,))
    check_same(op, q=q, k=k, v=v)
    scale = check_flags(op, causal, scale)
    check_backend(op, backend)
    q2, k2, v2 = _kernel_inputs(op, backend, q, k, v)
    out = attention_fwd(q2, k2, v2, causal, scale, backend)[0]
    return out if out.dtype == q.dtype else out.to(q.dtype)


# ------------------------------------------------------------------ decode over a KV cache


def _check_kvcache(op, q, k_cache, v_cache, cache_seqlens, block_table):
    """Validates a cached call (flash-attn's with_kvcache layout) before any work; returns
    (block_size or None, the most keys a sequence can hold)."""
    check_tensor(op, "q", q, (4,))
    check_tensor(op, "k_cache", k_cache, (4,))
    check_tensor(op, "v_cache", v_cache, (4,))
    check_same(op, k_cache=k_cache, v_cache=v_cache)
    if q.device != k_cache.device:
        raise ValueError(f"{op}: q is on {q.device}, k_cache on {k_cache.device}")
    B = q.shape[0]
    if not isinstance(cache_seqlens, torch.Tensor) or cache_seqlens.dtype not in (
            torch.int32, torch.int64) or tuple(cache_seqlens.shape) != (B,):
        raise ValueError(f"{op}: cache_seqlens must be an int32 tensor of shape (B,) = ({B},), "
                         f"got {getattr(cache_seqlens, 'dtype', type(cache_seqlens).__name__)} "
                         f"{tuple(getattr(cache_seqlens, 'shape', ()))}")
    if k_cache.shape[:2] != v_cache.shape[:2]:
        raise ValueError(f"{op}: k_cache {tuple(k_cache.shape)} and v_cache "
                         f"{tuple(v_cache.shape)} must agree in their first two dimensions")
    if block_table is None:
        if k_cache.shape[0] != B:
            raise ValueError(f"{op}: without block_table, k_cache must be (B, Tk_max, heads, D) "
                             f"with B = {B}, got {tuple(k_cache.shape)}")
        capacity, block_size = k_cache.shape[1], None
    else:
        if not isinstance(block_table, torch.Tensor) or block_table.dtype not in (
                torch.int32, torch.int64) or block_table.dim() != 2 or block_table.shape[0] != B:
            raise ValueError(f"{op}: block_table must be an int32 tensor of shape "
                             f"(B, max_blocks) with B = {B}, got "
                             f"{getattr(block_table, 'dtype', type(block_table).__name__)} "
                             f"{tuple(getattr(block_table, 'shape', ()))}")
        block_size = k_cache.shape[1]
        capacity = block_table.shape[1] * block_size
        if block_table.numel() and not torch.compiler.is_compiling():
            lo, hi = int(block_table.min()), int(block_table.max())
            if lo < 0 or hi >= k_cache.shape[0]:
                raise ValueError(f"{op}: block_table entries must lie in [0, {k_cache.shape[0]}) "
                                 f"(the cache's blocks), got values in [{lo}, {hi}]")
    if cache_seqlens.numel() and not torch.compiler.is_compiling():
        lo, hi = int(cache_seqlens.min()), int(cache_seqlens.max())
        if lo < 0 or hi > capacity:
            raise ValueError(f"{op}: cache_seqlens must lie in [0, {capacity}] (the keys a "
                             f"sequence can hold), got values in [{lo}, {hi}]")
    return block_size, capacity


def _gathered(cache, b, n, block_table):
    """Sequence b's first n cache rows (n, heads, D), read through its block table."""
    if block_table is None:
        return cache[b, :n]
    bs = cache.shape[1]
    blocks = block_table[b, :(n + bs - 1) // bs].long()
    return cache[blocks].reshape(-1, *cache.shape[2:])[:n]


def _kvcache_cpu(q, k_cache, v_cache, lam, cache_seqlens, block_table, scale, backend):
    """The CPU path: each sequence's cached keys gathered and one fused forward per sequence,
    causal bottom-right (the Tq query rows are the newest Tq positions of the cache)."""
    B, Tq, Hq, _ = q.shape
    H = Hq // 2 if lam is not None else Hq
    out = q.new_zeros((B, Tq, H, v_cache.shape[-1]), dtype=torch.float32)
    lens = cache_seqlens.tolist()
    for b in range(B):
        n = lens[b]
        if n == 0:
            continue
        k = as_f32(_gathered(k_cache, b, n, block_table))[None]
        v = as_f32(_gathered(v_cache, b, n, block_table))[None]
        qb = as_f32(q[b:b + 1])
        if lam is None:
            out[b] = attention_fwd(qb, k, v, True, scale, backend)[0][0]
        else:
            lb = as_f32(lam if lam.dim() == 1 else lam[b:b + 1]).contiguous()
            out[b] = diff_attention_fwd(qb, k, v, lb, True, scale, backend)[0][0]
    return out.to(q.dtype)


@torch.library.custom_op("diffattn::diff_attention_with_kvcache", mutates_args=())
def _diff_kvcache(q: Tensor, k_cache: Tensor, v_cache: Tensor, lam: Tensor,
                  cache_seqlens: Tensor, block_table: Optional[Tensor], scale: Optional[float],
                  backend: str) -> Tensor:
    if _triton("diff_attention_with_kvcache", q.device, backend):
        return _gpu().diff_attention_with_kvcache(q, k_cache, v_cache, lam, cache_seqlens,
                                                  block_table=block_table,
                                                  scale=scale).to(q.dtype)
    return _kvcache_cpu(q, k_cache, v_cache, lam, cache_seqlens, block_table, scale, backend)


@_diff_kvcache.register_fake
def _(q, k_cache, v_cache, lam, cache_seqlens, block_table, scale, backend):
    return q.new_empty((q.shape[0], q.shape[1], q.shape[2] // 2, v_cache.shape[-1]))


@torch.library.custom_op("diffattn::attention_with_kvcache", mutates_args=())
def _attn_kvcache(q: Tensor, k_cache: Tensor, v_cache: Tensor, cache_seqlens: Tensor,
                  block_table: Optional[Tensor], scale: Optional[float], backend: str) -> Tensor:
    if _triton("attention_with_kvcache", q.device, backend):
        return _gpu().attention_with_kvcache(q, k_cache, v_cache, cache_seqlens,
                                             block_table=block_table, scale=scale).to(q.dtype)
    return _kvcache_cpu(q, k_cache, v_cache, None, cache_seqlens, block_table, scale, backend)


@_attn_kvcache.register_fake
def _(q, k_cache, v_cache, cache_seqlens, block_table, scale, backend):
    return q.new_empty((q.shape[0], q.shape[1], q.shape[2], v_cache.shape[-1]))


def diff_attention_with_kvcache(q, k_cache, v_cache, lam, cache_seqlens, block_table=None,
                                scale=None, backend="auto"):
    """Differential attention of a few new query rows against a KV cache (decode; flash-attn's
    argument names). q (B, Tq, 2H, D); k_cache (num_blocks, block_size, 2G or G, D) and v_cache
    (num_blocks, block_size, G, Dv) with block_table (B, max_blocks) int32 (a paged cache), or
    (B, Tk_max, ...) with block_table None; cache_seqlens (B,) int32: sequence b's keys are its
    first cache_seqlens[b] rows, the new rows' own keys already appended (causal bottom-right);
    lam (H) or (B, Tq, H). Returns out (B, Tq, H, Dv) in q's dtype; no autograd (inference).
    CUDA: the split-KV Triton kernel (V read once for both maps and every query head of its
    group; float16/bfloat16 caches); CPU: each sequence's keys gathered and the fused kernel."""
    op = "diff_attention_with_kvcache"
    _check_kvcache(op, q, k_cache, v_cache, cache_seqlens, block_table)
    check_tensor(op, "lam", lam, (1, 3))
    if q.shape[2] % 2:
        raise ValueError(f"{op}: q must have 2H sub-heads (an even count), got {q.shape[2]}")
    scale = check_flags(op, True, scale)
    check_backend(op, backend)
    return _diff_kvcache(q, k_cache, v_cache, as_f32(lam), cache_seqlens, block_table, scale,
                         backend)


def attention_with_kvcache(q, k_cache, v_cache, cache_seqlens, block_table=None, scale=None,
                           backend="auto"):
    """Standard attention of a few new query rows against a KV cache, as
    diff_attention_with_kvcache with one map: q (B, Tq, H, D), k_cache (..., G, D)."""
    op = "attention_with_kvcache"
    _check_kvcache(op, q, k_cache, v_cache, cache_seqlens, block_table)
    scale = check_flags(op, True, scale)
    check_backend(op, backend)
    return _attn_kvcache(q, k_cache, v_cache, cache_seqlens, block_table, scale, backend)
