"""Saves replace a model directory as one (DirectoryUpdate, base/files.h): `diffattn convert` in both
directions, into a new directory or over an existing model, sharded or not, and `train`'s
checkpoints, killed with SIGKILL at every step (at the entry of every system call that changes a
file, in turn, by strace's fault injection): afterwards the directory holds its old model or the
new one, byte for byte, never a mix and never a stale weight file beside a new model; the user's
files in it (a README, a subdirectory, a symlink, a training log) are untouched; and the next
save finishes or removes what the killed one left beside it."""

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

import diffattn
import model_helpers as mh
import torch_model as tm

STRACE = shutil.which("strace")
# A Python run writes no bytecode, so that its system calls are the same every time.
ENV = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
pytestmark = pytest.mark.skipif(STRACE is None, reason="strace is not installed (scripts/packages-test.txt lists it)")

# The system calls that change files (and the directory tree); a kill at the entry of each one
# shows every state a save passes through.
MUTATING = ("write,pwrite64,writev,fsync,fdatasync,ftruncate,rename,renameat,renameat2,link,linkat,"
            "symlink,symlinkat,unlink,unlinkat,mkdir,mkdirat,rmdir,chmod,fchmod,fchmodat")

MODEL_FILES = {"config.json", "generation_config.json", "model.safetensors", "model.safetensors.index.json",
               "pytorch_model.bin", "pytorch_model.bin.index.json", "tf_model.h5", "flax_model.msgpack"}
TOKENIZER_FILES = {"tokenizer.json", "tokenizer_config.json", "tokenizer.model", "special_tokens_map.json",
                   "added_tokens.json", "vocab.json", "merges.txt", "chat_template.jinja", "chat_template.json"}


def is_model_file(top):
    return (top in MODEL_FILES or top in TOKENIZER_FILES
            or re.fullmatch(r"(model-\d{5}-of-\d{5}\.safetensors|pytorch_model-\d{5}-of-\d{5}\.bin)", top))


def tree(d):
    """{relative path: bytes, or ('link', target)} of everything under d."""
    out = {}
    for root, dirs, files in os.walk(d):
        for n in dirs + files:
            p = os.path.join(root, n)
            rel = os.path.relpath(p, d)
            if os.path.islink(p):
                out[rel] = ("link", os.readlink(p))
            elif os.path.isfile(p):
                with open(p, "rb") as f:
                    out[rel] = f.read()
    return out


def split(t):
    """(the model's files, the user's files) of a tree; the update marker is neither."""
    model = {k: v for k, v in t.items() if is_model_file(k.split("/")[0])}
    user = {k: v for k, v in t.items() if k not in model and k != ".diffattn-update"}
    return model, user


def config(kind="diff_v1"):
    return {"format": "diffattn/1", "attention": kind, "vocab_size": 64, "d_model": 16, "n_layers": 2,
            "n_heads": 1 if kind != "standard" else 2, "n_kv_heads": 1, "head_dim": 8, "ffn_dim": 24,
            "max_seq_len": 32, "rope_theta": 10000.0, "norm_eps": 1e-5, "tie_embeddings": False}


def own_model(path, seed, side=True):
    cfg = config()
    tm.save_model_dir(str(path), cfg, tm.random_weights(cfg, seed, std=0.1))
    if side:  # the files a conversion carries along
        (path / "tokenizer.json").write_text(json.dumps({"model": {"seed": seed}}))
        (path / "generation_config.json").write_text(json.dumps({"eos_token_id": 3}))
    return path


def add_user_files(d):
    os.makedirs(d / "notes", exist_ok=True)
    (d / "README.md").write_text("my model\n")
    (d / "notes" / "a.txt").write_text("kept\n")
    (d / "train_log.jsonl").write_text('{"step": 1}\n')
    os.symlink("README.md", d / "readme-link")


def command(args):
    """`diffattn ARGS`, or a Python script's argv when args starts with "python"."""
    if args and args[0] == "python":
        return [sys.executable, *map(str, args[1:])]
    return [mh.CLI, *map(str, args)]


def run(args):
    p = subprocess.run(command(args), capture_output=True, text=True, env=ENV)
    assert p.returncode == 0, p.stderr
    return p


def trace(args, cwd):
    """The mutating system calls the command makes, in order: (name, its invocation number)."""
    log = cwd / "strace.log"
    subprocess.run([STRACE, "-f", "-qq", "-o", str(log), "-e", "trace=" + MUTATING, *command(args)],
                   check=True, capture_output=True, env=ENV)
    calls, seen = [], {}
    for line in log.read_text().splitlines():
        m = re.match(r"^\d+\s+(\w+)\(", line)
        if m and "resumed>" not in line:
            seen[m.group(1)] = seen.get(m.group(1), 0) + 1
            calls.append((m.group(1), seen[m.group(1)]))
    log.unlink()
    return calls


def killed_at(args, call):
    name, n = call
    p = subprocess.run([STRACE, "-f", "-qq", "-o", "/dev/null", "-e", "trace=" + name,
                        "-e", f"inject={name}:signal=KILL:when={n}", *command(args)],
                       capture_output=True, env=ENV)
    return p.returncode


def leftovers(out):
    return [n for n in os.listdir(out.parent) if n.startswith("." + out.name + ".diffattn-")]


def check_every_kill(tmp_path, args_of, out, prepare):
    """prepare(dir) makes the initial state (or nothing); args_of(dir) is the command. Kills it at
    each mutating call; the directory must hold the old or the new model and the user's files."""
    template = tmp_path / "template" / out.name
    os.makedirs(template.parent)
    prepare(template)

    def restore(d):
        if d.exists():
            shutil.rmtree(d)
        for n in leftovers(d) if d.parent.exists() else []:
            shutil.rmtree(d.parent / n)
        os.makedirs(d.parent, exist_ok=True)
        if template.exists():
            shutil.copytree(template, d, symlinks=True)

    before = tree(template) if template.exists() else None
    old_model, user = split(before) if before is not None else (None, {})
    # The new state: an uninterrupted run on a copy; then the calls it makes, on a fresh copy.
    ref = tmp_path / "ref" / out.name
    restore(ref)
    run(args_of(ref))
    new_model, new_user = split(tree(ref))
    assert new_user == user, "an uninterrupted save changed the user's files"
    assert old_model != new_model
    restore(ref)
    calls = trace(args_of(ref), tmp_path)
    shutil.rmtree(ref.parent)
    assert len(calls) > 10, calls
    states = {"old": 0, "new": 0, "none": 0}
    for i, call in enumerate(calls):
        restore(out)
        rc = killed_at(args_of(out), call)
        assert rc != 0, f"{call} did not kill the run"
        where = f"killed at {call} (mutating call {i + 1} of {len(calls)})"
        if not out.exists():
            assert old_model is None, f"{where}: the directory is gone"
            states["none"] += 1
            continue
        model, got_user = split(tree(out))
        assert got_user == user, f"{where}: the user's files changed: {sorted(set(got_user) ^ set(user))}"
        if old_model is None and not model:
            states["none"] += 1
            continue
        assert model in (old_model, new_model), \
            f"{where}: a mix: {sorted(model)} (old {sorted(old_model or {})}, new {sorted(new_model)})"
        states["old" if model == old_model else "new"] += 1
        diffattn.load_model(str(out))  # and it loads
        # The next save finishes what the killed one left and writes the new model.
        if i % 3 == 0 or i == len(calls) - 1:
            run(args_of(out))
            model, got_user = split(tree(out))
            assert model == new_model and got_user == user, where
            assert leftovers(out) == [], f"{where}: left {leftovers(out)} beside the directory"
            assert not (out / ".diffattn-update").exists()
    assert states["new"] > 0 and states["old" if old_model is not None else "none"] > 0, states
    return states


def test_convert_to_diffattn_over_a_sharded_hf_model(tmp_path):
    src = own_model(tmp_path / "src", seed=1)
    hf = tmp_path / "hf_src"
    mh.run_cli("convert", "--model", src, "--to", "hf", "--out", hf)  # the source: an HF directory

    def prepare(out):  # an HF model of another seed, in 3 shards, with its own tokenizer
        mh.run_cli("convert", "--model", own_model(out.parent / "other", seed=2), "--to", "hf",
                   "--out", out, "--shards", 3)
        shutil.rmtree(out.parent / "other")
        add_user_files(out)
    check_every_kill(tmp_path, lambda out: ["convert", "--model", hf, "--to", "diffattn", "--out", out],
                     tmp_path / "w" / "model", prepare)


def test_convert_to_sharded_hf_into_a_new_directory(tmp_path):
    src = own_model(tmp_path / "src", seed=1)
    check_every_kill(tmp_path, lambda out: ["convert", "--model", src, "--to", "hf", "--out", out, "--shards", 3],
                     tmp_path / "w" / "new", lambda out: None)


def test_convert_to_sharded_hf_over_a_single_file_hf_model(tmp_path):
    # The stale model.safetensors must go: transformers would load it before the index.
    src = own_model(tmp_path / "src", seed=1)

    def prepare(out):
        mh.run_cli("convert", "--model", own_model(out.parent / "other", seed=2, side=False), "--to", "hf",
                   "--out", out)
        shutil.rmtree(out.parent / "other")
        add_user_files(out)
    check_every_kill(tmp_path, lambda out: ["convert", "--model", src, "--to", "hf", "--out", out, "--shards", 3],
                     tmp_path / "w" / "model", prepare)


def test_convert_to_hf_over_a_diffattn_model(tmp_path):
    src = own_model(tmp_path / "src", seed=1)

    def prepare(out):
        own_model(out, seed=2)
        add_user_files(out)
    states = check_every_kill(tmp_path, lambda out: ["convert", "--model", src, "--to", "hf", "--out", out],
                              tmp_path / "w" / "model", prepare)
    assert states["old"] > 0 and states["new"] > 0


def test_a_stale_model_never_survives_and_the_user_files_do(tmp_path):
    # Not killed: each direction over each kind of old model leaves only the new model's files.
    src = own_model(tmp_path / "src", seed=1, side=False)
    out = tmp_path / "out"
    mh.run_cli("convert", "--model", own_model(tmp_path / "o", seed=2), "--to", "hf", "--out", out, "--shards", 3)
    (out / "pytorch_model.bin").write_bytes(b"old weights")
    (out / "model.safetensors.tmp.123.456").write_bytes(b"partial")
    add_user_files(out)
    mh.run_cli("convert", "--model", src, "--to", "hf", "--out", out)
    model, user = split(tree(out))
    assert sorted(model) == ["config.json", "generation_config.json", "model.safetensors"]
    assert sorted(user) == ["README.md", "notes/a.txt", "readme-link", "train_log.jsonl"]
    assert leftovers(out) == []
    mh.run_cli("convert", "--model", out, "--to", "hf", "--out", out, "--shards", 2)  # in place
    model, _ = split(tree(out))
    assert sorted(model) == ["config.json", "generation_config.json", "model-00001-of-00002.safetensors",
                             "model-00002-of-00002.safetensors", "model.safetensors.index.json"]
    # A symlink to a model directory: the directory it names is replaced, the link stays.
    os.symlink(out, tmp_path / "alias")
    mh.run_cli("convert", "--model", src, "--to", "diffattn", "--out", tmp_path / "alias")
    assert os.path.islink(tmp_path / "alias")
    assert sorted(split(tree(out))[0]) == ["config.json", "model.safetensors"]


SAVE_FROM_PYTHON = """
import sys, diffattn
m = diffattn.load_model(sys.argv[1])
diffattn.save_model(sys.argv[2], m.config, m.parameters(), sys.argv[3])
"""


def test_save_from_python_over_an_hf_model(tmp_path):
    src = own_model(tmp_path / "src", seed=1, side=False)
    script = tmp_path / "save.py"
    script.write_text(SAVE_FROM_PYTHON)

    def prepare(out):
        mh.run_cli("convert", "--model", own_model(out.parent / "other", seed=2), "--to", "hf",
                   "--out", out, "--shards", 2)
        shutil.rmtree(out.parent / "other")
        add_user_files(out)
    check_every_kill(tmp_path, lambda out: ["python", script, src, out, "bf16"], tmp_path / "w" / "model", prepare)


def test_python_saves_check_what_they_write(tmp_path):
    src = own_model(tmp_path / "src", seed=1, side=False)
    m = diffattn.load_model(str(src))
    w = m.parameters()
    out = tmp_path / "out"
    assert diffattn.save_model(str(out), m.config, w) == ""
    assert sorted(os.listdir(out)) == ["config.json", "model.safetensors"]
    got = diffattn.load_model(str(out)).parameters()
    assert all((got[k] == w[k]).all() for k in w)
    bad = dict(w)
    bad["norm.weight"] = bad["norm.weight"].copy()
    bad["norm.weight"][3] = float("nan")
    with pytest.raises(ValueError, match=r'save_model: tensors\["norm.weight"\] holds NaN at flat index 3'):
        diffattn.save_model(str(out), m.config, bad)
    with pytest.raises(ValueError, match=r'tensors has no "norm.weight"'):
        diffattn.save_model(str(out), m.config, {k: v for k, v in w.items() if k != "norm.weight"})
    with pytest.raises(ValueError, match=r'tensors\["extra"\] is not a tensor of this config'):
        diffattn.save_model(str(out), m.config, dict(w, extra=w["norm.weight"]))
    with pytest.raises(ValueError, match=r'tensors\["norm.weight"\] has shape'):
        diffattn.save_model(str(out), m.config, dict(w, **{"norm.weight": w["norm.weight"][:3]}))
    assert sorted(split(tree(out))[0]) == ["config.json", "model.safetensors"]  # untouched by the refusals
    m.save(str(out), "bf16", "hf", 2)
    assert sorted(split(tree(out))[0]) == ["config.json", "generation_config.json", "model-00001-of-00002.safetensors",
                                           "model-00002-of-00002.safetensors", "model.safetensors.index.json"]
    with pytest.raises(ValueError, match="format is \"onnx\""):
        m.save(str(out), format="onnx")


def test_train_checkpoints_killed_at_every_step(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(mh.corpus_text(60))
    cfg = dict(config(), vocab_size=256)  # the byte tokenizer's
    tm.save_model_dir(str(tmp_path / "init"), cfg, tm.random_weights(cfg, 4, std=0.1))
    out = tmp_path / "run"
    args = ["--threads", 1, "train", "--init", tmp_path / "init", "--out", out, "--corpus", corpus,
            "--steps", 2, "--save-every", 1, "--batch", 2, "--seq-len", 8, "--no-progress"]
    mh.run_cli(*args)
    final = split(tree(out))[0]
    shutil.rmtree(out)
    calls = trace(args, tmp_path)
    assert len(calls) > 10
    for i, call in enumerate(calls):
        if out.exists():
            shutil.rmtree(out)
        killed_at(args, call)
        if not out.exists() or not (out / "config.json").exists():
            assert not (out / "model.safetensors").exists() if out.exists() else True, f"{call}: weights without a config"
            continue
        m = diffattn.load_model(str(out))  # whole: config and weights agree
        assert m.config["vocab_size"] == 256
        if (out / "train_state.safetensors").exists() and i % 4 == 0:
            # resumable, and the resumed run ends where the uninterrupted one did
            p = mh.run_cli("--threads", 1, "train", "--out", out, "--resume", "--no-progress", check=False)
            assert p.returncode == 0 or "already at step 2" in p.stderr, p.stderr
            assert split(tree(out))[0] == final, f"killed at {call}: the resumed run differs"
