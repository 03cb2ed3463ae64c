"""diffattn.HfTokenizer (a Hugging Face tokenizer.json) from Python: the real GPT-2 and Llama 3
files give the tokenizers library's ids for every test vector in ../shared/data/tokenizers
(skipped, saying so, where a clone has no such folder beside it); crafted files get the library's
verdict (both load them with the same ids, or both refuse them), except where the library reads a
file two ways (ids it reassigns, an id with two strings, a repeated key): diffattn refuses those,
naming the entry."""

import copy
import json
import os

import pytest
from tokenizers import Tokenizer
from tokenizers.pre_tokenizers import ByteLevel

import diffattn

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = os.environ.get("DIFFATTN_TOKENIZER_DATA",
                      os.path.join(os.path.dirname(ROOT), "shared", "data", "tokenizers"))


def vectors(name):
    with open(os.path.join(DATA, "vectors", name + ".jsonl"), encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def gpt2_without_its_dead_merge():
    """GPT-2's tokenizer.json less merges[40303] ("\u0120Cla ude", whose result is not in the
    vocab): the file as the tokenizers library can load it."""
    with open(os.path.join(DATA, "gpt2", "tokenizer.json"), encoding="utf-8") as f:
        j = json.load(f)
    assert j["model"]["merges"][40303] == "\u0120Cla ude"
    del j["model"]["merges"][40303]
    return json.dumps(j)


@pytest.mark.parametrize("name", ["gpt2", "llama3"])
def test_real_tokenizers_match_the_library(name):
    if not os.path.isfile(os.path.join(DATA, name, "tokenizer.json")):
        pytest.skip(f"no tokenizer data at {DATA} (set DIFFATTN_TOKENIZER_DATA)")
    if name == "gpt2":
        # The real file names a merge into a token it does not have: the library refuses it, and
        # so does diffattn, naming the merge; without it both load it.
        with pytest.raises(Exception):
            Tokenizer.from_file(os.path.join(DATA, name, "tokenizer.json"))
        with pytest.raises(OSError, match="model.merges\\[40303\\]: \"\u0120Cla ude\" merges into \"\u0120Claude\""):
            diffattn.HfTokenizer.load(os.path.join(DATA, name))
        text = gpt2_without_its_dead_merge()
        tok = diffattn.HfTokenizer.from_json(text, "gpt2")
        lib = Tokenizer.from_str(text)
    else:
        tok = diffattn.HfTokenizer.load(os.path.join(DATA, name))
        lib = Tokenizer.from_file(os.path.join(DATA, name, "tokenizer.json"))
    vs = vectors(name)
    bad = [v["text"][:40] for v in vs if tok.encode(v["text"], v["add_special_tokens"]) != v["ids"]]
    assert not bad, f"{len(bad)} of {len(vs)} differ: {bad[:5]}"
    # and the library itself, on the texts without the template's tokens
    lib_bad = [v["text"][:40] for v in vs if tok.encode(v["text"]) != lib.encode(v["text"], add_special_tokens=False).ids]
    assert not lib_bad, f"{len(lib_bad)} of {len(vs)} differ from the library: {lib_bad[:5]}"
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


def tiny():
    """A byte-level BPE file the library loads: the 256 byte characters (ids 0..255 in the
    library's alphabet order), "ab", "abc", "bc", merges "a b", "ab c", "b c"."""
    vocab = {c: i for i, c in enumerate(sorted(ByteLevel.alphabet()))}
    n = len(vocab)
    vocab.update({"ab": n, "abc": n + 1, "bc": n + 2})
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": [],
            "normalizer": None, "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False,
                                                  "trim_offsets": True, "use_regex": True},
            "post_processor": None, "decoder": {"type": "ByteLevel", "add_prefix_space": True,
                                                "trim_offsets": True, "use_regex": True},
            "model": {"type": "BPE", "dropout": None, "unk_token": None,
                      "continuing_subword_prefix": None, "end_of_word_suffix": None,
                      "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                      "vocab": vocab, "merges": ["a b", "ab c", "b c"]}}


def added(id_, content, special=True):
    return {"id": id_, "content": content, "single_word": False, "lstrip": False, "rstrip": False,
            "normalized": False, "special": special}


def variant(edit):
    j = tiny()
    edit(j)
    return j if isinstance(j, str) else json.dumps(j)


N = 259  # the tiny vocab's entries
X03 = sorted(ByteLevel.alphabet()).index(chr(0x103))  # the byte \x03's character, U+0103
VARIANTS = {
    "plain": lambda j: None,
    "added_next_id": lambda j: j.update(added_tokens=[added(N, "<|eot|>")]),
    "added_in_vocab": lambda j: j.update(added_tokens=[added(N - 3, "ab", False)]),
    "added_twice": lambda j: j.update(added_tokens=[added(N, "<a>"), added(N + 1, "<b>"), added(N, "<a>")]),
    "added_on_byte_id": lambda j: j.update(added_tokens=[added(X03, "<|eot_id|>")]),
    "added_on_other_token": lambda j: j.update(added_tokens=[added(N - 3, "abc", False)]),
    "added_past_a_hole": lambda j: j.update(added_tokens=[added(N + 5, "<|eot|>")]),
    "added_same_id_twice": lambda j: j.update(added_tokens=[added(N, "<a>"), added(N, "<b>")]),
    "two_strings_one_id": lambda j: j["model"]["vocab"].update(xyz=5),
    "merge_result_missing": lambda j: j["model"]["merges"].append("c a"),
    "merge_part_missing": lambda j: j["model"]["merges"].append("zz a"),
    "merge_listed_twice": lambda j: j["model"]["merges"].append("a b"),
    "merge_three_parts": lambda j: j["model"].update(merges=["a b c"]),
    "negative_id": lambda j: j["model"]["vocab"].update(q=-1),
    "float_id": lambda j: j["model"]["vocab"].update(ab=256.0),
    "id_past_u32": lambda j: j["model"]["vocab"].update(ab=1 << 32),
    "vocab_with_a_hole": lambda j: j["model"]["vocab"].update(bc=400),
}
TEXTS = ["abc", "ab bc abc", "<|eot|> <|eot_id|>\x03 <a><b>", "caf\u00e9 \x03"]
DIFFATTN_ONLY = ["the tokenizers library gives it id", "is also the id of", "appears twice"]


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_crafted_tokenizers_get_the_library_verdict(name):
    text = variant(VARIANTS[name])
    try:
        lib = Tokenizer.from_str(text)
    except Exception:
        lib = None
    try:
        ours = diffattn.HfTokenizer.from_json(text, "t/tokenizer.json")
    except OSError as e:
        assert "t/tokenizer.json: " in str(e)
        # Refused: the library refuses it too, or reads it in a way the file does not say.
        assert lib is None or any(w in str(e) for w in DIFFATTN_ONLY), (name, str(e))
        return
    assert lib is not None, f"{name}: the library refuses it, diffattn loads it"
    for t in TEXTS:
        assert ours.encode(t) == lib.encode(t, add_special_tokens=False).ids, (name, t)
        ids = ours.encode(t)
        assert ours.decode(ids) == lib.decode(ids, skip_special_tokens=False), (name, t)


def test_issue_cases_are_named():
    for name, words in [("added_on_byte_id", r"added_tokens\[0\]: \"<\|eot_id\|>\" has id %d, the id of "
                         "\"\u0103\"; the tokenizers library gives it id 259" % X03),
                        ("two_strings_one_id", r"model.vocab\[\"xyz\"\]: id 5 is also the id of"),
                        ("merge_result_missing", r"model.merges\[3\]: \"c a\" merges into \"ca\", which is "
                         r"not in the vocab")]:
        with pytest.raises(OSError, match=words):
            diffattn.HfTokenizer.from_json(variant(VARIANTS[name]), "t/tokenizer.json")
    dup = json.dumps(tiny()).replace('"ab": 256', '"ab": 256, "ab": 300', 1)
    assert '"ab": 300' in dup
    with pytest.raises(OSError, match=r"the key \"ab\" appears twice in \"model.vocab\""):
        diffattn.HfTokenizer.from_json(dup, "t/tokenizer.json")
