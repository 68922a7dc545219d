#!/usr/bin/env bash
# Small unary requests through the callback server (service.cc): one tridiagonal system of
# n = 64 a request, the whole system (unary) and by handle, every answer checked by
# `trisolve bench`, one local core beside it. Two load shapes: C clients waiting for each answer
# (--in-flight 1: 1 / 16 / 64 / 256 connections), and fewer connections each keeping K requests
# outstanding through the stub's callback API (--in-flight K), so that the load generator's own
# threads do not bound what is measured. BASE_BIN, when set, runs the same against the
# binaries there first (the code before), on the same machine in the same run.
#   here (CPU backend):  BASE_BIN=/tmp/base bash tests/bench/run_callback.sh
#   GPU machine:         BACKEND=cuda RUN=.gpu/run BIN=.gpu/bin bash tests/bench/run_callback.sh
# Logs under $OUT (default tests/bench/results/callback-<backend>-<date>).
set -uo pipefail
backend=${BACKEND:-cpu}
run=${RUN:-}
out=${OUT:-tests/bench/results/callback-$backend-$(date -u +%Y-%m-%d)}
mkdir -p "$out"
clients=${CLIENTS:-1 16 64 256}
inflight=${INFLIGHT:-"4x16 16x16 64x4"}  # CONNECTIONSxK
modes=${MODES:-unary handle}
{ uname -n; nproc; grep -m1 "model name" /proc/cpuinfo; date -u +%Y-%m-%dT%H:%MZ; uptime; } | tee "$out/machine.txt"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version --format=csv | tee -a "$out/machine.txt"

port=50270
sweep() {  # sweep BINDIR LABEL
  local bin=$1 trisolved=$1/trisolved trisolve=$1/trisolve
  [ -x "$trisolved" ] || trisolved=$bin/server/trisolved
  [ -x "$trisolve" ] || trisolve=$bin/client/trisolve
  port=$((port + 1))
  # shellcheck disable=SC2086
  $run "$trisolved" --backend "$backend" --listen "127.0.0.1:$port" ${EXTRA:-} \
    >"${TMPDIR:-/tmp}/trisolved_callback_$port.log" 2>&1 &
  local srv=$!
  for _ in $(seq 300); do $run "$trisolve" --server "127.0.0.1:$port" --timeout 1 health >/dev/null 2>&1 && break; sleep 0.1; done
  for mode in $modes; do
    for c in $clients; do
      r=${REQUESTS:-$((c == 1 ? 4000 : (c <= 16 ? 1000 : (c <= 64 ? 300 : 100))))}
      echo "--- $2, $mode, $c clients: trisolve bench --clients $c --requests $r --n 64 --mode $mode --transport grpc"
      $run "$trisolve" --server "127.0.0.1:$port" bench --clients "$c" --requests "$r" --n 64 \
        --mode "$mode" --transport grpc --json
    done
    [ "$2" = before ] && continue  # the code before has no --in-flight
    for ck in $inflight; do
      c=${ck%x*} k=${ck#*x}
      r=${REQUESTS_INFLIGHT:-$((64000 / c))}
      echo "--- $2, $mode, $c clients x $k in flight: trisolve bench --clients $c --in-flight $k --requests $r --n 64 --mode $mode --transport grpc"
      $run "$trisolve" --server "127.0.0.1:$port" bench --clients "$c" --in-flight "$k" \
        --requests "$r" --n 64 --mode "$mode" --transport grpc --json
    done
  done 2>&1 | tee -a "$out/$2.log"
  kill "$srv"; wait "$srv" 2>/dev/null
}
[ -n "${BASE_BIN:-}" ] && sweep "$BASE_BIN" before
sweep "${BIN:-build}" after
