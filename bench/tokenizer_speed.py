"""Encoding speed of diffattn.HfTokenizer (C++, PCRE2 pre-tokenizer, heap BPE) against a plain
Python byte-level BPE of the same tokenizer.json (the classic GPT-2 encoder: a regex split, then
merges by rank with a per-word cache), on the same text, in one run. Not a test.

    .venv/bin/python bench/tokenizer_speed.py \
        --tokenizer ../shared/data/tokenizers/llama3 --text build/data/kjv.txt --mb 2

The Python baseline approximates the \\p{L}/\\p{N} classes of GPT-2's and Llama 3's regexes
with Python's Unicode-aware \\w and \\d, which agree on the English text used here; the script
checks that both give the same ids before timing.
"""

import argparse
import json
import os
import re
import time

import diffattn


def byte_chars():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


class PythonBPE:
    # GPT-2's and Llama 3's split regexes with \p{L} ~ [^\W\d_] and \p{N} ~ \d.
    GPT2 = re.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?[^\W\d_]+| ?\d+| ?[^\s\w]+|\s+(?!\S)|\s+""")
    LLAMA3 = re.compile(r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\w]?[^\W\d_]+|\d{1,3}| ?[^\s\w]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""")

    def __init__(self, path):
        with open(path, encoding="utf-8") as f:
            j = json.load(f)
        self.PAT = self.LLAMA3 if j["pre_tokenizer"].get("type") == "Sequence" else self.GPT2
        self.ignore_merges = bool(j["model"].get("ignore_merges"))
        self.vocab = j["model"]["vocab"]
        merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in j["model"]["merges"]]
        self.ranks = {m: i for i, m in enumerate(merges)}
        self.bc = byte_chars()
        self.cache = {}

    def bpe(self, word):
        if word in self.cache:
            return self.cache[word]
        if self.ignore_merges and word in self.vocab:
            self.cache[word] = [self.vocab[word]]
            return self.cache[word]
        parts = list(word)
        while len(parts) > 1:
            best, at = None, -1
            for i in range(len(parts) - 1):
                r = self.ranks.get((parts[i], parts[i + 1]))
                if r is not None and (best is None or r < best) and parts[i] + parts[i + 1] in self.vocab:
                    best, at = r, i
            if best is None:
                break
            parts[at:at + 2] = [parts[at] + parts[at + 1]]
        ids = [self.vocab[p] for p in parts]
        self.cache[word] = ids
        return ids

    def encode(self, text):
        out = []
        for piece in self.PAT.findall(text):
            out.extend(self.bpe("".join(self.bc[b] for b in piece.encode("utf-8"))))
        return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokenizer", required=True, help="tokenizer.json or its directory")
    ap.add_argument("--text", required=True, help="a UTF-8 text file")
    ap.add_argument("--mb", type=float, default=2.0, help="MB of the text to encode")
    a = ap.parse_args()
    path = a.tokenizer if a.tokenizer.endswith(".json") else os.path.join(a.tokenizer, "tokenizer.json")
    with open(a.text, encoding="utf-8") as f:
        text = f.read(int(a.mb * 1e6))
    nbytes = len(text.encode("utf-8"))
    t0 = time.perf_counter()
    tok = diffattn.HfTokenizer.load(path)
    t_load = time.perf_counter() - t0
    t0 = time.perf_counter()
    py = PythonBPE(path)
    t_load_py = time.perf_counter() - t0
    # Same ids first (on the first 100 kB), then the timed runs.
    sample = text[:100_000]
    same = tok.encode(sample) == py.encode(sample)
    t0 = time.perf_counter()
    ids = tok.encode(text)
    t_cpp = time.perf_counter() - t0
    t0 = time.perf_counter()
    ids_py = py.encode(text)
    t_py = time.perf_counter() - t0
    print(f"text: {nbytes / 1e6:.2f} MB, {len(ids)} tokens; ids equal: {same and ids == ids_py}")
    print(f"load: diffattn {t_load:.2f} s, Python {t_load_py:.2f} s")
    print(f"encode: diffattn {nbytes / 1e6 / t_cpp:.2f} MB/s, Python (cached BPE) "
          f"{nbytes / 1e6 / t_py:.2f} MB/s, ratio {t_py / t_cpp:.1f}x")


if __name__ == "__main__":
    main()
