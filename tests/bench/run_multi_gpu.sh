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
# GPU_DIR: the bundle's folder (default .gpu; unpacked from GPU_DIR.tar.xz where absent).
# PARTS picks what runs (default all): tests backend bench. DEVICES: the device counts to compare
# (default 1 and every count up to the GPUs present, doubling). CLIENTS: default "16 64".
# TRANSPORTS: the bench's data paths (default "auto"; "shm" keeps each client's arrays in
# registered shared memory, so the host copies nothing and the devices' links are what is
# measured). MODES: default "handle unary". FAMILIES: default "tridiagonal block"; "dense" adds
# the dense family.
# tridiagonal: SHAPES "BATCHxN ..." (default "256x1024 2048x1024"): ~0.2 ms of a device a
# request, bound by the host's memory (the copies, the clients' checks). block: BLOCK_SHAPES
# "NxM ..." (default "512x512 1024x1024"), the thesis' experiment 2 solved to TOL (default 1e-8)
# by METHOD (default auto: multigrid-cg): ~11 iterations of a V-cycle on the device for the two
# arrays of 2 or 8 MiB a request moves by handle, work the devices rather than the host should
# bound. dense: DENSE_SHAPES "BATCHxN ..." (default "64x256 16x1024"): diagonally dominant
# float64 matrices, LU on the device (auto, n > 64; --gpu-min-unknowns applies to tridiagonal
# and tree requests only). By handle a request sends b and reads the kept factors (32 or
# 128 MiB, tens of microseconds of an H100's memory) for two triangular sweeps of each matrix of
# order 256 or 1024: ~0.1-1 ms a request (an estimate, not yet measured through the server),
# small enough that many clients keep several devices busy, with only b and x (128 KiB each at
# both shapes) to copy, so that the devices rather than the host's memory should bound it. Unary
# adds the factorisation (0.7 or 11.5 GFLOP, by the dense tables' rates ~0.3 ms and a few ms)
# and 32 or 128 MiB of A copied in: the unary rows measure the copies as much as the devices.
# Each client's expected answers are computed by the CPU reference before the clock, and the
# local core's unary time is one factorisation on one thread (seconds at 16 x 1024).
# REQUESTS: requests a client (default: by size, halved for unary).
# CHECK_EVERY: the values of each client's first answer and every K-th after it are checked, the
# statuses of all (default 1: every answer; the clients share the server's host, and at many
# clients of large requests their checks' memory traffic bounds what the node measures).
# SLOTS: jobs solved at once a device (--max-concurrent-jobs SLOTS x D; default the server's, 4
# a CUDA device). SERVER_FLAGS: more trisolved flags (e.g. "--streams 8").
# BACKEND: the server's (default cuda; cpu runs the script here, to try it). SERVER_CPUS,
# CLIENT_CPUS: taskset CPU lists for the server and the bench's clients (e.g. "0-15" and
# "16-31"), so that the clients' threads do not take the server's cores.
# The bench prints the cores its clients, the server and the whole host kept busy during its
# clock ("client_cores", "server_cores", "host_cores"): where the host's cores are all busy, the
# host bounds what is measured.
# After each bench the jobs each device ran during it (GetServerInfo before and after) are
# printed and kept in the JSON line ("device_jobs": "J0/J1/..."): by handle they show how the
# clients' systems were spread over the devices.
# The tridiagonal rows by handle are set beside their roofline: bench_multi_device --mode copies
# (where the bundle has it) moves what such a request moves -- the right-hand side in and x out,
# page-locked, a stream a client -- with no solve and no server, at the same shapes, clients and
# device counts; "of links" is the server's requests/s over those copies' calls/s. The copies'
# own scaling is what the host's memory and links allow the server's.
set -uo pipefail
out=${OUT:-/tmp/trisolve-multi}
mkdir -p "$out"
gpu=${GPU_DIR:-.gpu}  # the bundle (bundle.sh's OUT_DIR)
[ -d "$gpu" ] || tar -xJf "$gpu.tar.xz"
parts=" ${PARTS:-tests backend bench} "
want() { [[ $parts == *" $1 "* ]]; }
run=$gpu/run
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
  TRISOLVED_BIN=$PWD/$gpu/bin/trisolved TRISOLVE_CLI_BIN=$PWD/$gpu/bin/trisolve \
    $run test_ops --gtest_filter=Ops.DevicesFlag >"$out/test_ops_devices.log" 2>&1
  echo "test_ops DevicesFlag: exit $? $(grep -E '^\[  (PASSED|FAILED)  \]' "$out/test_ops_devices.log" | tr '\n' ' ')"
fi

if want backend; then
  echo "=== the backend alone: many threads, device 0 against 0..D-1"
  $run bench_multi_device --clients "$(echo ${CLIENTS:-16 64} | tr ' ' ,)" \
    ${DEVICES:+--devices "$(echo $DEVICES | tr ' ' ,)"} 2>&1 | tee "$out/bench_multi_device.log"
fi

# The jobs each device has run (GetServerInfo), "J0 J1 ..." by ordinal; and the difference of
# two such readings as "J0/J1/..." (empty where the server counts none: one device, or CPU).
device_jobs() {
  $run trisolve --server "127.0.0.1:$1" info 2>/dev/null |
    sed -n 's/^device: *cuda:\([0-9]*\) .*; \([0-9]*\) jobs,.*/\2/p' | tr '\n' ' '
}
job_split() {
  local -a a=($1) b=($2); local s="" i
  for i in "${!b[@]}"; do s="$s${s:+/}$(( b[i] - ${a[i]:-0} ))"; done
  echo "${s:--}"
}

pin() { [ -n "$1" ] && echo "taskset -c $1"; }

start() {  # start PORT DEVICES [SLOTS]: a server in the background, waits until it serves
  $(pin "${SERVER_CPUS:-}") $run trisolved --backend "${BACKEND:-cuda}" --listen "127.0.0.1:$1" \
    --devices "$2" --max-queued-jobs 4096 \
    --max-message-bytes 1073741824 --max-systems-per-identity 4096 --max-regions-per-identity 4096 \
    --max-system-bytes $((64 << 30)) ${3:+--max-concurrent-jobs $3} ${SERVER_FLAGS:-} \
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
    [ "$gpus" -lt 2 ] || [[ " $counts " == *" $gpus "* ]] || counts="$counts $gpus"
  fi
  results="$out/multi_bench.jsonl"
  : >"$results"
  port=50170
  for d in $counts; do
    list=$(seq -s, 0 $((d - 1)))
    echo "=== $d device(s): --devices $list"
    port=$((port + 1))
    start $port "$list" ${SLOTS:+$((SLOTS * d))} || continue
    $run trisolve --server 127.0.0.1:$port info | tee -a "$out/info_$d.txt"
    for family in ${FAMILIES:-tridiagonal block}; do
    # tridiagonal: 256 x 1024 (2 MiB a right-hand side) and 2048 x 1024 (16 MiB), float64; above
    # --gpu-min-unknowns, so every solve runs on a GPU. block: 512 x 512 (2 MiB) and 1024 x 1024
    # (8 MiB), every solve on a GPU.
    if [ "$family" = block ]; then shapes=${BLOCK_SHAPES:-512x512 1024x1024}
    elif [ "$family" = dense ]; then shapes=${DENSE_SHAPES:-64x256 16x1024}
    else shapes=${SHAPES:-256x1024 2048x1024}; fi
    for shape in $shapes; do
      set -- ${shape/x/ }
      if [ "$family" = block ]; then
        size=(--family block --N $1 --M $2 --tol "${TOL:-1e-8}" --method "${METHOD:-auto}")
        r=$(( $1 * $2 >= 1 << 20 ? 20 : 50 ))
      elif [ "$family" = dense ]; then
        size=(--family dense --batch $1 --n $2)
        r=$(( $1 * $2 * $2 >= 1 << 24 ? 20 : 50 ))
      else
        size=(--batch $1 --n $2)
        r=$(( $1 * $2 >= 1 << 21 ? 20 : 100 ))
      fi
      for t in ${TRANSPORTS:-auto}; do
      for c in ${CLIENTS:-16 64}; do
        for mode in ${MODES:-handle unary}; do
          rq=${REQUESTS:-$r}
          [ $mode = unary ] && [ -z "${REQUESTS:-}" ] && rq=$((r / 2))
          before=$(device_jobs $port)
          # A bench that hangs must not take the whole call: BENCH_TIMEOUT seconds (default 150).
          line=$(timeout "${BENCH_TIMEOUT:-150}" $(pin "${CLIENT_CPUS:-}") $run trisolve \
                   --server 127.0.0.1:$port bench \
                   --clients $c --requests $rq \
                   "${size[@]}" --mode $mode --transport $t --json \
                   ${CHECK_EVERY:+--check-every $CHECK_EVERY} |
                 tee -a "$out/bench_$d.log" | grep '^{')
          split=$(job_split "$before" "$(device_jobs $port)")
          echo "  jobs per device during it: $split" | tee -a "$out/bench_$d.log"
          if [ -z "$line" ]; then
            echo "bench $family $mode $t $shape $c clients, $d devices: no result (bench_$d.log)"
            continue
          fi
          echo "{\"devices\":$d,\"device_jobs\":\"$split\",${line#\{}" | tee -a "$results"
        done
      done
      done
    done
    done
    $run trisolve --server 127.0.0.1:$port info >>"$out/info_$d.txt"
    tail -3 "$out/trisolved_$port.log"
    kill $srv; wait $srv
  done

  # The roofline of tridiagonal requests by handle: their copies alone (see the header).
  declare -A links
  if [[ " ${FAMILIES:-tridiagonal block} " == *" tridiagonal "* ]] && [ -x "$gpu/bin/bench_multi_device" ]; then
    echo "=== the copies alone of a request by handle (d in, x out, page-locked; no solve)"
    $run bench_multi_device --mode copies --shapes "$(echo ${SHAPES:-256x1024 2048x1024} | tr ' ' ,)" \
      --clients "$(echo ${CLIENTS:-16 64} | tr ' ' ,)" --devices "$(echo $counts | tr ' ' ,)" \
      2>&1 | tee "$out/links.txt"
    while read -r m sh c d rate _; do
      [ "$m" = copies ] && links["$sh $c $d"]=$rate
    done <"$out/links.txt"
  fi

  echo "=== scaling: requests/s with D devices / (D x requests/s with 1); jobs: each device's;"
  echo "    of links: requests/s over the same requests' copies alone (tridiagonal by handle);"
  echo "    cores: those busy during the bench, the host's / the server's / the clients' (of $(nproc))"
  printf '%-11s %-8s %-6s %-11s %8s %8s %12s %8s %8s %14s  %s\n' family mode path shape clients \
    devices requests/s scaling "of links" cores jobs | tee "$out/scaling.txt"
  # One JSON object a line, flat: fields picked by name with sed (no jq or python needed there).
  field() { sed -n "s/.*\"$1\":\"\{0,1\}\([^,\"}]*\).*/\1/p" <<<"$2"; }
  declare -A base
  while read -r l; do
    [ -z "$l" ] && continue
    key="$(field family "$l") $(field mode "$l") $(field transport "$l") $(field shape "$l") $(field clients "$l")"
    d=$(field devices "$l"); rps=$(field requests_per_s "$l")
    [ "$d" = 1 ] && base[$key]=$rps
    b=${base[$key]:-}
    s=$([ -n "$b" ] && awk -v r="$rps" -v b="$b" -v d="$d" 'BEGIN{printf "%.2f", r / (d * b)}' || echo -)
    # The devices' shares of the jobs: the least over the most (1.00: even).
    jobs=$(field device_jobs "$l")
    even=$(awk -v j="$jobs" 'BEGIN{n=split(j,v,"/"); if (n<2) exit; lo=hi=v[1];
      for(i=2;i<=n;i++){if(v[i]<lo)lo=v[i]; if(v[i]>hi)hi=v[i]}
      printf " (least/most %.2f)", (hi > 0 ? lo / hi : 0)}')
    fam=$(field family "$l"); md=$(field mode "$l"); sh=$(field shape "$l"); c=$(field clients "$l")
    lk=${links["$sh $c $d"]:-}
    of=-
    [ "$fam $md" = "tridiagonal handle" ] && [ -n "$lk" ] &&
      of=$(awk -v r="$rps" -v k="$lk" 'BEGIN{printf "%.2f", r / k}')
    cores="$(field host_cores "$l")/$(field server_cores "$l")/$(field client_cores "$l")"
    printf '%-11s %-8s %-6s %-11s %8s %8s %12s %8s %8s %14s  %s\n' $key "$d" "$rps" "$s" "$of" \
      "$cores" "$jobs$even" | tee -a "$out/scaling.txt"
  done <"$results"
fi
echo "=== done"
