#!/usr/bin/env bash
# Session 39, call 2 (4 x H200): first against rotate, five each, 48 requests a client.
set -u
R=$OUT/r; mkdir -p $R
trap 'cd $OUT && tar -czf x.tgz r && rm -rf r' EXIT
tar -xJf .gpu.tar.xz
echo "start $(date -u +%T) $(nproc) cores"

i=0
for order in first rotate first rotate first rotate first rotate first rotate; do
  i=$((i+1)); port=$((50500 + i))
  env $( [ $order != first ] && echo TRISOLVE_EXPERIMENT_PIN_ORDER=$order ) .gpu/run trisolved --backend cuda \
    --listen 127.0.0.1:$port --devices 0,1,2,3 --max-queued-jobs 4096 \
    --max-message-bytes 1073741824 --max-regions-per-identity 4096 > $R/srv-$i.log 2>&1 &
  p=$!
  for _ in $(seq 100); do .gpu/run trisolve --server 127.0.0.1:$port --timeout 1 health >/dev/null 2>&1 && break; sleep 0.1; done
  .gpu/run trisolve --server 127.0.0.1:$port bench --family block --N 1024 --M 1024 --mode unary --transport shm \
     --clients 64 --requests 48 --check-every 8 > $R/bench-$i.log 2>&1
  .gpu/run trisolve --server 127.0.0.1:$port info > $R/info-$i.txt 2>&1
  echo "$i pin=$order: $(grep -h 'trisolve  ' $R/bench-$i.log | awk '{print $2" /s"}') $(date -u +%T)"
  grep '^device:' $R/info-$i.txt | sed 's/^device: *\(cuda:[0-9]\).*; \([0-9]*\) jobs, [0-9]* running; \(.*\))$/  \1 \2 jobs \3/'
  kill $p; wait $p
done
echo "end $(date -u +%T)"
