"""Independent local solutions with NumPy: the systems assembled as dense matrices."""
from __future__ import annotations

import numpy as np


def tridiagonal_matrix(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """One system: a[k] x[k-1] + b[k] x[k] + c[k] x[k+1] (a[0], c[n-1] unused)."""
    a, b, c = (np.asarray(v, dtype=np.float64) for v in (a, b, c))
    return np.diag(b) + np.diag(a[1:], -1) + np.diag(c[:-1], 1)


def tree_matrix(parent, lower, upper, diag) -> np.ndarray:
    """A[i][i] = diag[i], A[i][parent[i]] = lower[i], A[parent[i]][i] = upper[i]."""
    n = len(diag)
    A = np.diag(np.asarray(diag, dtype=np.float64))
    for i in range(1, n):
        p = int(parent[i])
        A[i, p] = lower[i]
        A[p, i] = upper[i]
    return A


def block_matrix(aC, cC, bC, cA, cB) -> np.ndarray:
    """Block row i: diag(cA[i]) Y[i-1] + tridiag(aC[i], cC[i], bC[i]) Y[i] + diag(cB[i]) Y[i+1];
    unknown (i, k) at i*M + k."""
    N, M = np.shape(cC)
    A = np.zeros((N * M, N * M))
    for i in range(N):
        for k in range(M):
            r = i * M + k
            A[r, r] = cC[i][k]
            if k > 0:
                A[r, r - 1] = aC[i][k]
            if k < M - 1:
                A[r, r + 1] = bC[i][k]
            if i > 0:
                A[r, r - M] = cA[i][k]
            if i < N - 1:
                A[r, r + M] = cB[i][k]
    return A


def thomas_batch(a, b, c, d) -> np.ndarray:
    """The Thomas algorithm vectorised over the batch (axis 0), in float64, for big batches."""
    a, b, c, d = (np.array(v, dtype=np.float64) for v in (a, b, c, d))
    n = b.shape[1]
    cp = np.empty_like(b)
    dp = np.empty_like(b)
    cp[:, 0] = c[:, 0] / b[:, 0]
    dp[:, 0] = d[:, 0] / b[:, 0]
    for k in range(1, n):
        m = b[:, k] - a[:, k] * cp[:, k - 1]
        cp[:, k] = c[:, k] / m
        dp[:, k] = (d[:, k] - a[:, k] * dp[:, k - 1]) / m
    x = np.empty_like(b)
    x[:, -1] = dp[:, -1]
    for k in range(n - 2, -1, -1):
        x[:, k] = dp[:, k] - cp[:, k] * x[:, k + 1]
    return x


def random_tridiagonal(rng: np.random.Generator, batch: int, n: int):
    """Non-symmetric, diagonally dominant systems, batch x n (flat); a[.,0] and c[.,n-1] hold
    values the solver must ignore."""
    a = rng.uniform(-1.0, 1.0, (batch, n))
    c = rng.uniform(-1.0, 2.0, (batch, n))
    b = np.abs(a) + np.abs(c) + rng.uniform(1.0, 2.0, (batch, n))
    d = rng.uniform(-5.0, 5.0, (batch, n))
    return a, b, c, d


def random_tree_parent(rng: np.random.Generator, n: int) -> np.ndarray:
    """A depth-first numbered tree: a few unbranched cables hanging off earlier nodes."""
    parent = np.empty(n, dtype=np.int32)
    parent[0] = -1
    for i in range(1, n):
        parent[i] = i - 1 if rng.uniform() < 0.7 else rng.integers(0, i)
    return parent


def random_tree(rng: np.random.Generator, batch: int, n: int):
    parent = random_tree_parent(rng, n)
    lower = rng.uniform(-1.0, 0.0, (batch, n))
    upper = rng.uniform(-2.0, 0.5, (batch, n))
    diag = rng.uniform(6.0, 9.0, (batch, n)) + n * 0  # dominant for the few children a node has
    children = np.bincount(parent[1:], minlength=n)
    diag += 2.0 * (children + 1)
    rhs = rng.uniform(-3.0, 3.0, (batch, n))
    return parent, lower, upper, diag, rhs
