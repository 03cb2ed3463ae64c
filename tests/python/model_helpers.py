"""Helpers for the end-to-end model tests: the built CLI, a small text corpus written by the
test, and the training data order of docs (README, "Training"), replicated in Python."""

import json
import os
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CLI = os.path.join(ROOT, "build", "diffattn")

M64 = (1 << 64) - 1


def corpus_text(lines=240):
    words = ["light", "water", "earth", "heaven", "day", "night", "seed", "tree", "fruit",
             "beast", "fowl", "sea", "moved", "created", "good", "said", "divided"]
    out = []
    for i in range(lines):
        n = 5 + (i * 7) % 9
        out.append("And " + " ".join(words[(i * 3 + j * j) % len(words)] for j in range(n)) + ".")
    return "\n".join(out) + "\n"


def split_lines(text, every=20):
    """Every every-th line (the last of each group) is validation, the rest training."""
    train, valid = [], []
    for i, line in enumerate(text.splitlines(keepends=True)):
        (valid if i % every == every - 1 else train).append(line)
    return "".join(train), "".join(valid)


def _mix(x):
    x &= M64
    x ^= x >> 30
    x = (x * 0xBF58476D1CE4E5B9) & M64
    x ^= x >> 27
    x = (x * 0x94D049BB133111EB) & M64
    return x ^ (x >> 31)


def window_starts(seed, index, B, n, T):
    """Start of window b of batch `index`: a counter-based hash, so batches need no state."""
    out = []
    for b in range(B):
        h = _mix(_mix((seed + 0x9E3779B97F4A7C15 * (index + 1)) & M64) ^ b)
        out.append(h % (n - T))
    return out


def run_cli(*args, check=True, env_extra=None, **kw):
    env = dict(os.environ)
    env.update(env_extra or {})
    p = subprocess.run([CLI, *map(str, args)], capture_output=True, text=True, errors="replace", env=env, **kw)
    if check and p.returncode != 0:
        raise AssertionError(f"diffattn {' '.join(map(str, args))} failed ({p.returncode}):\n{p.stderr}")
    return p


def read_log(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def tensor_shapes(c):
    """{name: shape} of the tensors docs/FORMAT.md lists for a config dict (biases, tied
    embeddings and each attention kind included), in its order."""
    C, F, V, D = c["d_model"], c["ffn_dim"], c["vocab_size"], c["head_dim"]
    H, G, kind = c["n_heads"], c["n_kv_heads"], c["attention"]
    nq = (2 * H if kind != "standard" else H) * D
    nk = (2 * G if kind == "diff_v1" else G) * D
    nv = G * (2 * D if kind == "diff_v1" else D)
    nout = H * (2 * D if kind == "diff_v1" else D)
    out = {"embed_tokens.weight": (V, C)}
    for l in range(c["n_layers"]):
        p = f"layers.{l}."
        out[p + "attn_norm.weight"] = (C,)
        out[p + "attn.q_proj.weight"] = (nq, C)
        out[p + "attn.k_proj.weight"] = (nk, C)
        out[p + "attn.v_proj.weight"] = (nv, C)
        out[p + "attn.out_proj.weight"] = (C, nout)
        if c.get("attention_bias"):
            for n, s in (("q", nq), ("k", nk), ("v", nv), ("out", C)):
                out[p + f"attn.{n}_proj.bias"] = (s,)
        if kind == "diff_v1":
            for n in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"):
                out[p + "attn." + n] = (D,)
            out[p + "attn.subln.weight"] = (2 * D,)
        if kind == "diff_v2":
            out[p + "attn.lambda_proj.weight"] = (H, C)
        out[p + "ffn_norm.weight"] = (C,)
        out[p + "ffn.gate_proj.weight"] = (F, C)
        out[p + "ffn.up_proj.weight"] = (F, C)
        out[p + "ffn.down_proj.weight"] = (C, F)
        if c.get("mlp_bias"):
            out[p + "ffn.gate_proj.bias"] = (F,)
            out[p + "ffn.up_proj.bias"] = (F,)
            out[p + "ffn.down_proj.bias"] = (C,)
    out["norm.weight"] = (C,)
    if not c["tie_embeddings"]:
        out["lm_head.weight"] = (V, C)
    return out


def tiny_run(tmp_path, name="run", steps=2, extra=()):
    """A tiny model trained by the CLI (2 steps on a made-up corpus) in tmp_path / name."""
    corpus = tmp_path / "corpus.txt"
    if not corpus.exists():
        corpus.write_text(corpus_text(240))
    out = tmp_path / name
    run_cli("--threads", 1, "train", "--out", out, "--corpus", corpus, "--steps", steps,
            "--batch", 2, "--seq-len", 32, "--no-progress", *extra)
    return out
