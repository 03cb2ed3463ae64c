"""Hugging Face LlamaForCausalLM / DiffLlamaForCausalLM directories run by diffattn: logits and
greedy continuations against the float64 PyTorch reference (hf_reference.py) for every variant a
checkpoint may have (GQA, tied, llama3 scaling in both spellings, F32/BF16/F16, shards, biases,
an explicit head_dim), the CLI with the real Llama 3 tokenizer, and malformed directories.

Tolerances (docs/STYLE.md): the C++ logits may be off the float64 reference by twice what a plain
float32 PyTorch computation of the same weights is off, plus a few ulps of the logits' scale;
a greedy continuation equals the reference's, or parts from it only where the float64 top-2
logits are closer than twice that float32 error."""

import json
import os
import shutil
import subprocess

import numpy as np
import pytest
import torch

import diffattn
import hf_reference as hr
import model_helpers as mh
import torch_model as tm

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOKENIZER = os.path.join(os.environ.get("DIFFATTN_TOKENIZER_DATA",
                                        os.path.join(os.path.dirname(ROOT), "shared", "data", "tokenizers")),
                         "llama3")



SCALING_SMALL = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                 "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
# with head_dim 8 and theta 10^4 the wavelengths are 6.3, 63, 628, 6283: one band each of
# "unchanged" (< 16), "medium" (16..64) and "divided by factor" (> 64), so scaling shows at T = 13

# name: (make_config arguments, dtype, shards, rope spelling)
CASES = {
    "diffllama-gqa": (dict(model="diffllama", heads=8, kv_heads=4), "F32", 1, "4.x"),
    "diffllama-mha-tied": (dict(model="diffllama", heads=4, kv_heads=4, tied=True), "F32", 1, "4.x"),
    "diffllama-hkv2-bf16-3shards": (dict(model="diffllama", heads=8, kv_heads=2), "BF16", 3, "4.x"),
    "diffllama-f16-llama3-4x": (dict(model="diffllama", heads=4, kv_heads=2, scaling=SCALING_SMALL), "F16", 1, "4.x"),
    "diffllama-llama3-5x-3shards": (dict(model="diffllama", heads=4, kv_heads=2, scaling=SCALING_SMALL), "F32", 3, "5.x"),
    "diffllama-head-dim-12-bias": (dict(model="diffllama", heads=4, kv_heads=2, head_dim=12, attention_bias=True), "F32", 1, "5.x"),
    "llama-gqa": (dict(model="llama", heads=4, kv_heads=2), "F32", 1, "4.x"),
    "llama-mha-tied-bf16": (dict(model="llama", heads=4, kv_heads=4, tied=True), "BF16", 1, "5.x"),
    "llama-mqa-f16-3shards": (dict(model="llama", heads=4, kv_heads=1), "F16", 3, "4.x"),
    "llama-llama3-4x": (dict(model="llama", heads=4, kv_heads=2, scaling=SCALING_SMALL), "F32", 1, "4.x"),
    "llama-llama3-4x-type-bf16": (dict(model="llama", heads=4, kv_heads=2, scaling=SCALING_SMALL), "BF16", 1, "4.x-type"),
    "llama-llama3-5x": (dict(model="llama", heads=4, kv_heads=2, scaling=SCALING_SMALL), "F32", 1, "5.x"),
    "llama-biases": (dict(model="llama", heads=4, kv_heads=2, attention_bias=True, mlp_bias=True), "F32", 1, "4.x"),
    "llama-head-dim-16": (dict(model="llama", hidden=48, heads=4, kv_heads=2, head_dim=16), "BF16", 3, "5.x"),
}


def make(tmp_path, name, seed=7, **over):
    kw, dtype, shards, spelling = CASES[name]
    kw = {"hidden": 32, "vocab": 96, "inter": 64, "max_pos": 64, **kw, **over}
    cfg = hr.make_config(**kw)
    d = tmp_path / name
    stored = hr.write_hf_checkpoint(str(d), cfg, hr.random_tensors(cfg, seed), dtype=dtype,
                                    shards=shards, rope_spelling=spelling)
    return d, cfg, stored


@pytest.mark.parametrize("name", sorted(CASES))
def test_logits_and_greedy_match_the_reference(tmp_path, name):
    d, cfg, w = make(tmp_path, name)
    toks = np.random.default_rng(1).integers(0, cfg["vocab_size"], (2, 13)).astype(np.int64)
    l64 = hr.logits(cfg, w, toks)
    l32 = hr.logits(cfg, w, toks, torch.float32)
    m = diffattn.load_model(str(d))
    got = m.forward(toks)
    assert got.shape == (2, 13, cfg["vocab_size"]) and got.dtype == np.float32
    hr.check_logits(got, l64, l32, name)
    # the variant must matter, or the case could not catch a loader that ignores it
    bound = hr.logits_bound(l64, l32)
    if cfg.get("rope_scaling"):
        plain = hr.logits(dict(cfg, rope_scaling=None), w, toks)
        assert np.abs(plain - l64).max() > 100 * bound
    if cfg.get("attention_bias") or cfg.get("mlp_bias"):
        nob = {k: (0 * v if k.endswith(".bias") else v) for k, v in w.items()}
        assert np.abs(hr.logits(cfg, nob, toks) - l64).max() > 100 * bound
    prompt = toks[0, :5].tolist()
    ref, steps = hr.greedy(cfg, w, prompt, 10)
    assert len(ref) == 10
    hr.check_greedy(m.generate(prompt, 10), ref, steps, name)


def test_batch_rows_are_independent(tmp_path):
    d, cfg, w = make(tmp_path, "diffllama-gqa")
    toks = np.random.default_rng(2).integers(0, cfg["vocab_size"], (3, 9)).astype(np.int64)
    m = diffattn.load_model(str(d))
    both = m.forward(toks)
    for b in range(3):
        one = m.forward(toks[b:b + 1])
        l64 = hr.logits(cfg, w, toks[b:b + 1])
        hr.check_logits(one, l64, hr.logits(cfg, w, toks[b:b + 1], torch.float32), f"row {b}")
        hr.check_logits(both[b:b + 1], l64, hr.logits(cfg, w, toks[b:b + 1], torch.float32), f"batched row {b}")


@pytest.mark.parametrize("name", ["diffllama-gqa", "llama-mqa-f16-3shards"])
def test_long_prompt_and_one_token_prompt(tmp_path, name):
    """A 260-token prompt puts decode on the split-KV path (Tq <= 4, Tk >= 256); a one-token
    prompt starts from a prefill of one row."""
    d, cfg, w = make(tmp_path, name, max_pos=300)
    m = diffattn.load_model(str(d))
    toks = np.random.default_rng(5).integers(0, cfg["vocab_size"], (1, 260)).astype(np.int64)
    hr.check_logits(m.forward(toks), hr.logits(cfg, w, toks), hr.logits(cfg, w, toks, torch.float32), name)
    for prompt in (toks[0].tolist(), [7]):
        ref, steps = hr.greedy(cfg, w, prompt, 6)
        hr.check_greedy(m.generate(prompt, 6), ref, steps, f"{name}, prompt of {len(prompt)}")


def test_generation_stops_at_max_position_embeddings(tmp_path):
    d, cfg, w = make(tmp_path, "llama-gqa", max_pos=12)
    m = diffattn.load_model(str(d))
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    ref, steps = hr.greedy(cfg, w, prompt, 10)
    assert len(ref) == 4  # 12 positions in all
    out = m.generate(prompt, 10)
    assert len(out) == 4
    hr.check_greedy(out, ref, steps)


def test_cli_info(tmp_path):
    d, cfg, w = make(tmp_path, "diffllama-hkv2-bf16-3shards")
    out = mh.run_cli("info", d).stdout
    # the config diffattn runs is hf_to_project's (H/2 pairs, Hkv/2 groups, head_dim d)
    text = out[out.index("{"):out.index("}") + 1]
    shown = json.loads(text)
    want, _ = hr.hf_to_project(cfg, w)
    assert shown.pop("norm_eps") == pytest.approx(want.pop("norm_eps"), rel=1e-6)
    assert shown == {k: v for k, v in want.items()}, out
    total = sum(a.size for a in w.values()) + cfg["num_hidden_layers"] * 2 * hr.head_dim_of(cfg)  # + subln
    assert f"total {total}" in " ".join(out.split()), out
    P = hr.params(w)
    for l in range(cfg["num_hidden_layers"]):
        a = f"model.layers.{l}.self_attn."
        lam = (float(torch.exp((P[a + "lambda_q1"] * P[a + "lambda_k1"]).sum()))
               - float(torch.exp((P[a + "lambda_q2"] * P[a + "lambda_k2"]).sum())) + hr.lambda_init(l))
        assert f"{l} {hr.lambda_init(l):.4f} {lam:.4f}" in " ".join(out.split()), out


# ---------------------------------------------------------------- convert


@pytest.mark.parametrize("name", ["diffllama-hkv2-bf16-3shards", "llama-gqa", "llama-mha-tied-bf16"])
def test_convert_to_diffattn_is_hf_to_project(tmp_path, name):
    d, cfg, w = make(tmp_path, name)
    out = tmp_path / "converted"
    mh.run_cli("convert", "--model", d, "--to", "diffattn", "--out", out)
    pc = json.loads((out / "config.json").read_text())
    pt, _ = tm.read_safetensors(str(out / "model.safetensors"))
    want_c, want_t = hr.hf_to_project(cfg, w)
    assert pc.pop("norm_eps") == pytest.approx(want_c.pop("norm_eps"), rel=1e-6)
    assert pc == want_c
    assert sorted(pt) == sorted(want_t)
    for n in pt:
        assert np.array_equal(pt[n], want_t[n]), n  # a permutation of the stored values, exactly


@pytest.mark.parametrize("kind,G,dtype,shards", [("diff_v1", 2, "f32", 1), ("diff_v1", 1, "bf16", 3),
                                                 ("standard", 2, "f16", 2)])
def test_convert_to_hf_gives_the_reference_model(tmp_path, kind, G, dtype, shards):
    """A diffattn/1 model (subln gains not 1) written as a Hugging Face directory: read back by
    this file's reader, the reference computes the project model's logits (exactly so up to the
    rounding of the stored dtype), and diffattn loads it with the reference's logits."""
    pc = {"format": "diffattn/1", "attention": kind, "vocab_size": 96, "d_model": 32, "n_layers": 2,
          "n_heads": 2 if kind == "diff_v1" else 4, "n_kv_heads": G, "head_dim": 8, "ffn_dim": 64,
          "max_seq_len": 64, "rope_theta": 10000.0, "norm_eps": 1e-5, "tie_embeddings": False}
    src, out = tmp_path / "project", tmp_path / "hf"
    pw = tm.random_weights(pc, 4)
    tm.save_model_dir(str(src), pc, pw)
    mh.run_cli("convert", "--model", src, "--to", "hf", "--out", out, "--dtype", dtype, "--shards", shards)
    assert (shards > 1) == (out / "model.safetensors.index.json").exists()
    cfg, w = hr.read_hf_checkpoint(str(out))
    assert cfg["model_type"] == ("diffllama" if kind == "diff_v1" else "llama")
    toks = np.random.default_rng(3).integers(0, 96, (2, 12)).astype(np.int64)
    l64 = hr.logits(cfg, w, toks)
    l32 = hr.logits(cfg, w, toks, torch.float32)
    hr.check_logits(diffattn.load_model(str(out)).forward(toks), l64, l32, f"{kind} {dtype}")
    with torch.no_grad():
        lp = tm.forward(pc, tm.params_from(pw), torch.as_tensor(toks)).numpy()
    if dtype == "f32":
        # the folded subln gains are one float32 rounding of a product away
        hr.check_logits(lp, l64, l32, "project model vs its Hugging Face form")
    else:
        assert np.abs(lp - l64).max() < (2.0**-8 if dtype == "bf16" else 2.0**-11) * 8 * np.abs(l64).max()


# ---------------------------------------------------------------- the real Llama 3 tokenizer


def _with_tokenizer(tmp_path, model, seed):
    if not os.path.isfile(os.path.join(TOKENIZER, "tokenizer.json")):
        pytest.skip(f"no Llama 3 tokenizer at {TOKENIZER} (../shared/data/tokenizers beside the "
                    "clone, or set DIFFATTN_TOKENIZER_DATA)")
    cfg = hr.make_config(model, hidden=32, heads=4, kv_heads=2, inter=64, vocab=128256,
                         max_pos=64, theta=500000.0, bos=128000, eos=128001)
    d = tmp_path / model
    w = hr.write_hf_checkpoint(str(d), cfg, hr.random_tensors(cfg, seed), dtype="BF16",
                               generation={"eos_token_id": [128001, 128009]})
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(TOKENIZER, f), d / f)
    return d, cfg, w


def _byte_level_char_to_byte():
    """GPT-2's byte-level alphabet, inverted: the printable Latin-1 bytes stand for themselves,
    the other 68 are the code points 256, 257, ... in byte order."""
    keep = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[chr(b)] = b
        else:
            table[chr(256 + extra)] = b
            extra += 1
    return table


def token_bytes(tok, ids):
    """What the ByteLevel decoder makes of ids, skipping special tokens, as bytes: random weights
    produce pieces of UTF-8 characters, which a str cannot hold."""
    table = _byte_level_char_to_byte()
    return b"".join(bytes(table[c] for c in tok.token(i)) for i in ids if not tok.is_special(i))


@pytest.mark.parametrize("model", ["diffllama", "llama"])
def test_cli_generates_the_reference_text_with_the_llama3_tokenizer(tmp_path, model):
    d, cfg, w = _with_tokenizer(tmp_path, model, seed=11)
    tok = diffattn.HfTokenizer.load(str(d))
    prompt = "The quick brown fox"
    ids = tok.encode(prompt, True)
    assert ids[0] == 128000  # the BOS that transformers' tokenizer(prompt) adds
    assert token_bytes(tok, ids) == prompt.encode()
    stops = [128001, 128009]  # generation_config.json's eos_token_id
    ref, steps = hr.greedy(cfg, w, ids, 12, stop_ids=stops)
    got = diffattn.load_model(str(d)).generate(ids, 12, stop_ids=stops)
    hr.check_greedy(got, ref, steps, model)
    assert len(got) > 0
    p = subprocess.run([mh.CLI, "--threads", "1", "generate", "--model", str(d), "--prompt", prompt,
                        "--max-new", "12", "--temperature", "0"], capture_output=True, check=True)
    # The CLI streams whole UTF-8 characters: bytes of the random model's tokens that form no
    # character print as U+FFFD, as Python's errors="replace" decodes them.
    text = (prompt.encode() + token_bytes(tok, got)).decode("utf-8", errors="replace")
    assert p.stdout == text.encode() + b"\n", (p.stdout, got)


# ---------------------------------------------------------------- malformed directories


def _rewrite_config(d, fn):
    p = d / "config.json"
    c = json.loads(p.read_text())
    fn(c)
    p.write_text(json.dumps(c))


def _load_error(d):
    """The message, with the directory (whose test-made name may hold any word) cut to <dir>."""
    with pytest.raises((ValueError, OSError)) as e:
        diffattn.load_model(str(d))
    return str(e.value).replace(str(d), "<dir>")


def test_missing_shard(tmp_path):
    d, _, _ = make(tmp_path, "llama-mqa-f16-3shards")
    os.remove(d / "model-00002-of-00003.safetensors")
    msg = _load_error(d)
    assert "<dir>/model-00002-of-00003.safetensors" in msg, msg


def test_a_stale_single_file_beside_an_index_is_named(tmp_path):
    # transformers would load model.safetensors and ignore the index: neither reader guesses.
    d, _, _ = make(tmp_path, "llama-mqa-f16-3shards")
    shutil.copy(d / "model-00001-of-00003.safetensors", d / "model.safetensors")
    msg = _load_error(d)
    assert "<dir>: holds both model.safetensors and model.safetensors.index.json" in msg, msg
    assert "remove it" in msg


def test_index_names_a_tensor_no_shard_holds(tmp_path):
    d, _, _ = make(tmp_path, "diffllama-hkv2-bf16-3shards")
    p = d / "model.safetensors.index.json"
    idx = json.loads(p.read_text())
    name = "model.norm.weight"
    have = idx["weight_map"][name]
    idx["weight_map"][name] = next(f for f in sorted(set(idx["weight_map"].values())) if f != have)
    p.write_text(json.dumps(idx))
    msg = _load_error(d)
    assert name in msg and ("<dir>/model.safetensors.index.json" in msg or
                            f"<dir>/{idx['weight_map'][name]}" in msg), msg


def test_tensor_with_the_wrong_shape(tmp_path):
    d, cfg, w = make(tmp_path, "llama-gqa")
    name = "model.layers.1.self_attn.k_proj.weight"
    w = dict(w)
    w[name] = w[name][:-1]  # one row short
    hr.write_hf_checkpoint(str(d), cfg, w)
    msg = _load_error(d)
    assert name in msg and "<dir>/model.safetensors" in msg, msg


@pytest.mark.parametrize("keep", ["all but 100 bytes", "20 bytes"])
def test_truncated_safetensors(tmp_path, keep):
    d, _, _ = make(tmp_path, "diffllama-gqa")
    p = d / "model.safetensors"
    data = p.read_bytes()
    p.write_bytes(data[:-100] if keep == "all but 100 bytes" else data[:20])
    msg = _load_error(d)
    assert "<dir>/model.safetensors" in msg, msg


def test_missing_tensor(tmp_path):
    d, cfg, w = make(tmp_path, "diffllama-gqa")
    name = "model.layers.0.self_attn.lambda_k2"
    hr.write_hf_checkpoint(str(d), cfg, {k: v for k, v in w.items() if k != name})
    msg = _load_error(d)
    assert name in msg and "<dir>/model.safetensors" in msg, msg


@pytest.mark.parametrize("spelling", ["4.x", "5.x"])
def test_unknown_rope_type(tmp_path, spelling):
    d, cfg, w = make(tmp_path, "llama-gqa")
    hr.write_hf_checkpoint(str(d), dict(cfg, rope_scaling=dict(SCALING_SMALL, rope_type="spiral")), w,
                           rope_spelling=spelling)
    msg = _load_error(d)
    field = "rope_scaling" if spelling == "4.x" else "rope_parameters"
    assert "<dir>/config.json" in msg and field in msg and "spiral" in msg, msg


def test_unsupported_model_type(tmp_path):
    d, _, _ = make(tmp_path, "llama-gqa")
    _rewrite_config(d, lambda c: c.update(model_type="mistral", architectures=["MistralForCausalLM"]))
    msg = _load_error(d)
    assert "<dir>/config.json" in msg and "model_type" in msg and "mistral" in msg, msg


def test_diffllama_with_odd_kv_heads(tmp_path):
    d, cfg, _ = make(tmp_path, "diffllama-gqa", heads=6, kv_heads=3, hidden=48)
    msg = _load_error(d)
    assert "<dir>/config.json" in msg and "num_key_value_heads" in msg, msg


@pytest.mark.parametrize("key", ["hidden_size", "num_hidden_layers", "num_attention_heads"])
def test_missing_required_config_key(tmp_path, key):
    d, _, _ = make(tmp_path, "diffllama-gqa")
    _rewrite_config(d, lambda c: c.pop(key))
    msg = _load_error(d)
    assert "<dir>/config.json" in msg and key in msg, msg


@pytest.mark.parametrize("dtype,bad", [("F32", np.nan), ("BF16", np.inf), ("F16", -np.inf)])
def test_non_finite_weight(tmp_path, dtype, bad):
    cfg = hr.make_config("diffllama", heads=4, kv_heads=2, vocab=96)
    w = hr.random_tensors(cfg, 2)
    name = "model.layers.1.mlp.up_proj.weight"
    w[name][3, 5] = bad
    hr.write_hf_checkpoint(str(tmp_path), cfg, w, dtype=dtype, shards=2)
    msg = _load_error(tmp_path)
    assert name in msg and "<dir>/model-0000" in msg and str(3 * 32 + 5) in msg, msg


def test_rotary_inv_freq_buffers_of_older_exports_are_skipped(tmp_path):
    """Older conversions saved each layer's RoPE buffer (rotary_emb.inv_freq); transformers
    ignores it, so does the loader; any other unknown tensor is an error naming it."""
    cfg = hr.make_config("llama", layers=1)
    t = hr.random_tensors(cfg, 3)
    d = hr.head_dim_of(cfg)
    extra = dict(t)
    extra["model.layers.0.self_attn.rotary_emb.inv_freq"] = np.ones(d // 2, np.float32)
    hr.write_hf_checkpoint(str(tmp_path / "a"), cfg, extra)
    hr.write_hf_checkpoint(str(tmp_path / "b"), cfg, t)
    tokens = np.arange(12, dtype=np.int64)[None] % cfg["vocab_size"]
    assert np.array_equal(diffattn.load_model(str(tmp_path / "a")).forward(tokens),
                          diffattn.load_model(str(tmp_path / "b")).forward(tokens))
    bad = dict(t)
    bad["model.layers.0.self_attn.rotary_emb.inv_freqs"] = np.ones(d // 2, np.float32)
    hr.write_hf_checkpoint(str(tmp_path / "c"), cfg, bad)
    with pytest.raises(OSError, match="extra tensor.*inv_freqs"):
        diffattn.load_model(str(tmp_path / "c"))
