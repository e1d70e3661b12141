// Shared helpers for the client scripts: the server's address (SLUICE_URL, set by run.sh), a
// tiny test runner, and a Prometheus text parser.
import assert from "node:assert/strict";

export const BASE = process.env.SLUICE_URL;
if (!BASE) {
  console.error("SLUICE_URL is not set (run the scripts through tests/clients/run.sh)");
  process.exit(2);
}
export { assert };

let failures = 0;
export async function test(name, fn) {
  const t0 = Date.now();
  try {
    await fn();
    console.log(`  ok   ${name} (${Date.now() - t0} ms)`);
  } catch (e) {
    failures++;
    console.log(`  FAIL ${name}: ${e && e.stack ? e.stack : e}`);
  }
}
export function done() {
  if (failures) {
    console.log(`${failures} test(s) failed`);
    process.exit(1);
  }
}

// Parses the Prometheus text exposition format; throws on a malformed line. Returns a Map from
// 'name{labels}' (labels as sent) to the value, plus the declared types.
export function parsePrometheus(text) {
  const samples = new Map();
  const types = new Map();
  const nameRe = /^[a-zA-Z_:][a-zA-Z0-9_:]*$/;
  for (const line of text.split("\n")) {
    if (line === "") continue;
    if (line.startsWith("#")) {
      const m = /^# (HELP|TYPE) (\S+) ?(.*)$/.exec(line);
      if (!m) continue;  // other comments are allowed
      if (!nameRe.test(m[2])) throw new Error(`bad metric name in: ${line}`);
      if (m[1] === "TYPE") {
        if (!["counter", "gauge", "histogram", "summary", "untyped"].includes(m[3])) throw new Error(`bad type: ${line}`);
        types.set(m[2], m[3]);
      }
      continue;
    }
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(?:[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\.)*",?)*\})? (\S+)( -?\d+)?$/.exec(line);
    if (!m) throw new Error(`malformed sample line: ${JSON.stringify(line)}`);
    const v = Number(m[3] === "+Inf" ? Infinity : m[3] === "-Inf" ? -Infinity : m[3]);
    if (Number.isNaN(v) && m[3] !== "NaN") throw new Error(`bad value in: ${line}`);
    // A histogram's samples are its name + _bucket (with le), _sum and _count.
    const fam = /^(.*)_(bucket|sum|count)$/.exec(m[1]);
    const family = fam && types.get(fam[1]) === "histogram" ? fam[1] : m[1];
    if (!types.has(family)) throw new Error(`sample before its TYPE line: ${line}`);
    samples.set(m[1] + (m[2] || ""), v);
  }
  return { samples, types };
}

export async function metrics() {
  // GET is idempotent: one retry when the pooled keep-alive connection it reused was closed by
  // the server meanwhile (it evicts idle connections when it needs their slots), as HTTP clients
  // do for idempotent requests; undici's fetch does not retry by itself.
  let r;
  try {
    r = await fetch(`${BASE}/metrics`);
  } catch (e) {
    if (e?.cause?.code !== "UND_ERR_SOCKET") throw e;
    r = await fetch(`${BASE}/metrics`);
  }
  assert.equal(r.status, 200);
  return parsePrometheus(await r.text()).samples;
}

export const sleep = (ms) => new Promise((res) => setTimeout(res, ms));
