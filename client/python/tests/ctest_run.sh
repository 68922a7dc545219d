#!/usr/bin/env bash
# ctest's entry to the Python client's tests: finds a python3 with grpc, google.protobuf, numpy
# and pytest (TRISOLVE_PYTHON, then /usr/bin/python3 -- where Debian's python3-* packages
# are -- then python3 on PATH), generates the stubs and runs pytest with the given arguments.
# Exit 77 (ctest SKIP_RETURN_CODE) when no such python or no protoc/grpc_python_plugin is found,
# saying why; pytest's exit 5 (no tests collected) is a failure, not a pass.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
pkg=$(dirname "$here")
modules="grpc google.protobuf numpy pytest"
py=""
why=""
for cand in ${TRISOLVE_PYTHON:-} /usr/bin/python3 python3; do
  command -v "$cand" >/dev/null 2>&1 || continue
  if out=$("$cand" -c "
import importlib, sys
missing = []
for m in '$modules'.split():
    try:
        importlib.import_module(m)
    except Exception:
        missing.append(m)
print(' '.join(missing))
sys.exit(1 if missing else 0)" 2>/dev/null); then
    py=$cand
    break
  fi
  why="$why $cand lacks:${out:- (did not run)};"
done
if [ -z "$py" ]; then
  echo "SKIP: no python3 with $modules found ($why)."
  echo "      Install them: apt-get install python3-grpcio python3-protobuf python3-numpy python3-pytest"
  exit 77
fi
for tool in protoc grpc_python_plugin; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "SKIP: $tool not found: apt-get install protobuf-compiler protobuf-compiler-grpc"
    exit 77
  fi
done
bash "$pkg/generate.sh" || exit 1
echo "python: $py ($("$py" --version 2>&1)); TRISOLVED_BIN=${TRISOLVED_BIN:-unset}"
cd "$here"
"$py" -m pytest -p no:cacheprovider -ra "$@"
rc=$?
if [ "$rc" = 5 ]; then
  echo "FAIL: pytest collected no tests"
  exit 1
fi
exit "$rc"
