"""Training end to end: 20 AdamW steps of the C++ trainer against the same steps in PyTorch
(torch_model.py and torch.optim.AdamW, from the same initial weights and the same batches),
and a run killed with SIGKILL then resumed, which must give the same losses bit for bit."""

import os
import signal
import subprocess
import time

import numpy as np
import pytest
import torch

import model_helpers as mh
import torch_model as tm

STEPS, B, T, ACCUM, SEED = 20, 2, 16, 2, 5
LR, MIN_LR, WARMUP, WD, CLIP = 3e-3, 3e-4, 5, 0.1, 0.5


def tiny_config(kind):
    c = {"format": "diffattn/1", "attention": kind, "vocab_size": 256, "d_model": 32,
         "n_layers": 2, "ffn_dim": 64, "max_seq_len": 32, "rope_theta": 10000.0,
         "norm_eps": 1e-5, "tie_embeddings": False}
    c.update({"diff_v1": dict(n_heads=2, n_kv_heads=2, head_dim=8),
              "diff_v2": dict(n_heads=4, n_kv_heads=2, head_dim=8),
              "standard": dict(n_heads=4, n_kv_heads=4, head_dim=8)}[kind])
    return c


def lr_at(step):
    if step < WARMUP:
        return LR * (step + 1) / WARMUP
    frac = min(1.0, (step - WARMUP) / (STEPS - WARMUP))
    return MIN_LR + 0.5 * (LR - MIN_LR) * (1 + np.cos(np.pi * frac))


def torch_losses(cfg, weights, train_tokens):
    P = tm.params_from(weights, dtype=torch.float64, grad=True)
    decay = [p for n, p in P.items() if p.dim() >= 2]
    no_decay = [p for n, p in P.items() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": WD},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=LR, betas=(0.9, 0.95), eps=1e-8)
    data = torch.tensor(train_tokens, dtype=torch.int64)
    losses = []
    for step in range(STEPS):
        opt.zero_grad()
        total = 0.0
        for micro in range(ACCUM):
            starts = mh.window_starts(SEED, step * ACCUM + micro, B, len(train_tokens), T)
            x = torch.stack([data[s:s + T] for s in starts])
            y = torch.stack([data[s + 1:s + T + 1] for s in starts])
            loss = tm.loss(cfg, P, x, y)
            (loss / ACCUM).backward()
            total += loss.item()
        losses.append(total / ACCUM)
        torch.nn.utils.clip_grad_norm_(list(P.values()), CLIP)
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        opt.step()
    return losses


def train_args(init, out, corpus, steps=STEPS, save_every=0):
    return ["train", "--init", init, "--out", out, "--corpus", corpus, "--steps", steps,
            "--batch", B, "--seq-len", T, "--accum", ACCUM, "--lr", LR, "--min-lr", MIN_LR,
            "--warmup", WARMUP, "--weight-decay", WD, "--clip", CLIP, "--seed", SEED,
            "--save-every", save_every, "--eval-batches", 2, "--no-progress", "--threads", 2]


@pytest.mark.parametrize("kind", ["diff_v1", "diff_v2", "standard"])
def test_20_steps_match_torch(tmp_path, kind):
    text = mh.corpus_text()
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(text)
    cfg = tiny_config(kind)
    weights = tm.random_weights(cfg, seed=11)
    tm.save_model_dir(str(tmp_path / "init"), cfg, weights)
    mh.run_cli(*train_args(tmp_path / "init", tmp_path / "out", corpus))
    log = mh.read_log(tmp_path / "out" / "train_log.jsonl")
    ours = [e["loss"] for e in log]
    assert [e["step"] for e in log] == list(range(1, STEPS + 1))
    train_text, _ = mh.split_lines(text)
    ref = torch_losses(cfg, weights, list(train_text.encode()))
    np.testing.assert_allclose(ours, ref, rtol=2e-4, err_msg="loss curve differs from PyTorch's")
    assert ours[-1] < ours[0] - 0.3, "the loss did not go down"
    for e in log:
        assert e["lr"] == pytest.approx(lr_at(e["step"] - 1), rel=1e-12)
        assert np.isfinite(e["grad_norm"]) and e["grad_norm"] > 0
        assert len(e["lambda"]) == (0 if kind == "standard" else cfg["n_layers"])


def test_kill_and_resume_is_bit_identical(tmp_path):
    text = mh.corpus_text()
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(text)
    cfg = tiny_config("diff_v1")
    tm.save_model_dir(str(tmp_path / "init"), cfg, tm.random_weights(cfg, seed=2))
    steps = 40
    # The uninterrupted run.
    mh.run_cli(*train_args(tmp_path / "init", tmp_path / "full", corpus, steps=steps))
    full = mh.read_log(tmp_path / "full" / "train_log.jsonl")
    # The same run, killed with SIGKILL once it has saved at least once, then resumed.
    out = tmp_path / "killed"
    args = train_args(tmp_path / "init", out, corpus, steps=steps, save_every=3)
    p = subprocess.Popen([mh.CLI, *map(str, args)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 60
    state = out / "train_state.safetensors"
    while time.time() < deadline and p.poll() is None:
        if state.exists() and (out / "train_log.jsonl").exists() and \
                len((out / "train_log.jsonl").read_text().splitlines()) >= 7:
            break
        time.sleep(0.002)
    killed_early = p.poll() is None
    p.send_signal(signal.SIGKILL)
    p.wait()
    assert killed_early, "the run finished before it could be killed; make it longer"
    partial = mh.read_log(out / "train_log.jsonl") if (out / "train_log.jsonl").exists() else []
    assert len(partial) < steps
    mh.run_cli("train", "--out", out, "--resume", "--no-progress", "--threads", 2)
    resumed = mh.read_log(out / "train_log.jsonl")
    assert [e["step"] for e in resumed] == list(range(1, steps + 1))
    assert [e["loss"] for e in resumed] == [e["loss"] for e in full]
    assert [e["grad_norm"] for e in resumed] == [e["grad_norm"] for e in full]
    # and the final weights are the same bits
    a, _ = tm.read_safetensors(str(tmp_path / "full" / "model.safetensors"))
    b, _ = tm.read_safetensors(str(out / "model.safetensors"))
    for name in a:
        assert np.array_equal(a[name], b[name]), name


def test_refuses_to_overwrite_a_run(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(mh.corpus_text())
    cfg = tiny_config("standard")
    tm.save_model_dir(str(tmp_path / "init"), cfg, tm.random_weights(cfg, seed=2))
    mh.run_cli(*train_args(tmp_path / "init", tmp_path / "out", corpus, steps=2))
    p = mh.run_cli(*train_args(tmp_path / "init", tmp_path / "out", corpus, steps=2), check=False)
    assert p.returncode != 0 and "--resume" in p.stderr
