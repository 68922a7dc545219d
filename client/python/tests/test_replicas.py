"""Replicas behind the Python client's balancing: real trisolved processes on loopback (CPU).

Calls spread over the replicas, a system's calls go to the replica its handle names (from this
client and from a fresh one), a killed replica's handles raise NotFound and the others' still
solve; a handle naming an address outside the target is never sent. The service config is the
C++ library's.
"""
from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Iterator, List

import numpy as np
import pytest
import trisolve
from trisolve import _replicas
from trisolve._proto import pb

from conftest import ServerProcess
from reference import random_tridiagonal, thomas_batch


@pytest.fixture
def replicas() -> Iterator[List[ServerProcess]]:
    started = [ServerProcess("--advertise-address", "127.0.0.1", "--cpu-threads", "1")
               for _ in range(3)]
    yield started
    for s in started:
        s.stop()


def jobs_done(server: ServerProcess) -> int:
    with trisolve.Client(server.target, timeout=30) as direct:
        return direct.server_info().jobs_done


def warm_up(client: trisolve.Client, replicas: List[ServerProcess]) -> None:
    """Solves until every replica has answered one (round_robin reaches a replica once its
    connection is up, which on a loaded machine can take more than a few calls); 20 s at most."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        client.solve_tridiagonal(a=[0.0, 1.0], b=[2.0, 2.0], c=[1.0, 0.0], d=[1.0, 1.0])
        if all(jobs_done(s) > 0 for s in replicas):
            return
    pytest.fail("not every replica was reached in 20 s")


def test_service_config_is_the_cpp_librarys() -> None:
    cc = (Path(__file__).resolve().parents[2] / "replicas.cc").read_text()
    m = re.search(r'R"json\((.*?)\)json"', cc, re.S)
    assert m, "client/replicas.cc holds no R\"json(...)json\" service config"
    assert json.loads(m.group(1)) == _replicas.SERVICE_CONFIG


def test_calls_spread_and_handles_route_home(replicas: List[ServerProcess]) -> None:
    target = ",".join(s.target for s in replicas)
    rng = np.random.default_rng(38)
    with trisolve.Client(target, timeout=60) as client, \
            trisolve.Client(target, timeout=60) as other:
        warm_up(client, replicas)
        before = [jobs_done(s) for s in replicas]
        for _ in range(30):
            a, b, c, d = random_tridiagonal(rng, 3, 20)
            r = client.solve_tridiagonal(a, b, c, d)
            np.testing.assert_allclose(r.x, thomas_batch(a, b, c, d), rtol=1e-12, atol=1e-12)
        done = [jobs_done(s) - b0 for s, b0 in zip(replicas, before)]
        assert sum(done) == 30
        assert min(done) >= 8, f"calls per replica {done}: not spread (round_robin: 10 each)"

        systems = []
        for _ in range(6):
            a, b, c, d = random_tridiagonal(rng, 3, 20)
            systems.append((client.create_system("tridiagonal", a=a, b=b, c=c), a, b, c, d))
        homes = {_replicas.replica_of(s.handle) for s, *_ in systems}
        assert homes <= {s.target for s in replicas}
        assert len(homes) == 3, f"systems on {homes}: round_robin should use all three"
        for s, a, b, c, d in systems:
            np.testing.assert_allclose(s.solve(d).x, thomas_batch(a, b, c, d), rtol=1e-12)
            # Another client, holding only the handle, reaches the same system.
            theirs = other.system(s.handle)
            b2 = b + 1.0
            theirs.update(b=b2)
            np.testing.assert_allclose(theirs.solve(d).x, thomas_batch(a, b2, c, d), rtol=1e-12)
            with s.stream() as st:
                np.testing.assert_allclose(st.solve(d).x, thomas_batch(a, b2, c, d), rtol=1e-12)
        assert len(client.list_systems()) == 6

        gone = _replicas.replica_of(systems[0][0].handle)
        for server in replicas:
            if server.target == gone:
                server.proc.kill()
                server.proc.wait()
        for s, a, b, c, d in systems:
            if _replicas.replica_of(s.handle) == gone:
                with pytest.raises(trisolve.NotFound):
                    s.solve(d, timeout=30)
                with pytest.raises(trisolve.NotFound):
                    s.update(b=b, timeout=30)
                with pytest.raises(trisolve.NotFound):
                    with s.stream(timeout=30) as st:
                        st.solve(d)
            else:
                np.testing.assert_allclose(s.solve(d).x, thomas_batch(a, b + 1.0, c, d),
                                           rtol=1e-12)
                s.release()
        assert client.list_systems() == []
        a, b, c, d = random_tridiagonal(rng, 3, 20)
        np.testing.assert_allclose(client.solve_tridiagonal(a, b, c, d).x,
                                   thomas_batch(a, b, c, d), rtol=1e-12)


def test_handle_naming_another_address_is_not_sent(replicas: List[ServerProcess]) -> None:
    target = ",".join(s.target for s in replicas[:2])
    with trisolve.Client(target, token="secret", timeout=30) as client:
        info = trisolve.SystemInfo.from_proto(pb.SystemInfo(
            handle="sys-00000000000000000000000000000000@127.0.0.1:1", family="tridiagonal",
            dtype=pb.FLOAT64))
        forged = trisolve.System(client, info, np.dtype(np.float64))
        with pytest.raises(trisolve.NotFound, match="is not one of"):
            forged.solve(np.ones(3))
    with pytest.raises(ValueError):
        trisolve.Client("127.0.0.1:1,nohostport")
