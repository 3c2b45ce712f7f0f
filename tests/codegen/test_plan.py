"""The KernelPlan stage: one plan for the build path, the generic path and inspect; printable,
deterministic and verified."""

from __future__ import annotations

import numpy as np
import pytest

import tensorlang as tl
from codegen.planning.plan import KernelPlan, PlanError, Split, plan_kernel

MLP = """def mlp(float(M,K) X, float(K,N) W, float(N) b) -> (O) {
  O(i,j) +=! X(i,k) * W(k,j)
  O(i,j) = fmax(O(i,j) + b(j), 0.0)
}"""
S1 = {"M": 64, "K": 48, "N": 80}
S2 = {"M": 37, "K": 5, "N": 130}


def _inputs(sizes, seed=0):
    rng = np.random.default_rng(seed)
    M, K, N = sizes["M"], sizes["K"], sizes["N"]
    return [rng.standard_normal(s).astype(np.float32) for s in ((M, K), (K, N), (N,))]


def _reference(X, W, b):
    return np.maximum(X.astype(np.float64) @ W + b, 0.0)


@pytest.mark.parametrize("specialize", [True, False])
def test_inspected_module_is_the_module_that_runs(specialize):
    k = tl.compile(MLP, options=tl.Options(specialize=specialize))
    for sizes in (S1, S2):
        args = _inputs(sizes)
        np.testing.assert_allclose(k(*args), _reference(*args), rtol=1e-4, atol=1e-4)
        key = tuple(sizes[s.name] for s in k.program.sizes)
        ran = k._cache[key].code.optimised_ir
        assert k.inspect("llvm", sizes=sizes) == ran
    if not specialize:  # one generic module for every size, and that is what inspect shows
        assert k.compile_count == 1
        assert k.inspect("llvm", sizes=S1) == k.inspect("llvm", sizes=S2)
        assert k.inspect("plan", sizes=S1) == k.inspect("plan", sizes=S2)


def test_plan_text_differs_by_sizes_and_is_deterministic():
    k = tl.compile(MLP)
    p1, p2 = k.inspect("plan", sizes=S1), k.inspect("plan", sizes=S2)
    assert p1 != p2 and "M=64" in p1 and "GEMM" in p1
    again = tl.compile(MLP)
    assert again.inspect("plan", sizes=S1) == p1  # a fresh compile of the same program
    a = plan_kernel(k.schedule, k.options.codegen, S1)
    b = plan_kernel(again.schedule, again.options.codegen, S1)
    assert a.key == b.key and a.key != plan_kernel(k.schedule, k.options.codegen, S2).key


def test_plan_lists_the_phase_decisions():
    softmax = """def softmax(float(N, D) I) -> (O) {
        mx(n) max=! I(n, d)
        e(n, d) = exp(I(n, d) - mx(n))
        s(n) +=! e(n, d)
        O(n, d) = e(n, d) / s(n)
    }"""
    k = tl.compile(softmax)
    plan = plan_kernel(k.schedule, k.options.codegen, {"N": 33, "D": 129})
    assert isinstance(plan, KernelPlan)
    (phase,) = plan.phases
    assert phase.split is Split.OUTER_LOOP and phase.pipeline is not None
    assert set(plan.contracted) == {"mx", "e", "s"}
    text = str(plan)
    assert "phase 0" in text and "pipelined" in text and "contracted" in text
    generic = plan_kernel(k.schedule, k.options.codegen, None)
    assert not generic.specialised and not generic.contracted and generic.phases[0].pipeline is None
    assert "symbolic" in str(generic)
    gemm = tl.compile("def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }")
    plan = plan_kernel(gemm.schedule, gemm.options.codegen, {"M": 67, "K": 45, "N": 83})
    # the zeroing of C is folded into the GEMM (its first K block stores), which threads share
    assert [(d.split, d.folded, d.overwrite) for d in plan.phases] == [
        (Split.SERIAL, True, False),
        (Split.GEMM_TEAM, False, True),
    ]


def test_verify_rejects_a_broken_plan():
    k = tl.compile(MLP)
    plan = plan_kernel(k.schedule, k.options.codegen, S1)
    broken = KernelPlan(**{**plan.__dict__, "phases": plan.phases[:-1]})
    with pytest.raises(PlanError, match="decisions for"):
        broken.verify()
    generic = plan_kernel(k.schedule, k.options.codegen, None)
    with pytest.raises(PlanError, match="generic plan"):
        KernelPlan(**{**generic.__dict__, "layouts": {"W": (1, 0)}}).verify()
    with pytest.raises(PlanError, match="not a temporary"):
        KernelPlan(**{**plan.__dict__, "sharing": {"X": 0}}).verify()


def test_inspect_plan_rejects_sizes_the_call_would_reject():
    k = tl.compile("def shift(float(N) A) -> (B) { B(i) = A(i + 2) where i in 0:N-2 }")
    with pytest.raises(tl.ArgumentError):
        k.inspect("plan", sizes={"N": 1})


def test_run_time_checks_survive_a_rewrite_that_copies_the_reads():
    """Checks are found by what they check, not by object identity: lowering a plan whose
    statements were deep-copied still checks the gather (it once silently dropped the check)."""
    import copy
    import dataclasses

    from codegen.lowering.abi import ERROR_INDEX
    from codegen.lowering.jit import jit
    from codegen.lowering.lower import lower_to_llvm

    src = "def gather(float(V, D) T, int32(N) I) -> (O) { O(n, d) = T(I(n), d) }"
    k = tl.compile(src, options=tl.Options(threads=1))
    sizes = {"V": 5, "D": 3, "N": 4}
    plan = plan_kernel(k.schedule, k.options.codegen, sizes)
    copied = tuple(dataclasses.replace(s, statement=copy.deepcopy(s.statement)) for s in plan.scop.statements)
    assert all(a.statement is not b.statement for a, b in zip(copied, plan.scop.statements))
    rewritten = dataclasses.replace(plan, scop=dataclasses.replace(plan.scop, statements=copied))
    module, layout = lower_to_llvm(rewritten)
    code = jit(module)
    table = np.arange(15, dtype=np.float32).reshape(5, 3)
    ids = np.array([0, 4, 7, 1], dtype=np.int32)  # 7 is outside T's 5 rows
    out = np.zeros((4, 3), np.float32)
    arrays = {"T": table, "I": ids, "O": out}
    import ctypes

    pointers = (ctypes.c_void_p * len(layout.tensors))(*[arrays[t].ctypes.data for t in layout.tensors])
    error = np.zeros(4, np.int64)
    params = np.zeros(max(1, len(layout.params)), np.int64)
    cancel = np.zeros(1, np.int32)  # the call's cancel word (never set here)
    codes = [
        code.entry(
            ctypes.addressof(pointers),
            params.ctypes.data,
            error.ctypes.data,
            n,
            -(2**63),
            2**63 - 1,
            0,
            cancel.ctypes.data,
        )
        for n in range(len(rewritten.phases))
    ]
    assert ERROR_INDEX in codes and error[3] == 7


def test_each_loop_nest_of_a_nested_sequence_is_a_phase_of_its_own():
    """A tensor stacked from three (as fdtd-2d copies its three fields into one temporary) comes
    out of isl as a sequence of the first two copies inside the region's sequence; each nest must
    get its own split (the two in the inner sequence ran as one serial phase on two threads)."""
    stack = """def stack(float(N, M) a, float(N, M) b, float(N, M) c) -> (O) {
      O(f, i, j) = f == 0 ? a(i, j) : f == 1 ? b(i, j) : c(i, j) where f in 0:3, i in 0:N, j in 0:M
    }"""
    k = tl.compile(stack, options=tl.Options(threads=2))
    plan = plan_kernel(k.schedule, k.options.codegen, {"N": 67, "M": 131})
    assert [p.statements for p in plan.ast.phases] == [("S0_1",), ("S0_2",), ("S0_3",)]
    assert all(d.split is Split.OUTER_LOOP for d in plan.phases)
    rng = np.random.default_rng(3)
    args = [rng.standard_normal((67, 131)).astype(np.float32) for _ in range(3)]
    np.testing.assert_array_equal(k(*args), np.stack(args))
