// A client that goes away mid-stream cancels its generation at the next token: the cancel is
// counted in /metrics long before max_tokens could have been generated, and the next request is
// served at once.
import OpenAI from "openai";
import { BASE, assert, test, done, metrics, sleep } from "./lib.mjs";

const client = new OpenAI({ baseURL: `${BASE}/v1`, apiKey: "unused", maxRetries: 0, timeout: 60_000 });
const key = 'sluice_requests_cancelled_total{reason="disconnect"}';

async function waitFor(pred, ms) {
  const t0 = Date.now();
  while (Date.now() - t0 < ms) {
    if (await pred()) return true;
    await sleep(50);
  }
  return false;
}

await test("abort mid-stream cancels the generation", async () => {
  const before = (await metrics()).get(key);
  const generatedBefore = (await metrics()).get("sluice_tokens_predicted_total");
  const ac = new AbortController();
  const stream = await client.chat.completions.create(
    { model: "tiny", max_tokens: 4000, temperature: 1, seed: 7, stream: true, ignore_eos: true, messages: [{ role: "user", content: "go on forever" }] },
    { signal: ac.signal },
  );
  let n = 0;
  try {
    for await (const _ of stream) if (++n === 5) ac.abort();
  } catch (e) {
    assert.ok(e.name === "AbortError" || e instanceof OpenAI.APIUserAbortError, String(e));
  }
  assert.ok(await waitFor(async () => (await metrics()).get(key) === before + 1, 5000), "cancel not counted");
  const m = await metrics();
  assert.equal(m.get("sluice_requests_processing"), 0);
  const generated = m.get("sluice_tokens_predicted_total") - generatedBefore;
  assert.ok(generated < 4000, `generated ${generated} tokens: not cancelled`);
});

await test("a non-streaming client that leaves is cancelled too", async () => {
  const before = (await metrics()).get(key);
  const ac = new AbortController();
  const p = client.chat.completions.create(
    { model: "tiny", max_tokens: 4000, temperature: 1, seed: 8, ignore_eos: true, messages: [{ role: "user", content: "long" }] },
    { signal: ac.signal },
  );
  await sleep(300);
  ac.abort();
  await assert.rejects(p);
  assert.ok(await waitFor(async () => (await metrics()).get(key) === before + 1, 5000), "cancel not counted");
});

await test("the next request is served", async () => {
  const r = await client.chat.completions.create({ model: "tiny", max_tokens: 3, messages: [{ role: "user", content: "hi" }] });
  assert.ok(r.usage.completion_tokens >= 1);
});

done();
