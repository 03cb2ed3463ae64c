"""The fused forward: differential attention (arXiv:2410.05258, Eq. 1) and standard attention
in one Triton kernel, one program per (pair, block of query rows, batch).

A program holds its pair's two query tiles Q1, Q2 and walks the key/value tiles once: both
score tiles are formed against the same K/V tile (V2 and standard attention load one K tile),
V is loaded once for both maps, each map keeps its own online-softmax state (m, l, acc), and
the lambda combine happens in the epilogue:

    out = acc1 / l1 - lam * acc2 / l2,   o2 = acc2 / l2,   lse_i = (m_i + log2 l_i) ln 2

The key tiles are walked in one loop; only the tiles from the first one some row of the block
does not see entirely (causal diagonal, the ragged last tile) on are masked, under a branch on
the tile's start; fully masked causal tiles are never visited. K tiles are read transposed.
"""

import triton
import triton.language as tl

from ._common import LN2_C, load_tile, mma, store_tile


@triton.jit
def _mask_scores(s, keys, offs_m, k_len, diag, CAUSAL: tl.constexpr):
    """s with -inf where the key is past k_len or (CAUSAL) past row i's diagonal i + diag."""
    seen = keys[None, :] < k_len
    if CAUSAL:
        seen = seen & (keys[None, :] <= offs_m[:, None] + diag)
    return tl.where(seen, s, float("-inf"))


@triton.jit
def _fwd_key_tiles(acc1, l1, m1, acc2, l2, m2, q1, q2,
                   k1_ptrs, k2_ptrs, v_ptrs, s_kt, s_vt,
                   hi, full, offs_m, offs_n, offs_d, offs_dv, k_len, diag,
                   qk_scale,
                   MAPS: tl.constexpr, SHARED_K: tl.constexpr,
                   CAUSAL: tl.constexpr, D: tl.constexpr, DV: tl.constexpr,
                   BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_M: tl.constexpr,
                   BLOCK_N: tl.constexpr, DOT_PREC: tl.constexpr):
    """Key tiles [0, hi) of one query block. acc (BLOCK_M, BLOCK_DV), l and m (BLOCK_M,) per
    map, in log2 units; q1, q2 (BLOCK_M, BLOCK_D); the K/V pointers address key 0 and move on
    by a tile per step. Tiles from `full` on may hold keys past k_len or (CAUSAL) keys past the
    diagonal (query i sees key j iff j <= i + diag, diag = Tk - Tq): only those are masked, by
    a branch on the tile's start. One loop, not an unmasked and a masked one: Triton 3.6
    software-pipelines both of two loops and then spills on sm_90 (255 registers; 1 KiB at
    128x64 tiles), which cost 4-6x in speed on an H100 (docs/PERFORMANCE.md)."""
    for start_n in range(0, hi, BLOCK_N):
        keys = start_n + offs_n                                   # (BLOCK_N,)
        # K read transposed, (BLOCK_D, BLOCK_N): dims as load_tile's rows, keys as its columns
        k1t = load_tile(k1_ptrs, offs_d, D, keys, k_len, D != BLOCK_D, True)
        v = load_tile(v_ptrs, keys, k_len, offs_dv, DV, True, DV != BLOCK_DV)
        zero = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        s1 = mma(q1, k1t, zero, DOT_PREC) * qk_scale             # (BLOCK_M, BLOCK_N), log2 units
        if start_n >= full:
            s1 = _mask_scores(s1, keys, offs_m, k_len, diag, CAUSAL)
        # m is the running max of the row's scores, so every p below is <= 1. A row that has
        # seen no key yet (all -inf, only in masked tiles) subtracts 0: its p and alpha are 0.
        m1_new = tl.maximum(m1, tl.max(s1, 1))
        m1_new_ = tl.where(m1_new == float("-inf"), 0.0, m1_new)
        p1 = tl.math.exp2(s1 - m1_new_[:, None])
        alpha1 = tl.math.exp2(m1 - m1_new_)
        l1 = l1 * alpha1 + tl.sum(p1, 1)
        acc1 = mma(p1.to(v.dtype), v, acc1 * alpha1[:, None], DOT_PREC)
        m1 = m1_new
        if MAPS == 2:
            if SHARED_K:
                k2t = k1t
            else:
                k2t = load_tile(k2_ptrs, offs_d, D, keys, k_len, D != BLOCK_D, True)
            s2 = mma(q2, k2t, zero, DOT_PREC) * qk_scale
            if start_n >= full:
                s2 = _mask_scores(s2, keys, offs_m, k_len, diag, CAUSAL)
            m2_new = tl.maximum(m2, tl.max(s2, 1))
            m2_new_ = tl.where(m2_new == float("-inf"), 0.0, m2_new)
            p2 = tl.math.exp2(s2 - m2_new_[:, None])
            alpha2 = tl.math.exp2(m2 - m2_new_)
            l2 = l2 * alpha2 + tl.sum(p2, 1)
            acc2 = mma(p2.to(v.dtype), v, acc2 * alpha2[:, None], DOT_PREC)  # the same V tile
            m2 = m2_new
        k1_ptrs += BLOCK_N * s_kt
        k2_ptrs += BLOCK_N * s_kt
        v_ptrs += BLOCK_N * s_vt
    return acc1, l1, m1, acc2, l2, m2


@triton.jit
def _finish_map(acc, l, m):
    """Normalise one map: o = acc / l (BLOCK_M, BLOCK_DV) and lse = (m + log2 l) ln 2 (natural
    log). A row that saw no key (l = 0) gets o = 0 and lse = +inf."""
    seen = l > 0.0
    inv_l = tl.where(seen, 1.0 / tl.where(seen, l, 1.0), 0.0)
    lse = tl.where(seen, (m + tl.math.log2(tl.where(seen, l, 1.0))) * LN2_C, float("inf"))
    return acc * inv_l[:, None], lse


@triton.jit
def attn_fwd_kernel(
    Q, K, V, LAM, OUT, O2, LSE, CU_Q, CU_K,
    qk_scale,                       # softmax scale * log2(e)
    s_qb, s_qt, s_qh,               # q    (B, Tq, MAPS*H, D)    or varlen (total_q, MAPS*H, D)
    s_kb, s_kt, s_kh,               # k    (B, Tk, KH, D)        KH = 2G (V1) or G
    s_vb, s_vt, s_vh,               # v    (B, Tk, G, DV)
    s_lb, s_lt, s_lh,               # lam  (H), (B, Tq, H) or () through strides (0 broadcasts)
    s_ob, s_ot, s_oh,               # out, o2 (B, Tq, H, DV)
    s_sb, s_sh,                     # lse  (B, MAPS*H, Tq)       or varlen (MAPS*H, total_q)
    Tq, Tk, QPG,                    # QPG: pairs (query heads) per key/value group
    MAPS: tl.constexpr, SHARED_K: tl.constexpr, CAUSAL: tl.constexpr, VARLEN: tl.constexpr,
    D: tl.constexpr, DV: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DOT_PREC: tl.constexpr,
):
    """grid (H, cdiv(Tq, BLOCK_M), B). The pair index varies fastest, so the programs that run
    together read the same group's K/V tiles (from L2 after the first)."""
    h = tl.program_id(0)
    pid_m = tl.program_id(1)
    b = tl.program_id(2)
    if CAUSAL:
        pid_m = tl.num_programs(1) - 1 - pid_m  # longest rows first: the tail of the grid is short
    if VARLEN:
        q0 = tl.load(CU_Q + b)
        q_len = tl.load(CU_Q + b + 1) - q0
        k0 = tl.load(CU_K + b)
        k_len = tl.load(CU_K + b + 1) - k0
        q0 = q0.to(tl.int64)  # row offsets into the packed tensors may pass 2^31 elements
        k0 = k0.to(tl.int64)
    else:
        q0 = 0
        q_len = Tq
        k0 = 0
        k_len = Tk
    start_m = pid_m * BLOCK_M
    if start_m >= q_len:
        return
    g = h // QPG
    b64 = b.to(tl.int64)
    row0 = tl.cast(q0 + start_m, tl.int64)  # rows x strides may pass 2^31 elements
    offs_m0 = tl.arange(0, BLOCK_M)
    offs_m = start_m + offs_m0
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)

    # query sub-heads MAPS*h (map 1) and MAPS*h + 1 (map 2); key heads 2g, 2g + 1 (V1) or g
    q_ptrs = (Q + b64 * s_qb + row0 * s_qt + offs_m0[:, None] * s_qt + (MAPS * h) * s_qh
              + offs_d[None, :])
    if MAPS == 2 and not SHARED_K:
        kh = 2 * g
    else:
        kh = g
    # K tiles are read transposed, (BLOCK_D, BLOCK_N): no register transpose before Q K^T
    k1_ptrs = K + b64 * s_kb + k0 * s_kt + offs_n[None, :] * s_kt + kh * s_kh + offs_d[:, None]
    if MAPS == 2 and not SHARED_K:
        k2_ptrs = k1_ptrs + s_kh
    else:
        k2_ptrs = k1_ptrs
    v_ptrs = V + b64 * s_vb + k0 * s_vt + offs_n[:, None] * s_vt + g * s_vh + offs_dv[None, :]

    q1 = load_tile(q_ptrs, offs_m, q_len, offs_d, D, True, D != BLOCK_D)    # (BLOCK_M, BLOCK_D)
    if MAPS == 2:
        q2 = load_tile(q_ptrs + s_qh, offs_m, q_len, offs_d, D, True, D != BLOCK_D)
    else:
        q2 = q1

    acc1 = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)
    acc2 = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)
    l1 = tl.zeros([BLOCK_M], dtype=tl.float32)
    l2 = tl.zeros([BLOCK_M], dtype=tl.float32)
    m1 = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    m2 = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)

    # causal, bottom-right: row i sees keys j <= i + diag. Keys below start_m + diag + 1 are seen
    # by every row of the block; keys from min(start_m + BLOCK_M, q_len) + diag on by none.
    diag = k_len - q_len
    if CAUSAL:
        hi = tl.maximum(tl.minimum(tl.minimum(start_m + BLOCK_M, q_len) + diag, k_len), 0)
        full = tl.maximum(tl.minimum(start_m + diag + 1, k_len), 0)
    else:
        hi = k_len
        full = k_len
    full = (full // BLOCK_N) * BLOCK_N
    acc1, l1, m1, acc2, l2, m2 = _fwd_key_tiles(
        acc1, l1, m1, acc2, l2, m2, q1, q2, k1_ptrs, k2_ptrs, v_ptrs, s_kt, s_vt, hi, full,
        offs_m, offs_n, offs_d, offs_dv, k_len, diag, qk_scale, MAPS, SHARED_K, CAUSAL,
        D, DV, BLOCK_D, BLOCK_DV, BLOCK_M, BLOCK_N, DOT_PREC)

    rows_ok = offs_m < q_len
    o1, lse1 = _finish_map(acc1, l1, m1)
    lse_ptrs = LSE + b64 * s_sb + tl.cast(MAPS * h, tl.int64) * s_sh + q0 + offs_m
    tl.store(lse_ptrs, lse1, mask=rows_ok)
    o_ptrs = b64 * s_ob + row0 * s_ot + offs_m0[:, None] * s_ot + h * s_oh + offs_dv[None, :]
    if MAPS == 2:
        o2, lse2 = _finish_map(acc2, l2, m2)
        tl.store(lse_ptrs + s_sh, lse2, mask=rows_ok)
        lam = tl.load(LAM + b64 * s_lb + (q0 + offs_m) * s_lt + h * s_lh, mask=rows_ok,
                      other=0.0).to(tl.float32)                            # (BLOCK_M,)
        out = o1 - lam[:, None] * o2                  # arXiv:2410.05258, Eq. (1): (A1 - lam A2) V
        store_tile(O2 + o_ptrs, o2.to(O2.dtype.element_ty), offs_m, q_len, offs_dv, DV,
                   DV != BLOCK_DV)
    else:
        out = o1
    store_tile(OUT + o_ptrs, out.to(OUT.dtype.element_ty), offs_m, q_len, offs_dv, DV,
               DV != BLOCK_DV)
