"""Optional peer implementations (torch, numba), used only when installed, never required.

tvm and halide are detected (papers/paperbench.detect_peers) and named in the output, but this suite
has no schedules for them.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

# Peers we look for. tvm and halide are only detected: this suite has no schedules for them.
PEERS = ("torch", "numba", "tvm", "halide")
FACTORIES: dict[str, Callable] = {}  # filled at the end of the module


THREADS = 1  # threads each peer may use; set by configure() in the worker process


def configure(threads: int) -> None:
    """Set the thread count of the peers' pools (the worker's environment also sets NUMBA_NUM_THREADS
    and OMP_NUM_THREADS)."""
    global THREADS
    THREADS = threads


# ---------------------------------------------------------------------------- torch


def torch_impls(family: str) -> Callable[[list[np.ndarray]], Callable[[], np.ndarray]] | None:
    """A factory: NumPy inputs → a no-argument callable running the torch version (CPU, default threads)."""
    import torch
    import torch.nn.functional as tf

    torch.set_num_threads(THREADS)

    ops = {
        "sgemm": torch.mm,
        "bmm": torch.bmm,
        "conv2d": tf.conv2d,
        "mlp": lambda x, w, b: torch.relu(torch.addmm(b, x, w)),
        "2mm": lambda a, b, c: torch.mm(torch.mm(a, b), c),
        "atax": lambda a, x: torch.mv(a.t(), torch.mv(a, x)),
        "transpose2d": lambda a: a.t().contiguous(),
        "permute4d": lambda a: a.permute(0, 2, 3, 1).contiguous(),
        "ewchain": lambda a, b, c: torch.tanh(a * b + c) * 0.5 + a,
        "softmax": lambda x: torch.softmax(x, dim=1),
    }
    op = ops.get(family)
    if op is None:
        return None

    def factory(inputs: list[np.ndarray]) -> Callable[[], np.ndarray]:
        tensors = [torch.from_numpy(a) for a in inputs]

        def run():
            with torch.inference_mode():
                return op(*tensors)

        return run

    return factory


def torch_to_numpy(result) -> np.ndarray:
    return result.numpy()


# ---------------------------------------------------------------------------- numba

_NUMBA_CACHE: dict[str, Callable] = {}


def _build_numba() -> dict[str, Callable]:
    """Straightforward loop nests, parallel over the outermost loop (prange), no fastmath."""
    import numba
    from numba import njit, prange

    f32 = np.float32

    @njit(parallel=True)
    def mm(a, b):
        m, k = a.shape
        n = b.shape[1]
        c = np.zeros((m, n), dtype=np.float32)
        for i in prange(m):
            for p in range(k):
                av = a[i, p]
                for j in range(n):
                    c[i, j] += av * b[p, j]
        return c

    @njit(parallel=True)
    def bmm(a, b):
        bt, m, k = a.shape
        n = b.shape[2]
        c = np.zeros((bt, m, n), dtype=np.float32)
        for q in prange(bt * m):
            z = q // m
            i = q % m
            for p in range(k):
                av = a[z, i, p]
                for j in range(n):
                    c[z, i, j] += av * b[z, p, j]
        return c

    @njit(parallel=True)
    def conv2d(x, w):
        n, c, h, wd = x.shape
        f, _, kh, kw = w.shape
        oh, ow = h - kh + 1, wd - kw + 1
        o = np.zeros((n, f, oh, ow), dtype=np.float32)
        for q in prange(n * f):
            b = q // f
            g = q % f
            for ch in range(c):
                for r in range(kh):
                    for s in range(kw):
                        wv = w[g, ch, r, s]
                        for y in range(oh):
                            for z in range(ow):
                                o[b, g, y, z] += wv * x[b, ch, y + r, z + s]
        return o

    @njit(parallel=True)
    def mlp(x, w, bias):
        y = mm(x, w)
        for i in prange(y.shape[0]):
            for j in range(y.shape[1]):
                y[i, j] = max(y[i, j] + bias[j], f32(0.0))
        return y

    @njit
    def mm2(a, b, c):
        return mm(mm(a, b), c)

    @njit(parallel=True)
    def atax(a, x):
        m, n = a.shape
        t = np.zeros(m, dtype=np.float32)
        for i in prange(m):
            acc = f32(0.0)
            for j in range(n):
                acc += a[i, j] * x[j]
            t[i] = acc
        y = np.zeros(n, dtype=np.float32)
        for i in range(m):  # serial: a parallel version needs per-thread copies of y
            ti = t[i]
            for j in range(n):
                y[j] += a[i, j] * ti
        return y

    @njit(parallel=True)
    def transpose2d(a):
        m, n = a.shape
        b = np.empty((n, m), dtype=np.float32)
        for j in prange(n):
            for i in range(m):
                b[j, i] = a[i, j]
        return b

    @njit(parallel=True)
    def permute4d(a):
        n, c, h, w = a.shape
        b = np.empty((n, h, w, c), dtype=np.float32)
        for q in prange(n * h):
            p = q // h
            y = q % h
            for z in range(w):
                for ch in range(c):
                    b[p, y, z, ch] = a[p, ch, y, z]
        return b

    @njit(parallel=True)
    def ewchain(a, b, c):
        o = np.empty_like(a)
        for i in prange(a.shape[0]):
            o[i] = np.tanh(a[i] * b[i] + c[i]) * f32(0.5) + a[i]
        return o

    @njit(parallel=True)
    def softmax(x):
        m, n = x.shape
        y = np.empty_like(x)
        for i in prange(m):
            mx = x[i, 0]
            for j in range(1, n):
                mx = max(mx, x[i, j])
            s = f32(0.0)
            for j in range(n):
                e = np.exp(x[i, j] - mx)
                y[i, j] = e
                s += e
            for j in range(n):
                y[i, j] = y[i, j] / s
        return y

    del numba
    return {
        "sgemm": mm,
        "bmm": bmm,
        "conv2d": conv2d,
        "mlp": mlp,
        "2mm": mm2,
        "atax": atax,
        "transpose2d": transpose2d,
        "permute4d": permute4d,
        "ewchain": ewchain,
        "softmax": softmax,
    }


def numba_impls(family: str) -> Callable[[list[np.ndarray]], Callable[[], np.ndarray]] | None:
    """A factory like `torch_impls`; the first call JIT-compiles (it is the verification call)."""
    if not _NUMBA_CACHE:
        import numba

        numba.set_num_threads(min(THREADS, numba.config.NUMBA_NUM_THREADS))
        _NUMBA_CACHE.update(_build_numba())
    fn = _NUMBA_CACHE.get(family)
    if fn is None:
        return None

    def factory(inputs: list[np.ndarray]) -> Callable[[], np.ndarray]:
        return lambda: fn(*inputs)

    return factory


FACTORIES.update(torch=torch_impls, numba=numba_impls)
CONVERT = {"torch": torch_to_numpy, "numba": np.asarray}
