"""diffattn.HfTokenizer (a Hugging Face tokenizer.json) from Python: the real GPT-2 and Llama 3
files give the tokenizers library's ids for every test vector in ../shared/data/tokenizers
(skipped, saying so, where a clone has no such folder beside it)."""

import json
import os

import pytest

import diffattn

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = os.environ.get("DIFFATTN_TOKENIZER_DATA",
                      os.path.join(os.path.dirname(ROOT), "shared", "data", "tokenizers"))


def vectors(name):
    with open(os.path.join(DATA, "vectors", name + ".jsonl"), encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


@pytest.mark.parametrize("name", ["gpt2", "llama3"])
def test_real_tokenizers_match_the_library(name):
    if not os.path.isfile(os.path.join(DATA, name, "tokenizer.json")):
        pytest.skip(f"no tokenizer data at {DATA} (set DIFFATTN_TOKENIZER_DATA)")
    tok = diffattn.HfTokenizer.load(os.path.join(DATA, name))
    vs = vectors(name)
    bad = [v["text"][:40] for v in vs if tok.encode(v["text"], v["add_special_tokens"]) != v["ids"]]
    assert not bad, f"{len(bad)} of {len(vs)} differ: {bad[:5]}"
    for v in vs:
        ids = tok.encode(v["text"], v["add_special_tokens"])
        assert tok.decode(ids, skip_special=v["add_special_tokens"]) == v["text"]


def test_llama3_specials_and_errors():
    path = os.path.join(DATA, "llama3")
    if not os.path.isfile(os.path.join(path, "tokenizer.json")):
        pytest.skip(f"no tokenizer data at {DATA}")
    tok = diffattn.HfTokenizer.load(path)
    assert tok.vocab_size == 128256
    assert tok.id_of("<|begin_of_text|>") == 128000 and tok.is_special(128000)
    assert tok.encode("Hello", True)[0] == 128000
    assert tok.encode("<|eot_id|>") == [128009]
    with pytest.raises(ValueError, match="not a token"):
        tok.decode([128256])
    with pytest.raises(ValueError, match="is outside"):
        tok.token(-1)


def test_broken_file_is_an_oserror(tmp_path):
    p = tmp_path / "tokenizer.json"
    p.write_text('{"model": {"type": "WordPiece", "vocab": {}}}')
    with pytest.raises(OSError, match=r"tokenizer.json: model: type \"WordPiece\" is not supported"):
        diffattn.HfTokenizer.load(str(tmp_path))
