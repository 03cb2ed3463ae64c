"""The explorer's HTTP server under misbehaving clients (`diffattn explore`, src/explorer/server.cpp):
keep-alive responses are not held back by Nagle's algorithm, clients that trickle bytes or open
too many connections cannot stop the page from answering, a second server on a used port fails.
The limits are read from include/diffattn/explorer/explorer.h, so the tests follow them.

Run as a script, the file measures instead (report numbers with the command):
    python3 tests/python/test_explorer_server.py [BINARY]
prints keep-alive requests/s on one connection and the time to answer a request while 12 (then
40) slow clients hold connections."""

import gzip
import json
import os
import re
import select
import signal
import socket
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BINARY = os.path.join(ROOT, "build", "diffattn")


def limit(name):
    with open(os.path.join(ROOT, "include", "diffattn", "explorer", "explorer.h")) as f:
        m = re.search(r"\b" + name + r" = ([0-9 *<]+);", f.read())
    assert m, name + " is not in explorer.h"
    return int(eval(m.group(1)))  # digits, *, << only


def start(binary, *args):
    """Starts `binary serve ARGS` and returns (process, port), reading the raw pipe for the
    'listening' line (select() on a buffered readline can miss it)."""
    proc = subprocess.Popen([binary, "explore", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
    said, fd, end = b"", proc.stdout.fileno(), time.time() + 20
    while time.time() < end:
        if select.select([fd], [], [], 1)[0]:
            chunk = os.read(fd, 4096)
            if not chunk:
                break
            said += chunk
            m = re.search(rb"listening on http://127\.0\.0\.1:(\d+)/.*\n", said)
            if m:
                return proc, int(m.group(1))
    proc.kill()
    raise AssertionError(f"the server did not start: {said.decode(errors='replace')}")


def stop(proc):
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=10) == 0, "the server must stop cleanly on SIGTERM"


@pytest.fixture
def server():
    proc, port = start(BINARY, "--port", "0")
    yield port
    stop(proc)


def connect(port, timeout=10):
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # only the server's side is tested
    return s


def read_response(s):
    """One HTTP response from socket s: (status, headers dict, body bytes); (None, {}, b"") when
    the server closed the connection without answering."""
    data = b""
    while b"\r\n\r\n" not in data:
        try:
            chunk = s.recv(65536)
        except ConnectionResetError:
            chunk = b""
        if not chunk:
            if not data:
                return None, {}, b""
            raise AssertionError(f"the connection closed inside a response: {data!r}")
        data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    lines = head.decode().split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.strip().lower(): v.strip() for k, v in (l.split(":", 1) for l in lines[1:])}
    n = int(headers.get("content-length", "0"))
    while len(body) < n:
        chunk = s.recv(65536)
        assert chunk, "the connection closed inside a response body"
        body += chunk
    return status, headers, body[:n]


INFO = b"GET /api/info HTTP/1.1\r\nHost: x\r\n\r\n"


def get_info(port, timeout=10):
    """A normal request on a new connection: (status, seconds to the answer)."""
    t0 = time.monotonic()
    with connect(port, timeout) as s:
        s.sendall(INFO.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n"))
        status, _, body = read_response(s)
    if status == 200:
        assert "limits" in json.loads(body)
    return status, time.monotonic() - t0


def keep_alive_run(port, n):
    """n requests one after another on one keep-alive connection: seconds in all. The server
    closes a connection after its kKeepAliveRequests-th request, not before."""
    with connect(port) as s:
        t0 = time.monotonic()
        for i in range(n):
            s.sendall(INFO)
            status, headers, _ = read_response(s)
            assert status == 200, (i, status)
            if headers.get("connection") == "close":
                assert i + 1 == n, f"closed after {i + 1} requests"
        return time.monotonic() - t0


def slow_clients(port, n):
    """n connections that sent the first byte of a request line and stall."""
    socks = []
    for _ in range(n):
        s = connect(port)
        s.sendall(b"G")
        socks.append(s)
    return socks


def test_keep_alive_responses_are_not_delayed(server):
    # Without TCP_NODELAY each response's body waits for the client's delayed ACK of its headers
    # (about 40 ms): 100 requests took 4.4 s. With it, well under 1 ms each.
    assert keep_alive_run(server, min(100, limit("kKeepAliveRequests"))) < 2.0


def test_slow_clients_cannot_hold_the_server(server):
    workers, request_s, idle_s = (limit("kServerWorkers"), limit("kRequestSeconds"),
                                  limit("kIdleSeconds"))
    idle = connect(server)  # sends nothing: closed after kIdleSeconds
    t0 = time.monotonic()
    slow = slow_clients(server, 16)
    status, took = get_info(server)
    assert status == 200 and took < 2.0, (status, took)
    # More stalled clients than workers: the request waits at most until the first of them runs
    # out of time (kRequestSeconds from its first byte), then gets a worker.
    slow += slow_clients(server, workers + 8 - len(slow))
    status, took = get_info(server, timeout=request_s + 10)
    assert status == 200 and took < request_s + 3, (status, took)
    # Each stalled client was answered 408 with a JSON error and its connection closed: the
    # first workers' worth after kRequestSeconds, those that waited for a worker after twice that.
    for s in slow:
        s.settimeout(2 * request_s + 5)
        status, _, body = read_response(s)
        assert status == 408 and "did not arrive within" in json.loads(body)["error"], status
        assert s.recv(1) == b""
        s.close()
    assert time.monotonic() - t0 < 2 * request_s + 3
    idle.settimeout(idle_s + 5)
    assert idle.recv(1) == b""  # closed without an answer: it asked nothing
    assert time.monotonic() - t0 < 2 * request_s + 3
    idle.close()


def test_trickled_request_is_cut_at_its_deadline(server):
    request_s = limit("kRequestSeconds")
    with connect(server) as s:
        t0 = time.monotonic()
        sent = b""
        # One byte every 0.2 s: each read() succeeds quickly, the request never completes.
        for c in (b"POST /api/views HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"y" * 200):
            try:
                s.sendall(bytes([c]))
            except (BrokenPipeError, ConnectionResetError):
                break
            sent += bytes([c])
            if select.select([s], [], [], 0.2)[0]:
                break
        s.settimeout(5)
        status, _, body = read_response(s)
        took = time.monotonic() - t0
    assert status == 408 and request_s - 0.5 < took < request_s + 2, (status, took, len(sent))


def test_too_many_connections_are_refused_at_once(server):
    cap = limit("kServerWorkers") + limit("kServerQueue")
    held = [connect(server) for _ in range(cap)]
    time.sleep(0.3)  # let the server accept them all
    t0 = time.monotonic()
    with connect(server) as s:
        s.sendall(INFO)
        status, headers, body = read_response(s)
    assert status == 503 and "busy" in json.loads(body)["error"], status
    assert headers.get("retry-after") == "1" and time.monotonic() - t0 < 1.0
    for s in held:
        s.close()
    # Closed connections free their workers and queue places at once.
    end = time.monotonic() + 3
    while (status := get_info(server)[0]) != 200 and time.monotonic() < end:
        time.sleep(0.05)
    assert status == 200


def test_oversized_head_is_431(server):
    with connect(server) as s:
        head = b"GET /api/info HTTP/1.1\r\n" + b"X-Pad: " + b"y" * 4000 + b"\r\n"
        try:
            for _ in range(limit("kMaxHeadBytes") // len(head) + 2):
                s.sendall(head)
        except (BrokenPipeError, ConnectionResetError):
            pass
        status, _, body = read_response(s)
    assert status == 431 and "headers are larger than" in json.loads(body)["error"]


def exchange(port, raw):
    """Sends raw bytes on a new connection, reads until the server closes it: the statuses."""
    with connect(port) as s:
        s.sendall(raw)
        got = b""
        try:
            while chunk := s.recv(65536):
                got += chunk
        except ConnectionResetError:
            pass
    return [int(m) for m in re.findall(rb"HTTP/1\.1 (\d{3}) ", got)], got


def test_bodies_httplib_would_not_bound_are_refused_unread(server):
    # gzip/deflate/br bodies are decompressed by httplib without bound, chunked ones read without
    # bound: both are refused before the body is read, and the connection closes.
    bomb = gzip.compress(b"0" * 10_000_000)  # 10 MB from ~10 KB, under the 16 KiB body limit
    statuses, got = exchange(server, b"POST /api/views HTTP/1.1\r\nHost: x\r\nContent-Encoding: "
                             b"gzip\r\nContent-Length: %d\r\n\r\n" % len(bomb) + bomb)
    assert statuses == [415] and b"compressed" in got, got[:300]
    statuses, got = exchange(server, b"POST /api/views HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: "
                             b"chunked\r\n\r\n" + b"4000\r\n" + b"x" * 0x4000 + b"\r\n" * 2)
    assert statuses == [411] and b"Content-Length" in got, got[:300]
    # A POST without Content-Length has an empty body (httplib would wait for the client to close).
    t0 = time.monotonic()
    statuses, _ = exchange(server, b"POST /api/views HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert statuses == [200] and time.monotonic() - t0 < 2.0


def test_pipelined_requests_are_all_answered(server):
    body = json.dumps({"source": "random", "length": 8, "seed": 1}).encode()
    post = b"POST /api/views HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body) + body
    statuses, _ = exchange(server, INFO + post + post + INFO.replace(b"\r\n\r\n",
                                                                     b"\r\nConnection: close\r\n\r\n"))
    assert statuses == [200, 200, 200, 200]


def test_stop_is_prompt_while_clients_stall():
    proc, port = start(BINARY, "--port", "0")
    held = slow_clients(port, limit("kServerWorkers") + 8) + [connect(port) for _ in range(8)]
    time.sleep(0.3)
    t0 = time.monotonic()
    stop(proc)
    assert time.monotonic() - t0 < 2.0, "stalled connections delayed the stop"
    for s in held:
        s.close()


def test_second_server_on_a_used_port_fails_naming_it(server):
    r = subprocess.run([BINARY, "explore", "--port", str(server)], capture_output=True, text=True,
                       timeout=10)
    assert r.returncode != 0, "a second server started on a port in use"
    assert f"port {server} is already in use" in r.stderr, r.stderr
    assert get_info(server)[0] == 200  # the first one still serves


# ---- measurement (run this file as a script) ----

def concurrent_run(port, conns, n):
    """conns threads, each n keep-alive requests on its own connection: per-request seconds
    (None for a request that failed or took over 10 s)."""
    import threading
    times = []

    def client():
        try:
            with connect(port) as s:
                for _ in range(n):
                    t0 = time.monotonic()
                    s.sendall(INFO)
                    status, headers, _ = read_response(s)
                    times.append(time.monotonic() - t0 if status == 200 else None)
                    if headers.get("connection") == "close":
                        break
        except OSError:
            times.append(None)

    threads = [threading.Thread(target=client) for _ in range(conns)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return times


def measure(binary):
    proc, port = start(binary, "--port", "0")
    try:
        n = 100
        took = keep_alive_run(port, n)
        print(f"keep-alive, one connection: {n} requests in {took:.3f} s = {n / took:.0f} requests/s")
        times = concurrent_run(port, 32, 20)
        ok = sorted(t for t in times if t is not None)
        pct = lambda q: ok[min(len(ok) - 1, int(q * len(ok)))] * 1000
        print(f"32 keep-alive connections x 20 requests: {len(ok)} answered, "
              f"{len(times) - len(ok)} failed; p50 {pct(0.5):.1f} ms, p99 {pct(0.99):.1f} ms, "
              f"max {ok[-1] * 1000:.1f} ms")
        for count, trickle in ((12, False), (12, True), (40, True)):
            slow = slow_clients(port, count)
            t0 = time.monotonic()
            status, took = None, None
            try:
                # Trickling clients send one more byte every second (each read() succeeds).
                with connect(port) as s:
                    s.settimeout(1)
                    s.sendall(INFO.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n"))
                    while time.monotonic() - t0 < 30:
                        try:
                            status, _, _ = read_response(s)
                            break
                        except socket.timeout:
                            if trickle:
                                for c in slow:
                                    try:
                                        c.sendall(b"E")
                                    except OSError:
                                        pass
                took = time.monotonic() - t0
            finally:
                for c in slow:
                    c.close()
            what = "trickling a byte a second" if trickle else "sending one byte, then nothing"
            if status is None:
                print(f"{count} slow clients ({what}): no answer within 30 s")
            else:
                print(f"{count} slow clients ({what}): answered {status} after {took * 1000:.1f} ms")
            time.sleep(1)
    finally:
        stop(proc)


if __name__ == "__main__":
    measure(sys.argv[1] if len(sys.argv) > 1 else BINARY)
