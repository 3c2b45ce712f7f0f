"""Every schedule the compiler emits respects every dependence (corpus programs, all fusion modes)."""

from __future__ import annotations

import warnings

import islpy as isl
import pytest
from conftest import load_corpus

from polyhedral import build_scop
from scheduler import Schedule, ScheduleOptions, compute_schedule, textual_schedule
from tensorlang.errors import InternalError
from tensorlang.frontend import check_source

CORPUS = load_corpus() or {"cases": []}
PROGRAMS = {c["name"]: (c["tc"], c.get("entry")) for c in CORPUS["cases"]}
PROGRAMS.setdefault(
    "matmul", ("def matmul(float(M, K) A, float(K, N) B) -> (C) { C(m, n) +=! A(m, k) * B(k, n) }", None)
)  # also without the corpus
PROGRAMS["softmax_temporaries"] = (
    """def softmax(float(N, D) I) -> (O) {
        mx(n) max=! I(n, d)
        e(n, d) = exp(I(n, d) - mx(n))
        s(n) +=! e(n, d)
        O(n, d) = e(n, d) / s(n)
    }""",
    None,
)


def _scop(name):
    src, entry = PROGRAMS[name]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return build_scop(check_source(src, entry))


@pytest.mark.parametrize("fusion", ["auto", "max", "none"])
@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_schedule_respects_dependences(name, fusion):
    scop = _scop(name)
    scop.verify()
    schedule = compute_schedule(scop, ScheduleOptions(fusion=fusion))
    assert schedule.violated_dependences().is_empty()


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_textual_fallback_is_legal(name):
    scop = _scop(name)
    schedule = Schedule(scop, textual_schedule(scop), ScheduleOptions(), "textual")
    schedule.verify()


def test_violation_is_detected():
    """The check itself can fail: a reversed matmul reduction order over k breaks RAW on C."""
    scop = _scop("matmul")
    reversed_k = isl.UnionMap(
        "[M, K, N] -> { I0[i, j] -> [0, i, j, 0]; S0[i, j, k] -> [1, i, j, -k] }", context=scop.ctx
    )
    tree = isl.Schedule.from_domain(scop.domain()).insert_partial_schedule(
        isl.MultiUnionPwAff.from_union_map(reversed_k.intersect_domain(scop.domain()))
    )
    bad = Schedule(scop, tree, ScheduleOptions(), "test")
    assert not bad.violated_dependences().is_empty()
    # exactly the dependences whose sink the schedule's lexicographic order puts first or level
    sched = bad.schedule_map()
    assert bad.violated_dependences().is_equal(scop.dependences.all.subtract(sched.lex_lt_union_map(sched)))
    with pytest.raises(InternalError, match="violates dependences"):
        bad.verify()
