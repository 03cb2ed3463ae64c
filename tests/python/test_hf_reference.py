"""The Hugging Face reference (hf_reference.py) checked before any loader uses it: mapped by
hf_to_project onto diffattn/1, a Llama checkpoint is a `standard` model and a DiffLlama one a
`diff_v1` model with the same logits, computed by the independent PyTorch model of FORMAT.md
(torch_model.py) and by the C++ library; a wrong mapping is caught; llama3 frequencies, BF16
rounding and the checkpoint writer are checked against hand computations."""

import json
import math
import os

import numpy as np
import pytest
import torch

import hf_reference as hr
import torch_model as tm

SHAPES = [  # model, H, Hkv, head_dim (None: hidden / H)
    ("llama", 4, 4, None), ("llama", 4, 2, None), ("llama", 4, 1, 16),
    ("diffllama", 4, 4, None), ("diffllama", 4, 2, None), ("diffllama", 8, 4, None),
    ("diffllama", 8, 2, 12),
]


def case(model, H, G, hd, tied=False, seed=3):
    cfg = hr.make_config(model, hidden=32, heads=H, kv_heads=G, head_dim=hd, vocab=80, tied=tied)
    t = hr.random_tensors(cfg, seed)
    toks = np.random.default_rng(seed).integers(0, 80, (2, 11))
    return cfg, t, toks


@pytest.mark.parametrize("model,H,G,hd", SHAPES)
def test_mapping_onto_the_project_format_gives_the_same_logits(model, H, G, hd):
    cfg, t, toks = case(model, H, G, hd, tied=(H == G))
    l64 = hr.logits(cfg, t, toks)
    l32 = hr.logits(cfg, t, toks, torch.float32)
    pc, pt = hr.hf_to_project(cfg, t)
    assert pc["attention"] == ("diff_v1" if model == "diffllama" else "standard")
    with torch.no_grad():
        lp = tm.forward(pc, tm.params_from(pt), torch.as_tensor(toks)).numpy()
    # two float64 computations of one function: agreement to float64 rounding, far below the
    # float32 error that sets every other tolerance
    assert np.abs(lp - l64).max() <= 1e-6 * np.abs(l32 - l64).max()
    assert np.abs(l32 - l64).max() < 1e-5 * np.abs(l64).max()
    assert np.abs(l64).max() > 1.0 and l64.std() > 0.3  # logits are not flat


def _mutated(cfg, t, how):
    """A mapping with one deliberate mistake, to show the comparison notices each."""
    pc, pt = hr.hf_to_project(cfg, t)
    H, G, d = cfg["num_attention_heads"], cfg["num_key_value_heads"], hr.head_dim_of(cfg)
    pt = dict(pt)
    q = t["model.layers.1.self_attn.q_proj.weight"]
    if how == "no RoPE permutation":
        order = [h for i in range(H // 2) for h in (i, i + H // 2)]
        pt["layers.1.attn.q_proj.weight"] = hr._heads_rows(q, H, d, order, False)
    elif how == "adjacent query heads paired":
        pt["layers.1.attn.q_proj.weight"] = hr._heads_rows(q, H, d, list(range(H)), True)
    elif how == "value halves not concatenated":
        v = t["model.layers.1.self_attn.v_proj.weight"]
        pt["layers.1.attn.v_proj.weight"] = hr._heads_rows(v, G, d, list(range(G)), False)
    elif how == "lambda_init of layer 0":
        pc = dict(pc, lambda_init=hr.lambda_init(0))
    elif how == "RMSNorm gain of layer 1 dropped":
        pt["layers.1.ffn_norm.weight"] = np.ones_like(pt["layers.1.ffn_norm.weight"])
    return pc, pt


@pytest.mark.parametrize("how", ["no RoPE permutation", "adjacent query heads paired",
                                 "value halves not concatenated", "lambda_init of layer 0",
                                 "RMSNorm gain of layer 1 dropped"])
def test_a_wrong_mapping_is_far_outside_the_tolerance(how):
    cfg, t, toks = case("diffllama", 8, 4, None)
    l64 = hr.logits(cfg, t, toks)
    l32 = hr.logits(cfg, t, toks, torch.float32)
    pc, pt = _mutated(cfg, t, how)
    with torch.no_grad():
        lp = tm.forward(pc, tm.params_from(pt), torch.as_tensor(toks)).numpy()
    assert np.abs(lp - l64).max() > 1000 * hr.logits_bound(l64, l32), how


def test_cpp_runs_the_mapped_checkpoint_with_the_reference_logits(tmp_path):
    diffattn = pytest.importorskip("diffattn")
    for model, H, G, hd in SHAPES:
        cfg, t, toks = case(model, H, G, hd, tied=(H == G))
        l64 = hr.logits(cfg, t, toks)
        l32 = hr.logits(cfg, t, toks, torch.float32)
        pc, pt = hr.hf_to_project(cfg, t)
        d = tmp_path / f"{model}-{H}-{G}-{hd}"
        tm.save_model_dir(str(d), pc, pt)
        got = diffattn.load_model(str(d)).forward(toks.astype(np.int64))
        hr.check_logits(got, l64, l32, f"{model} H={H} Hkv={G} head_dim={hd}")


def test_llama3_frequencies_by_hand():
    cfg = hr.make_config("llama", hidden=256, heads=2, kv_heads=2, theta=500000.0,
                         scaling=hr.LLAMA3_SCALING)
    d = 128
    f = hr.inv_freq(cfg, d).numpy()
    L, lo, hi, factor = 8192, 1.0, 4.0, 8.0
    bands = set()
    for j in range(d // 2):
        base = 500000.0 ** (-2 * j / d)
        wl = 2 * math.pi / base
        if wl < L / hi:
            want, band = base, "high"
        elif wl > L / lo:
            want, band = base / factor, "low"
        else:
            s = (L / wl - lo) / (hi - lo)
            want, band = (1 - s) * base / factor + s * base, "medium"
        bands.add(band)
        assert f[j] == pytest.approx(want, rel=1e-12), (j, band)
    assert bands == {"high", "medium", "low"}
    # every spelling of the same scaling gives the same frequencies
    for sp in ("4.x", "4.x-type", "5.x"):
        assert np.array_equal(hr.inv_freq(hr.respell(cfg, sp), d).numpy(), f), sp
    assert np.array_equal(hr.inv_freq(hr.respell(hr.make_config(), "5.x"), 8).numpy(),
                          hr.inv_freq(hr.make_config(), 8).numpy())


def test_bf16_rounds_to_nearest_even():
    ulp = 2.0**-7  # bf16 spacing at 1
    x = np.array([1 + ulp / 2, 1 + 1.5 * ulp, 1 + ulp / 2 + 2**-20, -(1 + ulp / 2 - 2**-20), 3.0e38],
                 dtype=np.float32)
    _, back = hr.round_to(x, "BF16")
    assert back[:4].tolist() == [1.0, 1 + 2 * ulp, 1 + ulp, -1.0]  # ties go to the even mantissa
    assert np.isfinite(back[4]) and abs(back[4] / x[4] - 1) <= 2.0**-8
    _, h = hr.round_to(np.array([1 + 2.0**-11], np.float32), "F16")
    assert h[0] == 1.0


@pytest.mark.parametrize("dtype,shards,spelling", [("F32", 1, "4.x"), ("BF16", 3, "5.x"), ("F16", 2, "4.x-type")])
def test_writer_reads_back_what_the_reference_uses(tmp_path, dtype, shards, spelling):
    cfg = hr.make_config("diffllama", tied=True, scaling=hr.LLAMA3_SCALING)
    t = hr.random_tensors(cfg, 1)
    stored = hr.write_hf_checkpoint(str(tmp_path), cfg, t, dtype=dtype, shards=shards, rope_spelling=spelling)
    files = sorted(os.listdir(tmp_path))
    if shards == 1:
        found, _ = tm.read_safetensors(str(tmp_path / "model.safetensors"))
        assert "model.safetensors.index.json" not in files
    else:
        idx = json.loads((tmp_path / "model.safetensors.index.json").read_text())
        assert set(idx["weight_map"]) == set(t)
        assert sorted(set(idx["weight_map"].values())) == [f"model-{i:05d}-of-{shards:05d}.safetensors"
                                                            for i in range(1, shards + 1)]
        found, size = {}, 0
        for fn in set(idx["weight_map"].values()):
            part, _ = tm.read_safetensors(str(tmp_path / fn))
            assert all(idx["weight_map"][n] == fn for n in part)
            found.update(part)
            size += sum(a.size for a in part.values()) * (4 if dtype == "F32" else 2)
        assert idx["metadata"]["total_size"] == size
    assert set(found) == set(t) == set(hr.tensor_shapes(cfg))
    for n in t:
        assert np.array_equal(found[n], stored[n]), n
        if dtype != "F32":
            assert 0 < np.abs(stored[n] - t[n]).max() <= np.abs(t[n]).max() * 2.0**-8, n
    c = json.loads((tmp_path / "config.json").read_text())
    assert hr.rope_of(c) == hr.rope_of(cfg)
    assert ("rope_parameters" in c) == (spelling == "5.x")
    assert c.get("torch_dtype", c.get("dtype")) == hr.TORCH_DTYPE[dtype]
    g = json.loads((tmp_path / "generation_config.json").read_text())
    assert g["eos_token_id"] == cfg["eos_token_id"]
