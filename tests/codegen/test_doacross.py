"""Doacross loops (lowering/doacross.py, wavefront.py): a team's wavefront loop whose chunks wait
only for the chunks they read from. The lags the AST builder finds, the flag wait called
directly, and the time-tiled stencils on 2, 3 and 7 threads, bitwise equal to one thread on odd
sizes, on flags and with too few flag slots (unit by unit); heat-3d's tiles (rows and columns of
several pieces) split as one space."""

from __future__ import annotations

import ctypes
import threading
import time

import islpy as isl
import numpy as np
import pytest
from conftest import JACOBI_2D_RECURRENCE, jit_exported
from test_stencils import CASES, _args

import tensorlang as tl
from codegen.emit.gemm_team import TEAM_FLAG_SLOTS, TEAM_FLAGS, TEAM_LOOP_BYTES, TEAM_SERIAL
from codegen.lowering import doacross
from codegen.lowering.barrier import define_flags_wait
from codegen.lowering.status import ERROR_CANCELLED
from codegen.planning.astgen import LoopKind
from codegen.planning.wavefront import wave_lags
from codegen.runtime import parallel
from scheduler import timetile


@pytest.fixture
def forced(monkeypatch):
    """Teams for any work (the thresholds would keep these sizes on one thread). Returns a
    function counting the flag words that the loop teams taken since set with their call's tag
    (the block's TEAM_SERIAL in the tag's high bits): how many chunks ran on flags."""
    monkeypatch.setattr(parallel, "MIN_PARALLEL_WORK", 1)
    monkeypatch.setattr(parallel, "TEAM_STEP_WORK", 1)
    taken: list[int] = []
    take = parallel._teams.take

    def recording(threads, nbytes=None):
        block = take(threads, nbytes)
        if nbytes is not None and nbytes >= TEAM_LOOP_BYTES:
            taken.append(block[1])
        return block

    monkeypatch.setattr(parallel._teams, "take", recording)

    def flagged() -> int:
        count = 0
        for address in taken:
            words = parallel._teams.views[address][:TEAM_LOOP_BYTES].view(np.int64)
            flags = words[TEAM_FLAGS // 8 : TEAM_FLAGS // 8 + TEAM_FLAG_SLOTS]
            count += int(np.count_nonzero((flags >> 16) == words[TEAM_SERIAL // 8]))
        taken.clear()
        return count

    return flagged


def _team_loop_lags(kernel, sizes):
    plan = kernel._plan(sizes)
    return [info.lags for info in plan.ast.loops.values() if info.lags is not None]


def test_the_wavefront_tiles_depend_on_a_bounded_window_back(monkeypatch, cache_dir):
    """jacobi-2d on threads: the tile loop inside the wavefront reads tiles at most two
    wavefronts back, and there the same row tile or the one before: with diamond tiles, whose
    loop counts tiles, tile numbers 0 and 1 back; with parallelogram tiles, whose loop runs over
    tile origins, 0 and 32 rows back (the tiles pinned, since the automatic rows follow the
    host's L2)."""
    # diamonds: the copies join the time band, entry 0 (with parallelograms entry 1, after the copy's)
    k = tl.compile(JACOBI_2D_RECURRENCE, options=tl.Options(threads=2, band_tiles=((16, 32),)))
    lags = _team_loop_lags(k, {"N": 1000, "M": 1000, "T": 100})
    assert lags and lags[0] == (2, 0, 1)
    monkeypatch.setattr(timetile, "DIAMOND_TILES", False)
    k = tl.compile(JACOBI_2D_RECURRENCE, options=tl.Options(threads=2, band_tiles=(None, (16, 32))))
    lags = _team_loop_lags(k, {"N": 1000, "M": 1000, "T": 100})
    assert lags and lags[0] == (2, 0, 32)
    # a loop with no loop around it carrying a dependence has none
    plain = tl.compile("def add(float(N) a) -> (b) { b(i) = a(i) + 1 }", options=tl.Options(threads=2))
    assert _team_loop_lags(plain, {"N": 1000}) == []
    plan = plain._plan({"N": 1000})
    assert all(info.kind is LoopKind.PARALLEL for info in plan.ast.loops.values())


def test_the_flag_wait_is_emitted_on_threads_only():
    sizes = {"N": 300, "M": 301, "T": 40}
    two = tl.compile(JACOBI_2D_RECURRENCE, options=tl.Options(threads=2)).inspect("llvm", sizes=sizes)
    one = tl.compile(JACOBI_2D_RECURRENCE, options=tl.Options(threads=1)).inspect("llvm", sizes=sizes)
    assert "@tl_team_flags(" in two
    assert "tl_team_flags" not in one


@pytest.fixture(scope="module")
def flags_wait():
    """wait(flags, first, last, tag, cancel, abort) from a module exporting tl_team_flags."""
    p, c = ctypes.c_void_p, ctypes.c_int64
    return jit_exported(define_flags_wait, ctypes.CFUNCTYPE(ctypes.c_int32, p, c, c, c, p, p))


def test_the_flag_wait_returns_once_every_flag_holds_the_tag(flags_wait):
    flags = np.array([7, 7, 5, 7], dtype=np.int64)
    words = np.zeros(2, dtype=np.int32)  # cancel, abort
    cancel, abort = words.ctypes.data, words.ctypes.data + 4
    assert flags_wait(flags.ctypes.data, 0, 1, 7, cancel, abort) == 0
    assert flags_wait(flags.ctypes.data, 3, 2, 7, cancel, abort) == 0  # no chunk to wait for
    # flag 2 holds another call's tag: the wait lasts until it is set (by another thread here)
    setter = threading.Timer(0.05, lambda: flags.__setitem__(2, 7))
    start = time.perf_counter()
    setter.start()
    assert flags_wait(flags.ctypes.data, 1, 3, 7, cancel, abort) == 0
    assert time.perf_counter() - start >= 0.04
    # a flag never set: the cancel word (or the team's abort word) ends the wait
    flags[0] = 0
    words[1] = 1
    assert flags_wait(flags.ctypes.data, 0, 3, 7, cancel, abort) == ERROR_CANCELLED


_STENCIL_SIZES = {
    "jacobi1d": ((9001,), 40),
    "jacobi2d": ((131, 67), 40),
    "heat3d": ((13, 11, 17), 21),
    "seidel2d": ((97, 61), 21),
    "fdtd": ((67, 37), 21),
}


def _run(name, threads, shape, steps, **options):
    source = CASES[name][0]
    args = _args(name, shape, steps, np.random.default_rng(len(shape) * 7 + steps))
    got = tl.compile(source, options=tl.Options(threads=threads, **options))(*args)
    return tuple(np.asarray(x) for x in (got if isinstance(got, tuple) else (got,)))


_SLOW = {("heat3d", 2), ("heat3d", 3), ("seidel2d", 3), ("fdtd", 3), ("jacobi2d", 3)}  # 3-10 s each


@pytest.mark.parametrize(
    ("name", "threads"),
    [
        pytest.param(name, threads, marks=pytest.mark.slow)
        if (name, threads) in _SLOW or threads == 7
        else (name, threads)
        for name in _STENCIL_SIZES
        for threads in (2, 3, 7)  # 7 threads on 2 cores
    ],
)
def test_stencils_on_flags_match_one_thread(forced, name, threads):
    shape, steps = _STENCIL_SIZES[name]
    # heat-3d's automatic tiles follow the host's L2: with 2 MiB, (16, 16, 16) leave a 13x11x17
    # grid one tile a wavefront and nothing on flags; pinned, as the tests below pin them
    pinned = {"band_tiles": HEAT_TILES} if name == "heat3d" else {}
    one = _run(name, 1, shape, steps, **pinned)
    assert forced() == 0
    got = _run(name, threads, shape, steps, **pinned)
    assert forced() > 0, "no chunk ran on flags"
    for a, b in zip(got, one):
        np.testing.assert_array_equal(a, b)  # every element computed as on one thread


@pytest.mark.slow  # the fallback; heat-3d's is slow too, and the default tier checks that flags are used
def test_too_many_chunks_for_the_flags_waits_unit_by_unit(forced, monkeypatch):
    """With fewer flag slots than the loop has chunks, every thread takes the unit-by-unit
    waits (decided alike on all of them): the same results."""
    monkeypatch.setattr(doacross, "TEAM_FLAG_SLOTS", 3)
    monkeypatch.setenv("TENSORLANG_CACHE", "0")
    a = np.random.default_rng(5).random((131, 67), dtype=np.float32)
    few = tl.compile(JACOBI_2D_RECURRENCE, options=tl.Options(threads=2, max_specializations=63))
    one = tl.compile(JACOBI_2D_RECURRENCE, options=tl.Options(threads=1))(a, T=40)
    got = few(a, T=40)
    assert forced() == 0, "chunks ran on flags"
    np.testing.assert_array_equal(got, one)


def test_a_loop_teams_flags_hold_only_tags_of_earlier_calls():
    """A block a GEMM team packed its panel into is cleared before a loop team's flags use it
    (its floats could pass for a tag); a loop team's own block keeps its old tags (they never
    equal a later call's, whose serial is new) and is not cleared per call."""
    from codegen.runtime.teams import Teams

    teams = Teams()
    flags = slice(TEAM_FLAGS, TEAM_LOOP_BYTES)
    gemm = teams.take(2)  # a GEMM team's block
    teams.views[gemm[1]][flags] = 0xAB
    teams.give_back(gemm)
    loop = teams.take(2, TEAM_LOOP_BYTES)
    assert loop[1] == gemm[1]  # the same block, reused
    words = teams.views[loop[1]][:TEAM_LOOP_BYTES].view(np.int64)
    assert not words[TEAM_FLAGS // 8 :].any()
    serial = int(words[TEAM_SERIAL // 8])
    words[TEAM_FLAGS // 8 : TEAM_FLAGS // 8 + 5] = (serial << 16) + 1  # this call's tags
    teams.give_back(loop)
    again = teams.take(2, TEAM_LOOP_BYTES)
    words = teams.views[again[1]][:TEAM_LOOP_BYTES].view(np.int64)
    assert again[1] == loop[1] and words[TEAM_SERIAL // 8] == serial + 1
    assert (words[TEAM_FLAGS // 8 : TEAM_FLAGS // 8 + 5] == (serial << 16) + 1).all()  # kept, stale


HEAT_TILES = (None, (16, 8, 8))  # heat-3d's time band is entry 1, after the copy-in band


def test_heat3d_tiles_wait_for_a_window_of_rows_and_columns():
    """heat-3d on threads: the wavefront loop's tiles (rows c1 and columns c2, 8 apart) read
    tiles at most three wavefronts back, in the same or the previous row and column (tiles
    pinned: the automatic ones follow the host's L2, (16, 16, 16) with 2 MiB)."""
    k = tl.compile(CASES["heat3d"][0], options=tl.Options(threads=2, band_tiles=HEAT_TILES))
    plan = k._plan({"N": 13, "M": 11, "K": 17, "T": 21})
    (wave,) = [info.wave for info in plan.ast.loops.values() if info.wave is not None]
    assert (wave.back, wave.least_row, wave.most_row, wave.least_col, wave.most_col) == (3, 0, 8, 0, 8)
    assert len(wave.pieces) == len(wave.inner) == 1


def test_a_window_needs_each_wavefronts_tiles_independent():
    """The window over the pieces' tiles; none when a dependence within one wavefront leaves
    its tile, or when two pieces share a tile."""
    sched = isl.UnionMap("{ S[w, r] -> [w, r] : 0 <= w < 10 and 0 <= r < 10 }")
    deps = isl.UnionMap("{ S[w, r] -> S[w + 1, r + 2] : 0 <= w < 9 and 0 <= r < 8; S[w, r] -> S[w + 2, r] }")
    lags = wave_lags(deps, [("p", sched)], {})
    assert (lags.back, lags.least_row, lags.most_row) == (2, 0, 2) and lags.inner == ()
    across = deps.union(isl.UnionMap("{ S[w, r] -> S[w, r + 1] : 0 <= r < 9 }"))
    assert wave_lags(across, [("p", sched)], {}) is None
    other = isl.UnionMap("{ U[w, r] -> [w, r] : 0 <= w < 10 and 0 <= r < 10 }")
    assert wave_lags(deps, [("p", sched), ("q", other)], {}) is None
    # tiles of columns in each row: the column window too
    cols = isl.UnionMap("{ S[w, r] -> [w, r, 3r] : 0 <= w < 10 and 0 <= r < 10 }")
    lags = wave_lags(deps, [("p", sched)], {"p": [("c", cols)]})
    assert (lags.least_col, lags.most_col, lags.inner) == (0, 6, (("p", "c"),))


_HEAT_SIZES = [
    pytest.param(2, (13, 11, 17), 21, id="2-small"),
    pytest.param(3, (23, 19, 29), 37, id="3-prime", marks=pytest.mark.slow),
    pytest.param(7, (9, 7, 11), 13, id="7-tiny", marks=pytest.mark.slow),
    # the pieces the AST builder separates at 120³ and 50 steps, a fenced one among them
    pytest.param(2, (120, 120, 120), 50, id="2-pieces", marks=pytest.mark.slow),
    pytest.param(3, (120, 120, 120), 50, id="3-pieces", marks=pytest.mark.slow),
    pytest.param(7, (120, 120, 120), 50, id="7-pieces", marks=pytest.mark.slow),
]


@pytest.mark.parametrize(("threads", "shape", "steps"), _HEAT_SIZES)
def test_heat3d_tiles_split_as_one_space_match_one_thread(forced, threads, shape, steps):
    """heat-3d's rows and columns of tiles, chunked as one space and run on flags: bitwise equal
    to one thread (tiles pinned, as above: the small grids need several tiles a wavefront)."""
    one = _run("heat3d", 1, shape, steps, band_tiles=HEAT_TILES)
    assert forced() == 0
    got = _run("heat3d", threads, shape, steps, band_tiles=HEAT_TILES)
    assert forced() > 0, "no chunk ran on flags"
    for a, b in zip(got, one):
        np.testing.assert_array_equal(a, b)


@pytest.mark.slow
def test_heat3d_runs_the_wavefront_loops_tiles_not_its_rows():
    kernel = tl.compile(CASES["heat3d"][0], options=tl.Options(threads=2, band_tiles=HEAT_TILES))
    assert "wave.loop" in kernel.inspect("llvm", sizes={"N": 13, "M": 11, "K": 17, "T": 21})


@pytest.mark.slow
def test_heat3d_with_too_few_flag_slots_waits_unit_by_unit(forced, monkeypatch):
    monkeypatch.setattr(doacross, "TEAM_FLAG_SLOTS", 3)
    monkeypatch.setenv("TENSORLANG_CACHE", "0")
    shape, steps = (13, 11, 17), 21
    one = _run("heat3d", 1, shape, steps)
    source = CASES["heat3d"][0]
    args = _args("heat3d", shape, steps, np.random.default_rng(len(shape) * 7 + steps))
    got = tl.compile(source, options=tl.Options(threads=2, max_specializations=63))(*args)
    assert forced() == 0, "chunks ran on flags"
    for a, b in zip(got if isinstance(got, tuple) else (got,), one):
        np.testing.assert_array_equal(a, b)
