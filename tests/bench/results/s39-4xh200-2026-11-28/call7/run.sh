#!/usr/bin/env bash
# Session 39, call 7 (4 x H200): registration through a context of its own.
set -u
R=$OUT/r; mkdir -p $R
trap 'cd $OUT && tar -czf x.tgz r && rm -rf r' EXIT
tar -xJf .gpu.tar.xz
echo "start $(date -u +%T) $(nproc) cores"
OUT=$R/tests PARTS=tests timeout 200 bash tests/bench/run_multi_gpu.sh 2>&1 | tail -6
grep -E "RegisteredMemory" $R/tests/test_cuda_multi.log | head -8
echo "=== bench_registration $(date -u +%T)"
timeout 120 .gpu/run bench_registration --clients 16 --seconds 3 --rounds 2 2>&1 | tee $R/bench_registration.txt
for i in 1 2 3 4; do
  port=$((50500 + i))
  .gpu/run trisolved --backend cuda --listen 127.0.0.1:$port --devices 0,1,2,3 --max-queued-jobs 4096 \
    --max-message-bytes 1073741824 --max-regions-per-identity 4096 > $R/srv-$i.log 2>&1 &
  p=$!
  for _ in $(seq 100); do .gpu/run trisolve --server 127.0.0.1:$port --timeout 1 health >/dev/null 2>&1 && break; sleep 0.1; done
  .gpu/run trisolve --server 127.0.0.1:$port bench --family block --N 1024 --M 1024 --mode unary --transport shm \
     --clients 64 --requests 48 --check-every 8 > $R/bench-$i.log 2>&1
  .gpu/run trisolve --server 127.0.0.1:$port info > $R/info-$i.txt 2>&1
  echo "$i: $(grep -h 'trisolve  ' $R/bench-$i.log | awk '{print $2" /s"}') $(date -u +%T)"
  grep '^device:' $R/info-$i.txt | sed 's/^device: *\(cuda:[0-9]\).*, \([0-9]*\) MiB free.*; \([0-9]*\) jobs, [0-9]* running; \(.*\))$/  \1 \3 jobs \4, \2 MiB free/'
  kill $p; wait $p
done
echo "end $(date -u +%T)"
