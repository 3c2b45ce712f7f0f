"""scheduler: ir.Program → OpGraph (statements as nodes, the tensors they pass as edges)."""

from __future__ import annotations

from dataclasses import dataclass

from polyhedral.contraction import is_contraction
from tensorlang import ir


@dataclass(frozen=True)
class OpNode:
    """One statement: what it writes, how (kind), and what it reads."""

    position: int
    tensor: str
    kind: str  # "contraction" (C += A·B, GEMM-able), "reduction", or "elementwise"
    reads: tuple[str, ...]
    text: str


@dataclass(frozen=True)
class OpEdge:
    """`consumer` reads `tensor`, last written before it by `producer`."""

    producer: int
    consumer: int
    tensor: str


@dataclass(frozen=True)
class OpGraph:
    nodes: tuple[OpNode, ...]
    edges: tuple[OpEdge, ...]

    def producers(self, position: int) -> set[int]:
        return {e.producer for e in self.edges if e.consumer == position}

    def __str__(self) -> str:
        lines = [f"S{n.position} [{n.kind}] {n.text}" for n in self.nodes]
        lines += [f"S{e.producer} -> S{e.consumer} ({e.tensor})" for e in self.edges]
        return "\n".join(lines)


def _kind(st: ir.Statement) -> str:
    if is_contraction(st):
        return "contraction"
    return "reduction" if st.reduction_indices else "elementwise"


def build_graph(program: ir.Program) -> OpGraph:
    nodes = []
    edges = []
    last_writer: dict[str, int] = {}
    for pos, st in enumerate(program.statements):
        reads = tuple(dict.fromkeys(e.tensor for e in ir.walk(st.rhs) if isinstance(e, ir.Read)))
        if st.op != "=" or st.tensor in reads:
            reads = tuple(dict.fromkeys((*reads, st.tensor))) if st.tensor in last_writer else reads
        nodes.append(OpNode(pos, st.tensor, _kind(st), reads, str(st)))
        for t in reads:
            if t in last_writer:
                edges.append(OpEdge(last_writer[t], pos, t))
        last_writer[st.tensor] = pos
    return OpGraph(tuple(nodes), tuple(edges))
