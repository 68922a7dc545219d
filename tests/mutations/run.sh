#!/usr/bin/env bash
# Mutation run (issue 35, item 8): each patch in this folder breaks the product on purpose; the
# tests its header names must fail on the mutated code (KILLED) and pass on the code as it is.
#
#   tests/mutations/run.sh [--cuda] [--no-baseline] [PATCH...]    (default: every *.patch)
#   tests/mutations/run.sh --cuda-build DIR [PATCH...]   build the CUDA mutants here, no GPU
#   tests/mutations/run.sh --cuda-run DIR                run them on a GPU host, no build
#
# A patch's header (the lines before its `diff --git`) says what it breaks and who must catch it:
#   # Mutation: what the mutated code does wrong
#   # Hole: the hole of item 8 it models
#   # Kill: <test binary> <gtest filter>        (one line per binary)
#   # CUDA: yes                                  (only for patches of the CUDA backend)
#
# The working tree is never touched: its files (tracked and untracked, as they are now) are
# copied into a scratch tree, $TRISOLVE_MUTATION_DIR (default /tmp/trisolve-mutants), kept
# between runs so that each run rebuilds only what changed (ccache shared with the other
# builds: CCACHE_BASEDIR is the scratch tree's parent). Per patch: apply, build the named test
# binaries, run the named tests, reverse the patch. Before the mutants, the same tests run on
# the unmutated copy (the baseline: a test that already fails kills nothing). CPU patches build
# with CUDA off; CUDA patches are skipped, saying so, unless --cuda is given on a host with
# nvcc and a GPU (they then build in a second, CUDA build of the scratch tree; architectures
# from TRISOLVE_CUDA_ARCHS, default 90).
#
# Where the GPU host cannot build (the lent GPU machine has no gRPC or Abseil), split the work:
# --cuda-build DIR builds, here, the baseline and each CUDA mutant's test binaries into
# DIR/stage (baseline.<binary>, <patch>.<binary>) and lists them in DIR/mutants.txt; bundle
# them with their libraries (../shared/gpu/bundle.sh DIR DIR/stage/*, which writes DIR/bin,
# DIR/lib and DIR/run), carry DIR over, and --cuda-run DIR runs them there.
#
# Prints KILLED / SURVIVED per patch (with the tests that failed) and a summary; exits 1 if a
# mutant survived, a build failed, a baseline failed or a patch did not apply, 0 otherwise.
# TRISOLVE_MUTATION_JOBS: build jobs (default 2); TRISOLVE_MUTATION_TIMEOUT: seconds a binary.
set -uo pipefail

here=$(cd "$(dirname "$0")" && pwd)
top=$(git -C "$here" rev-parse --show-toplevel 2> /dev/null || (cd "$here/../.." && pwd))
mode=local
cuda=0
baseline=1
out_dir=
patches=()
while [ $# -gt 0 ]; do
  case "$1" in
    --cuda) cuda=1 ;;
    --no-baseline) baseline=0 ;;
    --cuda-build|--cuda-run)
      mode=${1#--}
      [ $# -ge 2 ] || { echo "$1 needs a folder" >&2; exit 2; }
      out_dir=$(realpath -m "$2")
      shift ;;
    -h|--help) sed -n '2,33p' "$0"; exit 0 ;;
    -*) echo "unknown option $1" >&2; exit 2 ;;
    *) patches+=("$(realpath "$1")") ;;
  esac
  shift
done
[ ${#patches[@]} -eq 0 ] && patches=("$here"/*.patch)

root=${TRISOLVE_MUTATION_DIR:-/tmp/trisolve-mutants}
src=$root/tree
jobs=${TRISOLVE_MUTATION_JOBS:-2}
test_timeout=${TRISOLVE_MUTATION_TIMEOUT:-900}
export CCACHE_BASEDIR
CCACHE_BASEDIR=$(dirname "$root")

field() { sed -n "/^diff --git/q; s/^# $2: *//p" "$1"; }

# ---- the scratch tree: the working tree's files, copied where they differ ------------------
sync_tree() {
  local n=0 f
  while IFS= read -r -d '' f; do
    [ -f "$top/$f" ] || continue
    if ! cmp -s "$top/$f" "$src/$f"; then
      mkdir -p "$src/$(dirname "$f")"
      cp "$top/$f" "$src/$f"  # a new mtime: the build must see the change
      n=$((n + 1))
    fi
  done < <(git -C "$top" ls-files -z --cached --others --exclude-standard)
  echo "scratch tree $src: $n files copied from $top"
}

configure() {  # $1: build dir, $2: ON/OFF
  [ -f "$1/build.ninja" ] && return 0
  local extra=()
  [ "$2" = ON ] && extra=(-DCMAKE_CUDA_ARCHITECTURES="${TRISOLVE_CUDA_ARCHS:-90}")
  cmake -S "$src" -B "$1" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTRISOLVE_WERROR=ON \
    -DTRISOLVE_CUDA="$2" "${extra[@]}" > "$root/logs/configure-$(basename "$1").log" 2>&1 || {
    echo "configure of $1 failed: $root/logs/configure-$(basename "$1").log"
    return 1
  }
}

# How a test binary is started: exe_fmt is a printf format for its path (%s: the binary's
# name), run_with an optional wrapper (the bundle's run script).
exe_fmt=
run_with=()

# Runs the Kill: lines ($1: "binary filter" lines) with exe_fmt; log in $2. Prints the failed
# tests (and the named tests that passed beside them); returns 0 all passed, 1 some failed,
# 2 nothing ran (every case skipped: no GPU), 3 a filter matched no test.
run_tests() {
  local kills=$1 log=$2 rc=0 bin filter out status ran=0 nomatch=0 exe
  : > "$log"
  while read -r bin filter; do
    [ -z "$bin" ] && continue
    # shellcheck disable=SC2059
    exe=$(printf "$exe_fmt" "$bin")
    out=$(timeout "$test_timeout" "${run_with[@]}" "$exe" --gtest_filter="$filter" 2>&1)
    status=$?
    printf '==== %s --gtest_filter=%s (exit %d)\n%s\n' "$exe" "$filter" "$status" "$out" >> "$log"
    if grep -q '^\[==========\] 0 tests' <<< "$out"; then
      nomatch=1
      continue
    fi
    if grep -q '^\[  PASSED  \] [1-9]' <<< "$out"; then ran=1; fi
    if [ "$status" -ne 0 ]; then
      rc=1
      ran=1
      if [ "$status" -eq 124 ]; then
        echo "    $bin: timed out after ${test_timeout}s"
      else
        grep '^\[  FAILED  \] [A-Za-z]' <<< "$out" | grep -v ' listed below' |
          sed "s/^\[  FAILED  \] /    $bin: /; s/, where GetParam.*//; s/ ([0-9]* ms)\$//" |
          sort -u | head -20
        # The named tests the mutant got past: where the hole was (or is).
        grep '^\[       OK \] ' <<< "$out" |
          sed "s/^\[       OK \] /    $bin: passed: /; s/ ([0-9]* ms)\$//" | head -20
        grep -q '^\[  FAILED  \] [A-Za-z]' <<< "$out" ||
          echo "    $bin: exit $status (crashed: $(tail -1 <<< "$out" | cut -c1-120))"
      fi
    fi
  done <<< "$kills"
  if [ "$nomatch" -eq 1 ]; then return 3; fi
  if [ "$rc" -eq 0 ] && [ "$ran" -eq 0 ]; then return 2; fi
  return "$rc"
}

build_targets() {  # $1 build dir, $2 patch; log $3
  local targets
  targets=$(field "$2" Kill | awk '{print $1}' | sort -u | tr '\n' ' ')
  # shellcheck disable=SC2086
  cmake --build "$1" -j "$jobs" --target $targets > "$3" 2>&1
}

have_nvcc() { command -v nvcc > /dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; }
have_gpu() { command -v nvidia-smi > /dev/null 2>&1 && nvidia-smi -L 2> /dev/null | grep -q GPU; }

declare -A result failed
order=()
bad=0
verdict() {  # $1 name, $2 run_tests' status
  case $2 in
    1) result[$1]="KILLED" ;;
    0) result[$1]="SURVIVED"; bad=1 ;;
    2) result[$1]="NOT-RUN (the tests skipped: no GPU?)"; bad=1 ;;
    *) result[$1]="NO-SUCH-TEST (a Kill: filter matched nothing)"; bad=1 ;;
  esac
}
summary() {
  echo
  echo "== summary ($(date -u '+%Y-%m-%d %H:%M UTC'), $(hostname), logs in $1)"
  for name in "${order[@]}"; do printf '%-44s %s\n' "$name" "${result[$name]}"; done
  exit "$bad"
}

# ---- --cuda-run: the binaries --cuda-build staged, on the GPU host -------------------------
if [ "$mode" = cuda-run ]; then
  have_gpu || { echo "--cuda-run: no GPU here (nvidia-smi -L)"; exit 1; }
  if [ ! -f "$out_dir/mutants.txt" ] || [ ! -x "$out_dir/run" ]; then
    echo "--cuda-run: $out_dir has no mutants.txt or run (bundle it first)"
    exit 1
  fi
  export TRISOLVE_TEST_DATA=${TRISOLVE_TEST_DATA:-$top/tests/data}
  logs=${OUT:-$out_dir}/mutation-logs
  mkdir -p "$logs"
  run_with=("$out_dir/run")
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  declare -A base_ok
  while IFS=$'\t' read -r name bin filter; do
    [ -z "$name" ] && continue
    [ -n "${result[$name]:-}" ] || order+=("$name")
    kills="$bin $filter"
    if [ "$baseline" -eq 1 ] && [ -z "${base_ok[$kills]:-}" ]; then
      exe_fmt="baseline.%s"
      run_tests "$kills" "$logs/baseline.$name.$bin.log" > "$logs/baseline.$name.$bin.failed"
      base_ok[$kills]=$?
    fi
    if [ "${base_ok[$kills]:-0}" -ne 0 ]; then
      case ${base_ok[$kills]} in
        2) result[$name]="NOT-RUN (the baseline's tests skipped: no GPU?)" ;;
        3) result[$name]="NO-SUCH-TEST (a Kill: filter matched nothing)" ;;
        *) result[$name]="BASELINE-FAILED (the unmutated code fails: $logs/baseline.*.$bin.log)" ;;
      esac
      bad=1
      echo "== $name: ${result[$name]}"; continue
    fi
    exe_fmt="$name.%s"
    echo "== $name ($bin)"
    failed[$name]=$(run_tests "$kills" "$logs/$name.$bin.log")
    st=$?
    # A patch with several binaries: killed if any of them fails.
    if [ "${result[$name]:-}" != KILLED ]; then verdict "$name" "$st"; fi
    echo "   ${result[$name]}"
    [ -n "${failed[$name]}" ] && echo "${failed[$name]}"
  done < "$out_dir/mutants.txt"
  summary "$logs"
fi

mkdir -p "$src" "$root/logs"
sync_tree

# ---- --cuda-build: the CUDA mutants' test binaries, staged for the GPU host ------------------
if [ "$mode" = cuda-build ]; then
  have_nvcc || { echo "--cuda-build: no nvcc here"; exit 1; }
  build=$src/build-cuda
  configure "$build" ON || exit 1
  mkdir -p "$out_dir/stage"
  : > "$out_dir/mutants.txt"
  for patch in "${patches[@]}"; do
    [ -n "$(field "$patch" CUDA)" ] || continue
    name=$(basename "$patch" .patch)
    log=$root/logs/$name
    order+=("$name")
    echo "== $name: $(field "$patch" Mutation)"
    if ! build_targets "$build" "$patch" "$log.baseline-build.log"; then
      result[$name]="BASELINE-BUILD-FAILED ($log.baseline-build.log)"; bad=1; continue
    fi
    for bin in $(field "$patch" Kill | awk '{print $1}' | sort -u); do
      cp "$build/tests/$bin" "$out_dir/stage/baseline.$bin"
    done
    (cd "$src" && git apply "$patch") || { result[$name]="DOES-NOT-APPLY"; bad=1; continue; }
    if build_targets "$build" "$patch" "$log.build.log"; then
      for bin in $(field "$patch" Kill | awk '{print $1}' | sort -u); do
        cp "$build/tests/$bin" "$out_dir/stage/$name.$bin"
      done
      field "$patch" Kill | while read -r bin filter; do
        printf '%s\t%s\t%s\n' "$name" "$bin" "$filter"
      done >> "$out_dir/mutants.txt"
      result[$name]="BUILT ($out_dir/stage/$name.*)"
    else
      result[$name]="BUILD-FAILED ($log.build.log)"; bad=1
    fi
    (cd "$src" && git apply -R "$patch")
    echo "   ${result[$name]}"
  done
  echo "next: ../shared/gpu/bundle.sh $out_dir $out_dir/stage/*, then --cuda-run $out_dir on the GPU"
  summary "$root/logs"
fi

# ---- here: build, run, report -----------------------------------------------------------
if [ "$cuda" -eq 1 ] && ! { have_nvcc && have_gpu; }; then
  echo "--cuda: no nvcc or no GPU here; the CUDA patches are skipped"
  cuda=0
fi
for patch in "${patches[@]}"; do
  name=$(basename "$patch" .patch)
  order+=("$name")
  if [ -n "$(field "$patch" CUDA)" ] && [ "$cuda" -eq 0 ]; then
    result[$name]="SKIPPED (CUDA: --cuda on a GPU host, or --cuda-build / --cuda-run)"
    echo "== $name: ${result[$name]}"
    continue
  fi
  build=$src/build
  on=OFF
  if [ -n "$(field "$patch" CUDA)" ]; then build=$src/build-cuda; on=ON; fi
  configure "$build" "$on" || exit 1
  exe_fmt="$build/tests/%s"
  log=$root/logs/$name
  echo "== $name: $(field "$patch" Mutation)"
  if [ "$baseline" -eq 1 ]; then
    if ! build_targets "$build" "$patch" "$log.baseline-build.log"; then
      result[$name]="BASELINE-BUILD-FAILED ($log.baseline-build.log)"; bad=1
      echo "   ${result[$name]}"; continue
    fi
    run_tests "$(field "$patch" Kill)" "$log.baseline.log" > "$log.baseline.failed"
    st=$?
    if [ "$st" -ne 0 ]; then
      case $st in
        2) result[$name]="NOT-RUN (the tests skipped: no GPU?)" ;;
        3) result[$name]="NO-SUCH-TEST (a Kill: filter matched nothing, $log.baseline.log)" ;;
        *) result[$name]="BASELINE-FAILED (the unmutated code fails: $log.baseline.log)"
           cat "$log.baseline.failed" ;;
      esac
      bad=1
      echo "   ${result[$name]}"; continue
    fi
  fi
  if ! (cd "$src" && git apply --check "$patch" 2> "$log.apply.log"); then
    result[$name]="DOES-NOT-APPLY ($log.apply.log)"; bad=1
    echo "   ${result[$name]}"; continue
  fi
  (cd "$src" && git apply "$patch")
  t0=$(date +%s)
  if ! build_targets "$build" "$patch" "$log.build.log"; then
    result[$name]="BUILD-FAILED ($log.build.log)"; bad=1
  else
    failed[$name]=$(run_tests "$(field "$patch" Kill)" "$log.log")
    verdict "$name" $?
  fi
  # Reversed, the files get a new mtime: the next build compiles them again (a ccache hit).
  (cd "$src" && git apply -R "$patch")
  echo "   ${result[$name]} ($(( $(date +%s) - t0 )) s)"
  [ -n "${failed[$name]:-}" ] && echo "${failed[$name]}"
done
summary "$root/logs"
