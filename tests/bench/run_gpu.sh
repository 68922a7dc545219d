#!/usr/bin/env bash
# Everything the lent GPU machine runs, in one call (see README, "Benchmarks"):
#   ../shared/gpu/bundle.sh .gpu build-cuda/server/trisolved build-cuda/client/trisolve \
#       build-cuda/tests/test_cuda_tridiagonal build-cuda/tests/bench_tridiagonal \
#       build-cuda/tests/test_cuda_tree build-cuda/tests/bench_tree \
#       build-cuda/tests/test_cuda_dense build-cuda/tests/bench_dense \
#       build-cuda/tests/test_cuda_block build-cuda/tests/bench_block
#   then on the device: bash tests/bench/run_gpu.sh   (logs and results under $OUT)
# The bundle is over the device tool's 64 MiB carry limit: strip the programs and carry it
# packed (tar -cJf .gpu.tar.xz .gpu, about 10 MB); it is unpacked here.
# PARTS picks what runs (default all): tests tridiagonal tree dense block e2e.
set -uo pipefail
out=${OUT:-/tmp/trisolve-gpu}
mkdir -p "$out"
[ -d .gpu ] || tar -xJf .gpu.tar.xz
parts=" ${PARTS:-tests tridiagonal tree dense block e2e} "
want() { [[ $parts == *" $1 "* ]]; }
run=.gpu/run
# The GPU tests' data (test_cuda_tree's morphology): this tree's, not the build machine's path.
export TRISOLVE_TEST_DATA=${TRISOLVE_TEST_DATA:-$PWD/tests/data}
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv | tee "$out/device.txt"

if want tests; then
echo "=== GPU tests"
$run test_cuda_tridiagonal --gtest_brief=1 2>&1 | tee "$out/gpu_tests.log" | tail -25
$run test_cuda_tree --gtest_brief=1 2>&1 | tee "$out/gpu_tests_tree.log" | tail -25
$run test_cuda_dense --gtest_brief=1 2>&1 | tee "$out/gpu_tests_dense.log" | tail -25
$run test_cuda_block --gtest_brief=1 2>&1 | tee "$out/gpu_tests_block.log" | tail -25
fi

if want tridiagonal; then
echo "=== benchmark"
$run bench_tridiagonal --csv "$out/bench_tridiagonal.csv" 2>&1 | tee "$out/bench_tridiagonal.log"
fi

if want tree; then
echo "=== tree benchmark"
$run bench_tree --swc tests/data/neuron_10-2012-02-09-001.CNG.swc 2>&1 | tee "$out/bench_tree.log"
fi

if want dense; then
echo "=== dense benchmark"
$run bench_dense 2>&1 | tee "$out/bench_dense.log"
fi

if want block; then
echo "=== block-tridiagonal benchmark"
$run bench_block 2>&1 | tee "$out/bench_block.log"
fi

want e2e || exit 0
echo "=== end to end: trisolved --backend cuda, solved through the CLI"
$run trisolved --backend cuda --listen 127.0.0.1:50151 >"$out/trisolved.log" 2>&1 &
srv=$!
cli() { $run trisolve --server 127.0.0.1:50151 "$@"; }
for _ in $(seq 100); do cli --timeout 1 health >/dev/null 2>&1 && break; sleep 0.1; done
cli info
ex=/tmp/trisolve-e2e
cmd=$($run trisolve make-example tridiagonal $ex/small --batch 1000 --n 100)
read -r -a w <<<"$cmd"; cli "${w[@]:1}" --json
# 64 flat systems of 16384 rows (auto: thomas-window, whose answer comes through the last block).
cmd=$($run trisolve make-example tridiagonal $ex/windows --batch 64 --n 16384)
read -r -a w <<<"$cmd"; cli "${w[@]:1}" --json
# 2^24 unknowns in float64: 671 MB of arrays through gRPC (streamed), twice (cold and warm pool).
cmd=$($run trisolve make-example tridiagonal $ex/big --batch 65536 --n 256)
read -r -a w <<<"$cmd"
for i in 1 2 3; do /usr/bin/time -f "wall %e s, max rss %M KB" $run trisolve --server 127.0.0.1:50151 "${w[@]:1}" --json; done
# Cells of the real morphology: 16 (auto: cables) and 4096 (auto: hines-batch).
for cells in 16 4096; do
  cmd=$($run trisolve make-example tree $ex/tree$cells --batch $cells --swc tests/data/neuron_10-2012-02-09-001.CNG.swc)
  read -r -a w <<<"$cmd"; cli "${w[@]:1}" --json
done
# Two dense systems of n = 1000 (auto: lu through cuSOLVER).
cmd=$($run trisolve make-example dense $ex/dense --batch 2 --n 1000)
read -r -a w <<<"$cmd"; cli "${w[@]:1}" --json
cli solve tridiagonal a=$ex/big/a.npy b=$ex/big/b.npy c=$ex/big/c.npy d=$ex/big/d.npy --method thomas --skip-residual --json
cli info
kill $srv; wait $srv
cat "$out/trisolved.log" | tail -20
