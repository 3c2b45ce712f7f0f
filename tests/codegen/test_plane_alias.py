"""Planes kept in an input's or an output's memory (codegen/planning/plane_alias.py): a folded
temporary's first plane, a whole copy of an input, is read from the input, and its last plane,
copied whole into an output, is stored there, so neither copy runs. Planned exactly where the
copies are whole, element for element, and nothing else writes the plane or the output; results
equal the same kernel with its temporaries unfolded (Options(fold_storage=False), bit for bit),
NumPy's, and the input is never written. Vector rows that read the input's first and last rows
stay inside it (a guard page after the input and after the output)."""

from __future__ import annotations

import ctypes
import importlib.util
import math
import mmap
from pathlib import Path

import numpy as np
import pytest

import tensorlang as tl
from codegen.planning.folding import PlaneAlias

F32 = np.float32
REPO = Path(__file__).resolve().parents[2]


def _stencils():
    """tests/test_stencils.py, whose sources and NumPy references these tests reuse."""
    spec = importlib.util.spec_from_file_location(
        "_stencil_sources_alias", REPO / "tests" / "test_stencils.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_S = _stencils()
_KERNELS: dict = {}


def kernel(src: str, options: tl.Options):
    key = (src, options)
    if key not in _KERNELS:
        _KERNELS[key] = tl.compile(src, options=options)
    return _KERNELS[key]


ONE = tl.Options(threads=1)
UNFOLDED = tl.Options(threads=1, fold_storage=False)

RECURRENCE = """
  B(t, i) = (i >= 1 && i < N - 1) ? 0.5 * (B(t-1, i-1) + B(t-1, i+1)) : B(t-1, i) where t in 1:T, i in 0:N"""


def _program(first: str, last: str, outputs: str = "O") -> str:
    return f"def f(float(N) A, float(T) steps) -> ({outputs}) {{\n  {first}{RECURRENCE}\n  {last}\n}}"


PLAIN = _program("B(t, i) = A(i) where t in 0:1, i in 0:N", "O(i) = B(T - 1, i) where i in 0:N")

# (source, the planes kept elsewhere at N=13, T=7): each copy that is not whole, not element for
# element, or not the only writer keeps its own plane
PROGRAMS = {
    "plain": (PLAIN, [PlaneAlias(0, "A", "S0"), PlaneAlias(6, "O", "S2")]),
    "scaled_copy_in": (
        _program("B(t, i) = 2.0 * A(i) where t in 0:1, i in 0:N", "O(i) = B(T - 1, i) where i in 0:N"),
        [PlaneAlias(6, "O", "S2")],
    ),
    "reversed_copy_in": (
        _program("B(t, i) = A(N - 1 - i) where t in 0:1, i in 0:N", "O(i) = B(T - 1, i) where i in 0:N"),
        [PlaneAlias(6, "O", "S2")],
    ),
    "plane_0_written_again": (
        _program(
            "B(t, i) = A(i) where t in 0:1, i in 0:N\n  B(t, i) = B(t, i) + 1.0 where t in 0:1, i in 0:N",
            "O(i) = B(T - 1, i) where i in 0:N",
        ),
        [PlaneAlias(6, "O", "S3")],
    ),
    "reversed_copy_out": (
        _program("B(t, i) = A(i) where t in 0:1, i in 0:N", "O(i) = B(T - 1, N - 1 - i) where i in 0:N"),
        [PlaneAlias(0, "A", "S0")],
    ),
    "output_written_again": (
        _program(
            "B(t, i) = A(i) where t in 0:1, i in 0:N",
            "O(i) = B(T - 1, i) where i in 0:N\n  O(i) = O(i) * 0.5 where i in 0:N",
        ),
        [PlaneAlias(0, "A", "S0")],
    ),
    "converted_copy_out": (
        _program("B(t, i) = A(i) where t in 0:1, i in 0:N", "O(i) = double(B(T - 1, i)) where i in 0:N"),
        [PlaneAlias(0, "A", "S0")],
    ),
    "temporary_written_after_the_copy": (
        _program(
            "B(t, i) = A(i) where t in 0:1, i in 0:N",
            "O(i) = B(T - 1, i) where i in 0:N\n  B(t, i) = B(t, i) * 2.0 where t in T-1:T, i in 0:N\n"
            "  P(i) = B(T - 1, i) where i in 0:N",
            outputs="O, P",
        ),
        [PlaneAlias(0, "A", "S0"), PlaneAlias(6, "P", "S4")],
    ),
}


def _reference_1d(a: np.ndarray, t: int, program: str) -> tuple[np.ndarray, ...]:
    """NumPy's result of the PROGRAMS entry `program` (float32, in the kernel's order)."""
    half = F32(0.5)
    b = {"scaled_copy_in": F32(2.0) * a, "reversed_copy_in": a[::-1].copy()}.get(program, a.copy())
    if program == "plane_0_written_again":
        b = b + F32(1.0)
    for _ in range(t - 1):
        n = b.copy()
        n[1:-1] = half * (b[:-2] + b[2:])
        b = n
    if program == "reversed_copy_out":
        return (b[::-1].copy(),)
    if program == "output_written_again":
        return (b * half,)
    if program == "converted_copy_out":
        return (b.astype(np.float64),)
    if program == "temporary_written_after_the_copy":
        return b, b * F32(2.0)
    return (b,)


def _tuple(x) -> tuple:
    return x if isinstance(x, tuple) else (x,)


@pytest.mark.parametrize("name", list(PROGRAMS))
def test_which_planes_are_kept_in_an_input_or_output(name):
    src, aliases = PROGRAMS[name]
    plan = kernel(src, ONE)._plan(dict(N=13, T=7))
    assert list(plan.folded["B"].aliases) == aliases
    assert plan.elided == frozenset(a.copy for a in aliases)
    report = plan.loops().splitlines()[0]
    for a in aliases:
        assert f"plane {a.plane} is {a.tensor}'s memory ({a.copy} not run)" in report
    assert not kernel(src, UNFOLDED)._plan(dict(N=13, T=7)).elided


@pytest.mark.parametrize("name", list(PROGRAMS))
def test_results_with_planes_kept_elsewhere_equal_the_unfolded_kernel(name):
    src, _ = PROGRAMS[name]
    rng = np.random.default_rng(7)
    for n, t in ((13, 7), (5, 3), (37, 4), (2, 9), (1, 5)):
        a = rng.standard_normal(n).astype(F32)
        before = a.copy()
        steps = np.zeros(t, F32)
        got = _tuple(kernel(src, ONE)(a, steps))
        unfolded = _tuple(kernel(src, UNFOLDED)(a, steps))
        want = _reference_1d(a, t, name)
        for g, u, w in zip(got, unfolded, want, strict=True):
            np.testing.assert_array_equal(g, u, err_msg=f"{name} N={n} T={t}")
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6, err_msg=f"{name} N={n} T={t}")
        np.testing.assert_array_equal(a, before, err_msg="the input was written")


def test_one_step_copies_its_input_out_through_the_input_plane():
    """T = 2 stores both planes (nothing to fold); at T = 3 plane 0 is A's memory and plane 2 O's."""
    plan = kernel(PLAIN, ONE)._plan(dict(N=13, T=3))
    assert list(plan.folded["B"].aliases) == [PlaneAlias(0, "A", "S0"), PlaneAlias(2, "O", "S2")]
    assert not kernel(PLAIN, ONE)._plan(dict(N=13, T=2)).folded


STENCILS = ("jacobi1d", "jacobi2d", "heat3d", "seidel2d")


@pytest.mark.parametrize("name", STENCILS)
def test_the_stencils_copies_are_planned_away(name):
    src, _, shapes = _S.CASES[name]
    sizes = dict(zip(("N", "M", "K"), shapes[-1]), T=7)
    folded = kernel(src, ONE)._plan(sizes).folded["B"]
    assert folded.aliases == (PlaneAlias(0, "A", "S0"), PlaneAlias(6, "O", "S2"))


def test_fdtd_fields_are_parts_of_a_plane_and_keep_their_copies():
    src = _S.CASES["fdtd"][0]
    assert not kernel(src, ONE)._plan(dict(NX=5, NY=7, T=6)).elided


# (stencil, threads, shapes, steps): rows of 37-1009 elements run as vectors (two blocks or more),
# with ragged ends; seidel's rows read this step's values, which live in O in the last step. Each
# shape and step count compiles both kernels (about 0.7 s each): the default tier runs one or two
SWEEP = [
    ("jacobi1d", 1, [(131,), (1009,)], (3, 19)),
    ("jacobi2d", 1, [(13, 67)], (3, 19)),
    ("jacobi2d", 2, [(29, 41)], (6,)),
    ("seidel2d", 1, [(7, 37)], (4,)),
    pytest.param("jacobi2d", 1, [(7, 37), (3, 131)], (3, 6, 19), marks=pytest.mark.slow),
    pytest.param("jacobi2d", 2, [(13, 67)], (3, 19), marks=pytest.mark.slow),
    pytest.param("heat3d", 1, [(5, 7, 37), (4, 3, 67)], (3, 6), marks=pytest.mark.slow),
    pytest.param("seidel2d", 1, [(11, 67)], (3, 19), marks=pytest.mark.slow),
    pytest.param("seidel2d", 2, [(11, 67)], (3, 19), marks=pytest.mark.slow),
    pytest.param("jacobi1d", 2, [(1009,)], (3, 19), marks=pytest.mark.slow),
]


@pytest.mark.parametrize("name, threads, shapes, counts", SWEEP)
def test_stencils_with_planes_kept_elsewhere_equal_the_unfolded_kernel(name, threads, shapes, counts):
    src, ref, _ = _S.CASES[name]
    aliased = kernel(src, tl.Options(threads=threads))
    unfolded = kernel(src, tl.Options(threads=threads, fold_storage=False))
    rng = np.random.default_rng(11)
    for shape in shapes:
        for t in counts:
            a = rng.standard_normal(shape).astype(F32)
            before = a.copy()
            steps = np.zeros(t, F32)
            sizes = dict(zip(("N", "M", "K"), shape), T=t)
            assert aliased._plan(sizes).elided == {"S0", "S2"}
            got = aliased(a, steps)
            np.testing.assert_array_equal(got, unfolded(a, steps), err_msg=f"{name} {shape} T={t}")
            np.testing.assert_allclose(
                got, ref(a, steps), rtol=3e-5, atol=3e-5, err_msg=f"{name} {shape} T={t}"
            )
            into = np.full(shape, np.nan, F32)  # out=: the caller's array is the last plane
            aliased(a, steps, out={"O": into})
            np.testing.assert_array_equal(into, got)
            strided = np.full((*shape[:-1], 2 * shape[-1]), np.nan, F32)[..., ::2]  # copied back
            aliased(a, steps, out={"O": strided})
            np.testing.assert_array_equal(strided, got)
            np.testing.assert_array_equal(a, before, err_msg="the input was written")


_PROT_NONE, _PROT_READ = 0, 1


class _GuardedArray:
    """A float32 array of `shape` that ends where an unreadable page starts (`array`);
    `read_only()` then makes its own pages unwritable too."""

    def __init__(self, shape: tuple[int, ...]):
        nbytes = math.prod(shape) * 4
        self.page = mmap.PAGESIZE
        self.pages = -(-nbytes // self.page) + 1
        self.region = mmap.mmap(-1, self.pages * self.page)
        self.anchor = (ctypes.c_char * (self.pages * self.page)).from_buffer(self.region)
        self.libc = ctypes.CDLL(None, use_errno=True)
        self._protect(self.pages - 1, 1, _PROT_NONE)
        offset = (self.pages - 1) * self.page - nbytes
        self.array = np.frombuffer(self.region, F32, count=math.prod(shape), offset=offset).reshape(shape)

    def _protect(self, first: int, count: int, prot: int) -> None:
        start = ctypes.c_void_p(ctypes.addressof(self.anchor) + first * self.page)
        if self.libc.mprotect(start, ctypes.c_size_t(count * self.page), prot) != 0:
            pytest.skip("mprotect failed")

    def read_only(self) -> None:
        self._protect(0, self.pages - 1, _PROT_READ)


@pytest.mark.skipif(mmap.PAGESIZE % 64 != 0, reason="needs mmap and mprotect")
@pytest.mark.parametrize("threads", [1, 2])
def test_vector_rows_read_the_input_and_write_the_output_inside_them(threads):
    """The first step's rows read A, the last step's write O, both ending at an unreadable page:
    a vector load past A's last row, or a store past O's, would fault; A's own pages are
    read-only, so any write to the input (a copy into its plane left running) would fault."""
    src, ref, _ = _S.CASES["jacobi2d"]
    k = kernel(src, tl.Options(threads=threads))
    rng = np.random.default_rng(3)
    for shape in ((9, 67), (6, 131), (17, 33)):
        a, o = _GuardedArray(shape), _GuardedArray(shape)
        a.array[...] = rng.standard_normal(shape).astype(F32)
        a.read_only()
        steps = np.zeros(5, F32)
        k(a.array, steps, out={"O": o.array})
        np.testing.assert_allclose(o.array, ref(np.array(a.array), steps), rtol=3e-5, atol=3e-5)
