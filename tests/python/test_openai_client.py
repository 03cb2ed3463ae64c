"""The official OpenAI Python client (the `openai` package) drives `diffattn serve`: model list,
completions and chat completions, streamed and not, n > 1, and errors as the client raises
them. Greedy answers must equal `diffattn generate --temperature 0` on the same prompt."""

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
