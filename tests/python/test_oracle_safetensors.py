"""The `safetensors` library as the oracle of diffattn's safetensors files, both ways:

- what diffattn writes (a trained model and its resume point from `diffattn train`, the
  project's format at F32, BF16 and F16 from `diffattn convert --to diffattn`, Hugging Face
  shards from `convert --to hf`, diffattn.torch.save) loads in the library, through NumPy and
  through PyTorch (BF16 through PyTorch), with the values diffattn reads, bit for bit;
- what the library writes (safetensors.numpy.save_file and safetensors.torch.save_file, F32,
  F16 and BF16, with and without metadata) loads in diffattn with the library's values."""

import json
import os

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.numpy import load_file as np_load
from safetensors.numpy import save_file as np_save
from safetensors.torch import load_file as torch_load
from safetensors.torch import save_file as torch_save

import diffattn
import diffattn.torch as dt
import model_helpers as mh
import torch_model as tm

CFG = {"format": "diffattn/1", "attention": "diff_v1", "vocab_size": 64, "d_model": 32,
       "n_layers": 2, "n_heads": 2, "n_kv_heads": 1, "head_dim": 8, "ffn_dim": 48,
       "max_seq_len": 32, "rope_theta": 10000.0, "norm_eps": 1e-5, "tie_embeddings": False}


def library_tensors(path):
    """{name: float64 array} through PyTorch (every dtype, BF16 included), and the same through
    NumPy where NumPy has the dtype; both must agree."""
    via_torch = {k: v.to(torch.float64).numpy() for k, v in torch_load(str(path)).items()}
    with safe_open(str(path), framework="pt") as f:
        dtypes = {k: f.get_slice(k).get_dtype() for k in f.keys()}
    if "BF16" not in dtypes.values():
        via_np = np_load(str(path))
        assert set(via_np) == set(via_torch)
        for k, v in via_np.items():
            assert np.array_equal(v.astype(np.float64), via_torch[k]), k
    return via_torch, dtypes


def ours(model_dir):
    return {k: v.astype(np.float64) for k, v in diffattn.load_model(str(model_dir)).parameters().items()}


@pytest.mark.parametrize("dtype", ["f32", "bf16", "f16"])
def test_convert_output_loads_in_the_library(tmp_path, dtype):
    src, out = tmp_path / "src", tmp_path / dtype
    tm.save_model_dir(str(src), CFG, tm.random_weights(CFG, 3))
    mh.run_cli("convert", "--model", src, "--to", "diffattn", "--out", out, "--dtype", dtype)
    lib, dtypes = library_tensors(out / "model.safetensors")
    want = {"f32": "F32", "bf16": "BF16", "f16": "F16"}[dtype]
    assert set(dtypes.values()) == {want}
    mine = ours(out)
    assert set(lib) == set(mine)
    for k in mine:
        assert np.array_equal(lib[k], mine[k]), k


def test_training_files_load_in_the_library(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(mh.corpus_text(240))
    out = tmp_path / "run"
    mh.run_cli("--threads", 1, "train", "--out", out, "--corpus", corpus, "--steps", 2,
               "--batch", 2, "--seq-len", 32, "--no-progress", "--preset", "tiny")
    lib, _ = library_tensors(out / "model.safetensors")
    mine = ours(out)
    assert set(lib) == set(mine)
    for k in mine:
        assert np.array_equal(lib[k], mine[k]), k
    state, _ = library_tensors(out / "train_state.safetensors")
    assert any(k.startswith("adamw.m.") for k in state) and any(k.startswith("adamw.v.") for k in state)
    with safe_open(str(out / "train_state.safetensors"), framework="pt") as f:
        meta = f.metadata()
    assert meta and int(meta["step"]) == 2


def test_hf_shards_load_in_the_library(tmp_path):
    src, out = tmp_path / "src", tmp_path / "hf"
    tm.save_model_dir(str(src), CFG, tm.random_weights(CFG, 4))
    mh.run_cli("convert", "--model", src, "--to", "hf", "--out", out, "--dtype", "bf16",
               "--shards", 3)
    with open(out / "model.safetensors.index.json") as f:
        index = json.load(f)["weight_map"]
    seen = {}
    for shard in sorted(set(index.values())):
        tensors, dtypes = library_tensors(out / shard)
        assert set(dtypes.values()) == {"BF16"}
        for k in tensors:
            assert index[k] == shard, k
        seen.update(tensors)
    assert set(seen) == set(index)


def test_torch_save_loads_in_the_library(tmp_path):
    tm.save_model_dir(str(tmp_path / "src"), CFG, tm.random_weights(CFG, 5))
    module = dt.load(tmp_path / "src")
    dt.save(module, tmp_path / "saved")
    lib, _ = library_tensors(tmp_path / "saved" / "model.safetensors")
    for name, p in module.named_parameters():
        assert np.array_equal(lib[name], p.detach().double().numpy()), name


@pytest.mark.parametrize("how", ["numpy-f32", "numpy-f16", "torch-f32", "torch-bf16",
                                 "torch-f16-metadata"])
def test_library_files_load_in_diffattn(tmp_path, how):
    weights = tm.random_weights(CFG, 6)
    d = tmp_path / how
    os.makedirs(d)
    with open(d / "config.json", "w") as f:
        json.dump(CFG, f)
    kind, dtype = how.split("-")[:2]
    if kind == "numpy":
        arrays = {k: np.asarray(v, {"f32": np.float32, "f16": np.float16}[dtype])
                  for k, v in weights.items()}
        np_save(arrays, str(d / "model.safetensors"))
        want = {k: v.astype(np.float64) for k, v in arrays.items()}
    else:
        td = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}[dtype]
        tensors = {k: torch.as_tensor(np.asarray(v)).to(td).contiguous() for k, v in weights.items()}
        meta = {"format": "pt", "note": "written by the safetensors library"} if "metadata" in how else None
        torch_save(tensors, str(d / "model.safetensors"), metadata=meta)
        want = {k: v.to(torch.float64).numpy() for k, v in tensors.items()}
    mine = ours(d)
    assert set(mine) == set(want)
    for k in want:
        assert np.array_equal(mine[k], want[k]), k
