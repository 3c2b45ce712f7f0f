"""target="cuda" runtime on the CPU: parameter packing against the PTX signature, launch
configuration, CUDA-array detection (fake __cuda_array_interface__ / DLPack objects), driver
errors decoded, the clear error without a GPU, and whole calls through a stand-in driver
(tests/gpu/fake_driver.py) whose launches run the CPU emulation of the same grid.

The tests that need a real GPU are in test_gpu_device.py (marked `gpu`)."""

from __future__ import annotations

import os
import re
import sys
import threading
import warnings

import numpy as np
import pytest
from conftest import load_corpus

import tensorlang as tl
from codegen.gpu import arrays, runtime
from codegen.gpu.params import entry_params, pack, pack_pointers
from codegen.gpu.ptx import libdevice_path
from codegen.lowering.abi import kernel_layout

sys.path.insert(0, os.path.dirname(__file__))
from fake_driver import CUresult, FakeDriver  # noqa: E402

MATMUL = "def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }"
SOFTMAX = (
    "def sm(float(N,D) X) -> (Y) {\n  mx(n) max=! X(n,d)\n  e(n,d) = exp(X(n,d) - mx(n))\n  s(n) +=! e(n,d)\n"
    "  Y(n,d) = e(n,d) / s(n)\n}"
)
GATHER = "def emb(float(V,E) T, int32(B) I) -> (O) {\n  O(b,e) = T(I(b), e)\n}"
ACCUMULATE = "def acc(float(N) a) -> (o) { o(i) += a(i) }"
DIVIDE = "def dv(int32(N) a, int32(N) b) -> (o) { o(i) = a(i) / b(i) }"
CORPUS = load_corpus() or {"cases": []}
CASES = {c["name"]: c for c in CORPUS["cases"]}


def rand(*shape, seed=0):
    return np.random.default_rng(seed).uniform(-1, 1, shape).astype(np.float32)


@pytest.fixture
def fake(monkeypatch) -> FakeDriver:
    """A fresh process state whose driver is the stand-in."""
    driver = FakeDriver()
    monkeypatch.setattr(runtime, "_STATE", runtime._Process(os.getpid()))
    monkeypatch.setattr(runtime, "driver", lambda: driver)
    return driver


def compiled(fake: FakeDriver, src: str, sizes: dict, name=None):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tl.TensorLangWarning)
        k = tl.compile(src, name, target="cuda")
    fake.register(k, sizes)
    return k


# ---------------------------------------------------------------------------- packing and launches


@pytest.mark.parametrize(
    "src, sizes",
    [(MATMUL, {"M": 7, "K": 3, "N": 5}), (SOFTMAX, {"N": 9, "D": 4}), (GATHER, {"V": 6, "E": 3, "B": 2})],
)
def test_params_match_the_ptx_entry_signature(src: str, sizes: dict) -> None:
    k = tl.compile(src, target="cuda")
    spec = k.specialisation(sizes, "sm_90")
    plan, mapping = k.plan(sizes)
    signatures = entry_params(spec.ptx)
    assert spec.tensors == kernel_layout(plan.scop).tensors
    assert sorted(signatures) == sorted(name for name, _, _ in spec.launches)
    for name, grid, block in spec.launches:
        # one u64 pointer per layout tensor, then the error record: what pack_pointers packs
        assert signatures[name] == ("u64",) * (len(spec.tensors) + 1)
        phase = mapping.phases[int(name.rsplit("phase", 1)[1])]
        assert (grid, block) == (phase.blocks, phase.block)
        assert grid * block >= phase.threads and block % 32 == 0 or block == 1
    params = pack_pointers([0x1000 + 8 * n for n in range(len(spec.tensors))], 0xE000)
    assert params.kinds == ("u64",) * (len(spec.tensors) + 1)
    import ctypes

    read = [ctypes.c_uint64.from_address(p).value for p in params.pointers]
    assert read == [0x1000 + 8 * n for n in range(len(spec.tensors))] + [0xE000]


def test_pack_widths() -> None:
    import ctypes

    params = pack([("s32", -3), ("f32", 1.5), ("u64", 2**63 + 1), ("f64", 0.25)])
    cells = list(params.pointers)
    assert ctypes.c_int32.from_address(cells[0]).value == -3
    assert ctypes.c_float.from_address(cells[1]).value == 1.5
    assert ctypes.c_uint64.from_address(cells[2]).value == 2**63 + 1
    assert ctypes.c_double.from_address(cells[3]).value == 0.25
    with pytest.raises(ValueError):
        pack([("pred", 1)])


def test_large_grid_launch_configuration() -> None:
    k = tl.compile("def f(float(N) a) -> (o) { o(i) = a(i) * 2 }", target="cuda")
    ((name, grid, block),) = k.specialisation({"N": 64 << 20}, "sm_90").launches
    assert (name, grid, block) == ("tl_f_phase0", (64 << 20) // 256, 256)


def test_error_record_is_claimed_once() -> None:
    """The entry claims error[0] with a compare-and-swap, then writes the details; no thread
    reads the error word before its work (no hot address)."""
    k = tl.compile(GATHER, target="cuda")
    llvm_text = k.inspect("llvm", sizes={"V": 6, "E": 3, "B": 2})
    assert "cmpxchg" in llvm_text and "load atomic" not in llvm_text
    ptx = k.inspect("ptx", sizes={"V": 6, "E": 3, "B": 2})
    assert re.search(r"^\s*atom\.[\w.]*cas\.b64", ptx, re.M)


# ---------------------------------------------------------------------------- CUDA array detection


class FakeCAI:
    """An object exposing __cuda_array_interface__ over a NumPy array (the fake's device memory)."""

    def __init__(self, array: np.ndarray, strides=None, version=3, stream=None, mask=None, readonly=False):
        self.array = array
        self.cai = {
            "shape": array.shape,
            "typestr": array.dtype.str,
            "data": (array.ctypes.data, readonly),
            "strides": strides,
            "version": version,
        }
        if version >= 3:
            self.cai["stream"] = stream
        if mask is not None:
            self.cai["mask"] = mask

    @property
    def __cuda_array_interface__(self) -> dict:
        return self.cai


class FakeDLPackCUDA:
    """Claims to live on CUDA device 1; its capsule is NumPy's (host memory, same layout)."""

    def __init__(self, array: np.ndarray):
        self.array = array

    def __dlpack_device__(self):
        return (2, 1)

    def __dlpack__(self, stream=None):
        return self.array.__dlpack__()


def test_detection() -> None:
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    assert arrays.device_view(a, "x") is None and arrays.device_view([1, 2], "x") is None
    assert arrays.device_view(2.5, "x") is None
    view = arrays.device_view(FakeCAI(a), "x")
    assert (view.ptr, view.shape, view.dtype, view.kind, view.contiguous) == (
        a.ctypes.data, (3, 4), np.float32, "cai", True
    )  # fmt: skip
    assert arrays.device_view(FakeCAI(a, strides=(16, 4)), "x").contiguous
    strided = arrays.device_view(FakeCAI(a, strides=(4, 12)), "x")
    assert not strided.contiguous and strided.span() == (0, 4 * 2 + 12 * 3 + 4)
    dl = arrays.device_view(FakeDLPackCUDA(a[1:]), "x")
    assert (dl.ptr, dl.shape, dl.dtype, dl.device, dl.kind) == (
        a[1:].ctypes.data,
        (2, 4),
        np.float32,
        1,
        "dlpack",
    )
    with pytest.raises(tl.ArgumentError, match="mask"):
        arrays.device_view(FakeCAI(a, mask=object()), "x")


def test_torch_cpu_tensors_are_host_data() -> None:
    torch = pytest.importorskip("torch")
    assert arrays.device_view(torch.ones(3), "x") is None


# ---------------------------------------------------------------------------- errors without a GPU


def test_no_driver_gives_the_clear_error(monkeypatch) -> None:
    monkeypatch.setattr(runtime, "_STATE", runtime._Process(os.getpid()))
    k = tl.compile(MATMUL, target="cuda")
    reason = runtime.unavailable_reason()
    if reason is None:
        pytest.skip("a GPU is present")
    with pytest.raises(tl.TensorLangError, match="cannot run a target='cuda' kernel here") as info:
        k(rand(4, 3), rand(3, 2))
    assert type(info.value) is tl.TensorLangError  # not a driver exception, not a tuple


def test_no_bindings_gives_the_install_hint(monkeypatch) -> None:
    monkeypatch.setattr(runtime, "_STATE", runtime._Process(os.getpid()))
    monkeypatch.setitem(sys.modules, "cuda.bindings", None)
    k = tl.compile(MATMUL, target="cuda")
    with pytest.raises(
        tl.TensorLangError, match=r"cuda-bindings is not installed \(pip install 'tensorlang\[cuda\]'\)"
    ):
        k(rand(4, 3), rand(3, 2))


def test_error_decoding(fake) -> None:
    with pytest.raises(
        tl.TensorLangError, match=r"cuMemAlloc failed: CUDA_ERROR_OUT_OF_MEMORY \(fake description of 2\)"
    ):
        runtime.check(fake, (CUresult.CUDA_ERROR_OUT_OF_MEMORY, None), "cuMemAlloc")
    assert runtime.check(fake, (CUresult.CUDA_SUCCESS, 7), "x") == 7
    assert runtime.check(fake, (CUresult.CUDA_SUCCESS,), "x") is None
    assert runtime.error_text(fake, 999999).startswith("CUresult 999999")
    real = pytest.importorskip("cuda.bindings.driver")  # without a driver library: names from the enum
    assert runtime.error_text(real, real.CUresult.CUDA_ERROR_NO_DEVICE).startswith("CUDA_ERROR_NO_DEVICE")


def test_real_bindings_accept_our_argument_forms() -> None:
    """Every driver call the runtime makes, with the argument types it passes, gets past the real
    bindings' argument conversion (a TypeError there would be our bug). Without a driver library
    each call then fails loading it; with a GPU the calls are made for real by test_gpu_device.py."""
    d = pytest.importorskip("cuda.bindings.driver")
    if runtime.unavailable_reason() is None:
        pytest.skip("a GPU is present: the device tests make these calls")
    host = np.zeros(4, np.int64)
    params = pack_pointers([0x1000, 0x2000], 0x3000)
    ptr, stream = d.CUdeviceptr(0x1000), d.CUstream(0x7F0012345678)
    attr = d.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR
    calls = [
        ("cuInit", 0),
        ("cuDeviceGetCount",),
        ("cuDeviceGet", 0),
        ("cuDevicePrimaryCtxRetain", d.CUdevice(0)),
        ("cuDeviceGetAttribute", attr, d.CUdevice(0)),
        ("cuDeviceGetName", 256, d.CUdevice(0)),
        ("cuCtxSetCurrent", d.CUcontext()),
        ("cuMemAlloc", 256),
        ("cuMemFree", ptr),
        ("cuMemsetD8Async", ptr, 0, 32, stream),
        ("cuMemcpyHtoDAsync", ptr, host.ctypes.data, 32, stream),
        ("cuMemcpyDtoHAsync", host.ctypes.data, ptr, 32, d.CUstream(0)),
        ("cuStreamSynchronize", stream),
        ("cuModuleLoadDataEx", b".version 7.8\0", 0, [], []),
        ("cuModuleGetFunction", d.CUmodule(), b"tl_f_phase0"),
        ("cuLaunchKernel", d.CUfunction(), 4, 1, 1, 256, 1, 1, 0, stream, params.address, 0),
        ("cuPointerGetAttribute", d.CUpointer_attribute.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, ptr),
        ("cuDriverGetVersion",),
        ("cuGetErrorName", d.CUresult(1)),
    ]
    for name, *args in calls:
        with pytest.raises(tl.TensorLangError) as info:
            runtime.call(d, name, *args)
        assert not isinstance(info.value.__cause__, TypeError), (name, info.value)


def test_driver_failures_reach_the_user_as_tensorlang_errors(fake) -> None:
    k = compiled(fake, GATHER, {"V": 6, "E": 3, "B": 2})
    T, index = rand(6, 3), np.array([1, 5], np.int32)
    fake.fail["cuModuleLoadDataEx"] = CUresult.CUDA_ERROR_INVALID_PTX
    with pytest.raises(tl.TensorLangError, match="CUDA_ERROR_INVALID_PTX.*could not JIT-compile"):
        k(T, index)
    del fake.fail["cuModuleLoadDataEx"]
    # a host call waits for the default stream with its last copy (the error record)
    fake.fail["cuMemcpyDtoH"] = CUresult.CUDA_ERROR_LAUNCH_FAILED
    with pytest.raises(tl.TensorLangError, match="cuMemcpyDtoH failed: CUDA_ERROR_LAUNCH_FAILED"):
        k(T, index)
    del fake.fail["cuMemcpyDtoH"]
    np.testing.assert_array_equal(k(T, index), T[index])


def test_failed_init_is_remembered_and_fork_is_named(monkeypatch) -> None:
    driver = FakeDriver()
    driver.init_error = CUresult.CUDA_ERROR_NO_DEVICE
    monkeypatch.setattr(runtime, "driver", lambda: driver)
    monkeypatch.setattr(runtime, "_STATE", runtime._Process(os.getpid(), inherited=True))
    k = tl.compile(MATMUL, target="cuda")
    for _ in range(2):
        with pytest.raises(tl.TensorLangError, match="CUDA_ERROR_NO_DEVICE.*forked after its parent"):
            k(rand(4, 3), rand(3, 2))
    assert runtime.unavailable_reason().startswith("no usable CUDA driver or GPU")


def test_driver_errors_in_a_forked_child_name_the_fork(fake, monkeypatch) -> None:
    monkeypatch.setattr(runtime, "_STATE", runtime._Process(os.getpid(), inherited=True))
    k = compiled(fake, GATHER, {"V": 6, "E": 3, "B": 2})
    fake.fail["cuMemAlloc"] = CUresult.CUDA_ERROR_OUT_OF_MEMORY
    with pytest.raises(tl.TensorLangError, match="CUDA_ERROR_OUT_OF_MEMORY.*forked after its parent"):
        k(rand(6, 3), np.array([1, 5], np.int32))


def test_fork_gives_the_child_a_fresh_state(fake) -> None:
    runtime.device(0)
    parent = runtime._STATE
    assert parent.initialised and parent.devices
    runtime._after_fork_in_child()
    try:
        child = runtime._STATE
        assert child is not parent and child.inherited and not child.devices and not child.modules
    finally:
        runtime._STATE = parent


# ---------------------------------------------------------------------------- whole calls, stand-in driver


def test_numpy_call_matches(fake) -> None:
    sizes = {"M": 17, "K": 5, "N": 23}
    k = compiled(fake, MATMUL, sizes)
    A, B = rand(17, 5), rand(5, 23, seed=1)
    np.testing.assert_allclose(k(A, B), A @ B, rtol=1e-5, atol=1e-5)
    launches = [c[1] for c in fake.calls if c[0] == "cuLaunchKernel"]
    assert [name for name, *_ in launches] == ["tl_mm_phase0", "tl_mm_phase1"]
    held = fake.allocated()
    np.testing.assert_allclose(k(A, B), A @ B, rtol=1e-5, atol=1e-5)
    assert fake.allocated() == held  # the second call reuses the pool's buffers
    assert sum(1 for c in fake.calls if c[0] == "cuModuleLoadDataEx") == 1  # loaded once


def test_softmax_with_temporaries_and_non_contiguous_input(fake) -> None:
    k = compiled(fake, SOFTMAX, {"N": 9, "D": 31})
    X = rand(31, 9).T  # strided NumPy input: copied contiguous first
    e = np.exp(X - X.max(1, keepdims=True))
    np.testing.assert_allclose(k(X), e / e.sum(1, keepdims=True), rtol=1e-5)


def test_out_of_range_gather_raises_argument_error(fake) -> None:
    k = compiled(fake, GATHER, {"V": 6, "E": 3, "B": 4})
    T = rand(6, 3)
    with pytest.raises(
        tl.ArgumentError, match=r"index 9 out of range for dimension 0 of T in T\(I\(b\), e\) \(line 2"
    ):
        k(T, np.array([0, 9, 2, -1], np.int32))
    with pytest.raises(tl.ArgumentError, match="index -1 out of range"):
        k(T, np.array([0, 1, 2, -1], np.int32))
    np.testing.assert_array_equal(
        k(T, np.array([0, 5, 2, 1], np.int32)), T[[0, 5, 2, 1]]
    )  # the record is reset


def test_a_clear_error_record_is_reused_without_clearing_and_a_set_one_never(fake) -> None:
    k = compiled(fake, GATHER, {"V": 6, "E": 3, "B": 4})
    T, good, bad = rand(6, 3), np.array([0, 5, 2, 1], np.int32), np.array([0, 9, 2, 1], np.int32)

    def driver_calls() -> list[str]:
        start = len(fake.calls)
        np.testing.assert_array_equal(k(T, good), T[good])
        return [name for name, _ in fake.calls[start:]]

    driver_calls()
    steady = driver_calls()
    # inputs in, one launch, the result out, the error record out (the wait): no memset, no sync
    assert steady.count("cuLaunchKernel") == 1 and steady.count("cuMemcpyDtoH") == 1
    assert "cuMemsetD8Async" not in steady and "cuStreamSynchronize" not in steady
    for _ in range(2):
        with pytest.raises(tl.ArgumentError, match="index 9 out of range"):
            k(T, bad)
        assert "cuMemsetD8Async" in driver_calls()  # the set record was not reused: a new one, cleared
    assert "cuMemsetD8Async" not in driver_calls()


def test_integer_division_by_zero(fake) -> None:
    k = compiled(fake, DIVIDE, {"N": 5})
    with pytest.raises(tl.ArgumentError, match="integer division by zero"):
        k(np.arange(5, dtype=np.int32), np.array([1, 2, 0, 1, 1], np.int32))


def test_out_and_accumulation(fake) -> None:
    k = compiled(fake, ACCUMULATE, {"N": 7})
    a = rand(7)
    start = rand(7, seed=3)
    buf = start.copy()
    assert k(a, out={"o": buf}) is buf
    np.testing.assert_allclose(buf, start + a, rtol=1e-6)
    with pytest.warns(tl.TensorLangWarning, match="starts from zeros") as caught:
        np.testing.assert_allclose(k(a), a)
    assert caught[0].filename == __file__  # located at the user's call
    strided = np.zeros((7, 2), np.float32)[:, 0]
    k(a, out=[strided])
    np.testing.assert_allclose(strided, a)
    with pytest.raises(tl.ArgumentError, match="shares memory"):
        k(a, out={"o": a})
    with pytest.raises(tl.ArgumentError, match="expected type float"):
        k(a.astype(np.float64))


def test_device_call_returns_device_arrays(fake) -> None:
    sizes = {"M": 6, "K": 4, "N": 5}
    k = compiled(fake, MATMUL, sizes)
    A, B = rand(6, 4), rand(4, 5, seed=2)
    a_dev, b_dev = FakeCAI(fake.adopt(A)), FakeCAI(fake.adopt(B))
    C = k(a_dev, b_dev)
    assert isinstance(C, arrays.DeviceArray) and C.shape == (6, 5) and C.dtype == np.float32
    assert C.__cuda_array_interface__["version"] == 3
    np.testing.assert_allclose(C.numpy(), A @ B, rtol=1e-5, atol=1e-6)
    # a host input mixed in is copied; a device out= is written in place
    target = fake.adopt(np.zeros((6, 5), np.float32))
    assert k(A, b_dev, out={"C": FakeCAI(target)}).cai["data"][0] == target.ctypes.data
    np.testing.assert_allclose(target, A @ B, rtol=1e-5, atol=1e-6)
    held = fake.allocated()
    del C
    assert fake.allocated() == held  # back to the pool, not freed
    with pytest.raises(tl.ArgumentError, match="read-only"):
        k(a_dev, b_dev, out=FakeCAI(target, readonly=True))
    block = fake.adopt(np.zeros(64, np.float32))
    with pytest.raises(tl.ArgumentError, match="output C .out=. shares memory with input A"):
        k(FakeCAI(block[:24].reshape(6, 4)), b_dev, out=FakeCAI(block[20:50].reshape(6, 5)))


def test_strided_device_input_and_dlpack(fake) -> None:
    k = compiled(fake, MATMUL, {"M": 6, "K": 4, "N": 5})
    At = fake.adopt(rand(4, 6))
    B = fake.adopt(rand(4, 5, seed=4))
    A_view = FakeCAI(At, strides=(4, 24))  # A = At.T, strided
    A_view.cai["shape"] = (6, 4)
    np.testing.assert_allclose(k(A_view, FakeCAI(B)).numpy(), At.T @ B, rtol=1e-5, atol=1e-6)
    C = k(FakeDLPackCUDA(fake.adopt(np.ascontiguousarray(At.T))), FakeDLPackCUDA(B))
    np.testing.assert_allclose(C.numpy(), At.T @ B, rtol=1e-5, atol=1e-6)
    with pytest.raises(tl.ArgumentError, match="expected type float"):
        k(FakeCAI(fake.adopt(np.zeros((6, 4)))), FakeCAI(B))
    with pytest.raises(tl.ArgumentError, match="mismatched sizes for K"):
        k(FakeCAI(fake.adopt(np.zeros((6, 3), np.float32))), FakeCAI(B))


def test_concurrent_calls(fake) -> None:
    k = compiled(fake, SOFTMAX, {"N": 5, "D": 8})
    X = rand(5, 8)
    e = np.exp(X - X.max(1, keepdims=True))
    expected = e / e.sum(1, keepdims=True)
    failures = []

    def work():
        try:
            for _ in range(5):
                np.testing.assert_allclose(k(X), expected, rtol=1e-5)
        except Exception as exc:  # noqa: BLE001
            failures.append(exc)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures


def _corpus_case(fake, name: str) -> None:
    from test_corpus_e2e import assert_close, make_inputs, reference

    case = CASES[name]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tl.TensorLangWarning)
        k = tl.compile(case["tc"], case.get("entry"), target="cuda")
    rng = np.random.default_rng(0)
    inputs = make_inputs(case, rng)
    preinit = {
        n: rng.uniform(-1, 1, size=v).astype(case["output_dtypes"][n])
        for n, v in case.get("preinit", {}).items()
    }
    expected = reference(case)(*inputs, *[p.copy() for p in preinit.values()])
    shaped = [type("S", (), {"shape": np.shape(x)})() for x in inputs]
    from codegen.runtime import arguments as args_

    sizes = args_.bind_sizes(k.interface, shaped, k.interface.input_dims)
    sizes = args_.bind_keyword_sizes(k.interface, sizes, case.get("sizes", {}))
    try:
        fake.register(k, sizes)
    except tl.TensorLangError as error:  # math functions need libdevice, from tensorlang[cuda-tools]
        if libdevice_path() is None and "libdevice" in str(error):
            pytest.skip("libdevice not installed (tensorlang[cuda-tools])")
        raise
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tl.TensorLangWarning)
        result = k(*inputs, out={n: p.copy() for n, p in preinit.items()} or None, **case.get("sizes", {}))
    results = result if isinstance(result, tuple) else (result,)
    expected = expected if isinstance(expected, tuple) else (expected,)
    for out_name, actual, exp in zip(case["outputs"], results, expected):
        assert_close(actual, exp, f"{name}:{out_name}")


@pytest.mark.parametrize("name", sorted(CASES))
def test_corpus_case_through_the_stand_in_driver(fake, name: str) -> None:
    _corpus_case(fake, name)
