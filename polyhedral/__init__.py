"""polyhedral: ir.Program → Scop (isl domains, accesses, dependences, bounds proofs)."""

from .scop import BoundsCheck, Dependences, PolyStatement, Scop, StatementKind, build_scop

__all__ = ["BoundsCheck", "Dependences", "PolyStatement", "Scop", "StatementKind", "build_scop"]
