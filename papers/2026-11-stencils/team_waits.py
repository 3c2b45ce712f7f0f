"""papers: each stencil's recurrence on one and two threads, the two-thread team's waits counted → where a two-thread call loses against half a one-thread call.

Two threads would take half of one thread's time if nothing were lost. This splits what is lost
(the two-thread call minus half the one-thread call) into what can be counted: the time the
team's threads spend waiting, in the waits of the generated code (for a chunk's flags in a
wavefront, at a team's barriers: every wait that backs off, lowering/barrier.py), counted with
the time-stamp counter. For this run only, the kernels are built with a counter added around
each back-off (a patch of `_stop_or_back_off` made here, not in the compiler) and without the disk
cache, so the code timed is the compiler's plus that counter. The rest of the loss is what the
waits do not explain (candidates: the two-thread schedule's shorter tiles, the phases split by
rows, what the two cores cost each other, and, since calls alternate, the two-thread call
following its second core's idle time; README of this folder). Every result is checked first:
the two kernels bitwise equal, and both against NumPy.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE flock /tmp/tl_bench.lock \\
        .venv/bin/python papers/2026-11-stencils/team_waits.py          # results/team_waits/
"""

from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))
import paperbench as pb  # noqa: E402, I001  (first: it unsets the OpenBLAS presets)

QUESTION = (
    "Where does a stencil's two-thread call lose against half of a one-thread call: how much of it "
    "is the team's threads waiting for each other?"
)
DEFAULT_STENCILS = "jacobi-1d,jacobi-2d,heat-3d,fdtd-2d"
COUNTER = "tl_wait_cycles"


def count_waits() -> list:
    """Patch the lowering so that every team wait adds its time-stamp-counter cycles to the
    module's global COUNTER; returns the list the JIT appends each MachineCode to."""
    import llvmlite.ir as ir

    import codegen.lowering.barrier as barrier
    import codegen.lowering.jit as jit
    from codegen.emit.gemm_pack import declare_intrinsic

    i64 = ir.IntType(64)
    original_wait, original_jit = barrier._stop_or_back_off, jit.jit
    codes: list = []

    def counted(module, b, spins, cancel, abort):
        total = module.globals.get(COUNTER)
        if total is None:
            total = ir.GlobalVariable(module, i64, COUNTER)
            total.initializer = ir.Constant(i64, 0)
        clock = declare_intrinsic(module, "llvm.readcyclecounter", i64, [])
        start = b.call(clock, [])
        original_wait(module, b, spins, cancel, abort)
        b.atomic_rmw("add", total, b.sub(b.call(clock, []), start), "monotonic")

    def recorded(*args, **kwargs):
        code = original_jit(*args, **kwargs)
        codes.append(code)
        return code

    barrier._stop_or_back_off = counted
    jit.jit = recorded
    return codes


def tsc_hz() -> float:
    """The time-stamp counter's rate, measured against perf_counter over 50 ms."""
    import llvmlite.ir as ir

    from codegen.emit.gemm_pack import declare_intrinsic
    from codegen.lowering.jit import jit

    module = ir.Module("tsc")
    i64 = ir.IntType(64)
    fn = ir.Function(module, ir.FunctionType(i64, []), name="tl_kernel")
    b = ir.IRBuilder(fn.append_basic_block())
    b.ret(b.call(declare_intrinsic(module, "llvm.readcyclecounter", i64, []), []))
    code = jit(module)
    read = ctypes.CFUNCTYPE(ctypes.c_int64)(ctypes.cast(code.entry, ctypes.c_void_p).value)
    c0, t0 = read(), time.perf_counter()
    time.sleep(0.05)
    c1, t1 = read(), time.perf_counter()
    return (c1 - c0) / (t1 - t0)


def _fields(result) -> tuple:
    """A stencil's result as a tuple of arrays (fdtd-2d returns three)."""
    return result if isinstance(result, tuple) else (result,)


def waited(words: list[int]) -> int:
    """The counters' sum: cycles waited in the modules whose COUNTER words are at `words`."""
    return sum(ctypes.c_int64.from_address(w).value for w in words)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    pb.add_common_args(ap, threads_default=None, peers=False)
    ap.add_argument(
        "--stencils", default=DEFAULT_STENCILS, help=f"names from stencils.py (default {DEFAULT_STENCILS})"
    )
    a = ap.parse_args()
    repeats = a.repeats or (3 if a.quick else 31)
    print(pb.env_note(), flush=True)
    os.environ["TENSORLANG_CACHE"] = "0"  # build every kernel here, with the counter
    codes = count_waits()

    import numpy as np
    import stencils as S

    out = pb.default_out(HERE, a.quick, a.out, "team-waits", "team_waits")
    hz = tsc_hz()
    rows = []
    for name in a.stencils.split(","):
        stencil = S.STENCILS[name]
        shape, steps = stencil.quick if a.quick else stencil.full
        args = S.inputs(stencil, shape, steps)
        first = len(codes)
        one = S.tensorlang_impl(stencil, args, steps, 1, False)
        two = S.tensorlang_impl(stencil, args, steps, 2, False)
        got1, got2 = one(), two()  # builds both (a plan per call's sizes)
        want = S.reference_impl(stencil, args, steps)()
        for w, g1, g2 in zip(_fields(want), _fields(got1), _fields(got2), strict=True):
            if not np.array_equal(g1, g2):
                raise SystemExit(f"team_waits: {name}: two threads differ from one")
            if not np.allclose(g1, w, rtol=1e-3, atol=1e-3):
                raise SystemExit(f"team_waits: {name}: the result differs from NumPy's")
        words = [code.engine.get_global_value_address(COUNTER) for code in codes[first:]]
        words = [w for w in words if w]

        t1, t2, waits, ratios = [], [], [], []
        for _ in range(repeats):
            start = time.perf_counter()
            one()
            a1 = time.perf_counter() - start
            before = waited(words)
            start = time.perf_counter()
            two()
            a2 = time.perf_counter() - start
            t1.append(a1)
            t2.append(a2)
            waits.append((waited(words) - before) / hz)
            ratios.append(a1 / a2)
        one_s, two_s, wait_s = statistics.median(t1), statistics.median(t2), statistics.median(waits)
        lost = two_s - one_s / 2
        rows.append(
            {
                "stencil": name,
                "shape": list(shape),
                "steps": steps,
                "one_thread_s": one_s,
                "two_threads_s": two_s,
                "one_over_two_per_round": statistics.median(ratios),
                "team_waits_thread_s": wait_s,
                "lost_s": lost,
                # two threads wait: their summed waits cost half of that in a call's time
                "waits_share_of_lost": (wait_s / 2) / lost if lost > 0 else None,
                "team_code_found": bool(words),
            }
        )
        print(
            f"{name} {'x'.join(map(str, shape))} T={steps}: 1T {one_s * 1e3:.2f} ms, 2T {two_s * 1e3:.2f} ms, "
            f"1T/2T per round {statistics.median(ratios):.2f}; waits {wait_s * 1e3:.3f} ms of thread time, "
            f"lost {lost * 1e3:.3f} ms",
            flush=True,
        )
    results = pb.new_results(
        "2026-11-stencils/team_waits",
        QUESTION,
        a.quick,
        {"stencils": a.stencils.split(","), "repeats": repeats, "threads": [1, 2], "tsc_hz": hz},
    )
    results["rows"] = rows
    pb.write_results(results, out, _markdown, None, "Where two threads lose: the team's waits")


def _markdown(results: dict) -> str:
    s = results["settings"]
    lines = [
        pb.header_line(results),
        "",
        f"Each stencil's recurrence with 1 and 2 threads, calls alternating, medians of {s['repeats']} "
        "rounds. *Lost*: the two-thread call minus half the one-thread call. *Waits*: the summed time "
        "the two-thread team's threads spent in its waits; half of it is call time.",
        "",
        "| stencil | grid, T | 1 thread | 2 threads | 1T ÷ 2T per round | waits (thread time) | lost | waits ÷ 2 ÷ lost |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in results["rows"]:
        share = row["waits_share_of_lost"]
        lines.append(
            f"| {row['stencil']} | {'x'.join(map(str, row['shape']))}, {row['steps']} | "
            f"{pb.fmt_seconds(row['one_thread_s'])} | {pb.fmt_seconds(row['two_threads_s'])} | "
            f"{pb.fmt_ratio(row['one_over_two_per_round'])} | {pb.fmt_seconds(row['team_waits_thread_s'])} | "
            f"{pb.fmt_seconds(row['lost_s'])} | {'–' if share is None else f'{share:.0%}'} |"
        )
    lines += ["", f"Question: {results['question']}", ""]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
