"""The persistent compilation cache (codegen/lowering/disk_cache.py): hits across processes,
corrupt and foreign entries, racing writers, the off switch, the size bound, unusable directories."""

from __future__ import annotations

import ctypes
import json
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import numpy as np
import pytest

import tensorlang as tl
from codegen.host import gemm_blocking, gemm_workspace_layout
from codegen.lowering import build, disk_cache
from codegen.lowering.gemm_jit import cached_gemm
from tensorlang.errors import TensorLangWarning

REPO = Path(__file__).resolve().parents[2]
MATMUL = "def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }"
ROWS = "def rows(float(N, D) X) -> (Y) { Y(n, d) = X(n, d) * 2 + 1 }"

# a fresh process: compile and call the GEMM kernel, print counts and the result's bytes
CHILD = textwrap.dedent(
    """
    import hashlib, json, sys
    import numpy as np
    import tensorlang as tl
    k = tl.compile(SOURCE)
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((64, 48)).astype(np.float32), rng.standard_normal((48, 40)).astype(np.float32))
    c = k(a, b)
    ok = bool(np.allclose(c, a @ b, rtol=1e-4, atol=1e-4))
    print(json.dumps({"compile_count": k.compile_count, "disk_hits": k.disk_hits, "ok": ok,
                      "digest": hashlib.sha256(c.tobytes()).hexdigest()}))
    """
).replace("SOURCE", repr(MATMUL))


def _child(env_dir: Path, **extra: str) -> subprocess.Popen:
    import os

    env = {**os.environ, "TENSORLANG_CACHE_DIR": str(env_dir), "PYTHONPATH": str(REPO), **extra}
    return subprocess.Popen(
        [sys.executable, "-c", CHILD],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _result(proc: subprocess.Popen) -> dict:
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1])


def _entries(root: Path) -> dict[str, dict]:
    """kind → metadata of every entry."""
    metas = [json.loads(p.read_text()) for p in root.rglob("*.json")]
    return {m["kind"]: m for m in metas} | {"all": metas}


def _rows(k, n=5, d=7):
    x = np.arange(n * d, dtype=np.float32).reshape(n, d)
    y = k(x)
    np.testing.assert_array_equal(y, x * 2 + 1)
    return y


def test_a_fresh_process_hits_and_gets_the_same_result(cache_dir):
    cold = _result(_child(cache_dir))
    assert cold == {**cold, "compile_count": 1, "disk_hits": 0, "ok": True}
    kinds = _entries(cache_dir)
    assert {"kernel", "gemm"} <= set(kinds)  # the GEMM body is cached too
    assert kinds["gemm"]["dtype"] == "float32"
    warm = _result(_child(cache_dir))
    # compile_count counts specialisations obtained, from disk or generated; disk_hits those loaded
    assert warm == {**cold, "disk_hits": 1}
    assert len(kinds["all"]) == len(_entries(cache_dir)["all"])  # nothing new written


def test_hit_in_process_keeps_inspection(cache_dir):
    first = tl.compile(ROWS)
    _rows(first)
    assert first.disk_hits == 0
    second = tl.compile(ROWS)
    _rows(second)
    assert (second.compile_count, second.disk_hits) == (1, 1)
    (spec,) = second._cache.values()
    assert spec.code.optimised_ir == second.inspect("llvm", sizes={"N": 5, "D": 7})
    assert spec.code.optimised_ir == next(iter(first._cache.values())).code.optimised_ir


def _only_kernel_entry(root: Path) -> tuple[Path, Path]:
    (meta,) = [p for p in root.rglob("*.json") if json.loads(p.read_text())["kind"] == "kernel"]
    return meta.with_suffix(".o"), meta


@pytest.mark.parametrize("damage", ["flip", "truncate", "garbage-json", "empty-object", "missing-object"])
def test_a_corrupt_entry_is_detected_and_rewritten(cache_dir, damage):
    _rows(tl.compile(ROWS))
    obj, meta = _only_kernel_entry(cache_dir)
    good = obj.read_bytes()
    if damage == "flip":
        data = bytearray(good)
        data[len(data) // 2] ^= 0xFF
        obj.write_bytes(bytes(data))
    elif damage == "truncate":
        obj.write_bytes(good[: len(good) // 2])
    elif damage == "garbage-json":
        meta.write_text("{not json" + "\x00\xff")
    elif damage == "empty-object":
        obj.write_bytes(b"")
    else:
        obj.unlink()
    k = tl.compile(ROWS)
    _rows(k)
    assert (k.compile_count, k.disk_hits) == (1, 0)  # not trusted: compiled again
    assert obj.read_bytes() == good  # and rewritten
    again = tl.compile(ROWS)
    _rows(again)
    assert again.disk_hits == 1


def test_a_foreign_entry_under_another_key_is_ignored(cache_dir):
    _rows(tl.compile(ROWS))
    obj, meta = _only_kernel_entry(cache_dir)
    # the entry of another kernel (other sizes), copied under this key's file names
    other = tl.compile(ROWS)
    _rows(other, n=3, d=2)
    foreign = [
        p for p in cache_dir.rglob("*.json") if p != meta and json.loads(p.read_text())["kind"] == "kernel"
    ]
    (foreign_meta,) = foreign
    obj.write_bytes(foreign_meta.with_suffix(".o").read_bytes())
    meta.write_text(foreign_meta.read_text())
    k = tl.compile(ROWS)
    _rows(k)
    assert k.disk_hits == 0
    assert json.loads(meta.read_text())["key"] == meta.stem  # rewritten under its own key


def test_the_key_covers_options_and_environment(cache_dir, monkeypatch):
    k = tl.compile(ROWS)
    plan = k._plan({"N": 5, "D": 7})
    fast = tl.compile(ROWS, options=tl.Options(fast_math=True))._plan({"N": 5, "D": 7})
    key = build.plan_cache_key(plan)
    assert key == build.plan_cache_key(k._plan({"N": 5, "D": 7}))  # stable
    assert key != build.plan_cache_key(fast)
    assert key != build.plan_cache_key(k._plan({"N": 5, "D": 8}))
    monkeypatch.setattr(disk_cache, "_tensorlang_version", lambda: "99.0")
    assert key != build.plan_cache_key(plan)
    monkeypatch.undo()
    monkeypatch.setattr(disk_cache, "host_cpu_features", lambda: "+sse2")
    assert key != build.plan_cache_key(plan)


def test_racing_processes_all_get_correct_kernels(cache_dir):
    procs = [_child(cache_dir) for _ in range(4)]
    results = [_result(p) for p in procs]
    assert all(r["ok"] for r in results)
    assert len({r["digest"] for r in results}) == 1
    kinds = sorted(m["kind"] for m in _entries(cache_dir)["all"])
    # one kernel, one GEMM body, the program's record and its call record (runtime/warm.py)
    assert kinds == ["gemm", "kernel", "record", "record"]
    assert not [p for p in cache_dir.rglob("*") if p.name.endswith(".tmp")]
    assert _result(_child(cache_dir))["disk_hits"] == 1


def test_off_writes_nothing(cache_dir, monkeypatch):
    monkeypatch.setenv("TENSORLANG_CACHE", "0")
    _rows(tl.compile(ROWS))
    assert not cache_dir.exists()
    assert disk_cache.info()["enabled"] is False
    assert _result(_child(cache_dir, TENSORLANG_CACHE="0"))["ok"]
    assert not cache_dir.exists()


def test_eviction_keeps_the_size_under_the_bound(cache_dir, monkeypatch):
    k = tl.compile(ROWS)
    _rows(k, n=2, d=2)
    one = disk_cache.info()["bytes"]
    bound = int(one * 2.5)
    monkeypatch.setenv("TENSORLANG_CACHE_MAX_BYTES", str(bound))
    for n in range(3, 9):
        _rows(k, n=n, d=2)
        assert disk_cache.info()["bytes"] <= bound
    info = disk_cache.info()
    # 15 entries were written (the program record, then an object and a call record per size)
    assert info["max_bytes"] == bound and 1 <= info["entries"] < 15
    last = tl.compile(ROWS)  # the most recently used entry survived
    _rows(last, n=8, d=2)
    assert last.disk_hits == 1


@pytest.mark.parametrize("kind", ["a-file", "unreadable-entry"])
def test_an_unusable_directory_falls_back_to_compiling(tmp_path, monkeypatch, kind):
    if kind == "a-file":  # the cache "directory" is a regular file: nothing can be created in it
        root = tmp_path / "file"
        root.write_text("not a directory")
    else:  # an entry that is a directory where a file should be
        root = tmp_path / "cache"
        monkeypatch.setenv("TENSORLANG_CACHE_DIR", str(root))
        _rows(tl.compile(ROWS))
        obj, meta = _only_kernel_entry(root)
        meta.unlink()
        meta.mkdir()
    monkeypatch.setenv("TENSORLANG_CACHE_DIR", str(root))
    monkeypatch.setattr(disk_cache, "_warned", type(disk_cache._warned)())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        k = tl.compile(ROWS)
        _rows(k)
        _rows(k, n=4)
    assert (k.compile_count, k.disk_hits) == (2, 0)
    cache_warnings = [w for w in caught if issubclass(w.category, TensorLangWarning)]
    assert len(cache_warnings) <= 1
    if kind == "a-file":
        assert len(cache_warnings) == 1 and "compilation cache" in str(cache_warnings[0].message)
    info = disk_cache.info()
    assert info["path"] == str(root)


def test_the_gemm_object_is_cached_and_loads(cache_dir):
    cold = cached_gemm("float64")
    assert not cold.from_cache and cold.object_code
    warm = cached_gemm("float64")
    assert warm.from_cache and warm.object_code == cold.object_code
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((37, 29)), rng.standard_normal((29, 41))
    c = np.zeros((37, 41))
    raw = np.zeros(gemm_workspace_layout(gemm_blocking("float64"), 8)[2] + 64, np.uint8)
    ws = raw[(-raw.ctypes.data) % 64 :]
    ptr = ctypes.POINTER(ctypes.c_double)
    warm.fn(
        37,
        41,
        29,
        a.ctypes.data_as(ptr),
        29,
        1,
        b.ctypes.data_as(ptr),
        41,
        1,
        c.ctypes.data_as(ptr),
        41,
        1,
        ws.ctypes.data,
    )
    np.testing.assert_allclose(c, a @ b, rtol=1e-12)


def test_cache_info_and_clear(cache_dir):
    assert tl.cache_info() == {
        "path": str(cache_dir),
        "enabled": True,
        "entries": 0,
        "bytes": 0,
        "max_bytes": disk_cache.DEFAULT_MAX_BYTES,
    }
    _rows(tl.compile(ROWS))
    assert cache_dir.stat().st_mode & 0o777 == 0o700  # private: it holds code we run
    info = disk_cache.info()
    assert info["entries"] == 3 and info["bytes"] > 0  # the object code, program and call records
    assert tl.clear_cache() == info["bytes"]
    assert tl.cache_info()["entries"] == 0
    k = tl.compile(ROWS)
    _rows(k)
    assert k.disk_hits == 0


def test_command_line_cache_info_and_clear(cache_dir, capsys):
    from tensorlang.cli import main

    _rows(tl.compile(ROWS))
    assert main(["cache", "info"]) == 0
    out = capsys.readouterr().out
    assert f"path: {cache_dir}" in out and "entries: 3" in out and "enabled: True" in out
    assert main(["cache", "clear"]) == 0
    assert "removed 3 entries" in capsys.readouterr().out
    assert tl.cache_info()["entries"] == 0
    with pytest.raises(SystemExit):
        main(["cache", "shrink"])
