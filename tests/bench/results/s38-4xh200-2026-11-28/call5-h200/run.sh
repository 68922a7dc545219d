#!/usr/bin/env bash
set -u
R=$OUT/r; mkdir -p $R
trap 'cd $OUT && tar -czf x.tgz r && rm -rf r' EXIT
tar -xJf .gpu.tar.xz
F=".gpu-fold/run"
C=$R/coarsefold; mkdir -p $C; date -u | tee $C/device.txt; nvidia-smi -L | tee -a $C/device.txt
$F test_cuda_block_fold 2>&1 | tee $C/test_cuda_block_fold.log | tail -4
$F test_cuda_block_graphs 2>&1 | tee $C/test_cuda_block_graphs.log | tail -3
$F test_cuda_block --gtest_brief=1 2>&1 | tee $C/test_cuda_block.log | tail -3
echo "parts $(date -u +%T)"
timeout 90 $F bench_block_krylov 5 parts > $C/bench_block_krylov_parts.log 2>&1; tail -30 $C/bench_block_krylov_parts.log
echo "ab $(date -u +%T)"
for f in 0 4096 0 4096 1024 16384; do echo "#### TRISOLVE_BLOCK_FOLD=$f"; TRISOLVE_BLOCK_FOLD=$f timeout 60 $F bench_block_krylov 5 2>&1 | head -15; done > $C/ab-graph.txt
for f in 0 4096; do echo "#### TRISOLVE_BLOCK_GRAPHS=0 TRISOLVE_BLOCK_FOLD=$f"; TRISOLVE_BLOCK_GRAPHS=0 TRISOLVE_BLOCK_FOLD=$f timeout 60 $F bench_block_krylov 5 2>&1 | head -15; done > $C/ab-plain.txt
echo "fingerprints $(date -u +%T)"
for f in 0 4096; do echo "#### TRISOLVE_BLOCK_FOLD=$f"; TRISOLVE_BLOCK_FOLD=$f timeout 100 $F bench_block_krylov 3 2>&1; done > $C/bench_block_krylov.log
echo "wait $(date -u +%T)"
for w in yield block yield block; do
  OUT=$R/wait-$w SERVER_FLAGS="--device-wait $w" PARTS=bench FAMILIES=dense DENSE_SHAPES=64x256 CLIENTS=64 MODES=handle \
    DEVICES=1 CHECK_EVERY=8 BENCH_TIMEOUT=40 timeout 60 bash tests/bench/run_multi_gpu.sh > $R/wait-$w-dense.txt 2>&1
  sed -n '/^family/,$p' $R/wait-$w-dense.txt | tail -1
  OUT=$R/wait-$w-tri SERVER_FLAGS="--device-wait $w" PARTS=bench FAMILIES=tridiagonal TRANSPORTS=shm-ring SHAPES=256x1024 \
    CLIENTS="1 64" MODES=handle DEVICES=1 CHECK_EVERY=16 BENCH_TIMEOUT=40 timeout 70 bash tests/bench/run_multi_gpu.sh > $R/wait-$w-tri.txt 2>&1
  sed -n '/^family/,$p' $R/wait-$w-tri.txt | tail -2
  grep -h "trisolve  " $R/wait-$w-tri/bench_1.log
done
echo "end $(date -u +%T)"
