"""emit: the layout of the block a team of threads shares for one cooperative call, a GEMM's or a loop team's (no LLVM: the runtime reads it too)."""

from __future__ import annotations

import functools

from ..host import gemm_blocking, gemm_workspace_layout
from ..host.blocking import ELEMENT_BYTES

# The shared block of a cooperative call (64-byte aligned; the header starts at zero, but for
# TEAM_SIZE, which the runtime sets to the number of threads):
TEAM_TICKET = 0  # i64: the next task nobody has taken yet
TEAM_DONE = 64  # i64: tasks finished
TEAM_SIZE = 128  # i64: threads in the team (balances the row blocks; results do not depend on it)
TEAM_SLEEPERS = 136  # i64: threads asleep until TEAM_DONE moves (a finished task wakes them)
TEAM_PANEL = 256  # the packed KC×NC panel of B all threads compute from

# A loop team (PhasePlan.barriers: threads run a sequential loop together and meet at barriers)
# uses the header only, its words each on their own cache line:
TEAM_ARRIVED = TEAM_TICKET  # i64: threads that reached the current barrier
TEAM_GENERATION = TEAM_DONE  # i64: barriers completed (a waiting thread watches it change)
TEAM_ABORT = 192  # i32: a thread left early (an error, the cancel word): the others stop waiting
# a loop team's units of work (chunks of a parallel loop, or work one thread runs) are numbered
# in the order every thread meets them; threads take them from one counter and count them done
TEAM_CHUNK_TICKET = 256  # i64: the next chunk nobody has taken yet
TEAM_CHUNK_DONE = 320  # i64: chunks finished
TEAM_CHUNK_CLAIMS = 384  # i64: the current small unit's base and a bit per chunk taken
TEAM_HEADER = 448  # bytes of the header the runtime clears for each call
# the call's number (the runtime counts the blocks it hands out), which tags the flags below so
# that flags left by an earlier call or phase never read as this one's: no clearing needed
TEAM_SERIAL = 200  # i64, beside TEAM_ABORT (each read once per loop)
# a doacross loop's chunks, each flagged done with a tag (lowering/doacross.py): the loop's
# chunks in order, when they are at most TEAM_FLAG_SLOTS (else it waits unit by unit)
TEAM_FLAGS = TEAM_HEADER
TEAM_FLAG_SLOTS = 4096
TEAM_LOOP_BYTES = TEAM_FLAGS + 8 * TEAM_FLAG_SLOTS  # a loop team's block: header and flags

# A whole-call team (the kernel's last phase number runs every phase, a barrier between them)
# finds after the flags (at TEAM_LOOP_BYTES) one record of i64 per phase: WHOLE_MODE, WHOLE_SPAN, then [lo, hi) of
# each thread (2 + 2 * TEAM_SIZE words per record).
WHOLE_ALONE = 0  # thread 0 runs the phase (lo = INT64_MIN), the others wait at the barrier
WHOLE_SPLIT = 1  # each thread runs its [lo, hi) of the outer loop, WHOLE_SPAN at a time, polling between
WHOLE_TEAM = 2  # a loop team: every thread calls the phase with lo = the block, hi = its index


@functools.cache  # host facts: the same for the whole process (asked on every team call)
def gemm_team_bytes() -> int:
    """Bytes of the shared block: the header of counters, each on its own cache line, then one
    packed panel of B (the larger of the two precisions' panels, so that one size fits either)."""
    panels = []
    for dtype, size in ELEMENT_BYTES.items():
        _, b_off, total = gemm_workspace_layout(gemm_blocking(dtype), size)
        panels.append(total - b_off)
    return TEAM_PANEL + max(panels)
