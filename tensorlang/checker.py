"""checker: syntax.Def → ir.Program (names and scopes, typing, reductions, range inference, shapes)."""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass

import sympy

from . import ir, lint, ranges, syntax
from .builtins import BUILTINS
from .dtypes import ScalarType, match_types
from .errors import SemanticError, Source, Span, TensorLangWarning, located_warning_text
from .exprcheck import ExpressionChecker, Scope, TensorInfo, convert, literal, scalar_type, tc_type_name


def check_def(definition: syntax.Def, source: Source | None = None) -> ir.Program:
    """Check one def and lower it to an ir.Program (not yet verified)."""
    return _DefChecker(definition, source).run()


@dataclass
class _Written:
    """An output or temporary after the statement that first defines it."""

    tensor: ir.Tensor

    @property
    def info(self) -> TensorInfo:
        return TensorInfo(self.tensor.name, self.tensor.dtype, self.tensor.rank)


class _DefChecker:
    def __init__(self, definition: syntax.Def, source: Source | None):
        self.definition = definition
        self.source = source
        self.inputs: dict[str, ir.Tensor] = {}
        self.sizes: dict[str, ir.SizeParam] = {}
        self.outputs: dict[str, syntax.Param] = {}
        self.output_types: dict[str, ScalarType] = {}
        self.written: dict[str, ir.Tensor] = {}  # outputs and temporaries, in first-write order
        self.statements: list[ir.Statement] = []
        self.warnings: list[str] = []
        self.requirements: list[ir.Requirement] = []

    def run(self) -> ir.Program:
        for param in self.definition.params:
            self.declare_input(param)
        for param in self.definition.returns:
            self.declare_output(param)
        self.check_size_names()
        for statement in self.definition.statements:
            self.statements.append(self.check_statement(statement))
        outputs = []
        for name, param in self.outputs.items():
            if name not in self.written:
                raise SemanticError(f"output {name} is never written by any statement", param.name.span)
            self.check_annotated_shape(param, self.written[name])
            outputs.append(self.written[name])
        return ir.Program(
            name=self.definition.name.name,
            inputs=tuple(self.inputs.values()),
            outputs=tuple(outputs),
            temporaries=tuple(t for t in self.written.values() if t.role == "temporary"),
            sizes=tuple(self.sizes.values()),
            statements=tuple(self.statements),
            source=self.source,
            warnings=tuple(self.warnings),
            requirements=tuple(self.requirements),
        )

    # ------------------------------------------------------------ signature

    def new_name(self, ident: syntax.Ident) -> None:
        if ident.name in BUILTINS:
            raise SemanticError(f"'{ident.name}' is a built-in function and cannot be redefined", ident.span)
        if ident.name in self.inputs or ident.name in self.outputs:
            raise SemanticError(f"{ident.name} already defined", ident.span)

    def declare_input(self, param: syntax.Param) -> None:
        name = param.name.name
        self.new_name(param.name)
        if param.type is None:
            raise SemanticError(
                f"input {name} needs a type and a shape, e.g. float(N) {name}", param.name.span
            )
        dtype = scalar_type(param.type.type_name, param.type.span)
        shape = []
        for d, dim in enumerate(param.type.dims or ()):
            if isinstance(dim, syntax.Number):
                shape.append(self.constant_dim(dim))
                continue
            if dim.name in BUILTINS:
                raise SemanticError(f"'{dim.name}' is a built-in function and cannot be redefined", dim.span)
            self.sizes.setdefault(dim.name, ir.SizeParam(dim.name, name, d))
            shape.append(ir.size_symbol(dim.name))
        self.inputs[name] = ir.Tensor(name, dtype, tuple(shape), "input", span=param.name.span)

    def declare_output(self, param: syntax.Param) -> None:
        self.new_name(param.name)
        self.outputs[param.name.name] = param
        if param.type is not None:
            self.output_types[param.name.name] = scalar_type(param.type.type_name, param.type.span)

    def constant_dim(self, dim: syntax.Number) -> sympy.Expr:
        if dim.is_float:
            raise SemanticError(f"expected an integer size but found {dim.text}", dim.span)
        return sympy.Integer(literal(dim).value)

    def check_size_names(self) -> None:
        tensors = self.inputs.keys() | self.outputs.keys()
        for param in self.definition.params + self.definition.returns:
            for dim in (param.type.dims or ()) if param.type else ():
                if isinstance(dim, syntax.Ident) and dim.name in tensors:
                    raise SemanticError(f"{dim.name} is used both as a size and as a tensor name", dim.span)
                if isinstance(dim, syntax.Ident) and dim.name not in self.sizes:
                    if param in self.definition.returns and self.scattered_dim(param.name.name, dim):
                        # the extent a scatter writes into: given at the call (`k(I, V, E=10)`)
                        self.sizes[dim.name] = ir.SizeParam(dim.name, None, None)
                        continue
                    raise SemanticError(
                        f"size {dim.name} of output {param.name} is not the size of any input dimension",
                        dim.span,
                    )
                if isinstance(dim, syntax.Number):
                    self.constant_dim(dim)

    def scattered_dim(self, output: str, dim: syntax.Ident) -> bool:
        """Whether some statement writes `output` with a data-dependent subscript in the dimension
        that the output's type annotation sizes with `dim`."""
        param = self.outputs[output]
        d = next(k for k, x in enumerate(param.type.dims) if x is dim)
        return any(
            st.tensor.name == output and len(st.indices) > d and not isinstance(st.indices[d], syntax.Ident)
            for st in self.definition.statements
        )

    def check_annotated_shape(self, param: syntax.Param, tensor: ir.Tensor) -> None:
        if param.type is None or param.type.dims is None:
            return
        for d, (dim, inferred) in enumerate(zip(param.type.dims, tensor.shape)):
            declared = self.constant_dim(dim) if isinstance(dim, syntax.Number) else ir.size_symbol(dim.name)
            if sympy.simplify(inferred - declared) != 0:
                raise SemanticError(
                    f"output {tensor.name} is declared with size {declared} in dimension {d}, "
                    f"but range inference gives {inferred}",
                    dim.span,
                )

    # ------------------------------------------------------------ statements

    def check_target(self, st: syntax.Statement) -> None:
        name, span = st.tensor.name, st.tensor.span
        if name in self.inputs:
            raise SemanticError(f"{name} is an input; TC inputs are immutable", span)
        if name in BUILTINS:
            raise SemanticError(f"'{name}' is a built-in function and cannot be redefined", span)
        if name in self.sizes:
            raise SemanticError(f"{name} is a size, not a tensor; it cannot be written", span)
        rank = len(st.indices)
        if name in self.written and self.written[name].rank != rank:
            raise SemanticError(
                f"{name} has {self.written[name].rank} dimensions but is written here with {rank}", span
            )
        declared = self.outputs.get(name)
        if declared is not None and declared.type is not None and declared.type.dims is not None:
            if len(declared.type.dims) != rank:
                raise SemanticError(
                    f" tensor defined with {rank} dimensions but declared as an output with "
                    f"{len(declared.type.dims)} dimensions. ({name})",
                    span,
                )

    def taken(self, name: str) -> str | None:
        """What `name` already denotes in the def, if anything."""
        if name in BUILTINS:
            return "a built-in function"
        if name in self.sizes:
            return "a size"
        if name in self.inputs or name in self.outputs or name in self.written:
            return "a tensor"
        return None

    def check_statement(self, st: syntax.Statement) -> ir.Statement:
        self.check_target(st)
        name = st.tensor.name
        lhs: dict[str, Span | None] = {}
        for index in st.indices:
            if not isinstance(index, syntax.Ident):
                continue  # a scatter's data-dependent subscript, checked with the right-hand side
            what = self.taken(index.name)
            if index.name in lhs or what:
                raise SemanticError(
                    f"{index.name} already defined" + (f" (as {what})" if what else ""), index.span
                )
            lhs[index.name] = index.span
        lets = {}
        for clause in st.wheres:
            if isinstance(clause, syntax.WhereLet):
                var = clause.var.name
                what = self.taken(var)
                if var in lhs or var in lets or what:
                    raise SemanticError(
                        f"{var} already defined" + (f" (as {what})" if what else ""), clause.var.span
                    )
                lets[var] = clause
        self.declare_call_sizes(st, set(lhs) | set(lets))
        readable = {n: TensorInfo(t.name, t.dtype, t.rank) for n, t in self.inputs.items()}
        readable |= {n: TensorInfo(t.name, t.dtype, t.rank) for n, t in self.written.items()}
        scope = Scope(
            tensors=readable,
            unreadable=(set(self.outputs) | {name}) - set(readable),
            sizes=set(self.sizes),
            lhs_indices=tuple(lhs),
            lets=lets,
        )
        checker = ExpressionChecker(scope)
        rhs = checker.check(st.rhs)
        exists = [checker.check(c.expr) for c in st.wheres if isinstance(c, syntax.WhereExists)]
        scattered = self.check_scatter_subscripts(st, checker)
        scope.introduce = False  # a name used only in an unused let is a typo, not a reduction index
        for var in lets.keys() - scope.used_lets():
            scope.let_value(var, checker.check, lets[var].var.span)

        if st.op == "=" and scope.reduction_indices:
            raise SemanticError(
                f"this statement includes reduction variable '{scope.reduction_indices[0]}' but does not "
                f"specify a reduction.",
                st.tensor.span,
            )
        rhs = self.convert_to_target(st, rhs)
        where = self.where_ranges(st, scope)
        write = None
        if scattered:
            write = tuple(
                scattered[d] if d in scattered else ir.IndexRef(name=index.name)
                for d, index in enumerate(st.indices)
            )
        inference = self.infer_ranges(st, scope, lhs, where, [rhs, *exists, *scattered.values()], write)
        for narrowing in inference.narrowings:
            self.warn(lint.narrowing(narrowing, name))
        # the indices a scatter's subscripts use pick the element written: like left-hand-side ones
        picked = {n.name for e in scattered.values() for n in ir.walk(e) if isinstance(n, ir.IndexRef)}
        reduced = tuple(r for r in scope.reduction_indices if r not in picked)
        for finding in lint.separate_reductions([rhs, *exists], (*lhs, *sorted(picked)), reduced):
            self.warn(finding)
        return self.lower(st, rhs, scope, lhs, where, inference.ranges, write)

    def check_scatter_subscripts(
        self, st: syntax.Statement, checker: ExpressionChecker
    ) -> dict[int, ir.Expr]:
        """A scatter's data-dependent left-hand subscripts (dimension → integral expression that
        reads a tensor), checked in the statement's scope; {} for an ordinary statement."""
        out: dict[int, ir.Expr] = {}
        for d, sub in enumerate(st.indices):
            if isinstance(sub, syntax.Ident):
                continue
            index = checker.subscript(sub)
            if not any(isinstance(e, ir.Read) for e in ir.walk(index)):
                raise SemanticError(
                    f"a left-hand-side subscript must be an index variable, or read a tensor (a scatter, "
                    f"e.g. {st.tensor.name}(idx(b)) += V(b)); compute {sub} on the right-hand side instead",
                    sub.span,
                )
            if st.op == "=":
                raise SemanticError(
                    f"`=` cannot write through a data-dependent subscript ({sub}): when indices repeat, "
                    f"which value is kept is undefined. Use a reduction: `+=!` sums the contributions "
                    f"(a scatter-add; `+=` accumulates onto the existing values), or `max=!`/`min=!`",
                    sub.span,
                )
            out[d] = index
        return out

    def convert_to_target(self, st: syntax.Statement, rhs: ir.Expr) -> ir.Expr:
        name = st.tensor.name
        if name in self.written:
            target = self.written[name].dtype
        else:
            target = self.output_types.get(name, rhs.dtype)
        if match_types(rhs.dtype, target) != target:
            raise SemanticError(
                f" attempting to assign type {tc_type_name(rhs.dtype)} to narrower type "
                f"{tc_type_name(target)} without an explicit cast ({name})",
                st.tensor.span,
            )
        return convert(rhs, target)

    def where_ranges(self, st: syntax.Statement, scope: Scope) -> dict[str, tuple[sympy.Expr, sympy.Expr]]:
        tensor_names = set(self.inputs) | set(self.outputs) | set(self.written)
        where: dict[str, tuple[sympy.Expr, sympy.Expr]] = {}
        for clause in st.wheres:
            if not isinstance(clause, syntax.WhereRange):
                continue
            var = clause.var.name
            if not scope.is_index(var):
                raise SemanticError(
                    f"undefined variable {var} used here. A `where {var} in lo:hi` range must name an index "
                    f"variable of the statement",
                    clause.var.span,
                )
            if var in where:
                raise SemanticError(f"{var} already has a range in this statement", clause.var.span)
            lo = where_bound(clause.lo, set(self.sizes), tensor_names)
            hi = where_bound(clause.hi, set(self.sizes), tensor_names)
            where[var] = (lo, hi)
        return where

    def declare_call_sizes(self, st: syntax.Statement, indices: set[str]) -> None:
        """A bare name in a `where` range bound that is nothing else (no size, tensor, builtin,
        or index of the statement) declares a size that no input's shape gives; it is passed at
        the call (`k(A, T=100)`). Declared before the statement's expressions are checked, so
        they may use it too (`B(i) = A(i + K) where i in 0:N - K`)."""
        ranged = {c.var.name for c in st.wheres if isinstance(c, syntax.WhereRange)}
        taken = indices | ranged | set(self.inputs) | set(self.outputs) | set(self.written) | set(BUILTINS)
        for clause in st.wheres:
            if isinstance(clause, syntax.WhereRange):
                for name in _bound_names(clause.lo) + _bound_names(clause.hi):
                    if name not in taken:
                        self.sizes.setdefault(name, ir.SizeParam(name, None, None))

    def shape_of(self, tensor: str) -> tuple[sympy.Expr, ...]:
        return (self.inputs.get(tensor) or self.written[tensor]).shape

    def infer_ranges(self, st, scope, lhs, where, expressions, write=None) -> ranges.Inference:
        variables = set(lhs) | set(scope.reduction_indices)
        constraints = []
        for expr in expressions:
            for read, guard in ranges.guarded_accesses(expr, variables):
                shape = self.shape_of(read.tensor)
                span = lint.read_span(read)
                constraints += ranges.access_constraints(
                    read.tensor, read.indices, shape, variables, guard, span
                )
        name = st.tensor.name
        if name in self.written:
            # A later statement on a tensor stays inside the shape its first statement defined.
            write = write or tuple(ir.IndexRef(name=i) for i in lhs)
            constraints += ranges.access_constraints(name, write, self.shape_of(name), variables)
        return ranges.infer(
            tensor=name,
            lhs=tuple(lhs.items()),
            reduction=tuple((r, scope.reduction_spans[r]) for r in scope.reduction_indices),
            where=where,
            constraints=constraints,
            statement_span=st.tensor.span,
        )

    def lower(self, st, rhs, scope, lhs, where, solved, write=None) -> ir.Statement:
        name = st.tensor.name
        where_spans = {c.var.name: c.span for c in st.wheres if isinstance(c, syntax.WhereRange)}
        first = name not in self.written
        spans = lhs | scope.reduction_spans
        if first:
            for var in lhs:
                requirement = ranges.require_zero_based(name, var, *solved[var], spans[var])
                if requirement is not None:
                    self.requirements.append(requirement)
        for var, span in spans.items():
            ranges.check_nonempty(var, *solved[var], where_spans.get(var, span))
        dims = [(d, index.name) for d, index in enumerate(st.indices) if isinstance(index, syntax.Ident)]
        if first:
            role = "output" if name in self.outputs else "temporary"
            span = self.outputs[name].name.span if name in self.outputs else st.tensor.span
            shape = tuple(
                solved[index.name][1] if isinstance(index, syntax.Ident) else self.scatter_extent(st, d)
                for d, index in enumerate(st.indices)
            )
            self.written[name] = ir.Tensor(name, rhs.dtype, shape, role, span=span)
        else:
            # An output keeps the shape its first statement gave it; a temporary's extent is the
            # union (hull) of what its statements write: a `where` range may extend it upward.
            tensor = self.written[name]
            shape = list(tensor.shape)
            for d, var in dims:
                if var in where and tensor.role == "temporary":
                    shape[d] = ranges.hull(name, var, *solved[var], shape[d], spans[var])
                elif var in where:
                    ranges.check_within(name, var, *solved[var], shape[d], spans[var])
            self.written[name] = dataclasses.replace(tensor, shape=tuple(shape))

        op = "=" if st.op == "=" else st.op.rstrip("!").removesuffix("=")
        bang = st.op.endswith("!")
        uninitialized = op != "=" and not bang and first
        if uninitialized:
            self.warn_uninitialized(st)
        if write is not None and bang and first:
            self.statements.append(self.scatter_init(st, op, self.written[name]))
        return ir.Statement(
            tensor=name,
            indices=tuple(lhs),
            op=op,
            bang=bang,
            rhs=rhs,
            reduction_indices=tuple(scope.reduction_indices),
            ranges=tuple(ir.IndexRange(v, *solved[v], span=spans[v]) for v in spans),
            initializes=bang and first and write is None,
            uninitialized=uninitialized,
            span=st.span,
            subscripts=write,
        )

    def scatter_extent(self, st: syntax.Statement, d: int) -> sympy.Expr:
        """The extent of dimension d of a tensor a scatter writes first: from its declaration."""
        name = st.tensor.name
        declared = self.outputs.get(name)
        if declared is not None and declared.type is not None and declared.type.dims is not None:
            dim = declared.type.dims[d]
            return self.constant_dim(dim) if isinstance(dim, syntax.Number) else ir.size_symbol(dim.name)
        raise SemanticError(
            f"the extent of dimension {d} of {name} cannot come from a data-dependent subscript "
            f"({st.indices[d]}); declare it: return {name} with a type, e.g. "
            f"`-> (float({', '.join('E' if k == d else '...' for k in range(len(st.indices)))}) {name})`, "
            f"or write {name} with an ordinary statement first",
            st.indices[d].span,
        )

    def scatter_init(self, st: syntax.Statement, op: str, tensor: ir.Tensor) -> ir.Statement:
        """`T(i0, i1, ...) = identity of op` over the whole of T, before a scatter `T(idx(b)) op=! ...`:
        the scatter's left-hand side is data-dependent, so its `!` covers every element."""
        taken = set(self.sizes) | set(self.inputs) | set(self.outputs) | set(self.written)
        names = []
        for d in range(tensor.rank):
            var = f"i{d}"
            while var in taken:
                var = "_" + var
            names.append(var)
        identity = ir.Const(value=_identity(op, tensor.dtype), dtype=tensor.dtype)
        return ir.Statement(
            tensor=tensor.name,
            indices=tuple(names),
            op="=",
            bang=False,
            rhs=identity,
            reduction_indices=(),
            ranges=tuple(
                ir.IndexRange(v, sympy.Integer(0), extent, span=st.tensor.span)
                for v, extent in zip(names, tensor.shape)
            ),
            span=st.span,
        )

    def warn_uninitialized(self, st: syntax.Statement) -> None:
        name = st.tensor.name
        message = (
            f"Reduction without initialization. If {name} is not pre-initialized before calling the TC "
            f"function, consider using the !-suffixed reduction operator {st.op}! instead of {st.op} "
            f"(tensorlang starts {name} from zeros unless out= provides the buffer)"
        )
        self.warn(lint.Finding(message, st.tensor.span))

    def warn(self, finding: lint.Finding) -> None:
        """Record a located warning on the Program and issue it through Python's warnings."""
        span = finding.span
        text = located_warning_text(finding.message, span) if span is not None else finding.message
        self.warnings.append(text)
        warnings.warn(text, TensorLangWarning, stacklevel=5)


def _identity(op: str, dtype: ScalarType) -> int | float | bool:
    """The neutral element of a reduction (as codegen's values.identity)."""
    if op == "+":
        return False if dtype.is_bool else 0.0 if dtype.is_float else 0
    if op == "*":
        return True if dtype.is_bool else 1.0 if dtype.is_float else 1
    if dtype.is_bool:
        return op == "min"
    if dtype.is_float:
        return float("inf") if op == "min" else float("-inf")
    lo, hi = (
        (-(1 << (dtype.bits - 1)), (1 << (dtype.bits - 1)) - 1)
        if dtype.is_signed
        else (0, (1 << dtype.bits) - 1)
    )
    return hi if op == "min" else lo


# ---------------------------------------------------------------- where-range bounds


def _bound_names(expr: syntax.Expression) -> list[str]:
    """The bare names of a range bound (those a `where` may declare as call-time sizes)."""
    match expr:
        case syntax.Name(name=name):
            return [name]
        case syntax.UnaryOp(operand=operand) | syntax.CastExpr(operand=operand):
            return _bound_names(operand)
        case syntax.BinaryOp(lhs=a, rhs=b):
            return _bound_names(a) + _bound_names(b)
    return []


def where_bound(expr: syntax.Expression, sizes: set[str], tensors: set[str]) -> sympy.Expr:
    """A range bound as a sympy expression: integer literals and sizes under + - * / % min max."""
    match expr:
        case syntax.Number(text=text):
            if syntax.Number(text=text).is_float:
                raise SemanticError(" expected integral type but found float in a range bound", expr.span)
            if len(text.lstrip("0")) > 10:
                raise SemanticError(f"integer literal {text[:20]} does not fit in int32", expr.span)
            return sympy.Integer(int(text))
        case syntax.Name(name=name) | syntax.Apply(name=name):
            if name in tensors:
                raise SemanticError(
                    "tensor accesses cannot be used in this context (a range bound)", expr.span
                )
            if isinstance(expr, syntax.Name) and name in sizes:
                return ir.size_symbol(name)
            raise SemanticError(
                f"undefined variable {name} used here. A range bound may only use sizes and integer constants",
                expr.span,
            )
        case syntax.UnaryOp(op="-", operand=operand):
            return -where_bound(operand, sizes, tensors)
        case syntax.CastExpr(type_name=t, operand=operand) if t.startswith(("int", "uint")):
            return where_bound(operand, sizes, tensors)
        case syntax.BinaryOp(op=op, lhs=a, rhs=b) if op in ("+", "-", "*", "/", "%", "min", "max"):
            x, y = where_bound(a, sizes, tensors), where_bound(b, sizes, tensors)
            if op in ("/", "%") and y == 0:
                raise SemanticError("division by zero in a range bound", expr.span)
            return {
                "+": lambda: x + y,
                "-": lambda: x - y,
                "*": lambda: x * y,
                "/": lambda: sympy.floor(x / y),
                "%": lambda: sympy.Mod(x, y),
                "min": lambda: sympy.Min(x, y),
                "max": lambda: sympy.Max(x, y),
            }[op]()
    raise SemanticError("this expression cannot be used as a range bound", expr.span)
