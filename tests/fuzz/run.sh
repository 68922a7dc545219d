#!/usr/bin/env bash
# Builds the libFuzzer harnesses (clang-14, CPU only, ASan + UBSan) into ${FUZZ_BUILD_DIR:-build-fuzz}
# and runs each for SECONDS seconds (default 60; 3600 for the long run) from the checked-in seed
# corpus (tests/fuzz/corpus/<target>; new inputs go to the build directory's corpus, not the
# repository). Exit status non-zero when a harness finds a crash, a leak or undefined behaviour;
# the input that did it is left in the build directory (crash-*, leak-*), with the report in
# <target>.log.
#   bash tests/fuzz/run.sh            # CI: 60 s each (deploy/test.sh, unless TRISOLVE_FUZZ_SECONDS=0)
#   bash tests/fuzz/run.sh 3600       # the long run, 1 hour each
#   bash tests/fuzz/run.sh 600 fuzz_npy
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)
seconds=${1:-60}
shift || true
targets=("$@")
((${#targets[@]})) || targets=(fuzz_npy fuzz_swc fuzz_translate)
build=${FUZZ_BUILD_DIR:-$top/build-fuzz}
jobs=${FUZZ_JOBS:-$(nproc)}

mkdir -p "$build"
CC=${CC_FUZZ:-clang-14} CXX=${CXX_FUZZ:-clang++-14} cmake -S "$top" -B "$build" -G Ninja \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTRISOLVE_FUZZ=ON -DTRISOLVE_CUDA=OFF -DBUILD_TESTING=OFF \
  >"$build/configure.log" 2>&1 || { cat "$build/configure.log"; exit 1; }
cmake --build "$build" -j "$jobs" --target "${targets[@]}"

status=0
for t in "${targets[@]}"; do
  corpus="$build/corpus/$t"
  mkdir -p "$corpus"
  seeds="$here/corpus/${t#fuzz_}"
  # -rss_limit_mb and -malloc_limit_mb: an input that makes a harness take more than 2 GiB is a
  # finding (the parsers must not allocate what the input does not hold).
  echo "fuzz: $t for ${seconds} s (seeds: ${seeds#"$top"/})"
  if (cd "$build" && ASAN_OPTIONS=detect_leaks=1 \
        UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
        "./tests/fuzz/$t" -max_total_time="$seconds" -rss_limit_mb=2048 -malloc_limit_mb=2048 \
        -timeout=60 -max_len=65536 -print_final_stats=1 "$corpus" "$seeds" \
        >"$build/$t.log" 2>&1); then
    grep -E "^stat::number_of_executed_units|^stat::peak_rss_mb|^stat::new_units_added" \
      "$build/$t.log" | sed "s/^/  $t /"
  else
    status=1
    echo "fuzz: $t FOUND A PROBLEM; report in $build/$t.log:"
    grep -E "ERROR|runtime error|SUMMARY|Test unit written|^artifact_prefix" "$build/$t.log" | head -20
  fi
done
exit $status
