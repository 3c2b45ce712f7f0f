"""planning: one phase's dispatch facts for one call → PhasePlan (no islpy: the runtime and the disk cache read it)."""

from __future__ import annotations

from dataclasses import dataclass

# a team splitting a loop into private copies (planning/private.py): chunks per thread, each with
# its own copies (more let a thread that starts late take fewer; each costs a zeroing and a
# combining pass over its copies)
PRIVATE_CHUNKS_PER_THREAD = 4
# statement instances of a loop team's phase per iteration of its sequential loop (per barrier,
# about) below which the phase runs on one thread: a barrier costs about a microsecond when the
# threads have cores of their own, but up to a time slice when the machine is over-subscribed
# (the runtime's threshold, runtime/parallel.py; planning/teams.py plans such phases of much work
# as plain loops)
TEAM_STEP_WORK = 1 << 16


@dataclass(frozen=True)
class PhasePlan:
    """How the runtime dispatches one phase for one call: the (first, stop, step) of the loop
    whose iterations threads split, if any, the phase's work in statement instances, whether
    the runtime runs that loop in chunks, checking the cancel word between them (`chunked`), and
    whether a team of threads shares the phase (`team`: each thread's call gets lo = the address
    of a shared block laid out as in `emit.gemm_team`, its header zeroed and the team size at
    TEAM_SIZE; lo = INT64_MIN runs the phase on one thread). A GEMM team (one GEMM call,
    `barriers` 0) takes tasks from the block's counters; a loop team (`barriers` > 0, an
    estimate of its units of work) runs that loop on every thread, the parallel loops inside in
    chunks taken from the block's counters, all threads done with one unit before the next.
    `private_bytes`: a loop team that privatises reductions (planning/private.py) needs, after
    the block's loop words, this many bytes per chunk of its split loop."""

    index: int
    loop_range: tuple[int, int, int] | None
    work: int
    chunked: bool = False
    team: bool = False
    barriers: int = 0
    private_bytes: int = 0

    @property
    def loop_team(self) -> bool:
        return self.team and self.barriers > 0
