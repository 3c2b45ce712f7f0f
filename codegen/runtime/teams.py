"""runtime: shared blocks of teams; a call's phase plans → the table of a whole-call team (phases split, loop teams, thread 0).

When a kernel has no GEMM team phase, its phase number len(plans) runs every phase on each thread
of a team, a barrier between phases (lowering/whole.py): one Python dispatch per call instead of
one per phase. This module decides, per call, whether that pays and what each phase does in it,
by the same rules as the phase-by-phase dispatch in parallel.py, and writes the table into the
team's shared block.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np

from ..emit.gemm_team import TEAM_FLAGS, TEAM_HEADER, TEAM_LOOP_BYTES, TEAM_SERIAL, TEAM_SIZE, gemm_team_bytes
from ..planning.runs import PhasePlan


class Teams:
    """Shared blocks of cooperative phases (PhasePlan.team): for a GEMM, a packed panel of B and
    the counters the team's threads take tasks with; for a loop team, the barrier's words. One
    per phase call, kept for reuse; only the header is cleared for a new call."""

    def __init__(self):
        self._idle: list[tuple[np.ndarray, int]] = []
        self._lock = threading.Lock()
        self.views: dict[int, np.ndarray] = {}  # aligned address of a block → its bytes from there
        self._headers: dict[int, np.ndarray] = {}  # aligned address → its header's i64 words
        self._serial = 0  # blocks handed out (TEAM_SERIAL)
        # blocks whose flag words hold nothing but tags of earlier calls (which never equal a
        # later call's): a new block, or one a GEMM team packed its panel over, is cleared first
        self._flags_clean: set[int] = set()

    def after_fork(self) -> None:
        self._lock = threading.Lock()

    def take(self, threads: int, nbytes: int | None = None) -> tuple[np.ndarray, int]:
        """A block of `nbytes` (None: a GEMM team's), its header cleared, TEAM_SIZE = threads and
        TEAM_SERIAL numbering the block handed out; a loop team's (nbytes >= TEAM_LOOP_BYTES)
        with flag words that no earlier data can pass for a tag of this call."""
        loop_team = nbytes is not None and nbytes >= TEAM_LOOP_BYTES
        nbytes = gemm_team_bytes() if nbytes is None else nbytes
        with self._lock:
            while self._idle and self._idle[-1][0].nbytes < nbytes + 64:
                address = self._idle.pop()[1]  # made for another blocking
                self.views.pop(address, None)
                self._headers.pop(address, None)
                self._flags_clean.discard(address)
            block = self._idle.pop() if self._idle else None
            self._serial += 1
            serial = self._serial
        if block is None:
            buf = np.empty(nbytes + 64, dtype=np.uint8)
            address = (buf.ctypes.data + 63) // 64 * 64
            block = (buf, address)
            self.views[address] = buf[address - buf.ctypes.data :]  # from the aligned start
            self._headers[address] = self.views[address][:TEAM_HEADER].view(np.int64)
        if not loop_team:
            self._flags_clean.discard(block[1])
        elif block[1] not in self._flags_clean:
            self.views[block[1]][TEAM_FLAGS:TEAM_LOOP_BYTES].fill(0)
            self._flags_clean.add(block[1])
        header = self._headers[block[1]]
        header.fill(0)
        header[TEAM_SIZE // 8] = threads
        header[TEAM_SERIAL // 8] = serial
        return block

    def give_back(self, block: tuple[np.ndarray, int]) -> None:
        with self._lock:
            self._idle.append(block)


def whole_call_table(
    plans: tuple[PhasePlan, ...],
    threads: int,
    parallel: Callable[[PhasePlan], bool],
    team: Callable[[PhasePlan], bool],
    split: Callable[[tuple[int, int, int], int], list[tuple[int, int]]],
    chunk_work: int,
) -> np.ndarray | None:
    """The records (emit/gemm_team.py) of a whole-call team for these plans, or None when one
    dispatch per phase is the way: a GEMM team phase (its counters would clash with the
    barrier's), a single phase, or fewer than two phases worth threads (phase by phase, that is
    one dispatch too, with no barrier: a convolution's folded zeroing and the convolution). `parallel(plan)`: the
    phase is worth threads; `team(plan)`: a loop team is worth it; `split(range, parts)`: the
    [lo, hi) shares of a loop."""
    from ..emit.gemm_team import WHOLE_ALONE, WHOLE_SPLIT, WHOLE_TEAM

    if threads < 2 or len(plans) < 2 or any(p.team and not p.loop_team for p in plans):
        return None
    if sum(1 for p in plans if parallel(p)) < 2:  # one dispatch either way, and no barriers
        return None
    width = 2 + 2 * threads
    table = np.zeros((len(plans), width), dtype=np.int64)
    shared = False
    for row, plan in zip(table, plans):
        row[0] = WHOLE_ALONE
        if not parallel(plan):
            continue
        if plan.loop_team:
            if team(plan):
                row[0], shared = WHOLE_TEAM, True
            continue
        if plan.loop_range is None:
            continue
        first, stop, step = plan.loop_range
        shares = split(plan.loop_range, threads)
        if len(shares) < 2:
            continue
        row[0], shared = WHOLE_SPLIT, True
        trips = max(1, -(-(stop - first) // step))
        # a phase that does not poll the cancel word runs CHUNK_WORK instances at a time
        row[1] = max(1, chunk_work * trips // max(1, plan.work)) * step if plan.chunked else 2**62
        for t, (lo, hi) in enumerate(shares):
            row[2 + 2 * t], row[3 + 2 * t] = lo, hi
    return table.reshape(-1) if shared else None
