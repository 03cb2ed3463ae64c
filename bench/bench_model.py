"""Language-model throughput: diffattn against PyTorch on the same machine, same run.

Training tokens/s (forward, backward and an AdamW step) and decode tokens/s (KV cache, greedy,
one token at a time after a 64-token prefill) for the `small` preset (6 layers, d_model 256,
T 256) of each attention kind. diffattn runs as `diffattn train --bench` and
`diffattn generate --bench`; PyTorch runs tests/python/torch_model.py in float32 (dense causal
attention: PyTorch 1.13 has no fused SDPA) with torch.optim.AdamW. Rounds alternate between the
two, and the medians are reported with their ratios.

    .venv/bin/python bench/bench_model.py [--threads 2] [--rounds 3] [--batch 4] [--kinds ...]
"""

import argparse
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "python"))
CLI = os.path.join(ROOT, "build", "diffattn")

import numpy as np  # noqa: E402
import torch  # noqa: E402

import torch_model as tm  # noqa: E402


def small_config(kind):
    """The `small` preset as src/model/config.cpp defines it (checked against the CLI's count)."""
    c = {"format": "diffattn/1", "attention": kind, "vocab_size": 256, "d_model": 256,
         "n_layers": 6, "ffn_dim": 688, "max_seq_len": 256, "rope_theta": 10000.0,
         "norm_eps": 1e-5, "tie_embeddings": False, "head_dim": 32}
    if kind == "diff_v1":
        c.update(n_heads=4, n_kv_heads=4)
    elif kind == "diff_v2":
        c.update(n_heads=8, n_kv_heads=8, ffn_dim=600)
    else:
        c.update(n_heads=8, n_kv_heads=8)
    return c


def blas_of_torch():
    """Which BLAS library this process (with torch loaded) has mapped."""
    torch.ones(64, 64) @ torch.ones(64, 64)
    libs = set()
    with open("/proc/self/maps") as f:
        for line in f:
            if "blas" in line:
                libs.add(os.path.realpath(line.split()[-1]))
    return sorted(libs)


def torch_train_rate(cfg, B, T, steps):
    P = {k: torch.tensor(v, requires_grad=True) for k, v in tm.random_weights(cfg, 1).items()}
    decay = [p for p in P.values() if p.dim() >= 2]
    rest = [p for p in P.values() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": rest, "weight_decay": 0.0}], lr=1e-3, betas=(0.9, 0.95))
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, cfg["vocab_size"], (B, T), generator=g)
    y = torch.randint(0, cfg["vocab_size"], (B, T), generator=g)

    def step():
        opt.zero_grad()
        tm.loss(cfg, P, x, y).backward()
        torch.nn.utils.clip_grad_norm_(list(P.values()), 1.0)
        opt.step()

    step()  # warm-up
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    return B * T * steps / (time.perf_counter() - t0)


def torch_decode_rate(cfg, prompt_len, n):
    """Greedy decode with a KV cache, written directly in PyTorch from FORMAT.md."""
    P = {k: torch.tensor(v) for k, v in tm.random_weights(cfg, 1).items()}
    kind, H, G, D = cfg["attention"], cfg["n_heads"], cfg["n_kv_heads"], cfg["head_dim"]
    eps, theta, L = cfg["norm_eps"], cfg["rope_theta"], cfg["n_layers"]
    rep = H // G
    j = torch.arange(D // 2, dtype=torch.float64)
    freq = theta ** (-2.0 * j / D)

    def rope(u, pos):  # u (n, D) at position pos
        a = pos * freq
        c, s = torch.cos(a).float(), torch.sin(a).float()
        u0, u1 = u[:, 0::2], u[:, 1::2]
        return torch.stack((u0 * c - u1 * s, u0 * s + u1 * c), -1).reshape(u.shape)

    def norm(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w

    cache = [([], []) for _ in range(L)]

    def token_step(tok, pos):
        x = P["embed_tokens.weight"][tok]
        for l in range(L):
            p = f"layers.{l}."
            h = norm(x, P[p + "attn_norm.weight"])
            q, k, v = (h @ P[p + n].T for n in ("attn.q_proj.weight", "attn.k_proj.weight", "attn.v_proj.weight"))
            ks, vs = cache[l]
            s = 1.0 / math.sqrt(D)
            if kind == "standard":
                ks.append(rope(k.view(G, D), pos)); vs.append(v.view(G, D))
                K = torch.stack(ks, 1).repeat_interleave(rep, 0)  # (H, t, D)
                V = torch.stack(vs, 1).repeat_interleave(rep, 0)
                qh = rope(q.view(H, D), pos)
                o = torch.softmax((K @ qh.unsqueeze(-1)).squeeze(-1) * s, -1).unsqueeze(1) @ V
                o = o.reshape(-1)
            else:
                qh = rope(q.view(2 * H, D), pos)
                if kind == "diff_v1":
                    ks.append(rope(k.view(2 * G, D), pos)); vs.append(v.view(G, 2 * D))
                    K = torch.stack(ks, 1)
                    K1, K2 = K[0::2].repeat_interleave(rep, 0), K[1::2].repeat_interleave(rep, 0)
                    lam = (torch.exp(P[p + "attn.lambda_q1"] @ P[p + "attn.lambda_k1"])
                           - torch.exp(P[p + "attn.lambda_q2"] @ P[p + "attn.lambda_k2"]) + 0.5)
                else:
                    ks.append(rope(k.view(G, D), pos)); vs.append(v.view(G, D))
                    K1 = K2 = torch.stack(ks, 1).repeat_interleave(rep, 0)
                    lam = torch.sigmoid(h @ P[p + "attn.lambda_proj.weight"].T).unsqueeze(-1)
                V = torch.stack(vs, 1).repeat_interleave(rep, 0)
                a1 = torch.softmax((K1 @ qh[0::2].unsqueeze(-1)).squeeze(-1) * s, -1)
                a2 = torch.softmax((K2 @ qh[1::2].unsqueeze(-1)).squeeze(-1) * s, -1)
                o = ((a1 - lam * a2).unsqueeze(1) @ V).squeeze(1)
                if kind == "diff_v1":
                    o = 0.5 * norm(o, P[p + "attn.subln.weight"])
                o = o.reshape(-1)
            x = x + o @ P[p + "attn.out_proj.weight"].T
            h = norm(x, P[p + "ffn_norm.weight"])
            f = torch.nn.functional.silu(h @ P[p + "ffn.gate_proj.weight"].T) * (h @ P[p + "ffn.up_proj.weight"].T)
            x = x + f @ P[p + "ffn.down_proj.weight"].T
        return norm(x, P["norm.weight"]) @ P["lm_head.weight"].T

    with torch.no_grad():
        prompt = torch.arange(prompt_len) % cfg["vocab_size"]
        # prefill through the batched forward, then fill the cache row by row (not timed)
        for pos in range(prompt_len):
            logits = token_step(prompt[pos], pos)
        t0 = time.perf_counter()
        for i in range(n):
            nxt = int(torch.argmax(logits))
            logits = token_step(torch.tensor(nxt), prompt_len + i)
        return n / (time.perf_counter() - t0)


def cli(*args):
    p = subprocess.run([CLI, *map(str, args)], capture_output=True, text=True, check=True)
    return p.stdout


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--decode", type=int, default=128)
    ap.add_argument("--kinds", nargs="+", default=["diff_v1", "diff_v2", "standard"])
    ap.add_argument("--json", help="also write the results here")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    print(f"PyTorch {torch.__version__}, {a.threads} threads, BLAS mapped: {', '.join(blas_of_torch()) or 'none'}")
    print(f"diffattn: {CLI}, backend {os.environ.get('DIFFATTN_BACKEND', 'auto')}")
    results = {}
    tmp = tempfile.mkdtemp(prefix="diffattn-bench-")
    for kind in a.kinds:
        cfg = small_config(kind)
        mdir = os.path.join(tmp, kind)
        tm.save_model_dir(mdir, cfg, tm.random_weights(cfg, 1))
        r = {"ours_train": [], "torch_train": [], "ours_decode": [], "torch_decode": []}
        for _ in range(a.rounds):
            out = cli("--threads", a.threads, "train", "--bench", a.steps, "--preset", "small",
                      "--attention", kind, "--batch", a.batch, "--seq-len", a.seq_len)
            params = int(re.search(r"params (\d+)", out).group(1))
            assert params == sum(int(np.prod(s)) for s in tm.tensor_shapes(cfg).values()), \
                "bench config differs from the preset"
            r["ours_train"].append(float(re.search(r"([\d.]+) tokens/s", out).group(1)))
            r["torch_train"].append(torch_train_rate(cfg, a.batch, a.seq_len, a.steps))
            out = cli("--threads", a.threads, "generate", "--model", mdir, "--bench", a.decode)
            r["ours_decode"].append(float(re.search(r"decode .*, ([\d.]+) tokens/s", out).group(1)))
            r["torch_decode"].append(torch_decode_rate(cfg, 64, a.decode))
        med = {k: statistics.median(v) for k, v in r.items()}
        results[kind] = {"params": params, **med, "rounds": r}
        print(f"{kind:9s} params {params:8d}  train tokens/s: diffattn {med['ours_train']:9.1f}  "
              f"PyTorch {med['torch_train']:9.1f}  ratio {med['ours_train'] / med['torch_train']:5.2f}   "
              f"decode tokens/s: diffattn {med['ours_decode']:8.1f}  PyTorch {med['torch_decode']:8.1f}  "
              f"ratio {med['ours_decode'] / med['torch_decode']:5.2f}", flush=True)
    if "diff_v1" in results and "standard" in results:
        print(f"DIFF V1 / standard training throughput (diffattn): "
              f"{results['diff_v1']['ours_train'] / results['standard']['ours_train']:.3f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
