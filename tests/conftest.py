"""Shared pytest fixtures: the TC corpus from ../shared/tc_corpus/public.json (or, without it, the
subset shipped in tests/corpus_min.json), and kernel sources several test modules use
(`from conftest import SOFTMAX`)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# The packages are used from the checkout (not installed); make `import tensorlang` work for any runner.
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

# every stage's invariant checks (Scop.verify, Schedule.verify) run inside the pipeline under test
os.environ.setdefault("TENSORLANG_VERIFY", "1")

CORPUS_PATH = REPO.parent / "shared" / "tc_corpus" / "public.json"
# a dozen cases, invalid programs, range-inference tests and warnings copied from the corpus
CORPUS_SUBSET_PATH = REPO / "tests" / "corpus_min.json"

# Row softmax in four statements: fused into one row loop, `e` contracted to a row buffer.
SOFTMAX = """def softmax(float(N, D) I) -> (O) {
    mx(n) max=! I(n, d)
    e(n, d) = exp(I(n, d) - mx(n))
    s(n) +=! e(n, d)
    O(n, d) = e(n, d) / s(n)
}"""

# Layer norm in four statements: one row loop, `c` contracted.
LAYERNORM = """def layernorm(float(N, D) X) -> (Y) {
    mean(n) +=! X(n, d) / D
    c(n, d) = X(n, d) - mean(n)
    var(n) +=! c(n, d) * c(n, d) / D
    Y(n, d) = c(n, d) * rsqrt(var(n) + 1e-5)
}"""


def load_corpus(full: bool = False) -> dict | None:
    """The corpus as a dict: the full public corpus when ../shared holds it, else the subset
    shipped with the tests (None instead with `full=True`)."""
    if CORPUS_PATH.exists():
        return json.loads(CORPUS_PATH.read_text())
    return None if full else json.loads(CORPUS_SUBSET_PATH.read_text())


@pytest.fixture(scope="session")
def corpus() -> dict:
    """The full corpus (tests that count its entries); skipped when ../shared is absent."""
    data = load_corpus(full=True)
    if data is None:
        pytest.skip(f"corpus not found at {CORPUS_PATH}")
    return data


def pytest_addoption(parser):
    parser.addoption(
        "--accept",
        action="store_true",
        default=False,
        help="rewrite the golden files under tests/golden with today's output instead of comparing",
    )


@pytest.fixture(scope="session", autouse=True)
def _compilation_cache(tmp_path_factory):
    """The persistent compilation cache lives in a fresh directory for each test session (and
    the processes its tests start): tests never read or fill the user's cache. Under xdist the
    workers of one run share it (their base folders sit side by side in one run folder), so a
    kernel one worker compiled loads from disk in the others, as it would for a user."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        folder = tmp_path_factory.getbasetemp().parent / "tensorlang-cache"
        folder.mkdir(exist_ok=True)
    else:
        folder = tmp_path_factory.mktemp("tensorlang-cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TENSORLANG_CACHE_DIR", str(folder))
        yield


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    """An empty compilation cache of its own for one test (the session's is shared)."""
    root = tmp_path / "cache"
    monkeypatch.setenv("TENSORLANG_CACHE_DIR", str(root))
    monkeypatch.delenv("TENSORLANG_CACHE", raising=False)
    monkeypatch.delenv("TENSORLANG_CACHE_MAX_BYTES", raising=False)
    return root


@pytest.fixture
def run_phases_calls(monkeypatch) -> dict:
    """What the kernels' run_phases is called with next (entry, buffers_for, params, plans,
    workspaces: the last call's), with every phase worth threads (MIN_PARALLEL_WORK 0)."""
    import codegen.runtime.parallel
    from codegen.runtime import kernel as kernel_module

    monkeypatch.setattr(codegen.runtime.parallel, "MIN_PARALLEL_WORK", 0)
    seen: dict = {}
    real = kernel_module.run_phases

    def spy(entry, buffers_for, params, plans, threads, workspaces, clock=None):
        seen.update(entry=entry, buffers_for=buffers_for, params=params, plans=plans, workspaces=workspaces)
        return real(entry, buffers_for, params, plans, threads, workspaces, clock)

    monkeypatch.setattr(kernel_module, "run_phases", spy)
    return seen


# jacobi-2d written as a time recurrence (issue 13's program), and its NumPy reference: shared by
# the team-phase and kept-temporary tests
JACOBI_2D_RECURRENCE = """
def jacobi(float(N, M) A) -> (O) {
  B(t, i, j) = A(i, j) where t in 0:1, i in 0:N, j in 0:M
  B(t, i, j) = (i >= 1 && i < N - 1 && j >= 1 && j < M - 1)
               ? 0.2 * (B(t-1, i, j) + B(t-1, i-1, j) + B(t-1, i+1, j) + B(t-1, i, j-1) + B(t-1, i, j+1))
               : B(t-1, i, j) where t in 1:T, i in 0:N, j in 0:M
  O(i, j) = B(T - 1, i, j) where i in 0:N, j in 0:M
}
"""


def jacobi_2d_reference(a, steps: int):
    """`steps` planes of jacobi-2d from `a` (plane 0), in float64, the last one returned."""
    b = a.astype("float64")
    for _ in range(1, steps):
        c = b.copy()
        c[1:-1, 1:-1] = 0.2 * (b[1:-1, 1:-1] + b[:-2, 1:-1] + b[2:, 1:-1] + b[1:-1, :-2] + b[1:-1, 2:])
        b = c
    return b


def jit_exported(define, ctypes_type):
    """A helper of the generated code called directly: `define(module)` defines it (as
    lowering/barrier.py's define_* do) in a module of its own; a wrapper of the same type that
    calls it is exported and compiled, and returned as `ctypes_type` (its engine kept on it)."""
    import llvmlite.binding as llvm
    import llvmlite.ir as ir

    from codegen.lowering.jit import _lock, new_target_machine, optimise

    module = ir.Module(name="exported")
    inner = define(module)
    fn = ir.Function(module, inner.function_type, name="exported")
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    b.ret(b.call(inner, fn.args))
    with _lock:
        ref = optimise(module)
        engine = llvm.create_mcjit_compiler(ref, new_target_machine())
        engine.finalize_object()
        address = engine.get_function_address("exported")
    call = ctypes_type(address)
    call.keep = (engine, ref)
    return call
