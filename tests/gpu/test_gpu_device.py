"""target="cuda" on a real GPU (marked `gpu`; skipped when cuInit fails or cuda-bindings is
missing): the whole public corpus against its NumPy references, PyTorch CUDA tensors in and out,
CuPy arrays, out-of-range gathers, large grids, concurrent calls.

Run with `pytest -m gpu tests/gpu` (papers/2026-11-gpu/gpu_session.sh does, on the device machine).
"""

from __future__ import annotations

import threading
import warnings

import numpy as np
import pytest
from conftest import LAYERNORM, SOFTMAX, load_corpus

import tensorlang as tl
from codegen.gpu import runtime

REASON = runtime.unavailable_reason()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(REASON is not None, reason=f"no GPU: {REASON}")]

CORPUS = load_corpus() or {"cases": []}
CASES = {c["name"]: c for c in CORPUS["cases"]}
GATHER = "def emb(float(V,E) T, int32(B) I) -> (O) {\n  O(b,e) = T(I(b), e)\n}"
MATMUL = "def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }"


def quiet_compile(src: str, name=None):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tl.TensorLangWarning)
        return tl.compile(src, name, target="cuda")


def softmax_ref(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(1, keepdims=True))
    return e / e.sum(1, keepdims=True)


@pytest.mark.parametrize("name", sorted(CASES))
def test_corpus_case_on_the_gpu(name: str) -> None:
    from test_corpus_e2e import assert_close, make_inputs, reference

    case = CASES[name]
    kernel = quiet_compile(case["tc"], case.get("entry"))
    ref = reference(case)
    for seed in range(2):
        rng = np.random.default_rng(seed)
        inputs = make_inputs(case, rng)
        preinit = {
            k: rng.uniform(-1, 1, size=v).astype(case["output_dtypes"][k])
            for k, v in case.get("preinit", {}).items()
        }
        expected = ref(*inputs, *[p.copy() for p in preinit.values()])
        out = {k: v.copy() for k, v in preinit.items()} or None
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", tl.TensorLangWarning)
            result = kernel(*inputs, out=out, **case.get("sizes", {}))
        results = result if isinstance(result, tuple) else (result,)
        expected = expected if isinstance(expected, tuple) else (expected,)
        for out_name, actual, exp in zip(case["outputs"], results, expected):
            assert isinstance(actual, np.ndarray)
            assert actual.dtype == np.dtype(case["output_dtypes"][out_name]), out_name
            assert_close(actual, exp, f"{name}:{out_name} seed {seed}")


def test_device_and_architecture() -> None:
    dev = runtime.device(0)
    assert dev.arch.startswith("sm_") and dev.name
    print(dev)


def test_out_of_range_gather_raises_argument_error() -> None:
    k = quiet_compile(GATHER)
    T = np.random.default_rng(0).uniform(size=(50, 8)).astype(np.float32)
    with pytest.raises(
        tl.ArgumentError, match=r"index 50 out of range for dimension 0 of T in T\(I\(b\), e\)"
    ):
        k(T, np.array([3, 50, 7], np.int32))
    with pytest.raises(tl.ArgumentError, match="index -2 out of range"):
        k(T, np.array([3, 1, -2], np.int32))
    index = np.array([3, 49, 0, 7], np.int32)
    np.testing.assert_array_equal(k(T, index), T[index])  # the next call is fine


def test_torch_tensors_in_and_out() -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA")
    k = quiet_compile(SOFTMAX)
    x = torch.randn(333, 97, device="cuda")
    y = k(x)
    assert isinstance(y, torch.Tensor) and y.is_cuda and y.shape == (333, 97) and y.dtype == torch.float32
    torch.testing.assert_close(y, torch.softmax(x, 1), rtol=1e-5, atol=1e-6)
    out = torch.empty(333, 97, device="cuda")
    assert k(x, out=out) is out
    torch.testing.assert_close(out, torch.softmax(x, 1), rtol=1e-5, atol=1e-6)
    xt = torch.randn(97, 333, device="cuda").T  # strided input
    torch.testing.assert_close(k(xt), torch.softmax(xt, 1), rtol=1e-5, atol=1e-6)
    strided_out = torch.zeros(333, 194, device="cuda")[:, ::2]
    k(x, out=strided_out)
    torch.testing.assert_close(strided_out, torch.softmax(x, 1), rtol=1e-5, atol=1e-6)
    with pytest.raises(tl.ArgumentError, match="expected type float"):
        k(x.double())
    ln = quiet_compile(LAYERNORM)
    z = torch.randn(64, 256, device="cuda")
    torch.testing.assert_close(
        ln(z), torch.nn.functional.layer_norm(z, (256,), eps=1e-5), rtol=1e-4, atol=1e-4
    )
    # a non-default stream: the call runs on torch's current stream
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        w = x * 2
        r = k(w)
    torch.cuda.synchronize()
    torch.testing.assert_close(r, torch.softmax(x * 2, 1), rtol=1e-5, atol=1e-6)


def test_torch_matmul_and_requires_grad() -> None:
    torch = pytest.importorskip("torch")
    k = quiet_compile(MATMUL)
    a = torch.randn(129, 65, device="cuda", requires_grad=True)
    b = torch.randn(65, 31, device="cuda")
    c = k(a, b)  # read through .detach(): the call is not recorded by autograd
    torch.testing.assert_close(c, a.detach() @ b, rtol=1e-4, atol=1e-4)


def test_repeated_torch_calls_take_the_quick_path_and_stay_correct() -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA")
    k = quiet_compile(SOFTMAX)
    x = torch.randn(257, 129, device="cuda")
    first = k(x)
    assert len(k.torch_plans) == 1  # recorded by the full call: softmax cannot fail at run time
    results = [k(x * s) for s in (1.0, 2.0, -3.0)]  # quick calls: asynchronous, on torch's stream
    for s, y in zip((1.0, 2.0, -3.0), results):
        torch.testing.assert_close(y, torch.softmax(x * s, 1), rtol=1e-5, atol=1e-6)
    assert first.data_ptr() != results[0].data_ptr() and len({y.data_ptr() for y in results}) == 3
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):  # the quick path launches on the current stream
        z = k(x)
    side.synchronize()
    torch.testing.assert_close(z, torch.softmax(x, 1), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(
        k(x.T.contiguous().T), torch.softmax(x, 1), rtol=1e-5, atol=1e-6
    )  # strided: full
    torch.testing.assert_close(k(x[:100]), torch.softmax(x[:100], 1), rtol=1e-5, atol=1e-6)  # new signature
    assert len(k.torch_plans) == 2
    g = quiet_compile(GATHER)  # can fail at run time: every call checks and waits
    T = torch.randn(50, 3, device="cuda")
    g(T, torch.tensor([1, 2], dtype=torch.int32, device="cuda"))
    assert not g.torch_plans
    with pytest.raises(tl.ArgumentError, match="index 50 out of range"):
        g(T, torch.tensor([1, 50], dtype=torch.int32, device="cuda"))


def test_cupy_arrays() -> None:
    cupy = pytest.importorskip("cupy")
    k = quiet_compile(SOFTMAX)
    x = cupy.random.standard_normal((100, 33), dtype=cupy.float32)
    y = k(x)
    assert isinstance(y, cupy.ndarray)
    np.testing.assert_allclose(cupy.asnumpy(y), softmax_ref(cupy.asnumpy(x)), rtol=1e-5, atol=1e-6)


def test_generic_cuda_array_interface_gives_device_array() -> None:
    torch = pytest.importorskip("torch")

    class Wrapped:
        def __init__(self, t):
            self.t = t
            self.__cuda_array_interface__ = t.__cuda_array_interface__

    x = torch.randn(40, 17, device="cuda")
    y = quiet_compile(SOFTMAX)(Wrapped(x))
    assert type(y).__name__ == "DeviceArray"
    np.testing.assert_allclose(y.numpy(), softmax_ref(x.cpu().numpy()), rtol=1e-5, atol=1e-6)


def test_large_elementwise_grid() -> None:
    k = quiet_compile("def f(float(N) a) -> (o) { o(i) = tanh(a(i)) * 2 }")
    a = np.random.default_rng(1).uniform(-3, 3, 1 << 24).astype(np.float32)
    np.testing.assert_allclose(k(a), np.tanh(a) * 2, rtol=1e-5, atol=1e-6)


def test_concurrent_calls() -> None:
    k = quiet_compile(SOFTMAX)
    x = np.random.default_rng(2).standard_normal((300, 41)).astype(np.float32)
    expected = softmax_ref(x)
    failures = []

    def work():
        try:
            for _ in range(10):
                np.testing.assert_allclose(k(x), expected, rtol=1e-5, atol=1e-6)
        except Exception as exc:  # noqa: BLE001
            failures.append(exc)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures, failures[0]


def test_spawned_child_runs_kernels() -> None:
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(1) as pool:
        assert pool.apply(_child_sum, (1000,)) == pytest.approx(1000.0)


def _child_sum(n: int) -> float:
    import tensorlang as tl

    k = tl.compile("def s(float(N) a) -> (t) { t +=! a(i) }", target="cuda")
    return float(k(np.ones(n, np.float32)))
