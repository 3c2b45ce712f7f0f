"""target="cuda": every corpus kernel gives PTX that ptxas accepts (sm_80, sm_90), math builtins included.

ptxas comes with the nvidia-cuda-nvcc wheel (the [cuda-tools] extra); without it the ptxas tests
are skipped and only the PTX's structure is checked.
"""

from __future__ import annotations

import pickle
import re
import subprocess
import warnings

import pytest
from conftest import load_corpus

import tensorlang as tl
from codegen.gpu.ptx import libdevice_path, ptxas_path
from tensorlang.builtins import BUILTINS

CORPUS = load_corpus() or {"cases": []}
CASES = {c["name"]: c for c in CORPUS["cases"]}
MATMUL = "def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }"
MM_SIZES = {"M": 64, "K": 32, "N": 48}
needs_ptxas = pytest.mark.skipif(ptxas_path() is None, reason="ptxas not installed (tensorlang[cuda-tools])")


def corpus_sizes(kernel, case: dict) -> dict[str, int]:
    """The case's sizes: its `sizes`, else bound from its input shapes."""
    sizes = dict(case.get("sizes", {}))
    for t, shape in zip(kernel.interface.inputs, case["inputs"].values()):
        for (kind, value), n in zip(t.dims, shape):
            if kind == "size":
                sizes.setdefault(value, n)
    return {s: sizes[s] for s in kernel.interface.sizes}


def assemble(ptx: str, arch: str, tmp_path) -> None:
    f = tmp_path / "kernel.ptx"
    f.write_text(ptx)
    done = subprocess.run(
        [ptxas_path(), f"-arch={arch}", str(f), "-o", str(tmp_path / "kernel.cubin")],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr[:2000]


@needs_ptxas
@pytest.mark.parametrize("name", sorted(CASES))
def test_corpus_ptx_assembles(name: str, tmp_path) -> None:
    case = CASES[name]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tl.TensorLangWarning)
        kernel = tl.compile(case["tc"], case.get("entry"), target="cuda")
    sizes = corpus_sizes(kernel, case)
    for arch in ("sm_80", "sm_90"):
        ptx = kernel.inspect("ptx", sizes=sizes, arch=arch)
        assert re.search(rf"^\.target\s+{arch}\b", ptx, re.M)
        assemble(ptx, arch, tmp_path)


def test_ptx_structure() -> None:
    k = tl.compile(MATMUL, target="cuda")
    ptx = k.inspect("ptx", sizes=MM_SIZES)
    assert re.search(r"^\.target\s+sm_90\b", ptx, re.M)  # the default
    assert ".entry tl_mm_phase0(" in ptx and ".entry tl_mm_phase1(" in ptx  # init, then the body
    assert "ld.global" in ptx and "st.global" in ptx and "%tid.x" in ptx and "%ctaid.x" in ptx
    assert re.search(r"^\.target\s+sm_80\b", k.inspect("ptx", sizes=MM_SIZES, arch="sm_80"), re.M)
    assert k.inspect("asm", sizes=MM_SIZES) == ptx


def test_other_stages() -> None:
    k = tl.compile(MATMUL, target="cuda")
    for stage in ("ast", "ir", "scop", "deps", "graph", "schedule"):
        assert k.inspect(stage).strip()
    assert "C[c0][c1] = 0" in k.inspect("loops", sizes=MM_SIZES)
    llvm = k.inspect("llvm", sizes=MM_SIZES)
    assert 'target triple = "nvptx64-nvidia-cuda"' in llvm and "tl_mm_phase1" in llvm
    # nothing of the x86 path: no GEMM micro-kernel, no cancel word (an i32 polled atomically), no
    # workspace; the only atomics are the i64 error record's claim (gpu/lower.py, _run_thread)
    assert "gemm" not in llvm.lower() and "atomic i32" not in llvm and "workspace" not in llvm


def test_no_x86_math_in_gpu_code() -> None:
    k = tl.compile("def f(float(N) a) -> (o) { o(i) = tanh(a(i)) + exp(a(i)) + log(a(i)) }", target="cuda")
    llvm = k.inspect("llvm", sizes={"N": 100})
    assert "llvm.ldexp" not in llvm and "llvm.x86" not in llvm and "__nv_" not in llvm  # own IR, no libdevice


@pytest.mark.parametrize("bad", [{}, {"M": 4}])
def test_ptx_needs_sizes(bad) -> None:
    k = tl.compile(MATMUL, target="cuda")
    with pytest.raises(tl.TensorLangError, match="sizes"):
        k.inspect("ptx", sizes=bad or None)


def test_bad_arch_and_stage_and_target() -> None:
    k = tl.compile(MATMUL, target="cuda")
    with pytest.raises(tl.TensorLangError, match="sm_80"):
        k.inspect("ptx", sizes=MM_SIZES, arch="ampere")
    with pytest.raises(tl.TensorLangError, match="unknown stage"):
        k.inspect("cubin", sizes=MM_SIZES)
    with pytest.raises(tl.TensorLangError, match=r"'cpu', 'cuda'"):
        tl.compile(MATMUL, target="rocm")


def test_calling_raises_a_clear_error() -> None:
    import numpy as np

    k = tl.compile(MATMUL, target="cuda")
    with pytest.raises(tl.TensorLangError, match="cuda"):
        k(np.ones((4, 4), np.float32), np.ones((4, 4), np.float32))


def test_repr_and_pickle() -> None:
    k = tl.compile(MATMUL, target="cuda")
    assert repr(k).startswith("<tensorlang.CudaKernel mm(")
    k2 = pickle.loads(pickle.dumps(k))
    assert type(k2) is type(k) and k2.inspect("ptx", sizes=MM_SIZES) == k.inspect("ptx", sizes=MM_SIZES)


def test_cpu_compile_is_not_served_for_cuda() -> None:
    """The CPU program records (disk cache) are never used for target="cuda", and back."""
    cpu = tl.compile(MATMUL)
    cuda = tl.compile(MATMUL, target="cuda")
    assert type(cpu) is not type(cuda)
    assert type(tl.compile(MATMUL)) is type(cpu)


def test_cli_emit_ptx(tmp_path, capsys) -> None:
    from tensorlang.cli import main

    src = tmp_path / "mm.tc"
    src.write_text(MATMUL)
    sizes = ["--size", "M=8", "--size", "K=4", "--size", "N=8"]
    assert main([str(src), "--emit", "ptx", "--target", "cuda", *sizes]) == 0
    assert ".target sm_90" in capsys.readouterr().out
    assert main(["run", str(src), "--target", "cuda", "--shape", "A=8x4", "--shape", "B=4x8"]) != 0
    assert "cuda" in capsys.readouterr().err


def _builtin_source(name: str, ty: str) -> str:
    n = BUILTINS[name]
    params = ", ".join(f"{ty}(N) {x}" for x in "abcd"[:n])
    return f"def f({params}) -> (o) {{ o(i) = {name}({', '.join(f'{x}(i)' for x in 'abcd'[:n])}) }}"


FEW_BUILTINS = ("exp", "tanh", "sin", "pow", "erf", "lgamma", "erfinv", "fmod", "sqrt", "fmax")


@needs_ptxas
@pytest.mark.skipif(libdevice_path() is None, reason="libdevice not installed (tensorlang[cuda-tools])")
@pytest.mark.parametrize("name", FEW_BUILTINS)
def test_math_builtins_assemble(name: str, tmp_path) -> None:
    for ty in ("float", "double"):
        assemble(
            tl.compile(_builtin_source(name, ty), target="cuda").inspect("ptx", sizes={"N": 10}),
            "sm_90",
            tmp_path,
        )


@pytest.mark.slow
@needs_ptxas
@pytest.mark.skipif(libdevice_path() is None, reason="libdevice not installed (tensorlang[cuda-tools])")
@pytest.mark.parametrize("name", sorted(set(BUILTINS) - set(FEW_BUILTINS)))
def test_every_math_builtin_assembles(name: str, tmp_path) -> None:
    for ty in ("float", "double"):
        ptx = tl.compile(_builtin_source(name, ty), target="cuda").inspect(
            "ptx", sizes={"N": 10}, arch="sm_80"
        )
        assemble(ptx, "sm_80", tmp_path)


def test_which_kernels_cannot_fail_at_run_time() -> None:
    """gpu/fastcall.py returns a PyTorch call at once only when no entry reads the error record."""
    from codegen.gpu.fastcall import cannot_fail

    chain = tl.compile("def f(float(N) a) -> (o) { o(i) = tanh(a(i)) * 2 }", target="cuda")
    assert cannot_fail(chain.inspect("ptx", sizes={"N": 1000}))
    gather = tl.compile("def emb(float(V,E) T, int32(B) I) -> (O) { O(b,e) = T(I(b), e) }", target="cuda")
    assert not cannot_fail(gather.inspect("ptx", sizes={"V": 50, "E": 3, "B": 7}))
    divide = tl.compile("def dv(int32(N) a, int32(N) b) -> (o) { o(i) = a(i) / b(i) }", target="cuda")
    assert not cannot_fail(divide.inspect("ptx", sizes={"N": 100}))
    # recorded once per specialisation, not searched for on every call
    assert not chain.specialisation({"N": 1000}, "sm_90").can_fail
    assert gather.specialisation({"V": 50, "E": 3, "B": 7}, "sm_90").can_fail
