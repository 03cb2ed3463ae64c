"""Phi-4-mini-flash (model_type "phi4flash", the SambaY hybrid: Mamba-1, sliding-window
differential attention, a YOCO cross-decoder, GMUs) run by diffattn, against the independent
float64 reference tests/python/phi4flash_reference.py (docs/models/phi4flash.md) at scaled-down
configs that keep the published layer pattern, with windows shorter than the sequences:
logits of every position (F32 and BF16 storage, one file or shards), greedy continuations from
prompts shorter and longer than the window that generate across the window's edge (where the
published HF cache drops a key, docs/models/phi4flash.md "Where the sources disagree" item 1:
the engine must follow the reference, not that defect), 16-bit K/V caches, `diffattn serve`
with continuous batching and prompts prefilled in chunks across the window's edge (decode and
prefill logits seen through logprobs), the CLI (`info`, `generate`, `generate --bench`), the
writer's own directories (bench/make_hf_checkpoint.py --type phi4flash --shape tiny), clear
errors for configs and files the engine cannot run, and training refused.

Accuracy rule (docs/STYLE.md, hf_reference.check_logits): the logits may be off the float64
reference by twice what the same reference run in float32 is off, plus two float32 ulps of the
logits' scale; a greedy continuation equals the reference's or parts from it only at a float64
near-tie (top-2 gap within twice the float32 reference's error at that step)."""

import http.client
import importlib.util
import json
import os
import re
import subprocess
import sys
import threading

import numpy as np
import pytest
import torch

import diffattn
import hf_reference as hr
import model_helpers as mh
import phi4flash_reference as R

ROOT = mh.ROOT

# Scaled down, published pattern (layers % 4 == 0, mb_per_layer 2): test_phi4flash_reference.py's
# CONFIGS, plus the cross-check's 16-layer one (docs/models/phi4flash.md, "Checked against").
CONFIGS = [
    dict(layers=8, hidden=32, heads=4, kv_heads=2, window=5),
    dict(layers=8, hidden=48, heads=6, kv_heads=2, window=3, d_state=8),
    dict(layers=12, hidden=32, heads=4, kv_heads=4, window=4, d_conv=3),
    dict(layers=16, hidden=64, heads=8, kv_heads=4, window=6),
]
T = 16  # longer than every window above
KEEP_F32 = ("A_log", "lambda")  # spec kinds the published BF16 checkpoint stores as F32


# ------------------------------------------------------------------ checkpoints

def write_checkpoint(path, cfg, tensors, dtype="F32", shards=1):
    """A phi4flash Hugging Face directory: config.json (torch_dtype naming dtype),
    generation_config.json, and model.safetensors, or the published two-file split (the
    cross-decoder, layers L/2+2.., and the final norm in the second file) with its index. Matrices
    and vectors in dtype, A_log and the lambdas in F32 as published. Returns {name: float64
    tensor} of the values exactly as stored, what the reference must compute with."""
    os.makedirs(path, exist_ok=True)
    conf = dict(cfg, torch_dtype=hr.TORCH_DTYPE[dtype])
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(conf, f, indent=2)
    with open(os.path.join(path, "generation_config.json"), "w") as f:
        json.dump({"_from_model_config": True, "bos_token_id": cfg["bos_token_id"],
                   "eos_token_id": [cfg["eos_token_id"]], "pad_token_id": cfg["pad_token_id"],
                   "transformers_version": "4.46.1"}, f, indent=2)
    kinds = {n: k for n, _, k in R.tensor_specs(cfg)}
    L = cfg["num_hidden_layers"]

    def shard_of(name):
        if shards == 1:
            return "model.safetensors"
        second = name.startswith("model.final_layernorm") or (
            name.startswith("model.layers.") and int(name.split(".")[2]) >= L // 2 + 2)
        return f"model-0000{2 if second else 1}-of-00002.safetensors"

    files, stored = {}, {}
    for name, value in tensors.items():
        a = np.asarray(value.numpy() if isinstance(value, torch.Tensor) else value, np.float64)
        dt = "F32" if kinds.get(name) in KEEP_F32 else dtype
        raw, back = hr.round_to(a.astype(np.float32), dt)
        stored[name] = torch.from_numpy(back.reshape(a.shape).astype(np.float64))
        files.setdefault(shard_of(name), []).append((name, dt, a.shape, raw))
    for fname, entries in files.items():
        hr.write_safetensors_raw(os.path.join(path, fname), entries, {"format": "pt"})
    if shards != 1:
        with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": sum(len(e[3]) for es in files.values() for e in es)},
                       "weight_map": {n: shard_of(n) for n in sorted(tensors)}}, f, indent=2)
    return stored


_CKPT = {}


def checkpoint(tmp_path_factory, i, dtype="F32", shards=1):
    """(dir, config, stored float64 tensors) of CONFIGS[i], written once per session."""
    key = (i, dtype, shards)
    if key not in _CKPT:
        cfg = R.make_config(**CONFIGS[i])
        d = tmp_path_factory.mktemp(f"phi4flash-{i}-{dtype}-{shards}")
        _CKPT[key] = (str(d), cfg, write_checkpoint(str(d), cfg, R.random_tensors(cfg, 100 + i), dtype, shards))
    return _CKPT[key]


def tokens(cfg, B=2, n=T, seed=1):
    return np.random.default_rng(seed).integers(0, cfg["vocab_size"], (B, n)).astype(np.int64)


def ref_logits(cfg, t, toks, dtype=torch.float64):
    return R.forward(cfg, t, torch.as_tensor(toks), dtype).double().numpy()


def greedy_ref(cfg, t, prompt, n):
    """n greedy ids of the float64 reference's incremental decoder (prefill, then one step a
    token), and per step (float64 top-1 minus top-2 logit, max |float32 - float64| logits) with
    the float32 reference decoding the same ids: what hf_reference.check_greedy needs."""
    p = torch.tensor([prompt], dtype=torch.int64)
    l64, s64 = R.prefill(cfg, t, p)
    l32, s32 = R.prefill(cfg, t, p, torch.float32)
    ids, steps = [], []
    for k in range(n):
        a, b = l64[0], l32[0].double()
        top = torch.topk(a, 2).values
        steps.append((float(top[0] - top[1]), float((b - a).abs().max())))
        ids.append(int(a.argmax()))
        if k + 1 < n:
            nxt = torch.tensor([ids[-1]])
            l64 = R.step(cfg, t, s64, nxt)
            l32 = R.step(cfg, t, s32, nxt, torch.float32)
    return ids, steps


def log_softmax(x):
    x = np.asarray(x, np.float64)
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


# ------------------------------------------------------------------ 1. logits

CASES = [(i, dtype, shards) for i in range(len(CONFIGS)) for dtype, shards in (("F32", 1), ("BF16", 2))]


@pytest.mark.parametrize("i,dtype,shards", CASES)
def test_logits_match_the_reference(tmp_path_factory, i, dtype, shards):
    """Every position of two fresh sequences, longer than the window; T = 1 too. BF16: against
    the reference on the BF16-rounded values the files hold."""
    d, cfg, t = checkpoint(tmp_path_factory, i, dtype, shards)
    toks = tokens(cfg, seed=i)
    l64, l32 = ref_logits(cfg, t, toks), ref_logits(cfg, t, toks, torch.float32)
    m = diffattn.load_model(d)
    got = m.forward(toks)
    assert got.shape == (2, T, cfg["vocab_size"]) and got.dtype == np.float32
    hr.check_logits(got, l64, l32, f"config {i} {dtype} x{shards}")
    one = m.forward(toks[:, :1])
    hr.check_logits(one, l64[:, :1], l32[:, :1], f"config {i} {dtype} T=1")
    # the rule can tell: the logits are far from flat and the float32 error far below them
    assert np.abs(l64).max() > 1.0 and hr.logits_bound(l64, l32) < 1e-3 * np.abs(l64).max()
    assert ("phi4flash" in m.storage) and (dtype in m.storage), m.storage


def test_config_and_parameter_count(tmp_path_factory):
    d, cfg, t = checkpoint(tmp_path_factory, 3)
    m = diffattn.load_model(d)
    assert m.num_params == sum(v.numel() for v in t.values())
    c = m.config
    assert c["vocab_size"] == cfg["vocab_size"] and c.get("sliding_window") == cfg["sliding_window"]
    kinds = c.get("layer_kinds")
    if kinds is not None:  # the engine's own words for the layers; the published pattern
        want = {"mamba": "mamba", "memory": "mamba", "swa": "slid", "full": "full", "gmu": "gmu",
                "cross": "cross"}
        assert len(kinds) == cfg["num_hidden_layers"]
        for got, ref in zip(kinds, R.layer_kinds(cfg)):
            assert want[ref] in got, (kinds, R.layer_kinds(cfg))


def test_the_writers_directories(tmp_path):
    """bench/make_hf_checkpoint.py --type phi4flash --shape tiny (the published file layout,
    stand-in tokenizer): BF16 in the published two files, F32 in one."""
    spec = importlib.util.spec_from_file_location("make_hf_checkpoint",
                                                  os.path.join(ROOT, "bench", "make_hf_checkpoint.py"))
    mk = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mk)
    from safetensors.torch import load_file
    for dtype, shards in (("BF16", 2), ("F32", 1)):
        d = str(tmp_path / f"{dtype}-{shards}")
        mk.write_flash(d, "tiny", dtype, 5, shards)
        cfg = json.load(open(os.path.join(d, "config.json")))
        t = {}
        for f in sorted(os.listdir(d)):
            if f.endswith(".safetensors"):
                t.update({k: v.double() for k, v in load_file(os.path.join(d, f)).items()})
        toks = tokens(cfg, seed=4)
        m = diffattn.load_model(d)
        hr.check_logits(m.forward(toks), ref_logits(cfg, t, toks), ref_logits(cfg, t, toks, torch.float32),
                        f"writer tiny {dtype}")


# ------------------------------------------------------------------ 2. greedy

@pytest.mark.parametrize("i,dtype", [(0, "F32"), (1, "F32"), (2, "F32"), (3, "F32"), (3, "BF16")])
def test_greedy_matches_the_reference_across_the_window_edge(tmp_path_factory, i, dtype):
    """Prompts shorter than the window (the decode then crosses positions W-1 .. 2W-3, where
    HF's SambaYCache would attend an empty slot and drop position 0), exactly the window, and
    longer than it; 2W + 3 new tokens each."""
    d, cfg, t = checkpoint(tmp_path_factory, i, dtype, 2 if dtype == "BF16" else 1)
    W = cfg["sliding_window"]
    m = diffattn.load_model(d)
    seq = tokens(cfg, 1, 2 * W + 4, seed=20 + i)[0].tolist()
    n = 2 * W + 3
    for P in sorted({max(1, W - 2), W, W + 3}):
        prompt = seq[:P]
        ref, steps = greedy_ref(cfg, t, prompt, n)
        got = m.generate(prompt, n, temperature=0.0)
        assert len(got) == n
        hr.check_greedy(got, ref, steps, f"config {i} {dtype} prompt {P} (window {W})")


def test_generate_agrees_with_forward_along_its_path(tmp_path_factory):
    """The decode state after each token gives what a fresh prefill of the same tokens gives:
    every greedy id is an argmax of the engine's own parallel logits along the path, within
    twice the logits rule (decode and prefill are different paths in the engine, each within
    the rule)."""
    for i in (0, 3):
        d, cfg, t = checkpoint(tmp_path_factory, i)
        W = cfg["sliding_window"]
        m = diffattn.load_model(d)
        for P in (2, W + 1):
            prompt = tokens(cfg, 1, P, seed=40 + P)[0].tolist()
            ids = m.generate(prompt, 3 * W, temperature=0.0)
            path = np.asarray([prompt + ids[:-1]], np.int64)
            own = m.forward(path)[0].astype(np.float64)
            tol = 2 * hr.logits_bound(ref_logits(cfg, t, path)[0], ref_logits(cfg, t, path, torch.float32)[0])
            deficit = [own[P - 1 + k].max() - own[P - 1 + k, tok] for k, tok in enumerate(ids)]
            assert max(deficit) <= tol, (i, P, deficit, tol)


# ------------------------------------------------------------------ 3. 16-bit K/V caches

@pytest.mark.parametrize("kv", ["bf16", "f16"])
def test_16_bit_kv_caches_stay_close_to_the_reference(tmp_path_factory, monkeypatch, kv):
    """A 16-bit cache rounds the sliding windows' and the YOCO layer's keys and values (the Mamba
    states are not K/V). Loose bound: each greedy id of the 16-bit cache is, along its own path,
    an argmax of the float64 reference within twice the engine's float32 error plus twice the
    largest logit change that rounding every key and value to the cache's type makes in the
    reference (l16); a cache that reads stale or misplaced rows misses it by O(1)."""
    d, cfg, t = checkpoint(tmp_path_factory, 0)
    W = cfg["sliding_window"]
    m = diffattn.load_model(d)
    dt = {"bf16": torch.bfloat16, "f16": torch.float16}[kv]
    for P in (3, W + 2):
        prompt = tokens(cfg, 1, P, seed=60 + P)[0].tolist()
        n = 3 * W
        ids = m.generate(prompt, n, temperature=0.0, kv_dtype=kv)
        assert len(ids) == n
        path = np.asarray([prompt + ids[:-1]], np.int64)
        l64 = ref_logits(cfg, t, path)[0]
        orig = R.diff_attention

        def rounded(xq, k, v, *a, **kw):
            r = lambda u: u.to(torch.float32).to(dt).to(torch.float64)  # noqa: E731
            return orig(xq, r(k), r(v), *a, **kw)
        monkeypatch.setattr(R, "diff_attention", rounded)
        l16 = ref_logits(cfg, t, path)[0]
        monkeypatch.setattr(R, "diff_attention", orig)
        eps = np.abs(m.forward(path)[0].astype(np.float64) - l64).max()
        rounding = np.abs(l16 - l64)[P - 1:].max()
        bound = 2 * eps + 2 * rounding
        deficit = np.array([l64[P - 1 + k].max() - l64[P - 1 + k, tok] for k, tok in enumerate(ids)])
        assert deficit.max() <= bound, (kv, P, deficit.max(), eps, rounding)
        assert bound < 0.05 * np.abs(l64).max()  # loose, but far below a wrong token's deficit


# ------------------------------------------------------------------ 4. serve

def ascii_checkpoint(path, seed=21, window=5):
    """A byte-vocabulary (256) phi4flash model whose greedy output is printable ASCII: the tied
    embedding rows of bytes outside 32..126 are zero, so their logit is 0 while the largest of the
    95 others is positive; prompts use printable bytes only. Served text and ids then convert
    into each other exactly (--tokenizer bytes)."""
    cfg = R.make_config(layers=8, hidden=32, heads=4, kv_heads=2, window=window, vocab=256)
    t = R.random_tensors(cfg, seed)
    e = t["model.embed_tokens.weight"]
    e[:32] = 0
    e[127:] = 0
    return cfg, write_checkpoint(str(path), cfg, t)


def printable(n, seed):
    return [int(x) for x in np.random.default_rng(seed).integers(32, 127, n)]


def post(port, body, timeout=60):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    c.request("POST", "/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"})
    r = c.getresponse()
    out = r.status, json.loads(r.read())
    c.close()
    return out


def test_serve_batches_chunks_and_equals_generate(tmp_path):
    """`diffattn serve` with continuous batching and a prefill chunk of 3 tokens (over all
    sequences), so prompts longer than the window are split across its edge: prompts of 2 to 17
    tokens (window 5), some the start of others (the prefix cache must stay off for a recurrent
    model), each sent twice at once. Each answer equals m.generate() of its prompt alone, and its
    logprobs are the float64 reference's decode log-probabilities along the answer within twice
    the logits rule (the decode state after a chunked prefill, seen through logits)."""
    from serve_helpers import Server

    d = tmp_path / "ascii"
    cfg, t = ascii_checkpoint(d)
    m = diffattn.load_model(str(d))
    base = printable(17, 3)
    prompts = [base[:2], base[:4], base[:5], printable(7, 4), base[:12], base[:17]]
    n = 12
    want = {tuple(p): m.generate(p, n, temperature=0.0) for p in prompts}
    for ids in want.values():
        assert all(32 <= x < 127 for x in ids), ids
    s = Server(d, "--tokenizer", "bytes", "--prefill-chunk", 3, "--kv-dtype", "f32", "--max-batch", 8)
    got = {}
    try:
        def ask(k, p):
            got[k] = post(s.port, {"prompt": p, "max_tokens": n, "temperature": 0, "logprobs": 1})

        threads = [threading.Thread(target=ask, args=((j, r), p)) for j, p in enumerate(prompts) for r in range(2)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(120)
    finally:
        s.stop()
    for j, p in enumerate(prompts):
        for r in range(2):
            status, body = got[(j, r)]
            assert status == 200, body
            text = body["choices"][0]["text"]
            ids = [ord(ch) for ch in text]
            assert ids == want[tuple(p)], (len(p), r, ids, want[tuple(p)])
            lps = body["choices"][0]["logprobs"]["token_logprobs"]
            assert len(lps) == n
            path = np.asarray([p + ids[:-1]], np.int64)
            l64 = ref_logits(cfg, t, path)[0][len(p) - 1:]
            l32 = ref_logits(cfg, t, path, torch.float32)[0][len(p) - 1:]
            ref = log_softmax(l64)[np.arange(n), ids]
            tol = 2 * hr.logits_bound(l64, l32) + 2.0 ** -22 * np.abs(ref).max()
            err = np.abs(np.asarray(lps, np.float64) - ref).max()
            assert err <= tol, (len(p), r, err, tol)


def test_serve_prompt_logprobs_through_chunked_prefill(tmp_path):
    """The echoed prompt's log-probabilities (completions echo + logprobs, max_tokens 0) are the
    logits of every prompt position, computed in chunks of 3 across the window's edge: each
    within twice the logits rule of the float64 reference's forward."""
    from serve_helpers import Server

    d = tmp_path / "ascii"
    cfg, t = ascii_checkpoint(d, seed=22, window=4)
    prompt = printable(14, 8)
    s = Server(d, "--tokenizer", "bytes", "--prefill-chunk", 3)
    try:
        status, body = post(s.port, {"prompt": prompt, "max_tokens": 0, "echo": True, "logprobs": 1})
    finally:
        s.stop()
    assert status == 200, body
    lps = body["choices"][0]["logprobs"]["token_logprobs"]
    assert len(lps) == len(prompt) and lps[0] is None
    toks = np.asarray([prompt], np.int64)
    l64, l32 = ref_logits(cfg, t, toks)[0], ref_logits(cfg, t, toks, torch.float32)[0]
    ref = log_softmax(l64)[np.arange(len(prompt) - 1), prompt[1:]]
    tol = 2 * hr.logits_bound(l64, l32) + 2.0 ** -22 * np.abs(ref).max()
    err = np.abs(np.asarray(lps[1:], np.float64) - ref).max()
    assert err <= tol, (err, tol)


# ------------------------------------------------------------------ 5. CLI

def test_cli_info_generate_and_bench(tmp_path):
    d = tmp_path / "ascii"
    cfg, t = ascii_checkpoint(d)
    info = mh.run_cli("info", d).stdout
    assert "phi4flash" in info.lower() or "sambay" in info.lower(), info
    assert "mamba" in info.lower(), info
    # the state a sequence holds, if the engine prints it: Mamba conv and scan states in F32,
    # the sliding windows' W positions and the YOCO layer's n positions of keys and values in
    # the cache's type (docs/models/phi4flash.md, "Memory per sequence", for n >= W)
    sec = info.split("state bytes per sequence", 1)
    assert len(sec) == 2, info
    rows = re.findall(r"^\s*(\d+)\s+([\d.]+)\s+([\d.]+)\s*$", sec[1].split("\n\n", 1)[0], re.M)
    assert rows, sec[1][:400]
    for n, f32, bf16 in rows:
        assert int(n) >= cfg["sliding_window"]
        el = R.state_elements(cfg, int(n))
        for got, es in ((float(f32), 4), (float(bf16), 2)):
            want = (4 * el["mamba"] + es * (el["swa"] + el["yoco_kv"])) / 2**20
            assert abs(got - want) <= 1e-3 + 1e-6 * want, (n, es, got, want)
    # generate: the byte prompt's greedy continuation, as the Python API gives it
    m = diffattn.load_model(str(d))
    prompt = "Phi-4 flash, longer than its window"
    ids = m.generate(list(prompt.encode()), 10, temperature=0.0)
    p = mh.run_cli("--threads", 1, "generate", "--model", d, "--tokenizer", "bytes", "--prompt", prompt,
                   "--max-new", 10, "--temperature", 0)
    assert p.stdout == prompt + bytes(ids).decode("latin-1") + "\n", (p.stdout, ids)
    b = mh.run_cli("generate", "--model", d, "--bench", 6, "--bench-prompt", 12, "--kv-dtype", "bf16")
    out = b.stdout + b.stderr
    assert "tokens/s" in out and re.search(r"prefill 12 tokens", out), out


def test_cli_generate_with_the_writers_tokenizer(tmp_path):
    """The writer's tiny directory holds the stand-in tokenizer.json: text in, text out."""
    d = tmp_path / "tiny"
    subprocess.run([sys.executable, os.path.join(ROOT, "bench", "make_hf_checkpoint.py"), "--out", str(d),
                    "--type", "phi4flash", "--shape", "tiny", "--dtype", "bf16"], check=True, capture_output=True)
    p = mh.run_cli("--threads", 1, "generate", "--model", d, "--prompt", "ab", "--max-new", 6,
                   "--temperature", 0)
    assert p.stdout.startswith("ab"), p.stdout


# ------------------------------------------------------------------ 6. clear errors

BAD = [
    (dict(mb_per_layer=3), "mb_per_layer"),
    (dict(num_hidden_layers=10), "num_hidden_layers"),
    (dict(mamba_dt_rank=8), "mamba_dt_rank"),        # ceil(32 / 16) = 2 is what the code uses
    (dict(mamba_conv_bias=False), "mamba_conv_bias"),
    (dict(mamba_proj_bias=True), "mamba_proj_bias"),
    (dict(hidden_act="gelu"), "hidden_act"),
    (dict(num_key_value_heads=1), "num_key_value_heads"),  # heads pair up: G even
]


@pytest.mark.parametrize("over,key", BAD)
def test_configs_the_engine_cannot_run_are_clear_errors(tmp_path_factory, over, key):
    """What phi4flash_reference.check_config refuses; the files are a valid 8-layer model, so the
    config is what the error must name."""
    src, cfg, _ = checkpoint(tmp_path_factory, 0)
    with pytest.raises(ValueError):  # the reference refuses it too
        R.check_config(dict(cfg, **over))
    d = tmp_path_factory.mktemp("bad")
    for f in os.listdir(src):
        os.symlink(os.path.join(src, f), d / f)
    os.remove(d / "config.json")
    json.dump(dict(cfg, **over), open(d / "config.json", "w"))
    with pytest.raises((ValueError, OSError, RuntimeError), match=key):
        diffattn.load_model(str(d))


def test_missing_wrong_and_extra_tensors_are_named(tmp_path):
    cfg = R.make_config(**CONFIGS[0])
    t = R.random_tensors(cfg, 3)
    gone = "model.layers.5.attn.inner_cross_attn.lambda_k2"
    write_checkpoint(str(tmp_path / "missing"), cfg, {k: v for k, v in t.items() if k != gone})
    with pytest.raises((OSError, ValueError, RuntimeError), match="layers.5.attn.inner_cross_attn.lambda_k2"):
        diffattn.load_model(str(tmp_path / "missing"))
    bad = dict(t)
    bad["model.layers.4.attn.x_proj.weight"] = torch.zeros(7, 64, dtype=torch.float64)
    write_checkpoint(str(tmp_path / "shape"), cfg, bad)
    with pytest.raises((OSError, ValueError, RuntimeError), match="layers.4.attn.x_proj.weight"):
        diffattn.load_model(str(tmp_path / "shape"))
    extra = dict(t, **{"model.layers.2.attn.extra_weight": torch.zeros(3, dtype=torch.float64)})
    write_checkpoint(str(tmp_path / "extra"), cfg, extra)
    with pytest.raises((OSError, ValueError, RuntimeError), match="extra_weight"):
        diffattn.load_model(str(tmp_path / "extra"))


# ------------------------------------------------------------------ 7. training refused

def test_training_is_refused(tmp_path_factory):
    d, cfg, _ = checkpoint(tmp_path_factory, 0)
    m = diffattn.load_model(d)
    assert not m.trainable
    x = tokens(cfg, 1, 8)
    y = np.roll(x, -1, axis=1)
    with pytest.raises((ValueError, RuntimeError), match=r"(?i)inference"):
        m.gradients(x, y)
    with pytest.raises((ValueError, RuntimeError), match=r"(?i)inference"):
        m.loss(x, y)


def test_torch_load_names_what_runs_it(tmp_path_factory):
    """diffattn.torch.load has no module for the hybrid: its error says what runs it."""
    import diffattn.torch
    d, _, _ = checkpoint(tmp_path_factory, 0)
    with pytest.raises(ValueError, match=r"phi4flash.*load_model"):
        diffattn.torch.load(d)
