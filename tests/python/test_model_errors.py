"""Bad model directories and bad inputs give clear errors naming the file and the tensor or
key (docs/FORMAT.md): truncated and corrupted safetensors, wrong shapes, missing and extra
tensors, unknown config keys; and bad token arrays are ValueErrors naming the argument."""

import json
import struct

import numpy as np
import pytest

import diffattn
import torch_model as tm


def cfg(kind="diff_v1", **kw):
    c = {"format": "diffattn/1", "attention": kind, "vocab_size": 40, "d_model": 16,
         "n_layers": 1, "n_heads": 2 if kind == "diff_v1" else 4, "n_kv_heads": 2,
         "head_dim": 4, "ffn_dim": 24, "max_seq_len": 16, "rope_theta": 10000.0,
         "norm_eps": 1e-5, "tie_embeddings": False}
    c.update(kw)
    return c


@pytest.fixture
def model_dir(tmp_path):
    c = cfg()
    tm.save_model_dir(str(tmp_path), c, tm.random_weights(c, 1))
    return tmp_path


def test_good_directory_loads(model_dir):
    m = diffattn.load_model(str(model_dir))
    assert m.num_params == sum(int(np.prod(s)) for s in tm.tensor_shapes(cfg()).values())


def test_truncated_file(model_dir):
    f = model_dir / "model.safetensors"
    data = f.read_bytes()
    f.write_bytes(data[:-10])
    with pytest.raises(OSError, match=r"model\.safetensors: tensor \".*\": data_offsets .* outside"):
        diffattn.load_model(str(model_dir))
    f.write_bytes(data[:5])
    with pytest.raises(OSError, match="truncated"):
        diffattn.load_model(str(model_dir))
    f.write_bytes(data[:40])
    with pytest.raises(OSError, match="header length .* exceeds"):
        diffattn.load_model(str(model_dir))


def test_corrupted_header(model_dir):
    f = model_dir / "model.safetensors"
    data = bytearray(f.read_bytes())
    data[8:12] = b"\x00\xff{["
    f.write_bytes(bytes(data))
    with pytest.raises(OSError, match=r"model\.safetensors: corrupted safetensors header"):
        diffattn.load_model(str(model_dir))


def test_unsupported_dtype(model_dir):
    f = model_dir / "model.safetensors"
    data = f.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = data[8:8 + n].replace(b'"F32"', b'"I32"', 1)
    f.write_bytes(data[:8] + header + data[8 + n:])
    with pytest.raises(OSError, match="dtype I32 is not supported"):
        diffattn.load_model(str(model_dir))


def test_wrong_shape(tmp_path):
    c = cfg()
    w = tm.random_weights(c, 1)
    w["layers.0.attn.k_proj.weight"] = np.zeros((8, 16), np.float32)
    tm.save_model_dir(str(tmp_path), c, w)
    with pytest.raises(OSError, match=r"tensor \"layers\.0\.attn\.k_proj\.weight\" has shape \(8, 16\), the config implies \(16, 16\)"):
        diffattn.load_model(str(tmp_path))


def test_missing_and_extra_tensors(tmp_path):
    c = cfg("diff_v2")
    w = tm.random_weights(c, 1)
    del w["layers.0.attn.lambda_proj.weight"]
    tm.save_model_dir(str(tmp_path), c, w)
    with pytest.raises(OSError, match=r"missing tensor \"layers\.0\.attn\.lambda_proj\.weight\""):
        diffattn.load_model(str(tmp_path))
    w = tm.random_weights(c, 1)
    w["layers.0.attn.subln.weight"] = np.ones(8, np.float32)
    tm.save_model_dir(str(tmp_path), c, w)
    with pytest.raises(OSError, match=r"extra tensor \"layers\.0\.attn\.subln\.weight\""):
        diffattn.load_model(str(tmp_path))
    # tied embeddings: lm_head.weight must be absent
    c = cfg(tie_embeddings=True)
    w = tm.random_weights(cfg(), 1)
    tm.save_model_dir(str(tmp_path), c, w)
    with pytest.raises(OSError, match=r"extra tensor \"lm_head\.weight\".*tie_embeddings"):
        diffattn.load_model(str(tmp_path))


@pytest.mark.parametrize("change,pattern", [
    ({"n_experts": 4}, r"config\.json: unknown key \"n_experts\""),
    ({"format": "diffattn/2"}, r"\"format\" is \"diffattn/2\""),
    ({"attention": "linear"}, r"attention is \"linear\""),
    ({"n_kv_heads": 3}, r"n_kv_heads = 3 does not divide n_heads = 2"),
    ({"head_dim": 5}, r"head_dim = 5 must be even"),
    ({"d_model": 16.5}, r"\"d_model\" must be an integer"),
    ({"lambda_init": "x"}, r"\"lambda_init\" must be a number"),
])
def test_bad_config(model_dir, change, pattern):
    c = cfg()
    c.update(change)
    (model_dir / "config.json").write_text(json.dumps(c))
    with pytest.raises(ValueError, match=pattern):
        diffattn.load_model(str(model_dir))


def test_missing_config_key(model_dir):
    c = cfg()
    del c["rope_theta"]
    (model_dir / "config.json").write_text(json.dumps(c))
    with pytest.raises(ValueError, match=r"missing key \"rope_theta\""):
        diffattn.load_model(str(model_dir))


def test_not_a_directory(tmp_path):
    with pytest.raises(OSError, match="not a model directory"):
        diffattn.load_model(str(tmp_path / "absent"))


def test_bad_tokens(model_dir):
    m = diffattn.load_model(str(model_dir))
    good = np.zeros((2, 5), np.int64)
    with pytest.raises(ValueError, match="tokens must be int64, got float32"):
        m.forward(good.astype(np.float32))
    with pytest.raises(ValueError, match=r"tokens has shape \(5,\), expected \(B, T\)"):
        m.forward(np.zeros(5, np.int64))
    bad = good.copy()
    bad[1, 3] = 40
    with pytest.raises(ValueError, match=r"tokens\[1, 3\] = 40 is outside the vocabulary \[0, 40\)"):
        m.forward(bad)
    with pytest.raises(ValueError, match=r"T = 17 positions, more than max_seq_len = 16"):
        m.forward(np.zeros((1, 17), np.int64))
    with pytest.raises(ValueError, match=r"targets has shape \(2, 4\), expected the shape of tokens \(2, 5\)"):
        m.loss(good, np.zeros((2, 4), np.int64))
    with pytest.raises(ValueError, match="targets must be a NumPy int64 array"):
        m.gradients(good, [[0]])
    # a non-contiguous view is fine (copied), and gives the same numbers
    wide = np.zeros((2, 10), np.int64)
    np.testing.assert_array_equal(m.forward(wide[:, ::2]), m.forward(good))
