#!/usr/bin/env bash
# Session 39, call 12 (1 x H200): SymmetricPair shared by the host's and the device's symmetry test.
set -u
R=$OUT/r; mkdir -p $R
trap 'cd $OUT && tar -czf x.tgz r && rm -rf r' EXIT
tar -xJf .gpu.tar.xz
echo "start $(date -u +%T) $(nproc) cores; $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
timeout 200 .gpu/run test_cuda_block > $R/test_cuda_block.log 2>&1
echo "test_cuda_block: exit $? $(grep -E '^\[  (PASSED|FAILED)  \]' $R/test_cuda_block.log | tr '\n' ' ')"
grep -E '^\[  FAILED  \]|AutoTestsSymmetry' $R/test_cuda_block.log | grep -v RUN | head
port=50501
.gpu/run trisolved --backend cuda --listen 127.0.0.1:$port --max-queued-jobs 4096 \
  --max-message-bytes 1073741824 --max-regions-per-identity 4096 > $R/srv.log 2>&1 &
p=$!
for _ in $(seq 100); do .gpu/run trisolve --server 127.0.0.1:$port --timeout 1 health >/dev/null 2>&1 && break; sleep 0.1; done
.gpu/run trisolve --server 127.0.0.1:$port bench --family block --N 1024 --M 1024 --mode unary --transport shm \
   --clients 64 --requests 16 --check-every 8 > $R/bench.log 2>&1
cat $R/bench.log
kill $p; wait $p
echo "end $(date -u +%T)"
