// The official OpenAI SDK's Responses client against sluice: responses.create (plain and
// streaming), the SDK's stream accumulator (responses.stream -> finalResponse), a replayed
// conversation, and a refused request.
import OpenAI from "openai";
import { BASE, assert, test, done } from "./lib.mjs";

const client = new OpenAI({ baseURL: `${BASE}/v1`, apiKey: "unused", maxRetries: 0, timeout: 60_000 });

function checkUsage(u, maxOut) {
  assert.ok(u.input_tokens > 0);
  assert.equal(typeof u.input_tokens_details.cached_tokens, "number");
  assert.ok(u.output_tokens >= 1 && u.output_tokens <= maxOut, `output_tokens ${u.output_tokens}`);
  assert.ok(u.output_tokens_details.reasoning_tokens <= u.output_tokens);
  assert.equal(u.total_tokens, u.input_tokens + u.output_tokens);
}

await test("responses.create, not streaming: output items, output_text, usage", async () => {
  const r = await client.responses.create({
    model: "tiny", instructions: "You are terse.", input: "Say hello.", max_output_tokens: 6,
    reasoning: { effort: "none" }, temperature: 0, store: false,
  });
  assert.equal(r.object, "response");
  assert.ok(r.id.startsWith("resp_"));
  assert.ok(["completed", "incomplete"].includes(r.status), r.status);
  assert.equal(typeof r.output_text, "string");  // the SDK's convenience over the message items
  for (const item of r.output) assert.ok(["message", "function_call"].includes(item.type), item.type);
  checkUsage(r.usage, 6);
});

await test("responses.create, streaming: typed, numbered events ending in the response", async () => {
  const stream = await client.responses.create({
    model: "tiny", input: [{ role: "user", content: [{ type: "input_text", text: "Think, then say hi." }] }],
    max_output_tokens: 6, temperature: 0, stream: true,
  });
  const events = [];
  for await (const e of stream) events.push(e);
  assert.equal(events[0].type, "response.created");
  events.forEach((e, i) => assert.equal(e.sequence_number, i));
  const last = events[events.length - 1];
  assert.ok(["response.completed", "response.incomplete"].includes(last.type), last.type);
  const deltas = events.filter((e) => e.type === "response.reasoning_text.delta").map((e) => e.delta).join("");
  const reasoning = last.response.output.find((o) => o.type === "reasoning");
  assert.ok(reasoning, "thinking is on by default");
  assert.equal(reasoning.content[0].text, deltas);
  checkUsage(last.response.usage, 6);
});

// The accumulator throws on an event it cannot place (a delta before its item or content part).
// It replaces its snapshot only on response.completed; this response ends incomplete (at
// max_output_tokens), so the snapshot is the one it built from the events.
await test("responses.stream accumulates our events (items, parts, deltas)", async () => {
  const stream = client.responses.stream({ model: "tiny", input: "Hello", max_output_tokens: 5, temperature: 0 });
  let text = "";
  stream.on("response.reasoning_text.delta", (e) => { text += e.delta; });
  const final = await stream.finalResponse();
  assert.ok(final.output.length >= 1);
  const reasoning = final.output.filter((o) => o.type === "reasoning").flatMap((o) => o.content.map((c) => c.text));
  assert.equal(reasoning.join(""), text);
  assert.ok(text.length > 0);
});

await test("a replayed conversation: the second request reports cached tokens", async () => {
  const input = [{ role: "user", content: "Count to three." }];
  const first = await client.responses.create({ model: "tiny", input, reasoning: { effort: "none" }, max_output_tokens: 1, temperature: 0 });
  const second = await client.responses.create({
    model: "tiny", input: [...input, ...first.output, { role: "user", content: "Go on." }],
    reasoning: { effort: "none" }, max_output_tokens: 2, temperature: 0,
  });
  assert.equal(second.usage.input_tokens_details.cached_tokens, first.usage.input_tokens);
});

await test("a bad request is a 400 the SDK reports, naming the field", async () => {
  await assert.rejects(
    client.responses.create({ model: "tiny", input: [{ type: "function_call", name: "f" }] }),
    (e) => e instanceof OpenAI.BadRequestError && e.status === 400 && /input\[0\]: 'call_id'/.test(e.message),
  );
});

done();
