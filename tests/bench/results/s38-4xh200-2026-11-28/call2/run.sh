#!/usr/bin/env bash
set -u
R=$OUT/r; mkdir -p $R
trap 'cd $OUT && tar -czf x.tgz r && rm -rf r' EXIT
[ -d .gpu ] || tar -xJf .gpu.tar.xz
echo "block $(date -u +%T)"
OUT=$R/block PARTS=bench FAMILIES=block BLOCK_SHAPES="512x512 1024x1024" CLIENTS=64 \
  MODES="handle unary" DEVICES="1 2 4" CHECK_EVERY=8 BENCH_TIMEOUT=60 timeout 330 \
  bash tests/bench/run_multi_gpu.sh > $R/block.txt 2>&1
sed -n '/=== scaling/,$p' $R/block.txt
echo "dense $(date -u +%T)"
for cfg in yield block; do
  f=""; [ $cfg = block ] && f="--device-wait block"
  OUT=$R/dense-$cfg SERVER_FLAGS="$f" PARTS=bench FAMILIES=dense DENSE_SHAPES="64x256 16x1024" CLIENTS=64 \
    MODES=handle DEVICES="1 2 4" CHECK_EVERY=8 BENCH_TIMEOUT=45 timeout 110 \
    bash tests/bench/run_multi_gpu.sh > $R/dense-$cfg.txt 2>&1
  sed -n '/=== scaling/,$p' $R/dense-$cfg.txt
  echo "$cfg $(date -u +%T)"
done
