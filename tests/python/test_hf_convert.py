"""`diffattn convert`: a model of the project's format written as a Hugging Face DiffLlama or
Llama directory and read back gives the same logits (V1's learned per-head norm weight folded
into o_proj; llama3 RoPE scaling, biases, GQA, tied embeddings, BF16 and shards carried), BF16
round trips are exact, and what DiffLlama cannot express is refused with the reason."""

import json
import os

import numpy as np
import pytest

import diffattn
import model_helpers as mh
import torch_model as tm


def write_model(path, cfg, seed=0):
    """Random weights (norms and subln away from 1, so a dropped or unfolded weight shows)."""
    tm.save_model_dir(path, cfg, tm.random_weights(cfg, seed, std=0.08, lam_std=0.3, gain_std=0.3, bias_std=0.3))
    return path


def config(kind, **extra):
    c = {"format": "diffattn/1", "attention": kind, "vocab_size": 97, "d_model": 48,
         "n_layers": 3, "n_heads": 4 if kind == "standard" else 2,
         "n_kv_heads": 2 if kind == "standard" else 1, "head_dim": 12, "ffn_dim": 72,
         "max_seq_len": 256, "rope_theta": 10000.0, "norm_eps": 1e-5, "tie_embeddings": False}
    c.update(extra)
    return c


CASES = [
    ("diff_v1", {}),
    ("diff_v1", {"tie_embeddings": True, "attention_bias": True,
                 "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                  "high_freq_factor": 4.0, "original_max_position_embeddings": 32}}),
    ("standard", {}),
    ("standard", {"attention_bias": True, "mlp_bias": True,
                  "rope_scaling": {"rope_type": "linear", "factor": 2.0}}),
]


@pytest.mark.parametrize("kind,extra", CASES)
def test_hf_round_trip_keeps_the_logits(tmp_path, kind, extra):
    src = write_model(str(tmp_path / "own"), config(kind, **extra))
    hf = tmp_path / "hf"
    mh.run_cli("convert", "--model", src, "--to", "hf", "--out", hf, "--shards", 3)
    j = json.loads((hf / "config.json").read_text())
    assert j["model_type"] == ("diffllama" if kind == "diff_v1" else "llama")
    assert (hf / "model.safetensors.index.json").exists()
    back = tmp_path / "back"
    mh.run_cli("convert", "--model", hf, "--to", "diffattn", "--out", back)
    tokens = np.random.default_rng(1).integers(0, 97, (2, 70))
    ref = diffattn.load_model(src).forward(tokens)
    m_hf = diffattn.load_model(str(hf))
    assert not m_hf.trainable and "memory-mapped" in m_hf.storage
    for got in (m_hf.forward(tokens), diffattn.load_model(str(back)).forward(tokens)):
        # Folding subln into o_proj rounds once per weight: a few float32 ulps of the logits.
        assert np.abs(got - ref).max() <= 1e-5 * np.abs(ref).max(), np.abs(got - ref).max()
    assert m_hf.generate([3, 1, 4, 1, 5], 12) == diffattn.load_model(src).generate([3, 1, 4, 1, 5], 12)


def test_bf16_round_trip_is_exact(tmp_path):
    src = write_model(str(tmp_path / "own"), config("diff_v1"))
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    mh.run_cli("convert", "--model", src, "--to", "hf", "--out", a, "--dtype", "bf16")
    mh.run_cli("convert", "--model", a, "--to", "diffattn", "--out", b)
    mh.run_cli("convert", "--model", b, "--to", "hf", "--out", c, "--dtype", "bf16")
    wa, _ = tm.read_safetensors(str(a / "model.safetensors"))
    wc, _ = tm.read_safetensors(str(c / "model.safetensors"))
    assert sorted(wa) == sorted(wc)
    for n in wa:
        assert np.array_equal(wa[n], wc[n]), n
    assert "BF16" in diffattn.load_model(str(a)).storage


NATIVE_CASES = [
    ("diff_v1", {"attention_bias": True}),
    ("diff_v2", {"n_kv_heads": 2}),
    ("diff_v2", {"tie_embeddings": True, "n_layers": 2}),
    ("standard", {"attention_bias": True, "mlp_bias": True}),
]


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
@pytest.mark.parametrize("kind,extra", NATIVE_CASES)
def test_sixteen_bit_project_format_runs_as_stored(tmp_path, kind, extra, dtype):
    """`convert --to diffattn --dtype bf16|f16` halves the file; loading it keeps the matrices in
    that type, memory-mapped (q|k|v, and V2's lambda_proj, stacked into one block), and gives the
    logits and greedy ids of a float32 model holding the same rounded weights."""
    src = write_model(str(tmp_path / "own"), config(kind, **extra))
    half, f32 = tmp_path / "half", tmp_path / "f32"
    mh.run_cli("convert", "--model", src, "--to", "diffattn", "--out", half, "--dtype", dtype)
    w, _ = tm.read_safetensors(str(half / "model.safetensors"))
    data = (half / "model.safetensors").read_bytes()
    raw = json.loads(data[8:8 + int.from_bytes(data[:8], "little")])
    assert {e["dtype"] for n, e in raw.items() if n != "__metadata__"} == {dtype.upper()}
    m = diffattn.load_model(str(half))
    assert not m.trainable and "memory-mapped" in m.storage and dtype.upper() in m.storage, m.storage
    # The oracle: a trainable float32 model of the same rounded weights.
    mh.run_cli("convert", "--model", half, "--to", "diffattn", "--out", f32)
    ref = diffattn.load_model(str(f32))
    assert ref.trainable
    got_w = m.parameters()
    for n, a in w.items():
        assert np.array_equal(got_w[n], a), n
    tokens = np.random.default_rng(2).integers(0, 97, (2, 70))
    want, got = ref.forward(tokens), m.forward(tokens)
    # Same weights and float32 accumulation; only the products' summation order differs.
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max(), np.abs(got - want).max()
    assert m.generate([3, 1, 4, 1, 5], 12) == ref.generate([3, 1, 4, 1, 5], 12)
    # and the file is about half the float32 one
    assert (half / "model.safetensors").stat().st_size < 0.55 * (f32 / "model.safetensors").stat().st_size


def test_sixteen_bit_project_format_errors_name_the_tensor(tmp_path):
    cfg = config("diff_v2", n_kv_heads=2)
    weights = tm.random_weights(cfg, 3)
    weights["layers.1.attn.lambda_proj.weight"][1, 2] = np.nan
    d = tm.save_model_dir(str(tmp_path / "nan"), cfg, weights, dtype="BF16")
    with pytest.raises(OSError, match=r"layers\.1\.attn\.lambda_proj\.weight.*NaN or Inf at flat index 50"):
        diffattn.load_model(d)
    # a 16-bit model is for inference; training it names the way out
    good = tm.save_model_dir(str(tmp_path / "good"), cfg, tm.random_weights(cfg, 3), dtype="F16")
    t = np.zeros((1, 4), dtype=np.int64)
    with pytest.raises(ValueError, match="convert --to diffattn"):
        diffattn.load_model(good).gradients(t, t)
    p = mh.run_cli("convert", "--model", good, "--to", "diffattn", "--out", tmp_path / "x", "--shards", 2,
                   check=False)
    assert p.returncode == 2 and "--shards applies to --to hf" in p.stderr


def test_what_diffllama_lacks_is_refused(tmp_path):
    v2 = write_model(str(tmp_path / "v2"), config("diff_v2", n_kv_heads=2))
    p = mh.run_cli("convert", "--model", v2, "--to", "hf", "--out", tmp_path / "x", check=False)
    assert p.returncode != 0 and "DIFF V2" in p.stderr
    fixed = write_model(str(tmp_path / "fixed"), config("diff_v1", lambda_init=0.5))
    p = mh.run_cli("convert", "--model", fixed, "--to", "hf", "--out", tmp_path / "y", check=False)
    assert p.returncode != 0 and "lambda_init" in p.stderr
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()


def test_training_a_kept_model_is_refused(tmp_path):
    src = write_model(str(tmp_path / "own"), config("standard"))
    hf = tmp_path / "hf"
    mh.run_cli("convert", "--model", src, "--to", "hf", "--out", hf, "--dtype", "bf16")
    m = diffattn.load_model(str(hf))
    t = np.zeros((1, 4), dtype=np.int64)
    with pytest.raises(ValueError, match="convert --to diffattn"):
        m.gradients(t, t)


@pytest.mark.parametrize("kind,extra", CASES)
def test_torch_load_of_a_hugging_face_directory(tmp_path, kind, extra):
    """diffattn.torch.load reads the directory through the C++ loader into PyTorch modules
    (RoPE scaling and biases included): its logits equal the C++ model's."""
    torch = pytest.importorskip("torch")
    import diffattn.torch as dt
    src = write_model(str(tmp_path / "own"), config(kind, **extra))
    hf = tmp_path / "hf"
    mh.run_cli("convert", "--model", src, "--to", "hf", "--out", hf, "--dtype", "bf16")
    tokens = np.random.default_rng(2).integers(0, 97, (2, 50))
    ref = diffattn.load_model(str(hf)).forward(tokens)
    with torch.no_grad():
        got = dt.load(str(hf))(torch.from_numpy(tokens)).numpy()
    assert np.abs(got - ref).max() <= 1e-4 * np.abs(ref).max(), np.abs(got - ref).max()


def test_rope_frequencies_agree_with_the_llama3_rule():
    """The Python scaling rule against the rule written out per frequency band (Llama 3.1)."""
    import diffattn.torch as dt
    sc = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 8192}
    f = dt.rope_frequencies(128, 500000.0, sc).numpy()
    base = 500000.0 ** (-np.arange(0, 128, 2) / 128.0)
    for got, b in zip(f, base):
        wl = 2 * np.pi / b
        if wl < 8192 / 4.0:
            assert got == pytest.approx(b, rel=1e-12)
        elif wl > 8192 / 1.0:
            assert got == pytest.approx(b / 8.0, rel=1e-12)
        else:
            s = (8192 / wl - 1.0) / 3.0
            assert got == pytest.approx((1 - s) * b / 8.0 + s * b, rel=1e-12)
    assert (f < base).any() and (f == base).any()


@pytest.mark.parametrize("kind", ["diff_v2", "diffllama", "llama"])
def test_make_hf_checkpoint_writes_loadable_models(tmp_path, kind):
    """bench/make_hf_checkpoint.py (the benchmarks' random 1B-shape checkpoints), at its small
    shape: each type loads memory-mapped in BF16 with the shape's parameter count, runs, and the
    same seed gives the same bytes."""
    import subprocess
    import sys
    script = os.path.join(mh.ROOT, "bench", "make_hf_checkpoint.py")
    for d in ("a", "b"):
        subprocess.run([sys.executable, script, "--out", str(tmp_path / d), "--type", kind,
                        "--shape", "small", "--dtype", "bf16"], check=True, capture_output=True)
    assert (tmp_path / "a" / "model.safetensors").read_bytes() == (tmp_path / "b" / "model.safetensors").read_bytes()
    m = diffattn.load_model(str(tmp_path / "a"))
    assert not m.trainable and "BF16" in m.storage and "memory-mapped" in m.storage, m.storage
    C, F, V, L, H, G, d = 512, 1408, 32000, 4, 8, 4, 64
    q = 2 * H * d if kind == "diff_v2" else H * d
    per_layer = C * (q + 2 * G * d) + C * H * d + 3 * C * F + 2 * C
    per_layer += H * C if kind == "diff_v2" else 0
    per_layer += (4 * d + 2 * d) if kind == "diffllama" else 0  # lambdas, subln (ones)
    assert m.num_params == 2 * V * C + L * per_layer + C, (m.num_params, kind)
    assert np.isfinite(m.forward(np.array([[1, 2, 3, 4]]))).all()
