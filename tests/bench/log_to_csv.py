#!/usr/bin/env python3
"""Turns the tables a bench_tree, bench_dense or bench_block run prints into a CSV, row for row,
so that the performance tables can be generated from it (tests/bench/perf_tables.py).
bench_tridiagonal writes its CSV itself (--csv FILE). Lines that are not table rows (comments,
headers) are skipped; a log with no rows is an error.
  python3 tests/bench/log_to_csv.py tree  LOG > tests/bench/baselines/GPU/bench_tree.csv
  python3 tests/bench/log_to_csv.py dense LOG > tests/bench/baselines/GPU/bench_dense.csv
  python3 tests/bench/log_to_csv.py block LOG > tests/bench/baselines/GPU/bench_block.csv"""
import csv
import re
import sys

NUM = r"([-+\d.e]+)"


def split_layout(solver):
    """'trisolve cables (interl.)' -> ('trisolve cables', 'interleaved')."""
    m = re.fullmatch(r"(.*?)\s*\((interleaved|interl\.|flat)\)", solver)
    if not m:
        return solver, ""
    return m.group(1), "flat" if m.group(2) == "flat" else "interleaved"


def tree(lines):
    device = copy = ""
    out = []
    # (a row of cells of different sizes ends with a note in parentheses: their count, ...)
    cell = re.compile(rf"\s*(\d+)\s+(\d+)\s+(.+?)\s+{NUM} ms\s+(\d+)\s+{NUM}%\s+{NUM}"
                      r"(?:\s+\((.*)\))?$")
    whole = re.compile(rf"((?:random|chain) 2\^\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(.+?)\s+{NUM} ms"
                       rf"\s+(\d+)\s+{NUM}%\s+{NUM}$")
    for line in lines:
        m = re.match(r"device: (.+?); device-to-device copy (\d+) GB/s", line)
        if m:
            device, copy = m.groups()
            continue
        m = whole.match(line)
        if m:
            name, nodes, heights, cables, solver, ms, gbs, frac, diff = m.groups()
            solver, layout = split_layout(solver)
            out.append([device, copy, name, 1, nodes, heights, cables, solver, layout, ms, gbs,
                        f"{float(frac) / 100:.3f}", diff, ""])
            continue
        m = cell.match(line)
        if m:
            cells, nodes, solver, ms, gbs, frac, diff, note = m.groups()
            solver, layout = split_layout(solver)
            out.append([device, copy, "morphology", cells, nodes, "", "", solver, layout, ms,
                        gbs, f"{float(frac) / 100:.3f}", diff, note or ""])
    header = ["device", "copy_gbs", "tree", "cells", "nodes", "heights", "cables", "solver",
              "layout", "ms", "gbs", "fraction_of_copy", "max_diff", "note"]
    return header, out


def dense(lines):
    device = dtype = ""
    out = []
    batched = re.compile(rf"\s*(\d+)\s+(\d+)\s+(.+?)\s+{NUM} ms\s+{NUM}\s+{NUM}x$")
    single = re.compile(rf"\s*(\d+)\s+(.+?)\s+{NUM} ms\s+{NUM}x\s+{NUM}$")
    for line in lines:
        m = re.match(r"device: (.+?); \d+ matrix entries per order, (float\d+)", line)
        if m:
            device, dtype = m.groups()
            continue
        m = re.match(rf"\s*\(its backward error, from the original arrays: {NUM}\)", line)
        if m and out:
            out[-1][-1] = m.group(1)
            continue
        m = batched.match(line)
        if m:
            n, systems, solver, ms, _, _ = m.groups()
            out.append([device, dtype, n, systems, solver.strip(), 0, ms, "-1"])
            continue
        m = single.match(line)
        if m:
            n, solver, ms, _, err = m.groups()
            chosen = solver.endswith(" *")
            out.append([device, dtype, n, 1, solver.rstrip(" *"), int(chosen), ms, err])
    header = ["device", "dtype", "n", "systems", "solver", "default_panel", "ms",
              "backward_error"]
    return header, out


def block(lines):
    """One row a measurement: `experiment` says which of the log's tables it comes from."""
    header = ["device", "copy_gbs", "experiment", "n", "method", "path", "L", "iterations",
              "residual", "ms", "floor_ms", "ratio", "l1_ms", "l64_ms", "thesis_seq_s",
              "thesis_gpu_s"]
    device = copy = ""
    out = []
    section = ""

    def row(**kv):
        r = dict.fromkeys(header, "")
        r.update(device=device, copy_gbs=copy, **kv)
        out.append([r[h] for h in header])
    thesis = re.compile(rf"\s*(\d+)\s+(\d+)\s+{NUM} s\s+{NUM} s\s+{NUM} ms\s+\d+x$")
    floor = re.compile(rf"\s*(\d+) (red-black|jacobi|gauss-seidel)\s+{NUM} ms\s+{NUM} ms"
                       rf"\s+{NUM}x$")
    path = re.compile(rf"\s*(\d+) (red-black|jacobi|gauss-seidel)\s+(.+?)\s+{NUM} ms\s+{NUM} ms"
                      rf"\s+{NUM} ms$")
    solve = re.compile(rf"N=M=(\d+): (\d+) (sweeps|iterations), residual {NUM}, {NUM} ms")
    pair = re.compile(rf"N=M=(\d+): red-black (\d+) sweeps {NUM} ms; multigrid-bicgstab (\d+) "
                      rf"iterations {NUM} ms \(residuals {NUM}, {NUM}\)")
    for line in lines:
        m = re.match(r"device: (.+?); device-to-device copy (\d+) GB/s", line)
        if m:
            device, copy = m.groups()
            continue
        if re.match(r"(experiment|one sweep|sweep paths)", line):
            section = line
            continue
        m = thesis.match(line)
        if m and section.startswith("experiment 1 (tables"):
            n, L, seq, gpu, ms = m.groups()
            row(experiment="fixed-L", n=n, method="red-black", L=L, ms=ms, thesis_seq_s=seq,
                thesis_gpu_s=gpu)
            continue
        m = floor.match(line)
        if m:
            n, method, ms, fl, ratio = m.groups()
            row(experiment="sweep", n=n, method=method, ms=ms, floor_ms=fl, ratio=ratio)
            continue
        m = path.match(line)
        if m:
            n, method, how, ms, l1, l64 = m.groups()
            row(experiment="sweep-path", n=n, method=method, path=how, ms=ms, l1_ms=l1,
                l64_ms=l64 if float(l64) > 0 else "")
            continue
        m = pair.match(line)
        if m:
            n, sweeps, rb_ms, its, mg_ms, rb_res, mg_res = m.groups()
            row(experiment="nonsymmetric", n=n, method="red-black", iterations=sweeps,
                residual=rb_res, ms=rb_ms)
            row(experiment="nonsymmetric", n=n, method="multigrid-bicgstab", iterations=its,
                residual=mg_res, ms=mg_ms)
            continue
        m = solve.match(line)
        if m:
            n, its, _, res, ms = m.groups()
            if "multigrid-cg" in section:
                method = "multigrid-cg"
            elif "with cg" in section:
                method = "cg"
            elif "as it ran it" in section:
                method = "thesis, fixed sweeps"
            else:
                method = "thesis"
            row(experiment="to-1e-10", n=n, method=method, iterations=its, residual=res, ms=ms)
    return header, out


def main():
    kinds = {"tree": tree, "dense": dense, "block": block}
    if len(sys.argv) != 3 or sys.argv[1] not in kinds:
        sys.exit(__doc__)
    with open(sys.argv[2]) as f:
        header, rows = kinds[sys.argv[1]](f.read().splitlines())
    if not rows:
        sys.exit(f"{sys.argv[2]}: no {sys.argv[1]} rows")
    w = csv.writer(sys.stdout, lineterminator="\n")
    w.writerow(header)
    w.writerows(rows)


if __name__ == "__main__":
    main()
