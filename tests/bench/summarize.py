#!/usr/bin/env python3
"""Turns bench_tridiagonal's CSV into the README's table: for each precision and n, the best
trisolve kernel (each layout) and the best cuSPARSE routine, with time and fraction of the
measured device-to-device copy rate."""
import csv
import sys
from collections import defaultdict

rows = list(csv.DictReader(open(sys.argv[1])))
device, copy = rows[0]["device"], rows[0]["copy_gbs"]
best = defaultdict(dict)
for r in rows:
    key = (r["dtype"], int(r["n"]))
    who = "trisolve " + r["layout"] if r["kernel"].startswith("trisolve") else "cuSPARSE"
    if who not in best[key] or float(r["ms"]) < float(best[key][who]["ms"]):
        best[key][who] = r
print(f"{device}, device-to-device copy {copy} GB/s; 2^24 unknowns per shape; time (fraction of copy)\n")
print("| dtype | n | batch | trisolve flat | trisolve interleaved | best cuSPARSE | speed-up |")
print("|---|---|---|---|---|---|---|")
for (dtype, n), b in sorted(best.items(), key=lambda kv: (kv[0][0] != "float64", kv[0][1])):
    def cell(who):
        r = b.get(who)
        if not r:
            return "-"
        name = r["kernel"].replace("trisolve ", "").replace("cuSPARSE ", "")
        return f"{float(r['ms']):.3f} ms ({100 * float(r['fraction_of_copy']):.0f}%, {name})"
    ours = min(float(b[w]["ms"]) for w in b if w.startswith("trisolve"))
    theirs = float(b["cuSPARSE"]["ms"])
    batch = next(iter(b.values()))["batch"]
    print(f"| {dtype} | {n} | {batch} | {cell('trisolve flat')} | {cell('trisolve interleaved')} "
          f"| {cell('cuSPARSE')} | {theirs / ours:.1f}x |")
