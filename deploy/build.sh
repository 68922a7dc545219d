#!/usr/bin/env bash
# Configures and builds trisolve into ${BUILD_DIR:-build}. The CUDA backend is built when nvcc
# is found (PATH or /usr/local/cuda); TRISOLVE_CUDA_ARCHS narrows the architectures (CI: 90).
# Extra CMake arguments: TRISOLVE_CMAKE_ARGS.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$top/build}
args=(-G Ninja -DCMAKE_BUILD_TYPE="${BUILD_TYPE:-Release}" -DTRISOLVE_WERROR=ON)
[ -n "${TRISOLVE_CUDA_ARCHS:-}" ] && args+=("-DCMAKE_CUDA_ARCHITECTURES=${TRISOLVE_CUDA_ARCHS}")
# shellcheck disable=SC2206
[ -n "${TRISOLVE_CMAKE_ARGS:-}" ] && args+=(${TRISOLVE_CMAKE_ARGS})
cmake -S "$top" -B "$build" "${args[@]}"
cmake --build "$build" -j "$(nproc)"
