"""A stand-in for `cuda.bindings.driver` that runs on the CPU: the whole GPU call path without a GPU.

"Device memory" is host memory (NumPy buffers; a device pointer is a host address), copies and
memsets are memmove/memset, and a launch reads its parameters the way the real driver does —
from the `kernelParams` array of pointers, one value per `.param` of the PTX entry, with the
width the PTX declares — then runs the same phase on the host: the CPU emulation of the grid
(gpu/lower.py, lower_for_emulation) compiled from the kernel's plan, registered per PTX text.
Every call is recorded, so tests can check the launch configuration and the sequence of calls.
"""

from __future__ import annotations

import ctypes
import enum
import types

import llvmlite.binding as llvm
import numpy as np

from codegen.gpu.lower import lower_for_emulation
from codegen.gpu.params import entry_params

_WIDTH = {"u64": ctypes.c_uint64, "b64": ctypes.c_uint64, "s64": ctypes.c_int64, "u32": ctypes.c_uint32,
          "s32": ctypes.c_int32, "b32": ctypes.c_uint32}  # fmt: skip


class CUresult(enum.IntEnum):
    CUDA_SUCCESS = 0
    CUDA_ERROR_INVALID_VALUE = 1
    CUDA_ERROR_OUT_OF_MEMORY = 2
    CUDA_ERROR_NO_DEVICE = 100
    CUDA_ERROR_INVALID_PTX = 218
    CUDA_ERROR_LAUNCH_FAILED = 719


class FakeDriver(types.SimpleNamespace):
    """Build with `FakeDriver()`; `register(kernel, sizes)` before calling a kernel at those sizes."""

    CUresult = CUresult

    def __init__(self, arch: str = "sm_90"):
        super().__init__()
        self.arch = arch
        self.calls: list[tuple] = []
        self.memory: dict[int, np.ndarray] = {}
        self.modules: dict[int, str] = {}
        self.emulations: dict[str, object] = {}  # ptx text → (engine, phase count)
        self.fail: dict[str, CUresult] = {}  # function name → the error it returns
        self.init_error: CUresult | None = None
        self.external: dict[int, np.ndarray] = {}  # "device arrays" made by tests (host memory)
        self.CUdevice_attribute = types.SimpleNamespace(
            CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR="major",
            CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR="minor",
        )
        self.CUpointer_attribute = types.SimpleNamespace(CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL="ordinal")

    # ------------------------------------------------------------------ set-up by tests

    def register(self, kernel, sizes: dict) -> None:
        """Compile the host emulation of `kernel` at `sizes`: what launches of its PTX run."""
        plan, mapping = kernel.plan(sizes)
        ptx = kernel.specialisation(sizes, self.arch).ptx
        llvm.initialize_native_target()
        llvm.initialize_native_asmprinter()
        ref = llvm.parse_assembly(str(lower_for_emulation(plan, mapping)))
        ref.verify()
        engine = llvm.create_mcjit_compiler(ref, llvm.Target.from_default_triple().create_target_machine())
        engine.finalize_object()
        self.emulations[ptx] = (engine, mapping)

    def adopt(self, array: np.ndarray) -> np.ndarray:
        """Let `array`'s memory stand for device memory a test's CUDA array object holds."""
        base = array.base if array.base is not None and isinstance(array.base, np.ndarray) else array
        raw = base.reshape(-1).view(np.uint8) if base.flags.c_contiguous else base
        self.external[base.ctypes.data] = raw
        return array

    def allocated(self) -> int:
        return len(self.memory)

    def _result(self, name: str, *values):
        self.calls.append((name, values))
        err = self.fail.get(name)
        if err is not None:
            return (err,) + tuple(None for _ in values)
        return (CUresult.CUDA_SUCCESS, *values)

    # ------------------------------------------------------------------ the driver API subset

    @staticmethod
    def CUdeviceptr(value=0) -> int:  # noqa: N802 - the bindings' name
        return int(value)

    @staticmethod
    def CUstream(value=0) -> int:  # noqa: N802
        return int(value)

    def cuGetErrorName(self, err):  # noqa: N802
        return (CUresult.CUDA_SUCCESS, CUresult(int(err)).name.encode())

    def cuGetErrorString(self, err):  # noqa: N802
        return (CUresult.CUDA_SUCCESS, f"fake description of {int(err)}".encode())

    def cuInit(self, flags):  # noqa: N802
        if self.init_error is not None:
            return (self.init_error,)
        return self._result("cuInit")

    def cuDeviceGetCount(self):  # noqa: N802
        return self._result("cuDeviceGetCount", 2)

    def cuDeviceGet(self, ordinal):  # noqa: N802
        return self._result("cuDeviceGet", ordinal)

    def cuDevicePrimaryCtxRetain(self, device):  # noqa: N802
        return self._result("cuDevicePrimaryCtxRetain", f"ctx{device}")

    def cuDeviceGetAttribute(self, attr, device):  # noqa: N802
        major, minor = self.arch[3:-1], self.arch[-1]
        return self._result("cuDeviceGetAttribute", int(major if attr == "major" else minor))

    def cuDeviceGetName(self, length, device):  # noqa: N802
        return self._result("cuDeviceGetName", b"Fake GPU\0\0")

    def cuCtxSetCurrent(self, ctx):  # noqa: N802
        return self._result("cuCtxSetCurrent")

    def cuMemAlloc(self, nbytes):  # noqa: N802
        if "cuMemAlloc" in self.fail:
            return self._result("cuMemAlloc", 0)
        block = np.zeros(nbytes, np.uint8)
        block[:] = 0xAB  # garbage, as fresh device memory may hold
        self.memory[block.ctypes.data] = block
        return self._result("cuMemAlloc", block.ctypes.data)

    def cuMemFree(self, ptr):  # noqa: N802
        del self.memory[int(ptr)]
        return self._result("cuMemFree")

    def cuMemsetD8Async(self, ptr, value, count, stream):  # noqa: N802
        ctypes.memset(int(ptr), value, count)
        return self._result("cuMemsetD8Async")

    def cuMemcpyHtoDAsync(self, dst, src, count, stream):  # noqa: N802
        ctypes.memmove(int(dst), int(src), count)
        return self._result("cuMemcpyHtoDAsync")

    def cuMemcpyDtoHAsync(self, dst, src, count, stream):  # noqa: N802
        ctypes.memmove(int(dst), int(src), count)
        return self._result("cuMemcpyDtoHAsync")

    def cuMemcpyDtoH(self, dst, src, count):  # noqa: N802 - synchronous, on the legacy stream
        ctypes.memmove(int(dst), int(src), count)
        return self._result("cuMemcpyDtoH")

    def cuStreamSynchronize(self, stream):  # noqa: N802
        return self._result("cuStreamSynchronize")

    def cuPointerGetAttribute(self, attr, ptr):  # noqa: N802
        return self._result("cuPointerGetAttribute", 0)

    def cuModuleLoadDataEx(self, image, count, options, values):  # noqa: N802
        assert image.endswith(b"\0") and count == 0
        if "cuModuleLoadDataEx" in self.fail:
            return (self.fail["cuModuleLoadDataEx"], None)
        handle = len(self.modules) + 1
        self.modules[handle] = image[:-1].decode()
        return self._result("cuModuleLoadDataEx", handle)

    def cuModuleGetFunction(self, module, name):  # noqa: N802
        ptx = self.modules[module]
        assert name.decode() in entry_params(ptx), name
        return self._result("cuModuleGetFunction", (module, name.decode()))

    def cuLaunchKernel(self, f, gx, gy, gz, bx, by, bz, shmem, stream, params, extra):  # noqa: N802
        module, name = f
        ptx = self.modules[module]
        kinds = entry_params(ptx)[name]
        pointers = (ctypes.c_void_p * len(kinds)).from_address(params)
        values = [_WIDTH[k].from_address(p).value for k, p in zip(kinds, pointers)]
        self.calls.append(
            ("cuLaunchKernel", (name, (gx, gy, gz), (bx, by, bz), shmem, stream, tuple(values)))
        )
        engine, mapping = self.emulations[ptx]
        phase = int(name.rsplit("phase", 1)[1])
        grid = mapping.phases[phase]
        assert (gx, bx) == (grid.blocks, grid.block) and gy == gz == by == bz == 1
        assert gx * bx >= (grid.threads if grid.loops else 1)
        regions = list(self.memory.items()) + list(self.external.items())
        for v in values:  # every pointer parameter points into memory the driver handed out (or a test's)
            assert any(base <= v < base + len(block) for base, block in regions), hex(v)
        fn = ctypes.CFUNCTYPE(None, *[ctypes.c_void_p] * len(values))(
            engine.get_function_address(f"tl_emulate_phase{phase}")
        )
        fn(*values)
        return (CUresult.CUDA_SUCCESS,)
