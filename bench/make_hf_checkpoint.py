#!/usr/bin/env python3
"""Writes a randomly initialised Hugging Face Llama or DiffLlama directory of a published shape,
for benchmarks (`diffattn generate --model DIR --bench N`): config.json in transformers 4.x's
spelling, generation_config.json and one model.safetensors, streamed tensor by tensor (a 1.24 B
model needs no more memory than its largest tensor). Seeded: the same arguments give the same
bytes. The weights are N(0, 0.02) (lambda vectors N(0, 0.1), norms 1), not trained.

`--type phi4flash` writes Microsoft's Phi-4-mini-flash-reasoning layout (the SambaY hybrid;
docs/models/phi4flash.md): the published config.json keys and values, the published tensor names
and shapes, BF16 with A_log and the lambda vectors in F32 as in the published files (the full
shape's byte total equals the published index's total_size), two shards split where the published
index splits them (the cross-decoder and the final norm in the second), generation_config.json,
tokenizer_config.json with the published chat template, and a stand-in tokenizer.json (the
published one, o200k-based, is not available here: the stand-in encodes text as bytes, ids 0-255,
and holds the published special tokens at their published ids). Shapes: full (the published 3.85 B), small and
tiny (scaled down, the published layer pattern, windows shorter than test sequences).

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
`--layers N` (Motif only) writes the same shape with N decoder layers instead of the published
count (num_hidden_layers = N in config.json, every other value and every tensor shape as
published): the per-layer shapes of the 12.7B at a size that fits in memory, for speed
measurements (docs/PERFORMANCE.md, "Motif-2 at the published shapes"); such a directory is not
the published model and says so only through its num_hidden_layers.
Weights: linears N(0, 1/fan_in), embeddings N(0, 0.25), norms 1, lambda vectors N(0, 0.1),
PolyNorm weight 1/3 and bias 0 (its published initialisation). No tokenizer files: Motif's
tokenizer is not in the sources this was written from.

    bench/make_hf_checkpoint.py --out /tmp/diffllama-1b --type diffllama --shape 1b --dtype bf16
    bench/make_hf_checkpoint.py --out /tmp/v2-1b --type diff_v2 --shape 1b --dtype bf16
    bench/make_hf_checkpoint.py --out /tmp/phi4-flash --type phi4flash --shape full --dtype bf16
    bench/make_hf_checkpoint.py --out /tmp/motif-12.7b --type motif2-12.7b --dtype bf16 --shards 6
    bench/make_hf_checkpoint.py --out /tmp/motif-12.7b-8l --type motif2-12.7b --dtype bf16 --layers 8
"""

import argparse
import json
import math
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


# ------------------------------------------------------------------ Phi-4-mini-flash (phi4flash)

# The published config.json's shape (Phi-4-mini-flash-reasoning, "full") and two scaled-down shapes that
# keep its layer pattern (num_hidden_layers % 4 == 0) with windows shorter than test sequences.
FLASH_SHAPES = {
    "full": dict(vocab_size=200064, hidden_size=2560, intermediate_size=10240, num_hidden_layers=32,
                 num_attention_heads=40, num_key_value_heads=20, sliding_window=512,
                 max_position_embeddings=262144, special=199999),
    "small": dict(vocab_size=4096, hidden_size=256, intermediate_size=1024, num_hidden_layers=8,
                  num_attention_heads=8, num_key_value_heads=4, sliding_window=64,
                  max_position_embeddings=4096, special=4095),
    "tiny": dict(vocab_size=320, hidden_size=32, intermediate_size=40, num_hidden_layers=8,
                 num_attention_heads=4, num_key_value_heads=2, sliding_window=5,
                 max_position_embeddings=256, special=319),
}
# The published chat template (tokenizer_config.json of Phi-4-mini-flash-reasoning).
FLASH_CHAT_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] == 'system' and 'tools' in message and "
    "message['tools'] is not none %}{{ '<|' + message['role'] + '|>' + message['content'] + "
    "'<|tool|>' + message['tools'] + '<|/tool|>' + '<|end|>' }}{% else %}{{ '<|' + "
    "message['role'] + '|>' + message['content'] + '<|end|>' }}{% endif %}{% endfor %}{% if "
    "add_generation_prompt %}{{ '<|assistant|>' }}{% else %}{{ eos_token }}{% endif %}")
# (id, content, special, rstrip) of the published added tokens.
FLASH_ADDED = [(199999, "<|endoftext|>", True, False), (200018, "<|endofprompt|>", True, False),
               (200019, "<|assistant|>", True, True), (200020, "<|end|>", True, True),
               (200021, "<|user|>", True, True), (200022, "<|system|>", True, True),
               (200023, "<|tool|>", False, True), (200024, "<|/tool|>", False, True),
               (200025, "<|tool_call|>", False, True), (200026, "<|/tool_call|>", False, True),
               (200027, "<|tool_response|>", False, True), (200028, "<|tag|>", True, True)]


def flash_kinds(L):
    """Per layer: mamba, swa, memory (Mamba whose scan output the GMUs read), full (the YOCO
    key/value layer), gmu, cross."""
    h = L // 2
    return [("mamba" if i % 2 == 0 else "swa") if i < h else "memory" if i == h else
            "full" if i == h + 1 else ("gmu" if i % 2 == 0 else "cross") for i in range(L)]


def flash_tensors_of(cfg):
    """(name, shape, kind) in the published names; kind picks the values and the F32 exceptions."""
    C, F, V, L = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"], cfg["num_hidden_layers"]
    H, G = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    d, E, N, K, R = C // H, 2 * C, 16, 4, math.ceil(C / 16)  # mamba expand 2, d_state 16, d_conv 4
    out = [("model.embed_tokens.weight", (V, C), "w")]
    for i, kind in enumerate(flash_kinds(L)):
        p, a = f"model.layers.{i}.", f"model.layers.{i}.attn."
        out += [(p + "input_layernorm.weight", (C,), "ln_w"), (p + "input_layernorm.bias", (C,), "b")]
        if kind in ("mamba", "memory"):
            out += [(a + "in_proj.weight", (2 * E, C), "w"), (a + "conv1d.weight", (E, 1, K), "w"),
                    (a + "conv1d.bias", (E,), "b"), (a + "x_proj.weight", (R + 2 * N, E), "w"),
                    (a + "dt_proj.weight", (E, R), "w"), (a + "dt_proj.bias", (E,), "dt_b"),
                    (a + "A_log", (E, N), "A_log"), (a + "D", (E,), "D"), (a + "out_proj.weight", (C, E), "w")]
        elif kind == "gmu":
            out += [(a + "in_proj.weight", (E, C), "w"), (a + "out_proj.weight", (C, E), "w")]
        else:
            q = H * d if kind == "cross" else (H + 2 * G) * d
            out += [(a + "Wqkv.weight", (q, C), "w"), (a + "Wqkv.bias", (q,), "b"),
                    (a + "out_proj.weight", (C, H * d), "w"), (a + "out_proj.bias", (C,), "b")]
            out += [(a + "inner_cross_attn." + n, (d,), "lambda")
                    for n in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2")]
            out.append((a + "inner_cross_attn.subln.weight", (2 * d,), "ln_w"))
        out += [(p + "post_attention_layernorm.weight", (C,), "ln_w"),
                (p + "post_attention_layernorm.bias", (C,), "b"),
                (p + "mlp.fc1.weight", (2 * F, C), "w"), (p + "mlp.fc2.weight", (C, F), "w")]
    out += [("model.final_layernorm.weight", (C,), "ln_w"), ("model.final_layernorm.bias", (C,), "b")]
    return out


def flash_values(shape, kind, rng, rows=8192):
    """Float32 values of one tensor, in row chunks of `rows` (the stream equals one big draw):
    matrices N(0, 1/fan_in) (0.0198 at hidden 2560, the published initializer_range's scale),
    biases N(0, 0.02), norms and D 1 + N(0, 0.02), lambdas N(0, 0.1), A_log log(1..16) +
    N(0, 0.02) (S4D), dt bias softplus^-1 of dt log-uniform in [1e-3, 1e-1] (Mamba's init)."""
    if kind == "dt_b":
        dt = np.exp(np.log(1e-3) + rng.random(shape) * (np.log(1e-1) - np.log(1e-3)))
        yield (dt + np.log(-np.expm1(-dt))).astype(np.float32)
        return
    if kind == "A_log":
        yield (np.log(np.arange(1, shape[1] + 1, dtype=np.float32))[None, :]
               + rng.standard_normal(shape, dtype=np.float32) * 0.02)
        return
    std = {"w": shape[-1] ** -0.5, "b": 0.02, "ln_w": 0.02, "D": 0.02, "lambda": 0.1}[kind]
    base = 1.0 if kind in ("ln_w", "D") else 0.0
    for r in range(0, shape[0], rows):
        n = min(rows, shape[0] - r)
        yield base + rng.standard_normal((n,) + tuple(shape[1:]), dtype=np.float32) * std


def flash_arrays(cfg, seed=0):
    """{name: float32 array} of flash_tensors_of, the values write_flash writes (before rounding);
    for tests at small shapes."""
    rng = np.random.default_rng(seed)
    return {name: np.concatenate(list(flash_values(shape, kind, rng))).reshape(shape)
            for name, shape, kind in flash_tensors_of(cfg)}


def flash_config(shape, dtype):
    """config.json in the published keys and order; token ids are the published ones at full and
    the last id at the scaled-down shapes."""
    s = dict(FLASH_SHAPES[shape])
    sp = s.pop("special")
    return {"architectures": ["Phi4FlashForCausalLM"], "attention_dropout": 0.0,
            "auto_map": {"AutoConfig": "configuration_phi4flash.Phi4FlashConfig",
                         "AutoModelForCausalLM": "modeling_phi4flash.Phi4FlashForCausalLM",
                         "AutoTokenizer": "Xenova/gpt-4o"},
            "pad_token_id": sp, "bos_token_id": sp, "embd_pdrop": 0.0, "eos_token_id": sp,
            "hidden_act": "silu", "hidden_size": s["hidden_size"], "initializer_range": 0.02,
            "intermediate_size": s["intermediate_size"], "layer_norm_eps": 1e-5,
            "max_position_embeddings": s["max_position_embeddings"],
            "_attn_implementation": "flash_attention_2", "mb_per_layer": 2, "model_type": "phi4flash",
            "num_attention_heads": s["num_attention_heads"], "num_hidden_layers": s["num_hidden_layers"],
            "num_key_value_heads": s["num_key_value_heads"], "resid_pdrop": 0.0,
            "sliding_window": s["sliding_window"],
            "torch_dtype": {"BF16": "bfloat16", "F16": "float16", "F32": "float32"}[dtype],
            "tie_word_embeddings": True, "transformers_version": "4.46.1", "use_cache": True,
            "mlp_bias": False, "lm_head_bias": False, "vocab_size": s["vocab_size"]}


def flash_tokenizer_files(out, cfg):
    """tokenizer_config.json (the published one's keys, its chat template), special_tokens_map.json,
    added_tokens.json, and the stand-in tokenizer.json (byte tokens 0-255, no merges, the published
    special tokens at their ids; at scaled-down vocabularies only <|endoftext|>, at the last id)."""
    V = cfg["vocab_size"]
    added = FLASH_ADDED if V > 200028 else [(V - 1, "<|endoftext|>", True, False)]
    eot = "<|endoftext|>"
    tc = {"add_bos_token": False, "add_eos_token": False, "add_prefix_space": False,
          "added_tokens_decoder": {str(i): {"content": c, "lstrip": False, "normalized": False,
                                            "rstrip": r, "single_word": False, "special": sp}
                                   for i, c, sp, r in added},
          "bos_token": eot, "chat_template": FLASH_CHAT_TEMPLATE, "clean_up_tokenization_spaces": False,
          "eos_token": eot, "model_max_length": 65536, "pad_token": eot,
          "tokenizer_class": "GPT2Tokenizer", "unk_token": eot}
    tok = {"content": eot, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False}
    byte_chars = _gpt2_byte_chars()
    # Every id below vocab_size is in the model's vocabulary: the 256 bytes, the special tokens at
    # their ids (the tokenizers library keeps an added token's id only when the model's vocabulary
    # holds it), and unreachable fillers elsewhere (with no merges, BPE emits single bytes only).
    vocab = {byte_chars[b]: b for b in range(256)}
    vocab.update({c: i for i, c, _, _ in added})
    taken = set(vocab.values())
    vocab.update({f"<|filler_{i}|>": i for i in range(256, V) if i not in taken})
    tj = {"version": "1.0", "truncation": None, "padding": None,
          "added_tokens": [{"id": i, "content": c, "single_word": False, "lstrip": False, "rstrip": r,
                            "normalized": False, "special": sp} for i, c, sp, r in added],
          "normalizer": None,
          "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                            "use_regex": True},
          "post_processor": None,
          "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
          "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                    "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                    "ignore_merges": False, "vocab": vocab, "merges": []}}
    files = {"tokenizer_config.json": tc, "tokenizer.json": tj,
             "special_tokens_map.json": {k: tok for k in ("bos_token", "eos_token", "pad_token", "unk_token")}}
    if V > 200028:
        files["added_tokens.json"] = {c: i for i, c, _, _ in added if i >= 200019}
    for name, obj in files.items():
        with open(os.path.join(out, name), "w") as f:
            json.dump(obj, f, indent=2, ensure_ascii=False)


def _gpt2_byte_chars():
    """GPT-2's byte-to-printable-character table (the ByteLevel pre-tokenizer's alphabet)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    out, n = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + n)
            n += 1
    return out


def write_flash(out, shape, dtype, seed, shards):
    """The whole directory; tensors streamed chunk by chunk (no more memory than 8192 rows)."""
    conf = flash_config(shape, dtype)
    cfg = {k: conf[k] for k in ("hidden_size", "intermediate_size", "vocab_size", "num_hidden_layers",
                                 "num_attention_heads", "num_key_value_heads")}
    tensors = flash_tensors_of(cfg)
    L = cfg["num_hidden_layers"]

    def shard_of(name):  # the published split: layers L/2+2.. (the cross-decoder) and the final norm
        if shards == 1:
            return "model.safetensors"
        second = name.startswith("model.final_layernorm") or (
            name.startswith("model.layers.") and int(name.split(".")[2]) >= L // 2 + 2)
        return f"model-0000{2 if second else 1}-of-00002.safetensors"

    def dt_of(kind):  # A_log and the lambdas stay F32 in the published BF16 checkpoint
        return "F32" if kind in ("A_log", "lambda") else dtype

    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(seed)
    files = sorted({shard_of(n) for n, _, _ in tensors})
    handles, total = {}, 0
    for fname in files:
        header, off = {}, 0
        for name, shp, kind in tensors:
            if shard_of(name) == fname:
                n = int(np.prod(shp)) * (4 if dt_of(kind) == "F32" else 2)
                header[name] = {"dtype": dt_of(kind), "shape": list(shp), "data_offsets": [off, off + n]}
                off += n
        total += off
        header["__metadata__"] = {"format": "pt"}
        h = json.dumps(header).encode()
        h += b" " * ((8 - len(h) % 8) % 8)
        f = open(os.path.join(out, fname + ".tmp"), "wb")
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        handles[fname] = f
    for name, shp, kind in tensors:  # one random stream in this order, whatever the sharding
        f = handles[shard_of(name)]
        for chunk in flash_values(shp, kind, rng):
            f.write(to_dtype(chunk, dt_of(kind)))
    for fname, f in handles.items():
        f.close()
        os.replace(os.path.join(out, fname + ".tmp"), os.path.join(out, fname))
    if shards == 2:
        with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": total},
                       "weight_map": {n: shard_of(n) for n in sorted(n for n, _, _ in tensors)}}, f, indent=2)
    sp = conf["eos_token_id"]
    gen = {"_from_model_config": True, "bos_token_id": sp,
           "eos_token_id": [200020, sp] if shape == "full" else [sp], "pad_token_id": sp,
           "transformers_version": "4.45.0"}
    with open(os.path.join(out, "generation_config.json"), "w") as f:
        json.dump(gen, f, indent=2)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(conf, f, indent=2)
    flash_tokenizer_files(out, cfg)
    return total


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


def write_motif(out, kind, shape, dtype, shards, seed, layers=None):
    """Streams a MotifForCausalLM checkpoint to `out`: shards contiguous runs of tensors of about
    equal bytes, each written tensor by tensor, row block by row block. `layers`: the decoder
    layer count instead of the shape's (None: the shape's)."""
    cfg = motif_config(kind, shape, dtype)
    if layers is not None:
        cfg["num_hidden_layers"] = layers
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
    ap.add_argument("--type", choices=["diffllama", "llama", "diff_v2", "motif2-2.6b", "motif2-12.7b",
                                       "phi4flash"], default="diffllama")
    ap.add_argument("--shape", choices=sorted(set(SHAPES) | set(FLASH_SHAPES) | {"full", "tiny"}),
                    default=None, help="1b or small for the Llama types (default 1b); full or tiny "
                    "for Motif (default full); full, small or tiny for phi4flash (default full)")
    ap.add_argument("--shards", type=int, default=None,
                    help="Motif: number of safetensors files (default 1); "
                    "phi4flash: 2 (default, split as published) or 1")
    ap.add_argument("--dtype", choices=["bf16", "f16", "f32"], default="bf16")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--layers", type=int, default=None,
                    help="Motif: decoder layers instead of the shape's (every per-layer shape as "
                    "published; for speed measurements of the 12.7B's layers in less memory)")
    a = ap.parse_args()
    if a.layers is not None and (not a.type.startswith("motif2") or a.layers < 1):
        ap.error("--layers takes a count >= 1 and only --type motif2-2.6b / motif2-12.7b")
    if a.type == "phi4flash":
        shape = a.shape or "full"
        shards = 2 if a.shards is None else a.shards
        if shape not in FLASH_SHAPES or shards not in (1, 2):
            ap.error(f"--type phi4flash takes --shape {' / '.join(FLASH_SHAPES)} and --shards 1 or 2")
        dtype = {"bf16": "BF16", "f16": "F16", "f32": "F32"}[a.dtype]
        total = write_flash(a.out, shape, dtype, a.seed, shards)
        print(f"wrote {a.out}: phi4flash {shape} {dtype}, {total} bytes of weights")
        return
    a.shards = 1 if a.shards is None else a.shards
    dtype = {"bf16": "BF16", "f16": "F16", "f32": "F32"}[a.dtype]
    if a.type.startswith("motif2"):
        shape = a.shape or "full"
        if shape not in ("full", "tiny") or a.shards < 1:
            ap.error(f"--type {a.type} takes --shape full or tiny and --shards >= 1")
        write_motif(a.out, a.type, shape, dtype, a.shards, a.seed, a.layers)
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
