"""planning: Schedule + Scop + sizes → storage folding (temporaries stored modulo their dependence distance).

A stencil written as a time recurrence `B(t, i) = f(B(t-1, ...))` names every plane of B, but
at any moment only the planes between the last write of an element and its last read are live:
two for jacobi, three for a two-step recurrence. Storing dimension `d` of B modulo `m` (element
e in slot `e_d mod m`) is legal iff, for every read r of an element e and every write w of e
before r, no write w' of another element e' of the same slot (e'_d ≡ e_d mod m, the other
coordinates equal) can run between w and r: w' must run before w or after r. w' may be r
itself, because a statement instance evaluates all its reads before it stores. The check asks
for this in the direction the recurrence runs, which is sufficient: a write of an element
*earlier* along d must run before every write of e, and a write of a *later* one after every
read of e (a program that fills planes backwards is not folded).

The check is exact (isl, at the call's sizes) and reads the schedule that the kernel's AST is
built from, whatever it is (time-tiled or not). Loops that carry no dependence may run their
iterations on several threads at once, so "before" is the order of the schedule in which two
instances first differ at a dimension that carries a dependence; instances that first differ at
a dimension that carries none are unordered, and a conflicting write unordered with w or r
makes the modulus illegal. For each dimension along which the temporary's own statements read
it at non-negative distances (one at least), the moduli 1, 2, ... up to two past the largest
distance are tried and the smallest legal one wins; a temporary with none (or one that is
accumulated, scattered, touched by a GEMM or convolution call, or contracted) keeps its full
storage. Outputs and inputs are never folded. When the schedule forbids a folding that the
source order allows, fold_storage schedules again with the dependences the folding adds.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass

import islpy as isl

from polyhedral import Scop, StatementKind
from polyhedral.scop import Dependences, original_order
from polyhedral.sizes import compile_size_expr
from scheduler import Schedule, compute_schedule, padded_schedule
from tensorlang import ir

#: Moduli tried past the largest dependence distance along a dimension (a statement that reads
#: planes further back than the recurrence itself needs more than distance + 1 slots).
EXTRA_SLOTS = 2

#: Rows of a folded temporary's last dimension at least this long (bytes) whose length is not a
#: multiple of ROW_ALIGN are padded to one, so that every row starts at the same offset in a
#: cache line: jacobi's rows i-1, i and i+1 then load as aligned vectors (lowering/row_vectors.py;
#: 1000-float rows: 4.5 against 6.7 ms a 1000^2 x 100 sweep, README). Logical shape unchanged.
ROW_ALIGN = 64
MIN_PADDED_ROW = 256


def padded_pitch(shape: Sequence[int], dim: int, itemsize: int) -> int | None:
    """The padded extent of the last dimension of a temporary folded along `dim`, or None."""
    if len(shape) < 2 or dim == len(shape) - 1:
        return None
    row = shape[-1] * itemsize
    if row < MIN_PADDED_ROW or row % ROW_ALIGN == 0 or ROW_ALIGN % itemsize:
        return None
    return -(-row // ROW_ALIGN) * ROW_ALIGN // itemsize


@dataclass(frozen=True)
class FoldedTemporary:
    """Temporary `tensor` stored modulo `modulus` along dimension `dim` (`extent` logically)."""

    tensor: str
    dim: int
    modulus: int
    extent: int
    folded_bytes: int
    full_bytes: int
    label: str  # how the sources name the dimension (the index variable writing it), for reports
    row: int | None = None  # the last dimension's extent, when its rows are padded ...
    pitch: int | None = None  # ... to this many elements (None: not padded)

    @property
    def saved_bytes(self) -> int:
        return self.full_bytes - self.folded_bytes

    @property
    def allocated_bytes(self) -> int:
        """The bytes allocated: the folded planes, with their rows padded to the pitch."""
        return self.folded_bytes if self.pitch is None else self.folded_bytes // self.row * self.pitch

    def storage_shape(self, shape: Sequence[int]) -> tuple[int, ...]:
        return tuple(self.modulus if d == self.dim else e for d, e in enumerate(shape))

    def describe(self) -> str:
        return (
            f"// {self.tensor}: folded modulo {self.modulus} along dimension {self.dim} ({self.label}): "
            f"{self.modulus} of {self.extent} planes, {self.folded_bytes} of {self.full_bytes} bytes "
            f"(saves {self.saved_bytes / 2**20:.2f} MiB)"
            + (f"; rows padded from {self.row} to {self.pitch} elements" if self.pitch is not None else "")
        )


def storage_shape(folded: Mapping[str, tuple[int, int]], name: str, shape: Sequence[int]) -> tuple[int, ...]:
    """The allocated shape of `name` given `folded` (tensor → (dim, modulus)): its logical shape,
    with the folded dimension's extent replaced by the modulus."""
    fold = folded.get(name)
    if fold is None:
        return tuple(shape)
    return tuple(fold[1] if d == fold[0] else e for d, e in enumerate(shape))


def plan_folding(
    scop: Scop,
    schedule_map: isl.UnionMap,
    shapes: Mapping[str, tuple[int, ...]],
    sizes: Mapping[str, int],
    skip: set[str],
) -> dict[str, FoldedTemporary]:
    """The temporaries to fold for these sizes (`skip`: temporaries not to fold; those read or
    written by GEMM or convolution calls never are). `schedule_map` is the map the kernel's AST
    is built from."""
    candidates = _candidates(scop, skip)
    if not candidates:
        return {}
    context = scop.params.fixed_context(sizes)
    domain = scop.domain().intersect_params(context)
    sched = padded_schedule(schedule_map.intersect_domain(domain))
    if sched is None:
        return {}
    order = _happens_before(sched, scop.dependences.all.intersect_params(context))
    out: dict[str, FoldedTemporary] = {}
    for tensor, (writes, reads) in candidates.items():
        writes, reads = writes.intersect_params(context), reads.intersect_params(context)
        shape = shapes[tensor.name]
        found = _fold_tensor(tensor, shape, writes, reads, sched, order)
        if found is not None:
            dim, modulus = found
            itemsize = tensor.dtype.storage_bytes
            full = math.prod(shape) * itemsize
            folded = full // shape[dim] * modulus
            label = _label(scop, tensor.name, dim)
            pitch = padded_pitch(shape, dim, itemsize) if folded else None
            row = shape[-1] if pitch is not None else None
            out[tensor.name] = FoldedTemporary(
                tensor.name, dim, modulus, shape[dim], folded, full, label, row, pitch
            )
    return out


def _candidates(scop: Scop, skip: set[str]) -> dict[ir.Tensor, tuple[isl.UnionMap, isl.UnionMap]]:
    """Temporaries whose every access is affine, written only by plain `=` statements: their
    writes and reads (each read under its guard where the guard is affine)."""
    program = scop.program
    temporaries = {t.name: t for t in program.temporaries if t.name not in skip}
    space = scop.domain().get_space()
    found: dict[str, tuple[isl.UnionMap, isl.UnionMap]] = {}
    bad: set[str] = set()
    for s in scop.statements:
        for a in s.accesses:
            if a.tensor not in temporaries:
                continue
            st = s.statement
            if not a.exact or (a.is_write and (s.kind is not StatementKind.BODY or st.op != "=")):
                bad.add(a.tensor)
                continue
            if s.projected is not None:  # a GEMM call runs this statement's inner loops
                bad.add(a.tensor)
                continue
            relation = a.relation if a.guard is None or a.is_write else a.relation.intersect_domain(a.guard)
            writes, reads = found.get(a.tensor, (isl.UnionMap.empty(space), isl.UnionMap.empty(space)))
            if a.is_write:
                writes = writes.union(isl.UnionMap.from_map(relation))
            else:
                reads = reads.union(isl.UnionMap.from_map(relation))
            found[a.tensor] = (writes, reads)
    return {
        temporaries[name]: wr
        for name, wr in found.items()
        if name not in bad and not wr[0].is_empty() and not wr[1].is_empty()
    }


def _prefix_equal(space: isl.Space, k: int) -> isl.Map:
    m = isl.Map.universe(space)
    for d in range(k):
        m = m.equate(isl.dim_type.in_, d, isl.dim_type.out, d)
    return m


def _happens_before(sched: isl.UnionMap, deps: isl.UnionMap) -> isl.UnionMap:
    """Schedule point → schedule point surely run after it: the schedule's lexicographic order,
    where points that first differ at a dimension carrying no dependence (a loop that may run
    in parallel) are left unordered."""
    maps: list[isl.Map] = []
    sched.foreach_map(maps.append)
    space = isl.Space.map_from_set(maps[0].range().get_space())
    width = maps[0].dim(isl.dim_type.out)
    carried = deps.apply_domain(sched).apply_range(sched)
    carried_maps: list[isl.Map] = []
    carried.foreach_map(carried_maps.append)
    order = isl.Map.empty(space)
    for k in range(width):
        later = _prefix_equal(space, k).order_lt(isl.dim_type.in_, k, isl.dim_type.out, k)
        if any(not m.intersect(later).is_empty() for m in carried_maps):
            order = order.union(later)
    return isl.UnionMap.from_map(order)


def _distances(writes: isl.UnionMap, reads: isl.UnionMap, dim: int) -> tuple[int, int] | None:
    """The least and greatest of (written index − read index) along `dim` over the statement
    instances that read and write the tensor; None when there are none or they are unbounded."""
    both = writes.range_product(reads)  # instance → [written element → read element]
    if both.is_empty():
        return None
    pairs: list[isl.Map] = []
    both.range().unwrap().foreach_map(pairs.append)
    lo, hi = None, None
    for m in pairs:
        delta = m.deltas()  # read − written
        for bound in (delta.dim_min(dim), delta.dim_max(dim)):
            value = _constant(bound)
            if value is None:
                return None
            value = -value
            lo = value if lo is None else min(lo, value)
            hi = value if hi is None else max(hi, value)
    return (lo, hi) if lo is not None else None


def _constant(pa: isl.PwAff) -> int | None:
    pieces = pa.get_pieces()
    values = set()
    for _, aff in pieces:
        if not aff.is_cst():
            return None
        v = aff.get_constant_val()
        if not v.is_int():
            return None
        values.add(v.to_python())
    return values.pop() if len(values) == 1 else None


def _fold_tensor(
    tensor: ir.Tensor,
    shape: tuple[int, ...],
    writes: isl.UnionMap,
    reads: isl.UnionMap,
    sched: isl.UnionMap,
    order: isl.UnionMap,
) -> tuple[int, int] | None:
    """(dimension, modulus) of the best legal folding of one temporary, or None."""
    best: tuple[int, int, int] | None = None  # (bytes, dim, modulus)
    for dim in range(tensor.rank):
        span = _distances(writes, reads, dim)
        if span is None or span[0] < 0 or span[1] < 1:
            continue  # no recurrence along this dimension that moves forward
        for modulus in range(1, min(span[1] + 1 + EXTRA_SLOTS, shape[dim] - 1) + 1):
            if modulus >= shape[dim]:
                break
            if best is not None and modulus * best[2] >= best[0] * shape[dim]:
                break  # no smaller than the folding already found
            if _legal(tensor, dim, modulus, (writes, reads), sched, order):
                size = math.prod(shape) // shape[dim] * modulus
                if best is None or size < best[0]:
                    best = (size, dim, modulus)
                break
    return (best[1], best[2]) if best is not None else None


def _same_slot(tensor: ir.Tensor, space: isl.Space, dim: int, modulus: int, later: bool) -> isl.UnionMap:
    """Element → another element stored in the same slot when `dim` is stored modulo `modulus`,
    further along `dim` (`later`) or before it (`space`: a space with the parameters to align to)."""
    names = [f"e{d}" for d in range(tensor.rank)]
    other = [f"{v}p" if d == dim else v for d, v in enumerate(names)]
    text = (
        f"{{ {tensor.name}[{', '.join(names)}] -> {tensor.name}[{', '.join(other)}] : "
        f"exists q : {other[dim]} = {names[dim]} + {modulus} q and q {'>' if later else '<'} 0 }}"
    )
    same = isl.Map.read_from_str(space.get_ctx(), text).align_params(space)
    return isl.UnionMap.from_map(same)


def _legal(
    tensor: ir.Tensor,
    dim: int,
    modulus: int,
    accesses: tuple[isl.UnionMap, isl.UnionMap],
    sched: isl.UnionMap,
    order: isl.UnionMap,
) -> bool:
    """Whether storing `dim` of `tensor` modulo `modulus` keeps every read's value: each write of
    an element the slot held before must run before every write of e (so the slot holds e once
    e is written), and each write of an element the slot holds after e must run after every read
    of e, or be that read's own instance (module docstring). `order` is in schedule space."""
    writes, reads = accesses
    space = writes.get_space()
    # w → w': w' writes an earlier element of w's slot; w' must run first
    earlier = writes.apply_range(_same_slot(tensor, space, dim, modulus, False)).apply_range(writes.reverse())
    if not _ordered(earlier.reverse(), sched, order):
        return False
    # r → w': w' writes a later element of the slot r reads; w' must run after r (or be r)
    later = reads.apply_range(_same_slot(tensor, space, dim, modulus, True)).apply_range(writes.reverse())
    later = later.subtract(reads.domain().identity())
    return _ordered(later, sched, order)


def _ordered(pairs: isl.UnionMap, sched: isl.UnionMap, order: isl.UnionMap) -> bool:
    """Whether every instance pair a → b surely runs a before b."""
    if pairs.is_empty():
        return True
    return pairs.apply_domain(sched).apply_range(sched).is_subset(order)


def _label(scop: Scop, tensor: str, dim: int) -> str:
    """The index variable that writes dimension `dim` of `tensor` (`t`), else `dimension d`."""
    for s in scop.statements:
        st = s.statement
        if st.tensor == tensor and dim < len(st.lhs) and isinstance(st.lhs[dim], ir.IndexRef):
            return st.lhs[dim].name
    return f"dimension {dim}"


def storage_dependences(scop: Scop, fold: Mapping[str, tuple[int, int]]) -> Scop:
    """`scop` with the dependences that folding `fold` (tensor → (dim, modulus)) adds: every
    read and write of a slot before every later write of that slot, in the source order (as
    anti and output dependences), so that a schedule computed for it keeps the folding legal."""
    order = original_order(scop.statements, scop.params)
    before = _lex_before(order)
    war, waw = scop.dependences.war, scop.dependences.waw
    for name, (dim, modulus) in sorted(fold.items()):
        writes = reads = isl.UnionMap.empty(scop.domain().get_space())
        for s in scop.statements:
            for a in s.accesses:
                if a.tensor == name:
                    um = isl.UnionMap.from_map(a.relation)
                    writes, reads = (writes.union(um), reads) if a.is_write else (writes, reads.union(um))
        slot = _slot_map(scop.program.tensor(name), writes.get_space(), dim, modulus)
        writes, reads = writes.apply_range(slot), reads.apply_range(slot)
        war = war.union(reads.apply_range(writes.reverse()).intersect(before))
        waw = waw.union(writes.apply_range(writes.reverse()).intersect(before))
    deps = Dependences(scop.dependences.raw, war.coalesce(), waw.coalesce())
    return dataclasses.replace(scop, dependences=deps)


def _lex_before(order: isl.UnionMap) -> isl.UnionMap:
    """Instance → instance that runs after it in `order` (a map to one common time space)."""
    maps: list[isl.Map] = []
    order.foreach_map(maps.append)
    lex = isl.Map.lex_lt(maps[0].range().get_space())
    return order.apply_range(isl.UnionMap.from_map(lex)).apply_range(order.reverse())


def _slot_map(tensor: ir.Tensor, space: isl.Space, dim: int, modulus: int) -> isl.UnionMap:
    names = [f"e{d}" for d in range(tensor.rank)]
    slots = ["s" if d == dim else v for d, v in enumerate(names)]
    text = (
        f"{{ {tensor.name}[{', '.join(names)}] -> {tensor.name}[{', '.join(slots)}] : "
        f"exists q : {names[dim]} = s + {modulus} q and 0 <= s < {modulus} }}"
    )
    return isl.UnionMap.from_map(isl.Map.read_from_str(space.get_ctx(), text).align_params(space))


def fold_storage(
    schedule: Schedule,
    enabled: bool,
    sizes: Mapping[str, int] | None,
    memo: MutableMapping[tuple, Schedule] | None,
) -> tuple[Scop, Schedule, dict[str, FoldedTemporary]]:
    """The Scop and schedule to build the loops from and the temporaries folded under it (none
    unless `enabled`; temporaries that GEMM or convolution calls touch are never folded).

    The folding is first checked against `schedule` itself. Where the source order admits a
    smaller folding than `schedule` does (isl may have scheduled a stencil's boundary pieces
    for every time step before its interior), the program is scheduled again with the
    dependences that folding adds (memoised in `memo`), and that schedule is taken when it
    keeps more of the folding."""
    scop = schedule.scop
    if not enabled or sizes is None:
        return scop, schedule, {}
    shapes = {t.name: tuple(compile_size_expr(d)(sizes) for d in t.shape) for t in scop.program.tensors}
    found = plan_folding(scop, schedule.tree.get_map(), shapes, sizes, set())
    source = plan_folding(scop, original_order(scop.statements, scop.params), shapes, sizes, set())
    better = {
        name: f
        for name, f in source.items()
        if name not in found or f.folded_bytes < found[name].folded_bytes
    }
    if not better:
        return scop, schedule, found
    fold = {name: (f.dim, f.modulus) for name, f in sorted(source.items())}
    calls = tuple(sorted(s.name for s in scop.statements if s.projected is not None))  # the GEMMs planned
    key = ("fold", calls, tuple(sorted(fold.items())))
    again = memo.get(key) if memo is not None else None
    if again is None:
        again = compute_schedule(storage_dependences(scop, fold), schedule.options)
        if memo is not None:
            memo[key] = again
    refound = plan_folding(again.scop, again.tree.get_map(), shapes, sizes, set())
    if _saved(refound) > _saved(found):
        return again.scop, again, refound
    return scop, schedule, found


def _saved(folded: Mapping[str, FoldedTemporary]) -> int:
    return sum(f.saved_bytes for f in folded.values())


def touches(scop: Scop, statements: Sequence[str], folded: Mapping[str, FoldedTemporary]) -> bool:
    """Whether any of `statements` accesses a folded temporary (row pipelining reorders statement
    instances past what the folding was checked against, so such phases are not pipelined)."""
    return any(a.tensor in folded for name in statements for a in scop.statement(name).accesses)
