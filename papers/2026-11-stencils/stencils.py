"""The stencils of the experiment: each as a tensorlang time recurrence, a tensorlang sweep kernel
(one call per time step, the time loop in Python), NumPy slicing on preallocated buffers, and
numba loops (serial and prange). No NumPy or numba import at module level: run.py imports this
module after paperbench has cleaned the environment, and workers import numba lazily.

The recurrences are the ones of tests/test_stencils.py (issue 13's jacobi-2d among them).
"""

from __future__ import annotations

from dataclasses import dataclass, field

JACOBI_1D = """def jacobi1d(float(N) A) -> (O) {
  B(t, i) = A(i) where t in 0:1, i in 0:N
  B(t, i) = (i >= 1 && i < N - 1) ? 0.33333 * (B(t-1, i-1) + B(t-1, i) + B(t-1, i+1)) : B(t-1, i)
      where t in 1:T, i in 0:N
  O(i) = B(T - 1, i) where i in 0:N
}"""
JACOBI_1D_STEP = """def jacobi1d_step(float(N) X) -> (Y) {
  Y(i) = (i >= 1 && i < N - 1) ? 0.33333 * (X(i-1) + X(i) + X(i+1)) : X(i) where i in 0:N
}"""

JACOBI_2D = """def jacobi(float(N, M) A) -> (O) {
  B(t, i, j) = A(i, j) where t in 0:1, i in 0:N, j in 0:M
  B(t, i, j) = (i >= 1 && i < N - 1 && j >= 1 && j < M - 1)
               ? 0.2 * (B(t-1, i, j) + B(t-1, i-1, j) + B(t-1, i+1, j) + B(t-1, i, j-1) + B(t-1, i, j+1))
               : B(t-1, i, j) where t in 1:T, i in 0:N, j in 0:M
  O(i, j) = B(T - 1, i, j) where i in 0:N, j in 0:M
}"""
JACOBI_2D_STEP = """def jacobi_step(float(N, M) X) -> (Y) {
  Y(i, j) = (i >= 1 && i < N - 1 && j >= 1 && j < M - 1)
            ? 0.2 * (X(i, j) + X(i-1, j) + X(i+1, j) + X(i, j-1) + X(i, j+1))
            : X(i, j) where i in 0:N, j in 0:M
}"""

HEAT_3D = """def heat(float(N, M, K) A) -> (O) {
  B(t, i, j, k) = A(i, j, k) where t in 0:1, i in 0:N, j in 0:M, k in 0:K
  B(t, i, j, k) = (i >= 1 && i < N - 1 && j >= 1 && j < M - 1 && k >= 1 && k < K - 1)
      ? B(t-1, i, j, k) + 0.125 * (B(t-1, i+1, j, k) - 2.0 * B(t-1, i, j, k) + B(t-1, i-1, j, k))
                        + 0.125 * (B(t-1, i, j+1, k) - 2.0 * B(t-1, i, j, k) + B(t-1, i, j-1, k))
                        + 0.125 * (B(t-1, i, j, k+1) - 2.0 * B(t-1, i, j, k) + B(t-1, i, j, k-1))
      : B(t-1, i, j, k) where t in 1:T, i in 0:N, j in 0:M, k in 0:K
  O(i, j, k) = B(T - 1, i, j, k) where i in 0:N, j in 0:M, k in 0:K
}"""
HEAT_3D_STEP = """def heat_step(float(N, M, K) X) -> (Y) {
  Y(i, j, k) = (i >= 1 && i < N - 1 && j >= 1 && j < M - 1 && k >= 1 && k < K - 1)
      ? X(i, j, k) + 0.125 * (X(i+1, j, k) - 2.0 * X(i, j, k) + X(i-1, j, k))
                   + 0.125 * (X(i, j+1, k) - 2.0 * X(i, j, k) + X(i, j-1, k))
                   + 0.125 * (X(i, j, k+1) - 2.0 * X(i, j, k) + X(i, j, k-1))
      : X(i, j, k) where i in 0:N, j in 0:M, k in 0:K
}"""

# Gauss-Seidel in place: row i-1 and column j-1 already hold this sweep's values. No sweep kernel:
# one sweep reads its own output, which a TC statement cannot (only a recurrence can say it), and
# NumPy slicing cannot vectorise it either.
SEIDEL_2D = """def seidel(float(N, M) A) -> (O) {
  B(t, i, j) = A(i, j) where t in 0:1, i in 0:N, j in 0:M
  B(t, i, j) = (i >= 1 && i < N - 1 && j >= 1 && j < M - 1)
      ? (B(t, i-1, j-1) + B(t, i-1, j) + B(t, i-1, j+1)
         + B(t, i, j-1) + B(t-1, i, j) + B(t-1, i, j+1)
         + B(t-1, i+1, j-1) + B(t-1, i+1, j) + B(t-1, i+1, j+1)) / 9.0
      : B(t-1, i, j) where t in 1:T, i in 0:N, j in 0:M
  O(i, j) = B(T - 1, i, j) where i in 0:N, j in 0:M
}"""

# fdtd-2d: the three fields in one temporary F(t, f, i, j), f = 0 (ey), 1 (ex), 2 (hz).
FDTD_2D = """def fdtd(float(NX, NY) ex0, float(NX, NY) ey0, float(NX, NY) hz0, float(T) fict) -> (ex, ey, hz) {
  F(t, f, i, j) = f == 0 ? ey0(i, j) : f == 1 ? ex0(i, j) : hz0(i, j)
      where t in 0:1, f in 0:3, i in 0:NX, j in 0:NY
  F(t, f, i, j) = f == 0 ? (i == 0 ? fict(t - 1) : F(t-1, 0, i, j) - 0.5 * (F(t-1, 2, i, j) - F(t-1, 2, i-1, j)))
                : f == 1 ? (j >= 1 ? F(t-1, 1, i, j) - 0.5 * (F(t-1, 2, i, j) - F(t-1, 2, i, j-1)) : F(t-1, 1, i, j))
                : (i < NX - 1 && j < NY - 1)
                  ? F(t-1, 2, i, j) - 0.7 * (F(t, 1, i, j+1) - F(t, 1, i, j) + F(t, 0, i+1, j) - F(t, 0, i, j))
                  : F(t-1, 2, i, j)
      where t in 1:T, f in 0:3, i in 0:NX, j in 0:NY
  ex(i, j) = F(T - 1, 1, i, j) where i in 0:NX, j in 0:NY
  ey(i, j) = F(T - 1, 0, i, j) where i in 0:NX, j in 0:NY
  hz(i, j) = F(T - 1, 2, i, j) where i in 0:NX, j in 0:NY
}"""
FDTD_2D_STEP = """def fdtd_step(float(NX, NY) ex, float(NX, NY) ey, float(NX, NY) hz, float f) -> (ex1, ey1, hz1) {
  ey1(i, j) = i == 0 ? f : ey(i, j) - 0.5 * (hz(i, j) - hz(i-1, j)) where i in 0:NX, j in 0:NY
  ex1(i, j) = j >= 1 ? ex(i, j) - 0.5 * (hz(i, j) - hz(i, j-1)) : ex(i, j) where i in 0:NX, j in 0:NY
  hz1(i, j) = (i < NX - 1 && j < NY - 1)
      ? hz(i, j) - 0.7 * (ex1(i, j+1) - ex1(i, j) + ey1(i+1, j) - ey1(i, j))
      : hz(i, j) where i in 0:NX, j in 0:NY
}"""


@dataclass(frozen=True)
class Stencil:
    name: str
    recurrence: str
    step: str | None  # the sweep kernel, or None where one sweep cannot be a TC statement
    flops_per_point: int  # of one interior update, counted from the expression
    full: tuple[tuple[int, ...], int]  # (shape, T)
    quick: tuple[tuple[int, ...], int]
    fields: int = 1  # input arrays of the shape (fdtd: 3, plus fict of length T)
    notes: tuple[str, ...] = field(default=())

    @property
    def kind(self) -> str:
        """The stencil without its size variant ("jacobi-2d-large" is a jacobi-2d)."""
        return self.name.removesuffix("-large")

    def points(self, shape: tuple[int, ...], steps: int) -> int:
        """Interior updates of the whole run (what GFLOP/s counts)."""
        inner = 1
        for n in shape:
            inner *= max(0, n - 2) if self.kind != "fdtd-2d" else n
        return inner * max(0, steps - 1)


STENCILS = {
    s.name: s
    for s in (
        Stencil("jacobi-1d", JACOBI_1D, JACOBI_1D_STEP, 3, ((2_000_000,), 100), ((1001,), 7)),
        Stencil("jacobi-2d", JACOBI_2D, JACOBI_2D_STEP, 5, ((1000, 1000), 100), ((37, 41), 7)),
        Stencil("jacobi-2d-large", JACOBI_2D, JACOBI_2D_STEP, 5, ((4000, 4000), 50), ((67, 71), 5)),
        Stencil("heat-3d", HEAT_3D, HEAT_3D_STEP, 15, ((120, 120, 120), 50), ((11, 13, 17), 5)),
        Stencil("heat-3d-large", HEAT_3D, HEAT_3D_STEP, 15, ((256, 256, 256), 40), ((7, 11, 37), 4)),
        Stencil("seidel-2d", SEIDEL_2D, None, 9, ((1000, 1000), 20), ((31, 29), 5)),
        Stencil("fdtd-2d", FDTD_2D, FDTD_2D_STEP, 11, ((1000, 1000), 50), ((23, 19), 5), fields=3),
    )
}


def inputs(stencil: Stencil, shape: tuple[int, ...], steps: int, seed: int = 0) -> list:
    import numpy as np

    rng = np.random.default_rng(seed)
    arrays = [rng.random(shape, dtype=np.float32) for _ in range(stencil.fields)]
    if stencil.kind == "fdtd-2d":
        arrays.append(rng.random(steps, dtype=np.float32))
    return arrays


# ---------------------------------------------------------------------------- NumPy slicing


def numpy_impl(stencil: Stencil, args: list, steps: int):
    """A function of no arguments running the stencil with NumPy slicing on buffers allocated
    once (ping-pong), returning the result; None for seidel (a sequential in-place sweep)."""
    import numpy as np

    f32 = np.float32
    if stencil.kind == "jacobi-1d":
        (a,) = args
        x, y = a.copy(), a.copy()
        tmp = np.empty(a.shape[0] - 2, f32)

        def run():
            x[:], y[:] = a, a
            p, q = x, y
            for _ in range(1, steps):
                np.add(p[:-2], p[1:-1], out=tmp)
                np.add(tmp, p[2:], out=tmp)
                np.multiply(tmp, f32(0.33333), out=q[1:-1])
                p, q = q, p
            return p

        return run
    if stencil.kind == "jacobi-2d":
        (a,) = args
        x, y = a.copy(), a.copy()
        tmp = np.empty((a.shape[0] - 2, a.shape[1] - 2), f32)

        def run():
            x[:], y[:] = a, a
            p, q = x, y
            for _ in range(1, steps):
                np.add(p[1:-1, 1:-1], p[:-2, 1:-1], out=tmp)
                np.add(tmp, p[2:, 1:-1], out=tmp)
                np.add(tmp, p[1:-1, :-2], out=tmp)
                np.add(tmp, p[1:-1, 2:], out=tmp)
                np.multiply(tmp, f32(0.2), out=q[1:-1, 1:-1])
                p, q = q, p
            return p

        return run
    if stencil.kind == "heat-3d":
        (a,) = args
        x, y = a.copy(), a.copy()
        inner = tuple(s - 2 for s in a.shape)
        acc, term = np.empty(inner, f32), np.empty(inner, f32)
        c, two = f32(0.125), f32(2.0)
        mid = (slice(1, -1),) * 3

        def shifted(p, axis, by):
            index = list(mid)
            index[axis] = slice(1 + by, a.shape[axis] - 1 + by)
            return p[tuple(index)]

        def run():
            x[:], y[:] = a, a
            p, q = x, y
            for _ in range(1, steps):
                m = p[mid]
                np.copyto(acc, m)
                for axis in range(3):
                    np.multiply(m, -two, out=term)
                    np.add(term, shifted(p, axis, 1), out=term)
                    np.add(term, shifted(p, axis, -1), out=term)
                    np.multiply(term, c, out=term)
                    np.add(acc, term, out=acc)
                q[mid] = acc
                p, q = q, p
            return p

        return run
    if stencil.kind == "fdtd-2d":
        ex0, ey0, hz0, fict = args
        ex, ey, hz = ex0.copy(), ey0.copy(), hz0.copy()
        half, c = f32(0.5), f32(0.7)
        t1 = np.empty((ex0.shape[0] - 1, ex0.shape[1]), f32)
        t2 = np.empty((ex0.shape[0], ex0.shape[1] - 1), f32)
        t3 = np.empty((ex0.shape[0] - 1, ex0.shape[1] - 1), f32)
        t4 = np.empty_like(t3)

        def run():
            ex[:], ey[:], hz[:] = ex0, ey0, hz0
            for t in range(steps - 1):
                ey[0, :] = fict[t]
                np.subtract(hz[1:, :], hz[:-1, :], out=t1)
                np.multiply(t1, half, out=t1)
                ey[1:, :] -= t1
                np.subtract(hz[:, 1:], hz[:, :-1], out=t2)
                np.multiply(t2, half, out=t2)
                ex[:, 1:] -= t2
                np.subtract(ex[:-1, 1:], ex[:-1, :-1], out=t3)
                np.subtract(ey[1:, :-1], ey[:-1, :-1], out=t4)
                np.add(t3, t4, out=t3)
                np.multiply(t3, c, out=t3)
                hz[:-1, :-1] -= t3
            return ex, ey, hz

        return run
    return None


# ---------------------------------------------------------------------------- numba loops

NUMBA_SOURCE = """
import numpy as np
from numba import njit, prange

F = np.float32


@njit(parallel={par}, fastmath=False)
def jacobi1d(a, b, steps):
    n = a.shape[0]
    for t in range(1, steps):
        for i in prange(1, n - 1):
            b[i] = F(0.33333) * ((a[i - 1] + a[i]) + a[i + 1])
        a, b = b, a
    return a


@njit(parallel={par}, fastmath=False)
def jacobi2d(a, b, steps):
    n, m = a.shape
    for t in range(1, steps):
        for i in prange(1, n - 1):
            for j in range(1, m - 1):
                b[i, j] = F(0.2) * ((((a[i, j] + a[i - 1, j]) + a[i + 1, j]) + a[i, j - 1]) + a[i, j + 1])
        a, b = b, a
    return a


@njit(parallel={par}, fastmath=False)
def heat3d(a, b, steps):
    n, m, l = a.shape
    c, two = F(0.125), F(2.0)
    for t in range(1, steps):
        for i in prange(1, n - 1):
            for j in range(1, m - 1):
                for k in range(1, l - 1):
                    x = a[i, j, k]
                    b[i, j, k] = (x + c * (a[i + 1, j, k] - two * x + a[i - 1, j, k])
                                  + c * (a[i, j + 1, k] - two * x + a[i, j - 1, k])
                                  + c * (a[i, j, k + 1] - two * x + a[i, j, k - 1]))
        a, b = b, a
    return a


@njit(fastmath=False)
def seidel2d(b, steps):
    n, m = b.shape
    for t in range(1, steps):
        for i in range(1, n - 1):
            for j in range(1, m - 1):
                b[i, j] = (b[i - 1, j - 1] + b[i - 1, j] + b[i - 1, j + 1] + b[i, j - 1] + b[i, j]
                           + b[i, j + 1] + b[i + 1, j - 1] + b[i + 1, j] + b[i + 1, j + 1]) / F(9.0)
    return b


@njit(parallel={par}, fastmath=False)
def fdtd2d(ex, ey, hz, fict):
    nx, ny = ex.shape
    half, c = F(0.5), F(0.7)
    for t in range(fict.shape[0] - 1):
        for j in range(ny):
            ey[0, j] = fict[t]
        for i in prange(1, nx):
            for j in range(ny):
                ey[i, j] = ey[i, j] - half * (hz[i, j] - hz[i - 1, j])
        for i in prange(nx):
            for j in range(1, ny):
                ex[i, j] = ex[i, j] - half * (hz[i, j] - hz[i, j - 1])
        for i in prange(nx - 1):
            for j in range(ny - 1):
                hz[i, j] = hz[i, j] - c * (ex[i, j + 1] - ex[i, j] + ey[i + 1, j] - ey[i, j])
    return ex, ey, hz
"""


def numba_impl(stencil: Stencil, args: list, steps: int, parallel: bool):
    """A function of no arguments running numba's loops (prange over the outermost space loop
    when `parallel`; seidel has no parallel form: its sweeps are sequential in i and j)."""
    import numpy as np

    if parallel and stencil.kind == "seidel-2d":
        return None
    namespace: dict = {}
    exec(compile(NUMBA_SOURCE.replace("{par}", str(parallel)), "<numba stencils>", "exec"), namespace)
    f = namespace[{"jacobi-1d": "jacobi1d", "jacobi-2d": "jacobi2d", "heat-3d": "heat3d",
                   "seidel-2d": "seidel2d", "fdtd-2d": "fdtd2d"}[stencil.kind]]  # fmt: skip
    if stencil.kind == "seidel-2d":
        (a,) = args
        buf = np.empty_like(a)

        def run():
            buf[:] = a
            return f(buf, steps)

        return run
    if stencil.kind == "fdtd-2d":
        ex0, ey0, hz0, fict = args
        ex, ey, hz = ex0.copy(), ey0.copy(), hz0.copy()

        def run():
            ex[:], ey[:], hz[:] = ex0, ey0, hz0
            return f(ex, ey, hz, fict)

        return run
    (a,) = args
    x, y = a.copy(), a.copy()

    def run():
        x[:], y[:] = a, a
        return f(x, y, steps)

    return run


# ---------------------------------------------------------------------------- tensorlang


def tensorlang_impl(stencil: Stencil, args: list, steps: int, threads: int, sweep: bool):
    """The recurrence (one call: `k(A, T=steps, out=...)`), or with `sweep` the step kernel called
    once per time step from Python; both write into preallocated buffers (`out=`)."""
    import tensorlang as tl

    options = tl.Options(threads=threads)
    if not sweep:
        import numpy as np

        # the outputs preallocated (out=), as every other implementation's buffers are
        k = tl.compile(stencil.recurrence, options=options)
        outs = [np.empty_like(args[0]) for _ in range(3 if stencil.kind == "fdtd-2d" else 1)]
        if stencil.kind == "fdtd-2d":
            return lambda: k(*args, out=outs)
        return lambda: k(*args, T=steps, out=outs)
    if stencil.step is None:
        return None
    k = tl.compile(stencil.step, options=options)
    if stencil.kind == "fdtd-2d":
        ex0, ey0, hz0, fict = args
        bufs = [[a.copy() for a in (ex0, ey0, hz0)] for _ in range(2)]

        def run():
            p, q = bufs
            p[0][:], p[1][:], p[2][:] = ex0, ey0, hz0
            for t in range(steps - 1):
                k(p[0], p[1], p[2], fict[t], out=q)
                p, q = q, p
            return tuple(p)

        return run
    (a,) = args
    x, y = a.copy(), a.copy()

    def run():
        x[:], y[:] = a, a
        p, q = x, y
        for _ in range(1, steps):
            k(p, out=[q])
            p, q = q, p
        return p

    return run


def reference_impl(stencil: Stencil, args: list, steps: int):
    """What every result is checked against: NumPy slicing where it exists, else (seidel) the
    untransformed tensorlang program (Options(optimize=False)), itself tested against a NumPy loop
    in tests/test_stencils.py."""
    run = numpy_impl(stencil, args, steps)
    if run is not None:
        return run
    import tensorlang as tl

    k = tl.compile(stencil.recurrence, options=tl.Options(optimize=False, threads=1))
    return lambda: k(*args, T=steps)
