"""Models whose embedding has more rows than their tokenizer has tokens (padded vocabularies) and
tokenizers with holes: an id without text is never sampled, by `diffattn generate` or `diffattn
serve` (whole, streamed, id prompts), so no request fails decoding one; the text is greedy decoding
over the ids that have text. Also: a Hugging Face directory without a tokenizer is an error naming
what is missing unless --tokenizer bytes asks for bytes, and a generation_config.json whose
eos_token_id the model cannot produce is an error naming the file."""

import json
import os
import shutil

import numpy as np
import pytest

import diffattn
import model_helpers as mh
import serve_helpers as sh
import torch_model as tm
from test_serve import post, sse
from tokenizers.pre_tokenizers import ByteLevel

PADDED = 300  # embedding rows; the byte tokenizer has 256 ids


def padded_model(path, vocab=PADDED, text_ids=256, hole=None):
    """A byte-level model of `vocab` ids whose lm_head makes the ids without text (text_ids and
    up, and `hole`) by far the most likely, so any sampler that does not exclude them picks one."""
    cfg = {"format": "diffattn/1", "attention": "diff_v1", "vocab_size": vocab, "d_model": 48,
           "n_layers": 2, "n_heads": 2, "n_kv_heads": 1, "head_dim": 12, "ffn_dim": 96,
           "max_seq_len": 128, "rope_theta": 10000.0, "norm_eps": 1e-5, "tie_embeddings": False}
    w = tm.random_weights(cfg, 3, std=0.1, lam_std=0.3, gain_std=0.3)
    head = w["lm_head.weight"]
    head[:32] = 0
    head[127:] = 0
    head[32:127] *= 10  # printable ASCII: decisive margins, the largest logit positive
    # Each id without text gets 10x the row of a printable byte: whenever that byte's logit is
    # the largest (and positive), the id without text beats every byte.
    for k, i in enumerate([*range(text_ids, vocab), *([hole] if hole is not None else [])]):
        head[i] = 10 * head[32 + (7 * k) % 95]
    tm.save_model_dir(str(path), cfg, w)
    return cfg


def greedy_over(model_dir, prompt_ids, n, allowed):
    """Greedy decoding with the model's full forward, over the allowed ids only."""
    m = diffattn.load_model(str(model_dir))
    ids, out = list(prompt_ids), []
    mask = np.full(m.forward(np.array([ids], dtype=np.int64)).shape[-1], -np.inf)
    mask[allowed] = 0
    for _ in range(n):
        logits = m.forward(np.array([ids], dtype=np.int64))[0, -1]
        nxt = int(np.argmax(logits + mask))
        out.append(nxt)
        ids.append(nxt)
    return out, int(np.argmax(logits))


def test_generate_and_serve_never_sample_ids_without_text(tmp_path):
    d = tmp_path / "padded"
    padded_model(d)
    prompt = "Hello"
    want, unmasked = greedy_over(d, list(prompt.encode()), 12, np.arange(256))
    assert unmasked >= 256, "the test model must prefer a padded id"
    want_text = bytes(want).decode("latin-1")
    p = mh.run_cli("--threads", 1, "generate", "--model", d, "--prompt", prompt, "--max-new", 12,
                   "--temperature", 0)
    assert p.stdout == prompt + want_text + "\n"
    # Sampled, too: many draws, never an id past the tokenizer (the text would not decode).
    for seed in range(3):
        mh.run_cli("--threads", 1, "generate", "--model", d, "--prompt", prompt, "--max-new", 20,
                   "--temperature", 5, "--seed", seed)
    s = sh.Server(d)
    try:
        status, body = post(s.port, "/v1/completions", {"prompt": prompt, "max_tokens": 12, "temperature": 0})
        assert status == 200, body
        assert json.loads(body)["choices"][0]["text"] == want_text
        events = sse(s.port, {"prompt": prompt, "max_tokens": 12, "temperature": 0, "stream": True})
        assert events[-1] == "[DONE]"
        assert "".join(json.loads(e)["choices"][0]["text"] for e in events[:-1]
                       if json.loads(e)["choices"]) == want_text
        # An id prompt may hold a padded id (the model has a row for it); the answer has text.
        ids = list(prompt.encode()) + [280]
        want_ids, _ = greedy_over(d, ids, 8, np.arange(256))
        status, body = post(s.port, "/v1/completions", {"prompt": ids, "max_tokens": 8, "temperature": 0})
        assert status == 200, body
        assert json.loads(body)["choices"][0]["text"] == bytes(want_ids).decode("latin-1")
        for seed in range(4):
            status, body = post(s.port, "/v1/completions", {"prompt": ids, "max_tokens": 16,
                                                            "temperature": 2, "seed": seed, "n": 4})
            assert status == 200, body
            events = sse(s.port, {"prompt": ids, "max_tokens": 16, "temperature": 2, "seed": seed,
                                  "stream": True})
            assert events[-1] == "[DONE]" and not any('"error"' in e for e in events), events
        # An id past the embedding is the request's error (400), not the server's.
        status, body = post(s.port, "/v1/completions", {"prompt": [1, PADDED], "max_tokens": 2})
        assert status == 400 and "outside the vocabulary" in json.loads(body)["error"]["message"]
    finally:
        s.stop()


def tiny_tokenizer_json(hole):
    """A byte-level tokenizer.json of 258 ids (the 256 bytes, then "ab" and "abc") with id `hole`
    left out: its ids run to 258 but one of them has no token."""
    alpha = sorted(ByteLevel.alphabet())
    vocab = {c: i for i, c in enumerate(alpha)}
    vocab["ab"], vocab["abc"] = 256, 258
    assert hole == 257
    return {"version": "1.0", "added_tokens": [], "normalizer": None,
            "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True},
            "post_processor": None, "decoder": {"type": "ByteLevel"},
            "model": {"type": "BPE", "vocab": vocab, "merges": ["a b", "ab c"]}}


def test_hf_directory_with_a_padded_embedding_and_a_tokenizer_hole(tmp_path):
    src = tmp_path / "src"
    padded_model(src, vocab=272, text_ids=259, hole=257)
    hf = tmp_path / "hf"
    mh.run_cli("convert", "--model", src, "--to", "hf", "--out", hf)
    (hf / "tokenizer.json").write_text(json.dumps(tiny_tokenizer_json(257)))
    tok = diffattn.HfTokenizer.load(str(hf))
    allowed = [i for i in range(259) if i != 257]
    alpha = sorted(ByteLevel.alphabet())
    prompt = "Hi abc"
    ids = tok.encode(prompt)
    want, unmasked = greedy_over(hf, ids, 10, allowed)
    assert unmasked in (257,) or unmasked >= 259
    want_text = tok.decode(want)
    p = mh.run_cli("--threads", 1, "generate", "--model", hf, "--prompt", prompt, "--max-new", 10,
                   "--temperature", 0)
    assert p.stdout == prompt + want_text + "\n", (p.stdout, want)
    s = sh.Server(hf)
    try:
        status, body = post(s.port, "/v1/completions", {"prompt": prompt, "max_tokens": 10, "temperature": 0})
        assert status == 200 and json.loads(body)["choices"][0]["text"] == want_text, body
        for seed in range(3):
            events = sse(s.port, {"prompt": ids + [265], "max_tokens": 16, "temperature": 2, "seed": seed,
                                  "stream": True})
            assert events[-1] == "[DONE]" and not any('"error"' in e for e in events), events
    finally:
        s.stop()
    assert alpha  # the alphabet the tokenizer was built from


def test_hf_directory_without_a_tokenizer_is_named(tmp_path):
    src = tmp_path / "src"
    padded_model(src, vocab=256)
    hf = tmp_path / "hf"
    mh.run_cli("convert", "--model", src, "--to", "hf", "--out", hf)
    assert not (hf / "tokenizer.json").exists()
    for args in (["generate", "--model", hf, "--prompt", "Hi", "--max-new", 2],
                 ["eval", "--model", hf, "--corpus", __file__],
                 ["maps", "--model", hf, "--prompt", "Hi", "--out", tmp_path / "maps"],
                 ["serve", "--model", hf, "--port", 0]):
        p = mh.run_cli(*args, check=False, timeout=60)
        assert p.returncode != 0
        assert "a Hugging Face model directory without a tokenizer" in p.stderr, p.stderr
        assert "--tokenizer bytes" in p.stderr and str(hf) in p.stderr
    # Asked for, bytes work; `info` shows the directory and says it has no tokenizer.
    p = mh.run_cli("--threads", 1, "generate", "--model", hf, "--prompt", "Hi", "--max-new", 3,
                   "--temperature", 0, "--tokenizer", "bytes")
    assert p.stdout.startswith("Hi")
    assert "no tokenizer" in mh.run_cli("info", hf).stdout
    s = sh.Server(hf, "--tokenizer", "bytes")
    try:
        status, body = post(s.port, "/v1/completions", {"prompt": "Hi", "max_tokens": 3, "temperature": 0})
        assert status == 200, body
    finally:
        s.stop()
    p = mh.run_cli("generate", "--model", hf, "--prompt", "Hi", "--tokenizer", "words", check=False)
    assert p.returncode != 0 and "--tokenizer is \"words\", expected model" in p.stderr
    # diffattn's own format without tokenizer.model is byte-level by definition (FORMAT.md).
    mh.run_cli("--threads", 1, "generate", "--model", src, "--prompt", "Hi", "--max-new", 2)


def test_generation_config_eos_the_model_cannot_produce_is_named(tmp_path):
    d = tmp_path / "m"
    padded_model(d, vocab=256)
    for eos, ok in [(255, True), ([10, 255], True), (256, False), ([1, 100000], False)]:
        (d / "generation_config.json").write_text(json.dumps({"eos_token_id": eos}))
        p = mh.run_cli("--threads", 1, "generate", "--model", d, "--prompt", "Hi", "--max-new", 2,
                       check=False, timeout=60)
        if ok:
            assert p.returncode == 0, p.stderr
        else:
            assert p.returncode != 0
            assert str(d / "generation_config.json") in p.stderr
            assert "is not an id of the model (its vocabulary has 256 ids" in p.stderr, p.stderr
            p = mh.run_cli("serve", "--model", d, "--port", 0, check=False, timeout=60)
            assert p.returncode != 0 and "eos_token_id" in p.stderr
