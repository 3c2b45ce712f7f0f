"""runtime: Schedule → Kernel, a callable on NumPy arrays that JIT-compiles per set of sizes."""

from __future__ import annotations

import ctypes
import functools
import threading
import warnings
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from tensorlang.errors import ArgumentError, TensorLangError, TensorLangWarning

from ..options import Options
from . import arguments as args_
from . import fastcall, inspection, messages, scratch, specialise, warm
from .inspection import STAGES  # noqa: F401 (the stage names, public here since 0.1)
from .interface import Interface, interface_of
from .parallel import renew_after_fork, run_phases
from .specialise import Specialisation

# The stages' modules (islpy, sympy, LLVM IR) are imported where they are used: a Kernel made
# from the disk cache's records (runtime/warm.py) runs its calls without them.
if TYPE_CHECKING:
    from polyhedral import Scop
    from scheduler import Schedule
    from tensorlang import ir

    from ..lowering.jit import MachineCode
    from ..planning.plan import KernelPlan


@dataclass(frozen=True)
class Stages:
    """The compiled stages of a def: what planning, inspection and error messages read."""

    program: ir.Program
    schedule: Schedule
    syntax_text: str  # the def's syntax tree, printed (inspect("ast"))


class Kernel:
    """A compiled def. Call it with the inputs (NumPy arrays) in the def's order.

    Ctrl-C during a call raises KeyboardInterrupt only once no thread runs the kernel any more,
    a millisecond or two after the signal for long calls; a short call (below parallel.WATCHED_WORK
    instances, or one whose sizes' last call took under parallel.WATCH_AFTER_S: run on the
    calling thread) delivers it when it returns (codegen/runtime/parallel.py). No result is returned; an `out=` array the
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
        self._setup(interface_of(program), options, source, filename)
        self._stages: Stages | None = Stages(program, schedule, syntax_text)

    @classmethod
    def from_records(
        cls, interface: Interface, options: Options, source: str, filename: str, program_key: str
    ) -> Kernel:
        """A Kernel of a program compiled in an earlier process (warm.ProgramRecord): its stages
        run only when something needs them (sizes without a call record, inspect, an error)."""
        kernel = cls.__new__(cls)
        kernel._setup(interface, options, source, filename)
        kernel._stages = None
        kernel.program_key = program_key
        return kernel

    def _setup(self, interface: Interface, options: Options, source: str | None, filename: str) -> None:
        self.interface = interface
        self.options = options
        self.source = source  # the text compiled (tl.compile keeps it): what a pickle carries
        self.filename = filename
        # the key of this def's program record (tl.compile with the cache on): calls then store
        # and look up call records (runtime/warm.py)
        self.program_key: str | None = None
        self._input_dims = interface.input_dims
        # tensors a `+=`-without-`!` accumulates into first: they start from zeros (or out=)
        self._uninitialised = interface.uninitialised
        self._pending_calls: dict[tuple[int, ...], warm.CallRecord] = {}  # loaded, not yet used
        # input shapes → the few steps a repeated call of a small kernel needs (runtime/fastcall.py);
        # read without a lock: single dict operations are atomic, and eviction replaces the dict
        self._fast: dict[tuple, fastcall.FastCall] = {}
        self._native: fastcall.FastCall | None = None  # the one whose NativeCall ran last
        self._input_dtypes = tuple(np.dtype(t.dtype.numpy_name) for t in interface.inputs)
        self._warm_objects: dict[str, MachineCode] = {}  # generic code shared by call records
        # per set of sizes, least recently called first; at most options.max_specializations each
        self._cache: OrderedDict[tuple[int, ...], Specialisation] = OrderedDict()
        # the key a fast call last moved to _cache's end (no move while it is; other moves forget it)
        self._newest: tuple[int, ...] | None = None
        self._shape_cache: OrderedDict[tuple[int, ...], dict[str, tuple[int, ...]]] = OrderedDict()
        self._reschedules: dict[tuple, Schedule] = {}  # schedules after contraction planning
        self._tuned: dict[tuple[int, ...], tuple | None] = {}  # sizes → tuning record (see _tuned_options)
        self._generic = None  # (plan, build.Built) of the parametric kernel
        self._lock = threading.Lock()  # held while building a specialisation
        self._cache_lock = threading.Lock()  # held briefly for the two caches' bookkeeping
        self._stages_lock = threading.Lock()  # held while running the stages a warm Kernel skipped
        renew_after_fork(self)
        self.compile_count = 0  # specialisations built so far (observable cache behaviour)
        self.disk_hits = 0  # of those, how many were loaded from the disk cache

    def after_fork(self) -> None:
        """In a forked child: fresh locks (another thread of the parent may have held them)."""
        self._lock = threading.Lock()
        self._cache_lock = threading.Lock()
        self._stages_lock = threading.Lock()

    # ------------------------------------------------------------------ the compiled stages

    def _compiled_stages(self) -> Stages:
        stages = self._stages
        if stages is None:
            with self._stages_lock:
                if self._stages is None:
                    from ..driver import run_stages

                    with warnings.catch_warnings():  # given when the program was first compiled
                        warnings.simplefilter("ignore", TensorLangWarning)
                        self._stages = Stages(
                            *run_stages(self.source, self.name, self.options, self.filename)
                        )
                stages = self._stages
        return stages

    @property
    def program(self) -> ir.Program:
        return self._compiled_stages().program

    @property
    def schedule(self) -> Schedule:
        return self._compiled_stages().schedule

    @property
    def scop(self) -> Scop:
        return self._compiled_stages().schedule.scop

    @functools.cached_property
    def _shape_fns(self):
        from polyhedral.sizes import compile_size_expr

        return {t.name: tuple(compile_size_expr(d) for d in t.shape) for t in self.program.tensors}

    @functools.cached_property
    def _requirements(self):
        from polyhedral.sizes import compile_size_expr

        return tuple((compile_size_expr(r.expr), r) for r in self.program.requirements)

    def __reduce__(self):
        """Pickled as source, name, options and filename, never machine code, locks or caches:
        unpickling compiles again (in a child process of a pool, say)."""
        if self.source is None:
            raise TypeError(f"{self!r} cannot be pickled: it was not made by tl.compile (no source text)")
        from ..driver import unpickle_kernel

        return unpickle_kernel, (self.source, self.name, self.options, self.filename)

    @property
    def name(self) -> str:
        return self.interface.name

    def __repr__(self) -> str:
        ins = ", ".join(str(t) for t in self.interface.inputs)
        outs = ", ".join(t.name for t in self.interface.outputs)
        return f"<tensorlang.Kernel {self.name}({ins}) -> ({outs})>"

    # ------------------------------------------------------------------ calling

    def __call__(self, *inputs: object, out: object = None, **keyword_sizes: int):
        """Run the kernel: inputs in def order; a size that no input's shape gives (a time step
        count, say) by keyword, `k(A, T=100)`; `out=` as documented in the README."""
        fast = None if keyword_sizes else self._native  # the last signature, checked natively
        ran = fast.native.run(inputs, out) if fast is not None else None
        if ran is None:
            key = fastcall.signature(inputs, self._input_dtypes)
            fast = self._fast.get(fastcall.keyed(key, keyword_sizes) if keyword_sizes else key)
            ran = fast.run(inputs, out, self.options.thread_count) if fast is not None else None
            if not keyword_sizes:
                self._native = fast if ran is not None and fast.native is not None else self._native
        if ran is not None:  # a signature that passed every check before: few steps
            if fast.sizes is not self._newest:  # a call keeps its machine code the most recently used
                with self._cache_lock:
                    if fast.sizes in self._cache:
                        self._cache.move_to_end(fast.sizes)
                        self._newest = fast.sizes
            code, error, result = ran
            if code != 0:
                raise self._runtime_error(int(code), error)
            return result
        program = self.interface
        if len(inputs) != len(program.inputs):
            names = ", ".join(t.name for t in program.inputs)
            raise ArgumentError(
                f"{program.name}: expected {len(program.inputs)} inputs ({names}) but found {len(inputs)}"
            )
        arrays = [args_.as_input_array(v, t, program) for v, t in zip(inputs, program.inputs)]
        sizes = args_.bind_keyword_sizes(
            program, args_.bind_sizes(program, arrays, self._input_dims), keyword_sizes
        )
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
        shared_views = specialise.shared_views(spec, self.interface, shapes)
        idle, keep = spec.scratch.take(), {}
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
            shape, dtype = spec.storage_shape(t.name, shapes[t.name]), np.dtype(t.dtype.numpy_name)
            zeroed = t.name in self._uninitialised
            if t.role != "output" and scratch.kept(shape, dtype):
                storage[t.name] = keep[t.name] = scratch.buffer(idle, t.name, shape, dtype, zeroed)
                continue
            storage[t.name] = (np.zeros if zeroed else np.empty)(shape, dtype=dtype)
        self._run(spec, storage, buffers)
        spec.scratch.give_back(keep)
        for buf in buffers.values():
            if buf.target is not None:
                buf.target[...] = buf.work
        results = tuple(
            buffers[t.name].target
            if t.name in buffers and buffers[t.name].target is not None
            else storage[t.name]
            for t in program.outputs
        )
        signature = fastcall.signature(inputs, self._input_dtypes)
        key = fastcall.keyed(signature, keyword_sizes) if keyword_sizes else signature
        if key is not None and all(a is v for a, v in zip(arrays, inputs) if type(v) is np.ndarray):
            fast = fastcall.for_call(spec, program, sizes, shapes, signature, self.options.thread_count)
            with self._cache_lock:
                if fast is not None and any(s is spec for s in self._cache.values()):  # not evicted
                    self._fast[key] = fast
        return results[0] if len(results) == 1 else results

    # ------------------------------------------------------------------ shapes without a call

    def output_shapes(self, *input_shapes: tuple[int, ...]) -> tuple[tuple[int, ...], ...]:
        """The outputs' shapes, in the def's order, for inputs of these shapes: sizes bound and
        checked as a call binds them, nothing compiled or allocated (tensorlang.torch's fake kernels)."""
        shapes = self._shapes(args_.sizes_of_shapes(self.interface, input_shapes, self._input_dims))
        return tuple(shapes[t.name] for t in self.interface.outputs)

    def _shapes(self, sizes: Mapping[str, int]) -> dict[str, tuple[int, ...]]:
        """Output and temporary shapes for these sizes, after checking the call-time requirements
        (cached per set of sizes: only sizes that passed are cached)."""
        key = tuple(sizes[s] for s in self.interface.sizes)
        shapes = self._recall(self._shape_cache, key)
        if shapes is not None:
            return shapes
        record = self._call_record(key, sizes)
        shapes = dict(record.shapes) if record is not None else self._compute_shapes(sizes)
        with self._cache_lock:
            self._remember(self._shape_cache, key, shapes)
        return shapes

    def _recall(self, cache: OrderedDict, key: tuple[int, ...]):
        """The cached entry (now the most recently used), or None."""
        with self._cache_lock:
            value = cache.get(key)
            if value is not None:
                cache.move_to_end(key)
                self._newest = None
            return value

    def _remember(self, cache: OrderedDict, key: tuple[int, ...], value) -> None:
        """Add the most recently used entry; past the bound, forget the least recently used. An
        evicted Specialisation's machine code is freed when the last call using it lets go of it."""
        cache[key] = value
        cache.move_to_end(key)
        self._newest = None
        while len(cache) > self.options.max_specializations:
            _, evicted = cache.popitem(last=False)
            # a fast path must not keep evicted machine code alive (called with the lock held)
            self._fast = {k: f for k, f in self._fast.items() if f.spec is not evicted}
            self._native = None

    def _compute_shapes(self, sizes: Mapping[str, int]) -> dict[str, tuple[int, ...]]:
        return args_.shapes_for_sizes(self.name, self.program, self._requirements, self._shape_fns, sizes)

    def _run(self, spec: Specialisation, storage: dict[str, np.ndarray], buffers) -> None:
        # contracted temporaries have no storage of their own: their slots point into a workspace
        addresses = [storage[n].ctypes.data if n in storage else 0 for n in spec.buffers]
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
            spec.code.entry,
            buffers_for,
            spec.params_address,
            spec.plans,
            threads,
            spec.workspaces,
            spec.clock,
        )
        if code != 0:
            raise self._runtime_error(int(code), error)

    def _runtime_error(self, code: int, error: np.ndarray) -> ArgumentError:
        return messages.runtime_error(self.name, self.scop, code, error)

    def _specialisation(self, sizes: Mapping[str, int]) -> Specialisation:
        key = tuple(sizes[s] for s in self.interface.sizes)
        spec = self._recall(self._cache, key)
        if spec is not None:
            return spec
        with self._lock:  # one build at a time; calls of cached sizes go on meanwhile
            with self._cache_lock:
                spec = self._cache.get(key)
            if spec is None:
                spec = self._recorded_specialisation(key, sizes)
            if spec is None:
                self._check_preconditions(sizes)
                spec = self._build(sizes, key)
            with self._cache_lock:
                self._remember(self._cache, key, spec)
        return spec

    def _call_record(self, key: tuple[int, ...], sizes: Mapping[str, int]) -> warm.CallRecord | None:
        """The call record of these sizes from an earlier process (kept until its specialisation
        is made), or None."""
        if self.program_key is None:
            return None
        with self._cache_lock:
            record = self._pending_calls.get(key)
        if record is None:
            record = warm.load_call(self._call_key(key, sizes), self.interface, sizes)
            if record is not None:
                with self._cache_lock:
                    self._pending_calls[key] = record
        return record

    def _recorded_specialisation(
        self, key: tuple[int, ...], sizes: Mapping[str, int]
    ) -> Specialisation | None:
        """The specialisation of a call record and its object code, both from the disk cache,
        without the front end or planning; None when either is missing or unusable."""
        record = self._call_record(key, sizes)
        if record is None:
            return None
        with self._cache_lock:
            self._pending_calls.pop(key, None)
        code = self._warm_objects.get(record.object_key)
        if code is None:
            code = specialise.recorded_code(record, functools.partial(self._optimised_ir, dict(sizes)))
            if code is None:
                return None
            if not self.options.specialize:  # one generic object serves every call record
                self._warm_objects[record.object_key] = code
        self.compile_count += 1
        self.disk_hits += 1
        return specialise.from_record(record, code)

    def _optimised_ir(self, sizes: Mapping[str, int]) -> str:
        """The optimised module of the code that runs for these sizes (inspection of a cache hit)."""
        from ..lowering.build import optimised_text

        return optimised_text(self._plan(sizes))

    def _plan(self, sizes: Mapping[str, int] | None) -> KernelPlan:
        """The plan of the code that runs for these sizes: specialised to them, or the generic
        plan when `Options(specialize=False)` (or no sizes) — the build path and inspect alike."""
        import islpy as isl

        from ..planning.plan import plan_kernel

        sizes = sizes if self.options.specialize else None
        schedule, codegen, reschedules = self.schedule, self.options.codegen, self._reschedules
        tuned = self._tuned_options(sizes)
        if tuned is not None:
            schedule, codegen, reschedules = tuned[1:]
        try:
            return plan_kernel(schedule, codegen, sizes, reschedules)
        except isl.Error as exc:  # isl failures are our bugs, not the user's
            raise TensorLangError(f"{self.name}: internal compiler error while planning: {exc}") from exc

    # ------------------------------------------------------------------ tuning hook (codegen/tune)

    def _tuned_options(self, sizes: Mapping[str, int] | None) -> tuple | None:
        """The tuning database's best record for these sizes (codegen/tune/lookup.py), looked up
        once per set of sizes: (record id, schedule, CodegenOptions, reschedules) to plan with, or
        None (no record, Options(tuned=False), knobs the user set, no sizes)."""
        if sizes is None:
            return None
        key = tuple(sizes[s] for s in self.interface.sizes)
        if key not in self._tuned:
            from ..tune.lookup import tuned_record

            found = tuned_record(self.source, self.name, self.options, sizes, self._input_dtypes)
            if found is not None:
                record, options = found
                schedule, reschedules = self.schedule, self._reschedules
                if options.schedule != self.options.schedule:
                    from scheduler import compute_schedule

                    schedule, reschedules = compute_schedule(self.scop, options.schedule), {}
                found = (record, schedule, options.codegen, reschedules)
            self._tuned[key] = found
        return self._tuned[key]

    def _call_key(self, key: tuple[int, ...], sizes: Mapping[str, int]) -> str:
        """The call record's key: a tuned record's id is part of it, so code planned with other
        options (before tuning, or with another record) is never loaded for these sizes."""
        tuned = self._tuned_options(sizes) if self.options.specialize else None
        program = self.program_key if tuned is None else f"{self.program_key}+tuned:{tuned[0]}"
        return warm.call_key(program, key)

    def _compiled(self, plan: KernelPlan):
        """Machine code for a plan: from the disk cache (codegen/lowering/disk_cache.py) or
        generated, with its layout and disk-cache key. Either way `compile_count` counts it
        (machine code obtained for a plan, the observable behaviour of the in-memory caches);
        `disk_hits` counts those loaded from disk."""
        import islpy as isl

        from ..lowering.build import build

        try:
            built = build(plan)
        except (isl.Error, RuntimeError) as exc:  # isl or LLVM failures are our bugs, not the user's
            raise TensorLangError(
                f"{self.name}: internal compiler error while generating code: {exc}"
            ) from exc
        self.compile_count += 1
        self.disk_hits += built.from_disk
        return built

    def _build(self, sizes: Mapping[str, int], key: tuple[int, ...]) -> Specialisation:
        from ..planning.plan import param_values

        values = param_values(self.scop, sizes)
        if self.options.specialize:
            plan = self._plan(sizes)
            built = self._compiled(plan)
        else:  # one parametric kernel, compiled once, run with each call's sizes
            if self._generic is None:
                plan = self._plan(None)
                self._generic = (plan, self._compiled(plan))
            plan, built = self._generic
        record = specialise.call_record(plan, built, sizes, values, self._shapes(sizes))
        if self.program_key is not None:
            warm.store_call(self._call_key(key, sizes), record)
        return specialise.from_record(record, built.code)

    def _check_preconditions(self, sizes: Mapping[str, int]) -> None:
        """Accesses proved in bounds only for some sizes: reject the sizes that break them."""
        messages.check_preconditions(self.name, self.scop, sizes, self._describe_tensor)

    def _describe_tensor(self, name: str, sizes: Mapping[str, int]) -> str:
        shape = tuple(fn(sizes) for fn in self._shape_fns[name])
        return f"{name} has shape {shape}"

    # ------------------------------------------------------------------ inspection

    def inspect(self, stage: str, sizes: Mapping[str, int] | None = None) -> str:
        """The text of one compilation stage; with `sizes`, of the code specialised to them."""
        return inspection.stage_text(self, stage, sizes)
