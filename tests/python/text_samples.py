"""Seeded random texts for comparing tokenizers with the `tokenizers` library: mixed scripts,
emoji (modifiers, ZWJ sequences, flags), combining marks, whitespace runs of every kind, digit
runs, contractions, punctuation, and the text of special tokens (whole and cut). Shared by
tests/python/test_oracle_tokenizers.py and fuzz/tokenizer_vs_library.py."""

import random
import unicodedata

WORDS = ["the", "The", "quick", "brown", "fox", "hello", "World", "don't", "I'm", "we're",
         "it's", "THEY'LL", "you've", "I'd", "naïve", "café", "Äpfel", "straße", "coöperate"]
SCRIPTS = ["Привет мир", "Ελληνικά", "مرحبا بالعالم", "שלום", "नमस्ते दुनिया", "สวัสดี",
           "你好，世界", "日本語のテキスト", "カタカナ", "한국어 문장", "Tiếng Việt", "ᐊᐃᓐᓇᐅ"]
EMOJI = ["😀", "👍🏽", "👨‍👩‍👧‍👦", "🇫🇷", "❤️", "🏳️‍🌈", "🤷🏻‍♀️", "🙂🙂🙂", "🦀", "✨"]
SPACES = [" ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", "\u00a0", "\u3000", "\u2009", " \n ",
          "\t\t", "\u200b", "\ufeff"]
PUNCT = list(".,;:!?()[]{}<>/\\|@#$%^&*-_=+~`'\"") + ["...", "--", "!!!", "?!", "''", "``"]
SPECIALS = ["<|endoftext|>", "<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>",
            "<|start_header_id|>", "<|end_header_id|>", "<|reserved_special_token_7|>",
            "<|eot", "eot_id|>", "<|", "|>", "<|begin_of_text|><|begin_of_text|>"]
COMBINING = ["e\u0301", "a\u0308", "n\u0303", "\u0915\u094d\u0937", "o\u0328\u0301"]


def random_codepoint(rng):
    """A random assigned code point (Unicode 14, as this Python's unicodedata and Debian's PCRE2
    10.42 know it). Characters assigned later are letters to the tokenizers library (Oniguruma,
    Unicode 16) but unassigned to PCRE2, a difference of Unicode versions, not of tokenizing:
    docs/FORMAT.md says so."""
    while True:
        r = rng.random()
        c = rng.randrange(0x20, 0x80) if r < 0.3 else (
            rng.randrange(0x80, 0x3000) if r < 0.6 else (
                rng.randrange(0x3000, 0x10000) if r < 0.9 else rng.randrange(0x10000, 0x110000)))
        if not 0xD800 <= c < 0xE000 and unicodedata.category(chr(c)) != "Cn":
            return chr(c)


def random_text(rng, pieces=None):
    """One text of a few to a few dozen pieces drawn from every class above."""
    n = pieces if pieces is not None else rng.randint(1, 24)
    out = []
    for _ in range(n):
        r = rng.random()
        if r < 0.22:
            out.append(rng.choice(WORDS))
        elif r < 0.32:
            out.append(rng.choice(SCRIPTS))
        elif r < 0.40:
            out.append(rng.choice(EMOJI))
        elif r < 0.55:
            out.append(rng.choice(SPACES))
        elif r < 0.63:
            out.append(rng.choice(PUNCT))
        elif r < 0.70:
            out.append(str(rng.randrange(10 ** rng.randint(1, 12))))
        elif r < 0.76:
            out.append(rng.choice(SPECIALS))
        elif r < 0.80:
            out.append(rng.choice(COMBINING))
        elif r < 0.90:
            out.append("".join(random_codepoint(rng) for _ in range(rng.randint(1, 6))))
        else:
            out.append(rng.choice(SPACES) * rng.randint(2, 9))  # long whitespace runs
    return "".join(out)


def mutate(rng, text):
    """A small edit of text: a character inserted, deleted, duplicated or swapped, or two texts
    spliced: how the fuzzer walks from its corpus."""
    if not text:
        return random_text(rng, 3)
    i = rng.randrange(len(text))
    r = rng.random()
    if r < 0.25:
        return text[:i] + random_codepoint(rng) + text[i:]
    if r < 0.45:
        return text[:i] + text[i + 1:]
    if r < 0.6:
        return text[:i] + text[i] * rng.randint(2, 20) + text[i + 1:]
    if r < 0.75:
        j = rng.randrange(len(text))
        return text[:min(i, j)] + text[max(i, j):] + text[min(i, j):max(i, j)]
    return text[:i] + random_text(rng, rng.randint(1, 4)) + text[i:]


def texts(seed, count):
    rng = random.Random(seed)
    return [random_text(rng) for _ in range(count)]
