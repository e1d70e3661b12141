// The traffic of bench/soak (see there): node bench/soak.mjs SOAK_URL FRESH_URL SECONDS SERVER_PID
// Plain fetch, no SDK: what it checks is the server, not a client library.
import fs from "node:fs";

const [soakUrl, freshUrl, secondsArg, pidArg] = process.argv.slice(2);
const seconds = Number(secondsArg);
const pid = Number(pidArg);
const end = Date.now() + seconds * 1000;

// A seeded generator: the same run asks the same things.
let seed = 12345;
const rand = () => ((seed = (seed * 1103515245 + 12345) >>> 0) / 2 ** 32);
const pick = (xs) => xs[Math.floor(rand() * xs.length)];

const words = "def class return import self value list dict for while if else try except with open read write path"
  .split(" ");
const sentence = (n) => Array.from({ length: n }, () => pick(words)).join(" ");
// A long system prompt shared by every agent conversation (as a coding agent's is).
const system = Array.from({ length: 120 }, (_, i) => `rule ${i}: ${sentence(8)}.`).join("\n");

const latency = {};  // kind -> ms[]
const counts = {};   // kind -> {ok, refused, lost}
const greedy = new Map();  // body (JSON) -> answer text, for the replay
let lostDetail = [];
let peakRss = 0;
const note = (kind, what, ms) => {
  (counts[kind] ??= { ok: 0, refused: 0, lost: 0 })[what]++;
  if (ms !== undefined) (latency[kind] ??= []).push(ms);
};

async function post(url, path, body, raw) {
  const t0 = performance.now();
  const r = await fetch(url + path, { method: "POST", headers: { "content-type": "application/json" },
                                       body: raw ?? JSON.stringify(body) });
  const text = await r.text();
  return { status: r.status, text, ms: performance.now() - t0 };
}

// One agent conversation: turns that extend the prompt; restarted now and then.
async function agent(id) {
  let messages = [];
  while (Date.now() < end) {
    if (messages.length === 0 || messages.length > 24 || rand() < 0.05)
      messages = [{ role: "system", content: system }, { role: "user", content: `task ${id}: ${sentence(20)}` }];
    const body = { model: "m", messages, max_tokens: 16, temperature: 0 };
    try {
      const r = await post(soakUrl, "/v1/chat/completions", body);
      if (r.status === 503) { note("agent turn", "refused"); await sleep(200); continue; }
      if (r.status !== 200) throw new Error(`status ${r.status}: ${r.text.slice(0, 200)}`);
      const answer = JSON.parse(r.text).choices[0].message.content ?? "";
      note("agent turn", "ok", r.ms);
      if (greedy.size < 400) greedy.set(JSON.stringify(body), answer);
      messages = [...messages, { role: "assistant", content: answer }, { role: "user", content: sentence(12) }];
    } catch (e) {
      note("agent turn", "lost");
      lostDetail.push(`agent ${id}: ${e.message}`);
    }
  }
}

// A stream read until its first content, then dropped (an agent's Esc).
async function cutStream() {
  const body = { model: "m", stream: true, max_tokens: 400, temperature: 0.7,
                 messages: [{ role: "system", content: system }, { role: "user", content: sentence(15) }] };
  const ctl = new AbortController();
  const t0 = performance.now();
  try {
    const r = await fetch(soakUrl + "/v1/chat/completions", { method: "POST", signal: ctl.signal,
      headers: { "content-type": "application/json" }, body: JSON.stringify(body) });
    if (r.status === 503) return note("cut stream", "refused");
    if (r.status !== 200) throw new Error(`status ${r.status}`);
    const reader = r.body.getReader();
    const dec = new TextDecoder();
    let got = "";
    while (!got.includes("\"content\"")) {
      const { value, done } = await reader.read();
      if (done) break;
      got += dec.decode(value);
    }
    note("cut stream (first event)", "ok", performance.now() - t0);
    ctl.abort();
  } catch (e) {
    if (e.name === "AbortError") return;
    note("cut stream (first event)", "lost");
    lostDetail.push(`stream: ${e.message}`);
  }
}

async function tokenRoundTrip() {
  const content = sentence(50 + Math.floor(rand() * 400));
  try {
    const t = await post(soakUrl, "/tokenize", { content, parse_special: false });
    if (t.status === 503) return note("tokenize + detokenize", "refused");
    const tokens = JSON.parse(t.text).tokens;
    const d = await post(soakUrl, "/detokenize", { tokens });
    if (d.status === 503) return note("tokenize + detokenize", "refused");
    if (JSON.parse(d.text).content !== content) throw new Error("detokenize(tokenize(x)) != x");
    note("tokenize + detokenize", "ok", t.ms + d.ms);
  } catch (e) {
    note("tokenize + detokenize", "lost");
    lostDetail.push(`tokens: ${e.message}`);
  }
}

async function badRequest() {
  const cases = [["/v1/chat/completions", null, "{not json"], ["/v1/chat/completions", { messages: 3 }],
                 ["/v1/messages", { model: "m", max_tokens: 1 }], ["/v1/chat/completions",
                  { messages: [{ role: "user", content: "x" }], temperature: "hot" }], ["/detokenize", { tokens: [-1] }]];
  const [path, body, raw] = pick(cases);
  try {
    const r = await post(soakUrl, path, body, raw);
    if (r.status < 400 || r.status >= 500) throw new Error(`${path}: status ${r.status} for a bad request`);
    note("bad request", "ok", r.ms);
  } catch (e) {
    note("bad request", "lost");
    lostDetail.push(e.message);
  }
}

async function mixer() {
  while (Date.now() < end) {
    const x = rand();
    if (x < 0.35) await cutStream();
    else if (x < 0.75) await tokenRoundTrip();
    else await badRequest();
    await sleep(50);
  }
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const status = (key) => {
  const m = fs.readFileSync(`/proc/${pid}/status`, "utf8").match(new RegExp(`^${key}:\\s+(\\d+)`, "m"));
  return m ? Number(m[1]) * 1024 : 0;
};
const metric = async (name) => {
  const t = await (await fetch(soakUrl + "/metrics")).text();
  const m = t.match(new RegExp(`^${name} (\\S+)$`, "m"));
  return m ? Number(m[1]) : NaN;
};

const planned = await metric("sluice_memory_planned_bytes");
const sampler = setInterval(() => { try { peakRss = Math.max(peakRss, status("VmRSS")); } catch {} }, 250);
const t0 = Date.now();
await Promise.all([agent(1), agent(2), agent(3), agent(4), agent(5), mixer(), mixer()]);
clearInterval(sampler);
const hwm = status("VmHWM");

// The replay: every greedy answer again, from a server that never saw the traffic.
let mismatches = 0, replayed = 0;
for (const [body, answer] of greedy) {
  const r = await post(freshUrl, "/v1/chat/completions", undefined, body);
  replayed++;
  const again = r.status === 200 ? JSON.parse(r.text).choices[0].message.content ?? "" : `status ${r.status}`;
  if (again !== answer) {
    mismatches++;
    if (mismatches <= 3) console.log(`  answer differs: ${JSON.stringify(answer)} vs fresh ${JSON.stringify(again)}`);
  }
}

const pct = (xs, p) => xs[Math.min(xs.length - 1, Math.floor((p / 100) * xs.length))];
console.log(`soak: ${((Date.now() - t0) / 1000).toFixed(0)} s of traffic`);
console.log("kind                          ok  refused  lost     p50 ms   p90 ms   p99 ms    max ms");
for (const [kind, c] of Object.entries(counts)) {
  const xs = (latency[kind] ?? []).sort((a, b) => a - b);
  const f = (v) => (v === undefined ? "-" : v.toFixed(0)).padStart(9);
  console.log(`${kind.padEnd(28)}${String(c.ok).padStart(4)}${String(c.refused).padStart(9)}${String(c.lost).padStart(6)}` +
              `${f(pct(xs, 50))}${f(pct(xs, 90))}${f(pct(xs, 99))}${f(xs[xs.length - 1])}`);
}
const mib = (b) => (b / 2 ** 20).toFixed(1) + " MiB";
console.log(`server RSS: peak ${mib(hwm)} (sampled ${mib(peakRss)}), plan ${mib(planned)}, ratio ${(hwm / planned).toFixed(3)}`);
console.log(`greedy answers replayed on a fresh server: ${replayed}, differing: ${mismatches}`);
const lost = Object.values(counts).reduce((a, c) => a + c.lost, 0);
for (const l of lostDetail.slice(0, 5)) console.log(`  lost: ${l}`);
const ok = lost === 0 && mismatches === 0 && hwm <= planned;
console.log(ok ? "soak: passed" : "soak: FAILED");
process.exit(ok ? 0 : 1);
