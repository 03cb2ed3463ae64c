"""`diffattn serve` end to end over loopback: greedy answers equal `diffattn generate
--temperature 0` alone and while 15 other streams run (the official OpenAI Python client is in
test_openai_client.py); a client that disconnects mid-stream frees its
sequence; a full queue answers 503; malformed requests get 400 error objects; SIGTERM ends
streams cleanly and exits 0."""

import http.client
import json
import math
import os
import re
import shutil
import socket
import subprocess
import threading
import time

import pytest

import model_helpers as mh
import serve_helpers as sh

ROOT = mh.ROOT
TOKENIZER_DATA = os.environ.get("DIFFATTN_TOKENIZER_DATA",
                                os.path.join(os.path.dirname(ROOT), "shared", "data", "tokenizers"))
CHAT_TEMPLATE_DATA = os.environ.get("DIFFATTN_CHAT_TEMPLATE_DATA",
                                    os.path.join(os.path.dirname(ROOT), "shared", "data", "chat_templates"))


def post(port, path, body, timeout=60):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    c.request("POST", path, data, {"Content-Type": "application/json"})
    r = c.getresponse()
    out = r.status, r.read()
    c.close()
    return out


def get(port, path):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("GET", path)
    r = c.getresponse()
    out = r.status, r.read()
    c.close()
    return out


def sse(port, body, timeout=60):
    """The data: payloads of a streamed completion, in order (the last is "[DONE]")."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    c.request("POST", "/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"})
    r = c.getresponse()
    assert r.status == 200, r.read()
    assert r.getheader("Content-Type").startswith("text/event-stream")
    events = [line[6:] for line in r.read().decode().split("\n") if line.startswith("data: ")]
    c.close()
    return events


def metric(port, name):
    _, text = get(port, "/metrics")
    m = re.search(rf"^{name} (\S+)$", text.decode(), re.M)
    assert m, f"{name} missing from /metrics"
    return float(m.group(1))


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    d = tmp_path_factory.mktemp("serve") / "tiny"
    sh.write_ascii_model(d)
    return d


@pytest.fixture(scope="module")
def server(model):
    s = sh.Server(model)
    yield s
    s.stop()


def generate_cli(model, prompt, n):
    p = mh.run_cli("--threads", 1, "generate", "--model", model, "--prompt", prompt,
                   "--max-new", n, "--temperature", 0)
    assert p.stdout.startswith(prompt) and p.stdout.endswith("\n")
    return p.stdout[len(prompt):-1]


def test_greedy_equals_generate_alone_and_among_15_streams(model, server):
    prompts = ["In the beginning", "And God said, Let there be light", "x"]
    want = {p: generate_cli(model, p, 30) for p in prompts}
    for p in prompts:
        got, body = post(server.port, "/v1/completions", {"prompt": p, "max_tokens": 30, "temperature": 0})
        assert got == 200, body
        r = json.loads(body)
        assert r["choices"][0]["text"] == want[p]
        assert r["choices"][0]["finish_reason"] == "length"
        assert r["usage"] == {"prompt_tokens": len(p.encode()), "completion_tokens": 30,
                              "total_tokens": len(p.encode()) + 30,
                              "prompt_tokens_details": {"cached_tokens": 0}}
        assert r["object"] == "text_completion" and r["model"] == "tiny"
    # 15 sampled streams run (long ones) while the greedy requests are answered, streamed and not.
    results, errors = {}, []

    def other(i):
        try:
            ev = sse(server.port, {"prompt": f"stream {i}", "max_tokens": 200, "temperature": 1.0,
                                   "seed": i, "stream": True})
            results[i] = ev
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(repr(e))

    threads = [threading.Thread(target=other, args=(i,)) for i in range(15)]
    for t in threads:
        t.start()
    deadline = time.time() + 20
    while metric(server.port, "diffattn_running_sequences") < 8 and time.time() < deadline:
        time.sleep(0.01)
    busy = []
    for p in prompts:
        ev = sse(server.port, {"prompt": p, "max_tokens": 30, "temperature": 0, "stream": True})
        busy.append(metric(server.port, "diffattn_running_sequences"))
        assert ev[-1] == "[DONE]"
        text = "".join(json.loads(e)["choices"][0]["text"] for e in ev[:-1])
        assert text == want[p]
        got, body = post(server.port, "/v1/completions", {"prompt": p, "max_tokens": 30, "temperature": 0})
        assert json.loads(body)["choices"][0]["text"] == want[p]
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert max(busy) >= 2, f"the other streams were not running alongside (running: {busy})"
    for i, ev in results.items():
        assert ev[-1] == "[DONE]"
        chunks = [json.loads(e) for e in ev[:-1]]
        assert chunks[-1]["choices"][0]["finish_reason"] in ("length", "stop")
    # The same seed gives the same sampled text.
    a = post(server.port, "/v1/completions", {"prompt": "seeded", "max_tokens": 20, "seed": 5})
    b = post(server.port, "/v1/completions", {"prompt": "seeded", "max_tokens": 20, "seed": 5})
    assert json.loads(a[1])["choices"][0]["text"] == json.loads(b[1])["choices"][0]["text"]


def test_stop_strings_n_and_usage_in_streams(model, server):
    full = generate_cli(model, "Hello", 30)
    stop = full[10:12]
    cut = full[:full.index(stop)]
    got, body = post(server.port, "/v1/completions",
                     {"prompt": "Hello", "max_tokens": 30, "temperature": 0, "stop": [stop, "never"]})
    r = json.loads(body)
    assert r["choices"][0]["text"] == cut and r["choices"][0]["finish_reason"] == "stop"
    ev = sse(server.port, {"prompt": "Hello", "max_tokens": 30, "temperature": 0, "stop": stop,
                           "stream": True, "stream_options": {"include_usage": True}})
    chunks = [json.loads(e) for e in ev[:-1]]
    assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"]) == cut
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["prompt_tokens"] == 5
    got, body = post(server.port, "/v1/completions", {"prompt": "Hi", "max_tokens": 5, "n": 4, "seed": 1})
    r = json.loads(body)
    assert sorted(c["index"] for c in r["choices"]) == [0, 1, 2, 3]
    assert r["usage"]["completion_tokens"] == 20


def test_malformed_requests_get_400_error_objects(server):
    cases = [
        (b"{not json", None),
        (b"[]", None),
        ({"prompt": "x", "max_tokens": "5"}, "max_tokens"),
        ({"prompt": "x", "temperature": -1}, "temperature"),
        ({"prompt": "x", "n": 0}, "n"),
        ({"prompt": "x", "frequency_penalty": 2.5}, "frequency_penalty"),
        ({"prompt": "x", "presence_penalty": "high"}, "presence_penalty"),
        ({"prompt": "x", "logit_bias": {"sixty": 5}}, "logit_bias"),
        ({"prompt": "x", "logit_bias": {"65": -101}}, "logit_bias.65"),
        ({"prompt": "x", "logit_bias": {"256": 1}}, "logit_bias"),  # past the byte vocabulary
        ({"prompt": "x", "logprobs": True}, "logprobs"),
        ({"prompt": "x", "logprobs": 99}, "logprobs"),
        ({"prompt": "x", "echo": "yes"}, "echo"),
        ({"prompt": "x", "seed": "s"}, "seed"),
        ({"prompt": "x", "response_format": {"type": "yaml"}}, "response_format.type"),
        ({"prompt": "x", "response_format": {"type": "json_schema", "json_schema": {"schema": {
            "type": "string", "pattern": "^a"}}}}, "response_format.json_schema.schema"),
        ({"prompt": "x", "max_tokens": 300}, "max_tokens"),  # past the context of 256
        ({"prompt": "x" * 300}, "prompt"),
        ({"prompt": [1, 2, 256]}, None),  # outside the byte vocabulary
        ({"max_tokens": 3}, "prompt"),
    ]
    for body, param in cases:
        got, reply = post(server.port, "/v1/completions", body)
        assert got == 400, (body, reply)
        err = json.loads(reply)["error"]
        assert set(err) == {"message", "type", "param", "code"}
        assert err["type"] == "invalid_request_error" and err["message"]
        if param:
            assert err["param"] == param, (body, err)
    chat_cases = [
        ({"logprobs": 1}, "logprobs"),
        ({"top_logprobs": 2}, "top_logprobs"),  # without logprobs: true
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({"max_completion_tokens": 0}, "max_completion_tokens"),
    ]
    for extra, param in chat_cases:
        got, reply = post(server.port, "/v1/chat/completions",
                          {"messages": [{"role": "user", "content": "hi"}], **extra})
        assert got == 400 and json.loads(reply)["error"]["param"] == param, (extra, reply)
    got, reply = post(server.port, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})
    assert got == 400
    err = json.loads(reply)["error"]
    assert err["code"] == "no_chat_template" and "tokenizer_config.json" in err["message"]
    got, reply = post(server.port, "/v1/completions", {"model": "other", "prompt": "x"})
    assert got == 404 and json.loads(reply)["error"]["param"] == "model"
    got, reply = post(server.port, "/v1/completions", b"x" * (2 << 20))
    assert got == 413 and "error" in json.loads(reply)
    assert get(server.port, "/v1/completions")[0] == 405
    assert get(server.port, "/tokenize")[0] == 405
    assert get(server.port, "/nothing")[0] == 404
    assert json.loads(get(server.port, "/health")[1]) == {"status": "ok"}
    models = json.loads(get(server.port, "/v1/models")[1])
    assert [m["id"] for m in models["data"]] == ["tiny"]
    text = get(server.port, "/metrics")[1].decode()
    for name in ("diffattn_requests_total{", "diffattn_generation_tokens_total", "diffattn_queue_depth",
                 "diffattn_batch_size", "diffattn_time_to_first_token_seconds_bucket"):
        assert name in text


@pytest.fixture(scope="module")
def slow_model(tmp_path_factory):
    """Large enough that 1000 tokens take seconds: a disconnect lands mid-generation."""
    d = tmp_path_factory.mktemp("serve") / "slow"
    sh.write_ascii_model(d, max_seq_len=1100, d_model=384, n_layers=8, ffn_dim=1024)
    return d


def test_disconnect_frees_the_sequence_and_overload_gives_503(slow_model):
    s = sh.Server(slow_model, "--max-batch", 1, "--max-waiting", 1)
    try:
        total = metric(s.port, "diffattn_kv_blocks_total")
        sock = socket.create_connection(("127.0.0.1", s.port))
        body = json.dumps({"prompt": "a", "max_tokens": 1000, "stream": True}).encode()
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        seen = b""
        while b"data: " not in seen:
            chunk = sock.recv(4096)
            assert chunk, f"the stream ended early: {seen!r}"
            seen += chunk
        # The batch holds one sequence and the queue one more: a third request is refused.
        waiting = threading.Thread(target=post, args=(s.port, "/v1/completions",
                                                      {"prompt": "b", "max_tokens": 5}))
        waiting.start()
        deadline = time.time() + 10
        while metric(s.port, "diffattn_queue_depth") < 1 and time.time() < deadline:
            time.sleep(0.01)
        got, reply = post(s.port, "/v1/completions", {"prompt": "c", "max_tokens": 5})
        assert got == 503, reply
        err = json.loads(reply)["error"]
        assert err["code"] == "queue_full" and "capacity" in err["message"]
        assert metric(s.port, "diffattn_kv_blocks_free") < total
        sock.close()  # the client goes away mid-stream
        waiting.join(30)
        deadline = time.time() + 10
        while (metric(s.port, "diffattn_running_sequences") > 0 or
               metric(s.port, "diffattn_kv_blocks_free") < total) and time.time() < deadline:
            time.sleep(0.02)
        assert metric(s.port, "diffattn_running_sequences") == 0
        assert metric(s.port, "diffattn_kv_blocks_free") == total
        assert metric(s.port, "diffattn_generation_tokens_total") < 1000, "the stream was not cancelled"
    finally:
        s.stop()


def test_sigterm_ends_streams_and_exits_0(slow_model):
    s = sh.Server(slow_model)
    c = http.client.HTTPConnection("127.0.0.1", s.port, timeout=30)
    c.request("POST", "/v1/completions", json.dumps({"prompt": "a", "max_tokens": 1000, "stream": True}).encode())
    r = c.getresponse()
    assert r.status == 200
    first = r.readline()
    assert first.startswith(b"data: ")
    s.stop()  # asserts exit status 0
    rest = r.read().decode()
    assert rest.rstrip().endswith("data: [DONE]")
    assert "shutting down" in rest


def test_host_and_port_refusals(model, server):
    p = mh.run_cli("serve", "--model", model, "--host", "0.0.0.0", "--port", 0, check=False)
    assert p.returncode != 0 and "--allow-remote" in p.stderr
    p = mh.run_cli("serve", "--model", model, "--port", server.port, check=False, timeout=30)
    assert p.returncode != 0 and "already in use" in p.stderr
    p = mh.run_cli("serve", "--model", "/nonexistent/dir", check=False)
    assert p.returncode != 0 and "/nonexistent/dir" in p.stderr


def test_hugging_face_directory_with_the_llama3_tokenizer(tmp_path):
    """A DiffLlama directory (BF16) with Llama 3's tokenizer.json and tokenizer_config.json:
    completions equal `diffattn generate`, the chat prompt is the template rendered and encoded
    with its special tokens (no second <|begin_of_text|>), streamed text equals the whole answer."""
    tok = os.path.join(TOKENIZER_DATA, "llama3")
    if not os.path.exists(os.path.join(tok, "tokenizer.json")):
        pytest.skip(f"no Llama-3 tokenizer at {tok} (set DIFFATTN_TOKENIZER_DATA)")
    import numpy as np
    import torch_model as tm
    cfg = {"format": "diffattn/1", "attention": "diff_v1", "vocab_size": 128256, "d_model": 32,
           "n_layers": 2, "n_heads": 2, "n_kv_heads": 1, "head_dim": 8, "ffn_dim": 48,
           "max_seq_len": 512, "rope_theta": 500000.0, "norm_eps": 1e-5, "tie_embeddings": False}
    rng = np.random.default_rng(0)
    src = tmp_path / "src"
    os.makedirs(src)
    tm.write_safetensors(str(src / "model.safetensors"),
                         {n: (1.0 + 0.1 * rng.standard_normal(s)) if n.endswith("norm.weight") or "subln" in n
                          else 0.1 * rng.standard_normal(s) for n, s in mh.tensor_shapes(cfg).items()})
    with open(src / "config.json", "w") as f:
        json.dump(cfg, f)
    hf = tmp_path / "hf"
    mh.run_cli("convert", "--model", src, "--to", "hf", "--out", hf, "--dtype", "bf16")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(tok, name), hf / name)
    prompt = "The capital of France is"
    want = mh.run_cli("--threads", 1, "generate", "--model", hf, "--prompt", prompt, "--max-new", 6,
                      "--temperature", 0).stdout
    s = sh.Server(hf)
    try:
        got, body = post(s.port, "/v1/completions", {"prompt": prompt, "max_tokens": 6, "temperature": 0})
        r = json.loads(body)
        assert prompt + r["choices"][0]["text"] + "\n" == want
        assert r["usage"]["prompt_tokens"] == 6  # <|begin_of_text|> and 5 words
        msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": " Hello there! "}]
        rendered = ("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
                    "<|start_header_id|>user<|end_header_id|>\n\nHello there!<|eot_id|>"
                    "<|start_header_id|>assistant<|end_header_id|>\n\n")
        ids = mh.run_cli("tokenize", "--tokenizer", hf, "--text", rendered).stdout.split()
        assert ids[0] == "128000" and ids.count("128000") == 1
        got, body = post(s.port, "/v1/chat/completions", {"messages": msgs, "max_tokens": 8, "temperature": 0})
        assert got == 200, body
        r = json.loads(body)
        assert r["usage"]["prompt_tokens"] == len(ids)
        c = http.client.HTTPConnection("127.0.0.1", s.port, timeout=60)
        c.request("POST", "/v1/chat/completions",
                  json.dumps({"messages": msgs, "max_tokens": 8, "temperature": 0, "stream": True}).encode())
        events = [l[6:] for l in c.getresponse().read().decode().split("\n") if l.startswith("data: ")]
        assert events[-1] == "[DONE]"
        text = "".join(json.loads(e)["choices"][0]["delta"].get("content", "") for e in events[:-1]
                       if json.loads(e)["choices"])
        assert text == r["choices"][0]["message"]["content"]
        # Constrained output over Llama 3's 128,256 tokens: whole enum objects from random weights.
        schema = {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]}},
                  "required": ["color"], "additionalProperties": False}
        got, body = post(s.port, "/v1/completions", {
            "prompt": prompt, "max_tokens": 40, "temperature": 1, "seed": 3, "n": 3,
            "response_format": {"type": "json_schema", "json_schema": {"name": "c", "schema": schema}}})
        assert got == 200, body
        for c in json.loads(body)["choices"]:
            assert json.loads(c["text"])["color"] in ("red", "green", "blue") and c["finish_reason"] == "stop", c
        # logprobs name real BPE tokens; /tokenize and /detokenize agree with the tokenizer.
        got, body = post(s.port, "/v1/completions", {"prompt": prompt, "max_tokens": 6, "temperature": 0,
                                                     "logprobs": 2})
        lp = json.loads(body)["choices"][0]["logprobs"]
        assert len(lp["tokens"]) == 6 and all(v <= 0 for v in lp["token_logprobs"])
        got, body = post(s.port, "/tokenize", {"prompt": prompt})
        tokens = json.loads(body)["tokens"]
        assert tokens[0] == 128000 and json.loads(body)["count"] == 6
        got, body = post(s.port, "/tokenize", {"prompt": prompt, "add_special_tokens": False})
        assert json.loads(body)["tokens"] == tokens[1:]
        got, body = post(s.port, "/tokenize", {"messages": msgs})
        assert [str(t) for t in json.loads(body)["tokens"]] == ids
        got, body = post(s.port, "/detokenize", {"tokens": tokens[1:]})
        assert json.loads(body) == {"prompt": prompt}
    finally:
        s.stop()


def test_chat_with_the_real_qwen3_and_mistral_templates(tmp_path):
    """Two more real templates through HTTP: Qwen3's as chat_template.jinja (no bos_token),
    Mistral-Nemo's in tokenizer_config.json. The prompt is what jinja2 renders in transformers'
    environment, the answer what `diffattn generate` gives on it; a conversation Mistral's
    template refuses is a 400 with the template's own message; a template that does not parse
    stops the server at start-up, naming the file and the line."""
    tdir = os.path.join(CHAT_TEMPLATE_DATA, "templates")
    if not os.path.isdir(tdir):
        pytest.skip(f"no chat templates at {tdir} (set DIFFATTN_CHAT_TEMPLATE_DATA)")
    from transformers.utils.chat_template_utils import _compile_jinja_template

    def read(name):
        with open(os.path.join(tdir, name), encoding="utf-8", newline="") as f:
            return f.read()

    qwen, mistral = read("Qwen-Qwen3-0.6B.jinja"), read("mistralai-Mistral-Nemo-Instruct-2407.jinja")
    q, m = tmp_path / "qwen3", tmp_path / "mistral"
    for d in (q, m):
        sh.write_ascii_model(d, max_seq_len=512)
    with open(q / "chat_template.jinja", "w", encoding="utf-8", newline="") as f:
        f.write(qwen)
    with open(q / "tokenizer_config.json", "w") as f:
        json.dump({"bos_token": None, "eos_token": "<|im_end|>"}, f)
    with open(m / "tokenizer_config.json", "w") as f:
        json.dump({"bos_token": "<s>", "eos_token": "</s>", "chat_template": mistral}, f)
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": " Hi there "}]
    twice = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
    for d, source, tokens in ((q, qwen, {"eos_token": "<|im_end|>"}), (m, mistral, {"bos_token": "<s>", "eos_token": "</s>"})):
        tmpl = _compile_jinja_template(source)
        rendered = tmpl.render(messages=msgs, tools=None, documents=None, add_generation_prompt=True, **tokens)
        want = generate_cli(d, rendered, 8)
        s = sh.Server(d)
        try:
            got, body = post(s.port, "/v1/chat/completions", {"messages": msgs, "max_tokens": 8, "temperature": 0})
            assert got == 200, body
            r = json.loads(body)
            assert r["usage"]["prompt_tokens"] == len(rendered.encode())
            assert r["choices"][0]["message"]["content"] == want
            got, body = post(s.port, "/v1/chat/completions", {"messages": twice, "max_tokens": 4, "temperature": 0})
            if d == q:  # Qwen3's template takes any order
                assert got == 200, body
            else:
                assert got == 400, body
                err = json.loads(body)["error"]
                assert err["param"] == "messages" and err["code"] == "chat_template_error"
                with pytest.raises(Exception) as refused:  # jinja2.exceptions.TemplateError
                    tmpl.render(messages=twice, tools=None, documents=None, add_generation_prompt=True, **tokens)
                assert ": " + str(refused.value) + " (" in err["message"]
                assert "tokenizer_config.json" in err["message"]
        finally:
            s.stop()
    with open(q / "chat_template.jinja", "w") as f:
        f.write("{% for m in messages %}\n{{ m.content }")
    p = mh.run_cli("serve", "--model", q, "--port", 0, check=False, timeout=60)
    assert p.returncode != 0 and "chat_template.jinja, line 2" in p.stderr, p.stderr


def test_tools_tool_calls_and_developer_messages_reach_the_template(tmp_path):
    """A chat with tools, an assistant message calling one (content null, arguments as OpenAI's
    JSON string), the tool's answer and a developer message renders as jinja2 renders it in
    transformers' environment with the arguments as an object (vLLM's reading), the developer
    message as a system message (OpenAI's) and the call's null content as "", for Qwen3's and Mistral-Nemo's real templates:
    the tools' key order survives (Mistral writes each tool's keys in their order). The same
    through /tokenize and /v1/chat/completions; malformed tools and calls are 400s naming them."""
    tdir = os.path.join(CHAT_TEMPLATE_DATA, "templates")
    if not os.path.isdir(tdir):
        pytest.skip(f"no chat templates at {tdir} (set DIFFATTN_CHAT_TEMPLATE_DATA)")
    from transformers.utils.chat_template_utils import _compile_jinja_template

    tools = [{"type": "function", "function": {
        "name": "get_weather", "description": "The weather in a city",
        "parameters": {"type": "object", "required": ["city"],
                       "properties": {"unit": {"enum": ["C", "F"]}, "city": {"type": "string"}}}}},
             {"type": "function", "function": {"parameters": {"type": "object", "properties": {}},
                                               "name": "now"}}]
    args = '{"unit": "C", "city": "Paris"}'
    sent = [{"role": "developer", "content": "Answer with tools."},
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": None,
             "tool_calls": [{"id": "abc123XYZ", "type": "function",
                             "function": {"name": "get_weather", "arguments": args}}]},
            {"role": "tool", "tool_call_id": "abc123XYZ", "content": "{\"celsius\": 21}"},
            {"role": "assistant", "content": "21 C."},
            {"role": "user", "content": "Thanks"}]
    seen = json.loads(json.dumps(sent))
    seen[0]["role"] = "system"
    seen[2]["content"] = ""  # a tool-calling message without content: Qwen3's template needs a string
    seen[2]["tool_calls"][0]["function"]["arguments"] = json.loads(args)
    for name, tokens in (("Qwen-Qwen3-0.6B.jinja", {"eos_token": "<|im_end|>"}),
                         ("mistralai-Mistral-Nemo-Instruct-2407.jinja", {"bos_token": "<s>", "eos_token": "</s>"})):
        with open(os.path.join(tdir, name), encoding="utf-8", newline="") as f:
            source = f.read()
        want = _compile_jinja_template(source).render(messages=seen, tools=tools, documents=None,
                                                       add_generation_prompt=True, **tokens)
        assert "get_weather" in want and "Paris" in want and "21" in want
        d = tmp_path / name.split("-")[0]
        sh.write_ascii_model(d, max_seq_len=2048)
        with open(d / "tokenizer_config.json", "w") as f:
            json.dump({"chat_template": source, "bos_token": tokens.get("bos_token"), **tokens}, f)
        s = sh.Server(d)
        try:
            got, body = post(s.port, "/tokenize", {"messages": sent, "tools": tools})
            assert got == 200, body
            assert bytes(json.loads(body)["tokens"]).decode() == want
            got, body = post(s.port, "/v1/chat/completions",
                             {"messages": sent, "tools": tools, "tool_choice": "auto", "max_tokens": 2})
            assert got == 200, body
            assert json.loads(body)["usage"]["prompt_tokens"] == len(want.encode())
            bad = [({"tools": {"type": "function"}}, "tools"),
                   ({"tools": [{"type": "retrieval"}]}, "tools[0].type"),
                   ({"tools": [{"type": "function", "function": {"description": "x"}}]}, "tools[0].function.name"),
                   ({"tools": [{"type": "function", "function": {"name": "f", "parameters": "{}"}}]},
                    "tools[0].function.parameters"),
                   ({"messages": [{"role": "user", "content": "a", "tool_calls": []}]}, "messages[0].tool_calls"),
                   ({"messages": [{"role": "assistant", "content": None}]}, "messages[0].content"),
                   ({"messages": [{"role": "assistant", "tool_calls": [{"function": {"arguments": "{}"}}]}]},
                    "messages[0].tool_calls[0].function.name"),
                   ({"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": 3}}]}]},
                    "messages[0].tool_calls[0].function.arguments"),
                   ({"messages": [{"role": "narrator", "content": "a"}]}, "messages[0].role")]
            for extra, param in bad:
                got, body = post(s.port, "/v1/chat/completions", {"messages": sent, "max_tokens": 1, **extra})
                assert got == 400 and json.loads(body)["error"]["param"] == param, (extra, body)
        finally:
            s.stop()


def test_max_tokens_0_scores_the_prompt(model, server):
    """Completions with max_tokens 0 and echo return the prompt and, with logprobs, its tokens'
    log probabilities (the ones a longer request's echo gives), nothing generated; chat needs at
    least one token."""
    full = completion(server.port, prompt="Hello", max_tokens=4, temperature=0, echo=True, logprobs=2)
    r = completion(server.port, prompt="Hello", max_tokens=0, echo=True, logprobs=2)
    ch = r["choices"][0]
    assert ch["text"] == "Hello" and ch["finish_reason"] == "length"
    assert ch["logprobs"]["tokens"] == list("Hello")
    assert ch["logprobs"]["token_logprobs"][0] is None
    assert ch["logprobs"]["token_logprobs"][1:] == pytest.approx(full["choices"][0]["logprobs"]["token_logprobs"][1:5], abs=1e-5)
    assert r["usage"]["completion_tokens"] == 0 and r["usage"]["prompt_tokens"] == 5
    assert completion(server.port, prompt="Hello", max_tokens=0)["choices"][0]["text"] == ""
    ev = sse(server.port, {"prompt": "Hello", "max_tokens": 0, "echo": True, "stream": True})
    assert ev[-1] == "[DONE]"
    chunks = [json.loads(e) for e in ev[:-1]]
    assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"]) == "Hello"
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "length"
    got, body = post(server.port, "/v1/chat/completions",
                     {"messages": [{"role": "user", "content": "a"}], "max_tokens": 0})
    assert got == 400 and json.loads(body)["error"]["param"] == "max_tokens", body


def test_a_request_past_its_timeout_gets_504(slow_model):
    s = sh.Server(slow_model, "--timeout", 1)
    try:
        t0 = time.time()
        got, reply = post(s.port, "/v1/completions", {"prompt": "a", "max_tokens": 1000})
        assert got == 504, reply
        err = json.loads(reply)["error"]
        assert err["code"] == "timeout" and "1 s" in err["message"]
        assert time.time() - t0 < 10
        ev = sse(s.port, {"prompt": "a", "max_tokens": 1000, "stream": True})
        assert ev[-1] == "[DONE]" and "timeout" in ev[-2]
        total = metric(s.port, "diffattn_kv_blocks_total")
        deadline = time.time() + 10
        while metric(s.port, "diffattn_kv_blocks_free") < total and time.time() < deadline:
            time.sleep(0.02)
        assert metric(s.port, "diffattn_kv_blocks_free") == total
    finally:
        s.stop()


def test_kv_dtype_and_pool_size(model):
    """--kv-dtype bf16 with blocks of 5 positions (a prompt's blocks straddle its chunks): greedy
    answers equal `generate --kv-dtype bf16`; a pool larger than the machine is refused at start
    with its size, not allocated."""
    s = sh.Server(model, "--kv-dtype", "bf16", "--block-size", "5", "--prefill-chunk", "7")
    try:
        for prompt in ["In the beginning", "And God said, Let there be light"]:
            p = mh.run_cli("--threads", 1, "generate", "--model", model, "--prompt", prompt,
                           "--max-new", 25, "--temperature", 0, "--kv-dtype", "bf16")
            want = p.stdout[len(prompt):-1]
            got, body = post(s.port, "/v1/completions", {"prompt": prompt, "max_tokens": 25, "temperature": 0})
            assert got == 200, body
            assert json.loads(body)["choices"][0]["text"] == want
    finally:
        s.stop()
    r = subprocess.run([mh.CLI, "serve", "--model", str(model), "--port", "0", "--kv-blocks", str(1 << 30),
                        "--block-size", "1"], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    assert "KV pool" in r.stderr and "GiB" in r.stderr, r.stderr


def completion(port, **body):
    got, reply = post(port, "/v1/completions", body)
    assert got == 200, reply
    return json.loads(reply)


def test_logit_bias_and_penalties(model, server):
    """logit_bias adds to the logits (100 on "A": every token is "A"; -100 on greedy's first
    token: another comes first); penalties subtract per generated token, so the same bias with
    a frequency penalty runs out of "A"s, sooner with a larger penalty."""
    want = generate_cli(model, "Hello", 20)
    r = completion(server.port, prompt="Hello", max_tokens=20, temperature=0, logit_bias={"65": 100})
    assert r["choices"][0]["text"] == "A" * 20
    r = completion(server.port, prompt="Hello", max_tokens=20, temperature=0,
                   logit_bias={str(ord(want[0])): -100})
    assert r["choices"][0]["text"][0] != want[0]
    runs = []
    for fp, pp in ((0.0, 0.0), (1.0, 0.0), (2.0, 0.0), (2.0, 2.0)):
        r = completion(server.port, prompt="Hello", max_tokens=60, temperature=0, logit_bias={"65": 100},
                       frequency_penalty=fp, presence_penalty=pp)
        text = r["choices"][0]["text"]
        runs.append(len(text) - len(text.lstrip("A")))
    assert runs[0] == 60 and runs == sorted(runs, reverse=True) and 0 < runs[-1] < runs[0], runs
    # A presence penalty counts a token once: -2 keeps the greedy text on what it has written.
    a = completion(server.port, prompt="Hello", max_tokens=30, temperature=0, presence_penalty=2)
    b = completion(server.port, prompt="Hello", max_tokens=30, temperature=0, presence_penalty=-2)
    assert a["choices"][0]["text"] != b["choices"][0]["text"]
    # A penalised request is reproducible with its seed, and n choices differ.
    c1 = completion(server.port, prompt="Hi", max_tokens=12, seed=3, n=2, frequency_penalty=1, presence_penalty=0.5)
    c2 = completion(server.port, prompt="Hi", max_tokens=12, seed=3, n=2, frequency_penalty=1, presence_penalty=0.5)
    assert [c["text"] for c in c1["choices"]] == [c["text"] for c in c2["choices"]]


def test_logprobs_and_echo_whole_and_streamed(model, server):
    """Completions' legacy logprobs: one entry per token, whose texts make the answer; greedy
    tokens are their own top; streamed chunks carry the same; echo puts the prompt (and its
    tokens, the first with null) before the completion."""
    want = generate_cli(model, "Hello", 12)
    r = completion(server.port, prompt="Hello", max_tokens=12, temperature=0, logprobs=3)
    ch = r["choices"][0]
    lp = ch["logprobs"]
    assert ch["text"] == want
    assert "".join(lp["tokens"]) == want and len(lp["tokens"]) == 12
    assert lp["text_offset"] == list(range(12))
    for tok, val, top in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"]):
        assert val <= 0 and len(top) == 3 and top[tok] == val and max(top.values()) == val
    # The log-softmax at temperature 1 (greedy) sums to at most 1 over the top ones.
    assert all(sum(math.exp(v) for v in top.values()) <= 1 + 1e-5 for top in lp["top_logprobs"])
    # Streamed: the same tokens and values.
    ev = sse(server.port, {"prompt": "Hello", "max_tokens": 12, "temperature": 0, "logprobs": 3, "stream": True})
    chunks = [json.loads(e) for e in ev[:-1]]
    toks, vals = [], []
    for c in chunks:
        if c["choices"] and c["choices"][0]["logprobs"]:
            toks += c["choices"][0]["logprobs"]["tokens"]
            vals += c["choices"][0]["logprobs"]["token_logprobs"]
    assert toks == lp["tokens"]
    assert vals == pytest.approx(lp["token_logprobs"], abs=1e-6)
    # Echo, with and without logprobs, whole and streamed.
    r = completion(server.port, prompt="Hello", max_tokens=12, temperature=0, echo=True)
    assert r["choices"][0]["text"] == "Hello" + want
    r = completion(server.port, prompt="Hello", max_tokens=12, temperature=0, echo=True, logprobs=1)
    lpe = r["choices"][0]["logprobs"]
    assert lpe["tokens"] == list("Hello") + lp["tokens"]
    assert lpe["token_logprobs"][0] is None and lpe["top_logprobs"][0] is None
    assert all(v <= 0 for v in lpe["token_logprobs"][1:])
    assert lpe["token_logprobs"][5:] == pytest.approx(lp["token_logprobs"], abs=1e-4)
    assert lpe["text_offset"] == list(range(17))
    ev = sse(server.port, {"prompt": "Hello", "max_tokens": 12, "temperature": 0, "echo": True, "stream": True})
    text = "".join(json.loads(e)["choices"][0]["text"] for e in ev[:-1] if json.loads(e)["choices"])
    assert text == "Hello" + want
    # Prompt ids echo as their text.
    r = completion(server.port, prompt=list(b"Hello"), max_tokens=3, temperature=0, echo=True)
    assert r["choices"][0]["text"] == "Hello" + want[:3]


def test_response_format_json_schema_on_a_random_model(model, server):
    """A random-weight model under an enum-only schema writes a whole object, one of the enum's
    values, and stops within a few dozen tokens, for every sampled choice; json_object gives an
    object."""
    schema = {"type": "object", "properties": {"color": {"type": "string", "enum": ["red", "green", "blue"]},
                                               "ok": {"type": "boolean"}},
              "required": ["color", "ok"], "additionalProperties": False}
    for seed in range(3):
        r = completion(server.port, prompt="Pick:", max_tokens=60, temperature=1, seed=seed, n=4,
                       response_format={"type": "json_schema", "json_schema": {"name": "c", "schema": schema,
                                                                                "strict": True}})
        for c in r["choices"]:
            doc = json.loads(c["text"])
            assert list(doc) == ["color", "ok"] and doc["color"] in ("red", "green", "blue")
            assert isinstance(doc["ok"], bool) and c["finish_reason"] == "stop"
        assert r["usage"]["completion_tokens"] <= 4 * 40
    r = completion(server.port, prompt="Pick:", max_tokens=200, temperature=0,
                   response_format={"type": "json_object"})
    text = r["choices"][0]["text"]
    assert text.startswith("{")
    if r["choices"][0]["finish_reason"] == "stop":
        assert isinstance(json.loads(text), dict)
    ev = sse(server.port, {"prompt": "Pick:", "max_tokens": 60, "temperature": 1, "seed": 1, "stream": True,
                           "response_format": {"type": "json_schema", "json_schema": {"schema": schema}}})
    text = "".join(json.loads(e)["choices"][0]["text"] for e in ev[:-1] if json.loads(e)["choices"])
    assert json.loads(text)["color"] in ("red", "green", "blue")
    got, reply = post(server.port, "/v1/completions", {"prompt": "x", "response_format": {
        "type": "json_schema", "json_schema": {"schema": {"type": "object", "properties": {
            "a": {"type": "string", "format": "date"}}}}}})
    assert got == 400
    err = json.loads(reply)["error"]
    assert err["param"] == "response_format.json_schema.schema" and err["code"] == "unsupported_schema"
    assert '"format"' in err["message"] and "/properties/a/format" in err["message"]


def test_tokenize_and_detokenize(server):
    got, reply = post(server.port, "/tokenize", {"prompt": "Hi!"})
    assert got == 200, reply
    r = json.loads(reply)
    assert r["tokens"] == [72, 105, 33] and r["count"] == 3 and r["max_model_len"] == 256
    got, reply = post(server.port, "/detokenize", {"tokens": [72, 105, 33], "model": "tiny"})
    assert got == 200 and json.loads(reply) == {"prompt": "Hi!"}
    for path, body, param in [("/tokenize", {}, "prompt"), ("/tokenize", {"prompt": 3}, "prompt"),
                              ("/tokenize", {"prompt": "x" * 300000}, "prompt"),
                              ("/detokenize", {"tokens": [1, 300]}, "tokens[1]"),
                              ("/detokenize", {"tokens": "abc"}, "tokens"),
                              ("/detokenize", {}, "tokens"), ("/tokenize", b"{oops", None)]:
        got, reply = post(server.port, path, body)
        assert got == 400, (path, body, reply)
        err = json.loads(reply)["error"]
        assert err["type"] == "invalid_request_error"
        if param:
            assert err["param"] == param, (body, err)
    got, reply = post(server.port, "/tokenize", {"prompt": "x", "model": "other"})
    assert got == 404
    # This model has no chat template: messages are a 400 saying so.
    got, reply = post(server.port, "/tokenize", {"messages": [{"role": "user", "content": "hi"}]})
    assert got == 400 and json.loads(reply)["error"]["code"] == "no_chat_template"


def test_unknown_fields_are_ignored_and_logged_once(model):
    s = sh.Server(model)
    try:
        for _ in range(3):
            got, reply = post(s.port, "/v1/completions", {"prompt": "x", "max_tokens": 2, "bogus_field": 1,
                                                          "user": "u", "suffix": "!"})
            assert got == 200, reply
    finally:
        s.stop()
    err = s.proc.stderr.read().decode()
    assert err.count('"bogus_field"') == 1 and err.count('"suffix"') == 1, err


def test_api_key_from_the_flag_and_the_environment(model):
    def check(s, key):
        got, reply = post(s.port, "/v1/completions", {"prompt": "x", "max_tokens": 2})
        assert got == 401, reply
        err = json.loads(reply)["error"]
        assert err["code"] == "invalid_api_key" and err["type"] == "invalid_request_error"
        for path in ("/tokenize", "/detokenize"):
            assert post(s.port, path, {"prompt": "x"})[0] == 401
        c = http.client.HTTPConnection("127.0.0.1", s.port, timeout=30)
        c.request("GET", "/v1/models", headers={"Authorization": "Bearer wrong"})
        r = c.getresponse()
        assert r.status == 401 and r.getheader("WWW-Authenticate") == "Bearer"
        r.read()
        c.request("POST", "/v1/completions", json.dumps({"prompt": "x", "max_tokens": 2}).encode(),
                  {"Authorization": "Bearer " + key})
        r = c.getresponse()
        assert r.status == 200, r.read()
        r.read()
        c.close()
        assert get(s.port, "/health")[0] == 200 and get(s.port, "/metrics")[0] == 200

    s = sh.Server(model, "--api-key", "k-123")
    try:
        check(s, "k-123")
    finally:
        s.stop()
    os.environ["DIFFATTN_API_KEY"] = "from-env"
    try:
        s = sh.Server(model)
    finally:
        del os.environ["DIFFATTN_API_KEY"]
    try:
        check(s, "from-env")
    finally:
        s.stop()
    p = mh.run_cli("serve", "--model", model, "--api-key", "has space", check=False)
    assert p.returncode != 0 and "API key" in p.stderr


def test_prefix_cache_reuses_blocks_and_changes_nothing(model):
    """A prompt seen before takes its whole 16-position blocks (not its last token) from the
    prefix cache, and the start of its next block from a cached block after the same prefix
    that begins the same way (its rows copied): usage and /metrics say how many, and the
    answers, greedy and seeded, whole and streamed, are those of a server without the cache
    (and of `diffattn generate`)."""
    base = "In the beginning God created the heaven and the earth."  # 55 bytes: 3 whole blocks
    prompts = [base, base, base + " And the earth was", base[:40], base]
    want = generate_cli(model, base, 20)
    answers = {}
    for flag in ((), ("--no-prefix-cache",)):
        s = sh.Server(model, *flag)
        try:
            got = []
            for i, p in enumerate(prompts):
                r = completion(s.port, prompt=p, max_tokens=20, temperature=0)
                g = completion(s.port, prompt=p, max_tokens=20, seed=i, temperature=1.0)
                ev = sse(s.port, {"prompt": p, "max_tokens": 20, "temperature": 0, "stream": True,
                                  "stream_options": {"include_usage": True}})
                streamed = "".join(json.loads(e)["choices"][0]["text"] for e in ev[:-1] if json.loads(e)["choices"])
                assert streamed == r["choices"][0]["text"]
                got.append((r["choices"][0]["text"], g["choices"][0]["text"],
                            r["usage"]["prompt_tokens_details"]["cached_tokens"],
                            json.loads(ev[-2])["usage"]["prompt_tokens_details"]["cached_tokens"],
                            g["usage"]["prompt_tokens_details"]["cached_tokens"]))
            answers[flag] = got
            assert metric(s.port, "diffattn_prefix_cache_hit_tokens_total") == sum(sum(g[2:]) for g in got)
        finally:
            s.stop()
    on, off = answers[()], answers[("--no-prefix-cache",)]
    assert [g[:2] for g in on] == [g[:2] for g in off]
    assert on[0][0] == want
    # base[:40]: 2 blocks and 7 rows of base's cached third (its last token computed); base at
    # the end: 3 blocks and the 5 rows its tokens share with the fourth block the longer prompt
    # (prompts[2]) left cached, up to where their tokens part
    assert [g[2] for g in on] == [0, 48, 48, 39, 53] and on[0][3] == 48
    assert all(g[2] == 0 and g[3] == 0 for g in off)
