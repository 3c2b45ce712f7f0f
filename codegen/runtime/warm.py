"""runtime: compile requests and calls ⇄ JSON records in the disk cache, so a cache-warm process skips the front end.

A cold `tl.compile` runs every stage, and the first call of each set of sizes plans and compiles
machine code. Object code alone (lowering/build.py) does not make a fresh process fast: finding
its key needs the KernelPlan, hence the front end, islpy and sympy (~0.3 s of imports). So two
more records are written next to the object code:
- a *program record*, keyed by the source text, the def's name, the filename, the options and
  the thread count fusion planned for: the def's Interface and the warnings compiling it gave;
- a *call record* per set of sizes, keyed by the program record's key and the sizes: the key of
  the object code, the output shapes, and the few facts of the Specialisation the runtime reads
  (buffer order, parameter values, phase runs, workspace size, contracted and shared storage).
A record exists only for programs that compiled and sizes that passed every check (requirements,
bounds proofs, allocation limits) in an earlier process with the same sources (the key holds
their hash, disk_cache.environment), so a hit may skip those checks. Anything missing, corrupt or
inconsistent is a miss: the Kernel then runs the stages it skipped, and rewrites the records.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from ..lowering import disk_cache
from ..planning.runs import PhasePlan
from .interface import Interface

RECORD_VERSION = 2  # 2: call records hold the folded temporaries


def program_key(source: str, name: str | None, filename: str, options_text: str, threads: int) -> str | None:
    """The program record's key, or None when the cache is off."""
    if not disk_cache.enabled():
        return None
    return disk_cache.cache_key(
        "program",
        version=RECORD_VERSION,
        source=source,
        name=name,
        filename=filename,
        options=options_text,
        threads=threads,
    )


@dataclasses.dataclass(frozen=True)
class ProgramRecord:
    interface: Interface
    warnings: tuple[str, ...]  # TensorLangWarning messages compiling the program gave


def load_program(key: str | None) -> ProgramRecord | None:
    payload = disk_cache.load_record(key) if key else None
    if payload is None:
        return None
    try:
        return ProgramRecord(
            Interface.from_json(payload["interface"]), tuple(str(w) for w in payload["warnings"])
        )
    except (KeyError, TypeError, ValueError):
        return None


def store_program(key: str | None, interface: Interface, warnings: Sequence[str]) -> None:
    if key:
        disk_cache.store_record(key, {"interface": interface.to_json(), "warnings": list(warnings)})


def call_key(program: str, sizes: Sequence[int]) -> str:
    return disk_cache.cache_key("call", version=RECORD_VERSION, program=program, sizes=list(sizes))


@dataclasses.dataclass(frozen=True)
class CallRecord:
    """What a call of one set of sizes needs besides the object code (see the module docstring)."""

    object_key: str
    gemm_dtypes: tuple[str, ...]  # GEMM bodies the object code calls (published before loading)
    shapes: Mapping[str, tuple[int, ...]]  # of every output and temporary
    buffers: tuple[str, ...]  # the kernel's buffer (pointer array) order
    params: tuple[int, ...]  # the parameter array's values
    phases: tuple[PhasePlan, ...]
    workspace_bytes: int
    contracted: Mapping[str, int]  # contracted temporary → offset in a thread's workspace
    layouts: Mapping[str, tuple[int, ...]]  # inputs relaid out (GEMM operands)
    sharing: Mapping[str, int]  # temporaries → shared buffer slot
    folded: Mapping[str, tuple[int, ...]]  # temporaries stored modulo: (dimension, modulus[, pitch])

    def to_json(self) -> dict:
        return {
            "object_key": self.object_key,
            "gemm_dtypes": list(self.gemm_dtypes),
            "shapes": {k: list(v) for k, v in self.shapes.items()},
            "buffers": list(self.buffers),
            "params": list(self.params),
            "phases": [_phase_json(p) for p in self.phases],
            "workspace_bytes": self.workspace_bytes,
            "contracted": dict(self.contracted),
            "layouts": {k: list(v) for k, v in self.layouts.items()},
            "sharing": dict(self.sharing),
            "folded": {k: list(v) for k, v in self.folded.items()},
        }

    @staticmethod
    def from_json(record: dict, interface: Interface) -> CallRecord:
        """Raises KeyError, TypeError or ValueError on a record that does not fit the interface."""
        shapes = {str(k): _ints(v) for k, v in record["shapes"].items()}
        written = {t.name for t in interface.outputs + interface.temporaries}
        if set(shapes) != written or any(min(s, default=0) < 0 for s in shapes.values()):
            raise ValueError("the shapes do not match the program")
        buffers = tuple(str(b) for b in record["buffers"])
        if set(buffers) != {t.name for t in interface.tensors}:
            raise ValueError("the buffers do not match the program")
        return CallRecord(
            str(record["object_key"]),
            tuple(str(d) for d in record["gemm_dtypes"]),
            shapes,
            buffers,
            _ints(record["params"]),
            tuple(_phase(p) for p in record["phases"]),
            _int(record["workspace_bytes"]),
            {str(k): _int(v) for k, v in record["contracted"].items()},
            {str(k): _ints(v) for k, v in record["layouts"].items()},
            {str(k): _int(v) for k, v in record["sharing"].items()},
            {str(k): _fold(v) for k, v in record["folded"].items()},
        )

    def fits(self, interface: Interface, sizes: Mapping[str, int]) -> bool:
        """Whether each recorded shape has its tensor's rank, and the value of each dimension
        declared as a bare size symbol or a constant (the rest need the front end to evaluate)."""
        for tensor in interface.outputs + interface.temporaries:
            shape = self.shapes[tensor.name]
            if len(shape) != tensor.rank:
                return False
            for text, extent in zip(tensor.shape, shape):
                expected = sizes.get(text, int(text) if text.isdigit() else None)
                if expected is not None and expected != extent:
                    return False
        return True


def load_call(key: str, interface: Interface, sizes: Mapping[str, int]) -> CallRecord | None:
    payload = disk_cache.load_record(key)
    if payload is None:
        return None
    try:
        record = CallRecord.from_json(payload, interface)
    except (KeyError, TypeError, ValueError, AttributeError):
        return None
    return record if record.fits(interface, sizes) else None


def store_call(key: str, record: CallRecord) -> None:
    disk_cache.store_record(key, record.to_json())


# ------------------------------------------------------------------ PhasePlan ⇄ JSON, generically
# (by field name, so a field added to PhasePlan needs no change here; its values are ints,
# bools, None or tuples of those)


def _phase_json(plan: PhasePlan) -> dict:
    return {f.name: _plain(getattr(plan, f.name)) for f in dataclasses.fields(plan)}


def _plain(value: object) -> object:
    return [_plain(v) for v in value] if isinstance(value, tuple) else value


def _phase(record: dict) -> PhasePlan:
    names = {f.name for f in dataclasses.fields(PhasePlan)}
    if set(record) != names:
        raise ValueError("phase fields differ")
    return PhasePlan(**{k: _frozen(v) for k, v in record.items()})


def _frozen(value: object) -> object:
    if isinstance(value, list):
        return tuple(_frozen(v) for v in value)
    if value is None or isinstance(value, bool | int):
        return value
    raise ValueError(f"unexpected value {value!r} in a phase record")


def _fold(value: object) -> tuple[int, ...]:
    fold = _ints(value)
    if len(fold) not in (2, 3) or fold[0] < 0 or min(fold[1:]) < 1:
        raise ValueError(f"unexpected folding {value!r}")
    return fold


def _int(value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"expected an integer, got {value!r}")
    return value


def _ints(values: object) -> tuple[int, ...]:
    if not isinstance(values, list):
        raise ValueError(f"expected a list, got {values!r}")
    return tuple(_int(v) for v in values)
