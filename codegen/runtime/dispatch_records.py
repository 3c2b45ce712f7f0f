"""runtime: a specialisation's phase plans and a thread count → DispatchRecords, each split phase's dispatch written once for the native checked call (no Python per call).

parallel.run_phases decides per call, in Python, how each phase runs: on the calling thread, as a
GEMM team, or split into ranges, and writes the pieces into the native pool's slots (about 25 µs
of Python a call of a 2-thread sgemm 256, against 73 µs of work per thread). For a signature
called again and again those decisions and those words are the same every time, so here they are
made once: a record per split phase (emit/dispatch.py gives its layout) that tl_worker_dispatch
copies into the slots, and a workspace per thread that the records point at, kept for the
signature's life. The decisions are run_phases' own (worth_threads, dynamic_calls, piece_calls),
with three exceptions that keep the Python path: a call long enough to be *watched* (Ctrl-C is
seen while it runs), a whole-call team (its barriers need every thread, never revoked), and a
loop team. A small GEMM team always splits here; parallel.py's resting of stalled small teams
(stalls.py) is the Python path's: a native dispatch never waits for a worker that has not started
(tl_worker_revoke).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import numpy as np

from ..emit.dispatch import (
    IMAGE_WORDS,
    R_ENTRY,
    R_HEADER,
    R_IMAGES,
    R_NEVER,
    R_PARAMS,
    R_PHASE,
    R_PIECES,
    R_SLOTS,
    R_TEAM,
    R_TEAM_SIZE,
    R_WORKSPACE,
)
from ..emit.workers import POOL_CANCEL, SHARED_COUNTER_BYTE, SLOT_ERROR, SLOT_OWN_COUNTER
from . import native_pool
from .parallel import (
    _NEVER_ADDRESS,
    WATCHED_WORK,
    chunks,
    dynamic_calls,
    piece_calls,
    whole_call_plan,
    worth_threads,
)


@dataclass(frozen=True, eq=False)
class DispatchRecords:
    threads: int
    pool: native_pool.Pool | None  # None: no phase splits
    addresses: tuple[int, ...]  # per phase, its record's address; 0: it runs on the calling thread
    workspace: int  # piece 0's, which the phases run on the calling thread use too
    keep: tuple  # the arrays the addresses point into


def dispatch_records(spec, threads: int) -> DispatchRecords | None:
    """The records of `spec`'s phases on `threads` threads, or None where its calls take the
    Python path (see the module's docstring; also where there are no native workers)."""
    plans = spec.plans
    if sum(p.work for p in plans) >= WATCHED_WORK or whole_call_plan(plans, threads) is not None:
        return None
    kinds = []
    for plan in plans:
        if threads < 2 or not worth_threads(plan):
            kinds.append(None)
        elif plan.loop_team:
            return None
        elif plan.team:
            kinds.append("team")
        elif plan.loop_range is not None and len(chunks(plan.loop_range, threads)) > 1:
            kinds.append("split")
        else:
            kinds.append(None)
    pieces = threads if any(kinds) else 1
    workspaces = spec.workspaces.lease(pieces)  # kept for the signature's life
    keep: list = [workspaces]
    if not any(kinds):
        return DispatchRecords(threads, None, (0,) * len(plans), workspaces[0][1], tuple(keep))
    entry = spec.code.entry
    pool = native_pool.acquire(entry, threads - 1)
    if pool is None:
        spec.workspaces.give_back(workspaces)
        return None
    pool.busy.release()
    entry_address = ctypes.cast(entry, ctypes.c_void_p).value
    addresses = []
    for plan, kind in zip(plans, kinds):
        if kind is None:
            addresses.append(0)
            continue
        team = 0
        if kind == "team":
            team = pool.team_block()
            lists, shared = [[(team, 0)]] * threads, None
        else:
            lists = [piece_calls(plan, lo, hi) for lo, hi in chunks(plan.loop_range, threads)]
            shared = dynamic_calls(plan, threads)
        record = np.zeros(R_IMAGES + IMAGE_WORDS * len(lists), dtype=np.int64)
        record[[R_HEADER, R_SLOTS, R_PIECES, R_TEAM, R_TEAM_SIZE]] = [
            pool.header,
            pool.slot(0),
            len(lists),
            team,
            threads,
        ]
        record[[R_ENTRY, R_PARAMS, R_PHASE, R_WORKSPACE, R_NEVER]] = [
            entry_address, spec.params_address, plan.index, workspaces[0][1], _NEVER_ADDRESS,
        ]  # fmt: skip
        common = None
        if shared is not None:
            common = np.asarray(shared, dtype=np.int64).reshape(-1)
            keep.append(common)
        for p, calls in enumerate(lists):
            slot = pool.slot(p)
            if common is None:
                pairs = np.asarray(calls, dtype=np.int64).reshape(-1)
                keep.append(pairs)
                ranges, count, counter = pairs.ctypes.data, len(calls), slot + SLOT_OWN_COUNTER
            else:
                ranges, count, counter = common.ctypes.data, len(shared), pool.header + SHARED_COUNTER_BYTE
            # a split piece done with its own calls takes the others' untaken ones (stealing)
            peers = len(lists) if kind == "split" and common is None else 0
            record[R_IMAGES + p * IMAGE_WORDS : R_IMAGES + (p + 1) * IMAGE_WORDS] = [
                entry_address, 0, spec.params_address, slot + SLOT_ERROR, plan.index, 0, 0, workspaces[p][1],
                pool.header + POOL_CANCEL, ranges, count, counter, 0, -1,
                pool.slot(0), peers, 0, 0, 0,
            ]  # fmt: skip
        keep.append(record)
        addresses.append(record.ctypes.data)
    return DispatchRecords(threads, pool, tuple(addresses), workspaces[0][1], tuple(keep))
