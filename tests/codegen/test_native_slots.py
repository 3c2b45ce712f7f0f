"""The native pool's slot writes (runtime/native_pool.run): one range, several, more than a slot holds, and a shared list, each range run exactly once."""

import numpy as np
import pytest

import tensorlang as tl
from codegen.emit.workers import SLOT_PAIRS
from codegen.runtime import native_pool

ADD = "def add(float(N) A, float(N) C) -> (B) { B(i) = A(i) + C(i) }"


@pytest.fixture
def captured(run_phases_calls):
    """A compiled 2-thread add (kept alive: its machine code), what its run_phases was called with."""
    if native_pool._machine_code() is None:
        pytest.skip("no native workers on this host")
    seen = run_phases_calls
    k = tl.compile(ADD, options=tl.Options(threads=2))
    rng = np.random.default_rng(5)
    a, c = rng.standard_normal(2003, dtype=np.float32), rng.standard_normal(2003, dtype=np.float32)
    out = np.empty(2003, dtype=np.float32)
    k(a, c, out={"B": out})
    np.testing.assert_array_equal(out, a + c)
    return seen, a, c, out, k


_POOLS: list = []  # as the runtime's own pool, the pools made here outlive their workers


def piece_calls(lo: int, hi: int, parts: int) -> list[tuple[int, int]]:
    bounds = [lo + (hi - lo) * p // parts for p in range(parts + 1)]
    return [(bounds[p], bounds[p + 1]) for p in range(parts)]


@pytest.mark.parametrize("parts", [1, 3, SLOT_PAIRS + 5, native_pool.COMMON_PAIRS // 2 + 1])
@pytest.mark.parametrize("shared", [False, True])
def test_every_range_runs_once(captured, parts, shared):
    seen, a, c, out, _ = captured
    (plan,) = seen["plans"]
    pool = native_pool.Pool(native_pool._machine_code())
    _POOLS.append(pool)  # never freed: a stopped worker may still read its slot for a while
    assert pool.reserve(1)
    try:
        (_, ws), (_, ws2) = seen["workspaces"].lease(2)
        first, second = piece_calls(0, 1001, parts), piece_calls(1001, 2003, parts)
        pieces = [(seen["buffers_for"](ws), ws, first), (seen["buffers_for"](ws2), ws2, second)]
        for _ in range(3):  # slots reused call after call
            out[:] = np.nan
            common = first + second if shared else None
            status, _ = native_pool.run(
                pool, seen["entry"], seen["params"], plan.index, pieces, common, True, -1, False
            )
            assert status == 0
            np.testing.assert_array_equal(out, a + c)
    finally:
        pool.stop()
