#!/usr/bin/env python3
"""bench/gpu_attention.py: diffattn.gpu's fused Triton kernels on one GPU, in one command.

    PYTHONPATH=python python3 bench/gpu_attention.py [--quick] [--json out.json] [--autotune]

1. Correctness on the device: tests/python/test_gpu_kernels.py under pytest when pytest is
   present (not with --quick), and always an internal check at larger shapes: every output and
   gradient against a float64 oracle on the device, within 2x the error of the same PyTorch
   computation in the inputs' dtype (FlashAttention's rule).
2. The device: copy bandwidth (device-to-device copy, bytes read + written) and a large bf16
   matmul's TFLOP/s, measured in this run.
3. Prefill and training, BF16, for T in {1k, 4k, 16k} (B*T = 16k tokens), D in {64, 128},
   causal and not; V1 (Dv = 2D, H = 1024/D pairs, one K/V group per pair):
     fused       diffattn.gpu.diff_attention_fwd (+ diff_attention_bwd)
     2-call      transformers' DiffLlama recipe: two SDPA calls, each on the double-width V
     4-call      upstream / vLLM recipe: four SDPA calls, V split in halves
     std-SDPA    standard attention of equal FLOPs (head dim 128, 3*H*D/128 heads), SDPA
                 forced to its FlashAttention backend
   FLOPs (per pair, non-causal): 4*Tq*Tk*D (two Q K^T) + 4*Tq*Tk*Dv (two P V); half when causal;
   a backward counts 2.5x the forward. The recipes use SDPA's default dispatch on tensors in
   SDPA's (B, heads, T, D) layout, prepared outside the timed region.
4. Decode, BF16, one new token per sequence against 4K..128K cached keys (B = 8, 8 pairs, one
   K/V group per pair, D = 64, Dv = 128): fused split-KV decode on a paged cache (block size 64,
   blocks in random order) and on a contiguous one, against the 2-call SDPA decode: GB/s of
   K/V read and the fraction of the copy bandwidth.

Each SDPA recipe runs under the SDPA backend that is fastest for it at that shape (default
dispatch, FlashAttention, memory-efficient or cuDNN, one quick timing each; the JSON names it):
the 2-call recipe's V is twice as wide as its K, which FlashAttention-2 refuses.

Every timing uses CUDA events after warm-up, recipes interleaved round by round (A B C A B C),
median of the rounds. A markdown table goes to stdout and everything to --json.

--dry-run runs the same code at tiny shapes on the CPU under TRITON_INTERPRET=1 (its numbers
mean nothing): the test suite runs it that way so this script cannot rot.
"""

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
import warnings

if "--dry-run" in sys.argv:  # before triton is imported: @triton.jit reads it at definition
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

# "import diffattn.gpu", not "from diffattn import gpu": without the compiled core, the package's
# __getattr__ answers the latter's attribute probe with an ImportError
import diffattn.gpu as gpu  # noqa: E402
from diffattn.gpu import _configs  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ------------------------------------------------------------------ timing


class Clock:
    """Times a callable: CUDA events on a GPU, the wall clock on the CPU (dry run)."""

    def __init__(self, device):
        self.cuda = device.type == "cuda"

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize()

    def ms(self, fn, iters):
        if self.cuda:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            for _ in range(iters):
                fn()
            b.record()
            b.synchronize()
            return a.elapsed_time(b) / iters
        t = time.perf_counter()
        for _ in range(iters):
            fn()
        return (time.perf_counter() - t) * 1e3 / iters


def interleaved(clock, fns, rounds, target_ms=20.0):
    """Median ms per call of each fn, measured round by round in turn. A fn that raises (no
    SDPA kernel for the shape, out of memory) is reported as None with the reason."""
    times, errors, iters = {n: [] for n in fns}, {}, {}
    for name, fn in fns.items():  # warm-up (compiles, autotunes) and calibration
        try:
            fn()
            clock.sync()
            one = clock.ms(fn, 1)
            iters[name] = max(1, min(200, int(target_ms / max(one, 1e-3))))
        except Exception as e:  # noqa: BLE001 (a recipe that cannot run is reported)
            errors[name] = f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"
    for _ in range(rounds):
        for name, fn in fns.items():
            if name not in errors:
                times[name].append(clock.ms(fn, iters[name]))
    out = {n: (statistics.median(t) if t else None) for n, t in times.items()}
    return out, errors


# ------------------------------------------------------------------ the device


def copy_bandwidth(clock, device, dry):
    """GB/s of a device-to-device copy, counting bytes read and written."""
    n = (1 << 20) if dry else (1 << 30)
    src = torch.empty(n, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    t, _ = interleaved(clock, {"copy": lambda: dst.copy_(src)}, 1 if dry else 5)
    return 2 * n / (t["copy"] * 1e-3) / 1e9


def matmul_tflops(clock, device, dry):
    n = 256 if dry else 8192
    dt = torch.float32 if dry else torch.bfloat16
    a = torch.randn(n, n, device=device, dtype=dt)
    b = torch.randn(n, n, device=device, dtype=dt)
    t, _ = interleaved(clock, {"mm": lambda: a @ b}, 1 if dry else 5)
    return 2 * n ** 3 / (t["mm"] * 1e-3) / 1e12


# ------------------------------------------------------------------ the oracle (correctness)


def _oracle(q, k, v, lam, causal):
    """Materialised differential (lam given) or standard attention in q's dtype: out, lse."""
    B, Tq, QH, D = q.shape
    Tk, G = k.shape[1], v.shape[2]
    s = 1.0 / math.sqrt(D)
    i = torch.arange(Tq, device=q.device)[:, None]
    j = torch.arange(Tk, device=q.device)[None, :]
    mask = (j <= i + Tk - Tq) if causal else torch.ones(Tq, Tk, dtype=torch.bool, device=q.device)

    def one(qm, km, rep):
        km, vm = km.repeat_interleave(rep, 2), v.repeat_interleave(rep, 2)
        sc = torch.einsum("bqhd,bkhd->bhqk", qm, km) * s
        sc = sc.masked_fill(~mask, float("-inf"))
        m = sc.amax(-1, keepdim=True).detach()
        m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
        e = torch.exp(sc - m)
        z = e.sum(-1, keepdim=True)
        zs = torch.where(z > 0, z, torch.ones_like(z))
        return torch.einsum("bhqk,bkhd->bqhd", e / zs, vm), torch.where(
            z > 0, m + torch.log(zs), torch.full_like(z, float("inf")))[..., 0]

    if lam is None:
        return one(q, k, QH // G)
    H = QH // 2
    k1, k2 = (k[:, :, 0::2], k[:, :, 1::2]) if k.shape[2] == 2 * G else (k, k)
    o1, l1 = one(q[:, :, 0::2], k1, H // G)
    o2, l2 = one(q[:, :, 1::2], k2, H // G)
    lamb = lam[..., None] if lam.dim() == 3 else (lam[:, None] if lam.dim() == 1 else lam)
    return o1 - lamb * o2, torch.stack([l1, l2], 2).reshape(B, 2 * H, Tq)


def _rule(name, got, ref, lowp):
    """FlashAttention's rule: |got - ref| <= 2 |lowp - ref| + floor; returns the error ratio."""
    fin = torch.isfinite(ref)
    if not torch.equal(torch.isinf(got.double()), torch.isinf(ref)):
        return name, float("inf"), "infinite entries differ"
    # half a unit in the last place of the result's own dtype: the rounding of the stored result
    half_ulp = 0.5 * torch.finfo(got.dtype).eps if got.dtype != torch.float32 else 0.0
    got, lowp, ref = got.double()[fin], lowp.double()[fin], ref[fin]
    err = (got - ref).abs().max().item()
    naive = (lowp - ref).abs().max().item()
    floor = (4 * torch.finfo(torch.float32).eps + half_ulp) * max(ref.abs().max().item(), 1.0)
    return name, err / max(naive, 1e-30), ("ok" if err <= 2 * naive + floor else
                                           f"error {err:.2e} > 2 x {naive:.2e} + {floor:.1e}")


def internal_check(device, dry):
    """Forward, backward (atomic and deterministic) and paged decode at a few shapes against the
    float64 oracle; returns a list of (name, ratio to the plain error, verdict)."""
    gen = torch.Generator().manual_seed(0)
    rows = []
    if dry:
        cases = [("v1 bf16 causal", 1, 40, 40, 2, 1, 16, 32, "v1", torch.bfloat16, True),
                 ("std f32", 1, 23, 37, 2, 1, 16, 16, "std", torch.float32, False)]
    else:
        cases = [("v1 bf16 causal T=2048 gqa", 2, 2048, 2048, 8, 2, 64, 128, "v1", torch.bfloat16,
                  True),
                 ("v1 bf16 D=128 Tq<Tk", 1, 700, 1500, 4, 2, 128, 256, "v1", torch.bfloat16, True),
                 ("v2 fp16 token-lambda", 2, 1000, 1000, 8, 1, 128, 128, "v2", torch.float16,
                  False),
                 ("std bf16 causal Tq>Tk", 2, 1100, 900, 8, 2, 128, 128, "std", torch.bfloat16,
                  True),
                 ("v1 fp32", 1, 300, 333, 2, 1, 64, 128, "v1", torch.float32, True)]
    for name, B, Tq, Tk, H, G, D, Dv, kind, dt, causal in cases:
        QH = H if kind == "std" else 2 * H
        KH = 2 * G if kind == "v1" else G
        q = torch.randn(B, Tq, QH, D, generator=gen).to(dt).to(device)
        k = torch.randn(B, Tk, KH, D, generator=gen).to(dt).to(device)
        v = torch.randn(B, Tk, G, Dv, generator=gen).to(dt).to(device)
        dout = torch.randn(B, Tq, H, Dv, generator=gen).to(dt).to(device)
        lam = None
        if kind == "v1":
            lam = torch.linspace(-0.3, 1.2, H, device=device)
        elif kind == "v2":
            lam = (torch.rand(B, Tq, H, generator=gen) * 1.5 - 0.2).to(device)
        for det in (False, True):
            if lam is None:
                out, lse = gpu.attention_fwd(q, k, v, causal=causal)
                grads = gpu.attention_bwd(dout, q, k, v, out, lse, causal=causal,
                                          deterministic=det)
            else:
                out, lse, o2 = gpu.diff_attention_fwd(q, k, v, lam, causal=causal)
                grads = gpu.diff_attention_bwd(dout, q, k, v, lam, out, lse, o2, causal=causal,
                                               deterministic=det)
            refs = {}
            for prec in (torch.float64, dt):
                xs = [x.detach().to(prec).requires_grad_() for x in (q, k, v)]
                lp = None if lam is None else lam.detach().to(prec).requires_grad_()
                o, ls = _oracle(*xs, lp, causal)
                g = torch.autograd.grad(o, xs + ([lp] if lp is not None else []), dout.to(prec))
                refs[prec] = (o.detach(), ls.detach(), g)
            tag = f"{name} {'det' if det else 'atomic'}"
            r64, rlp = refs[torch.float64], refs[dt]
            rows.append(_rule(f"{tag} out", out, r64[0], rlp[0]))
            rows.append(_rule(f"{tag} lse", lse, r64[1], rlp[1]))
            for gname, g, g64, glp in zip(("dq", "dk", "dv", "dlam"), grads, r64[2], rlp[2]):
                rows.append(_rule(f"{tag} {gname}", g, g64, glp))
    # varlen: packed sequences of their own lengths, each against the oracle on its own
    lens = [37, 0, 5, 50] if dry else [1500, 1, 0, 777, 2048]
    H, G, D, Dv, dt = (2, 1, 16, 32, torch.bfloat16) if dry else (8, 2, 128, 128, torch.bfloat16)
    cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32, device=device)
    T = sum(lens)
    q = torch.randn(T, 2 * H, D, generator=gen).to(dt).to(device)
    k = torch.randn(T, G, D, generator=gen).to(dt).to(device)
    v = torch.randn(T, G, Dv, generator=gen).to(dt).to(device)
    lam = (torch.rand(T, H, generator=gen) * 1.5 - 0.2).to(device)
    dout = torch.randn(T, H, Dv, generator=gen).to(dt).to(device)
    out, lse, o2 = gpu.diff_attention_varlen_fwd(q, k, v, lam, cu, cu, max(lens), max(lens),
                                                 causal=True)
    grads = gpu.diff_attention_varlen_bwd(dout, q, k, v, lam, out, lse, o2, cu, cu, max(lens),
                                          max(lens), causal=True)
    for b, n in enumerate(lens):
        if n == 0:
            continue
        sl = slice(int(cu[b]), int(cu[b + 1]))
        refs = {}
        for prec in (torch.float64, dt):
            xs = [x[sl][None].detach().to(prec).requires_grad_() for x in (q, k, v, lam)]
            o, ls = _oracle(*xs, True)
            g = torch.autograd.grad(o, xs, dout[sl][None].to(prec))
            refs[prec] = (o.detach(), ls.detach(), g)
        r64, rlp = refs[torch.float64], refs[dt]
        rows.append(_rule(f"varlen seq {b} ({n} rows) out", out[sl][None], r64[0], rlp[0]))
        rows.append(_rule(f"varlen seq {b} lse", lse[:, sl][None], r64[1], rlp[1]))
        for gname, g, g64, glp in zip(("dq", "dk", "dv", "dlam"), grads, r64[2], rlp[2]):
            rows.append(_rule(f"varlen seq {b} {gname}", g[sl][None], g64, glp))
    # paged decode, ragged lengths
    B, H, G, D, Dv, bs = (2, 4, 2, 16, 32, 8) if dry else (4, 8, 2, 128, 256, 64)
    lens = [37, 5] if dry else [5000, 17, 4096, 1]
    dt = torch.bfloat16
    max_blocks = -(-max(lens) // bs)
    nblocks = B * max_blocks + 1
    kc = torch.randn(nblocks, bs, 2 * G, D, generator=gen).to(dt).to(device)
    vc = torch.randn(nblocks, bs, G, Dv, generator=gen).to(dt).to(device)
    table = torch.randperm(nblocks, generator=gen)[:B * max_blocks].reshape(B, max_blocks)
    q = torch.randn(B, 1, 2 * H, D, generator=gen).to(dt).to(device)
    lam = torch.linspace(0.1, 0.9, H, device=device)
    seqlens = torch.tensor(lens, dtype=torch.int32, device=device)
    out, lse = gpu.diff_attention_with_kvcache(q, kc, vc, lam, seqlens, table.to(torch.int32).to(
        device), return_softmax_lse=True)
    for b, n in enumerate(lens):
        kk = kc[table[b]].reshape(-1, 2 * G, D)[:n][None]
        vv = vc[table[b]].reshape(-1, G, Dv)[:n][None]
        o64, l64 = _oracle(q[b:b + 1].double(), kk.double(), vv.double(), lam.double(), True)
        olp, llp = _oracle(q[b:b + 1], kk, vv, lam.to(dt), True)
        rows.append(_rule(f"decode seq {b} ({n} keys) out", out[b:b + 1], o64, olp))
        rows.append(_rule(f"decode seq {b} lse", lse[b:b + 1], l64, llp))
    return rows


def run_pytest(timeout_s):
    """tests/python/test_gpu_kernels.py on this device, when pytest is present."""
    import importlib.util
    if importlib.util.find_spec("pytest") is None:
        return {"ran": False, "reason": "pytest is not installed"}
    test = os.path.join(ROOT, "tests", "python", "test_gpu_kernels.py")
    if not os.path.exists(test):
        return {"ran": False, "reason": f"{test} is absent"}
    import diffattn
    env = dict(os.environ)
    pkg_root = os.path.dirname(os.path.dirname(os.path.abspath(diffattn.__file__)))
    env["PYTHONPATH"] = pkg_root + os.pathsep + env.get("PYTHONPATH", "")
    env["TRITON_INTERPRET"] = "0"   # the device's kernels, whatever conftest.py would guess
    t = time.time()
    try:
        r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test],
                           capture_output=True, text=True, env=env, timeout=timeout_s, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {"ran": True, "passed": False, "seconds": timeout_s, "tail": "timed out"}
    tail = (r.stdout + r.stderr).strip().splitlines()[-12:]
    return {"ran": True, "passed": r.returncode == 0, "seconds": round(time.time() - t, 1),
            "tail": "\n".join(tail)}


# ------------------------------------------------------------------ prefill and training


def diff_flops(B, H, Tq, Tk, D, Dv, causal):
    f = B * H * (4 * Tq * Tk * D + 4 * Tq * Tk * Dv)
    return f / 2 if causal else f


def sdpa(q, k, v, causal):
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal,
                                          enable_gqa=q.shape[1] != k.shape[1])


_BACKENDS = {"default": None, "flash": SDPBackend.FLASH_ATTENTION,
             "efficient": SDPBackend.EFFICIENT_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}


def best_backend(clock, fn):
    """A recipe at its best: fn run under each SDPA backend that accepts the shape (and under
    the default dispatch), one quick timing each; returns (the fastest as a callable, its name)."""
    def under(backend):
        if backend is None:
            return fn

        def run():
            with sdpa_kernel(backend):
                return fn()
        return run

    best, best_ms, name = fn, float("inf"), "default"
    for n, b in _BACKENDS.items():
        f = under(b)
        try:
            with warnings.catch_warnings():  # SDPA says why each backend refuses
                warnings.simplefilter("ignore", UserWarning)
                f()
                clock.sync()
                ms = min(clock.ms(f, 2) for _ in range(2))
        except Exception:  # noqa: BLE001 (a backend that refuses the shape)
            continue
        if ms < best_ms:
            best, best_ms, name = f, ms, n
    return best, name


def prefill_row(clock, device, dt, T, D, causal, rounds, tokens, heads_dim, train):
    """One shape: fused vs the SDPA recipes vs standard SDPA of equal FLOPs; ms and TFLOP/s."""
    B = max(1, tokens // T)
    H = heads_dim // D                      # pairs; 2H sub-heads of width D
    G, Dv = H, 2 * D
    gen = torch.Generator(device=device).manual_seed(T + D)
    mk = lambda *s: torch.randn(*s, device=device, dtype=dt, generator=gen)  # noqa: E731
    q, k, v = mk(B, T, 2 * H, D), mk(B, T, 2 * G, D), mk(B, T, G, Dv)
    lam = torch.full((H,), 0.5, device=device)
    dout = mk(B, T, H, Dv)
    # SDPA's layout, (B, heads, T, D), made once outside the timed region
    q1, q2 = q[:, :, 0::2].transpose(1, 2).contiguous(), q[:, :, 1::2].transpose(1, 2).contiguous()
    k1, k2 = k[:, :, 0::2].transpose(1, 2).contiguous(), k[:, :, 1::2].transpose(1, 2).contiguous()
    vs = v.transpose(1, 2).contiguous()
    va, vb = vs[..., :D].contiguous(), vs[..., D:].contiguous()
    lam4 = lam.view(1, H, 1, 1)
    dout_s = dout.transpose(1, 2).contiguous()
    # standard attention of equal FLOPs: head dim 128
    Hs = max(1, round(H * (2 * D + 2 * Dv) / (4 * 128)))
    sq, sk, sv = mk(B, Hs, T, 128), mk(B, Hs, T, 128), mk(B, Hs, T, 128)
    sdout = mk(B, Hs, T, 128)
    tq, tk, tv = (x.transpose(1, 2) for x in (sq, sk, sv))

    def two_call(q1, k1, q2, k2, vs, lam4):
        return sdpa(q1, k1, vs, causal) - lam4 * sdpa(q2, k2, vs, causal)

    def four_call(q1, k1, q2, k2, va, vb, lam4):
        a = torch.cat([sdpa(q1, k1, va, causal), sdpa(q1, k1, vb, causal)], -1)
        b = torch.cat([sdpa(q2, k2, va, causal), sdpa(q2, k2, vb, causal)], -1)
        return a - lam4 * b

    def std_flash(sq, sk, sv):
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return sdpa(sq, sk, sv, causal)

    fwd = {
        "fused": lambda: gpu.diff_attention_fwd(q, k, v, lam, causal=causal),
        "2-call": lambda: two_call(q1, k1, q2, k2, vs, lam4),
        "4-call": lambda: four_call(q1, k1, q2, k2, va, vb, lam4),
        "std-SDPA": lambda: std_flash(sq, sk, sv),
        "std-triton": lambda: gpu.attention_fwd(tq, tk, tv, causal=causal),
    }
    fns = fwd
    backends = {}
    if train:
        # every input a leaf, lambda included (the fused backward returns dlam too)
        l2 = [x.detach().requires_grad_() for x in (q1, k1, q2, k2, vs, lam4)]
        l4 = [x.detach().requires_grad_() for x in (q1, k1, q2, k2, va, vb, lam4)]
        sleaves = [x.detach().requires_grad_() for x in (sq, sk, sv)]

        def fused_train():
            out, lse, o2 = gpu.diff_attention_fwd(q, k, v, lam, causal=causal)
            return gpu.diff_attention_bwd(dout, q, k, v, lam, out, lse, o2, causal=causal)

        def std_triton_train():
            out, lse = gpu.attention_fwd(tq, tk, tv, causal=causal)
            return gpu.attention_bwd(sdout.transpose(1, 2), tq, tk, tv, out, lse, causal=causal)

        fns = {
            "fused": fused_train,
            "2-call": lambda: two_call(*l2).backward(dout_s),
            "4-call": lambda: four_call(*l4).backward(dout_s),
            "std-SDPA": lambda: std_flash(*sleaves).backward(sdout),
            "std-triton": std_triton_train,
        }
    for n in ("2-call", "4-call"):
        fns[n], backends[n] = best_backend(clock, fns[n])
    ms, errors = interleaved(clock, fns, rounds)
    flops = diff_flops(B, H, T, T, D, Dv, causal) * (3.5 if train else 1.0)
    std_flops = B * Hs * 4 * T * T * 128 / (2 if causal else 1) * (3.5 if train else 1.0)
    row = {"mode": "fwd+bwd" if train else "fwd", "T": T, "B": B, "H": H, "D": D, "Dv": Dv,
           "causal": causal, "ms": ms, "errors": errors,
           "tflops": {n: (None if t is None else (std_flops if n.startswith("std") else flops)
                          / (t * 1e-3) / 1e12) for n, t in ms.items()},
           "std_heads": Hs, "sdpa_backends": backends}
    recipes = [ms[n] for n in ("2-call", "4-call") if ms.get(n)]
    row["vs_best_recipe"] = (min(recipes) / ms["fused"]) if recipes and ms.get("fused") else None
    row["vs_std_sdpa_tflops"] = (row["tflops"]["fused"] / row["tflops"]["std-SDPA"]
                                 if ms.get("fused") and ms.get("std-SDPA") else None)
    return row


# ------------------------------------------------------------------ decode


def decode_row(clock, device, dt, n_keys, rounds, copy_gbps, B, H, G, D, Dv, block_size):
    gen = torch.Generator(device=device).manual_seed(n_keys)
    mk = lambda *s: torch.randn(*s, device=device, dtype=dt, generator=gen)  # noqa: E731
    nb = n_keys // block_size
    kc, vc = mk(B * nb, block_size, 2 * G, D), mk(B * nb, block_size, G, Dv)
    table = torch.randperm(B * nb, device=device, generator=gen).to(torch.int32).view(B, nb)
    kd = kc.view(B, nb * block_size, 2 * G, D)       # the same bytes as a contiguous cache
    vd = vc.view(B, nb * block_size, G, Dv)
    q = mk(B, 1, 2 * H, D)
    lam = torch.full((H,), 0.5, device=device)
    seqlens = torch.full((B,), n_keys, dtype=torch.int32, device=device)
    # the 2-call recipe's caches in SDPA's layout (B, heads, Tk, D)
    k1 = kd[:, :, 0::2].transpose(1, 2).contiguous()
    k2 = kd[:, :, 1::2].transpose(1, 2).contiguous()
    vs = vd.transpose(1, 2).contiguous()
    q1 = q[:, :, 0::2].transpose(1, 2).contiguous()
    q2 = q[:, :, 1::2].transpose(1, 2).contiguous()
    lam4 = lam.view(1, H, 1, 1)
    fns = {
        "fused-paged": lambda: gpu.diff_attention_with_kvcache(q, kc, vc, lam, seqlens, table),
        "fused-contig": lambda: gpu.diff_attention_with_kvcache(q, kd, vd, lam, seqlens),
        "2-call": lambda: sdpa(q1, k1, vs, False) - lam4 * sdpa(q2, k2, vs, False),
    }
    fns["2-call"], backend = best_backend(clock, fns["2-call"])
    ms, errors = interleaved(clock, fns, rounds)
    kv_bytes = B * n_keys * (2 * G * D + G * Dv) * kc.element_size()
    gbps = {n: (None if t is None else kv_bytes / (t * 1e-3) / 1e9) for n, t in ms.items()}
    return {"keys": n_keys, "B": B, "H": H, "G": G, "D": D, "Dv": Dv, "block_size": block_size,
            "sdpa_backend": backend, "ms": ms, "errors": errors, "kv_bytes": kv_bytes, "GBps": gbps,
            "of_copy_bw": {n: (None if g is None else g / copy_gbps) for n, g in gbps.items()},
            "vs_2call": (ms["2-call"] / ms["fused-paged"]
                         if ms.get("2-call") and ms.get("fused-paged") else None)}


# ------------------------------------------------------------------ report


def _f(x, fmt="{:.2f}"):
    return "-" if x is None else fmt.format(x)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer shapes and rounds; no pytest")
    ap.add_argument("--dry-run", action="store_true",
                    help="tiny shapes on the CPU under TRITON_INTERPRET=1 (numbers meaningless)")
    ap.add_argument("--json", default="", help="write every number here")
    ap.add_argument("--autotune", nargs="?", const="all", default="",
                    help="time each kernel's candidate tilings at first use and keep the fastest; "
                    "optionally only some tables, comma-separated (fwd,bwd_dkdv,bwd_dq,decode)")
    ap.add_argument("--no-pytest", action="store_true", help="skip the pytest correctness run")
    args = ap.parse_args()

    dry = args.dry_run
    if dry:
        device = torch.device("cpu")
    elif torch.cuda.is_available():
        device = torch.device("cuda")
    else:
        sys.exit("gpu_attention.py: no CUDA device (use --dry-run to exercise the script on the "
                 "CPU under TRITON_INTERPRET=1)")
    if args.autotune == "all":
        _configs.autotune(True)
    elif args.autotune:
        _configs.autotune(True, kernels=args.autotune.split(","))
    clock = Clock(device)
    import triton
    report = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else
              "cpu (TRITON_INTERPRET=1, dry run: timings meaningless)",
              "torch": torch.__version__, "triton": triton.__version__, "dry_run": dry,
              "quick": args.quick, "autotune": args.autotune}
    print(f"# diffattn.gpu benchmark on {report['device']} (torch {torch.__version__}, "
          f"triton {triton.__version__})\n")
    t_start = time.time()

    def save():  # after every row, so a run cut off by a time limit keeps what it measured
        if args.json:
            tmp = args.json + ".tmp"
            with open(tmp, "w") as f:
                json.dump(report, f, indent=1, default=str)
            os.replace(tmp, args.json)

    # 1. correctness
    if not (args.quick or args.no_pytest or dry):
        report["pytest"] = run_pytest(timeout_s=360)
        p = report["pytest"]
        print(f"pytest tests/python/test_gpu_kernels.py: "
              f"{'PASSED' if p.get('passed') else ('FAILED' if p['ran'] else 'not run')} "
              f"({p.get('seconds', '-')} s) {p.get('reason', '')}")
        if p["ran"]:
            print("    " + p["tail"].replace("\n", "\n    "))
    rows = internal_check(device, dry)
    bad = [r for r in rows if r[2] != "ok"]
    report["check"] = {"cases": len(rows), "failed": [list(r) for r in bad],
                       "max_ratio": max(r[1] for r in rows)}
    print(f"internal check: {len(rows) - len(bad)}/{len(rows)} within FlashAttention's rule "
          f"(largest error / plain-PyTorch error: {report['check']['max_ratio']:.2f})")
    for r in bad:
        print(f"    FAILED {r[0]}: {r[2]}")

    # 2. the device
    report["copy_GBps"] = copy_bandwidth(clock, device, dry)
    report["matmul_bf16_TFLOPs"] = matmul_tflops(clock, device, dry)
    save()
    print(f"\ndevice-to-device copy: {report['copy_GBps']:.0f} GB/s; "
          f"bf16 matmul 8192^3: {report['matmul_bf16_TFLOPs']:.0f} TFLOP/s\n")

    # 3. prefill and training
    dt = torch.float32 if dry else torch.bfloat16
    if dry:
        Ts, Ds, rounds, tokens, heads_dim = [32], [16], 1, 32, 32
    elif args.quick:
        Ts, Ds, rounds, tokens, heads_dim = [1024, 4096], [64, 128], 3, 16384, 1024
    else:
        Ts, Ds, rounds, tokens, heads_dim = [1024, 4096, 16384], [64, 128], 5, 16384, 1024
    report["prefill"] = []
    print("| mode | T | D | causal | fused TFLOP/s | 2-call | 4-call | std-SDPA (FA) | "
          "std-triton | fused / best recipe | fused / std-SDPA | recipes' SDPA backends |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for train in (False, True):
        for D in Ds:
            for T in Ts:
                for causal in (False, True):
                    r = prefill_row(clock, device, dt, T, D, causal, rounds, tokens, heads_dim,
                                    train)
                    report["prefill"].append(r)
                    save()
                    tf = r["tflops"]
                    print(f"| {r['mode']} | {T} | {D} | {causal} | {_f(tf['fused'], '{:.0f}')} | "
                          f"{_f(tf['2-call'], '{:.0f}')} | {_f(tf['4-call'], '{:.0f}')} | "
                          f"{_f(tf['std-SDPA'], '{:.0f}')} | {_f(tf['std-triton'], '{:.0f}')} | "
                          f"{_f(r['vs_best_recipe'])}x | {_f(r['vs_std_sdpa_tflops'])}x | "
                          f"{r['sdpa_backends'].get('2-call', '-')}, "
                          f"{r['sdpa_backends'].get('4-call', '-')} |")
                    for n, e in r["errors"].items():
                        print(f"|   {n} did not run: {e} |")
                    sys.stdout.flush()

    # 4. decode
    if dry:
        keys, dims = [64, 128], dict(B=2, H=4, G=2, D=16, Dv=32, block_size=16)
    else:
        keys = [4096, 32768] if args.quick else [4096, 16384, 32768, 65536, 131072]
        dims = dict(B=8, H=8, G=8, D=64, Dv=128, block_size=64)
    report["decode"] = []
    print("\n| keys | fused paged GB/s | of copy BW | fused contiguous GB/s | 2-call GB/s | "
          "fused / 2-call | 2-call SDPA backend |")
    print("|---|---|---|---|---|---|---|")
    for n in keys:
        r = decode_row(clock, device, dt, n, 3 if dry else 7, report["copy_GBps"], **dims)
        report["decode"].append(r)
        save()
        g, c = r["GBps"], r["of_copy_bw"]
        print(f"| {n} | {_f(g['fused-paged'], '{:.0f}')} | {_f(c['fused-paged'])} | "
              f"{_f(g['fused-contig'], '{:.0f}')} | {_f(g['2-call'], '{:.0f}')} | "
              f"{_f(r['vs_2call'])}x | {r['sdpa_backend']} |")
        for name, e in r["errors"].items():
            print(f"|   {name} did not run: {e} |")

    # 5. the goals, from the numbers above
    def gm(xs):
        xs = [x for x in xs if x]
        return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else None

    fwd = [r for r in report["prefill"] if r["mode"] == "fwd"]
    trn = [r for r in report["prefill"] if r["mode"] == "fwd+bwd"]
    at32k = [r for r in report["decode"] if r["keys"] == 32768] or report["decode"][-1:]
    goals = {
        "forward >= 1.15x best SDPA recipe (geomean, min)":
            (gm([r["vs_best_recipe"] for r in fwd]),
             min((r["vs_best_recipe"] for r in fwd if r["vs_best_recipe"]), default=None), 1.15),
        "fwd+bwd >= 1.1x best SDPA recipe (geomean, min)":
            (gm([r["vs_best_recipe"] for r in trn]),
             min((r["vs_best_recipe"] for r in trn if r["vs_best_recipe"]), default=None), 1.1),
        "forward TFLOP/s >= 0.7x standard SDPA of equal FLOPs (geomean, min)":
            (gm([r["vs_std_sdpa_tflops"] for r in fwd]),
             min((r["vs_std_sdpa_tflops"] for r in fwd if r["vs_std_sdpa_tflops"]), default=None),
             0.7),
        "decode >= 1.4x 2-call at 32K keys": (at32k[0]["vs_2call"], None, 1.4),
        "decode >= 0.8x copy bandwidth at 32K keys":
            (at32k[0]["of_copy_bw"]["fused-paged"], None, 0.8),
    }
    report["goals"] = {k: {"value": v, "min": m, "goal": g,
                           "met": None if (v is None or dry)
                           else bool(v >= g and (m is None or m >= g))}
                       for k, (v, m, g) in goals.items()}
    print("\n| goal | measured | min | met |\n|---|---|---|---|")
    for k, g in report["goals"].items():
        print(f"| {k} | {_f(g['value'])} | {_f(g['min'])} | "
              f"{'-' if g['met'] is None else ('yes' if g['met'] else 'no')} |")
    report["tuned"] = _configs.tuned()
    if report["tuned"]:
        print("\nautotuned tilings:", json.dumps(report["tuned"], indent=1))
    report["seconds"] = round(time.time() - t_start, 1)
    print(f"\n{report['seconds']} s"
          + ("  (dry run: the numbers above mean nothing)" if dry else ""))
    save()
    failed = bool(bad) or (report.get("pytest", {}).get("ran") and
                           not report["pytest"].get("passed"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
