#!/usr/bin/env bash
# run_with_server.sh TRISOLVED_BIN PROGRAM [ARGS...]
# Starts `trisolved --backend cpu --listen 127.0.0.1:0`, reads the port it bound from its log line
# "listening on ... (port N)", runs PROGRAM with TRISOLVE_SERVER=127.0.0.1:N, stops the server
# and exits with PROGRAM's status (1 if the server did not come up).
set -u
if [ $# -lt 2 ]; then
  echo "usage: $0 TRISOLVED_BIN PROGRAM [ARGS...]" >&2
  exit 2
fi
server_bin=$1
shift
log=$(mktemp "${TMPDIR:-/tmp}/trisolved.XXXXXX.log")
"$server_bin" --backend cpu --listen 127.0.0.1:0 >"$log" 2>&1 &
server_pid=$!
stop() {
  if kill -0 "$server_pid" 2>/dev/null; then
    kill "$server_pid" 2>/dev/null
    wait "$server_pid" 2>/dev/null
  fi
  rm -f "$log"
}
trap stop EXIT

port=""
for _ in $(seq 1 300); do  # up to 30 s
  port=$(sed -n 's/.*(port \([0-9][0-9]*\)).*/\1/p' "$log" | head -n 1)
  [ -n "$port" ] && break
  if ! kill -0 "$server_pid" 2>/dev/null; then
    break
  fi
  sleep 0.1
done
if [ -z "$port" ]; then
  echo "run_with_server.sh: trisolved did not report its port; its log:" >&2
  cat "$log" >&2
  exit 1
fi
echo "run_with_server.sh: trisolved (pid $server_pid) on 127.0.0.1:$port"
TRISOLVE_SERVER=127.0.0.1:$port "$@"
status=$?
# EXPECT_RING=1: the program's small solves must have gone through a request ring.
if [ $status -eq 0 ] && [ "${EXPECT_RING:-0}" = 1 ] && ! grep -q 'ring .* opened' "$log"; then
  echo "run_with_server.sh: $1 opened no request ring (EXPECT_RING=1)" >&2
  status=1
fi
if [ $status -ne 0 ]; then
  echo "run_with_server.sh: $1 exited with $status; the server's log:" >&2
  tail -n 40 "$log" >&2
fi
exit $status
