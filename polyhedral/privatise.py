"""polyhedral: Scop + a set of statements → the reduction targets threads may privatise, and the dependences left without them.

A loop whose iterations depend on each other only through reductions into one tensor (atax's
`y(j) +=! A(i, j) * t(i)` inside a loop over i) can still run on several threads: each thread
accumulates into its own copy of the tensor, started at the reduction's identity, and the
copies are combined into the tensor once every thread is done. The language leaves the order
of a reduction's terms unspecified (tensorlang/ir.py `Statement`), so the regrouping is a
legal order, not an approximation. The tensor qualifies, within the statements considered, when
  * every statement that computes into it is a reduction (`op=`) with one common operator,
    whose right-hand side does not read it and which is not a scatter;
  * its only other writers are those statements' own initialisations (`op=!`), which come
    before every update in program order (the copies are combined after them);
  * no other statement there reads it, and it is not an input.
The dependences between its writers are then all through that tensor, and dropping them is
what privatisation buys.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import islpy as isl

from .scop import Scop, StatementKind


def private_reductions(scop: Scop, names: Iterable[str]) -> dict[str, str]:
    """Tensor → reduction operator, for the tensors the statements `names` may privatise."""
    # (an initialisation is scheduled with its own statement, so those of the candidates' writers
    # are the only initialisations of a candidate here)
    chosen = [scop.statement(n) for n in names]
    candidates: dict[str, str] = {}
    refused: set[str] = set()
    for s in chosen:
        st = s.statement
        if s.kind is not StatementKind.BODY:
            continue
        tensor = st.tensor
        ok = (
            st.op != "="
            and not st.is_scatter
            and scop.program.tensor(tensor).role != "input"
            and all(a.tensor != tensor for a in s.reads if a.read is not None)  # None: its own element
            and candidates.get(tensor, st.op) == st.op
        )
        if ok:
            candidates[tensor] = st.op
        else:
            refused.add(tensor)
    for s in chosen:
        for a in s.reads:
            if a.tensor in candidates and a.read is not None:  # read by a statement not reducing into it
                refused.add(a.tensor)
    return {t: op for t, op in candidates.items() if t not in refused}


def writers(scop: Scop, names: Iterable[str], tensors: Iterable[str]) -> set[str]:
    """The statements among `names` that write one of `tensors` (updates and initialisations)."""
    wanted = set(tensors)
    return {n for n in names if scop.statement(n).statement.tensor in wanted}


def without_private(deps: isl.UnionMap, private_writers: set[str]) -> isl.UnionMap:
    """`deps` less the dependences from one writer of a privatised tensor to another."""
    if not private_writers:
        return deps
    kept = isl.UnionMap.empty(deps.get_space())
    for m in _maps(deps):
        source, sink = m.get_tuple_name(isl.dim_type.in_), m.get_tuple_name(isl.dim_type.out)
        if source in private_writers and sink in private_writers:
            continue
        kept = kept.union(isl.UnionMap.from_map(m))
    return kept


def privatised_dependences(
    scop: Scop, names: Iterable[str], deps: isl.UnionMap
) -> tuple[Mapping[str, str], isl.UnionMap]:
    """(the tensors `names` may privatise → their operators, `deps` without what they carry)."""
    names = list(names)
    private = private_reductions(scop, names)
    return private, without_private(deps, writers(scop, names, private))


def _maps(umap: isl.UnionMap) -> list[isl.Map]:
    out: list[isl.Map] = []
    umap.foreach_map(out.append)
    return out
