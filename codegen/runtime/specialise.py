"""runtime: a built plan, or a call record and its cached object code → Specialisation, the plain data a call reads."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from ..planning.runs import PhasePlan
from .parallel import Workspaces
from .scratch import Scratch
from .warm import CallRecord
from .watch import CallClock

if TYPE_CHECKING:
    from ..lowering.build import Built
    from ..lowering.jit import MachineCode
    from ..planning.plan import KernelPlan, Param


@dataclass
class Specialisation:
    """Machine code for one set of sizes, with the parameter values it was built for: what a
    call reads, all of it plain data (warm.CallRecord stores it)."""

    code: MachineCode
    buffers: tuple[str, ...]  # the tensors in the kernel's pointer-array order
    params: np.ndarray  # int64 parameter array passed at each call
    plans: tuple[PhasePlan, ...]
    workspaces: Workspaces
    contracted: Mapping[str, int]  # temporaries stored as one slice per thread → workspace offset
    layouts: Mapping[str, tuple[int, ...]]  # inputs passed in another storage order (GEMM operands)
    sharing: Mapping[str, int]  # temporaries → buffer slot shared by disjoint lifetimes
    # temporary → (dim, modulus), or (dim, modulus, pitch) when its rows are padded
    folded: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    scratch: Scratch = field(default_factory=Scratch)  # large temporaries kept between calls
    clock: CallClock = field(default_factory=CallClock)  # its last calls' times (which to watch)

    def storage_shape(self, name: str, shape: tuple[int, ...]) -> tuple[int, ...]:
        """The shape allocated for `name`: its logical shape, with a folded dimension's extent its
        modulus and padded rows their pitch (planning/folding.py)."""
        fold = self.folded.get(name)
        if fold is None:
            return shape
        out = [fold[1] if d == fold[0] else e for d, e in enumerate(shape)]
        if len(fold) > 2:
            out[-1] = fold[2]
        return tuple(out)

    @functools.cached_property
    def params_address(self) -> int:
        return self.params.ctypes.data

    @functools.cached_property
    def workspace_slots(self) -> tuple[tuple[int, int], ...]:
        """(index in the buffer list, offset in a thread's workspace) of each contracted temporary."""
        return tuple((self.buffers.index(name), offset) for name, offset in self.contracted.items())


def call_record(
    plan: KernelPlan,
    built: Built,
    sizes: Mapping[str, int],
    values: Mapping[Param, int],
    shapes: Mapping[str, tuple[int, ...]],
) -> CallRecord:
    """What a call of these sizes reads, from the plan and its machine code (`values`: every
    parameter's value, plan.param_values)."""
    dtypes = {plan.program.tensor(c.c.tensor).dtype.numpy_name for c in plan.contractions.values()}
    gemms = set(map(plan.gemm_variant, dtypes))  # the GEMM variants its object code calls
    return CallRecord(
        built.key,
        tuple(sorted(gemms)),
        dict(shapes),
        built.layout.tensors,
        tuple(values[p] for p in built.layout.params),
        plan.phase_runs(sizes, values),
        plan.workspace_bytes,
        {name: c.offset for name, c in plan.contracted.items()},
        dict(plan.layouts),
        dict(plan.sharing),
        {name: (f.dim, f.modulus) + ((f.pitch,) if f.pitch else ()) for name, f in plan.folded.items()},
    )


def from_record(record: CallRecord, code: MachineCode) -> Specialisation:
    return Specialisation(
        code,
        record.buffers,
        np.array(record.params or (0,), dtype=np.int64),
        record.phases,
        Workspaces(record.workspace_bytes),
        record.contracted,
        record.layouts,
        record.sharing,
        record.folded,
    )


def recorded_code(record: CallRecord, ir_text: Callable[[], str]) -> MachineCode | None:
    """The call record's object code from the disk cache, loaded (its GEMM bodies published
    first); None when it is missing, not a kernel's, or rejected by LLVM. `ir_text` rebuilds
    the optimised module for inspection."""
    from ..lowering import disk_cache
    from ..lowering.gemm_jit import shared_gemm
    from ..lowering.jit import jit_object

    entry = disk_cache.load(record.object_key)
    if entry is None or entry[1].get("kind") != "kernel":
        return None
    for dtype in record.gemm_dtypes:  # the object code's external symbols
        shared_gemm(dtype)
    try:
        return jit_object(entry[0], ir_text)
    except RuntimeError:  # LLVM rejected it: the caller compiles again (and overwrites it)
        return None


def shared_bytes(
    sharing: Mapping[str, int], tensors: Iterable[tuple[str, Sequence[int], object]]
) -> dict[int, int]:
    """Bytes of each shared slot: the largest of the temporaries `sharing` assigns to it, from
    `tensors`, (name, shape, dtype) of each temporary (others are skipped); at least 1."""
    sizes_of: dict[int, int] = {}
    for name, shape, dtype in tensors:
        if name in sharing:
            nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
            sizes_of[sharing[name]] = max(sizes_of.get(sharing[name], 1), nbytes)
    return sizes_of


def shared_views(spec: Specialisation, interface, shapes) -> dict[str, np.ndarray]:
    """Views of one allocation per shared slot for the temporaries `spec.sharing` assigns to
    it (temporaries whose lifetimes never overlap), each sized for the largest of its tenants."""
    tenants = [(name, shapes[name], interface.tensor(name).dtype.numpy_name) for name in spec.sharing]
    slots = {slot: np.empty(n, dtype=np.uint8) for slot, n in shared_bytes(spec.sharing, tenants).items()}
    views = {}
    for name, slot in spec.sharing.items():
        dtype = np.dtype(interface.tensor(name).dtype.numpy_name)
        count = int(np.prod(shapes[name], dtype=np.int64))
        views[name] = slots[slot][: count * dtype.itemsize].view(dtype).reshape(shapes[name])
    return views
