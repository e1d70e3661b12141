#!/usr/bin/env bash
# The expert-parallel job under mpirun on loopback (issue 17, docs/scale-out.md): 2 and 3 ranks
# give the logits of one process bit for bit (balanced and a placement file, streamed and
# resident experts, chunked prefill and decode); a peer stopped with SIGSTOP or killed with
# SIGKILL ends the job with a non-zero exit in time, the stopped one with one line naming it;
# ranks holding different model files refuse to start, naming the field; --fabric mpi without
# --fabric-if is refused; serve ends a stream with an error event when a peer stops. Usage:
# mpi_job.sh SLUICE_BINARY
set -euo pipefail
bin=$(readlink -f "$1")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
export OMPI_MCA_plm_rsh_agent=false  # everything is local: never try ssh
mpi=(mpirun --allow-run-as-root --oversubscribe --bind-to none --mca pml ob1 --mca btl self,tcp
     --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo)
fab=(--fabric mpi --fabric-if lo)
fail() { echo "FAIL: $*" >&2; exit 1; }
# rank1_pid LOG [PATTERN]: rank 1's pid once LOG says it serves (and PATTERN, if given, is there).
rank1_pid() {
  local p=""
  for _ in $(seq 1 300); do
    p=$(sed -n 's/^sluice (rank 1): pid \([0-9]*\) serving.*/\1/p' "$1" | head -1)
    [ -n "$p" ] && { [ -z "${2:-}" ] || grep -q "$2" "$1"; } && break
    p=""
    sleep 0.1
  done
  echo "$p"
}
# signal_job SIG PID JOB: signals PID, waits for the job; sets rc and secs (signal to exit).
signal_job() {
  local t0 t1
  t0=$(date +%s.%N)
  kill -"$1" "$2"
  set +e
  wait "$3"
  rc=$?
  set -e
  t1=$(date +%s.%N)
  kill -CONT "$2" 2> /dev/null || true
  secs=$(python3 -c "print(f'{$t1 - $t0:.2f}')")
}

"$bin" make-model --preset tiny -o a.gguf --seed 4 > /dev/null
"$bin" make-model --preset tiny -o b.gguf --seed 5 > /dev/null
prompt=$(seq -s, 3 2 301)  # 150 tokens: several chunks of 32
run=(run -m a.gguf --tokens "$prompt" -n 24 -t 1 --chunk 32)

# 1. Bit identity.
python3 - > interleaved.txt <<'PY'
print("# owner rank e % 3 of every expert")
for l in range(8):
    print(f"{l}: " + " ".join(str(e % 3) for e in range(16)))
PY
# local-first: the routing profile of this very run (rank 0 keeps each layer's 5 most chosen).
"$bin" "${run[@]}" --routing-profile profile.txt > /dev/null 2>&1 || fail "run --routing-profile"
grep -q "^7: " profile.txt || fail "the routing profile has no line for layer 7"
for mode in "" --resident-experts; do
  rm -f one.f32* two.f32* three.f32* file.f32* lf.f32*
  "$bin" "${run[@]}" $mode --dump-logits one.f32 > one.txt 2> /dev/null
  "${mpi[@]}" -np 2 "$bin" "${run[@]}" $mode "${fab[@]}" --dump-logits two.f32 > two.txt 2> two.err ||
    { cat two.err >&2; fail "np 2 $mode"; }
  "${mpi[@]}" -np 3 "$bin" "${run[@]}" $mode "${fab[@]}" --dump-logits three.f32 > three.txt 2> three.err ||
    { cat three.err >&2; fail "np 3 $mode"; }
  cmp one.f32 two.f32 || fail "np 2 logits differ from one process ($mode)"
  # One 150-row chunk: Work frames of ~77 KB, past Open MPI's 64 KiB eager limit (rendezvous).
  rm -f big.f32*
  "${mpi[@]}" -np 2 "$bin" run -m a.gguf --tokens "$prompt" -n 24 -t 1 --chunk 160 $mode "${fab[@]}" \
    --dump-logits big.f32 > /dev/null 2> big.err || { cat big.err >&2; fail "np 2, chunk 160 $mode"; }
  "$bin" run -m a.gguf --tokens "$prompt" -n 24 -t 1 --chunk 160 $mode --dump-logits bigone.f32 > /dev/null 2>&1
  cmp bigone.f32 big.f32 || fail "np 2 logits with 150-row frames differ ($mode)"
  rm -f bigone.f32*
  cmp one.f32 three.f32 || fail "np 3 logits differ from one process ($mode)"
  cmp one.txt two.txt && cmp one.txt three.txt || fail "generated tokens differ ($mode)"
  grep -q "rank 2: [1-9][0-9]* exchanges" three.err || fail "rank 2 did no work ($mode)"
  # Rank 1 is an expert server of its 64 of the 128 experts and nothing else (runtime/expert_host.h).
  grep -q "sluice (rank 1): served .* | 64 experts owned | " two.err || { cat two.err >&2; fail "rank 1's summary ($mode)"; }
  [ -z "$mode" ] || grep -q "| 64 experts owned | 64 experts resident (" two.err ||
    { cat two.err >&2; fail "rank 1 holds other than its experts ($mode)"; }
  # Rank 0's summary shows rank 1's store as its answers reported it.
  if [ -z "$mode" ]; then want="rank 1: .* expert cache hit rate [0-9.]*% ([0-9]*/[1-9]"; else want="rank 1: .*, experts resident"; fi
  grep -q "$want" two.err || { cat two.err >&2; fail "rank 0's summary lacks rank 1's store ($mode)"; }
  if true; then  # the tiny preset: 8 layers of 16 experts (parse_placement refuses anything else)
    "${mpi[@]}" -np 3 "$bin" "${run[@]}" $mode "${fab[@]}" --placement interleaved.txt --dump-logits file.f32 \
      > /dev/null 2> file.err || { cat file.err >&2; fail "placement file $mode"; }
    cmp one.f32 file.f32 || fail "logits with the placement file differ ($mode)"
    "${mpi[@]}" -np 3 "$bin" "${run[@]}" $mode "${fab[@]}" --placement local-first:profile.txt --local-experts 5 \
      --dump-logits lf.f32 > /dev/null 2> lf.err || { cat lf.err >&2; fail "local-first $mode"; }
    cmp one.f32 lf.f32 || fail "logits with local-first differ ($mode)"
    grep -q "fabric: 3 ranks (mpi, local-first)" lf.err || { cat lf.err >&2; fail "local-first was not used ($mode)"; }
  fi
done
echo "bit identity: ok"

# 1b. The byte counters under MPI equal the frame formula over the traced routing: one row per
# pass (a 1-token prompt, then decode), so each traced position is one exchange per rank that
# owns one of its experts: out 64 + 2 x hidden + 12 k, back 64 + 4 x hidden x k.
rm -rf bytes_trace
"${mpi[@]}" -np 3 "$bin" run -m a.gguf --tokens 7 -n 40 -t 1 "${fab[@]}" --trace bytes_trace --expert-stats \
  > /dev/null 2> bytes.err || { cat bytes.err >&2; fail "byte counters run"; }
"$bin" inspect a.gguf --json > a.json
python3 - bytes_trace/trace.jsonl bytes.err a.json <<'PY' || { cat bytes.err >&2; fail "byte counters differ from the formula"; }
import json, re, sys
meta = {m["key"]: m.get("value") for m in json.load(open(sys.argv[3]))["metadata"]}
H, E = meta["deepseek41.hidden_size"], meta["deepseek41.n_routed_experts"]
R = 3
want = {r: [0, 0, 0, 0] for r in (1, 2)}  # exchanges, terms, out, back
for line in open(sys.argv[1]):
    for experts in json.loads(line)["experts"]:
        for r in (1, 2):
            k = sum(1 for e in experts if e * R // E == r)  # balanced: e * ranks / experts
            if k:
                w = want[r]
                w[0] += 1; w[1] += k; w[2] += 64 + 2 * H + 12 * k; w[3] += 64 + 4 * H * k
got = {}
for m in re.finditer(r"rank (\d) expert store: .*, (\d+) expert terms computed, (\d+) exchanges, (\d+) bytes sent, (\d+) bytes received", open(sys.argv[2]).read()):
    got[int(m[1])] = [int(m[3]), int(m[2]), int(m[4]), int(m[5])]
for r in (1, 2):
    if got.get(r) != want[r] or want[r][0] == 0:
        sys.exit(f"rank {r}: counted {got.get(r)}, the formula gives {want[r]}")
print("byte counters: " + ", ".join(f"rank {r} {want[r][2]} B out, {want[r][3]} B in" for r in (1, 2)))
PY

# 1c. chat across ranks (rank 0 has stdin): the same replies as one process.
printf 'hello there\nand again\n/exit\n' | "$bin" chat -m a.gguf -n 8 -t 1 > chat1.out 2> /dev/null || fail "chat"
printf 'hello there\nand again\n/exit\n' | "${mpi[@]}" -np 2 "$bin" chat -m a.gguf -n 8 -t 1 "${fab[@]}" \
  > chat2.out 2> chat2.err || { cat chat2.err >&2; fail "chat across ranks"; }
cmp chat1.out chat2.out || fail "chat across ranks replied differently"
grep -q "fabric: 2 ranks (mpi, balanced) | rank 1: [1-9]" chat2.err || { cat chat2.err >&2; fail "chat's fabric summary"; }
echo "chat: ok"

# 2. --fabric-if is required.
set +e
"$bin" "${run[@]}" --fabric mpi > /dev/null 2> noif.err
rc=$?
set -e
[ $rc = 2 ] && grep -q "needs --fabric-if" noif.err || { cat noif.err >&2; fail "--fabric mpi without --fabric-if (rc $rc)"; }

# 3. Different model files on the ranks: refused, naming the field.
set +e
"${mpi[@]}" -np 1 "$bin" "${run[@]}" "${fab[@]}" : -np 1 "$bin" run -m b.gguf --tokens "$prompt" -n 24 -t 1 --chunk 32 \
  "${fab[@]}" > /dev/null 2> mismatch.err
rc=$?
set -e
[ $rc != 0 ] && grep -q "rank 1 differs from rank 0 in its model file identity" mismatch.err ||
  { cat mismatch.err >&2; fail "a model mismatch was not refused (rc $rc)"; }
# The same model, but rank 1 reads another placement file (MPMD: one command line per rank).
set +e
python3 - > two_a.txt <<'PY'
for l in range(8):
    print(f"{l}: " + " ".join(str(e % 2) for e in range(16)))
PY
sed 's/^0: 0 1/0: 1 0/' two_a.txt > two_b.txt  # two experts of layer 0 trade places
"${mpi[@]}" -np 1 "$bin" "${run[@]}" "${fab[@]}" --placement two_a.txt : \
  -np 1 "$bin" "${run[@]}" "${fab[@]}" --placement two_b.txt > /dev/null 2> placement.err
rc=$?
set -e
[ $rc != 0 ] && grep -q "rank 1 differs from rank 0 in its placement" placement.err ||
  { cat placement.err >&2; fail "a rank with another placement file was not refused (rc $rc)"; }
echo "handshake mismatch: ok"

# 4. A stopped and a killed peer: a long generation, the peer signalled once it serves.
long=(run -m a.gguf --tokens "$prompt" -n 1800 -t 1 --chunk 32 --ignore-eos "${fab[@]}" --fabric-timeout 500)
for sig in STOP KILL; do
  "${mpi[@]}" -np 2 "$bin" "${long[@]}" > /dev/null 2> sig.err &
  job=$!
  pid=$(rank1_pid sig.err)
  [ -n "$pid" ] || { kill -9 $job; cat sig.err >&2; fail "rank 1 never served"; }
  sleep 1.0  # past the prefill: a decode exchange (one row) has the plain timeout
  signal_job $sig "$pid" $job
  echo "SIG$sig: rc $rc after $secs s"
  [ $rc != 0 ] || fail "SIG$sig: the job exited 0"
  if [ $sig = STOP ]; then
    python3 -c "import sys; sys.exit(0 if $secs < 0.5 + 2.0 else 1)" || { cat sig.err >&2; fail "SIGSTOP: took $secs s"; }
    grep -q "sluice (rank 0): fabric: rank 1 did not return layer [0-9]* outputs (exchange [0-9]*) within 500 ms" sig.err ||
      { cat sig.err >&2; fail "SIGSTOP: no line naming the rank"; }
  else
    python3 -c "import sys; sys.exit(0 if $secs < 10 else 1)" || { cat sig.err >&2; fail "SIGKILL: took $secs s"; }
  fi
  # Gone, or a zombie waiting for init to reap it: nothing of the job runs on.
  for _ in $(seq 1 50); do
    st=$(ps -o stat= -p "$pid" 2> /dev/null || true)
    [ -z "$st" ] || [ "${st:0:1}" = Z ] && break
    sleep 0.1
  done
  [ -z "$st" ] || [ "${st:0:1}" = Z ] || fail "SIG$sig: rank 1 (pid $pid) is still running ($st)"
done
echo "stopped and killed peers: ok"

# 5. serve across ranks: a stopped peer ends the streaming request with an error event, then the job.
port=$((20000 + RANDOM % 20000))
"${mpi[@]}" -np 2 "$bin" serve -m a.gguf --port $port -t 1 "${fab[@]}" --fabric-timeout 500 > /dev/null 2> serve.err &
job=$!
pid=$(rank1_pid serve.err "ready")
[ -n "$pid" ] || { kill -9 $job; cat serve.err >&2; fail "serve: rank 1 never served"; }
curl -s -N "http://127.0.0.1:$port/v1/completions" -H 'content-type: application/json' \
  -d '{"prompt":"hello","max_tokens":4000,"stream":true,"ignore_eos":true}' > stream.out &
client=$!
for _ in $(seq 1 100); do grep -q '"text"' stream.out 2> /dev/null && break; sleep 0.05; done
grep -q '"text"' stream.out || { kill -9 $job; fail "serve: no tokens streamed before the stop"; }
curl -s "http://127.0.0.1:$port/metrics" > metrics.txt
grep -q '^sluice_fabric_exchanges_total{rank="1"} [1-9]' metrics.txt &&
  grep -q '^sluice_fabric_exchange_latency_us{rank="1",quantile="0.99"} ' metrics.txt ||
  { kill -9 $job; grep fabric metrics.txt >&2; fail "serve: /metrics has no fabric lines for rank 1"; }
signal_job STOP "$pid" $job
wait $client || true
echo "serve, SIGSTOP: rc $rc after $secs s"
[ $rc != 0 ] || fail "serve: the job exited 0"
python3 -c "import sys; sys.exit(0 if $secs < 0.5 + 2.0 else 1)" || fail "serve: took too long"
grep -q '"error":{"code":500,"message":"fabric: rank 1 did not return layer' stream.out ||
  { tail -c 400 stream.out >&2; fail "serve: the stream did not end with an error event"; }
grep -q "sluice (rank 0): fabric: rank 1 did not return" serve.err || { cat serve.err >&2; fail "serve: no line naming the rank"; }
echo "serve with a stopped peer: ok"
