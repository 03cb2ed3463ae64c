#!/usr/bin/env python3
"""bench/gpu_tune.py: why diffattn.gpu's forward runs at the speed it does, on one GPU.

    PYTHONPATH=python python3 bench/gpu_tune.py [--json out.json] [--budget-s 200] [--dry-run]

For three forward problems (BF16, B = 4, T = 4096, not causal): standard attention at D = 128,
V1 differential attention at D = 64 (Dv = 128) and at D = 128 (Dv = 256), it times
  - the SDPA references (FlashAttention backend for standard attention; the best SDPA backend
    for the 2-call DiffLlama recipe),
  - diffattn.gpu's forward under a grid of tilings (_configs.force), with each compiled
    kernel's registers, spills and what its Triton GPU IR holds (asynchronous copies, wgmma,
    layout conversions),
  - for standard attention, two minimal forward kernels written here (query-block-fastest grid,
    (B, H, T, D) layout): pointer loads, and tensor descriptors (TMA) where this Triton has them;
    they say what Triton itself reaches on the device, apart from diffattn's kernel.
A markdown table to stdout, everything to --json (rewritten after each row). --dry-run runs
tiny shapes on the CPU under TRITON_INTERPRET=1 (numbers meaningless) so the script cannot rot.
"""

import argparse
import json
import os
import sys
import time

if "--dry-run" in sys.argv:
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

import diffattn.gpu as gpu  # noqa: E402
from diffattn.gpu import _configs  # noqa: E402
from diffattn.gpu._configs import Tiles  # noqa: E402
from diffattn.gpu._fwd import attn_fwd_kernel  # noqa: E402

LOG2E = 1.4426950408889634


@triton.jit
def mini_fwd_ptr(Q, K, V, O, T, qk_scale, D: tl.constexpr, BLOCK_M: tl.constexpr,
                 BLOCK_N: tl.constexpr):
    """Standard attention, (B*H, T, D) contiguous, T a multiple of the tiles, no mask."""
    pid_m = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    base = bh * T * D
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)
    q = tl.load(Q + base + offs_m[:, None] * D + offs_d[None, :])
    kt_ptrs = K + base + offs_n[None, :] * D + offs_d[:, None]          # (D, BLOCK_N)
    v_ptrs = V + base + offs_n[:, None] * D + offs_d[None, :]
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    for _ in range(0, T, BLOCK_N):
        kt = tl.load(kt_ptrs)
        s = tl.dot(q, kt) * qk_scale
        m_new = tl.maximum(m, tl.max(s, 1))
        p = tl.math.exp2(s - m_new[:, None])
        alpha = tl.math.exp2(m - m_new)
        l = l * alpha + tl.sum(p, 1)
        v = tl.load(v_ptrs)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
        m = m_new
        kt_ptrs += BLOCK_N * D
        v_ptrs += BLOCK_N * D
    acc = acc / l[:, None]
    tl.store(O + base + offs_m[:, None] * D + offs_d[None, :], acc.to(O.dtype.element_ty))


@triton.jit
def mini_fwd_desc(Q, K, V, O, T, qk_scale, D: tl.constexpr, BLOCK_M: tl.constexpr,
                  BLOCK_N: tl.constexpr):
    """The same through tensor descriptors (TMA on Hopper): (B*H*T, D) row-major views."""
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    rows = tl.num_programs(1) * T
    dq = tl.make_tensor_descriptor(Q, shape=[rows, D], strides=[D, 1], block_shape=[BLOCK_M, D])
    dk = tl.make_tensor_descriptor(K, shape=[rows, D], strides=[D, 1], block_shape=[BLOCK_N, D])
    dv = tl.make_tensor_descriptor(V, shape=[rows, D], strides=[D, 1], block_shape=[BLOCK_N, D])
    do = tl.make_tensor_descriptor(O, shape=[rows, D], strides=[D, 1], block_shape=[BLOCK_M, D])
    r0 = bh * T
    q = dq.load([r0 + pid_m * BLOCK_M, 0])
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    for start in range(0, T, BLOCK_N):
        k = dk.load([r0 + start, 0])
        s = tl.dot(q, k.T) * qk_scale
        m_new = tl.maximum(m, tl.max(s, 1))
        p = tl.math.exp2(s - m_new[:, None])
        alpha = tl.math.exp2(m - m_new)
        l = l * alpha + tl.sum(p, 1)
        v = dv.load([r0 + start, 0])
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
        m = m_new
    acc = acc / l[:, None]
    do.store([r0 + pid_m * BLOCK_M, 0], acc.to(O.dtype.element_ty))


def bench_ms(fn, dry):
    if dry:
        fn()
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e3
    return triton.testing.do_bench(fn, warmup=10, rep=40, return_mode="median")


def compiled_kernels(jit_fn):
    """Every compiled kernel of a JIT function so far (Triton 3.x caches), best effort."""
    out = []
    for cache in getattr(jit_fn, "device_caches", {}).values():
        table = cache[0] if isinstance(cache, tuple) else cache
        if isinstance(table, dict):
            out.extend(table.values())
    return out


def describe(kernel):
    d = {}
    for a in ("n_regs", "n_spills"):
        d[a] = getattr(kernel, a, None)
    md = getattr(kernel, "metadata", None)
    if md is not None:
        d["num_warps"] = getattr(md, "num_warps", None)
        d["num_stages"] = getattr(md, "num_stages", None)
        d["shared"] = getattr(md, "shared", None)
    ir = getattr(kernel, "asm", {}).get("ttgir", "") if hasattr(kernel, "asm") else ""
    for name, pat in (("async_copies", "async_copy_global_to_local"), ("tma_loads", "async_tma"),
                      ("wgmma", "warp_group_dot "), ("mma_sync", "tt.dot "),
                      ("convert_layout", "ttg.convert_layout"), ("plain_loads", "tt.load ")):
        d[name] = ir.count(pat)
    return d


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default="")
    ap.add_argument("--budget-s", type=float, default=200.0,
                    help="stop starting new tilings after this many seconds")
    ap.add_argument("--dry-run", action="store_true")
    args = ap.parse_args()
    dry = args.dry_run
    dev = torch.device("cpu" if dry else "cuda")
    dt = torch.float32 if dry else torch.bfloat16
    t0 = time.time()
    report = {"device": "cpu (dry run)" if dry else torch.cuda.get_device_name(dev),
              "torch": torch.__version__, "triton": triton.__version__, "rows": []}

    def save():
        if args.json:
            with open(args.json + ".tmp", "w") as f:
                json.dump(report, f, indent=1, default=str)
            os.replace(args.json + ".tmp", args.json)

    B, T = (1, 64) if dry else (4, 4096)
    gen = torch.Generator(device=dev).manual_seed(0)

    def mk(*s):
        return torch.randn(*s, device=dev, dtype=dt, generator=gen)

    print(f"# forward tilings on {report['device']} (torch {torch.__version__}, "
          f"triton {triton.__version__}), B = {B}, T = {T}, not causal\n")
    print("| problem | what | ms | TFLOP/s | regs | spills | async copies | wgmma | notes |")
    print("|---|---|---|---|---|---|---|---|---|")

    def row(problem, what, ms, flops, info=None, note=""):
        tf = None if ms is None else flops / (ms * 1e-3) / 1e12
        info = info or {}
        r = {"problem": problem, "what": what, "ms": ms, "tflops": tf, "info": info, "note": note}
        report["rows"].append(r)
        save()
        f = (lambda x, s="{:.1f}": "-" if x is None else s.format(x))
        print(f"| {problem} | {what} | {f(ms, '{:.3f}')} | {f(tf)} | {info.get('n_regs', '-')} | "
              f"{info.get('n_spills', '-')} | {info.get('async_copies', '-')} | "
              f"{info.get('wgmma', '-')} | {note} |")
        sys.stdout.flush()

    def sweep(problem, call, flops, tilings):
        for t in tilings:
            if time.time() - t0 > args.budget_s:
                row(problem, f"{t}", None, flops, note="skipped: budget")
                continue
            before = {id(k) for k in compiled_kernels(attn_fwd_kernel)}
            try:
                with _configs.force(fwd=t):
                    ms = bench_ms(call, dry)
            except Exception as e:  # noqa: BLE001 (a tiling that does not fit is reported)
                row(problem, f"M{t.BLOCK_M} N{t.BLOCK_N} w{t.num_warps} s{t.num_stages}", None,
                    flops, note=f"{type(e).__name__}: {str(e).splitlines()[0][:80]}")
                continue
            new = [k for k in compiled_kernels(attn_fwd_kernel) if id(k) not in before]
            row(problem, f"M{t.BLOCK_M} N{t.BLOCK_N} w{t.num_warps} s{t.num_stages}", ms, flops,
                describe(new[-1]) if new else {})

    grid = ([Tiles(16, 16, 1, 1)] if dry else
            [Tiles(m, n, w, s) for (m, n, w, s) in
             [(128, 64, 8, 3), (128, 64, 4, 3), (128, 128, 8, 3), (128, 64, 8, 2),
              (128, 32, 8, 3), (64, 64, 4, 3), (64, 64, 4, 4), (64, 128, 4, 3),
              (64, 32, 4, 3), (128, 128, 8, 2), (64, 64, 8, 3), (128, 64, 8, 4)]])
    grid_wide = ([Tiles(16, 16, 1, 1)] if dry else
                 [Tiles(m, n, w, s) for (m, n, w, s) in
                  [(64, 32, 8, 3), (64, 32, 4, 3), (64, 64, 8, 2), (64, 64, 4, 2),
                   (128, 32, 8, 2), (128, 64, 8, 2), (64, 16, 4, 3), (128, 16, 8, 3),
                   (64, 32, 8, 2), (32, 64, 4, 3)]])

    # --- standard attention, D = 128
    D, H = (16, 2) if dry else (128, 16)
    q, k, v = mk(B, H, T, D), mk(B, H, T, D), mk(B, H, T, D)
    flops = 4 * B * H * T * T * D
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION if not dry else SDPBackend.MATH):
        row("std D128", "SDPA flash", bench_ms(lambda: F.scaled_dot_product_attention(q, k, v),
                                                dry), flops)
    o = torch.empty_like(q)
    scale = D ** -0.5 * LOG2E
    for name, kern in (("mini ptr", mini_fwd_ptr), ("mini desc", mini_fwd_desc)):
        for bm, bn, w, s in ([(16, 16, 1, 1)] if dry else
                             [(128, 64, 8, 3), (128, 128, 8, 3), (128, 64, 4, 3)]):
            try:
                if kern is mini_fwd_desc and hasattr(triton, "set_allocator"):
                    triton.set_allocator(lambda size, align, stream: torch.empty(
                        size, dtype=torch.int8, device=dev))

                def call(kern=kern, bm=bm, bn=bn, w=w, s=s):
                    kern[(T // bm, B * H)](q, k, v, o, T, scale, D=D, BLOCK_M=bm, BLOCK_N=bn,
                                           num_warps=w, num_stages=s)
                ms = bench_ms(call, dry)
                err = (o.float() - F.scaled_dot_product_attention(q, k, v).float()).abs().max()
                info = describe(compiled_kernels(kern)[-1]) if compiled_kernels(kern) else {}
                row("std D128", f"{name} M{bm} N{bn} w{w} s{s}", ms, flops, info,
                    f"max err {float(err):.3g}")
            except Exception as e:  # noqa: BLE001
                row("std D128", f"{name} M{bm} N{bn} w{w} s{s}", None, flops,
                    note=f"{type(e).__name__}: {str(e).splitlines()[0][:80] if str(e) else ''}")
    tq, tk, tv = (x.transpose(1, 2) for x in (q, k, v))
    sweep("std D128", lambda: gpu.attention_fwd(tq, tk, tv), flops, grid)
    qc, kc, vc = (x.transpose(1, 2).contiguous() for x in (q, k, v))
    with _configs.force(fwd=grid[0]):
        ms = bench_ms(lambda: gpu.attention_fwd(qc, kc, vc), dry)
    row("std D128", f"{grid[0]} (B, T, H, D) contiguous", ms, flops)
    del q, k, v, o, tq, tk, tv, qc, kc, vc

    # --- V1, D = 64 and D = 128
    for D, grid_d in ((16, grid), (16, grid_wide)) if dry else ((64, grid), (128, grid_wide)):
        Dv, H = 2 * D, (2 if dry else 1024 // D)
        q, k, v = mk(B, T, 2 * H, D), mk(B, T, 2 * H, D), mk(B, T, H, Dv)
        lam = torch.full((H,), 0.5, device=dev)
        flops = B * H * (4 * T * T * D + 4 * T * T * Dv)
        q1, q2 = (q[:, :, i::2].transpose(1, 2).contiguous() for i in (0, 1))
        k1, k2 = (k[:, :, i::2].transpose(1, 2).contiguous() for i in (0, 1))
        vs = v.transpose(1, 2).contiguous()
        lam4 = lam.view(1, H, 1, 1)
        name = f"V1 D{D}"
        for bname, be in (("default", None), ("efficient", SDPBackend.EFFICIENT_ATTENTION),
                          ("cudnn", SDPBackend.CUDNN_ATTENTION)):
            def two(be=be):
                if be is None:
                    return (F.scaled_dot_product_attention(q1, k1, vs)
                            - lam4 * F.scaled_dot_product_attention(q2, k2, vs))
                with sdpa_kernel(be):
                    return (F.scaled_dot_product_attention(q1, k1, vs)
                            - lam4 * F.scaled_dot_product_attention(q2, k2, vs))
            try:
                row(name, f"2-call SDPA {bname}", bench_ms(two, dry), flops)
            except Exception as e:  # noqa: BLE001
                row(name, f"2-call SDPA {bname}", None, flops, note=type(e).__name__)
            if dry:
                break
        sweep(name, lambda: gpu.diff_attention_fwd(q, k, v, lam), flops, grid_d)
        del q, k, v, q1, q2, k1, k2, vs
    report["seconds"] = round(time.time() - t0, 1)
    save()
    print(f"\n{report['seconds']} s")


if __name__ == "__main__":
    main()
