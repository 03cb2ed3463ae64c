// Drives `diffattn serve` with the official OpenAI Node client (npm package `openai`):
//   node tests/node/openai_client.mjs BASE_URL MODEL
// Prints one JSON object of what the client received; tests/python/test_serve.py checks it.
import OpenAI from "openai";

const [baseURL, model] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey: "unused", maxRetries: 0, timeout: 60000 });
const out = {};

out.models = (await client.models.list()).data.map((m) => m.id);

const c = await client.completions.create({ model, prompt: "Hello", max_tokens: 12, temperature: 0 });
out.completion = { text: c.choices[0].text, finish_reason: c.choices[0].finish_reason, usage: c.usage };

let streamed = "";
let chunks = 0;
let usage = null;
const s = await client.completions.create({
  model, prompt: "Hello", max_tokens: 12, temperature: 0, stream: true,
  stream_options: { include_usage: true },
});
for await (const ch of s) {
  chunks += 1;
  if (ch.choices.length > 0) streamed += ch.choices[0].text;
  if (ch.usage) usage = ch.usage;
}
out.stream = { text: streamed, chunks, usage };

const chat = await client.chat.completions.create({
  model, messages: [{ role: "system", content: "Be brief." }, { role: "user", content: "Hi there" }],
  max_tokens: 10, temperature: 0,
});
out.chat = { role: chat.choices[0].message.role, content: chat.choices[0].message.content,
             finish_reason: chat.choices[0].finish_reason, usage: chat.usage };

let chatStreamed = "";
let roles = [];
const cs = await client.chat.completions.create({
  model, messages: [{ role: "system", content: "Be brief." }, { role: "user", content: "Hi there" }],
  max_tokens: 10, temperature: 0, stream: true,
});
for await (const ch of cs) {
  for (const choice of ch.choices) {
    if (choice.delta.role) roles.push(choice.delta.role);
    if (choice.delta.content) chatStreamed += choice.delta.content;
  }
}
out.chat_stream = { content: chatStreamed, roles };

const n = await client.completions.create({ model, prompt: "Hi", max_tokens: 4, n: 3, seed: 7, temperature: 1 });
out.n = n.choices.map((ch) => ch.index);

try {
  await client.completions.create({ model, prompt: "Hi", max_tokens: 4, temperature: 7 });
  out.bad = null;
} catch (e) {
  out.bad = { status: e.status, param: e.param, type: e.type };
}
console.log(JSON.stringify(out));
