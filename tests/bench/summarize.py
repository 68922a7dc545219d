#!/usr/bin/env python3
"""Turns bench_tridiagonal's CSV into the tridiagonal table of docs/performance.md: for each
precision and n, the best trisolve kernel (each layout) and the best cuSPARSE routine, with time
and fraction of the measured device-to-device copy rate. The same rendering as the doc's
(perf_tables.py), for a CSV that is not (yet) the baseline.
  python3 tests/bench/summarize.py bench_tridiagonal.csv"""
import csv
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from perf_tables import tridiagonal_lines  # noqa: E402

if len(sys.argv) != 2:
    sys.exit(__doc__)
with open(sys.argv[1]) as f:
    print("\n".join(tridiagonal_lines(list(csv.DictReader(f)))))
