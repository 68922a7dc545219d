#!/usr/bin/env python3
"""The generator of docs/performance.md's tables (perf_tables.py) fails its check where the doc
and the baselines disagree, in either direction, and rewrites the doc to agree; malformed
markers and missing baselines are refused, not skipped. Runs on copies in a temporary folder."""
import csv
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.dirname(os.path.dirname(HERE))
GEN = os.path.join(HERE, "perf_tables.py")


class PerfTables(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp()
        self.doc = os.path.join(self.tmp, "performance.md")
        self.base = os.path.join(self.tmp, "baselines")
        shutil.copy(os.path.join(TOP, "docs", "performance.md"), self.doc)
        shutil.copytree(os.path.join(HERE, "baselines"), self.base)

    def tearDown(self):
        shutil.rmtree(self.tmp)

    def gen(self, *args):
        return subprocess.run([sys.executable, GEN, "--doc", self.doc, "--baselines", self.base,
                               *args], capture_output=True, text=True)

    def text(self):
        with open(self.doc) as f:
            return f.read()

    def write(self, text):
        with open(self.doc, "w") as f:
            f.write(text)

    def test_committed_doc_agrees(self):
        r = self.gen("--check")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)

    def test_hand_edited_figure_fails_and_is_rewritten(self):
        before = self.text()
        self.assertIn("| 0.229 ms (98%, partitioned) |", before)
        self.write(before.replace("| 0.229 ms (98%, partitioned) |",
                                  "| 0.200 ms (98%, partitioned) |", 1))
        r = self.gen("--check")
        self.assertEqual(r.returncode, 1)
        self.assertIn("-| float64 | 32 |", r.stdout)  # the diff names the row
        self.assertEqual(self.gen().returncode, 0)
        self.assertEqual(self.text(), before)

    def test_new_baseline_forces_the_doc(self):
        path = os.path.join(self.base, "h100", "bench_tree.csv")
        with open(path) as f:
            rows = list(csv.DictReader(f))
        for r in rows:
            if r["tree"] == "morphology" and r["cells"] == "10240" and \
                    r["solver"] == "trisolve contraction-block" and r["layout"] == "flat":
                r["ms"] = "0.600"
        with open(path, "w") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]), lineterminator="\n")
            w.writeheader()
            w.writerows(rows)
        self.assertEqual(self.gen("--check").returncode, 1)
        self.assertEqual(self.gen().returncode, 0)
        self.assertIn("| 10,240 | 32,634,880 | **0.600 ms** |", self.text())
        self.assertEqual(self.gen("--check").returncode, 0)

    def test_converted_csvs_are_their_logs(self):
        """The CSVs converted from a log (log_to_csv.py) are that log's rows, not edited."""
        for kind in ("tree", "dense", "block"):
            for gpu in sorted(os.listdir(self.base)):
                log = os.path.join(self.base, gpu, f"bench_{kind}.log")
                if not os.path.exists(log):
                    continue
                r = subprocess.run([sys.executable, os.path.join(HERE, "log_to_csv.py"), kind, log],
                                   capture_output=True, text=True)
                self.assertEqual(r.returncode, 0, r.stderr)
                with open(os.path.join(self.base, gpu, f"bench_{kind}.csv")) as f:
                    self.assertEqual(r.stdout, f.read(), f"{gpu}/bench_{kind}.csv")

    def test_prose_outside_the_markers_is_kept(self):
        self.write(self.text().replace("## Dense systems", "## Dense systems\n\nhand-written"))
        self.assertEqual(self.gen("--check").returncode, 0)

    def test_refusals(self):
        text = self.text()
        for bad, why in [(text.replace("<!-- end generated -->", "", 1), "is not closed"),
                         (text.replace("h100/tridiagonal", "h100/nonesuch", 1), "no table"),
                         (text.replace("h100/tridiagonal", "a100/tridiagonal", 1), "is missing"),
                         ("no tables here\n", "no generated tables")]:
            self.write(bad)
            r = self.gen("--check")
            self.assertEqual(r.returncode, 2, why)
            self.assertIn(why, r.stderr)


if __name__ == "__main__":
    unittest.main()
