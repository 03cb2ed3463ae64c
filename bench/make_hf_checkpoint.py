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

`--type motif2-2.6b` / `motif2-12.7b` write Motif Technologies' MotifForCausalLM layouts
(docs/models/motif2.md): config.json with the published keys (values the sources do not settle
are marked there), the published tensor names and shapes (grouped differential attention: q_proj
(H d, C), k/v_proj (Hkv d, C), o_proj (C, 2 (H - G) d), lambda_q1/k1/q2/k2 (d), subln (2d),
PolyNorm act_fn.weight (3) and act_fn.bias (1)), one file or `--shards N` with
model.safetensors.index.json, and generation_config.json. `--shape full` is the published size
(2.6B: 2.60 B parameters; 12.7B: 12.70 B, 25.4 GB in BF16; tensors are generated in row chunks so
memory stays bounded), `--shape tiny` the scaled-down test shapes of tests/python/motif_reference.py.
Weights: linears N(0, 1/fan_in), embeddings N(0, 0.25), norms 1, lambda vectors N(0, 0.1),
PolyNorm weight 1/3 and bias 0 (its published initialisation). No tokenizer files: Motif's
tokenizer is not in the sources this was written from.

    bench/make_hf_checkpoint.py --out /tmp/diffllama-1b --type diffllama --shape 1b --dtype bf16
    bench/make_hf_checkpoint.py --out /tmp/v2-1b --type diff_v2 --shape 1b --dtype bf16
    bench/make_hf_checkpoint.py --out /tmp/motif-12.7b --type motif2-12.7b --dtype bf16 --shards 6
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


# Motif-2 (MotifForCausalLM). "full": the published sizes as far as docs/models/motif2.md's sources
# show them; "tiny": tests/python/motif_reference.py's TINY shapes of the same layout (the tests
# check the two stay equal).
MOTIF_SHAPES = {
    ("motif2-2.6b", "full"): dict(vocab_size=219520, hidden_size=2048, intermediate_size=8192,
                                  num_hidden_layers=32, num_attention_heads=16, num_key_value_heads=16,
                                  max_position_embeddings=4096, rope_theta=10000.0,
                                  tie_word_embeddings=True),
    ("motif2-12.7b", "full"): dict(vocab_size=219520, hidden_size=4096, intermediate_size=16384,
                                   num_hidden_layers=40, num_attention_heads=40, num_key_value_heads=16,
                                   head_dim=128, num_noise_heads=8, max_position_embeddings=65536,
                                   rope_theta=1000000.0, tie_word_embeddings=False),
    ("motif2-2.6b", "tiny"): dict(vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
                                  num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64,
                                  rope_theta=10000.0, tie_word_embeddings=True),
    ("motif2-12.7b", "tiny"): dict(vocab_size=96, hidden_size=48, intermediate_size=64, num_hidden_layers=3,
                                   num_attention_heads=10, num_key_value_heads=4, head_dim=8, num_noise_heads=2,
                                   max_position_embeddings=64, rope_theta=1000000.0, tie_word_embeddings=False),
}
TORCH_DTYPE = {"BF16": "bfloat16", "F16": "float16", "F32": "float32"}


def motif_config(kind, shape, dtype):
    """config.json of a MotifForCausalLM checkpoint in the published spelling."""
    cfg = {"architectures": ["MotifForCausalLM"],
           "auto_map": {"AutoConfig": "configuration_motif.MotifConfig",
                        "AutoModelForCausalLM": "modeling_motif.MotifForCausalLM"},
           "model_type": "Motif", "hidden_act": "poly_norm", "rms_norm_eps": 1e-06,
           "attn_rms_norm_eps": 1e-05, "rope_scaling": None, "use_bias": False,
           "attention_dropout": 0.0, "initializer_range": 0.02, "bos_token_id": 1, "eos_token_id": 2,
           "use_cache": True, "torch_dtype": TORCH_DTYPE[dtype], "transformers_version": "4.51.3"}
    cfg.update(MOTIF_SHAPES[(kind, shape)])
    if "num_noise_heads" in cfg:
        cfg["k_ratio"] = 1
    return cfg


def motif_tensors_of(cfg):
    """(name, shape, kind) of a MotifForCausalLM checkpoint in the published order;
    kind: w (linear, fan-in scaled), emb, norm, lambda, poly_w, poly_b."""
    C, F, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    H, Hkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    d = cfg.get("head_dim") or C // H
    G = cfg.get("num_noise_heads") or H // 2
    out = [("model.embed_tokens.weight", (V, C), "emb")]
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        out += [(p + "input_layernorm.weight", (C,), "norm"),
                (p + "self_attn.q_proj.weight", (H * d, C), "w"),
                (p + "self_attn.k_proj.weight", (Hkv * d, C), "w"),
                (p + "self_attn.v_proj.weight", (Hkv * d, C), "w"),
                (p + "self_attn.o_proj.weight", (C, 2 * (H - G) * d), "w")]
        out += [(p + "self_attn." + n, (d,), "lambda") for n in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2")]
        out += [(p + "self_attn.subln.weight", (2 * d,), "norm"),
                (p + "post_attention_layernorm.weight", (C,), "norm"),
                (p + "mlp.gate_proj.weight", (F, C), "w"),
                (p + "mlp.up_proj.weight", (F, C), "w"),
                (p + "mlp.down_proj.weight", (C, F), "w"),
                (p + "mlp.act_fn.weight", (3,), "poly_w"),
                (p + "mlp.act_fn.bias", (1,), "poly_b")]
    out.append(("model.norm.weight", (C,), "norm"))
    if not cfg["tie_word_embeddings"]:
        out.append(("lm_head.weight", (V, C), "emb"))
    return out


def motif_chunks(shape, kind, rng, chunk=1 << 24):
    """The float32 values of one tensor, in row blocks of about `chunk` elements (the same
    blocks whatever reads them, so the stream of the seeded generator is fixed)."""
    if kind == "norm":
        yield np.ones(shape, np.float32)
        return
    if kind == "poly_w":
        yield np.full(shape, 1.0 / 3.0, np.float32)
        return
    if kind == "poly_b":
        yield np.zeros(shape, np.float32)
        return
    std = {"emb": 0.25, "lambda": 0.1}.get(kind) or 1.0 / np.sqrt(shape[-1])
    rows, width = (shape[0], int(np.prod(shape[1:]))) if len(shape) > 1 else (1, shape[0])
    step = max(1, chunk // width)
    for r in range(0, rows, step):
        n = min(step, rows - r)
        yield (rng.standard_normal((n,) + tuple(shape[1:]) if len(shape) > 1 else shape, dtype=np.float32)
               * np.float32(std))


def motif_arrays(cfg, seed):
    """{name: float32 array}: every tensor the writer writes for cfg and seed, unrounded."""
    rng = np.random.default_rng(seed)
    return {n: np.concatenate(list(motif_chunks(s, k, rng)), axis=0).reshape(s)
            for n, s, k in motif_tensors_of(cfg)}


def write_motif(out, kind, shape, dtype, shards, seed):
    """Streams a MotifForCausalLM checkpoint to `out`: shards contiguous runs of tensors of about
    equal bytes, each written tensor by tensor, row block by row block."""
    cfg = motif_config(kind, shape, dtype)
    tensors = motif_tensors_of(cfg)
    es = 4 if dtype == "F32" else 2
    sizes = [int(np.prod(s)) * es for _, s, _ in tensors]
    total, groups, acc = sum(sizes), [[] for _ in range(shards)], 0
    for i, n in enumerate(sizes):  # shard k holds the tensors that start in its 1/shards of the bytes
        groups[min(shards - 1, acc * shards // total)].append(i)
        acc += n
    groups = [g for g in groups if g]
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(seed)
    weight_map = {}
    for k, idx in enumerate(groups):
        fname = "model.safetensors" if len(groups) == 1 else f"model-{k + 1:05d}-of-{len(groups):05d}.safetensors"
        header, off = {}, 0
        for i in idx:
            name, shp, _ = tensors[i]
            header[name] = {"dtype": dtype, "shape": list(shp), "data_offsets": [off, off + sizes[i]]}
            off += sizes[i]
            weight_map[name] = fname
        header["__metadata__"] = {"format": "pt"}
        h = json.dumps(header).encode()
        h += b" " * ((8 - len(h) % 8) % 8)
        tmp = os.path.join(out, fname + ".tmp")
        with open(tmp, "wb") as f:
            f.write(struct.pack("<Q", len(h)))
            f.write(h)
            for i in idx:
                for block in motif_chunks(tensors[i][1], tensors[i][2], rng):
                    f.write(to_dtype(block, dtype))
        os.replace(tmp, os.path.join(out, fname))
    if len(groups) > 1:
        with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    with open(os.path.join(out, "generation_config.json"), "w") as f:
        json.dump({"_from_model_config": True, "bos_token_id": cfg["bos_token_id"],
                   "eos_token_id": cfg["eos_token_id"], "transformers_version": cfg["transformers_version"]},
                  f, indent=2)
    n_params = sum(int(np.prod(s)) for _, s, _ in tensors)
    print(f"wrote {out}: {kind} {shape} {dtype}, {n_params / 1e9:.2f} B parameters, "
          f"{total / 1e9:.2f} GB of weights in {len(groups)} file(s)")


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
    ap.add_argument("--type", choices=["diffllama", "llama", "diff_v2", "motif2-2.6b", "motif2-12.7b"],
                    default="diffllama")
    ap.add_argument("--shape", choices=sorted(SHAPES) + ["full", "tiny"], default=None,
                    help="1b or small for the Llama types (default 1b); full or tiny for Motif (default full)")
    ap.add_argument("--shards", type=int, default=1, help="Motif only: number of safetensors files")
    ap.add_argument("--dtype", choices=["bf16", "f16", "f32"], default="bf16")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    dtype = {"bf16": "BF16", "f16": "F16", "f32": "F32"}[a.dtype]
    if a.type.startswith("motif2"):
        shape = a.shape or "full"
        if shape not in ("full", "tiny") or a.shards < 1:
            ap.error(f"--type {a.type} takes --shape full or tiny and --shards >= 1")
        write_motif(a.out, a.type, shape, dtype, a.shards, a.seed)
        return
    a.shape = a.shape or "1b"
    if a.shape not in SHAPES or a.shards != 1:
        ap.error(f"--type {a.type} takes --shape {' or '.join(sorted(SHAPES))} and one file")
    diff = a.type == "diffllama"
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
