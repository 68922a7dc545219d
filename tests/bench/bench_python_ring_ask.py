"""The Python client's own cost of one ring call, without a server: _ring.ask() writing the
request into a slot and reading the answer back, with the exchange replaced by a stand-in that
answers at once (the answer written into the slot as the server would). What remains is what a
call costs the calling thread under the GIL, apart from the wake-ups.

    python3 tests/bench/bench_python_ring_ask.py [--calls 20000] [--n 64] [--package DIR]

--package: a directory holding the trisolve package to measure (default: this tree's
client/python), so that two versions can be timed side by side. Prints microseconds a call
(the median of 5 runs of --calls calls) for a unary tridiagonal call (four arrays copied into
the arena) and for a call by handle (the right-hand side).
"""
from __future__ import annotations

import argparse
import os
import statistics
import struct
import sys
import time

import numpy as np


def main() -> int:
    here = os.path.dirname(os.path.abspath(__file__))
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=20000)
    p.add_argument("--n", type=int, default=64)
    p.add_argument("--package", default=os.path.join(here, "..", "..", "client", "python"))
    args = p.parse_args()
    sys.path.insert(0, os.path.abspath(args.package))
    from trisolve import _ring
    from trisolve.shm import SharedMemory

    n = args.n
    rng = np.random.default_rng(1)
    a, b, c, d = (rng.uniform(-1, 1, n) for _ in range(4))
    shm = SharedMemory(1 << 20)
    lane = _ring.Lane(shm, "bench")
    lane.write_header()
    slot = _ring.HEADER.itemsize
    request_tag = slot + _ring.SLOT.fields["request"][1] + _ring.REQUEST.fields["tag"][1]
    answer_at = slot + _ring.SLOT.fields["answer"][1]
    answer_tag = answer_at + _ring.ANSWER.fields["tag"][1]
    ans = np.zeros((), _ring.ANSWER)
    ans["dtype"], ans["x_rank"], ans["x_shape"][0], ans["statuses"] = 1, 1, n, 1
    ans["systems"], ans["ok"], ans["method"], ans["backend"] = 1, 1, b"thomas", b"cpu"
    answer = ans.tobytes()
    mem = lane.mem

    def answer_now(lane_, spin_us, deadline, expect_us=0.0):
        mem[answer_at:answer_at + len(answer)] = answer
        struct.pack_into("<Q", mem, answer_tag, struct.unpack_from("<Q", mem, request_tag)[0])

    _ring.exchange = answer_now
    f64 = np.dtype(np.float64)
    calls = {
        "unary (a, b, c, d copied)": _ring.Call(
            op=_ring.OP_SOLVE, family="tridiagonal", dtype=f64,
            arrays=[("d", d, None), ("a", a, None), ("b", b, None), ("c", c, None)],
            rhs_field="d", x_shape=(n,)),
        "by handle (rhs copied)": _ring.Call(
            op=_ring.OP_SOLVE_SYSTEM, family="tridiagonal", dtype=f64,
            arrays=[("rhs", d, None)], rhs_field="rhs", x_shape=(n,),
            handle="sys-0123456789abcdef0123456789abcdef", system=(1, False)),
    }
    print(f"n = {n}, {args.calls} calls a run, median of 5 runs; package {args.package}")
    for what, call in calls.items():
        x, _, _ = _ring.ask(lane, call, 0.0)
        assert x.shape == (n,)
        runs = []
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(args.calls):
                _ring.ask(lane, call, 0.0)
            runs.append((time.perf_counter() - t0) / args.calls * 1e6)
        print(f"  {what:28} {statistics.median(runs):6.1f} us a call "
              f"(runs {min(runs):.1f} .. {max(runs):.1f})")
    lane.release_views()
    shm.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
