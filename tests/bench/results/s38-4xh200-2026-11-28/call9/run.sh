#!/usr/bin/env bash
set -u
R=$OUT/r; mkdir -p $R
trap 'cd $OUT && tar -czf x.tgz r && rm -rf r' EXIT
tar -xJf .gpu.tar.xz
i=0
for ms in 10 100000000 10 100000000; do
  i=$((i+1)); port=$((50500 + i))
  TRISOLVE_EXPERIMENT_REFRESH_MS=$ms .gpu/run trisolved --backend cuda --listen 127.0.0.1:$port --devices 0,1,2,3 --max-queued-jobs 4096 \
    --max-message-bytes 1073741824 --max-regions-per-identity 4096 > $R/srv-$i.log 2>&1 &
  p=$!
  for _ in $(seq 100); do .gpu/run trisolve --server 127.0.0.1:$port --timeout 1 health >/dev/null 2>&1 && break; sleep 0.1; done
  .gpu/run trisolve --server 127.0.0.1:$port bench --family block --N 1024 --M 1024 --mode unary --transport shm \
     --clients 64 --requests 12 --check-every 8 > $R/bench-$i.log 2>&1
  echo "refresh $ms ms: $(grep -h 'trisolve  ' $R/bench-$i.log | awk '{print $2" /s"}') jobs: $(.gpu/run trisolve --server 127.0.0.1:$port info | grep '^device:' | sed 's/.*\(cuda:[0-9]\).*; \([0-9]*\) jobs.*/\2/' | tr '\n' ' ')"
  kill $p; wait $p
done
