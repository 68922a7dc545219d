#!/usr/bin/env bash
set -u
R=$OUT/r; mkdir -p $R
trap 'cd $OUT && tar -czf x.tgz r && rm -rf r' EXIT
tar -xJf .gpu.tar.xz
echo "start $(date -u +%T)"
OUT=$R/block1024 PARTS=bench FAMILIES=block BLOCK_SHAPES="1024x1024" TRANSPORTS="auto shm" CLIENTS=64 \
  MODES="unary" DEVICES="1 4" CHECK_EVERY=8 BENCH_TIMEOUT=60 timeout 300 \
  bash tests/bench/run_multi_gpu.sh > $R/block1024.txt 2>&1
sed -n '/^family/,$p' $R/block1024.txt
grep -h "over \|server, mean\|client, mean\|cores busy" $R/block1024/bench_*.log
echo "end $(date -u +%T)"
