"""The Python client's request ring (proto/ring_abi.h) against the real trisolved: the same
answers as over gRPC, bit for bit; its fall-back, its errors, and the connection wait."""
from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import grpc
import numpy as np
import pytest

import trisolve
from trisolve import _ring
from conftest import ServerProcess
from reference import block_matrix, random_tree, random_tridiagonal

ABI = Path(__file__).resolve().parents[3] / "proto" / "ring_abi.h"
pytestmark = pytest.mark.skipif(not _ring.SUPPORTED, reason=str(_ring.unsupported_reason()))


# ---- the layout ---------------------------------------------------------------------------------
_STRUCTS = {"RingArray": _ring.ARRAY, "RingRequest": _ring.REQUEST, "RingAnswer": _ring.ANSWER,
            "RingSlot": _ring.SLOT, "RingHeader": _ring.HEADER}
_CONSTANTS = {"kRingMagic": _ring.RING_MAGIC, "kRingVersion": _ring.RING_VERSION,
              "kRingMaxArrays": _ring.MAX_ARRAYS, "kRingMaxRank": _ring.MAX_RANK,
              "kRingMessageBytes": _ring.MESSAGE_BYTES, "kRingMaxRegions": _ring.MAX_REGIONS,
              "kRingAlign": _ring.ALIGN}


def _header_fields(text: str, struct: str) -> list:
    """The member names of `struct` in ring_abi.h, in order (two names on a line included)."""
    body = re.search(r"struct %s \{(.*?)\n\};" % struct, text, re.S)
    assert body, f"{struct} not found in {ABI}"
    names = []
    for line in body.group(1).splitlines():
        line = line.split("//")[0].strip()
        if not line.endswith(";"):
            continue
        decl = line[:-1].split(None, 1)[1]
        for part in decl.split(","):
            names.append(re.match(r"\s*(\w+)", part).group(1))
    return names


def test_layout_matches_ring_abi_h_text():
    """Constants, member order and sizes as the header states them (always runs)."""
    text = ABI.read_text()
    for name, value in _CONSTANTS.items():
        m = re.search(r"constexpr \w+ %s = (0x[0-9a-fA-F]+|[0-9]+)" % name, text)
        assert m, name
        assert int(m.group(1), 0) == value, name
    for struct, dt in _STRUCTS.items():
        assert _header_fields(text, struct) == list(dt.names), struct
        m = re.search(r"sizeof\(%s\) == ([0-9]+)" % struct, text)
        assert m and int(m.group(1)) == dt.itemsize, struct


def test_layout_matches_compiled_offsets(tmp_path):
    """Every member's offset as a C++ compiler lays ring_abi.h out (as tests/test_ring.cc)."""
    cxx = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    if not cxx:
        pytest.skip("no C++ compiler to lay out ring_abi.h (test_layout_matches_ring_abi_h_text "
                    "still checked its sizes and members)")
    text = ABI.read_text()
    lines = []
    for struct, dt in _STRUCTS.items():
        lines.append(f'std::printf("{struct} %zu\\n", sizeof({struct}));')
        for name in _header_fields(text, struct):
            lines.append(f'std::printf("{struct}.{name} %zu\\n", offsetof({struct}, {name}));')
    src = tmp_path / "offsets.cc"
    src.write_text('#include <cstddef>\n#include <cstdio>\n#include "ring_abi.h"\n'
                   "using namespace trisolve::ring;\nint main() {\n" + "\n".join(lines)
                   + "\n}\n")
    exe = tmp_path / "offsets"
    subprocess.run([cxx, "-std=c++20", "-I", str(ABI.parent), str(src), "-o", str(exe)],
                   check=True)
    got = dict(line.rsplit(" ", 1) for line in
               subprocess.run([str(exe)], check=True, capture_output=True, text=True)
               .stdout.splitlines())
    for struct, dt in _STRUCTS.items():
        assert int(got[struct]) == dt.itemsize, struct
        for name in dt.names:
            assert int(got[f"{struct}.{name}"]) == dt.fields[name][1], f"{struct}.{name}"


@pytest.mark.parametrize("narrays", range(_ring.MAX_ARRAYS + 1))
def test_struct_layouts_write_and_read_what_the_dtypes_do(narrays):
    """The request as ask() packs it, read back through the REQUEST dtype (pinned to ring_abi.h
    above), and an answer written through the ANSWER dtype, read as ask() unpacks it: every
    member with a value of its own, so that a member packed at another's place shows."""
    buf = bytearray(b"\xa5" * _ring.REQUEST.itemsize)  # the arrays past narrays must be zeroed
    head = [1, 2, 3, 4, 5, narrays, b"m" * 31, b"h" * 63, b"r" * 63, -7, 9, 0.25]
    arrays = []
    for i in range(narrays):
        arrays += [b"a%d" % i, 1 + i % 4, i % 3, 10 + i, 20 + i, 30 + i, 40 + i, 64 * i, 8 * i + 8]
    tail = [1000, 1008, 2000, 2008, b"region-one", b"region-two", 2, 0, 2**64 - 3]
    _ring._REQUESTS[narrays].pack_into(buf, 0, *head, *arrays, *tail)
    rq = np.frombuffer(bytes(buf), _ring.REQUEST)[0]
    for k, name in enumerate(("op", "family", "dtype", "layout", "flags", "narrays", "method",
                              "handle", "request_id", "deadline_unix_ns", "max_iterations",
                              "tol")):
        assert rq[name] == head[k], name
    for i in range(_ring.MAX_ARRAYS):
        a = rq["arrays"][i]
        if i >= narrays:
            assert a.tobytes() == bytes(_ring.ARRAY.itemsize), i
            continue
        v = arrays[9 * i:9 * i + 9]
        assert (a["name"], a["rank"], a["region"]) == tuple(v[:3])
        assert list(a["shape"]) == v[3:7] and (a["offset"], a["bytes"]) == tuple(v[7:])
    for k, name in enumerate(("x_offset", "x_bytes", "status_offset", "status_bytes")):
        assert rq[name] == tail[k], name
    assert list(rq["regions"]) == tail[4:6]
    assert (rq["x_region"], rq["reserved"], rq["tag"]) == tuple(tail[6:])

    ans = np.zeros((), _ring.ANSWER)
    values = {}
    for k, name in enumerate(_ring.ANSWER.names):
        kind = _ring.ANSWER.fields[name][0]
        if kind.kind == "S":
            values[name] = b"%s-%d" % (name.encode()[:8], k)
        elif kind.shape:
            values[name] = [100 * k + j for j in range(kind.shape[0])]
        elif kind.kind == "f":
            values[name] = k + 0.5
        else:
            values[name] = k + 1
        ans[name] = values[name]
    got = _ring._ANSWER.unpack_from(ans.tobytes())
    assert got[_ring._A_CODE] == values["code"]
    assert got[_ring._A_MESSAGE_BYTES] == values["message_bytes"]
    assert got[_ring._A_MESSAGE].rstrip(b"\0") == values["message"]
    assert got[_ring._A_DTYPE] == values["dtype"] and got[_ring._A_X_RANK] == values["x_rank"]
    assert list(got[_ring._A_X_SHAPE:_ring._A_X_SHAPE + 4]) == values["x_shape"]
    assert got[_ring._A_STATUSES] == values["statuses"]
    for name, i in _ring._A_SUMMARY.items():
        assert got[i] == values[name], name
    assert got[_ring._A_METHOD].rstrip(b"\0") == values["method"]
    assert got[_ring._A_BACKEND].rstrip(b"\0") == values["backend"]
    assert got[_ring._A_TAG] == values["tag"]


# ---- answers as over gRPC -----------------------------------------------------------------------
@pytest.fixture(scope="module")
def ring_client(server):
    with trisolve.Client(server.target, timeout=60, transport="ring") as c:
        yield c


def _same(r, g):
    assert r.summary.transport == "ring"
    assert g.summary.transport == "grpc"
    assert r.x.dtype == g.x.dtype and r.x.shape == g.x.shape
    assert r.x.tobytes() == g.x.tobytes()
    np.testing.assert_array_equal(r.status, g.status)
    assert r.summary.method == g.summary.method
    assert (r.summary.systems, r.summary.ok) == (g.summary.systems, g.summary.ok)


def _block(rng, N, M):
    aC, bC = rng.uniform(-0.6, 0.0, (N, M)), rng.uniform(-0.4, 0.2, (N, M))
    cA, cB = rng.uniform(-0.5, 0.0, (N, M)), rng.uniform(-0.3, 0.1, (N, M))
    cC = 4.0 + rng.uniform(0.0, 0.5, (N, M))
    f = (block_matrix(aC, cC, bC, cA, cB) @ rng.uniform(0.5, 1.5, N * M)).reshape(N, M)
    return aC, cC, bC, cA, cB, f


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_every_family_unary_equals_grpc(client, ring_client, dtype):
    rng = np.random.default_rng(31)
    a, b, c, d = (v.astype(dtype) for v in random_tridiagonal(rng, 3, 64))
    calls = [
        lambda cl: cl.solve_tridiagonal(a, b, c, d),
        lambda cl: cl.solve_tridiagonal(a.T.copy(), b.T.copy(), c.T.copy(), d.T.copy(),
                                        layout="interleaved", method="pcr", request_id="ring-ok.1"),
        lambda cl: cl.solve_tridiagonal(a[0], b[0], c[0], d),  # one matrix, 3 right-hand sides
        lambda cl: cl.solve_tridiagonal(a.reshape(-1), b.reshape(-1), c.reshape(-1),
                                        d.reshape(-1), lengths=[10, 100, 82]),
    ]
    parent, lower, upper, diag, rhs = random_tree(rng, 4, 40)
    tree = [v.astype(dtype) for v in (lower, upper, diag, rhs)]
    calls.append(lambda cl: cl.solve_tree(parent, *tree, skip_residual=True))
    blk = [v.astype(dtype) for v in _block(rng, 6, 5)]
    tol = 1e-10 if dtype == np.float64 else 1e-5
    calls.append(lambda cl: cl.solve_block_tridiagonal(*blk, method="gauss-seidel", tol=tol,
                                                       max_iterations=300, scale_rows=True))
    A = rng.uniform(-1, 1, (3, 8, 8)) + 10 * np.eye(8)
    B = rng.uniform(-1, 1, (3, 8))
    calls.append(lambda cl: cl.solve_dense(A.astype(dtype), B.astype(dtype), method="lu"))
    for call in calls:
        r, g = call(ring_client), call(client)
        _same(r, g)
    blk_r, blk_g = calls[5](ring_client), calls[5](client)
    assert blk_r.summary.iterations == blk_g.summary.iterations > 0


def test_auto_uses_the_ring_for_small_calls_only(server, client):
    rng = np.random.default_rng(32)
    with trisolve.Client(server.target, timeout=60) as auto:
        assert auto.ring_state() == "untried"
        a, b, c, d = random_tridiagonal(rng, 1, 64)
        r = auto.solve_tridiagonal(a, b, c, d)
        assert r.summary.transport == "ring" and auto.ring_state() == "ring"
        _same(r, client.solve_tridiagonal(a, b, c, d))
        mid = random_tridiagonal(rng, 8, 1024)  # 320 KiB with x: the ring grows to hold it
        got = auto.solve_tridiagonal(*mid)
        assert got.summary.transport == "ring"
        _same(got, client.solve_tridiagonal(*mid))
        # The grown ring serves the small calls too.
        assert auto.solve_tridiagonal(a, b, c, d).summary.transport == "ring"
        big = random_tridiagonal(rng, 64, 1024)  # 2.5 MiB: past the most a ring grows to
        assert auto.solve_tridiagonal(*big).summary.transport == "shared-memory"
        out = np.empty_like(d)
        assert auto.solve_tridiagonal(a, b, c, d, out=out).x is out
        assert out.tobytes() == r.x.tobytes()
        # Progress reports travel through the RPC.
        p = auto.solve_tridiagonal(a, b, c, d, progress=lambda _: None)
        assert p.summary.transport == "grpc"
    with trisolve.Client(server.target, timeout=60, ring_max_arena_bytes=256 << 10) as capped:
        assert capped.solve_tridiagonal(*mid).summary.transport == "grpc"
    with trisolve.Client(server.target, transport="grpc") as g:
        assert g.ring_state() == "off"
    with trisolve.Client(server.target, transport="ring") as forced:
        with pytest.raises(trisolve.FailedPrecondition, match="transport ring: progress"):
            forced.solve_tridiagonal(a, b, c, d, progress=lambda _: None)


def test_arrays_in_registered_memory_by_reference(server, client):
    rng = np.random.default_rng(33)
    a, b, c, d = random_tridiagonal(rng, 2, 64)
    with trisolve.SharedMemory(1 << 16) as shm, trisolve.Client(server.target,
                                                                transport="ring") as rc:
        rc.register_memory(shm)
        ds, out = shm.copy(d), shm.zeros(d.shape)
        r = rc.solve_tridiagonal(a, b, c, ds, out=out)
        assert r.x is out
        _same(r, client.solve_tridiagonal(a, b, c, d))


def test_by_handle_equals_grpc(systems, ring_client):
    client = systems
    rng = np.random.default_rng(34)
    a, b, c, d = random_tridiagonal(rng, 2, 64)
    parent, lower, upper, diag, rhs = random_tree(rng, 3, 30)
    blk = _block(rng, 5, 4)
    A = rng.uniform(-1, 1, (2, 6, 6)) + 8 * np.eye(6)
    made = [
        (client.create_system("tridiagonal", a=a, b=b, c=c), d, np.stack([d, 2 * d])),
        (client.create_system("tree", parent=parent, lower=lower, upper=upper, diag=diag), rhs,
         None),
        (client.create_system("block-tridiagonal", aC=blk[0], cC=blk[1], bC=blk[2], cA=blk[3],
                              cB=blk[4], method="gauss-seidel", tol=1e-10), blk[5], None),
        (client.create_system("dense", A=A), rng.uniform(-1, 1, (2, 6)), None),
        (client.create_system("tridiagonal", a=a.reshape(-1), b=b.reshape(-1),
                              c=c.reshape(-1), lengths=[50, 78]), d.reshape(-1), None),
    ]
    try:
        for system, r1, rk in made:
            on_ring = ring_client.system(system.handle)
            for rhs_ in [r1] + ([rk] if rk is not None else []):
                r = on_ring.solve(rhs_)
                g = system.solve(rhs_)
                _same(r, g)
                assert r.summary.handle == system.handle
            name, make = next(iter(_coefficients(system.family).items()))
            with pytest.raises(trisolve.FailedPrecondition, match="transport ring: updates"):
                on_ring.solve(r1, update={name: make(system)})
    finally:
        for system, _, _ in made:
            system.release()


def _coefficients(family):
    """One coefficient of a family's system, as an update of the same values."""
    return {"tridiagonal": {"b": lambda s: np.ones(s.last_info.rhs_shape)},
            "tree": {"diag": lambda s: np.ones(s.last_info.rhs_shape)},
            "block-tridiagonal": {"cC": lambda s: np.ones(s.last_info.rhs_shape)},
            "dense": {"A": lambda s: np.eye(s.last_info.rhs_shape[-1])}}[family]


def test_bad_handle_and_bad_input_fail_as_over_grpc(systems, ring_client):
    client = systems
    rng = np.random.default_rng(35)
    a, b, c, d = random_tridiagonal(rng, 1, 64)
    system = client.create_system("tridiagonal", a=a, b=b, c=c)
    gone = ring_client.system(system.handle)
    system.release()
    errors = []
    for s in (gone, system):
        with pytest.raises(trisolve.NotFound) as e:
            s.solve(d)
        errors.append(e.value)
    assert errors[0].code == errors[1].code == grpc.StatusCode.NOT_FOUND
    # A handle this client never made (another identity's, or made up).
    foreign = trisolve.System(ring_client, system.last_info, np.dtype(np.float64))
    foreign.handle = "sys-" + "0" * 32
    with pytest.raises(trisolve.NotFound):
        foreign.solve(d)
    for cl in (ring_client, client):  # a singular-looking shape mismatch: the server refuses it
        with pytest.raises(trisolve.InvalidArgument) as e:
            cl.solve_tridiagonal(a[:, :10], b, c, d)
        errors.append(e.value)
    assert errors[2].code == errors[3].code and errors[2].message == errors[3].message


def test_threads_each_get_their_own_answer(server, client):
    rng = np.random.default_rng(36)
    threads, calls = 6, 40
    problems = [random_tridiagonal(rng, 1, 64) for _ in range(threads)]
    expected = [client.solve_tridiagonal(*p).x.tobytes() for p in problems]
    wrong, failed = [], []
    with trisolve.Client(server.target, timeout=60, transport="ring") as rc:
        barrier = threading.Barrier(threads)

        def work(k):
            try:
                barrier.wait()
                for _ in range(calls):
                    r = rc.solve_tridiagonal(*problems[k])
                    if r.x.tobytes() != expected[k] or r.summary.transport != "ring":
                        wrong.append(k)
            except Exception as e:  # noqa: BLE001 - reported below
                failed.append(repr(e))

        ts = [threading.Thread(target=work, args=(k,)) for k in range(threads)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        assert not failed and not wrong
        # Six threads released at once, 40 calls each: they overlap, so several rings opened.
        assert 2 <= rc._rings.open <= threads
        assert len(rc._rings.idle) == rc._rings.open  # every ring handed back


def test_rings_off_falls_back_once():
    srv = ServerProcess("--rings", "off")
    try:
        rng = np.random.default_rng(37)
        a, b, c, d = random_tridiagonal(rng, 1, 64)
        with trisolve.Client(srv.target, timeout=30) as auto:
            opened = []
            real = auto._open_ring
            auto._open_ring = lambda *args: opened.append(1) or real(*args)
            for _ in range(3):
                r = auto.solve_tridiagonal(a, b, c, d)
                assert r.summary.transport == "grpc" and r.ok
            assert auto.ring_state() == "grpc"
            assert len(opened) == 1  # refused once, not asked again
        with trisolve.Client(srv.target, timeout=30, transport="ring") as forced:
            with pytest.raises(trisolve.FailedPrecondition, match="transport ring: .*rings off"):
                forced.solve_tridiagonal(a, b, c, d)
    finally:
        srv.stop()


def test_server_killed_mid_loop_fails_within_the_heartbeat_timeout():
    srv = ServerProcess()
    try:
        rng = np.random.default_rng(38)
        problem = random_tridiagonal(rng, 1, 64)
        with trisolve.Client(srv.target, timeout=60, transport="ring") as rc:
            rc.solve_tridiagonal(*problem)
            threading.Timer(0.3, lambda: srv.proc.send_signal(signal.SIGKILL)).start()
            t0 = time.monotonic()
            with pytest.raises(trisolve.Unavailable):
                while time.monotonic() - t0 < 30:
                    rc.solve_tridiagonal(*problem)
            elapsed = time.monotonic() - t0
            # 0.3 s to the kill, the heartbeat's 3 s, a 50 ms futex sleep's rounding.
            assert elapsed < 0.3 + _ring.HEARTBEAT_TIMEOUT_S + 1.5, elapsed
    finally:
        srv.stop()


# ---- the connection wait --------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_client_made_before_its_server_succeeds_on_its_first_call():
    binary = os.environ["TRISOLVED_BIN"]
    port = _free_port()
    log = tempfile.TemporaryFile()
    procs = []
    rng = np.random.default_rng(39)
    a, b, c, d = random_tridiagonal(rng, 1, 64)
    # The server starts 0.5 s after the client; on a loaded machine it may take seconds to
    # listen, and the channel's reconnect attempts back off meanwhile: a wait of 10 s, not the
    # default 2, so that the test asks whether the first call waits for it, not how fast it starts.
    with trisolve.Client(f"127.0.0.1:{port}", timeout=30, connect_timeout=10.0) as cl:
        threading.Timer(0.5, lambda: procs.append(subprocess.Popen(
            [binary, "--listen", f"127.0.0.1:{port}", "--backend", "cpu"], stdout=log,
            stderr=subprocess.STDOUT))).start()
        try:
            t0 = time.monotonic()
            r = cl.solve_tridiagonal(a, b, c, d)
            assert r.ok and time.monotonic() - t0 < cl.connect_timeout + 0.5
        finally:
            time.sleep(0.6)  # the timer's process, should the call have failed before it
            for p in procs:
                p.kill()  # its graceful drain is not what this tests
                p.wait(timeout=15)
    log.close()


@pytest.mark.parametrize("transport", ["auto", "grpc"])
def test_closed_port_fails_after_about_connect_timeout(transport):
    port = _free_port()
    with trisolve.Client(f"127.0.0.1:{port}", connect_timeout=1.0, transport=transport) as cl:
        t0 = time.monotonic()
        with pytest.raises(trisolve.Unavailable):
            cl.solve_tridiagonal([0.0, 1.0], [2.0, 2.0], [1.0, 0.0], [1.0, 1.0])
        elapsed = time.monotonic() - t0
        assert 0.9 <= elapsed < 3.0, elapsed
    # A deadline shorter than the wait: half of it is spent waiting, then the call fails.
    with trisolve.Client(f"127.0.0.1:{port}", connect_timeout=5.0, transport=transport) as cl:
        t0 = time.monotonic()
        with pytest.raises((trisolve.Unavailable, trisolve.DeadlineExceeded)):
            cl.solve_tridiagonal([0.0, 1.0], [2.0, 2.0], [1.0, 0.0], [1.0, 1.0], timeout=1.0)
        assert time.monotonic() - t0 < 1.5
