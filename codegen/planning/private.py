"""planning: a phase whose outer loop carries only reductions → the private copies a team of threads accumulates into.

The loop is split among a team of threads in chunks (lowering/private_team.py). Each chunk
accumulates the privatised tensors into its own copies, laid out in the team's shared block
after its loop words: chunk k's set of copies at `k * set_bytes`, each tensor's copy at its
`offset` in the set, row-major and unpadded. Once every chunk is done, the team adds the copies
into the tensors in chunk order, so that the result does not depend on which thread ran which
chunk. A phase the runtime runs on one thread accumulates into the tensors themselves, as the
sequential loop does.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from polyhedral import Scop, StatementKind
from polyhedral.sizes import compile_size_expr

from .astgen import LoopAst, Phase
from .runs import PRIVATE_CHUNKS_PER_THREAD
from .teams import split_bound

# privatise only when zeroing and combining the copies costs little next to the loop: the phase
# does at least this many statement instances per element of every chunk's copies
WORK_PER_COPIED_ELEMENT = 16
_ALIGN = 64


@dataclass(frozen=True)
class PrivateCopy:
    """One privatised tensor: its reduction operator, elements, and byte offset in a copy set."""

    tensor: str
    op: str
    elements: int
    element_bytes: int
    offset: int

    def describe(self) -> str:
        return f"{self.tensor} ({self.op}, {self.elements * self.element_bytes} bytes)"


def set_bytes(copies: tuple[PrivateCopy, ...]) -> int:
    """Bytes of one chunk's set of copies (a multiple of 64)."""
    end = max((c.offset + c.elements * c.element_bytes for c in copies), default=0)
    return -(-end // _ALIGN) * _ALIGN


def phase_work(scop: Scop, statements: tuple[str, ...], sizes: Mapping[str, int], heavy: Mapping) -> int:
    """A phase's work in statement instances for these sizes (`heavy`: its GEMM and convolution
    statements, discounted)."""
    work = 0
    for name in statements:
        stmt = scop.statement(name)
        st = stmt.statement
        ranges = st.ranges if stmt.kind is StatementKind.BODY else st.ranges[: len(st.indices)]
        points = 1
        for r in ranges:
            points *= max(0, compile_size_expr(r.hi)(sizes) - compile_size_expr(r.lo)(sizes))
        # a packed-GEMM multiply-add costs about 1/128 of a simple loop instance (0.009 ns at
        # 230 GFLOP/s); a GEMM team splits from less work than other phases
        # (runtime/parallel.GEMM_TEAM_DISCOUNT: from about 2^23 multiply-adds)
        work += points // 128 if name in heavy else points
    return work


def private_phases(
    scop: Scop,
    ast: LoopAst,
    shapes: Mapping[str, tuple[int, ...]],
    sizes: Mapping[str, int],
    heavy: Mapping,
    skip: set[int],
    threads: int,
) -> dict[int, tuple[PrivateCopy, ...]]:
    """Phase number → its copies, for the phases (not in `skip`, without GEMM or convolution
    calls) whose loop a team privatising reductions runs."""
    found = {}
    for n, phase in enumerate(ast.phases):
        if n in skip or any(s in heavy for s in phase.statements):
            continue
        copies = plan_private(
            scop, ast, phase, shapes, phase_work(scop, phase.statements, sizes, heavy), threads
        )
        if copies:
            found[n] = copies
    return found


def plan_private(
    scop: Scop,
    ast: LoopAst,
    phase: Phase,
    shapes: Mapping[str, tuple[int, ...]],
    work: int,
    threads: int,
) -> tuple[PrivateCopy, ...]:
    """The copies a team splitting the phase's sequential outer loop needs, or () when the loop
    carries more than privatisable reductions, cannot be split, or the copies cost too much."""
    if phase.outer is None or phase.loop is not None or split_bound(phase.outer) is None:
        return ()
    info = ast.loops.get(phase.outer.get_annotation().get_name())
    if info is None or not info.private:
        return ()
    copies, offset = [], 0
    for tensor, op in info.private:
        elements = math.prod(shapes[tensor])
        size = scop.program.tensor(tensor).dtype.storage_bytes
        copies.append(PrivateCopy(tensor, op, elements, size, offset))
        offset += -(-elements * size // _ALIGN) * _ALIGN
    chunks = threads * PRIVATE_CHUNKS_PER_THREAD
    if sum(c.elements for c in copies) * chunks * WORK_PER_COPIED_ELEMENT > work:
        return ()
    return tuple(copies)
