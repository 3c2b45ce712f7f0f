"""The loop team's chunk claims (lowering/barrier.py tl_team_claim), called directly: each thread
takes its own chunks of a small unit first (its contiguous share, own_chunks, or a mask such as
a doacross loop's columns, doacross.column_mask), then the others' from the last; every chunk is
taken exactly once, also by threads racing; a larger unit is taken in order from the ticket."""

from __future__ import annotations

import ctypes
import threading

import llvmlite.ir as ir
import numpy as np
import pytest
from conftest import jit_exported

from codegen.lowering.barrier import MASK_CHUNKS, define_claim, own_chunks
from codegen.lowering.doacross import column_mask

I64 = ir.IntType(64)


def _define_share_claim(module: ir.Module) -> ir.Function:
    """claim(ticket, claims, base, parts, me, size): tl_team_claim with thread me's contiguous
    share as its own chunks, as a unit outside doacross loops claims."""
    claim = define_claim(module)
    p = I64.as_pointer()
    fn = ir.Function(module, ir.FunctionType(I64, [p, p, I64, I64, I64, I64]), name="share_claim")
    ticket, claims, base, parts, me, size = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    b.ret(b.call(claim, [ticket, claims, base, parts, own_chunks(b, parts, me, size)]))
    return fn


def _define_column_mask(module: ir.Module) -> ir.Function:
    fn = ir.Function(module, ir.FunctionType(I64, [I64] * 6), name="column_mask")
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    b.ret(column_mask(b, *fn.args))
    return fn


@pytest.fixture(scope="module")
def claim():
    """claim(ticket, claims, base, parts, me, size) from a module that exports tl_team_claim."""
    p = ctypes.c_void_p
    c = ctypes.c_int64
    call = jit_exported(_define_share_claim, ctypes.CFUNCTYPE(c, p, p, c, c, c, c))
    words = np.zeros(2, dtype=np.int64)  # [ticket, claims]

    def run(base: int, parts: int, me: int, size: int) -> int:
        return call(words.ctypes.data, words.ctypes.data + 8, base, parts, me, size)

    run.words = words
    run.raw = call
    run.keep = call.keep
    return run


def _drain(claim, base, parts, me, size):
    taken = []
    while (k := claim(base, parts, me, size)) >= 0:
        taken.append(k - base)
    return taken


def test_each_thread_takes_its_own_chunks_first(claim):
    claim.words[:] = 0
    assert claim(0, 2, 1, 2) == 1  # thread 1's chunk, though thread 0 has not come yet
    assert claim(0, 2, 0, 2) == 0
    assert claim(0, 2, 0, 2) == -1 and claim(0, 2, 1, 2) == -1


def test_a_thread_done_with_its_own_takes_the_others_from_the_last(claim):
    claim.words[:] = 0
    base = 16
    # 7 chunks on 2 threads: thread 0 owns 0-2, thread 1 owns 3-6
    assert _drain(claim, base, 7, 0, 2) == [0, 1, 2, 6, 5, 4, 3]
    claim.words[:] = 0
    assert claim(base, 7, 1, 2) - base == 3
    assert _drain(claim, base, 7, 0, 2) == [0, 1, 2, 6, 5, 4]
    assert claim(base, 7, 1, 2) == -1


def test_fewer_chunks_than_threads(claim):
    claim.words[:] = 0
    # one chunk of four threads: owned by the thread whose share holds it (3); any may take it
    assert claim(5, 1, 0, 4) == 5
    assert claim(5, 1, 3, 4) == -1
    assert claim(9, 0, 0, 4) == -1  # an empty unit


def test_units_follow_each_other_through_one_word(claim):
    claim.words[:] = 0
    assert _drain(claim, 0, 3, 0, 1) == [0, 1, 2]
    # the next unit (numbered from 3) reads the earlier unit's word as nothing taken
    assert _drain(claim, 3, 3, 0, 1) == [0, 1, 2]
    # a thread still at an earlier unit after the word moved on finds nothing left there
    assert claim(0, 3, 0, 1) == -1
    assert claim.words[1] >> MASK_CHUNKS == 3


def test_a_large_unit_takes_chunks_in_order_from_the_ticket(claim):
    claim.words[:] = 0
    parts = MASK_CHUNKS + 6
    # the ticket lags behind base where earlier units were claimed by their bits
    assert [claim(40, parts, 1, 2) for _ in range(3)] == [40, 41, 42]
    assert _drain(claim, 40, parts, 0, 2) == list(range(3, parts))
    assert claim(40, parts, 1, 2) == -1
    assert claim.words[0] == 40 + parts  # never past the unit's end


@pytest.mark.parametrize("parts", [2, 7, MASK_CHUNKS, MASK_CHUNKS + 9])
def test_racing_threads_take_every_chunk_exactly_once(claim, parts):
    """Threads claim units in turn (ctypes releases the GIL: they race in the native code), a
    barrier between units as the team's wait is: each chunk of every unit is taken once."""
    claim.words[:] = 0
    size, units = 4, 300
    taken = [[[] for _ in range(units)] for _ in range(size)]
    barrier = threading.Barrier(size)
    ticket, word = claim.words.ctypes.data, claim.words.ctypes.data + 8

    def worker(me: int) -> None:
        for u in range(units):
            base = u * parts
            while (k := claim.raw(ticket, word, base, parts, me, size)) >= 0:
                taken[me][u].append(k - base)
            barrier.wait()

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for u in range(units):
        got = sorted(k for me in range(size) for k in taken[me][u])
        assert got == list(range(parts)), u


@pytest.fixture(scope="module")
def masked_claim():
    """claim(base, parts, own) with an explicit mask of own chunks."""
    p = ctypes.c_void_p
    c = ctypes.c_int64
    call = jit_exported(define_claim, ctypes.CFUNCTYPE(c, p, p, c, c, c))
    words = np.zeros(2, dtype=np.int64)

    def run(base: int, parts: int, own: int) -> int:
        return call(words.ctypes.data, words.ctypes.data + 8, base, parts, own)

    run.words = words
    run.keep = call.keep
    return run


def test_a_thread_takes_the_chunks_of_its_mask_first_then_the_others_from_the_last(masked_claim):
    masked_claim.words[:] = 0
    taken = []
    while (k := masked_claim(8, 7, 0b0101010)) >= 0:  # chunks 1, 3 and 5 its own
        taken.append(k - 8)
    assert taken == [1, 3, 5, 6, 4, 2, 0]
    masked_claim.words[:] = 0
    assert masked_claim(8, 7, 0) == 8 + 6  # no own chunk: the last


@pytest.fixture(scope="module")
def columns():
    c = ctypes.c_int64
    return jit_exported(_define_column_mask, ctypes.CFUNCTYPE(c, c, c, c, c, c, c))


def _columns_model(init, step, count, parts, me, size):
    mask = 0
    for k in range(min(parts, MASK_CHUNKS)):
        value = init + (count * k // parts) * step
        if (value // step) % size == me:
            mask |= 1 << k
    return mask


@pytest.mark.parametrize(
    "init, step, count, parts, size",
    [
        (0, 64, 7, 7, 2),  # a wavefront of seven time tiles, one chunk each
        (-384, 64, 7, 7, 2),  # columns below zero round down
        (128, 64, 5, 5, 3),
        (0, 1, 50, 8, 2),  # chunks of several values: each by its first
        (64, 64, 40, 40, 2),  # more chunks than a mask holds: the first MASK_CHUNKS
        (3, 7, 0, 0, 2),  # an empty unit
    ],
)
def test_a_doacross_loops_threads_own_the_chunks_of_their_columns(columns, init, step, count, parts, size):
    """column_mask deals the chunks by the column of their first value modulo the team, so that
    a time tile runs on the thread that ran the tile below it, and every chunk has one owner."""
    masks = [columns(init, step, count, parts, me, size) for me in range(size)]
    assert masks == [_columns_model(init, step, count, parts, me, size) for me in range(size)]
    union = 0
    for m in masks:
        assert union & m == 0
        union |= m
    assert union == (1 << min(parts, MASK_CHUNKS)) - 1
    if (init, step, count) == (0, 64, 7):
        assert masks == [0b1010101, 0b0101010]
