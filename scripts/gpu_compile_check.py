#!/usr/bin/env python3
"""Compiles diffattn.gpu's Triton kernels for an NVIDIA GPU (sm_90, the H100, by default) on a
machine without one, and reports each kernel's registers, spills and shared memory.

Triton's wheel carries ptxas, so the whole pipeline (Triton IR -> PTX -> cubin) runs on the CPU.
The public functions are called on CPU tensors of representative shapes with Triton's launch
replaced by a compile for the target: the kernels see exactly the arguments, constexprs and
specialisations (16-byte divisibility of pointers and sizes) that a real launch would give them.
What this cannot tell is speed; it tells whether a tiling compiles, fits in shared memory, and
keeps its accumulators in registers (no spills), before any time on a GPU is spent.

    PYTHONPATH=python python3 scripts/gpu_compile_check.py            # default tilings
    PYTHONPATH=python python3 scripts/gpu_compile_check.py --all      # every candidate tiling
    PYTHONPATH=python python3 scripts/gpu_compile_check.py --only fwd_v1_d128

Exits 1 when a default tiling fails to compile, spills registers or needs more shared memory
than the target has. Must run without TRITON_INTERPRET (the kernels must be compiled ones).
"""

import argparse
import json
import os
import re
import subprocess
import sys
import time

if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
    sys.exit("gpu_compile_check.py: unset TRITON_INTERPRET (the kernels must be compiled, not "
             "interpreted)")

import torch  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.backends.nvidia.compiler import get_ptxas  # noqa: E402
from triton.compiler import ASTSource, make_backend  # noqa: E402
from triton.compiler import compile as triton_compile  # noqa: E402
from triton.runtime.jit import JITFunction, create_function_from_signature  # noqa: E402

from diffattn.gpu import _configs, interface  # noqa: E402

SHARED_LIMIT = {90: 227 * 1024, 80: 163 * 1024, 89: 99 * 1024}

_records = []   # one per compiled kernel: what the patched launch saw


def _compile_instead_of_launch(target):
    backend = make_backend(target)
    binders = {}

    def run(self, *args, grid, warmup, **kwargs):
        kwargs.setdefault("debug", False)
        if self not in binders:
            binders[self] = create_function_from_signature(self.signature, self.params, backend)
        bound, spec, options = binders[self](*args, **kwargs)
        options, signature, constexprs, attrs = self._pack_args(backend, kwargs, bound, spec,
                                                                options)
        rec = {"kernel": self.__name__, "num_warps": options.num_warps,
               "num_stages": options.num_stages,
               "constexprs": {self.arg_names[k[0]]: v for k, v in constexprs.items()
                              if self.arg_names[k[0]].isupper() and v is not None}}
        t0 = time.time()
        try:
            k = triton_compile(ASTSource(self, signature, constexprs, attrs), target=target,
                               options=options.__dict__)
        except Exception as e:  # noqa: BLE001 (reported, counted as a failure)
            chain, c = [], e
            while c is not None:  # the innermost frame says what went wrong
                chain.append(str(c))
                c = c.__cause__ or c.__context__
            msg = ("\n".join(chain) if os.environ.get("VERBOSE")
                   else chain[-1].splitlines()[-1][:200])
            rec["error"] = f"{type(e).__name__}: {msg}"
            _records.append(rec)
            return None
        rec["compile_s"] = round(time.time() - t0, 1)
        rec["shared"] = k.metadata.shared
        rec["wgmma"] = "wgmma" in k.asm["ptx"]
        rec.update(_ptxas_usage(k.asm["ptx"], target.arch))
        _records.append(rec)
        return None

    return run


def _ptxas_usage(ptx, arch):
    """registers and spill bytes, from ptxas -v on the kernel's PTX."""
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        src = os.path.join(d, "k.ptx")
        with open(src, "w") as f:
            f.write(ptx)
        sm = f"sm_{arch}a" if arch == 90 else f"sm_{arch}"
        r = subprocess.run([get_ptxas(arch).path, "-v", f"--gpu-name={sm}", src, "-o",
                            os.path.join(d, "k.cubin")], capture_output=True, text=True)
    text = r.stdout + r.stderr
    regs = re.findall(r"Used (\d+) registers", text)
    stores = re.findall(r"(\d+) bytes spill stores", text)
    return {"regs": int(regs[-1]) if regs else None,
            "spill_bytes": int(stores[-1]) if stores else None}


def _problems():
    """name -> a call of the public API at a representative shape (CPU tensors: only their
    dtypes, strides and alignment matter here)."""
    bf = torch.bfloat16

    def diff(D, Dv, shared, causal, dtype=bf, det=False, lam_tok=False, T=1024):
        def call():
            B, H, G = 1, 4, 2
            q = torch.empty(B, T, 2 * H, D, dtype=dtype)
            k = torch.empty(B, T, G if shared else 2 * G, D, dtype=dtype)
            v = torch.empty(B, T, G, Dv, dtype=dtype)
            lam = torch.empty(B, T, H) if lam_tok else torch.empty(H)
            out, lse, o2 = interface.diff_attention_fwd(q, k, v, lam, causal=causal)
            interface.diff_attention_bwd(torch.empty_like(out), q, k, v, lam, out, lse, o2,
                                         causal=causal, deterministic=det)
        return call

    def std(D, causal, dtype=bf, det=False, T=1024):
        def call():
            q = torch.empty(1, T, 8, D, dtype=dtype)
            k = torch.empty(1, T, 2, D, dtype=dtype)
            v = torch.empty(1, T, 2, D, dtype=dtype)
            out, lse = interface.attention_fwd(q, k, v, causal=causal)
            interface.attention_bwd(torch.empty_like(out), q, k, v, out, lse, causal=causal,
                                    deterministic=det)
        return call

    def decode(D, Dv, maps, shared, Tq=1, QPG=1, dtype=bf, paged=True):
        def call():
            B, G, BS, NB = 2, 8, 16, 64
            H = G * QPG
            q = torch.empty(B, Tq, maps * H, D, dtype=dtype)
            KH = G if (shared or maps == 1) else 2 * G
            kc = torch.empty(NB, BS, KH, D, dtype=dtype)
            vc = torch.empty(NB, BS, G, Dv, dtype=dtype)
            lens = torch.full((B,), 100, dtype=torch.int32)
            bt = torch.arange(B * 8, dtype=torch.int32).reshape(B, 8) if paged else None
            if not paged:  # (B, Tk_max, heads, dim)
                kc, vc = kc.reshape(B, -1, KH, D), vc.reshape(B, -1, G, Dv)
            if maps == 2:
                interface.diff_attention_with_kvcache(q, kc, vc, torch.empty(H), lens, bt)
            else:
                interface.attention_with_kvcache(q, kc, vc, lens, bt)
        return call

    return {
        "fwd_bwd_v1_d64": diff(64, 128, False, False),
        "fwd_bwd_v1_d64_causal": diff(64, 128, False, True),
        "fwd_bwd_v1_d128": diff(128, 256, False, False),
        "fwd_bwd_v1_d128_causal_det": diff(128, 256, False, True, det=True),
        "fwd_bwd_v2_d128_causal": diff(128, 128, True, True, lam_tok=True),
        "fwd_bwd_v2_d64": diff(64, 64, True, False, lam_tok=True),
        "fwd_bwd_v1_d64_fp32": diff(64, 128, False, True, dtype=torch.float32, det=True),
        "fwd_bwd_std_d64": std(64, False),
        "fwd_bwd_std_d128_causal_det": std(128, True, det=True),
        "decode_v1_d128": decode(128, 256, 2, False),
        "decode_v1_d64_gqa4": decode(64, 128, 2, False, QPG=4),
        "decode_v2_d128_tq4": decode(128, 128, 2, True, Tq=4, QPG=2),
        "decode_std_d128": decode(128, 128, 1, False, QPG=4),
        "decode_std_d64_contig": decode(64, 64, 1, False, paged=False),
    }


_KERNEL_TABLE = {"attn_fwd_kernel": "fwd", "attn_bwd_dkdv_kernel": "bwd_dkdv",
                 "attn_bwd_dq_kernel": "bwd_dq", "attn_decode_split_kernel": "decode"}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", type=int, default=90, help="compute capability x10 (default 90)")
    ap.add_argument("--all", action="store_true", help="every candidate tiling, not the default")
    ap.add_argument("--only", default="", help="problems whose name contains this")
    ap.add_argument("--json", default="", help="write the records here")
    args = ap.parse_args()

    target = GPUTarget("cuda", args.arch, 32)
    JITFunction.run = _compile_instead_of_launch(target)
    interface._device = lambda op, q: q.device          # CPU tensors stand for the GPU's
    limit = SHARED_LIMIT.get(args.arch, 99 * 1024)

    failures = 0
    for name, call in _problems().items():
        if args.only and args.only not in name:
            continue
        variants = [{}]
        if args.all:
            # every candidate of each table kernel this problem launches, one at a time
            start = len(_records)
            call()
            seen = {r["kernel"]: r for r in _records[start:]}
            del _records[start:]
            variants = []
            for kname, table in _KERNEL_TABLE.items():
                if kname not in seen:
                    continue
                c = seen[kname]["constexprs"]
                elem = 4 if c.get("DOT_PREC") == "ieee" else 2
                for t in _configs.candidates(table, c["MAPS"], c["BLOCK_D"], c["BLOCK_DV"], elem):
                    variants.append({table: t})
        for force in variants:
            start = len(_records)
            with _configs.force(**force):
                call()
            for r in _records[start:]:
                table = _KERNEL_TABLE.get(r["kernel"])
                if force and table not in force:
                    continue  # only the kernel whose tiling this variant forces
                c = r["constexprs"]
                tiles = f"M{c.get('BLOCK_M', c.get('BLOCK_R', '-'))} N{c.get('BLOCK_N', '-')} " \
                        f"w{r['num_warps']} s{r['num_stages']}"
                r["problem"] = name
                bad = ("error" in r or (r.get("spill_bytes") or 0) > 0
                       or (r.get("shared") or 0) > limit)
                r["ok"] = not bad
                if bad and not force:
                    failures += 1
                if "error" in r:
                    print(f"{name:28s} {r['kernel']:26s} {tiles:18s} FAILED {r['error']}")
                else:
                    print(f"{name:28s} {r['kernel']:26s} {tiles:18s} regs {r['regs']:3d} "
                          f"spill {r['spill_bytes']:5d} B  smem {r['shared'] // 1024:3d} KiB  "
                          f"{'wgmma' if r['wgmma'] else 'mma  '}  {r['compile_s']:5.1f} s"
                          + ("" if r["ok"] else
                             "   <-- " + ("spills" if r["spill_bytes"] else "smem")))
                sys.stdout.flush()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(_records, f, indent=1, default=str)
    if failures:
        print(f"{failures} default tiling(s) failed to compile, spill or exceed shared memory")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
