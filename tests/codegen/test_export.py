"""Ahead-of-time export: tensorlang.export → <name>.o/.h/.so that C programs and ctypes call (needs a C compiler)."""

from __future__ import annotations

import ctypes
import shutil
import subprocess

import numpy as np
import pytest

from codegen.aot import export
from codegen.export.wrapper import ERROR_INDEX, ERROR_NOT_EXPORTED, ERROR_SIZES
from tensorlang.errors import TensorLangError

CC = shutil.which("cc")
pytestmark = pytest.mark.skipif(CC is None, reason="no C compiler (cc) on this machine")

MATMUL = "def matmul(float(M, K) A, float(K, N) B) -> (C) {\n  C(m, n) +=! A(m, k) * B(k, n)\n}\n"
SOFTMAX = (
    "def softmax(float(N, D) I) -> (O) {\n  mx(n) max=! I(n, d)\n  e(n, d) = exp(I(n, d) - mx(n))\n"
    "  s(n) +=! e(n, d)\n  O(n, d) = e(n, d) / s(n)\n}\n"
)
EMB = "def emb(float(V, E) T, int32(B) I) -> (O) {\n  O(b, e) = T(I(b), e)\n}\n"
CONV = (
    "def conv(float(N, C, H, W) I, float(F, C, KH, KW) Wt) -> (O) {\n"
    "  O(n, f, h, w) +=! I(n, c, h + kh, w + kw) * Wt(f, c, kh, kw)\n}\n"
)

# what an exported object may leave undefined: libc's memory functions and libm
ALLOWED_UNDEFINED = {
    "memset", "memcpy", "memmove", "malloc", "free", "posix_memalign", "aligned_alloc",
    "exp", "expf", "log", "logf", "pow", "powf", "sin", "sinf", "cos", "cosf", "tanh", "tanhf",
    "sqrt", "sqrtf", "fmod", "fmodf", "erf", "erff", "exp2", "exp2f", "log2", "log2f",
}  # fmt: skip

C_TYPES = {np.float32: "float", np.int32: "int32_t"}


def softmax_ref(x):
    e = np.exp(x - x.max(1, keepdims=True))
    return e / e.sum(1, keepdims=True)


def run_c(tmp_path, result, inputs, outputs, sizes):
    """Compile a C program that reads the inputs from files, calls the export and writes the
    outputs; link it with the object and -lm; return (return code, outputs)."""
    name = result.name
    lines = ["#include <stdio.h>", "#include <stdlib.h>", f'#include "{name}.h"', "int main(void) {"]
    args = []
    for n, a in enumerate(inputs):
        ty = C_TYPES[a.dtype.type]
        a.tofile(tmp_path / f"in{n}.bin")
        lines += [
            f"  {ty}* in{n} = malloc({max(1, a.nbytes)});",
            f'  FILE* f{n} = fopen("in{n}.bin", "rb"); fread(in{n}, 1, {a.nbytes}, f{n}); fclose(f{n});',
        ]
        args.append(f"in{n}")
    for n, (dtype, shape) in enumerate(outputs):
        lines.append(
            f"  {C_TYPES[dtype]}* out{n} = calloc({max(1, int(np.prod(shape)))}, sizeof({C_TYPES[dtype]}));"
        )
        args.append(f"out{n}")
    args += [str(v) for v in sizes]
    lines.append(f"  int32_t rc = {name}({', '.join(args)});")
    lines.append(f'  printf("%d %s\\n", rc, {name}_error(rc));')
    for n, (_, shape) in enumerate(outputs):
        count = int(np.prod(shape))
        lines.append(
            f'  FILE* o{n} = fopen("out{n}.bin", "wb"); fwrite(out{n}, sizeof(*out{n}), {count}, o{n}); fclose(o{n});'
        )
    lines.append("  return 0;\n}\n")
    (tmp_path / "prog.c").write_text("\n".join(lines))
    cmd = [
        CC,
        "-O1",
        "-Wall",
        "-I",
        str(result.header.parent),
        "prog.c",
        str(result.object),
        "-lm",
        "-lpthread",
        "-o",
        "prog",
    ]
    subprocess.run(cmd, cwd=tmp_path, check=True, capture_output=True)
    out = subprocess.run(
        ["./prog"], cwd=tmp_path, check=True, capture_output=True, text=True, timeout=60
    ).stdout
    rc = int(out.split()[0])
    results = [np.fromfile(tmp_path / f"out{n}.bin", dtype=d).reshape(s) for n, (d, s) in enumerate(outputs)]
    return rc, results, out


def load(result):
    """The shared library's entry, taking NumPy arrays' addresses and int64 sizes."""
    lib = ctypes.CDLL(str(result.shared))
    fn = getattr(lib, result.name)
    fn.restype = ctypes.c_int32
    error = getattr(lib, f"{result.name}_error")
    error.restype, error.argtypes = ctypes.c_char_p, [ctypes.c_int32]

    def call(*arrays, sizes):
        return fn(*[ctypes.c_void_p(a.ctypes.data) for a in arrays], *[ctypes.c_int64(s) for s in sizes])

    return lib, call, error


@pytest.mark.parametrize("specialised", [True, False], ids=["specialised", "generic"])
def test_matmul_c_program_matches_numpy(tmp_path, specialised):
    r = np.random.default_rng(0)
    M, K, N = 37, 53, 29  # odd sizes: GEMM edges (specialised), loop remainders (generic)
    A, B = r.standard_normal((M, K), dtype=np.float32), r.standard_normal((K, N), dtype=np.float32)
    result = export(MATMUL, sizes=dict(M=M, K=K, N=N) if specialised else None, path=tmp_path / "out")
    assert result.object.exists() and result.header.exists()
    rc, (C,), _ = run_c(tmp_path, result, [A, B], [(np.float32, (M, N))], (M, K, N))
    assert rc == 0
    np.testing.assert_allclose(C, A @ B, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("specialised", [True, False], ids=["specialised", "generic"])
def test_softmax_c_program_matches_numpy(tmp_path, specialised):
    x = np.random.default_rng(1).standard_normal((19, 301), dtype=np.float32)
    result = export(SOFTMAX, sizes=dict(N=19, D=301) if specialised else None, path=tmp_path / "out")
    rc, (got,), _ = run_c(tmp_path, result, [x], [(np.float32, x.shape)], x.shape)
    assert rc == 0
    np.testing.assert_allclose(got, softmax_ref(x), rtol=1e-5, atol=1e-6)


def test_gather_out_of_range_index_returns_error_code(tmp_path):
    T = np.random.default_rng(2).standard_normal((50, 16), dtype=np.float32)
    idx = np.arange(23, dtype=np.int32) % 50
    result = export(EMB, path=tmp_path / "out")
    rc, (got,), _ = run_c(tmp_path, result, [T, idx], [(np.float32, (23, 16))], (50, 16, 23))
    assert rc == 0 and np.array_equal(got, T[idx])
    idx[5] = 53
    rc, _, text = run_c(tmp_path, result, [T, idx], [(np.float32, (23, 16))], (50, 16, 23))
    assert rc == ERROR_INDEX and "out of range" in text


def test_specialised_export_rejects_other_sizes(tmp_path):
    result = export(MATMUL, sizes=dict(M=8, K=4, N=6), path=tmp_path)
    _, call, error = load(result)
    A, B, C = np.ones((8, 4), np.float32), np.ones((4, 6), np.float32), np.zeros((8, 6), np.float32)
    assert call(A, B, C, sizes=(8, 4, 6)) == 0 and np.all(C == 4)
    assert call(A, B, C, sizes=(8, 4, 5)) == ERROR_NOT_EXPORTED
    assert call(A, B, C, sizes=(-1, 4, 6)) == ERROR_SIZES
    assert b"exported" in error(ERROR_NOT_EXPORTED) and error(1234) == b"unknown error code"


def test_generic_export_checks_sizes_and_reports_output_shape(tmp_path):
    result = export(MATMUL, path=tmp_path)
    lib, call, _ = load(result)
    dims = (ctypes.c_int64 * 2)()
    lib.matmul_output_shape(ctypes.c_int64(5), ctypes.c_int64(7), ctypes.c_int64(3), dims)
    assert list(dims) == [5, 3]
    A, B, C = np.ones((5, 7), np.float32), np.ones((7, 3), np.float32), np.zeros((5, 3), np.float32)
    assert call(A, B, C, sizes=(5, 7, 3)) == 0 and np.all(C == 7)
    assert call(A, B, C, sizes=(5, 2**31, 3)) == ERROR_SIZES


def test_object_leaves_only_libc_and_libm_undefined(tmp_path):
    for source, sizes in ((MATMUL, dict(M=64, K=64, N=64)), (SOFTMAX, None), (EMB, None)):
        result = export(source, sizes=sizes, path=tmp_path)
        listing = subprocess.run(["nm", "-u", str(result.object)], check=True, capture_output=True, text=True)
        undefined = {line.split()[-1] for line in listing.stdout.splitlines() if line.strip()}
        assert undefined <= ALLOWED_UNDEFINED, undefined - ALLOWED_UNDEFINED
        defined = subprocess.run(
            ["nm", "-g", "--defined-only", str(result.object)], capture_output=True, text=True
        )
        public = {line.split()[-1] for line in defined.stdout.splitlines() if line.strip()}
        assert public == {result.name, f"{result.name}_error", f"{result.name}_output_shape"}


def test_shared_library_gives_the_numpy_result(tmp_path):
    """A GEMM call whose weights the entry relays out first (a convolution), through ctypes."""
    r = np.random.default_rng(3)
    image = r.standard_normal((2, 16, 18, 18), dtype=np.float32)
    Wt = r.standard_normal((32, 16, 3, 3), dtype=np.float32)
    sizes = dict(N=2, C=16, H=18, W=18, F=32, KH=3, KW=3)  # large enough for the GEMM path
    result = export(CONV, sizes=sizes, path=tmp_path)
    assert result.shared is not None and result.shared.exists()
    _, call, _ = load(result)
    got = np.zeros((2, 32, 16, 16), np.float32)
    assert call(image, Wt, got, sizes=tuple(sizes.values())) == 0
    want = np.zeros_like(got)
    for kh in range(3):
        for kw in range(3):
            want += np.einsum("nchw,fc->nfhw", image[:, :, kh : kh + 16, kw : kw + 16], Wt[:, :, kh, kw])
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_bad_arguments_are_tensorlang_errors(tmp_path):
    with pytest.raises(TensorLangError, match="sizes"):
        export(MATMUL, sizes=dict(M=3, K=4), path=tmp_path)
    with pytest.raises(TensorLangError, match="int"):
        export(MATMUL, sizes=dict(M=3, K=4, N=-2), path=tmp_path)
    with pytest.raises(TensorLangError, match="name"):
        export(MATMUL, "nope", path=tmp_path)


MLP = """def mlp(float(B, D) X, float(D, H) W1, float(H, O) W2) -> (Y) {
  h(b, j) +=! X(b, d) * W1(d, j)
  r(b, j) = fmax(h(b, j), 0.0)
  g(b, o) +=! r(b, k) * W2(k, o)
  Y(b, o) = g(b, o) * 2.0
}
"""
ROWSUM = "def rowsum(float(N, D) I) -> (O) {\n  t(n) +=! I(n, d)\n  u(n) += I(n, d) * 2.0\n  O(n) = t(n) + u(n)\n}\n"


@pytest.mark.parametrize("specialised", [True, False], ids=["specialised", "generic"])
def test_temporaries_are_allocated_shared_and_zeroed(tmp_path, specialised):
    """Two GEMMs whose temporaries share buffers (specialised), and a temporary accumulated
    with `+=` that starts from zeros."""
    r = np.random.default_rng(4)
    X, W1, W2 = (r.standard_normal(s, dtype=np.float32) for s in ((64, 96), (96, 80), (80, 48)))
    sizes = dict(B=64, D=96, H=80, O=48)
    result = export(MLP, sizes=sizes if specialised else None, path=tmp_path / "mlp")
    _, call, _ = load(result)
    Y = np.zeros((64, 48), np.float32)
    assert call(X, W1, W2, Y, sizes=tuple(sizes.values())) == 0
    np.testing.assert_allclose(Y, 2 * (np.maximum(X @ W1, 0) @ W2), rtol=1e-4, atol=1e-3)
    with pytest.warns(UserWarning, match="without initialization"):
        result = export(ROWSUM, sizes=dict(N=30, D=20) if specialised else None, path=tmp_path / "rs")
    _, call, _ = load(result)
    x, got = r.standard_normal((30, 20), dtype=np.float32), np.zeros(30, np.float32)
    for _ in range(2):  # a second call starts from zeros again
        assert call(x, got, sizes=(30, 20)) == 0
        np.testing.assert_allclose(got, 3 * x.sum(1), rtol=1e-5, atol=1e-5)


def test_generic_export_checks_bounds_that_depend_on_sizes(tmp_path):
    """A(i + 2) stays in bounds only while M <= N - 2: the runtime checks that per call, and so
    does the generic C entry."""
    source = "def shift(float(N) A, float(M) Q) -> (B) {\n  B(i) = A(i + 2) + Q(i) where i in 0:M\n}\n"
    _, call, _ = load(export(source, path=tmp_path))
    a, q, got = np.arange(10, dtype=np.float32), np.ones(9, np.float32), np.zeros(9, np.float32)
    assert call(a, q, got, sizes=(10, 8)) == 0
    np.testing.assert_array_equal(got[:8], a[2:] + 1)
    assert call(a, q, got, sizes=(10, 9)) == ERROR_SIZES


def test_generic_export_computes_derived_parameters(tmp_path):
    """B's extent N*M is a derived isl parameter: the entry computes it from the sizes."""
    source = "def flat(float(N, M) A) -> (B) {\n  B(k) = A(k / M, k % M) where k in 0:N*M\n}\n"
    _, call, _ = load(export(source, path=tmp_path))
    a, got = np.arange(12, dtype=np.float32).reshape(3, 4), np.zeros(12, np.float32)
    assert call(a, got, sizes=(3, 4)) == 0
    np.testing.assert_array_equal(got, a.ravel())


def test_command_line_export(tmp_path, capsys):
    from tensorlang import cli

    (tmp_path / "mm.tc").write_text(MATMUL)
    out = tmp_path / "build"
    assert (
        cli.main(["export", str(tmp_path / "mm.tc"), "--shape", "A=8x4", "--shape", "B=4x6", "-o", str(out)])
        == 0
    )
    assert (out / "matmul.o").exists() and "M=8, K=4, N=6" in (out / "matmul.h").read_text()
    assert cli.main(["export", str(tmp_path / "mm.tc"), "-o", str(out)]) == 0  # generic
    assert "Generic" in (out / "matmul.h").read_text()
    assert cli.main(["export", str(tmp_path / "mm.tc"), "--size", "M=8", "-o", str(out)]) == 1
    assert "K, N unknown" in capsys.readouterr().err


def test_shared_library_linked_by_the_ziglang_wheel(tmp_path, monkeypatch):
    """Where the system has no C compiler, the `[aot]` extra's zig links the .so."""
    pytest.importorskip("ziglang")
    from codegen.export import objects

    monkeypatch.setattr(objects.shutil, "which", lambda name: None)
    assert objects.linker_command()[1:] == ["-m", "ziglang", "cc"]
    r = np.random.default_rng(5)
    a, b = r.standard_normal((7, 5), dtype=np.float32), r.standard_normal((5, 3), dtype=np.float32)
    result = export(MATMUL, sizes=dict(M=7, K=5, N=3), path=tmp_path)
    assert result.shared is not None and result.shared.exists()
    _, call, _ = load(result)
    got = np.zeros((7, 3), np.float32)
    assert call(a, b, got, sizes=(7, 5, 3)) == 0
    np.testing.assert_allclose(got, a @ b, rtol=1e-5, atol=1e-5)
