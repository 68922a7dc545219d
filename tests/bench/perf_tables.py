#!/usr/bin/env python3
"""Renders the performance tables of docs/performance.md from the committed baseline CSVs
(tests/bench/baselines/GPU/*.csv), so that the figures in the doc are the baseline's and a new
baseline forces the doc to follow.

A table lives between two marker lines; NAME is GPU/TABLE, GPU a folder of tests/bench/baselines/
and TABLE one of the renderers below (each says which CSV it reads):
    <!-- generated: h100/tridiagonal -->
    ...rendered, never edited by hand...
    <!-- end generated -->
The prose around the markers is hand-written.

  python3 tests/bench/perf_tables.py            # rewrite the generated tables in place
  python3 tests/bench/perf_tables.py --check    # exit 1 and show the diff where the doc differs
  options: --doc FILE (default docs/performance.md), --baselines DIR (default tests/bench/baselines)
"""
import argparse
import csv
import difflib
import os
import re
import sys
from collections import defaultdict

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.dirname(os.path.dirname(HERE))
BEGIN = re.compile(r"<!-- generated: ([\w.-]+)/([\w-]+) -->")
END = "<!-- end generated -->"


class TableError(Exception):
    pass


def read_csv(baselines, gpu, name):
    path = os.path.join(baselines, gpu, name)
    if not os.path.exists(path):
        raise TableError(f"{os.path.relpath(path, TOP)} is missing")
    with open(path) as f:
        rows = list(csv.DictReader(f))
    if not rows:
        raise TableError(f"{os.path.relpath(path, TOP)} has no rows")
    return rows


def ms(x):
    return f"{float(x):.3f} ms"


def ms_as_logged(x):
    """A time with the digits the benchmark printed, no more."""
    return f"{x} ms"


def pct(fraction):
    p = 100 * float(fraction)
    return f"{p:.1f}%" if p < 10 else f"{p:.0f}%"


def table(header, rows):
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return out


# --- bench_tridiagonal.csv: the best trisolve kernel of each layout and the best cuSPARSE routine

def tridiagonal_best(rows):
    """(dtype, n) -> {'trisolve flat'|'trisolve interleaved'|'cuSPARSE': fastest row}."""
    best = defaultdict(dict)
    for r in rows:
        key = (r["dtype"], int(r["n"]))
        who = "trisolve " + r["layout"] if r["kernel"].startswith("trisolve") else "cuSPARSE"
        if who not in best[key] or float(r["ms"]) < float(best[key][who]["ms"]):
            best[key][who] = r
    return best


def tridiagonal_lines(rows):
    best = tridiagonal_best(rows)
    lines = [f"{rows[0]['device']}, device-to-device copy {rows[0]['copy_gbs']} GB/s; "
             "2^24 unknowns per shape; time (fraction of copy)", ""]
    body = []
    for (dtype, n), b in sorted(best.items(), key=lambda kv: (kv[0][0] != "float64", kv[0][1])):
        def cell(who):
            r = b.get(who)
            if not r:
                return "-"
            name = r["kernel"].replace("trisolve ", "").replace("cuSPARSE ", "")
            return f"{ms(r['ms'])} ({pct(r['fraction_of_copy'])}, {name})"
        ours = [float(b[w]["ms"]) for w in b if w.startswith("trisolve")]
        speedup = (f"{float(b['cuSPARSE']['ms']) / min(ours):.1f}x"
                   if ours and "cuSPARSE" in b else "-")
        batch = next(iter(b.values()))["batch"]
        body.append([dtype, n, batch, cell("trisolve flat"), cell("trisolve interleaved"),
                     cell("cuSPARSE"), speedup])
    return lines + table(["dtype", "n", "batch", "trisolve flat", "trisolve interleaved",
                          "best cuSPARSE", "speed-up"], body)


def render_tridiagonal(baselines, gpu):
    """bench_tridiagonal.csv (bench_tridiagonal --csv)."""
    return tridiagonal_lines(read_csv(baselines, gpu, "bench_tridiagonal.csv"))


# --- bench_tridiagonal_variable.csv: variable-size batches beside uniform ones in the same run

def render_variable(baselines, gpu):
    """bench_tridiagonal_variable.csv (bench_tridiagonal --variable --csv)."""
    rows = read_csv(baselines, gpu, "bench_tridiagonal_variable.csv")
    fastest = {}
    for r in rows:  # a shape timed twice in the run: the faster time
        key = (r["dtype"], r["n"], r["batch"], r["layout"], r["kernel"])
        if key not in fastest or float(r["ms"]) < float(fastest[key]["ms"]):
            fastest[key] = r
    body = []
    for (dtype, n, batch, layout, kernel), r in fastest.items():
        if layout.startswith("variable"):
            lo, hi = layout.split()[1].split("-")
            shape = f"uniform in {lo} … {hi}"
            if layout.endswith(" unified"):
                shape += " (unified)"
            elif layout.endswith(" per system"):
                shape += " (per system)"
        else:
            shape = f"{n} ({layout})"
        err = float(r["max_rel_diff"])
        body.append([dtype, shape, f"{int(batch):,}", kernel.replace("trisolve ", ""),
                     ms(r["ms"]), r["gbs"], f"{100 * float(r['fraction_of_copy']):.1f}%",
                     f"{err:.1e}" if err >= 0 else "-"])
    lines = [f"{rows[0]['device']}, device-to-device copy {rows[0]['copy_gbs']} GB/s; 2^24 "
             "unknowns per shape", ""]
    return lines + table(["dtype", "rows a system", "systems", "kernel", "time", "GB/s",
                          "of the copy rate", "max rel. diff"], body)


# --- bench_tree.csv (log_to_csv.py tree): batches of one morphology, and single large trees

def tree_rows(baselines, gpu):
    return read_csv(baselines, gpu, "bench_tree.csv")


TREE_COLUMNS = [("trisolve contraction-block", "flat"),
                ("trisolve contraction-block", "interleaved"),
                ("trisolve cables-block", "flat"), ("trisolve hines-batch", "flat"),
                ("trisolve hines-batch", "interleaved"), ("plain one thread a cell", "interleaved"),
                ("CPU sweep, one core", "")]


def render_tree_cells(baselines, gpu):
    """bench_tree.csv, the morphology rows: each solver's time by the number of cells."""
    rows = [r for r in tree_rows(baselines, gpu) if r["tree"] == "morphology"]
    by = defaultdict(dict)
    for r in rows:
        by[int(r["cells"])][(r["solver"], r["layout"])] = r
    body = []
    for cells in sorted(by):
        got = by[cells]
        gpu_times = {k: float(got[k]["ms"]) for k in TREE_COLUMNS[:-2] if k in got}
        best = min(gpu_times, key=gpu_times.get) if gpu_times else None
        line = [f"{cells:,}", f"{int(next(iter(got.values()))['nodes']):,}"]
        for k in TREE_COLUMNS:
            if k not in got:
                line.append("-")
                continue
            text = ms_as_logged(got[k]["ms"])
            line.append(f"**{text}**" if k == best else text)
        line.append(pct(got[best]["fraction_of_copy"]) if best else "-")
        body.append(line)
    lines = [f"{rows[0]['device']}, device-to-device copy {rows[0]['copy_gbs']} GB/s; float64; "
             "fastest GPU solver in bold", ""]
    header = ["cells", "nodes", "`contraction-block` flat", "`contraction-block` interleaved",
              "`cables-block` flat", "`hines-batch` flat", "`hines-batch` interleaved",
              "plain (one thread a cell)", "CPU sweep, one core", "of copy (best)"]
    return lines + table(header, body)


def render_tree_forest(baselines, gpu):
    """bench_tree.csv, the cells of different sizes (TreeRequest.lengths) beside the uniform
    batch of as many nodes: one block a cell with per-cell plans (both kernels), the cells as
    one tree, and the uniform cells sent with lengths."""
    rows = [r for r in tree_rows(baselines, gpu) if r["tree"] == "morphology"]
    by = defaultdict(dict)
    for r in rows:
        by[int(r["cells"])][(r["solver"], r["layout"])] = r
    per_cell = ("variable cells, per-cell contr.-block", "")
    per_cell_cables = ("variable cells, per-cell cables-block", "")
    joined = ("variable cells, cables", "")
    same = ("lengths, one morphology, per-cell", "")
    uniform = ("trisolve contraction-block", "flat")

    def cell(got, key):
        if key not in got:
            return "-"
        return f"{ms_as_logged(got[key]['ms'])} ({pct(got[key]['fraction_of_copy'])})"

    def note(got, key, pattern):
        m = re.search(pattern, got[key]["note"]) if key in got else None
        return m.group(1) if m else "-"
    count, structures, analysis = r"(\d+) cells of", r"(\d+) structures", r"analysis ([\d.]+) ms"

    def ms_or_dash(v):
        return "-" if v == "-" else f"{v} ms"
    body = []
    for cells in sorted(by):
        got = by[cells]
        if per_cell not in got:
            continue
        varied = note(got, joined, count)
        body.append([f"{cells:,}", f"{int(got[per_cell]['nodes']):,}",
                     f"{int(varied):,}" if varied != "-" else "-",
                     f"{int(kinds):,}" if (kinds := note(got, per_cell, structures)) != "-"
                     else "-", cell(got, per_cell), cell(got, per_cell_cables),
                     cell(got, joined), cell(got, same), cell(got, uniform),
                     ms_or_dash(note(got, per_cell, analysis)),
                     ms_or_dash(note(got, joined, analysis))])
    if not body:
        raise TableError("bench_tree.csv has no 'variable cells, per-cell contr.-block' rows")
    return table(["uniform cells", "nodes", "cells of 32 … 3,187 nodes", "structures",
                  "`contraction-block`, per-cell plans", "`cables-block`, per-cell plans",
                  "as one tree (`cables`)",
                  "uniform cells sent with lengths", "uniform `contraction-block` flat",
                  "analysis, per-cell (host threads)", "analysis, one tree (one thread)"], body)


def render_tree_large(baselines, gpu):
    """bench_tree.csv, the single random trees and the chain: `cables` against the CPU sweep."""
    rows = [r for r in tree_rows(baselines, gpu) if r["tree"] != "morphology"]
    by = {}
    for r in rows:
        by.setdefault(r["tree"], {})[r["solver"]] = r
    body = []
    for name, got in by.items():
        first = next(iter(got.values()))

        def t(solver):
            return ms_as_logged(got[solver]["ms"]) if solver in got else "-"
        cab = got.get("trisolve cables")
        body.append([name, f"{int(first['nodes']):,}", first["heights"],
                     f"{int(first['cables']):,}",
                     t("trisolve cables"), pct(cab["fraction_of_copy"]) if cab else "-",
                     t("plain, one thread"), t("CPU sweep, one core"), t("analysis (host, once)")])
    return table(["tree", "nodes", "heights", "cables", "`cables`", "of copy",
                  "plain, one thread", "CPU sweep, one core", "analysis (host, once)"], body)


# --- bench_dense.csv (log_to_csv.py dense)

def dense_rows(baselines, gpu):
    return read_csv(baselines, gpu, "bench_dense.csv")


def err(r):
    return "-" if float(r["backward_error"]) < 0 else f"{float(r['backward_error']):.1e}"


def render_dense_batched(baselines, gpu):
    """bench_dense.csv, batches of small systems: the fastest trisolve method against cuBLAS."""
    rows = [r for r in dense_rows(baselines, gpu) if int(r["systems"]) > 1]
    by = defaultdict(list)
    for r in rows:
        by[int(r["n"])].append(r)
    body = []
    for n in sorted(by):
        ref = next((r for r in by[n] if r["solver"].startswith("cuBLAS")), None)
        ours = [r for r in by[n] if r["solver"].startswith("trisolve")]
        if not ref or not ours:
            raise TableError(f"bench_dense.csv: n = {n} lacks cuBLAS or a trisolve row")
        best = min(ours, key=lambda r: float(r["ms"]))
        name = best["solver"].replace("trisolve ", "")
        body.append([n, f"{int(ref['systems']):,}", ms_as_logged(ref["ms"]),
                     f"{ms_as_logged(best['ms'])} (`{name}`)",
                     f"{float(ref['ms']) / float(best['ms']):.2f}×", err(best)])
    lines = [f"{rows[0]['device']}, {rows[0]['dtype']}; speed-up = cuBLAS time / trisolve time", ""]
    return lines + table(["n", "systems", "cuBLAS getrfBatched + getrsBatched",
                          "trisolve (fastest)",
                          "speed-up", "backward error"], body)


def render_dense_single(baselines, gpu):
    """bench_dense.csv, one large system: lu, blocked Gauss-Jordan (the default panel) and
    householder-pcr against cuSOLVER."""
    rows = [r for r in dense_rows(baselines, gpu) if int(r["systems"]) == 1]
    by = defaultdict(dict)
    for r in rows:
        solver = r["solver"]
        if solver.startswith("trisolve gauss-jordan-blocked"):
            if r["default_panel"] != "1":
                continue
            solver = "gj"
        by[int(r["n"])][solver] = r
    body = []
    for n in sorted(by):
        got = by[n]
        getrf, sytrd = got.get("cuSOLVER getrf + getrs"), got.get("cuSOLVER sytrd (reduction only)")
        lu, gj = got.get("trisolve lu"), got.get("gj")
        hpcr = got.get("trisolve householder-pcr (+1 refinement)")
        if not lu and not gj and not hpcr:
            raise TableError(f"bench_dense.csv: n = {n} has no trisolve row")

        def timed(r, ref, extra=""):
            """A run cut short leaves a size's last rows out: '-', not an error."""
            if not r:
                return "-"
            if not ref:
                return ms_as_logged(r["ms"])
            return f"{ms_as_logged(r['ms'])} ({float(r['ms']) / float(ref['ms']):.2f}×{extra})"
        panel = re.search(r"panel (\d+)", gj["solver"]).group(1) if gj else ""
        body.append([n, ms_as_logged(getrf["ms"]) if getrf else "-", timed(lu, getrf),
                     timed(gj, getrf, f", panel {panel}"),
                     ms_as_logged(sytrd["ms"]) if sytrd else "-", timed(hpcr, sytrd),
                     " / ".join(err(r) if r else "-" for r in (lu, gj, hpcr))])
    lines = [f"{rows[0]['device']}, {rows[0]['dtype']}, one system (symmetric indefinite); "
             "ratios: `lu` and `gauss-jordan` to getrf + getrs, `householder-pcr` to sytrd alone",
             ""]
    return lines + table(["n", "cuSOLVER getrf + getrs", "trisolve `lu`",
                          "trisolve `gauss-jordan` (blocked)", "cuSOLVER sytrd alone",
                          "trisolve `householder-pcr`", "backward error (lu / gj / h-pcr)"], body)


# --- bench_block.csv (log_to_csv.py block): the thesis' experiments

def block_rows(baselines, gpu, experiment):
    rows = [r for r in read_csv(baselines, gpu, "bench_block.csv") if r["experiment"] == experiment]
    if not rows:
        raise TableError(f"bench_block.csv has no '{experiment}' rows")
    return rows


def render_block_fixed_l(baselines, gpu):
    """bench_block.csv, experiment 1 with exactly L red-black sweeps, beside the thesis' times."""
    rows = block_rows(baselines, gpu, "fixed-L")
    body = [[r["n"], r["L"], f"{r['thesis_seq_s']} s", f"{r['thesis_gpu_s']} s",
             ms_as_logged(r["ms"]), f"{1000 * float(r['thesis_gpu_s']) / float(r['ms']):.0f}×"]
            for r in rows]
    return table(["N = M", "L", "thesis, sequential", "thesis, its GPU (RTX 3060)",
                  "trisolve `red-black`", "vs its GPU"], body)


def render_block_sweep(baselines, gpu):
    """bench_block.csv, one sweep ((L = 65) - (L = 1)) / 64 against the memory floor."""
    rows = block_rows(baselines, gpu, "sweep")
    body = [[r["n"], f"`{r['method']}`", ms_as_logged(r["ms"]), ms_as_logged(r["floor_ms"]),
             f"{r['ratio']}×"] for r in rows]  # the log's ratio, of the unrounded times
    lines = [f"{rows[0]['device']}, device-to-device copy {rows[0]['copy_gbs']} GB/s; the floor: "
             "8 arrays of N·M float64 values at that rate", ""]
    return lines + table(["N = M", "method", "one sweep", "floor", "sweep / floor"], body)


def render_block_solves(baselines, gpu):
    """bench_block.csv, experiment 2 to a relative residual of 1e-10 (the thesis' method, cg,
    multigrid-cg) and experiment 1, not symmetric (red-black, multigrid-bicgstab)."""
    rows = block_rows(baselines, gpu, "to-1e-10")
    by = defaultdict(dict)
    for r in rows:
        by[int(r["n"])][r["method"]] = r

    def cell(r, unit):
        if not r:
            return "-"
        return f"{int(r['iterations']):,} {unit}, {ms_as_logged(r['ms'])}, residual {r['residual']}"
    body = []
    for n in sorted(by):
        got = by[n]
        thesis = got.get("thesis") or got.get("thesis, fixed sweeps")
        text = cell(thesis, "sweeps")
        if thesis and thesis["method"] == "thesis, fixed sweeps":
            text += " (as the thesis ran it)"
        body.append([n, text, cell(got.get("cg"), "iterations"),
                     cell(got.get("multigrid-cg"), "iterations")])
    out = table(["N = M", "thesis' method (red-black, row scaling)", "`cg` (line-preconditioned)",
                 "`multigrid-cg` (`auto`)"], body)
    nonsym = defaultdict(dict)
    for r in block_rows(baselines, gpu, "nonsymmetric"):
        nonsym[int(r["n"])][r["method"]] = r
    out += ["", "Experiment 1 (not symmetric) to 1e-10:", ""]
    out += table(["N = M", "`red-black`", "`multigrid-bicgstab`"],
                 [[n, cell(got.get("red-black"), "sweeps"),
                   cell(got.get("multigrid-bicgstab"), "iterations")]
                  for n, got in sorted(nonsym.items())])
    return out


RENDERERS = {
    "tridiagonal": render_tridiagonal,
    "variable": render_variable,
    "tree-cells": render_tree_cells,
    "tree-large": render_tree_large,
    "tree-forest": render_tree_forest,
    "dense-batched": render_dense_batched,
    "dense-single": render_dense_single,
    "block-fixed-l": render_block_fixed_l,
    "block-sweep": render_block_sweep,
    "block-solves": render_block_solves,
}


def render_doc(text, baselines):
    """The doc with every generated block re-rendered; raises TableError on a bad block."""
    lines = text.split("\n")
    out, i, seen = [], 0, 0
    while i < len(lines):
        m = BEGIN.fullmatch(lines[i].strip())
        if not m:
            if lines[i].strip() == END:
                raise TableError(f"line {i + 1}: '{END}' without a "
                                 "'<!-- generated: ... -->' before it")
            out.append(lines[i])
            i += 1
            continue
        gpu, name = m.groups()
        if name not in RENDERERS:
            raise TableError(f"line {i + 1}: no table '{name}' (known: {', '.join(RENDERERS)})")
        j = i + 1
        while j < len(lines) and lines[j].strip() != END:
            if BEGIN.fullmatch(lines[j].strip()):
                raise TableError(f"line {i + 1}: '{gpu}/{name}' is not closed before line {j + 1}")
            j += 1
        if j == len(lines):
            raise TableError(f"line {i + 1}: '{gpu}/{name}' has no '{END}'")
        out.append(lines[i])
        try:
            out += RENDERERS[name](baselines, gpu)
        except (KeyError, ValueError, AttributeError) as e:
            raise TableError(f"line {i + 1}: '{gpu}/{name}': the baseline CSV lacks or garbles "
                             f"a field ({type(e).__name__}: {e})") from e
        out.append(lines[j])
        i, seen = j + 1, seen + 1
    if not seen:
        raise TableError("no generated tables "
                         "(<!-- generated: GPU/TABLE --> ... <!-- end generated -->)")
    return "\n".join(out)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--check", action="store_true",
                   help="fail, with the diff, where the doc differs")
    p.add_argument("--doc", default=os.path.join(TOP, "docs", "performance.md"))
    p.add_argument("--baselines", default=os.path.join(HERE, "baselines"))
    a = p.parse_args()
    with open(a.doc) as f:
        text = f.read()
    try:
        new = render_doc(text, a.baselines)
    except TableError as e:
        print(f"{a.doc}: {e}", file=sys.stderr)
        return 2
    if new == text:
        return 0
    if a.check:
        sys.stdout.writelines(difflib.unified_diff(text.splitlines(True), new.splitlines(True),
                                                   a.doc, a.doc + " (from the baselines)"))
        print(f"\n{a.doc} differs from what the baselines give: run python3 "
              "tests/bench/perf_tables.py and commit the result", file=sys.stderr)
        return 1
    with open(a.doc, "w") as f:
        f.write(new)
    print(f"{a.doc}: tables rewritten from {a.baselines}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
