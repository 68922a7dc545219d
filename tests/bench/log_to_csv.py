#!/usr/bin/env python3
"""Turns the table a bench_tree or bench_dense run prints into a CSV, row for row, so that the
performance tables can be generated from it (tests/bench/perf_tables.py). bench_tridiagonal
writes its CSV itself (--csv FILE). Lines that are not table rows (comments, headers) are
skipped; a log with no rows is an error.
  python3 tests/bench/log_to_csv.py tree  LOG > tests/bench/baselines/GPU/bench_tree.csv
  python3 tests/bench/log_to_csv.py dense LOG > tests/bench/baselines/GPU/bench_dense.csv"""
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
    cell = re.compile(rf"\s*(\d+)\s+(\d+)\s+(.+?)\s+{NUM} ms\s+(\d+)\s+{NUM}%\s+{NUM}$")
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
                        f"{float(frac) / 100:.3f}", diff])
            continue
        m = cell.match(line)
        if m:
            cells, nodes, solver, ms, gbs, frac, diff = m.groups()
            solver, layout = split_layout(solver)
            out.append([device, copy, "morphology", cells, nodes, "", "", solver, layout, ms,
                        gbs, f"{float(frac) / 100:.3f}", diff])
    header = ["device", "copy_gbs", "tree", "cells", "nodes", "heights", "cables", "solver",
              "layout", "ms", "gbs", "fraction_of_copy", "max_diff"]
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


def main():
    if len(sys.argv) != 3 or sys.argv[1] not in ("tree", "dense"):
        sys.exit(__doc__)
    with open(sys.argv[2]) as f:
        header, rows = {"tree": tree, "dense": dense}[sys.argv[1]](f.read().splitlines())
    if not rows:
        sys.exit(f"{sys.argv[2]}: no {sys.argv[1]} rows")
    w = csv.writer(sys.stdout, lineterminator="\n")
    w.writerow(header)
    w.writerows(rows)


if __name__ == "__main__":
    main()
