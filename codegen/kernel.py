"""codegen: Schedule → Kernel, a callable on NumPy arrays that JIT-compiles per set of sizes."""

from __future__ import annotations

import ctypes
import functools
import threading
import warnings
from collections.abc import Mapping
from dataclasses import dataclass

import islpy as isl
import numpy as np

from polyhedral import Scop
from polyhedral.contraction import plan_contractions
from polyhedral.sizes import compile_size_expr
from scheduler import Schedule, compute_schedule
from tensorlang import ir
from tensorlang.errors import ArgumentError, TensorLangError, TensorLangWarning
from tensorlang.options import Options

from . import arguments as args_
from .astgen import LoopAst, build_ast, loop_range
from .gemm import shared_gemm, workspace_bytes
from .jit import MachineCode, assembly_of, jit, optimise
from .loops import loops_text
from .lower import (
    ERROR_DIVISION,
    ERROR_INDEX,
    KernelLayout,
    gemm_phase,
    lower_to_llvm,
    prefetched_footprints,
)
from .parallel import PhasePlan, Workspaces, run_phases
from .pipeline import PipelinePlan, plan_pipeline
from .storage import (
    ContractedTemporary,
    plan_buffer_sharing,
    plan_layouts,
    plan_storage,
    storage_report,
    workspace_end,
)

STAGES = ("ast", "ir", "scop", "deps", "graph", "schedule", "loops", "llvm", "asm")


@dataclass
class Specialisation:
    """Machine code for one set of sizes, with the parameter values it was built for."""

    code: MachineCode
    layout: KernelLayout
    params: np.ndarray  # int64 parameter array passed at each call
    plans: tuple[PhasePlan, ...]
    workspaces: Workspaces
    contracted: Mapping[str, ContractedTemporary]  # temporaries stored as one slice per thread
    layouts: Mapping[str, tuple[int, ...]]  # inputs passed in another storage order (GEMM operands)
    sharing: Mapping[str, int]  # temporaries → buffer slot shared by disjoint lifetimes

    @functools.cached_property
    def params_address(self) -> int:
        return self.params.ctypes.data

    @functools.cached_property
    def workspace_slots(self) -> tuple[tuple[int, int], ...]:
        """(index in the buffer list, offset in a thread's workspace) of each contracted temporary."""
        return tuple((self.layout.tensors.index(name), c.offset) for name, c in self.contracted.items())


class Kernel:
    """A compiled def. Call it with the inputs (NumPy arrays) in the def's order."""

    def __init__(self, program: ir.Program, schedule: Schedule, options: Options, syntax_text: str):
        self.program = program
        self.schedule = schedule
        self.scop: Scop = schedule.scop
        self.options = options
        self._prefetch = options.optimize and options.prefetch
        self._syntax_text = syntax_text
        self._shape_fns = {t.name: tuple(compile_size_expr(d) for d in t.shape) for t in program.tensors}
        self._input_dims = args_.input_dims(program)
        # tensors a `+=`-without-`!` accumulates into first: they start from zeros (or out=)
        self._uninitialised = frozenset(st.tensor for st in program.statements if st.uninitialized)
        self._requirements = tuple((compile_size_expr(r.expr), r) for r in program.requirements)
        self._cache: dict[tuple[int, ...], Specialisation] = {}
        self._shape_cache: dict[tuple[int, ...], dict[str, tuple[int, ...]]] = {}
        self._schedules: dict[tuple, Schedule] = {}  # per contraction plan
        self._generic = None  # (ast, machine code, layout) of the parametric kernel
        self._lock = threading.Lock()
        self.compile_count = 0  # number of JIT compilations so far (observable cache behaviour)

    @property
    def name(self) -> str:
        return self.program.name

    def __repr__(self) -> str:
        ins = ", ".join(str(t) for t in self.program.inputs)
        outs = ", ".join(t.name for t in self.program.outputs)
        return f"<tensorlang.Kernel {self.name}({ins}) -> ({outs})>"

    # ------------------------------------------------------------------ calling

    def __call__(self, *inputs: object, out: object = None):
        program = self.program
        if len(inputs) != len(program.inputs):
            names = ", ".join(t.name for t in program.inputs)
            raise ArgumentError(
                f"{program.name}: expected {len(program.inputs)} inputs ({names}) but found {len(inputs)}"
            )
        arrays = [args_.as_input_array(v, t, program) for v, t in zip(inputs, program.inputs)]
        sizes = args_.bind_sizes(program, arrays, self._input_dims)
        shapes = self._shapes(sizes)
        requested = args_.normalise_out(program, out)
        buffers = {
            name: args_.check_out_buffer(program, program.tensor(name), arr, shapes[name])
            for name, arr in requested.items()
        }
        args_.check_no_aliasing(program, {t.name: a for t, a in zip(program.inputs, arrays)}, requested)
        spec = self._specialisation(sizes)
        storage: dict[str, np.ndarray] = {t.name: a for t, a in zip(program.inputs, arrays)}
        for name, order in spec.layouts.items():  # GEMM operands with no unit stride: relayout once
            storage[name] = np.ascontiguousarray(storage[name].transpose(order))
        shared_views = self._shared_views(spec, shapes)
        for t in program.outputs + program.temporaries:
            if t.name in buffers:
                storage[t.name] = buffers[t.name].work
                continue
            if t.name in self._uninitialised and t.role == "output":
                warnings.warn(
                    f"{program.name}: output {t.name} is accumulated without initialisation (+= without !) "
                    f"and no out= buffer was given; it starts from zeros",
                    TensorLangWarning,
                    stacklevel=2,
                )
            if t.name in spec.contracted:  # lives in the per-thread workspace instead
                continue
            if t.name in spec.sharing:  # one allocation for temporaries that are never live together
                storage[t.name] = shared_views[t.name]
                continue
            alloc = np.zeros if t.name in self._uninitialised else np.empty
            storage[t.name] = alloc(shapes[t.name], dtype=t.dtype.numpy_name)
        self._run(spec, storage, buffers)
        for buf in buffers.values():
            if buf.target is not None:
                buf.target[...] = buf.work
        results = tuple(
            buffers[t.name].target
            if t.name in buffers and buffers[t.name].target is not None
            else storage[t.name]
            for t in program.outputs
        )
        return results[0] if len(results) == 1 else results

    def _shared_views(self, spec: Specialisation, shapes) -> dict[str, np.ndarray]:
        sizes_of = {}
        for name, slot in spec.sharing.items():
            t = self.program.tensor(name)
            nbytes = int(np.prod(shapes[name], dtype=np.int64)) * np.dtype(t.dtype.numpy_name).itemsize
            sizes_of[slot] = max(sizes_of.get(slot, 0), nbytes)
        slots = {slot: np.empty(max(1, n), dtype=np.uint8) for slot, n in sizes_of.items()}
        views = {}
        for name, slot in spec.sharing.items():
            t = self.program.tensor(name)
            dtype = np.dtype(t.dtype.numpy_name)
            count = int(np.prod(shapes[name], dtype=np.int64))
            views[name] = slots[slot][: count * dtype.itemsize].view(dtype).reshape(shapes[name])
        return views

    def _shapes(self, sizes: Mapping[str, int]) -> dict[str, tuple[int, ...]]:
        """Output and temporary shapes for these sizes, after checking the call-time requirements
        (cached per set of sizes: only sizes that passed are cached)."""
        key = tuple(sizes[s.name] for s in self.program.sizes)
        shapes = self._shape_cache.get(key)
        if shapes is None:
            shapes = self._shape_cache[key] = self._compute_shapes(sizes)
        return shapes

    def _compute_shapes(self, sizes: Mapping[str, int]) -> dict[str, tuple[int, ...]]:
        for evaluate, requirement in self._requirements:
            value = evaluate(sizes)
            if value != 0:
                where = f" (line {requirement.span.line})" if requirement.span is not None else ""
                raise ArgumentError(
                    f"{self.name}: with {_sizes_text(sizes)}, {requirement.message}{where}; here it is {value}"
                )
        shapes = {}
        for t in self.program.outputs + self.program.temporaries:
            shape = tuple(fn(sizes) for fn in self._shape_fns[t.name])
            for d, extent in enumerate(shape):
                if extent < 0:
                    raise ArgumentError(
                        f"{self.name}: {t.role} {t.name} dimension {d} would have negative size {extent} "
                        f"({t.shape[d]} with {_sizes_text(sizes)})"
                    )
            shapes[t.name] = shape
        args_.check_allocation_sizes(self.program, shapes, _sizes_text(sizes))
        return shapes

    def _run(self, spec: Specialisation, storage: dict[str, np.ndarray], buffers) -> None:
        # contracted temporaries have no storage of their own: their slots point into a workspace
        addresses = [storage[n].ctypes.data if n in storage else 0 for n in spec.layout.tensors]
        slots = spec.workspace_slots
        arrays = {}  # keeps each pointer array alive during the call

        def buffers_for(workspace: int) -> int:
            if workspace not in arrays:
                own = list(addresses)
                for index, offset in slots:  # contracted temporaries: this thread's slices
                    own[index] = workspace + offset
                arrays[workspace] = (ctypes.c_void_p * max(1, len(own)))(*own)
            return ctypes.addressof(arrays[workspace])

        threads = self.options.thread_count()
        code, error = run_phases(
            spec.code.entry, buffers_for, spec.params_address, spec.plans, threads, spec.workspaces
        )
        if code != 0:
            raise self._runtime_error(int(code), error)

    def _runtime_error(self, code: int, error: np.ndarray) -> ArgumentError:
        if code == ERROR_INDEX:
            check = self.scop.checks[int(error[1])]
            dim, value = int(error[2]), int(error[3])
            stmt = self.scop.statement(check.statement).statement
            where = _statement_location(stmt)
            access = _source_text(check.read) if check.read is not None else f"{check.tensor} (write)"
            return ArgumentError(
                f"{self.name}: index {value} out of range for dimension {dim} of {check.tensor} "
                f"in {access}{where}; generated code never accesses out of bounds, so the call was stopped"
            )
        if code == ERROR_DIVISION:
            stmt = self.program.statements[int(error[1])]
            return ArgumentError(
                f"{self.name}: integer division by zero in statement {stmt.tensor}{_statement_location(stmt)}"
            )
        return ArgumentError(f"{self.name}: kernel failed with code {code}")

    def _specialisation(self, sizes: Mapping[str, int]) -> Specialisation:
        key = tuple(sizes[s.name] for s in self.program.sizes)
        spec = self._cache.get(key)
        if spec is not None:
            return spec
        with self._lock:
            spec = self._cache.get(key)
            if spec is None:
                self._check_preconditions(sizes)
                spec = self._build(sizes)
                self._cache[key] = spec
        return spec

    def _param_values(self, sizes: Mapping[str, int]) -> dict[str, int]:
        values = self.scop.params.values(sizes)
        for t in self.program.tensors:
            for d, fn in enumerate(self._shape_fns[t.name]):
                values[f"{t.name}.{d}"] = fn(sizes)
        return values

    def _build(self, sizes: Mapping[str, int]) -> Specialisation:
        values = self._param_values(sizes)
        if not self.options.specialize:
            return self._generic_for(sizes, values)
        try:
            scop, schedule, plans = self.scop, self.schedule, {}
            if self.options.optimize and self.options.specialize:
                scop, plans = plan_contractions(self.scop, sizes)
                if plans:  # contractions run as GEMM calls: schedule the remaining loops
                    schedule = self._contraction_schedule(scop, plans)
            ast = build_ast(schedule, sizes if self.options.specialize else None, footprints=self._prefetch)
            gemm_bytes = max((workspace_bytes(self._dtype(p.c.tensor)) for p in plans.values()), default=0)
            contracted, layouts, sharing = {}, {}, {}
            if self.options.optimize and self.options.specialize:
                shapes = {**self._shapes(sizes), **self._input_shapes(sizes)}
                contracted = plan_storage(scop, ast, shapes, plans, gemm_bytes)
                layouts = plan_layouts(self.program, plans, shapes)
                sharing = plan_buffer_sharing(scop, ast, shapes, set(contracted))
            pipelines = self._pipelines(scop, ast, values, contracted, plans)
            module, layout = lower_to_llvm(
                scop,
                ast,
                values if self.options.specialize else None,
                self.options.fast_math,
                plans,
                contracted,
                layouts,
                self._prefetch,
                pipelines,
            )
            for plan in plans.values():  # GEMM bodies are compiled once per process and linked
                shared_gemm(self.program.tensor(plan.c.tensor).dtype.numpy_name)
            code = jit(module, vectorize=self.options.vectorize)
        except (isl.Error, RuntimeError) as exc:  # isl or LLVM failures are our bugs, not the user's
            raise TensorLangError(
                f"{self.name}: internal compiler error while generating code: {exc}"
            ) from exc
        self.compile_count += 1
        params = np.array([values[p] for p in layout.params] or [0], dtype=np.int64)
        workspaces = Workspaces(workspace_end(contracted, gemm_bytes))
        phase_plans = self._phase_plans(scop, ast, values, sizes, plans)
        return Specialisation(code, layout, params, phase_plans, workspaces, contracted, layouts, sharing)

    def _input_shapes(self, sizes: Mapping[str, int]) -> dict[str, tuple[int, ...]]:
        return {t.name: tuple(fn(sizes) for fn in self._shape_fns[t.name]) for t in self.program.inputs}

    def _dtype(self, tensor: str) -> str:
        return self.program.tensor(tensor).dtype.numpy_name

    def _generic_for(self, sizes: Mapping[str, int], values: Mapping[str, int]) -> Specialisation:
        """Options(specialize=False): one parametric kernel, compiled once, run with each call's sizes."""
        if self._generic is None:
            try:
                ast = build_ast(self.schedule, None, footprints=self._prefetch)
                module, layout = lower_to_llvm(
                    self.scop, ast, None, self.options.fast_math, prefetch=self._prefetch
                )
                code = jit(module, vectorize=self.options.vectorize)
            except (isl.Error, RuntimeError) as exc:
                raise TensorLangError(
                    f"{self.name}: internal compiler error while generating code: {exc}"
                ) from exc
            self.compile_count += 1
            self._generic = (ast, code, layout)
        ast, code, layout = self._generic
        params = np.array([values[p] for p in layout.params] or [0], dtype=np.int64)
        plans = self._phase_plans(self.scop, ast, values, sizes, {})
        return Specialisation(code, layout, params, plans, Workspaces(0), {}, {}, {})

    def _contraction_schedule(self, scop: Scop, plans) -> Schedule:
        key = tuple(sorted((name, p.m, p.n, p.k) for name, p in plans.items()))
        schedule = self._schedules.get(key)
        if schedule is None:
            schedule = compute_schedule(scop, self.options)
            self._schedules[key] = schedule
        return schedule

    def _pipelines(self, scop: Scop, ast: LoopAst, values, contracted, plans) -> dict[int, PipelinePlan]:
        """Phases to row-pipeline (specialised sizes only). Threads that split the outer loop each
        pipeline their own rows."""
        options = self.options
        if not (options.optimize and options.specialize and options.pipeline):
            return {}
        dims = {name: c.dim for name, c in contracted.items()}
        found = {}
        for n, phase in enumerate(ast.phases):
            plan = plan_pipeline(scop, ast, phase, values, dims, set(plans))
            if plan is not None:
                found[n] = plan
        return found

    def _phase_plans(self, scop: Scop, ast: LoopAst, values, sizes, plans) -> tuple[PhasePlan, ...]:
        result = []
        for n, phase in enumerate(ast.phases):
            work = 0
            for name in phase.statements:
                stmt = scop.statement(name)
                st = stmt.statement
                ranges = st.ranges if stmt.kind == "body" else st.ranges[: len(st.indices)]
                points = 1
                for r in ranges:
                    points *= max(0, compile_size_expr(r.hi)(sizes) - compile_size_expr(r.lo)(sizes))
                # a GEMM multiply-add costs a few hundredths of a simple loop instance
                work += points // 32 if name in plans else points
            span = loop_range(phase.loop, values) if phase.loop is not None else None
            gemm = gemm_phase(phase, plans)
            if gemm is not None:  # split the rows of the one GEMM among threads
                r = scop.statement(gemm.statement).statement.range_of(gemm.m)
                span = (compile_size_expr(r.lo)(sizes), compile_size_expr(r.hi)(sizes), 1)
            result.append(PhasePlan(n, span, work))
        return tuple(result)

    def _check_preconditions(self, sizes: Mapping[str, int]) -> None:
        """Accesses proved in bounds only for some sizes: reject the sizes that break them."""
        fixed = None
        for check in self.scop.checks:
            if check.violation is None:
                continue
            fixed = fixed if fixed is not None else self.scop.params.fixed_context(sizes)
            if not check.violation.intersect(fixed).is_empty():
                stmt = self.scop.statement(check.statement).statement
                access = (
                    _source_text(check.read) if check.read is not None else f"the write of {check.tensor}"
                )
                shape = self._describe_tensor(check.tensor, sizes)
                raise ArgumentError(
                    f"{self.name}: with {_sizes_text(sizes)}, {access} would access {check.tensor} "
                    f"out of bounds ({shape}){_statement_location(stmt)}"
                )

    def _describe_tensor(self, name: str, sizes: Mapping[str, int]) -> str:
        shape = tuple(fn(sizes) for fn in self._shape_fns[name])
        return f"{name} has shape {shape}"

    # ------------------------------------------------------------------ inspection

    def inspect(self, stage: str, sizes: Mapping[str, int] | None = None) -> str:
        """The text of one compilation stage; with `sizes`, of the code specialised to them."""
        if stage not in STAGES:
            raise TensorLangError(f"unknown stage {stage!r}; stages are {', '.join(STAGES)}")
        if sizes is not None:
            missing = [s.name for s in self.program.sizes if s.name not in sizes]
            if missing:
                raise TensorLangError(f"inspect: sizes= lacks {', '.join(missing)}")
        if stage == "ast":
            return self._syntax_text
        if stage == "ir":
            return str(self.program)
        if stage == "scop":
            return str(self.scop)
        if stage == "deps":
            return str(self.scop.dependences)
        if stage == "schedule":
            return str(self.schedule)
        if stage == "graph":
            return self.schedule.graph_text()
        ast = build_ast(self.schedule, sizes, footprints=self._prefetch)
        scop, plans = self.scop, {}
        if sizes is not None and self.options.optimize and self.options.specialize:
            scop, plans = plan_contractions(self.scop, sizes)
            if plans:
                ast = build_ast(self._contraction_schedule(scop, plans), sizes, footprints=self._prefetch)
        contracted, layouts = {}, {}
        if sizes is not None and self.options.optimize and self.options.specialize:
            gemm_bytes = max((workspace_bytes(self._dtype(p.c.tensor)) for p in plans.values()), default=0)
            shapes = self._shapes(sizes)
            contracted = plan_storage(scop, ast, shapes, plans, gemm_bytes)
            layouts = plan_layouts(self.program, plans, {**shapes, **self._input_shapes(sizes)})
        values = self._param_values(sizes) if sizes is not None else None
        pipelines = self._pipelines(scop, ast, values, contracted, plans) if values is not None else {}
        if stage == "loops":
            prefetch = {}
            if self._prefetch:
                excluded = set(contracted) | set(layouts)
                specialised = values if self.options.specialize else None
                for phase in ast.phases:
                    fetched = prefetched_footprints(phase, self.program, plans, excluded, specialised)
                    if fetched and phase.outer is not None:
                        prefetch[phase.outer.get_annotation().get_name()] = tuple(f.tensor for f in fetched)
            pipelined = {ast.phases[n].outer.get_annotation().get_name() for n in pipelines}
            text = loops_text(scop, ast, plans, prefetch, pipelined)
            report = storage_report(contracted)
            return f"{report}\n{text}" if report else text
        module, _ = lower_to_llvm(
            scop, ast, values, self.options.fast_math, plans, contracted, layouts, self._prefetch, pipelines
        )
        if stage == "llvm":
            return str(optimise(module, vectorize=self.options.vectorize))
        return assembly_of(module)


def _source_text(read: ir.Read) -> str:
    """An access as the user would write it: `A(i * i)` rather than `A((i * i))`."""

    def bare(e: ir.Expr) -> str:
        text = str(e)
        return text[1:-1] if isinstance(e, ir.Binary) and e.op not in ("min", "max") else text

    return f"{read.tensor}({', '.join(bare(i) for i in read.indices)})" if read.indices else read.tensor


def _sizes_text(sizes: Mapping[str, int]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sizes.items()) or "no sizes"


def _statement_location(stmt: ir.Statement) -> str:
    if stmt.span is None:
        return ""
    line = stmt.span.source.line_text(stmt.span.line).strip()
    return f" (line {stmt.span.line}: {line})"
