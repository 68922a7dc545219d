#!/usr/bin/env bash
# README command 2: installs what is missing, builds, runs every test (ctest). The CUDA tests
# skip, saying so, where no GPU is present.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
bash "$top/deploy/install-deps.sh"
bash "$top/deploy/build.sh"
cd "${BUILD_DIR:-$top/build}"
ctest --output-on-failure -j "$(nproc)" --timeout 900
