#!/usr/bin/env bash
# The merged tree's GPU validation: CUDA suites against the CPU reference, end-to-end suites
# against trisolved --backend cuda.
set -uo pipefail
tar -xJf .gpu.tar.xz
o=$OUT/final; mkdir -p $o
export TRISOLVE_TEST_DATA=$PWD/tests/data
export TRISOLVED_BIN=$PWD/.gpu/bin/trisolved TRISOLVE_CLI_BIN=$PWD/.gpu/bin/trisolve
{ nvidia-smi --query-gpu=name,driver_version --format=csv; nproc; date -u; git log --oneline -1 2>/dev/null; } > $o/device.txt
run() { local name=$1; shift; timeout 420 "$@" > $o/$name.log 2>&1; echo "rc $?" >> $o/$name.log; echo "$name: $(grep -E '^\[  (PASSED|FAILED)  \]|tests? (ran|skipped)' $o/$name.log | tr '\n' ' ') $(tail -1 $o/$name.log)"; }
run test_cuda_tree .gpu/run test_cuda_tree
TRISOLVE_TEST_BACKEND=cuda run test_tree_cells_service_cuda .gpu/run test_tree_cells_service
TRISOLVE_TEST_BACKEND=cuda run test_ring_cuda .gpu/run test_ring
TRISOLVE_TEST_BACKEND=cuda run test_memory_cuda .gpu/run test_memory
run test_cuda_variable .gpu/run test_cuda_variable
run test_cuda_pivoting .gpu/run test_cuda_pivoting
run test_cuda_pivoting_split .gpu/run test_cuda_pivoting_split
run test_cuda_stability .gpu/run test_cuda_stability
OMP_NUM_THREADS=16 run test_pivoting_split_16 .gpu/run test_pivoting_split
run test_cuda_tridiagonal .gpu/run test_cuda_tridiagonal
tar -czf $OUT/final.tgz -C $OUT final
