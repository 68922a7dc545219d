"""Progress reports (``progress=``) and residual histories (``residual_history=True``) against
the real trisolved on loopback: the reports are monotone and end before the answer, nothing is
reported where nothing was asked, the history matches the answer, and a callback that raises
cancels the call and frees its slot."""
from __future__ import annotations

import math
import time

import numpy as np
import pytest

import trisolve
from conftest import ServerProcess
from test_client import block_problem


def poisson(N: int, M: int, dtype=np.float64):
    """A 5-point Poisson-like block system (the thesis' experiment 2 shape): symmetric positive
    definite, solution all ones."""
    aC = np.full((N, M), -1.0)
    bC = np.full((N, M), -1.0)
    cA = np.full((N, M), -1.0)
    cB = np.full((N, M), -1.0)
    cC = np.full((N, M), 4.0)
    aC[:, 0] = bC[:, -1] = 0
    cA[0, :] = cB[-1, :] = 0
    y = np.ones((N, M))
    f = cC * y + aC * np.roll(y, 1, 1) + bC * np.roll(y, -1, 1) + cA * np.roll(y, 1, 0) \
        + cB * np.roll(y, -1, 0)
    return [a.astype(dtype) for a in (aC, cC, bC, cA, cB, f)]


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("method", ["multigrid-cg", "red-black"])
def test_progress_and_history(client, dtype, method):
    N, M = (96, 96) if method == "multigrid-cg" else (40, 40)
    tol = 1e-10 if dtype == np.float64 else 1e-5
    seen = []
    r = client.solve_block_tridiagonal(*poisson(N, M, dtype), method=method, tol=tol,
                                       max_iterations=100000, progress=seen.append,
                                       progress_interval=0.01, residual_history=True)
    assert r.ok, r.status
    assert r.x.dtype == dtype
    np.testing.assert_allclose(r.x, 1.0, rtol=1e-6 if dtype == np.float64 else 1e-2)
    # The reports: received first, phases and iterations never going back.
    assert seen and seen[0].phase == "received"
    assert seen[0].bytes_total == 6 * N * M * np.dtype(dtype).itemsize
    order = {"received": 1, "queued": 2, "solving": 3, "sending": 4}
    assert [order[p.phase] for p in seen] == sorted(order[p.phase] for p in seen)
    its = [p.iteration for p in seen if p.phase == "solving"]
    assert its == sorted(its)
    assert all(i <= r.summary.iterations for i in its)
    assert all(p.max_iterations == 100000 and p.tol == pytest.approx(tol)
               for p in seen if p.phase == "solving")
    assert all(p.elapsed_s >= q.elapsed_s for q, p in zip(seen, seen[1:]))
    # The history: from 0 (residual 1 from y = 0) to the answer's iterations and residual.
    h = r.summary.residual_history
    assert isinstance(h, trisolve.ResidualHistory)
    assert 2 <= len(h) <= 1024
    assert h.iterations[0] == 0 and h.residuals[0] == pytest.approx(1.0)
    assert np.all(np.diff(h.iterations) > 0)
    assert h.iterations[-1] == r.summary.iterations
    assert h.residuals[-1] == r.summary.residual
    assert r.summary.residual <= tol


def test_nothing_reported_where_not_asked(client):
    arrays = poisson(32, 32)
    r = client.solve_block_tridiagonal(*arrays, tol=1e-10)
    assert r.ok and r.summary.iterations > 0
    assert len(r.summary.residual_history) == 0
    # A direct family takes progress= as well: phases, no iterations.
    rng = np.random.default_rng(2)
    a, c = rng.uniform(-1, 0, (2, 8, 50))
    b, d = 4 + rng.uniform(0, 1, (8, 50)), rng.uniform(-1, 1, (8, 50))
    seen = []
    r = client.solve_tridiagonal(a, b, c, d, progress=seen.append)
    assert r.ok
    assert [p.phase for p in seen][0] == "received"
    assert all(p.max_iterations == 0 and math.isnan(p.residual) for p in seen)
    with pytest.raises(TypeError, match="progress must be callable"):
        client.solve_tridiagonal(a, b, c, d, progress=3)
    with pytest.raises(trisolve.InvalidArgument, match="interval_s"):
        client.solve_tridiagonal(a, b, c, d, progress=seen.append, progress_interval=0.001)


def test_history_through_the_stream_and_refused_for_many_rhs(stream_client):
    """SolveStream's summary carries the history too; k right-hand sides of one matrix are
    refused (one history a solve)."""
    arrays = poisson(24, 24)
    r = stream_client.solve_block_tridiagonal(*arrays, method="cg", tol=1e-10,
                                              residual_history=True)
    assert r.summary.streamed
    assert r.summary.residual_history.iterations[-1] == r.summary.iterations
    f = np.stack([arrays[5], 2 * arrays[5]])
    with pytest.raises(trisolve.InvalidArgument, match="residual_history"):
        stream_client.solve_block_tridiagonal(*arrays[:5], f, tol=1e-10, residual_history=True)


def test_a_raising_callback_cancels_and_frees_the_slot(tmp_path):
    server = ServerProcess("--max-concurrent-jobs", "1", "--small-job-unknowns", "0")
    try:
        with trisolve.Client(server.target, timeout=60, transport="grpc") as c:
            class Stop(Exception):
                pass

            def stop_when_solving(p):
                if p.phase == "solving" and p.iteration > 0:
                    raise Stop()

            arrays = [a for a in block_problem(np.random.default_rng(5), 200, 200)[:6]]
            t0 = time.monotonic()
            with pytest.raises(Stop):
                c.solve_block_tridiagonal(*arrays, method="gauss-seidel", tol=1e-300,
                                          max_iterations=100_000_000, progress=stop_when_solving,
                                          progress_interval=0.01)
            # The only slot is free again: the next solve runs at once.
            deadline = time.monotonic() + 20
            while c.server_info().jobs_in_flight and time.monotonic() < deadline:
                time.sleep(0.01)
            r = c.solve_block_tridiagonal(*poisson(16, 16), tol=1e-10, timeout=20)
            assert r.ok
            assert r.summary.timings.queue_us < 1e6
            assert time.monotonic() - t0 < 30
    finally:
        server.stop()
