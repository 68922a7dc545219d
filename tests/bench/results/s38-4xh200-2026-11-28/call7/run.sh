#!/usr/bin/env bash
set -u
R=$OUT/r; mkdir -p $R
trap 'cd $OUT && tar -czf x.tgz r && rm -rf r' EXIT
tar -xJf .gpu.tar.xz
nvidia-smi --query-gpu=index,pci.bus_id,clocks.max.sm,power.limit --format=csv
for list in 0,1,2,3 1,2,3,0 3,2,1,0; do
  port=$((50400 + RANDOM % 100))
  .gpu/run trisolved --backend cuda --listen 127.0.0.1:$port --devices $list --max-queued-jobs 4096 \
    --max-message-bytes 1073741824 --max-regions-per-identity 4096 > $R/srv-$list.log 2>&1 &
  p=$!
  for _ in $(seq 100); do .gpu/run trisolve --server 127.0.0.1:$port --timeout 1 health >/dev/null 2>&1 && break; sleep 0.1; done
  .gpu/run trisolve --server 127.0.0.1:$port bench --family block --N 1024 --M 1024 --mode unary --transport shm \
     --clients 64 --requests 10 --check-every 8 > $R/bench-$list.log 2>&1
  echo "--devices $list: $(grep -h 'trisolve  ' $R/bench-$list.log)"
  .gpu/run trisolve --server 127.0.0.1:$port info | grep device: 
  kill $p; wait $p
done
