"""gpu: compiled stages (Program, Schedule) → CudaKernel, what tl.compile(..., target="cuda") returns.

A CudaKernel inspects every stage (`ast` … `plan`, `loops`, `llvm` for the NVPTX module, `ptx`),
plans per set of sizes like the CPU Kernel, and pickles as its source. Calling it runs the PTX
through the CUDA driver (gpu/calling.py, gpu/runtime.py); without cuda-bindings, a driver or a
GPU, a call raises a TensorLangError that says which is missing.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Mapping
from dataclasses import dataclass

from tensorlang.errors import TensorLangError

from ..options import Options
from ..runtime.interface import interface_of
from .ptx import DEFAULT_ARCH, check_arch

STAGES = ("ast", "ir", "scop", "deps", "graph", "schedule", "plan", "loops", "llvm", "ptx")


@dataclass(frozen=True)
class CudaSpecialisation:
    """One set of sizes on one architecture: the PTX, the layout's tensor order (the entries'
    pointer parameters), each phase's launch (entry, blocks, threads per block), and the shape
    allocated for each temporary."""

    ptx: str
    tensors: tuple[str, ...]
    launches: tuple[tuple[str, int, int], ...]
    storage: Mapping[str, tuple[int, ...]]
    digest: str  # the PTX's hash: its module's key (gpu/runtime.py)
    can_fail: bool  # some entry reads its error record: a run-time check may fail (gpu/fastcall.py)

    @staticmethod
    def of(plan, mapping, ptx: str, interface, sizes: Mapping[str, int]) -> CudaSpecialisation:
        from polyhedral.sizes import compile_size_expr

        from ..lowering.abi import kernel_layout

        if plan.contracted or plan.layouts or plan.contractions or plan.convolutions:
            raise TensorLangError(
                f"{interface.name}: internal compiler error: a cuda plan with x86-only steps"
            )
        storage = {}
        in_shared = {
            v.tensor for p in mapping.phases if p.rows is not None for v in p.rows.local if v.first_step < 0
        }
        in_shared |= {t for p in mapping.phases for t in p.private}  # in registers
        for t in plan.program.temporaries:
            shape = tuple(compile_size_expr(d)(sizes) for d in t.shape)
            if t.name in in_shared:  # in shared memory (gpu/rows.py) or registers: the pointer is unused
                shape = (1,) * len(shape)
            fold = plan.folded.get(t.name)
            if fold is not None:  # stored modulo its dependence distance: never more than needed
                shape = tuple(max(e, fold.modulus) if d == fold.dim else e for d, e in enumerate(shape))
            storage[t.name] = shape
        launches = tuple((f"tl_{interface.name}_phase{p.index}", p.blocks, p.block) for p in mapping.phases)
        from .fastcall import cannot_fail
        from .runtime import ptx_key

        return CudaSpecialisation(
            ptx, kernel_layout(plan.scop).tensors, launches, storage, ptx_key(ptx), not cannot_fail(ptx)
        )


class CudaKernel:
    """A def compiled for target="cuda"; `inspect("ptx", sizes=...)` gives its PTX."""

    target = "cuda"

    def __init__(self, program, schedule, options: Options, syntax_text: str, source: str, filename: str):
        self.program = program
        self.schedule = schedule
        self.options = options
        self.syntax_text = syntax_text
        self.source = source
        self.filename = filename
        self.interface = interface_of(program)
        self._plans: dict[tuple, object] = {}
        self._specs: dict[tuple, CudaSpecialisation] = {}
        self._checked: set[tuple[int, ...]] = set()
        self.torch_plans: dict[tuple, object] = {}  # input signature → TorchCallPlan (gpu/fastcall.py)
        self._host = None  # the def's CPU Kernel: shapes and size checks (nothing compiled)
        self._lock = threading.Lock()

    @property
    def name(self) -> str:
        return self.program.name

    @property
    def scop(self):
        return self.schedule.scop

    def __repr__(self) -> str:
        ins = ", ".join(str(t) for t in self.interface.inputs)
        outs = ", ".join(t.name for t in self.interface.outputs)
        return f"<tensorlang.CudaKernel {self.name}({ins}) -> ({outs})>"

    def __reduce__(self):
        return unpickle_cuda_kernel, (self.source, self.name, self.options, self.filename)

    # ------------------------------------------------------------------ calling

    def __call__(self, *inputs: object, out: object = None, **sizes: int):
        """Run on the GPU: NumPy inputs are copied to the device and NumPy outputs returned; CUDA
        arrays (PyTorch, CuPy, __cuda_array_interface__, DLPack on CUDA) are used in place and
        the outputs returned on the device, of the same kind (gpu/calling.py)."""
        from . import runtime as rt
        from .calling import call

        try:
            if self.torch_plans and out is None and not sizes:
                from .fastcall import MISSING, torch_call

                found = torch_call(self, inputs)
                if found is not MISSING:
                    return found
            return call(self, inputs, out, sizes)
        except rt.CudaUnavailable as exc:
            raise TensorLangError(f"{self.name}: cannot run a target='cuda' kernel here: {exc}") from exc

    def shapes(self, sizes: Mapping[str, int]) -> dict[str, tuple[int, ...]]:
        """Output and temporary shapes for these sizes, after the call-time requirements and the
        size preconditions of the accesses: the CPU Kernel's own checks (the same program)."""
        host = self._host_kernel()
        shapes = host._shapes(sizes)
        key = tuple(sizes[s] for s in self.interface.sizes)
        if key not in self._checked:
            host._check_preconditions(sizes)
            self._checked.add(key)
        return shapes

    def _host_kernel(self):
        if self._host is None:
            from ..runtime.kernel import Kernel

            with self._lock:
                if self._host is None:
                    self._host = Kernel(
                        self.program,
                        self.schedule,
                        self.options,
                        self.syntax_text,
                        self.source,
                        self.filename,
                    )
        return self._host

    def specialisation(self, sizes: Mapping[str, int], arch: str) -> CudaSpecialisation:
        """What a call of these sizes on a device of `arch` launches (cached per sizes and arch)."""
        key = (tuple(sorted(sizes.items())), arch)
        found = self._specs.get(key)
        if found is None:
            plan, mapping = self.plan(sizes)
            ptx = self.inspect("ptx", sizes, arch=arch)
            found = self._specs[key] = CudaSpecialisation.of(plan, mapping, ptx, self.interface, sizes)
        return found

    # ------------------------------------------------------------------ planning and inspection

    def _sizes(self, sizes: Mapping[str, int] | None, stage: str) -> dict[str, int]:
        if sizes is None:
            raise TensorLangError(
                f"inspect({stage!r}) of a cuda kernel needs sizes= ({', '.join(self.interface.sizes)}): "
                "the grid is planned for concrete sizes"
            )
        missing = [s for s in self.interface.sizes if s not in sizes]
        if missing:
            raise TensorLangError(f"inspect: sizes= lacks {', '.join(missing)}")
        bad = [s for s in self.interface.sizes if not isinstance(sizes[s], int) or sizes[s] < 0]
        if bad:
            raise TensorLangError(f"inspect: sizes must be non-negative integers ({', '.join(bad)})")
        return {s: int(sizes[s]) for s in self.interface.sizes}

    def plan(self, sizes: Mapping[str, int]):
        """(KernelPlan, GridMapping) for these sizes: the CPU's plan without its x86-only steps
        (GEMM path, contracted temporaries, pipelining, prefetching: CodegenOptions(optimize=False)),
        then the grid mapping."""
        import islpy as isl

        from ..planning.plan import plan_kernel
        from .mapping import map_plan

        key = tuple(sorted(sizes.items()))
        with self._lock:
            found = self._plans.get(key)
            if found is None:
                codegen = dataclasses.replace(
                    self.options.codegen, optimize=False, pipeline=False, prefetch=False, vectorize=False,
                    specialize=True,
                )  # fmt: skip
                try:
                    plan = plan_kernel(self.schedule, codegen, sizes)
                except isl.Error as exc:
                    raise TensorLangError(
                        f"{self.name}: internal compiler error while planning: {exc}"
                    ) from exc
                found = self._plans[key] = (plan, map_plan(plan))
        return found

    def module(self, sizes: Mapping[str, int]):
        """The NVPTX llvmlite module for these sizes."""
        from .lower import lower_to_nvptx
        from .ptx import new_calling_convention

        plan, mapping = self.plan(sizes)
        return lower_to_nvptx(plan, mapping, new_calling_convention=new_calling_convention())

    def inspect(self, stage: str, sizes: Mapping[str, int] | None = None, *, arch: str = DEFAULT_ARCH) -> str:
        """The text of one stage; `plan`, `loops`, `llvm` and `ptx` need `sizes`. `arch`: the
        PTX target (sm_90 by default; sm_80 for an A100)."""
        if stage == "asm":
            stage = "ptx"
        if stage not in STAGES:
            raise TensorLangError(f"unknown stage {stage!r}; stages are {', '.join(STAGES)}")
        check_arch(arch)
        if stage == "ast":
            return self.syntax_text
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
        sizes = self._sizes(sizes, stage)
        plan, mapping = self.plan(sizes)
        if stage == "plan":
            return f"{plan}\n// target cuda\n{mapping}\n"
        if stage == "loops":
            return plan.loops()
        from .ptx import emit_ptx, optimised_ir

        try:
            module = self.module(sizes)
            return optimised_ir(module, arch) if stage == "llvm" else emit_ptx(module, arch)
        except RuntimeError as exc:  # LLVM rejected our IR: a compiler bug
            raise TensorLangError(
                f"{self.name}: internal compiler error while generating PTX: {exc}"
            ) from exc


def why_no_gpu() -> str | None:
    """Why a cuda kernel cannot run in this process (no cuda-bindings, no driver, no GPU), or None
    when one can."""
    from .runtime import unavailable_reason

    return unavailable_reason()


def unpickle_cuda_kernel(source: str, name: str, options: Options, filename: str) -> CudaKernel:
    import warnings

    from tensorlang.errors import TensorLangWarning

    from ..driver import compile as compile_

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TensorLangWarning)
        return compile_(source, name, options=options, filename=filename, target="cuda")
