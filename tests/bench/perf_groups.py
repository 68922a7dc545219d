#!/usr/bin/env python3
"""Groups a `perf record` profile of trisolved or the trisolve CLI by where a transport's CPU
goes: the solve, user-space copies, page faults, the kernel's socket copies, the rest.

    perf_groups.py PERF_DATA [REQUESTS]   (ms of CPU a request when REQUESTS is given)
"""
import re
import subprocess
import sys


def group(sym, kernel):
    if "ThomasSweep" in sym or "FirstNonFinite" in sym or sym.startswith("0x0000"):
        return "solve + finiteness check (libgomp's unnamed frames too)"
    if "RunBench" in sym or "mersenne" in sym or "trisolve::Thomas" in sym:
        return "the bench's own data, checks and local core"
    if "memmove" in sym or "memcpy" in sym:
        return "user-space memcpy"
    if sym in ("_copy_to_iter", "_copy_from_iter"):
        return "kernel socket copy (" + sym + ")"
    if kernel and re.search(r"page|fault|pte|folio|memcg|mem_cgroup|lruvec|alloc|free|rmap|"
                            r"unmap|mm_|vma|charge|zap|tlb|lru", sym):
        return "page faults, page allocation and freeing"
    if kernel:
        return "the rest of the kernel (TCP, wake-ups, syscalls)"
    if "memset" in sym:
        return "memset"
    return "gRPC, protobuf and the rest of user space"


def main():
    path = sys.argv[1]
    requests = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    out = subprocess.run(["perf", "report", "-i", path, "-n", "--no-children", "--sort",
                          "symbol", "-g", "none", "--stdio"], capture_output=True, text=True,
                         check=True).stdout
    freq = 999
    m = re.search(r"freq\D*(\d+)", subprocess.run(["perf", "evlist", "-F", "-i", path],
                                                  capture_output=True, text=True).stdout)
    if m:
        freq = int(m.group(1))
    groups, total = {}, 0
    for line in out.splitlines():
        m = re.match(r"\s+([\d.]+)%\s+(\d+)\s+\[(.)\]\s+(.*)", line)
        if not m:
            continue
        n = int(m.group(2))
        sym = m.group(4).split("  ")[0].strip()
        total += n
        g = group(sym, m.group(3) == "k")
        groups[g] = groups.get(g, 0) + n
    print(f"{path}: {total} samples at {freq} Hz ({total / freq:.2f} s of CPU)")
    for g, n in sorted(groups.items(), key=lambda x: -x[1]):
        per = f"{n / freq * 1e3 / requests:8.1f} ms a request  " if requests else ""
        print(f"  {per}{100 * n / total:5.1f}%  {g}")


if __name__ == "__main__":
    main()
