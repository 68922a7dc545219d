"""Parallel streams into the server's memory (transport="streams", and "auto" from 32 MiB
where shared memory is not possible) against the real trisolved: every family bitwise equal to
the socket path, a large job over several connections, persistent systems, auto's choices,
and allocations the server refuses."""
from __future__ import annotations

import grpc
import numpy as np
import pytest

import trisolve
from conftest import ServerProcess
from reference import random_tridiagonal
from test_shared_memory import RHS, family_jobs
from trisolve._proto import pb


@pytest.fixture(scope="module")
def streams_client(server):
    with trisolve.Client(server.target, timeout=120, transport="streams",
                         parallel_streams=4) as c:
        yield c


@pytest.fixture(scope="module")
def no_shm_server():
    """A server that maps no client memory: as one on another host, for auto's choice."""
    s = ServerProcess("--no-shared-memory")
    yield s
    s.stop()


def upload_regions(client: trisolve.Client):
    return [r for r in client.list_memory() if r.name.startswith("upload-")]


@pytest.mark.parametrize("which", range(5))
def test_every_family_through_server_memory_bitwise_as_over_the_socket(client, streams_client,
                                                                        which):
    label, call, kwargs = list(family_jobs(np.random.default_rng(300 + which)))[which]
    want = getattr(client, call)(**kwargs)
    assert want.summary.transport == "grpc" and want.ok, label
    got = getattr(streams_client, call)(**kwargs)
    assert got.summary.transport == "streams", label
    assert got.x.dtype == want.x.dtype and got.x.shape == want.x.shape
    assert got.x.tobytes() == want.x.tobytes(), label  # bitwise: the same job, the same answer
    np.testing.assert_array_equal(got.status, want.status)
    assert got.summary.method == want.summary.method
    assert got.summary.iterations == want.summary.iterations

    # out=: C-contiguous (read straight into it) and a strided view (copied into it).
    out = np.full(want.x.shape, np.nan, dtype=want.x.dtype)
    got = getattr(streams_client, call)(**kwargs, out=out)
    assert got.x is out and out.tobytes() == want.x.tobytes(), label
    wide = np.full(want.x.shape[:-1] + (2 * want.x.shape[-1],), np.nan, dtype=want.x.dtype)
    view = wide[..., ::2]
    got = getattr(streams_client, call)(**kwargs, out=view)
    assert got.x is view and np.array_equal(view, want.x), label
    assert np.isnan(wide[..., 1::2]).all(), "only out's own elements are written"


def test_fortran_order_and_float32_through_server_memory(client, streams_client):
    rng = np.random.default_rng(11)
    a, b, c, d = (np.asfortranarray(v) for v in random_tridiagonal(rng, 30, 70))
    want = client.solve_tridiagonal(a, b, c, d)
    got = streams_client.solve_tridiagonal(a, b, c, d)
    assert got.summary.transport == "streams" and got.x.tobytes() == want.x.tobytes()
    a32, b32, c32, d32 = (v.astype(np.float32) for v in (a, b, c, d))
    want = client.solve_tridiagonal(a32, b32, c32, d32)
    got = streams_client.solve_tridiagonal(a32, b32, c32, d32)
    assert got.x.dtype == np.float32 and got.x.tobytes() == want.x.tobytes()


def test_a_large_job_goes_over_several_connections(client, server):
    """40 MiB (4 arrays and x of 2^20 unknowns): five lanes of at least 8 MiB, four allowed."""
    rng = np.random.default_rng(12)
    a, b, c, d = random_tridiagonal(rng, 256, 4096)
    want = client.solve_tridiagonal(a, b, c, d)
    with trisolve.Client(server.target, timeout=300, transport="streams",
                         parallel_streams=4) as sc:
        for _ in range(2):  # the second call reuses the server region
            got = sc.solve_tridiagonal(a, b, c, d)
            assert got.summary.transport == "streams"
            assert got.x.tobytes() == want.x.tobytes()
        assert len(sc._streams._lanes) == 4, "32 MiB of arrays spread over four connections"
        held = {r.name for r in sc._streams._idle}
        regions = [r for r in upload_regions(sc) if r.name in held]
        assert len(held) == 1 and len(regions) == 1 and regions[0].server_owned
        assert regions[0].bytes >= 5 * a.nbytes
        name = regions[0].name
    # Closing the client gives the server its memory back.
    assert name not in [r.name for r in upload_regions(client)]


def test_persistent_systems_through_server_memory(systems, streams_client):
    rng = np.random.default_rng(13)
    a, b, c, d = random_tridiagonal(rng, 64, 500)
    d3 = np.stack([d, 2 * d, -d])
    with systems.create_system("tridiagonal", a=a, b=b, c=c) as plain:
        want = plain.solve(d3)
    with streams_client.create_system("tridiagonal", a=a, b=b, c=c) as sys:
        got = sys.solve(d3)
        assert got.summary.transport == "streams"
        assert got.x.tobytes() == want.x.tobytes()
        out = np.empty_like(d3)
        assert sys.solve(d3, out=out).x is out and out.tobytes() == want.x.tobytes()


def test_auto_chooses_streams_from_32_mib_when_shared_memory_is_not_possible(no_shm_server):
    rng = np.random.default_rng(14)
    with trisolve.Client(no_shm_server.target, timeout=300, transport="grpc") as plain, \
            trisolve.Client(no_shm_server.target, timeout=300) as auto:
        small = random_tridiagonal(rng, 64, 4096)         # 2 MiB an array, 10 MiB moved
        r = auto.solve_tridiagonal(*small)
        assert auto.shared_memory_state == "grpc"          # refused once, for good
        assert r.summary.transport == "grpc-stream"        # over 4 MiB: SolveStream
        assert r.x.tobytes() == plain.solve_tridiagonal(*small).x.tobytes()
        large = random_tridiagonal(rng, 256, 4096)         # 8 MiB an array, 40 MiB moved
        r = auto.solve_tridiagonal(*large)
        assert r.summary.transport == "streams"
        assert r.x.tobytes() == plain.solve_tridiagonal(*large).x.tobytes()
    with trisolve.Client(no_shm_server.target, timeout=300, streams_min_bytes=8 << 20) as auto:
        assert auto.solve_tridiagonal(*small).summary.transport == "streams"


def test_allocations_the_server_refuses():
    """A server whose regions are capped at 1 MiB refuses the client's 16 MiB upload region:
    "streams" raises ResourceExhausted naming the cap, "auto" goes over gRPC instead."""
    server = ServerProcess("--no-shared-memory", "--max-region-bytes", str(1 << 20))
    try:
        rng = np.random.default_rng(15)
        a, b, c, d = random_tridiagonal(rng, 8, 100)
        with trisolve.Client(server.target, timeout=120, transport="streams") as sc:
            with pytest.raises(trisolve.ResourceExhausted, match="max-region-bytes|max_region_bytes") as e:
                sc.solve_tridiagonal(a, b, c, d)
            assert e.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert sc._streams._count == 0, "the refused allocation is not counted as held"
            # Bad requests of its own are refused too, each with its code.
            for req, code in [(pb.AllocateMemoryRequest(name="no spaces", bytes=4096),
                               grpc.StatusCode.INVALID_ARGUMENT),
                              (pb.AllocateMemoryRequest(name="zero", bytes=0),
                               grpc.StatusCode.INVALID_ARGUMENT)]:
                with pytest.raises(trisolve.TrisolveError) as e:
                    sc._unary("AllocateMemory", req)
                assert e.value.code == code
        large = random_tridiagonal(rng, 256, 4096)
        with trisolve.Client(server.target, timeout=300) as auto, \
                trisolve.Client(server.target, timeout=300, transport="grpc") as plain:
            r = auto.solve_tridiagonal(*large)
            assert r.summary.transport == "grpc-stream"
            assert r.x.tobytes() == plain.solve_tridiagonal(*large).x.tobytes()
    finally:
        server.stop()


def test_a_write_into_another_identitys_region_is_not_found(streams_client, server):
    """Regions belong to the identity that allocated them; a name it never allocated (or one
    released) is NOT_FOUND for a write, as for a request that refers to it."""
    def chunks():
        yield pb.MemoryChunk(region="upload-0000000000000000", offset=0, data=b"\0" * 8)
    with pytest.raises(grpc.RpcError) as e:
        streams_client._stub.WriteMemory(chunks(), timeout=30)
    assert e.value.code() == grpc.StatusCode.NOT_FOUND


def test_transport_names():
    with pytest.raises(ValueError, match="streams"):
        trisolve.Client("127.0.0.1:1", transport="parallel")
    c = trisolve.Client("127.0.0.1:1", transport="STREAMS")
    assert c.transport == "streams"
    c.close()
