#!/usr/bin/env bash
set -u
R=$OUT/r; mkdir -p $R
trap 'cd $OUT && tar -czf x.tgz r && rm -rf r' EXIT
tar -xJf .gpu.tar.xz
echo "start $(date -u +%T) $(nproc) cores"
OUT=$R/tests PARTS=tests timeout 150 bash tests/bench/run_multi_gpu.sh 2>&1 | tail -8
echo "tri $(date -u +%T)"
OUT=$R/tri PARTS=bench FAMILIES=tridiagonal TRANSPORTS=shm-ring SHAPES="256x1024 2048x1024" CLIENTS=64 \
  MODES="handle unary" DEVICES="1 2 4" CHECK_EVERY=16 BENCH_TIMEOUT=60 timeout 400 \
  bash tests/bench/run_multi_gpu.sh > $R/tri.txt 2>&1
sed -n '/=== scaling/,$p' $R/tri.txt
grep -h "cores busy" $R/tri/bench_*.log
echo "end $(date -u +%T)"
