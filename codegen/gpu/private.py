"""gpu: a thread-per-iteration phase → the temporaries each thread keeps in a register.

An elementwise chain written with named intermediates (`t1(i) = a(i) * b(i) + c(i)`, then
`t2(i) = tanh(t1(i))`, ...) is fused into one loop, and on the CPU its temporaries are
contracted to a slice per thread. On the GPU each thread runs one iteration of the mapped
loops, so a temporary that the thread alone writes and reads needs no memory at all: storing
every intermediate to global memory and reading it back (a 64 Mi-element tanh chain moves seven
arrays instead of four) is most of such a kernel's time.

A temporary is private to the thread when
* no statement outside the phase touches it, and it is not stored modulo a distance (folded);
* every access in the phase (writes, reads, reduction inits) has the same affine subscripts,
  in the mapped loops' iterators and constants only — so each thread touches one element; and
* each mapped iterator stands alone (with coefficient ±1, plus a constant) in some subscript —
  so two threads never touch the same element.
Then the element is a zero-initialised local (`+=` without `!` starts from zero, as the runtime's
memset does for the full tensor), which LLVM promotes to a register.
"""

from __future__ import annotations

from collections.abc import Sequence

from tensorlang import ir

from ..planning.astgen import leaves_under
from ..planning.plan import KernelPlan
from .rows import _subscripts, _tensors


def thread_private(plan: KernelPlan, phase, iterators: Sequence[str]) -> tuple[str, ...]:
    """The temporaries of `phase` (an AST phase whose mapped loops are `iterators`, one
    iteration per thread) that each thread can keep in a register."""
    if not iterators:
        return ()
    candidates = {t.name for t in plan.program.temporaries} - set(plan.folded)
    inside = set(phase.statements)
    for poly in plan.scop.statements:
        if poly.name not in inside:
            candidates -= _tensors(poly)
    seen: dict[str, set] = {}
    for leaf in leaves_under(phase.node, plan.ast.leaves) or ():
        poly = plan.scop.statement(leaf.statement)
        st = poly.statement
        exprs = dict(leaf.index_exprs)
        accesses = [(st.tensor, st.lhs)]
        if poly.kind != "init":
            accesses += [(r.tensor, r.indices) for r in ir.walk(st.rhs) if isinstance(r, ir.Read)]
            accesses += [
                (r.tensor, r.indices) for sub in st.lhs for r in ir.walk(sub) if isinstance(r, ir.Read)
            ]
        for tensor, subscripts in accesses:
            if tensor in candidates:
                seen.setdefault(tensor, set()).add(_subscripts(tuple(subscripts), exprs))
    mapped = set(iterators)
    private = []
    for tensor in sorted(candidates & set(seen)):
        forms = seen[tensor]
        if len(forms) != 1 or None in forms:
            continue
        (subs,) = forms
        names = {name for sub in subs for name, _ in sub if name}
        alone = {
            name
            for sub in subs
            for name, coeff in sub
            if name and abs(coeff) == 1 and {n for n, _ in sub if n} == {name}
        }
        if names <= mapped and alone == mapped:
            private.append(tensor)
    return tuple(private)
