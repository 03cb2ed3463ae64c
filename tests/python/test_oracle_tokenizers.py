"""diffattn.HfTokenizer against the `tokenizers` library (Hugging Face's own implementation) on
the real GPT-2 and Llama 3 tokenizer.json files in ../shared/data/tokenizers: the same ids for
thousands of seeded random texts (mixed scripts, emoji, combining marks, whitespace runs, digit
runs, the text of special tokens), with and without the special tokens a template adds, and
the library's text back from decoding them. fuzz/tokenizer_vs_library.py runs the same
comparison as a fuzzer (`make test` replays its corpus)."""

import json
import os
import shutil

import pytest
import tokenizers

import diffattn
import text_samples

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = os.environ.get("DIFFATTN_TOKENIZER_DATA",
                      os.path.join(os.path.dirname(ROOT), "shared", "data", "tokenizers"))
COUNT = 2500


def consistent_copy(src, dst):
    """src's tokenizer.json with the merges whose result is not a token dropped, in dst.
    The GPT-2 file has one ("ĠCla ude": no "ĠClaude" in its vocab), which the library refuses
    to load; a merge that makes no token can never apply, so dropping it changes no encoding."""
    with open(os.path.join(src, "tokenizer.json"), encoding="utf-8") as f:
        j = json.load(f)
    m = j["model"]
    m.setdefault("type", "BPE")
    keep = [x for x in m["merges"]
            if (x.replace(" ", "", 1) if isinstance(x, str) else "".join(x)) in m["vocab"]]
    dropped = len(m["merges"]) - len(keep)
    m["merges"] = keep
    os.makedirs(dst, exist_ok=True)
    with open(os.path.join(dst, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(j, f, ensure_ascii=False)
    for extra in ("tokenizer_config.json",):
        if os.path.exists(os.path.join(src, extra)):
            shutil.copy(os.path.join(src, extra), dst)
    return dropped


@pytest.fixture(scope="module")
def consistent(tmp_path_factory):
    return tmp_path_factory.mktemp("tokenizers")


def pair(name, where):
    path = os.path.join(DATA, name)
    if not os.path.isfile(os.path.join(path, "tokenizer.json")):
        pytest.skip(f"no tokenizer data at {DATA} (set DIFFATTN_TOKENIZER_DATA)")
    dst = os.path.join(where, name)
    if not os.path.exists(dst):
        dropped = consistent_copy(path, dst)
        assert dropped <= (1 if name == "gpt2" else 0), dropped
    return (diffattn.HfTokenizer.load(dst),
            tokenizers.Tokenizer.from_file(os.path.join(dst, "tokenizer.json")))


@pytest.mark.parametrize("name,seed", [("gpt2", 1), ("llama3", 2)])
def test_random_texts_give_the_library_ids(name, seed, consistent):
    ours, lib = pair(name, consistent)
    samples = text_samples.texts(seed, COUNT)
    assert len(set(samples)) > 0.95 * COUNT
    bad = []
    for special in (False, True):
        want = lib.encode_batch(samples, add_special_tokens=special)
        for text, w in zip(samples, want):
            got = ours.encode(text, special)
            if got != w.ids:
                bad.append((special, text, got[:12], w.ids[:12]))
    assert not bad, f"{len(bad)} of {2 * COUNT} differ, e.g. {bad[:3]!r}"


@pytest.mark.parametrize("name,seed", [("gpt2", 3), ("llama3", 4)])
def test_decoding_gives_the_library_text(name, seed, consistent):
    ours, lib = pair(name, consistent)
    bad = []
    for text in text_samples.texts(seed, COUNT // 2):
        ids = lib.encode(text, add_special_tokens=False).ids
        for skip in (False, True):
            want = lib.decode(ids, skip_special_tokens=skip)
            got = ours.decode(ids, skip_special=skip)
            if got != want:
                bad.append((skip, text, got, want))
    assert not bad, f"{len(bad)} differ, e.g. {bad[:3]!r}"


def test_the_generator_covers_every_class():
    """The texts really contain what the comparison is meant to exercise."""
    joined = "".join(text_samples.texts(5, 400))
    for needle in ("<|eot_id|>", "\u00a0", "\u200d", "\t\t", "\U0001F1EB", "\u0301"):
        assert needle in joined, needle
    assert any(ord(c) > 0xFFFF for c in joined) and any("\u0600" <= c <= "\u06ff" for c in joined)
