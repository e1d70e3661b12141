#!/usr/bin/env bash
# opencode, unmodified, against sluice's OpenAI chat completions API (an OpenAI-compatible
# provider in its config): one `opencode run` turn, then a turn continuing the session
# (--continue) that must show cached prompt tokens. Pinned: opencode-ai 1.18.33 (a bundled
# native binary; node only for npm). Its @ai-sdk/openai-compatible provider is built in: the run
# downloads nothing (checked: the scratch cache holds no packages afterwards).
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"
npm_install opencode opencode-ai@1.18.33
opencode="$AGENT_PKGS/opencode/node_modules/.bin/opencode"
work="$AGENT_HOME/work"
mkdir -p "$work" "$AGENT_HOME/.config/opencode"
export HOME=$AGENT_HOME XDG_CONFIG_HOME=$AGENT_HOME/.config XDG_DATA_HOME=$AGENT_HOME/.local/share
export XDG_CACHE_HOME=$AGENT_HOME/.cache XDG_STATE_HOME=$AGENT_HOME/.local/state
export OPENCODE_DISABLE_AUTOUPDATE=1 OPENCODE_DISABLE_SHARE=1
cat >"$AGENT_HOME/.config/opencode/opencode.json" <<JSON
{
  "\$schema": "https://opencode.ai/config.json",
  "autoupdate": false,
  "share": "disabled",
  "model": "sluice/tiny",
  "provider": {
    "sluice": {
      "npm": "@ai-sdk/openai-compatible",
      "name": "sluice",
      "options": { "baseURL": "$SLUICE_URL/v1", "apiKey": "dummy" },
      "models": { "tiny": { "name": "tiny" } }
    }
  }
}
JSON
cd "$work"

# turn N PROMPT [ARGS...]: one run; it must exit 0 and end with a finished step.
turn() {
  local n=$1 prompt=$2; shift 2
  local out="$AGENT_HOME/turn$n.json"
  if ! timeout 600 "$opencode" run "$prompt" --format json "$@" >"$out" 2>"$AGENT_HOME/turn$n.err"; then
    tail -5 "$AGENT_HOME/turn$n.err" >&2; fail "opencode turn $n exited non-zero"
  fi
  node -e '
    const lines = require("fs").readFileSync(process.argv[1], "utf8").split("\n").filter(Boolean).map(JSON.parse);
    const errors = lines.filter((e) => e.type === "error");
    const fin = lines.filter((e) => e.type === "step_finish");
    if (errors.length || !fin.length) { console.error(lines.map((e) => JSON.stringify(e)).join("\n").slice(0, 2000)); process.exit(1); }
    const t = fin[fin.length - 1].part.tokens || {};
    console.log(`   turn ${process.argv[2]}: finish ${fin[fin.length - 1].part.reason}, input ${t.input}, ` +
                `cache read ${t.cache ? t.cache.read : "?"}, output ${t.output}`);
    if (process.argv[3] === "cached" && !(t.cache && t.cache.read > 0)) {
      console.error("   no cached tokens in the continued turn"); process.exit(1);
    }' "$out" "$n" "${CHECK_CACHED:-}" ||
    fail "opencode turn $n did not complete"
}

two_turns_reading_the_cache
if find "$XDG_CACHE_HOME" -name package.json 2>/dev/null | grep -q .; then
  echo "   note: opencode downloaded packages into its cache:"; find "$XDG_CACHE_HOME" -name package.json | sed 's/^/     /'
fi
