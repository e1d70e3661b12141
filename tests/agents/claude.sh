#!/usr/bin/env bash
# Claude Code, unmodified, against sluice's Anthropic Messages API: one `claude -p` turn, then a
# turn continuing it (--continue) that must report prompt tokens read from the cache.
# Pinned: @anthropic-ai/claude-code 2.1.332. Its package declares node >= 22, but `claude` is a
# bundled native binary (its own runtime) and runs where npm runs (tested: node 20).
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"
npm_install claude @anthropic-ai/claude-code@2.1.332
claude="$AGENT_PKGS/claude/node_modules/.bin/claude"
work="$AGENT_HOME/work"
mkdir -p "$work"
export HOME=$AGENT_HOME XDG_CONFIG_HOME=$AGENT_HOME/.config
export DISABLE_TELEMETRY=1 CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 DISABLE_AUTOUPDATER=1 DISABLE_ERROR_REPORTING=1
export ANTHROPIC_BASE_URL=$SLUICE_URL ANTHROPIC_API_KEY=dummy
cd "$work"

# turn N PROMPT [ARGS...]: runs one turn, checks it completed, prints its usage.
turn() {
  local n=$1 prompt=$2; shift 2
  local out="$AGENT_HOME/turn$n.json"
  if ! timeout 600 "$claude" -p "$prompt" --output-format json "$@" >"$out" 2>"$AGENT_HOME/turn$n.err"; then
    tail -5 "$AGENT_HOME/turn$n.err" >&2; head -c 2000 "$out" >&2; fail "claude turn $n exited non-zero"
  fi
  node -e '
    const r = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"));
    if (r.type !== "result" || r.subtype !== "success" || r.is_error) {
      console.error(JSON.stringify(r).slice(0, 2000)); process.exit(1);
    }
    const u = r.usage || {};
    console.log(`   turn ${process.argv[2]}: ${r.num_turns} request(s), stop ${r.stop_reason}, input ${u.input_tokens}, ` +
                `cache_read ${u.cache_read_input_tokens}, output ${u.output_tokens}`);
    if (process.argv[3] === "cached" && !(u.cache_read_input_tokens > 0)) {
      console.error("   no cache_read_input_tokens in the continued turn"); process.exit(1);
    }' "$out" "$n" "${CHECK_CACHED:-}" || fail "claude turn $n did not complete as expected"
}

two_turns_reading_the_cache
