"""The loops isl generates for time tiles run every statement instance exactly once
(codegen/planning/astscan.py checks it at plan time). isl's AST generator dropped iterations
from a wavefront over shifted point loops (fdtd-2d, tiles (2, 3, 5), 2 threads: a wrong `ey` at
1×1, T=17), and the odd steps of jacobi-2d's groups of steps in a tile (2×3, T=7); the
wavefront's tiles and groups now use unshifted point loops (scheduler/timetile.py
`_tile`), and a plan whose loops miss, repeat or invent an instance is refused."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import numpy as np
import pytest

import scheduler.timetile as timetile
import tensorlang as tl
from codegen.planning.astscan import check_instances, scan
from codegen.planning.plan import PlanError

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from test_stencils import CASES, _args  # noqa: E402

SIZES = {
    "jacobi1d": ("N",),
    "jacobi2d": ("N", "M"),
    "heat3d": ("N", "M", "K"),
    "seidel2d": ("N", "M"),
    "fdtd": ("NX", "NY"),
}
ODD_TILES = [(2, 3, 5), (3, 2, 2), (5, 3, 2), (4, 7, 3)]
TINY = [(1, 1, 1), (1, 2, 3), (2, 3, 2), (3, 5, 2), (7, 2, 3)]


def _sizes(name: str, shape: tuple[int, ...], steps: int) -> dict[str, int]:
    return {**dict(zip(SIZES[name], shape)), "T": steps}


def _check_every_instance_once(name, tile, threads, shapes, steps):
    k = tl.compile(CASES[name][0], options=tl.Options(threads=threads, tile=tile))
    for shape in shapes:
        for t in steps:
            sizes = _sizes(name, shape, t)
            plan = k._plan(sizes)  # plan_kernel checks the loops itself; check again, to see it
            assert check_instances(plan.scop, plan.ast, sizes) == [], (name, tile, threads, sizes)


@pytest.mark.parametrize("name", list(CASES))
def test_wavefront_loops_run_every_instance_once(name):
    _check_every_instance_once(name, (2, 3, 5), 2, [(1, 1, 1), (2, 3, 2)], (2, 7, 17))


@pytest.mark.slow
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("tile", ODD_TILES)
@pytest.mark.parametrize("name", list(CASES))
def test_time_tile_loops_run_every_instance_once(name, tile, threads):
    _check_every_instance_once(name, tile, threads, TINY, (2, 7, 17, 33))


@pytest.mark.parametrize("shape,steps", [((1, 1), 17), ((1, 1), 18), ((1, 2), 33), ((2, 3), 33)])
def test_fdtd_wavefront_that_dropped_steps_matches_the_untransformed_kernel(shape, steps):
    k = tl.compile(CASES["fdtd"][0], options=tl.Options(threads=2, tile=(2, 3, 5)))
    reference = tl.compile(CASES["fdtd"][0], options=tl.Options(optimize=False))
    args = _args("fdtd", shape, steps, np.random.default_rng(5))
    for got, want in zip(k(*args), reference(*args)):
        np.testing.assert_array_equal(got, want)


def test_shifted_point_loops_are_refused_where_isl_drops_their_iterations(monkeypatch):
    """The old tiling (isl's shifted point loops under the wavefront): the plan is refused,
    naming the instances that never run, instead of returning a wrong ey."""
    monkeypatch.setattr(timetile, "_tile", lambda node, sizes, unshifted: node.band_tile(sizes))
    k = tl.compile(CASES["fdtd"][0], options=tl.Options(threads=2, tile=(2, 3, 5)))
    sizes = _sizes("fdtd", (1, 1), 17)
    plan = None
    try:
        plan = k._plan(sizes)
    except PlanError as exc:
        assert "never" in str(exc) and "S1_1[" in str(exc) and "Options(specialize=False)" in str(exc)
    if plan is not None:
        pytest.skip("this isl builds the shifted wavefront's loops correctly")


def test_check_instances_names_missing_and_foreign_instances():
    """A LoopAst whose leaves run another statement's instances: the check says which never run
    and which run outside the domain."""
    k = tl.compile(CASES["jacobi1d"][0], options=tl.Options(threads=1))
    sizes = _sizes("jacobi1d", (5,), 4)
    plan = k._plan(sizes)
    assert check_instances(plan.scop, plan.ast, sizes) == []
    runs = scan(plan.ast, plan.scop.params.values(sizes))
    assert sum(runs.values()) == len(runs)  # each once
    body = {n for n, _ in runs if n.startswith("S1")}
    victim = sorted(body)[0]
    leaves = {
        key: dataclasses.replace(leaf, statement="S0") if leaf.statement == victim else leaf
        for key, leaf in plan.ast.leaves.items()
    }
    broken = dataclasses.replace(plan.ast, leaves=leaves)
    problems = check_instances(plan.scop, broken, sizes)
    assert any(p.startswith(f"{len([1 for n, _ in runs if n == victim])} instance") for p in problems)
    assert any("never" in p and f"{victim}[" in p for p in problems)
    assert any("outside the domain" in p and "S0[" in p for p in problems)

    # past the limit (the domain's bounding boxes: 5 + 3 * 5 + 5 points) the loops are not scanned
    assert check_instances(plan.scop, broken, sizes, limit=10) == []


def test_odd_heat_tiles_schedule_and_verify():
    """heat-3d with tiles (4, 7, 3) on one thread: the legality check of the tiled schedule took
    minutes when it built the lexicographic order between every pair of statements (now the
    dependences are mapped into the schedule's space, scheduler/schedule.py); the tiled
    schedule is kept and its loops run every instance once."""
    k = tl.compile(CASES["heat3d"][0], options=tl.Options(threads=1, tile=(4, 7, 3)))
    assert k.schedule.strategy.endswith("+postpass")
    k.schedule.verify()
    sizes = _sizes("heat3d", (5, 7, 3), 9)
    plan = k._plan(sizes)
    assert check_instances(plan.scop, plan.ast, sizes) == []
