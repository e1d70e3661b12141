# Shared by the agent scripts (sourced): pinned local npm installs and checks on the server log.
# The caller (run.sh) sets SLUICE_URL, AGENT_HOME, AGENT_PKGS and SLUICE_SERVER_LOG.
set -euo pipefail

# npm_install DIR PACKAGE@VERSION: installs once into $AGENT_PKGS/DIR (kept between runs).
npm_install() {
  local dir="$AGENT_PKGS/$1" spec=$2
  if [ ! -f "$dir/.installed" ] || [ "$(cat "$dir/.installed")" != "$spec" ]; then
    echo "   npm install $spec"
    mkdir -p "$dir"
    npm install --prefix "$dir" --no-audit --no-fund --loglevel=error "$spec" >/dev/null
    echo "$spec" >"$dir/.installed"
  fi
}

# The request log lines the server wrote since line $1 of the log.
requests_since() { tail -n +"$(($1 + 1))" "$SLUICE_SERVER_LOG" | grep 'sluice serve: request ' || true; }

# Largest cached= among the request lines since line $1.
max_cached_since() {
  requests_since "$1" | sed -n 's/.* cached=\([0-9]*\) .*/\1/p' | sort -n | tail -1
}

log_lines() { wc -l <"$SLUICE_SERVER_LOG"; }

fail() { echo "   FAIL: $*" >&2; exit 1; }

# The two turns of an agent with --continue: the script's turn() runs one (turn N PROMPT
# [ARGS...]; CHECK_CACHED=cached asks it to check the agent's own usage), and the continued
# turn must also show cached prompt tokens in the server's request log.
two_turns_reading_the_cache() {
  turn 1 "Say hello in one word."
  local from cached
  from=$(log_lines)
  CHECK_CACHED=cached turn 2 "And once more." --continue
  cached=$(max_cached_since "$from")
  [ "${cached:-0}" -gt 0 ] || fail "the server log shows no cached prompt tokens for the continued turn"
  echo "   continued turn: server log cached=$cached"
}
