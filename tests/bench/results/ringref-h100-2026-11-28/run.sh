#!/usr/bin/env bash
# ringref on the H100: the 2^24 job by reference over gRPC (shm) and through the ring
# (shm-ring), unary and by handle, three rounds; small calls after idling; the ring's tests
# against the CUDA backend.
set -uo pipefail
tar -xJf .gpu.tar.xz
mkdir -p $OUT/ring
export TRISOLVED_BIN=$PWD/.gpu/bin/trisolved TRISOLVE_CLI_BIN=$PWD/.gpu/bin/trisolve
for r in 1 2 3; do
  OUT=$OUT/ring/round$r BUNDLES=new TRANSPORTS="shm shm-ring" SHAPES=65536x256 REQUESTS=20 \
    bash tests/bench/run_datapath_gpu.sh > /dev/null 2>&1
done
port=50411
.gpu/run trisolved --backend cuda --listen 127.0.0.1:$port --request-log errors > $OUT/ring/idle_server.log 2>&1 &
srv=$!
for _ in $(seq 100); do .gpu/run trisolve --server 127.0.0.1:$port --timeout 1 health >/dev/null 2>&1 && break; sleep 0.1; done
for p in 0 30; do for tr in grpc shm ring shm-ring; do
  echo "### handle n=64 $tr pause $p" >> $OUT/ring/idle.log
  timeout 60 .gpu/run trisolve --server 127.0.0.1:$port bench --mode handle --transport $tr --n 64 --requests 100 --pause-ms $p --json >> $OUT/ring/idle.log 2>&1
done; done
kill $srv; wait $srv
TRISOLVE_TEST_BACKEND=cuda timeout 300 .gpu/run test_ring --gtest_filter='Ring.*Reference*:Ring.OtherRegions*:Ring.SolvesByHandle*:Ring.EveryFamily*' > $OUT/ring/test_ring_cuda.log 2>&1; echo "test_ring rc $?" >> $OUT/ring/test_ring_cuda.log
tar -czf $OUT/ring.tgz -C $OUT ring
for r in 1 2 3; do grep -E "^bench|trisolve  |server, mean|client, mean" $OUT/ring/round$r/datapath_new.log; done
grep -E "^###|trisolve  |server, mean" $OUT/ring/idle.log
tail -3 $OUT/ring/test_ring_cuda.log
