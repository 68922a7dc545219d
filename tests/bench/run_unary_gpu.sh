#!/usr/bin/env bash
# One small request's fixed cost on the lent GPU machine (issue 31: n = 64, p50 <= 100 us,
# >= 100,000/s at 64 clients, no fall from 16 to 256): the floor (GetServerInfo, the health
# check) beside unary and by-handle solves at 1 / 16 / 64 / 256 clients, against
# `trisolved --backend cuda` with the answered solves logged (the default) and not
# (--request-log errors); unary and by handle also through request rings (--transport ring: the
# control path in shared memory, no socket). Every answer is checked by the bench.
#   here:   /work/shared/gpu/bundle.sh .gpu build/server/trisolved build/client/trisolve
#           strip .gpu/bin/*; tar -cf - .gpu | xz -9 -T2 > .gpu.tar.xz
#   there:  bash tests/bench/run_unary_gpu.sh        (logs under $OUT)
# RUN / BIN: the bundle's wrapper and binaries (default .gpu/run, bare names).
set -uo pipefail
out=${OUT:-/tmp/trisolve-unary}
mkdir -p "$out"
[ -d .gpu ] || { [ -f .gpu.tar.xz ] && tar -xJf .gpu.tar.xz; }
run=${RUN:-.gpu/run}
backend=${BACKEND:-cuda}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null | tee "$out/device.txt"
nproc | sed 's/^/cores: /' | tee -a "$out/device.txt"
date -u +%Y-%m-%dT%H:%MZ | tee -a "$out/device.txt"

port=50171
for log in all errors; do
  $run trisolved --backend "$backend" --listen "127.0.0.1:$port" --request-log "$log" \
    --max-systems-per-identity 1024 --max-regions-per-identity 1024 \
    >"$out/trisolved_$log.log" 2>&1 &
  srv=$!
  for _ in $(seq 200); do
    $run trisolve --server "127.0.0.1:$port" --timeout 1 health >/dev/null 2>&1 && break
    sleep 0.1
  done
  for c in 1 16 64 256; do
    r=$((c == 1 ? 3000 : (c <= 16 ? 1000 : (c <= 64 ? 400 : 100))))
    for mode in info health unary handle ring-unary ring-handle; do
      transport=grpc
      case $mode in ring-*) transport=ring; mode=${mode#ring-} ;; esac
      echo "--- request-log $log, $mode over $transport, $c clients" | tee -a "$out/unary_$log.log"
      $run trisolve --server "127.0.0.1:$port" bench --clients $c --requests $r --n 64 \
        --mode $mode --transport $transport --json 2>&1 | tee -a "$out/unary_$log.log"
    done
  done
  kill $srv
  wait $srv
  port=$((port + 1))
done
