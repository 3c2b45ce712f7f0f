"""papers: one stencil, several tensorlang Options and numba in one process → medians of interleaved calls.

A quick companion to run.py for trying tile sizes or comparing builds: every variant is compiled
once, checked against the reference (NumPy slicing, or the untransformed kernel for seidel), and
then the calls of all variants (and numba's loops with --numba) are interleaved, `--repeats` each.
Recurrences write into preallocated outputs (out=), as numba's loops do. Example:

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE flock /tmp/tl_bench.lock \\
        .venv/bin/python papers/2026-11-stencils/compare.py heat-3d 256x256x256 --steps 40 --numba \\
        "auto=dict()" "small=dict(band_tiles=((16, 8, 8),))"   # the time band: entry 0 on one thread

A variant is NAME=EXPR, EXPR a Python expression giving the keyword arguments of tl.Options
(threads from --threads unless EXPR gives it: "1T=dict()" "2T=dict(threads=2)" times one and
two threads interleaved). Each variant must differ in its Options: tl.compile memoises.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import paperbench as pb  # noqa: E402, I001  (first: it unsets the OpenBLAS presets)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("kernel", help="a name of stencils.STENCILS (jacobi-2d, heat-3d, fdtd-2d, ...)")
    p.add_argument("shape", help="the grid, e.g. 1000x1000")
    p.add_argument("variants", nargs="*", help="NAME=EXPR (default: auto=dict())")
    p.add_argument("--steps", type=int, default=50, help="time steps T")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--numba", action="store_true", help="time numba's loops too")
    a = p.parse_intermixed_args()

    import numpy as np
    import stencils as S

    import tensorlang as tl

    st = S.STENCILS[a.kernel]
    shape = tuple(int(x) for x in a.shape.split("x"))
    args = S.inputs(st, shape, a.steps)
    ref = S.reference_impl(st, args, a.steps)()
    ref = ref if isinstance(ref, tuple) else (ref,)
    runs = {}
    for variant in a.variants or ["auto=dict()"]:
        name, expr = variant.split("=", 1)
        knobs = {"threads": a.threads, **eval(expr)}  # noqa: S307 - the user's own expression
        options = tl.Options(**knobs)
        start = time.perf_counter()
        k = tl.compile(st.recurrence, options=options)
        outs = [np.empty(shape, np.float32) for _ in range(3 if st.kind == "fdtd-2d" else 1)]
        if st.kind == "fdtd-2d":
            run = lambda k=k, o=outs: k(*args, out=o)  # noqa: E731
        else:
            run = lambda k=k, o=outs: k(*args, T=a.steps, out=o)  # noqa: E731
        got = run()
        print(f"{name}: compile and first call {time.perf_counter() - start:.2f} s", flush=True)
        for g, r in zip(got if isinstance(got, tuple) else (got,), ref):
            np.testing.assert_allclose(g, r, rtol=1e-3, atol=1e-3, err_msg=name)
        runs[name] = run
    if a.numba:
        runs["numba"] = S.numba_impl(st, args, a.steps, parallel=a.threads > 1)
        runs["numba"]()
    times = pb.interleaved_times(runs, a.repeats)
    flops = st.points(shape, a.steps) * st.flops_per_point
    for n, ts in times.items():
        m = statistics.median(ts)
        print(
            f"{n:>12}: median {m * 1e3:9.2f} ms  min {min(ts) * 1e3:9.2f} ms  {flops / m / 1e9:6.1f} GFLOP/s"
        )
    # the host is shared and its speed drifts over seconds: a ratio of two calls made one after the
    # other in the same round sees the same phase, so the median of the rounds' ratios is steadier
    # than the ratio of two medians
    first, *others = times
    for n in others if a.repeats >= 2 else ():
        q = statistics.quantiles([a / b for a, b in zip(times[first], times[n])], n=4)
        print(f"{first:>12} / {n}: per-round ratio median {q[1]:.2f} (quartiles {q[0]:.2f} - {q[2]:.2f})")


if __name__ == "__main__":
    main()
