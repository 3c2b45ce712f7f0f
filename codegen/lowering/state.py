"""lowering: KernelPlan → the state one kernel's lowering shares across its jobs (plan facts, builder, phase)."""

from __future__ import annotations

from dataclasses import dataclass

import llvmlite.ir as ll

from tensorlang import ir

from ..planning.plan import KernelPlan, Param, PhaseDecision
from .abi import kernel_layout


class LoweringState:
    """What the lowering jobs (loops, pipelined loops, statements, GEMM calls, prefetches) share:
    facts of the plan, set once, and the phase being emitted, set by `Lowering.begin_phase`."""

    # the phase being emitted
    body: ll.Function  # its function, tl_phase<n>
    b: ll.IRBuilder
    params: dict[Param, ll.Value]  # kernel parameters: constants when specialised, else arguments
    pointers: dict[str, ll.Value]  # tensor → base pointer
    error_ptr: ll.Value  # i64* error record (codegen/lowering/abi.py)
    lo: ll.Value  # this thread's share [lo, hi) of a split loop
    hi: ll.Value
    workspace: ll.Value  # i8*: this thread's scratch memory (contracted temporaries, GEMM packing)
    cancel: ll.Value  # i32*: the call's cancel word, polled once per iteration of outermost loops
    gemm_team: bool  # the phase is one GEMM call that threads share (lo: the team's block)
    gemm_overwrite: bool  # the phase's GEMM calls store C at their first K block

    def __init__(self, plan: KernelPlan):
        self.plan = plan
        self.scop = plan.scop
        self.program = plan.scop.program
        self.ast = plan.ast
        self.plans = plan.contractions
        self.contracted = plan.contracted
        self.layouts = plan.layouts  # tensor → storage order of its dimensions
        self.param_values = plan.param_values
        self.layout = kernel_layout(plan.scop)
        self.flags = ("fast",) if plan.fast_math else ()
        self.module = ll.Module("tensorlang")
        # run-time bounds checks by what they check: (statement, read), None for the write. Reads
        # are values (frozen, compared without their spans), so a rewrite that copies a read still
        # finds its checks; equal reads of one statement get the checks of all of them.
        self.checks_of: dict[tuple[str, ir.Read | None], list[tuple[int, int]]] = {}
        for n, c in enumerate(plan.scop.checks):
            found = self.checks_of.setdefault((c.statement, c.read), [])
            found += [(n, d) for d in c.dynamic_dims if d not in {dim for _, dim in found}]
        # tensor → the private copy that statements reducing into it write (private_team.py)
        self.private_pointers: dict[str, ll.Value] = {}
        self.read_overrides: dict[tuple[str, ir.Read], ll.Value] = {}  # (statement, read) → loaded earlier
        self.decision: PhaseDecision | None = None  # the phase being emitted; its outer loop not yet
        self.leaf_statement: PolyLeafContext | None = None  # the statement instance being emitted
        self.phase_functions: list[ll.Function] = []
        self.loop_depth = 0  # for loops around the current position in the phase being emitted


@dataclass
class PolyLeafContext:
    """The statement instance being emitted: its name and index variable values."""

    name: str
    statement: ir.Statement
    indices: dict[str, ll.Value]

    @property
    def statement_position(self) -> int:
        return int(self.name[1:].split("_")[0])  # a piece S3_1 of statement 3 (polyhedral/split.py)
