// A logging pass-through for POST /v1/responses (and anything else) in front of `sluice serve`,
// used by codex.sh to measure what the agent sends: per request one JSON line with the body's
// size, tool count, input items, the time to the first output delta, and the usage of the
// final event. Usage: node responses_proxy.mjs UPSTREAM_URL LOG_FILE [BODY_DIR]; prints the
// bound port on stdout.
import http from 'node:http';
import fs from 'node:fs';

const [upstream, logFile, bodyDir] = process.argv.slice(2);
const target = new URL(upstream);
let n = 0;

function countTools(tools) {
  let count = 0;
  for (const t of tools ?? []) count += t.type === 'namespace' ? (t.tools ?? []).length : 1;
  return count;
}

const server = http.createServer((req, res) => {
  const chunks = [];
  req.on('data', (c) => chunks.push(c));
  req.on('end', () => {
    const body = Buffer.concat(chunks);
    const id = ++n;
    if (bodyDir) fs.writeFileSync(`${bodyDir}/request-${id}.json`, body);
    let parsed = {};
    try { parsed = JSON.parse(body.toString('utf8') || '{}'); } catch { /* not JSON: logged as such */ }
    const record = {
      n: id, method: req.method, path: req.url, bytes: body.length,
      tools: countTools(parsed.tools), tool_types: [...new Set((parsed.tools ?? []).map((t) => t.type))],
      input_items: Array.isArray(parsed.input) ? parsed.input.length : typeof parsed.input,
      stream: parsed.stream === true, max_output_tokens: parsed.max_output_tokens ?? null,
    };
    const started = Date.now();
    const up = http.request({
      host: target.hostname, port: target.port, path: req.url, method: req.method,
      headers: { ...req.headers, host: target.host },
    }, (ur) => {
      res.writeHead(ur.statusCode, ur.headers);
      record.status = ur.statusCode;
      let buf = '';
      ur.on('data', (c) => {
        res.write(c);
        buf += c.toString('utf8');
        if (record.ttft_ms === undefined && /response\.(output_text|reasoning_text|function_call_arguments)\.delta/.test(buf))
          record.ttft_ms = Date.now() - started;
      });
      ur.on('end', () => {
        res.end();
        record.total_ms = Date.now() - started;
        // The last event that carries a response object: completed, incomplete or failed.
        const m = [...buf.matchAll(/^data: (.*)$/gm)].map((x) => { try { return JSON.parse(x[1]); } catch { return null; } });
        const final = m.reverse().find((e) => e && e.response && ['completed', 'incomplete', 'failed'].includes(e.response.status));
        const whole = !record.stream ? (() => { try { return JSON.parse(buf); } catch { return null; } })() : null;
        const r = final?.response ?? whole;
        if (r) {
          record.final = final?.type ?? 'json';
          record.usage = r.usage ?? null;
          record.error = r.error ?? null;
          record.output_types = (r.output ?? []).map((o) => o.type);
        }
        fs.appendFileSync(logFile, JSON.stringify(record) + '\n');
      });
    });
    up.on('error', (e) => {
      record.error = String(e);
      fs.appendFileSync(logFile, JSON.stringify(record) + '\n');
      res.writeHead(502);
      res.end();
    });
    up.end(body);
  });
});
server.listen(0, '127.0.0.1', () => console.log(server.address().port));
