#!/usr/bin/env bash
# Codex CLI (the real agent, unmodified) against `sluice serve` over POST /v1/responses: one
# non-interactive turn, then a second turn that resumes the conversation and must report cached
# prompt tokens. Called by tests/agents/run.sh with:
#   SLUICE_URL         the server, e.g. http://127.0.0.1:PORT (no /v1)
#   AGENT_HOME         an empty scratch directory (HOME and CODEX_HOME live there)
#   AGENT_PKGS         a persistent directory for npm installs (codex goes to $AGENT_PKGS/codex)
#   SLUICE_SERVER_LOG  the server's stderr log
# Requests go through a logging pass-through (responses_proxy.mjs) that records each one's size,
# tool count, time to first token and usage; the largest request and the times are printed.
# Exit status 0 when both turns complete and the second reports cached tokens.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
CODEX_VERSION=0.171.0
: "${SLUICE_URL:?}" "${AGENT_HOME:?}" "${AGENT_PKGS:?}" "${SLUICE_SERVER_LOG:?}"
fail() { echo "codex: FAIL: $*" >&2; exit 1; }
for tool in node npm curl; do command -v "$tool" >/dev/null || fail "'$tool' not found"; done
echo "codex: node $(node --version) (the npm launcher needs node >= 16; the agent itself is a native binary)"

# Install (once per AGENT_PKGS), pinned.
codex="$AGENT_PKGS/codex/node_modules/.bin/codex"
if [ ! -x "$codex" ] || [ "$("$codex" --version 2>/dev/null)" != "codex-cli $CODEX_VERSION" ]; then
  echo "codex: npm install @openai/codex@$CODEX_VERSION"
  npm install --prefix "$AGENT_PKGS/codex" --no-audit --no-fund --loglevel=error "@openai/codex@$CODEX_VERSION" >/dev/null
fi
[ "$("$codex" --version)" = "codex-cli $CODEX_VERSION" ] || fail "installed codex is $("$codex" --version)"

# The model id and context size the server reports.
models=$(curl -sf "$SLUICE_URL/v1/models") || fail "GET $SLUICE_URL/v1/models failed"
model=$(node -e 'const j = JSON.parse(process.argv[1]); console.log(j.data[0].id)' "$models")
n_ctx=$(node -e 'const j = JSON.parse(process.argv[1]); console.log(j.data[0].meta.n_ctx ?? 0)' "$models")

export HOME="$AGENT_HOME" CODEX_HOME="$AGENT_HOME/.codex"
mkdir -p "$CODEX_HOME" "$AGENT_HOME/work"
requests="$AGENT_HOME/requests.jsonl"
: >"$requests"
proxy_pid=""
cleanup() { if [ -n "$proxy_pid" ]; then kill "$proxy_pid" 2>/dev/null || true; fi; }
trap cleanup EXIT
node "$here/responses_proxy.mjs" "$SLUICE_URL" "$requests" >"$AGENT_HOME/proxy.port" &
proxy_pid=$!
for _ in $(seq 1 100); do [ -s "$AGENT_HOME/proxy.port" ] && break; sleep 0.05; done
port=$(cat "$AGENT_HOME/proxy.port")
[ -n "$port" ] || fail "the logging proxy did not start"

# A custom provider on the Responses wire API; no auth (a dummy key in the env var Codex reads),
# no analytics or update checks, no approval prompts. A read-only sandbox: the random model's
# output is never a valid command, but nothing it asks for may touch the machine. Retries off:
# a failed request must fail the test, not be resent (a resend would prefill again). The idle
# timeout covers a long prefill on CPU (the server sends keep-alive comments meanwhile).
cat >"$CODEX_HOME/config.toml" <<EOF
model = "$model"
model_provider = "sluice"
model_context_window = $n_ctx
approval_policy = "never"
sandbox_mode = "read-only"
check_for_update_on_startup = false

[model_providers.sluice]
name = "sluice"
base_url = "http://127.0.0.1:$port/v1"
wire_api = "responses"
env_key = "SLUICE_AGENT_KEY"
request_max_retries = 0
stream_max_retries = 0
stream_idle_timeout_ms = 1800000

[analytics]
enabled = false
EOF
export SLUICE_AGENT_KEY=sluice-test

# One codex exec; its JSONL events go to $AGENT_HOME/turnN.jsonl. Checks exit 0 and a completed turn.
turn() {
  local n=$1; shift
  local out="$AGENT_HOME/turn$n.jsonl" err="$AGENT_HOME/turn$n.err" status=0
  (cd "$AGENT_HOME/work" && timeout 1200 "$codex" exec --json --skip-git-repo-check "$@" </dev/null >"$out" 2>"$err") || status=$?
  if [ "$status" -ne 0 ] || ! grep -q '"type":"turn.completed"' "$out"; then
    echo "--- codex turn $n (exit $status) stdout:" >&2; cat "$out" >&2
    echo "--- stderr:" >&2; tail -20 "$err" >&2
    echo "--- server log:" >&2; tail -20 "$SLUICE_SERVER_LOG" >&2
    fail "turn $n did not complete (exit $status)"
  fi
  grep -q '"type":"turn.failed"' "$out" && fail "turn $n reported turn.failed"
  grep '"type":"turn.completed"' "$out" | tail -1
}

echo "codex: turn 1"
usage1=$(turn 1 "Say hello, then stop.")
echo "codex: turn 1 completed: $usage1"
echo "codex: turn 2 (resume --last)"
before=$(wc -l <"$requests")
usage2=$(turn 2 resume --last "Now say goodbye.")
echo "codex: turn 2 completed: $usage2"

# The agent's own report (turn.completed carries the thread's totals so far) and the server's
# usage for the second turn's requests, as the proxy saw them.
reported=$(node -e 'const e = JSON.parse(process.argv[1]); console.log(e.usage?.cached_input_tokens ?? 0)' "$usage2")
cached=$(tail -n +"$((before + 1))" "$requests" | node -e '
  const rows = require("node:fs").readFileSync(0, "utf8").trim().split("\n").filter(Boolean).map((l) => JSON.parse(l));
  console.log(Math.max(0, ...rows.map((r) => r.usage?.input_tokens_details?.cached_tokens ?? 0)))')

# What was sent: every request, then the largest.
node - "$requests" <<'EOF'
const fs = require('node:fs');
const rows = fs.readFileSync(process.argv[2], 'utf8').trim().split('\n').filter(Boolean).map((l) => JSON.parse(l));
for (const r of rows)
  console.log(`codex: request ${r.n}: ${r.method} ${r.path} ${r.bytes} bytes, ${r.tools} tools (${r.tool_types.join(', ')}), ` +
              `${r.input_items} input items, status ${r.status}, ${r.final ?? '-'}, prompt ${r.usage?.input_tokens ?? '?'} tokens ` +
              `(${r.usage?.input_tokens_details?.cached_tokens ?? '?'} cached), first token after ${r.ttft_ms ?? '?'} ms, ` +
              `done after ${r.total_ms ?? '?'} ms`);
const big = rows.reduce((a, b) => (b.bytes > (a?.bytes ?? -1) ? b : a), null);
if (big)
  console.log(`codex: largest request: ${big.bytes} bytes, ${big.tools} tools, ${big.usage?.input_tokens ?? '?'} prompt tokens, ` +
              `first token after ${big.ttft_ms ?? '?'} ms`);
EOF
grep '/v1/responses' "$SLUICE_SERVER_LOG" | sed 's/^/codex: server log: /' || true

[ "$cached" -gt 0 ] || fail "the server reported no cached prompt tokens for turn 2"
[ "$reported" -gt 0 ] || fail "codex reported no cached prompt tokens after turn 2 ($usage2)"
echo "codex: PASS (turn 2: $cached cached prompt tokens; codex reports $reported)"
