#!/usr/bin/env python3
"""Data-parallel training of a DIFF Transformer with diffattn's fused attention inside
PyTorch: the model comes from a model directory through diffattn.torch.load, is wrapped in
torch.nn.parallel.DistributedDataParallel, and trains on WORLD processes that talk over gloo
on 127.0.0.1 (on GPUs the backend would be NCCL; nothing else changes here).

    python3 examples/ddp_train.py --world 2 --steps 20
    python3 examples/ddp_train.py --model runs/tiny --world 2 --batch 16 --out losses.json

Each step's batch is a pure function of (seed, step); rank r trains on rows
[r B/W, (r+1) B/W) of it, in --accum micro-batches. The printed loss is the mean over the whole
batch (an all_reduce of the ranks' means). Without --model a small random diff_v1 model is
made (and saved with diffattn.torch.save) in a temporary directory. Data: random tokens, so
the loss falls only towards the unigram entropy; point --model at a trained directory and
replace batch() with your data for real use.
"""

import argparse
import contextlib
import json
import os
import socket
import sys
import tempfile
import time


def batch(step, B, T, V, seed):
    """tokens, targets (B, T) of step `step`: the same on every rank."""
    import torch
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    x = torch.randint(0, V, (B, T + 1), generator=g)
    return x[:, :-1], x[:, 1:]


def make_model_dir(path, seed):
    import torch
    import diffattn.torch as dt
    cfg = {"format": "diffattn/1", "attention": "diff_v1", "vocab_size": 64, "d_model": 32,
           "n_layers": 2, "ffn_dim": 64, "max_seq_len": 64, "rope_theta": 10000.0,
           "norm_eps": 1e-5, "tie_embeddings": False, "n_heads": 2, "n_kv_heads": 1,
           "head_dim": 8}
    torch.manual_seed(seed)
    m = dt.DiffTransformerLM(cfg)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name.endswith("norm.weight") or name.endswith("subln.weight"):
                p.fill_(1.0)
            else:
                p.normal_(0.0, 0.1)
    dt.save(m, path)


def worker(rank, args, port):
    # one kernel thread per process: the processes share the machine's cores, and a fixed
    # thread count keeps the kernels' sums in one order (the test compares runs bit for bit)
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP
    import diffattn.torch as dt

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=args.world)
    model = dt.load(args.model)
    ddp = DDP(model)
    opt = torch.optim.AdamW(ddp.parameters(), lr=args.lr, weight_decay=0.0)
    V = model.config["vocab_size"]
    n = args.batch // args.world
    losses = []
    for step in range(args.steps):
        t0 = time.perf_counter()
        tokens, targets = batch(step, args.batch, args.seq, V, args.seed)
        tokens, targets = tokens[rank * n:(rank + 1) * n], targets[rank * n:(rank + 1) * n]
        opt.zero_grad(set_to_none=True)
        total = torch.zeros(())
        for i, (x, y) in enumerate(zip(tokens.chunk(args.accum), targets.chunk(args.accum))):
            sync = contextlib.nullcontext() if i == args.accum - 1 else ddp.no_sync()
            with sync:
                logits = ddp(x)
                loss = F.cross_entropy(logits.reshape(-1, V), y.reshape(-1)) / args.accum
                loss.backward()  # the last micro-batch's backward all-reduces the gradients
            total += loss.detach()
        dist.all_reduce(total)
        total /= args.world
        opt.step()
        losses.append(total.item())
        if rank == 0:
            print(f"step {step}  loss {losses[-1]:.6f}  {time.perf_counter() - t0:.3f} s",
                  flush=True)
    if rank == 0 and args.out:
        with open(args.out, "w") as f:
            json.dump({"losses": losses, "world": args.world, "accum": args.accum}, f)
    dist.barrier()
    dist.destroy_process_group()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="model directory (docs/FORMAT.md); default: a random one")
    ap.add_argument("--world", type=int, default=2, help="processes (default 2)")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--batch", type=int, default=8, help="sequences a step, all ranks together")
    ap.add_argument("--seq", type=int, default=32, help="tokens a sequence")
    ap.add_argument("--accum", type=int, default=1, help="micro-batches a rank per step")
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", help="write the losses as JSON here")
    args = ap.parse_args(argv)
    if args.world < 1 or args.accum < 1 or args.steps < 1:
        ap.error("--world, --accum and --steps must be at least 1")
    if args.batch % (args.world * args.accum):
        ap.error(f"--batch {args.batch} must be divisible by --world x --accum "
                 f"= {args.world * args.accum}")
    import torch.multiprocessing as mp
    with tempfile.TemporaryDirectory() as tmp:
        if not args.model:
            args.model = os.path.join(tmp, "model")
            make_model_dir(args.model, args.seed)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        mp.spawn(worker, args=(args, port), nprocs=args.world, join=True)


if __name__ == "__main__":
    sys.exit(main())
