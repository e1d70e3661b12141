# Shared by tests/clients/run.sh and tests/agents/run.sh (sourced): waits for a `sluice serve`
# started in the background with --port 0 to report its address and answer /health.
# wait_for_server NAME PID LOG TRIES: sets `url`; on failure prints the log and exits 1
# ("NAME: server exited" / "NAME: server did not start"). Each try waits 50 ms.
wait_for_server() {
  local name=$1 server_pid=$2 server_log=$3 tries=$4
  url=""
  for _ in $(seq 1 "$tries"); do
    url=$(grep -o 'listening on http://[^ ]*' "$server_log" | sed 's/listening on //' || true)
    [ -n "$url" ] && break
    kill -0 "$server_pid" 2>/dev/null || { cat "$server_log" >&2; echo "$name: server exited" >&2; exit 1; }
    sleep 0.05
  done
  [ -n "$url" ] || { cat "$server_log" >&2; echo "$name: server did not start" >&2; exit 1; }
  for _ in $(seq 1 "$tries"); do
    [ "$(curl -s -o /dev/null -w '%{http_code}' "$url/health")" = 200 ] && break
    sleep 0.05
  done
}
