"""Kernels from the disk cache's records (codegen/runtime/warm.py): a fresh process skips the front
end, islpy and sympy; the records' kernels behave as compiled ones (results, warnings, errors,
inspection, pickling); damaged or inconsistent records are misses, never trusted."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import numpy as np
import pytest

import tensorlang as tl
from codegen.lowering import disk_cache
from codegen.runtime import warm
from tensorlang.errors import TensorLangWarning

REPO = Path(__file__).resolve().parents[2]
MATMUL = "def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }"
SOFTMAX = """
def sm(float(N, D) I) -> (O) {
  mx(n) max=! I(n, d)
  e(n, d) = exp(I(n, d) - mx(n))
  s(n) +=! e(n, d)
  O(n, d) = e(n, d) / s(n)
}"""
GATHER = "def g(float(E, D) T, int32(B) I) -> (O) { O(b, d) = T(I(b), d) }"
LINTED = "def mm(float(M, K) A, float(K, N) B) -> (C) {\n    C(m, n) +=! A(m, k) * B(kk, n)\n}"
# reads I(i, i + j, j) in bounds only when I_0 + I_2 - 1 <= I_1: checked per call's sizes
PRECONDITION = "def f(float(A, B, C) I) -> (O) { O(i) +=! I(i, i + j, j) }"

CHILD = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import tensorlang as tl
    k = tl.compile(SOURCE)
    r = np.random.default_rng(0)
    a = r.standard_normal((67, 45), dtype=np.float32)
    b = r.standard_normal((45, 83), dtype=np.float32)
    c = k(a, b)
    print(json.dumps({
        "ok": bool(np.allclose(c, a @ b, rtol=1e-4, atol=1e-4)),
        "disk_hits": k.disk_hits, "compile_count": k.compile_count,
        "heavy": sorted(m for m in ("sympy", "islpy", "polyhedral.scop", "tensorlang.ir") if m in sys.modules),
    }))
    """
).replace("SOURCE", repr(MATMUL))


def _fresh_process(cache: Path) -> dict:
    env = {**os.environ, "TENSORLANG_CACHE_DIR": str(cache), "PYTHONPATH": str(REPO)}
    env.pop("TENSORLANG_VERIFY", None)
    out = subprocess.run(
        [sys.executable, "-c", CHILD], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def _records(root: Path) -> list[Path]:
    return [p for p in root.rglob("*.json") if json.loads(p.read_text()).get("kind") == "record"]


def _matmul_inputs(m=67, k=45, n=83, seed=0):
    r = np.random.default_rng(seed)
    return r.standard_normal((m, k), dtype=np.float32), r.standard_normal((k, n), dtype=np.float32)


def test_a_warm_process_runs_without_the_front_end(cache_dir):
    cold = _fresh_process(cache_dir)
    assert cold["ok"] and cold["disk_hits"] == 0
    assert "islpy" in cold["heavy"] and "sympy" in cold["heavy"]  # the cold one ran every stage
    warm_run = _fresh_process(cache_dir)
    assert warm_run == {"ok": True, "disk_hits": 1, "compile_count": 1, "heavy": []}


def test_a_recorded_kernel_matches_a_compiled_one(cache_dir):
    cold = tl.compile(SOFTMAX)
    x = np.random.default_rng(1).standard_normal((13, 29)).astype(np.float32)
    want = cold(x)
    hot = tl.compile(SOFTMAX)
    assert hot._stages is None  # from the program record: nothing compiled
    got = hot(x)
    np.testing.assert_array_equal(got, want)
    assert (hot.compile_count, hot.disk_hits) == (1, 1)
    assert hot._stages is None  # the call record and the object code sufficed
    assert repr(hot) == repr(cold) and hot.name == "sm"
    # new sizes have no call record: the skipped stages run then, and record them
    y = np.random.default_rng(2).standard_normal((7, 3)).astype(np.float32)
    np.testing.assert_array_equal(hot(y), cold(y))
    assert hot._stages is not None and str(hot.program) == str(cold.program)
    for stage in ("ast", "ir", "schedule"):
        assert hot.inspect(stage) == cold.inspect(stage)


def test_inspection_of_a_recorded_kernel_plans_on_demand(cache_dir):
    a, b = _matmul_inputs()
    tl.compile(MATMUL)(a, b)
    hot = tl.compile(MATMUL)
    np.testing.assert_allclose(hot(a, b), a @ b, rtol=1e-4, atol=1e-4)
    sizes = {"M": 67, "K": 45, "N": 83}
    assert hot.inspect("plan", sizes=sizes) == tl.compile(
        MATMUL, options=tl.Options(fast_math=False)
    ).inspect("plan", sizes=sizes)
    (spec,) = hot._cache.values()
    assert spec.code.optimised_ir == hot.inspect("llvm", sizes=sizes)


def test_warnings_are_given_again_from_the_record(cache_dir):
    for _ in range(2):
        with pytest.warns(TensorLangWarning, match="reduced over separate indices"):
            tl.compile(LINTED)
    assert tl.compile  # and ignoring them works on a hit too
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(TensorLangWarning):
            tl.compile(LINTED)


def test_errors_of_a_recorded_kernel_are_located(cache_dir):
    k = tl.compile(GATHER)
    table = np.arange(12, dtype=np.float32).reshape(4, 3)
    np.testing.assert_array_equal(k(table, np.array([3, 0], np.int32)), table[[3, 0]])
    hot = tl.compile(GATHER)
    with pytest.raises(tl.ArgumentError) as cold_error:
        k(table, np.array([1, 4], np.int32))
    with pytest.raises(tl.ArgumentError) as hot_error:
        hot(table, np.array([1, 4], np.int32))  # same sizes: from the records, then the stages
    assert str(hot_error.value) == str(cold_error.value)
    assert "index 4 out of range for dimension 0 of T" in str(hot_error.value)
    with pytest.raises(tl.ArgumentError, match="expected type int32"):
        hot(table, np.array([1, 2], np.int64))  # checked from the Interface alone


def test_only_sizes_that_passed_the_checks_are_recorded(cache_dir):
    k = tl.compile(PRECONDITION)
    good = np.ones((3, 6, 4), np.float32)
    np.testing.assert_array_equal(k(good), np.full(3, 4, np.float32))
    with pytest.raises(tl.ArgumentError, match="out of bounds"):
        k(np.zeros((3, 5, 4), np.float32))
    records = len(_records(cache_dir))
    assert records == 2  # the program and the one good call
    hot = tl.compile(PRECONDITION)
    np.testing.assert_array_equal(hot(good), np.full(3, 4, np.float32))
    with pytest.raises(tl.ArgumentError, match="out of bounds"):
        hot(np.zeros((3, 5, 4), np.float32))


@pytest.mark.parametrize("damage", ["garbage", "truncate", "edit-payload", "wrong-shapes", "unknown-field"])
def test_a_damaged_record_is_a_miss(cache_dir, damage):
    a, b = _matmul_inputs(5, 7, 3)
    want = tl.compile(MATMUL)(a, b)
    for path in _records(cache_dir):
        record = json.loads(path.read_text())
        payload = record["payload"]
        if damage == "garbage":
            path.write_bytes(b"\x00{garbage")
            continue
        if damage == "truncate":
            path.write_bytes(path.read_bytes()[:40])
            continue
        if "shapes" in payload:  # the call record
            if damage == "edit-payload":
                payload["params"] = [p + 1 for p in payload["params"]]  # checksum now wrong
            elif damage == "wrong-shapes":
                payload["shapes"] = {"C": [5, 4]}
            else:
                payload["phases"][0]["surprise"] = 1
            if damage != "edit-payload":  # a consistent checksum: the record's content is checked too
                record["sha256"] = disk_cache._payload_digest(payload)
            path.write_text(json.dumps(record))
    k = tl.compile(MATMUL)
    np.testing.assert_array_equal(k(a, b), want)
    again = tl.compile(MATMUL)  # rewritten: a hit now
    np.testing.assert_array_equal(again(a, b), want)
    assert again._stages is None and again.disk_hits == 1


def test_a_missing_object_behind_a_call_record_recompiles(cache_dir):
    a, b = _matmul_inputs(9, 4, 11)
    want = tl.compile(MATMUL)(a, b)
    for path in cache_dir.rglob("*.o"):
        if json.loads(path.with_suffix(".json").read_text())["kind"] == "kernel":
            path.unlink()
    k = tl.compile(MATMUL)
    np.testing.assert_array_equal(k(a, b), want)
    assert k.disk_hits == 0 and k._stages is not None


def test_generic_code_is_shared_by_call_records(cache_dir):
    options = tl.Options(specialize=False)
    x = np.random.default_rng(3).standard_normal((6, 5)).astype(np.float32)
    y = np.random.default_rng(4).standard_normal((4, 9)).astype(np.float32)
    cold = tl.compile(SOFTMAX, options=options)
    want = cold(x), cold(y)
    hot = tl.compile(SOFTMAX, options=options)
    np.testing.assert_array_equal(hot(x), want[0])
    np.testing.assert_array_equal(hot(y), want[1])
    assert hot._stages is None and len(hot._warm_objects) == 1  # one generic object for both


def test_the_program_key_covers_what_compiling_reads(cache_dir):
    base = warm.program_key(MATMUL, None, "<source>", repr(tl.Options()), 2)
    assert base == warm.program_key(MATMUL, None, "<source>", repr(tl.Options()), 2)
    others = [
        warm.program_key(MATMUL + " ", None, "<source>", repr(tl.Options()), 2),
        warm.program_key(MATMUL, "mm", "<source>", repr(tl.Options()), 2),
        warm.program_key(MATMUL, None, "mm.tc", repr(tl.Options()), 2),
        warm.program_key(MATMUL, None, "<source>", repr(tl.Options(tile=8)), 2),
        warm.program_key(MATMUL, None, "<source>", repr(tl.Options()), 1),  # fusion plans for threads
    ]
    assert len({base, *others}) == 6


def test_a_recorded_kernel_pickles(cache_dir):
    a, b = _matmul_inputs(3, 5, 2)
    tl.compile(MATMUL)(a, b)
    hot = pickle.loads(pickle.dumps(tl.compile(MATMUL)))
    np.testing.assert_allclose(hot(a, b), a @ b, rtol=1e-5, atol=1e-5)
    assert hot.disk_hits == 1


def test_cache_off_writes_no_records(cache_dir, monkeypatch):
    monkeypatch.setenv("TENSORLANG_CACHE", "0")
    k = tl.compile(MATMUL)
    assert k.program_key is None
    k(*_matmul_inputs(2, 3, 4))
    assert not cache_dir.exists()
