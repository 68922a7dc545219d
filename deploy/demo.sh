#!/usr/bin/env bash
# README command 1: installs what is missing, builds, starts trisolved, solves one example of
# each family through the CLI (printing the residuals), and stops the server.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
bash "$top/deploy/install-deps.sh"
bash "$top/deploy/build.sh"
build=${BUILD_DIR:-$top/build}
port=${TRISOLVE_DEMO_PORT:-50051}
work=$(mktemp -d)
log=$work/trisolved.log
"$build/server/trisolved" --listen "127.0.0.1:$port" >"$log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null; wait $server 2>/dev/null; rm -rf "$work"' EXIT
cli() { "$build/client/trisolve" --server "127.0.0.1:$port" "$@"; }
for _ in $(seq 50); do cli --timeout 1 health >/dev/null 2>&1 && break; sleep 0.1; done
cli info
swc=$top/tests/data/neuron_10-2012-02-09-001.CNG.swc
for kind in tridiagonal tree block-tridiagonal dense; do
  echo
  echo "=== $kind"
  extra=()
  [ "$kind" = tree ] && extra=(--swc "$swc")
  cmd=$("$build/client/trisolve" make-example "$kind" "$work/$kind" "${extra[@]}")
  echo "\$ $cmd"
  read -r -a words <<<"$cmd"
  cli "${words[@]:1}"
done
echo
echo "=== the thesis' experiment 1 (N = M = 64) for exactly L = 64 red-black sweeps"
b=$work/block-tridiagonal
cli solve block-tridiagonal aC="$b/aC.npy" cC="$b/cC.npy" bC="$b/bC.npy" cA="$b/cA.npy" \
  cB="$b/cB.npy" f="$b/f.npy" --method red-black --iterations 64 --tol 0
echo
echo "server log:"
cat "$log"
