"""Variable-size tridiagonal batches and tree cells of different sizes through the Python client
(``lengths=``) against the real trisolved: every system checked against a dense solve of its own
rows; the refusals name ``lengths`` (or the cell whose parent array is bad)."""
from __future__ import annotations

import numpy as np
import pytest

import trisolve
from reference import tree_matrix, tridiagonal_matrix


def concatenated(sizes, seed, zero_diagonal=None):
    rng = np.random.default_rng(seed)
    total = int(sum(sizes))
    a, c, d = rng.uniform(-1, 1, total), rng.uniform(-1, 1, total), rng.uniform(-1, 1, total)
    b = 2.5 + rng.uniform(-1, 1, total)
    if zero_diagonal is not None:  # b = 0, a = c = 1 (n even): nonsingular, Thomas' pivot 0
        o = int(sum(sizes[:zero_diagonal]))
        n = sizes[zero_diagonal]
        a[o:o + n], b[o:o + n], c[o:o + n] = 1, 0, 1
    return a, b, c, d


def per_system_reference(sizes, a, b, c, d):
    out, o = [], 0
    for n in sizes:
        s = slice(o, o + n)
        out.append(np.linalg.solve(tridiagonal_matrix(a[s], b[s], c[s]), d[s]))
        o += n
    return np.concatenate(out)


@pytest.mark.parametrize("dtype,tol", [(np.float64, 1e-11), (np.float32, 2e-4)])
def test_systems_of_different_sizes(client, dtype, tol):
    sizes = [1, 2, 3, 64, 7, 250, 4]
    a, b, c, d = concatenated(sizes, 3, zero_diagonal=3)
    r = client.solve_tridiagonal(a.astype(dtype), b.astype(dtype), c.astype(dtype),
                                 d.astype(dtype), lengths=np.array(sizes, dtype=np.int64))
    assert r.x.shape == (sum(sizes),) and r.x.dtype == dtype
    assert r.status.shape == (len(sizes),) and r.ok, r.status
    ref = per_system_reference(sizes, a.astype(dtype).astype(np.float64),
                               b.astype(dtype).astype(np.float64),
                               c.astype(dtype).astype(np.float64),
                               d.astype(dtype).astype(np.float64))
    assert np.max(np.abs(r.x - ref)) <= tol * np.max(np.abs(ref))
    assert r.summary.systems == len(sizes)


def test_lengths_refusals_name_the_field(client):
    a, b, c, d = concatenated([3, 4], 5)
    with pytest.raises(trisolve.InvalidArgument, match="lengths: the 2 lengths sum to 8"):
        client.solve_tridiagonal(a, b, c, d, lengths=[3, 5])
    with pytest.raises(trisolve.InvalidArgument, match=r"lengths: lengths\[1\] is 0"):
        client.solve_tridiagonal(a, b, c, d, lengths=[7, 0])
    with pytest.raises(trisolve.InvalidArgument, match="takes layout FLAT"):
        client.solve_tridiagonal(a, b, c, d, layout="interleaved", lengths=[3, 4])
    with pytest.raises(TypeError, match="lengths has dtype float64"):
        client.solve_tridiagonal(a, b, c, d, lengths=np.array([3.0, 4.0]))
    with pytest.raises(ValueError, match="lengths holds values outside int32"):
        client.solve_tridiagonal(a, b, c, d, lengths=np.array([3, 2**40], dtype=np.int64))


def test_unified_layout(client):
    rng = np.random.default_rng(8)
    batch, n = 6, 40
    a, c, d = (rng.uniform(-1, 1, (batch, n)) for _ in range(3))
    b = 2.5 + rng.uniform(-1, 1, (batch, n))
    abc = np.stack([a, b, c], axis=-1)  # [batch, n, 3]: a, b, c of a row together
    r = client.solve_tridiagonal(None, None, None, d, abc=abc)
    assert r.x.shape == (batch, n) and r.ok
    ref = np.stack([np.linalg.solve(tridiagonal_matrix(a[s], b[s], c[s]), d[s])
                    for s in range(batch)])
    assert np.max(np.abs(r.x - ref)) <= 1e-11 * np.max(np.abs(ref))
    flat = client.solve_tridiagonal(a, b, c, d)
    assert np.max(np.abs(r.x - flat.x)) <= 1e-13 * np.max(np.abs(ref))
    # With lengths: abc [total, 3].
    sizes = [5, 1, 34]
    r2 = client.solve_tridiagonal(None, None, None, d[:2].reshape(-1)[:40],
                                  abc=abc[:2].reshape(-1, 3)[:40], lengths=sizes)
    assert r2.ok and r2.status.shape == (3,)
    with pytest.raises(trisolve.InvalidArgument, match=r"abc has shape \[6, 40, 2\]"):
        client.solve_tridiagonal(None, None, None, d, abc=abc[..., :2])
    with pytest.raises(ValueError, match="abc holds a, b and c"):
        client.solve_tridiagonal(a, None, None, d, abc=abc)


def tree_cells(sizes, seed, singular=None):
    """Cells of the given sizes concatenated, each numbered on its own (its node 0 its root),
    diagonally dominant; `singular` names a cell made [[1, 1], [1, 1]] (size 2)."""
    rng = np.random.default_rng(seed)
    parent, lower, upper, diag, rhs = [], [], [], [], []
    for k, n in enumerate(sizes):
        p = np.array([-1] + [int(rng.integers(0, i)) for i in range(1, n)], dtype=np.int64)
        lo, up = -rng.uniform(0.1, 1, n), -rng.uniform(0.1, 1, n)
        lo[0], up[0] = 77.0, -55.0  # not part of the matrix: ignored
        dg = rng.uniform(0.5, 1.5, n) + np.abs(lo) * (np.arange(n) > 0)
        np.add.at(dg, p[1:], np.abs(up[1:]))
        if k == singular:
            assert n == 2
            lo[1], up[1], dg[:] = 1, 1, 1
        parent.append(p), lower.append(lo), upper.append(up), diag.append(dg)
        rhs.append(rng.uniform(-1, 1, n))
    return [np.concatenate(v) for v in (parent, lower, upper, diag, rhs)]


def per_cell_reference(sizes, parent, lower, upper, diag, rhs):
    out, o = [], 0
    for n in sizes:
        s = slice(o, o + n)
        out.append(np.linalg.solve(tree_matrix(parent[s], lower[s], upper[s], diag[s]), rhs[s]))
        o += n
    return np.concatenate(out)


@pytest.mark.parametrize("dtype,tol", [(np.float64, 1e-11), (np.float32, 2e-4)])
def test_tree_cells_of_different_sizes(client, dtype, tol):
    sizes = [1, 2, 5, 40, 3, 120, 7]
    parent, lower, upper, diag, rhs = tree_cells(sizes, 4)
    r = client.solve_tree(parent, lower.astype(dtype), upper.astype(dtype), diag.astype(dtype),
                          rhs.astype(dtype), lengths=np.array(sizes, dtype=np.int64))
    assert r.x.shape == (sum(sizes),) and r.x.dtype == dtype
    assert r.status.shape == (len(sizes),) and r.ok, r.status
    ref = per_cell_reference(sizes, parent, *(v.astype(dtype).astype(np.float64)
                                               for v in (lower, upper, diag, rhs)))
    assert np.max(np.abs(r.x - ref)) <= tol * np.max(np.abs(ref))
    assert r.summary.systems == len(sizes)


def test_tree_cells_singular_cell_and_refusals(client):
    sizes = [3, 2, 4]
    parent, lower, upper, diag, rhs = tree_cells(sizes, 6, singular=1)
    r = client.solve_tree(parent, lower, upper, diag, rhs, lengths=sizes)
    assert list(r.status) == [trisolve.SystemStatus.OK, trisolve.SystemStatus.SINGULAR,
                              trisolve.SystemStatus.OK], r.status
    assert np.all(r.x[3:5] == 0)
    with pytest.raises(trisolve.InvalidArgument, match="lengths: the 3 lengths sum to 8"):
        client.solve_tree(parent, lower, upper, diag, rhs, lengths=[3, 2, 3])
    bad = parent.copy()
    bad[6] = 5  # cell 2's node 1 given the request's index of a node, not the cell's
    with pytest.raises(trisolve.InvalidArgument,
                       match=r"parent: cell 2: parent\[6\] \(its node 1\) is 5"):
        client.solve_tree(bad, lower, upper, diag, rhs, lengths=sizes)
    with pytest.raises(trisolve.InvalidArgument, match="cells of different sizes take layout FLAT"):
        client.solve_tree(parent, lower, upper, diag, rhs, layout="interleaved", lengths=sizes)
    with pytest.raises(TypeError, match="lengths has dtype float64"):
        client.solve_tree(parent, lower, upper, diag, rhs, lengths=np.array([3.0, 2.0, 4.0]))


def test_variable_systems_by_handle(systems):
    """create_system(..., lengths=): a solve sends d (total,) or (k, total) alone and answers as
    the one-shot call; an update of b cures a singular system; lengths cannot be updated."""
    client = systems
    sizes = [1, 2, 3, 64, 7, 250, 4]
    a, b, c, d = concatenated(sizes, 8)
    o = sum(sizes[:4])
    b_zero = b.copy()
    a_zero, c_zero = a.copy(), c.copy()
    a_zero[o:o + 7], b_zero[o:o + 7], c_zero[o:o + 7] = 0, 0, 0  # system 4 singular
    with client.create_system("tridiagonal", a=a_zero, b=b_zero, c=c_zero, lengths=sizes) as sys:
        assert sys.last_info.variable and sys.last_info.systems == len(sizes)
        assert sys.last_info.rhs_shape == (sum(sizes),)
        r = sys.solve(d)
        one_shot = client.solve_tridiagonal(a_zero, b_zero, c_zero, d, lengths=sizes)
        assert np.array_equal(r.x, one_shot.x) and list(r.status) == list(one_shot.status)
        assert [s == trisolve.SystemStatus.SINGULAR for s in r.status] == \
            [k == 4 for k in range(len(sizes))]
        two = np.stack([d, 2 * d])
        rk = sys.solve(two)
        assert rk.x.shape == (2, sum(sizes)) and rk.status.shape == (2 * len(sizes),)
        assert np.array_equal(rk.x[0], one_shot.x)
        r = sys.solve(d, update={"a": a, "b": b, "c": c})
        ref = per_system_reference(sizes, a, b, c, d)
        assert r.ok and np.max(np.abs(r.x - ref)) <= 1e-11 * np.max(np.abs(ref))
        with pytest.raises(trisolve.InvalidArgument, match="'lengths' is fixed"):
            sys.update(lengths=np.array(sizes, dtype=np.float64))
        with pytest.raises(trisolve.InvalidArgument, match=r"rhs has shape \[7\]"):
            sys.solve(d[:7])
    parent, lower, upper, diag, rhs = tree_cells([3, 2, 4], 9, singular=1)
    with client.create_system("tree", parent=parent, lower=lower, upper=upper, diag=diag,
                              lengths=[3, 2, 4]) as cells:
        r = cells.solve(rhs)
        one_shot = client.solve_tree(parent, lower, upper, diag, rhs, lengths=[3, 2, 4])
        assert np.array_equal(r.x, one_shot.x)
        assert list(r.status) == [trisolve.SystemStatus.OK, trisolve.SystemStatus.SINGULAR,
                                  trisolve.SystemStatus.OK]
    with pytest.raises(ValueError, match="lengths: a dense system"):
        client.create_system("dense", A=np.eye(3), lengths=[3])
