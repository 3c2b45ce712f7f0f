"""Loop order in skewed bands (scheduler/postpass.py): a time recurrence's band, which the isl
scheduler skews ((t, t + i, t + j)), runs its time step outermost and the member that moves the
stride-1 dimension innermost, instead of the time step innermost (1 GFLOP/s on jacobi-2d)."""

from __future__ import annotations

import re

import numpy as np
import pytest
from conftest import JACOBI_2D_RECURRENCE as JACOBI

import tensorlang as tl


def _jacobi(a: np.ndarray, steps: int) -> np.ndarray:
    b = a.copy()
    for _ in range(steps - 1):
        c = b.copy()
        c[1:-1, 1:-1] = 0.2 * (b[1:-1, 1:-1] + b[:-2, 1:-1] + b[2:, 1:-1] + b[1:-1, :-2] + b[1:-1, 2:])
        b = c
    return b


def test_the_stride_one_member_goes_innermost():
    loops = tl.compile(JACOBI, options=tl.Options(threads=1)).inspect(
        "loops", sizes={"N": 40, "M": 40, "T": 70}
    )
    lines = loops.splitlines()

    # the interior piece of S1 (polyhedral/split.py splits the select into S1_1 and S1_2)
    def enclosing(s1: int) -> list[str]:
        """The loops enclosing line s1, by brace balance (time tiles put boundary loops of the
        same tile beside it)."""
        loop_vars, level = [], 0
        for line in reversed(lines[:s1]):
            level += line.count("}") - line.count("{")
            if level < 0:  # a block that encloses the statement opens here
                level = 0
                m = re.search(r"for \(int64 (c\d+) =", line)
                if m:
                    loop_vars.insert(0, m.group(1))
        return loop_vars

    # the instance of the interior statement inside the most loops (partial tiles have others)
    s1, loop_vars = max(
        ((n, enclosing(n)) for n, line in enumerate(lines) if line.rstrip().endswith("// S1_1")),
        key=lambda found: len(found[1]),
    )
    inner = loop_vars[-1]
    write = re.match(r"\s*B\[(.*?)\]\[(.*?)\]\[(.*?)\] =", lines[s1])
    time, row, column = write.groups()
    assert inner in column and inner not in time and inner not in row  # stride 1 along j
    # the time step outermost in the band: a 2-d tile runs its steps in groups (its outermost
    # point loop), row by row, the step within the group right outside the row's loop
    # (scheduler/timetile._jam_steps); otherwise only the tile loops outside them (T = 70 runs
    # two 64-step tiles on one thread)
    in_time = set(re.findall(r"c\d+", time))
    assert {loop_vars[-4], loop_vars[-2]} <= in_time <= {loop_vars[-4], loop_vars[-2], *loop_vars[:-4]}


@pytest.mark.slow  # ~10 s of compiling
def test_reordered_recurrence_matches_numpy_and_the_reference():
    r = np.random.default_rng(7)
    for n, m, steps in ((1, 1, 1), (3, 5, 2), (13, 11, 7), (37, 29, 5)):
        a = r.standard_normal((n, m)).astype(np.float32)
        want = _jacobi(a, steps)
        for options in (tl.Options(threads=1), tl.Options(threads=2), tl.Options(tile=(4, 8, 16))):
            np.testing.assert_allclose(
                tl.compile(JACOBI, options=options)(a, T=steps), want, rtol=1e-5, atol=1e-5
            )
        reference = tl.compile(JACOBI, options=tl.Options(optimize=False))(a, T=steps)
        np.testing.assert_allclose(reference, want, rtol=1e-5, atol=1e-5)
