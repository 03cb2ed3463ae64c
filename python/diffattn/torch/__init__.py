"""diffattn.torch: the fused operators as PyTorch custom ops (autograd, torch.compile), drop-in
attention modules, whole models from model directories, and ring (context-parallel)
differential attention on torch.distributed.

    import diffattn.torch as dt
    out = dt.diff_attention(q, k, v, lam, causal=True)   # q (B, Tq, 2H, D) ...
    out.sum().backward()                                  # grads for q, k, v and lam

One module per concern:
    ops       torch.library custom ops (namespace `diffattn`): diff_attention, attention and
              their decode forms over a (paged) KV cache; C++ kernels on CPU, Triton on CUDA
    rotary    rotary position embedding (interleaved and rotate-half, rope_scaling)
    modules   MultiheadDiffAttn, MultiheadDiffAttnV2, DiffLlamaAttention, RMSNorm
    ring      ring_diff_attention / ring_attention over a process group
    models    DiffTransformerLM, load, save

Layouts are those of the NumPy operators (docs/DESIGN.md, "The operator contract"):
q (B, Tq, 2H, D), k (B, Tk, 2G, D) (V1) or (B, Tk, G, D) (V2, shared keys), v (B, Tk, G, Dv),
lam (H) or (B, Tq, H); out (B, Tq, H, Dv). Standard attention: q (B, Tq, H, D), k (B, Tk, G, D).

A training step runs one forward kernel and one backward kernel: the forward saves
(out, lse, o2) and the backward hands them back to the kernel. CPU float32 tensors reach the
C++ kernels by address and strides (no copy), including views such as x.transpose(1, 2) of a
(B, heads, T, D) tensor (the last dimension must be contiguous; otherwise that one tensor is
copied). float64, float16 and bfloat16 are computed in float32 on the CPU and come back in
their dtype; CUDA tensors run the Triton kernels of diffattn.gpu in float32, float16 or
bfloat16 with float32 accumulation.
"""

from .modules import (DiffLlamaAttention, MultiheadDiffAttn, MultiheadDiffAttnV2, RMSNorm,
                      lambda_init_fn)
from .models import DiffTransformerLM, load, save
from .ops import attention, attention_with_kvcache, diff_attention, diff_attention_with_kvcache
from .ring import (ring_attention, ring_bytes_sent, ring_diff_attention, zigzag_shard,
                   zigzag_unshard)
from .rotary import (apply_rotary_half, apply_rotary_interleaved, rope_frequencies,
                     rotary_cos_sin)

__all__ = [
    "diff_attention",
    "attention",
    "diff_attention_with_kvcache",
    "attention_with_kvcache",
    "MultiheadDiffAttn",
    "MultiheadDiffAttnV2",
    "DiffLlamaAttention",
    "RMSNorm",
    "lambda_init_fn",
    "rope_frequencies",
    "rotary_cos_sin",
    "apply_rotary_interleaved",
    "apply_rotary_half",
    "ring_diff_attention",
    "ring_attention",
    "ring_bytes_sent",
    "zigzag_shard",
    "zigzag_unshard",
    "DiffTransformerLM",
    "load",
    "save",
]
