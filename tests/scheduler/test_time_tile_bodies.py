"""The body of a time tile (scheduler/timetile.py): a stencil of several statements (fdtd-2d's
three fields, pieces of one statement over F(t, f, i, j)) keeps its stride-1 member innermost,
is not mistaken for a Gauss-Seidel chain (a dependence between two statements that no cycle
closes), and runs its innermost loop distributed over the statements in dependence order, one
vectorisable sweep each. Results match NumPy and the untransformed kernel (optimize=False) at
tiny, odd and prime sizes with tiles smaller than the grid, on 1 and 2 threads."""

from __future__ import annotations

import sys
from pathlib import Path

import islpy as isl
import numpy as np
import pytest

import tensorlang as tl
from polyhedral import build_scop
from scheduler import ScheduleOptions, compute_schedule
from scheduler.timetile import innermost_carries, time_band
from tensorlang import frontend

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from test_stencils import CASES, _args, _as_tuple  # noqa: E402

F32 = np.float32


def _scop_and_tree(src: str, **options):
    program = frontend.check_source(src, None, "<test>")
    scop = build_scop(program)
    schedule = compute_schedule(scop, ScheduleOptions(**options))
    schedule.verify()
    return scop, schedule.tree


def _nodes(tree: isl.Schedule, kind) -> list[isl.ScheduleNode]:
    found: list[isl.ScheduleNode] = []

    def visit(node: isl.ScheduleNode) -> None:
        if node.get_type() == kind:
            found.append(node)
        for k in range(node.n_children()):
            visit(node.child(k))

    visit(tree.get_root())
    return found


def _names(node: isl.ScheduleNode) -> list[str]:
    names: list[str] = []
    node.get_domain().foreach_set(lambda s: names.append(s.get_tuple_name()))
    return names


def _filter_names(sequence: isl.ScheduleNode) -> list[list[str]]:
    out = []
    for k in range(sequence.n_children()):
        names: list[str] = []
        sequence.child(k).filter_get_filter().foreach_set(
            lambda s, names=names: names.append(s.get_tuple_name())
        )
        out.append(names)
    return out


def test_fdtd_is_no_chain_and_seidel_is():
    """fdtd's hz(i, j) reads this step's ex(i, j + 1), a dependence the innermost member carries,
    but no cycle closes it; seidel's B(t, i, j) reads B(t, i, j - 1) of its own statement."""
    seen = {}
    for name in ("fdtd", "seidel2d", "jacobi2d"):
        scop, tree = _scop_and_tree(CASES[name][0], threads=1, time_tiles=False)
        from scheduler.postpass import member_vars

        for band in _nodes(tree, isl.schedule_node_type.band):
            if band.band_get_permutable() and time_band(scop, band, member_vars(scop, band)) is not None:
                seen[name] = innermost_carries(scop, band)
    assert seen == {"fdtd": False, "seidel2d": True, "jacobi2d": False}


@pytest.mark.parametrize("threads", [1, 2])
def test_fdtd_innermost_loop_is_distributed_in_dependence_order(threads):
    """Below the tile's (t, i) loops a sequence runs one j loop per piece; ey's and ex's interior
    pieces (S1_2, S1_3) come before hz's (S1_5), which reads them."""
    _, tree = _scop_and_tree(CASES["fdtd"][0], threads=threads)
    sequences = [
        s
        for s in _nodes(tree, isl.schedule_node_type.sequence)
        if s.has_parent() and s.parent().get_type() == isl.schedule_node_type.band and "S1_5" in _names(s)
    ]
    (sequence,) = sequences
    # on one thread the copies into the first plane (S0_*) and out of the last (S2-S4) run in
    # the tiles too (scheduler/fusion.py), each in a j loop of its own
    filters = _filter_names(sequence)
    order = [names[0] for names in filters]
    steps = [name for name in order if name.startswith("S1_")]
    assert sorted(steps) == ["S1_1", "S1_2", "S1_3", "S1_4", "S1_5", "S1_6"]
    assert set(order) - set(steps) == (set() if threads > 1 else {"S0_1", "S0_2", "S0_3", "S2", "S3", "S4"})
    assert steps.index("S1_2") < steps.index("S1_5") and steps.index("S1_3") < steps.index("S1_5")
    for k in range(sequence.n_children()):
        if not filters[k][0].startswith("S1_"):
            continue
        inner = sequence.child(k).child(0)
        assert inner.get_type() == isl.schedule_node_type.band and inner.band_n_member() == 1
        # the stride-1 member innermost: the boundary pieces with an index fixed (ey's i == 0
        # row, ex's j == 0 column) see skewed members as plain variables and used to decide the
        # order alone, putting i innermost
        text = str(inner.band_get_partial_schedule())
        if "S1_4" not in text:  # ex's j == 0 column runs t + i there
            assert "t + j)" in text and "+ i" not in text, text


def test_jacobi_and_heat_bodies_stay_fused():
    """Pieces with no dependence between them in a tile's row (interior and boundary) keep one
    innermost loop that isl separates: no sequence below the point band."""
    for name in ("jacobi2d", "heat3d", "seidel2d"):
        _, tree = _scop_and_tree(CASES[name][0], threads=1)
        for s in _nodes(tree, isl.schedule_node_type.sequence):
            assert not (s.has_parent() and s.parent().get_type() == isl.schedule_node_type.band), name


# Two fields where the dependence inside a row goes against the pieces' names: field 1's pieces
# come first in the select (S1_1, S1_2), but its interior reads field 0's (S1_3, S1_4) j - 1
# neighbour of this step, so field 0 must run first in the row.
TWO_FIELDS = """
def two(float(N, M) A) -> (O) {
  F(t, f, i, j) = A(i, j) where t in 0:1, f in 0:2, i in 0:N, j in 0:M
  F(t, f, i, j) = f == 1
      ? ((i >= 1 && i < N - 1 && j >= 1 && j < M - 1)
         ? 0.2 * (F(t-1, 1, i, j) + F(t-1, 1, i-1, j) + F(t-1, 1, i+1, j) + F(t-1, 1, i, j+1) + F(t, 0, i, j-1))
         : F(t-1, 1, i, j))
      : ((i >= 1 && i < N - 1 && j >= 1 && j < M - 1)
         ? 0.2 * (F(t-1, 0, i, j) + F(t-1, 0, i-1, j) + F(t-1, 0, i+1, j) + F(t-1, 0, i, j-1) + F(t-1, 0, i, j+1))
         : F(t-1, 0, i, j))
      where t in 1:T, f in 0:2, i in 0:N, j in 0:M
  O(i, j) = F(T - 1, 0, i, j) + F(T - 1, 1, i, j) where i in 0:N, j in 0:M
}
"""


def ref_two(a, steps):
    f0, f1 = a.copy(), a.copy()
    c = F32(0.2)
    for _ in range(steps - 1):
        n0 = f0.copy()
        n0[1:-1, 1:-1] = c * (
            (((f0[1:-1, 1:-1] + f0[:-2, 1:-1]) + f0[2:, 1:-1]) + f0[1:-1, :-2]) + f0[1:-1, 2:]
        )
        n1 = f1.copy()
        n1[1:-1, 1:-1] = c * (
            (((f1[1:-1, 1:-1] + f1[:-2, 1:-1]) + f1[2:, 1:-1]) + f1[1:-1, 2:]) + n0[1:-1, :-2]
        )
        f0, f1 = n0, n1
    return f0 + f1


def test_the_body_order_follows_the_dependences_not_the_names():
    _, tree = _scop_and_tree(TWO_FIELDS, threads=1)
    (sequence,) = [
        s
        for s in _nodes(tree, isl.schedule_node_type.sequence)
        if s.has_parent() and s.parent().get_type() == isl.schedule_node_type.band and "S1_1" in _names(s)
    ]
    order = [names[0] for names in _filter_names(sequence)]
    assert order.index("S1_3") < order.index("S1_1") and order.index("S1_4") < order.index("S1_1")


# Field 1 reads its own j - 1 neighbour of this step (a Gauss-Seidel chain) and field 0 of this
# step: a chain, so the tile's last two point loops run the inner wavefront, not a distribution.
CHAIN_AND_FIELD = """
def chain(float(N, M) A) -> (O) {
  F(t, f, i, j) = A(i, j) where t in 0:1, f in 0:2, i in 0:N, j in 0:M
  F(t, f, i, j) = (i >= 1 && i < N - 1 && j >= 1 && j < M - 1)
      ? (f == 0
         ? 0.2 * (F(t-1, 0, i, j) + F(t-1, 0, i-1, j) + F(t-1, 0, i+1, j) + F(t-1, 0, i, j-1) + F(t-1, 0, i, j+1))
         : 0.25 * (F(t, 1, i, j-1) + F(t-1, 1, i-1, j) + F(t-1, 1, i+1, j) + F(t, 0, i, j)))
      : F(t-1, f, i, j)
      where t in 1:T, f in 0:2, i in 0:N, j in 0:M
  O(i, j) = F(T - 1, 0, i, j) - F(T - 1, 1, i, j) where i in 0:N, j in 0:M
}
"""


def ref_chain(a, steps):
    f0, f1 = a.copy(), a.copy()
    c, q = F32(0.2), F32(0.25)
    for _ in range(steps - 1):
        n0 = f0.copy()
        n0[1:-1, 1:-1] = c * (
            (((f0[1:-1, 1:-1] + f0[:-2, 1:-1]) + f0[2:, 1:-1]) + f0[1:-1, :-2]) + f0[1:-1, 2:]
        )
        n1 = f1.copy()
        for j in range(1, a.shape[1] - 1):
            n1[1:-1, j] = q * (((n1[1:-1, j - 1] + f1[:-2, j]) + f1[2:, j]) + n0[1:-1, j])
        f0, f1 = n0, n1
    return f0 - f1


def test_a_chain_in_one_field_is_still_a_chain():
    scop, tree = _scop_and_tree(CHAIN_AND_FIELD, threads=1, time_tiles=False)
    from scheduler.postpass import member_vars

    found = [
        innermost_carries(scop, band)
        for band in _nodes(tree, isl.schedule_node_type.band)
        if band.band_get_permutable() and time_band(scop, band, member_vars(scop, band)) is not None
    ]
    assert found == [True]


SHAPES = [(1, 1), (2, 3), (3, 2), (7, 5), (13, 7), (17, 19)]
TILED = [
    tl.Options(threads=1),
    tl.Options(threads=2),
    tl.Options(threads=1, tile=(3, 5, 7)),
    tl.Options(threads=2, tile=(2, 3, 5)),
    tl.Options(threads=1, tile=(4, 2)),  # the innermost member untiled
]


def _check(kernel, reference, want, args, keywords, label):
    got = _as_tuple(kernel(*args, **keywords))
    base = _as_tuple(reference(*args, **keywords))
    for g, b, w in zip(got, base, _as_tuple(want)):
        np.testing.assert_allclose(g, b, rtol=1e-6, atol=1e-6, err_msg=label)
        np.testing.assert_allclose(g, w, rtol=2e-5, atol=2e-5, err_msg=label)


@pytest.mark.slow
@pytest.mark.parametrize("options", TILED, ids=lambda o: f"threads={o.threads},tile={o.tile}")
def test_fdtd_time_tiles_match_numpy_and_the_untransformed_kernel(options):
    src, ref, _ = CASES["fdtd"]
    kernel = tl.compile(src, options=options)
    reference = tl.compile(src, options=tl.Options(optimize=False, threads=1))
    rng = np.random.default_rng(11)
    for shape in SHAPES:
        for steps in (1, 2, 3, 17):
            args = _args("fdtd", shape, steps, rng)
            _check(kernel, reference, ref(*args), args, {}, f"fdtd {shape} T={steps} {options}")


@pytest.mark.slow
@pytest.mark.parametrize("options", TILED[:3], ids=lambda o: f"threads={o.threads},tile={o.tile}")
@pytest.mark.parametrize("case", ["two", "chain"])
def test_several_fields_match_numpy_and_the_untransformed_kernel(case, options):
    src, ref = {"two": (TWO_FIELDS, ref_two), "chain": (CHAIN_AND_FIELD, ref_chain)}[case]
    kernel = tl.compile(src, options=options)
    reference = tl.compile(src, options=tl.Options(optimize=False, threads=1))
    rng = np.random.default_rng(5)
    for shape in SHAPES:
        for steps in (1, 2, 3, 17):
            a = rng.standard_normal(shape).astype(F32)
            _check(kernel, reference, ref(a, steps), [a], {"T": steps}, f"{case} {shape} T={steps}")


# Two fields in 3-d (isl schedules this one with the field index in the band, so it checks results
# of a multi-field 3-d recurrence under time tiles, not the distribution itself).
TWO_FIELDS_3D = """
def two3(float(N, M, K) A) -> (O) {
  F(t, f, i, j, k) = A(i, j, k) where t in 0:1, f in 0:2, i in 0:N, j in 0:M, k in 0:K
  F(t, f, i, j, k) = (i >= 1 && i < N - 1 && j >= 1 && j < M - 1 && k >= 1 && k < K - 1)
      ? (f == 1
         ? 0.25 * (F(t-1, 1, i-1, j, k) + F(t-1, 1, i, j+1, k) + F(t-1, 1, i, j, k+1) + F(t, 0, i, j, k-1))
         : 0.25 * (F(t-1, 0, i+1, j, k) + F(t-1, 0, i, j-1, k) + F(t-1, 0, i, j, k-1) + F(t-1, 0, i, j, k+1)))
      : F(t-1, f, i, j, k)
      where t in 1:T, f in 0:2, i in 0:N, j in 0:M, k in 0:K
  O(i, j, k) = F(T - 1, 0, i, j, k) - F(T - 1, 1, i, j, k) where i in 0:N, j in 0:M, k in 0:K
}
"""


def ref_two_3d(a, steps):
    f0, f1 = a.copy(), a.copy()
    q = F32(0.25)
    m = (slice(1, -1),) * 3
    for _ in range(steps - 1):
        n0 = f0.copy()
        n0[m] = q * (((f0[2:, 1:-1, 1:-1] + f0[1:-1, :-2, 1:-1]) + f0[1:-1, 1:-1, :-2]) + f0[1:-1, 1:-1, 2:])
        n1 = f1.copy()
        n1[m] = q * (((f1[:-2, 1:-1, 1:-1] + f1[1:-1, 2:, 1:-1]) + f1[1:-1, 1:-1, 2:]) + n0[1:-1, 1:-1, :-2])
        f0, f1 = n0, n1
    return f0 - f1


@pytest.mark.parametrize(
    "options",
    [
        pytest.param(o, marks=pytest.mark.slow)
        for o in (tl.Options(threads=1), tl.Options(threads=2, tile=(3, 2, 2)))
    ],
)
def test_a_3d_two_field_recurrence_matches_numpy_and_the_untransformed_kernel(options):
    kernel = tl.compile(TWO_FIELDS_3D, options=options)
    reference = tl.compile(TWO_FIELDS_3D, options=tl.Options(optimize=False, threads=1))
    rng = np.random.default_rng(3)
    for shape in [(1, 1, 1), (3, 4, 5), (7, 5, 11)]:
        for steps in (1, 2, 5):
            a = rng.standard_normal(shape).astype(F32)
            _check(kernel, reference, ref_two_3d(a, steps), [a], {"T": steps}, f"{shape} T={steps}")
