"""planning: one phase's dispatch facts for one call → PhasePlan (no islpy: the runtime and the disk cache read it)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PhasePlan:
    """How the runtime dispatches one phase for one call: the (first, stop, step) of the loop
    whose iterations threads split, if any, the phase's work in statement instances, whether
    the runtime runs that loop in chunks, checking the cancel word between them (`chunked`), and
    whether the phase is one GEMM call that a team of threads shares (`team`: each thread's call
    gets lo = the address of a shared block of `emit.gemm_team.gemm_team_bytes()`, its counters
    zeroed and the team size at TEAM_SIZE; lo = INT64_MIN runs the GEMM on one thread)."""

    index: int
    loop_range: tuple[int, int, int] | None
    work: int
    chunked: bool = False
    team: bool = False
