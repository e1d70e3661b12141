#!/usr/bin/env bash
# The chat page of `sluice serve` in a real browser: Debian's chromium, headless, driven through
# the DevTools protocol by puppeteer-core (installed here by npm; it downloads no browser).
#   tests/webui/run.sh path/to/sluice [SCREENSHOT_DIR]
# Two servers: the built-in model (models/deepseek41-python-26m.gguf, so the screenshots show
# text a model learned) without a key, and the tiny model with one (the key prompt). Screenshots
# go to SCREENSHOT_DIR (default build/webui-screenshots). Exit 0 only when webui.mjs passes and
# both servers exit cleanly on SIGTERM.
set -euo pipefail
if [ $# -lt 1 ] || [ $# -gt 2 ]; then echo "usage: $0 SLUICE_BINARY [SCREENSHOT_DIR]" >&2; exit 2; fi
bin=$(realpath "$1")
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
shots=$(realpath -m "${2:-$root/build/webui-screenshots}")
. "$here/../serve_lib.sh"
chromium=${CHROMIUM:-$(command -v chromium || true)}
if [ -z "$chromium" ]; then
  echo "tests/webui: error: chromium not found; scripts/setup --tests installs Debian's (apt-get install chromium)" >&2
  exit 1
fi
for tool in node npm curl; do
  command -v "$tool" >/dev/null || { echo "tests/webui: error: '$tool' not found" >&2; exit 1; }
done

tmp=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT

echo "== npm install (tests/webui)"
(cd "$here" && npm install --no-audit --no-fund --no-package-lock --loglevel=error >/dev/null)

# --cached-tokens-granularity 1: the test reads the second turn's reused tokens to the token.
"$bin" serve -m "$root/models/deepseek41-python-26m.gguf" --port 0 --max-tokens-limit 4000 --allow-swap \
  --cached-tokens-granularity 1 2>"$tmp/server.log" &
pids+=($!)
wait_for_server tests/webui "${pids[0]}" "$tmp/server.log" 200
export SLUICE_URL=$url

"$bin" make-model --preset tiny -o "$tmp/tiny.gguf" >/dev/null
export SLUICE_KEY="webui-key-$RANDOM$RANDOM"
SLUICE_API_KEY=$SLUICE_KEY "$bin" serve -m "$tmp/tiny.gguf" --port 0 --allow-swap 2>"$tmp/keyed.log" &
pids+=($!)
wait_for_server tests/webui "${pids[1]}" "$tmp/keyed.log" 200
export SLUICE_KEYED_URL=$url
echo "== servers at $SLUICE_URL and $SLUICE_KEYED_URL (with a key); chromium: $chromium"

mkdir -p "$shots"
failed=0
(cd "$here" && CHROMIUM=$chromium SCREENSHOT_DIR=$shots node webui.mjs) || failed=1
for i in 0 1; do
  kill -TERM "${pids[$i]}"
  status=0
  wait "${pids[$i]}" || status=$?
  if [ "$status" -ne 0 ]; then echo "tests/webui: FAIL: server $i exited with $status on SIGTERM" >&2; failed=1; fi
done
pids=()
if [ "$failed" -ne 0 ]; then
  echo "tests/webui: FAILED (screenshots in $shots; the server's log follows)" >&2
  tail -20 "$tmp/server.log" >&2
  exit 1
fi
echo "tests/webui: all passed (screenshots in $shots)"
