"""Scop.verify and Schedule.verify raise InternalError (never a bare assert) when an invariant breaks."""

from __future__ import annotations

import dataclasses

import islpy as isl
import pytest

import tensorlang as tl
from tensorlang.errors import verification_enabled

SRC = "def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }"


def test_the_tests_run_with_verification_on():
    assert verification_enabled()


def test_scop_verify_names_the_broken_invariant():
    k = tl.compile(SRC)
    scop = k.scop
    scop.verify()
    twice = dataclasses.replace(scop, statements=scop.statements + scop.statements[:1])
    with pytest.raises(tl.InternalError, match="duplicate polyhedral statements"):
        twice.verify()
    first = scop.statements[0]
    renamed = dataclasses.replace(first, domain=first.domain.set_tuple_name("X9"))
    with pytest.raises(tl.InternalError, match="domain is named X9"):
        dataclasses.replace(scop, statements=(renamed, *scop.statements[1:])).verify()


def test_schedule_verify_rejects_a_schedule_against_the_dependences():
    k = tl.compile(SRC)
    schedule = k.schedule
    schedule.verify()
    # run the body before its initialisation: the flow dependence I0 -> S0 is violated
    order = isl.UnionMap.read_from_str(
        k.scop.ctx, "[M, K, N] -> { I0[m, n] -> [1, m, n, 0]; S0[m, n, k] -> [0, m, n, k] }"
    )
    backwards = isl.Schedule.from_domain(k.scop.domain()).insert_partial_schedule(
        isl.MultiUnionPwAff.from_union_map(order)
    )
    with pytest.raises(tl.InternalError, match="violates dependences"):
        dataclasses.replace(schedule, tree=backwards).verify()
