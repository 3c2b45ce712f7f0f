"""autodiff: a checked def → its tensors in SSA form (one version per write) and the forward to recompute.

A tensor written by several statements (`O1(b, n) +=! ...; O1(b, n) = O1(b, n) + B1(n); O1(b, n) =
fmax(O1(b, n), 0)`) has one version per statement; the backward needs the value before each
in-place update, so in the gradient program every version is its own tensor. The last version
keeps the forward name (`O1`), earlier ones are `O1_0`, `O1_1`, ... The gradient program
recomputes the forward (it saves nothing: its only inputs are the forward's inputs and the output
adjoints), one statement per forward statement, renamed. A statement that updates only part of a
tensor, accumulates onto it, or reads it at other points (a scan) first copies the old version.

Inside one statement a read of the target at the written point sees the old version; a read at a
shifted point (`S(i - 1)` while writing `S(i)`) sees the new one: a recurrence.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import sympy

from .. import ir, syntax
from ..errors import SemanticError
from ..lint import read_span
from .exprs import rename_tensors, rewrite
from .names import Names


@dataclass(frozen=True)
class Version:
    """The value of forward tensor `tensor` after its `number`-th write (inputs: number 0)."""

    tensor: str
    number: int
    name: str  # its name in the gradient program
    dtype: object
    shape: tuple[sympy.Expr, ...]
    role: str  # "input", "output" or "temporary" of the forward tensor


@dataclass(frozen=True)
class Step:
    """One forward statement with the versions it reads and writes."""

    ir: ir.Statement
    syntax: syntax.Statement
    old: Version | None  # the target before the statement (None: the statement defines it)
    new: Version
    rhs: ir.Expr  # the right-hand side, reads renamed to versions
    shifted: tuple[ir.Read, ...]  # reads of `new` at other points (a recurrence)
    full: bool  # the statement writes its target's whole extent

    @property
    def lhs(self) -> tuple[str, ...]:
        return self.ir.indices

    def ranges(self) -> dict[str, tuple[sympy.Expr, sympy.Expr]]:
        return {r.var: (r.lo, r.hi) for r in self.ir.ranges}


def same_point(read: ir.Read, lhs: tuple[str, ...]) -> bool:
    return len(read.indices) == len(lhs) and all(
        isinstance(ix, ir.IndexRef) and ix.name == v for ix, v in zip(read.indices, lhs)
    )


def build(program: ir.Program, definition: syntax.Def, names: Names) -> tuple[dict[str, Version], list[Step]]:
    """The versions of every tensor (by gradient-program name) and the steps in forward order."""
    writes: dict[str, int] = {}
    for st in program.statements:
        writes[st.tensor] = writes.get(st.tensor, 0) + 1
    current: dict[str, Version] = {}
    versions: dict[str, Version] = {}
    for t in program.inputs:
        current[t.name] = versions[t.name] = Version(t.name, 0, t.name, t.dtype, t.shape, "input")
    seen: dict[str, int] = {}
    steps: list[Step] = []
    for st, sy in zip(program.statements, definition.statements):
        t = program.tensor(st.tensor)
        k = seen.get(st.tensor, 0)
        seen[st.tensor] = k + 1
        last = k + 1 == writes[st.tensor]
        name = st.tensor if last else names.take(f"{st.tensor}_{k}")
        new = Version(st.tensor, k + 1, name, t.dtype, t.shape, t.role)
        old = current.get(st.tensor)
        full = all(
            sympy.simplify(r.lo) == 0 and sympy.simplify(r.hi - extent) == 0
            for r, extent in zip(st.ranges, t.shape)
        )
        mapping = {n: v.name for n, v in current.items() if n != st.tensor}
        shifted: list[ir.Read] = []

        def resolve(e: ir.Expr, st=st, old=old, new=new, mapping=mapping, shifted=shifted) -> ir.Expr | None:
            if not isinstance(e, ir.Read) or e.tensor != st.tensor:
                return None
            indices = tuple(rename_tensors(i, mapping) for i in e.indices)
            if st.op != "=":
                raise SemanticError(
                    f"tl.grad: this reduction reads {st.tensor}, the tensor it accumulates into; "
                    f"its gradient is not supported (compute the value into another tensor first)",
                    read_span(e),
                )
            if same_point(e, st.indices):
                return dataclasses.replace(e, tensor=old.name, indices=indices)
            renamed = dataclasses.replace(e, tensor=new.name, indices=indices)
            shifted.append(renamed)
            return renamed

        rhs = rewrite(
            st.rhs, lambda e, t=st.tensor: resolve(e) if isinstance(e, ir.Read) and e.tensor == t else None
        )
        rhs = rename_tensors(rhs, mapping)
        steps.append(Step(st, sy, old, new, rhs, tuple(shifted), full))
        current[st.tensor] = versions[name] = new
    return versions, steps


# ---------------------------------------------------------------- the forward, recomputed


def rename_syntax(e: syntax.Expression, mapping: dict[str, str]) -> syntax.Expression:
    """Rename tensor reads (`T(...)`, and bare 0-d `T`) in a syntax expression."""
    match e:
        case syntax.Name(name=n) if n in mapping:
            return dataclasses.replace(e, name=mapping[n])
        case syntax.Apply(name=n, args=args):
            return dataclasses.replace(
                e, name=mapping.get(n, n), args=tuple(rename_syntax(a, mapping) for a in args)
            )
        case syntax.UnaryOp(operand=o) | syntax.CastExpr(operand=o):
            return dataclasses.replace(e, operand=rename_syntax(o, mapping))
        case syntax.BinaryOp(lhs=a, rhs=b):
            return dataclasses.replace(e, lhs=rename_syntax(a, mapping), rhs=rename_syntax(b, mapping))
        case syntax.Ternary(cond=c, if_true=t, if_false=f):
            return dataclasses.replace(
                e,
                cond=rename_syntax(c, mapping),
                if_true=rename_syntax(t, mapping),
                if_false=rename_syntax(f, mapping),
            )
    return e


def _rename_where(w: syntax.WhereClause, mapping: dict[str, str]) -> syntax.WhereClause:
    match w:
        case syntax.WhereLet(value=v):
            return dataclasses.replace(w, value=rename_syntax(v, mapping))
        case syntax.WhereExists(expr=x):
            return dataclasses.replace(w, expr=rename_syntax(x, mapping))
    return w


def recompute(
    step: Step, current: dict[str, str], annotated: dict[str, str], names: Names
) -> list[syntax.Statement]:
    """The forward statement `step` as statements of the gradient program.

    current: forward tensor → the name of its current version. annotated: outputs whose return
    entry gave a type (their first statement converts to it; as temporaries they must too).
    """
    st, sy = step.ir, step.syntax
    target = step.new.name
    op = sy.op
    if st.uninitialized:
        op = op + "!"  # tensorlang starts an uninitialised reduction from zeros without out=
    mapping = dict(current)
    out: list[syntax.Statement] = []
    if step.old is not None and (op != "=" or step.shifted or not step.full):
        # the new version starts as a copy of the old one, then the statement updates it in place
        idx = [names.index("i") for _ in step.new.shape]
        ids = tuple(syntax.Ident(name=i) for i in idx)
        copy = syntax.Apply(name=step.old.name, args=tuple(syntax.Name(name=i) for i in idx))
        out.append(syntax.Statement(tensor=syntax.Ident(name=target), indices=ids, op="=", rhs=copy))
        mapping[st.tensor] = target
    elif step.old is not None:
        mapping[st.tensor] = step.old.name
    rhs = rename_syntax(sy.rhs, mapping)
    if step.old is None and st.tensor in annotated:
        rhs = syntax.CastExpr(type_name=annotated[st.tensor], operand=rhs)
    out.append(
        dataclasses.replace(
            sy,
            tensor=syntax.Ident(name=target),
            op=op,
            rhs=rhs,
            equivalent=None,
            wheres=tuple(_rename_where(w, mapping) for w in sy.wheres),
        )
    )
    return out
