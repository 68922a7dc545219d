"""The Python client against the real trisolved (CPU backend) on loopback.

Every answer is checked against an independent local solve: the system assembled as a dense
matrix and solved with np.linalg.solve (non-symmetric data, so a swapped lower/upper or a
transposed layout would show), or a vectorised Thomas sweep for the large batch.
"""
from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import grpc
import numpy as np
import pytest

import trisolve
from conftest import ServerProcess
from reference import (block_matrix, random_tree, random_tree_parent, random_tridiagonal,
                       thomas_batch, tree_matrix, tridiagonal_matrix)

F64_TOL = 1e-11
F32_TOL = 2e-4
DTYPES = [np.float64, np.float32]
LAYOUTS = ["flat", "interleaved"]


def tol_for(dtype) -> float:
    return F64_TOL if np.dtype(dtype) == np.float64 else F32_TOL


def rel_err(x: np.ndarray, ref: np.ndarray) -> float:
    return float(np.max(np.abs(np.asarray(x, np.float64) - ref)) / np.max(np.abs(ref)))


def tri_reference(a, b, c, d) -> np.ndarray:
    """x for flat batch x n arrays, each system solved densely."""
    return np.stack([np.linalg.solve(tridiagonal_matrix(a[s], b[s], c[s]), d[s])
                     for s in range(b.shape[0])])


def tree_reference(parent, lower, upper, diag, rhs) -> np.ndarray:
    out = []
    for s in range(diag.shape[0]):
        p = parent if parent.ndim == 1 else parent[s]
        out.append(np.linalg.solve(tree_matrix(p, lower[s], upper[s], diag[s]), rhs[s]))
    return np.stack(out)


# ---- service -------------------------------------------------------------------------------
def test_health_and_server_info(client):
    assert client.health() == "SERVING"
    assert client.health("trisolve.v1.Solver") == "SERVING"
    info = client.server_info()
    assert info.backend == "cpu"
    assert info.limits.max_message_bytes > 0


# ---- tridiagonal -----------------------------------------------------------------------------
def test_tridiagonal_worked_example(client):
    r = client.solve_tridiagonal([0.0, 1, 1], [2.0, 2, 2], [1.0, 1, 0], [4.0, 8, 8])
    np.testing.assert_allclose(r.x, [1.0, 2.0, 3.0], rtol=1e-14)
    assert r.x.shape == (3,) and r.x.dtype == np.float64
    assert r.ok and r.summary.systems == 1 and r.summary.ok == 1
    assert r.summary.backend == "cpu" and r.summary.method
    assert not r.summary.streamed
    assert r.summary.residual < 1e-15
    r.x[0] = 7.0  # the answer is the caller's to change


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_tridiagonal_batch(client, dtype, layout):
    rng = np.random.default_rng(1)
    a, b, c, d = random_tridiagonal(rng, 5, 17)
    ref = tri_reference(a, b, c, d)
    arrays = [v.astype(dtype) for v in (a, b, c, d)]
    if layout == "interleaved":
        arrays = [np.ascontiguousarray(v.T) for v in arrays]  # n x batch
    r = client.solve_tridiagonal(*arrays, layout=layout)
    assert r.x.dtype == dtype
    x = r.x.T if layout == "interleaved" else r.x
    assert r.x.shape == arrays[3].shape
    assert rel_err(x, ref) < tol_for(dtype)
    assert r.status.shape == (5,) and r.ok
    assert r.summary.systems == 5


@pytest.mark.parametrize("layout", LAYOUTS)
def test_tridiagonal_streamed_every_layout(stream_client, layout):
    rng = np.random.default_rng(2)
    a, b, c, d = random_tridiagonal(rng, 7, 301)
    ref = tri_reference(a, b, c, d)
    arrays = (a, b, c, d) if layout == "flat" else tuple(np.ascontiguousarray(v.T) for v in (a, b, c, d))
    r = stream_client.solve_tridiagonal(*arrays, layout=layout)
    assert r.summary.streamed
    x = r.x if layout == "flat" else r.x.T
    assert rel_err(x, ref) < F64_TOL
    assert list(r.status) == [0] * 7


def test_tridiagonal_over_4_mib_is_streamed(client):
    rng = np.random.default_rng(3)
    a, b, c, d = random_tridiagonal(rng, 2000, 160)  # 4 x 2.56 MB
    assert a.nbytes * 4 > 4 << 20
    r = client.solve_tridiagonal(a, b, c, d)
    assert r.summary.streamed
    assert r.x.shape == (2000, 160) and r.status.shape == (2000,) and r.ok
    assert rel_err(r.x, thomas_batch(a, b, c, d)) < F64_TOL
    # Below the threshold the same client sends one message.
    small = client.solve_tridiagonal(a[:10], b[:10], c[:10], d[:10])
    assert not small.summary.streamed
    np.testing.assert_allclose(small.x, r.x[:10], rtol=1e-13, atol=0)


def test_tridiagonal_many_right_hand_sides(client):
    rng = np.random.default_rng(4)
    a, b, c, d = random_tridiagonal(rng, 1, 12)
    D = rng.uniform(-1, 1, (4, 12))
    r = client.solve_tridiagonal(a[0], b[0], c[0], D)
    M = tridiagonal_matrix(a[0], b[0], c[0])
    assert r.x.shape == (4, 12)
    assert rel_err(r.x, np.linalg.solve(M, D.T).T) < F64_TOL


# ---- order, dtype and the array rules --------------------------------------------------------
def test_fortran_order_is_converted_not_reinterpreted(client):
    rng = np.random.default_rng(5)
    a, b, c, d = random_tridiagonal(rng, 4, 9)
    ref = client.solve_tridiagonal(a, b, c, d).x
    fa, fb, fc, fd = (np.asfortranarray(v) for v in (a, b, c, d))
    assert not fb.flags.c_contiguous
    r = client.solve_tridiagonal(fa, fb, fc, fd)
    np.testing.assert_array_equal(r.x, ref)
    # A transposed view is the n x batch (interleaved) array of the same systems.
    r_il = client.solve_tridiagonal(a.T, b.T, c.T, d.T, layout="interleaved")
    assert r_il.x.shape == (9, 4)
    np.testing.assert_allclose(r_il.x.T, ref, rtol=1e-13, atol=0)
    assert rel_err(ref, tri_reference(a, b, c, d)) < F64_TOL
    # Strided slices too.
    r_s = client.solve_tridiagonal(a[::2], b[::2], c[::2], d[::2])
    np.testing.assert_allclose(r_s.x, ref[::2], rtol=1e-13, atol=0)


def test_big_endian_input(client):
    a, b, c, d = ([0.0, 1, 1], [2.0, 2, 2], [1.0, 1, 0], [4.0, 8, 8])
    r = client.solve_tridiagonal(*(np.array(v, dtype=">f8") for v in (a, b, c, d)))
    np.testing.assert_allclose(r.x, [1.0, 2.0, 3.0], rtol=1e-14)


def test_mixed_precision_is_sent_as_float64(client):
    rng = np.random.default_rng(6)
    a, b, c, d = random_tridiagonal(rng, 3, 10)
    a32 = a.astype(np.float32)
    r = client.solve_tridiagonal(a32, b, c, d)
    assert r.x.dtype == np.float64
    ref = tri_reference(a32.astype(np.float64), b, c, d)
    assert rel_err(r.x, ref) < F64_TOL  # float32 would give ~1e-7
    # float32 right-hand side with float64 coefficients: float64 too (never narrowed).
    r2 = client.solve_tridiagonal(a, b, c, d.astype(np.float32))
    assert r2.x.dtype == np.float64
    # Asked for explicitly, float32 it is.
    r3 = client.solve_tridiagonal(a, b, c, d, dtype=np.float32)
    assert r3.x.dtype == np.float32
    assert rel_err(r3.x, tri_reference(a, b, c, d)) < F32_TOL


def test_integer_arrays_raise_type_error_naming_the_array(client):
    with pytest.raises(TypeError, match=r"^b has dtype int"):
        client.solve_tridiagonal([0.0, 1.0], np.array([2, 2]), [1.0, 0.0], [1.0, 1.0])
    with pytest.raises(TypeError, match=r"^rhs has dtype"):
        client.solve_tree([-1, 0], [0.0, 1.0], [0.0, 1.0], [3.0, 3.0], np.array([1, 2], dtype=np.int32))
    with pytest.raises(TypeError, match=r"^A has dtype complex"):
        client.solve_dense(np.eye(2, dtype=complex), [1.0, 1.0])
    with pytest.raises(TypeError, match=r"^parent has dtype float64"):
        client.solve_tree([-1.0, 0.0], [0.0, 1.0], [0.0, 1.0], [3.0, 3.0], [1.0, 2.0])
    with pytest.raises(ValueError, match="layout"):
        client.solve_tridiagonal([0.0], [1.0], [0.0], [1.0], layout="diagonal")
    with pytest.raises(ValueError, match="dtype"):
        client.solve_tridiagonal([0.0], [1.0], [0.0], [1.0], dtype=np.float16)


# ---- tree ------------------------------------------------------------------------------------
def test_tree_worked_example(client):
    r = client.solve_tree([-1, 0, 1, 0], [0.0, 1, 2, 3], [0.0, 0.5, 0.25, 1], [4.0, 5, 6, 7],
                          [9.0, 11.75, 22, 31])
    np.testing.assert_allclose(r.x, [1.0, 2.0, 3.0, 4.0], rtol=1e-14)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_tree_batch(client, dtype, layout):
    rng = np.random.default_rng(7)
    parent, lower, upper, diag, rhs = random_tree(rng, 4, 23)
    ref = tree_reference(parent, lower, upper, diag, rhs)
    arrays = [v.astype(dtype) for v in (lower, upper, diag, rhs)]
    if layout == "interleaved":
        arrays = [v.T for v in arrays]  # views: converted to C order by the client
    r = client.solve_tree(parent, *arrays, layout=layout)
    assert r.x.dtype == dtype
    x = r.x.T if layout == "interleaved" else r.x
    assert rel_err(x, ref) < tol_for(dtype)
    assert r.ok and r.summary.systems == 4


def test_tree_per_system_parents_int64_and_streamed(client, stream_client):
    rng = np.random.default_rng(8)
    n, batch = 31, 3
    parent = np.stack([random_tree_parent(rng, n) for _ in range(batch)]).astype(np.int64)
    _, lower, upper, diag, rhs = random_tree(rng, batch, n)
    ref = tree_reference(parent, lower, upper, diag, rhs)
    for cl in (client, stream_client):
        r = cl.solve_tree(parent, lower, upper, diag, rhs)
        assert rel_err(r.x, ref) < F64_TOL
    with pytest.raises(ValueError, match="int32"):
        client.solve_tree(np.array([-1, 2**40]), lower[0, :2], upper[0, :2], diag[0, :2], rhs[0, :2])


# ---- block-tridiagonal -----------------------------------------------------------------------
def block_problem(rng, N, M):
    aC = rng.uniform(-0.6, 0.0, (N, M))
    bC = rng.uniform(-0.4, 0.2, (N, M))
    cA = rng.uniform(-0.5, 0.0, (N, M))
    cB = rng.uniform(-0.3, 0.1, (N, M))
    cC = 4.0 + rng.uniform(0.0, 0.5, (N, M))
    y = rng.uniform(0.5, 1.5, (N, M))
    f = (block_matrix(aC, cC, bC, cA, cB) @ y.reshape(-1)).reshape(N, M)
    return aC, cC, bC, cA, cB, f, y


@pytest.mark.parametrize("dtype", DTYPES)
def test_block_tridiagonal(client, dtype):
    rng = np.random.default_rng(9)
    aC, cC, bC, cA, cB, f, y = block_problem(rng, 6, 5)
    # Independent check of the assembly: np.linalg.solve gives back y.
    ref = np.linalg.solve(block_matrix(aC, cC, bC, cA, cB), f.reshape(-1)).reshape(6, 5)
    np.testing.assert_allclose(ref, y, rtol=1e-12)
    arrays = [v.astype(dtype) for v in (aC, cC, bC, cA, cB, f)]
    tol = 1e-12 if dtype == np.float64 else 1e-6
    r = client.solve_block_tridiagonal(*arrays, method="gauss-seidel", tol=tol, max_iterations=500)
    assert r.x.dtype == dtype and r.x.shape == (6, 5)
    assert r.ok, r.status
    assert 0 < r.summary.iterations < 500
    assert r.summary.residual <= tol
    assert rel_err(r.x, ref) < (1e-10 if dtype == np.float64 else 1e-4)


def test_block_tridiagonal_options(client, stream_client):
    rng = np.random.default_rng(10)
    aC, cC, bC, cA, cB, f, y = block_problem(rng, 5, 4)
    # tol = 0 runs exactly max_iterations sweeps.
    r = client.solve_block_tridiagonal(aC, cC, bC, cA, cB, f, method="jacobi",
                                       max_iterations=3, tol=0)
    assert r.summary.iterations == 3
    # Starting from the answer needs (almost) nothing.
    r0 = client.solve_block_tridiagonal(aC, cC, bC, cA, cB, f, y0=y, method="gauss-seidel",
                                        tol=1e-10)
    r1 = client.solve_block_tridiagonal(aC, cC, bC, cA, cB, f, method="gauss-seidel", tol=1e-10)
    assert r0.summary.iterations < r1.summary.iterations
    # Fortran order and the streamed path agree with the unary one.
    rf = stream_client.solve_block_tridiagonal(*(np.asfortranarray(v) for v in (aC, cC, bC, cA, cB, f)),
                                               method="gauss-seidel", tol=1e-10)
    assert rf.summary.streamed
    np.testing.assert_allclose(rf.x, r1.x, rtol=1e-13)
    assert rel_err(r1.x, y) < 1e-8


# ---- dense -----------------------------------------------------------------------------------
def test_dense_worked_example(client):
    r = client.solve_dense([[0.0, 1.0], [1.0, 1.0]], [2.0, 3.0])
    np.testing.assert_allclose(r.x, [1.0, 2.0], rtol=1e-14)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("method", ["auto", "lu"])
def test_dense_batch(client, dtype, method):
    rng = np.random.default_rng(11)
    A = rng.uniform(-1, 1, (4, 7, 7)) + 4 * np.eye(7)
    b = rng.uniform(-1, 1, (4, 7))
    ref = np.linalg.solve(A, b[..., None])[..., 0]
    r = client.solve_dense(A.astype(dtype), b.astype(dtype), method=method)
    assert r.x.dtype == dtype and r.x.shape == (4, 7)
    assert rel_err(r.x, ref) < tol_for(dtype)
    # A in Fortran order keeps A[s, i, j]'s meaning (a reinterpretation would solve A^T).
    rf = client.solve_dense(np.asfortranarray(A.astype(dtype)), b.astype(dtype), method=method)
    np.testing.assert_allclose(rf.x, r.x, rtol=1e-6 if dtype == np.float32 else 1e-13)


def test_dense_streamed(stream_client):
    rng = np.random.default_rng(12)
    A = rng.uniform(-1, 1, (3, 20, 20)) + 5 * np.eye(20)
    b = rng.uniform(-1, 1, (3, 20))
    r = stream_client.solve_dense(A, b)
    assert r.summary.streamed
    assert rel_err(r.x, np.linalg.solve(A, b[..., None])[..., 0]) < F64_TOL


def test_singular_status(client):
    r = client.solve_dense(np.array([[[1.0, 2.0], [2.0, 4.0]], [[2.0, 0.0], [0.0, 2.0]]]),
                           np.array([[1.0, 1.0], [2.0, 4.0]]))
    assert list(r.status) == [trisolve.SystemStatus.SINGULAR, trisolve.SystemStatus.OK]
    assert not r.ok and r.summary.singular == 1
    np.testing.assert_array_equal(r.x[0], [0.0, 0.0])
    np.testing.assert_allclose(r.x[1], [1.0, 2.0])


# ---- errors ----------------------------------------------------------------------------------
def test_bad_shape_is_invalid_argument_naming_the_array(client, stream_client):
    for cl in (client, stream_client):
        with pytest.raises(trisolve.InvalidArgument) as e:
            cl.solve_tridiagonal(np.zeros((2, 5)), np.ones((2, 4)), np.zeros((2, 5)), np.ones((2, 5)))
        assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert "b has shape" in e.value.message
        assert isinstance(e.value, trisolve.TrisolveError)
    with pytest.raises(trisolve.InvalidArgument, match="lower"):
        client.solve_tree([-1, 0, 1], [0.0, 1.0], [0.0, 1.0, 1.0], [3.0, 3.0, 3.0], [1.0, 1.0, 1.0])


def test_invalid_values_and_methods(client):
    with pytest.raises(trisolve.InvalidArgument, match="method"):
        client.solve_tridiagonal([0.0, 1.0], [2.0, 2.0], [1.0, 0.0], [1.0, 1.0], method="magic")
    with pytest.raises(trisolve.InvalidArgument):
        client.solve_tridiagonal([0.0, 1.0], [2.0, np.nan], [1.0, 0.0], [1.0, 1.0])
    with pytest.raises(trisolve.InvalidArgument, match="parent"):
        client.solve_tree([-1, 2, 0], [0.0, 1, 1], [0.0, 1, 1], [3.0, 3, 3], [1.0, 1, 1])


def test_deadline_exceeded(client):
    rng = np.random.default_rng(13)
    aC, cC, bC, cA, cB, f, _ = block_problem(rng, 32, 32)
    t0 = time.monotonic()
    with pytest.raises(trisolve.DeadlineExceeded) as e:
        client.solve_block_tridiagonal(aC, cC, bC, cA, cB, f, method="jacobi",
                                       max_iterations=200000, tol=0, timeout=0.2)
    assert e.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
    assert time.monotonic() - t0 < 5


def test_unavailable():
    with trisolve.Client("127.0.0.1:1", timeout=10) as c:
        with pytest.raises(trisolve.Unavailable) as e:
            c.server_info()
        assert e.value.code == grpc.StatusCode.UNAVAILABLE


def test_message_limit_resource_exhausted_and_streaming_past_it():
    s = ServerProcess("--max-message-bytes", str(1 << 20))
    try:
        rng = np.random.default_rng(14)
        a, b, c, d = random_tridiagonal(rng, 200, 400)  # 4 x 640 KB
        with trisolve.Client(s.target, timeout=60, stream_threshold_bytes=1 << 40,
                             transport="grpc") as unary:
            with pytest.raises(trisolve.ResourceExhausted) as e:
                unary.solve_tridiagonal(a, b, c, d)
            assert e.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        with trisolve.Client(s.target, timeout=60, stream_threshold_bytes=512 << 10,
                             transport="grpc") as streaming:
            r = streaming.solve_tridiagonal(a, b, c, d)
            assert r.summary.streamed
            assert rel_err(r.x, thomas_batch(a, b, c, d)) < F64_TOL
    finally:
        s.stop()


def test_unimplemented_is_raised_as_such():
    """A gRPC server without trisolve's service answers UNIMPLEMENTED: the exception the
    persistent-system tests and the example's fallback look for."""
    from concurrent import futures

    bare = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    port = bare.add_insecure_port("127.0.0.1:0")
    bare.start()
    try:
        with trisolve.Client(f"127.0.0.1:{port}", timeout=10) as c:
            with pytest.raises(trisolve.Unimplemented) as e:
                c.create_system("tridiagonal", a=[0.0, 1.0], b=[2.0, 2.0], c=[1.0, 0.0])
            assert e.value.code == grpc.StatusCode.UNIMPLEMENTED
            with pytest.raises(trisolve.Unimplemented):
                c.solve_dense(np.eye(70), np.ones(70), timeout=10)
    finally:
        bare.stop(None)


def test_token_auth(tmp_path):
    tokens = tmp_path / "tokens"
    tokens.write_text("# accepted tokens\ns3cret-token\n")
    s = ServerProcess("--token-file", str(tokens))
    try:
        with trisolve.Client(s.target, timeout=30) as anonymous:
            assert anonymous.health() == "SERVING"  # the health service stays open
            with pytest.raises(trisolve.Unauthenticated) as e:
                anonymous.solve_tridiagonal([0.0, 1.0], [2.0, 2.0], [1.0, 0.0], [3.0, 3.0])
            assert e.value.code == grpc.StatusCode.UNAUTHENTICATED
        with trisolve.Client(s.target, token="wrong", timeout=30) as wrong:
            with pytest.raises(trisolve.Unauthenticated):
                wrong.server_info()
        with trisolve.Client(s.target, token="s3cret-token", timeout=30, transport="grpc") as good:
            r = good.solve_tridiagonal([0.0, 1.0], [2.0, 2.0], [1.0, 0.0], [3.0, 3.0])
            np.testing.assert_allclose(r.x, [1.0, 1.0])
            big = np.ones((1000, 300))  # streamed calls carry the token too
            r = good.solve_tridiagonal(0.5 * big, 3 * big, 0.5 * big, big)
            assert r.summary.streamed and r.ok
    finally:
        s.stop()


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def test_tls(tmp_path):
    if shutil.which("openssl") is None:
        pytest.skip("openssl not installed: cannot make the test certificates")
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=test-ca",
             "-keyout", "ca.key", "-out", "ca.pem", cwd=tmp_path)
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=localhost",
             "-keyout", "server.key", "-out", "server.csr", cwd=tmp_path)
    (tmp_path / "ext").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    _openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
             "-CAcreateserial", "-days", "1", "-extfile", "ext", "-out", "server.pem", cwd=tmp_path)
    s = ServerProcess("--tls-cert", str(tmp_path / "server.pem"), "--tls-key", str(tmp_path / "server.key"))
    try:
        target = f"localhost:{s.port}"
        with trisolve.Client(target, tls={"ca": str(tmp_path / "ca.pem")}, timeout=30) as c:
            r = c.solve_tridiagonal([0.0, 1, 1], [2.0, 2, 2], [1.0, 1, 0], [4.0, 8, 8])
            np.testing.assert_allclose(r.x, [1.0, 2.0, 3.0])
        pem = (tmp_path / "ca.pem").read_bytes()
        with trisolve.Client(s.target, tls=trisolve.TLS(ca=pem, server_name="localhost"),
                             timeout=30) as c:
            assert c.server_info().backend == "cpu"
        with trisolve.Client(s.target, timeout=10) as plain:
            with pytest.raises(trisolve.Unavailable):
                plain.server_info()
        with pytest.raises(FileNotFoundError):
            trisolve.Client(s.target, tls={"ca": str(tmp_path / "missing.pem")})
    finally:
        s.stop()


# ---- persistent systems ------------------------------------------------------------------------
def test_system_tridiagonal_solve_update_release(systems):
    client = systems
    rng = np.random.default_rng(20)
    a, b, c, _ = random_tridiagonal(rng, 1, 16)
    a, b, c = a[0], b[0], c[0]
    sys_ = client.create_system("tridiagonal", a=a, b=b, c=c, label="py-test", ttl_s=60)
    try:
        assert sys_.handle and sys_.family == "tridiagonal" and sys_.dtype == np.float64
        info = sys_.info()
        assert info.label == "py-test" and info.rhs_shape == (16,)
        assert sys_.handle in [s.handle for s in client.list_systems()]
        d = rng.uniform(-1, 1, 16)
        r = sys_.solve(d)
        assert rel_err(r.x, np.linalg.solve(tridiagonal_matrix(a, b, c), d)) < F64_TOL
        assert r.summary.handle in ("", sys_.handle)
        # k right-hand sides at once
        D = rng.uniform(-1, 1, (3, 16))
        r = sys_.solve(D)
        assert r.x.shape == (3, 16)
        assert rel_err(r.x, np.linalg.solve(tridiagonal_matrix(a, b, c), D.T).T) < F64_TOL
        # update in place, then with the solve
        b2 = b + 1.0
        sys_.update(b=b2)
        r = sys_.solve(d)
        assert rel_err(r.x, np.linalg.solve(tridiagonal_matrix(a, b2, c), d)) < F64_TOL
        b3 = b + 2.0
        r = sys_.solve(d, update={"b": b3})
        assert rel_err(r.x, np.linalg.solve(tridiagonal_matrix(a, b3, c), d)) < F64_TOL
        assert sys_.info().solves >= 4
        again = client.system(sys_.handle)  # re-attached by handle
        assert again.dtype == np.float64 and again.family == "tridiagonal"
        assert rel_err(again.solve(d).x, np.linalg.solve(tridiagonal_matrix(a, b3, c), d)) < F64_TOL
        with pytest.raises(trisolve.InvalidArgument):
            sys_.solve(np.ones(15))
    finally:
        sys_.release()
    with pytest.raises(trisolve.NotFound) as e:
        sys_.solve(np.ones(16))
    assert e.value.code == grpc.StatusCode.NOT_FOUND
    with pytest.raises(trisolve.NotFound):
        client.system(sys_.handle)


def test_system_context_manager_and_precision(systems):
    client = systems
    a = np.array([0.0, 1.0, 1.0], np.float32)
    b = np.array([2.0, 2.0, 2.0], np.float32)
    c = np.array([1.0, 1.0, 0.0], np.float32)
    with client.create_system("tridiagonal", a=a, b=b, c=c) as sys_:
        handle = sys_.handle
        assert sys_.dtype == np.float32
        r = sys_.solve(np.array([4.0, 8.0, 8.0], np.float32))
        assert r.x.dtype == np.float32
        np.testing.assert_allclose(r.x, [1.0, 2.0, 3.0], rtol=1e-6)
        with pytest.raises(TypeError, match="float32"):
            sys_.solve(np.array([4.0, 8.0, 8.0]))  # float64 into a float32 system: not narrowed
    assert handle not in [s.handle for s in client.list_systems()]


def test_system_tree_interleaved_batch(systems):
    client = systems
    rng = np.random.default_rng(21)
    parent, lower, upper, diag, rhs = random_tree(rng, 3, 19)
    with client.create_system("tree", parent=parent, lower=lower.T, upper=upper.T, diag=diag.T,
                              layout="interleaved") as sys_:
        r = sys_.solve(rhs.T)
        assert r.x.shape == (19, 3)
        assert rel_err(r.x.T, tree_reference(parent, lower, upper, diag, rhs)) < F64_TOL
        diag2 = diag * 1.5
        r = sys_.solve(rhs.T, update={"diag": diag2.T})
        assert rel_err(r.x.T, tree_reference(parent, lower, upper, diag2, rhs)) < F64_TOL


def test_system_dense_and_block(systems):
    client = systems
    rng = np.random.default_rng(22)
    A = rng.uniform(-1, 1, (6, 6)) + 4 * np.eye(6)
    with client.create_system("dense", A=A, method="lu") as sys_:
        B = rng.uniform(-1, 1, (2, 6))
        r = sys_.solve(B)
        assert rel_err(r.x, np.linalg.solve(A, B.T).T) < F64_TOL
    aC, cC, bC, cA, cB, f, y = block_problem(rng, 5, 4)
    with client.create_system("block-tridiagonal", aC=aC, cC=cC, bC=bC, cA=cA, cB=cB,
                              method="gauss-seidel", tol=1e-12) as sys_:
        r = sys_.solve(f)
        assert rel_err(r.x, y) < 1e-9


def test_system_time_step_stream(systems):
    client = systems
    rng = np.random.default_rng(23)
    n = 24
    a, b, c, _ = random_tridiagonal(rng, 1, n)
    a, b, c = a[0], b[0], c[0]
    with client.create_system("tridiagonal", a=a, b=b, c=c) as sys_:
        steps = []
        for k in range(8):
            steps.append((rng.uniform(-1, 1, n), b + 0.1 * k))
        with sys_.stream() as st:
            # two steps in flight: the next travels while the current one is solved
            st.send(steps[0][0], update={"b": steps[0][1]})
            answers = []
            for rhs, bk in steps[1:]:
                st.send(rhs, update={"b": bk})
                answers.append(st.recv())
            answers.append(st.recv())
            assert st.pending == 0
            r = st.solve(steps[0][0])  # no update: the last b stays
            np.testing.assert_allclose(
                r.x, np.linalg.solve(tridiagonal_matrix(a, steps[-1][1], c), steps[0][0]), rtol=1e-10)
        for (rhs, bk), ans in zip(steps, answers):
            assert rel_err(ans.x, np.linalg.solve(tridiagonal_matrix(a, bk, c), rhs)) < F64_TOL
        # an error ends the stream with the exception
        with pytest.raises(trisolve.InvalidArgument):
            with sys_.stream() as st:
                st.solve(np.ones(n + 1))
