#!/usr/bin/env bash
# The pipeline's last piece cut in 1 (default) or 4 (TRISOLVE_STAGING_TAPER), 2^24 through the
# ring by reference, unary and by handle, three interleaved rounds.
set -uo pipefail
tar -xJf .gpu.tar.xz
mkdir -p $OUT/taper
for r in 1 2 3; do for t in 1 4 2; do
  TRISOLVE_STAGING_TAPER=$t OUT=$OUT/taper/r${r}_t$t BUNDLES=new TRANSPORTS="shm-ring" SHAPES=65536x256 REQUESTS=20 \
    bash tests/bench/run_datapath_gpu.sh > /dev/null 2>&1
done; done
tar -czf $OUT/taper.tgz -C $OUT taper
for f in $OUT/taper/r*/datapath_new.log; do echo "== $f"; grep -E "trisolve  |server, mean" $f; done
