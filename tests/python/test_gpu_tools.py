"""The GPU tools run end to end without a GPU: bench/gpu_attention.py in its dry run (tiny
shapes on the CPU under TRITON_INTERPRET=1) and scripts/gpu_compile_check.py (the Triton kernels
compiled for the H100, sm_90, by the ptxas that ships with Triton)."""

import json
import os
import subprocess
import sys

import pytest

import diffattn

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PKG_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(diffattn.__file__)))


def _env(interpret):
    env = dict(os.environ)
    env["PYTHONPATH"] = PKG_ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("TRITON_INTERPRET", None)
    if interpret:
        env["TRITON_INTERPRET"] = "1"
    return env


def test_benchmark_dry_run(tmp_path):
    """Every step of the benchmark (check, device figures, prefill and training recipes,
    decode, goals) runs and writes its JSON."""
    out = tmp_path / "bench.json"
    r = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "gpu_attention.py"),
                        "--quick", "--dry-run", "--json", str(out)],
                       capture_output=True, text=True, env=_env(True), timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["dry_run"] and report["check"]["failed"] == []
    assert {r["mode"] for r in report["prefill"]} == {"fwd", "fwd+bwd"}
    for row in report["prefill"] + report["decode"]:
        assert row["errors"] == {}, row
        assert all(t is not None and t > 0 for t in row["ms"].values()), row
    assert set(report["goals"]) and all(g["met"] is None for g in report["goals"].values())


def test_forward_tuning_sweep_dry_run(tmp_path):
    """bench/gpu_tune.py (the forward's tilings beside minimal Triton kernels) runs through and
    reports a time for each of its rows: the references, the minimal kernels (their outputs
    checked against SDPA) and the diffattn kernel under forced tilings."""
    out = tmp_path / "tune.json"
    r = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "gpu_tune.py"), "--dry-run",
                        "--json", str(out)],
                       capture_output=True, text=True, env=_env(True), timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    assert {row["problem"] for row in rows} == {"std D128", "V1 D16"}
    for row in rows:
        assert row["ms"] is not None and row["ms"] > 0, row
        if row["what"].startswith("mini"):
            assert float(row["note"].split()[-1]) < 1e-4, row


def _ptxas_present():
    try:
        from triton.backends.nvidia.compiler import get_ptxas
        return os.path.exists(get_ptxas(90).path)
    except Exception:  # noqa: BLE001 (no NVIDIA backend in this Triton)
        return False


@pytest.mark.skipif(not _ptxas_present(), reason="Triton's NVIDIA backend (ptxas) is absent")
def test_kernels_compile_for_sm90_without_spills():
    """The default tilings of a V1 head-dim-128 training step (forward, preprocess, key-block
    backward, deterministic dQ) and of paged decode compile for sm_90 with no register spills
    and within its shared memory: a kernel the interpreter accepts can still fail to compile
    (the compiler is stricter, e.g. about globals), and this catches it before GPU time."""
    r = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "gpu_compile_check.py"),
                        "--only", "d128_causal_det"],
                       capture_output=True, text=True, env=_env(False), timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    kernels = {line.split()[1] for line in r.stdout.splitlines() if "regs" in line}
    assert {"attn_fwd_kernel", "attn_bwd_dkdv_kernel", "attn_bwd_dq_kernel"} <= kernels, r.stdout
    r = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "gpu_compile_check.py"),
                        "--only", "decode_v1_d128"],
                       capture_output=True, text=True, env=_env(False), timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "attn_decode_split_kernel" in r.stdout
