"""Time tiles (scheduler/timetile.py): a stencil's skewed time-recurrence band is tiled with
parallelogram tiles (time steps first, the stride-1 member innermost inside a tile), and with
several threads its tile loops form a wavefront (sequential outer loop, parallel loop inside).
Results match NumPy and the untransformed kernel (Options(optimize=False)) for automatic and
explicit tile sizes, at tiny, odd and prime sizes and sizes smaller than a tile."""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

import islpy as isl
import numpy as np
import pytest

import tensorlang as tl
from polyhedral import build_scop
from scheduler import ScheduleOptions, compute_schedule
from scheduler.timetile import TimeBand, auto_sizes
from tensorlang import frontend

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from test_stencils import CASES, _args, _as_tuple  # noqa: E402

STENCILS = list(CASES)
SIZES = {  # per stencil: the shapes (N = 1, 2, 3, 5, 7, 13 and mixes)
    "jacobi1d": [(1,), (2,), (3,), (5,), (7,), (13,), (97,)],
    "jacobi2d": [(1, 1), (2, 3), (3, 2), (5, 7), (13, 7), (17, 40)],
    "heat3d": [(1, 1, 1), (2, 3, 5), (3, 3, 3), (7, 5, 13)],
    "seidel2d": [(1, 1), (2, 3), (3, 3), (5, 7), (13, 11)],
    "fdtd": [(1, 1), (2, 3), (3, 2), (7, 5), (13, 7)],
}
STEPS = (1, 2, 3, 17)


def _schedule(name: str, **options) -> isl.Schedule:
    program = frontend.check_source(CASES[name][0], None, "<test>")
    schedule = compute_schedule(build_scop(program), ScheduleOptions(**options))
    schedule.verify()
    return schedule


@dataclass(frozen=True)
class Band:
    coincident: tuple[bool, ...]
    schedule: str  # the band's partial schedule
    child: str | None  # the partial schedule of a band right below it
    below: str = ""  # the partial schedules of the chain of bands below it


def _bands(tree: isl.Schedule) -> list[Band]:
    found: list[Band] = []

    def visit(node: isl.ScheduleNode) -> isl.ScheduleNode:
        if node.get_type() == isl.schedule_node_type.band:
            child = node.child(0) if node.n_children() else None
            below = child is not None and child.get_type() == isl.schedule_node_type.band
            chain = []
            while child is not None and child.get_type() == isl.schedule_node_type.band:
                chain.append(str(child.band_get_partial_schedule()))
                child = child.child(0) if child.n_children() else None
            found.append(
                Band(
                    tuple(bool(node.band_member_get_coincident(m)) for m in range(node.band_n_member())),
                    str(node.band_get_partial_schedule()),
                    chain[0] if below else None,
                    " ".join(chain),
                )
            )
        return node

    tree.map_schedule_node_bottom_up(visit)
    return found


def _time_tile_bands(schedule) -> list[Band]:
    """Tile bands of time tiles: a band whose first member numbers the time tiles (t - t mod
    size, or in a wavefront floor(t / size) + ...) and whose other members number tiles too,
    above the bands of the tile's points. (Not the groups of steps inside a wavefront's tile,
    (t - t mod 4, t + i), whose point loops are unshifted: its second member is a point.)"""

    def numbers_tiles(member: str) -> bool:
        first = member.split(";")[0]
        return "mod" in first or "floor(" in first

    return [
        b
        for b in _bands(schedule.tree)
        if b.child is not None
        and any(f in b.schedule.split("}, {")[0] for f in ("(t - (t) mod", "floor((t)/", "floor((t - i)/"))
        and all(numbers_tiles(m) for m in b.schedule.split("}, {"))
    ]


def _jam_bands(schedule) -> list[Band]:
    """Bands of groups of time steps inside a tile (_jam_steps): (t, s) tiled by (steps, 1)."""
    # the interior piece's (the copies that run in the tiles on one thread sit at a constant)
    # in a wavefront the groups' point loops are unshifted: (t, t + i) below (t - t mod 4, t + i)
    return [
        b
        for b in _bands(schedule.tree)
        if b.child is not None
        and (
            re.search(r"S1_1\[[^]]*\] -> \[\(0\)\]", b.child)
            or (
                "(t - (t) mod 4)" in b.schedule.split("}, {")[0]
                and "-> [(t + i)]" in b.schedule.split("}, {")[1]
            )
        )
    ]


@pytest.mark.parametrize("name", STENCILS)
def test_every_stencil_gets_time_tiles(name):
    assert _time_tile_bands(_schedule(name, threads=1)), name


@pytest.mark.parametrize("name", STENCILS)
def test_on_threads_the_tile_loops_are_a_wavefront(name):
    """Outer tile loop sequential, the others coincident (parallel), the shape team phases run;
    the outer one sums every member's tile number (T + I + J: tiles of every space dimension on
    one wavefront, not only of the first). 1-d and 2-d stencils whose dependences span one step
    tile (t - i, t + i, ...): diamonds."""
    schedule = _schedule(name, threads=2)
    bands = _time_tile_bands(schedule)
    assert bands
    for band in bands:
        n = len(band.coincident)
        assert band.coincident == (False,) + (True,) * (n - 1), band
        # the stepped statement's entry (on threads the copies join a band with diamonds too)
        stepped = [p for p in band.schedule.split("}, {")[0].split(";") if "S1_1[" in p or "S1[" in p]
        first = "floor((t - i)/" if name in DIAMONDS else "floor((t)/"
        assert stepped and all(first in p and p.count("floor(") == n for p in stepped), band


# the stencils that get diamond tiles on threads: heat-3d's wavefront already holds tiles along i
# and j; fdtd's hz reads this step's ey(i + 1) and seidel-2d this step's B(i - 1), which no
# c * t - (t + i) orders
DIAMONDS = ("jacobi1d", "jacobi2d")


def _tiles_per_wavefront(schedule, sizes: dict[str, int]) -> list[int]:
    """How many tiles each wavefront of the (one) wavefront band holds at these sizes."""
    found: list[isl.MultiUnionPwAff] = []

    def visit(node: isl.ScheduleNode) -> isl.ScheduleNode:
        if node.get_type() == isl.schedule_node_type.band and node.band_n_member() >= 2:
            n = node.band_n_member()
            pattern = tuple(bool(node.band_member_get_coincident(m)) for m in range(n))
            text = str(node.band_get_partial_schedule())
            if pattern == (False,) + (True,) * (n - 1) and "floor(" in text.split("}, {")[0]:
                found.append(node.band_get_partial_schedule())
        return node

    schedule.tree.map_schedule_node_bottom_up(visit)
    (band,) = found
    domain = schedule.tree.get_domain()
    fixed = " and ".join(f"{k} = {v}" for k, v in sizes.items())
    params = isl.Set.read_from_str(domain.get_ctx(), f"[{', '.join(sizes)}] -> {{ : {fixed} }}")
    tiles = (
        isl.UnionMap.from_multi_union_pw_aff(band).intersect_domain(domain.intersect_params(params)).range()
    )
    counts: dict[int, int] = {}

    def count(point: isl.Point) -> None:
        wave = point.get_coordinate_val(isl.dim_type.set, 0).to_python()
        counts[wave] = counts.get(wave, 0) + 1

    tiles.foreach_point(count)
    return [counts[w] for w in sorted(counts)]


@pytest.mark.parametrize(
    ("name", "sizes"), [("jacobi2d", dict(N=300, M=300, T=17)), ("jacobi1d", dict(N=40000, T=17))]
)
def test_diamonds_give_a_wavefront_tiles_along_the_rows_whatever_the_steps(name, sizes):
    """Parallelogram tiles put each time band's tiles one after another along i: at T = 17 (a
    16-step band and a 1-step one) a wavefront held at most two tiles, one per band, and two
    threads ran jacobi-2d 1000² no faster than one. Diamonds start together along the rows."""
    per_wave = _tiles_per_wavefront(_schedule(name, threads=2), sizes)
    rows = sizes["N"]
    block = 64 if name == "jacobi2d" else 4096
    assert max(per_wave) >= rows // block, per_wave
    assert len(per_wave) <= 4, per_wave  # 17 steps: the diamonds of two, three wavefronts


def test_auto_sizes_of_diamonds():
    """A diamond's first two members get one size: a 1-d block, a 2-d stencil's rows (with strips
    of the stride-1 member); both within the L2 budget as the parallelograms' are."""
    one, two = auto_sizes(TimeBand(2, 4), diamond=True), auto_sizes(TimeBand(3, 4), diamond=True)
    assert one[0] == one[1] == auto_sizes(TimeBand(2, 4))[1]
    assert two[0] == two[1] >= 16 and two[2] == auto_sizes(TimeBand(3, 4))[2]
    assert auto_sizes(TimeBand(3, 8), diamond=True)[0] <= two[0]


@pytest.mark.parametrize("threads", (1, 2))
def test_a_2d_tile_runs_its_steps_four_at_a_time_row_by_row(threads):
    """jacobi-2d's point loops (t, t + i, t + j) become (t / 4, t + i, t, t + j); the j member
    stays innermost, below; not for Gauss-Seidel (its inner wavefront), fdtd (its distributed
    body), 1-d or 3-d stencils."""
    (jam,) = _jam_bands(_schedule("jacobi2d", threads=threads))
    # on threads the groups' point loops are unshifted (timetile._tile): t, not t mod 4
    assert ("((t) mod 4)" if threads == 1 else "-> [(t)]") in jam.child and "(t + j)" not in jam.child
    for name in ("jacobi1d", "heat3d", "seidel2d", "fdtd"):
        assert not _jam_bands(_schedule(name, threads=threads)), name


def test_a_single_thread_keeps_the_tile_loops_in_lexicographic_order():
    for band in _time_tile_bands(_schedule("jacobi2d", threads=1)):
        assert not any(band.coincident)


def test_explicit_sizes_are_used():
    (band,) = _time_tile_bands(_schedule("jacobi2d", threads=1, time_tile=(3, 5, 7)))
    text = band.below
    assert "mod 3" in text and "mod 5" in text and "mod 7" in text
    # on threads the sizes of the diamond band's members (t - i, t + i, t + j)
    (band,) = _time_tile_bands(_schedule("jacobi2d", threads=2, time_tile=(6, 10, 7)))
    assert all(f in band.schedule for f in ("floor((t - i)/6)", "floor((t + i)/10)", "floor((t + j)/7)"))


def test_time_tile_option_is_validated():
    with pytest.raises(tl.TensorLangError, match="time_tile"):
        ScheduleOptions(time_tile=(4, 0))
    assert ScheduleOptions(time_tile=8).time_tile == (8,)


def test_auto_sizes_fit_half_the_l2_cache():
    """1-d and 2-d stencils tile every member (2-d: the stride-1 one in wide strips); 3-d and
    more leave the stride-1 member untiled."""
    for members in (2, 3, 4, 5):
        for element in (4, 8):
            sizes = auto_sizes(TimeBand(members, element))
            assert len(sizes) == (members if members <= 3 else members - 1)
            assert all(s >= 1 for s in sizes)
    assert auto_sizes(TimeBand(3, 4))[-1] >= 512  # long vectorised strips


def test_one_thread_runs_deeper_1d_and_2d_tiles():
    """Without a wavefront (one thread) a 1-d or 2-d stencil's tile runs 64 steps over the block
    or rows that 16 steps get; a Gauss-Seidel chain, 3-d bands, and bands on threads keep 16."""
    for members in (2, 3):
        deep = auto_sizes(TimeBand(members, 4), wavefront=False)
        shallow = auto_sizes(TimeBand(members, 4), wavefront=True)
        assert deep[0] == 64 and shallow[0] == 16 and deep[1:] == shallow[1:]
        assert auto_sizes(TimeBand(members, 4), chain=True, wavefront=False)[0] == 16
    assert auto_sizes(TimeBand(4, 4), wavefront=False)[0] == 16
    (one,) = _time_tile_bands(_schedule("jacobi2d", threads=1))
    (two,) = _time_tile_bands(_schedule("jacobi2d", threads=2))
    assert "(t) mod 64" in one.schedule and "(t) mod 64" in one.below
    assert "floor((t - i)/64)" in two.schedule  # on threads: diamonds
    # the wavefront's point loops are unshifted (timetile._tile): groups of 4 steps of t
    assert "(t - (t) mod 4)" in two.below and "(t) mod 16" not in two.below


_EVERY_SHAPE = ((3, 5), (13, 7), (37, 70))


@pytest.mark.parametrize(
    ("name", "shapes", "steps"),
    [
        # the default tier: one odd grid, T past one and two 64-step tiles
        pytest.param("jacobi2d", ((13, 7),), (65, 130), id="jacobi2d-13x7"),
        # every shape, and one T short of a tile: 9 sizes, 18 specialisations (here 22 s and 16 s)
        pytest.param("jacobi2d", _EVERY_SHAPE, (63, 65, 130), id="jacobi2d", marks=pytest.mark.slow),
        pytest.param("fdtd", _EVERY_SHAPE, (63, 65, 130), id="fdtd", marks=pytest.mark.slow),
    ],
)
def test_deep_tiles_over_several_bands_match_the_untransformed_kernel(name, shapes, steps):
    """T past one and two 64-step tiles (65, 130), on grids narrower and shorter than a tile's
    rows and at odd, prime shapes: every band boundary, partial tile and group of steps."""
    src, ref, _ = CASES[name]
    kind = "fdtd" if name == "fdtd" else ""
    k = tl.compile(src, options=tl.Options(threads=1))
    reference = tl.compile(src, options=tl.Options(optimize=False))
    rng = np.random.default_rng(5)
    for shape in shapes:
        for t in steps:
            args = _args(kind, shape, t, rng)
            got, want = _as_tuple(k(*args)), _as_tuple(reference(*args))
            for g, w in zip(got, want, strict=True):
                np.testing.assert_array_equal(g, w)
            for g, r in zip(got, _as_tuple(ref(*args)), strict=True):
                np.testing.assert_allclose(g, r, rtol=1e-3, atol=1e-3)


def test_one_size_fewer_leaves_the_innermost_member_untiled():
    (band,) = _time_tile_bands(_schedule("jacobi2d", threads=1, time_tile=(4, 8)))
    assert "mod 4" in band.below and "mod 8" in band.below and "(t + j) mod" not in band.below


def test_plain_bands_are_not_time_tiled():
    """A matmul's band and a copy are not time recurrences: no tiles unless asked."""
    program = frontend.check_source(
        "def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }", None, "<t>"
    )
    schedule = compute_schedule(build_scop(program), ScheduleOptions(threads=1))
    assert "mod" not in str(schedule)


OPTIONS = [
    tl.Options(threads=1),  # automatic sizes, larger than every test size
    tl.Options(threads=2),  # wavefront
    tl.Options(threads=1, tile=(2, 3, 5), specialize=False),
    tl.Options(threads=2, tile=(3, 2), specialize=False),
    tl.Options(threads=2, tile=1, specialize=False),
    tl.Options(threads=1, tile=(5, 4, 3, 2), specialize=False),
]


@pytest.mark.slow
@pytest.mark.parametrize("name", STENCILS)
@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: f"threads={o.threads},tile={o.tile}")
def test_time_tiles_match_numpy_and_the_untransformed_kernel(name, options):
    src, ref, _ = CASES[name]
    kernel = tl.compile(src, options=options)
    reference = tl.compile(src, options=tl.Options(optimize=False, specialize=False))
    rng = np.random.default_rng(len(name))
    shapes = SIZES[name] if not options.specialize else SIZES[name][1::2]
    for shape in shapes:
        for steps in STEPS if not options.specialize else (2, 17):
            args = _args("fdtd" if name == "fdtd" else "", shape, steps, rng)
            got = _as_tuple(kernel(*args))
            for g, b, w in zip(got, _as_tuple(reference(*args)), _as_tuple(ref(*args))):
                np.testing.assert_allclose(g, b, rtol=1e-6, atol=1e-6, err_msg=f"{name} {shape} T={steps}")
                np.testing.assert_allclose(g, w, rtol=2e-5, atol=2e-5, err_msg=f"{name} {shape} T={steps}")


def test_a_gauss_seidel_chain_runs_a_wavefront_inside_the_tile():
    """seidel-2d reads B(t, i, j - 1): its innermost member carries a dependence, so the last two
    point loops become (i + j, i) with the innermost coincident; jacobi's stay (i, j)."""
    (seidel,) = _time_tile_bands(_schedule("seidel2d", threads=1))
    assert "mod 32 + (2t + i + j) mod" in seidel.below
    for name in ("jacobi2d", "heat3d"):
        for band in _time_tile_bands(_schedule(name, threads=1)):
            below = band.below.replace("((t + ", "").replace("(t) mod 4) + (", "")
            assert " + (" not in below.replace("((T + ", "").replace("(T) mod 4) + (", "")


JAM_SHAPES = ((37, 41), (67, 53), (11, 131))
JAM_OPTIONS = [  # steps run 4 at a time inside 16-, 8- and 12-step tiles; rows of 1-3 vectors
    pytest.param(tl.Options(threads=1), JAM_SHAPES, marks=pytest.mark.slow),
    pytest.param(tl.Options(threads=2), JAM_SHAPES, marks=pytest.mark.slow),
    # the copies join the time band, entry 0 (scheduler/fusion.py): on threads too, where it gets
    # diamond tiles (jacobi-2d), whose first two sizes are then those of (t - i, t + i)
    pytest.param(tl.Options(threads=1, band_tiles=((8, 4, 64),)), JAM_SHAPES, marks=pytest.mark.slow),
    pytest.param(tl.Options(threads=2, band_tiles=((12, 8, 2048),)), JAM_SHAPES, marks=pytest.mark.slow),
    (tl.Options(threads=2, band_tiles=((8, 4, 2048),)), ((67, 53),)),  # each shape: ~3 s of compiling
]


@pytest.mark.parametrize(
    "options,shapes",
    JAM_OPTIONS,
    ids=lambda o: f"threads={o.threads},tiles={o.band_tiles}" if isinstance(o, tl.Options) else "",
)
def test_steps_run_together_match_the_untransformed_kernel(options, shapes):
    """jacobi-2d with several groups of steps per tile and several tiles, rows long enough to
    run as vectors: equal to the untransformed kernel and to NumPy (_jam_steps)."""
    src, ref, _ = CASES["jacobi2d"]
    kernel = tl.compile(src, options=options)
    reference = tl.compile(src, options=tl.Options(optimize=False))
    rng = np.random.default_rng(4)
    for shape in shapes:
        for steps in (1, 2, 5, 23):
            args = _args("", shape, steps, rng)
            got = kernel(*args)
            np.testing.assert_allclose(
                got, reference(*args), rtol=1e-6, atol=1e-6, err_msg=f"{shape} T={steps}"
            )
            np.testing.assert_allclose(got, ref(*args), rtol=2e-5, atol=2e-5, err_msg=f"{shape} T={steps}")
