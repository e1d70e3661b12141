// Malformed and out-of-bounds requests with plain fetch: JSON error bodies, status codes, and a
// server that keeps working afterwards. Also /health, /tokenize and /metrics shapes.
import { BASE, assert, test, done, parsePrometheus } from "./lib.mjs";

const post = (path, body, headers = {}) =>
  fetch(`${BASE}${path}`, { method: "POST", headers: { "content-type": "application/json", ...headers }, body });

async function expectError(res, status, re) {
  assert.equal(res.status, status);
  assert.match(res.headers.get("content-type"), /application\/json/);
  const j = await res.json();
  assert.equal(typeof j.error.message, "string");
  assert.match(j.error.message, re);
  return j;
}

await test("malformed JSON: 400 with an OpenAI error body", async () => {
  const j = await expectError(await post("/v1/chat/completions", '{"messages": [}'), 400, /malformed JSON/);
  assert.equal(j.error.type, "invalid_request_error");
});

await test("not an object, missing messages, wrong types: 400", async () => {
  await expectError(await post("/v1/chat/completions", "[1,2]"), 400, /object/);
  await expectError(await post("/v1/chat/completions", "{}"), 400, /messages/);
  await expectError(await post("/v1/chat/completions", '{"messages":[{"role":"user","content":"x"}],"max_tokens":"ten"}'), 400, /max_tokens/);
  await expectError(await post("/v1/chat/completions", '{"messages":[{"role":"user","content":"x"}],"temperature":-1}'), 400, /temp/);
  await expectError(await post("/v1/completions", '{"prompt": 5}'), 400, /prompt/);
});

await test("Anthropic errors use Anthropic's shape", async () => {
  const r = await post("/v1/messages", '{"messages":[{"role":"user","content":"x"}]}');
  assert.equal(r.status, 400);
  const j = await r.json();
  assert.equal(j.type, "error");
  assert.equal(j.error.type, "invalid_request_error");
  assert.match(j.error.message, /max_tokens/);
});

await test("too large a body: 413", async () => {
  const big = JSON.stringify({ messages: [{ role: "user", content: "x".repeat(2 << 20) }] });
  await expectError(await post("/v1/chat/completions", big), 413, /exceeds the limit/);
});

await test("unknown path 404, wrong method 405", async () => {
  await expectError(await fetch(`${BASE}/v1/nothing`), 404, /no endpoint/);
  await expectError(await fetch(`${BASE}/v1/chat/completions`), 405, /POST/);
});

await test("prompt longer than the context: 400", async () => {
  const ids = Array.from({ length: 5000 }, (_, i) => 3 + (i % 200));
  await expectError(await post("/v1/completions", JSON.stringify({ prompt: ids, max_tokens: 1 })), 400, /context/);
});

await test("/health, /tokenize, /metrics", async () => {
  const h = await fetch(`${BASE}/health`);
  assert.equal(h.status, 200);
  assert.deepEqual(await h.json(), { status: "ok" });
  const t = await (await post("/tokenize", JSON.stringify({ content: "hello world" }))).json();
  assert.ok(Array.isArray(t.tokens) && t.tokens.length > 0);
  const d = await (await post("/detokenize", JSON.stringify({ tokens: t.tokens }))).json();
  assert.equal(d.content, "hello world");
  const m = await fetch(`${BASE}/metrics`);
  assert.match(m.headers.get("content-type"), /text\/plain/);
  const { samples, types } = parsePrometheus(await m.text());
  for (const name of ["sluice_prompt_tokens_total", "sluice_tokens_predicted_total", "sluice_expert_cache_hits_total",
                      "sluice_expert_cache_misses_total", "sluice_memory_rss_bytes", "sluice_memory_budget_bytes"])
    assert.ok(types.has(name), `${name} missing`);
  assert.ok(samples.get("sluice_memory_rss_bytes") > 0);
  for (const [name, type] of types) if (type === "counter") assert.ok(name.endsWith("_total"), name);
});

await test("still serving after all of that", async () => {
  const r = await post("/v1/chat/completions", JSON.stringify({ messages: [{ role: "user", content: "ok?" }], max_tokens: 2 }));
  assert.equal(r.status, 200);
  assert.ok((await r.json()).usage.completion_tokens >= 1);
});

done();
