#!/usr/bin/env bash
# Tests `sluice serve` with real clients: the official OpenAI and Anthropic JavaScript SDKs
# (installed here, locally, by npm) plus plain fetch, against a server on the tiny model.
#   tests/clients/run.sh path/to/sluice
# Exit status 0 only when every script passes, the server exits cleanly on SIGTERM, and its
# resident memory did not grow over the run (see the tolerance below).
set -euo pipefail
if [ $# -ne 1 ]; then echo "usage: $0 SLUICE_BINARY" >&2; exit 2; fi
bin=$(realpath "$1")
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../serve_lib.sh"
for tool in node npm; do
  if ! command -v "$tool" >/dev/null; then
    echo "tests/clients: error: '$tool' not found; install Node.js 18+ and npm (Debian: apt-get install nodejs npm)" >&2
    exit 1
  fi
done
node_major=$(node -p 'process.versions.node.split(".")[0]')
if [ "$node_major" -lt 18 ]; then echo "tests/clients: error: Node.js 18+ needed, found $(node --version)" >&2; exit 1; fi

tmp=$(mktemp -d)
pid=""
cleanup() {
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then kill -KILL "$pid" 2>/dev/null || true; fi
  rm -rf "$tmp"
}
trap cleanup EXIT

echo "== npm install (tests/clients)"
(cd "$here" && npm install --no-audit --no-fund --no-package-lock --loglevel=error >/dev/null)

"$bin" make-model --preset tiny -o "$tmp/tiny.gguf" >/dev/null
# --queue 4: 20 concurrent clients must overflow it. --max-body 1MiB: malformed.mjs sends 2 MiB.
# --cached-tokens-granularity 1: responses.mjs checks the reused count to the token.
"$bin" serve -m "$tmp/tiny.gguf" --port 0 --queue 4 --max-body 1MiB --max-tokens-limit 4000 \
  --sse-ping-interval 1 --resident-experts --allow-swap --cached-tokens-granularity 1 2>"$tmp/server.log" &
pid=$!
wait_for_server tests/clients "$pid" "$tmp/server.log" 200
export SLUICE_URL=$url
echo "== server at $url (pid $pid)"

rss_kib() { awk '/^VmRSS:/ {print $2}' "/proc/$pid/status"; }
(cd "$here" && node warmup.mjs)
rss_before=$(rss_kib)

failed=0
for script in openai_chat responses anthropic concurrent disconnect malformed; do
  echo "== $script.mjs"
  (cd "$here" && node "$script.mjs") || failed=1
  echo "   (server RSS now $(rss_kib) KiB)"
done

rss_after=$(rss_kib)
# Tolerance: 8 MiB + 10 %. Nothing is kept per request, but glibc keeps freed memory in its
# per-thread arenas (one per connection thread, up to 8 x cores) and in the heap top instead of
# returning it, so the RSS after a burst of 20 connections wanders by a few MiB without any leak.
# A leak of the size that matters (a kept prompt, a stream buffer, a thread per request: tens
# of KiB x hundreds of requests) exceeds this.
limit=$((rss_before + 8192 + rss_before / 10))
echo "== server RSS: ${rss_before} KiB after warm-up, ${rss_after} KiB after the run (limit ${limit} KiB)"
if [ "$rss_after" -gt "$limit" ]; then echo "tests/clients: FAIL: server memory grew" >&2; failed=1; fi

kill -TERM "$pid"
status=0
wait "$pid" || status=$?
pid=""
if [ "$status" -ne 0 ]; then echo "tests/clients: FAIL: server exited with $status on SIGTERM" >&2; tail -20 "$tmp/server.log" >&2; failed=1; fi

# Continuous batching: --parallel 4 with a queue of 16 (20 concurrent chats all complete; the
# server's RSS after them within 10 % of before), then with --queue 0 (a 5th request: 503).
for setup in "16 burst" "0 full"; do
  set -- $setup
  "$bin" serve -m "$tmp/tiny.gguf" --port 0 --parallel 4 --queue "$1" --max-tokens-limit 4000 \
    --resident-experts --allow-swap 2>"$tmp/server-$2.log" &
  pid=$!
  wait_for_server tests/clients "$pid" "$tmp/server-$2.log" 200
  export SLUICE_URL=$url
  echo "== parallel.mjs $2 (--parallel 4 --queue $1, server at $url)"
  (cd "$here" && node warmup.mjs >/dev/null)
  rss_before=$(rss_kib)
  (cd "$here" && node parallel.mjs "$2") || failed=1
  rss_after=$(rss_kib)
  limit=$((rss_before + rss_before / 10))
  echo "   server RSS: ${rss_before} KiB before, ${rss_after} KiB after (limit ${limit} KiB)"
  if [ "$2" = burst ] && [ "$rss_after" -gt "$limit" ]; then echo "tests/clients: FAIL: server memory grew" >&2; failed=1; fi
  kill -TERM "$pid"
  status=0
  wait "$pid" || status=$?
  pid=""
  if [ "$status" -ne 0 ]; then echo "tests/clients: FAIL: server exited with $status on SIGTERM" >&2; tail -20 "$tmp/server-$2.log" >&2; failed=1; fi
done

if [ "$failed" -ne 0 ]; then echo "tests/clients: FAILED" >&2; tail -5 "$tmp/server.log" >&2; exit 1; fi
echo "tests/clients: all passed"
