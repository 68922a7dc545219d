#!/usr/bin/env bash
# Session 39, call 11 (4 x H200): registrations by the driver's calls in their own context.
set -u
R=$OUT/r; mkdir -p $R
trap 'cd $OUT && tar -czf x.tgz r && rm -rf r' EXIT
tar -xJf .gpu.tar.xz
echo "start $(date -u +%T) $(nproc) cores"
.gpu/run test_cuda_multi > $R/test_cuda_multi.log 2>&1
echo "test_cuda_multi: exit $? $(grep -E '^\[  (PASSED|FAILED)  \]' $R/test_cuda_multi.log | tr '\n' ' ')"
grep -E "RegisteredMemory" $R/test_cuda_multi.log | grep -v RUN
timeout 120 .gpu/run bench_registration --clients 16 --seconds 3 --rounds 1 2>&1 | tee $R/bench_registration.txt
for i in 1 2; do
  port=$((50500 + i))
  .gpu/run trisolved --backend cuda --listen 127.0.0.1:$port --devices 0,1,2,3 --max-queued-jobs 4096 \
    --max-message-bytes 1073741824 --max-regions-per-identity 4096 > $R/srv-$i.log 2>&1 &
  p=$!
  for _ in $(seq 100); do .gpu/run trisolve --server 127.0.0.1:$port --timeout 1 health >/dev/null 2>&1 && break; sleep 0.1; done
  .gpu/run trisolve --server 127.0.0.1:$port bench --family block --N 1024 --M 1024 --mode unary --transport shm \
     --clients 64 --requests 48 --check-every 8 > $R/bench-$i.log 2>&1
  .gpu/run trisolve --server 127.0.0.1:$port info > $R/info-$i.txt 2>&1
  echo "$i: $(grep -h 'trisolve  ' $R/bench-$i.log | awk '{print $2" /s"}') $(date -u +%T)"
  grep -h "answers:" $R/bench-$i.log
  grep '^device:' $R/info-$i.txt | sed 's/^device: *\(cuda:[0-9]\).*, \([0-9]*\) MiB free.*; \([0-9]*\) jobs, [0-9]* running; \(.*\))$/  \1 \3 jobs \4, \2 MiB free/'
  kill $p; wait $p
done
echo "end $(date -u +%T)"
