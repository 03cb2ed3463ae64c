"""Motif-2 (MotifForCausalLM) directories run by diffattn: logits and greedy continuations
against the independent float64 reference (motif_reference.py, docs/models/motif2.md) for both
published layouts (Motif-2.6B: a noise head per signal head; Motif-2-12.7B: one noise head shared
by a group of signal heads) at scaled-down shapes, F32 and BF16, one file or shards; the writer's
own directories (bench/make_hf_checkpoint.py --shape tiny); BF16/F16 KV caches; `info`,
`generate`, `convert` to the project's format and back to the published layout (tensors byte
for byte); diffattn.torch.load; and clear errors for configs diffattn does not run.

Accuracy rule (docs/STYLE.md): the logits may be off the float64 reference by twice what a plain
float32 PyTorch computation of the same weights is off, plus two ulps of the logits' scale; a
greedy continuation equals the reference's or parts from it only at a float64 near-tie."""

import importlib.util
import json
import os

import numpy as np
import pytest
import torch

import diffattn
import diffattn.torch
import hf_reference as hr
import model_helpers as mh
import motif_reference as mr

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _bench():
    spec = importlib.util.spec_from_file_location("make_hf_checkpoint",
                                                  os.path.join(ROOT, "bench", "make_hf_checkpoint.py"))
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


def make(tmp_path, shape, dtype="F32", shards=1, seed=11, **over):
    """A Motif checkpoint of motif_reference's TINY shape; returns (dir, config, stored tensors)."""
    cfg = mr.make_config(shape, torch_dtype=hr.TORCH_DTYPE[dtype], **over)
    d = tmp_path / f"{shape}-{dtype}-{shards}"
    stored = hr.write_hf_checkpoint(str(d), cfg, mr.random_tensors(cfg, seed), dtype=dtype, shards=shards)
    return d, cfg, stored


def tokens(cfg, B=2, T=13, seed=1):
    return np.random.default_rng(seed).integers(0, cfg["vocab_size"], (B, T)).astype(np.int64)


CASES = [(shape, dtype, shards) for shape in sorted(mr.TINY) for dtype, shards in (("F32", 1), ("BF16", 3))]


@pytest.mark.parametrize("shape,dtype,shards", CASES)
def test_logits_and_greedy_match_the_reference(tmp_path, shape, dtype, shards):
    d, cfg, w = make(tmp_path, shape, dtype, shards)
    toks = tokens(cfg)
    l64, l32 = mr.logits(cfg, w, toks), mr.logits(cfg, w, toks, torch.float32)
    m = diffattn.load_model(str(d))
    got = m.forward(toks)
    assert got.shape == (2, 13, cfg["vocab_size"])
    mr.check_logits(got, l64, l32, f"{shape} {dtype}")
    prompt = toks[0, :5].tolist()
    ref, steps = mr.greedy(cfg, w, prompt, 10)
    assert len(ref) == 10
    mr.check_greedy(m.generate(prompt, 10, temperature=0.0), ref, steps, f"{shape} {dtype}")


@pytest.mark.parametrize("shape", ["2.6b", "12.7b"])
def test_what_the_loader_maps_matters(tmp_path, shape):
    """Motif's lambda_init index and the learned subln weight each move the logits far outside
    the rule, so the test above can tell a loader that drops either."""
    d, cfg, w = make(tmp_path, shape)
    toks = tokens(cfg)
    l64, l32 = mr.logits(cfg, w, toks), mr.logits(cfg, w, toks, torch.float32)
    bound = mr.logits_bound(l64, l32)
    ones = {k: (np.ones_like(v) if k.endswith("subln.weight") else v) for k, v in w.items()}
    assert np.abs(mr.logits(cfg, ones, toks) - l64).max() > 100 * bound
    with pytest.MonkeyPatch.context() as mp:  # DiffLlama's index: exp(-0.3 l)
        mp.setattr(mr, "lambda_init", lambda l: 0.8 - 0.6 * np.exp(-0.3 * l))
        assert np.abs(mr.logits(cfg, w, toks) - l64).max() > 100 * bound
    # the engine's own config: Motif's schedule (shift 1), the 12.7B grouping as noise_share
    c = diffattn.load_model(str(d)).config
    assert c["lambda_init_shift"] == 1 and c["mlp"] == "polynorm"
    assert c.get("noise_share", 1) == (4 if shape == "12.7b" else 1)


@pytest.mark.parametrize("kind,shards", [("motif2-2.6b", 1), ("motif2-12.7b", 2)])
@pytest.mark.parametrize("dtype", ["F32", "BF16"])
def test_the_writers_directories(tmp_path, kind, shards, dtype):
    d = str(tmp_path / kind)
    _bench().write_motif(d, kind, "tiny", dtype, shards, 5)
    cfg, w = mr.read_checkpoint(d)
    toks = tokens(cfg, seed=4)
    m = diffattn.load_model(d)
    mr.check_logits(m.forward(toks), mr.logits(cfg, w, toks), mr.logits(cfg, w, toks, torch.float32), kind)
    assert ("motif" in m.storage) and (dtype in m.storage)


@pytest.mark.parametrize("kv", ["bf16", "f16"])
@pytest.mark.parametrize("shape", ["2.6b", "12.7b"])
def test_16_bit_kv_caches(tmp_path, shape, kv):
    """A 16-bit cache rounds each key (after RoPE) and value once (test_kv16_greedy.py's oracle):
    every token it picks is an argmax, within twice the engine's float32 error, of the float64
    reference with keys and values rounded the same way, along its own path."""
    d, cfg, w = make(tmp_path, shape)
    m = diffattn.load_model(str(d))
    prompt = tokens(cfg, 1, 6, seed=9)[0].tolist()
    n = 24
    ids16 = m.generate(prompt, n, temperature=0.0, kv_dtype=kv)
    assert len(ids16) == n
    tdt = {"bf16": torch.bfloat16, "f16": torch.float16}[kv]
    path = np.asarray([prompt + ids16[:-1]], np.int64)
    l64 = mr.logits(cfg, w, path)[0]
    l16 = mr.logits(cfg, w, path, kv=lambda u: u.to(torch.float32).to(tdt).to(torch.float64))[0]
    tol = 2 * np.abs(m.forward(path)[0].astype(np.float64) - l64).max()
    p = len(prompt) - 1
    deficit = np.array([l16[p + t].max() - l16[p + t, tok] for t, tok in enumerate(ids16)])
    assert deficit.max() <= tol, (shape, kv, deficit.max(), tol)
    # the rounding matters at this tolerance (else the check could not tell a 16-bit cache)
    assert np.abs(l16 - l64)[p:].max() > tol


def test_cli_info_generate_and_convert_round_trip(tmp_path):
    d, cfg, w = make(tmp_path, "12.7b", "BF16", 3)
    info = mh.run_cli("info", d).stdout
    assert "motif" in info and "polynorm" in info, info
    proj = tmp_path / "proj"
    mh.run_cli("convert", "--model", d, "--to", "diffattn", "--out", proj, "--dtype", "bf16")
    back = tmp_path / "back"
    mh.run_cli("convert", "--model", proj, "--to", "hf", "--out", back, "--dtype", "bf16", "--shards", "2")
    c2 = json.load(open(back / "config.json"))
    for k in ("architectures", "model_type", "hidden_act", "num_attention_heads", "num_key_value_heads",
              "num_noise_heads", "k_ratio", "head_dim", "hidden_size", "intermediate_size",
              "num_hidden_layers", "vocab_size", "tie_word_embeddings", "max_position_embeddings"):
        assert c2[k] == cfg[k], k
    for k in ("rms_norm_eps", "attn_rms_norm_eps", "rope_theta"):
        assert c2[k] == pytest.approx(cfg[k], rel=1e-6), k
    # tensors byte for byte: the same names, shapes and BF16 payloads
    from safetensors import safe_open

    def raw(path):
        out = {}
        idx = path / "model.safetensors.index.json"
        files = sorted(set(json.load(open(idx))["weight_map"].values())) if idx.exists() else ["model.safetensors"]
        for fn in files:
            with safe_open(str(path / fn), framework="pt") as f:
                for n in f.keys():
                    t = f.get_tensor(n)
                    out[n] = (t.dtype, tuple(t.shape), t.view(torch.int16).numpy().tobytes())
        return out
    a, b = raw(d), raw(back)
    assert sorted(a) == sorted(b)
    for n in a:
        assert a[n] == b[n], n
    toks = tokens(cfg)
    l64, l32 = mr.logits(cfg, w, toks), mr.logits(cfg, w, toks, torch.float32)
    for path in (proj, back):
        mr.check_logits(diffattn.load_model(str(path)).forward(toks), l64, l32, str(path))


def test_convert_f32_round_trip_2_6b_tied(tmp_path):
    d, cfg, w = make(tmp_path, "2.6b")
    proj, back = tmp_path / "proj", tmp_path / "back"
    mh.run_cli("convert", "--model", d, "--to", "diffattn", "--out", proj)
    mh.run_cli("convert", "--model", proj, "--to", "hf", "--out", back)
    c2, w2 = mr.read_checkpoint(str(back))
    assert "num_noise_heads" not in c2 and c2["tie_word_embeddings"] and "lm_head.weight" not in w2
    assert sorted(w2) == sorted(w)
    for n in w:
        assert np.array_equal(w2[n], w[n]), n


def test_torch_load(tmp_path):
    d, cfg, w = make(tmp_path, "12.7b-shared-kv")
    module = diffattn.torch.load(str(d))
    toks = tokens(cfg)
    with torch.no_grad():
        got = module(torch.as_tensor(toks)).numpy()
    mr.check_logits(got, mr.logits(cfg, w, toks), mr.logits(cfg, w, toks, torch.float32), "torch.load")


def test_project_format_keys_read_back(tmp_path):
    d, cfg, w = make(tmp_path, "12.7b")
    proj = tmp_path / "proj"
    mh.run_cli("convert", "--model", d, "--to", "diffattn", "--out", proj)
    c = json.load(open(proj / "config.json"))
    assert c["mlp"] == "polynorm" and c["lambda_init_shift"] == 1 and c["noise_share"] == 4
    assert c["subln_eps"] == pytest.approx(1e-5) and c["n_heads"] == 8 and c["n_kv_heads"] == 2
    # a trainable float32 model, but training refuses what has no backward
    m = diffattn.load_model(str(proj))
    with pytest.raises(ValueError, match="inference only"):
        m.gradients(tokens(cfg), tokens(cfg, seed=2))


BAD = [
    (dict(use_bias=True), "no Motif-2 model has biases"),
    (dict(attention_bias=True), "no Motif-2 model has biases"),
    (dict(rope_scaling={"rope_type": "yarn", "factor": 2.0}), "rope_scaling"),
    (dict(hidden_act="silu"), "poly_norm"),
    (dict(k_ratio=2), "k_ratio"),
    (dict(num_noise_heads=3), "num_noise_heads"),
    (dict(num_key_value_heads=3), "num_key_value_heads"),
    (dict(logit_scale=2.0), "logit_scale"),
]


@pytest.mark.parametrize("over,msg", BAD)
def test_unsupported_configs_are_clear_errors(tmp_path, over, msg):
    cfg = mr.make_config("2.6b")
    cfg.update(over)
    d = tmp_path / "bad"
    os.makedirs(d)
    json.dump(cfg, open(d / "config.json", "w"))
    with pytest.raises(ValueError, match=msg):
        diffattn.load_model(str(d))


def test_missing_and_extra_tensors_are_named(tmp_path):
    cfg = mr.make_config("2.6b")
    t = mr.random_tensors(cfg, 3)
    sub = "model.layers.1.self_attn.subln.weight"
    d = tmp_path / "missing"
    hr.write_hf_checkpoint(str(d), cfg, {k: v for k, v in t.items() if k != sub})
    with pytest.raises(OSError, match="subln.weight"):
        diffattn.load_model(str(d))
    d = tmp_path / "extra"
    hr.write_hf_checkpoint(str(d), cfg, dict(t, **{"model.layers.0.mlp.extra": np.zeros(3, np.float32)}))
    with pytest.raises(OSError, match="extra tensor .*Motif"):
        diffattn.load_model(str(d))
    d = tmp_path / "shape"
    bad = dict(t)
    bad["model.layers.0.mlp.act_fn.weight"] = np.zeros(4, np.float32)
    hr.write_hf_checkpoint(str(d), cfg, bad)
    with pytest.raises(OSError, match="act_fn.weight"):
        diffattn.load_model(str(d))


def test_cli_generate(tmp_path):
    """`diffattn generate` on a Motif directory: text through the byte tokenizer (the writer's
    directories hold no tokenizer, so the vocabulary here covers the 256 byte ids), the same
    greedy ids as the Python API, and the decode benchmark with a BF16 cache."""
    d, cfg, w = make(tmp_path, "12.7b", vocab_size=300)
    p = mh.run_cli("generate", "--model", d, "--tokenizer", "bytes", "--prompt", "Motif",
                   "--max-new", "6", "--temperature", "0")
    assert p.stdout.strip(), p.stderr
    b = mh.run_cli("generate", "--model", d, "--bench", "4", "--bench-prompt", "8", "--kv-dtype", "bf16")
    assert "tokens/s" in b.stdout + b.stderr, b.stdout + b.stderr


def test_serve_paged_batches_equal_generate(tmp_path):
    """`diffattn serve` (paged KV blocks, continuous batching) on a grouped Motif directory: greedy
    completions, two of each prompt at once, equal `diffattn generate`'s (the contiguous cache).
    The byte tokenizer stands in for the published one (not in the writer's directories); the
    lm_head rows of bytes outside printable ASCII are zero so the text is printable."""
    import http.client
    import threading

    from serve_helpers import Server

    cfg = mr.make_config("12.7b", vocab_size=300, max_position_embeddings=128)
    w = mr.random_tensors(cfg, 21)
    head = w["lm_head.weight"]
    head[:32] = 0
    head[127:] = 0
    head[32:127] *= 10
    d = tmp_path / "motif"
    hr.write_hf_checkpoint(str(d), cfg, w)

    def post(port, body):
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        c.request("POST", "/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"})
        r = c.getresponse()
        out = r.status, json.loads(r.read())
        c.close()
        return out

    prompts = ["In the beginning", "Motif"]
    want = {}
    for p in prompts:
        out = mh.run_cli("--threads", 1, "generate", "--model", d, "--tokenizer", "bytes", "--prompt", p,
                         "--max-new", 20, "--temperature", 0).stdout
        assert out.startswith(p)
        want[p] = out[len(p):].rstrip("\n")
    s = Server(d, "--tokenizer", "bytes", "--kv-dtype", "f32")
    try:
        got = {}

        def ask(p):
            got[p] = post(s.port, {"prompt": p, "max_tokens": 20, "temperature": 0})

        threads = [threading.Thread(target=ask, args=(p,)) for p in prompts * 2]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        for p in prompts:
            status, r = got[p]
            assert status == 200, r
            assert r["choices"][0]["text"] == want[p], (p, r)
    finally:
        s.stop()


@pytest.mark.parametrize("over,msg", [
    (dict(mlp="gelu"), "mlp"),
    (dict(lambda_init_shift=2), "lambda_init_shift"),
    (dict(subln_eps=0.0), "subln_eps"),
    (dict(noise_share=3), "noise_share"),
    (dict(noise_share=2, attention="standard", n_heads=8), "noise_share"),
])
def test_project_format_keys_are_checked(tmp_path, over, msg):
    d, cfg, w = make(tmp_path, "12.7b")
    proj = tmp_path / "proj"
    mh.run_cli("convert", "--model", d, "--to", "diffattn", "--out", proj)
    c = json.load(open(proj / "config.json"))
    c.update(over)
    json.dump(c, open(proj / "config.json", "w"))
    with pytest.raises(ValueError, match=msg):
        diffattn.load_model(str(proj))
