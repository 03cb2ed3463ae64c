"""Worker processes for test_torch_ring.py: each rank runs every case on its zig-zag (or
contiguous) shard of one full problem and saves its rows of the output and gradients, which
the test reassembles and compares with the single-process operator."""

import os
import traceback

import torch
import torch.distributed as dist


def full_problem(case):
    """The full-sequence inputs of a case (same on every rank and in the test)."""
    B, T, H, G, D, Dv, shared, per_token = (case[k] for k in
                                            ("B", "T", "H", "G", "D", "Dv", "shared", "per_token"))
    g = torch.Generator().manual_seed(case["seed"])
    if case.get("standard"):  # standard attention: q (B, T, H, D), k (B, T, G, D), no lambda
        q = torch.randn(B, T, H, D, generator=g)
        k = torch.randn(B, T, G, D, generator=g)
        v = torch.randn(B, T, G, Dv, generator=g)
        return q, k, v, None, torch.randn(B, T, H, Dv, generator=g)
    q = torch.randn(B, T, 2 * H, D, generator=g)
    k = torch.randn(B, T, G if shared else 2 * G, D, generator=g)
    v = torch.randn(B, T, G, Dv, generator=g)
    lam = 0.1 + 0.8 * torch.rand((B, T, H) if per_token else (H,), generator=g)
    dout = torch.randn(B, T, H, Dv, generator=g)
    return q, k, v, lam, dout


def shard(x, rank, world, layout):
    import diffattn.torch as dt
    if layout == "zigzag":
        return dt.zigzag_shard(x, rank, world)
    n = x.shape[1] // world
    return x[:, rank * n:(rank + 1) * n]


def run(rank, world, port, cases, outdir):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    try:
        import diffattn.torch as dt
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=world)
        results = []
        for case in cases:
            q, k, v, lam, dout = full_problem(case)
            lay = case["layout"]
            xs = [shard(x, rank, world, lay).clone().requires_grad_() for x in (q, k, v)]
            before = dict(dt.ring_bytes_sent)
            if lam is None:
                lam_l = None
                out = dt.ring_attention(*xs, causal=case["causal"], layout=lay)
            else:
                lam_l = (shard(lam, rank, world, lay) if lam.dim() == 3 else lam).clone()
                lam_l.requires_grad_()
                out = dt.ring_diff_attention(*xs, lam_l, causal=case["causal"], layout=lay)
            out.backward(shard(dout, rank, world, lay))
            sent = {p: dt.ring_bytes_sent[p] - before[p] for p in before}
            results.append(dict(out=out.detach(), dq=xs[0].grad, dk=xs[1].grad, dv=xs[2].grad,
                                dlam=None if lam_l is None else lam_l.grad, sent=sent))
        # two rings of 2 inside a world of 4: ranks {0, 1} and {2, 3} (group ranks differ
        # from global ranks in the second)
        sub = []
        if world == 4:
            groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]
            grp, grank = groups[rank // 2], rank % 2
            c = cases[0]
            q, k, v, lam, dout = full_problem(c)
            xs = [dt.zigzag_shard(x, grank, 2).clone().requires_grad_() for x in (q, k, v)]
            lam_l = (dt.zigzag_shard(lam, grank, 2) if lam.dim() == 3 else lam).clone()
            lam_l.requires_grad_()
            out = dt.ring_diff_attention(*xs, lam_l, causal=c["causal"], group=grp)
            out.backward(dt.zigzag_shard(dout, grank, 2))
            sub.append(dict(out=out.detach(), dq=xs[0].grad, dk=xs[1].grad, dv=xs[2].grad,
                            dlam=lam_l.grad))
        errors = []
        q, k, v, lam, _ = full_problem(cases[0])
        odd = q[:, :3]  # 3 rows on every rank: T = 3 * world, not divisible by 2 * world
        try:
            dt.ring_diff_attention(odd, k[:, :3], v[:, :3], lam if lam.dim() == 1 else lam[:, :3])
        except ValueError as e:
            errors.append(str(e))
        torch.save(dict(results=results, errors=errors, sub=sub), os.path.join(outdir, f"rank{rank}.pt"))
        dist.barrier()
        dist.destroy_process_group()
    except Exception:
        with open(os.path.join(outdir, f"rank{rank}.err"), "w") as f:
            f.write(traceback.format_exc())
        raise
