"""autodiff: source text of `def f(inputs) -> (outputs)` → source text of `def f_grad(inputs, d<outputs>) -> (d<wrt>)`.

The gradient program recomputes the forward (it saves nothing, so its inputs are the forward's
inputs plus one adjoint per floating-point output), then computes the adjoints, visiting the
forward statements last to first. Its outputs are the gradients of the `wrt` inputs (every
floating-point input by default), declared with their type and shape.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import sympy

from .. import ir, syntax
from ..checker import check_def
from ..errors import InternalError, SemanticError, Source, TensorLangWarning
from ..frontend import select_def
from ..parser import parse
from . import emit
from .exprs import const, reads
from .names import Names
from .reverse import Generated, Reverse
from .rules import ZERO_DERIVATIVE
from .versions import Version, build, recompute


def grad(
    source: str,
    name: str | None = None,
    *,
    wrt: str | Sequence[str] | None = None,
    filename: str = "<source>",
) -> str:
    """The text of a tensorlang program computing the gradients of def `name` (see the module doc).

    wrt: the inputs to differentiate with respect to (a name, a comma-separated list or a sequence
    of names); by default every floating-point input. Raises a located SemanticError for a name that
    is not an input or is an integer or bool input, and for a construct whose gradient tensorlang
    cannot express yet. The adjoint of a gather `T(I(b), e)` is a scatter-add, `dT(I(b), e) +=! ...`.
    """
    src = Source(source, filename)
    module = parse(src)
    definition = select_def(module, name)
    with warnings.catch_warnings():
        warnings.simplefilter(
            "ignore", TensorLangWarning
        )  # the forward's own warnings: tl.compile gives them
        program = check_def(definition, src)
    program.verify()
    chosen = _wrt(program, definition, wrt)
    for st in program.statements:
        if st.is_scatter:
            raise SemanticError(
                "tl.grad: the gradient through a scatter (a data-dependent left-hand side) is not "
                "supported yet",
                st.span,
            )

    used = {t.name for t in program.tensors} | {s.name for s in program.sizes} | {definition.name.name}
    for st in program.statements:
        used |= set(st.all_indices)
    for sy in definition.statements:
        used |= {w.var.name for w in sy.wheres if isinstance(w, syntax.WhereLet)}
    names = Names(used)
    versions, steps = build(program, definition, names)
    sizes = {s.name for s in program.sizes}
    shapes: dict[str, tuple[sympy.Expr, ...]] = {v.name: v.shape for v in versions.values()}

    final: dict[str, Version] = {}
    for v in versions.values():
        if v.tensor not in final or v.number > final[v.tensor].number:
            final[v.tensor] = v
    # one adjoint input per floating-point output; output extents that are not a size get one
    adjoint_params: list[str] = []
    seeds: dict[str, str] = {}
    for out in program.outputs:
        if not out.dtype.is_float:
            continue
        d_name = names.take(f"d{out.name}")
        dims, shape = [], []
        for k, extent in enumerate(out.shape):
            extent = sympy.simplify(extent)
            if extent.is_Integer:
                dims.append(str(int(extent)))
                shape.append(extent)
            elif extent.is_Symbol and extent.name in sizes:
                dims.append(extent.name)
                shape.append(extent)
            else:
                size = names.take(f"{out.name}_{k}")
                sizes.add(size)
                dims.append(size)
                shape.append(ir.size_symbol(size))
        shapes[d_name] = tuple(shape)
        type_text = emit.type_name(out.dtype)
        adjoint_params.append(f"{type_text}({', '.join(dims)}) {d_name}" if dims else f"{type_text} {d_name}")
        seeds[out.name] = d_name
    if not seeds:
        raise SemanticError(
            f"tl.grad: {program.name} has no floating-point output to differentiate", definition.name.span
        )
    grad_names = {x: names.take(f"d{x}") for x in chosen}

    needs = _needs(steps, set(chosen))
    reverse = Reverse(versions, steps, needs, names, sizes)
    for out_name, d_name in seeds.items():
        reverse.seed_output(final[out_name], d_name)
    for x, d_name in grad_names.items():
        reverse.fix_name(versions[x], d_name)
    generated = reverse.run()
    written = {g.tensor for g in generated}
    for x, d_name in grad_names.items():
        if d_name not in written:  # no output depends on x
            v = versions[x]
            idx = tuple(names.index("i") for _ in v.shape)
            generated.append(
                Generated(
                    d_name,
                    idx,
                    "=",
                    const(0.0, v.dtype),
                    tuple((i, sympy.Integer(0), e) for i, e in zip(idx, v.shape)),
                )
            )
    shapes |= reverse.shapes

    # the forward, recomputed (renamed to versions), then the adjoints; drop what nothing needs
    annotated = {p.name.name: p.type.type_name for p in definition.returns if p.type is not None}
    current = {t.name: t.name for t in program.inputs}
    forward: list[syntax.Statement] = []
    for step in steps:
        forward += recompute(step, current, annotated, names)
        current[step.new.tensor] = step.new.name
    tensors = set(shapes)
    forward_reads = [emit.syntax_reads(s, tensors) for s in forward]
    all_targets = [s.tensor.name for s in forward] + [g.tensor for g in generated]
    all_reads = forward_reads + [{r.tensor for r in reads(g.rhs) + g.subscript_reads} for g in generated]
    live = _live(all_targets, all_reads, set(grad_names.values()))
    forward = [s for s, keep in zip(forward, live) if keep]
    backward = []
    seen: set[str] = set()
    for g, keep in zip(generated, live[len(all_targets) - len(generated) :]):
        if keep:
            backward.append(emit.to_statement(g, shapes, sizes, g.tensor in seen))
            seen.add(g.tensor)

    params = [str(p) for p in definition.params] + adjoint_params
    inputs = {p.name.name: p for p in definition.params}
    returns = [f"{inputs[x].type} {d}" for x, d in grad_names.items()]
    text = emit.print_def(names.take(f"{program.name}_grad"), params, returns, forward, backward)
    _self_check(text)
    return text


def _wrt(program: ir.Program, definition: syntax.Def, wrt) -> list[str]:
    floats = [t.name for t in program.inputs if t.dtype.is_float]
    if wrt is None:
        if not floats:
            raise SemanticError(
                f"tl.grad: {program.name} has no floating-point input to differentiate", definition.name.span
            )
        return floats
    requested = [w.strip() for w in wrt.split(",")] if isinstance(wrt, str) else list(wrt)
    params = {p.name.name: p for p in definition.params}
    for w in requested:
        if w not in params:
            raise SemanticError(
                f"tl.grad: wrt names {w!r}, which is not an input of {program.name} "
                f"(its inputs: {', '.join(params)})",
                definition.name.span,
            )
        tensor = program.tensor(w)
        if not tensor.dtype.is_float:
            raise SemanticError(
                f"tl.grad: {w} is a {tensor.dtype} input and has no gradient; wrt may only name "
                f"floating-point inputs ({', '.join(floats) or 'none here'})",
                params[w].name.span,
            )
    if not requested:
        raise SemanticError("tl.grad: wrt names no input", definition.name.span)
    return list(dict.fromkeys(requested))


def _value_reads(e: ir.Expr) -> list[ir.Read]:
    """The reads whose value can reach `e`'s value differentiably (not subscripts or conditions)."""
    match e:
        case ir.Read():
            return [e] if e.dtype.is_float else []
        case _ if not e.dtype.is_float:
            return []
        case ir.Select(if_true=t, if_false=f):
            return _value_reads(t) + _value_reads(f)
        case ir.Call(function=f) if f in ZERO_DERIVATIVE:
            return []
    return [r for c in ir.children(e) for r in _value_reads(c)]


def _needs(steps, wrt: set[str]) -> set[str]:
    """The versions whose value depends on a wrt input."""
    needs = set(wrt)
    for step in steps:
        if any(r.tensor in needs for r in _value_reads(step.rhs)) or (
            step.old is not None and step.old.name in needs
        ):
            needs.add(step.new.name)
    return needs


def _live(targets: list[str], reads_of: list[set[str]], outputs: set[str]) -> list[bool]:
    needed = set(outputs)
    keep = [False] * len(targets)
    for k in range(len(targets) - 1, -1, -1):
        if targets[k] in needed:
            keep[k] = True
            needed |= reads_of[k]
    return keep


def _self_check(text: str) -> None:
    """The generated program must be valid tensorlang; anything else is a bug here, said loudly."""
    from ..frontend import check_source

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", TensorLangWarning)
            check_source(text, filename="<tl.grad>")
    except SemanticError as error:
        raise InternalError(f"tl.grad generated a program that does not check:\n{text}\n{error}") from error
