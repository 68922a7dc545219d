#!/usr/bin/env bash
# What a change must pass on the lent GPU before it lands, in one or two calls: the GPU suites,
# every end-to-end suite behind `trisolved --backend cuda`, and the kernel benchmarks of this
# tree beside those of a baseline bundle, run one after the other on the same card (a refactor
# must give the same figures within their run-to-run spread).
#   here:   ../shared/gpu/bundle.sh .gpu build-cuda/server/trisolved build-cuda/client/trisolve \
#               build-cuda/tests/test_cuda_* build-cuda/tests/test_{systems,service,memory} \
#               build-cuda/tests/test_{batching,faults,ops,cli} build-cuda/tests/bench_*
#           (and the baseline's bench_* into .gpu-base the same way); strip .gpu*/bin/*;
#           tar -cf - .gpu .gpu-base | xz -9 -T2 > .gpu.tar.xz
#   there:  PARTS="suites e2e" bash tests/bench/run_check_gpu.sh     (logs under $OUT)
#           PARTS="kernels" bash tests/bench/run_check_gpu.sh
# PARTS (default all): suites e2e kernels; BUNDLES (default "base new"): which benchmarks run.
set -uo pipefail
out=${OUT:-/tmp/trisolve-check}
mkdir -p "$out"
{ [ -d .gpu ] && [ -d .gpu-base ]; } || tar -xJf .gpu.tar.xz
parts=" ${PARTS:-suites e2e kernels} "
want() { [[ $parts == *" $1 "* ]]; }
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; date -u +%Y-%m-%dT%H:%MZ; } |
  tee "$out/device.txt"
export TRISOLVE_TEST_DATA=$PWD/tests/data

suite() {  # suite LOG BINARY [env...]: a gtest binary, its verdict and its failures
  local log=$1 bin=$2
  shift 2
  env "$@" .gpu/run "$bin" --gtest_brief=1 >"$out/$log.log" 2>&1
  echo "$log: exit $? $(grep -E '^\[  (PASSED|FAILED|SKIPPED)  \]|tests? from .* ran' "$out/$log.log" | tr '\n' ' ')"
  grep -E '^\[  FAILED  \]' "$out/$log.log" | head -20
}

if want suites; then
  echo "=== GPU suites"
  for t in test_cuda_tridiagonal test_cuda_tree test_cuda_dense test_cuda_block test_cuda_multi; do
    [ -x .gpu/bin/$t ] && suite "$t" "$t"
  done
fi

if want e2e; then
  echo "=== end-to-end suites behind trisolved --backend cuda"
  for t in test_systems test_service test_memory test_batching test_faults test_ops test_cli test_progress; do
    [ -x .gpu/bin/$t ] && suite "${t}_cuda" "$t" TRISOLVE_TEST_BACKEND=cuda \
      TRISOLVED_BIN="$PWD/.gpu/bin/trisolved" TRISOLVE_CLI_BIN="$PWD/.gpu/bin/trisolve"
  done
fi

if want kernels; then
  echo "=== kernel benchmarks: baseline (.gpu-base) then this tree (.gpu), same card"
  swc=tests/data/neuron_10-2012-02-09-001.CNG.swc
  for b in ${BUNDLES:-base new}; do
    dir=.gpu
    [ "$b" = base ] && dir=.gpu-base
    [ -d "$dir" ] || { echo "no $dir: skipped"; continue; }
    $dir/run bench_tridiagonal --csv "$out/bench_tridiagonal_$b.csv" >"$out/bench_tridiagonal_$b.log" 2>&1
    $dir/run bench_tree --swc "$swc" >"$out/bench_tree_$b.log" 2>&1
    $dir/run bench_block >"$out/bench_block_$b.log" 2>&1
    $dir/run bench_dense >"$out/bench_dense_$b.log" 2>&1
    echo "$b: $(wc -l <"$out/bench_tridiagonal_$b.csv" 2>/dev/null) tridiagonal rows"
  done
  if [ -f "$out/bench_tridiagonal_base.csv" ] && [ -f "$out/bench_tridiagonal_new.csv" ]; then
    python3 tests/bench/compare_csv.py "$out/bench_tridiagonal_base.csv" \
      "$out/bench_tridiagonal_new.csv" | tee "$out/compare_tridiagonal.txt"
  fi
fi
