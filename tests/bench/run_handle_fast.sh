#!/usr/bin/env bash
# Issue 31's by-handle target: 2^24 unknowns (65,536 x 256 float64), right-hand side only, >= 3x
# faster end to end than sending the whole system, and faster than one local core. ROUNDS
# rounds (default 3), each running in turn: the whole system (unary, the client's default
# pieces), by handle whole, by handle in 2, 4 and 8 pieces; `trisolve bench --transport
# streams`, one client, REQUESTS requests each (p50 of them), every answer checked, one local
# core beside each; then the whole system and by handle whole again with x written into an
# array of the client's own, reused (`bench --x-out`, as a time-stepping code keeps its x). Per
# round: each p50, the bench's upload / download / server split, and the whole system's p50
# over each by-handle p50. STREAMS: the --parallel-streams values to run
# the round with (default 8, the client's default). BASE: another build's trisolve command (the
# client before a change, say); each round then also runs its unary and by-handle whole against
# the same server, first.
#   here (CPU backend):  bash tests/bench/run_handle_fast.sh
#   lent GPU:            RUN=.gpu/run BACKEND=cuda bash tests/bench/run_handle_fast.sh
# RUN: a wrapper the binaries run under (the GPU bundle's); BIN: where trisolved and trisolve
# are (default build/server and build/client, or bare names under RUN). Logs under $OUT.
set -uo pipefail
out=${OUT:-/tmp/trisolve-handle-fast}
mkdir -p "$out"
run=${RUN:-}
backend=${BACKEND:-cpu}
rounds=${ROUNDS:-3}
requests=${REQUESTS:-5}
batch=${BATCH:-65536}
n=${N:-256}
streams_list=${STREAMS:-8}
if [ -n "$run" ]; then
  srv_bin="$run trisolved"
  cli_bin="$run trisolve"
else
  srv_bin=${BIN:-build}/server/trisolved
  cli_bin=${BIN:-build}/client/trisolve
fi
{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null
  nproc | sed 's/^/cores: /'
  grep -m1 'model name' /proc/cpuinfo
  cat /sys/kernel/mm/transparent_hugepage/enabled 2>/dev/null | sed 's/^/transparent hugepages: /'
  date -u +%Y-%m-%dT%H:%MZ
} | tee "$out/device.txt"

port=${PORT:-50431}
$srv_bin --backend "$backend" --listen "127.0.0.1:$port" --request-log errors \
  >"$out/trisolved.log" 2>&1 &
srv=$!
for _ in $(seq 300); do
  $cli_bin --server "127.0.0.1:$port" --timeout 1 health >/dev/null 2>&1 && break
  sleep 0.1
done

field() { grep -o "\"$1\":[0-9.e+-]*" | tail -1 | cut -d: -f2; }
# bench NAME MODE PIECES STREAMS [BENCH FLAGS]: one configuration; its JSON line appended to
# the log and its p50 echoed (empty where it failed).
bench() {
  local name=$1 mode=$2 pieces=$3 streams=$4 line
  shift 4
  local piece_args=()
  # Pieces of 8 MiB or more: 2^24 by handle moves 268 MB, so up to 32 (the default 128 MiB
  # would allow two).
  [ "$pieces" != default ] && piece_args=(--pipeline-pieces "$pieces" --pipeline-piece-bytes 8388608)
  line=$(${cli:-$cli_bin} --server "127.0.0.1:$port" --parallel-streams "$streams" \
    "${piece_args[@]}" bench --mode "$mode" --transport streams --batch "$batch" --n "$n" \
    --requests "$requests" --json "$@" 2>>"$out/bench.err" | tail -1)
  echo "round $round streams $streams $name: $line" >>"$out/handle_fast.log"
  if echo "$line" | grep -q '"wrong":0,"errors":0'; then
    printf '%s' "$line" >"$out/last.json"
    echo "$line" | field p50_ms
  fi
}

for round in $(seq "$rounds"); do
  for streams in $streams_list; do
    if [ -n "${BASE:-}" ]; then
      for mode in unary handle; do
        rm -f "$out/last.json"
        p50=$(cli=$BASE bench "base $mode" "$mode" "$([ $mode = unary ] && echo default || echo 0)" "$streams")
        printf 'round %s, streams %s: base %s %s ms (up %s, down %s, server %s)\n' "$round" "$streams" \
          "$mode" "${p50:-FAILED}" "$(field upload_ms <"$out/last.json" 2>/dev/null)" \
          "$(field download_ms <"$out/last.json" 2>/dev/null)" \
          "$(field server_total_ms <"$out/last.json" 2>/dev/null)" | tee -a "$out/summary.txt"
      done
    fi
    rm -f "$out/last.json"
    unary=$(bench unary unary default "$streams")
    summary=$(printf 'round %s, streams %s: unary %s ms (up %s, down %s, server %s; local core %s)' \
      "$round" "$streams" "${unary:-FAILED}" "$(field upload_ms <"$out/last.json")" \
      "$(field download_ms <"$out/last.json")" "$(field server_total_ms <"$out/last.json")" \
      "$(field local_ms <"$out/last.json")")
    echo "$summary" | tee -a "$out/summary.txt"
    rm -f "$out/last.json"
    unary_x=$(bench "unary, x reused" unary default "$streams" --x-out)
    printf '  unary, x reused: %s ms (up %s, down %s, server %s)\n' "${unary_x:-FAILED}" \
      "$(field upload_ms <"$out/last.json" 2>/dev/null)" \
      "$(field download_ms <"$out/last.json" 2>/dev/null)" \
      "$(field server_total_ms <"$out/last.json" 2>/dev/null)" | tee -a "$out/summary.txt"
    for pieces in 0 2 4 8 x; do
      name=$([ "$pieces" = 0 ] && echo "handle whole" || echo "handle $pieces pieces")
      against=$unary
      rm -f "$out/last.json"
      if [ "$pieces" = x ]; then
        # Against the whole system with its x reused likewise.
        name="handle whole, x reused"
        against=$unary_x
        p50=$(bench "$name" handle 0 "$streams" --x-out)
      else
        p50=$(bench "$name" handle "$pieces" "$streams")
      fi
      if [ -z "$p50" ]; then
        echo "  $name: FAILED (see $out/handle_fast.log, $out/bench.err)" | tee -a "$out/summary.txt"
        continue
      fi
      ratio=$(awk -v u="${against:-0}" -v h="$p50" 'BEGIN { if (u > 0) printf "%.2f", u / h; else print "-" }')
      printf '  %s: %s ms (up %s, down %s, server %s; pieces %s; local core %s ms), unary/handle %s\n' \
        "$name" "$p50" "$(field upload_ms <"$out/last.json")" "$(field download_ms <"$out/last.json")" \
        "$(field server_total_ms <"$out/last.json")" "$(field pieces <"$out/last.json")" \
        "$(field local_ms <"$out/last.json")" "$ratio" | tee -a "$out/summary.txt"
    done
  done
done
kill $srv
wait $srv 2>/dev/null
