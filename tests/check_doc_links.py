#!/usr/bin/env python3
"""Dead links to repository files in the Markdown documents: every relative link
[text](path#anchor) and every path in backticks that names a file of the repository
(`tests/bench/results/x.log`, `results/x.log` as the bench notes write it,
`docs/kernels/README.md`, `tests/bench/baselines/h100/bench_tridiagonal.{csv,log}`) must exist.
A link's #anchor must name a heading of the target document (GitHub's slugs). A moved or
pruned file, or a renamed heading, then fails here, naming the document, the line and the path.
Paths with a placeholder or a pattern (`*`, `...`, `<family>`, `NAME`, `$OUT`) are not
checked, nor are build outputs (`build/`, `build-cuda/`), nor the files a command writes.
  python3 tests/check_doc_links.py REPO_ROOT"""
import os
import re
import subprocess
import sys

TOP_DIRS = ("docs/", "tests/", "kernels/", "server/", "client/", "deploy/", "proto/", ".ci/")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
CODE = re.compile(r"`([^`\s]+)`")
PLACEHOLDER = re.compile(r"[*<>$]|\.\.\.|\bNAME\b|\bGPU\b|\bFILE\b|\bLOG\b|\bCSV\b|/X\b")


def expand(path):
    """a.{csv,log} -> a.csv, a.log (one brace group)."""
    m = re.search(r"\{([^{}]*)\}", path)
    if not m:
        return [path]
    return [path[:m.start()] + alt + path[m.end():] for alt in m.group(1).split(",")]


def slug(heading):
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    s = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return s.replace(" ", "-")


def anchors(path, cache={}):
    if path not in cache:
        found, fence = set(), False
        with open(path, errors="replace") as f:
            for line in f:
                if line.startswith("```"):
                    fence = not fence
                m = re.match(r"#{1,6} (.+)", line)
                if m and not fence:
                    base, n = slug(m.group(1)), 0
                    while (base if n == 0 else f"{base}-{n}") in found:
                        n += 1
                    found.add(base if n == 0 else f"{base}-{n}")
        cache[path] = found
    return cache[path]


def tracked(root):
    out = subprocess.run(["git", "-C", root, "ls-files"], capture_output=True, text=True)
    if out.returncode != 0:
        return None
    return [f for f in out.stdout.split("\n") if f]


def candidates(doc, line):
    """(path as written, [paths relative to the root that would satisfy it])."""
    here = os.path.dirname(doc)
    for m in LINK.finditer(line):
        target, _, anchor = m.group(1).partition("#")
        if re.match(r"[a-z][a-z0-9+.-]*:", target) or PLACEHOLDER.search(target):
            continue
        if not target:
            yield m.group(1), [doc + "#" + anchor]
            continue
        path = os.path.normpath(os.path.join(here, target))
        yield m.group(1), [path + ("#" + anchor if anchor else "")]
    for m in CODE.finditer(line):
        p = m.group(1).rstrip(".,;:)")
        if PLACEHOLDER.search(p) or "=" in p or p.endswith("/"):
            continue
        if p.startswith("results/") and re.search(r"\.(log|csv|txt|patch)\b|\}", p):
            # the bench notes cite results/ relative to tests/bench/
            yield p, [os.path.normpath(os.path.join("tests/bench", p))]
        elif p.startswith(TOP_DIRS) and re.search(r"\.[a-z]{1,5}\b|\}", p.split("/")[-1]):
            yield p, [os.path.normpath(p)]


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else ".")
    files = tracked(root)
    if files is None:
        print("not a git checkout: nothing to check", file=sys.stderr)
        return 77
    exists = set(files)
    dirs = {os.path.dirname(f) for f in files}
    while any(d and os.path.dirname(d) not in dirs for d in dirs):
        dirs |= {os.path.dirname(d) for d in dirs}
    docs = [f for f in files if f.endswith(".md") and "/results/" not in f]
    dead, checked = [], 0
    for doc in docs:
        with open(os.path.join(root, doc), errors="replace") as f:
            for no, line in enumerate(f, 1):
                for written, paths in candidates(doc, line):
                    for p in paths:
                        for q in expand(p):
                            q, _, anchor = q.rstrip("/").partition("#")
                            checked += 1
                            if q.startswith(("build", "..")):
                                continue
                            if q not in exists and q not in dirs:
                                dead.append(f"{doc}:{no}: {written} ({q} is not in the repository)")
                            elif anchor and q.endswith(".md") and \
                                    anchor not in anchors(os.path.join(root, q)):
                                dead.append(f"{doc}:{no}: {written} (no heading '#{anchor}' in {q})")
    for d in dead:
        print(d)
    print(f"{len(docs)} documents, {checked} paths checked, {len(dead)} dead", file=sys.stderr)
    return 1 if dead else 0


if __name__ == "__main__":
    sys.exit(main())
