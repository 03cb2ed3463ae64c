"""The upstream naive formulation of differential attention in PyTorch, against diffattn's fused
kernel, on the same shapes, in one run (interleaved rounds, medians).

The naive formulation materialises both (T x T) maps per pair, subtracts them with lambda and
multiplies by V, as the Differential Transformer's reference code does without FlashAttention.
Run with Debian's Python (it has PyTorch and NumPy) and the built module:

    .venv/bin/python bench/torch_naive.py [--T 4096] [--backward]

PyTorch must use OpenBLAS (libopenblas0-pthread): Debian's PyTorch otherwise falls back to the
reference BLAS, about 30x slower, and the comparison says nothing. The script prints what
torch reports about its BLAS and the sgemm rate torch.matmul reaches beside NumPy's.
"""

import argparse
import json
import os
import statistics
import time

import numpy as np
import torch

import diffattn


def naive_forward(q, k, v, lam, causal):
    """q (B, T, 2H, D), k (B, T, 2G, D), v (B, T, G, 2D), lam (H): the upstream recipe."""
    B, T, H2, D = q.shape
    G = v.shape[2]
    H = H2 // 2
    rep = H // G
    qh = q.transpose(1, 2)  # (B, 2H, T, D)
    # keys: sub-heads 2g, 2g+1 of group g, repeated for the group's pairs (pair-level GQA)
    kh = k.view(B, T, G, 2, D).repeat_interleave(rep, dim=2).reshape(B, T, 2 * H, D).transpose(1, 2)
    vh = v.repeat_interleave(rep, dim=2).transpose(1, 2)  # (B, H, T, Dv)
    w = torch.matmul(qh * D ** -0.5, kh.transpose(-1, -2))  # (B, 2H, T, T)
    if causal:
        w = w + torch.triu(torch.full((T, T), float("-inf")), 1)
    w = torch.softmax(w, dim=-1).view(B, H, 2, T, T)
    w = w[:, :, 0] - lam.view(1, H, 1, 1) * w[:, :, 1]
    return torch.matmul(w, vh).transpose(1, 2)  # (B, T, H, Dv)


def seconds(f):
    t0 = time.perf_counter()
    f()
    return time.perf_counter() - t0


def matmul_gflops(n, mm):
    a = np.random.default_rng(0).standard_normal((n, n), dtype=np.float32)
    b = np.random.default_rng(1).standard_normal((n, n), dtype=np.float32)
    mm(a, b)
    return 2 * n ** 3 / min(seconds(lambda: mm(a, b)) for _ in range(3)) * 1e-9


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--T", type=int, default=4096)
    ap.add_argument("--B", type=int, default=1)
    ap.add_argument("--H", type=int, default=4)
    ap.add_argument("--G", type=int, default=4)
    ap.add_argument("--D", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-causal", action="store_true")
    ap.add_argument("--backward", action="store_true", help="also time both backwards")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    threads = int(os.environ.get("DIFFATTN_NUM_THREADS", os.cpu_count()))
    torch.set_num_threads(threads)
    causal = not a.no_causal

    config = torch.__config__.show()
    blas = [f for f in config.replace("\n", ",").split(",") if "BLAS" in f or "LAPACK" in f]
    blas = [f.strip().replace("- Build settings: ", "") for f in blas]
    torch_rate = matmul_gflops(1024, lambda x, y: torch.matmul(torch.from_numpy(x), torch.from_numpy(y)))
    numpy_rate = matmul_gflops(1024, np.matmul)

    rng = np.random.default_rng(7)
    B, T, H, G, D = a.B, a.T, a.H, a.G, a.D
    q = rng.standard_normal((B, T, 2 * H, D), dtype=np.float32)
    k = rng.standard_normal((B, T, 2 * G, D), dtype=np.float32)
    v = rng.standard_normal((B, T, G, 2 * D), dtype=np.float32)
    lam = np.full((H,), 0.6, np.float32)
    dout = rng.standard_normal((B, T, H, 2 * D), dtype=np.float32)
    tq, tk, tv, tl = (torch.from_numpy(x) for x in (q, k, v, lam))

    # Same numbers first (a comparison of wrong results would be meaningless).
    with torch.no_grad():
        ref = naive_forward(tq, tk, tv, tl, causal).numpy()
    got = diffattn.diff_attention(q, k, v, lam, causal=causal)
    max_err = float(np.abs(got - ref).max())

    variants = {
        "torch naive fwd": lambda: torch.no_grad()(naive_forward)(tq, tk, tv, tl, causal),
        "diffattn fused fwd": lambda: diffattn.diff_attention(q, k, v, lam, causal=causal),
    }
    if a.backward:
        def torch_bwd():
            xs = [x.clone().requires_grad_(True) for x in (tq, tk, tv, tl)]
            out = naive_forward(*xs, causal)
            out.backward(torch.from_numpy(dout))

        variants["torch naive fwd+bwd"] = torch_bwd
        variants["diffattn fused fwd+bwd"] = lambda: diffattn.diff_attention_backward(
            q, k, v, lam, dout, causal=causal)
    times = {name: [] for name in variants}
    for r in range(a.rounds + 1):  # round 0 warms up
        for name, f in variants.items():
            # OpenBLAS's and OpenMP's worker threads spin for a while after a call; on a machine
            # with few cores they would steal the next variant's cycles. Let them settle.
            time.sleep(0.3)
            t = seconds(f)
            if r:
                times[name].append(t)
    med = {name: statistics.median(ts) for name, ts in times.items()}
    result = {
        "shape": f"B={B} H={H} G={G} T={T} D={D} Dv={2 * D} V1 causal={causal}",
        "threads": threads,
        "torch_blas": blas,
        "torch_matmul_gflops_1024": torch_rate,
        "numpy_matmul_gflops_1024": numpy_rate,
        "max_abs_diff_fused_vs_naive": max_err,
        "seconds": med,
        "speedup_fwd": med["torch naive fwd"] / med["diffattn fused fwd"],
    }
    if a.backward:
        result["speedup_fwd_bwd"] = med["torch naive fwd+bwd"] / med["diffattn fused fwd+bwd"]
    if a.json:
        print(json.dumps(result, indent=2))
        return
    print(f"{result['shape']}, {threads} threads, medians of {a.rounds} interleaved rounds")
    print("torch BLAS: " + ("; ".join(blas) if blas else "(torch.__config__ names none)"))
    print(f"sgemm 1024^3: torch.matmul {torch_rate:.1f} GFLOP/s, numpy.matmul {numpy_rate:.1f} GFLOP/s")
    print(f"max |fused - naive| = {max_err:.2e}")
    for name, t in med.items():
        print(f"  {name:24s} {t * 1e3:10.1f} ms")
    print(f"fused forward is {result['speedup_fwd']:.1f}x faster than the naive formulation")
    if a.backward:
        print(f"fused forward+backward is {result['speedup_fwd_bwd']:.1f}x faster")


if __name__ == "__main__":
    main()
