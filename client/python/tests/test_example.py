"""examples/cable_time_loop.py against the real server: a few dozen steps, by handle (or the
fallback it announces), residual and steps per second printed, exit status 0."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "cable_time_loop.py"


@pytest.mark.parametrize("extra", [[], ["--no-handles"], ["--dtype", "float32"], ["--shm"],
                                   ["--shm", "--no-handles", "--dtype", "float32"],
                                   ["--no-handles", "--transport", "ring"],
                                   ["--no-handles", "--transport", "grpc"]])
def test_cable_time_loop(server, extra):
    out = subprocess.run(
        [sys.executable, str(EXAMPLE), "--server", server.target, "--cells", "16", "--steps", "40",
         *extra], capture_output=True, text=True, timeout=300)
    print(out.stdout, out.stderr)
    assert out.returncode == 0, out.stdout + out.stderr
    m = re.search(r"residual \(backward error\): last (\S+), worst (\S+)", out.stdout)
    assert m, out.stdout
    limit = 1e-5 if "float32" in extra else 1e-12
    assert float(m.group(2)) <= limit
    assert re.search(r"[0-9.]+ steps/s", out.stdout)
    if "--shm" in extra:  # the server is on this host and accepts shared memory
        assert "in shared memory /trisolve-" in out.stdout
    # Without handles each step is a small unary solve: auto takes a request ring (by
    # reference to the registered arrays with --shm); by handle, the steps carry updates, which
    # travel through the time-step stream.
    if ("--no-handles" in extra and "grpc" not in extra) or "ring" in extra:
        assert "arrays by ring" in out.stdout
    else:
        assert f"arrays by {'shared-memory' if '--shm' in extra else 'grpc'}" in out.stdout
    if "--no-handles" in extra:
        assert "kept on the server" not in out.stdout
    else:
        assert ("kept on the server" in out.stdout) or ("UNIMPLEMENTED" in out.stdout)
