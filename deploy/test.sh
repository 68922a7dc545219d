#!/usr/bin/env bash
# README command 2: installs what is missing, builds, runs every test (ctest), then the fuzz
# harnesses for 60 s each (tests/fuzz/run.sh). The CUDA tests skip, saying so, where no GPU is
# present.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
bash "$top/deploy/install-deps.sh"
bash "$top/deploy/build.sh"
(cd "${BUILD_DIR:-$top/build}" && ctest --output-on-failure -j "$(nproc)" --timeout 900)
# The fuzz harnesses, built apart with clang and the sanitizers, each for a bounded time from the
# checked-in corpus (docs/fuzzing.md). TRISOLVE_FUZZ_SECONDS=0 skips them.
fuzz_seconds=${TRISOLVE_FUZZ_SECONDS:-60}
if [ "$fuzz_seconds" != 0 ]; then
  FUZZ_BUILD_DIR=${FUZZ_BUILD_DIR:-${BUILD_DIR:-$top/build}-fuzz} \
    bash "$top/tests/fuzz/run.sh" "$fuzz_seconds"
fi
