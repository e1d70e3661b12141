// 20 streaming clients at once against one worker and a bounded queue: every client either
// completes its stream or gets a clean 503 with Retry-After; then the server still answers.
import OpenAI from "openai";
import { BASE, assert, test, done, metrics } from "./lib.mjs";

const N = 20;
const client = new OpenAI({ baseURL: `${BASE}/v1`, apiKey: "unused", maxRetries: 0, timeout: 120_000 });

await test(`${N} concurrent streaming clients: complete or clean 503`, async () => {
  const before = await metrics();
  const one = async (i) => {
    try {
      const stream = await client.chat.completions.create({
        model: "tiny", max_tokens: 24, temperature: 0.8, seed: i, stream: true,
        messages: [{ role: "user", content: `client ${i}` }],
      });
      let finish = null;
      for await (const c of stream) finish = c.choices[0]?.finish_reason ?? finish;
      assert.ok(["stop", "length"].includes(finish), `client ${i}: finish ${finish}`);
      return "ok";
    } catch (e) {
      if (e instanceof OpenAI.APIError && e.status === 503) {
        assert.ok(Number(e.headers?.get?.("retry-after") ?? e.headers?.["retry-after"]) >= 1, "503 without Retry-After");
        assert.ok(/busy|queue/.test(e.message), e.message);
        return "503";
      }
      throw e;
    }
  };
  const results = await Promise.all(Array.from({ length: N }, (_, i) => one(i)));
  const ok = results.filter((r) => r === "ok").length;
  const busy = results.filter((r) => r === "503").length;
  console.log(`    ${ok} completed, ${busy} got 503`);
  assert.equal(ok + busy, N);
  assert.ok(ok >= 1);
  const after = await metrics();
  const rejected = after.get('sluice_requests_rejected_total{reason="queue_full"}') -
    before.get('sluice_requests_rejected_total{reason="queue_full"}');
  assert.equal(rejected, busy, "every 503 is counted as queue_full");
  assert.equal(after.get("sluice_requests_waiting"), 0);
});

await test("the server answers after the burst", async () => {
  const r = await client.chat.completions.create({ model: "tiny", max_tokens: 3, messages: [{ role: "user", content: "still there?" }] });
  assert.ok(r.usage.completion_tokens >= 1);
});

done();
