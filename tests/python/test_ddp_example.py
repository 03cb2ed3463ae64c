"""examples/ddp_train.py: DistributedDataParallel over 2 gloo processes, each with half of
every batch, gives the losses of 1 process with the whole batch. Bit for bit against 1 process
that sums the same two halves' gradients (gradient accumulation: the same float operations as
DDP's averaged all_reduce); within float32 rounding (the batch mean taken in one piece rather
than as the mean of two halves, a few ulps a step) against the whole batch in one piece."""

import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest

import torch_model as tm
from test_model_torch import config

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLE = os.path.join(ROOT, "examples", "ddp_train.py")
EPS32 = float(np.finfo(np.float32).eps)


def run(tmp_path, model, world, accum, steps=4):
    out = tmp_path / f"w{world}a{accum}.json"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    p = subprocess.Popen([sys.executable, EXAMPLE, "--model", str(model), "--world", str(world),
                          "--accum", str(accum), "--steps", str(steps), "--batch", "4",
                          "--seq", "24", "--out", str(out)],
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         start_new_session=True)
    try:
        log, _ = p.communicate(timeout=90)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)  # the example and the ranks it spawned
        p.communicate()
        pytest.fail(f"ddp_train.py --world {world} ran past 90 s")
    assert p.returncode == 0, log
    return json.loads(out.read_text())["losses"]


def test_two_ranks_with_half_batches_match_one_rank(tmp_path):
    cfg = config("diff_v1")
    tm.save_model_dir(str(tmp_path / "model"), cfg, tm.random_weights(cfg, seed=2))
    ddp2 = run(tmp_path, tmp_path / "model", world=2, accum=1)
    accum = run(tmp_path, tmp_path / "model", world=1, accum=2)
    whole = run(tmp_path, tmp_path / "model", world=1, accum=1)
    assert len(ddp2) == 4
    assert ddp2 == accum
    for step, (a, b) in enumerate(zip(ddp2, whole)):
        assert abs(a - b) <= 16 * (step + 1) * EPS32 * abs(b), (step, a, b)


def test_bad_arguments_are_refused():
    p = subprocess.run([sys.executable, EXAMPLE, "--world", "2", "--batch", "3"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "--batch 3 must be divisible by --world x --accum = 2" in p.stderr
