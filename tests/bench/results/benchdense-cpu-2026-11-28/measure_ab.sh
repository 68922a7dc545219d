#!/bin/bash
# Before (main's trisolve, 8c4db4e's client) and after (branch benchdense), alternated, 3 rounds.
B=/tmp/bd/trisolve_before
A=/work/wt/benchdense/build/client/trisolve
S="--server 127.0.0.1:50931"
cases=(
  "bench --clients 2 --requests 2000 --n 64 --mode unary --json"
  "bench --clients 2 --requests 2000 --n 64 --mode handle --json"
  "bench --clients 1 --requests 40 --batch 256 --n 1024 --mode handle --json"
  "bench --clients 2 --requests 20 --batch 256 --n 1024 --mode unary --json"
  "bench --clients 2 --requests 20 --batch 256 --n 1024 --mode handle --transport shm --json"
  "bench --family block --N 128 --M 128 --clients 1 --requests 20 --mode handle --json"
  "bench --family block --N 128 --M 128 --clients 2 --requests 10 --mode unary --json"
)
for round in 1 2 3; do
  for c in "${cases[@]}"; do
    for which in before after; do
      bin=$B; [ $which = after ] && bin=$A
      line=$($bin $S $c | grep '^{')
      echo "$round $which $c :: $line"
    done
  done
done
