"""Ring (context-parallel) differential and standard attention on torch.distributed with
gloo on loopback: 2 and 4 ranks spawned by torch.multiprocessing, each holding a zig-zag (or
contiguous) shard; the reassembled output and gradients meet FlashAttention's rule against
the float64 reference, as the single-process operator does, causal and not, GQA, V1 and V2
layouts, and two rings inside one world. The ranks run under a deadline and are killed if
they pass it."""

import socket
import time

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp

import diffattn.torch as dt
import ring_worker
import torch_reference as tr

EPS32 = float(np.finfo(np.float32).eps)
DEADLINE_S = 120  # a hang guard; the runs take 5-10 s


def check_rule(name, got, ref64, torch32):
    got, ref64, torch32 = (x.detach().double().numpy() for x in (got, ref64, torch32))
    naive = float(np.abs(torch32 - ref64).max())
    err = float(np.abs(got - ref64).max())
    eps = 4 * EPS32 * float(np.abs(ref64).max())
    assert err <= 2 * naive + eps, f"{name}: error {err:.3e}, float32 torch {naive:.3e}, eps {eps:.1e}"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn(world, cases, tmp_path):
    ctx = mp.spawn(ring_worker.run, args=(world, free_port(), cases, str(tmp_path)),
                   nprocs=world, join=False)
    deadline = time.monotonic() + DEADLINE_S
    try:
        while not ctx.join(timeout=max(0.1, deadline - time.monotonic())):
            if time.monotonic() > deadline:
                raise AssertionError(f"{world} ranks still running after {DEADLINE_S} s")
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.kill()
            p.join()
    for r in range(world):
        err = tmp_path / f"rank{r}.err"
        assert not err.exists(), err.read_text()
    return [torch.load(tmp_path / f"rank{r}.pt") for r in range(world)]


def case(T, H, G, D, Dv, shared, per_token, causal, layout="zigzag", B=1, seed=0,
         standard=False):
    return dict(B=B, T=T, H=H, G=G, D=D, Dv=Dv, shared=shared, per_token=per_token,
                causal=causal, layout=layout, seed=seed, standard=standard)


CASES = [
    case(48, 4, 2, 8, 16, False, False, True, B=2),     # V1, GQA, causal
    case(48, 2, 2, 8, 16, False, False, False),         # V1, no mask
    case(64, 4, 1, 16, 16, True, True, True),           # V2: shared keys, per-token lambda
    case(40, 2, 1, 8, 8, True, True, False),
    case(48, 2, 1, 8, 16, False, True, True, layout="contiguous"),
    case(8, 2, 1, 4, 8, False, False, True, B=2),       # chunks of 1 or 2 rows
    case(48, 6, 2, 8, 16, False, False, True, standard=True),   # ring_attention, GQA
    case(24, 2, 2, 8, 8, False, False, False, standard=True),
]


def unshard(parts, layout):
    return dt.zigzag_unshard(parts) if layout == "zigzag" else torch.cat(parts, 1)


def reference(c):
    q, k, v, lam, dout = ring_worker.full_problem(c)
    if lam is None:
        fn = lambda q, k, v: tr.attention(q, k, v, causal=c["causal"])  # noqa: E731
    else:
        fn = lambda q, k, v, lam: tr.diff_attention(q, k, v, lam, causal=c["causal"])  # noqa: E731
    res = {}
    for tag, dtype in (("64", torch.float64), ("32", torch.float32)):
        xs = [x.to(dtype).requires_grad_() for x in (q, k, v, lam) if x is not None]
        out = fn(*xs)
        res[tag] = [out] + list(torch.autograd.grad(out, xs, dout.to(dtype)))
    return res, (q, k, v, lam, dout)


@pytest.mark.parametrize("world", [2, 4])
def test_ring_matches_single_process(world, tmp_path):
    ranks = spawn(world, CASES, tmp_path)
    for i, c in enumerate(CASES):
        ref, (q, k, v, lam, dout) = reference(c)
        per = [r["results"][i] for r in ranks]
        got = [unshard([p[n] for p in per], c["layout"]) for n in ("out", "dq", "dk", "dv")]
        if lam is None:
            pass
        elif lam.dim() == 1:  # a shared lambda: each rank has its rows' share
            got.append(sum(p["dlam"] for p in per))
        else:
            got.append(unshard([p["dlam"] for p in per], c["layout"]))
        for name, g, r64, r32 in zip(("out", "dq", "dk", "dv", "dlam"), got, ref["64"], ref["32"]):
            assert g.shape == r64.shape, (i, name)
            check_rule(f"case {i} {name}", g, r64, r32)
        # the single-process operator meets the same rule on the same problem
        single = (dt.attention(q, k, v, causal=c["causal"]) if lam is None
                  else dt.diff_attention(q, k, v, lam, causal=c["causal"]))
        check_rule(f"case {i} single out", single, ref["64"][0], ref["32"][0])
        # bytes each rank sent: forward (W-1)(|K|+|V|), backward (W-1)(|K|+|V|) + W(|K|+|V|)
        kv = 4 * (k.numel() + v.numel()) // world
        for p in per:
            assert p["sent"] == {"forward": (world - 1) * kv, "backward": (2 * world - 1) * kv}
    if world == 4:  # two groups of 2 ranks, each running CASES[0] on its own
        c = CASES[0]
        ref, (q, k, v, lam, dout) = reference(c)
        for members in ((0, 1), (2, 3)):
            per = [ranks[m]["sub"][0] for m in members]
            got = [dt.zigzag_unshard([p[n] for p in per]) for n in ("out", "dq", "dk", "dv")]
            got.append(sum(p["dlam"] for p in per))
            for name, g, r64, r32 in zip(("out", "dq", "dk", "dv", "dlam"), got, ref["64"],
                                         ref["32"]):
                check_rule(f"group {members} {name}", g, r64, r32)
    for r in ranks:
        assert len(r["errors"]) == 1 and "is not divisible by 2*world" in r["errors"][0]


def test_zigzag_shards_and_errors():
    x = torch.arange(16).view(1, 16)
    shards = [dt.zigzag_shard(x, r, 4) for r in range(4)]
    assert shards[0].tolist() == [[0, 1, 14, 15]] and shards[3].tolist() == [[6, 7, 8, 9]]
    assert torch.equal(dt.zigzag_unshard(shards), x)
    with pytest.raises(ValueError, match="sequence length 18 .* not divisible by 2\\*world = 8"):
        dt.zigzag_shard(torch.zeros(1, 18), 0, 4)
    q = torch.zeros(1, 4, 2, 4)
    with pytest.raises(RuntimeError, match="torch.distributed is not initialized"):
        dt.ring_diff_attention(q, q, q[:, :, :1], torch.zeros(1))
