"""Flags and prompts the tool must refuse with a message naming what is wrong (issue 9): every
numeric flag range-checked, sizes that would overflow or exhaust memory refused before anything is
allocated, --resume changing only what it may, and prompts that encode to nothing or do not fit.
Each case runs the built CLI and checks the exit status and the message, never a signal."""

import json

import pytest

import model_helpers as mh


def refused(p, *words, status=2):
    """Exited with an error (not a signal), with `status` (docs/cli.md, "Exit status": 2 for
    the command line, 1 for anything else), and said every word."""
    assert p.returncode == status, (p.returncode, p.stderr)
    for w in words:
        assert w in p.stderr, (w, p.stderr)
    assert "bad_alloc" not in p.stderr and "max_size" not in p.stderr, p.stderr


@pytest.mark.parametrize("flag,value,words", [
    ("--batch", "4611686018427387904", ["--batch", "between"]),
    ("--batch", "99999999999999999999", ["--batch", "64 bits"]),
    ("--batch", "0", ["--batch"]),
    ("--batch", "8x", ["--batch", "integer"]),
    ("--seq-len", "-3", ["--seq-len"]),
    ("--steps", "-1", ["--steps"]),
    ("--accum", "0", ["--accum"]),
    ("--clip", "-1", ["--clip"]),
    ("--warmup", "-5", ["--warmup"]),
    ("--save-every", "-2", ["--save-every"]),
    ("--eval-every", "-1", ["--eval-every"]),
    ("--eval-batches", "0", ["--eval-batches"]),
    ("--lr", "-0.1", ["--lr"]),
    ("--lr", "nan", ["--lr"]),
    ("--min-lr", "-1", ["--min-lr"]),
    ("--weight-decay", "-1", ["--weight-decay"]),
    ("--vocab-size", "-7", ["--vocab-size"]),
    ("--bench", "-1", ["--bench"]),
])
def test_train_flags_are_range_checked(tmp_path, flag, value, words):
    p = mh.run_cli("train", "--out", tmp_path / "o", flag, value, check=False, timeout=60)
    refused(p, *words)
    assert not (tmp_path / "o" / "train_state.safetensors").exists()


def test_huge_batch_is_refused_by_its_memory(tmp_path):
    # Within the flag's range, but one micro-batch's activations exceed any machine's memory:
    # an error naming the sizes, not a bare std::bad_alloc or a wrapped size.
    (tmp_path / "c.txt").write_text(mh.corpus_text(240))
    for batch in ("100000000", "1099511627776"):
        p = mh.run_cli("train", "--out", tmp_path / "o", "--corpus", tmp_path / "c.txt",
                       "--batch", batch, "--no-progress", check=False, timeout=60)
        refused(p, "batch " + batch, "seq_len", "memory", status=1)
    p = mh.run_cli("train", "--bench", 1, "--batch", "100000000", check=False, timeout=60)
    refused(p, "batch 100000000", "memory", status=1)
    p = mh.run_cli("train", "--out", tmp_path / "o", "--corpus", tmp_path / "c.txt",
                   "--steps", "1099511627776", "--accum", "1099511627776", check=False, timeout=60)
    refused(p, "steps", "accum", "overflows", status=1)


@pytest.mark.parametrize("args,words", [
    (["--max-new", "-5"], ["--max-new"]),
    (["--temperature", "-1"], ["--temperature"]),
    (["--top-k", "-1"], ["--top-k"]),
    (["--top-p", "0"], ["--top-p"]),
    (["--top-p", "1.5"], ["--top-p"]),
    (["--seed", "-1"], ["--seed"]),
    (["--bench", "-1"], ["--bench"]),
])
def test_generate_flags_are_range_checked(tmp_path, args, words):
    model = mh.tiny_run(tmp_path)
    p = mh.run_cli("generate", "--model", model, "--prompt", "And", *args, check=False, timeout=60)
    refused(p, *words)


def test_generate_prompt_length(tmp_path):
    model = mh.tiny_run(tmp_path)
    cap = json.loads((model / "config.json").read_text())["max_seq_len"]
    p = mh.run_cli("generate", "--model", model, "--prompt", "a" * cap, check=False, timeout=60)
    refused(p, "--prompt", str(cap), "max_seq_len")
    # A prompt that leaves room for fewer than --max-new tokens: generated up to max_seq_len,
    # with a note saying so.
    prompt = "a" * (cap - 3)
    p = mh.run_cli("--threads", 1, "generate", "--model", model, "--prompt", prompt,
                   "--max-new", 50, "--temperature", 0, timeout=60)
    assert "generating 3 new tokens" in p.stderr
    assert len(p.stdout.encode()) <= cap + 1 + 3 * 4  # prompt + 3 tokens (bytes) + newline
    # The empty prompt starts from a newline on a byte-level model.
    p = mh.run_cli("--threads", 1, "generate", "--model", model, "--prompt", "", "--max-new", 4,
                   timeout=60)
    assert p.returncode == 0


def test_sentencepiece_empty_prompt_is_an_error(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(mh.corpus_text(600))
    out = mh.tiny_run(tmp_path, "sp", extra=("--tokenizer", "sentencepiece", "--vocab-size", 320))
    for prompt in ("", "   ", "\n"):
        p = mh.run_cli("generate", "--model", out, "--prompt", prompt, check=False, timeout=60)
        refused(p, "--prompt", "no tokens", "sentencepiece")
    p = mh.run_cli("--threads", 1, "generate", "--model", out, "--prompt", "And", "--max-new", 3,
                   timeout=60)
    assert p.stdout.startswith("And")


def test_resume_honours_steps_and_refuses_other_changes(tmp_path):
    out = mh.tiny_run(tmp_path, steps=2, extra=("--lr", "0.002", "--save-every", "1"))
    # A flag that would change the steps already taken is refused, naming the run's value.
    for flag, value, was in [("--lr", "0.01", "0.002"), ("--batch", "4", "2"),
                             ("--seq-len", "16", "32"), ("--seed", "7", "1"), ("--clip", "0.5", "1")]:
        p = mh.run_cli("train", "--out", out, "--resume", flag, value, check=False, timeout=60)
        refused(p, flag, "cannot change on --resume", was)
    p = mh.run_cli("train", "--out", out, "--resume", "--preset", "small", check=False, timeout=60)
    refused(p, "--preset", "--resume")
    # Repeating the run's own value is fine; a finished run needs a larger --steps.
    p = mh.run_cli("train", "--out", out, "--resume", "--lr", "0.002", check=False, timeout=60)
    refused(p, "already at step 2", "--steps")
    # --steps extends the run.
    mh.run_cli("--threads", 1, "train", "--out", out, "--resume", "--steps", 4, "--no-progress",
               timeout=120)
    log = mh.read_log(out / "train_log.jsonl")
    assert [e["step"] for e in log] == [1, 2, 3, 4]
    p = mh.run_cli("train", "--out", out, "--resume", "--steps", -4, check=False, timeout=60)
    refused(p, "--steps")
