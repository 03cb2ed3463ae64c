#!/usr/bin/env python3
"""A differential fuzzer of diffattn.HfTokenizer against the `tokenizers` library on the real
GPT-2 and Llama 3 tokenizer.json files (../shared/data/tokenizers): it first replays every text
in fuzz/corpus_text/tokenizer_vs_library/ (a difference ever found stays fixed), then mutates
texts (tests/python/text_samples.py: insertions, deletions, repeats, swaps, splices of random
pieces) for SECONDS, comparing the ids with and without special tokens and the decoded text.
A difference is written to ARTIFACTS/diff-N.txt (the text) and the exit status is 1.

    .venv/bin/python fuzz/tokenizer_vs_library.py --seconds 60 [--seed 1] [--artifacts DIR]

`make test` runs it for a few seconds; `make fuzz` for FUZZ_SECONDS."""

import argparse
import json
import os
import random
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "python"))

import text_samples  # noqa: E402
import test_oracle_tokenizers as oracle  # noqa: E402  (the consistent copy of the files)


def load(where):
    import tokenizers
    import diffattn
    out = {}
    for name in ("gpt2", "llama3"):
        src = os.path.join(oracle.DATA, name)
        if not os.path.isfile(os.path.join(src, "tokenizer.json")):
            print(f"tokenizer_vs_library: no {name} tokenizer at {src}; skipped", file=sys.stderr)
            continue
        dst = os.path.join(where, name)
        oracle.consistent_copy(src, dst)
        out[name] = (diffattn.HfTokenizer.load(dst),
                     tokenizers.Tokenizer.from_file(os.path.join(dst, "tokenizer.json")))
    return out


def differs(pairs, text):
    """A description of the first difference between the two implementations on text, or None."""
    for name, (ours, lib) in pairs.items():
        for special in (False, True):
            want = lib.encode(text, add_special_tokens=special).ids
            try:
                got = ours.encode(text, special)
            except Exception as e:  # an error where the library encodes is a difference too
                return f"{name} encode(special={special}) raised {type(e).__name__}: {e}"
            if got != want:
                return f"{name} encode(special={special}): {got[:16]} != library {want[:16]}"
        ids = lib.encode(text, add_special_tokens=False).ids
        for skip in (False, True):
            want = lib.decode(ids, skip_special_tokens=skip)
            got = ours.decode(ids, skip_special=skip)
            if got != want:
                return f"{name} decode(skip_special={skip}): {got!r:.80} != library {want!r:.80}"
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--corpus", default=os.path.join(HERE, "corpus_text", "tokenizer_vs_library"))
    ap.add_argument("--artifacts", default=os.path.join(ROOT, "build", "fuzz", "artifacts",
                                                        "tokenizer_vs_library"))
    a = ap.parse_args()
    if a.seconds < 0:
        ap.error("--seconds must be >= 0")
    with tempfile.TemporaryDirectory() as tmp:
        pairs = load(tmp)
        if not pairs:
            print("tokenizer_vs_library: no tokenizer data; nothing to compare")
            return 0
        corpus = []
        for f in sorted(os.listdir(a.corpus)):
            with open(os.path.join(a.corpus, f), encoding="utf-8") as fh:
                corpus.append(fh.read())
        found = []
        for text in corpus:
            d = differs(pairs, text)
            if d:
                found.append((text, d))
        rng = random.Random(a.seed)
        pool = list(corpus) or [""]
        runs, end = 0, time.monotonic() + a.seconds
        while time.monotonic() < end and not found:
            text = text_samples.mutate(rng, rng.choice(pool)) if rng.random() < 0.7 \
                else text_samples.random_text(rng)
            runs += 1
            d = differs(pairs, text)
            if d:
                found.append((text, d))
            elif len(pool) < 2000:
                pool.append(text)
        print(f"tokenizer_vs_library: replayed {len(corpus)} corpus texts, fuzzed {runs} texts "
              f"in {a.seconds:g} s against {', '.join(pairs)}: {len(found)} difference(s)")
        if found:
            os.makedirs(a.artifacts, exist_ok=True)
            for i, (text, d) in enumerate(found):
                p = os.path.join(a.artifacts, f"diff-{i}.txt")
                with open(p, "w", encoding="utf-8") as fh:
                    fh.write(text)
                print(f"  {d}\n  text: {json.dumps(text)[:200]} (saved in {p})", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
