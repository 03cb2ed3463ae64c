"""The Python operators run the fused kernels by default; backend="reference" or the
environment variable DIFFATTN_BACKEND=reference force the reference. (Their agreement with
PyTorch over every shape is in test_operator_torch.py, which runs the default backend.)
Also: `diffattn bench --json` runs and reports every row with its rates, and `--check` checks
every timed fused case against the reference under the C++ tests' accuracy rule."""

import io
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import diffattn

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOOL = os.path.join(ROOT, "build", "diffattn")


def arrays(Tq=40, Tk=40, H=2, G=1, D=8, Dv=16, seed=0):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((1, Tq, 2 * H, D), dtype=np.float32)
    k = rng.standard_normal((1, Tk, 2 * G, D), dtype=np.float32)
    v = rng.standard_normal((1, Tk, G, Dv), dtype=np.float32)
    lam = np.full((H,), 0.6, np.float32)
    return q, k, v, lam


@pytest.mark.parametrize("Tq,Tk", [(40, 40), (1, 600), (3, 600)], ids=["tiled", "decode1", "decode3"])
def test_default_is_fused_and_reference_can_be_forced(Tq, Tk, monkeypatch):
    q, k, v, lam = arrays(Tq, Tk)
    fused = diffattn.diff_attention(q, k, v, lam, causal=True, backend="fused")
    default = diffattn.diff_attention(q, k, v, lam, causal=True)
    ref = diffattn.diff_attention(q, k, v, lam, causal=True, backend="reference")
    assert np.array_equal(default, fused)
    np.testing.assert_allclose(fused, ref, rtol=1e-4, atol=1e-5)
    assert not np.array_equal(fused, ref)  # two implementations: different rounding
    # DIFFATTN_BACKEND is read once per process: each setting runs in a fresh interpreter.
    for env, want in (("reference", ref), ("fused", fused)):
        assert np.array_equal(default_in_subprocess(env, Tq, Tk), want)


def default_in_subprocess(env_value, Tq, Tk, tmp=None):
    """diff_attention of arrays(Tq, Tk) with default backend, run under DIFFATTN_BACKEND."""
    script = ("import sys, numpy as np, diffattn, test_fused_backend as t\n"
              f"q, k, v, lam = t.arrays({Tq}, {Tk})\n"
              "np.save(sys.stdout.buffer, diffattn.diff_attention(q, k, v, lam, causal=True))\n")
    env = dict(os.environ, DIFFATTN_BACKEND=env_value,
               PYTHONPATH=os.pathsep.join([os.environ.get("PYTHONPATH", ""),
                                           os.path.dirname(os.path.abspath(__file__))]))
    r = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, timeout=120)
    if r.returncode != 0:
        raise RuntimeError(r.stderr.decode(errors="replace"))
    return np.load(io.BytesIO(r.stdout))


def test_backward_default_is_fused():
    q, k, v, lam = arrays()
    dout = np.random.default_rng(1).standard_normal((1, 40, 2, 16), dtype=np.float32)
    fused = diffattn.diff_attention_backward(q, k, v, lam, dout, causal=True, backend="fused")
    default = diffattn.diff_attention_backward(q, k, v, lam, dout, causal=True)
    ref = diffattn.diff_attention_backward(q, k, v, lam, dout, causal=True, backend="reference")
    for a, b, r in zip(fused, default, ref):
        assert np.array_equal(a, b)
        np.testing.assert_allclose(a, r, rtol=1e-3, atol=1e-5)


def test_bad_backend_names_are_errors(monkeypatch):
    q, k, v, lam = arrays()
    with pytest.raises(ValueError, match='backend is "[a-z]+", expected "auto", "fused" or "reference"'):
        diffattn.diff_attention(q, k, v, lam, backend="gpu")
    with pytest.raises(RuntimeError, match='DIFFATTN_BACKEND is "fast"'):
        default_in_subprocess("fast", 40, 40)


@pytest.mark.skipif(not os.path.exists(TOOL), reason="needs build/diffattn")
def test_bench_json_reports_every_row():
    cmd = [TOOL, "--threads", "1", "bench", "--json", "--T", "64", "--ref-T", "32",
           "--decode-T", "512", "--rss-T", "256", "--rounds", "1", "--sgemm-n", "64",
           "--bandwidth-mb", "8"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=120).stdout
    report = json.loads(out)
    machine = report["machine"]
    assert machine["threads"] == 1 and machine["sgemm_gflops"] > 0
    assert machine["read_bandwidth_gbs"] > 0 and machine["simd_target"]
    rows = report["rows"]
    ops = {(r["op"], r["variant"]) for r in rows}
    for op in ("fwd", "bwd"):
        for variant in ("diff fused", "standard 2H heads", "upstream recipe", "reference"):
            assert (op, variant) in ops
    for variant in ("diff fused", "standard 2H heads", "upstream recipe", "reference"):
        assert ("decode", variant) in ops
    for r in rows:
        assert r["seconds"] > 0
        if r["op"] == "decode":
            assert r["gbs"] > 0 and r["x_bandwidth"] > 0
        else:
            assert r["gflops"] > 0 and r["x_sgemm"] > 0
    assert 0 < report["peak_rss"]["mb"] < 1024


@pytest.mark.skipif(not os.path.exists(TOOL), reason="needs build/diffattn")
def test_bench_check_reports_every_fused_row():
    cmd = [TOOL, "--threads", "1", "bench", "--json", "--check", "--T", "64", "--ref-T", "32",
           "--decode-T", "300", "--rss-T", "0", "--rounds", "1", "--sgemm-n", "64",
           "--bandwidth-mb", "8", "--check-T", "40"]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    rows = json.loads(run.stdout)["rows"]
    checked = 0
    for r in rows:
        if r["variant"] == "reference" or (r["op"] == "bwd" and r["variant"] == "upstream recipe"):
            assert "check" not in r
            continue
        c = r["check"]
        assert c["ok"] and 0 <= c["error_over_bound"] <= 1, r
        names = {t["name"] for t in c["tensors"]}
        if r["variant"] == "upstream recipe":
            assert names == {"recipe out"}
        else:
            assert {"out", "lse"} <= names
            if r["op"] == "bwd":
                assert {"dq", "dk", "dv"} <= names
            if "kv" in r["variant"]:
                assert "out vs float64 on unrounded K/V" in names
        # forward/backward rows longer than --check-T are checked at it, the others (decode
        # rows, the T=32 rows) at their own size
        if "Tq=64 " in r["shape"]:
            assert c["shape"] == r["shape"].replace("Tq=64 Tk=64", "Tq=40 Tk=40")
        else:
            assert c["shape"] == r["shape"]
        checked += 1
    assert checked >= 20
    bad = subprocess.run([TOOL, "bench", "--check", "--check-T", "0"], capture_output=True,
                         text=True, timeout=60)
    assert bad.returncode != 0 and "--check-T" in bad.stderr


@pytest.mark.skipif(not os.path.exists(TOOL), reason="needs build/diffattn")
def test_bench_decode_only_rows_for_each_length_and_batch():
    cmd = [TOOL, "--threads", "1", "bench", "--json", "--decode-only", "--decode-T", "300,520",
           "--decode-B", "1,3", "--rounds", "1", "--sgemm-n", "64", "--bandwidth-mb", "8"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=120).stdout
    report = json.loads(out)
    assert "peak_rss" not in report
    rows = report["rows"]
    assert {r["op"] for r in rows} == {"decode"}
    shapes = {(r["variant"], r["shape"].split(" H=")[0], r["shape"].split("Tk=")[1].split()[0])
              for r in rows}
    for b in ("1", "3"):
        for t in ("300", "520"):
            for variant in ("diff fused", "standard 2H heads", "diff V2 fused",
                            "diff fused BF16 kv", "standard 2H heads F16 kv"):
                assert (variant, "B=" + b, t) in shapes
    for bad, what in ((["--decode-T", "64,x"], "--decode-T expects integers"),
                      (["--decode-T", "0"], "--decode-T: each value must be between"),
                      (["--decode-B", "2,,3"], "--decode-B expects integers")):
        run = subprocess.run([TOOL, "bench", "--decode-only"] + bad, capture_output=True,
                             text=True, timeout=60)
        assert run.returncode == 2 and what in run.stderr, run.stderr
