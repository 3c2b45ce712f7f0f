"""planning: Schedule + Options + sizes (or none) → KernelPlan, the call-time pipeline listed once.

`plan_kernel` is the only place where the steps between a schedule and LLVM IR are listed, in
the order they run. Everything lowering needs is decided here and recorded in the frozen
`KernelPlan`: lowering reads the plan and decides nothing. The kernel's build path, its generic
(symbolic-size) path and `inspect` all call `plan_kernel` with the same arguments for the same
call, so what is inspected is what runs. The plan prints (`inspect("plan")`) and hashes
deterministically: the same program, options and sizes give the same text.
"""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass, field

import islpy as isl

from polyhedral import Scop
from polyhedral.contraction import ContractionPlan
from polyhedral.convolution import ConvPlan, plan_convolutions
from polyhedral.convolution import folded_inits as conv_folded_inits
from polyhedral.convolution import workspace_bytes as conv_workspace_bytes
from polyhedral.sizes import compile_size_expr
from scheduler import Schedule, ScheduleOptions, compute_schedule
from tensorlang import ir
from tensorlang.errors import InternalError, verification_enabled

from ..host import gemm_variant, workspace_bytes
from .astgen import (
    Footprint,
    LoopAst,
    Phase,
    build_ast,
    contains_loop,
    evaluate_ast_int,
    loop_range,
    unwrap,
)
from .astscan import ALWAYS_CHECKED, MAX_INSTANCES, check_instances
from .folding import FoldedTemporary, fold_storage, touches
from .gemm_inits import folded_inits
from .loops import loops_text
from .options import CodegenOptions
from .pipeline import PipelinePlan, plan_pipeline
from .prefetching import worth_prefetching
from .private import PrivateCopy, phase_work, private_phases, set_bytes
from .runs import PhasePlan
from .storage import (
    ContractedTemporary,
    plan_buffer_sharing,
    plan_layouts,
    plan_storage,
    storage_report,
    workspace_end,
)
from .teams import team_barriers, team_pays, team_phase

# Below this many multiply-adds a generic kernel's GEMM call runs plain vector loops instead of
# the packed GEMM (its extents are known only then). Measured here (one thread, float32): the
# loops win up to 32³ (batched 16³: 47 against 290 µs for 500 of them; 32³: 85 against 142 µs for
# 100) and lose from 48³ on (85 against 75 µs for 30); a single 1×64×1000 call 10 against 17 µs.
SMALL_GEMM_WORK = 1 << 16


@dataclass(frozen=True)
class Extent:
    """A kernel parameter: the extent of dimension `dim` of `tensor` (the other parameters are
    the isl parameters, named by strings as isl names them)."""

    tensor: str
    dim: int

    def __str__(self) -> str:
        return f"{self.tensor}.{self.dim}"


Param = str | Extent  # an isl parameter's name, or a tensor extent


class PlanError(InternalError):
    """A KernelPlan broke one of its invariants: a compiler bug, reported instead of miscompiled."""


class Split(enum.Enum):
    """How threads share one phase."""

    SERIAL = "serial"  # one thread runs the whole phase
    OUTER_LOOP = "outer loop"  # the phase's outermost loop carries no dependence: split its iterations
    GEMM_TEAM = "gemm"  # the phase is one contraction call: threads pack B together, split C's rows
    # the outermost loop carries a dependence, a parallel loop lies inside it: every thread runs
    # the sequential loop, splitting the parallel loops, with barriers between (planning/teams.py)
    LOOP_TEAM = "team"


@dataclass(frozen=True)
class PhaseDecision:
    """What lowering does with one phase (a top-level loop nest of the AST)."""

    index: int
    split: Split
    prefetch: tuple[Footprint, ...]  # rows each outer iteration prefetches for the next
    pipeline: PipelinePlan | None  # row pipelining of the outer loop, if any
    # The generated code polls the cancel word once per outer iteration. A split outer loop with
    # no loop inside it (an elementwise kernel) does not: a poll there would stop LLVM from
    # vectorising it, so the runtime runs its iterations in chunks and checks between them.
    chunked: bool = False
    # The phase only zeroes a GEMM's C, which the next phase's GEMM calls store instead of adding
    # to at their first K block (`overwrite`): it emits nothing.
    folded: bool = False
    overwrite: bool = False
    # a LOOP_TEAM phase whose sequential outer loop carries only reductions into these tensors:
    # the team splits that loop, each chunk reducing into its own copies (planning/private.py)
    private: tuple[PrivateCopy, ...] = ()

    def describe(self, phase: Phase) -> str:
        parts = [f"phase {self.index}: {', '.join(phase.statements) or 'no statements'}"]
        if self.folded:
            parts.append(f"folded into the GEMM of phase {self.index + 1}")
        elif self.split is Split.SERIAL:
            parts.append("serial")
        elif self.split is Split.GEMM_TEAM:
            parts.append("threads share the gemm (B packed once, blocks of C's rows)")
        elif self.private:
            copies = ", ".join(c.describe() for c in self.private)
            parts.append(
                f"a team of threads splits the outer loop, each chunk reducing into its own copy of {copies}"
            )
            parts.append("the copies are combined in chunk order after it")
        elif self.split is Split.LOOP_TEAM:
            parts.append("a team of threads runs the sequential loop, splitting the parallel loops inside")
        else:
            parts.append(f"threads split the {self.split.value}")
        if self.overwrite:
            parts.append("the GEMM stores C (no zeroing pass)")
        if self.pipeline is not None:
            parts.append(f"pipelined ({self.pipeline.trip} elements per row)")
        if self.prefetch:
            parts.append(f"prefetches {', '.join(f.tensor for f in self.prefetch)}")
        if self.chunked:
            parts.append("run in chunks (cancel checked between them)")
        return "; ".join(parts)


@dataclass(frozen=True, eq=False)
class KernelPlan:
    """Everything decided between a schedule and LLVM IR, for one set of sizes or for all.

    `param_values` is None for the generic kernel (sizes are run-time parameters); otherwise the
    sizes are constants of the generated code. `scop` is the program after contraction planning
    (GEMM statements projected), `ast` the loops lowering emits."""

    program: ir.Program
    scop: Scop
    ast: LoopAst
    sizes: tuple[tuple[str, int], ...] | None
    param_values: Mapping[Param, int] | None
    fast_math: bool
    vectorize: bool
    contractions: Mapping[str, ContractionPlan]  # statement → its GEMM call
    contracted: Mapping[str, ContractedTemporary]  # temporaries kept as one slice per thread
    folded: Mapping[str, FoldedTemporary]  # temporaries stored modulo their dependence distance
    layouts: Mapping[str, tuple[int, ...]]  # inputs relaid out for the GEMM (dimension order)
    sharing: Mapping[str, int]  # temporaries → buffer slot shared by disjoint lifetimes
    phases: tuple[PhaseDecision, ...]
    workspace_bytes: int  # per-thread scratch: packed GEMM operands and contracted slices
    gemm_blocking: tuple[int, int, int] | None = None  # (MC, NC, KC) of the GEMM calls (None: the host's)
    vector_width: int | None = None  # bits the vectorisers may use (None: the target's preference)
    # statement → its direct convolution (packed filters at the end of the workspace)
    convolutions: Mapping[str, ConvPlan] = field(default_factory=dict)
    # a generic plan's GEMM calls run plain loops (emit/gemm_small.py) below this many
    # multiply-adds, checked at each call; None: always the packed GEMM (specialised plans, whose
    # contraction planning already left small statements on the loop path)
    small_gemm_work: int | None = None

    def gemm_variant(self, dtype: str) -> str:
        """The GEMM the contractions of `dtype` call (host.gemm_variant: the plan's blocking)."""
        return gemm_variant(dtype, self.gemm_blocking)

    @property
    def specialised(self) -> bool:
        return self.param_values is not None

    def loops(self) -> str:
        """The loop nest as C-like text, with its storage decisions (`inspect("loops")`)."""
        prefetch, pipelined = {}, set()
        for decision, phase in zip(self.phases, self.ast.phases):
            name = phase.outer.get_annotation().get_name() if phase.outer is not None else None
            if decision.prefetch and name is not None:
                prefetch[name] = tuple(f.tensor for f in decision.prefetch)
            if decision.pipeline is not None and name is not None:
                pipelined.add(name)
        plans = {**self.contractions, **self.convolutions}
        text = loops_text(self.scop, self.ast, plans, prefetch, pipelined)
        report = storage_report(self.contracted, self.folded)
        return f"{report}\n{text}" if report else text

    def __str__(self) -> str:
        sizes = ", ".join(f"{k}={v}" for k, v in self.sizes) if self.sizes is not None else "symbolic"
        lines = [f"// plan for {self.program.name} ({sizes})"]
        lines += [f"// {d.describe(p)}" for d, p in zip(self.phases, self.ast.phases)]
        small = f" (plain loops below {self.small_gemm_work} multiply-adds)" if self.small_gemm_work else ""
        for name, plan in sorted(self.contractions.items()):
            lines.append(f"// {name}: GEMM m={plan.m} n={plan.n} k={plan.k}{small}")
        for name, conv in sorted(self.convolutions.items()):
            lines.append(f"// {name}: {conv.describe()}")
        for name, order in sorted(self.layouts.items()):
            lines.append(f"// {name}: passed in dimension order {order}")
        for name, slot in sorted(self.sharing.items()):
            lines.append(f"// {name}: shares buffer {slot}")
        lines.append(f"// workspace: {self.workspace_bytes} bytes per thread")
        flags = [f for f, on in (("fast-math", self.fast_math), ("no-vectorize", not self.vectorize)) if on]
        if self.vector_width is not None and self.vectorize:
            flags.append(f"vector-width={self.vector_width}")
        dtypes = {_dtype(self.program, c.c.tensor) for c in self.contractions.values()}
        flags += [f"gemm={v}" for v in sorted(map(self.gemm_variant, dtypes)) if "@" in v]
        if flags:
            lines.append(f"// {' '.join(flags)}")
        return "\n".join(lines) + "\n" + self.loops()

    @property
    def key(self) -> str:
        """A stable hash of the plan's text: equal for the same program, options and sizes."""
        return hashlib.sha256(str(self).encode()).hexdigest()

    def verify(self) -> None:
        """Check the plan's invariants; raise PlanError (never a bare assert) when one breaks."""
        if len(self.phases) != len(self.ast.phases):
            raise PlanError(
                f"{self.program.name}: {len(self.phases)} decisions for {len(self.ast.phases)} phases"
            )
        # GEMM calls and direct convolutions read their extents at run time; storage does not
        specific = self.contracted or self.folded or self.layouts or self.sharing
        if not self.specialised and specific:
            raise PlanError(f"{self.program.name}: a generic plan with size-specific storage")
        if self.specialised and self.small_gemm_work is not None:
            raise PlanError(f"{self.program.name}: a specialised plan deciding its GEMM calls at run time")
        temporaries = {t.name for t in self.program.temporaries}
        for name in set(self.contracted) | set(self.sharing) | set(self.folded):
            if name not in temporaries:
                raise PlanError(f"{self.program.name}: {name} is not a temporary but its storage is planned")
        stored = (set(self.contracted), set(self.sharing), set(self.folded))
        for name in stored[0] & stored[1] | stored[0] & stored[2] | stored[1] & stored[2]:
            raise PlanError(f"{self.program.name}: {name} is given two kinds of storage")
        for name in self.layouts:
            if self.program.tensor(name).role != "input":
                raise PlanError(f"{self.program.name}: relayout of {name}, which is not an input")
        ends = [c.offset + c.slice_bytes for c in self.contracted.values()]
        if any(end > self.workspace_bytes for end in ends):
            raise PlanError(f"{self.program.name}: a contracted slice lies outside the workspace")
        for decision, phase in zip(self.phases, self.ast.phases):
            if decision.split is Split.OUTER_LOOP and phase.loop is None:
                raise PlanError(f"{self.program.name}: phase {decision.index} split without a parallel loop")
            if decision.split is Split.GEMM_TEAM and gemm_phase(phase, self.contractions) is None:
                raise PlanError(f"{self.program.name}: phase {decision.index} split as a GEMM without one")
            if decision.private and decision.split is not Split.LOOP_TEAM:
                raise PlanError(f"{self.program.name}: phase {decision.index} privatises outside a team")
            if decision.split is Split.LOOP_TEAM and not (team_phase(phase, self.ast) or decision.private):
                raise PlanError(f"{self.program.name}: phase {decision.index} run by a team without one")
            if decision.folded and (
                decision.index + 1 >= len(self.phases) or not self.phases[decision.index + 1].overwrite
            ):
                raise PlanError(f"{self.program.name}: phase {decision.index} folded into no GEMM")
            if decision.overwrite and (decision.index == 0 or not self.phases[decision.index - 1].folded):
                raise PlanError(f"{self.program.name}: phase {decision.index} overwrites C nobody zeroed")
            if decision.pipeline is not None and not self.specialised:
                raise PlanError(f"{self.program.name}: phase {decision.index} pipelined without sizes")

    def phase_runs(self, sizes: Mapping[str, int], values: Mapping[str, int]) -> tuple[PhasePlan, ...]:
        """How the runtime dispatches each phase for these sizes: the split range and the work."""
        runs = []
        heavy = {**self.contractions, **self.convolutions}
        for decision, phase in zip(self.phases, self.ast.phases):
            work = 0 if decision.folded else phase_work(self.scop, phase.statements, sizes, heavy)
            span = None
            if decision.split is Split.OUTER_LOOP and not decision.folded:
                span = loop_range(phase.loop, values)
            team = decision.split is Split.GEMM_TEAM
            barriers = 0
            if decision.private:  # the split loop, then combining the copies
                barriers, team = 2, True
            elif decision.split is Split.LOOP_TEAM:  # how many barriers (unknown: one thread)
                barriers = team_barriers(phase, self.ast, values) or 0
                team = barriers > 0
            chunked = decision.chunked and span is not None
            private_bytes = set_bytes(decision.private)
            runs.append(PhasePlan(decision.index, span, work, chunked, team, barriers, private_bytes))
        return tuple(runs)


def param_values(scop: Scop, sizes: Mapping[str, int]) -> dict[Param, int]:
    """The value of every kernel parameter for these sizes: isl parameters, then tensor extents."""
    values = scop.params.values(sizes)
    for t in scop.program.tensors:
        for d, extent in enumerate(t.shape):
            values[Extent(t.name, d)] = compile_size_expr(extent)(sizes)
    return values


def plan_kernel(
    schedule: Schedule,
    options: CodegenOptions,
    sizes: Mapping[str, int] | None,
    reschedules: MutableMapping[tuple, Schedule] | None = None,
) -> KernelPlan:
    """The call-time pipeline, in order. `sizes` None plans the generic kernel (what
    `Options(specialize=False)` runs); size-dependent steps are then left out. `reschedules`
    memoises the schedules that contraction planning asks for, per set of contractions."""
    program, scop = schedule.scop.program, schedule.scop
    values = param_values(scop, sizes) if sizes is not None else None
    transform = options.optimize and sizes is not None  # transformations that need concrete sizes

    # 1. contractions: matmul-like statements become GEMM calls; the rest is rescheduled
    contractions: dict[str, ContractionPlan] = {}
    convolutions: dict[str, ConvPlan] = {}
    if options.optimize:  # sizes None (a generic kernel): only plans that run with run-time sizes
        scop, contractions, convolutions = plan_convolutions(scop, sizes, options.direct_conv)
        if contractions or convolutions:
            schedule = _reschedule(scop, {**contractions, **convolutions}, schedule.options, reschedules)
            if verification_enabled():
                scop.verify()
                schedule.verify()
    # 2. storage folding: temporaries kept modulo their dependence distance (may reschedule)
    scop, schedule, folds = fold_storage(schedule, transform and options.fold, sizes, reschedules)
    # 3. the loop AST and its phases
    prefetch = options.optimize and options.prefetch
    # lags: how far back a team's parallel loop depends (lowering/doacross.py), with threads only
    lags = transform and schedule.options.thread_count() > 1
    ast = build_ast(schedule, sizes, footprints=prefetch, lags=lags)
    if sizes is not None:  # isl's AST generator has dropped iterations before (planning/astscan.py)
        limit = MAX_INSTANCES if verification_enabled() else ALWAYS_CHECKED
        problems = check_instances(scop, ast, sizes, limit)
        if problems:
            raise PlanError(
                f"{program.name}: the loops generated for sizes {dict(sizes)} do not run the program's "
                f"statements exactly once each ({'; '.join(problems)}); other tile sizes "
                f"(Options(tile=...)) or Options(specialize=False) avoid the schedule that triggers it"
            )
    # 4. storage: contracted temporaries, GEMM operand layouts, buffers shared between lifetimes
    gemm_variants = {
        gemm_variant(_dtype(program, p.c.tensor), options.gemm_blocking) for p in contractions.values()
    }
    gemm_bytes = max(map(workspace_bytes, gemm_variants), default=0)
    contracted, layouts, sharing = {}, {}, {}
    if transform:
        shapes = {t.name: tuple(compile_size_expr(d)(sizes) for d in t.shape) for t in program.tensors}
        contracted = plan_storage(scop, ast, shapes, {**contractions, **convolutions}, gemm_bytes, set(folds))
        layouts = plan_layouts(program, contractions, shapes)
        sharing = plan_buffer_sharing(scop, ast, shapes, set(contracted) | set(folds))
    # 5. per phase: thread split, row pipelining, prefetching
    pipelines = {}
    if transform and options.pipeline:
        dims = {name: c.dim for name, c in contracted.items()}
        for n, phase in enumerate(ast.phases):
            found = plan_pipeline(scop, ast, phase, values, dims, set(contractions) | set(convolutions))
            if found is not None and not touches(scop, phase.statements, folds):  # slots: source order only
                pipelines[n] = found
    excluded = set(contracted) | set(layouts) | set(folds)
    folded = set()
    if options.optimize:
        folded = folded_inits(scop, ast, contractions, sizes)
        # direct convolutions (a generic kernel's only where its calls run for every size)
        folded |= conv_folded_inits(scop, [p.statements for p in ast.phases], convolutions)
    heavy_work = {**contractions, **convolutions}
    # teams that split a sequential outer loop carrying only reductions, into private copies
    private = {}
    if transform and schedule.options.thread_count() > 1 and schedule.options.private_reductions:
        skip = set(pipelines) | folded
        heavy = {**contractions, **convolutions}
        private = private_phases(scop, ast, shapes, sizes, heavy, skip, schedule.options.thread_count())
    teams = set(private) | {
        n
        for n, phase in enumerate(ast.phases)
        if options.optimize and n not in pipelines and n not in folded and team_phase(phase, ast)
        # one thread: a team's chunks, claims and waits per parallel loop are pure overhead (the
        # time tiles' inner loops of a 1-thread schedule: fdtd-2d 200^2 T=200 7.3 -> 2.1 ms)
        and schedule.options.thread_count() > 1
        # a team whose steps are too short to pay at these sizes: plain loops on one thread
        and (values is None or team_pays(phase, ast, values, phase_work(scop, phase.statements, sizes, heavy_work)))
        and not any(s in contractions or s in convolutions for s in phase.statements)
        and not any(c.phase == n for c in contracted.values())  # one slice per thread: not shared
    }  # fmt: skip
    # Options.thread_split="serial" (a tuning knob): every phase on the calling thread
    serial = set(range(len(ast.phases))) if options.thread_split == "serial" else folded
    phases = tuple(
        PhaseDecision(
            n,
            Split.SERIAL if n in serial else Split.LOOP_TEAM if n in teams else _split(phase, contractions),
            _prefetched(phase, program, contractions, excluded, values) if prefetch else (),
            pipelines.get(n),
            _chunked(phase, {**contractions, **convolutions}) and n not in folded,
            folded=n in folded,
            overwrite=n - 1 in folded,
            private=private.get(n, ()),
        )
        for n, phase in enumerate(ast.phases)
    )
    plan = KernelPlan(
        program=program,
        scop=scop,
        ast=ast,
        sizes=tuple((s.name, int(sizes[s.name])) for s in program.sizes) if sizes is not None else None,
        param_values=values,
        fast_math=options.fast_math,
        vectorize=options.vectorize,
        contractions=contractions,
        contracted=contracted,
        folded=folds,
        layouts=layouts,
        sharing=sharing,
        phases=phases,
        workspace_bytes=_with_filters(workspace_end(contracted, gemm_bytes), convolutions),
        gemm_blocking=options.gemm_blocking if contractions else None,
        vector_width=options.vector_width,
        convolutions=convolutions,
        small_gemm_work=SMALL_GEMM_WORK if contractions and sizes is None else None,
    )
    plan.verify()
    return plan


def _with_filters(end: int, convolutions: Mapping[str, ConvPlan]) -> int:
    """The workspace with the packed filters of direct convolutions at its end (64-byte aligned)."""
    return -(-end // 64) * 64 + conv_workspace_bytes(convolutions) if convolutions else end


def _chunked(phase: Phase, contractions: Mapping[str, ContractionPlan]) -> bool:
    """Whether the runtime runs the phase's split outer loop in chunks: it has no loop inside and
    calls no GEMM (whose outer loop is cheap to poll, and which polls inside too)."""
    if _split(phase, contractions) is not Split.OUTER_LOOP or any(
        s in contractions for s in phase.statements
    ):
        return False
    return not contains_loop(unwrap(phase.loop).for_get_body())


def _reschedule(
    scop: Scop,
    contractions: Mapping[str, ContractionPlan | ConvPlan],
    options: ScheduleOptions,
    memo: MutableMapping[tuple, Schedule] | None,
) -> Schedule:
    key = tuple(
        sorted(
            (name, *((p.m, p.n, p.k) if isinstance(p, ContractionPlan) else ("conv",)))
            for name, p in contractions.items()
        )
    )
    if memo is not None and key in memo:
        return memo[key]
    schedule = compute_schedule(scop, options)
    if memo is not None:
        memo[key] = schedule
    return schedule


def _dtype(program: ir.Program, tensor: str) -> str:
    return program.tensor(tensor).dtype.numpy_name


def gemm_phase(phase: Phase, contractions: Mapping[str, ContractionPlan]) -> ContractionPlan | None:
    """The contraction of a phase that is a single GEMM call with no loop around it."""
    if len(phase.statements) != 1 or unwrap(phase.node).get_type() != isl.ast_node_type.user:
        return None
    return contractions.get(phase.statements[0])


def _split(phase: Phase, contractions: Mapping[str, ContractionPlan]) -> Split:
    if gemm_phase(phase, contractions) is not None:
        return Split.GEMM_TEAM
    return Split.OUTER_LOOP if phase.loop is not None else Split.SERIAL


def _prefetched(
    phase: Phase,
    program: ir.Program,
    contractions: Mapping[str, ContractionPlan],
    excluded: set[str],
    values: Mapping[str, int] | None,
) -> tuple[Footprint, ...]:
    """What a phase prefetches one outer iteration ahead: reads of tensors in plain row-major
    storage (`excluded` holds per-thread contracted slices, which stay in cache, and relayouts),
    outside phases with GEMM calls, which pack their operands themselves. With the parameter
    `values` of a specialised kernel, footprints that are not worth it at the loop's first
    iteration are left out here; otherwise the generated code checks at run time."""
    if any(s in contractions for s in phase.statements):
        return ()
    chosen = []
    for f in phase.footprints:
        if f.tensor in excluded:
            continue
        if values is not None and phase.outer is not None:
            first = evaluate_ast_int(phase.outer.for_get_init(), values)
            iterator = phase.outer.for_get_iterator().get_id().get_name()
            at_first = {**values, iterator: first} if first is not None else values
            lo = [evaluate_ast_int(e, at_first) for e in f.lo]
            hi = [evaluate_ast_int(e, at_first) for e in f.hi]
            if None not in lo and None not in hi:
                extents = [values.get(Extent(f.tensor, d)) for d in range(len(lo))]
                if None not in extents and not worth_prefetching(lo, hi, extents, program.tensor(f.tensor)):
                    continue
        chosen.append(f)
    return tuple(chosen)
