"""planning: GEMM plans + the loop AST → the phases whose zeroing of C the next phase's GEMM folds in."""

from __future__ import annotations

from collections.abc import Mapping

from polyhedral import Scop, StatementKind
from polyhedral.contraction import ContractionPlan, calls_cover
from polyhedral.sizes import compile_size_expr

from .astgen import LoopAst


def folded_inits(
    scop: Scop, ast: LoopAst, contractions: Mapping[str, ContractionPlan], sizes: Mapping[str, int] | None
) -> set[int]:
    """Phases that only zero the C of the GEMM the next phase runs, which can store its first K
    block instead (saving a pass over C and, on threads, a dispatch): the next phase holds only
    that contraction, whose calls cover exactly the cells the init zeroes — every variable looped
    around the GEMM indexes the output (a reduction variable there, as in a convolution's kh and
    kw, would add to the same C again), its only reduction variable is the GEMM's k, and a call
    runs at every outer point the init zeroes: K is not empty (else no call would run), or, in a
    generic kernel, the projected domain keeps no condition on K (a call with K empty zeroes C)."""
    found = set()
    for n in range(len(ast.phases) - 1):
        inits, body = ast.phases[n].statements, ast.phases[n + 1].statements
        if len(inits) != 1 or len(body) != 1 or body[0] not in contractions:
            continue
        init = inits[0]
        gemm = contractions[body[0]]
        init_stmt, stmt = scop.statement(init), scop.statement(gemm.statement)
        if init_stmt.kind is not StatementKind.INIT or init_stmt.position != stmt.position:
            continue
        st = stmt.statement
        if set(gemm.outer) | {gemm.m, gemm.n} != set(st.indices) or set(st.all_indices) - set(st.indices) != {
            gemm.k
        }:
            continue
        if sizes is not None:
            k = st.range_of(gemm.k)
            if compile_size_expr(k.hi)(sizes) - compile_size_expr(k.lo)(sizes) <= 0:
                continue
        elif not calls_cover(init_stmt, stmt, (gemm.m, gemm.n)):
            continue  # a generic kernel: the calls must run for every size, empty K included
        found.add(n)
    return found
