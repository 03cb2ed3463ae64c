"""The backward kernels (FlashAttention-2 style): nothing is recomputed from scratch, every
probability comes back from the saved log-sum-exp, P = exp(s q k^T - lse).

Differential attention (arXiv:2410.05258, Eq. 1) is out = O1 - lam O2 with Oi = Ai V, so
dO1 = dout and dO2 = -lam dout. With dP = dout V^T, shared by both maps:

    dS1 = P1 o (dP - D1),            D1 = rowsum(dout o (out + lam o2)) = rowsum(dO1 o O1)
    dS2 = -lam P2 o (dP - R2),       R2 = rowsum(dout o o2), so rowsum(dO2 o O2) = -lam R2
    dV  = (P1 - lam P2)^T dout       one product for both maps
    dK1 = s dS1^T Q1, dK2 = s dS2^T Q2 (shared keys: their sum),  dQi = s dSi Ki
    dlam = -rowsum(dout o o2) = -R2  per token; summed over tokens (and pairs) for a broadcast lam

A row that sees exactly one key has P = 1 and dS = 0 exactly; the kernels write that 0 rather
than the rounding left by dP - D.

Three kernels: the preprocess writes (D1, R2) per row (standard attention: D = rowsum(dout o out)),
laid out like lse; the key-block kernel owns a block of keys of one group and loops over the
group's pairs and the query blocks that see it, so dK and dV need no atomics (several programs
split a group's pairs when the grid would be too small; their float32 partials are summed
after); dQ is either added atomically by that kernel (fast, order not fixed) or computed by a
query-block kernel of its own (deterministic).
"""

import triton
import triton.language as tl

from ._common import LOG2E_C, load_tile, mma, store_tile


@triton.jit
def attn_bwd_preprocess_kernel(
    DOUT, OUT, O2, LAM, DELTA, CU_Q,
    s_db, s_dt, s_dh,               # dout (B, Tq, H, DV)
    s_ob, s_ot, s_oh,               # out  (B, Tq, H, DV)
    s_2b, s_2t, s_2h,               # o2   (B, Tq, H, DV)
    s_lb, s_lt, s_lh,               # lam  (H), (B, Tq, H) or ()
    s_sb, s_sh,                     # delta (B, MAPS*H, Tq) like lse: D1 at 2h, R2 at 2h + 1
    Tq,
    MAPS: tl.constexpr, VARLEN: tl.constexpr, DV: tl.constexpr, BLOCK_DV: tl.constexpr,
    BLOCK_M: tl.constexpr,
):
    """grid (H, cdiv(Tq, BLOCK_M), B)."""
    h = tl.program_id(0)
    start_m = tl.program_id(1) * BLOCK_M
    b = tl.program_id(2)
    if VARLEN:
        q0 = tl.load(CU_Q + b)
        q_len = tl.load(CU_Q + b + 1) - q0
        q0 = q0.to(tl.int64)
    else:
        q0 = 0
        q_len = Tq
    if start_m >= q_len:
        return
    b64 = b.to(tl.int64)
    offs_m0 = tl.arange(0, BLOCK_M)
    offs_m = start_m + offs_m0
    offs_dv = tl.arange(0, BLOCK_DV)
    rows = tl.cast(q0 + start_m, tl.int64) + offs_m0[:, None]   # rows x strides may pass 2^31
    do = load_tile(DOUT + b64 * s_db + rows * s_dt + h * s_dh + offs_dv[None, :], offs_m, q_len,
                   offs_dv, DV, True, DV != BLOCK_DV).to(tl.float32)     # (BLOCK_M, BLOCK_DV)
    out = load_tile(OUT + b64 * s_ob + rows * s_ot + h * s_oh + offs_dv[None, :], offs_m, q_len,
                    offs_dv, DV, True, DV != BLOCK_DV).to(tl.float32)
    rows_ok = offs_m < q_len
    d_ptrs = DELTA + b64 * s_sb + tl.cast(MAPS * h, tl.int64) * s_sh + q0 + offs_m
    if MAPS == 2:
        o2 = load_tile(O2 + b64 * s_2b + rows * s_2t + h * s_2h + offs_dv[None, :], offs_m, q_len,
                       offs_dv, DV, True, DV != BLOCK_DV).to(tl.float32)
        lam = tl.load(LAM + b64 * s_lb + (q0 + offs_m) * s_lt + h * s_lh, mask=rows_ok,
                      other=0.0).to(tl.float32)
        o1 = out + lam[:, None] * o2                          # map 1's output A1 V
        tl.store(d_ptrs, tl.sum(do * o1, 1), mask=rows_ok)
        tl.store(d_ptrs + s_sh, tl.sum(do * o2, 1), mask=rows_ok)
    else:
        tl.store(d_ptrs, tl.sum(do * out, 1), mask=rows_ok)


@triton.jit
def _sees_one_key(rows, diag, k_len, CAUSAL: tl.constexpr):
    """Whether each query row sees exactly one key. Its P is then 1 and dS = dP - D is exactly
    0, but dP (from V) and D (from the saved outputs) round differently; the kernels write the
    exact 0 (as the CPU backend does). Such rows occur only in masked tiles."""
    if CAUSAL:
        n_seen = tl.minimum(tl.maximum(rows + diag + 1, 0), k_len)
    else:
        n_seen = tl.zeros_like(rows) + k_len
    return n_seen == 1


@triton.jit
def _bwd_query_tiles(dk1, dk2, dv, k1, k2, v, q_ptrs, do_ptrs, lse_ptrs, delta_ptrs, lam_ptrs,
                     dq_ptrs, s_qt, s_ot, s_lt, s_dqt, s_qh, s_sh, s_dqh,
                     lo, hi, offs_n, offs_m0, offs_d, offs_dv, q_len, k_len, diag, qk_scale,
                     MAPS: tl.constexpr, SHARED_K: tl.constexpr, MASKED: tl.constexpr,
                     CAUSAL: tl.constexpr, ATOMIC_DQ: tl.constexpr, D: tl.constexpr,
                     DV: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DOT_PREC: tl.constexpr):
    """Query blocks [lo, hi) of one pair against one key block. k1, k2 (BLOCK_N, BLOCK_D),
    v (BLOCK_N, BLOCK_DV); dk1, dk2 (BLOCK_N, BLOCK_D) and dv (BLOCK_N, BLOCK_DV) float32.
    The (BLOCK_M, .) tile pointers q_ptrs, do_ptrs, dq_ptrs address rows 0.. of the pair's
    map-1 sub-head (map 2: + s_qh, + s_dqh), as do lse_ptrs, delta_ptrs (+ s_sh: map 2) and
    lam_ptrs; each step adds its row offset in int64 (rows x strides may pass 2^31).
    Scores are formed transposed, (BLOCK_N, BLOCK_M), so dK and dV are plain products. Rows past
    q_len read lse = +inf, so their P is 0; MASKED adds the causal diagonal and the key bound."""
    zero = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    for start_m in range(lo, hi, BLOCK_M):
        offs_m = start_m + offs_m0                                 # (BLOCK_M,)
        rows_ok = offs_m < q_len
        m64 = tl.cast(start_m, tl.int64)
        q1 = load_tile(q_ptrs + m64 * s_qt, offs_m, q_len, offs_d, D, True, D != BLOCK_D)
        do = load_tile(do_ptrs + m64 * s_ot, offs_m, q_len, offs_dv, DV, True, DV != BLOCK_DV)
        lse1 = tl.load(lse_ptrs + offs_m, mask=rows_ok, other=float("inf"))
        d1 = tl.load(delta_ptrs + offs_m, mask=rows_ok, other=0.0)
        # P1^T = exp(s k1 q1^T - lse1), in log2 units  (BLOCK_N, BLOCK_M)
        p1 = tl.math.exp2(mma(k1, tl.trans(q1), zero, DOT_PREC) * qk_scale
                          - lse1[None, :] * LOG2E_C)
        if MASKED:
            seen = offs_n[:, None] < k_len
            if CAUSAL:
                seen = seen & (offs_n[:, None] <= offs_m[None, :] + diag)
            p1 = tl.where(seen, p1, 0.0)
            one_key = _sees_one_key(offs_m, diag, k_len, CAUSAL)[None, :]
        dp = mma(v, tl.trans(do), zero, DOT_PREC)            # (dout V^T)^T  (BLOCK_N, BLOCK_M)
        ds1 = p1 * (dp - d1[None, :])
        if MASKED:
            ds1 = tl.where(one_key, 0.0, ds1)
        dk1 = mma(ds1.to(q1.dtype), q1, dk1, DOT_PREC)
        if ATOMIC_DQ:
            dq1 = mma(tl.trans(ds1.to(k1.dtype)), k1, tl.zeros([BLOCK_M, BLOCK_D], tl.float32),
                      DOT_PREC)
            tl.atomic_add(dq_ptrs + m64 * s_dqt, dq1,
                          mask=rows_ok[:, None] & (offs_d[None, :] < D), sem="relaxed")
        if MAPS == 2:
            q2 = load_tile(q_ptrs + m64 * s_qt + s_qh, offs_m, q_len, offs_d, D, True,
                           D != BLOCK_D)
            lse2 = tl.load(lse_ptrs + s_sh + offs_m, mask=rows_ok, other=float("inf"))
            r2 = tl.load(delta_ptrs + s_sh + offs_m, mask=rows_ok, other=0.0)
            lam = tl.load(lam_ptrs + offs_m * s_lt, mask=rows_ok, other=0.0).to(tl.float32)
            p2 = tl.math.exp2(mma(k2, tl.trans(q2), zero, DOT_PREC) * qk_scale
                              - lse2[None, :] * LOG2E_C)
            if MASKED:
                p2 = tl.where(seen, p2, 0.0)
            # out = (A1 - lam A2) V (arXiv:2410.05258, Eq. 1), so dV = (P1 - lam P2)^T dout
            dv = mma((p1 - lam[None, :] * p2).to(do.dtype), do, dv, DOT_PREC)
            ds2 = -lam[None, :] * p2 * (dp - r2[None, :])
            if MASKED:
                ds2 = tl.where(one_key, 0.0, ds2)
            if SHARED_K:
                dk1 = mma(ds2.to(q2.dtype), q2, dk1, DOT_PREC)
            else:
                dk2 = mma(ds2.to(q2.dtype), q2, dk2, DOT_PREC)
            if ATOMIC_DQ:
                dq2 = mma(tl.trans(ds2.to(k2.dtype)), k2, tl.zeros([BLOCK_M, BLOCK_D], tl.float32),
                          DOT_PREC)
                tl.atomic_add(dq_ptrs + m64 * s_dqt + s_dqh, dq2,
                              mask=rows_ok[:, None] & (offs_d[None, :] < D), sem="relaxed")
        else:
            dv = mma(p1.to(do.dtype), do, dv, DOT_PREC)
    return dk1, dk2, dv


@triton.jit
def attn_bwd_dkdv_kernel(
    Q, K, V, LAM, DOUT, LSE, DELTA, DQ, DK_OUT, DV_OUT, CU_Q, CU_K,
    qk_scale, sm_scale,             # scale * log2(e), scale
    s_qb, s_qt, s_qh,               # q     (B, Tq, MAPS*H, D)
    s_kb, s_kt, s_kh,               # k     (B, Tk, KH, D)
    s_vb, s_vt, s_vh,               # v     (B, Tk, G, DV)
    s_lb, s_lt, s_lh,               # lam   (H), (B, Tq, H) or ()
    s_ob, s_ot, s_oh,               # dout  (B, Tq, H, DV)
    s_sb, s_sh,                     # lse, delta (B, MAPS*H, Tq)
    s_dqb, s_dqt, s_dqh,            # dq    float32 (B, Tq, MAPS*H, D), ATOMIC_DQ only
    s_dks, s_dkb, s_dkt, s_dkh,     # dk    (S, B, Tk, KH, D): S splits of a group's pairs
    s_dvs, s_dvb, s_dvt, s_dvh,     # dv    (S, B, Tk, G, DV)
    Tq, Tk, QPG, SPLITS,            # QPG pairs per group, split into SPLITS runs of programs
    MAPS: tl.constexpr, SHARED_K: tl.constexpr, CAUSAL: tl.constexpr, VARLEN: tl.constexpr,
    ATOMIC_DQ: tl.constexpr, D: tl.constexpr, DV: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_DV: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    DOT_PREC: tl.constexpr,
):
    """grid (cdiv(Tk, BLOCK_N), G * SPLITS, B): one key block of one group; the program's pairs
    are a contiguous run of the group's QPG pairs, and it writes its own dK/dV rows."""
    pid_n = tl.program_id(0)
    g = tl.program_id(1) // SPLITS
    split = tl.program_id(1) % SPLITS
    b = tl.program_id(2)
    if VARLEN:
        q0 = tl.load(CU_Q + b)
        q_len = tl.load(CU_Q + b + 1) - q0
        k0 = tl.load(CU_K + b)
        k_len = tl.load(CU_K + b + 1) - k0
        q0 = q0.to(tl.int64)
        k0 = k0.to(tl.int64)
    else:
        q0 = 0
        q_len = Tq
        k0 = 0
        k_len = Tk
    start_n = pid_n * BLOCK_N
    if start_n >= k_len:
        return
    b64 = b.to(tl.int64)
    key0 = tl.cast(k0 + start_n, tl.int64)   # keys x strides may pass 2^31 elements
    offs_n0 = tl.arange(0, BLOCK_N)
    offs_n = start_n + offs_n0
    offs_m0 = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)

    if MAPS == 2 and not SHARED_K:
        kh = 2 * g
    else:
        kh = g
    k_off = b64 * s_kb + (key0 + offs_n0[:, None]) * s_kt + kh * s_kh + offs_d[None, :]
    k1 = load_tile(K + k_off, offs_n, k_len, offs_d, D, True, D != BLOCK_D)   # (BLOCK_N, BLOCK_D)
    if MAPS == 2 and not SHARED_K:
        k2 = load_tile(K + k_off + s_kh, offs_n, k_len, offs_d, D, True, D != BLOCK_D)
    else:
        k2 = k1
    v_off = b64 * s_vb + (key0 + offs_n0[:, None]) * s_vt + g * s_vh + offs_dv[None, :]
    v = load_tile(V + v_off, offs_n, k_len, offs_dv, DV, True, DV != BLOCK_DV)
    dk1 = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dk2 = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_DV], dtype=tl.float32)

    # causal, bottom-right: row i sees key j iff i >= j - diag. Rows below start_n - diag see
    # none of the block; rows from start_n + BLOCK_N - 1 - diag on see all of it (when the block
    # lies inside k_len).
    diag = k_len - q_len
    if CAUSAL:
        lo = tl.maximum(start_n - diag, 0)
        lo = (lo // BLOCK_M) * BLOCK_M
        full = tl.maximum(start_n + BLOCK_N - 1 - diag, 0)
        full = tl.cdiv(full, BLOCK_M) * BLOCK_M
    else:
        lo = 0
        full = 0
    if start_n + BLOCK_N > k_len:   # the ragged last key block: every query block is masked
        full = q_len
    full = tl.maximum(tl.minimum(full, q_len), lo)

    per = tl.cdiv(QPG, SPLITS)
    p_lo = split * per
    p_hi = tl.minimum(p_lo + per, QPG)
    for p in range(p_lo, p_hi):
        h = g * QPG + p
        q_ptrs = (Q + b64 * s_qb + q0 * s_qt + offs_m0[:, None] * s_qt + (MAPS * h) * s_qh
                  + offs_d[None, :])
        do_ptrs = (DOUT + b64 * s_ob + q0 * s_ot + offs_m0[:, None] * s_ot + h * s_oh
                   + offs_dv[None, :])
        lse_ptrs = LSE + b64 * s_sb + tl.cast(MAPS * h, tl.int64) * s_sh + q0
        delta_ptrs = DELTA + b64 * s_sb + tl.cast(MAPS * h, tl.int64) * s_sh + q0
        if MAPS == 2:
            lam_ptrs = LAM + b64 * s_lb + q0 * s_lt + h * s_lh
        else:
            lam_ptrs = lse_ptrs  # unused: standard attention has no lambda
        if ATOMIC_DQ:
            dq_ptrs = (DQ + b64 * s_dqb + q0 * s_dqt + offs_m0[:, None] * s_dqt
                       + (MAPS * h) * s_dqh + offs_d[None, :])
        else:
            dq_ptrs = q_ptrs     # unused: the deterministic dQ kernel writes dQ
        dk1, dk2, dv = _bwd_query_tiles(
            dk1, dk2, dv, k1, k2, v, q_ptrs, do_ptrs, lse_ptrs, delta_ptrs, lam_ptrs, dq_ptrs,
            s_qt, s_ot, s_lt, s_dqt, s_qh, s_sh, s_dqh, lo, full, offs_n, offs_m0, offs_d,
            offs_dv, q_len, k_len, diag, qk_scale, MAPS, SHARED_K, True, CAUSAL, ATOMIC_DQ, D, DV,
            BLOCK_D, BLOCK_DV, BLOCK_M, BLOCK_N, DOT_PREC)
        dk1, dk2, dv = _bwd_query_tiles(
            dk1, dk2, dv, k1, k2, v, q_ptrs, do_ptrs, lse_ptrs, delta_ptrs, lam_ptrs, dq_ptrs,
            s_qt, s_ot, s_lt, s_dqt, s_qh, s_sh, s_dqh, full, q_len, offs_n, offs_m0, offs_d,
            offs_dv, q_len, k_len, diag, qk_scale, MAPS, SHARED_K, False, CAUSAL, ATOMIC_DQ, D, DV,
            BLOCK_D, BLOCK_DV, BLOCK_M, BLOCK_N, DOT_PREC)

    dk_off = (tl.cast(split, tl.int64) * s_dks + b64 * s_dkb + (key0 + offs_n0[:, None]) * s_dkt
              + kh * s_dkh + offs_d[None, :])
    store_tile(DK_OUT + dk_off, (dk1 * sm_scale).to(DK_OUT.dtype.element_ty), offs_n, k_len,
               offs_d, D, D != BLOCK_D)
    if MAPS == 2 and not SHARED_K:
        store_tile(DK_OUT + dk_off + s_dkh, (dk2 * sm_scale).to(DK_OUT.dtype.element_ty), offs_n,
                   k_len, offs_d, D, D != BLOCK_D)
    dv_off = (tl.cast(split, tl.int64) * s_dvs + b64 * s_dvb + (key0 + offs_n0[:, None]) * s_dvt
              + g * s_dvh + offs_dv[None, :])
    store_tile(DV_OUT + dv_off, dv.to(DV_OUT.dtype.element_ty), offs_n, k_len, offs_dv, DV,
               DV != BLOCK_DV)


@triton.jit
def _dq_key_tiles(dq1, dq2, q1, q2, do, lse1, lse2, d1, r2, lam, k1_ptrs, k2_ptrs, v_ptrs,
                  s_kt, s_vt, lo, hi, offs_m, offs_n0, offs_d, offs_dv, k_len, diag, qk_scale,
                  MAPS: tl.constexpr, SHARED_K: tl.constexpr, MASKED: tl.constexpr,
                  CAUSAL: tl.constexpr, D: tl.constexpr, DV: tl.constexpr,
                  BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_M: tl.constexpr,
                  BLOCK_N: tl.constexpr, DOT_PREC: tl.constexpr):
    """Key tiles [lo, hi) for one query block: dq1, dq2 (BLOCK_M, BLOCK_D) float32 (unscaled);
    the K/V pointers address key lo and move on by a tile per step (returned where they end)."""
    zero = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for start_n in range(lo, hi, BLOCK_N):
        keys = start_n + offs_n0
        k1 = load_tile(k1_ptrs, keys, k_len, offs_d, D, MASKED, D != BLOCK_D)
        v = load_tile(v_ptrs, keys, k_len, offs_dv, DV, MASKED, DV != BLOCK_DV)
        p1 = tl.math.exp2(mma(q1, tl.trans(k1), zero, DOT_PREC) * qk_scale
                          - lse1[:, None] * LOG2E_C)
        if MASKED:
            seen = keys[None, :] < k_len
            if CAUSAL:
                seen = seen & (keys[None, :] <= offs_m[:, None] + diag)
            p1 = tl.where(seen, p1, 0.0)
            one_key = _sees_one_key(offs_m, diag, k_len, CAUSAL)[:, None]
        dp = mma(do, tl.trans(v), zero, DOT_PREC)                 # dout V^T  (BLOCK_M, BLOCK_N)
        ds1 = p1 * (dp - d1[:, None])
        if MASKED:
            ds1 = tl.where(one_key, 0.0, ds1)
        dq1 = mma(ds1.to(k1.dtype), k1, dq1, DOT_PREC)
        if MAPS == 2:
            if SHARED_K:
                k2 = k1
            else:
                k2 = load_tile(k2_ptrs, keys, k_len, offs_d, D, MASKED, D != BLOCK_D)
            p2 = tl.math.exp2(mma(q2, tl.trans(k2), zero, DOT_PREC) * qk_scale
                              - lse2[:, None] * LOG2E_C)
            if MASKED:
                p2 = tl.where(seen, p2, 0.0)
            ds2 = -lam[:, None] * p2 * (dp - r2[:, None])
            if MASKED:
                ds2 = tl.where(one_key, 0.0, ds2)
            dq2 = mma(ds2.to(k2.dtype), k2, dq2, DOT_PREC)
        k1_ptrs += BLOCK_N * s_kt
        k2_ptrs += BLOCK_N * s_kt
        v_ptrs += BLOCK_N * s_vt
    return dq1, dq2, k1_ptrs, k2_ptrs, v_ptrs


@triton.jit
def attn_bwd_dq_kernel(
    Q, K, V, LAM, DOUT, LSE, DELTA, DQ, CU_Q, CU_K,
    qk_scale, sm_scale,
    s_qb, s_qt, s_qh,               # q     (B, Tq, MAPS*H, D)
    s_kb, s_kt, s_kh,               # k     (B, Tk, KH, D)
    s_vb, s_vt, s_vh,               # v     (B, Tk, G, DV)
    s_lb, s_lt, s_lh,               # lam
    s_ob, s_ot, s_oh,               # dout  (B, Tq, H, DV)
    s_sb, s_sh,                     # lse, delta (B, MAPS*H, Tq)
    s_dqb, s_dqt, s_dqh,            # dq    (B, Tq, MAPS*H, D), q's dtype
    Tq, Tk, QPG,
    MAPS: tl.constexpr, SHARED_K: tl.constexpr, CAUSAL: tl.constexpr, VARLEN: tl.constexpr,
    D: tl.constexpr, DV: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DOT_PREC: tl.constexpr,
):
    """grid (H, cdiv(Tq, BLOCK_M), B): the deterministic dQ, one query block of one pair, the key
    tiles visited in order (the forward's two phases)."""
    h = tl.program_id(0)
    pid_m = tl.program_id(1)
    b = tl.program_id(2)
    if CAUSAL:
        pid_m = tl.num_programs(1) - 1 - pid_m
    if VARLEN:
        q0 = tl.load(CU_Q + b)
        q_len = tl.load(CU_Q + b + 1) - q0
        k0 = tl.load(CU_K + b)
        k_len = tl.load(CU_K + b + 1) - k0
        q0 = q0.to(tl.int64)
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
    offs_n0 = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    rows_ok = offs_m < q_len

    q_off = b64 * s_qb + (row0 + offs_m0[:, None]) * s_qt + (MAPS * h) * s_qh + offs_d[None, :]
    q1 = load_tile(Q + q_off, offs_m, q_len, offs_d, D, True, D != BLOCK_D)
    do = load_tile(DOUT + b64 * s_ob + (row0 + offs_m0[:, None]) * s_ot + h * s_oh
                   + offs_dv[None, :], offs_m, q_len, offs_dv, DV, True, DV != BLOCK_DV)
    s_off = b64 * s_sb + tl.cast(MAPS * h, tl.int64) * s_sh + q0 + offs_m
    lse1 = tl.load(LSE + s_off, mask=rows_ok, other=float("inf"))
    d1 = tl.load(DELTA + s_off, mask=rows_ok, other=0.0)
    if MAPS == 2:
        q2 = load_tile(Q + q_off + s_qh, offs_m, q_len, offs_d, D, True, D != BLOCK_D)
        lse2 = tl.load(LSE + s_off + s_sh, mask=rows_ok, other=float("inf"))
        r2 = tl.load(DELTA + s_off + s_sh, mask=rows_ok, other=0.0)
        lam = tl.load(LAM + b64 * s_lb + (q0 + offs_m) * s_lt + h * s_lh, mask=rows_ok,
                      other=0.0).to(tl.float32)
    else:
        q2 = q1
        lse2 = lse1
        r2 = d1
        lam = d1
    if MAPS == 2 and not SHARED_K:
        kh = 2 * g
    else:
        kh = g
    k1_ptrs = K + b64 * s_kb + (k0 + offs_n0[:, None]) * s_kt + kh * s_kh + offs_d[None, :]
    if MAPS == 2 and not SHARED_K:
        k2_ptrs = k1_ptrs + s_kh
    else:
        k2_ptrs = k1_ptrs
    v_ptrs = V + b64 * s_vb + (k0 + offs_n0[:, None]) * s_vt + g * s_vh + offs_dv[None, :]

    diag = k_len - q_len
    if CAUSAL:
        hi = tl.maximum(tl.minimum(tl.minimum(start_m + BLOCK_M, q_len) + diag, k_len), 0)
        full = tl.maximum(tl.minimum(start_m + diag + 1, k_len), 0)
    else:
        hi = k_len
        full = k_len
    full = (full // BLOCK_N) * BLOCK_N
    dq1 = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    dq2 = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    dq1, dq2, k1_ptrs, k2_ptrs, v_ptrs = _dq_key_tiles(
        dq1, dq2, q1, q2, do, lse1, lse2, d1, r2, lam, k1_ptrs, k2_ptrs, v_ptrs, s_kt, s_vt, 0,
        full, offs_m, offs_n0, offs_d, offs_dv, k_len, diag, qk_scale, MAPS, SHARED_K, False,
        CAUSAL, D, DV, BLOCK_D, BLOCK_DV, BLOCK_M, BLOCK_N, DOT_PREC)
    dq1, dq2, k1_ptrs, k2_ptrs, v_ptrs = _dq_key_tiles(
        dq1, dq2, q1, q2, do, lse1, lse2, d1, r2, lam, k1_ptrs, k2_ptrs, v_ptrs, s_kt, s_vt, full,
        hi, offs_m, offs_n0, offs_d, offs_dv, k_len, diag, qk_scale, MAPS, SHARED_K, True, CAUSAL,
        D, DV, BLOCK_D, BLOCK_DV, BLOCK_M, BLOCK_N, DOT_PREC)
    dq_off = b64 * s_dqb + (row0 + offs_m0[:, None]) * s_dqt + (MAPS * h) * s_dqh + offs_d[None, :]
    store_tile(DQ + dq_off, (dq1 * sm_scale).to(DQ.dtype.element_ty), offs_m, q_len, offs_d, D,
               D != BLOCK_D)
    if MAPS == 2:
        store_tile(DQ + dq_off + s_dqh, (dq2 * sm_scale).to(DQ.dtype.element_ty), offs_m, q_len,
                   offs_d, D, D != BLOCK_D)
