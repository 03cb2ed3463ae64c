"""Ring (context-parallel) attention on torch.distributed: one sequence sharded over the ranks
of a process group (gloo on CPU, NCCL on GPUs; the same code), each map keeping its own
(output, log-sum-exp) and the subtraction after the merge. The blocks run the diffattn custom
ops (diffattn.torch.ops), so a rank's kernels are the C++ ones on CPU and Triton's on CUDA."""

import torch

from ._checks import as_f32, check_flags, check_same, check_tensor
from .ops import attention_bwd, attention_fwd, diff_attention_bwd, diff_attention_fwd

__all__ = ["ring_diff_attention", "ring_attention", "zigzag_shard", "zigzag_unshard",
           "ring_bytes_sent"]


# Context parallelism for differential attention on torch.distributed. The sequence is cut
# into 2W chunks of c = T / (2W) tokens (W ranks); each rank holds two chunks, concatenated:
#
#   layout "zigzag" (default): rank r holds chunks r and 2W-1-r. Under a causal mask every
#     rank then has the same work at every ring step: its own block costs two diagonal
#     c x c tiles and one full one, every other block exactly two full c x c tiles (the
#     early chunk sees all of a block from an earlier rank, the late chunk all of it from a
#     later rank). zigzag_shard / zigzag_unshard cut and reassemble a full tensor.
#   layout "contiguous": rank r holds tokens [r T/W, (r+1) T/W) (chunks 2r, 2r+1). Under a
#     causal mask rank W-1 does W times the work of rank 0: fine without a mask.
#
# Forward: K/V shards travel the ring (rank r sends to r+1, receives from r-1; the next
# block's transfer overlaps the current block's kernels). For each (query chunk, key chunk)
# pair the mask leaves visible (none, all, or the causal diagonal) one fused call with
# lambda = 0 returns map 1's output as out, map 2's as o2, and each map's log-sum-exp; every
# map keeps its own running (output, lse), merged with log-sum-exp weights in float64, and the
# subtraction out = O1 - lam O2 comes after the last merge.
# Backward: the global (out, lse, o2) of the rank's rows make every block's contribution exact
# (P = exp(s q.k - lse) with the global lse, dS = P (dP - D), D from the global outputs), so
# each block's kernel backward gives its share of dq, dk, dv. K/V travel the ring again with
# their dK/dV accumulators; after W steps each rank's dK/dV come home. dlam = -dout . o2 needs
# no keys: computed once from the saved o2.
#
# Bytes sent per rank per step (float32): forward (W-1) (|K| + |V|), backward
# (W-1) (|K| + |V|) + W (|K| + |V|) (nothing at all when W = 1), |K| and |V| this rank's
# shard sizes. Counted in
# ring_bytes_sent (a dict: "forward", "backward").

ring_bytes_sent = {"forward": 0, "backward": 0}


def _chunk_ids(rank, world, layout):
    return (rank, 2 * world - 1 - rank) if layout == "zigzag" else (2 * rank, 2 * rank + 1)


def zigzag_shard(x, rank, world, dim=1):
    """Rank `rank`'s zig-zag shard of a full-sequence tensor: chunks rank and 2W-1-rank of
    x's dimension `dim` cut into 2*world equal chunks, concatenated."""
    T = x.shape[dim]
    if world < 1 or not 0 <= rank < world:
        raise ValueError(f"zigzag_shard: rank {rank} is not in [0, world={world})")
    if T % (2 * world):
        raise ValueError(f"zigzag_shard: sequence length {T} (dimension {dim}) is not divisible "
                         f"by 2*world = {2 * world}")
    c = T // (2 * world)
    a, b = _chunk_ids(rank, world, "zigzag")
    return torch.cat((x.narrow(dim, a * c, c), x.narrow(dim, b * c, c)), dim)


def zigzag_unshard(shards, dim=1):
    """The full-sequence tensor from every rank's zig-zag shard (rank order)."""
    W = len(shards)
    chunks = [None] * (2 * W)
    for r, s in enumerate(shards):
        a, b = _chunk_ids(r, W, "zigzag")
        chunks[a], chunks[b] = torch.chunk(s, 2, dim)
    return torch.cat(chunks, dim)


def _visible(qi, kj, causal):
    """None: query chunk qi sees nothing of key chunk kj; False: all of it; True: the causal
    diagonal (same chunk)."""
    if not causal:
        return False
    if kj < qi:
        return False
    return True if kj == qi else None


class _Ring:
    """Ranks and point-to-point transfers of one group."""

    def __init__(self, group):
        import torch.distributed as dist
        self.dist, self.group = dist, group
        self.rank = dist.get_rank(group)
        self.world = dist.get_world_size(group)

        def glob(r):
            if group is None:
                return r
            g = getattr(dist, "get_global_rank", None) or dist.distributed_c10d._get_global_rank
            return g(group, r)

        self.next = glob((self.rank + 1) % self.world)
        self.prev = glob((self.rank - 1) % self.world)

    def start(self, tensors, phase):
        """Send tensors to the next rank and receive same-shaped ones from the previous."""
        bufs = [torch.empty_like(t) for t in tensors]
        reqs = [self.dist.isend(t, self.next, group=self.group) for t in tensors]
        reqs += [self.dist.irecv(b, self.prev, group=self.group) for b in bufs]
        ring_bytes_sent[phase] += sum(t.numel() * t.element_size() for t in tensors)
        return reqs, bufs

    @staticmethod
    def finish(pending):
        reqs, bufs = pending
        for r in reqs:
            r.wait()
        return bufs


def _merge(O, L, rows, o_part, l_part, m, maps=2):
    """Fold one block's partial (o_part (B, c, H, Dv), l_part (B, maps*H, c), map m's rows
    m, m+maps, ...) into the running map-m output O (B, Tl, H, Dv) and lse L (B, maps*H, Tl),
    float64."""
    lp = l_part[:, m::maps].double()  # (B, H, c)
    lp = torch.where(lp == float("inf"), torch.full_like(lp, float("-inf")), lp)  # no key
    lo = L[:, m::maps, rows]
    new = torch.logaddexp(lo, lp)
    safe = torch.where(torch.isinf(new), torch.zeros_like(new), new)
    w_old = torch.exp(lo - safe).transpose(1, 2).unsqueeze(-1)  # (B, c, H, 1)
    w_new = torch.exp(lp - safe).transpose(1, 2).unsqueeze(-1)
    O[:, rows] = O[:, rows] * w_old + o_part.double() * w_new
    L[:, m::maps, rows] = new


def _ring_forward(ring, layout, causal, q, k, v, block):
    """Runs block(a, k_chunk, v_chunk, mode) for every (query chunk a, key chunk) pair this
    rank's queries see, while the K/V shards travel the ring (the next shard's transfer overlaps
    this shard's work)."""
    W, r = ring.world, ring.rank
    c = q.shape[1] // 2
    mine = _chunk_ids(r, W, layout)
    kb, vb = k.contiguous(), v.contiguous()
    for s in range(W):
        pending = ring.start([kb, vb], "forward") if s < W - 1 else None
        theirs = _chunk_ids((r - s) % W, W, layout)
        for a in range(2):
            for b in range(2):
                mode = _visible(mine[a], theirs[b], causal)
                if mode is not None:
                    block(a, kb[:, b * c:(b + 1) * c], vb[:, b * c:(b + 1) * c], mode)
        if pending is not None:
            kb, vb = ring.finish(pending)


def _ring_backward(ring, layout, causal, q, k, v, block):
    """dq, dk, dv over the ring: block(a, k_chunk, v_chunk, mode) returns the (dq, dk, dv) of
    query chunk a against one key chunk; each shard's dK/dV travel with it, so after W hops
    they are home."""
    W, r = ring.world, ring.rank
    c = q.shape[1] // 2
    mine = _chunk_ids(r, W, layout)
    dq = torch.zeros(q.shape, dtype=torch.float64, device=q.device)
    kb, vb = k.contiguous(), v.contiguous()
    dkb, dvb = torch.zeros_like(kb), torch.zeros_like(vb)
    for s in range(W):
        pending = ring.start([kb, vb], "backward") if s < W - 1 else None
        theirs = _chunk_ids((r - s) % W, W, layout)
        for a in range(2):
            for b in range(2):
                mode = _visible(mine[a], theirs[b], causal)
                if mode is None:
                    continue
                cols = slice(b * c, (b + 1) * c)
                gq, gk, gv = block(a, kb[:, cols], vb[:, cols], mode)
                dq[:, a * c:(a + 1) * c] += gq
                dkb[:, cols] += gk
                dvb[:, cols] += gv
        dkb, dvb = ring.finish(ring.start([dkb, dvb], "backward")) if W > 1 else [dkb, dvb]
        if pending is not None:
            kb, vb = ring.finish(pending)
    return dq, dkb, dvb


def _row_pieces(c, **tensors):
    """Per query chunk (2 of c rows): the contiguous pieces the kernels read. A tensor whose
    rows are its second dimension is cut there; lse (B, heads, T) on its last."""
    out = []
    for a in range(2):
        rows = slice(a * c, (a + 1) * c)
        out.append({n: (t[:, :, rows] if n == "lse" else t[:, rows]).contiguous()
                    for n, t in tensors.items()})
    return out


def _backend(x):
    """The kernels of a rank's device: the fused C++ ones on CPU, Triton's on CUDA."""
    return "fused" if x.device.type == "cpu" else "auto"


def _lse_of(L):
    """The merged log-sum-exp as the kernels save it: +inf for a row that saw no key."""
    return torch.where(torch.isinf(L), torch.full_like(L, float("inf")), L).float()


class _RingAttnFn(torch.autograd.Function):
    """Standard attention over the ring: as _RingDiffFn with one map."""

    @staticmethod
    def forward(ctx, q, k, v, causal, scale, group, layout):
        ring = _Ring(group)
        B, Tl, H, D = q.shape
        c = Tl // 2
        O = torch.zeros(B, Tl, H, v.shape[-1], dtype=torch.float64, device=q.device)
        L = torch.full((B, H, Tl), float("-inf"), dtype=torch.float64, device=q.device)
        backend = _backend(q)

        def block(a, kc, vc, mode):
            rows = slice(a * c, (a + 1) * c)
            op, lp = attention_fwd(q[:, rows], kc, vc, mode, scale, backend)
            _merge(O, L, rows, op, lp, 0, maps=1)

        _ring_forward(ring, layout, causal, q, k, v, block)
        out = O.float()
        ctx.causal, ctx.scale, ctx.group, ctx.layout = causal, scale, group, layout
        ctx.save_for_backward(q, k, v, out, _lse_of(L))
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        dout = as_f32(dout).contiguous()
        per_row = _row_pieces(q.shape[1] // 2, q=q, dout=dout, out=out, lse=lse)
        backend = _backend(q)

        def block(a, kc, vc, mode):
            x = per_row[a]
            return attention_bwd(x["dout"], x["q"], kc, vc, x["out"], x["lse"], mode, ctx.scale,
                                 backend)

        dq, dk, dv = _ring_backward(_Ring(ctx.group), ctx.layout, ctx.causal, q, k, v, block)
        return dq.float(), dk, dv, None, None, None, None


class _RingDiffFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, lam, causal, scale, group, layout):
        ring = _Ring(group)
        B, Tl, H2, D = q.shape
        H, c = H2 // 2, Tl // 2
        zero_lam = torch.zeros(H, device=q.device)
        O1 = torch.zeros(B, Tl, H, v.shape[-1], dtype=torch.float64, device=q.device)
        O2 = torch.zeros_like(O1)
        L = torch.full((B, H2, Tl), float("-inf"), dtype=torch.float64, device=q.device)
        backend = _backend(q)

        def block(a, kc, vc, mode):
            # lambda 0: out is map 1's output, o2 map 2's; each merges with its own lse
            rows = slice(a * c, (a + 1) * c)
            o1p, lp, o2p = diff_attention_fwd(q[:, rows], kc, vc, zero_lam, mode, scale, backend)
            _merge(O1, L, rows, o1p, lp, 0)
            _merge(O2, L, rows, o2p, lp, 1)

        _ring_forward(ring, layout, causal, q, k, v, block)
        lam_b = lam.double().view(1, 1, -1, 1) if lam.dim() == 1 else lam.double().unsqueeze(-1)
        out = (O1 - lam_b * O2).float()
        o2 = O2.float()
        ctx.causal, ctx.scale, ctx.group, ctx.layout = causal, scale, group, layout
        ctx.save_for_backward(q, k, v, lam, out, _lse_of(L), o2)
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, lam, out, lse, o2 = ctx.saved_tensors
        c = q.shape[1] // 2
        dout = as_f32(dout).contiguous()
        per_row = _row_pieces(c, q=q, dout=dout, out=out, o2=o2, lse=lse)
        for a in range(2):
            per_row[a]["lam"] = (lam.contiguous() if lam.dim() == 1
                                 else lam[:, a * c:(a + 1) * c].contiguous())
        backend = _backend(q)

        def block(a, kc, vc, mode):
            x = per_row[a]
            gq, gk, gv, _ = diff_attention_bwd(x["dout"], x["q"], kc, vc, x["lam"], x["out"],
                                               x["lse"], x["o2"], mode, ctx.scale, backend)
            return gq, gk, gv

        dq, dk, dv = _ring_backward(_Ring(ctx.group), ctx.layout, ctx.causal, q, k, v, block)
        dlam = -(dout.double() * o2.double()).sum(-1)  # (B, Tl, H), computed once, not per block
        if lam.dim() == 1:
            dlam = dlam.sum((0, 1)) if lam.numel() == dlam.shape[-1] else dlam.sum().reshape(1)
        return (dq.float(), dk, dv, dlam.float(), None, None, None, None)


def ring_diff_attention(q, k, v, lam, causal=True, group=None, scale=None, layout="zigzag"):
    """Differential attention over a sequence sharded across the ranks of `group` (default:
    the whole world), differentiable in q, k, v and lam.

    Each rank passes its shard: q (B, Tl, 2H, D), k (B, Tl, 2G or G, D), v (B, Tl, G, Dv),
    lam (H) or (B, Tl, H) (this rank's rows), Tl = T / W the same on every rank and even.
    layout "zigzag" (default): rank r holds chunks r and 2W-1-r of the sequence cut into 2W
    (zigzag_shard builds it; balances a causal mask); "contiguous": tokens [r Tl, (r+1) Tl).
    Returns this rank's rows of the single-process diff_attention output, (B, Tl, H, Dv).

    The gradients of q, k and v are this rank's rows of the full ones (dK/dV of every rank's
    queries travel back along the ring). A lambda of shape (H) is shared by every rank, as a
    replicated parameter is: each rank's gradient is its own rows' share, and their sum (an
    all_reduce, as DistributedDataParallel does for parameters) is the single-process one.
    """
    op = "ring_diff_attention"
    check_tensor(op, "lam", lam, (1, 3))
    scale = _check_ring(op, q, k, v, causal, group, scale, layout)
    out = _RingDiffFn.apply(as_f32(q), as_f32(k), as_f32(v), as_f32(lam), causal, scale,
                            group, layout)
    return out if q.dtype == torch.float32 else out.to(q.dtype)


def ring_attention(q, k, v, causal=True, group=None, scale=None, layout="zigzag"):
    """Standard softmax attention over a sequence sharded across the ranks of `group`, as
    ring_diff_attention with one map: q (B, Tl, H, D), k (B, Tl, G, D), v (B, Tl, G, Dv)
    this rank's rows -> this rank's rows of the output (B, Tl, H, Dv)."""
    op = "ring_attention"
    scale = _check_ring(op, q, k, v, causal, group, scale, layout)
    out = _RingAttnFn.apply(as_f32(q), as_f32(k), as_f32(v), causal, scale, group, layout)
    return out if q.dtype == torch.float32 else out.to(q.dtype)


def _check_ring(op, q, k, v, causal, group, scale, layout):
    import torch.distributed as dist
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(f"{op}: torch.distributed is not initialized "
                           f"(call torch.distributed.init_process_group first)")
    for name, x in (("q", q), ("k", k), ("v", v)):
        check_tensor(op, name, x, (4,))
    check_same(op, q=q, k=k, v=v)
    scale = check_flags(op, causal, scale)
    if layout not in ("zigzag", "contiguous"):
        raise ValueError(f"{op}: layout must be 'zigzag' or 'contiguous', got {layout!r}")
    W = dist.get_world_size(group)
    Tl = q.shape[1]
    # every rank must hold the same number of rows: compare (Tl, -Tl) maxima over the group
    t = torch.tensor([Tl, -Tl], dtype=torch.int64, device=q.device)  # NCCL reduces on the GPU
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    if int(t[0]) != -int(t[1]):
        raise ValueError(f"{op}: the ranks hold different numbers of rows ({Tl} here, between "
                         f"{-int(t[1])} and {int(t[0])}); every rank needs T / world rows")
    if Tl % 2:
        raise ValueError(f"{op}: sequence length T = {Tl * W} is not divisible by 2*world = "
                         f"{2 * W} (each rank holds two chunks of T / (2*world) rows; this "
                         f"rank has {Tl})")
    for name, x in (("k", k), ("v", v)):
        if x.shape[1] != Tl:
            raise ValueError(f"{op}: {name} has {x.shape[1]} rows on this rank, q has {Tl}")
    return scale
