#!/usr/bin/env bash
# Session 34, issue 38, round 2: placement by held bytes; many clients over 1, 2, 4 devices.
set -u
[ -d .gpu ] || tar -xJf .gpu.tar.xz
nproc
run_one() {  # name, env...
  local name=$1; shift
  echo "######## $name"
  env "$@" OUT=$OUT/$name DEVICES="1 2 4" CLIENTS=64 MODES="handle unary" \
    BENCH_TIMEOUT=60 bash tests/bench/run_multi_gpu.sh 2>&1 | grep -E "^===|^test_|scaling|^(tridiagonal|block) |did not|no result|FAILED"
}
T0=$(date +%s)
run_one block PARTS="tests bench" FAMILIES=block BLOCK_SHAPES="512x512 1024x1024" TRANSPORTS=shm REQUESTS=30 CHECK_EVERY=8
echo "elapsed $(( $(date +%s) - T0 )) s"
run_one tri-small PARTS=bench FAMILIES=tridiagonal SHAPES=256x1024 TRANSPORTS=shm-ring REQUESTS=400 CHECK_EVERY=16
run_one tri-large PARTS=bench FAMILIES=tridiagonal SHAPES=2048x1024 TRANSPORTS=shm-ring REQUESTS=60 CHECK_EVERY=16
echo "elapsed $(( $(date +%s) - T0 )) s"
grep -h "error\|answers:" $OUT/tri-*/bench_*.log | sort | uniq -c | sort -rn | head -20
cd $OUT && tar -czf /tmp/x4.tgz . && mv /tmp/x4.tgz $OUT/x4.tgz
