#!/bin/bash
T=/work/wt/benchdense/build/client/trisolve
for shape in 64x256 16x1024; do
  set -- ${shape/x/ }
  for c in 1 4; do
    for mode in unary handle; do
      if [ $mode = unary ]; then r=$([ $2 -ge 1024 ] && echo 3 || echo 8); else r=200; fi
      echo "### dense $shape clients $c mode $mode requests $r"
      $T --server 127.0.0.1:50931 bench --family dense --batch $1 --n $2 --clients $c --requests $r --mode $mode --json
      echo "rc=$?"
    done
  done
done
