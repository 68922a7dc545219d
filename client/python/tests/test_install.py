"""`pip install --no-build-isolation --no-deps client/python` into a fresh virtual environment
(with the system's site packages, where Debian's grpcio/protobuf/numpy are), then a solve from
the installed copy, run from outside the source tree."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parent.parent


def test_pip_install_and_solve(server, tmp_path):
    venv = tmp_path / "venv"
    made = subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)],
                          capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"python3 -m venv failed (apt-get install python3-venv): {made.stderr.strip()}")
    py = venv / "bin" / "python"
    inst = subprocess.run([str(py), "-m", "pip", "install", "--no-build-isolation", "--no-deps",
                           "--no-index", "--quiet", str(PKG)], capture_output=True, text=True,
                          timeout=300)
    assert inst.returncode == 0, inst.stdout + inst.stderr
    code = (
        "import trisolve, numpy as np, sys\n"
        "assert 'site-packages' in trisolve.__file__, trisolve.__file__\n"
        f"c = trisolve.Client('{server.target}', timeout=30)\n"
        "r = c.solve_tridiagonal([0.0, 1, 1], [2.0, 2, 2], [1.0, 1, 0], [4.0, 8, 8])\n"
        "assert np.allclose(r.x, [1, 2, 3]), r.x\n"
        "print('installed', trisolve.__version__, r.summary.method)\n")
    run = subprocess.run([str(py), "-c", code], capture_output=True, text=True, cwd=tmp_path,
                         timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "installed 0.1.0" in run.stdout
