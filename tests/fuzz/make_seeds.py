#!/usr/bin/env python3
"""Writes the seed corpus of the fuzzers into tests/fuzz/corpus/{npy,swc,translate}.

Seeds are small valid inputs of each kind (and a few near misses); the fuzzers mutate from
them. Run again after a change of the request format: python3 tests/fuzz/make_seeds.py
(needs protoc and python3-protobuf, python3-numpy)."""
import io
import pathlib
import shutil
import subprocess
import sys
import tempfile

import numpy as np

here = pathlib.Path(__file__).resolve().parent
top = here.parent.parent
corpus = here / "corpus"


def write(kind, name, data):
    d = corpus / kind
    d.mkdir(parents=True, exist_ok=True)
    (d / name).write_bytes(data)


def npy_seeds():
    def save(name, a, version=None):
        buf = io.BytesIO()
        if version is None:
            np.save(buf, a)
        else:
            np.lib.format.write_array(buf, a, version=version)
        write("npy", name, buf.getvalue())

    save("f8_2d.npy", np.arange(6, dtype="<f8").reshape(2, 3))
    save("f4_1d.npy", np.linspace(0, 1, 5, dtype="<f4"))
    save("i4_parent.npy", np.array([-1, 0, 1, 1, 3], dtype="<i4"))
    save("i8_1d.npy", np.array([-1, 0, 0], dtype="<i8"))
    save("f8_0d.npy", np.array(2.5, dtype="<f8"))
    save("f8_3d_v2.npy", np.zeros((2, 2, 2), dtype="<f8"), version=(2, 0))
    save("f8_empty.npy", np.zeros((0, 4), dtype="<f8"))
    save("fortran.npy", np.asfortranarray(np.ones((2, 3))))


def swc_seeds():
    write("swc", "small.swc", b"# comment\n1 1 0 0 0 5 -1\n2 3 1 0 0 1 1\n3 3 2 0 0 1 2\n"
          b"4 3 0 1 0 1 1\n")
    write("swc", "gaps.swc", b"10 1 0 0 0 5 -1\n12 3 1e0 0 0 1.5 10\n\t13 3 2 0 0 1 12\r\n")
    lines = (top / "tests/data/neuron_10-2012-02-09-001.CNG.swc").read_bytes().splitlines()
    write("swc", "neuron_head.swc", b"\n".join(lines[:80]) + b"\n")


def translate_seeds():
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(["protoc", f"--proto_path={top / 'proto'}", f"--proto_path={here}",
                        f"--python_out={tmp}", str(top / "proto/trisolve/v1/trisolve.proto"),
                        str(here / "translate_input.proto")], check=True)
        sys.path.insert(0, tmp)
        from trisolve.v1 import trisolve_pb2 as v1
        import translate_input_pb2 as fz

        def arr(a, values):
            values = np.ascontiguousarray(values)
            a.shape[:] = list(values.shape)
            a.data = values.tobytes()

        def put(name, msg):
            write("translate", name, msg.SerializeToString())

        rng = np.random.default_rng(35)
        # Tridiagonal, flat [2, 5], float64, solved.
        t = fz.TranslateInput(solve=True)
        r = t.tridiagonal
        r.dtype = v1.FLOAT64
        arr(r.a, rng.random((2, 5)))
        arr(r.b, 4 + rng.random((2, 5)))
        arr(r.c, rng.random((2, 5)))
        arr(r.d, rng.random((2, 5)))
        put("tridiagonal.pb", t)
        # One matrix, three right-hand sides, float32, pivoting.
        t = fz.TranslateInput(solve=True)
        r = t.tridiagonal
        r.dtype = v1.FLOAT32
        r.method = "pivoting"
        for a, v in ((r.a, rng.random(4)), (r.b, rng.random(4)), (r.c, rng.random(4))):
            arr(a, v.astype("<f4"))
        arr(r.d, rng.random((3, 4)).astype("<f4"))
        put("tridiagonal_shared_f32.pb", t)
        # Tree: 6 nodes, interleaved batch of 2.
        t = fz.TranslateInput(solve=True)
        r = t.tree
        r.dtype = v1.FLOAT64
        r.layout = v1.INTERLEAVED
        arr(r.parent, np.array([-1, 0, 1, 1, 0, 4], dtype="<i4"))
        for a in (r.lower, r.upper, r.rhs):
            arr(a, rng.random((6, 2)))
        arr(r.diag, 3 + rng.random((6, 2)))
        put("tree.pb", t)
        # Block tridiagonal 3 x 4, red-black.
        t = fz.TranslateInput(solve=True)
        r = t.block_tridiagonal
        r.dtype = v1.FLOAT64
        r.method = "red-black"
        r.max_iterations = 20
        arr(r.a_c, -np.ones((3, 4)))
        arr(r.b_c, -np.ones((3, 4)))
        arr(r.c_c, 6 * np.ones((3, 4)))
        arr(r.c_a, -np.ones((3, 4)))
        arr(r.c_b, -np.ones((3, 4)))
        arr(r.f, rng.random((3, 4)))
        put("block.pb", t)
        # Dense 2 x [3, 3], lu.
        t = fz.TranslateInput(solve=True)
        r = t.dense
        r.dtype = v1.FLOAT64
        r.method = "lu"
        arr(r.a, rng.random((2, 3, 3)) + 3 * np.eye(3))
        arr(r.b, rng.random((2, 3)))
        put("dense.pb", t)
        # CreateSystem (tridiagonal, no right-hand side), then two steps: an update, then rhs.
        t = fz.TranslateInput(solve=True)
        r = t.create_system.tridiagonal
        r.dtype = v1.FLOAT64
        for a, v in ((r.a, rng.random(5)), (r.b, 4 + rng.random(5)), (r.c, rng.random(5))):
            arr(a, v)
        s = t.steps.add()
        arr(s.rhs, rng.random(5))
        s = t.steps.add()
        u = s.update.add()
        u.name = "b"
        arr(u.array, 5 + rng.random(5))
        arr(s.rhs, rng.random((2, 5)))
        put("create_system.pb", t)
        # CreateSystem, dense.
        t = fz.TranslateInput(solve=True)
        r = t.create_system.dense
        r.dtype = v1.FLOAT32
        arr(r.a, (rng.random((3, 3)) + 3 * np.eye(3)).astype("<f4"))
        s = t.steps.add()
        arr(s.rhs, rng.random(3).astype("<f4"))
        put("create_system_dense.pb", t)
        # A stream: header, then chunks of each array (d in two pieces).
        t = fz.TranslateInput(solve=True)
        h = t.stream.messages.add().tridiagonal
        h.dtype = v1.FLOAT64
        for a in (h.a, h.b, h.c, h.d):
            a.shape[:] = [4]
        for name, v in (("a", np.ones(4)), ("b", 4 * np.ones(4)), ("c", np.ones(4))):
            c = t.stream.messages.add().chunk
            c.array = name
            c.data = v.tobytes()
        d = np.arange(4.0)
        for off in (0, 2):
            c = t.stream.messages.add().chunk
            c.array = "d"
            c.offset = off * 8
            c.data = d[off:off + 2].tobytes()
        put("stream.pb", t)


if __name__ == "__main__":
    if corpus.exists():
        shutil.rmtree(corpus)
    npy_seeds()
    swc_seeds()
    translate_seeds()
    for kind in sorted(p.name for p in corpus.iterdir()):
        print(kind, len(list((corpus / kind).iterdir())), "seeds")
