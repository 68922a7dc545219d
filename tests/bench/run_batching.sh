#!/usr/bin/env bash
# Dynamic batching of small unary requests, before and after, with `trisolve bench` (every answer
# checked on the client, one local core beside it): one tridiagonal system of n = 64 a request,
# 1 / 16 / 64 clients, against trisolved with batching off (--max-batch-systems 1: the default and the code
# before), with the defaults (natural batching), with a window, and with one lane a kind and a
# window. Runs from a build tree or from the GPU bundle; EXTRA adds server flags to every
# configuration (on the GPU: EXTRA="--gpu-min-unknowns 0" keeps every solve on the device).
#   here (CPU backend):  bash tests/bench/run_batching.sh
#   GPU machine:         BACKEND=cuda RUN=.gpu/run BIN=.gpu/bin bash tests/bench/run_batching.sh
# Logs under $OUT (default tests/bench/results/batching-<backend>-<date>).
set -uo pipefail
backend=${BACKEND:-cpu}
bin=${BIN:-build}
run=${RUN:-}
trisolved=$bin/trisolved trisolve=$bin/trisolve
[ -x "$trisolved" ] || trisolved=$bin/server/trisolved
[ -x "$trisolve" ] || trisolve=$bin/client/trisolve
out=${OUT:-tests/bench/results/batching-$backend-$(date -u +%Y-%m-%d)}
mkdir -p "$out"
clients=${CLIENTS:-1 16 64}
{ uname -n; nproc; grep -m1 "model name" /proc/cpuinfo; date -u +%Y-%m-%dT%H:%MZ; uptime; } | tee "$out/machine.txt"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version --format=csv | tee -a "$out/machine.txt"

start() {  # start PORT [flags]: a server in the background, waits until it serves
  # shellcheck disable=SC2086
  $run "$trisolved" --backend "$backend" --listen "127.0.0.1:$1" "${@:2}" ${EXTRA:-} \
    >"${TMPDIR:-/tmp}/trisolved_batching_$1.log" 2>&1 &
  srv=$!
  for _ in $(seq 300); do $run "$trisolve" --server "127.0.0.1:$1" --timeout 1 health >/dev/null 2>&1 && return; sleep 0.1; done
}
sweep() {  # sweep PORT LABEL
  for c in $clients; do
    r=${REQUESTS:-$((c == 1 ? 4000 : (c <= 16 ? 500 : 150)))}
    echo "--- $2 (${EXTRA:-}), $c clients: $trisolve bench --clients $c --requests $r --n 64 --mode unary --transport grpc"
    $run "$trisolve" --server "127.0.0.1:$1" bench --clients "$c" --requests "$r" --n 64 \
      --mode unary --transport grpc --json
  done 2>&1 | tee -a "$out/$2.log"
}

configs=" ${CONFIGS:-off natural window lane} "
want() { [[ $configs == *" $1 "* ]]; }
port=50170
config() {  # config NAME [trisolved flags]
  want "$1" || return 0
  port=$((port + 1))
  echo "=== $1: trisolved --backend $backend ${*:2}"
  start $port "${@:2}"
  sweep $port "$1"
  kill $srv; wait $srv 2>/dev/null
}
on="--max-batch-systems 256"
config off --max-batch-systems 1                     # batching off: the default
config natural $on                                   # natural batching, 2 lanes
config window $on --batch-window-us "${WINDOW:-100}"    # a window for batches with company
config lane $on --max-batches-in-flight 1 --batch-window-us "${WINDOW:-100}"  # one lane a kind
