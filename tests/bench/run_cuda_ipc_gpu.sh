#!/usr/bin/env bash
# Arrays in a client process's CUDA memory (RegisterCudaMemory) on the lent GPU: 2^24 unknowns
# (65,536 x 256, float64) and 64 x 65,536, the whole system and by handle, one local core
# beside each (bench_cuda_ipc).
#   here:   ../shared/gpu/bundle.sh .gpu-ipc build-cuda/server/trisolved build-cuda/client/trisolve \
#             build-cuda/tests/bench_cuda_ipc; strip .gpu-ipc/bin/*;
#           tar -cf - .gpu-ipc | xz -9 -T2 > .gpu-ipc.tar.xz
#   there:  bash tests/bench/run_cuda_ipc_gpu.sh        (logs under $OUT)
# DIR (default .gpu-ipc); REQUESTS (default 20).
set -uo pipefail
out=${OUT:-/tmp/trisolve-cuda-ipc}
dir=${DIR:-.gpu-ipc}
mkdir -p "$out"
[ -d "$dir" ] || tar -xJf "$dir.tar.xz"
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; date -u +%Y-%m-%dT%H:%MZ; } |
  tee "$out/device.txt"
port=$((50170 + RANDOM % 500))
"$dir/run" trisolved --backend cuda --listen "127.0.0.1:$port" >"$out/trisolved.log" 2>&1 &
srv=$!
for _ in $(seq 200); do
  "$dir/run" trisolve --server "127.0.0.1:$port" --timeout 1 health >/dev/null 2>&1 && break
  sleep 0.1
done
for shape in "--batch 65536 --n 256" "--batch 64 --n 65536"; do
  # shellcheck disable=SC2086
  "$dir/run" bench_cuda_ipc --server "127.0.0.1:$port" $shape --requests "${REQUESTS:-20}" 2>&1 |
    tee -a "$out/cuda_ipc.log"
done
kill $srv
wait $srv
echo "=== done"
