#!/usr/bin/env python3
"""bench/gpu_experiment.py: the paired language-model experiment in PyTorch (issue 29, item 4).

    make corpus                                        # data/corpus/ (docs/corpus.md)
    PYTHONPATH=python python3 bench/gpu_experiment.py --out runs/gpu-lm      # one H100
    PYTHONPATH=python python3 bench/gpu_experiment.py --tiny --out /tmp/lm   # CPU, seconds

DIFF V1, DIFF V2 and a standard Transformer (diffattn.torch.DiffTransformerLM) of equal size
(the C++ model_of_size rule: V1 pairs the standard model's heads, V2 doubles the query heads and
pays with a smaller SwiGLU) trained per seed on the same batches in the same order, initialised
in pairs: every parameter is drawn from a generator seeded by (seed, name, shape) on the CPU,
so each tensor two architectures share (same name and shape: embeddings, norms, K/V/output
projections, the V1/standard SwiGLU) is byte-identical across them. Then, on the held-out
documents of the corpus (scripts/corpus.py):

  * loss per document (mean byte cross-entropy in nats over the document's first
    --eval-windows windows of seq_len bytes, each window read from its own start), and per
    pair of models the paired difference per document with a 95% Student-t interval over
    documents (per seed, and with each document's difference averaged over the seeds);
  * loss by position bucket within the window (does DIFF help later positions?), with the
    same paired intervals per bucket;
  * lambda per layer: V1 its learned scalar, V2 the mean of sigmoid(lambda_proj(x)) over the
    held-out tokens read.

Report: report.json (everything, options included), report.md (tables, the scale, the budget
and what the numbers do and do not show), loss_by_position.svg and training_loss.svg (written
here as plain SVG; no plotting dependency).

Attention: --attention auto uses diffattn.torch's operators (the fused Triton kernels on CUDA
when Triton imports, the C++ kernels on CPU); on CUDA without Triton, and with --attention sdpa,
the SDPA recipe (two torch scaled_dot_product_attention calls per DIFF layer, combined as
o1 - lambda o2). The test compares the recipe with the operator on CPU.

Budget (the defaults; an estimate, not measured: no GPU was lent when this was written):
d_model 512, 10 layers, 8 heads of 64, SwiGLU 1376, byte vocabulary, seq_len 1024 -> 31.76M
parameters (standard; V1 31.77M, V2 31.77M); 1600 steps x 64 x 1024 = 104.9M tokens per model;
3 seeds x 3 models = 944M tokens trained. FLOPs: 6 N per token for the weights (1.80e17 in
all) plus causal attention, 3 x 2 T d_attn per token per layer for forward and backward with
the DIFF models' attention counted 1.5x (0.39e17): about 2.2e17. An H100's dense BF16 peak is
about 989 TFLOP/s; at 35% of it this is about 10.6 minutes, at 20% about 18.5 minutes;
evaluation is a few seconds per model. Before training, --budget-minutes (default 25 on CUDA)
times a few steps of each model and, if the projected total exceeds 90% of the budget (less
the time spent so far and half a minute for evaluation), lowers the steps of every model
alike (recorded in the report), so the run fits and stays paired.
"""

import argparse
import hashlib
import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

KINDS = ("diff_v1", "diff_v2", "standard")
LABEL = {"diff_v1": "DIFF V1", "diff_v2": "DIFF V2", "standard": "standard"}
PAIRS = (("diff_v1", "standard"), ("diff_v2", "standard"), ("diff_v1", "diff_v2"))

# Student t 0.975 quantiles for 1..30 degrees of freedom; beyond, the normal's 1.96 plus the
# first Cornish-Fisher term (error under 0.002 for df > 30).
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179,
         2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064,
         2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def t975(df):
    if df < 1:
        return float("nan")
    if df <= 30:
        return _T975[df - 1]
    z = 1.959964
    return z + (z ** 3 + z) / (4 * df) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * df ** 2)


def t_interval(x):
    """Mean and 95% Student-t interval of the values x (the paired differences)."""
    x = np.asarray(x, dtype=np.float64)
    n = len(x)
    m = float(x.mean()) if n else float("nan")
    if n < 2:
        return {"n": n, "mean": m, "lo": float("nan"), "hi": float("nan"), "sd": float("nan")}
    sd = float(x.std(ddof=1))
    h = t975(n - 1) * sd / math.sqrt(n)
    return {"n": n, "mean": m, "lo": m - h, "hi": m + h, "sd": sd}


# ------------------------------------------------------------------------------ models

def model_config(kind, d_model, n_layers, n_std, ffn, seq_len, vocab=256):
    """As the C++ model_of_size: the standard model has n_std heads of d_model / n_std; V1
    n_std / 2 pairs with values twice as wide; V2 n_std pairs sharing keys, its SwiGLU narrowed
    by the extra query heads and lambda projection (v2_matched_ffn_dim)."""
    if d_model % n_std or (kind == "diff_v1" and n_std % 2):
        raise ValueError(f"{n_std} heads must divide d_model {d_model} (and be even for V1)")
    D = d_model // n_std
    H = n_std // 2 if kind == "diff_v1" else n_std
    if kind == "diff_v2":
        extra = H * D * d_model + H * d_model
        ffn = ffn - (extra + 3 * d_model // 2) // (3 * d_model)
    return {"format": "diffattn/1", "attention": kind, "vocab_size": vocab, "d_model": d_model,
            "n_layers": n_layers, "n_heads": H, "n_kv_heads": H, "head_dim": D,
            "ffn_dim": ffn, "max_seq_len": seq_len, "rope_theta": 10000.0, "norm_eps": 1e-5,
            "tie_embeddings": True}


def paired_init(model, seed, init_std=0.02, lambda_std=0.1):
    """Every parameter from its own CPU generator seeded by (seed, name, shape): a tensor of the
    same name and shape is byte-identical in every architecture. Norm scales 1; V1's lambda
    vectors N(0, lambda_std); everything else N(0, init_std)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            key = f"{seed}/{name}/{tuple(p.shape)}".encode()
            g = torch.Generator().manual_seed(int.from_bytes(hashlib.sha256(key).digest()[:8],
                                                             "little") & ((1 << 63) - 1))
            if name.endswith("norm.weight") or name.endswith("subln.weight"):
                t = torch.ones(p.shape)
            elif ".lambda_" in name and not name.endswith("lambda_proj.weight"):
                t = torch.randn(p.shape, generator=g) * lambda_std
            else:
                t = torch.randn(p.shape, generator=g) * init_std
            p.copy_(t.to(device=p.device, dtype=p.dtype))


def sdpa_diff_attention(q, k, v, lam, causal=True):
    """The SDPA recipe of diffattn's diff_attention (pair h: sub-heads 2h and 2h+1; shared keys
    when k has as many heads as v): two SDPA calls, o1 - lam o2."""
    H, G = q.shape[2] // 2, v.shape[2]
    k1, k2 = (k[:, :, 0::2], k[:, :, 1::2]) if k.shape[2] == 2 * G else (k, k)
    t = lambda x: x.transpose(1, 2)  # noqa: E731
    rep = lambda x: t(x).repeat_interleave(H // G, dim=1) if H != G else t(x)  # noqa: E731
    o1 = F.scaled_dot_product_attention(t(q[:, :, 0::2]), rep(k1), rep(v), is_causal=causal)
    o2 = F.scaled_dot_product_attention(t(q[:, :, 1::2]), rep(k2), rep(v), is_causal=causal)
    o1, o2 = t(o1), t(o2)  # (B, T, H, Dv)
    lam = lam.to(o1.dtype)
    return o1 - (lam.view(1, 1, -1, 1) if lam.dim() == 1 else lam.unsqueeze(-1)) * o2


def sdpa_attention(q, k, v, causal=True):
    H, G = q.shape[2], v.shape[2]
    t = lambda x: x.transpose(1, 2)  # noqa: E731
    rep = lambda x: t(x).repeat_interleave(H // G, dim=1) if H != G else t(x)  # noqa: E731
    return t(F.scaled_dot_product_attention(t(q), rep(k), rep(v), is_causal=causal))


def choose_attention(kind, device):
    """'ops' (diffattn.torch's operators), 'sdpa' or 'triton'; patches diffattn.torch.models
    for sdpa and triton (this process only: the script owns it)."""
    from diffattn.torch import models
    use = kind
    if kind == "auto":
        use = "ops"
        if device.type == "cuda":
            try:
                import triton  # noqa: F401
            except ImportError:
                use = "sdpa"
    if use == "triton":  # the Triton kernels on any device (CPU under TRITON_INTERPRET=1)
        from diffattn.torch import ops
        models.attention = lambda q, k, v, causal=True: ops.attention(q, k, v, causal,
                                                                      backend="triton")
        models.diff_attention = lambda q, k, v, lam, causal=True: ops.diff_attention(
            q, k, v, lam, causal, backend="triton")
    if use == "sdpa":
        models.attention = lambda q, k, v, causal=True: sdpa_attention(q, k, v, causal)
        models.diff_attention = lambda q, k, v, lam, causal=True: sdpa_diff_attention(
            q, k, v, lam, causal)
    return use


# ------------------------------------------------------------------------------ data

def read_corpus(path, max_docs=None):
    """train.jsonl / heldout.jsonl of scripts/corpus.py -> (training bytes as one uint8 array
    with documents joined by a blank line, held-out documents as a list of (source/id, bytes))."""
    def docs(name):
        p = os.path.join(path, name)
        if not os.path.isfile(p):
            raise SystemExit(f"gpu_experiment: {p} not found; build the corpus first "
                             f"(make corpus, or python3 scripts/corpus.py --out {path})")
        out = []
        with open(p, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                try:
                    d = json.loads(line)
                    out.append((f"{d['source']}/{d['id']}", d["text"].encode("utf-8")))
                except (ValueError, KeyError, TypeError) as e:
                    raise SystemExit(f"gpu_experiment: {p} line {n}: not a corpus record "
                                     f"({e})") from None
                if max_docs and len(out) >= max_docs:
                    break
        if not out:
            raise SystemExit(f"gpu_experiment: {p} holds no documents")
        return out
    train = b"\n\n".join(t for _, t in docs("train.jsonl"))
    return np.frombuffer(train, dtype=np.uint8), docs("heldout.jsonl")


def batch_starts(seed, steps, batch, n_tokens, seq_len):
    """The data order: window starts for every step, from the seed alone (the same for every
    model of a seed)."""
    if n_tokens < seq_len + 2:
        raise SystemExit(f"gpu_experiment: {n_tokens} training bytes, fewer than seq_len + 2")
    g = np.random.Generator(np.random.PCG64(seed))
    return g.integers(0, n_tokens - seq_len - 1, size=(steps, batch), dtype=np.int64)


def eval_windows(heldout, seq_len, max_windows):
    """Each document's first max_windows non-overlapping windows of seq_len + 1 bytes (the last
    one shorter, padded; a mask marks the predicted positions)."""
    rows, masks, doc_of = [], [], []
    for d, (_, text) in enumerate(heldout):
        a = np.frombuffer(text, dtype=np.uint8)
        for w in range(max_windows):
            s = w * seq_len
            chunk = a[s:s + seq_len + 1]
            if len(chunk) < 2:
                break
            row = np.zeros(seq_len + 1, dtype=np.int64)
            row[:len(chunk)] = chunk
            m = np.zeros(seq_len, dtype=bool)
            m[:len(chunk) - 1] = True
            rows.append(row)
            masks.append(m)
            doc_of.append(d)
    return np.stack(rows), np.stack(masks), np.asarray(doc_of)


def position_buckets(seq_len):
    """Bucket edges over positions 0..seq_len-1 (the position of the predicting token):
    [0,8) [8,64) [64,256) ... then to seq_len, powers of 4 from 64."""
    edges = [0, 8, 64]
    while edges[-1] * 4 < seq_len:
        edges.append(edges[-1] * 4)
    edges = [e for e in edges if e < seq_len] + [seq_len]
    return list(zip(edges[:-1], edges[1:]))


# ------------------------------------------------------------------------------ train / eval

def lr_at(step, steps, lr, warmup):
    if step < warmup:
        return lr * (step + 1) / warmup
    p = (step - warmup) / max(1, steps - warmup)
    return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * p)))


def make_optimizer(model, lr, wd):
    decay = [p for n, p in model.named_parameters() if p.dim() == 2]
    rest = [p for n, p in model.named_parameters() if p.dim() != 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": wd},
                              {"params": rest, "weight_decay": 0.0}], lr=lr, betas=(0.9, 0.95),
                             eps=1e-8)


def train_model(model, train, starts, a, device, log, step_limit=None):
    """Trains on the windows `starts` (steps, batch); returns per-step losses."""
    opt = make_optimizer(model, a.lr, a.weight_decay)
    steps = starts.shape[0] if step_limit is None else step_limit
    offs = np.arange(a.seq_len + 1)
    losses = []
    model.train()
    for s in range(steps):
        x = torch.from_numpy(train[starts[s][:, None] + offs].astype(np.int64)).to(device)
        for grp in opt.param_groups:
            grp["lr"] = lr_at(s, starts.shape[0], a.lr, a.warmup)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=a.bf16):
            logits = model(x[:, :-1])
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())  # (a sync per step: negligible beside a step at this size)
        if log and (s % max(1, steps // 10) == 0 or s == steps - 1):
            log(f"  step {s + 1}/{steps} loss {losses[-1]:.4f}")
    return losses


@torch.no_grad()
def evaluate(model, kind, rows, masks, doc_of, n_docs, buckets, device, batch, bf16):
    """Per-document mean loss, per-document per-bucket (sum, count), lambda per layer."""
    model.eval()
    T = masks.shape[1]
    pos_loss = np.zeros(T)
    pos_count = np.zeros(T)
    doc_sum = np.zeros(n_docs)
    doc_cnt = np.zeros(n_docs)
    bk_sum = np.zeros((n_docs, len(buckets)))
    bk_cnt = np.zeros((n_docs, len(buckets)))
    lam_sum = np.zeros(len(model.layers))
    lam_cnt = np.zeros(len(model.layers))
    hooks = []
    if kind == "diff_v2":
        def hook(i):
            def f(mod, inp, out):
                s = torch.sigmoid(mod.lambda_proj(inp[0]).float())
                lam_sum[i] += float(s.sum())
                lam_cnt[i] += s.numel()
            return f
        hooks = [layer.attn.register_forward_hook(hook(i)) for i, layer in enumerate(model.layers)]
    try:
        for b0 in range(0, len(rows), batch):
            x = torch.from_numpy(rows[b0:b0 + batch]).to(device)
            m = masks[b0:b0 + batch]
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
                logits = model(x[:, :-1])
            ce = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]),
                                 x[:, 1:].reshape(-1), reduction="none")
            ce = ce.view(x.shape[0], T).cpu().double().numpy() * m
            pos_loss += ce.sum(0)
            pos_count += m.sum(0)
            d = doc_of[b0:b0 + batch]
            np.add.at(doc_sum, d, ce.sum(1))
            np.add.at(doc_cnt, d, m.sum(1))
            for j, (lo, hi) in enumerate(buckets):
                np.add.at(bk_sum[:, j], d, ce[:, lo:hi].sum(1))
                np.add.at(bk_cnt[:, j], d, m[:, lo:hi].sum(1))
    finally:
        for h in hooks:
            h.remove()
    if kind == "diff_v1":
        lams = [float(torch.exp(torch.dot(l.attn.lambda_q1, l.attn.lambda_k1))
                      - torch.exp(torch.dot(l.attn.lambda_q2, l.attn.lambda_k2))
                      + l.attn.lambda_init) for l in model.layers]
    elif kind == "diff_v2":
        lams = list(lam_sum / np.maximum(lam_cnt, 1))
    else:
        lams = []
    with np.errstate(invalid="ignore", divide="ignore"):
        return {"doc_loss": doc_sum / doc_cnt, "doc_tokens": doc_cnt,
                "bucket_doc_loss": bk_sum / bk_cnt,
                "loss_by_position": pos_loss / np.maximum(pos_count, 1),
                "loss_token_mean": float(doc_sum.sum() / doc_cnt.sum()), "lambdas": lams}


# ------------------------------------------------------------------------------ report

def svg_lines(path, title, xlabel, ylabel, series, xs_log=False):
    """A small line chart as SVG: series = [(label, xs, ys)]."""
    W, H, L, R, Tm, Bm = 640, 400, 70, 150, 40, 50
    pts = [(x, y) for _, xs, ys in series for x, y in zip(xs, ys) if np.isfinite(y)]
    if not pts:
        return
    fx = (lambda v: math.log10(max(v, 1e-9))) if xs_log else (lambda v: v)
    x0, x1 = min(fx(p[0]) for p in pts), max(fx(p[0]) for p in pts)
    y0, y1 = min(p[1] for p in pts), max(p[1] for p in pts)
    x1, y1 = (x1 if x1 > x0 else x0 + 1), (y1 if y1 > y0 else y0 + 1)
    X = lambda v: L + (fx(v) - x0) / (x1 - x0) * (W - L - R)  # noqa: E731
    Y = lambda v: H - Bm - (v - y0) / (y1 - y0) * (H - Tm - Bm)  # noqa: E731
    colours = ("#d62728", "#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b")
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
           f'font-family="sans-serif" font-size="12">',
           f'<rect width="{W}" height="{H}" fill="white"/>',
           f'<text x="{W / 2}" y="20" text-anchor="middle" font-size="14">{title}</text>',
           f'<line x1="{L}" y1="{H - Bm}" x2="{W - R}" y2="{H - Bm}" stroke="black"/>',
           f'<line x1="{L}" y1="{Tm}" x2="{L}" y2="{H - Bm}" stroke="black"/>',
           f'<text x="{(L + W - R) / 2}" y="{H - 12}" text-anchor="middle">{xlabel}</text>',
           f'<text x="15" y="{H / 2}" transform="rotate(-90 15 {H / 2})" '
           f'text-anchor="middle">{ylabel}</text>']
    for i in range(5):
        yv = y0 + (y1 - y0) * i / 4
        out.append(f'<text x="{L - 5}" y="{Y(yv) + 4:.1f}" text-anchor="end">{yv:.3g}</text>')
        xv = x0 + (x1 - x0) * i / 4
        xr = 10 ** xv if xs_log else xv
        out.append(f'<text x="{L + (xv - x0) / (x1 - x0) * (W - L - R):.1f}" y="{H - Bm + 16}" '
                   f'text-anchor="middle">{xr:.3g}</text>')
    for k, (label, xs, ys) in enumerate(series):
        c = colours[k % len(colours)]
        p = " ".join(f"{X(x):.1f},{Y(y):.1f}" for x, y in zip(xs, ys) if np.isfinite(y))
        out.append(f'<polyline fill="none" stroke="{c}" stroke-width="1.5" points="{p}"/>')
        out.append(f'<text x="{W - R + 10}" y="{Tm + 16 * (k + 1)}" fill="{c}">{label}</text>')
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")


def fmt_ci(c, digits=4):
    return f"{c['mean']:+.{digits}f} [{c['lo']:+.{digits}f}, {c['hi']:+.{digits}f}]"


def write_report(r, out):
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "report.json"), "w") as f:
        json.dump(r, f, indent=1)
        f.write("\n")
    o, seeds = r["options"], r["seeds"]
    md = [f"# Paired language-model experiment ({'tiny, CPU' if o['tiny'] else 'full'})", ""]
    md += [f"Device: {r['device']}; attention: {r['attention']}; torch {r['torch']}. "
           f"Wall time {r['seconds']:.1f} s.", "",
           "## Scale and budget", "",
           f"- Models: d_model {o['d_model']}, {o['n_layers']} layers, {o['n_heads']} standard "
           f"heads, SwiGLU {o['ffn_dim']} (V2 narrower to match), byte vocabulary, seq_len "
           f"{o['seq_len']}. Parameters: " + ", ".join(
               f"{LABEL[k]} {r['params'][k]:,}" for k in KINDS) + ".",
           f"- Training: {r['steps']} steps x batch {o['batch']} x {o['seq_len']} = "
           f"{r['tokens_per_model']:,} tokens per model (requested {o['steps']} steps"
           + (f"; lowered to fit {o['budget_minutes']} min" if r['steps'] < o['steps'] else "")
           + f"), {len(seeds)} seeds, AdamW lr {o['lr']} (warmup {o['warmup']}, cosine to 10%),"
           f" weight decay {o['weight_decay']}, "
           + ("BF16 autocast." if o["bf16"] else "float32."),
           f"- Corpus: {r['corpus']['train_bytes']:,} training bytes (about "
           f"{r['tokens_per_model'] / max(1, r['corpus']['train_bytes']):.3g} epochs per model), "
           f"{r['corpus']['heldout_documents']} held-out documents, evaluated on each one's "
           f"first {o['eval_windows']} windows ({r['corpus']['heldout_tokens_scored']:,} "
           f"predicted bytes).",
           f"- Pairing: per seed every model starts from parameters drawn by (seed, name, shape);"
           f" {r['pairing']['shared_tensors']} tensors are shared (same name and shape) by at "
           f"least two architectures and were checked byte-identical; every model of a seed "
           f"read the same {r['steps']} x {o['batch']} windows (order SHA-256 prefix per seed: "
           + ", ".join(f"{s['seed']}: {s['data_order_sha256'][:12]}" for s in seeds) + ").", ""]
    md += ["## Held-out loss (nats per byte)", "",
           "| seed | " + " | ".join(LABEL[k] for k in KINDS) + " |",
           "|---|" + "---|" * len(KINDS)]
    for s in seeds:
        md.append(f"| {s['seed']} | " + " | ".join(
            f"{s['models'][k]['loss_doc_mean']:.4f}" for k in KINDS) + " |")
    md += ["", "Mean over documents (each document weighs the same).", "",
           "## Paired differences (A - B, nats per byte; negative: A better)", "",
           "95% Student-t interval over held-out documents of the per-document difference; "
           "'all seeds': each document's difference averaged over the seeds first. The "
           "interval covers document-to-document variation for these trained models, not "
           "the training noise between seeds (the per-seed rows show that; "
           "`across seeds` is the t-interval over the seeds' mean differences).", "",
           "| A - B | " + " | ".join(f"seed {s['seed']}" for s in seeds)
           + " | all seeds | across seeds |", "|---|" + "---|" * (len(seeds) + 2)]
    for p in r["paired"]:
        md.append(f"| {LABEL[p['a']]} - {LABEL[p['b']]} | " + " | ".join(
            fmt_ci(c) for c in p["per_seed"]) + f" | {fmt_ci(p['pooled'])} | "
            f"{fmt_ci(p['across_seeds'])} |")
    md += ["", "## Loss by position bucket (all seeds; position of the predicting byte)", "",
           "| positions | " + " | ".join(LABEL[k] for k in KINDS) + " | "
           + " | ".join(f"{LABEL[a]} - {LABEL[b]}" for a, b in PAIRS) + " |",
           "|---|" + "---|" * (len(KINDS) + len(PAIRS))]
    for j, (lo, hi) in enumerate(r["buckets"]):
        row = [f"{lo}-{hi - 1}"] + [f"{r['bucket_loss'][k][j]:.4f}" for k in KINDS]
        row += [fmt_ci(p["by_bucket"][j]) for p in r["paired"]]
        md.append("| " + " | ".join(row) + " |")
    md += ["", "## Lambda per layer (after training)", "",
           "| model | seed | " + " | ".join(f"layer {i}" for i in range(o["n_layers"])) + " |",
           "|---|---|" + "---|" * o["n_layers"]]
    for s in seeds:
        for k in ("diff_v1", "diff_v2"):
            md.append(f"| {LABEL[k]} | {s['seed']} | " + " | ".join(
                f"{v:.3f}" for v in s["models"][k]["lambdas"]) + " |")
    md += ["", "V1: its learned scalar lambda; V2: mean of sigmoid(lambda_proj(x)) over the "
           "held-out tokens read.", "", "## What these numbers do and do not show", ""]
    md += [f"- They compare three attention kinds at one small scale ({r['params']['standard']:,}"
           f" parameters, {r['tokens_per_model']:,} training bytes per model, byte-level "
           "tokens) on one corpus of mostly technical documentation. They do not predict "
           "the ordering at the paper's scales (billions of parameters and tokens).",
           "- The intervals over documents say how consistent a difference is across held-out"
           " documents for these trained weights; with "
           f"{len(seeds)} seeds the training noise is only sampled, not bounded (see "
           "'across seeds').",
           "- One set of hyperparameters (learning rate, warmup, init) serves all kinds, "
           "untuned for any; a kind that prefers another learning rate is handicapped.",
           "- Held-out documents are whole pages never trained on, but from the same packages "
           "as the training pages (the same style and often the same vocabulary)."]
    if o["tiny"]:
        md += ["- This is a --tiny run: it checks the pipeline, its numbers mean nothing."]
    md += [""]
    with open(os.path.join(out, "report.md"), "w") as f:
        f.write("\n".join(md))
    svg_lines(os.path.join(out, "loss_by_position.svg"), "Held-out loss by position (all seeds)",
              "position in window", "loss (nats/byte)",
              [(LABEL[k], [lo for lo, _ in r["buckets"]], r["bucket_loss"][k]) for k in KINDS])
    curves = []
    for k in KINDS:
        ys = np.mean([s["models"][k]["loss_curve"] for s in seeds], axis=0)
        w = max(1, len(ys) // 100)
        ys = np.convolve(ys, np.ones(w) / w, mode="valid")
        curves.append((LABEL[k], list(range(1, len(ys) + 1)), list(ys)))
    svg_lines(os.path.join(out, "training_loss.svg"), "Training loss (mean over seeds)", "step",
              "loss (nats/byte)", curves)


# ------------------------------------------------------------------------------ main

def check_pairing(models):
    """Returns how many tensors two or more architectures share (same name and shape); raises
    if any such tensor differs in a byte."""
    by = {}
    for k, m in models.items():
        for n, p in m.named_parameters():
            by.setdefault((n, tuple(p.shape)), []).append(
                (k, p.detach().cpu().contiguous().numpy().tobytes()))
    shared = 0
    for (n, shape), v in by.items():
        if len(v) < 2:
            continue
        shared += 1
        if any(b != v[0][1] for _, b in v[1:]):
            raise AssertionError(f"pairing: {n} {shape} differs between "
                                 f"{[k for k, _ in v]}")
    return shared


def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", default=os.path.join(os.environ.get("DIFFATTN_DATA_DIR", "data"),
                                                     "corpus"))
    ap.add_argument("--out", default="runs/gpu-lm")
    ap.add_argument("--tiny", action="store_true", help="a CPU-sized run that checks the pipeline")
    ap.add_argument("--seeds", default=None, help="comma-separated (default 1,2,3)")
    ap.add_argument("--d-model", type=int)
    ap.add_argument("--n-layers", type=int)
    ap.add_argument("--n-heads", type=int, help="the standard model's heads")
    ap.add_argument("--ffn-dim", type=int)
    ap.add_argument("--seq-len", type=int)
    ap.add_argument("--batch", type=int)
    ap.add_argument("--steps", type=int)
    ap.add_argument("--lr", type=float)
    ap.add_argument("--warmup", type=int)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--eval-windows", type=int, help="windows per held-out document")
    ap.add_argument("--eval-batch", type=int, default=32)
    ap.add_argument("--max-docs", type=int, default=0,
                    help="read at most this many documents per split (0: all)")
    ap.add_argument("--attention", choices=("auto", "ops", "sdpa", "triton"), default="auto",
                    help="auto: diffattn.torch's operators (Triton on CUDA), or SDPA on CUDA "
                         "without Triton; triton: force the Triton kernels (on the CPU under "
                         "TRITON_INTERPRET=1, for tests)")
    ap.add_argument("--device", default=None, help="cuda or cpu (default: cuda when present)")
    ap.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=None,
                    help="BF16 autocast (default: on CUDA only)")
    ap.add_argument("--budget-minutes", type=float, default=None,
                    help="fit the training into this many minutes (default 25 on CUDA, none "
                         "on CPU)")
    a = ap.parse_args(argv)
    full = dict(d_model=512, n_layers=10, n_heads=8, ffn_dim=1376, seq_len=1024, batch=64,
                steps=1600, lr=2e-3, warmup=100, eval_windows=8)
    tiny = dict(d_model=32, n_layers=2, n_heads=4, ffn_dim=88, seq_len=64, batch=4, steps=12,
                lr=3e-3, warmup=2, eval_windows=2)
    for k, v in (tiny if a.tiny else full).items():
        if getattr(a, k) is None:
            setattr(a, k, v)
    a.seeds = [int(s) for s in (a.seeds or "1,2,3").split(",") if s]
    for k in ("d_model", "n_layers", "n_heads", "ffn_dim", "seq_len", "batch", "steps",
              "eval_windows", "eval_batch"):
        if getattr(a, k) < 1:
            ap.error(f"--{k.replace('_', '-')} must be at least 1")
    if not a.seeds or len(set(a.seeds)) != len(a.seeds) or min(a.seeds) < 0:
        ap.error("--seeds: distinct non-negative integers")
    if not 0 <= a.warmup < a.steps:
        ap.error("--warmup must lie in [0, steps)")
    return a


def main(argv=None):
    a = parse(argv)
    from diffattn.torch import DiffTransformerLM
    device = torch.device(a.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    budget = a.budget_minutes if a.budget_minutes is not None else (
        25.0 if device.type == "cuda" else None)
    attention = choose_attention(a.attention, device)
    if a.bf16 is None:
        a.bf16 = device.type == "cuda"
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    t_start = time.time()
    log = lambda s: print(s, flush=True)  # noqa: E731
    train, heldout = read_corpus(a.corpus, a.max_docs or None)
    rows, masks, doc_of = eval_windows(heldout, a.seq_len, a.eval_windows)
    buckets = position_buckets(a.seq_len)
    cfgs = {k: model_config(k, a.d_model, a.n_layers, a.n_heads, a.ffn_dim, a.seq_len)
            for k in KINDS}
    log(f"gpu_experiment: {device}, attention {attention}, {len(train):,} training bytes, "
        f"{len(heldout)} held-out documents ({int(masks.sum()):,} bytes scored)")

    steps = a.steps
    if budget:  # time a few steps of each kind (also warms the kernels), then fit the budget
        probe = np.zeros((8, a.batch), dtype=np.int64)
        per_step = 0.0
        for k in KINDS:
            m = DiffTransformerLM(cfgs[k]).to(device)
            train_model(m, train, probe[:3], a, device, None)
            if device.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.time()
            train_model(m, train, probe[3:], a, device, None)
            if device.type == "cuda":
                torch.cuda.synchronize()
            per_step += (time.time() - t0) / 5
            del m
        projected = per_step * steps * len(a.seeds) / 60
        allowed = 0.9 * budget - (time.time() - t_start) / 60 - 0.5  # 0.5 min for evaluation
        log(f"gpu_experiment: {per_step:.3f} s per step of the three models; {steps} steps x "
            f"{len(a.seeds)} seeds projected at {projected:.1f} min, budget {budget} min")
        if projected > allowed:
            steps = max(a.warmup + 1, int(steps * allowed / projected))
            log(f"gpu_experiment: steps lowered to {steps} for every model")

    result = {"options": vars(a) | {"budget_minutes": budget}, "device": str(
        torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"),
        "attention": attention, "torch": torch.__version__, "steps": steps,
        "tokens_per_model": steps * a.batch * a.seq_len, "buckets": buckets,
        "params": {}, "seeds": [],
        "corpus": {"train_bytes": int(len(train)), "heldout_documents": len(heldout),
                   "heldout_tokens_scored": int(masks.sum()),
                   "heldout_ids": [i for i, _ in heldout]}}
    shared_total = 0
    evals = {k: [] for k in KINDS}
    for seed in a.seeds:
        starts = batch_starts(seed, a.steps, a.batch, len(train), a.seq_len)
        order = hashlib.sha256(starts[:steps].tobytes()).hexdigest()
        models = {}
        for k in KINDS:
            torch.manual_seed(seed)
            m = DiffTransformerLM(cfgs[k])
            paired_init(m, seed)
            models[k] = m
        shared_total = check_pairing(models)
        srec = {"seed": seed, "data_order_sha256": order, "models": {}}
        for k in KINDS:
            m = models[k].to(device)
            result["params"][k] = sum(p.numel() for p in m.parameters())
            log(f"seed {seed} {LABEL[k]} ({result['params'][k]:,} parameters)")
            t0 = time.time()
            curve = train_model(m, train, starts, a, device, log, step_limit=steps)
            secs = time.time() - t0
            ev = evaluate(m, k, rows, masks, doc_of, len(heldout), buckets, device, a.eval_batch,
                          a.bf16)
            evals[k].append(ev)
            srec["models"][k] = {"train_seconds": secs, "loss_curve": curve,
                                 "loss_doc_mean": float(np.nanmean(ev["doc_loss"])),
                                 "loss_token_mean": ev["loss_token_mean"],
                                 "doc_loss": [float(x) for x in ev["doc_loss"]],
                                 "lambdas": [float(x) for x in ev["lambdas"]]}
            log(f"  held-out loss {srec['models'][k]['loss_doc_mean']:.4f} "
                f"({secs:.1f} s training)")
            models[k] = None
            del m
        result["seeds"].append(srec)
    result["pairing"] = {"shared_tensors": shared_total, "identical": True}

    paired = []
    for ka, kb in PAIRS:
        per_seed = [t_interval(ea["doc_loss"] - eb["doc_loss"])
                    for ea, eb in zip(evals[ka], evals[kb])]
        mean_diff = np.mean([ea["doc_loss"] - eb["doc_loss"]
                             for ea, eb in zip(evals[ka], evals[kb])], axis=0)
        by_bucket = []
        for j in range(len(buckets)):
            d = np.mean([ea["bucket_doc_loss"][:, j] - eb["bucket_doc_loss"][:, j]
                         for ea, eb in zip(evals[ka], evals[kb])], axis=0)
            by_bucket.append(t_interval(d[np.isfinite(d)]))
        paired.append({"a": ka, "b": kb, "per_seed": per_seed, "pooled": t_interval(mean_diff),
                       "across_seeds": t_interval([c["mean"] for c in per_seed]),
                       "by_bucket": by_bucket})
    result["paired"] = paired
    result["ci_method"] = ("95% Student-t interval of the mean per-document paired difference "
                           "(documents as the unit; t quantile from a table to df 30, "
                           "Cornish-Fisher beyond)")
    result["bucket_loss"] = {}
    for k in KINDS:
        pl = np.mean([e["loss_by_position"] for e in evals[k]], axis=0)
        result["bucket_loss"][k] = [float(pl[lo:hi].mean()) for lo, hi in buckets]
    result["loss_by_position"] = {k: [float(x) for x in np.mean(
        [e["loss_by_position"] for e in evals[k]], axis=0)] for k in KINDS}
    result["seconds"] = time.time() - t_start
    write_report(result, a.out)
    log(f"gpu_experiment: report in {a.out}/report.md ({result['seconds']:.1f} s)")
    return result


if __name__ == "__main__":
    main()
    sys.exit(0)
