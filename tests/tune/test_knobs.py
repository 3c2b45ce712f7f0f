"""The plan-level tuning knobs (loop_order, band_tiles, vector_width, gemm_blocking): each is
validated, changes the generated code, keeps results equal to NumPy at odd and prime sizes, and
round-trips through the tuning database's JSON; tuning with sizes given by keyword."""

from __future__ import annotations

import itertools
import json
import random
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import tensorlang as tl
from codegen.host import gemm_blocking
from codegen.tune import database, key, space

REPO = Path(__file__).resolve().parents[2]
TRANSPOSE = "def tr(float(N,M) A) -> (B) { B(j,i) = A(i,j) * 2.0 }"
PERMUTE3 = "def p3(float(N,M,K) A) -> (B) { B(k,i,j) = A(i,j,k) + 1.0 }"
TWO_BANDS = (
    "def two(float(N,M) A, float(M,N) B) -> (C, D) {\n C(i,j) = A(i,j) + B(j,i)\n D(j,i) = C(i,j) * 3.0\n}"
)
MATMUL = "def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }"
MATMUL64 = "def mm64(double(M,K) A, double(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }"
AXPY = "def axpy(float(N) X, float(N) Y) -> (Z) { Z(i) = X(i) * 3.0 + Y(i) }"
RAMP = "def ramp(float(N) A) -> (B) {\n  B(t, i) = A(i) * t where t in 0:T, i in 0:N\n}"


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TENSORLANG_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("TENSORLANG_TUNE_FAULTS", raising=False)


def _rng(seed=0):
    return np.random.default_rng(seed)


# ---------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    "bad",
    [
        {"loop_order": (0, 0)},
        {"loop_order": (1, 2)},
        {"loop_order": (0,)},
        {"loop_order": (0, True)},
        {"band_tiles": [[0]]},
        {"band_tiles": "8"},
        {"vector_width": 100},
        {"vector_width": True},
        {"gemm_blocking": (96, 0, 128)},
        {"gemm_blocking": (96, 128)},
    ],
)
def test_invalid_knobs_are_rejected(bad):
    with pytest.raises(tl.TensorLangError, match="Options\\."):
        tl.Options(**bad)


def test_knobs_are_normalised_and_shown_in_the_repr_only_when_set():
    o = tl.Options(loop_order=[1, 0], band_tiles=[None, [8, 8], 4], gemm_blocking=[96, 512, 64])
    assert (
        o.loop_order == (1, 0) and o.band_tiles == (None, (8, 8), (4,)) and o.gemm_blocking == (96, 512, 64)
    )
    assert "loop_order" not in repr(tl.Options()) and "vector_width=128" in repr(tl.Options(vector_width=128))


# ---------------------------------------------------------------------- loop order


def _outer_loop(loops: str) -> str:
    """The bound of the outermost loop (sizes are specialised: `c0 <= 36` for a size 37)."""
    return re.search(r"for \(int64 (c\d+) = 0; \1 <= (\d+)", loops).group(2)


def _statement(loops: str) -> str:
    return next(line.strip() for line in loops.splitlines() if "// S0" in line)


@pytest.mark.parametrize("n, m", [(1, 1), (3, 7), (37, 29), (97, 61)])
def test_loop_order_changes_the_loops_and_not_the_result(n, m):
    a = _rng().standard_normal((n, m), dtype=np.float32)
    sizes = {"N": n, "M": m}
    default = tl.compile(TRANSPOSE, options=tl.Options(tuned=False, threads=1))
    swapped = tl.compile(TRANSPOSE, options=tl.Options(tuned=False, threads=1, loop_order=(1, 0)))
    np.testing.assert_array_equal(default(a), a.T * 2)
    np.testing.assert_array_equal(swapped(a), a.T * 2)
    if n == 1:
        return  # no loops at all
    # the statement's subscripts name the loops: the innermost runs over j instead of i
    assert _statement(default.inspect("loops", sizes=sizes)) != _statement(
        swapped.inspect("loops", sizes=sizes)
    )


def test_every_permutation_of_a_three_member_band_is_correct():
    a = _rng(1).standard_normal((5, 7, 11), dtype=np.float32)
    want = np.transpose(a, (2, 0, 1)) + 1
    outer = set()
    for perm in itertools.permutations(range(3)):
        k = tl.compile(PERMUTE3, options=tl.Options(tuned=False, threads=2, loop_order=perm))
        np.testing.assert_array_equal(k(a), want)
        outer.add(_outer_loop(k.inspect("loops", sizes={"N": 5, "M": 7, "K": 11})))
    assert outer == {"4", "6", "10"}  # each member goes outermost in some order


def test_loop_order_of_another_length_leaves_the_band_alone():
    sizes = {"N": 37, "M": 29}
    default = tl.compile(TRANSPOSE, options=tl.Options(tuned=False)).inspect("loops", sizes=sizes)
    other = tl.compile(TRANSPOSE, options=tl.Options(tuned=False, loop_order=(2, 0, 1))).inspect(
        "loops", sizes=sizes
    )
    assert default == other


# ---------------------------------------------------------------------- tiles per band


def test_band_tiles_tile_each_band_on_its_own():
    n, m = 41, 23
    a = _rng().standard_normal((n, m), dtype=np.float32)
    b = _rng(1).standard_normal((m, n), dtype=np.float32)
    options = tl.Options(tuned=False, threads=1, fusion="none", band_tiles=[None, (4, 4)])
    k = tl.compile(TWO_BANDS, options=options)
    c, d = k(a, b)
    np.testing.assert_allclose(c, a + b.T, rtol=1e-6)
    np.testing.assert_allclose(d, (a + b.T).T * 3, rtol=1e-6)
    loops = k.inspect("loops", sizes={"N": n, "M": m})
    default = tl.compile(TWO_BANDS, options=tl.Options(tuned=False, threads=1, fusion="none"))
    assert "+= 4)" in loops and loops != default.inspect("loops", sizes={"N": n, "M": m})
    s = space.space_for(default.inspect("schedule"), {"N": n, "M": m})
    assert s.bands == (2, 2)


# ---------------------------------------------------------------------- vector width


def _vector_types(k) -> set[str]:
    return set(re.findall(r"<(\d+) x float>", k.inspect("llvm")))


def test_vector_width_sets_the_ir_vector_type():
    x = _rng().standard_normal(1009, dtype=np.float32)
    y = _rng(1).standard_normal(1009, dtype=np.float32)
    types = {}
    for width in (None, 128, 256, 512):
        k = tl.compile(AXPY, options=tl.Options(tuned=False, threads=1, vector_width=width))
        np.testing.assert_array_equal(k(x, y), x * np.float32(3) + y)
        types[width] = _vector_types(k)
    assert types[128] == {"4"}  # 128 bits: <4 x float> only
    assert types[128] != types[512]
    assert "vector-width=128" in tl.compile(AXPY, options=tl.Options(vector_width=128)).inspect(
        "plan", sizes={"N": 9}
    )


@pytest.mark.parametrize("width", [128, 256, 512])
def test_vector_width_keeps_reductions_equal(width):
    a = _rng().standard_normal((13, 17), dtype=np.float32)
    b = _rng(1).standard_normal((17, 11), dtype=np.float32)
    src = "def mv(float(N,M) A, float(M) x) -> (y) { y(i) +=! A(i,j) * x(j) }"
    k0 = tl.compile(src, options=tl.Options(tuned=False, threads=1))
    k1 = tl.compile(src, options=tl.Options(tuned=False, threads=1, vector_width=width))
    np.testing.assert_array_equal(k0(a, b[:, 0]), k1(a, b[:, 0]))  # no fast-math: the same sums
    np.testing.assert_allclose(k1(a, b[:, 0]), a @ b[:, 0], rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------- GEMM blocking


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("m, k, n", [(1, 1, 1), (7, 13, 5), (131, 127, 149), (67, 263, 97)])
def test_gemm_blocking_changes_the_plan_and_not_the_result(threads, m, k, n):
    a = _rng().standard_normal((m, k), dtype=np.float32)
    b = _rng(1).standard_normal((k, n), dtype=np.float32)
    sizes = {"M": m, "K": k, "N": n}
    base = tl.compile(MATMUL, options=tl.Options(tuned=False, threads=threads))
    small = tl.compile(MATMUL, options=tl.Options(tuned=False, threads=threads, gemm_blocking=(12, 16, 16)))
    np.testing.assert_allclose(small(a, b), a @ b, rtol=1e-4, atol=1e-4)
    plan, default_plan = small.inspect("plan", sizes=sizes), base.inspect("plan", sizes=sizes)
    if "GEMM m=" not in default_plan:  # tiny products stay loops: the knob changes nothing
        assert plan == default_plan
        return
    assert "GEMM m=" in plan and "gemm=float32@" in plan and plan != default_plan
    workspace = re.compile(r"workspace: (\d+) bytes")
    assert int(workspace.search(plan).group(1)) < int(workspace.search(default_plan).group(1))


def test_gemm_blocking_float64_and_blocks_made_legal():
    a = _rng().standard_normal((53, 71))
    b = _rng(1).standard_normal((71, 59))
    k = tl.compile(MATMUL64, options=tl.Options(tuned=False, gemm_blocking=(7, 10**6, 10**6)))
    np.testing.assert_allclose(k(a, b), a @ b, rtol=1e-10, atol=1e-10)
    from codegen.host.blocking import blocked

    for dtype in ("float32", "float64"):
        base = gemm_blocking(dtype)
        cfg = blocked(dtype, (7, 10**6, 10**6))
        assert cfg.mc % cfg.mr == 0 and cfg.nc % cfg.nr == 0 and cfg.kc % 16 == 0
        assert cfg.kc * cfg.nc <= base.kc * base.nc  # fits the team's shared panel


FRESH = textwrap.dedent(
    """
    import json, sys, numpy as np, tensorlang as tl
    a = np.random.default_rng(0).standard_normal((45, 37), dtype=np.float32)
    b = np.random.default_rng(1).standard_normal((37, 29), dtype=np.float32)
    k = tl.compile(sys.argv[1], options=tl.Options(tuned=False, gemm_blocking=(24, 64, 32)))
    c = k(a, b)
    print(json.dumps(dict(ok=bool(np.allclose(c, a @ b, rtol=1e-4, atol=1e-4)), hits=k.disk_hits)))
    """
)


def test_gemm_variant_from_the_disk_cache_in_a_fresh_process(tmp_path):
    env = {**__import__("os").environ, "TENSORLANG_CACHE_DIR": str(tmp_path / "fresh")}
    runs = []
    for _ in range(2):  # the second loads the kernel's object code, which calls the variant
        out = subprocess.run(
            [sys.executable, "-c", FRESH, MATMUL], capture_output=True, text=True, cwd=REPO, env=env
        )
        assert out.returncode == 0, out.stderr
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    assert runs[0]["ok"] and runs[1]["ok"] and runs[1]["hits"] >= 1


# ---------------------------------------------------------------------- thread split


@pytest.mark.parametrize("source, shapes", [(TRANSPOSE, [(101, 67)]), (MATMUL, [(131, 127), (127, 149)])])
def test_serial_thread_split_runs_every_phase_on_one_thread(source, shapes):
    arrays = [_rng(i).standard_normal(s, dtype=np.float32) for i, s in enumerate(shapes)]
    default = tl.compile(source, options=tl.Options(tuned=False, threads=2))
    serial = tl.compile(source, options=tl.Options(tuned=False, threads=2, thread_split="serial"))
    np.testing.assert_allclose(serial(*arrays), default(*arrays), rtol=1e-5, atol=1e-5)
    sizes = dict(zip(("N", "M"), shapes[0])) if source == TRANSPOSE else {"M": 131, "K": 127, "N": 149}
    plan = serial.inspect("plan", sizes=sizes)
    phases = [line for line in plan.splitlines() if line.startswith("// phase")]
    assert phases and all("; serial" in line or "folded into" in line for line in phases)
    assert plan != default.inspect("plan", sizes=sizes)
    with pytest.raises(tl.TensorLangError, match="thread_split"):
        tl.Options(thread_split="inner")


# ---------------------------------------------------------------------- the space and records


def test_space_offers_the_new_knobs_and_every_point_is_valid_options():
    k = tl.compile(MATMUL)
    sizes = {"M": 64, "K": 48, "N": 80}
    cfg = gemm_blocking("float32")
    s = space.space_for(k.inspect("schedule"), sizes, (cfg.mc, cfg.nc, cfg.kc))
    d = s.default()
    near = s.neighbours(d)
    assert not any(n["thread_split"] for n in near)  # one thread: nothing to split
    s = space.space_for(k.inspect("schedule"), sizes, (cfg.mc, cfg.nc, cfg.kc), threads=2)
    d = s.default()
    near = s.neighbours(d)
    for knob in ("loop_order", "vector_width", "gemm_blocking", "thread_split"):
        assert any(n[knob] is not None for n in near), knob
    # loop orders offered are exactly the permutations of the deepest band's members
    assert all(sorted(o) == list(range(s.depth)) for o in s.orders if o is not None)
    rng = random.Random(0)
    points = near + [s.sample(rng) for _ in range(50)] + [s.mutate(d, rng) for _ in range(100)]
    for p in points:
        options = key.from_knobs(p, tl.Options())
        assert key.knobs_json(options) == key.normalise(p)
        assert json.loads(json.dumps(p)) == p


CONV = "def conv(float(N,C,H,W) I, float(F,C,KH,KW) Wt) -> (O) {\n O(n,f,h,w) +=! I(n,c,h+kh,w+kw) * Wt(f,c,kh,kw)\n}"


def test_direct_convolution_or_gemm_is_a_knob():
    from codegen.tune import api

    sizes = {"N": 1, "C": 32, "H": 19, "W": 23, "F": 32, "KH": 3, "KW": 3}
    x = _rng().standard_normal((1, 32, 19, 23), dtype=np.float32)
    w = _rng(1).standard_normal((32, 32, 3, 3), dtype=np.float32)
    direct = tl.compile(CONV, options=tl.Options(tuned=False))
    gemm = tl.compile(CONV, options=tl.Options(tuned=False, direct_conv=False))
    np.testing.assert_allclose(direct(x, w), gemm(x, w), rtol=1e-4, atol=1e-3)
    if not api._direct_conv(direct, sizes):
        pytest.skip("no direct convolution for this kernel on this host")
    assert "GEMM m=" in gemm.inspect("plan", sizes=sizes)
    assert api._gemm_blocks(direct, sizes, ["float32"]) is not None
    s = space.space_for(direct.inspect("schedule"), sizes, (1, 2, 3), conv=True)
    assert {**s.default(), "direct_conv": False} in s.neighbours(s.default())
    assert key.from_knobs({**s.default(), "direct_conv": False}, tl.Options()).direct_conv is False


def test_records_without_the_later_knobs_stay_readable():
    old = {
        "tile": [8, 8],
        "fusion": "auto",
        "unroll": 2,
        "vectorize": True,
        "pipeline": True,
        "prefetch": False,
    }
    options = key.from_knobs(old, tl.Options())
    assert options.tile == (8, 8) and options.loop_order is None and options.gemm_blocking is None
    assert key.normalise(old)["vector_width"] is None
    knobs = {**key.knobs_json(tl.Options()), "band_tiles": [None, [4, 4]], "gemm_blocking": [96, 512, 64]}
    assert key.from_knobs(knobs, tl.Options()).band_tiles == (None, (4, 4))
    with pytest.raises(ValueError):
        key.from_knobs({**knobs, "loop_order": [0, 0]}, tl.Options())


def test_the_tuner_offers_and_checks_gemm_blockings():
    from codegen.tune import api, measure

    a = _rng().standard_normal((67, 53), dtype=np.float32)
    b = _rng(1).standard_normal((53, 71), dtype=np.float32)
    k = tl.compile(MATMUL, options=tl.Options(tuned=False))
    sizes = {"M": 67, "K": 53, "N": 71}
    cfg = gemm_blocking("float32")
    assert api._gemm_blocks(k, sizes, ["float32"]) == (cfg.mc, cfg.nc, cfg.kc)
    assert api._gemm_blocks(tl.compile(TRANSPOSE), {"N": 64, "M": 64}, ["float32"]) is None
    default = key.knobs_json(tl.Options())
    blocked = {**default, "gemm_blocking": [12, 16, 16], "vector_width": 128, "loop_order": [1, 0]}
    task = {
        "kind": "confirm",
        "source": MATMUL,
        "name": "mm",
        "threads": 2,
        "candidates": [default, blocked],
        "inputs": [a, b],
        "reference": [a @ b],
        "rounds": 1,
        "timeout_s": 120.0,
    }
    result = measure.evaluate(task)  # checked against the reference before it is timed
    assert result["status"] == "ok", result
    assert len(result["times"]) == 2


# ---------------------------------------------------------------------- keyword sizes


def test_tune_with_a_keyword_size_keys_it_and_the_kernel_finds_the_record():
    a = _rng().standard_normal(67, dtype=np.float32)
    r = tl.tune(RAMP, a, T=13, budget_s=1.5, progress=False)
    want = key.key_of(key.describe(RAMP, "ramp", {"N": 67, "T": 13}, ["float32"], tl.Options()))
    assert r.key == want
    # a distinctive record at that key: the kernel called with T=13 plans with it
    knobs = {**key.knobs_json(tl.Options()), "tile": [4, 4]}
    with database.Database() as db:
        trial = db.add_trial(want, knobs, 1e-6, "ok")
        db.set_best(want, trial, knobs, 1e-6, 2e-6)
    k = tl.compile(RAMP)
    np.testing.assert_array_equal(k(a, T=13), np.arange(13, dtype=np.float32)[:, None] * a[None, :])
    assert "c0 += 4" in k.inspect("plan", sizes={"N": 67, "T": 13})
    assert "c0 += 4" not in k.inspect("plan", sizes={"N": 67, "T": 14})  # another key


def test_tune_keyword_size_errors_are_the_kernels():
    a = np.ones(8, dtype=np.float32)
    with pytest.raises(tl.TensorLangError, match="pass it by keyword"):
        tl.tune(RAMP, a, budget_s=0, progress=False)
    with pytest.raises(tl.TensorLangError, match="Q= is not a size"):
        tl.tune(RAMP, a, T=3, Q=1, budget_s=0, progress=False)


def test_cli_tune_with_a_size_by_keyword(tmp_path, capsys):
    from tensorlang.cli import main

    src = tmp_path / "ramp.tc"
    src.write_text(RAMP)
    assert main(["tune", str(src), "--shape", "A=16", "--size", "T=5", "--budget", "1"]) == 0
    assert "ramp: best" in capsys.readouterr().out
    assert main(["tune", "--list"]) == 0
    assert "ramp [N=16,T=5] float32" in capsys.readouterr().out


def test_exported_object_with_a_gemm_variant_matches_numpy(tmp_path):
    """Ahead-of-time export links the variant's GEMM into the object (export/objects.py)."""
    from codegen.aot import export

    sys.path.insert(0, str(REPO / "tests" / "codegen"))
    from test_export import run_c  # the C harness of the export tests

    m, k, n = 131, 127, 149
    a = _rng().standard_normal((m, k), dtype=np.float32)
    b = _rng(1).standard_normal((k, n), dtype=np.float32)
    options = tl.Options(gemm_blocking=(24, 64, 32), tuned=False)
    result = export(MATMUL, sizes=dict(M=m, K=k, N=n), path=tmp_path / "out", options=options)
    rc, (c,), _ = run_c(tmp_path, result, [a, b], [(np.float32, (m, n))], (m, k, n))
    assert rc == 0
    np.testing.assert_allclose(c, a @ b, rtol=1e-4, atol=1e-4)


def test_a_finalist_must_win_every_interleaved_round():
    from codegen.tune.api import _wins_every_round

    steady = {"times": [1.0, 0.9], "rounds": [[1.0, 1.0, 1.1], [0.9, 0.9, 1.0]]}
    burst = {"times": [1.0, 0.8], "rounds": [[1.0, 0.7, 1.1], [0.8, 0.8, 0.7]]}  # lost round 2
    assert _wins_every_round(steady, 1) and not _wins_every_round(burst, 1)
    assert _wins_every_round({"times": [1.0, 0.9]}, 1)  # no rounds reported: the median decides
