"""The official OpenAI Python client (the `openai` package) drives `diffattn serve`: model list,
completions and chat completions, streamed and not, n > 1, logprobs, echo, logit_bias and the
penalties, response_format, the API key, and errors as the client raises them. Greedy answers
must equal `diffattn generate --temperature 0` on the same prompt."""

import json
import os
import shutil

import openai
import pytest

import model_helpers as mh
import serve_helpers as sh

TOKENIZER_DATA = os.environ.get("DIFFATTN_TOKENIZER_DATA",
                                os.path.join(os.path.dirname(mh.ROOT), "shared", "data",
                                             "tokenizers"))
# Llama 3's chat format with a system and a user message, as the template renders it.
RENDERED = ("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n")
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]


def generate_cli(model, prompt, n):
    p = mh.run_cli("--threads", 1, "generate", "--model", model, "--prompt", prompt,
                   "--max-new", n, "--temperature", 0)
    assert p.stdout.startswith(prompt) and p.stdout.endswith("\n")
    return p.stdout[len(prompt):-1]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A byte-level model with the Llama 3 chat template, served; (model dir, client)."""
    d = tmp_path_factory.mktemp("openai") / "chat"
    sh.write_ascii_model(d)
    real = os.path.join(TOKENIZER_DATA, "llama3", "tokenizer_config.json")
    if os.path.exists(real):
        shutil.copy(real, d / "tokenizer_config.json")
    else:
        with open(d / "tokenizer_config.json", "w") as f:
            json.dump({"bos_token": "<|begin_of_text|>", "chat_template": sh.LLAMA3_TEMPLATE}, f)
    s = sh.Server(d)
    client = openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0, timeout=60)
    yield d, client
    s.stop()


def test_models_and_completions(served):
    d, client = served
    assert [m.id for m in client.models.list().data] == ["chat"]
    want = generate_cli(d, "Hello", 12)
    c = client.completions.create(model="chat", prompt="Hello", max_tokens=12, temperature=0)
    assert c.choices[0].text == want and c.choices[0].finish_reason == "length"
    assert (c.usage.prompt_tokens, c.usage.completion_tokens, c.usage.total_tokens) == (5, 12, 17)
    assert c.object == "text_completion" and c.model == "chat"


def test_streamed_completion_carries_text_and_usage(served):
    d, client = served
    want = generate_cli(d, "Hello", 12)
    text, usage, chunks = "", None, 0
    for ch in client.completions.create(model="chat", prompt="Hello", max_tokens=12,
                                        temperature=0, stream=True,
                                        stream_options={"include_usage": True}):
        chunks += 1
        if ch.choices:
            text += ch.choices[0].text
        if ch.usage:
            usage = ch.usage
    assert text == want and chunks > 1
    assert usage is not None and usage.completion_tokens == 12 and usage.prompt_tokens == 5


def test_chat_and_streamed_chat(served):
    d, client = served
    want = generate_cli(d, RENDERED, 10)
    chat = client.chat.completions.create(model="chat", messages=MESSAGES, max_tokens=10,
                                          temperature=0)
    msg = chat.choices[0].message
    assert msg.role == "assistant" and msg.content == want
    assert chat.usage.prompt_tokens == len(RENDERED.encode())
    content, roles = "", []
    for ch in client.chat.completions.create(model="chat", messages=MESSAGES, max_tokens=10,
                                             temperature=0, stream=True):
        for choice in ch.choices:
            if choice.delta.role:
                roles.append(choice.delta.role)
            if choice.delta.content:
                content += choice.delta.content
    assert content == want and roles == ["assistant"]


def test_n_choices_and_seeded_sampling(served):
    _, client = served
    a = client.completions.create(model="chat", prompt="Hi", max_tokens=4, n=3, seed=7,
                                  temperature=1)
    assert [c.index for c in a.choices] == [0, 1, 2]
    b = client.completions.create(model="chat", prompt="Hi", max_tokens=4, n=3, seed=7,
                                  temperature=1)
    assert [c.text for c in a.choices] == [c.text for c in b.choices]


def test_errors_reach_the_client_as_openai_errors(served):
    _, client = served
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="chat", prompt="Hi", max_tokens=4, temperature=7)
    assert e.value.status_code == 400
    body = e.value.body
    assert body["param"] == "temperature" and body["type"] == "invalid_request_error"
    with pytest.raises(openai.NotFoundError) as e:
        client.completions.create(model="other", prompt="Hi", max_tokens=4)
    assert e.value.status_code == 404 and e.value.body["param"] == "model"


def test_logprobs_penalties_and_bias_through_the_client(served):
    """Chat logprobs as the client parses them (token, logprob, bytes, top_logprobs), streamed
    the same; completions' legacy logprobs and echo; logit_bias and the penalties accepted."""
    d, client = served
    want = generate_cli(d, RENDERED, 8)
    chat = client.chat.completions.create(model="chat", messages=MESSAGES, max_tokens=8, temperature=0,
                                          logprobs=True, top_logprobs=2)
    content = chat.choices[0].logprobs.content
    assert "".join(t.token for t in content) == want == chat.choices[0].message.content
    for t in content:
        assert bytes(t.bytes).decode() == t.token and t.logprob <= 0
        assert len(t.top_logprobs) == 2 and t.top_logprobs[0].token == t.token
        assert t.top_logprobs[0].logprob == pytest.approx(t.logprob)
    streamed = []
    for ch in client.chat.completions.create(model="chat", messages=MESSAGES, max_tokens=8, temperature=0,
                                             logprobs=True, top_logprobs=2, stream=True):
        for choice in ch.choices:
            if choice.logprobs and choice.logprobs.content:
                streamed += choice.logprobs.content
    assert [t.token for t in streamed] == [t.token for t in content]
    assert [t.logprob for t in streamed] == pytest.approx([t.logprob for t in content], abs=1e-6)
    c = client.completions.create(model="chat", prompt="Hello", max_tokens=5, temperature=0, logprobs=2,
                                  echo=True)
    lp = c.choices[0].logprobs
    assert c.choices[0].text.startswith("Hello") and "".join(lp.tokens) == c.choices[0].text
    assert lp.token_logprobs[0] is None and len(lp.top_logprobs[-1]) >= 2
    c = client.completions.create(model="chat", prompt="Hello", max_tokens=6, temperature=0,
                                  logit_bias={"66": 100}, presence_penalty=0.5, frequency_penalty=0.5)
    assert c.choices[0].text == "B" * 6
    c = client.chat.completions.create(model="chat", messages=MESSAGES, max_completion_tokens=3, temperature=0,
                                       seed=1, n=2)
    assert [ch.message.content for ch in c.choices] == [want[:3]] * 2
    # Fields the server does not use are ignored, not refused.
    c = client.chat.completions.create(model="chat", messages=MESSAGES, max_tokens=2, temperature=0,
                                       user="u", store=False, parallel_tool_calls=False,
                                       extra_body={"something_new": 1})
    assert c.choices[0].message.content == want[:2]


def test_response_format_through_the_client(served):
    _, client = served
    schema = {"type": "object", "properties": {"size": {"enum": ["S", "M", "L"]}, "n": {"type": "integer",
                                                                                          "minimum": 0, "maximum": 9}},
              "required": ["size", "n"], "additionalProperties": False}
    c = client.chat.completions.create(
        model="chat", messages=MESSAGES, max_tokens=40, temperature=1, seed=2, n=3,
        response_format={"type": "json_schema", "json_schema": {"name": "shirt", "schema": schema, "strict": True}})
    for ch in c.choices:
        doc = json.loads(ch.message.content)
        assert doc["size"] in ("S", "M", "L") and 0 <= doc["n"] <= 9 and ch.finish_reason == "stop"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="chat", messages=MESSAGES, max_tokens=4, response_format={
            "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "string", "pattern": "a"}}})
    assert e.value.body["param"] == "response_format.json_schema.schema"
    assert "pattern" in e.value.body["message"]


def test_api_key_with_the_client(tmp_path):
    d = tmp_path / "keyed"
    sh.write_ascii_model(d)
    s = sh.Server(d, "--api-key", "sk-local-1")
    try:
        good = openai.OpenAI(base_url=s.url + "/v1", api_key="sk-local-1", max_retries=0, timeout=60)
        assert [m.id for m in good.models.list().data] == ["keyed"]
        assert good.completions.create(model="keyed", prompt="Hi", max_tokens=2).choices[0].text
        bad = openai.OpenAI(base_url=s.url + "/v1", api_key="sk-other", max_retries=0, timeout=60)
        with pytest.raises(openai.AuthenticationError) as e:
            bad.completions.create(model="keyed", prompt="Hi", max_tokens=2)
        assert e.value.status_code == 401 and e.value.body["code"] == "invalid_api_key"
    finally:
        s.stop()
