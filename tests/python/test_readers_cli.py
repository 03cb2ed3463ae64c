"""Files a hostile or broken download puts in a model or training directory, tried through the
CLI as a user would (issue 9): each is a clear error naming the file, within seconds, never a
hang, a signal or an allocation sized by the file. The library-level cases are in
tests/cpp/test_readers.cpp."""

import json
import os
import struct

import numpy as np
import pytest

import model_helpers as mh
import torch_model as tm


def cfg(**kw):
    c = {"format": "diffattn/1", "attention": "diff_v1", "vocab_size": 40, "d_model": 16,
         "n_layers": 1, "n_heads": 2, "n_kv_heads": 2, "head_dim": 4, "ffn_dim": 24,
         "max_seq_len": 16, "rope_theta": 10000.0, "norm_eps": 1e-5, "tie_embeddings": False}
    c.update(kw)
    return c


@pytest.fixture
def model_dir(tmp_path):
    d = tmp_path / "model"
    tm.save_model_dir(str(d), cfg(), tm.random_weights(cfg(), 1))
    return d


def refused(p, *words):
    assert p.returncode in (1, 2), (p.returncode, p.stderr)
    for w in words:
        assert w in p.stderr, (w, p.stderr)


def test_fifo_directory_and_device_are_refused_without_hanging(model_dir):
    w = model_dir / "model.safetensors"
    w.unlink()
    os.mkfifo(w)  # opening it for reading blocked forever before
    refused(mh.run_cli("info", model_dir, check=False, timeout=30), str(w), "not a regular file (a FIFO)")
    w.unlink()
    w.symlink_to("/dev/zero")  # read without bound before
    refused(mh.run_cli("info", model_dir, check=False, timeout=30), "not a regular file (a character device)")
    w.unlink()
    w.mkdir()
    refused(mh.run_cli("info", model_dir, check=False, timeout=30), "not a regular file (a directory)")
    c = model_dir / "config.json"
    c.unlink()
    os.mkfifo(c)
    refused(mh.run_cli("info", model_dir, check=False, timeout=30), str(c), "a FIFO")


def test_wrapping_shape_is_an_error(model_dir):
    # shape (2^62, 8) with no data: the element count wrapped to 0 and matched zero bytes.
    header = json.dumps({"embed_tokens.weight": {"dtype": "F32", "shape": [4611686018427387904, 8],
                                                 "data_offsets": [0, 0]}}).encode()
    (model_dir / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header)
    refused(mh.run_cli("info", model_dir, check=False, timeout=30),
            "tensor \"embed_tokens.weight\": shape", "more elements than 2^63")


def test_huge_config_with_small_weights_fails_before_allocating(model_dir):
    # ffn_dim at its bound and 4096 layers: about 2^38 parameters, named by the header check
    # (before: the Model was allocated, or refused for memory, naming neither file nor tensor).
    (model_dir / "config.json").write_text(json.dumps(cfg(ffn_dim=1 << 20, n_layers=4096)))
    p = mh.run_cli("info", model_dir, check=False, timeout=30)
    refused(p, "model.safetensors: tensor \"layers.0.ffn.gate_proj.weight\" has shape (24, 16)",
            "the config implies (1048576, 16)")
    assert "bad_alloc" not in p.stderr


def test_nan_weight_names_file_tensor_and_index(model_dir):
    w = tm.random_weights(cfg(), 1)
    w["layers.0.attn.lambda_q1"][2] = np.nan
    tm.save_model_dir(str(model_dir), cfg(), w)
    refused(mh.run_cli("info", model_dir, check=False, timeout=30),
            "model.safetensors: tensor \"layers.0.attn.lambda_q1\" holds NaN at flat index 2")


def rewrite_metadata(path, **changes):
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    header["__metadata__"].update(changes)
    h = json.dumps(header).encode()
    h += b" " * (-(8 + len(h)) % 8)
    # Offsets are relative to the data, so the data is unchanged.
    path.write_bytes(struct.pack("<Q", len(h)) + h + data[8 + n:])


def test_resume_metadata_and_interrupted_first_checkpoint(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(mh.corpus_text(240))
    out = tmp_path / "run"
    mh.run_cli("--threads", 1, "train", "--out", out, "--corpus", corpus, "--steps", 2,
               "--batch", 2, "--seq-len", 32, "--no-progress", timeout=120)
    state = out / "train_state.safetensors"
    good = state.read_bytes()
    for bad, words in [("abc", ["\"step\" is \"abc\""]), ("-5", ["\"step\" is \"-5\""]),
                       ("3", ["\"step\" is \"3\"", "from 0 to 2"])]:
        state.write_bytes(good)
        rewrite_metadata(state, step=bad)
        p = mh.run_cli("train", "--out", out, "--resume", "--steps", 4, check=False, timeout=60)
        refused(p, str(state), *words)
        assert "stoll" not in p.stderr
    # A kill during the first checkpoint, before its first file was renamed into place: no
    # resume point, which --resume says, and a plain `train` starts the run again.
    state.unlink()
    (out / "model.safetensors").unlink()
    (out / "config.json").unlink()
    (out / "train_state.safetensors.tmp.1.2").write_bytes(good[:100])
    p = mh.run_cli("train", "--out", out, "--resume", check=False, timeout=60)
    refused(p, "no resume point", "without --resume")
    mh.run_cli("--threads", 1, "train", "--out", out, "--corpus", corpus, "--steps", 2,
               "--batch", 2, "--seq-len", 32, "--no-progress", timeout=120)
    assert state.exists() and (out / "config.json").exists()
