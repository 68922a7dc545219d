#!/usr/bin/env bash
# Ring-thread settings and clients side by side (issue 31): run_ring.sh once a configuration,
# ring transport only, each configuration's table printed as it ends. CONFIGS: "threads:client"
# pairs ("4:trisolve" is --ring-threads 4 with the client `trisolve`), MODES, CLIENTS, ROUNDS and
# SCALE as run_ring.sh takes them; RUN / BIN as there. Logs under $OUT/rt<threads>-<client>/.
#   lent GPU: RUN=.gpu/run BACKEND=cuda bash tests/bench/run_ring_threads.sh
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${OUT:-/tmp/trisolve-ring-threads}
for config in ${CONFIGS:-0:trisolve 4:trisolve 8:trisolve}; do
  threads=${config%%:*}
  client=${config#*:}
  echo "=== --ring-threads $threads, client $client"
  SERVER_ARGS="--ring-threads $threads" CLIENT=$client TRANSPORTS=ring \
    MODES=${MODES:-unary} SCALE=${SCALE:-10} OUT="$out/rt$threads-$client" \
    bash "$here/run_ring.sh" 2>&1 | sed -n '/^mode /,$p'
done
