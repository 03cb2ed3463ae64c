#!/usr/bin/env python3
"""A training step (forward, backward, AdamW) of a small DIFF V1 model in PyTorch, with the
attention done three ways, at several sequence lengths: time per step and peak memory.

  diffattn      diffattn.torch.diff_attention (fused kernels; saves out, lse, o2; no T x T)
  materialised  the upstream naive recipe: both softmax maps (B, 2H, T, T) materialised,
                A1 - lam A2, times V; autograd keeps the maps for the backward
  two-call      F.scaled_dot_product_attention once per map, out1 - lam out2 (needs
                PyTorch >= 2.0; reported as unavailable on older versions)

    .venv/bin/python bench/torch_step.py [--T 512 2048] [--steps 3]

Every (variant, T) runs in a fresh child process so its peak resident memory is its own:
the child builds the model, resets the kernel's peak-RSS counter (/proc/self/clear_refs),
runs one warm-up step and --steps timed steps, and reports the median step time and the peak
RSS above the RSS before the first step. A variant whose T x T maps would need more than
--max-map-gib is skipped (and says so). Results print as a table and, with --json, as JSON.
Before timing, the three variants' losses for the same weights and batch are compared.
"""

import argparse
import json
import statistics
import subprocess
import sys
import time

CFG = {"format": "diffattn/1", "attention": "diff_v1", "vocab_size": 256, "d_model": 256,
       "n_layers": 2, "ffn_dim": 512, "max_seq_len": 1 << 16, "rope_theta": 10000.0,
       "norm_eps": 1e-5, "tie_embeddings": False, "n_heads": 4, "n_kv_heads": 4, "head_dim": 32}


def map_bytes(T, B):
    # per layer: scores, softmax and the difference, (B, 2H, T, T) float32, kept for backward
    return 3 * B * 2 * CFG["n_heads"] * T * T * 4 * CFG["n_layers"]


def materialised(q, k, v, lam, causal=True, scale=None):
    import torch
    B, T, H2, D = q.shape
    H, G = H2 // 2, v.shape[2]
    rep = H // G
    qh = q.transpose(1, 2)
    kh = k.view(B, T, G, 2, D).repeat_interleave(rep, dim=2).reshape(B, T, H2, D).transpose(1, 2)
    vh = v.repeat_interleave(rep, dim=2).transpose(1, 2)
    s = (D ** -0.5 if scale is None else scale)
    w = torch.matmul(qh * s, kh.transpose(-1, -2))
    w = w + torch.triu(torch.full((T, T), float("-inf")), 1)
    w = torch.softmax(w, dim=-1).view(B, H, 2, T, T)
    w = w[:, :, 0] - lam.view(1, H, 1, 1) * w[:, :, 1]
    return torch.matmul(w, vh).transpose(1, 2)


def two_call(q, k, v, lam, causal=True, scale=None):
    import torch
    import torch.nn.functional as F
    B, T, H2, D = q.shape
    H, G = H2 // 2, v.shape[2]
    rep = H // G
    q1, q2 = q[:, :, 0::2].transpose(1, 2), q[:, :, 1::2].transpose(1, 2)
    k1 = k[:, :, 0::2].repeat_interleave(rep, dim=2).transpose(1, 2)
    k2 = k[:, :, 1::2].repeat_interleave(rep, dim=2).transpose(1, 2)
    vh = v.repeat_interleave(rep, dim=2).transpose(1, 2)
    o1 = F.scaled_dot_product_attention(q1, k1, vh, is_causal=True)
    o2 = F.scaled_dot_product_attention(q2, k2, vh, is_causal=True)
    return (o1 - lam.view(1, H, 1, 1) * o2).transpose(1, 2)


def child(variant, T, B, steps):
    import torch
    import diffattn.torch as dt
    if variant == "two-call" and not hasattr(torch.nn.functional, "scaled_dot_product_attention"):
        return {"skipped": f"torch {torch.__version__} has no scaled_dot_product_attention"}
    if variant != "diffattn":  # the model's layers look diff_attention up at call time
        dt.diff_attention = materialised if variant == "materialised" else two_call
    torch.manual_seed(0)
    model = dt.DiffTransformerLM(CFG)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, CFG["vocab_size"], (B, T + 1), generator=g)
    tokens, targets = x[:, :-1], x[:, 1:]

    def rss(field):
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field):
                    return int(line.split()[1]) * 1024
        return 0

    def step():
        opt.zero_grad(set_to_none=True)
        loss = model.loss(tokens, targets)
        loss.backward()
        opt.step()
        return loss.item()

    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset VmHWM (peak RSS) to the current RSS
    base = rss("VmRSS:")
    first_loss = step()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return {"step_s": statistics.median(times), "times": times, "first_loss": first_loss,
            "peak_rss_above_start_mib": (rss("VmHWM:") - base) / 2**20,
            "threads": torch.get_num_threads()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--T", type=int, nargs="+", default=[512, 2048])
    ap.add_argument("--B", type=int, default=1)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--variants", nargs="+", default=["diffattn", "materialised", "two-call"])
    ap.add_argument("--max-map-gib", type=float, default=4.0)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--child", nargs=2, metavar=("VARIANT", "T"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child[0], int(args.child[1]), args.B, args.steps)))
        return
    results = []
    for T in args.T:
        for variant in args.variants:
            if variant != "diffattn" and map_bytes(T, args.B) > args.max_map_gib * 2**30:
                r = {"skipped": f"maps need {map_bytes(T, args.B) / 2**30:.1f} GiB "
                                f"> --max-map-gib {args.max_map_gib}"}
            else:
                p = subprocess.run([sys.executable, __file__, "--child", variant, str(T),
                                    "--B", str(args.B), "--steps", str(args.steps)],
                                   capture_output=True, text=True)
                if p.returncode != 0:
                    r = {"skipped": "failed: " + p.stderr.strip().splitlines()[-1]}
                else:
                    r = json.loads(p.stdout.strip().splitlines()[-1])
            r.update(variant=variant, T=T, B=args.B)
            results.append(r)
            if "skipped" in r:
                print(f"T={T:6d} {variant:13s} skipped: {r['skipped']}", flush=True)
            else:
                print(f"T={T:6d} {variant:13s} {r['step_s'] * 1e3:9.1f} ms/step  peak RSS "
                      f"+{r['peak_rss_above_start_mib']:8.1f} MiB  first loss "
                      f"{r['first_loss']:.6f}", flush=True)
    for T in args.T:
        row = {r["variant"]: r for r in results if r["T"] == T and "step_s" in r}
        if "diffattn" in row and "materialised" in row:
            print(f"T={T}: materialised / diffattn = "
                  f"{row['materialised']['step_s'] / row['diffattn']['step_s']:.2f}x time, "
                  f"{row['materialised']['peak_rss_above_start_mib'] / max(row['diffattn']['peak_rss_above_start_mib'], 1e-9):.1f}x memory")
    if args.json:
        print(json.dumps(results))


if __name__ == "__main__":
    main()
