"""runtime: ir.Program ⇄ Interface, what a call checks its arguments against, as JSON (no sympy).

A cache-warm process (codegen/runtime/warm.py) builds its Kernels from this record instead of
running the front end: it holds everything `Kernel.__call__` reads before it needs machine code —
the def's name, its size symbols, each tensor's name, type, role and declared dimensions — in
the duck type of `ir.Program`/`ir.Tensor` that runtime/arguments.py reads.
"""

from __future__ import annotations

from dataclasses import dataclass

from tensorlang.dtypes import ScalarType

Dim = tuple[str, int | str]  # ("const", n) or ("size", symbol)


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of the def, as the call sees it (`shape` holds the declared dimensions' text)."""

    name: str
    dtype: ScalarType
    role: str  # "input", "output" or "temporary"
    shape: tuple[str, ...]
    dims: tuple[Dim, ...]  # inputs: how each dimension binds (a constant, or a size symbol)

    @property
    def rank(self) -> int:
        return len(self.shape)

    def __str__(self) -> str:  # as ir.Tensor prints
        return f"{self.role} {self.dtype}({', '.join(self.shape)}) {self.name}"


@dataclass(frozen=True)
class Interface:
    """The def's signature and storage roles; `uninitialised` are the tensors a `+=` without `!`
    accumulates into (they start from zeros, or from an `out=` array)."""

    name: str
    sizes: tuple[str, ...]
    inputs: tuple[TensorInfo, ...]
    outputs: tuple[TensorInfo, ...]
    temporaries: tuple[TensorInfo, ...]
    uninitialised: frozenset[str]

    @property
    def tensors(self) -> tuple[TensorInfo, ...]:
        return self.inputs + self.outputs + self.temporaries

    def tensor(self, name: str) -> TensorInfo:
        for t in self.tensors:
            if t.name == name:
                return t
        raise KeyError(name)

    @property
    def input_dims(self) -> tuple[tuple[Dim, ...], ...]:
        return tuple(t.dims for t in self.inputs)

    # ------------------------------------------------------------------ JSON

    def to_json(self) -> dict:
        def tensor(t: TensorInfo) -> dict:
            return {
                "name": t.name,
                "dtype": t.dtype.value,
                "role": t.role,
                "shape": list(t.shape),
                "dims": [list(d) for d in t.dims],
            }

        return {
            "name": self.name,
            "sizes": list(self.sizes),
            "inputs": [tensor(t) for t in self.inputs],
            "outputs": [tensor(t) for t in self.outputs],
            "temporaries": [tensor(t) for t in self.temporaries],
            "uninitialised": sorted(self.uninitialised),
        }

    @staticmethod
    def from_json(record: dict) -> Interface:
        """The Interface of a record written by to_json; raises KeyError, TypeError or
        ValueError on anything else (the caller then compiles as if nothing were cached)."""

        def dim(d: list) -> Dim:
            kind, value = d
            if kind == "const" and isinstance(value, int):
                return ("const", value)
            if kind == "size" and isinstance(value, str):
                return ("size", value)
            raise ValueError(f"bad dimension {d!r}")

        def tensor(t: dict) -> TensorInfo:
            return TensorInfo(
                str(t["name"]),
                ScalarType(t["dtype"]),
                str(t["role"]),
                tuple(str(s) for s in t["shape"]),
                tuple(dim(d) for d in t["dims"]),
            )

        return Interface(
            str(record["name"]),
            tuple(str(s) for s in record["sizes"]),
            tuple(tensor(t) for t in record["inputs"]),
            tuple(tensor(t) for t in record["outputs"]),
            tuple(tensor(t) for t in record["temporaries"]),
            frozenset(str(n) for n in record["uninitialised"]),
        )


def interface_of(program) -> Interface:  # program: tensorlang.ir.Program
    """The Interface of a checked program."""

    def tensor(t) -> TensorInfo:
        dims = (
            tuple(("const", int(d)) if d.is_Integer else ("size", str(d)) for d in t.shape)
            if t.role == "input"
            else ()
        )
        return TensorInfo(t.name, t.dtype, t.role, tuple(str(d) for d in t.shape), dims)

    return Interface(
        program.name,
        tuple(s.name for s in program.sizes),
        tuple(tensor(t) for t in program.inputs),
        tuple(tensor(t) for t in program.outputs),
        tuple(tensor(t) for t in program.temporaries),
        frozenset(st.tensor for st in program.statements if st.uninitialized),
    )
