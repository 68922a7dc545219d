"""The shared-memory path against the real trisolved: arrays read from registered regions and x
written into them for every family, bitwise equal to the socket path; out= anywhere; auto
staging, and its fallback against a server started with --no-shared-memory; persistent systems
and the time-step stream through regions; every bad reference raising its own exception."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import grpc
import numpy as np
import pytest

import trisolve
from conftest import ServerProcess
from reference import random_tree, random_tree_parent, random_tridiagonal
from test_client import block_problem
from trisolve._proto import pb

PKG = Path(__file__).resolve().parent.parent


def on_dev_shm(shm_or_name) -> bool:
    name = shm_or_name if isinstance(shm_or_name, str) else shm_or_name.name
    return os.path.exists(os.path.join("/dev/shm", name))


def uses(client: trisolve.Client, name: str) -> int:
    for r in client.list_memory():
        if r.name == name:
            return r.uses
    raise AssertionError(f"region {name} is not registered")


@pytest.fixture
def region(server):
    """A transport="grpc" client (nothing staged) with 32 MiB of shared memory registered as a
    region of a unique name; both closed afterwards."""
    with trisolve.Client(server.target, timeout=120, transport="grpc") as c, \
            trisolve.SharedMemory(32 << 20) as shm:
        name = "py-" + shm.name[9:21]
        c.register_memory(shm, name)
        yield c, shm, name


# ---- the helper ----------------------------------------------------------------------------
def test_shared_memory_arrays_alignment_and_lifetime():
    with trisolve.SharedMemory(5000) as shm:
        assert shm.size % os.sysconf("SC_PAGE_SIZE") == 0 and shm.size >= 5000
        assert shm.key == "/" + shm.name and shm.name.startswith("trisolve-")
        assert len(shm.name) == len("trisolve-") + 32  # 128 random bits: the key is a capability
        assert on_dev_shm(shm)
        assert oct(os.stat(os.path.join("/dev/shm", shm.name)).st_mode & 0o777) == "0o600"
        a = shm.array((3, 5))
        b = shm.array(7, np.float32)
        c = shm.copy(np.arange(6, dtype=">i8").reshape(2, 3))
        for arr in (a, b, c):
            assert arr.ctypes.data % 64 == 0 and shm.contains(arr) and arr.flags.c_contiguous
        assert a.shape == (3, 5) and a.dtype == np.float64 and not a.any()
        assert b.ctypes.data >= a.ctypes.data + a.nbytes
        assert c.dtype == np.dtype("=i8") and c.tolist() == [[0, 1, 2], [3, 4, 5]]
        assert not shm.contains(np.zeros(3))
        with pytest.raises(MemoryError, match="do not fit"):
            shm.array(shm.size)
        a[:] = 7.0
        shm.reset()
        again = shm.array((3, 5))
        assert again.ctypes.data == a.ctypes.data and (again == 7.0).all()
    # Closed: unlinked at once, the arrays still readable (the mapping goes with the last one).
    assert shm.closed and not on_dev_shm(shm)
    assert (a == 7.0).all() and not shm.contains(a)
    with pytest.raises(ValueError, match="closed"):
        shm.array(1)
    with pytest.raises(ValueError):
        trisolve.SharedMemory(0)


def test_a_process_that_never_closes_leaves_nothing_and_no_warning(server):
    """Registered, used and never closed: unlinked at exit by the finalizer, not by Python's
    resource tracker (which would warn about a leak)."""
    code = textwrap.dedent(f"""
        import sys; sys.path.insert(0, {str(PKG)!r})
        import numpy as np, trisolve
        shm = trisolve.SharedMemory(1 << 20)
        client = trisolve.Client({server.target!r}, timeout=60)
        client.register_memory(shm, "py-" + shm.name[9:21])
        d = shm.copy([4.0, 8.0, 8.0]); x = shm.array(3)
        r = client.solve_tridiagonal([0.0, 1, 1], [2.0, 2, 2], [1.0, 1, 0], d, out=x)
        assert r.x is x and np.allclose(x, [1, 2, 3])
        assert r.summary.transport in ("ring", "shared-memory")  # by reference either way
        print(shm.name)
    """)
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "leaked" not in run.stderr and "resource_tracker" not in run.stderr, run.stderr
    assert not on_dev_shm(run.stdout.strip())


# ---- every family, by reference -------------------------------------------------------------
def family_jobs(rng):
    """(name, call, kwargs): every family, both layouts and both precisions among them."""
    a, b, c, d = random_tridiagonal(rng, 64, 300)
    yield "tridiagonal-flat-f64", "solve_tridiagonal", dict(a=a, b=b, c=c, d=d)
    a, b, c, d = (np.ascontiguousarray(v.T.astype(np.float32)) for v in random_tridiagonal(rng, 48, 200))
    yield "tridiagonal-interleaved-f32", "solve_tridiagonal", dict(a=a, b=b, c=c, d=d,
                                                                  layout="interleaved")
    n, batch = 41, 6
    parent = np.stack([random_tree_parent(rng, n) for _ in range(batch)])
    _, lower, upper, diag, rhs = random_tree(rng, batch, n)
    yield "tree-per-system-parents", "solve_tree", dict(parent=parent, lower=lower, upper=upper,
                                                        diag=diag, rhs=rhs)
    aC, cC, bC, cA, cB, f, y = block_problem(rng, 12, 10)
    yield "block-tridiagonal", "solve_block_tridiagonal", dict(
        aC=aC, cC=cC, bC=bC, cA=cA, cB=cB, f=f, y0=0.5 * y, method="gauss-seidel", tol=1e-12)
    A = rng.uniform(-1, 1, (8, 40, 40)) + 6 * np.eye(40)
    yield "dense", "solve_dense", dict(A=A, b=rng.uniform(-1, 1, (8, 40)))


RHS = {"solve_tridiagonal": "d", "solve_tree": "rhs", "solve_block_tridiagonal": "f",
       "solve_dense": "b"}


@pytest.mark.parametrize("which", range(5))
def test_every_family_from_and_into_a_region_bitwise_as_over_the_socket(client, region, which):
    shm_client, shm, name = region
    label, call, kwargs = list(family_jobs(np.random.default_rng(100 + which)))[which]
    want = getattr(client, call)(**kwargs)
    assert want.summary.transport == "grpc" and want.ok, label

    in_shm = {k: shm.copy(v) if isinstance(v, np.ndarray) else v for k, v in kwargs.items()}
    x = shm.array(want.x.shape, want.x.dtype)
    x.fill(np.nan)  # NaNs unless the server writes every value
    before = uses(shm_client, name)
    got = getattr(shm_client, call)(**in_shm, out=x)
    assert got.summary.transport == "shared-memory", label
    assert got.x is x
    assert x.dtype == want.x.dtype
    np.testing.assert_array_equal(x, want.x)  # bitwise: same job, same answer
    assert x.tobytes() == want.x.tobytes(), label
    np.testing.assert_array_equal(got.status, want.status)
    assert got.summary.method == want.summary.method
    assert got.summary.iterations == want.summary.iterations
    refs = sum(isinstance(v, np.ndarray) for v in in_shm.values())
    assert uses(shm_client, name) == before + refs + 1  # each array read from it, x written

    # Without out=: the arrays still go by reference, x comes back in the answer.
    got2 = getattr(shm_client, call)(**in_shm)
    assert got2.summary.transport == "shared-memory" and not shm.contains(got2.x)
    assert got2.x.tobytes() == want.x.tobytes()
    assert uses(shm_client, name) == before + 2 * refs + 1


def test_arrays_that_cannot_go_by_reference_travel_as_bytes(client, region):
    """Non-C-contiguous views, arrays converted to the job's dtype and arrays of a closed
    region go as bytes (the answer is the same); only what lies in live registered memory, C
    order, in the wire dtype, goes by reference."""
    shm_client, shm, name = region
    rng = np.random.default_rng(7)
    a, b, c, d = random_tridiagonal(rng, 16, 40)
    want = client.solve_tridiagonal(a, b, c, d)
    before = uses(shm_client, name)
    # Transposes of interleaved arrays in the region: flat C-order copies are what is sent.
    il = [shm.copy(np.ascontiguousarray(v.T)) for v in (a, b, c, d)]
    r = shm_client.solve_tridiagonal(*(v.T for v in il))
    assert r.summary.transport == "grpc" and r.x.tobytes() == want.x.tobytes()
    # float32 arrays in a job that travels in float64: converted, so sent as bytes.
    r32 = shm_client.solve_tridiagonal(*(shm.copy(v, np.float32) for v in (a, b, c, d)),
                                       dtype=np.float64)
    assert r32.summary.transport == "grpc" and r32.x.dtype == np.float64
    assert uses(shm_client, name) == before
    # Arrays of memory that was closed (its arrays live on) never go by reference again.
    with trisolve.SharedMemory(1 << 20) as other:
        shm_client.register_memory(other, "py-" + other.name[9:21])
        kept = [other.copy(v) for v in (a, b, c, d)]
    assert other.name not in [m.key[1:] for m in shm_client.list_memory()]  # unregistered
    r = shm_client.solve_tridiagonal(*kept)
    assert r.summary.transport == "grpc" and r.x.tobytes() == want.x.tobytes()


def test_out_anywhere_and_its_checks(client, region):
    shm_client, shm, _ = region
    d = np.array([4.0, 8.0, 8.0])
    args = ([0.0, 1, 1], [2.0, 2, 2], [1.0, 1, 0])
    out = np.full(3, np.nan)  # plain memory: the client copies x into it
    r = client.solve_tridiagonal(*args, d, out=out)
    assert r.x is out and r.summary.transport == "grpc"
    np.testing.assert_allclose(out, [1.0, 2.0, 3.0], rtol=1e-14)
    strided = np.full(6, np.nan)[::2]  # in the region but not contiguous: copied into too
    r = shm_client.solve_tridiagonal(*args, shm.copy(d), out=strided)
    assert r.x is strided
    np.testing.assert_allclose(strided, [1.0, 2.0, 3.0], rtol=1e-14)
    # x on top of d (LAPACK's habit): the server may not write over what it reads, so x comes
    # back and is copied over d.
    d_shm = shm.copy(d)
    r = shm_client.solve_tridiagonal(*args, d_shm, out=d_shm)
    assert r.x is d_shm
    np.testing.assert_allclose(d_shm, [1.0, 2.0, 3.0], rtol=1e-14)
    with shm_client.create_system("tridiagonal", a=args[0], b=args[1], c=args[2]) as system:
        d_shm[:] = d
        assert system.solve(d_shm, out=d_shm).x is d_shm
        np.testing.assert_allclose(d_shm, [1.0, 2.0, 3.0], rtol=1e-14)
        b_shm = shm.copy(args[1])  # x over an update the same step reads
        d_shm[:] = d
        r = system.solve(d_shm, update={"b": b_shm}, out=b_shm)
        assert r.x is b_shm
        np.testing.assert_allclose(b_shm, [1.0, 2.0, 3.0], rtol=1e-14)
        with system.stream() as st:
            d_shm[:] = d
            st.solve(d_shm, update={"b": args[1]}, out=d_shm)
        np.testing.assert_allclose(d_shm, [1.0, 2.0, 3.0], rtol=1e-14)
    with pytest.raises(ValueError, match="shape"):
        client.solve_tridiagonal(*args, d, out=np.zeros(4))
    with pytest.raises(TypeError, match="dtype"):
        client.solve_tridiagonal(*args, d, out=np.zeros(3, np.float32))
    ro = np.zeros(3)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        client.solve_tridiagonal(*args, d, out=ro)
    with pytest.raises(TypeError, match="ndarray"):
        client.solve_tridiagonal(*args, d, out=[0.0, 0.0, 0.0])


# ---- persistent systems and the time-step stream ---------------------------------------------
def test_systems_and_the_step_stream_read_and_write_regions(client, region):
    shm_client, shm, name = region
    rng = np.random.default_rng(31)
    a, b, c, d = random_tridiagonal(rng, 16, 500)
    want = client.solve_tridiagonal(a, b, c, d)
    b2 = 2 * b
    want2 = client.solve_tridiagonal(a, b2, c, d)
    before = uses(shm_client, name)
    with shm_client.create_system("tridiagonal", a=shm.copy(a), b=shm.copy(b),
                                  c=shm.copy(c)) as system:
        assert uses(shm_client, name) == before + 3  # the coefficients were read from it
        d_in, x = shm.copy(d), shm.array(d.shape)
        r = system.solve(d_in, out=x)
        assert r.x is x and r.summary.transport == "shared-memory"
        assert x.tobytes() == want.x.tobytes()
        # An update read from the region, then two steps of the stream answered into it.
        x1, x2 = shm.array(d.shape), shm.array(d.shape)
        x1.fill(np.nan)
        x2.fill(np.nan)
        with system.stream() as st:
            st.send(d_in, update={"b": shm.copy(b2)}, out=x1)
            st.send(d_in, out=x2)
            r1, r2 = st.recv(), st.recv()
        assert r1.x is x1 and r2.x is x2
        assert r1.summary.transport == r2.summary.transport == "shared-memory"
        assert x1.tobytes() == want2.x.tobytes() and x2.tobytes() == want2.x.tobytes()
        # A step whose out is plain memory gets x copied into it.
        plain = np.empty(d.shape)
        with system.stream() as st:
            r3 = st.solve(d_in, out=plain)
        assert r3.x is plain and plain.tobytes() == want2.x.tobytes()
        system.update(b=shm.copy(b))
        assert system.solve(d).x.tobytes() == want.x.tobytes()
        with pytest.raises(ValueError, match="shape"):
            system.solve(d_in, out=shm.array(d.shape[1]))


# ---- transports ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def refusing():
    s = ServerProcess("--no-shared-memory")
    yield s
    s.stop()


def big_job(seed=21):
    return random_tridiagonal(np.random.default_rng(seed), 256, 256)  # 4 x 512 KiB = 2 MiB


def test_auto_stages_large_jobs_through_one_reused_region(client, server):
    a, b, c, d = big_job()
    want = client.solve_tridiagonal(a, b, c, d)
    with trisolve.Client(server.target, timeout=120) as auto:
        assert auto.transport == "auto" and auto.shared_memory_state == "untried"
        small = auto.solve_tridiagonal(a[:4], b[:4], c[:4], d[:4])  # small: a request ring
        assert small.summary.transport == "ring" and auto.shared_memory_state == "untried"
        for _ in range(3):
            r = auto.solve_tridiagonal(a, b, c, d)
            assert r.summary.transport == "shared-memory" and not r.summary.streamed
            assert r.x.tobytes() == want.x.tobytes()
            assert not any(m.contains(r.x) for m in auto._idle_arenas)  # x is the caller's
        assert auto.shared_memory_state == "shared-memory"
        staging = [m for m in auto.list_memory() if m.name.startswith("staging-")]
        mine = [m for m in staging if m.key in [a_.key for a_ in auto._idle_arenas]]
        assert len(mine) == 1 and mine[0].uses == 3 * 5  # a, b, c, d and x, three times
        key = mine[0].key
        out = np.empty_like(d)  # out= in plain memory: copied out of the staging region
        assert auto.solve_tridiagonal(a, b, c, d, out=out).x is out
        assert out.tobytes() == want.x.tobytes()
        # One-shot systems go the same way.
        with auto.create_system("tridiagonal", a=a, b=b, c=c) as system:
            rs = system.solve(d)
            assert rs.summary.transport == "shared-memory" and rs.x.tobytes() == want.x.tobytes()
    # Closing the client unregisters and unlinks its staging region.
    assert not on_dev_shm(key[1:])
    with trisolve.Client(server.target, timeout=30) as other:  # the same (anonymous) identity
        assert key not in [m.key for m in other.list_memory()]


def test_auto_replaces_a_staging_region_the_server_dropped(client):
    """A staging region idle past its time-to-live is gone on the server: the next staged job
    registers a new one instead of sending a reference the server no longer knows."""
    s = ServerProcess("--region-ttl", "0.3")
    try:
        a, b, c, d = big_job()
        want = client.solve_tridiagonal(a, b, c, d)
        with trisolve.Client(s.target, timeout=60) as auto:
            assert auto.solve_tridiagonal(a, b, c, d).summary.transport == "shared-memory"
            first = [m.key for m in auto.list_memory()]
            assert len(first) == 1
            deadline = time.monotonic() + 30
            while auto.list_memory() and time.monotonic() < deadline:  # until the server drops it
                time.sleep(0.05)
            assert auto.list_memory() == []
            r = auto.solve_tridiagonal(a, b, c, d)
            assert r.summary.transport == "shared-memory" and r.x.tobytes() == want.x.tobytes()
            assert not on_dev_shm(first[0][1:])  # the old one was unlinked
    finally:
        s.stop()


def test_auto_falls_back_to_grpc_for_good_where_refused(client, refusing):
    a, b, c, d = big_job()
    want = client.solve_tridiagonal(a, b, c, d)
    with trisolve.Client(refusing.target, timeout=120) as auto:
        tries = []
        unary = auto._unary

        def counting(rpc, *args, **kwargs):
            tries.append(rpc)
            return unary(rpc, *args, **kwargs)

        auto._unary = counting  # count the registrations it attempts
        for _ in range(2):
            r = auto.solve_tridiagonal(a, b, c, d)
            assert r.summary.transport == "grpc" and r.x.tobytes() == want.x.tobytes()
        assert auto.shared_memory_state == "grpc"
        assert tries.count("RegisterSharedMemory") == 1  # remembered after the first refusal
        with auto.create_system("tridiagonal", a=a, b=b, c=c) as system:
            assert system.solve(d).x.tobytes() == want.x.tobytes()
        assert tries.count("RegisterSharedMemory") == 1


def test_shm_insists_and_raises_where_refused(refusing, server):
    a, b, c, d = big_job()
    with trisolve.Client(refusing.target, timeout=60, transport="shm") as insisting:
        with pytest.raises(trisolve.FailedPrecondition) as e:
            insisting.solve_tridiagonal(a[:2], b[:2], c[:2], d[:2])  # however small
        assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION
        assert "--no-shared-memory" in e.value.message
        with trisolve.SharedMemory(1 << 20) as shm:
            with pytest.raises(trisolve.FailedPrecondition):
                insisting.register_memory(shm)
    # transport="shm" where it is accepted: even a tiny job goes through a staging region.
    with trisolve.Client(server.target, timeout=60, transport="shm") as shm_client:
        r = shm_client.solve_tridiagonal([0.0, 1, 1], [2.0, 2, 2], [1.0, 1, 0], [4.0, 8, 8])
        assert r.summary.transport == "shared-memory"
        np.testing.assert_allclose(r.x, [1.0, 2.0, 3.0], rtol=1e-14)
    with pytest.raises(ValueError, match="transport"):
        trisolve.Client(server.target, transport="udp")


# ---- bad references ---------------------------------------------------------------------------
def raw_tridiagonal(region: str, offset: int, batch: int, n: int) -> "pb.TridiagonalRequest":
    """A request whose a, b, c, d lie one after the other from `offset` of `region`."""
    req = pb.TridiagonalRequest(dtype=pb.FLOAT64)
    for k, field in enumerate("abcd"):
        arr = getattr(req, field)
        arr.shape.extend([batch, n])
        arr.region.CopyFrom(pb.RegionRef(region=region, offset=offset + k * batch * n * 8))
    return req


def test_bad_references_raise_their_own_exceptions(tmp_path):
    tokens = tmp_path / "tokens"
    tokens.write_text("alice-token\nbob-token\n")
    s = ServerProcess("--token-file", str(tokens))
    try:
        # (transport grpc: arrays in registered memory still go by reference, and no request
        # ring's region shows in the listings below)
        with trisolve.Client(s.target, token="alice-token", timeout=30,
                             transport="grpc") as alice, \
                trisolve.Client(s.target, token="bob-token", timeout=30) as bob, \
                trisolve.SharedMemory(1 << 20) as shm:
            batch, n = 4, 100
            coef = shm.array((4, batch, n))
            coef[:] = 1.0
            coef[1] = 4.0  # a = c = d = 1, b = 4: diagonally dominant
            alice.register_memory(shm, "r")
            x = shm.array((batch, n))
            r = alice.solve_tridiagonal(*coef, out=x)
            assert r.summary.transport == "shared-memory" and r.ok
            with pytest.raises(ValueError, match="already"):
                alice.register_memory(shm, "again")
            with trisolve.Client(s.target, token="alice-token", timeout=30) as alice2:
                with pytest.raises(trisolve.AlreadyExists) as e:  # the same token, the same name
                    alice2.register_memory(shm, "r")
                assert e.value.code == grpc.StatusCode.ALREADY_EXISTS

            # Another token's region is not there for bob, by name or in his list.
            with pytest.raises(trisolve.NotFound) as e:
                bob._unary("SolveTridiagonal", raw_tridiagonal("r", 0, batch, n))
            assert e.value.code == grpc.StatusCode.NOT_FOUND and "'r'" in e.value.message
            assert bob.list_memory() == []
            assert [m.name for m in alice.list_memory()] == ["r"]
            with pytest.raises(trisolve.NotFound):
                bob._unary("UnregisterMemory", pb.UnregisterMemoryRequest(name="r"))

            # References outside the region, misaligned, the wrong size, x on top of d.
            with pytest.raises(trisolve.InvalidArgument, match="outside"):
                alice._unary("SolveTridiagonal",
                             raw_tridiagonal("r", shm.size - 4 * batch * n * 8 + 8, batch, n))
            with pytest.raises(trisolve.InvalidArgument, match="multiple of 8"):
                alice._unary("SolveTridiagonal", raw_tridiagonal("r", 4, batch, n))
            req = raw_tridiagonal("r", 0, batch, n)
            req.b.region.bytes = batch * n * 8 - 8
            with pytest.raises(trisolve.InvalidArgument, match="b.region"):
                alice._unary("SolveTridiagonal", req)
            req = raw_tridiagonal("r", 0, batch, n)
            req.x_region.CopyFrom(pb.RegionRef(region="r", offset=shm.size - 8))
            with pytest.raises(trisolve.InvalidArgument, match="x_region"):
                alice._unary("SolveTridiagonal", req)
            with pytest.raises(trisolve.NotFound):
                alice._unary("SolveTridiagonal", raw_tridiagonal("nope", 0, batch, n))

            # Unregistered: its arrays go as bytes again, and the name is gone on the server.
            info = alice.unregister_memory(shm)
            assert info.name == "r" and info.uses >= 1
            assert alice.list_memory() == []
            r = alice.solve_tridiagonal(*coef, out=x)
            assert r.summary.transport == "grpc" and r.ok
            with pytest.raises(trisolve.NotFound):
                alice._unary("SolveTridiagonal", raw_tridiagonal("r", 0, batch, n))
            with pytest.raises(ValueError, match="not registered"):
                alice.unregister_memory(shm)
            # Unauthenticated registration is refused as such.
            with trisolve.Client(s.target, timeout=30) as anonymous:
                with pytest.raises(trisolve.Unauthenticated):
                    anonymous.register_memory(shm)
    finally:
        s.stop()


def test_threads_sharing_an_auto_client_each_stage_through_their_own_region(client, server):
    """Staging regions are held by one call at a time: concurrent calls of one client take
    different ones (never more than 16), every answer its own."""
    from concurrent.futures import ThreadPoolExecutor

    jobs = [big_job(seed) for seed in range(6)]
    want = [client.solve_tridiagonal(*job).x for job in jobs]
    with trisolve.Client(server.target, timeout=120) as auto:
        def solve(i):
            r = auto.solve_tridiagonal(*jobs[i % 6])
            return i, r.summary.transport, r.x

        with ThreadPoolExecutor(max_workers=4) as pool:
            results = list(pool.map(solve, range(24)))
        for i, transport, x in results:
            assert transport == "shared-memory"
            assert x.tobytes() == want[i % 6].tobytes(), i
        assert 1 <= len(auto._idle_arenas) <= 4  # at most one a call in flight
