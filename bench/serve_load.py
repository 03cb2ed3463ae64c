"""A bounded load generator for `diffattn serve` (a benchmark, not a test).

    python3 bench/serve_load.py --model-kind diff_v1 --streams 1,4,16,64 --seconds 10
    python3 bench/serve_load.py --url http://127.0.0.1:8000 --streams 16   # a running server

Without --url it writes a random model of the small preset's shape (byte vocabulary; greedy
output is printable ASCII, and there is no end-of-sequence id, so every request runs to
max_tokens), starts `build/diffattn serve` on a free loopback port and stops it at the end. At
each concurrency N, N client threads each send streaming completions back to back for --seconds
(a request started before the end is finished); reported: aggregate generated tokens/s (the
usage chunks' completion_tokens over the wall time), p50/p99 time to first token, p50/p99 gap
between content chunks (one token per chunk when the client keeps up; a chunk may carry several
tokens when it does not, so this is the inter-token latency the client saw), errors, and the
server's resident memory after each level (the KV pool's pages count once touched: repeat a
level to see whether memory stays flat) and before the first.

The server's idle OpenMP threads spin or sleep (OMP_WAIT_POLICY); the tool sleeps them only
when the machine is busy as it starts (one-minute load average at least half the processors),
so on a 2-core machine a run started right after another one waits passively. One stream
decodes about twice as fast with spinning threads, so compare runs under one policy:
--wait-policy active|passive sets it for the server this script starts (auto: the tool's
choice, which the header line reports).
"""

import argparse
import http.client
import json
import os
import statistics
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "python"))

SMALL = {  # the small preset (README, "Presets")
    "diff_v1": dict(n_layers=6, d_model=256, n_heads=4, n_kv_heads=4, head_dim=32, ffn_dim=688),
    "diff_v2": dict(n_layers=6, d_model=256, n_heads=8, n_kv_heads=8, head_dim=32, ffn_dim=600),
    "standard": dict(n_layers=6, d_model=256, n_heads=8, n_kv_heads=8, head_dim=32, ffn_dim=688),
}


def percentile(xs, q):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    i = min(len(xs) - 1, max(0, int(round(q / 100 * (len(xs) - 1)))))
    return xs[i]


def one_request(host, port, prompt, max_tokens, out):
    c = http.client.HTTPConnection(host, port, timeout=300)
    body = json.dumps({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0.8, "stream": True,
                       "stream_options": {"include_usage": True}}).encode()
    t0 = time.perf_counter()
    c.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        out["errors"].append(f"HTTP {r.status}: {r.read()[:200]!r}")
        c.close()
        return
    last = None
    tokens = 0
    while True:
        line = r.readline()
        if not line:
            out["errors"].append("stream ended without [DONE]")
            break
        line = line.strip()
        if not line.startswith(b"data: "):
            continue
        data = line[6:]
        if data == b"[DONE]":
            break
        ev = json.loads(data)
        if "error" in ev:
            out["errors"].append(ev["error"]["message"])
            break
        now = time.perf_counter()
        if ev.get("usage"):
            tokens = ev["usage"]["completion_tokens"]
        if ev["choices"] and ev["choices"][0]["text"]:
            if last is None:
                out["ttft"].append(now - t0)
            else:
                out["gaps"].append(now - last)
            last = now
    c.close()
    out["tokens"] += tokens
    out["requests"] += 1


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return -1


def run_level(host, port, n, seconds, max_tokens):
    out = {"ttft": [], "gaps": [], "errors": [], "tokens": 0, "requests": 0}
    lock = threading.Lock()
    stop_at = time.perf_counter() + seconds

    def worker(i):
        while time.perf_counter() < stop_at:
            mine = {"ttft": [], "gaps": [], "errors": [], "tokens": 0, "requests": 0}
            try:
                one_request(host, port, f"Stream {i}: In the beginning", max_tokens, mine)
            except Exception as e:  # noqa: BLE001 (counted as an error)
                mine["errors"].append(repr(e))
            with lock:
                for k in ("ttft", "gaps", "errors"):
                    out[k].extend(mine[k])
                out["tokens"] += mine["tokens"]
                out["requests"] += mine["requests"]

    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    out["wall"] = time.perf_counter() - t0
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", help="a running server (else one is started on a random small-preset model)")
    ap.add_argument("--model-kind", default="diff_v1", choices=sorted(SMALL))
    ap.add_argument("--streams", default="1,4,16,64")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=0, help="server --threads (0: its default)")
    ap.add_argument("--pid", type=int, help="with --url: the server's process id, for its memory")
    ap.add_argument("--wait-policy", default="auto", choices=["auto", "active", "passive"],
                    help="OMP_WAIT_POLICY of the server started here (auto: the tool's choice)")
    a = ap.parse_args()
    proc = tmp = policy = None
    if a.url:
        host, port = a.url.split("//")[1].split(":")
        port = int(port.strip("/"))
        pid = a.pid
    else:
        import tempfile
        import serve_helpers as sh
        tmp = tempfile.mkdtemp(prefix="serve_load_")  # removed at the end
        d = os.path.join(tmp, a.model_kind)
        sh.write_ascii_model(d, kind=a.model_kind, max_seq_len=256, **SMALL[a.model_kind])
        extra = ["--threads", str(a.threads)] if a.threads else []
        import subprocess
        cli = os.path.join(os.path.dirname(HERE), "build", "diffattn")
        env = dict(os.environ)
        if a.wait_policy != "auto":
            env["OMP_WAIT_POLICY"] = a.wait_policy
        policy = env.get("OMP_WAIT_POLICY")
        if policy is None:  # the tool's rule (src/cli/main.cpp, machine_busy)
            busy = os.getloadavg()[0] >= 0.5 * (os.cpu_count() or 1)
            policy = f"auto: {'passive' if busy else 'active'} at load {os.getloadavg()[0]:.2f}"
        proc = subprocess.Popen([cli, *extra, "serve", "--model", d, "--port", "0"], stdout=subprocess.PIPE,
                                env=env)
        line = proc.stdout.readline().decode()
        port = int(line.split("http://127.0.0.1:")[1].split("/")[0])
        host, pid = "127.0.0.1", proc.pid
    try:
        rss0 = rss_kib(pid) if pid else -1
        print(f"model: {a.url or a.model_kind + ' (small preset shape, random weights)'}; "
              f"max_tokens {a.max_tokens}; {a.seconds:g} s per level"
              + (f"; server threads wait: {policy}" if policy else ""))
        print(f"{'streams':>7} {'requests':>8} {'tokens/s':>9} {'TTFT p50':>9} {'TTFT p99':>9} "
              f"{'ITL p50':>8} {'ITL p99':>8} {'errors':>6} {'RSS KiB':>9}")
        for n in [int(x) for x in a.streams.split(",")]:
            r = run_level(host, port, n, a.seconds, a.max_tokens)
            ms = lambda x: f"{1000 * x:.1f}ms"  # noqa: E731
            print(f"{n:>7} {r['requests']:>8} {r['tokens'] / r['wall']:>9.1f} {ms(percentile(r['ttft'], 50)):>9} "
                  f"{ms(percentile(r['ttft'], 99)):>9} {ms(percentile(r['gaps'], 50)):>8} "
                  f"{ms(percentile(r['gaps'], 99)):>8} {len(r['errors']):>6} "
                  f"{rss_kib(pid) if pid else -1:>9}", flush=True)
            for e in r["errors"][:3]:
                print("   error:", e)
        if pid:
            print(f"server RSS: {rss0} KiB before, {rss_kib(pid)} KiB after")
    finally:
        if proc:
            proc.terminate()
            proc.wait(timeout=30)
        if tmp:
            import shutil
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
