#!/usr/bin/env python3
"""A cable-equation time loop on trisolve: implicit Euler on branched cells (Hines systems).

For each of `--cells` cells of one morphology (a soma and a few dendrites, numbered depth-first)

    C dV/dt = sum over neighbours j of g_ax (V_j - V) - g_m(t) (V - E_L) + I(t),

each step solves (C/dt + g_m(t) + sum g_ax) V_new - sum g_ax V_j,new = C/dt V + g_m E_L + I.
The matrix keeps its off-diagonal (axial) entries; the diagonal changes every step with the
membrane conductance g_m(t) (a synapse opening and closing). So the system is created once by
handle, and each step sends only the new diagonal and right-hand side over the time-step stream.
If the server answers UNIMPLEMENTED for handles, the loop says so and sends the whole system
each step instead. With --shm (a client on the server's host), diag and rhs are written into
registered shared memory and the server writes V there too: no array crosses the socket.
With --no-handles each step is one small unary solve, which a client on the server's host sends
through a request ring (--transport auto or ring) instead of a gRPC call.

    python3 client/python/examples/cable_time_loop.py --server 127.0.0.1:50051 --steps 200
    python3 client/python/examples/cable_time_loop.py --shm
    python3 client/python/examples/cable_time_loop.py --no-handles --transport ring

Prints the server's residual (normwise backward error) and the steps per second.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

try:
    import trisolve
except ImportError:  # run from the source tree
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    import trisolve


def morphology(dendrites: int, length: int) -> np.ndarray:
    """parent[] of a soma (node 0) with `dendrites` unbranched dendrites of `length` nodes, the
    first one forking halfway (depth-first numbering: parent[i] < i)."""
    parent = [-1]
    for d in range(dendrites):
        start = len(parent)
        parent.append(0)
        parent.extend(range(start, start + length - 1))
        if d == 0:  # a side branch from the middle of the first dendrite
            fork = start + length // 2
            parent.append(fork)
            parent.extend(range(len(parent) - 1, len(parent) - 1 + length // 2 - 1))
    return np.array(parent, dtype=np.int32)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--server", default=os.environ.get("TRISOLVE_SERVER", trisolve.DEFAULT_TARGET))
    p.add_argument("--token", default=os.environ.get("TRISOLVE_TOKEN"))
    p.add_argument("--cells", type=int, default=64)
    p.add_argument("--dendrites", type=int, default=4)
    p.add_argument("--length", type=int, default=50, help="nodes a dendrite")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--dt", type=float, default=0.025, help="ms")
    p.add_argument("--dtype", choices=["float64", "float32"], default="float64")
    p.add_argument("--no-handles", action="store_true",
                   help="send the whole system each step (what the fallback does)")
    p.add_argument("--shm", action="store_true",
                   help="diag, rhs and V in registered shared memory (client on the server's host)")
    p.add_argument("--transport", choices=["auto", "shm", "streams", "grpc", "ring"], default="auto",
                   help="the client's transport (ring: every step through a request ring)")
    args = p.parse_args()

    dt_np = np.dtype(args.dtype)
    parent = morphology(args.dendrites, args.length)
    n, cells = len(parent), args.cells
    rng = np.random.default_rng(0)
    C, E_L, g_leak, g_ax = 1.0, -65.0, 0.1, 5.0     # uF/cm2, mV, mS/cm2, mS/cm2 (per segment)
    # Axial coupling: node i to parent[i]; cells differ a little (their diameters).
    g = np.tile(g_ax * np.ones(n), (cells, 1)) * rng.uniform(0.8, 1.2, (cells, 1))
    g[:, 0] = 0.0
    lower = -g            # A[i][parent[i]]
    upper = -g            # A[parent[i]][i]
    axial = g.copy()      # sum of the couplings at each node: its own, and its children's
    np.add.at(axial, (slice(None), parent[1:]), g[:, 1:])
    synapse = rng.integers(1, n, cells)             # where each cell's synapse sits

    E_syn = 0.0                                      # mV, an excitatory synapse's reversal
    cell = np.arange(cells)

    def step_arrays(k: int, V: np.ndarray, into=None):
        t = k * args.dt
        g_syn = 2.0 * np.exp(-(((t % 5.0) - 1.0) / 0.5) ** 2)  # opens every 5 ms
        g_m = np.full((cells, n), g_leak)
        g_m[cell, synapse] += g_syn
        I = np.zeros((cells, n))
        I[:, 0] = 0.5                                   # current injected at the soma
        diag = C / args.dt + g_m + axial
        rhs = C / args.dt * V + g_leak * E_L + I
        rhs[cell, synapse] += g_syn * E_syn
        if into is not None:  # written in place (shared memory the server reads)
            into[0][:] = diag
            into[1][:] = rhs
            return into
        return diag.astype(dt_np), rhs.astype(dt_np)

    V = np.full((cells, n), E_L)
    client = trisolve.Client(args.server, token=args.token, timeout=60, transport=args.transport)
    print(f"cable time loop: {cells} cells x {n} nodes ({args.dendrites} dendrites), "
          f"{args.steps} steps of {args.dt} ms, {args.dtype}, server {args.server}")

    shm, step_in, V_out = None, None, None
    if args.shm:
        shm = trisolve.SharedMemory(3 * cells * n * dt_np.itemsize + 3 * 64)
        try:
            client.register_memory(shm)
            step_in = (shm.array((cells, n), dt_np), shm.array((cells, n), dt_np))
            V_out = shm.array((cells, n), dt_np)
            print(f"diag, rhs and V in shared memory {shm.key} ({shm.size} bytes)")
        except trisolve.FailedPrecondition as e:
            print(f"the server cannot map this process's memory ({e.message}): "
                  "sending the arrays over the socket instead")
            shm.close()
            shm = None

    system = None
    if not args.no_handles:
        diag0, _ = step_arrays(0, V)
        try:
            system = client.create_system("tree", parent=parent, lower=lower.astype(dt_np),
                                          upper=upper.astype(dt_np), diag=diag0,
                                          label="cable-time-loop")
            print(f"system {system.handle} kept on the server; each step sends diag and rhs")
        except trisolve.Unimplemented as e:
            print(f"the server answers UNIMPLEMENTED for persistent systems ({e.message}): "
                  "sending the whole system each step instead")

    worst, last = 0.0, None
    t0 = time.perf_counter()
    if system is not None:
        with system, system.stream() as stream:
            for k in range(args.steps):
                diag, rhs = step_arrays(k, V, step_in)
                last = stream.solve(rhs, update={"diag": diag}, out=V_out)
                V = last.x.astype(np.float64)
                worst = max(worst, last.summary.residual)
    else:
        lo, up = lower.astype(dt_np), upper.astype(dt_np)
        for k in range(args.steps):
            diag, rhs = step_arrays(k, V, step_in)
            last = client.solve_tree(parent, lo, up, diag, rhs, out=V_out)
            V = last.x.astype(np.float64)
            worst = max(worst, last.summary.residual)
    elapsed = time.perf_counter() - t0
    client.close()
    if shm is not None:
        shm.close()

    assert last is not None
    if not last.ok or not np.all(np.isfinite(V)):
        print(f"FAILED: statuses {np.bincount(last.status, minlength=4).tolist()}")
        return 1
    print(f"soma V after {args.steps * args.dt:.2f} ms: {V[:, 0].mean():.3f} mV (cell mean); "
          f"method {last.summary.method}, backend {last.summary.backend}")
    print(f"residual (backward error): last {last.summary.residual:.3e}, worst {worst:.3e}")
    print(f"arrays by {last.summary.transport}")
    print(f"{args.steps / elapsed:.1f} steps/s ({elapsed / args.steps * 1e3:.3f} ms a step, "
          f"{cells * n * args.steps / elapsed / 1e6:.2f} M node-updates/s)")
    limit = 1e-12 if dt_np == np.float64 else 1e-5
    if worst > limit:
        print(f"FAILED: residual {worst:.3e} above {limit:g}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
