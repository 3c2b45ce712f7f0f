"""planning: LoopAst → C-like pseudo-code of the loop nest (for `inspect("loops")` and `--emit loops`)."""

from __future__ import annotations

from collections.abc import Mapping

import islpy as isl

from polyhedral import Scop, StatementKind
from polyhedral.contraction import ContractionPlan
from polyhedral.convolution import ConvPlan
from tensorlang import ir

from .astgen import LoopAst

_IDENTITY = {"+": "0", "*": "1", "min": "+inf", "max": "-inf"}


def _expr(e: ir.Expr, names: dict[str, str]) -> str:
    match e:
        case ir.IndexRef(name=n):
            return names.get(n, n)
        case ir.Read(tensor=t, indices=ix):
            return t + "".join(f"[{_expr(i, names)}]" for i in ix)
        case ir.Const() | ir.SizeRef():
            return str(e)
        case ir.Unary(op=op, operand=o):
            return f"{op}{_expr(o, names)}"
        case ir.Binary(op="min" | "max", lhs=a, rhs=b):
            return f"{e.op}({_expr(a, names)}, {_expr(b, names)})"
        case ir.Binary(op=op, lhs=a, rhs=b):
            return f"({_expr(a, names)} {op} {_expr(b, names)})"
        case ir.Select(cond=c, if_true=t, if_false=f):
            return f"({_expr(c, names)} ? {_expr(t, names)} : {_expr(f, names)})"
        case ir.Cast(operand=o):
            return f"({e.dtype}){_expr(o, names)}"
        case ir.Call(function=fn, args=args):
            return f"{fn}({', '.join(_expr(a, names) for a in args)})"
    return str(e)


def statement_text(
    scop: Scop, name: str, index_names: dict[str, str], plans: Mapping[str, ContractionPlan | ConvPlan]
) -> str:
    """One statement instance as C, with index variables replaced by loop expressions."""
    stmt = scop.statement(name)
    st = stmt.statement
    plan = plans.get(name)
    if isinstance(plan, ConvPlan):  # one call covers f, x and the taps at this point
        ranges = {r.var: r for r in st.ranges}
        inner = [v for v, _ in plan.extent]
        dims = ", ".join(f"{v} in {ranges[v].lo}:{ranges[v].hi}" for v in inner)
        names = {**index_names, **{v: v for v in inner}}
        out = plan.out.tensor + "".join(f"[{names.get(v, v)}]" for v in st.indices)
        return f"conv({dims}): {out} += {_expr(st.rhs, names)};"
    if plan is not None:
        ranges = {r.var: r for r in st.ranges}
        dims = ", ".join(f"{v} in {ranges[v].lo}:{ranges[v].hi}" for v in (plan.m, plan.n, plan.k))
        names = {**index_names, plan.m: plan.m, plan.n: plan.n, plan.k: plan.k}
        c = plan.c.tensor + "".join(f"[{index_names.get(v, v)}]" for v in st.indices)
        return f"gemm({dims}): {c} += {_expr(st.rhs, names)};"
    lhs = st.tensor + "".join(f"[{_expr(x, index_names)}]" for x in st.lhs)
    if stmt.kind is StatementKind.INIT:
        return f"{lhs} = {_IDENTITY[st.op]};"
    rhs = _expr(st.rhs, index_names)
    if st.op == "=":
        return f"{lhs} = {rhs};"
    if st.op in ("+", "*"):
        return f"{lhs} {st.op}= {rhs};"
    return f"{lhs} = {st.op}({lhs}, {rhs});"


def loops_text(
    scop: Scop,
    ast: LoopAst,
    plans: Mapping[str, ContractionPlan | ConvPlan] | None = None,
    prefetch: Mapping[str, tuple[str, ...]] | None = None,
    pipelined: set[str] | None = None,
) -> str:
    """`prefetch`: outer loop annotation → tensors its iterations prefetch one iteration ahead;
    `pipelined`: annotations of row-pipelined outer loops (codegen/pipeline.py)."""
    plans = plans or {}
    prefetch = prefetch or {}
    pipelined = pipelined or set()
    lines: list[str] = []

    def emit(node: isl.AstNode, depth: int) -> None:
        pad = "  " * depth
        t = node.get_type()
        NT = isl.ast_node_type
        if t == NT.block:
            children = node.block_get_children()
            for i in range(children.n_ast_node()):
                emit(children.get_at(i), depth)
        elif t == NT.mark:
            lines.append(f"{pad}// {node.mark_get_id().get_name()}")
            emit(node.mark_get_node(), depth)
        elif t == NT.user:
            leaf = ast.leaves[node.get_annotation().get_name()]
            names = {v: e.to_C_str() for v, e in leaf.index_exprs}
            lines.append(f"{pad}{statement_text(scop, leaf.statement, names, plans)}  // {leaf.statement}")
        elif t == NT.if_:
            lines.append(f"{pad}if ({node.if_get_cond().to_C_str()}) {{")
            emit(node.if_get_then_node(), depth + 1)
            if node.if_has_else_node():
                lines.append(f"{pad}}} else {{")
                emit(node.if_get_else_node(), depth + 1)
            lines.append(f"{pad}}}")
        elif t == NT.for_:
            it = node.for_get_iterator().to_C_str()
            init = node.for_get_init().to_C_str()
            if node.for_is_degenerate():
                lines.append(f"{pad}{{ // {it} = {init}")
            else:
                cond = node.for_get_cond().to_C_str()
                inc = node.for_get_inc().to_C_str()
                fetched = prefetch.get(node.get_annotation().get_name())
                if node.get_annotation().get_name() in pipelined:
                    lines.append(
                        f"{pad}// pipelined: the last inner loop of iteration {it} runs in the loop before it "
                        f"during iteration {it} + {inc}"
                    )
                if fetched:
                    lines.append(
                        f"{pad}// each iteration prefetches what the next reads of {', '.join(fetched)}"
                    )
                lines.append(f"{pad}for (int64 {it} = {init}; {cond}; {it} += {inc}) {{")
            emit(node.for_get_body(), depth + 1)
            lines.append(f"{pad}}}")

    emit(ast.root, 0)
    return "\n".join(lines)
