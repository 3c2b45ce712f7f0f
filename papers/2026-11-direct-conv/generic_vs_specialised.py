"""Direct convolution: the generic kernel (Options(specialize=False), sizes at run time) against the specialised one.

Question: how much does one parametric kernel, compiled once for every size, lose against the code
specialised to each shape, over the shapes of this paper's FULL table?

Run: python papers/2026-11-direct-conv/generic_vs_specialised.py [SHAPE NAME ...]

One process, 1 thread; each shape: both kernels checked against each other, then 3 interleaved
rounds of 7 repeats each, the median of the round medians printed with the ratio
generic ÷ specialised.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import time
from pathlib import Path

os.environ.pop("OPENBLAS_CORETYPE", None)  # as paperbench does: NumPy at its best
os.environ.pop("OPENBLAS_L2_SIZE", None)

import numpy as np  # noqa: E402

import tensorlang as tl  # noqa: E402

HERE = Path(__file__).resolve().parent


def _shapes() -> dict:
    spec = importlib.util.spec_from_file_location("direct_conv_run", HERE / "run.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.FULL


def _median(fn, repeats: int = 7) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return sorted(times)[repeats // 2]


def main() -> None:
    shapes = _shapes()
    rng = np.random.default_rng(0)
    for name in sys.argv[1:] or list(shapes):
        src, x_shape, w_shape, dtype, _ = shapes[name]
        x = rng.standard_normal(x_shape).astype(dtype)
        w = rng.standard_normal(w_shape).astype(dtype)
        spec = tl.compile(src, options=tl.Options(threads=1))
        gen = tl.compile(src, options=tl.Options(threads=1, specialize=False))
        a, b = spec(x, w), gen(x, w)
        assert np.allclose(a, b, rtol=1e-3, atol=1e-3 * max(1.0, float(np.abs(a).max()))), name
        ts, tg = [], []
        for _ in range(3):
            ts.append(_median(lambda spec=spec, x=x, w=w: spec(x, w)))
            tg.append(_median(lambda gen=gen, x=x, w=w: gen(x, w)))
        s, g = sorted(ts)[1], sorted(tg)[1]
        print(
            f"{name:24s} specialised {s * 1e3:7.3f} ms  generic {g * 1e3:7.3f} ms  generic/specialised {g / s:.2f}x"
        )


if __name__ == "__main__":
    main()
