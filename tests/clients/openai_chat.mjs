// The official OpenAI SDK against sluice: chat (plain and streaming), reasoning fields, usage,
// tools, completions, models, and the SDK's error path.
import OpenAI from "openai";
import { BASE, assert, test, done } from "./lib.mjs";

const client = new OpenAI({ baseURL: `${BASE}/v1`, apiKey: "unused", maxRetries: 0, timeout: 60_000 });
const messages = [
  { role: "system", content: "You are terse." },
  { role: "user", content: "Say hello." },
];

await test("models.list reports one model", async () => {
  const page = await client.models.list();
  assert.equal(page.data.length, 1);
  assert.equal(typeof page.data[0].id, "string");
});

await test("chat, not streaming: message, finish_reason, usage", async () => {
  const r = await client.chat.completions.create({ model: "tiny", messages, max_tokens: 8, temperature: 0 });
  assert.equal(r.object, "chat.completion");
  assert.equal(r.choices.length, 1);
  assert.equal(r.choices[0].message.role, "assistant");
  assert.ok(["stop", "length"].includes(r.choices[0].finish_reason), r.choices[0].finish_reason);
  assert.ok(r.usage.prompt_tokens > 0);
  assert.ok(r.usage.completion_tokens >= 1 && r.usage.completion_tokens <= 8);
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens);
  const m = r.choices[0].message;
  // Thinking is off by default for chat completions: the answer is content, no reasoning.
  assert.equal(m.reasoning_content, undefined);
  assert.equal(m.reasoning, undefined);
});

await test("chat with reasoning_effort: reasoning under both names", async () => {
  const r = await client.chat.completions.create({
    model: "tiny", messages, max_tokens: 8, temperature: 0, reasoning_effort: "high",
  });
  const m = r.choices[0].message;
  assert.equal(m.reasoning_content, m.reasoning);
});

await test("chat, streaming: role first, deltas, finish, usage chunk", async () => {
  const stream = await client.chat.completions.create({
    model: "tiny", messages, max_tokens: 6, temperature: 0, stream: true, stream_options: { include_usage: true },
  });
  const chunks = [];
  for await (const c of stream) chunks.push(c);
  assert.ok(chunks.length >= 3, `only ${chunks.length} chunks`);
  assert.equal(chunks[0].choices[0].delta.role, "assistant");
  const ids = new Set(chunks.map((c) => c.id));
  assert.equal(ids.size, 1, "every chunk carries the same id");
  for (const c of chunks.slice(1)) if (c.choices.length) assert.equal(c.choices[0].delta.role, undefined);
  const usage = chunks[chunks.length - 1];
  assert.deepEqual(usage.choices, []);
  assert.ok(usage.usage.prompt_tokens > 0 && usage.usage.completion_tokens >= 1);
  const fin = chunks[chunks.length - 2];
  assert.ok(["stop", "length"].includes(fin.choices[0].finish_reason));
  for (const c of chunks.slice(1, -2)) {
    assert.equal(c.choices[0].finish_reason, null);
    const d = c.choices[0].delta;
    if (d.reasoning_content !== undefined) assert.equal(d.reasoning_content, d.reasoning);
  }
});

await test("streamed text equals the non-streamed text (greedy)", async () => {
  const body = { model: "tiny", messages, max_tokens: 10, temperature: 0, reasoning_effort: "none" };
  const plain = await client.chat.completions.create(body);
  const stream = await client.chat.completions.create({ ...body, stream: true });
  let text = "";
  for await (const c of stream) text += c.choices[0]?.delta?.content ?? "";
  assert.equal(text, plain.choices[0].message.content ?? "");
  assert.equal(plain.choices[0].message.reasoning_content, undefined, "no reasoning with thinking off");
});

await test("tool definitions and a tool loop are accepted", async () => {
  const tools = [{
    type: "function",
    function: {
      name: "get_weather", description: "Weather for a city",
      parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] },
    },
  }];
  const r = await client.chat.completions.create({ model: "tiny", messages, tools, tool_choice: "auto", max_tokens: 6, temperature: 0 });
  assert.ok(["stop", "length", "tool_calls"].includes(r.choices[0].finish_reason));
  const loop = [
    { role: "user", content: "Weather in Paris?" },
    { role: "assistant", content: null, reasoning_content: "I should call the tool.",
      tool_calls: [{ id: "call_1", type: "function", function: { name: "get_weather", arguments: '{"city": "Paris"}' } }] },
    { role: "tool", tool_call_id: "call_1", content: "sunny, 21 C" },
  ];
  const s = await client.chat.completions.create({ model: "tiny", messages: loop, tools, max_tokens: 4, stream: true });
  let n = 0;
  for await (const _ of s) n++;
  assert.ok(n >= 2);
});

await test("completions, plain and streaming", async () => {
  const r = await client.completions.create({ model: "tiny", prompt: "Once upon a time", max_tokens: 5, temperature: 0 });
  assert.equal(r.object, "text_completion");
  assert.equal(typeof r.choices[0].text, "string");
  assert.ok(r.usage.completion_tokens >= 1);
  const s = await client.completions.create({ model: "tiny", prompt: "Once upon a time", max_tokens: 5, temperature: 0, stream: true });
  let text = "";
  let finish = null;
  for await (const c of s) {
    text += c.choices[0]?.text ?? "";
    finish = c.choices[0]?.finish_reason ?? finish;
  }
  assert.equal(text, r.choices[0].text);
  assert.ok(["stop", "length"].includes(finish));
});

await test("a bad request surfaces as APIError 400 with a message", async () => {
  await assert.rejects(
    client.chat.completions.create({ model: "tiny", messages: [{ role: "wizard", content: "x" }], max_tokens: 2 }),
    (e) => e instanceof OpenAI.APIError && e.status === 400 && /role/.test(e.message),
  );
  await assert.rejects(
    client.chat.completions.create({ model: "tiny", messages, max_tokens: -1 }),
    (e) => e instanceof OpenAI.APIError && e.status === 400 && /max_tokens/.test(e.message),
  );
  // Far above --max-tokens-limit is clamped, not refused (agents ask for 32000-128000).
  const r = await client.chat.completions.create({ model: "tiny", messages, max_tokens: 10_000_000 }).withResponse();
  assert.equal(r.response.headers.get("x-max-tokens"), "4000");
  assert.equal(r.response.headers.get("x-max-tokens-capped-by"), "--max-tokens-limit");
});

// A stop string taken from the greedy text itself: the text ends right before its first
// occurrence, streaming and not, and finish_reason is "stop".
function pickStop(text) {
  const chars = Array.from(text);
  for (let i = 2; i < chars.length; i++) if (chars[i].trim() !== "" && chars[i] !== "\uFFFD") return chars[i];
  return null;
}

await test("completions: stop strings end the text before them, streaming or not", async () => {
  const base = { model: "tiny", prompt: "Once upon a time", max_tokens: 24, temperature: 0, ignore_eos: true };
  const full = await client.completions.create(base);
  const text = full.choices[0].text;
  const stop = pickStop(text);
  assert.ok(stop, `no usable character in ${JSON.stringify(text)}`);
  const want = text.slice(0, text.indexOf(stop));
  const cut = await client.completions.create({ ...base, stop: [stop, "never-appears-here"] });
  assert.equal(cut.choices[0].text, want);
  assert.equal(cut.choices[0].finish_reason, "stop");
  const stream = await client.completions.create({ ...base, stop, stream: true });
  let streamed = "";
  let finish = null;
  for await (const c of stream) {
    streamed += c.choices[0]?.text ?? "";
    finish = c.choices[0]?.finish_reason ?? finish;
  }
  assert.equal(streamed, want);
  assert.equal(finish, "stop");
  await assert.rejects(client.completions.create({ ...base, stop: [""] }),
    (e) => e instanceof OpenAI.APIError && e.status === 400 && /stop/.test(e.message));
});

done();
