"""Two or more running OpenAI-compatible servers under identical requests (a benchmark, not a test).

Compares `diffattn serve` with another server (llama.cpp's llama-server was the one measured,
docs/PERFORMANCE.md, "Against llama.cpp's server") on the same model. Nothing is started here:
start each server first, then name them with --server NAME=URL. The issue's protocol (the runs of
2026-11-27, smaller, are given with their exact commands in docs/PERFORMANCE.md):

    diffattn --threads 1 serve --model /work/ext/llama-1b --port 18101 --kv-dtype f16
    diffattn --threads 1 serve --model /work/ext/llama-1b --port 18103 --kv-dtype f16 --no-prefix-cache
    llama-server -m /work/ext/llama-1b-bf16.gguf -t 1 -tb 1 -np 32 -c 65536 --port 18102
    python3 bench/serve_compare.py --server diffattn=http://127.0.0.1:18101 \\
        --server llama-server=http://127.0.0.1:18102 --server diffattn-nocache=http://127.0.0.1:18103 \\
        --throughput diffattn,llama-server --prefix diffattn,diffattn-nocache,llama-server \\
        --streams 1,8,32 --rounds 3 --json /tmp/compare.json

(all servers with OMP_WAIT_POLICY=passive in their environment; see below).

Every request is a streaming completion, greedy (temperature 0), with a fixed max_tokens and
"ignore_eos": true (llama-server honours it; diffattn ignores unknown fields, so a request of its
may stop early at an end-of-sequence token: tokens are counted from each server's usage chunk,
else from its content chunks, and the per-server count is printed, so a short count shows).

Throughput: at each concurrency N, N client threads each send --requests-per-stream requests back
to back (distinct short prompts, the same ones for every server); reported: generated tokens over
the level's wall time. Shared prefix: a deterministic system prompt of about --prefix-tokens tokens
followed by a short distinct user part, --prefix-requests requests one after another per server
and round; reported: time to first token (first non-empty content chunk), p50 and p99 over all
rounds. Each server first gets one priming request with the system prompt (its TTFT is reported as
"cold", outside the percentiles), so a prefix cache starts warm as it would in service.

Rounds interleave the servers: round r runs every level on every server, then the prefix requests
on every server, the servers' order reversed every other round so that neither always goes first.
The one-minute load average is printed at the start and end of the run and of each round: on a
shared machine both servers see the same background only in the interleaved sense.

OpenMP threads: diffattn's idle worker threads spin or sleep by OMP_WAIT_POLICY (bench/serve_load.py
explains the tool's choice); llama-server's threads are its own pool. With one thread each (--threads
1, -t 1 -tb 1) there is no idle worker to spin, so the policy does not matter for the runs above.
"""

import argparse
import http.client
import json
import os
import statistics
import threading
import time
import urllib.parse

WORDS = ("the system keeps a ledger of every request and every answer it gives so that an operator "
         "can audit what was said to whom and when each record names the model the prompt the "
         "parameters and the time it took").split()


def percentile(xs, q):
    """Nearest-rank percentile (as bench/serve_load.py)."""
    if not xs:
        return float("nan")
    xs = sorted(xs)
    i = min(len(xs) - 1, max(0, int(round(q / 100 * (len(xs) - 1)))))
    return xs[i]


def system_prompt(n_words):
    """A deterministic system prompt: numbered sentences of plain English words (about one token a word)."""
    out, k = ["You are a careful assistant. Follow these rules."], 0
    while sum(len(s.split()) for s in out) < n_words:
        k += 1
        words = [WORDS[(k * 7 + j) % len(WORDS)] for j in range(12)]
        out.append(f"Rule {k}: " + " ".join(words) + ".")
    return " ".join(out)


def load1():
    return os.getloadavg()[0]


def one_request(url, prompt, max_tokens):
    """One streaming completion; returns dict(ttft, tokens, prompt_tokens, cached, from_usage, error)."""
    u = urllib.parse.urlparse(url)
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=3600)
    body = json.dumps({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True,
                       "ignore_eos": True, "stream_options": {"include_usage": True}}).encode()
    res = {"ttft": None, "tokens": 0, "prompt_tokens": None, "cached": None, "from_usage": False, "error": None}
    t0 = time.perf_counter()
    try:
        c.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        r = c.getresponse()
        if r.status != 200:
            res["error"] = f"HTTP {r.status}: {r.read()[:200]!r}"
            return res
        chunks = 0
        while True:
            line = r.readline()
            if not line:
                res["error"] = "stream ended without [DONE]"
                break
            line = line.strip()
            if not line.startswith(b"data: "):
                continue
            data = line[6:]
            if data == b"[DONE]":
                break
            ev = json.loads(data)
            if "error" in ev:
                res["error"] = str(ev["error"])[:200]
                break
            now = time.perf_counter()
            usage = ev.get("usage")
            if usage:
                res["tokens"] = usage.get("completion_tokens", 0)
                res["prompt_tokens"] = usage.get("prompt_tokens")
                res["cached"] = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
                res["from_usage"] = True
            if ev.get("choices") and ev["choices"][0].get("text"):
                chunks += 1
                if res["ttft"] is None:
                    res["ttft"] = now - t0
        if not res["from_usage"]:
            res["tokens"] = chunks
    except Exception as e:  # noqa: BLE001 (reported as an error)
        res["error"] = repr(e)
    finally:
        c.close()
    return res


def throughput_level(url, n, per_stream, max_tokens, tag):
    """N threads, each per_stream requests back to back; returns dict(tps, tokens, wall, errors, ...)."""
    results = []
    lock = threading.Lock()

    def worker(i):
        for j in range(per_stream):
            r = one_request(url, f"Stream {i} request {j} ({tag}): Once upon a time", max_tokens)
            with lock:
                results.append(r)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    tokens = sum(r["tokens"] for r in results)
    return {"tps": tokens / wall, "tokens": tokens, "wall": wall, "requests": len(results),
            "errors": [r["error"] for r in results if r["error"]],
            "from_usage": all(r["from_usage"] for r in results)}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--server", action="append", required=True, metavar="NAME=URL",
                    help="a running server (repeat); URL like http://127.0.0.1:8000")
    ap.add_argument("--throughput", default="", help="comma-separated names for the throughput levels "
                    "(the first over the second gives the ratio)")
    ap.add_argument("--prefix", default="", help="comma-separated names for the shared-prefix TTFT test "
                    "(ratios against the last)")
    ap.add_argument("--streams", default="1,8,32")
    ap.add_argument("--requests-per-stream", type=int, default=1)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--prefix-words", type=int, default=900,
                    help="system prompt length in words (about 1,000 Llama-3 tokens at 900)")
    ap.add_argument("--prefix-requests", type=int, default=4, help="per server and round")
    ap.add_argument("--prefix-max-tokens", type=int, default=8)
    ap.add_argument("--json", help="write every measurement here")
    a = ap.parse_args()
    urls = dict(s.split("=", 1) for s in a.server)
    thr = [x for x in a.throughput.split(",") if x]
    pre = [x for x in a.prefix.split(",") if x]
    for name in thr + pre:
        if name not in urls:
            ap.error(f"no --server named {name}")
    levels = [int(x) for x in a.streams.split(",") if x]
    sysp = system_prompt(a.prefix_words)
    rec = {"args": vars(a), "load_start": load1(), "throughput": [], "prefix": [], "cold": {}}
    print(f"servers: {urls}")
    print(f"start {time.strftime('%H:%M:%S', time.gmtime())} UTC, load average (1 min) {rec['load_start']:.2f}; "
          f"max_tokens {a.max_tokens}, {a.requests_per_stream} request(s) per stream, {a.rounds} rounds", flush=True)

    for name in sorted(set(thr + pre)):  # warm-up: first-request costs (page faults, allocations) out of the way
        r = one_request(urls[name], "Warm-up: Once upon a time", 4)
        print(f"warm-up {name}: {r['tokens']} tokens{'; error ' + r['error'] if r['error'] else ''}", flush=True)
    for name in pre:
        r = one_request(urls[name], sysp + "\nUser: priming request. Answer:", a.prefix_max_tokens)
        rec["cold"][name] = r
        print(f"cold {name}: TTFT {r['ttft']:.2f} s, prompt_tokens {r['prompt_tokens']}, cached {r['cached']}"
              f"{'; error ' + r['error'] if r['error'] else ''}", flush=True)

    for rnd in range(a.rounds):
        order_t = thr if rnd % 2 == 0 else thr[::-1]
        order_p = pre if rnd % 2 == 0 else pre[::-1]
        print(f"round {rnd + 1}: load {load1():.2f} at {time.strftime('%H:%M:%S', time.gmtime())} UTC", flush=True)
        for n in levels:
            row = {"round": rnd + 1, "streams": n}
            for name in order_t:
                r = throughput_level(urls[name], n, a.requests_per_stream, a.max_tokens, f"r{rnd}")
                row[name] = r
                print(f"  {n:>3} streams  {name:<18} {r['tps']:8.2f} tok/s  {r['tokens']:>5} tokens "
                      f"in {r['wall']:7.1f} s  (counted from {'usage' if r['from_usage'] else 'chunks'})"
                      f"{'  errors ' + str(r['errors'][:2]) if r['errors'] else ''}", flush=True)
            if len(thr) >= 2:
                row["ratio"] = row[thr[0]]["tps"] / row[thr[1]]["tps"]
                print(f"  {n:>3} streams  {thr[0]} / {thr[1]} = {row['ratio']:.3f}", flush=True)
            rec["throughput"].append(row)
        for name in order_p:
            for k in range(a.prefix_requests):
                r = one_request(urls[name], sysp + f"\nUser {rnd}.{k}: what does rule {k + 3} say? Answer:",
                                a.prefix_max_tokens)
                r.update(round=rnd + 1, server=name)
                rec["prefix"].append(r)
                print(f"  prefix {name:<18} TTFT {r['ttft'] if r['ttft'] is None else round(r['ttft'], 3)} s  "
                      f"prompt_tokens {r['prompt_tokens']} cached {r['cached']}"
                      f"{'  error ' + r['error'] if r['error'] else ''}", flush=True)
        print(f"round {rnd + 1} end: load {load1():.2f}", flush=True)

    rec["load_end"] = load1()
    print(f"\nend {time.strftime('%H:%M:%S', time.gmtime())} UTC, load average (1 min) {rec['load_end']:.2f}")
    if thr:
        print("\ntokens/s, median over rounds" + (f" (ratio {thr[0]} / {thr[1]}: median of per-round ratios)"
                                                 if len(thr) >= 2 else ""))
        for n in levels:
            rows = [r for r in rec["throughput"] if r["streams"] == n]
            cells = [f"{name} {statistics.median(r[name]['tps'] for r in rows):.2f}" for name in thr]
            if len(thr) >= 2:
                cells.append(f"ratio {statistics.median(r['ratio'] for r in rows):.3f} "
                             f"(rounds: {', '.join(format(r['ratio'], '.3f') for r in rows)})")
            print(f"  {n:>3} streams: " + "; ".join(cells))
    if pre:
        print("\nshared-prefix TTFT over all rounds (s)")
        summary = {}
        for name in pre:
            xs = [r["ttft"] for r in rec["prefix"] if r["server"] == name and r["ttft"] is not None]
            summary[name] = (percentile(xs, 50), percentile(xs, 99), len(xs))
            print(f"  {name:<18} p50 {summary[name][0]:.3f}  p99 {summary[name][1]:.3f}  (n={len(xs)})")
        ref = pre[-1]
        for name in pre[:-1]:
            print(f"  {name} / {ref}: p50 {summary[name][0] / summary[ref][0]:.3f}, "
                  f"p99 {summary[name][1] / summary[ref][1]:.3f}")
        rec["prefix_summary"] = summary
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rec, f, indent=1)


if __name__ == "__main__":
    main()
