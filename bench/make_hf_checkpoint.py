#!/usr/bin/env python3
"""Writes a randomly initialised Hugging Face Llama or DiffLlama directory of a published shape,
for benchmarks (`diffattn generate --model DIR --bench N`): config.json in transformers 4.x's
spelling, generation_config.json and one model.safetensors, streamed tensor by tensor (a 1.24 B
model needs no more memory than its largest tensor). Seeded: the same arguments give the same
bytes. The weights are N(0, 0.02) (lambda vectors N(0, 0.1), norms 1), not trained.

`--type diff_v2` writes the same shape as a DIFF V2 model in the project's own format
(docs/FORMAT.md; transformers has no V2): the Llama shape's heads become V2's output heads, so
the query projection doubles (2 x 32 query heads of 64), the 8 key/value heads stay, and
lambda_proj (32, 2048) is added: 1.37 B parameters against Llama's 1.24 B.

    bench/make_hf_checkpoint.py --out /tmp/diffllama-1b --type diffllama --shape 1b --dtype bf16
    bench/make_hf_checkpoint.py --out /tmp/v2-1b --type diff_v2 --shape 1b --dtype bf16
"""

import argparse
import json
import os
import struct

import numpy as np

# The Llama-3.2-1B shape (and the public DiffLlama checkpoint of the same shape).
SHAPES = {
    "1b": dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
               num_attention_heads=32, num_key_value_heads=8, head_dim=64,
               max_position_embeddings=131072, rope_theta=500000.0, tie_word_embeddings=True,
               rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                             "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}),
    "small": dict(vocab_size=32000, hidden_size=512, intermediate_size=1408, num_hidden_layers=4,
                  num_attention_heads=8, num_key_value_heads=4, head_dim=64,
                  max_position_embeddings=4096, rope_theta=10000.0, tie_word_embeddings=False,
                  rope_scaling=None),
}


def tensors_of(cfg, diff):
    """(name, shape, kind) in the order transformers names them; kind: w, norm, lambda."""
    C, F, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    H, G, d = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    out = [("model.embed_tokens.weight", (V, C), "w")]
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        out += [(p + "input_layernorm.weight", (C,), "norm"),
                (p + "self_attn.q_proj.weight", (H * d, C), "w"),
                (p + "self_attn.k_proj.weight", (G * d, C), "w"),
                (p + "self_attn.v_proj.weight", (G * d, C), "w"),
                (p + "self_attn.o_proj.weight", (C, H * d), "w")]
        if diff:
            out += [(p + "self_attn." + n, (d,), "lambda")
                    for n in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2")]
        out += [(p + "post_attention_layernorm.weight", (C,), "norm"),
                (p + "mlp.gate_proj.weight", (F, C), "w"),
                (p + "mlp.up_proj.weight", (F, C), "w"),
                (p + "mlp.down_proj.weight", (C, F), "w")]
    out.append(("model.norm.weight", (C,), "norm"))
    if not cfg["tie_word_embeddings"]:
        out.append(("lm_head.weight", (V, C), "w"))
    return out


def v2_tensors_of(cfg):
    """The project's DIFF V2 tensors (docs/FORMAT.md) for an HF shape: (name, shape, kind)."""
    C, F, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    H, G, d = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    out = [("embed_tokens.weight", (V, C), "w")]
    for l in range(cfg["num_hidden_layers"]):
        p = f"layers.{l}."
        out += [(p + "attn_norm.weight", (C,), "norm"),
                (p + "attn.q_proj.weight", (2 * H * d, C), "w"),
                (p + "attn.k_proj.weight", (G * d, C), "w"),
                (p + "attn.v_proj.weight", (G * d, C), "w"),
                (p + "attn.lambda_proj.weight", (H, C), "w"),
                (p + "attn.out_proj.weight", (C, H * d), "w"),
                (p + "ffn_norm.weight", (C,), "norm"),
                (p + "ffn.gate_proj.weight", (F, C), "w"),
                (p + "ffn.up_proj.weight", (F, C), "w"),
                (p + "ffn.down_proj.weight", (C, F), "w")]
    out.append(("norm.weight", (C,), "norm"))
    if not cfg["tie_word_embeddings"]:
        out.append(("lm_head.weight", (V, C), "w"))
    return out


def v2_config(cfg):
    """The project's config.json for the shape."""
    c = {"format": "diffattn/1", "attention": "diff_v2", "vocab_size": cfg["vocab_size"],
         "d_model": cfg["hidden_size"], "n_layers": cfg["num_hidden_layers"],
         "n_heads": cfg["num_attention_heads"], "n_kv_heads": cfg["num_key_value_heads"],
         "head_dim": cfg["head_dim"], "ffn_dim": cfg["intermediate_size"],
         "max_seq_len": cfg["max_position_embeddings"], "rope_theta": cfg["rope_theta"],
         "norm_eps": 1e-5, "tie_embeddings": cfg["tie_word_embeddings"]}
    if cfg["rope_scaling"]:
        c["rope_scaling"] = cfg["rope_scaling"]
    return c


def to_dtype(a, dtype):
    if dtype == "F32":
        return a.astype("<f4").tobytes()
    if dtype == "F16":
        return a.astype("<f2").tobytes()
    u = a.astype("<f4").view("<u4").astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16  # round to nearest even (no NaN here)
    return u.astype("<u2").tobytes()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--type", choices=["diffllama", "llama", "diff_v2"], default="diffllama")
    ap.add_argument("--shape", choices=sorted(SHAPES), default="1b")
    ap.add_argument("--dtype", choices=["bf16", "f16", "f32"], default="bf16")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    diff = a.type == "diffllama"
    dtype = {"bf16": "BF16", "f16": "F16", "f32": "F32"}[a.dtype]
    es = 4 if dtype == "F32" else 2
    cfg = dict(SHAPES[a.shape])
    v2 = a.type == "diff_v2"
    tensors = v2_tensors_of(cfg) if v2 else tensors_of(cfg, diff)

    header, off = {}, 0
    for name, shape, _ in tensors:
        n = int(np.prod(shape)) * es
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [off, off + n]}
        off += n
    header["__metadata__"] = {"format": "diffattn/1" if v2 else "pt"}
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)

    os.makedirs(a.out, exist_ok=True)
    rng = np.random.default_rng(a.seed)
    tmp = os.path.join(a.out, "model.safetensors.tmp")
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for name, shape, kind in tensors:
            if kind == "norm":
                x = np.ones(shape, np.float32)
            else:
                x = rng.standard_normal(shape, dtype=np.float32) * (0.1 if kind == "lambda" else 0.02)
            f.write(to_dtype(x, dtype))
    os.replace(tmp, os.path.join(a.out, "model.safetensors"))

    if v2:
        with open(os.path.join(a.out, "config.json"), "w") as f:
            json.dump(v2_config(cfg), f, indent=2)
        print(f"wrote {a.out}: {a.type} {a.shape} {dtype}, {off / 1e9:.2f} GB of weights")
        return
    conf = {"architectures": ["DiffLlamaForCausalLM" if diff else "LlamaForCausalLM"],
            "model_type": a.type, "hidden_act": "silu", "rms_norm_eps": 1e-5,
            "attention_bias": False, "attention_dropout": 0.0, "initializer_range": 0.02,
            "bos_token_id": 128000, "eos_token_id": 128001, "use_cache": True,
            "torch_dtype": {"BF16": "bfloat16", "F16": "float16", "F32": "float32"}[dtype], **cfg}
    if diff:
        conf["lambda_std_dev"] = 0.1
    else:
        conf.update(mlp_bias=False, pretraining_tp=1)
    with open(os.path.join(a.out, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": 128000, "eos_token_id": 128001}, f, indent=2)
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(conf, f, indent=2)
    print(f"wrote {a.out}: {a.type} {a.shape} {dtype}, {off / 1e9:.2f} GB of weights")


if __name__ == "__main__":
    main()
