#!/usr/bin/env bash
# Many clients against one trisolved over 1, 2, ... GPUs (--devices), in one call on a
# multi-GPU machine: the multi-device suite first, then the backend alone under many threads
# (bench_multi_device: the devices' scaling without gRPC), then `trisolve bench` (every answer
# checked)
# at GPU-sized requests, by handle (each client's system kept on one device) and unary (the
# whole system each time), and the scaling table: requests/s with D devices against D times
# those with one (the target of issue 38: >= 0.9).
#   here:   ../shared/gpu/bundle.sh .gpu build/server/trisolved build/client/trisolve \
#               build/tests/test_cuda_multi build/tests/bench_multi_device build/tests/test_ops
#           strip .gpu/bin/*; tar -cf - .gpu | xz -9 -T2 > .gpu.tar.xz
#   there:  bash tests/bench/run_multi_gpu.sh          (logs under $OUT)
# PARTS picks what runs (default all): tests backend bench. DEVICES: the device counts to compare
# (default 1 and every count up to the GPUs present, doubling). CLIENTS: default "16 64".
# TRANSPORTS: the bench's data paths (default "auto"; "shm" keeps each client's arrays in
# registered shared memory, so the host copies nothing and the devices' links are what is
# measured). SHAPES: "BATCHxN ..." (default "256x1024 2048x1024"). MODES: default "handle unary".
set -uo pipefail
out=${OUT:-/tmp/trisolve-multi}
mkdir -p "$out"
[ -d .gpu ] || tar -xJf .gpu.tar.xz
parts=" ${PARTS:-tests backend bench} "
want() { [[ $parts == *" $1 "* ]]; }
run=.gpu/run
nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv | tee "$out/device.txt"
nvidia-smi topo -m >>"$out/device.txt" 2>&1
date -u +%Y-%m-%dT%H:%MZ | tee -a "$out/device.txt"
gpus=$(nvidia-smi --query-gpu=index --format=csv,noheader | wc -l)
echo "host: $(nproc) cores; $gpus GPUs" | tee -a "$out/device.txt"

if want tests; then
  echo "=== test_cuda_multi (every device present, device 0 twice, devices 0 and 1)"
  $run test_cuda_multi --gtest_brief=0 >"$out/test_cuda_multi.log" 2>&1
  echo "test_cuda_multi: exit $? $(grep -E '^\[  (PASSED  |FAILED  |SKIPPED )\]' "$out/test_cuda_multi.log" | tr '\n' ' ')"
  grep -E '^\[  (FAILED|SKIPPED) ' "$out/test_cuda_multi.log" | head -30
  echo "=== test_ops DevicesFlag (trisolved --devices 0,0 on a GPU)"
  TRISOLVED_BIN=$PWD/.gpu/bin/trisolved TRISOLVE_CLI_BIN=$PWD/.gpu/bin/trisolve \
    $run test_ops --gtest_filter=Ops.DevicesFlag >"$out/test_ops_devices.log" 2>&1
  echo "test_ops DevicesFlag: exit $? $(grep -E '^\[  (PASSED|FAILED)  \]' "$out/test_ops_devices.log" | tr '\n' ' ')"
fi

if want backend; then
  echo "=== the backend alone: many threads, device 0 against 0..D-1"
  $run bench_multi_device --clients "$(echo ${CLIENTS:-16 64} | tr ' ' ,)" \
    ${DEVICES:+--devices "$(echo $DEVICES | tr ' ' ,)"} 2>&1 | tee "$out/bench_multi_device.log"
fi

start() {  # start PORT DEVICES: a server in the background, waits until it serves
  $run trisolved --backend cuda --listen "127.0.0.1:$1" --devices "$2" --max-queued-jobs 4096 \
    --max-message-bytes 1073741824 --max-systems-per-identity 4096 \
    --max-system-bytes $((64 << 30)) \
    >"$out/trisolved_$1.log" 2>&1 &
  srv=$!
  for _ in $(seq 300); do
    $run trisolve --server "127.0.0.1:$1" --timeout 1 health >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  echo "trisolved --devices $2 did not start:"; tail -5 "$out/trisolved_$1.log"; return 1
}

if want bench; then
  counts=${DEVICES:-}
  if [ -z "$counts" ]; then
    counts=1
    for ((d = 2; d <= gpus; d *= 2)); do counts="$counts $d"; done
    [[ " $counts " == *" $gpus "* ]] || counts="$counts $gpus"
  fi
  results="$out/multi_bench.jsonl"
  : >"$results"
  port=50170
  for d in $counts; do
    list=$(seq -s, 0 $((d - 1)))
    echo "=== $d device(s): --devices $list"
    port=$((port + 1))
    start $port "$list" || continue
    $run trisolve --server 127.0.0.1:$port info | tee -a "$out/info_$d.txt"
    # Shapes: 256 x 1024 (2 MiB a right-hand side) and 2048 x 1024 (16 MiB), float64; above
    # --gpu-min-unknowns, so every solve runs on a GPU.
    for shape in ${SHAPES:-256x1024 2048x1024}; do
      set -- ${shape/x/ }
      for t in ${TRANSPORTS:-auto}; do
      for c in ${CLIENTS:-16 64}; do
        for mode in ${MODES:-handle unary}; do
          r=$(( $1 * $2 >= 1 << 21 ? 20 : 100 ))
          [ $mode = unary ] && r=$((r / 2))
          line=$($run trisolve --server 127.0.0.1:$port bench --clients $c --requests $r \
                   --batch $1 --n $2 --mode $mode --transport $t --json |
                 tee -a "$out/bench_$d.log" | grep '^{')
          if [ -z "$line" ]; then
            echo "bench $mode $t $1x$2 $c clients, $d devices: no result (bench_$d.log)"; continue
          fi
          echo "{\"devices\":$d,${line#\{}" | tee -a "$results"
        done
      done
      done
    done
    $run trisolve --server 127.0.0.1:$port info >>"$out/info_$d.txt"
    tail -3 "$out/trisolved_$port.log"
    kill $srv; wait $srv
  done

  echo "=== scaling: requests/s with D devices / (D x requests/s with 1)"
  printf '%-8s %-6s %-11s %8s %8s %12s %8s\n' mode path shape clients devices requests/s scaling | tee "$out/scaling.txt"
  # One JSON object a line, flat: fields picked by name with sed (no jq or python needed there).
  field() { sed -n "s/.*\"$1\":\"\{0,1\}\([^,\"}]*\).*/\1/p" <<<"$2"; }
  declare -A base
  while read -r l; do
    [ -z "$l" ] && continue
    key="$(field mode "$l") $(field transport "$l") $(field batch "$l")x$(field n "$l") $(field clients "$l")"
    d=$(field devices "$l"); rps=$(field requests_per_s "$l")
    [ "$d" = 1 ] && base[$key]=$rps
    b=${base[$key]:-}
    s=$([ -n "$b" ] && awk -v r="$rps" -v b="$b" -v d="$d" 'BEGIN{printf "%.2f", r / (d * b)}' || echo -)
    printf '%-8s %-6s %-11s %8s %8s %12s %8s\n' $key "$d" "$rps" "$s" | tee -a "$out/scaling.txt"
  done <"$results"
fi
echo "=== done"
