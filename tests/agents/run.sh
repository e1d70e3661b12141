#!/usr/bin/env bash
# Runs real coding agents, unmodified, against `sluice serve` on a tiny random model with
# DeepSeek's vocabulary: each tests/agents/<agent>.sh present (claude, codex, opencode) runs one
# non-interactive turn and a continued turn, with a scratch HOME.
#   tests/agents/run.sh path/to/sluice
# The random model never ends a turn by itself. The server is started with options a user has:
# a server-wide --stop string that random text soon contains ("e"; Claude Code retries a turn
# that stops at max_tokens, so a turn must end on a stop sequence), --thinking off so the text is
# content (where stop strings are matched), and a --max-tokens-limit that clamps what the agents
# ask for (32000-128000). Nothing here or in the server knows which client it is.
# Environment: SLUICE_AGENT_PKGS (npm installs kept between runs, default
# ~/.cache/sluice-agents), SLUICE_AGENTS (space-separated subset, default all present).
set -euo pipefail
if [ $# -ne 1 ]; then echo "usage: $0 SLUICE_BINARY" >&2; exit 2; fi
bin=$(realpath "$1")
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
. "$here/../serve_lib.sh"
for tool in node npm curl; do
  command -v "$tool" >/dev/null || { echo "tests/agents: error: '$tool' not found" >&2; exit 1; }
done
export AGENT_PKGS=${SLUICE_AGENT_PKGS:-$HOME/.cache/sluice-agents}
mkdir -p "$AGENT_PKGS"

tmp=$(mktemp -d)
pid=""
cleanup() {
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then kill -KILL "$pid" 2>/dev/null || true; fi
  rm -rf "$tmp"
}
trap cleanup EXIT

start=$(date +%s)
"$bin" make-model --config "$root/configs/tiny-agents.json" --vocab "$root/data/deepseek-v3-vocab.gguf" \
  -o "$tmp/model.gguf" >/dev/null
log="$tmp/server.log"
"$bin" serve -m "$tmp/model.gguf" --port 0 --resident-experts --allow-swap -c 65536 --max-tokens-limit 64 \
  --thinking off --stop e 2>"$log" &
pid=$!
wait_for_server tests/agents "$pid" "$log" 400
echo "== server at $url (pid $pid)"

failed=0
ran=0
for agent in ${SLUICE_AGENTS:-claude codex opencode}; do
  script="$here/$agent.sh"
  [ -f "$script" ] || { echo "== $agent: no tests/agents/$agent.sh, skipped"; continue; }
  ran=$((ran + 1))
  home="$tmp/home-$agent"
  mkdir -p "$home"
  from=$(wc -l <"$log")
  t0=$(date +%s)
  echo "== $agent"
  if SLUICE_URL=$url AGENT_HOME=$home SLUICE_SERVER_LOG=$log bash "$script"; then
    echo "   $agent: passed in $(( $(date +%s) - t0 )) s"
  else
    echo "tests/agents: FAIL: $agent" >&2
    failed=1
  fi
  # What the agent sent: one line per request (endpoint, body bytes, tools, prompt and cached
  # tokens, max_tokens, time to first token, finish), then its largest request.
  tail -n +"$((from + 1))" "$log" | grep 'sluice serve: request ' | sed 's/^/   /' || true
  tail -n +"$((from + 1))" "$log" | grep 'sluice serve: request ' |
    awk '{ for (i = 1; i <= NF; i++) if ($i ~ /^prompt=/) { split($i, p, "="); if (p[2] + 0 > max) { max = p[2] + 0; line = $0 } } }
         END { if (line != "") print "   largest request: " line }' | sed 's/sluice serve: request //'
done

kill -TERM "$pid"
status=0
wait "$pid" || status=$?
pid=""
[ "$status" -eq 0 ] || { echo "tests/agents: FAIL: server exited with $status on SIGTERM" >&2; failed=1; }
echo "== agents stage: $ran agent(s) in $(( $(date +%s) - start )) s"
if [ "$failed" -ne 0 ]; then echo "tests/agents: FAILED" >&2; tail -20 "$log" >&2; exit 1; fi
echo "tests/agents: all passed"
