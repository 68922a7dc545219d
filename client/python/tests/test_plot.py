"""``python3 -m trisolve plot``: a block solution's heat map (from a .npy, and solved on the real
trisolved first) and the benchmark plots from the committed CSVs; the files exist, are PNGs of
the expected pixel size and a sane byte size, and show what they should (the heat map's pixels
follow x). matplotlib is required here, not optional: deploy/packages.txt installs
python3-matplotlib, so its absence fails these tests instead of skipping them."""
from __future__ import annotations

import os
import struct
import subprocess
import sys
from pathlib import Path

import matplotlib  # an ImportError here is a failure, by design
import matplotlib.colors
import matplotlib.image
import numpy as np
import pytest

import trisolve
from trisolve import plot
from test_client import block_problem

PKG = Path(__file__).resolve().parent.parent
REPO = PKG.parent.parent
BASELINE_CSV = REPO / "tests/bench/baselines/h100/bench_tridiagonal.csv"


def png_size(path: Path):
    """(width, height) from a PNG's IHDR, after checking the signature."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def run_cli(*args: str, env=None):
    return subprocess.run([sys.executable, "-m", "trisolve", *args], cwd=PKG,
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(PKG), **(env or {})})


def pressure_field(N: int, M: int) -> np.ndarray:
    """A smooth field with one peak: what a pressure solve looks like."""
    i, k = np.meshgrid(np.arange(N), np.arange(M), indexing="ij")
    return np.exp(-((i - 0.3 * N) ** 2 / (0.05 * N * N) + (k - 0.6 * M) ** 2 / (0.05 * M * M)))


def test_heatmap_from_npy(tmp_path):
    x = pressure_field(60, 90)
    np.save(tmp_path / "x.npy", x)
    out = tmp_path / "x.png"
    r = run_cli("plot", "solution", str(tmp_path / "x.npy"), "-o", str(out), "--dpi", "80")
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"wrote {out}" in r.stdout
    w, h = png_size(out)
    assert 400 <= w <= 800 and 320 <= h <= 800, (w, h)
    assert 5_000 < out.stat().st_size < 1_000_000, out.stat().st_size
    # The picture follows x: the brightest pixel of the map lies near x's peak, not elsewhere.
    img = matplotlib.image.imread(str(out))[..., :3]
    assert img.std() > 0.05  # not a blank or single-coloured image
    # viridis' top colour (yellow) is the peak; the colorbar is to the right of the map.
    top = np.array(matplotlib.colormaps["viridis"](1.0)[:3])
    rows, cols = np.nonzero(np.linalg.norm(img - top, axis=2) < 0.1)
    in_map = cols < 0.75 * w
    assert in_map.any()
    peak_row = np.median(rows[in_map]) / h
    assert 0.15 < peak_row < 0.6, peak_row  # the peak is at i = 0.3 N, drawn from the top


def test_heatmap_of_a_stack_and_bad_inputs(tmp_path):
    xs = np.stack([pressure_field(20, 30), -pressure_field(20, 30)])
    np.save(tmp_path / "xs.npy", xs)
    out = tmp_path / "second.png"
    r = run_cli("plot", "solution", str(tmp_path / "xs.npy"), "--index", "1", "-o", str(out))
    assert r.returncode == 0, r.stderr
    assert png_size(out)[0] > 300
    r = run_cli("plot", "solution", str(tmp_path / "xs.npy"), "--index", "5", "-o", str(out))
    assert r.returncode == 2 and "index 5" in r.stderr
    np.save(tmp_path / "line.npy", np.arange(10.0))
    r = run_cli("plot", "solution", str(tmp_path / "line.npy"), "-o", str(out))
    assert r.returncode == 2 and "N x M" in r.stderr
    r = run_cli("plot", "solution", "aC=" + str(tmp_path / "line.npy"), "-o", str(out))
    assert r.returncode == 2 and "missing cC" in r.stderr
    r = run_cli("plot", "solution", str(tmp_path / "absent.npy"), "-o", str(out))
    assert r.returncode == 2 and "cannot read" in r.stderr
    with pytest.raises(ValueError, match="N x M"):
        plot.solution_heatmap(np.zeros((2, 2, 2, 2)), str(out))
    # Non-finite values are left blank and counted, not allowed to swamp the scale.
    x = pressure_field(10, 10)
    x[3, 3] = np.nan
    plot.solution_heatmap(x, str(tmp_path / "nan.svg"))
    assert "1 non-finite" in (tmp_path / "nan.svg").read_text()


def test_heatmap_of_a_system_solved_on_the_server(server, client, tmp_path):
    rng = np.random.default_rng(21)
    arrays = dict(zip(("aC", "cC", "bC", "cA", "cB", "f"), block_problem(rng, 24, 40)[:6]))
    args = []
    for name, arr in arrays.items():
        np.save(tmp_path / f"{name}.npy", arr)
        args.append(f"{name}={tmp_path / f'{name}.npy'}")
    out, xfile = tmp_path / "y.png", tmp_path / "y.npy"
    r = run_cli("plot", "solution", "--server", server.target, *args, "--tol", "1e-12",
                "-o", str(out), "--save-x", str(xfile))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "relative residual" in r.stdout and "1 ok of 1" in r.stdout
    assert 5_000 < out.stat().st_size < 1_000_000 and png_size(out)[0] >= 500
    want = client.solve_block_tridiagonal(**arrays, tol=1e-12)
    assert np.load(xfile).tobytes() == want.x.tobytes()
    # A refusal is the server's, with its code and exit status 1.
    bad = arrays["cC"].copy()
    bad[0, 0] = np.inf
    np.save(tmp_path / "cC.npy", bad)
    r = run_cli("plot", "solution", "--server", server.target, *args, "-o", str(out))
    assert r.returncode == 1 and "INVALID_ARGUMENT" in r.stderr and "cC" in r.stderr


def test_history_plot_from_csv(tmp_path):
    # A history as the server sends it (and trisolve solve --history-output writes it).
    its = np.arange(0, 400, 8)
    h = trisolve.ResidualHistory(iterations=its, residuals=10.0 ** (-its / 40.0))
    csv_path = tmp_path / "h.csv"
    h.to_csv(csv_path)
    assert csv_path.read_text().startswith("iteration,residual\n0,1.0\n")
    back = trisolve.ResidualHistory.from_csv(csv_path)
    assert np.array_equal(back.iterations, its) and np.array_equal(back.residuals, h.residuals)
    out = tmp_path / "h.png"
    r = run_cli("plot", "history", str(csv_path), "-o", str(out), "--tol", "1e-8", "--dpi", "80")
    assert r.returncode == 0, r.stdout + r.stderr
    w, hh = png_size(out)
    assert 400 <= w <= 800 and 250 <= hh <= 600, (w, hh)
    assert 5_000 < out.stat().st_size < 500_000, out.stat().st_size
    # The curve falls: the line's pixels (matplotlib's first colour) start high on the left and
    # end low on the right.
    img = matplotlib.image.imread(str(out))[..., :3]
    blue = np.array(matplotlib.colors.to_rgb("C0"))
    rows, cols = np.nonzero(np.linalg.norm(img - blue, axis=2) < 0.15)
    assert rows.size > 50
    left, right = rows[cols < np.percentile(cols, 10)], rows[cols > np.percentile(cols, 90)]
    assert np.median(left) < np.median(right) - 0.3 * hh
    # Bad histories are refused, exit 2, naming what is wrong.
    (tmp_path / "bad.csv").write_text("iteration,residual\n0,1\nten,0.1\n")
    r = run_cli("plot", "history", str(tmp_path / "bad.csv"), "-o", str(out))
    assert r.returncode == 2 and "bad.csv:3" in r.stderr
    (tmp_path / "back.csv").write_text("iteration,residual\n5,1\n3,0.1\n")
    r = run_cli("plot", "history", str(tmp_path / "back.csv"), "-o", str(out))
    assert r.returncode == 2 and "do not increase" in r.stderr


def test_history_of_a_system_solved_on_the_server(server, client, tmp_path):
    rng = np.random.default_rng(22)
    arrays = dict(zip(("aC", "cC", "bC", "cA", "cB", "f"), block_problem(rng, 32, 32)[:6]))
    args = []
    for name, arr in arrays.items():
        np.save(tmp_path / f"{name}.npy", arr)
        args.append(f"{name}={tmp_path / f'{name}.npy'}")
    out, csv_path = tmp_path / "h.png", tmp_path / "h.csv"
    r = run_cli("plot", "history", "--server", server.target, *args, "--method", "gauss-seidel",
                "--tol", "1e-12", "--progress", "-o", str(out), "--save-csv", str(csv_path))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "received" in r.stderr  # --progress printed the reports
    assert 5_000 < out.stat().st_size < 500_000 and png_size(out)[0] >= 500
    h = trisolve.ResidualHistory.from_csv(csv_path)
    want = client.solve_block_tridiagonal(**arrays, method="gauss-seidel", tol=1e-12,
                                          residual_history=True)
    assert np.array_equal(h.iterations, want.summary.residual_history.iterations)
    assert h.iterations[-1] == want.summary.iterations and h.residuals[-1] <= 1e-12


def test_bench_plot_from_the_committed_baseline(tmp_path):
    assert BASELINE_CSV.exists(), f"{BASELINE_CSV} (cited by docs/performance.md) is missing"
    out = tmp_path / "bench.png"
    r = run_cli("plot", "bench", str(BASELINE_CSV), "-o", str(out))
    assert r.returncode == 0, r.stdout + r.stderr
    w, h = png_size(out)
    assert (w, h) == (1100, 720), (w, h)  # 11 x 7.2 inches at 100 dpi: two precisions, two panels
    assert 30_000 < out.stat().st_size < 2_000_000, out.stat().st_size
    # The plotted points are the table's: the best of each per (dtype, n).
    best = plot._best([r for r in plot.read_bench_csv(str(BASELINE_CSV)) if r["dtype"] == "float64"])
    assert float(best[("float64", 16777216)]["trisolve flat"]["ms"]) == pytest.approx(0.272, abs=5e-4)
    assert best[("float64", 1024)]["cuSPARSE (best)"]["kernel"] == "cuSPARSE gtsv2StridedBatch"
    # Two CSVs side by side; a CSV of something else is refused, naming what is missing.
    r = run_cli("plot", "bench", str(BASELINE_CSV), str(BASELINE_CSV), "-o", str(tmp_path / "two.svg"))
    assert r.returncode == 0 and (tmp_path / "two.svg").stat().st_size > 10_000
    (tmp_path / "other.csv").write_text("a,b\n1,2\n")
    r = run_cli("plot", "bench", str(tmp_path / "other.csv"), "-o", str(out))
    assert r.returncode == 2 and "not a bench_tridiagonal CSV" in r.stderr and "kernel" in r.stderr


def test_committed_plots_in_docs_are_pngs_of_sane_size():
    """The pictures docs/ links to exist and are small PNGs (regenerate with the commands in
    docs/python.md)."""
    for name in ("tridiagonal-h100-2026-11-24.png", "block-solution-heatmap.png",
                 "residual-history.png"):
        path = REPO / "docs" / "plots" / name
        assert path.exists(), path
        w, h = png_size(path)
        assert w >= 400 and h >= 300
        assert 10_000 < path.stat().st_size < 400_000, (name, path.stat().st_size)
