// Continuous batching (serve --parallel 4) with the OpenAI SDK.
//   node parallel.mjs burst   against --parallel 4 --queue 16: 20 concurrent streaming chats all
//                             complete with 200, several ran at once, and each one's text is the
//                             text it gets run alone (seeded sampling: a different logit bit
//                             would change a draw).
//   node parallel.mjs full    against --parallel 4 --queue 0: with 4 streams running, a 5th
//                             request gets a 503 that arrives at once; then the server answers.
import OpenAI from "openai";
import { BASE, assert, test, done, metrics, sleep } from "./lib.mjs";

const mode = process.argv[2];
const client = new OpenAI({ baseURL: `${BASE}/v1`, apiKey: "unused", maxRetries: 0, timeout: 120_000 });

const chat = (i, extra = {}) => ({
  model: "tiny", max_tokens: 24, temperature: 0.8, seed: 100 + i, ignore_eos: true,
  messages: [{ role: "user", content: `conversation ${i}: ${"word ".repeat(i % 7)}` }], ...extra,
});

async function streamText(params, signal) {
  const stream = await client.chat.completions.create({ ...params, stream: true }, { signal });
  let text = "", finish = null;
  for await (const c of stream) {
    text += c.choices[0]?.delta?.content ?? "";
    finish = c.choices[0]?.finish_reason ?? finish;
  }
  return { text, finish };
}

// Samples /metrics' running-generations gauge until stopped; returns the largest value seen.
function watchProcessing() {
  let most = 0, stop = false;
  const loop = (async () => {
    while (!stop) {
      most = Math.max(most, (await metrics()).get("sluice_requests_processing"));
      await sleep(5);
    }
  })();
  return async () => { stop = true; await loop; return most; };
}

if (mode === "burst") {
  const N = 20;
  const alone = [];
  await test(`${N} chats one at a time`, async () => {
    for (let i = 0; i < N; i++) alone.push(await streamText(chat(i)));
    for (const r of alone) assert.equal(r.finish, "length");
  });
  await test(`${N} concurrent streaming chats: all 200, each as alone`, async () => {
    assert.equal((await metrics()).get("sluice_slots"), 4);
    const watch = watchProcessing();
    const results = await Promise.all(Array.from({ length: N }, (_, i) => streamText(chat(i))));
    const most = await watch();
    console.log(`    at most ${most} generations ran at once`);
    assert.ok(most >= 2 && most <= 4, `${most} generations ran at once (--parallel 4)`);
    for (let i = 0; i < N; i++) {
      assert.equal(results[i].finish, "length", `chat ${i}`);
      assert.equal(results[i].text, alone[i].text, `chat ${i} differs from its run alone`);
    }
    const m = await metrics();
    assert.equal(m.get('sluice_requests_rejected_total{reason="queue_full"}'), 0);
    assert.equal(m.get("sluice_requests_waiting"), 0);
    assert.equal(m.get("sluice_requests_processing"), 0);
  });
} else if (mode === "full") {
  await test("with 4 streams running and --queue 0, a 5th request gets a 503 at once", async () => {
    const ctl = new AbortController();
    const long = Array.from({ length: 4 }, (_, i) =>
      streamText(chat(i, { max_tokens: 3000 }), ctl.signal).catch((e) => (ctl.signal.aborted ? "aborted" : Promise.reject(e))));
    let running = 0;
    for (let t = 0; t < 2000 && running < 4; t++) {
      running = (await metrics()).get("sluice_requests_processing");
      if (running < 4) await sleep(5);
    }
    assert.equal(running, 4, "the 4 streams did not all start");
    const t0 = Date.now();
    const err = await client.chat.completions.create(chat(9)).then(() => null, (e) => e);
    const ms = Date.now() - t0;
    assert.ok(err instanceof OpenAI.APIError && err.status === 503, `5th request: ${err}`);
    assert.ok(/busy|queue/.test(err.message), err.message);
    assert.ok(ms < 5000, `the 503 took ${ms} ms`);
    ctl.abort();
    await Promise.all(long);
  });
  await test("the server answers after the streams were dropped", async () => {
    let r = null;
    for (let t = 0; t < 200 && !r; t++) {
      r = await client.chat.completions.create(chat(5, { max_tokens: 3 })).catch((e) => {
        if (e instanceof OpenAI.APIError && e.status === 503) return null;  // the cancelled streams are still ending
        throw e;
      });
      if (!r) await sleep(20);
    }
    assert.ok(r && r.usage.completion_tokens === 3);
  });
} else {
  console.error("usage: node parallel.mjs burst|full");
  process.exit(2);
}

done();
