"""``python3 -m trisolve``: the package's command line.

    python3 -m trisolve plot solution x.npy -o x.png                 # a block solution, N x M
    python3 -m trisolve plot solution --server HOST:PORT aC=aC.npy cC=cC.npy bC=bC.npy \\
        cA=cA.npy cB=cB.npy f=f.npy [y0=y0.npy] -o y.png [--save-x y.npy]   # solve, then draw
    python3 -m trisolve plot history HISTORY.csv -o h.png             # iteration,residual lines
    python3 -m trisolve plot history --server HOST:PORT aC=aC.npy ... f=f.npy -o h.png \
        [--save-csv h.csv] [--progress]                              # solve, then draw
    python3 -m trisolve plot bench CSV [CSV ...] -o plot.png          # bench_tridiagonal CSVs

Exit status: 0 written; 1 the server refused or failed the solve (its code and message are
printed), or a system was not solved; 2 bad arguments or input files.
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Any, Dict, List, Optional

import numpy as np

BLOCK_ARRAYS = ("aC", "cC", "bC", "cA", "cB", "f")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python3 -m trisolve",
                                description="trisolve's Python client from the command line")
    sub = p.add_subparsers(dest="command", required=True)
    plot = sub.add_parser("plot", help="draw a solution or the benchmark tables into a file")
    what = plot.add_subparsers(dest="what", required=True)

    s = what.add_parser("solution", help="a block-tridiagonal solution as a heat map",
                        description="Draws x (N block rows x M unknowns) as a heat map: from a "
                        ".npy file, or solved first on a server from NAME=FILE.npy arrays "
                        f"({', '.join(BLOCK_ARRAYS)}, optional y0).")
    s.add_argument("inputs", nargs="+", metavar="X.npy | NAME=FILE.npy",
                   help="x itself, or the block system's arrays to solve")
    s.add_argument("-o", "--output", required=True, help="the image (.png, .svg, .pdf)")
    s.add_argument("--server", default=os.environ.get("TRISOLVE_SERVER", "127.0.0.1:50051"),
                   help="HOST:PORT of trisolved, when solving (default $TRISOLVE_SERVER or "
                   "127.0.0.1:50051)")
    s.add_argument("--token", default=os.environ.get("TRISOLVE_TOKEN"),
                   help="bearer token (default $TRISOLVE_TOKEN)")
    s.add_argument("--method", default="auto")
    s.add_argument("--tol", type=float, default=None)
    s.add_argument("--max-iterations", type=int, default=None)
    s.add_argument("--save-x", metavar="X.npy", help="also write the solved x here")
    s.add_argument("--index", type=int, default=0,
                   help="which solution of a k x N x M stack to draw (default 0)")
    s.add_argument("--title", default=None)
    s.add_argument("--dpi", type=int, default=100)

    h = what.add_parser("history", help="an iterative solve's residual history",
                        description="Draws the relative residual against the iterations: from a "
                        "CSV of iteration,residual lines (trisolve solve --history-output), or "
                        "from a block system solved first on a server from NAME=FILE.npy "
                        f"arrays ({', '.join(BLOCK_ARRAYS)}, optional y0).")
    h.add_argument("inputs", nargs="+", metavar="HISTORY.csv | NAME=FILE.npy",
                   help="the history, or the block system's arrays to solve")
    h.add_argument("-o", "--output", required=True, help="the image (.png, .svg, .pdf)")
    h.add_argument("--server", default=os.environ.get("TRISOLVE_SERVER", "127.0.0.1:50051"),
                   help="HOST:PORT of trisolved, when solving")
    h.add_argument("--token", default=os.environ.get("TRISOLVE_TOKEN"), help="bearer token")
    h.add_argument("--method", default="auto")
    h.add_argument("--tol", type=float, default=None,
                   help="when solving: the tolerance; always: drawn as a dashed line")
    h.add_argument("--max-iterations", type=int, default=None)
    h.add_argument("--save-csv", metavar="H.csv", help="also write the solved history here")
    h.add_argument("--progress", action="store_true",
                   help="when solving: print the server's progress reports on stderr")
    h.add_argument("--title", default=None)
    h.add_argument("--dpi", type=int, default=100)

    b = what.add_parser("bench", help="bench_tridiagonal CSVs as plots",
                        description="Plots the time and the fraction of the device copy rate of "
                        "the best trisolve kernel per layout and the best cuSPARSE routine "
                        "against n, per precision (the table in docs/performance.md).")
    b.add_argument("csv", nargs="+", help="bench_tridiagonal CSV files")
    b.add_argument("-o", "--output", required=True, help="the image (.png, .svg, .pdf)")
    b.add_argument("--dpi", type=int, default=100)
    return p


def _load(path: str) -> np.ndarray:
    try:
        return np.load(path, allow_pickle=False)
    except (OSError, ValueError) as e:
        raise SystemExit(_usage_error(f"cannot read {path}: {e}"))


def _usage_error(message: str) -> int:
    print(f"python3 -m trisolve: {message}", file=sys.stderr)
    return 2


def _solve(args: argparse.Namespace) -> "tuple[Optional[np.ndarray], int, str]":
    """x from the inputs: loaded, or solved on the server. (x, exit status, title)."""
    if len(args.inputs) == 1 and "=" not in args.inputs[0]:
        return _load(args.inputs[0]), 0, args.title or os.path.basename(args.inputs[0])
    r, status, title = _solve_block(args, history=False)
    return (None if r is None else r.x), status, title


def _solve_block(args: argparse.Namespace, history: bool) -> "tuple[Optional[Any], int, str]":
    """The block system of NAME=FILE.npy inputs solved on the server: (Result, status, title)."""
    arrays: Dict[str, np.ndarray] = {}
    for item in args.inputs:
        name, sep, path = item.partition("=")
        if not sep or name not in (*BLOCK_ARRAYS, "y0"):
            return None, _usage_error(f"{item!r}: expected NAME=FILE.npy with NAME one of "
                                      f"{', '.join(BLOCK_ARRAYS)}, y0 (or one X.npy alone)"), ""
        if name in arrays:
            return None, _usage_error(f"{name} given twice"), ""
        arrays[name] = _load(path)
    missing = [n for n in BLOCK_ARRAYS if n not in arrays]
    if missing:
        return None, _usage_error(f"missing {', '.join(missing)} (a block system needs "
                                  f"{', '.join(BLOCK_ARRAYS)})"), ""
    import trisolve

    def report(p: "trisolve.Progress") -> None:
        it = (f" iteration {p.iteration}/{p.max_iterations}, residual {p.residual:.3e}"
              if p.phase == "solving" and p.max_iterations else "")
        print(f"{p.elapsed_s:7.2f} s  {p.phase}{it}", file=sys.stderr)

    extra: Dict[str, Any] = {}
    if history:
        extra["residual_history"] = True
    if getattr(args, "progress", False):
        extra["progress"] = report
    try:
        with trisolve.Client(args.server, token=args.token) as client:
            r = client.solve_block_tridiagonal(**arrays, method=args.method, tol=args.tol,
                                               max_iterations=args.max_iterations, **extra)
    except trisolve.TrisolveError as e:
        print(f"python3 -m trisolve: the server said {e.code.name}: {e.message}", file=sys.stderr)
        return None, 1, ""
    s = r.summary
    print(f"solved on {args.server}: {s.method}, {s.iterations} iterations, "
          f"relative residual {s.residual:.3e}, statuses {s.ok} ok of {s.systems}")
    status = 0 if r.ok else 1
    if not r.ok:
        print("python3 -m trisolve: the system was not solved (x is 0); drawing it anyway",
              file=sys.stderr)
    title = args.title or (f"{s.method}: {s.iterations} iterations, "
                           f"residual {s.residual:.2e}")
    return r, status, title


def _history(args: argparse.Namespace) -> int:
    from . import plot
    from .results import ResidualHistory

    if len(args.inputs) == 1 and "=" not in args.inputs[0]:
        hist = ResidualHistory.from_csv(args.inputs[0])
        status, title = 0, args.title or os.path.basename(args.inputs[0])
    else:
        r, status, title = _solve_block(args, history=True)
        if r is None:
            return status
        hist = r.summary.residual_history
        if len(hist) == 0:
            print("python3 -m trisolve: the server sent no residual history (a server older "
                  "than SolveSummary.residual_history?)", file=sys.stderr)
            return 1
        if args.save_csv:
            hist.to_csv(args.save_csv)
    plot.history_plot(hist, args.output, title=title, tol=args.tol, dpi=args.dpi)
    print(f"wrote {args.output}")
    return status


def main(argv: Optional[List[str]] = None) -> int:
    args = _parser().parse_args(argv)
    from . import plot

    try:
        if args.what == "bench":
            plot.bench_plot(args.csv, args.output, dpi=args.dpi)
            print(f"wrote {args.output}")
            return 0
        if args.what == "history":
            return _history(args)
        x, status, title = _solve(args)
        if x is None:
            return status
        if args.save_x:
            np.save(args.save_x, x)
        plot.solution_heatmap(x, args.output, title=title, index=args.index, dpi=args.dpi)
        print(f"wrote {args.output}")
        return status
    except ImportError as e:  # matplotlib
        print(f"python3 -m trisolve: {e}", file=sys.stderr)
        return 1
    except (ValueError, OSError) as e:
        return _usage_error(str(e))


if __name__ == "__main__":
    sys.exit(main())
