"""Fixtures: the real trisolved on loopback (CPU backend), and the package from this tree.

TRISOLVED_BIN names the server binary (ctest passes $<TARGET_FILE:trisolved>). The stubs are
generated first (generate.sh), then client/python goes on sys.path, so the tests run the tree's
code, not an installed copy.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator, List

import pytest

PKG = Path(__file__).resolve().parent.parent
subprocess.run(["bash", str(PKG / "generate.sh")], check=True)
sys.path.insert(0, str(PKG))

import trisolve  # noqa: E402


class ServerProcess:
    """trisolved --listen 127.0.0.1:0 --backend cpu [extra], its port read from its log."""

    def __init__(self, *extra: str) -> None:
        binary = os.environ.get("TRISOLVED_BIN", "")
        if not binary or not os.access(binary, os.X_OK):
            raise RuntimeError(
                f"TRISOLVED_BIN={binary!r} is not an executable: set it to the built server, "
                "e.g. TRISOLVED_BIN=build/server/trisolved (ctest sets it)")
        fd, self.log_path = tempfile.mkstemp(prefix="trisolved_py_", suffix=".log")
        self._log = os.fdopen(fd, "wb")
        self.args: List[str] = [binary, "--listen", "127.0.0.1:0", "--backend", "cpu", *extra]
        self.proc = subprocess.Popen(self.args, stdout=self._log, stderr=subprocess.STDOUT)
        self.port = 0
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            m = re.search(r"\(port ([0-9]+)\)", self.log())
            if m:
                self.port = int(m.group(1))
                break
            if self.proc.poll() is not None:
                break
            time.sleep(0.025)
        if not self.port:
            self.stop()
            raise RuntimeError(f"{' '.join(self.args)} did not start listening:\n{self.log()}")
        self.target = f"127.0.0.1:{self.port}"

    def log(self) -> str:
        with open(self.log_path, "r", errors="replace") as f:
            return f.read()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        os.unlink(self.log_path)


@pytest.fixture(scope="session")
def server() -> Iterator[ServerProcess]:
    s = ServerProcess()
    yield s
    s.stop()


@pytest.fixture(scope="session")
def client(server: ServerProcess) -> Iterator[trisolve.Client]:
    """The socket path (transport="grpc": no staging through shared memory)."""
    with trisolve.Client(server.target, timeout=120, transport="grpc") as c:
        yield c


@pytest.fixture(scope="session")
def stream_client(server: ServerProcess) -> Iterator[trisolve.Client]:
    """Sends every job through SolveStream, in chunks of 1 KiB (several chunks an array)."""
    with trisolve.Client(server.target, timeout=120, stream_threshold_bytes=0,
                         chunk_bytes=1024, transport="grpc") as c:
        yield c


_systems_state = {}


@pytest.fixture
def systems(client: trisolve.Client) -> trisolve.Client:
    """The client, if the server keeps persistent systems; skips (saying why) if it answers
    UNIMPLEMENTED."""
    if "reason" not in _systems_state:
        _systems_state["reason"] = None
        try:
            s = client.create_system("tridiagonal", a=[0.0, 1.0], b=[2.0, 2.0], c=[1.0, 0.0],
                                     label="probe")
            s.release()
        except trisolve.Unimplemented as e:
            _systems_state["reason"] = (
                f"the server answers UNIMPLEMENTED for CreateSystem ({e.message!r}): "
                "persistent systems are not in this build of trisolved")
    if _systems_state["reason"]:
        pytest.skip(_systems_state["reason"])
    return client
