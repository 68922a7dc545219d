#!/usr/bin/env bash
# The serving side on the lent GPU machine, in one call: the GPU suites, the end-to-end suites
# against `trisolved --backend cuda`, and `trisolve bench` (every answer checked, one local core
# beside it) for small and large requests, unary, by handle and streamed.
#   here:   ../shared/gpu/bundle.sh .gpu build/server/trisolved build/client/trisolve \
#               build/tests/test_cuda_tridiagonal build/tests/test_cuda_block \
#               build/tests/test_cuda_tree build/tests/test_cuda_dense \
#               build/tests/test_systems build/tests/test_service build/tests/test_memory
#           strip .gpu/bin/*; tar -cf - .gpu | xz -9 -T2 > .gpu.tar.xz
#   there:  bash tests/bench/run_serving_gpu.sh        (logs under $OUT)
# PARTS picks what runs (default all): tests e2e small large shm cpu.
set -uo pipefail
out=${OUT:-/tmp/trisolve-serving}
mkdir -p "$out"
[ -d .gpu ] || tar -xJf .gpu.tar.xz
parts=" ${PARTS:-tests e2e small large shm cpu} "
want() { [[ $parts == *" $1 "* ]]; }
run=.gpu/run
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/device.txt"
date -u +%Y-%m-%dT%H:%MZ | tee -a "$out/device.txt"

if want tests; then
  echo "=== GPU suites"
  for t in test_cuda_tridiagonal test_cuda_block test_cuda_tree test_cuda_dense; do
    $run $t --gtest_brief=1 >"$out/$t.log" 2>&1
    echo "$t: exit $? $(grep -E '^\[  (PASSED|FAILED)  \]' "$out/$t.log" | tr '\n' ' ')"
    grep -E '^\[  FAILED  \]' "$out/$t.log" | head -20
  done
fi

if want e2e; then
  echo "=== end-to-end suites behind trisolved --backend cuda"
  for t in test_systems test_service test_memory; do
    TRISOLVE_TEST_BACKEND=cuda TRISOLVED_BIN=$PWD/.gpu/bin/trisolved \
      TRISOLVE_CLI_BIN=$PWD/.gpu/bin/trisolve $run $t --gtest_brief=1 >"$out/${t}_cuda.log" 2>&1
    echo "$t (cuda): exit $? $(grep -E '^\[  (PASSED|FAILED)  \]' "$out/${t}_cuda.log" | tr '\n' ' ')"
    grep -E '^\[  FAILED  \]' "$out/${t}_cuda.log" | head -20
  done
fi

bench() { $run trisolve --server "$1" bench "${@:2}" --json; }
start() {  # start BACKEND PORT [flags]: a server in the background, waits until it serves
  $run trisolved --backend "$1" --listen "127.0.0.1:$2" "${@:3}" >"$out/trisolved_$1_$2.log" 2>&1 &
  srv=$!
  for _ in $(seq 200); do $run trisolve --server "127.0.0.1:$2" --timeout 1 health >/dev/null 2>&1 && return; sleep 0.1; done
}

if want small; then
  echo "=== small requests (one system of n = 64), cuda backend"
  start cuda 50161 --max-systems-per-identity 1024
  for c in 1 16 64 256; do
    r=$((c == 1 ? 3000 : (c <= 16 ? 1000 : (c <= 64 ? 400 : 100))))
    bench 127.0.0.1:50161 --clients $c --requests $r --n 64 --mode unary | tee -a "$out/small_cuda.log"
    bench 127.0.0.1:50161 --clients $c --requests $r --n 64 --mode handle | tee -a "$out/small_cuda.log"
  done
  bench 127.0.0.1:50161 --clients 1 --requests 3000 --n 64 --mode stream | tee -a "$out/small_cuda.log"
  bench 127.0.0.1:50161 --clients 8 --requests 200 --batch 1000 --n 64 --mode unary | tee -a "$out/small_cuda.log"
  bench 127.0.0.1:50161 --clients 8 --requests 200 --batch 1000 --n 64 --mode handle | tee -a "$out/small_cuda.log"
  kill $srv; wait $srv
fi

if want large; then
  echo "=== large requests, cuda backend"
  start cuda 50162 --max-message-bytes 1073741824
  # 2^24 unknowns: the whole system each time, then by handle (right-hand side only), over
  # the socket (grpc), through the client's staging region (auto) and zero-copy (shm).
  for tr in grpc streams auto shm; do
    rq=$(case $tr in grpc) echo 3;; streams) echo 6;; *) echo 20;; esac)
    bench 127.0.0.1:50162 --transport $tr --clients 1 --requests $rq --batch 65536 --n 256 --mode unary | tee -a "$out/large_cuda.log"
    bench 127.0.0.1:50162 --transport $tr --clients 1 --requests $((rq * 2)) --batch 65536 --n 256 --mode handle | tee -a "$out/large_cuda.log"
    bench 127.0.0.1:50162 --transport $tr --clients 1 --requests $rq --batch 64 --n 65536 --mode unary | tee -a "$out/large_cuda.log"
    bench 127.0.0.1:50162 --transport $tr --clients 4 --requests $rq --batch 65536 --n 64 --mode handle | tee -a "$out/large_cuda.log"
  done
  tail -5 "$out/trisolved_cuda_50162.log"
  kill $srv; wait $srv
fi

if want shm; then
  echo "=== small requests through shared memory (one system of n = 64), cuda backend"
  start cuda 50164 --max-systems-per-identity 1024
  for c in 1 16 64; do
    r=$((c == 1 ? 3000 : (c <= 16 ? 1000 : 400)))
    for m in unary handle; do
      bench 127.0.0.1:50164 --transport shm --clients $c --requests $r --n 64 --mode $m | tee -a "$out/shm_small_cuda.log"
    done
  done
  bench 127.0.0.1:50164 --transport shm --clients 1 --requests 3000 --n 64 --mode stream | tee -a "$out/shm_small_cuda.log"
  kill $srv; wait $srv
fi

if want cpu; then
  echo "=== small requests, cpu backend (16 cores)"
  start cpu 50163
  for c in 1 16 64 256; do
    r=$((c == 1 ? 3000 : (c <= 16 ? 1000 : (c <= 64 ? 400 : 100))))
    bench 127.0.0.1:50163 --clients $c --requests $r --n 64 --mode unary | tee -a "$out/small_cpu.log"
  done
  kill $srv; wait $srv
fi
echo "=== done"
