"""An implicit 2D pressure step solved on the server and drawn as a heat map.

    python3 client/python/examples/pressure_heatmap.py --server 127.0.0.1:50051 -o p.png

(sigma - Laplacian) p = sigma p_old + sources on an N x M grid (N block rows of M unknowns, the
block-tridiagonal family), with p_old = 0 and two Gaussian sources of opposite sign: a pressure
field with a high and a low. Prints the method, iterations and residual, and writes the picture
(docs/plots/block-solution-heatmap.png is this with the defaults).
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import trisolve  # noqa: E402
from trisolve import plot  # noqa: E402


def pressure_system(N: int, M: int, sigma: float):
    aC = np.full((N, M), -1.0)
    bC = np.full((N, M), -1.0)
    cA = np.full((N, M), -1.0)
    cB = np.full((N, M), -1.0)
    aC[:, 0] = bC[:, -1] = cA[0, :] = cB[-1, :] = 0.0  # Dirichlet walls (p = 0 outside)
    cC = np.full((N, M), 4.0 + sigma)
    i, k = np.meshgrid(np.arange(N), np.arange(M), indexing="ij")
    def bump(ci, ck, w):
        return np.exp(-((i - ci) ** 2 + (k - ck) ** 2) / (2 * w * w))
    f = 40 * bump(0.35 * N, 0.3 * M, 0.06 * M) - 25 * bump(0.65 * N, 0.72 * M, 0.08 * M)
    return dict(aC=aC, cC=cC, bC=bC, cA=cA, cB=cB, f=f)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--server", default=os.environ.get("TRISOLVE_SERVER", trisolve.DEFAULT_TARGET))
    p.add_argument("--N", type=int, default=96)
    p.add_argument("--M", type=int, default=128)
    p.add_argument("--sigma", type=float, default=0.02)
    p.add_argument("-o", "--output", default="pressure.png")
    args = p.parse_args()
    with trisolve.Client(args.server) as client:
        r = client.solve_block_tridiagonal(**pressure_system(args.N, args.M, args.sigma), tol=1e-10)
    s = r.summary
    print(f"{args.N} x {args.M}: {s.method}, {s.iterations} iterations, residual {s.residual:.2e}")
    if not r.ok:
        print("not solved:", r.status)
        return 1
    plot.solution_heatmap(r.x, args.output,
                          title=f"(sigma - Laplacian) p = sources, {args.N} x {args.M}: "
                                f"{s.method}, {s.iterations} iterations")
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
