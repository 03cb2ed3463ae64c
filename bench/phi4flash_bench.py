#!/usr/bin/env python3
"""Phi-4-mini-flash (model_type "phi4flash", docs/models/phi4flash.md) on this machine's CPU at the
published shape: prefill and decode tokens/s against the machine's limits, and the state a
sequence holds against a Llama of similar size.

    .venv/bin/python bench/phi4flash_bench.py [--dir /work/ext/phi4flash-full] [--prompts 128,512,2048]
    .venv/bin/python bench/phi4flash_bench.py --shape small --dir /tmp/phi4flash-small   # a quick check

1. The checkpoint: --dir is used as it is when it holds a config.json (bench/make_hf_checkpoint.py
   writes config.json last, so one there means a whole directory); else the script writes random
   weights in the published layout there (`make_hf_checkpoint.py --type phi4flash --shape full
   --dtype bf16`: 7.7 GB, about 10 minutes), after checking the disk has room.
2. Read bandwidth, measured here: numpy's sum over a 1 GiB float32 array, best of 5 (one
   thread), beside the engine's own multi-threaded read-bandwidth probe that `generate --bench`
   prints. Decode bound = bandwidth / bytes a token reads: every weight once (the tied embedding
   whole, as the output layer) plus the state it reads at the mean context (Mamba states read and
   written in F32, the sliding windows, and the YOCO keys/values read by the full-attention layer
   and each cross layer).
3. For each prompt length P: `diffattn generate --model DIR --bench N --bench-prompt P` (one
   sequence, greedy, the K/V cache in --kv-dtype): prefill tokens/s and GFLOP/s against the same
   run's sgemm rate, decode tokens/s against the bounds above.
4. Memory per sequence at 4K, 32K and 128K context: the formula of docs/models/phi4flash.md
   ("Memory per sequence") for phi4flash and for Llama-3.2-3B (28 layers, 8 K/V heads of 128),
   and, beside it, what the engine says (`diffattn info DIR`'s "state bytes per sequence" table,
   when it prints one; else formula only, and the script says so).

Markdown tables go to stdout; --json writes everything measured.
"""

import argparse
import importlib.util
import json
import math
import os
import re
import shutil
import struct
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
LLAMA_3B = {"layers": 28, "kv_heads": 8, "head_dim": 128}  # Llama-3.2-3B's config.json
CONTEXTS = (4096, 32768, 131072)
MIB = float(1 << 20)


def writer():
    spec = importlib.util.spec_from_file_location("make_hf_checkpoint", os.path.join(HERE, "make_hf_checkpoint.py"))
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


def default_cli():
    built = os.path.join(ROOT, "build", "diffattn")
    return built if os.path.exists(built) else (shutil.which("diffattn") or built)


# ------------------------------------------------------------------ the checkpoint

def ensure_checkpoint(d, shape, dtype, allow_write=True):
    """The directory's config.json; writes the directory first when it has none."""
    mk = writer()
    want = mk.FLASH_SHAPES[shape]
    cfg_path = os.path.join(d, "config.json")
    if os.path.exists(cfg_path):
        cfg = json.load(open(cfg_path))
        if cfg.get("model_type") != "phi4flash" or any(
                cfg.get(k) != want[k] for k in ("hidden_size", "num_hidden_layers", "vocab_size")):
            sys.exit(f"{d} holds a config.json that is not phi4flash --shape {shape}; pick another --dir")
        print(f"checkpoint: {d} (present, {cfg.get('torch_dtype')})", flush=True)
        return cfg
    if not allow_write:
        sys.exit(f"{d} has no config.json and --no-write was given")
    conf = mk.flash_config(shape, dtype.upper())
    es = 4 if dtype == "f32" else 2
    need = sum(math.prod(s) * (4 if kind in ("A_log", "lambda") else es) for _, s, kind in mk.flash_tensors_of(conf))
    os.makedirs(d, exist_ok=True)
    free = shutil.disk_usage(d).free
    if free < 1.1 * need + (1 << 30):
        sys.exit(f"{d}: {need / 1e9:.2f} GB of weights to write, {free / 1e9:.2f} GB free")
    print(f"checkpoint: writing {need / 1e9:.2f} GB of random weights to {d} ...", flush=True)
    t0 = time.time()
    subprocess.run([sys.executable, os.path.join(HERE, "make_hf_checkpoint.py"), "--out", d, "--type", "phi4flash",
                    "--shape", shape, "--dtype", dtype], check=True)
    print(f"checkpoint: written in {time.time() - t0:.0f} s", flush=True)
    return json.load(open(cfg_path))


def weight_bytes(d):
    """Bytes of tensor data in the directory's safetensors files (from their headers)."""
    total = 0
    for f in sorted(os.listdir(d)):
        if f.endswith(".safetensors"):
            with open(os.path.join(d, f), "rb") as fh:
                (n,) = struct.unpack("<Q", fh.read(8))
                header = json.loads(fh.read(n))
            total += sum(v["data_offsets"][1] - v["data_offsets"][0] for k, v in header.items() if k != "__metadata__")
    return total


# ------------------------------------------------------------------ the model's arithmetic

def dims(cfg):
    L, C, H, G = cfg["num_hidden_layers"], cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    h = L // 2
    kinds = [("mamba" if i % 2 == 0 else "swa") if i < h else "memory" if i == h else
             "full" if i == h + 1 else ("gmu" if i % 2 == 0 else "cross") for i in range(L)]
    return dict(L=L, C=C, G=G, d=C // H, W=cfg["sliding_window"], N=cfg.get("mamba_d_state", 16),
                K=cfg.get("mamba_d_conv", 4), E=cfg.get("mamba_expand", 2) * C,
                n_mamba=sum(k in ("mamba", "memory") for k in kinds), n_swa=kinds.count("swa"),
                n_cross=kinds.count("cross"))


def state_elements(cfg, n):
    """docs/models/phi4flash.md: 9 E (K - 1 + N) + 8 * 2 * min(n, W) * G d + 2 n G d at the
    published shape, by part."""
    D = dims(cfg)
    return {"mamba": D["n_mamba"] * D["E"] * (D["K"] - 1 + D["N"]),
            "swa": D["n_swa"] * 2 * min(n, D["W"]) * D["G"] * D["d"],
            "yoco": 2 * n * D["G"] * D["d"]}


def llama_elements(n):
    return LLAMA_3B["layers"] * 2 * n * LLAMA_3B["kv_heads"] * LLAMA_3B["head_dim"]


def state_read_bytes(cfg, n, kv_bytes):
    """Bytes of state one decode step reads at context n: Mamba conv and scan states read and
    written (F32), each sliding window once, the YOCO keys/values by the full-attention layer and
    by each cross layer."""
    D = dims(cfg)
    el = state_elements(cfg, n)
    return 2 * 4 * el["mamba"] + kv_bytes * (el["swa"] + (1 + D["n_cross"]) * el["yoco"])


# ------------------------------------------------------------------ measurements

def numpy_read_bandwidth(gib=1.0, rounds=5):
    """GB/s (1e9 bytes) of numpy's float32 sum over a `gib` GiB array, best of `rounds`."""
    import numpy as np
    a = np.ones(int(gib * (1 << 30)) // 4, np.float32)
    a.sum()  # pages touched, caches warm
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        a.sum()
        best = min(best, time.perf_counter() - t0)
    bw = a.nbytes / best / 1e9
    del a
    return bw


NUM = r"([0-9][0-9.e+-]*)"
BENCH_LINES = {
    "load": re.compile(rf"load {NUM} s; peak RSS {NUM} GB = {NUM} x the weights' {NUM} GB"),
    "prefill": re.compile(rf"prefill (\d+) tokens in {NUM} s: {NUM} tokens/s, {NUM} GFLOP/s = {NUM} x sgemm "
                          rf"\({NUM} GFLOP/s\)"),
    "decode": re.compile(rf"decode (\d+) tokens in {NUM} s: {NUM} tokens/s = {NUM} x the bound {NUM} tokens/s "
                         rf"\(read bandwidth {NUM} GB/s / {NUM} GB a token\)"),
    "state": re.compile(rf"state a sequence holds after (\d+) positions: {NUM} MiB"),
}


def parse_bench(text):
    """The numbers of `diffattn generate --bench`'s lines (cmd_generate.cpp's printf formats);
    a line it did not print is absent from the result."""
    out = {}
    for key, rx in BENCH_LINES.items():
        m = rx.search(text)
        if m:
            out[key] = [float(g) for g in m.groups()]
    r = {}
    if "load" in out:
        r.update(load_s=out["load"][0], rss_gb=out["load"][1], weights_gb=out["load"][3])
    if "prefill" in out:
        p = out["prefill"]
        r.update(prompt=int(p[0]), prefill_s=p[1], prefill_tps=p[2], prefill_gflops=p[3], prefill_x_sgemm=p[4],
                 sgemm_gflops=p[5])
    if "decode" in out:
        p = out["decode"]
        r.update(decode_tokens=int(p[0]), decode_s=p[1], decode_tps=p[2], decode_x_bound=p[3],
                 engine_bound_tps=p[4], engine_bw_gbs=p[5], engine_gb_per_token=p[6])
    if "state" in out:
        r.update(state_positions=int(out["state"][0]), state_mib=out["state"][1])
    return r


def parse_info_state(text):
    """{context: (MiB with an F32 cache, MiB with a BF16 cache)} from `diffattn info`'s "state
    bytes per sequence" table, or {} when it prints none."""
    part = re.split(r"state bytes per sequence[^\n]*\n", text, maxsplit=1)
    if len(part) < 2:
        return {}
    rows = re.findall(r"^\s*(\d+)\s+([0-9.]+)\s+([0-9.]+)\s*$", part[1].split("\n\n", 1)[0], re.M)
    return {int(n): (float(a), float(b)) for n, a, b in rows}


def run(cmd, timeout):
    t0 = time.time()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, f"timed out after {timeout} s"
    if p.returncode != 0:
        return None, f"exit {p.returncode}: {p.stderr.strip()[-600:]}"
    return p.stdout + p.stderr, f"{time.time() - t0:.1f} s"


# ------------------------------------------------------------------ tables

def table(header, rows):
    out = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def fmt(x, nd=2):
    return "—" if x is None else f"{x:,.{nd}f}"


def memory_rows(cfg, engine):
    """Per context: phi4flash elements by part; MiB with F32 Mamba states and BF16 K/V (the
    engine's layout), all BF16, all F32; the engine's figures; Llama-3.2-3B's; the ratio."""
    rows = []
    for n in CONTEXTS:
        el = state_elements(cfg, n)
        kv = el["swa"] + el["yoco"]
        mixed = (4 * el["mamba"] + 2 * kv) / MIB
        bf16, f32 = 2 * (el["mamba"] + kv) / MIB, 4 * (el["mamba"] + kv) / MIB
        lb, lf = 2 * llama_elements(n) / MIB, 4 * llama_elements(n) / MIB
        e = engine.get(n)
        rows.append([f"{n:,}", f"{el['mamba']:,} / {el['swa']:,} / {el['yoco']:,}", fmt(mixed), fmt(bf16), fmt(f32),
                     fmt(e[1]) if e else "—", fmt(e[0]) if e else "—", fmt(lb, 0), fmt(lf, 0), f"{lb / bf16:.1f}x / {lb / mixed:.1f}x"])
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default=None, help="the checkpoint directory (default /work/ext/phi4flash-SHAPE)")
    ap.add_argument("--shape", default="full", choices=["full", "small", "tiny"])
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "f32"], help="weights to write when absent")
    ap.add_argument("--no-write", action="store_true", help="refuse to write a missing checkpoint")
    ap.add_argument("--prompts", default="128,512,2048", help="prompt lengths, comma-separated")
    ap.add_argument("--tokens", type=int, default=16, help="decode steps per run")
    ap.add_argument("--kv-dtype", default="bf16", choices=["f32", "bf16", "f16"])
    ap.add_argument("--threads", type=int, default=None, help="diffattn --threads (default: every hardware thread)")
    ap.add_argument("--cli", default=default_cli())
    ap.add_argument("--timeout", type=int, default=1800, help="seconds per diffattn run")
    ap.add_argument("--json", default=None, help="write the measurements here")
    a = ap.parse_args()
    d = a.dir or f"/work/ext/phi4flash-{a.shape}"
    prompts = [int(x) for x in a.prompts.split(",") if x]

    cfg = ensure_checkpoint(d, a.shape, a.dtype, not a.no_write)
    wbytes = weight_bytes(d)
    kvb = {"f32": 4, "bf16": 2, "f16": 2}[a.kv_dtype]
    print(f"weights: {wbytes:,} bytes ({wbytes / 1e9:.3f} GB)", flush=True)
    bw = numpy_read_bandwidth()
    print(f"read bandwidth (numpy sum, 1 GiB, one thread, best of 5): {bw:.2f} GB/s", flush=True)
    glob = [a.cli] + (["--threads", str(a.threads)] if a.threads else [])
    results = {"dir": d, "shape": a.shape, "weights_bytes": wbytes, "numpy_read_gbs": bw, "kv_dtype": a.kv_dtype,
               "runs": [], "cpu_count": os.cpu_count()}

    rows = []
    for P in prompts:
        text, note = run(glob + ["generate", "--model", d, "--bench", str(a.tokens), "--bench-prompt", str(P),
                                 "--kv-dtype", a.kv_dtype], a.timeout)
        print(f"generate --bench {a.tokens} --bench-prompt {P}: {note}", flush=True)
        if text is None:
            results["runs"].append({"prompt": P, "error": note})
            rows.append([P, "failed: " + note.splitlines()[0][:80]] + ["—"] * 7)
            continue
        r = parse_bench(text)
        r["raw"] = text
        mean = r.get("prompt", P) + r.get("decode_tokens", a.tokens) / 2
        per_tok = wbytes + state_read_bytes(cfg, int(mean), kvb)
        r["bound_tps"] = bw * 1e9 / per_tok
        r["bound_weights_only_tps"] = bw * 1e9 / wbytes
        results["runs"].append(r)
        dec = r.get("decode_tps")
        rows.append([r.get("prompt", P), fmt(r.get("prefill_tps"), 1),
                     f"{fmt(r.get('prefill_gflops'), 1)} ({fmt(r.get('prefill_x_sgemm'))}x)",
                     fmt(dec, 3), f"{fmt(r['bound_tps'], 3)} ({per_tok / 1e9:.3f} GB)",
                     f"{dec / r['bound_tps']:.0%}" if dec else "—",
                     f"{fmt(r.get('engine_bound_tps'), 3)} ({fmt(r.get('engine_bw_gbs'), 1)} GB/s)",
                     f"{fmt(r.get('decode_x_bound'))}x" if dec else "—",
                     f"{fmt(r.get('state_mib'))} @ {r.get('state_positions', '—')}"])

    print(f"\n### phi4flash {a.shape} ({cfg.get('torch_dtype')} weights, {wbytes / 1e9:.2f} GB), K/V cache {a.kv_dtype},"
          f" {a.tokens} decode steps, {a.threads or os.cpu_count()} threads\n")
    print(table(["prompt", "prefill tok/s", "prefill GFLOP/s (x sgemm)", "decode tok/s",
                 "bound: numpy BW / bytes a token", "of bound", "engine's bound (its BW probe)", "of engine's bound",
                 "state MiB @ positions (engine)"], rows))
    print(f"\nnumpy read bandwidth {bw:.2f} GB/s (one thread); weights-only decode bound {bw * 1e9 / wbytes:.3f} tok/s.")

    info_text, note = run(glob + ["info", d], a.timeout)
    engine = parse_info_state(info_text) if info_text else {}
    results["engine_state_mib"] = {str(k): {"f32": v[0], "bf16": v[1]} for k, v in engine.items()}
    print("\n### State per sequence (MiB = 2^20 bytes)\n")
    print(table(["context", "phi4flash elements (Mamba / sliding / YOCO)", "F32 Mamba + BF16 K/V (formula)",
                 "all BF16", "all F32", "engine, BF16 K/V", "engine, F32 K/V", "Llama-3.2-3B BF16", "F32",
                 "Llama BF16 / phi4flash all BF16 / F32 Mamba + BF16 K/V"], memory_rows(cfg, engine)))
    if not engine:
        why = "it printed no state table" if info_text else f"`diffattn info` failed ({note})"
        print(f"\nformula only: the engine's figures are missing ({why}).")
    else:
        worst = 0.0
        for n, (f32, bf16) in engine.items():
            el = state_elements(cfg, n)
            for got, es in ((f32, 4), (bf16, 2)):
                want = (4 * el["mamba"] + es * (el["swa"] + el["yoco"])) / MIB
                worst = max(worst, abs(got - want) / want)
        results["engine_vs_formula_rel"] = worst
        print(f"\nengine (`diffattn info`) against the formula: largest relative difference {worst:.2e} "
              "(Mamba states F32 in both columns; the engine allocates whole windows, so below W tokens it holds more).")
    per_tok = 2 * 2 * dims(cfg)["G"] * dims(cfg)["d"]
    print(f"Per extra token: phi4flash {per_tok:,} bytes (BF16), Llama-3.2-3B {2 * llama_elements(1):,} bytes.")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
