"""lowering: KernelPlan → LLVM IR module + KernelLayout (one function per phase, then the tl_kernel entry)."""

from __future__ import annotations

import llvmlite.ir as ll

from ..emit import values as V
from ..planning.plan import KernelPlan, Split
from .abi import KernelLayout, declare_phase, emit_entry
from .conv_generic_call import release_conv_buffers
from .gemm_call import GemmCallLowering
from .loops import LoopLowering
from .pipelined import PipelineLowering
from .prefetch import PrefetchLowering
from .private_team import PrivateTeamLowering
from .statements import StatementLowering
from .vector_width import apply_vector_width
from .whole import WholeCallLowering


class Lowering(
    LoopLowering,
    PipelineLowering,
    StatementLowering,
    GemmCallLowering,
    PrefetchLowering,
    PrivateTeamLowering,
    WholeCallLowering,
):
    """Emits one kernel module from a KernelPlan, one job per base class (their state is
    LoweringState). Single use: construct, then call `run()`."""

    def run(self) -> ll.Module:
        for decision, phase in zip(self.plan.phases, self.ast.phases):
            self.begin_phase(decision.index)
            self.decision = decision
            self.gemm_team = decision.split is Split.GEMM_TEAM
            self.gemm_overwrite = decision.overwrite
            if decision.split is Split.LOOP_TEAM:  # returns from tl_team<n>, its own function
                self.emit_team_phase(decision.index, phase.node)
                continue
            if not decision.folded:  # a folded init: the next phase's GEMM stores C instead
                self.emit_node(phase.node, {})
            self.b.ret(ll.Constant(V.I32, 0))
        release_conv_buffers(self)  # a generic kernel's packed filters, freed before each return
        if not any(d.split is Split.GEMM_TEAM for d in self.plan.phases):
            self.emit_whole_call()  # phase number len(phases): the whole call on a team
        emit_entry(
            self.module, self.program, self.layout, self.param_values is not None, self.phase_functions
        )
        return self.module

    def begin_phase(self, n: int) -> None:
        """Start the function of phase `n` and point the builder at its entry."""
        layout = self.layout
        fn = declare_phase(self.module, self.program, layout, self.param_values is not None, n)
        self.body = fn
        self.phase_functions.append(fn)
        self.error_ptr, self.lo, self.hi, self.workspace, self.cancel = fn.args[-5:]
        self.b = ll.IRBuilder(fn.append_basic_block("entry"))
        if self.param_values is not None:
            self.params = {p: ll.Constant(V.I64, int(self.param_values[p])) for p in layout.params}
        else:
            self.params = dict(zip(layout.params, fn.args[len(layout.tensors) : -5]))
        self.pointers = dict(zip(layout.tensors, fn.args))


def lower_to_llvm(plan: KernelPlan) -> tuple[ll.Module, KernelLayout]:
    """The plan's LLVM module and the argument layout its entry expects."""
    lowering = Lowering(plan)
    module = lowering.run()
    apply_vector_width(module, plan.vector_width if plan.vectorize else None)  # tuning knob
    return module, lowering.layout
