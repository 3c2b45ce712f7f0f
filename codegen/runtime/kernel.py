"""runtime: Schedule → Kernel, a callable on NumPy arrays that JIT-compiles per set of sizes."""

from __future__ import annotations

import ctypes
import functools
import threading
import warnings
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass

import islpy as isl
import numpy as np

from polyhedral import Scop
from polyhedral.sizes import compile_size_expr
from scheduler import Schedule
from tensorlang import ir
from tensorlang.errors import ArgumentError, TensorLangError, TensorLangWarning

from ..lowering.abi import ERROR_DIVISION, ERROR_INDEX, KernelLayout
from ..lowering.build import build
from ..lowering.jit import MachineCode, assembly_of, optimise
from ..lowering.lower import lower_to_llvm
from ..options import Options
from ..planning.plan import KernelPlan, PhasePlan, param_values, plan_kernel
from ..planning.storage import ContractedTemporary
from . import arguments as args_
from .parallel import Workspaces, renew_after_fork, run_phases

STAGES = ("ast", "ir", "scop", "deps", "graph", "schedule", "plan", "loops", "llvm", "asm")


@dataclass
class Specialisation:
    """Machine code for one set of sizes, with the parameter values it was built for."""

    plan: KernelPlan
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
    """A compiled def. Call it with the inputs (NumPy arrays) in the def's order.

    Ctrl-C during a call raises KeyboardInterrupt only once no thread runs the kernel any more,
    a millisecond or two after the signal for long calls; a short call (below parallel.WATCHED_WORK,
    run on the calling thread) delivers it when it returns (codegen/runtime/parallel.py). No result is returned; an `out=` array the
    kernel writes in place (one usable directly) may then hold a partial result, one it
    would have copied into at the end keeps its old values; nothing is written afterwards.
    """

    def __init__(
        self,
        program: ir.Program,
        schedule: Schedule,
        options: Options,
        syntax_text: str,
        source: str | None = None,
        filename: str = "<source>",
    ):
        self.program = program
        self.schedule = schedule
        self.scop: Scop = schedule.scop
        self.options = options
        self._syntax_text = syntax_text
        self.source = source  # the text compiled (tl.compile keeps it): what a pickle carries
        self.filename = filename
        self._shape_fns = {t.name: tuple(compile_size_expr(d) for d in t.shape) for t in program.tensors}
        self._input_dims = args_.input_dims(program)
        # tensors a `+=`-without-`!` accumulates into first: they start from zeros (or out=)
        self._uninitialised = frozenset(st.tensor for st in program.statements if st.uninitialized)
        self._requirements = tuple((compile_size_expr(r.expr), r) for r in program.requirements)
        # per set of sizes, least recently called first; at most options.max_specializations each
        self._cache: OrderedDict[tuple[int, ...], Specialisation] = OrderedDict()
        self._shape_cache: OrderedDict[tuple[int, ...], dict[str, tuple[int, ...]]] = OrderedDict()
        self._reschedules: dict[tuple, Schedule] = {}  # schedules after contraction planning
        self._generic = None  # (plan, machine code, layout) of the parametric kernel
        self._lock = threading.Lock()  # held while building a specialisation
        self._cache_lock = threading.Lock()  # held briefly for the two caches' bookkeeping
        renew_after_fork(self)
        self.compile_count = 0  # specialisations built so far (observable cache behaviour)
        self.disk_hits = 0  # of those, how many were loaded from the disk cache

    def after_fork(self) -> None:
        """In a forked child: fresh locks (another thread of the parent may have held them)."""
        self._lock = threading.Lock()
        self._cache_lock = threading.Lock()

    def __reduce__(self):
        """Pickled as source, name, options and filename, never machine code, locks or caches:
        unpickling compiles again (in a child process of a pool, say)."""
        if self.source is None:
            raise TypeError(f"{self!r} cannot be pickled: it was not made by tl.compile (no source text)")
        from ..driver import unpickle_kernel

        return unpickle_kernel, (self.source, self.name, self.options, self.filename)

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
        shapes = self._recall(self._shape_cache, key)
        if shapes is not None:
            return shapes
        shapes = self._compute_shapes(sizes)
        with self._cache_lock:
            self._remember(self._shape_cache, key, shapes)
        return shapes

    def _recall(self, cache: OrderedDict, key: tuple[int, ...]):
        """The cached entry (now the most recently used), or None."""
        with self._cache_lock:
            value = cache.get(key)
            if value is not None:
                cache.move_to_end(key)
            return value

    def _remember(self, cache: OrderedDict, key: tuple[int, ...], value) -> None:
        """Add the most recently used entry; past the bound, forget the least recently used. An
        evicted Specialisation's machine code is freed when the last call using it lets go of it."""
        cache[key] = value
        cache.move_to_end(key)
        while len(cache) > self.options.max_specializations:
            cache.popitem(last=False)

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
        spec = self._recall(self._cache, key)
        if spec is not None:
            return spec
        with self._lock:  # one build at a time; calls of cached sizes go on meanwhile
            with self._cache_lock:
                spec = self._cache.get(key)
            if spec is None:
                self._check_preconditions(sizes)
                spec = self._build(sizes)
                with self._cache_lock:
                    self._remember(self._cache, key, spec)
        return spec

    def _plan(self, sizes: Mapping[str, int] | None) -> KernelPlan:
        """The plan of the code that runs for these sizes: specialised to them, or the generic
        plan when `Options(specialize=False)` (or no sizes) — the build path and inspect alike."""
        sizes = sizes if self.options.specialize else None
        try:
            return plan_kernel(self.schedule, self.options.codegen, sizes, self._reschedules)
        except isl.Error as exc:  # isl failures are our bugs, not the user's
            raise TensorLangError(f"{self.name}: internal compiler error while planning: {exc}") from exc

    def _compiled(self, plan: KernelPlan) -> tuple[MachineCode, KernelLayout]:
        """Machine code for a plan: from the disk cache (codegen/lowering/disk_cache.py) or
        generated. Either way `compile_count` counts it (machine code obtained for a plan, the
        observable behaviour of the in-memory caches); `disk_hits` counts those loaded from disk."""
        try:
            code, layout, hit = build(plan)
        except (isl.Error, RuntimeError) as exc:  # isl or LLVM failures are our bugs, not the user's
            raise TensorLangError(
                f"{self.name}: internal compiler error while generating code: {exc}"
            ) from exc
        self.compile_count += 1
        self.disk_hits += hit
        return code, layout

    def _build(self, sizes: Mapping[str, int]) -> Specialisation:
        values = param_values(self.scop, sizes)
        if self.options.specialize:
            plan = self._plan(sizes)
            code, layout = self._compiled(plan)
        else:  # one parametric kernel, compiled once, run with each call's sizes
            if self._generic is None:
                plan = self._plan(None)
                self._generic = (plan, *self._compiled(plan))
            plan, code, layout = self._generic
        params = np.array([values[p] for p in layout.params] or [0], dtype=np.int64)
        return Specialisation(
            plan,
            code,
            layout,
            params,
            plan.phase_runs(sizes, values),
            Workspaces(plan.workspace_bytes),
            plan.contracted,
            plan.layouts,
            plan.sharing,
        )

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
            self._shapes(sizes)  # sizes the call would reject (ArgumentError) are not planned either
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
        plan = self._plan(sizes)
        if stage == "plan":
            return str(plan)
        if stage == "loops":
            return plan.loops()
        module, _ = lower_to_llvm(plan)
        if stage == "llvm":
            return str(optimise(module, vectorize=plan.vectorize))
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
