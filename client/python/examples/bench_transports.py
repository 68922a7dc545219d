"""Times one large tridiagonal batch through each transport of the Python client.

    python3 client/python/examples/bench_transports.py --server 127.0.0.1:50051 \\
        --batch 1024 --n 4096 --transports grpc,streams,shm

Prints, per transport, how the arrays travelled and the p50 and best of --repeat calls (after
one warm-up call), with the residual pass skipped on the server so that the data path dominates.
Every answer is compared bit for bit with the first transport's.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import trisolve  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--server", default=os.environ.get("TRISOLVE_SERVER", trisolve.DEFAULT_TARGET))
    p.add_argument("--batch", type=int, default=1024)
    p.add_argument("--n", type=int, default=4096)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--transports", default="grpc,streams,shm")
    args = p.parse_args()
    rng = np.random.default_rng(1)
    a = rng.uniform(-1, 1, (args.batch, args.n))
    c = rng.uniform(-1, 1, (args.batch, args.n))
    b = 3 + np.abs(a) + np.abs(c)
    d = rng.uniform(-1, 1, (args.batch, args.n))
    moved = 5 * a.nbytes / 2**20
    first = None
    for tr in args.transports.split(","):
        with trisolve.Client(args.server, timeout=600, transport=tr) as client:
            r = client.solve_tridiagonal(a, b, c, d, skip_residual=True)
            times = []
            for _ in range(args.repeat):
                t0 = time.perf_counter()
                r = client.solve_tridiagonal(a, b, c, d, skip_residual=True)
                times.append(time.perf_counter() - t0)
            times.sort()
            if first is None:
                first = r.x
            same = "same x" if r.x.tobytes() == first.tobytes() else "DIFFERENT x"
            print(f"{tr:8s} {r.summary.transport:14s} p50 {times[len(times) // 2] * 1e3:8.1f} ms"
                  f"  best {times[0] * 1e3:8.1f} ms  {moved:.0f} MiB moved  {same}")
            if same != "same x":
                return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
