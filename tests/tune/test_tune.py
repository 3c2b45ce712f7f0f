"""tl.tune (codegen/tune/): measured search, the tuning database, tl.compile's use of its records, the CLI.

Tiny kernels and budgets of 1-3 s; each test has its own cache directory (the database lives
there). Candidates fail on purpose through TENSORLANG_TUNE_FAULTS (trial number: crash, hang,
wrong; the default is trial 0)."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

import tensorlang as tl
from codegen.tune import database, key, space
from codegen.tune.search import canonical

REPO = Path(__file__).resolve().parents[2]
SCALE = "def scale(float(N,M) A) -> (B) { B(i,j) = A(i,j) * 3.0 }"
TRANSPOSE = "def tr(float(N,M) A) -> (B) { B(j,i) = A(i,j) * 2.0 }"


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TENSORLANG_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("TENSORLANG_TUNE_FAULTS", raising=False)


def _a(n=48, m=40, seed=0):
    return np.random.default_rng(seed).standard_normal((n, m), dtype=np.float32)


def _record_key(source, a, options=None):
    k = tl.compile(source, options=tl.Options(tuned=False))
    sizes = dict(zip(("N", "M"), a.shape))
    description = key.describe(source, k.name, sizes, [str(a.dtype)], options or tl.Options())
    return key.key_of(description)


def _statuses(k):
    with database.Database() as db:
        return [t.status for t in db.trials(k)]


# ---------------------------------------------------------------------- the space and keys


def test_space_from_band_depth_and_sizes():
    k = tl.compile(TRANSPOSE)
    s = space.space_for(k.inspect("schedule"), {"N": 96, "M": 40})
    assert s.depth == 2
    assert {4, 8, 16, 32, 64}.issubset(s.tiles) and 48 in s.tiles and 20 in s.tiles and max(s.tiles) <= 96
    d = s.default()
    assert d == key.knobs_json(tl.Options())
    assert all(n != d for n in s.neighbours(d))
    import random

    rng = random.Random(0)
    for _ in range(50):  # every mutation is a valid Options
        key.from_knobs(s.mutate(d, rng), tl.Options())


def test_records_apply_only_to_default_knobs():
    assert key.applies(tl.Options()) and key.applies(tl.Options(threads=1))
    assert not key.applies(tl.Options(tuned=False))
    assert not key.applies(tl.Options(tile=16))
    assert not key.applies(tl.Options(specialize=False))
    with pytest.raises(ValueError):
        key.from_knobs({"tile": [8], "bogus": 1}, tl.Options())
    with pytest.raises(ValueError):
        key.from_knobs({"unroll": -3}, tl.Options())
    assert repr(tl.Options()).endswith("max_specializations=64)")  # repr (a cache key) unchanged
    assert repr(tl.Options(tuned=False)).endswith("tuned=False)")


# ---------------------------------------------------------------------- the search


def test_default_first_and_never_worse():
    a = _a()
    r = tl.tune(SCALE, a, budget_s=1.5, progress=False)
    assert isinstance(r, tl.TuneResult)
    assert r.trials >= 1 and r.best_s <= r.default_s
    with database.Database() as db:
        trials = db.trials(r.key)
        assert canonical(trials[0].knobs) == canonical(key.knobs_json(tl.Options()))
        assert trials[0].status == "ok"
        best = db.best(r.key)
    assert best is not None and key.from_knobs(best.knobs, tl.Options()) == r.options
    assert r.key == _record_key(SCALE, a)


@pytest.mark.slow
def test_wrong_crashing_and_hanging_candidates_fail(monkeypatch):
    monkeypatch.setenv("TENSORLANG_TUNE_FAULTS", "1:wrong,2:crash,3:hang")
    r = tl.tune(SCALE, _a(), budget_s=8, progress=False)  # room for trial 3 on a loaded machine
    statuses = _statuses(r.key)
    assert statuses[0] == "ok"
    assert statuses[1:4] == ["wrong", "crash", "timeout"], statuses
    assert r.best_s <= r.default_s


@pytest.mark.slow  # ~7 s
def test_wrong_candidate_fails(monkeypatch):
    monkeypatch.setenv("TENSORLANG_TUNE_FAULTS", "1:wrong,2:crash")
    r = tl.tune(SCALE, _a(), budget_s=4, progress=False)
    statuses = _statuses(r.key)
    # the third trial may not fit the budget on a loaded machine (each runs in a fresh process)
    assert statuses[:2] == ["ok", "wrong"] and statuses[2:3] in ([], ["crash"]), statuses
    with database.Database() as db:
        best = db.best(r.key)
        wrong = [t for t in db.trials(r.key) if t.status != "ok"]
    assert all(canonical(w.knobs) != canonical(best.knobs) for w in wrong)


@pytest.mark.slow  # ~8 s
def test_resume_and_start_from_best():
    a = _a()
    r1 = tl.tune(SCALE, a, budget_s=1.5, progress=False)
    with database.Database() as db:
        before = db.trials(r1.key)
    r2 = tl.tune(SCALE, a, budget_s=1.5, progress=False)
    with database.Database() as db:
        after = db.trials(r2.key)
    assert r1.key == r2.key and len(after) > len(before)
    new = after[len(before) :]
    default = canonical(key.knobs_json(tl.Options()))
    old = {canonical(t.knobs) for t in before} - {default}
    # nothing measured before is measured again (but the default, the reference of each run)
    assert canonical(new[0].knobs) == default
    assert not {canonical(t.knobs) for t in new[1:]} & old


# ---------------------------------------------------------------------- tl.compile uses records


def _set_best(source, a, knobs):
    k = _record_key(source, a)
    with database.Database() as db:
        db.add_program(k, "tr", {})
        trial = db.add_trial(k, knobs, 1e-3, "ok")
        db.set_best(k, trial, knobs, 1e-3, 2e-3)
    return k


FRESH = textwrap.dedent(
    """
    import json, sys, numpy as np, tensorlang as tl
    src = sys.argv[1]
    a = np.random.default_rng(0).standard_normal((48, 40), dtype=np.float32)
    k = tl.compile(src)
    b = k(a)
    kd = tl.compile(src, options=tl.Options(tuned=False))
    print(json.dumps(dict(ok=bool(np.array_equal(b, a.T * 2)), hits=k.disk_hits,
        plan=k.inspect("plan", sizes={"N": 48, "M": 40}), default=kd.inspect("plan", sizes={"N": 48, "M": 40}))))
    """
)


def _fresh():
    out = subprocess.run([sys.executable, "-c", FRESH, TRANSPOSE], capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_fresh_process_uses_the_record_and_tuned_false_ignores_it():
    a = _a()
    first = _fresh()  # no database yet: the default; a call record is stored
    assert first["ok"] and "c0 += 32" in first["plan"]
    _set_best(TRANSPOSE, a, {**key.knobs_json(tl.Options()), "tile": [8, 8], "unroll": 2})
    second = _fresh()  # the record applies: not the stale call record of the default
    assert second["ok"] and "c0 += 8" in second["plan"] and "c2 += 2" in second["plan"]
    assert "c0 += 8" not in second["default"]  # Options(tuned=False)
    third = _fresh()  # the call record of the tuned code, from the disk cache
    assert third["ok"] and third["hits"] == 1 and "c0 += 8" in third["plan"]
    _set_best(TRANSPOSE, a, {**key.knobs_json(tl.Options()), "tile": [16, 16]})  # a newer record
    fourth = _fresh()
    assert fourth["ok"] and "c0 += 16" in fourth["plan"] and fourth["hits"] == 0


def test_user_knobs_win_over_records():
    a = _a()
    _set_best(TRANSPOSE, a, {**key.knobs_json(tl.Options()), "tile": [8, 8]})
    assert "c0 += 8" in tl.compile(TRANSPOSE).inspect("plan", sizes={"N": 48, "M": 40})
    assert "c0 += 16" in tl.compile(TRANSPOSE, options=tl.Options(tile=16)).inspect(
        "plan", sizes={"N": 48, "M": 40}
    )
    assert "c0 += 8" not in tl.compile(TRANSPOSE).inspect("plan", sizes={"N": 40, "M": 48})  # other sizes


# ---------------------------------------------------------------------- the database


def test_corrupt_rows_are_ignored(tmp_path):
    a = _a()
    k = _set_best(TRANSPOSE, a, {**key.knobs_json(tl.Options()), "tile": [8, 8]})
    with database.Database() as db:
        conn = db._conn
        conn.execute(
            "INSERT INTO trials (key, options, seconds, status, created) VALUES (?, '{bad', 1.0, 'ok', 0)",
            (k,),
        )
        conn.execute(
            "INSERT INTO trials (key, options, seconds, status, created) VALUES (?, ?, 1.0, 'ok', 0)",
            (k, json.dumps({"tile": None, "warp": 3})),
        )
        assert len(db.trials(k)) == 1
        conn.execute('UPDATE best SET options = \'{"fusion": "sideways"}\' WHERE key = ?', (k,))
        assert db.best(k) is None
    plan = tl.compile(TRANSPOSE).inspect("plan", sizes={"N": 48, "M": 40})
    assert "c0 += 32" in plan  # the corrupt record is not used


def test_corrupt_file_is_moved_aside_and_rebuilt():
    path = database.default_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"this is not an SQLite database" * 100)
    a = _a()
    assert database.lookup_best("0" * 64) is None  # reading a corrupt file never fails a compile
    np.testing.assert_array_equal(tl.compile(TRANSPOSE)(a), a.T * 2)
    with database.Database() as db:
        assert db.programs() == []
        db.add_trial("k", key.knobs_json(tl.Options()), 1.0, "ok")
    assert list(path.parent.glob("tune.sqlite3.corrupt-*"))


def test_export_import_round_trip(tmp_path, monkeypatch):
    a = _a()
    k = _set_best(TRANSPOSE, a, {**key.knobs_json(tl.Options()), "tile": [8, 8]})
    with database.Database() as db:
        data = db.export()
    json.dumps(data)
    monkeypatch.setenv("TENSORLANG_CACHE_DIR", str(tmp_path / "other"))
    with database.Database() as db:
        assert db.import_(data) == 1
        best = db.best(k)
        assert best is not None and best.knobs["tile"] == [8, 8]
        with pytest.raises(ValueError):
            db.import_({"format": "something else"})


# ---------------------------------------------------------------------- processes


TUNER = "import sys, numpy as np, tensorlang as tl\n" + (
    "a = np.random.default_rng(0).standard_normal((48, 40), dtype=np.float32)\n"
    "r = tl.tune(sys.argv[1], a, budget_s=float(sys.argv[2]), progress=False)\nprint(r.trials)\n"
)


@pytest.mark.slow  # ~4-7 s: the default run stays under 10 minutes on 2 cores
def test_two_concurrent_tuners():
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", TUNER, src, "1.5"],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for src in (SCALE, TRANSPOSE)
    ]
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err.decode()[-500:]
    with database.Database() as db:
        rows = db.programs()
    assert sorted(r["name"] for r in rows) == ["scale", "tr"]
    assert all(r["best_s"] for r in rows)


@pytest.mark.slow
def test_killed_tuner_leaves_a_usable_database():
    p = subprocess.Popen([sys.executable, "-c", TUNER, TRANSPOSE, "60"], cwd=REPO, start_new_session=True)
    path = database.default_path()
    deadline = time.time() + 60
    try:
        while time.time() < deadline:
            time.sleep(0.5)
            if path.exists():
                try:
                    with database.Database() as db:
                        if sum(r["trials"] for r in db.programs()) >= 3:
                            break
                except sqlite3.Error:
                    pass
    finally:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
    with database.Database() as db:
        assert sum(r["trials"] for r in db.programs()) >= 3
    r = tl.tune(TRANSPOSE, _a(), budget_s=1, progress=False)
    assert r.best_s <= r.default_s


@pytest.mark.slow  # ~6 s of worker processes (test_executor_dask is slow too)
def test_executor_process_pool():
    import concurrent.futures as cf
    import multiprocessing as mp

    with cf.ProcessPoolExecutor(2, mp_context=mp.get_context("spawn")) as ex:
        r = tl.tune(SCALE, _a(), budget_s=3, executor=ex, progress=False)
    assert r.trials >= 2 and r.best_s <= r.default_s


@pytest.mark.slow  # a local cluster of two worker processes starts in a few seconds
def test_executor_dask():
    """The README's example: a local Dask cluster's executor; candidates run as Dask tasks on
    the workers (each compiles, checks and times its candidate in a child process there)."""
    distributed = pytest.importorskip("distributed")
    with distributed.Client(
        processes=True, n_workers=2, threads_per_worker=1, dashboard_address=None
    ) as client:
        with distributed.get_task_stream(client) as stream:
            r = tl.tune(SCALE, _a(), budget_s=3, executor=client.get_executor(), progress=False)
        ran = [t for t in stream.data if "evaluate" in t["key"]]
        workers = set(client.scheduler_info()["workers"])
    assert r.trials >= 2 and r.best_s <= r.default_s
    assert ran and {t["worker"] for t in ran} <= workers
    with database.Database() as db:
        assert len(db.trials(r.key)) == r.trials


# ---------------------------------------------------------------------- the CLI


def test_cli_tune_list_export_import(tmp_path, capsys, monkeypatch):
    from tensorlang.cli import main

    src = tmp_path / "scale.tc"
    src.write_text(SCALE)
    assert main(["tune", str(src), "--shape", "A=16x24", "--budget", "1"]) == 0
    assert "scale: best" in capsys.readouterr().out
    assert main(["tune", "--list"]) == 0
    listed = capsys.readouterr().out
    assert "scale [M=24,N=16] float32" in listed
    out = tmp_path / "records.json"
    assert main(["tune", "--export", str(out)]) == 0
    monkeypatch.setenv("TENSORLANG_CACHE_DIR", str(tmp_path / "elsewhere"))
    assert main(["tune", "--import", str(out), "--list"]) == 0
    assert "scale [M=24,N=16]" in capsys.readouterr().out
    assert main(["tune"]) == 1
    assert main(["tune", "--import", str(tmp_path / "missing.json")]) == 1
