#!/usr/bin/env bash
# Copies programs and the shared libraries they need (but the C/C++ runtime and the CUDA
# libraries, which the runtime image has) into PREFIX/bin and PREFIX/lib: the Docker image's
# runtime stage takes PREFIX and nothing else from the build stage.
#   deploy/collect-runtime.sh PREFIX PROGRAM...
set -euo pipefail
prefix=$1; shift
mkdir -p "$prefix/bin" "$prefix/lib"
skip='^(linux-vdso|ld-linux|libc\.so|libm\.so|libdl\.so|librt\.so|libpthread\.so|libstdc\+\+\.so|libgcc_s\.so|libcuda\.so|libcudart\.so|libcublas|libcusparse|libcusolver|libnvJitLink)'
for prog in "$@"; do
  install -m 0755 "$prog" "$prefix/bin/"
  ldd "$prog" | awk '/=> \//{print $1, $3}' | while read -r name path; do
    [[ $name =~ $skip ]] || cp -fL "$path" "$prefix/lib/$name"
  done
done
