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


def test_bytes_that_are_not_utf8_still_give_a_message(model_dir):
    # The message quotes what the parser read; bytes that are not UTF-8 are shown as \xNN, and the
    # exception is the documented one with its message (it was a bare UnicodeDecodeError).
    c = cfg()
    (model_dir / "config.json").write_bytes(json.dumps(c).encode().replace(b'"diff_v1"', b'"diff_\xff1"'))
    with pytest.raises(ValueError, match=r"config\.json: not valid JSON .*\\xff") as e:
        diffattn.load_model(str(model_dir))
    assert str(model_dir / "config.json") in str(e.value)
    (model_dir / "config.json").write_bytes(json.dumps(c).encode().replace(b'"norm_eps"', b'"norm_\xffeps"'))
    with pytest.raises(ValueError, match=r"not valid JSON .*ill-formed UTF-8"):
        diffattn.load_model(str(model_dir))
    tok = {"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}}
    with pytest.raises(OSError, match=r"t\.json: not valid JSON .*\\xff"):
        diffattn.HfTokenizer.from_json(json.dumps(tok).replace('"a"', '"a\udcff"', 1).encode("utf-8", "surrogateescape"),
                                       "t.json")
    # NUL bytes and a byte order mark are not JSON (Python's json refuses both; nlohmann took the
    # text up to the NUL, or skipped the mark).
    (model_dir / "config.json").write_bytes(json.dumps(c).encode() + b"\0garbage")
    with pytest.raises(ValueError, match=r"config\.json: not valid JSON \(a NUL byte at offset"):
        diffattn.load_model(str(model_dir))
    (model_dir / "config.json").write_bytes(b"\xef\xbb\xbf" + json.dumps(c).encode())
    with pytest.raises(ValueError, match="byte order mark"):
        diffattn.load_model(str(model_dir))


def test_sizes_are_checked_before_any_work(model_dir):
    m = diffattn.load_model(str(model_dir))
    zero = np.zeros(1, dtype=np.int64)
    # A stride-0 view of 2^40 tokens is 8 bytes: it is refused by its T before anything is copied.
    huge = np.lib.stride_tricks.as_strided(zero, shape=(1 << 20, 1 << 20), strides=(0, 0))
    with pytest.raises(ValueError, match=r"Model\.forward: tokens has T = 1048576 positions, more than max_seq_len = 16"):
        m.forward(huge)
    # A batch whose forward cannot fit: named with its shape, no MemoryError / bad_alloc.
    wide = np.lib.stride_tricks.as_strided(zero, shape=(1 << 40, 16), strides=(0, 0))
    for call in (lambda: m.forward(wide), lambda: m.loss(wide, wide), lambda: m.gradients(wide, wide)):
        with pytest.raises(ValueError, match=r"tokens of shape \(1099511627776, 16\) .* needs about .* GiB, more than"):
            call()
    # Ids are read through the strides (a view works, and a bad one is named by its index).
    view = np.lib.stride_tricks.as_strided(np.arange(3, dtype=np.int64), shape=(4, 3), strides=(0, 8))
    assert m.forward(view).shape == (4, 3, 40)
    bad = view.copy()
    bad[2, 1] = 40
    with pytest.raises(ValueError, match=r"tokens\[2, 1\] = 40 is outside the vocabulary \[0, 40\)"):
        m.forward(bad)


def test_attention_maps_are_sized_before_the_forward():
    # q, k, v views of 64 bytes whose maps would take 4 TiB: refused at once, the forward not run.
    base = np.zeros(16, dtype=np.float32)
    x = np.lib.stride_tricks.as_strided(base, shape=(1, 1 << 20, 1, 16), strides=(0, 0, 0, 4))
    calls = diffattn.kernel_calls()["forward"]
    with pytest.raises(ValueError, match=r"attention_map: 1 map\(s\) of shape \(B, H, Tq, Tk\) = \(1, 1, 1048576, 1048576\) "
                                         r"needs about 4096\.0 GiB"):
        diffattn.attention_map(x, x, x)
    x2 = np.lib.stride_tricks.as_strided(base, shape=(1, 1 << 20, 2, 16), strides=(0, 0, 0, 4))
    v2 = np.lib.stride_tricks.as_strided(base, shape=(1, 1 << 20, 1, 16), strides=(0, 0, 0, 4))
    with pytest.raises(ValueError, match=r"diff_attention_maps: 2 map\(s\)"):
        diffattn.diff_attention_maps(x2, x2, v2, np.array([0.5], dtype=np.float32))
    assert diffattn.kernel_calls()["forward"] == calls


def test_nan_inputs_are_errors():
    for lam in (float("nan"), float("inf"), -float("inf"), 1e300):
        with pytest.raises(ValueError, match="views: lambda must be a finite number"):
            diffattn.textbook_views(lam)
    x = np.ones((1, 4, 2, 4), dtype=np.float32)
    for scale in (float("nan"), float("inf")):
        with pytest.raises(ValueError, match="scale must be finite"):
            diffattn.attention(x, x, x, scale=scale)
    c = {"attention": "diff_v1", "vocab_size": 100, "d_model": 64, "n_layers": 2, "ffn_dim": 128,
         "n_heads": 2, "n_kv_heads": 2, "head_dim": 16, "tie_embeddings": False}
    for kv in (float("nan"), float("inf"), -1.0):
        with pytest.raises(ValueError, match="accounting: bytes per value must be a finite number > 0"):
            diffattn.account(c, 4096, kv)
