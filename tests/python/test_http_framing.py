"""HTTP/1.1 framing as RFC 9112 asks, over raw sockets, on the server `diffattn explore` and
`diffattn serve` share (src/http, request_head.h): every head another parser could read differently
(two lengths, Transfer-Encoding with Content-Length or not ending in chunked, whitespace before a
colon, control bytes, folded lines, bare CR or LF, a missing or repeated Host) is answered once,
400 (411 for a chunked body, 505 for another HTTP version), and the connection closes, so a request
hidden behind it is never answered. Well-framed requests still work, pipelined or not."""

import json
import os
import re
import socket

import pytest

import model_helpers as mh
import serve_helpers as sh
from test_explorer_server import BINARY, start, stop

INFO = b"GET /api/info HTTP/1.1\r\nHost: x\r\n\r\n"
# A request hidden in what a lenient reader would take for a body or a second message.
HIDDEN = b"GET /api/info HTTP/1.1\r\nHost: smuggled\r\n\r\n"


@pytest.fixture(scope="module")
def explorer():
    proc, port = start(BINARY, "--port", "0")
    yield port
    stop(proc)


def exchange(port, raw, timeout=10):
    """Sends raw bytes on a new connection and reads until the server closes it: (statuses,
    everything received). A server that keeps the connection open fails the test (timeout)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(raw)
        got = b""
        try:
            while chunk := s.recv(65536):
                got += chunk
        except ConnectionResetError:
            pass
        except socket.timeout:
            raise AssertionError(f"the connection stayed open after {raw[:80]!r}; got {got[:200]!r}")
    return [int(m) for m in re.findall(rb"HTTP/1\.1 (\d{3}) ", got)], got


def post(body_headers, body=b""):
    return b"POST /api/views HTTP/1.1\r\nHost: x\r\n" + body_headers + b"\r\n" + body


# (name, raw request, expected status, words of the error): each is followed on the same
# connection by HIDDEN, which must not be answered.
REFUSED = [
    ("two different lengths", post(b"Content-Length: 0\r\nContent-Length: %d\r\n" % len(HIDDEN)), 400,
     "2 Content-Length fields"),
    ("the same length twice", post(b"Content-Length: 0\r\nContent-Length: 0\r\n"), 400, "2 Content-Length fields"),
    ("lengths in other cases", post(b"content-length: 0\r\nCONTENT-LENGTH: 0\r\n"), 400, "2 Content-Length fields"),
    ("a list of lengths", post(b"Content-Length: 0, 0\r\n"), 400, "digits only"),
    ("a signed length", post(b"Content-Length: +0\r\n"), 400, "digits only"),
    ("a negative length", post(b"Content-Length: -1\r\n"), 400, "digits only"),
    ("a hex length", post(b"Content-Length: 0x10\r\n"), 400, "digits only"),
    ("an empty length", post(b"Content-Length: \r\n"), 400, "Content-Length is empty"),
    ("a length past 64 bits", post(b"Content-Length: 99999999999999999999999\r\n"), 400, "64 bits"),
    ("space before the colon", post(b"Transfer-Encoding : chunked\r\n"), 400,
     "whitespace between the header name \"Transfer-Encoding\" and its colon"),
    ("tab before the colon", post(b"Content-Length\t: 0\r\n"), 400, "whitespace between"),
    ("chunked and a length", post(b"Content-Length: 4\r\nTransfer-Encoding: chunked\r\n", b"0\r\n\r\n"), 400,
     "both Transfer-Encoding and Content-Length"),
    ("a length and chunked", post(b"Transfer-Encoding: chunked\r\nContent-Length: 4\r\n", b"0\r\n\r\n"), 400,
     "both Transfer-Encoding and Content-Length"),
    ("gzip, not chunked", post(b"Transfer-Encoding: gzip\r\n"), 400, "does not end in chunked"),
    ("chunked, then gzip", post(b"Transfer-Encoding: chunked, gzip\r\n"), 400, "does not end in chunked"),
    ("chunked over two lines, then gzip", post(b"Transfer-Encoding: chunked\r\nTransfer-Encoding: gzip\r\n"), 400,
     "does not end in chunked"),
    ("an unknown coding", post(b"Transfer-Encoding: xchunked\r\n"), 400, "does not end in chunked"),
    ("chunked in HTTP/1.0", b"POST /api/views HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n", 400,
     "HTTP/1.0 request must not have a Transfer-Encoding"),
    ("chunked", post(b"Transfer-Encoding: chunked\r\n", b"4\r\nxxxx\r\n0\r\n\r\n"), 411, "Content-Length"),
    ("Chunked with a parameter", post(b"Transfer-Encoding: gzip, Chunked;q=1\r\n"), 411, "Content-Length"),
    ("chunked with a bad size", post(b"Transfer-Encoding: chunked\r\n", b"zz\r\n" + HIDDEN), 411, "Content-Length"),
    ("chunked with an extension", post(b"Transfer-Encoding: chunked\r\n", b"4;ext=\"x\"\r\nxxxx\r\n0\r\n\r\n"), 411,
     "Content-Length"),
    ("chunked on a GET", b"GET /api/info HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 411,
     "Content-Length"),
    ("a NUL in a value", b"GET /api/info HTTP/1.1\r\nHost: x\r\nX-A: a\x00b\r\n\r\n", 400, "control byte \\\\x00"),
    ("a control byte in a value", b"GET /api/info HTTP/1.1\r\nHost: x\r\nX-A: a\x01b\r\n\r\n", 400, "control byte"),
    ("DEL in a value", b"GET /api/info HTTP/1.1\r\nHost: x\r\nX-A: a\x7fb\r\n\r\n", 400, "control byte"),
    ("a NUL in a name", b"GET /api/info HTTP/1.1\r\nHost: x\r\nX\x00A: 1\r\n\r\n", 400, "header name holds"),
    ("a space in a name", b"GET /api/info HTTP/1.1\r\nHost: x\r\nX A: 1\r\n\r\n", 400, "header name holds"),
    ("an empty name", b"GET /api/info HTTP/1.1\r\nHost: x\r\n: 1\r\n\r\n", 400, "empty name"),
    ("no colon", b"GET /api/info HTTP/1.1\r\nHost: x\r\nX-A\r\n\r\n", 400, "has no colon"),
    ("a folded line", b"GET /api/info HTTP/1.1\r\nHost: x\r\nX-A: 1\r\n 2\r\n\r\n", 400, "line folding"),
    ("a folded length", post(b"Content-Length: 0\r\n\t5\r\n"), 400, "line folding"),
    ("a bare LF line end", b"GET /api/info HTTP/1.1\nHost: x\r\n\r\n", 400, "bare LF"),
    ("a bare LF inside a value", b"GET /api/info HTTP/1.1\r\nHost: x\r\nX-A: 1\nContent-Length: 5\r\n\r\n", 400,
     "bare LF"),
    ("a bare CR", b"GET /api/info HTTP/1.1\r\nHost: x\rContent-Length: 5\r\n\r\n", 400, "bare CR"),
    ("no Host", b"GET /api/info HTTP/1.1\r\n\r\n", 400, "must have a Host field"),
    ("two Hosts", b"GET /api/info HTTP/1.1\r\nHost: x\r\nHost: y\r\n\r\n", 400, "2 Host fields"),
    ("two spaces in the request line", b"GET  /api/info HTTP/1.1\r\nHost: x\r\n\r\n", 400, "one space between each"),
    ("a tab in the request line", b"GET\t/api/info HTTP/1.1\r\nHost: x\r\n\r\n", 400, "one space between each"),
    ("a control byte in the target", b"GET /api/\x01info HTTP/1.1\r\nHost: x\r\n\r\n", 400, "request target holds"),
    ("a non-ASCII target", b"GET /api/\xc3\xa9 HTTP/1.1\r\nHost: x\r\n\r\n", 400, "request target holds"),
    ("a method that is not a token", b"G(T /api/info HTTP/1.1\r\nHost: x\r\n\r\n", 400, "method is not a token"),
    ("a lowercase version", b"GET /api/info http/1.1\r\nHost: x\r\n\r\n", 400, "HTTP/<digit>.<digit>"),
    ("HTTP/1.2", b"GET /api/info HTTP/1.2\r\nHost: x\r\n\r\n", 505, "not supported"),
    ("HTTP/2.0", b"GET /api/info HTTP/2.0\r\nHost: x\r\n\r\n", 505, "not supported"),
    ("a bare request line", b"GET /api/info\r\nHost: x\r\n\r\n", 400, "one space between each"),
]


@pytest.mark.parametrize("name,raw,status,words", REFUSED, ids=[r[0] for r in REFUSED])
def test_misframed_requests_are_refused_and_the_connection_closes(explorer, name, raw, status, words):
    statuses, got = exchange(explorer, raw + HIDDEN)
    assert statuses == [status], (name, got[:400])
    head, body = got.split(b"\r\n\r\n", 1)
    assert b"\r\nconnection: close" in head.lower()
    error = json.loads(body)["error"]
    assert re.search(words, error), (name, error)
    assert b"smuggled" not in got


def test_well_framed_requests_still_work(explorer):
    body = json.dumps({"source": "random", "length": 8, "seed": 1}).encode()
    close = b"Connection: close\r\n"
    ok = [
        INFO.replace(b"\r\n\r\n", b"\r\n" + close + b"\r\n"),
        b"\r\n\r\n" + INFO.replace(b"\r\n\r\n", b"\r\n" + close + b"\r\n"),  # empty lines first (RFC 9112 2.2)
        b"GET /api/info HTTP/1.1\r\nhost:x\r\nX-A:\t a\tb \r\n" + close + b"\r\n",  # OWS and tabs, no space
        b"GET /api/info HTTP/1.0\r\n\r\n",  # HTTP/1.0 needs no Host (and closes after the answer)
        b"GET /api/info HTTP/1.1\r\nHost: x\r\nX-Bytes: caf\xc3\xa9\r\n" + close + b"\r\n",  # obs-text in a value
        b"POST /api/views HTTP/1.1\r\nHost: x\r\nContent-Length: 00%d\r\n" % len(body) + close + b"\r\n" + body,
    ]
    for raw in ok:
        statuses, got = exchange(explorer, raw)
        assert statuses == [200], (raw, got[:300])


def test_nothing_after_a_refused_request_is_answered(explorer):
    # Pipelined: a good request, a misframed one, then good ones; the first is answered, the
    # second refused, the rest never read.
    bad = post(b"Content-Length: 5\r\nContent-Length: 0\r\n")
    statuses, got = exchange(explorer, INFO + bad + INFO + INFO)
    assert statuses == [200, 400], got[:600]
    # A body larger than the limit (httplib's own 413) also ends the connection.
    big = post(b"Content-Length: %d\r\n" % (20 * 1024), b"x" * (20 * 1024))
    statuses, _ = exchange(explorer, big + HIDDEN)
    assert statuses == [413]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    d = tmp_path_factory.mktemp("framing") / "tiny"
    sh.write_ascii_model(d)
    s = sh.Server(d)
    yield s
    s.stop()


def test_serve_refuses_smuggling_too(server):
    body = json.dumps({"prompt": "Hi", "max_tokens": 1}).encode()
    hidden = b"POST /v1/completions HTTP/1.1\r\nHost: smuggled\r\nContent-Length: %d\r\n\r\n" % len(body) + body
    for headers, words in [(b"Content-Length: %d\r\nContent-Length: 0\r\n" % len(body), "2 Content-Length fields"),
                           (b"Transfer-Encoding : chunked\r\nContent-Length: %d\r\n" % len(body), "whitespace"),
                           (b"Content-Length: %d\r\nX-A: \x00\r\n" % len(body), "control byte")]:
        raw = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" + headers + b"\r\n"
        statuses, got = exchange(server.port, raw + body + hidden)
        assert statuses == [400], got[:400]
        err = json.loads(got.split(b"\r\n\r\n", 1)[1])["error"]
        assert words in err["message"] and err["type"] == "invalid_request_error"
    raw = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
           b"Connection: close\r\n\r\n" % len(body)) + body
    statuses, _ = exchange(server.port, raw, timeout=60)
    assert statuses == [200]
