#!/usr/bin/env bash
# A mixed soak against trisolved --backend cuda on the GPU machine: for SECONDS_TOTAL (default
# 600), rounds of `trisolve bench` in five kinds at once (small unary requests from 32 clients
# over gRPC and 32 over request rings, batches by handle, a time-step stream, large unary jobs),
# every answer checked by the bench; the
# server's resident memory and the device's used memory sampled every 10 s.
#   bash tests/bench/soak_gpu.sh        (after the bundle of run_serving_gpu.sh; logs under $OUT)
set -uo pipefail
out=${OUT:-/tmp/trisolve-soak}
mkdir -p "$out"
[ -d .gpu ] || tar -xJf .gpu.tar.xz
run=.gpu/run
secs=${SECONDS_TOTAL:-600}
$run trisolved --backend cuda --listen 127.0.0.1:50171 --max-systems-per-identity 1024 --max-regions-per-identity 256 \
  >"$out/soak_trisolved.log" 2>&1 &
srv=$!
for _ in $(seq 200); do $run trisolve --server 127.0.0.1:50171 --timeout 1 health >/dev/null 2>&1 && break; sleep 0.1; done
b() { $run trisolve --server 127.0.0.1:50171 bench "$@" --json | tail -1; }
(
  while sleep 10; do
    echo "$(date +%s) rss_kb=$(ps -o rss= -p $srv) gpu_used_mib=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits)"
  done
) >"$out/soak_memory.log" &
mon=$!
end=$(( $(date +%s) + secs ))
round=0
while [ "$(date +%s)" -lt $end ]; do
  round=$((round + 1))
  pids=()
  b --clients 32 --requests 300 --n 64 --mode unary --transport grpc >>"$out/soak_small.jsonl" &
  pids+=($!)
  b --clients 32 --requests 3000 --n 64 --mode unary --transport ring >>"$out/soak_ring.jsonl" &
  pids+=($!)
  b --clients 4 --requests 50 --batch 1000 --n 64 --mode handle >>"$out/soak_handle.jsonl" & pids+=($!)
  b --clients 1 --requests 500 --batch 16 --n 1024 --mode stream >>"$out/soak_stream.jsonl" & pids+=($!)
  b --clients 1 --requests 2 --batch 64 --n 65536 --mode unary >>"$out/soak_large.jsonl" & pids+=($!)
  wait "${pids[@]}"
done
kill $mon
echo "rounds: $round"
for f in small ring handle stream large; do
  python3 - "$out/soak_$f.jsonl" "$f" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
ok = sum(r["ok"] for r in rows); wrong = sum(r["wrong"] for r in rows); err = sum(r["errors"] for r in rows)
want = sum(r["clients"] * r["requests"] for r in rows)
print(f"{sys.argv[2]:7s} runs {len(rows):4d}  requests {want:8d}  ok {ok:8d}  wrong {wrong}  errors {err}  lost {want - ok - wrong - err}")
PY
done
head -2 "$out/soak_memory.log"; tail -2 "$out/soak_memory.log"
$run trisolve --server 127.0.0.1:50171 info | tail -4
kill $srv; wait $srv
echo "server exit: $?"
