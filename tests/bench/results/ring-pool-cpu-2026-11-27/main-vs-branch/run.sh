#!/usr/bin/env bash
# Recorded as run on 2026-11-27 19:08 UTC: "before" was main's trisolved (0744df5) copied to
# /tmp/ringpool-before before this branch's first build, "after" this branch at b54cd54
# (--ring-threads default: 1 on 2 cores), "after2" the same with --ring-threads 2.
# ROUNDS=5 SERVERS="before after after2" OUT=... ./run.sh
# before/after: unary ring, n=64, cpu backend, interleaved rounds
set -u
cli=/work/wt/ringpool/build/client/trisolve
out=${OUT:-/tmp/rp-bench/out}; mkdir -p $out; : > $out/all.jsonl
port=50491
for round in $(seq ${ROUNDS:-3}); do
  for srv in ${SERVERS:-before after}; do
    case $srv in
      before) bin=/tmp/ringpool-before/trisolved; extra="";;
      after) bin=/work/wt/ringpool/build/server/trisolved; extra="";;
      after2) bin=/work/wt/ringpool/build/server/trisolved; extra="--ring-threads 2";;
    esac
    $bin --backend cpu --listen 127.0.0.1:$port --request-log errors --max-regions-per-identity 1024 $extra > $out/srv-$srv-$round.log 2>&1 &
    pid=$!
    for _ in $(seq 100); do $cli --server 127.0.0.1:$port --timeout 1 health >/dev/null 2>&1 && break; sleep 0.1; done
    for c in ${CLIENTS:-2 16 64 256}; do
      r=$((c <= 16 ? 1000 : (c <= 64 ? 400 : 100)))
      $cli --server 127.0.0.1:$port bench --clients $c --requests $r --n 64 --mode ${MODE:-unary} --transport ring --json 2>&1 | grep '^{' | sed "s/^{/{\"server\":\"$srv\",\"round\":$round,/" >> $out/all.jsonl
    done
    kill $pid; wait $pid 2>/dev/null
  done
done
python3 - $out/all.jsonl <<'PY'
import json,statistics,sys
rows={}
for l in open(sys.argv[1]):
    j=json.loads(l); rows.setdefault((j['server'],j['clients']),[]).append(j)
print(f"{'server':8} {'clients':>7} {'runs':>4} {'req/s med':>10} {'all req/s':>26} {'p50 us':>8} {'p99 us':>9} {'bad':>4}")
for k in sorted(rows):
    rs=rows[k]; m=lambda f: statistics.median(r[f] for r in rs)
    print(f"{k[0]:8} {k[1]:>7} {len(rs):>4} {m('requests_per_s'):>10,.0f} {'/'.join('%.0f' % r['requests_per_s'] for r in rs):>26} {m('p50_ms')*1e3:>8.0f} {m('p99_ms')*1e3:>9.0f} {sum(r.get('wrong',0)+r.get('errors',0) for r in rs):>4}")
PY
