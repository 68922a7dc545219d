#!/usr/bin/env bash
# Session 34, issue 38: many clients over 1, 2, 4 devices with sampled checks, two slot counts.
set -u
[ -d .gpu ] || tar -xJf .gpu.tar.xz
nproc; free -g | head -2; df -h /dev/shm | tail -1
run_one() {  # name, env...
  local name=$1; shift
  echo "######## $name"
  env "$@" OUT=$OUT/$name PARTS=bench DEVICES="1 2 4" CLIENTS=64 MODES="handle unary" \
    BENCH_TIMEOUT=60 bash tests/bench/run_multi_gpu.sh 2>&1 | grep -E "^===|scaling|^(tridiagonal|block) |did not|no result" 
}
T0=$(date +%s)
run_one tri-small FAMILIES=tridiagonal SHAPES=256x1024 TRANSPORTS=shm-ring REQUESTS=400 CHECK_EVERY=16
run_one tri-large FAMILIES=tridiagonal SHAPES=2048x1024 TRANSPORTS=shm-ring REQUESTS=60 CHECK_EVERY=16
echo "elapsed $(( $(date +%s) - T0 )) s"
run_one block FAMILIES=block BLOCK_SHAPES="512x512 1024x1024" TRANSPORTS=shm REQUESTS=30 CHECK_EVERY=8
echo "elapsed $(( $(date +%s) - T0 )) s"
if [ $(( $(date +%s) - T0 )) -lt 300 ]; then
  run_one block-slots4 FAMILIES=block BLOCK_SHAPES="512x512" TRANSPORTS=shm REQUESTS=30 CHECK_EVERY=8 SLOTS=4
  run_one tri-large-slots4 FAMILIES=tridiagonal SHAPES=2048x1024 TRANSPORTS=shm-ring REQUESTS=60 CHECK_EVERY=16 SLOTS=4
fi
echo "elapsed $(( $(date +%s) - T0 )) s"
cd $OUT && tar -czf /tmp/x4.tgz . && mv /tmp/x4.tgz $OUT/x4.tgz
