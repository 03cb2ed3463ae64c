#!/usr/bin/env python3
"""Ring differential attention (diffattn.torch.ring_diff_attention) on W gloo processes on
this machine: time per training step (forward + backward of the operator) and the bytes each
rank sends, against the formula.

    .venv/bin/python bench/torch_ring.py [--T 4096] [--world 1 2 4]

One sequence of T tokens, V1 layout (2H query heads of D, 2G key heads, G value heads of 2D),
causal, zig-zag shards. Per rank and step (float32): forward sends (W-1)(|K|+|V|), backward
(W-1)(|K|+|V|) + W(|K|+|V|) (nothing at W = 1), |K| = T/W * 2G * D * 4 bytes, |V| = T/W * G * 2D * 4 bytes. The
ranks share this machine's cores (and one process's kernels use the threads it is given), so
the times show the ring's overheads here, not a multi-machine speed-up; on GPUs with NCCL the
K/V transfers would overlap the kernels of the previous block.
"""

import argparse
import json
import os
import socket
import statistics
import sys
import tempfile
import time


def worker(rank, world, port, a, out):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch
    import torch.distributed as dist
    import diffattn.torch as dt
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    g = torch.Generator().manual_seed(0)
    B, T, H, G, D = 1, a.T, a.H, a.G, a.D
    full = [torch.randn(B, T, 2 * H, D, generator=g), torch.randn(B, T, 2 * G, D, generator=g),
            torch.randn(B, T, G, 2 * D, generator=g)]
    dout = dt.zigzag_shard(torch.randn(B, T, H, 2 * D, generator=g), rank, world)
    xs = [dt.zigzag_shard(x, rank, world).clone().requires_grad_() for x in full]
    lam = torch.full((H,), 0.5, requires_grad=True)
    times, sent = [], None
    for i in range(a.steps + 1):
        dist.barrier()
        before = dict(dt.ring_bytes_sent)
        t0 = time.perf_counter()
        dt.ring_diff_attention(*xs, lam, causal=True).backward(dout)
        dist.barrier()
        if i:
            times.append(time.perf_counter() - t0)
        sent = {k: dt.ring_bytes_sent[k] - before[k] for k in before}
    if rank == 0:
        kv = 4 * (xs[1].numel() + xs[2].numel())
        with open(out, "w") as f:
            json.dump({"world": world, "step_s": statistics.median(times), "times": times,
                       "sent": sent, "formula": {"forward": (world - 1) * kv,
                                                 "backward": (2 * world - 1) * kv if world > 1 else 0}}, f)
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--T", type=int, default=4096)
    ap.add_argument("--H", type=int, default=4)
    ap.add_argument("--G", type=int, default=2)
    ap.add_argument("--D", type=int, default=64)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--world", type=int, nargs="+", default=[1, 2, 4])
    a = ap.parse_args()
    import torch.multiprocessing as mp
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch
    import diffattn.torch as dt
    g = torch.Generator().manual_seed(0)
    xs = [torch.randn(1, a.T, 2 * a.H, a.D, generator=g).requires_grad_(),
          torch.randn(1, a.T, 2 * a.G, a.D, generator=g).requires_grad_(),
          torch.randn(1, a.T, a.G, 2 * a.D, generator=g).requires_grad_()]
    lam = torch.full((a.H,), 0.5, requires_grad=True)
    dout = torch.randn(1, a.T, a.H, 2 * a.D, generator=g)
    times = []
    for i in range(a.steps + 1):
        t0 = time.perf_counter()
        dt.diff_attention(*xs, lam, causal=True).backward(dout)
        if i:
            times.append(time.perf_counter() - t0)
    print(f"single process diff_attention: {statistics.median(times) * 1e3:8.1f} ms/step "
          f"(torch threads {torch.get_num_threads()})", flush=True)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for W in a.world:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            out = os.path.join(tmp, f"w{W}.json")
            mp.spawn(worker, args=(W, port, a, out), nprocs=W, join=True)
            with open(out) as f:
                r = json.load(f)
            rows.append(r)
            print(f"W={W}: {r['step_s'] * 1e3:8.1f} ms/step  sent per rank: forward "
                  f"{r['sent']['forward']} B (formula {r['formula']['forward']}), backward "
                  f"{r['sent']['backward']} B (formula {r['formula']['backward']})", flush=True)
    print(json.dumps(rows))


if __name__ == "__main__":
    sys.exit(main())
