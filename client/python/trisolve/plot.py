"""Pictures: a block system's solution as a heat map, an iterative solve's residual history,
and the benchmark tables as plots.

    python3 -m trisolve plot solution x.npy -o x.png
    python3 -m trisolve plot history history.csv -o history.png      # trisolve solve --history-output
    python3 -m trisolve plot history --server HOST:PORT aC=aC.npy ... f=f.npy -o history.png
    python3 -m trisolve plot solution --server HOST:PORT aC=aC.npy cC=cC.npy bC=bC.npy \\
        cA=cA.npy cB=cB.npy f=f.npy -o y.png [--save-x y.npy]
    python3 -m trisolve plot bench tests/bench/results/tridiagonal-h100-2026-11-24-session21-final.csv \\
        -o docs/plots/tridiagonal-h100.png

matplotlib (Debian's ``python3-matplotlib``) draws them, with its non-interactive Agg backend:
no display is needed. The functions here take arrays and paths and return the path written.
"""
from __future__ import annotations

import csv
import math
import os
from collections import defaultdict
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

__all__ = ["solution_heatmap", "history_plot", "bench_plot", "read_bench_csv", "BENCH_COLUMNS"]

# The columns tests/bench's bench_tridiagonal writes (and summarize.py reads).
BENCH_COLUMNS = ("device", "copy_gbs", "dtype", "n", "batch", "layout", "kernel", "ms",
                 "fraction_of_copy")


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise ImportError("trisolve's plots need matplotlib: apt-get install python3-matplotlib "
                          "(or pip install matplotlib)") from None
    matplotlib.use("Agg")  # files only: no display
    import matplotlib.pyplot as plt
    return plt


def matplotlib_ticker() -> Any:
    import matplotlib.ticker
    return matplotlib.ticker


def _block_grid(x: np.ndarray, index: int) -> np.ndarray:
    """The N x M grid of a block system's solution: x itself, or system ``index`` of a
    ``[k, N, M]`` stack."""
    x = np.asarray(x)
    if x.ndim == 3:
        if not -x.shape[0] <= index < x.shape[0]:
            raise ValueError(f"index {index} is outside the {x.shape[0]} solutions of x "
                             f"(shape {list(x.shape)})")
        x = x[index]
    elif x.ndim != 2:
        raise ValueError(f"x has shape {list(x.shape)}: a block system's solution is N x M "
                         "(block rows x unknowns a block row), or k x N x M")
    if x.size == 0:
        raise ValueError("x is empty")
    if not np.issubdtype(x.dtype, np.number):
        raise ValueError(f"x has dtype {x.dtype}, expected a floating-point array")
    return np.asarray(x, dtype=np.float64)


def solution_heatmap(x: np.ndarray, path: str, title: Optional[str] = None, index: int = 0,
                     dpi: int = 100, cmap: str = "viridis") -> str:
    """Draws a block-tridiagonal system's solution ``x`` (N block rows x M unknowns each, as
    the solve returns it) as a heat map, block row i down the vertical axis, unknown k across,
    and writes it to ``path`` (the format from its extension: .png, .svg, .pdf).

    Non-finite values (there are none in an answer the server marks OK) are drawn blank and
    counted in the caption rather than stretching the colour scale.
    """
    grid = _block_grid(x, index)
    plt = _pyplot()
    n_rows, m = grid.shape
    # Wider than tall for wide grids, within 5-10 inches a side.
    aspect = m / n_rows
    w = min(10.0, max(5.0, 6.0 * math.sqrt(aspect)))
    h = min(10.0, max(4.0, 6.0 / math.sqrt(aspect)))
    fig, ax = plt.subplots(figsize=(w, h), dpi=dpi)
    bad = ~np.isfinite(grid)
    shown = np.ma.masked_array(grid, mask=bad)
    im = ax.imshow(shown, origin="upper", aspect="auto", cmap=cmap, interpolation="nearest")
    fig.colorbar(im, ax=ax, label="x")
    ax.set_xlabel(f"unknown k within a block row (M = {m})")
    ax.set_ylabel(f"block row i (N = {n_rows})")
    finite = grid[~bad]
    caption = (f"min {finite.min():.4g}, max {finite.max():.4g}" if finite.size else "no finite value")
    if bad.any():
        caption += f"; {int(bad.sum())} non-finite values left blank"
    ax.set_title((title + "\n" if title else "") + caption, fontsize=10)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def history_plot(history: Any, path: str, title: Optional[str] = None,
                 tol: Optional[float] = None, dpi: int = 100) -> str:
    """Draws a residual history (a :class:`trisolve.ResidualHistory`, or any object with
    ``iterations`` and ``residuals`` arrays) as the relative residual against the iterations on
    a log scale, with ``tol`` as a dashed line where given, and writes it to ``path``.

    Zero residuals (an exact solve) are drawn at the bottom of the axis; non-finite ones are
    left out and counted in the caption. ``ValueError`` for an empty history or one whose
    iterations do not increase.
    """
    its = np.asarray(history.iterations, dtype=np.int64)
    res = np.asarray(history.residuals, dtype=np.float64)
    if its.size == 0 or its.size != res.size:
        raise ValueError(f"a residual history needs as many iterations as residuals, at least "
                         f"one (got {its.size} and {res.size})")
    if its.size > 1 and not np.all(np.diff(its) > 0):
        raise ValueError("the history's iterations do not increase")
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7.0, 4.5), dpi=dpi)
    finite = np.isfinite(res)
    positive = finite & (res > 0)
    floor = res[positive].min() / 10 if positive.any() else 1e-16
    shown = np.where(positive, res, floor)
    ax.semilogy(its[finite], shown[finite], marker="o" if its.size <= 64 else None,
                markersize=3, linewidth=1.5, label="||f - A y|| / ||f||")
    if tol is not None and tol > 0:
        ax.axhline(tol, linestyle="--", color="grey", linewidth=1, label=f"tol {tol:.0e}")
    ax.set_xlabel("iteration")
    ax.set_ylabel("relative residual")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="upper right")
    caption = (f"{its.size} points, {int(its[-1])} iterations, final residual "
               f"{res[-1]:.3e}" if finite[-1] else f"{its.size} points, final residual {res[-1]}")
    if not finite.all():
        caption += f"; {int((~finite).sum())} non-finite left out"
    ax.set_title(title or "residual history", fontsize=11)
    fig.text(0.5, 0.01, caption, ha="center", fontsize=8)
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    fig.savefig(path)
    plt.close(fig)
    return path


def read_bench_csv(path: str) -> List[Dict[str, str]]:
    """The rows of a bench_tridiagonal CSV; ValueError naming the missing columns."""
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        missing = [c for c in BENCH_COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise ValueError(f"{path}: not a bench_tridiagonal CSV (no column {', '.join(missing)}; "
                             f"it has {', '.join(reader.fieldnames or []) or 'none'})")
        rows = list(reader)
    if not rows:
        raise ValueError(f"{path}: no rows")
    return rows


def _best(rows: Sequence[Dict[str, str]]) -> Dict[Tuple[str, int], Dict[str, Dict[str, str]]]:
    """For each (dtype, n): the fastest row of trisolve flat, trisolve interleaved and cuSPARSE
    (as tests/bench/summarize.py makes the table in docs/performance.md)."""
    best: Dict[Tuple[str, int], Dict[str, Dict[str, str]]] = defaultdict(dict)
    for r in rows:
        key = (r["dtype"], int(r["n"]))
        who = "trisolve " + r["layout"] if r["kernel"].startswith("trisolve") else "cuSPARSE (best)"
        if who not in best[key] or float(r["ms"]) < float(best[key][who]["ms"]):
            best[key][who] = r
    return best


def bench_plot(csv_paths: Sequence[str], path: str, dpi: int = 100) -> str:
    """Plots bench_tridiagonal CSVs (2^24 unknowns a shape, n from 32 to 2^24): for each
    precision, the time of the best trisolve kernel per layout and of the best cuSPARSE
    routine against the system size n (left), and the fraction of the measured device-to-device
    copy rate each reaches (right). Several CSVs (e.g. two machines) are drawn side by side in
    the same panels, told apart by their file names."""
    plt = _pyplot()
    runs = [(os.path.basename(p).rsplit(".", 1)[0], read_bench_csv(p)) for p in csv_paths]
    dtypes = sorted({r["dtype"] for _, rows in runs for r in rows},
                    key=lambda d: (d != "float64", d))
    fig, axes = plt.subplots(len(dtypes), 2, figsize=(11, 3.6 * len(dtypes)), dpi=dpi,
                             squeeze=False)
    styles = {"trisolve flat": ("C0", "o"), "trisolve interleaved": ("C1", "s"),
              "cuSPARSE (best)": ("C3", "^")}
    lines = ["-", "--", ":", "-."]
    for row, dtype in enumerate(dtypes):
        t_ax, f_ax = axes[row]
        for ri, (label, rows) in enumerate(runs):
            best = _best([r for r in rows if r["dtype"] == dtype])
            device = rows[0]["device"]
            for who, (color, marker) in styles.items():
                pts = sorted((n, float(b[who]["ms"]), float(b[who]["fraction_of_copy"]))
                             for (d, n), b in best.items() if who in b)
                if not pts:
                    continue
                ns, ms, frac = zip(*pts)
                name = who if len(runs) == 1 else f"{who}, {label}"
                t_ax.plot(ns, ms, color=color, marker=marker, linestyle=lines[ri % 4], label=name)
                f_ax.plot(ns, [100 * v for v in frac], color=color, marker=marker,
                          linestyle=lines[ri % 4], label=name)
        copy = runs[0][1][0]["copy_gbs"]
        t_ax.set_title(f"{dtype}: time for 2^24 unknowns ({device})", fontsize=10)
        t_ax.set_ylabel("ms (lower is better)")
        f_ax.set_title(f"{dtype}: fraction of the device copy rate ({copy} GB/s)", fontsize=10)
        f_ax.set_ylabel("% of copy (higher is better)")
        f_ax.set_ylim(0, 105)
        for ax in (t_ax, f_ax):
            ax.set_xscale("log", base=2)
            ax.set_xlabel("n (unknowns a system; batch = 2^24 / n)")
            ax.grid(True, which="major", alpha=0.3)
        t_ax.set_yscale("log")
        # Plain numbers on the time axis (0.25, 1), not 2.5 x 10^-1.
        plain = matplotlib_ticker().FuncFormatter(lambda v, _: f"{v:g}")
        t_ax.yaxis.set_major_formatter(plain)
        t_ax.yaxis.set_minor_formatter(plain)
        t_ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
