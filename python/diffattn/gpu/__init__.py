"""diffattn.gpu: fused Triton kernels for differential attention (arXiv:2410.05258) and standard
attention on NVIDIA GPUs, for training (forward and backward) and for decoding against a paged
KV cache. Imports with PyTorch and Triton alone: nothing here needs the compiled diffattn._core.

    out, lse, o2 = diff_attention_fwd(q, k, v, lam, causal=True)          # q (B, Tq, 2H, D)
    dq, dk, dv, dlam = diff_attention_bwd(dout, q, k, v, lam, out, lse, o2, causal=True)
    out = diff_attention_with_kvcache(q, k_cache, v_cache, lam, cache_seqlens, block_table)

Layouts, dtypes and the causal rule are those of docs/DESIGN.md, "The operator contract" (see
interface.py). Tensors are CUDA tensors, or CPU tensors when TRITON_INTERPRET=1 was set before
Triton was imported: Triton's interpreter runs the same kernels on the CPU, which is how the
tests check every variant on machines without a GPU.

Design
------
Forward (_fwd.py): one program per (pair, block of BLOCK_M query rows, sequence). It keeps both
maps' query tiles and walks the key/value tiles once: per tile it forms S1 = Q1 K1^T and
S2 = Q2 K2^T (V2 and standard attention load one K tile), updates two online softmaxes (running
max m, sum l, float32 accumulator, in log2 units: the scale is folded with log2(e) and the
kernel calls exp2), and multiplies both probability tiles with the same V tile, loaded once.
The epilogue normalises, combines out = O1 - lam O2 and stores out, o2 = O2 and each map's
log-sum-exp (natural log, +inf for a row that sees no key). Key tiles are walked in one loop;
only the diagonal / ragged ones are masked (a branch on the tile's start: two loops made
Triton 3.6 spill registers on sm_90); fully masked causal tiles are never visited, and causal
programs start from the longest rows. The pair index varies fastest in the grid, so the
programs that run together share their group's K/V tiles through L2 (GQA at the pair level).

Backward (_bwd.py), FlashAttention-2 style from the saved (out, lse, o2): a preprocess writes
D1 = rowsum(dout (out + lam o2)) and R2 = rowsum(dout o2) per row; the key-block kernel owns
BLOCK_N keys of one K/V group, loops over the group's pairs and the query blocks that see those
keys, recomputes P1, P2 from lse, shares dP = dout V^T between the maps and accumulates
dV = (P1 - lam P2)^T dout, dK1 = s dS1^T Q1, dK2 = s dS2^T Q2 (dS1 = P1 (dP - D1),
dS2 = -lam P2 (dP - R2)) in registers: no atomics for dK/dV, K/V loaded once per group. dQ is
either added atomically by that kernel (default) or computed by a query-block kernel of its own
(deterministic=True). When the grid of key blocks is too small for the GPU, a group's pairs are
split over several programs whose float32 partials are summed after, in order. dlam = -R2,
summed over tokens (and pairs) for a per-pair (scalar) lambda.

Decode (_decode.py): split-KV. One program per (split of the cache's keys, K/V group,
sequence) handles every query row of the group (QPG pairs x Tq rows, stacked, both maps): each
K tile is read once per map (once for V2) and each V tile once for everything; paged caches are
read in place through the block table (any block size). Partial (normalised output,
log-sum-exp) pairs are merged exactly by a second kernel, which applies the lambda combine.
The number of splits comes from the cache's capacity (no host synchronisation): about four
programs per multiprocessor.

Tiles (_configs.py): one table per kernel keyed by (maps, head dims, 16-bit or float32), the
default first, chosen on the CPU by compiling every candidate for sm_90
(scripts/gpu_compile_check.py: registers, spills, shared memory; every default keeps its
accumulators in registers). Forward, bf16: 128x64 (8 warps) for D = 64, Dv = 128; 64x32
(8 warps) for D = 128, Dv = 256; key-block backward 16 query rows x 64 keys (D = 64) and 32x32
(D = 128, mma.sync: no wgmma tiling of its three accumulators fits without spills); decode
64-key tiles, 4 warps.
DIFFATTN_TRITON_AUTOTUNE=1 (or _configs.autotune()) times every candidate on first use on a
GPU and keeps the fastest; _configs.tuned() reports the choices. Under the interpreter every
kernel uses one small tiling.

Benchmark: bench/gpu_attention.py runs the correctness checks on the device, measures copy
bandwidth and bf16 matmul rate, then the fused forward and forward+backward against the 2-call
(DiffLlama) and 4-call (upstream, vLLM) SDPA recipes and standard SDPA of equal FLOPs, for
T in {1k, 4k, 16k}, D in {64, 128}, causal and not, and decode at 4K-128K keys in GB/s against
the copy bandwidth and the 2-call decode: a markdown table and JSON.
"""

from . import _configs  # noqa: F401
from .interface import (  # noqa: F401
    __all__,
    attention_bwd,
    attention_fwd,
    attention_varlen_bwd,
    attention_varlen_fwd,
    attention_with_kvcache,
    diff_attention_bwd,
    diff_attention_fwd,
    diff_attention_varlen_bwd,
    diff_attention_varlen_fwd,
    diff_attention_with_kvcache,
)
