#!/usr/bin/env bash
set -u
R=$OUT/r; mkdir -p $R
trap 'cd $OUT && tar -czf x.tgz r && rm -rf r' EXIT
[ -d .gpu ] || tar -xJf .gpu.tar.xz
# 1. auto now takes the ring for dense by handle (b + x = 256 KiB + statuses)
echo "=== auto $(date -u +%T)"
OUT=$R/auto PARTS=bench FAMILIES=dense DENSE_SHAPES="64x256 16x1024" CLIENTS=64 \
  MODES="handle unary" DEVICES="1 4" CHECK_EVERY=8 BENCH_TIMEOUT=45 timeout 150 \
  bash tests/bench/run_multi_gpu.sh > $R/auto.txt 2>&1
sed -n '/^family/,$p' $R/auto.txt
grep -h "over auto\|server, mean\|client, mean" $R/auto/bench_*.log | head -20
grep -c "closed (by its client)" $R/auto/trisolved_*.log
# 2. gRPC's completion queues and pollers: dense by handle over grpc at 4 devices, and the floor
for q in "1 2" "4 2" "16 2" "16 4"; do
  set -- $q
  echo "=== grpc cqs $1 pollers $2 $(date -u +%T)"
  OUT=$R/grpc-$1-$2 SERVER_FLAGS="--grpc-completion-queues $1 --grpc-pollers $2" TRANSPORTS=grpc \
    PARTS=bench FAMILIES=dense DENSE_SHAPES="64x256" CLIENTS=64 MODES=handle DEVICES="4" CHECK_EVERY=8 \
    BENCH_TIMEOUT=45 timeout 80 bash tests/bench/run_multi_gpu.sh > $R/grpc-$1-$2.txt 2>&1
  sed -n '/^family/,$p' $R/grpc-$1-$2.txt | tail -1
  grep -h "server, mean\|client, mean" $R/grpc-$1-$2/bench_*.log
  .gpu/run trisolved --listen 127.0.0.1:50300 --grpc-completion-queues $1 --grpc-pollers $2 > $R/floor-$1-$2.log 2>&1 &
  p=$!; sleep 3
  for c in 1 64; do
    .gpu/run trisolve --server 127.0.0.1:50300 bench --mode info --clients $c --requests 2000 --transport grpc | grep -E "trisolve  " | sed "s/^/info $c clients: /"
  done
  kill $p; wait $p
done
echo "end $(date -u +%T)"
