#!/usr/bin/env bash
# The data path on the lent GPU, this tree beside a baseline on the same card in one call:
# 2^24 unknowns (65,536 x 256, float64) through shared memory, the whole system and by handle
# (right-hand side in, x out), and 64 x 65,536; one local core beside each (trisolve bench).
#   here:   ../shared/gpu/bundle.sh .gpu build-cuda/server/trisolved build-cuda/client/trisolve
#           (the baseline's two programs into .gpu-base the same way); strip .gpu*/bin/*;
#           tar -cf - .gpu .gpu-base | xz -9 -T2 > .gpu.tar.xz
#   there:  bash tests/bench/run_datapath_gpu.sh        (logs under $OUT)
# BUNDLES (default "base new"); TRANSPORTS (default shm); REQUESTS (default 20); STREAMS (the
# client's --parallel-streams, default its own); PIECES (streams: --pipeline-pieces values to run
# each job with, e.g. "0 4 8"; a base without the option ignores it); PIECE_BYTES (streams: the
# fewest bytes moved a piece, --pipeline-piece-bytes; by handle only d and x move, so 2^24 by handle
# needs 64 MiB or less for 4 pieces); STAGING_PIECES (the server's most pieces of a solve from
# page-locked memory, TRISOLVE_STAGING_PIECES, e.g. "8 16 32": a server a value, each bundle);
# SHAPES (default "65536x256 64x65536", batch x n) and MODES (default "unary handle");
# SERVER_ARGS (more trisolved flags, e.g. "--log-level debug": a line a call by handle with the
# backend's wall time beside its copies and kernels, in trisolved_<bundle>.log).
set -uo pipefail
out=${OUT:-/tmp/trisolve-datapath}
mkdir -p "$out"
{ [ -d .gpu ] && [ -d .gpu-base ]; } || tar -xJf .gpu.tar.xz
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; date -u +%Y-%m-%dT%H:%MZ; } |
  tee "$out/device.txt"
rq=${REQUESTS:-20}
for b in ${BUNDLES:-base new}; do
  dir=.gpu
  [ "$b" = base ] && dir=.gpu-base
  [ -d "$dir" ] || { echo "no $dir: skipped"; continue; }
  for sp in ${STAGING_PIECES:-default}; do
    port=$((50170 + RANDOM % 500))
    [ "$sp" = default ] || echo "staging pieces $sp" | tee -a "$out/datapath_$b.log"
    # shellcheck disable=SC2086
    env ${STAGING_PIECES:+TRISOLVE_STAGING_PIECES=$sp} \
      $dir/run trisolved --backend cuda --listen "127.0.0.1:$port" --max-message-bytes 1073741824 \
      ${SERVER_ARGS:-} \
      >>"$out/trisolved_$b.log" 2>&1 &
    srv=$!
    for _ in $(seq 200); do
      $dir/run trisolve --server "127.0.0.1:$port" --timeout 1 health >/dev/null 2>&1 && break
      sleep 0.1
    done
    for tr in ${TRANSPORTS:-shm}; do
      for args in $(for sh in ${SHAPES:-65536x256 64x65536}; do for m in ${MODES:-unary handle}; do
                      echo "--batch=${sh%x*},--n=${sh#*x},--mode=$m"; done; done); do
        args=${args//,/ }
        for pieces in ${PIECES:-default}; do
          [ "$pieces" = default ] || echo "pipeline pieces $pieces" | tee -a "$out/datapath_$b.log"
          # shellcheck disable=SC2086
          env ${STREAMS:+TRISOLVE_PARALLEL_STREAMS=$STREAMS} \
            ${PIECES:+TRISOLVE_PIPELINE_PIECES=$pieces} \
            ${PIECE_BYTES:+TRISOLVE_PIPELINE_PIECE_BYTES=$PIECE_BYTES} \
            $dir/run trisolve --server "127.0.0.1:$port" bench --transport "$tr" --clients 1 \
            --requests "$rq" $args --json 2>&1 | tee -a "$out/datapath_$b.log"
        done
      done
    done
    kill $srv
    wait $srv
  done
done
echo "=== done"
