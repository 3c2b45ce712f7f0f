"""Storage folding (planning/folding.py): temporaries of time recurrences stored modulo their
dependence distance, decided exactly against the schedule; results equal the unfolded kernel's
(Options(fold_storage=False)), the untransformed one's and NumPy's, on tiny, odd and prime sizes."""

from __future__ import annotations

import ctypes
import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import islpy as isl
import numpy as np
import pytest

import tensorlang as tl
from codegen.planning import folding
from polyhedral.sizes import compile_size_expr
from scheduler import padded_schedule

F32 = np.float32
REPO = Path(__file__).resolve().parents[2]


def _stencils():
    """tests/test_stencils.py, whose sources and NumPy references these tests reuse."""
    spec = importlib.util.spec_from_file_location("_stencil_sources", REPO / "tests" / "test_stencils.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_S = _stencils()

# B(t) from B(t - 1) and B(t - 2): three planes are live
TWO_STEP = """
def twostep(float(N) A, float(T) steps) -> (O) {
  B(t, i) = A(i) + t where t in 0:2, i in 0:N
  B(t, i) = (i >= 1 && i < N - 1) ? 0.5 * B(t-1, i) + 0.25 * (B(t-2, i-1) + B(t-2, i+1)) : B(t-2, i)
      where t in 2:T, i in 0:N
  O(i) = B(T - 1, i) where i in 0:N
}
"""

# the last statement reads B at three steps: B(T - 3) must still be there at the end
LATE_READS = """
def late(float(N) A, float(T) steps) -> (O) {
  B(t, i) = A(i) where t in 0:1, i in 0:N
  B(t, i) = (i >= 1 && i < N - 1) ? 0.5 * (B(t-1, i-1) + B(t-1, i+1)) : B(t-1, i) where t in 1:T, i in 0:N
  O(i) = B(T - 1, i) - B(T - 3, i) + B(T - 2, i) where i in 0:N
}
"""

# B(0) stays live to the end: no folding below T planes is legal
FIRST_AND_LAST = """
def firstlast(float(N) A, float(T) steps) -> (O) {
  B(t, i) = A(i) where t in 0:1, i in 0:N
  B(t, i) = (i >= 1 && i < N - 1) ? 0.5 * (B(t-1, i-1) + B(t-1, i+1)) : B(t-1, i) where t in 1:T, i in 0:N
  O(i) = B(T - 1, i) + B(0, i) where i in 0:N
}
"""


def ref_two_step(a, t):
    b = [a + F32(0), a + F32(1)]
    for s in range(2, t):
        p1, p2 = b[s - 1], b[s - 2]
        n = p2.copy()
        n[1:-1] = F32(0.5) * p1[1:-1] + F32(0.25) * (p2[:-2] + p2[2:])
        b.append(n)
    return b[t - 1]


def _smooth(b):
    n = b.copy()
    n[1:-1] = F32(0.5) * (b[:-2] + b[2:])
    return n


def _planes(a, t):
    planes = [a.copy()]
    for _ in range(t - 1):
        planes.append(_smooth(planes[-1]))
    return planes


def ref_late(a, t):
    p = _planes(a, t)
    return (p[t - 1] - p[t - 3]) + p[t - 2]


def ref_first_last(a, t):
    p = _planes(a, t)
    return p[t - 1] + p[0]


def _stencil_args(shape, t, rng):
    return [rng.standard_normal(shape).astype(F32), np.zeros(t, F32)]


def _fdtd_args(shape, t, rng):
    return [rng.standard_normal(shape).astype(F32) for _ in range(3)] + [rng.standard_normal(t).astype(F32)]


def _steps(ref):
    return lambda a, steps: ref(a, len(steps))


CASES = {
    "jacobi1d": (
        _S.JACOBI_1D,
        _steps(_S.ref_jacobi1d),
        [(1,), (2,), (3,), (13,), (31,)],
        (1, 2, 3, 7),
        _stencil_args,
    ),
    "jacobi2d": (
        _S.JACOBI_2D,
        _steps(_S.ref_jacobi2d),
        [(1, 1), (2, 3), (5, 7), (11, 13), (17, 4)],
        (1, 2, 3, 7),
        _stencil_args,
    ),
    "heat3d": (
        _S.HEAT_3D,
        _steps(_S.ref_heat3d),
        [(1, 1, 1), (3, 3, 3), (5, 7, 3), (7, 5, 11)],
        (1, 2, 5),
        _stencil_args,
    ),
    "seidel2d": (
        _S.SEIDEL_2D,
        _steps(_S.ref_seidel2d),
        [(1, 1), (2, 3), (5, 7), (7, 5)],
        (1, 2, 4),
        _stencil_args,
    ),
    "fdtd2d": (_S.FDTD_2D, _S.ref_fdtd2d, [(1, 1), (2, 3), (5, 7)], (1, 2, 4), _fdtd_args),
    "twostep": (
        TWO_STEP,
        _steps(ref_two_step),
        [(1,), (2,), (3,), (17,), (29,)],
        (2, 3, 4, 9),
        _stencil_args,
    ),
    "late": (LATE_READS, _steps(ref_late), [(1,), (3,), (13,)], (3, 4, 9), _stencil_args),
    "firstlast": (FIRST_AND_LAST, _steps(ref_first_last), [(1,), (3,), (13,)], (1, 2, 3, 9), _stencil_args),
}

_KERNELS: dict = {}


def kernel(name: str, options: tl.Options) -> tl.Kernel:
    key = (name, options)
    if key not in _KERNELS:
        _KERNELS[key] = tl.compile(CASES[name][0], options=options)
    return _KERNELS[key]


def _tuple(x):
    return x if isinstance(x, tuple) else (x,)


def _compare_with_unfolded(name, cases):
    _, ref, _, _, make = CASES[name]
    rng = np.random.default_rng(5)
    folded = kernel(name, tl.Options(threads=1))
    unfolded = kernel(name, tl.Options(threads=1, fold_storage=False))
    reference = kernel(name, tl.Options(optimize=False))
    for shape, t in cases:
        args = make(shape, t, rng)
        want = _tuple(ref(*args))
        got, plain, base = _tuple(folded(*args)), _tuple(unfolded(*args)), _tuple(reference(*args))
        for w, g, p, b in zip(want, got, plain, base):
            msg = f"{name} {shape} T={t}"
            np.testing.assert_allclose(g, w, rtol=2e-5, atol=2e-5, err_msg=msg)
            # the same expressions on the same values: bit for bit the unfolded results
            np.testing.assert_array_equal(g, p, err_msg=msg)
            np.testing.assert_array_equal(g, b, err_msg=msg)


@pytest.mark.parametrize("name", list(CASES))
def test_folded_kernels_match_unfolded_untransformed_and_numpy(name):
    _, _, shapes, steps, _ = CASES[name]
    _compare_with_unfolded(name, [(shapes[0], steps[0]), (shapes[-1], steps[-1]), (shapes[-2], steps[1])])


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CASES))
def test_folded_kernels_match_at_every_size_and_step_count(name):
    _, _, shapes, steps, _ = CASES[name]
    _compare_with_unfolded(name, [(shape, t) for shape in shapes for t in steps])


@pytest.mark.parametrize("name", ["jacobi2d", "heat3d", "seidel2d", "fdtd2d", "twostep", "late"])
def test_folded_kernels_on_two_threads_match_the_untransformed_kernel(name):
    _, _, shapes, steps, make = CASES[name]
    rng = np.random.default_rng(9)
    k = kernel(name, tl.Options(threads=2))
    reference = kernel(name, tl.Options(optimize=False))
    for shape in shapes[-2:]:
        for t in steps[-2:]:
            args = make(shape, t, rng)
            for g, b in zip(_tuple(k(*args)), _tuple(reference(*args))):
                np.testing.assert_array_equal(g, b, err_msg=f"{name} {shape} T={t}")


def _plan(name: str, sizes: dict[str, int], options: tl.Options | None = None):
    return kernel(name, options or tl.Options(threads=1))._plan(sizes)


@pytest.mark.parametrize(
    "name, sizes, modulus",
    [
        ("jacobi1d", dict(N=31, T=7), 2),
        ("jacobi2d", dict(N=11, M=13, T=7), 2),
        ("heat3d", dict(N=7, M=5, K=11, T=5), 2),
        ("twostep", dict(N=29, T=9), 3),
        ("late", dict(N=13, T=9), 3),  # B(T - 3) is read after the recurrence: three planes
    ],
)
def test_the_modulus_is_the_live_planes(name, sizes, modulus):
    plan = _plan(name, sizes)
    (fold,) = plan.folded.values()
    assert (fold.tensor, fold.dim, fold.modulus) == ("B", 0, modulus)
    assert fold.folded_bytes * sizes["T"] == fold.full_bytes * modulus
    assert not _plan(name, sizes, tl.Options(threads=1, fold_storage=False)).folded
    assert not _plan(name, sizes, tl.Options(optimize=False)).folded


def test_in_place_recurrences_fold_to_what_the_schedule_allows():
    # Gauss-Seidel reads this sweep's values where it already wrote them: one or two planes,
    # whatever the exact check finds for the schedule (and the results above agree)
    assert _plan("seidel2d", dict(N=7, M=5, T=4)).folded["B"].modulus in (1, 2)
    assert _plan("fdtd2d", dict(NX=5, NY=7, T=4)).folded["F"].modulus in (1, 2)


def test_a_plane_read_at_the_end_keeps_its_storage():
    assert not _plan("firstlast", dict(N=13, T=9)).folded  # B(0) is live until O reads it


def test_too_few_steps_to_fold():
    assert not _plan("jacobi2d", dict(N=11, M=13, T=2)).folded  # two planes are all there is
    assert not _plan("jacobi2d", dict(N=11, M=13, T=1)).folded


def test_planned_storage_of_jacobi_1000_is_two_planes():
    sizes = dict(N=1000, M=1000, T=100)
    plan = _plan("jacobi2d", sizes)
    fold = plan.folded["B"]
    plane = 1000 * 1000 * 4
    assert fold.folded_bytes == 2 * plane and fold.full_bytes == 100 * plane
    assert fold.folded_bytes < 3 * plane and plan.workspace_bytes < plane
    assert fold.storage_shape((100, 1000, 1000)) == (2, 1000, 1000)
    k = kernel("jacobi2d", tl.Options(threads=1))
    assert k.inspect("loops", sizes=sizes).startswith(
        "// B: folded modulo 2 along dimension 0 (t): 2 of 100 planes, 8000000 of 400000000 bytes "
        "(saves 373.84 MiB)"
    )
    assert "folded modulo 2" in k.inspect("plan", sizes=sizes)


def test_the_allocated_temporary_has_the_folded_shape(monkeypatch):
    shapes = []
    real = np.empty

    def spy(shape, *a, **kw):
        shapes.append(tuple(shape) if not isinstance(shape, int) else (shape,))
        return real(shape, *a, **kw)

    k = tl.compile(_S.JACOBI_2D, options=tl.Options(threads=1))
    a = np.random.default_rng(0).standard_normal((9, 7)).astype(F32)
    k(a, np.zeros(6, F32))
    monkeypatch.setattr(np, "empty", spy)
    np.testing.assert_allclose(k(a, np.zeros(6, F32)), _S.ref_jacobi2d(a, 6), rtol=2e-5, atol=2e-5)
    assert (2, 9, 7) in shapes and (6, 9, 7) not in shapes


def _check_inputs(name, sizes):
    k = kernel(name, tl.Options(threads=1))
    scop = k._plan(sizes).scop
    context = scop.params.fixed_context(sizes)
    ((tensor, (writes, reads)),) = folding._candidates(scop, set()).items()
    return k, scop, context, tensor, (writes.intersect_params(context), reads.intersect_params(context))


def test_the_check_rejects_one_plane_for_jacobi_and_accepts_two():
    sizes = dict(N=13, T=6)
    k, scop, context, tensor, accesses = _check_inputs("jacobi1d", sizes)
    shapes = {t.name: tuple(compile_size_expr(d)(sizes) for d in t.shape) for t in scop.program.tensors}
    assert shapes["B"] == (6, 13)
    source = folding.original_order(scop.statements, scop.params)
    for schedule in (k.schedule.tree.get_map(), source):
        sched = padded_schedule(schedule.intersect_domain(scop.domain().intersect_params(context)))
        order = folding._happens_before(sched, scop.dependences.all.intersect_params(context))
        # B(t) would overwrite B(t - 1) while its neighbours still read it
        assert not folding._legal(tensor, 0, 1, accesses, sched, order)
    assert folding._legal(tensor, 0, 2, accesses, sched, order)  # in the source order
    assert k._plan(sizes).folded["B"].modulus == 2


def test_loops_that_may_run_in_parallel_order_nothing():
    # with no dependence carried anywhere every loop may run in parallel: no write is ordered
    sizes = dict(N=13, T=6)
    k, scop, context, tensor, accesses = _check_inputs("jacobi1d", sizes)
    source = folding.original_order(scop.statements, scop.params)
    sched = padded_schedule(source.intersect_domain(scop.domain().intersect_params(context)))
    order = folding._happens_before(sched, isl.UnionMap.empty(scop.dependences.all.get_space()))
    assert not folding._legal(tensor, 0, 2, accesses, sched, order)


def test_the_folded_inner_loop_is_still_vectorised():
    text = kernel("jacobi2d", tl.Options(threads=1)).inspect("llvm", sizes=dict(N=64, M=64, T=8))
    assert any(f"<{w} x float>" in text for w in (4, 8, 16))


def test_folded_kernel_from_the_call_records_of_a_fresh_process(cache_dir):
    child = textwrap.dedent(
        """
        import json
        import numpy as np
        import tensorlang as tl
        k = tl.compile(SOURCE, options=tl.Options(threads=1))
        a = np.random.default_rng(0).standard_normal((13, 11)).astype(np.float32)
        o = k(a, np.zeros(7, np.float32))
        b = a.copy()
        for _ in range(6):
            n = b.copy()
            s = (((b[1:-1, 1:-1] + b[:-2, 1:-1]) + b[2:, 1:-1]) + b[1:-1, :-2]) + b[1:-1, 2:]
            n[1:-1, 1:-1] = np.float32(0.2) * s
            b = n
        print(json.dumps({"ok": bool(np.array_equal(o, b)), "disk_hits": k.disk_hits}))
        """
    ).replace("SOURCE", repr(_S.JACOBI_2D))
    env = {**os.environ, "TENSORLANG_CACHE_DIR": str(cache_dir), "PYTHONPATH": str(REPO)}
    runs = []
    for _ in range(2):
        out = subprocess.run(
            [sys.executable, "-c", child], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
        )
        assert out.returncode == 0, out.stderr
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    assert runs[0]["ok"] and runs[1]["ok"]
    assert runs[1]["disk_hits"] > 0
    records = [json.loads(p.read_text()) for p in cache_dir.rglob("*.json")]
    assert any(r.get("kind") == "record" and r["payload"].get("folded") == {"B": [0, 2]} for r in records)


def test_exported_folded_kernel_matches_numpy(tmp_path):
    result = tl.export(_S.JACOBI_2D, sizes=dict(N=13, M=11, T=7), path=tmp_path / "out")
    if getattr(result, "shared", None) is None or not Path(result.shared).exists():
        pytest.skip("no linker for a shared library")
    lib = ctypes.CDLL(str(result.shared))
    fn = getattr(lib, result.name)
    fn.restype = ctypes.c_int32
    a = np.random.default_rng(3).standard_normal((13, 11)).astype(F32)
    steps, out = np.zeros(7, F32), np.empty((13, 11), F32)
    pointers = [ctypes.c_void_p(x.ctypes.data) for x in (a, steps, out)]
    assert fn(*pointers, *[ctypes.c_int64(s) for s in (13, 11, 7)]) == 0
    np.testing.assert_allclose(out, _S.ref_jacobi2d(a, 7), rtol=2e-5, atol=2e-5)
