"""The Phi-4-mini-flash reference (phi4flash_reference.py) checked before any engine uses it: it
runs at scaled-down configs with the published layer pattern and windows shorter than the
sequences; its incremental decoder's state after N tokens equals a fresh prefill of N tokens and
its decode logits equal the parallel forward's; bench/make_hf_checkpoint.py --type phi4flash
writes files that the safetensors library loads with the names, shapes and dtypes the config
implies, and the reference on them equals the reference on the writer's in-memory values (F32
exactly, BF16 within its rounding); each deliberate mistake (window off by one, GMU memory from
the wrong layer or after the gate, lambda_init from the wrong index, DiffLlama's head halves)
moves the logits far beyond the accuracy rule.

Accuracy rule: two float64 computations of one function agree to float64 rounding, i.e. far below
err32, the difference between the same reference run in float32 and in float64."""

import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import phi4flash_reference as R

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIGS = [  # scaled down, published pattern: (layers, hidden, heads, kv heads, window)
    dict(layers=8, hidden=32, heads=4, kv_heads=2, window=5),
    dict(layers=8, hidden=48, heads=6, kv_heads=2, window=3, d_state=8),
    dict(layers=12, hidden=32, heads=4, kv_heads=4, window=4, d_conv=3),
]
T = 13


def case(i, seed=0):
    cfg = R.make_config(**CONFIGS[i])
    t = R.random_tensors(cfg, seed + 10 * i)
    toks = torch.randint(0, cfg["vocab_size"], (2, T), generator=torch.Generator().manual_seed(seed + i))
    return cfg, t, toks


_ERR32 = {}


def err32(cfg, t, toks):
    """The float32 reference's distance from the float64 one (memoised per case)."""
    key = (json.dumps(cfg, sort_keys=True), float(sum(v.sum() for v in t.values())), toks.numpy().tobytes())
    if key not in _ERR32:
        _ERR32[key] = _err32(cfg, t, toks)
    return _ERR32[key]


def _err32(cfg, t, toks):
    return (R.forward(cfg, t, toks, torch.float32).double() - R.forward(cfg, t, toks)).abs().max().item()


def test_layer_pattern_and_specs_follow_the_published_model():
    """At the published 32 layers: Mamba 0..16 even (16 is the memory layer), sliding window on
    1..15 odd, full attention on 17, GMU on 18..30 even, cross-attention on 19..31 odd; 434
    tensors and 3,852,562,944 parameters at the published shape."""
    cfg = dict(R.make_config(layers=32, hidden=2560, heads=40, kv_heads=20, inter=10240,
                             vocab=200064, window=512), max_position_embeddings=262144)
    k = R.layer_kinds(cfg)
    assert [i for i, x in enumerate(k) if x == "mamba"] == list(range(0, 16, 2))
    assert [i for i, x in enumerate(k) if x == "swa"] == list(range(1, 16, 2))
    assert k[16] == "memory" and k[17] == "full"
    assert [i for i, x in enumerate(k) if x == "gmu"] == list(range(18, 32, 2))
    assert [i for i, x in enumerate(k) if x == "cross"] == list(range(19, 32, 2))
    specs = R.tensor_specs(cfg)
    assert len(specs) == 434
    assert sum(int(np.prod(s)) for _, s, _ in specs) == 3_852_562_944
    shapes = dict((n, s) for n, s, _ in specs)
    assert shapes["model.layers.17.attn.Wqkv.weight"] == (5120, 2560)   # 40 q + 2 x 20 kv heads of 64
    assert shapes["model.layers.19.attn.Wqkv.weight"] == (2560, 2560)   # queries only
    assert shapes["model.layers.16.attn.x_proj.weight"] == (160 + 32, 5120)
    assert shapes["model.layers.18.attn.in_proj.weight"] == (5120, 2560)
    with pytest.raises(ValueError):
        R.make_config(layers=6)
    with pytest.raises(ValueError):
        R.Dims(dict(cfg, mamba_dt_rank=64))


@pytest.mark.parametrize("i", range(len(CONFIGS)))
def test_reference_runs_and_is_accurate(i):
    cfg, t, toks = case(i)
    l64 = R.forward(cfg, t, toks)
    assert l64.shape == (2, T, cfg["vocab_size"]) and torch.isfinite(l64).all()
    assert l64.abs().max() > 1.0 and l64.std() > 0.3      # logits are not flat
    e = err32(cfg, t, toks)
    assert 0 < e < 1e-4 * l64.abs().max()
    # causality: the logits of a prefix do not depend on what follows it
    assert (R.forward(cfg, t, toks[:, :7]) - l64[:, :7]).abs().max() <= 1e-6 * e


@pytest.mark.parametrize("i", range(len(CONFIGS)))
def test_decode_state_after_n_tokens_equals_prefill_of_n_tokens(i):
    cfg, t, toks = case(i)
    W = cfg["sliding_window"]
    l64 = R.forward(cfg, t, toks)
    e = err32(cfg, t, toks)
    for P in (1, W, W + 2):                   # prompts shorter than, equal to, longer than the window
        logits, st = R.prefill(cfg, t, toks[:, :P])
        assert (logits - l64[:, P - 1]).abs().max() <= 1e-6 * e
        for s in range(P, T):
            got = R.step(cfg, t, st, toks[:, s])
            assert (got - l64[:, s]).abs().max() <= 1e-6 * e, (P, s)
            if s not in (P, W - 1, W, T - 1):  # states compared where the window fills, and last
                continue
            _, fresh = R.prefill(cfg, t, toks[:, :s + 1])
            a, b = st.tensors(), fresh.tensors()
            assert a.keys() == b.keys() and st.pos == fresh.pos == s + 1
            for k in a:
                assert a[k].shape == b[k].shape, k
                assert (a[k] - b[k]).abs().max() <= 1e-9, (P, s, k)
        # the sliding caches hold min(N, W) positions: memory bounded by the window
        assert all(k.shape[1] == min(T, W) for k, _ in st.swa.values())
        assert st.kv[0].shape[1] == T


@pytest.mark.parametrize("i", range(len(CONFIGS)))
def test_chunked_prefill_equals_one_prefill(i):
    """Chunks that end before, at and after the window's edge, and a chunk longer than the window."""
    cfg, t, toks = case(i)
    W = cfg["sliding_window"]
    l64 = R.forward(cfg, t, toks)
    e = err32(cfg, t, toks)
    _, st = R.prefill(cfg, t, toks[:, :2])
    cuts = sorted({2, W - 1, W + 1, T} - {0, 1})
    for a, b in zip(cuts, cuts[1:]):
        got = R.extend(cfg, t, st, toks[:, a:b])
        assert (got - l64[:, b - 1]).abs().max() <= 1e-6 * e
    _, fresh = R.prefill(cfg, t, toks)
    x, y = st.tensors(), fresh.tensors()
    assert all((x[k] - y[k]).abs().max() <= 1e-9 for k in x)


def test_greedy_equals_argmax_of_forward():
    cfg, t, toks = case(0)
    g = R.greedy(cfg, t, toks[:, :4], 9)
    seq = torch.cat([toks[:, :4], g], 1)
    assert (R.forward(cfg, t, seq)[:, 3:-1].argmax(-1) == g).all()


def test_state_arithmetic_matches_the_state_tensors():
    cfg, t, toks = case(0)
    _, st = R.prefill(cfg, t, toks)
    n = R.state_elements(cfg, T)
    sizes = {k: v.numel() // 2 for k, v in st.tensors().items()}   # batch of 2
    assert n["yoco_kv"] == sizes["kv.k"] + sizes["kv.v"]
    assert n["mamba"] == sum(v for k, v in sizes.items() if k.endswith((".conv", ".ssm")))
    assert n["swa"] == sum(v for k, v in sizes.items() if k.endswith((".k", ".v")) and not k.startswith("kv"))


@pytest.mark.parametrize("mistake", R.MISTAKES)
def test_each_mistake_moves_the_logits_beyond_the_accuracy_rule(mistake):
    cfg, t, toks = case(0)
    l64 = R.forward(cfg, t, toks)
    e = err32(cfg, t, toks)
    d = (R.forward(cfg, t, toks, mistake=mistake) - l64).abs().max().item()
    assert d > 1e4 * e and d > 1e-2, (mistake, d, e)


# ------------------------------------------------------------------ the checkpoint writer

def _writer():
    spec = importlib.util.spec_from_file_location("make_hf_checkpoint",
                                                  os.path.join(ROOT, "bench", "make_hf_checkpoint.py"))
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


def _write(tmp, dtype, shards="2", seed="5"):
    subprocess.run([sys.executable, os.path.join(ROOT, "bench", "make_hf_checkpoint.py"), "--out", str(tmp),
                    "--type", "phi4flash", "--shape", "tiny", "--dtype", dtype, "--shards", shards,
                    "--seed", seed], check=True, capture_output=True)


def _load(d):
    from safetensors.torch import load_file
    files = sorted(f for f in os.listdir(d) if f.endswith(".safetensors"))
    out = {}
    for f in files:
        part = load_file(os.path.join(d, f))
        assert not set(part) & set(out)
        out.update(part)
    return files, out


def test_written_files_have_the_names_shapes_and_dtypes_the_config_implies(tmp_path):
    _write(tmp_path, "bf16")
    cfg = json.load(open(tmp_path / "config.json"))
    assert cfg["model_type"] == "phi4flash" and cfg["sliding_window"] < T
    files, got = _load(tmp_path)
    assert files == ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    specs = R.tensor_specs(cfg)
    assert set(got) == {n for n, _, _ in specs}
    for name, shape, kind in specs:
        assert tuple(got[name].shape) == shape, name
        want = torch.float32 if kind in ("A_log", "lambda") else torch.bfloat16
        assert got[name].dtype == want, name
    index = json.load(open(tmp_path / "model.safetensors.index.json"))
    assert index["metadata"]["total_size"] == sum(v.numel() * v.element_size() for v in got.values())
    second = {n for n, f in index["weight_map"].items() if f.endswith("00002-of-00002.safetensors")}
    assert second == {n for n in got if n.startswith("model.final_layernorm")
                      or (n.startswith("model.layers.") and int(n.split(".")[2]) >= 6)}
    tc = json.load(open(tmp_path / "tokenizer_config.json"))
    assert "<|assistant|>" in tc["chat_template"]
    gen = json.load(open(tmp_path / "generation_config.json"))
    assert gen["eos_token_id"] == [cfg["eos_token_id"]]
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    assert tok.get_vocab_size() == cfg["vocab_size"]
    assert tok.encode("ab<|endoftext|>").ids == [97, 98, cfg["eos_token_id"]]
    # the same seed gives the same bytes; one shard holds the same tensors
    _write(tmp_path / "again", "bf16")
    _write(tmp_path / "one", "bf16", shards="1")
    assert _load(tmp_path / "again")[1].keys() == got.keys()
    assert all(torch.equal(_load(tmp_path / "again")[1][k], got[k]) for k in got)
    files1, one = _load(tmp_path / "one")
    assert files1 == ["model.safetensors"] and all(torch.equal(one[k], got[k]) for k in got)


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_reference_from_written_files_equals_reference_on_memory(tmp_path, dtype):
    _write(tmp_path, dtype)
    cfg = json.load(open(tmp_path / "config.json"))
    mem = {k: torch.from_numpy(v).double() for k, v in _writer().flash_arrays(cfg, seed=5).items()}
    files = {k: v.double() for k, v in _load(tmp_path)[1].items()}
    toks = torch.randint(0, cfg["vocab_size"], (2, T), generator=torch.Generator().manual_seed(1))
    lf = R.forward(cfg, files, toks)
    lm = R.forward(cfg, mem, toks)
    assert lm.abs().max() > 0.5
    if dtype == "f32":
        assert torch.equal(lf, lm)
    else:
        # exactly the reference on the in-memory values rounded as the files store them ...
        keep = {k for k, _, kind in R.tensor_specs(cfg) if kind in ("A_log", "lambda")}
        rounded = {k: v if k in keep else v.to(torch.bfloat16).double() for k, v in mem.items()}
        assert torch.equal(lf, R.forward(cfg, rounded, toks))
        # ... and within BF16's rounding of the unrounded values: relative RMS error a few 2^-8
        rel = ((lf - lm).pow(2).mean() / lm.pow(2).mean()).sqrt().item()
        assert 0 < rel < 2 ** -5, rel
