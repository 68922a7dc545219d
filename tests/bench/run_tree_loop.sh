#!/usr/bin/env bash
# The time-step loop of issue 31: CELLS cells (default 10,240) of the real morphology
# (tests/data/*.swc, 3,187 compartments each), the diagonal and the right-hand side new each
# step, by handle and through the time-step stream, every answer's residual checked, beside Hines
# over the same cells on one local core. One step by handle moves 3 x 8 bytes an unknown (261 MB
# an array at 10,240 cells), so the server takes messages up to 2 GB here.
#   here (CPU backend):  bash tests/bench/run_tree_loop.sh
#   GPU machine:         BACKEND=cuda RUN=.gpu/run BIN=.gpu/bin bash tests/bench/run_tree_loop.sh
set -uo pipefail
backend=${BACKEND:-cpu}
bin=${BIN:-build}
run=${RUN:-}
trisolved=$bin/trisolved trisolve=$bin/trisolve
[ -x "$trisolved" ] || trisolved=$bin/server/trisolved
[ -x "$trisolve" ] || trisolve=$bin/client/trisolve
swc=${SWC:-tests/data/neuron_10-2012-02-09-001.CNG.swc}
cells=${CELLS:-10240} steps=${STEPS:-5}
out=${OUT:-tests/bench/results/tree-loop-$backend-$(date -u +%Y-%m-%d)}
mkdir -p "$out"
{ uname -n; nproc; grep -m1 "model name" /proc/cpuinfo; date -u +%Y-%m-%dT%H:%MZ; uptime; } | tee -a "$out/machine.txt"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version --format=csv | tee -a "$out/machine.txt"
port=${PORT:-50181}
# shellcheck disable=SC2086
$run "$trisolved" --backend "$backend" --listen "127.0.0.1:$port" --max-message-bytes 2000000000 \
  ${EXTRA:-} >"${TMPDIR:-/tmp}/trisolved_tree_loop_$port.log" 2>&1 &
srv=$!
for _ in $(seq 300); do $run "$trisolve" --server "127.0.0.1:$port" --timeout 1 health >/dev/null 2>&1 && break; sleep 0.1; done
for mode in ${MODES:-handle stream}; do
  echo "--- $trisolve bench --swc $swc --batch $cells --clients 1 --requests $steps --mode $mode --transport grpc"
  $run "$trisolve" --server "127.0.0.1:$port" bench --swc "$swc" --batch "$cells" --clients 1 \
    --requests "$steps" --mode "$mode" --transport grpc --json
done 2>&1 | tee -a "$out/tree-loop.log"
kill $srv; wait $srv 2>/dev/null
