"""The Motif-2 reference (motif_reference.py) and the random checkpoints of
bench/make_hf_checkpoint.py checked before any loader uses them: both layouts run at scaled-down
configs; the writer's files load with the safetensors library under the published names and
shapes; the reference on the written files equals the reference on the writer's in-memory
tensors (F32 exactly, BF16 after its rounding); and each plausible layout mistake moves the
logits far outside the accuracy rule, so the reference can tell. The cross-checks against the
published modeling code (docs/models/motif2.md, "Checked against") are not rerun here: they need
the saved third-party sources, which the repository does not hold."""

import importlib.util
import json
import math
import os

import numpy as np
import pytest
import torch

import motif_reference as mr

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _bench():
    spec = importlib.util.spec_from_file_location("make_hf_checkpoint", os.path.join(ROOT, "bench", "make_hf_checkpoint.py"))
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


def case(shape, seed=3, T=11):
    cfg = mr.make_config(shape)
    t = mr.random_tensors(cfg, seed)
    toks = np.random.default_rng(seed).integers(0, cfg["vocab_size"], (2, T))
    return cfg, t, toks


@pytest.mark.parametrize("shape", sorted(mr.TINY))
def test_both_layouts_run_with_meaningful_logits(shape):
    cfg, t, toks = case(shape)
    l64 = mr.logits(cfg, t, toks)
    l32 = mr.logits(cfg, t, toks, torch.float32)
    assert l64.shape == (2, 11, cfg["vocab_size"]) and np.isfinite(l64).all()
    assert np.abs(l64).max() > 1.0 and l64.std() > 0.3  # not flat: every mistake below shows
    assert np.abs(l32 - l64).max() < 1e-5 * np.abs(l64).max()  # float32 stays close: a sane rule
    # causality: the first 6 positions do not see the last 5 tokens
    toks2 = toks.copy()
    toks2[:, 6:] = (toks2[:, 6:] + 1) % cfg["vocab_size"]
    assert np.array_equal(mr.logits(cfg, t, toks2)[:, :6], l64[:, :6])


def test_head_layout_of_both_models():
    # Motif-2.6B: adjacent query pairs (2g signal, 2g+1 noise), GQA over key/value pairs
    assert mr.head_layout(mr.make_config("2.6b")) == [([0], 1, 0), ([2], 3, 1)]
    assert mr.head_layout(mr.make_config("2.6b-gqa")) == [([0], 1, 0), ([2], 3, 0), ([4], 5, 1), ([6], 7, 1)]
    # Motif-2-12.7B at full size: 8 groups of 4 signal heads + 1 noise head, group g on pair g
    full = mr.make_config("12.7b", size="full")
    lay = mr.head_layout(full)
    assert len(lay) == 8 and lay[3] == ([15, 16, 17, 18], 19, 3)
    assert mr.tensor_shapes(full)["model.layers.0.self_attn.o_proj.weight"] == (4096, 8192)
    assert mr.tensor_shapes(full)["model.layers.0.self_attn.q_proj.weight"] == (5120, 4096)
    assert mr.tensor_shapes(full)["model.layers.0.self_attn.v_proj.weight"] == (2048, 4096)
    # two groups per key/value pair when there are fewer pairs than noise heads
    assert [j for _, _, j in mr.head_layout(mr.make_config("12.7b-shared-kv"))] == [0, 0, 1, 1]
    # published parameter counts: 2.60 B (tied) and 12.70 B (untied, 643 tensors)
    n = {s: sum(math.prod(v) for v in mr.tensor_shapes(mr.make_config(s, size="full")).values()) for s in mr.PUBLISHED}
    assert n == {"2.6b": 2597218432, "12.7b": 12703860896}
    assert len(mr.tensor_shapes(full)) == 643


def test_lambda_init_is_motifs_index_convention():
    assert mr.lambda_init(1) == pytest.approx(0.2)  # the paper's first layer value lands on index 1
    assert mr.lambda_init(0) == pytest.approx(0.8 - 0.6 * math.exp(0.3))  # -0.0099: index 0 < 0
    assert mr.lambda_init(0) < 0 < mr.lambda_init(2)


def test_noise_map_computed_once_per_group_and_maps_are_distributions():
    cfg, t, toks = case("12.7b")
    maps = {}
    with torch.no_grad():
        P = mr.params(t)
        x = P["model.embed_tokens.weight"][torch.as_tensor(toks)]
        mr.attention(cfg, 1, P, x, maps=maps)
    noise = [k for k in maps if k[1] == "noise"]
    signal = [k for k in maps if k[1] == "signal"]
    assert len(noise) == cfg["num_noise_heads"] and len(signal) == cfg["num_attention_heads"] - cfg["num_noise_heads"]
    for A in maps.values():  # causal rows that sum to one
        assert torch.allclose(A.sum(-1), torch.ones((), dtype=A.dtype))
        assert (A.triu(1) == 0).all()


@pytest.mark.parametrize("shape", ["2.6b", "12.7b"])
def test_greedy_by_recomputation(shape):
    cfg, t, _ = case(shape, seed=7)
    prompt = [5, 17, 42, 8]
    ids, steps = mr.greedy(cfg, t, prompt, 4)
    assert len(ids) == 4 and len(steps) == 4
    full = mr.logits(cfg, t, np.array([prompt + ids]))[0]
    assert [int(np.argmax(full[len(prompt) - 1 + i])) for i in range(4)] == ids  # one full pass agrees
    P32 = mr.params(t, torch.float32)
    seq = list(prompt)
    with torch.no_grad():
        for _ in range(4):
            seq.append(int(torch.argmax(mr.forward(cfg, P32, torch.tensor([seq]))[0, -1])))
    mr.check_greedy(seq[len(prompt):], ids, steps, f"{shape} float32 greedy")


# ------------------------------------------------------------------ the writer


@pytest.mark.parametrize("kind,dtype,shards", [("motif2-2.6b", "F32", 1), ("motif2-12.7b", "BF16", 3),
                                               ("motif2-12.7b", "F32", 2), ("motif2-2.6b", "BF16", 1)])
def test_writer_files_load_with_safetensors(tmp_path, kind, dtype, shards):
    from safetensors import safe_open

    b = _bench()
    b.write_motif(str(tmp_path), kind, "tiny", dtype, shards, seed=4)
    shape = kind.split("-")[1]
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg == mr.make_config(shape, torch_dtype=b.TORCH_DTYPE[dtype])  # the writer and the reference agree
    want = mr.tensor_shapes(cfg)
    files = sorted(os.listdir(tmp_path))
    if shards == 1:
        assert "model.safetensors" in files and "model.safetensors.index.json" not in files
        weight_map = {n: "model.safetensors" for n in want}
    else:
        idx = json.loads((tmp_path / "model.safetensors.index.json").read_text())
        weight_map = idx["weight_map"]
        assert sorted(set(weight_map.values())) == [f"model-{i:05d}-of-{shards:05d}.safetensors" for i in range(1, shards + 1)]
        assert idx["metadata"]["total_size"] == sum(math.prod(s) for s in want.values()) * (4 if dtype == "F32" else 2)
    assert set(weight_map) == set(want)
    found = {}
    torch_dtype = {"F32": torch.float32, "BF16": torch.bfloat16}[dtype]
    for fn in set(weight_map.values()):
        with safe_open(str(tmp_path / fn), framework="pt") as f:
            assert f.metadata() == {"format": "pt"}
            for n in f.keys():
                assert weight_map[n] == fn
                x = f.get_tensor(n)
                assert x.dtype == torch_dtype and tuple(x.shape) == want[n], n
                found[n] = x
    assert set(found) == set(want)
    gen = json.loads((tmp_path / "generation_config.json").read_text())
    assert gen["eos_token_id"] == cfg["eos_token_id"]


@pytest.mark.parametrize("kind,dtype,shards", [("motif2-2.6b", "F32", 1), ("motif2-12.7b", "F32", 2),
                                               ("motif2-2.6b", "BF16", 1), ("motif2-12.7b", "BF16", 3)])
def test_reference_on_written_files_equals_reference_in_memory(tmp_path, kind, dtype, shards):
    b = _bench()
    b.write_motif(str(tmp_path), kind, "tiny", dtype, shards, seed=9)
    cfg, stored = mr.read_checkpoint(str(tmp_path))
    mem = b.motif_arrays(cfg, seed=9)
    toks = np.random.default_rng(2).integers(0, cfg["vocab_size"], (2, 9))
    if dtype == "F32":
        for n in mem:
            assert np.array_equal(stored[n], mem[n]), n
        assert np.array_equal(mr.logits(cfg, stored, toks), mr.logits(cfg, mem, toks))
    else:
        rounded = {n: mr.round_to(a, "BF16")[1].reshape(a.shape) for n, a in mem.items()}
        for n in mem:
            assert np.array_equal(stored[n], rounded[n]), n  # round to nearest even, nothing else
            assert np.abs(stored[n] - mem[n]).max() <= 2.0**-8 * max(np.abs(mem[n]).max(), 1e-30), n
        assert np.array_equal(mr.logits(cfg, stored, toks), mr.logits(cfg, rounded, toks))


def test_writer_and_reference_agree_on_the_published_configs():
    b = _bench()
    for kind in ("motif2-2.6b", "motif2-12.7b"):
        for size in ("full", "tiny"):
            assert b.motif_config(kind, size, "BF16") == mr.make_config(kind.split("-")[1], size=size), (kind, size)
        c = b.motif_config(kind, "full", "BF16")
        assert [(n, s) for n, s, _ in b.motif_tensors_of(c)] == list(mr.tensor_shapes(c).items())


def test_writer_is_seeded(tmp_path):
    b = _bench()
    for d in ("a", "b"):
        b.write_motif(str(tmp_path / d), "motif2-12.7b", "tiny", "BF16", 2, seed=1)
    for f in ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors", "config.json"):
        assert (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes()


# ------------------------------------------------------------------ the reference can tell


def _mistake(cfg, t, how):
    """(tensors, attention keywords) with one deliberate layout mistake."""
    t = dict(t)
    kw = {}
    _, H, Hkv, d, G, P, _ = mr.dims(cfg)
    lay = mr.head_layout(cfg)
    if how == "query heads paired i, i + H/2 (DiffLlama)":
        kw["layout"] = [([g], g + H // 2, j) for g, (_, _, j) in enumerate(lay)]
    elif how == "lambda_init of index l, not l - 1":
        kw["li_of"] = lambda l: 0.8 - 0.6 * math.exp(-0.3 * l)
    elif how == "noise head first in its group":
        S = H // G
        kw["layout"] = [(list(range(g * S + 1, g * S + S)), g * S, j) for g, (_, _, j) in enumerate(lay)]
    elif how == "group g on pair g % P":
        kw["layout"] = [(s, n, g % P) for g, (s, n, _) in enumerate(lay)]
    elif how == "value halves swapped":
        for l in range(cfg["num_hidden_layers"]):
            v = t[f"model.layers.{l}.self_attn.v_proj.weight"].reshape(Hkv // 2, 2, d, -1)
            t[f"model.layers.{l}.self_attn.v_proj.weight"] = v[:, ::-1].reshape(Hkv * d, -1)
    elif how == "subln weight ignored":
        for l in range(cfg["num_hidden_layers"]):
            t[f"model.layers.{l}.self_attn.subln.weight"] = np.ones(2 * d, np.float32)
    elif how == "PolyNorm weights reversed":
        for l in range(cfg["num_hidden_layers"]):
            t[f"model.layers.{l}.mlp.act_fn.weight"] = t[f"model.layers.{l}.mlp.act_fn.weight"][::-1].copy()
    return t, kw


def _logits_with(cfg, t, toks, kw):
    li_of = kw.pop("li_of", None)
    if li_of is None:
        return mr.logits(cfg, t, toks, **kw)
    # lambda_init is per layer: patch it for this one computation
    saved = mr.lambda_init
    mr.lambda_init = li_of
    try:
        return mr.logits(cfg, t, toks, **kw)
    finally:
        mr.lambda_init = saved


MISTAKES = {
    "2.6b": ["query heads paired i, i + H/2 (DiffLlama)", "lambda_init of index l, not l - 1",
             "value halves swapped", "subln weight ignored", "PolyNorm weights reversed"],
    "12.7b": ["noise head first in its group", "lambda_init of index l, not l - 1", "value halves swapped",
              "subln weight ignored"],
    "12.7b-shared-kv": ["group g on pair g % P"],
}


@pytest.mark.parametrize("shape,how", [(s, h) for s, hs in MISTAKES.items() for h in hs])
def test_a_layout_mistake_is_far_outside_the_accuracy_rule(shape, how):
    cfg, t, toks = case(shape)
    l64 = mr.logits(cfg, t, toks)
    l32 = mr.logits(cfg, t, toks, torch.float32)
    tm, kw = _mistake(cfg, t, how)
    bad = _logits_with(cfg, tm, toks, kw)
    assert np.abs(bad - l64).max() > 1000 * mr.logits_bound(l64, l32), how
