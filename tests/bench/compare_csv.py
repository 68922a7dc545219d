#!/usr/bin/env python3
"""Compares two bench_tridiagonal CSVs of the same card (a baseline and a change), row by row:
each (dtype, n, batch, layout, kernel) with both times, their ratio and both answers' max_rel_diff,
then the spread of the ratios. A refactor should show ratios within the run-to-run spread (a few
per cent) and answers as close to the reference as before.
  python3 tests/bench/compare_csv.py BASE.csv NEW.csv"""
import csv
import statistics
import sys


def rows(path):
    out = {}
    for r in csv.DictReader(open(path)):
        out[(r["dtype"], int(r["n"]), int(r["batch"]), r["layout"], r["kernel"])] = r
    return out


base, new = rows(sys.argv[1]), rows(sys.argv[2])
ratios = []
print("| dtype | n | batch | layout | kernel | base ms | new ms | new/base | base diff | new diff |")
print("|---|---|---|---|---|---|---|---|---|---|")
for key in sorted(set(base) | set(new), key=lambda k: (k[0] != "float64", k[1], k[3], k[4])):
    b, n = base.get(key), new.get(key)
    if not b or not n:
        print(f"| {' | '.join(map(str, key))} | {'-' if not b else b['ms']} | "
              f"{'-' if not n else n['ms']} | only in {'new' if n else 'base'} | | |")
        continue
    ratio = float(n["ms"]) / float(b["ms"])
    if key[4].startswith("trisolve"):
        ratios.append(ratio)
    print(f"| {' | '.join(map(str, key))} | {float(b['ms']):.4f} | {float(n['ms']):.4f} | "
          f"{ratio:.3f} | {b['max_rel_diff']} | {n['max_rel_diff']} |")
if ratios:
    print(f"\ntrisolve kernels: {len(ratios)} rows, new/base median {statistics.median(ratios):.3f}, "
          f"min {min(ratios):.3f}, max {max(ratios):.3f}")
