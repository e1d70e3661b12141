// The official Anthropic SDK against /v1/messages: plain, streaming (event order), thinking,
// tools with a tool_use / tool_result loop, count_tokens, errors.
import Anthropic from "@anthropic-ai/sdk";
import { BASE, assert, test, done } from "./lib.mjs";

const client = new Anthropic({ baseURL: BASE, apiKey: "unused", maxRetries: 0, timeout: 60_000 });
const tools = [{
  name: "get_weather", description: "Weather for a city",
  input_schema: { type: "object", properties: { city: { type: "string" } }, required: ["city"] },
}];

await test("messages.create, not streaming", async () => {
  const m = await client.messages.create({
    model: "tiny", max_tokens: 8, system: "Be terse.", messages: [{ role: "user", content: "Hello" }],
  });
  assert.equal(m.type, "message");
  assert.equal(m.role, "assistant");
  assert.ok(m.id.startsWith("msg_"));
  assert.ok(["end_turn", "max_tokens"].includes(m.stop_reason));
  assert.ok(m.usage.input_tokens > 0 && m.usage.output_tokens >= 1);
  for (const b of m.content) assert.ok(["text", "thinking", "tool_use"].includes(b.type));
  assert.equal(m.timings, undefined, "no llama.cpp timings on the Anthropic path");
});

await test("streaming: the event sequence", async () => {
  const stream = client.messages.stream({
    model: "tiny", max_tokens: 8, thinking: { type: "enabled", budget_tokens: 1024 },
    messages: [{ role: "user", content: [{ type: "text", text: "Think, then answer." }] }],
  });
  const types = [];
  for await (const ev of stream) types.push(ev.type);
  const final = await stream.finalMessage();
  assert.equal(types[0], "message_start");
  assert.equal(types[types.length - 1], "message_stop");
  assert.equal(types[types.length - 2], "message_delta");
  let open = 0;
  for (const t of types) {
    if (t === "content_block_start") { assert.equal(open, 0); open = 1; }
    if (t === "content_block_delta") assert.equal(open, 1);
    if (t === "content_block_stop") { assert.equal(open, 1); open = 0; }
  }
  assert.equal(open, 0);
  assert.ok(final.usage.output_tokens >= 1);
  // Thinking on: the first block is a thinking block (the tiny model never closes </think> in 8 tokens
  // unless it samples it; accept text too).
  if (final.content.length) assert.ok(["thinking", "text"].includes(final.content[0].type));
});

await test("tools and a tool_use / tool_result loop are accepted", async () => {
  const m = await client.messages.create({
    model: "tiny", max_tokens: 6, tools, tool_choice: { type: "auto" },
    messages: [
      { role: "user", content: "Weather in Paris?" },
      { role: "assistant", content: [
        { type: "text", text: "Let me check." },
        { type: "tool_use", id: "toolu_1", name: "get_weather", input: { city: "Paris" } },
      ] },
      { role: "user", content: [
        { type: "tool_result", tool_use_id: "toolu_1", content: "sunny, 21 C" },
        { type: "text", text: "And tomorrow?" },
      ] },
    ],
  });
  assert.ok(["end_turn", "max_tokens", "tool_use"].includes(m.stop_reason));
});

await test("count_tokens matches the prompt the server evaluates", async () => {
  const body = { model: "tiny", messages: [{ role: "user", content: "Count me" }] };
  const c = await client.messages.countTokens(body);
  const m = await client.messages.create({ ...body, max_tokens: 1 });
  // Anthropic's input_tokens leaves out the tokens read from the cache.
  assert.equal(c.input_tokens, m.usage.input_tokens + m.usage.cache_read_input_tokens);
});

await test("a bad request is an Anthropic error (400)", async () => {
  await assert.rejects(
    client.messages.create({ model: "tiny", max_tokens: 4, messages: [{ role: "wizard", content: "x" }] }),
    (e) => e instanceof Anthropic.APIError && e.status === 400 && e.error?.type === "error" &&
      e.error?.error?.type === "invalid_request_error",
  );
});

await test("stop_sequences: stop_reason stop_sequence names the one that matched", async () => {
  const base = { model: "tiny", max_tokens: 24, temperature: 0, messages: [{ role: "user", content: "Tell a story." }] };
  const full = await client.messages.create(base);
  const text = full.content.filter((b) => b.type === "text").map((b) => b.text).join("");
  const chars = Array.from(text);
  const stop = chars.slice(2).find((c) => c.trim() !== "" && c !== "\uFFFD");
  assert.ok(stop, `no usable character in ${JSON.stringify(text)}`);
  const r = await client.messages.create({ ...base, stop_sequences: [stop] });
  const got = r.content.filter((b) => b.type === "text").map((b) => b.text).join("");
  assert.equal(got, text.slice(0, text.indexOf(stop)));
  assert.equal(r.stop_reason, "stop_sequence");
  assert.equal(r.stop_sequence, stop);
});

done();
