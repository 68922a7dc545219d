#!/usr/bin/env bash
# Request rings against gRPC (issue 31: one system of n = 64, p50 <= 100 us, >= 100,000/s at 64
# clients, no fall from 16 to 256): `trisolve bench` at 1 / 16 / 64 / 256 clients, unary and by
# handle through rings (--transport ring) and over the socket (--transport grpc), with gRPC's
# floor (--mode health) beside them, ROUNDS rounds interleaved (each round every configuration
# once, in turn), medians printed at the end. Every answer is checked by the bench.
#   here (CPU backend):  bash tests/bench/run_ring.sh
#   lent GPU:            RUN=.gpu/run BACKEND=cuda bash tests/bench/run_ring.sh  (logs under $OUT)
# RUN: a wrapper the binaries run under (the GPU bundle's); BIN: where trisolved and trisolve
# are (default build/server and build/client, or bare names under RUN). SERVER_ARGS: more flags
# for trisolved (e.g. "--ring-threads 0" for a thread a ring); TRANSPORTS: "ring grpc" (default)
# or one of them; SCALE: requests a client times this (longer, steadier runs); CLIENT: the
# client binary's name under RUN (default trisolve).
set -uo pipefail
out=${OUT:-/tmp/trisolve-ring}
mkdir -p "$out"
run=${RUN:-}
backend=${BACKEND:-cpu}
rounds=${ROUNDS:-3}
clients=${CLIENTS:-1 16 64 256}
modes=${MODES:-unary handle health}
transports=${TRANSPORTS:-ring grpc}
server_args=${SERVER_ARGS:-}
if [ -n "$run" ]; then
  srv_bin="$run trisolved"
  cli_bin="$run ${CLIENT:-trisolve}"
else
  srv_bin=${BIN:-build}/server/trisolved
  cli_bin=${BIN:-build}/client/${CLIENT:-trisolve}
fi
{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null
  nproc | sed 's/^/cores: /'
  date -u +%Y-%m-%dT%H:%MZ
  echo "trisolved ${SERVER_ARGS:-}; client ${CLIENT:-trisolve}; requests x${SCALE:-1}"
} | tee "$out/device.txt"

port=${PORT:-50391}
# Each ring is a region of the caller's: 256 clients need room for 256 of them.
$srv_bin --backend "$backend" --listen "127.0.0.1:$port" --request-log errors \
  --max-regions-per-identity 1024 --max-systems-per-identity 1024 $server_args \
  >"$out/trisolved.log" 2>&1 &
srv=$!
for _ in $(seq 200); do
  $cli_bin --server "127.0.0.1:$port" --timeout 1 health >/dev/null 2>&1 && break
  sleep 0.1
done
: >"$out/ring.jsonl"
for round in $(seq "$rounds"); do
  for c in $clients; do
    r=$(((c == 1 ? 3000 : (c <= 16 ? 1000 : (c <= 64 ? 400 : 100))) * ${SCALE:-1}))
    for mode in $modes; do
      for t in $transports; do
        [ "$mode" = health ] && [ "$t" = ring ] && continue
        echo "--- round $round, $mode over $t, $c clients" | tee -a "$out/ring.log"
        $cli_bin --server "127.0.0.1:$port" bench --clients "$c" --requests "$r" --n 64 \
          --mode "$mode" --transport "$t" --json 2>&1 | tee -a "$out/ring.log" |
          grep '^{' >>"$out/ring.jsonl"
      done
    done
  done
done
kill $srv
wait $srv 2>/dev/null
python3 - "$out/ring.jsonl" <<'EOF'
import json, statistics, sys
rows = {}
for line in open(sys.argv[1]):
    j = json.loads(line)
    key = (j["mode"], j["transport"] if j["mode"] != "health" else "-", j["clients"])
    rows.setdefault(key, []).append(j)
print(f"{'mode':8} {'transport':9} {'clients':>7} {'runs':>4} {'req/s (median)':>15} "
      f"{'p50 us':>8} {'p99 us':>9} {'wrong+errors':>12}")
for key in sorted(rows, key=lambda k: (k[0], k[1], k[2])):
    rs = rows[key]
    med = lambda f: statistics.median(r[f] for r in rs)
    bad = sum(r.get("wrong", 0) + r.get("errors", 0) for r in rs)
    print(f"{key[0]:8} {key[1]:9} {key[2]:>7} {len(rs):>4} {med('requests_per_s'):>15,.0f} "
          f"{med('p50_ms') * 1e3:>8.0f} {med('p99_ms') * 1e3:>9.0f} {bad:>12}")
EOF
