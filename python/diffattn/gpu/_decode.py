"""Decode against a KV cache (contiguous or paged): split-KV with an exact log-sum-exp merge.

Decode is memory bound: every step reads the whole cache. One program owns (split of the
cache's keys, key/value group, sequence) and every query row of that group: the Tq newest
tokens of each of the group's QPG pairs and both maps, stacked as QPG*Tq rows per map. Each K
tile is read once for all of them (V2 and standard attention read one K tile; V1 one per map),
and each V tile once for both maps and every pair. A split writes its rows' normalised partial
outputs and log-sum-exps (float32); the merge kernel combines the splits of a row with weights
exp(lse_s - lse) and then applies the lambda combine of arXiv:2410.05258, Eq. (1).

Paged caches address key j of sequence b through its block table: row j % block_size of block
block_table[b, j // block_size]; any block size works (the table is read per key row).
"""

import triton
import triton.language as tl

from ._common import LN2_C, load_tile, mma


@triton.jit
def _cache_rows(BLOCK_TABLE, b64, s_btb, keys, k_hi, block_size, s_blk, s_row,
                PAGED: tl.constexpr):
    """Element offsets (BLOCK_N,) int64 of the cache rows holding keys of sequence b (keys past
    k_hi point at row 0 of the sequence's first block; their loads are masked)."""
    if PAGED:
        keys_ok = keys < k_hi
        blk = tl.load(BLOCK_TABLE + b64 * s_btb + keys // block_size, mask=keys_ok, other=0)
        rows = blk.to(tl.int64) * s_blk + (keys % block_size).to(tl.int64) * s_row
    else:
        rows = b64 * s_blk + keys.to(tl.int64) * s_row
    return rows


@triton.jit
def _decode_key_tiles(acc1, l1, m1, acc2, l2, m2, q1, q2, K, V, BLOCK_TABLE, b64, s_btb,
                      block_size, s_kblk, s_krow, s_vblk, s_vrow, kh1, kh2, vh,
                      lo, hi, k_hi, row_t, diag, offs_n, offs_d, offs_dv, qk_scale,
                      MAPS: tl.constexpr, SHARED_K: tl.constexpr, MASKED: tl.constexpr,
                      CAUSAL: tl.constexpr, PAGED: tl.constexpr, D: tl.constexpr,
                      DV: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
                      BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr, DOT_PREC: tl.constexpr):
    """Keys [lo, hi) of one split. Rows (BLOCK_R,): row_t is each row's query index; it sees key
    j iff j <= row_t + diag (CAUSAL; diag = seqlen - Tq) and j < k_hi (the split's end)."""
    zero = tl.zeros([BLOCK_R, BLOCK_N], dtype=tl.float32)
    for start_n in range(lo, hi, BLOCK_N):
        keys = start_n + offs_n
        k_rows = _cache_rows(BLOCK_TABLE, b64, s_btb, keys, k_hi, block_size, s_kblk, s_krow, PAGED)
        v_rows = _cache_rows(BLOCK_TABLE, b64, s_btb, keys, k_hi, block_size, s_vblk, s_vrow, PAGED)
        k1 = load_tile(K + k_rows[:, None] + kh1 + offs_d[None, :], keys, k_hi, offs_d, D, MASKED,
                       D != BLOCK_D)                                       # (BLOCK_N, BLOCK_D)
        v = load_tile(V + v_rows[:, None] + vh + offs_dv[None, :], keys, k_hi, offs_dv, DV, MASKED,
                      DV != BLOCK_DV)                                      # (BLOCK_N, BLOCK_DV)
        s1 = mma(q1, tl.trans(k1), zero, DOT_PREC) * qk_scale       # (BLOCK_R, BLOCK_N) log2 units
        if MASKED:
            seen = keys[None, :] < k_hi
            if CAUSAL:
                seen = seen & (keys[None, :] <= row_t[:, None] + diag)
            s1 = tl.where(seen, s1, float("-inf"))
        m1_new = tl.maximum(m1, tl.max(s1, 1))
        m1_use = tl.where(m1_new == float("-inf"), 0.0, m1_new)     # no key seen yet: p = 0
        p1 = tl.math.exp2(s1 - m1_use[:, None])
        alpha1 = tl.math.exp2(m1 - m1_use)
        l1 = l1 * alpha1 + tl.sum(p1, 1)
        acc1 = mma(p1.to(v.dtype), v, acc1 * alpha1[:, None], DOT_PREC)
        m1 = m1_new
        if MAPS == 2:
            if SHARED_K:
                k2 = k1
            else:
                k2 = load_tile(K + k_rows[:, None] + kh2 + offs_d[None, :], keys, k_hi, offs_d, D,
                               MASKED, D != BLOCK_D)
            s2 = mma(q2, tl.trans(k2), zero, DOT_PREC) * qk_scale
            if MASKED:
                s2 = tl.where(seen, s2, float("-inf"))
            m2_new = tl.maximum(m2, tl.max(s2, 1))
            m2_use = tl.where(m2_new == float("-inf"), 0.0, m2_new)
            p2 = tl.math.exp2(s2 - m2_use[:, None])
            alpha2 = tl.math.exp2(m2 - m2_use)
            l2 = l2 * alpha2 + tl.sum(p2, 1)
            acc2 = mma(p2.to(v.dtype), v, acc2 * alpha2[:, None], DOT_PREC)   # the same V tile
            m2 = m2_new
    return acc1, l1, m1, acc2, l2, m2


@triton.jit
def _store_partial(O_PART, LSE_PART, part, acc, l, m, offs_r, offs_dv, s_pm, map_idx,
                   BLOCK_DV: tl.constexpr):
    """One map's normalised partial (BLOCK_R, BLOCK_DV) and its log2-unit lse (BLOCK_R,);
    a row that saw no key of the split: 0 and -inf (weight 0 in the merge)."""
    seen = l > 0.0
    l_safe = tl.where(seen, l, 1.0)
    lse = tl.where(seen, m + tl.math.log2(l_safe), float("-inf"))
    o = acc / l_safe[:, None]
    tl.store(LSE_PART + part + map_idx * s_pm + offs_r, lse)
    tl.store(O_PART + (part + map_idx * s_pm) * BLOCK_DV + offs_r[:, None] * BLOCK_DV
             + offs_dv[None, :], o)


@triton.jit
def attn_decode_split_kernel(
    Q, K, V, SEQLENS, BLOCK_TABLE, O_PART, LSE_PART,
    qk_scale,                       # scale * log2(e)
    s_qb, s_qt, s_qh,               # q        (B, Tq, MAPS*H, D)
    s_kblk, s_krow, s_kh,           # k_cache  (num_blocks, block_size, KH, D) or (B, Tk_max, ...)
    s_vblk, s_vrow, s_vh,           # v_cache  (num_blocks, block_size, G, DV) or (B, Tk_max, ...)
    s_btb,                          # block_table (B, max_blocks) int32
    s_pb, s_pg, s_ps, s_pm,         # lse_part (B, G*NRB, S, MAPS, BLOCK_R) float32; o_part the
                                    #   same with a trailing BLOCK_DV (element offset * BLOCK_DV)
    Tq, QPG, NRB, keys_per_split, block_size,   # NRB: blocks of BLOCK_R rows per group
    MAPS: tl.constexpr, SHARED_K: tl.constexpr, CAUSAL: tl.constexpr, PAGED: tl.constexpr,
    D: tl.constexpr, DV: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr, DOT_PREC: tl.constexpr,
):
    """grid (S, G * NRB, B). Rows r < QPG*Tq of group g: pair g*QPG + r // Tq, query r % Tq;
    a program takes BLOCK_R of them (NRB > 1 only when a group has more rows than that)."""
    split = tl.program_id(0)
    slot = tl.program_id(1)
    g = slot // NRB
    b = tl.program_id(2)
    b64 = b.to(tl.int64)
    seqlen = tl.load(SEQLENS + b)
    k_lo = split * keys_per_split
    k_hi = tl.minimum(k_lo + keys_per_split, seqlen)
    if k_lo >= k_hi:
        return  # the merge reads only the splits below cdiv(seqlen, keys_per_split)
    offs_r = tl.arange(0, BLOCK_R)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    rows = (slot % NRB) * BLOCK_R + offs_r
    rows_ok = rows < QPG * Tq
    row_p = rows // Tq
    row_t = rows % Tq
    q_ptrs = (Q + b64 * s_qb + row_t[:, None] * s_qt + (MAPS * (g * QPG + row_p[:, None])) * s_qh
              + offs_d[None, :])
    q_mask = rows_ok[:, None] & (offs_d[None, :] < D)
    q1 = tl.load(q_ptrs, mask=q_mask, other=0.0).to(K.dtype.element_ty)     # (BLOCK_R, BLOCK_D)
    if MAPS == 2:
        q2 = tl.load(q_ptrs + s_qh, mask=q_mask, other=0.0).to(K.dtype.element_ty)
    else:
        q2 = q1
    if MAPS == 2 and not SHARED_K:
        kh1 = (2 * g) * s_kh
        kh2 = kh1 + s_kh
    else:
        kh1 = g * s_kh
        kh2 = kh1
    vh = g * s_vh

    acc1 = tl.zeros([BLOCK_R, BLOCK_DV], dtype=tl.float32)
    acc2 = tl.zeros([BLOCK_R, BLOCK_DV], dtype=tl.float32)
    l1 = tl.zeros([BLOCK_R], dtype=tl.float32)
    l2 = tl.zeros([BLOCK_R], dtype=tl.float32)
    m1 = tl.full([BLOCK_R], float("-inf"), dtype=tl.float32)
    m2 = tl.full([BLOCK_R], float("-inf"), dtype=tl.float32)

    # The cache holds the Tq query tokens last: query t sees keys j <= t + seqlen - Tq (causal),
    # so keys below seqlen - Tq + 1 are seen by every row. Whole tiles of those need no mask.
    diag = seqlen - Tq
    if CAUSAL:
        full_end = tl.minimum(k_hi, diag + 1)
    else:
        full_end = k_hi
    full = k_lo + tl.maximum((full_end - k_lo) // BLOCK_N, 0) * BLOCK_N
    acc1, l1, m1, acc2, l2, m2 = _decode_key_tiles(
        acc1, l1, m1, acc2, l2, m2, q1, q2, K, V, BLOCK_TABLE, b64, s_btb, block_size, s_kblk,
        s_krow, s_vblk, s_vrow, kh1, kh2, vh, k_lo, full, k_hi, row_t, diag, offs_n, offs_d,
        offs_dv, qk_scale, MAPS, SHARED_K, False, CAUSAL, PAGED, D, DV, BLOCK_D, BLOCK_DV, BLOCK_R,
        BLOCK_N, DOT_PREC)
    acc1, l1, m1, acc2, l2, m2 = _decode_key_tiles(
        acc1, l1, m1, acc2, l2, m2, q1, q2, K, V, BLOCK_TABLE, b64, s_btb, block_size, s_kblk,
        s_krow, s_vblk, s_vrow, kh1, kh2, vh, full, k_hi, k_hi, row_t, diag, offs_n, offs_d,
        offs_dv, qk_scale, MAPS, SHARED_K, True, CAUSAL, PAGED, D, DV, BLOCK_D, BLOCK_DV, BLOCK_R,
        BLOCK_N, DOT_PREC)

    part = b64 * s_pb + slot * s_pg + split * s_ps
    _store_partial(O_PART, LSE_PART, part, acc1, l1, m1, offs_r, offs_dv, s_pm, 0, BLOCK_DV)
    if MAPS == 2:
        _store_partial(O_PART, LSE_PART, part, acc2, l2, m2, offs_r, offs_dv, s_pm, 1, BLOCK_DV)


@triton.jit
def _merge_map(O_PART, LSE_PART, part0, s_ps, n_splits, map_idx, s_pm, offs_r, offs_c,
               BLOCK_DV: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    """Combine one map's split partials: o = sum_s exp2(lse_s - lse) o_s with
    lse = log2 sum_s exp2(lse_s), by a running max over the splits in order."""
    m = tl.full([BLOCK_R], float("-inf"), dtype=tl.float32)
    w_sum = tl.zeros([BLOCK_R], dtype=tl.float32)
    acc = tl.zeros([BLOCK_R, BLOCK_C], dtype=tl.float32)
    for s in range(0, n_splits):
        part = part0 + s * s_ps + map_idx * s_pm
        lse_s = tl.load(LSE_PART + part + offs_r)
        o_s = tl.load(O_PART + part * BLOCK_DV + offs_r[:, None] * BLOCK_DV + offs_c[None, :])
        m_new = tl.maximum(m, lse_s)
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.math.exp2(m - m_use)
        w = tl.math.exp2(lse_s - m_use)
        acc = acc * alpha[:, None] + w[:, None] * o_s
        w_sum = w_sum * alpha + w
        m = m_new
    seen = w_sum > 0.0
    w_safe = tl.where(seen, w_sum, 1.0)
    lse = tl.where(seen, (m + tl.math.log2(w_safe)) * LN2_C, float("inf"))   # natural log
    return acc / w_safe[:, None], lse


@triton.jit
def attn_decode_merge_kernel(
    O_PART, LSE_PART, SEQLENS, LAM, OUT, LSE,
    s_pb, s_pg, s_ps, s_pm,         # the partials, as in attn_decode_split_kernel
    s_lb, s_lt, s_lh,               # lam  (H), (B, Tq, H) or ()
    s_ob, s_ot, s_oh,               # out  (B, Tq, H, DV)
    s_sb, s_sh,                     # lse  (B, MAPS*H, Tq)
    Tq, QPG, NRB, keys_per_split,
    MAPS: tl.constexpr, DV: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_R: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    """grid (G * NRB, B, BLOCK_DV // BLOCK_C): out = o1 - lam o2 for BLOCK_R rows of a group,
    BLOCK_C columns."""
    slot = tl.program_id(0)
    g = slot // NRB
    b = tl.program_id(1)
    pid_c = tl.program_id(2)
    b64 = b.to(tl.int64)
    seqlen = tl.load(SEQLENS + b)
    n_splits = tl.cdiv(seqlen, keys_per_split)
    offs_r = tl.arange(0, BLOCK_R)
    offs_c = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
    rows = (slot % NRB) * BLOCK_R + offs_r
    rows_ok = rows < QPG * Tq
    row_t = rows % Tq
    h = g * QPG + rows // Tq                                      # (BLOCK_R,) each row's pair
    part0 = b64 * s_pb + slot * s_pg
    o1, lse1 = _merge_map(O_PART, LSE_PART, part0, s_ps, n_splits, 0, s_pm, offs_r, offs_c,
                          BLOCK_DV, BLOCK_R, BLOCK_C)
    lse_ptrs = LSE + b64 * s_sb + (MAPS * h) * s_sh + row_t
    if pid_c == 0:  # one program of the row block writes its rows' lse
        tl.store(lse_ptrs, lse1, mask=rows_ok)
    if MAPS == 2:
        o2, lse2 = _merge_map(O_PART, LSE_PART, part0, s_ps, n_splits, 1, s_pm, offs_r, offs_c,
                              BLOCK_DV, BLOCK_R, BLOCK_C)
        if pid_c == 0:
            tl.store(lse_ptrs + s_sh, lse2, mask=rows_ok)
        lam = tl.load(LAM + b64 * s_lb + row_t * s_lt + h * s_lh, mask=rows_ok,
                      other=0.0).to(tl.float32)
        out = o1 - lam[:, None] * o2                  # arXiv:2410.05258, Eq. (1)
    else:
        out = o1
    o_ptrs = OUT + b64 * s_ob + row_t[:, None] * s_ot + h[:, None] * s_oh + offs_c[None, :]
    tl.store(o_ptrs, out.to(OUT.dtype.element_ty), mask=rows_ok[:, None] & (offs_c[None, :] < DV))
