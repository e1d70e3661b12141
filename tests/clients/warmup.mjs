// One request of each kind, so that the RSS run.sh compares is measured after every code path
// and allocator arena has been touched once.
import { BASE, assert } from "./lib.mjs";

const post = (path, body) => fetch(`${BASE}${path}`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body) });
for (const stream of [false, true]) {
  const a = await post("/v1/chat/completions", { messages: [{ role: "user", content: "warm" }], max_tokens: 16, stream });
  assert.equal(a.status, 200);
  await a.text();
  const b = await post("/v1/messages", { messages: [{ role: "user", content: "warm" }], max_tokens: 16, stream });
  assert.equal(b.status, 200);
  await b.text();
}
// The longest prompt of the suite (tools block), so the kept sequence has reached the size the
// later scripts give it: its growth is the engine's context state, not a leak.
const tools = [{ type: "function", function: { name: "get_weather", description: "Weather for a city",
  parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] } } }];
const t = await post("/v1/chat/completions", { messages: [{ role: "user", content: "Weather in Paris?" }], tools, max_tokens: 8 });
assert.equal(t.status, 200);
await t.text();
// A burst like concurrent.mjs's, so per-thread allocator arenas exist before the first reading.
await Promise.all(Array.from({ length: 20 }, (_, i) =>
  post("/v1/chat/completions", { messages: [{ role: "user", content: `w${i}` }], max_tokens: 4, stream: true }).then((r) => r.text())));
console.log("  ok   warm-up");
