#!/usr/bin/env bash
# Servers of several commits side by side on the lent machine, interleaved in rounds, with
# one client build for all: small requests (n = 64 at 1 / 16 / 64 / 256 clients) and, with
# BIG=1, the 2^24-unknown job over the streams transport (whole, in pieces, by handle).
#   here:   ../shared/gpu/bundle.sh .gpu build-cpu/server/trisolved build-cpu/client/trisolve
#           cp OTHER/build/server/trisolved .gpu/bin/trisolved-NAME   (same libraries)
#           strip .gpu/bin/*; tar -cf - .gpu | xz -9 -T2 > .gpu.tar.xz
#   there:  SERVERS="base:trisolved-base new:trisolved" bash tests/bench/run_ab_gpu.sh
# SERVERS: name:binary pairs; ROUNDS (3); CLIENTS ("1 16 64 256"); MODE (unary); BACKEND (cpu);
# BIG (0); LOG (the servers' --request-log; empty: each server's default). Logs under $OUT: ab.log (the bench's JSON) and ab.txt (one line a run).
set -uo pipefail
out=${OUT:-/tmp/trisolve-ab}/${TAG:-ab}
mkdir -p "$out"
[ -d .gpu ] || tar -xJf .gpu.tar.xz
run=.gpu/run
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc | sed 's/^/cores: /'
  date -u +%Y-%m-%dT%H:%MZ; } 2>/dev/null | tee "$out/device.txt"
port=$((50200 + RANDOM % 400))
line() {  # name clients label <json
  python3 -c '
import json, sys
name, c, label = sys.argv[1:4]
for l in sys.stdin:
    if l.startswith("{"):
        j = json.loads(l)
        print("round %s %s clients %s: %.0f/s p50 %.0f us p99 %.0f us ok %d wrong %d err %d "
              "up %.1f ms down %.1f ms" % (name, label, c, j["requests_per_s"], j["p50_ms"] * 1000,
              j["p99_ms"] * 1000, j["ok"], j["wrong"], j["errors"], j["upload_ms"],
              j["download_ms"]))' "$@"
}
for round in $(seq "${ROUNDS:-3}"); do
  for pair in ${SERVERS:-new:trisolved}; do
    name=${pair%%:*} bin=${pair#*:}
    port=$((port + 1))
    $run "$bin" --backend "${BACKEND:-cpu}" --listen "127.0.0.1:$port" \
      ${LOG:+--request-log $LOG} --max-message-bytes 1073741824 >"/tmp/ab-server-${name}-$round.log" 2>&1 &
    srv=$!
    for _ in $(seq 200); do
      $run trisolve --server "127.0.0.1:$port" --timeout 1 health >/dev/null 2>&1 && break
      sleep 0.1
    done
    for c in ${CLIENTS:-1 16 64 256}; do
      r=$((c == 1 ? 3000 : (c <= 16 ? 1000 : (c <= 64 ? 400 : 100))))
      $run trisolve --server "127.0.0.1:$port" bench --clients "$c" --requests "$r" --n 64 \
        --mode "${MODE:-unary}" --transport grpc --json 2>&1 | tee -a "$out/ab.log" |
        line "$round $name" "$c" "${MODE:-unary}" | tee -a "$out/ab.txt"
    done
    if [ "${BIG:-0}" = 1 ]; then
      for job in "unary 4" "unary 0" "handle 0"; do
        set -- $job
        TRISOLVE_PIPELINE_PIECES=$2 $run trisolve --server "127.0.0.1:$port" bench \
          --transport streams --clients 1 --requests 5 --batch 65536 --n 256 --mode "$1" \
          --json 2>&1 | tee -a "$out/ab.log" | line "$round $name" 1 "2^24-$1-pieces$2" |
          tee -a "$out/ab.txt"
      done
    fi
    kill $srv
    wait $srv 2>/dev/null
  done
done
echo "=== done"
