#!/usr/bin/env bash
set -u
R=$OUT/r; mkdir -p $R
trap 'cd $OUT && tar -czf x.tgz r && rm -rf r' EXIT
tar -xJf .gpu.tar.xz
port=50420
.gpu/run trisolved --backend cuda --listen 127.0.0.1:$port --devices 0,1,2,3 --max-queued-jobs 4096 \
  --max-message-bytes 1073741824 --max-regions-per-identity 4096 > $R/srv.log 2>&1 &
p=$!
for _ in $(seq 100); do .gpu/run trisolve --server 127.0.0.1:$port --timeout 1 health >/dev/null 2>&1 && break; sleep 0.1; done
for round in 1 2; do
  .gpu/run trisolve --server 127.0.0.1:$port bench --family block --N 1024 --M 1024 --mode unary --transport shm \
     --clients 64 --requests 12 --check-every 8 > $R/bench-$round.log 2>&1 &
  b=$!
  : > $R/inflight-$round.txt
  while kill -0 $b 2>/dev/null; do
    .gpu/run trisolve --server 127.0.0.1:$port info | sed -n 's/^device: *cuda:\([0-9]\) .*; \([0-9]*\) jobs, \([0-9]*\) running.*/\1 \3/p' | tr '\n' ' ' >> $R/inflight-$round.txt
    echo >> $R/inflight-$round.txt
    sleep 0.05
  done
  wait $b
  echo "round $round: $(grep -h 'trisolve  ' $R/bench-$round.log)"
  awk 'NF==8{for(i=1;i<=8;i+=2){s[$i]+=$(i+1)}; n++} END{printf "mean in flight over %d samples:", n; for(d=0;d<4;d++) printf " cuda:%d %.2f", d, s[d]/n; print ""}' $R/inflight-$round.txt
  .gpu/run trisolve --server 127.0.0.1:$port info | grep "^device:" | sed 's/.*\(cuda:[0-9]\).*; \([0-9]*\) jobs.*/\1 \2 jobs/' | tr '\n' ' '; echo
done
kill $p; wait $p
