#!/usr/bin/env bash
# Where a call's time goes outside the server's own account: client call minus server total,
# back to back and after idling (--pause-ms), over gRPC, shm and the ring.
set -uo pipefail
out=$OUT/gap; mkdir -p $out
tar -xJf .gpu.tar.xz
B=${BACKEND:-cpu}
nproc > $out/nproc.txt; nvidia-smi --query-gpu=name,driver_version --format=csv >> $out/nproc.txt 2>&1
port=50321
.gpu/run trisolved --backend $B --listen 127.0.0.1:$port --max-message-bytes 1073741824 --request-log errors > $out/server.log 2>&1 &
srv=$!
for _ in $(seq 100); do .gpu/run trisolve --server 127.0.0.1:$port --timeout 1 health >/dev/null 2>&1 && break; sleep 0.1; done
run() { echo "### $*" | tee -a $out/bench.log; timeout 120 .gpu/run trisolve --server 127.0.0.1:$port bench --json "$@" 2>&1 | grep -v '^{' | tee -a $out/bench.log; }
for p in 0 30; do
  for tr in grpc ring shm; do
    run --mode handle --transport $tr --n 64 --requests 100 --pause-ms $p
  done
  run --mode health --transport grpc --n 64 --requests 100 --pause-ms $p
  run --mode handle --transport shm --batch 64 --n 256 --requests 60 --pause-ms $p
  run --mode handle --transport shm --batch 4096 --n 256 --requests 40 --pause-ms $p
done
run --mode handle --transport shm --batch 65536 --n 256 --requests 15
run --mode unary --transport shm --batch 65536 --n 256 --requests 10
kill $srv; wait $srv
tar -czf $OUT/gap.tgz -C $OUT gap
