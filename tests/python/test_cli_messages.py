"""What a new user hit in the commands (issue 31, item 7), each checked through the built CLI:
one exit status convention for every flag error (2: the command line; 1: anything else, a
file, a model), notes and messages worded once and in the singular where it is one, generated
text streamed as valid UTF-8, `params --model` at the model's own context, and the demo's
progress bars and report (a short `demo --steps`)."""

import os
import pty
import re
import select
import subprocess

import pytest

import model_helpers as mh


# Every flag error exits 2, whichever parser found it (the tool's own or the library's) and
# before any file is read: the model directories here do not exist.
@pytest.mark.parametrize("args,words", [
    ([], ["usage"]),
    (["frobnicate"], ["unknown command"]),
    (["--threads", "0", "info", "x"], ["--threads"]),
    (["info"], ["DIR"]),
    (["generate", "--prompt", "x"], ["--model"]),
    (["generate", "--model", "NOPE", "--kv-dtype", "f8"], ["--kv-dtype", "f8"]),
    (["generate", "--model", "NOPE", "--tokenizer", "words"], ["--tokenizer", "words"]),
    (["generate", "--model", "NOPE", "--max-new", "-5"], ["--max-new"]),
    (["generate", "--model", "NOPE", "--top-p", "2"], ["--top-p"]),
    (["generate", "--model", "NOPE", "--nope"], ["unknown option --nope"]),
    (["eval", "--model", "NOPE", "--tokenizer", "words"], ["--tokenizer", "words"]),
    (["eval", "--model", "NOPE", "--batch", "0"], ["--batch"]),
    (["maps", "--model", "NOPE", "--prompt", "a", "--mode", "odd"], ["--mode", "odd"]),
    (["maps", "--model", "NOPE", "--prompt", "a", "--layer", "x"], ["--layer"]),
    (["convert", "--model", "NOPE", "--to", "hf", "--out", "o", "--dtype", "f8"], ["--dtype", "f8"]),
    (["convert", "--model", "NOPE", "--to", "gguf", "--out", "o"], ["--to", "gguf"]),
    (["train", "--out", "o", "--attention", "diff_v3"], ["--attention", "diff_v3"]),
    (["train", "--out", "o", "--preset", "huge"], ["huge"]),
    (["train", "--out", "o", "--steps", "0"], ["--steps"]),
    (["experiment", "retrieval", "--kinds", "diff_v9"], ["--kinds", "diff_v9"]),
    (["experiment", "retrieval", "--needles", "0"], ["needles"]),
    (["experiment", "nope"], ["retrieval"]),
    (["serve", "--model", "NOPE", "--kv-dtype", "f8"], ["--kv-dtype"]),
    (["serve", "--model", "NOPE", "--tokenizer", "words"], ["--tokenizer"]),
    (["serve", "--model", "NOPE", "--host", "192.0.2.1"], ["--host", "--allow-remote"]),
    (["explore", "--model", "NOPE", "--host", "192.0.2.1"], ["--host", "loopback"]),
    (["params", "--context", "0"], ["--context"]),
    (["params", "--heads", "x"], ["--heads"]),
    (["demo", "--steps", "0"], ["--steps"]),
    (["snr", "--length", "0"], ["length"]),
    (["bench", "--H", "0"], ["--H"]),
    (["explore", "--model", "NOPE", "--port", "99999"], ["--port"]),
    (["experiment", "retrieval", "--d-model", "0"], ["--d-model"]),
    (["analyze", "--model", "NOPE", "--samples", "0"], ["--samples"]),
])
def test_flag_errors_exit_2(tmp_path, args, words):
    args = [str(tmp_path / a) if a in ("NOPE", "o") else a for a in args]
    p = mh.run_cli(*args, check=False, timeout=60, cwd=tmp_path)
    assert p.returncode == 2, (args, p.returncode, p.stderr)
    for w in words:
        assert w in p.stderr + p.stdout, (w, p.stderr)
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("args", [
    ["info", "NOPE"],
    ["generate", "--model", "NOPE", "--prompt", "x"],
    ["eval", "--model", "NOPE"],
    ["params", "--model", "NOPE"],
])
def test_runtime_errors_exit_1(tmp_path, args):
    args = [str(tmp_path / a) if a == "NOPE" else a for a in args]
    p = mh.run_cli(*args, check=False, timeout=60)
    assert p.returncode == 1, (args, p.returncode, p.stderr)
    assert "NOPE" in p.stderr


def test_a_missing_config_is_worded_once(tmp_path):
    # A directory without config.json, and no directory at all: every command that takes a
    # model says the same, "not a model directory" and why.
    for d, why in ((tmp_path / "empty", "no config.json"), (tmp_path / "absent", "no such directory")):
        if why == "no config.json":
            d.mkdir()
            (d / "model.safetensors").write_bytes(b"")
        msgs = []
        for args in (["info", d], ["generate", "--model", d, "--prompt", "x"], ["eval", "--model", d],
                     ["maps", "--model", d, "--prompt", "x"], ["convert", "--model", d, "--to", "hf",
                     "--out", tmp_path / "o"], ["analyze", "--model", d]):
            p = mh.run_cli(*args, check=False, timeout=60)
            assert p.returncode == 1, p.stderr
            msgs.append(p.stderr.split(": error: ", 1)[1])
        assert len(set(msgs)) == 1, msgs
        assert msgs[0].startswith(f"{d}: not a model directory ({why};"), msgs[0]
    p = mh.run_cli("params", "--model", tmp_path / "empty", check=False, timeout=60)
    assert p.returncode == 1 and "not a model directory (no config.json;" in p.stderr, p.stderr


def test_generate_notes_only_what_the_user_asked(tmp_path):
    model = mh.tiny_run(tmp_path)
    # The default --max-new (200) on a 128-token model: no note, it just stops at max_seq_len.
    p = mh.run_cli("--threads", 1, "generate", "--model", model, "--prompt", "And",
                   "--temperature", 0, timeout=60)
    assert "note" not in p.stderr, p.stderr
    # An explicit --max-new that does not fit: a note, in the singular where it is one.
    cap = 128
    p = mh.run_cli("--threads", 1, "generate", "--model", model, "--prompt", "a" * (cap - 1),
                   "--max-new", 5, "--temperature", 0, timeout=60)
    assert "(127 tokens)" in p.stderr and "generating 1 new token\n" in p.stderr, p.stderr
    p = mh.run_cli("generate", "--model", model, "--prompt", "a" * cap, check=False, timeout=60)
    assert p.returncode == 2 and "--prompt is 128 tokens" in p.stderr


def test_generate_streams_valid_utf8(tmp_path):
    # A barely trained byte-level model at a high temperature draws bytes at random: most are
    # not whole UTF-8 characters. What is printed is UTF-8, with U+FFFD for the broken ones.
    model = mh.tiny_run(tmp_path)
    p = subprocess.run([mh.CLI, "--threads", "1", "generate", "--model", str(model), "--prompt",
                        "caf\u00e9", "--temperature", "100", "--max-new", "120", "--seed", "3"],
                       capture_output=True, timeout=60)
    assert p.returncode == 0, p.stderr
    text = p.stdout.decode("utf-8")  # strict: raises on invalid UTF-8
    assert text.startswith("caf\u00e9") and "\ufffd" in text


def test_convert_error_names_the_command_once(tmp_path):
    model = mh.tiny_run(tmp_path, "v2", extra=("--attention", "diff_v2"))
    p = mh.run_cli("convert", "--model", model, "--to", "hf", "--out", tmp_path / "hf",
                   check=False, timeout=60)
    assert p.returncode == 1
    assert p.stderr.count("convert") == 1 and "DIFF V2" in p.stderr, p.stderr


def test_params_of_a_model_at_its_own_context(tmp_path):
    model = mh.tiny_run(tmp_path)
    out = mh.run_cli("params", "--model", model).stdout
    assert "attention at context T = 128 " in out, out
    # Counted FLOPs: no decimals on a bare count, kilo-FLOPs with their unit.
    assert not re.search(r"\d\.\d\d FLOP\b", out), out
    assert "KFLOP" in out
    out = mh.run_cli("params", "--model", model, "--context", 64).stdout
    assert "attention at context T = 64 " in out


def run_on_a_terminal(args, cwd, timeout):
    """Runs the CLI with stderr on a pseudo-terminal (stdout a pipe); returns (rc, stdout,
    stderr)."""
    master, slave = pty.openpty()
    p = subprocess.Popen([mh.CLI, *map(str, args)], stdout=subprocess.PIPE, stderr=slave,
                         cwd=cwd)
    os.close(slave)
    err = b""
    out_chunks = []
    import threading
    t = threading.Thread(target=lambda: out_chunks.append(p.stdout.read()))
    t.start()
    while True:
        r, _, _ = select.select([master], [], [], timeout)
        if not r:
            p.kill()
            raise AssertionError("no output for %d s" % timeout)
        try:
            chunk = os.read(master, 65536)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        err += chunk
    p.wait(timeout=timeout)
    t.join()
    os.close(master)
    return p.returncode, out_chunks[0].decode(), err.decode(errors="replace")


def test_demo_shows_progress_and_writes_a_sound_report(tmp_path):
    rc, out, err = run_on_a_terminal(["--threads", 1, "demo", "--steps", 4, "--out", tmp_path / "d"],
                                     tmp_path, 300)
    assert rc == 0, err
    # Section 4: a bar for each model; section 5: the trainer's bar for each of three models.
    assert "DIFF V1 (1 of 2)  step 4/4" in err and "standard (2 of 2)  step 4/4" in err, err
    assert err.count("step 4/4") >= 5, err
    assert "== 5. Multi-needle retrieval" in out
    report = (tmp_path / "d" / "retrieval" / "report.md").read_text()
    assert "-1 near-miss" not in report
    assert "2 near-miss needles per context (every unqueried one)" in report
    # Every Markdown table: each row has as many (unescaped) cell separators as its header.
    lines = report.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("|") and i + 1 < len(lines) and re.match(r"^\|[ :|-]+\|$", lines[i + 1]):
            n = len(re.findall(r"(?<!\\)\|", line))
            assert len(re.findall(r"(?<!\\)\|", lines[i + 1])) == n, (line, lines[i + 1])
            j = i + 2
            while j < len(lines) and lines[j].startswith("|"):
                assert len(re.findall(r"(?<!\\)\|", lines[j])) == n, (line, lines[j])
                j += 1
    assert "noise \\|w\\|" in report
