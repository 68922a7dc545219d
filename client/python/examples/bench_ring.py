"""Small solves through gRPC and through a request ring: solves/s and latency of the Python client.

    python3 client/python/examples/bench_ring.py --server 127.0.0.1:50051 --n 64 --threads 1,4

For each transport (grpc, ring), each way of asking (unary: solve_tridiagonal with the whole
system; by handle: System.solve with the right-hand side) and each thread count, every thread
calls for --seconds with one system of --n rows (its own right-hand side, one client shared by
the threads, each thread on a ring of its own). Prints a Markdown table: solves/s over all
threads, and the p50 and p99 of one call as each thread saw it. Every answer is checked bit for
bit against the gRPC answer of the same right-hand side first.
"""
from __future__ import annotations

import argparse
import os
import sys
import threading
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import trisolve  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--server", default=os.environ.get("TRISOLVE_SERVER", trisolve.DEFAULT_TARGET))
    p.add_argument("--n", type=int, default=64)
    p.add_argument("--threads", default="1,4")
    p.add_argument("--seconds", type=float, default=3.0)
    args = p.parse_args()
    rng = np.random.default_rng(1)
    n = args.n
    a, c = rng.uniform(-1, 1, n), rng.uniform(-1, 1, n)
    b = 3 + np.abs(a) + np.abs(c)
    most = max(int(t) for t in args.threads.split(","))
    rhs = [rng.uniform(-1, 1, n) for _ in range(most)]
    with trisolve.Client(args.server, timeout=60, transport="grpc") as g:
        want = [g.solve_tridiagonal(a, b, c, d).x.tobytes() for d in rhs]
        system = g.create_system("tridiagonal", a=a, b=b, c=c, label="bench-ring")
    print(f"tridiagonal n = {n}, one system a call, server {args.server}, "
          f"{os.cpu_count()} cores here")
    print()
    print("| transport | call | threads | solves/s | p50 latency (us) | p99 latency (us) |")
    print("|---|---|---:|---:|---:|---:|")
    try:
        for threads in (int(t) for t in args.threads.split(",")):
            for how in ("unary", "by handle"):
                for tr in ("grpc", "ring"):
                    with trisolve.Client(args.server, timeout=60, transport=tr) as cl:
                        on = cl.system(system.handle)
                        lat: list = [[] for _ in range(threads)]
                        bad = []

                        def call(k: int) -> trisolve.Result:
                            if how == "unary":
                                return cl.solve_tridiagonal(a, b, c, rhs[k])
                            return on.solve(rhs[k])

                        def work(k: int, until: float) -> None:
                            r = call(k)  # the ring's opening is not timed
                            if r.x.tobytes() != want[k] or r.summary.transport != tr:
                                bad.append((k, r.summary.transport))
                            start.wait()
                            while time.perf_counter() < until:
                                t0 = time.perf_counter()
                                call(k)
                                lat[k].append(time.perf_counter() - t0)

                        start = threading.Barrier(threads + 1)
                        until = [0.0]
                        ts = [threading.Thread(target=lambda k=k: work(k, until[0]))
                              for k in range(threads)]
                        until[0] = time.perf_counter() + args.seconds + 1.0
                        for t in ts:
                            t.start()
                        start.wait()
                        t0 = time.perf_counter()
                        for t in ts:
                            t.join()
                        wall = time.perf_counter() - t0
                        if bad:
                            print(f"FAILED: answers differ from gRPC's: {bad[:4]}")
                            return 1
                        every = np.concatenate([np.asarray(x) for x in lat]) * 1e6
                        print(f"| {tr} | {how} | {threads} | {every.size / wall:,.0f} | "
                              f"{np.percentile(every, 50):,.0f} | {np.percentile(every, 99):,.0f} |")
    finally:
        with trisolve.Client(args.server, timeout=60, transport="grpc") as g:
            g.system(system.handle).release()
    return 0


if __name__ == "__main__":
    sys.exit(main())
