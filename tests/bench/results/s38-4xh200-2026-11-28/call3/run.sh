#!/usr/bin/env bash
set -u
R=$OUT/r; mkdir -p $R
trap 'cd $OUT && tar -czf x.tgz r && rm -rf r' EXIT
[ -d .gpu ] || tar -xJf .gpu.tar.xz
for cfg in grpc ring ring-t0; do
  t=$cfg; f=""; [ $cfg = ring-t0 ] && { t=ring; f="--ring-threads 0"; }
  echo "=== $cfg $(date -u +%T)"
  OUT=$R/$cfg SERVER_FLAGS="$f" TRANSPORTS=$t PARTS=bench FAMILIES=dense DENSE_SHAPES="64x256 16x1024" CLIENTS=64 \
    MODES=handle DEVICES="1 4" CHECK_EVERY=8 BENCH_TIMEOUT=45 timeout 150 \
    bash tests/bench/run_multi_gpu.sh > $R/$cfg.txt 2>&1
  sed -n '/^family/,$p' $R/$cfg.txt
  grep -h "server, mean\|client, mean" $R/$cfg/bench_*.log
done
echo "end $(date -u +%T)"
