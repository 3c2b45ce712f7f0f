"""gpu: a repeated call on contiguous PyTorch CUDA tensors → launches on PyTorch's stream, returned at once.

The full call (gpu/calling.py) checks every argument in Python, reads the error record back and
waits for the GPU before it returns. For a kernel that cannot fail at run time (no gather to
bounds-check, no integer division: no entry of its PTX reads the error record's parameter) and a
call whose inputs are all contiguous PyTorch CUDA tensors, nothing is left to check once a first
full call has succeeded with the same signature (shapes, dtypes, device): the sizes, the output
and temporary shapes, the module and its entries are those of that call. So such a call

* matches the inputs against the recorded signature (any difference: the full call serves);
* allocates the outputs and temporaries with PyTorch's caching allocator on PyTorch's current
  stream, so that their memory is reused only after this call's kernels (stream order), as
  PyTorch's own operators do;
* launches every phase on that stream and returns without waiting, like a PyTorch operator.

The error record passed is a per-device word that no entry reads. A call with out=, keyword
sizes, host data or another array kind always takes the full path.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass

import numpy as np

from . import runtime as rt
from .arrays import torch_dtype
from .params import pack_pointers

MISSING = object()  # the fast path does not apply: take the full call
MAX_PLANS = 64  # signatures remembered per kernel


@dataclass(frozen=True)
class TorchCallPlan:
    """What a call with this signature needs: per layout tensor where its pointer comes from
    (`("in", i)`, `("out", j)` or `("tmp", k)`), the outputs' shapes and torch dtypes (`zero`: a
    `+=` without `!`), the temporaries' bytes and whether they start from zeros, the launches."""

    ordinal: int
    sources: tuple[tuple[str, int], ...]
    outputs: tuple[tuple[tuple[int, ...], object, bool], ...]
    temporaries: tuple[tuple[int, bool], ...]
    launches: tuple[tuple[object, int, int, str], ...]  # (CUfunction, grid, block, name)


def cannot_fail(ptx: str) -> bool:
    """No entry reads its last parameter, the error record: no run-time check can fail."""
    for entry, params in re.findall(r"\.entry\s+(\w+)\s*\((.*?)\)", ptx, re.S):
        last = len(re.findall(r"\.param\s", params)) - 1
        if re.search(rf"\[{entry}_param_{last}\]", ptx):
            return False
    return True


def signature(torch, inputs: tuple) -> tuple | None:
    """The inputs' (shape, dtype, device) when every one is a non-empty contiguous CUDA tensor."""
    key = []
    for x in inputs:
        if type(x) is not torch.Tensor or not x.is_cuda or not x.is_contiguous() or x.numel() == 0:
            return None
        key.append((tuple(x.shape), x.dtype, x.device.index or 0))
    return tuple(key)


def record(kernel, inputs: tuple, spec, module, sizes_shapes: dict) -> None:
    """After a successful full call with torch tensors: remember its plan for this signature, if
    it qualifies."""
    torch = sys.modules.get("torch")
    if torch is None or spec.can_fail:
        return
    key = signature(torch, inputs)
    if key is None:
        return
    interface = kernel.interface
    ins = {t.name: i for i, t in enumerate(interface.inputs)}
    outs = {t.name: j for j, t in enumerate(interface.outputs)}
    temps = {t.name: k for k, t in enumerate(interface.temporaries)}
    sources = []
    for name in spec.tensors:
        kind = "in" if name in ins else "out" if name in outs else "tmp"
        sources.append((kind, {"in": ins, "out": outs, "tmp": temps}[kind][name]))
    outputs = tuple(
        (
            tuple(sizes_shapes[t.name]),
            torch_dtype(torch, np.dtype(t.dtype.numpy_name)),
            t.name in interface.uninitialised,
        )
        for t in interface.outputs
    )
    temporaries = tuple(
        (
            max(
                1, int(np.prod(spec.storage[t.name], dtype=np.int64)) * np.dtype(t.dtype.numpy_name).itemsize
            ),
            t.name in interface.uninitialised,
        )
        for t in interface.temporaries
    )
    launches = tuple((module.function(name), grid, block, name) for name, grid, block in spec.launches)
    if len(kernel.torch_plans) >= MAX_PLANS:  # a kernel called with ever new shapes: start afresh
        kernel.torch_plans.clear()
    kernel.torch_plans[key] = TorchCallPlan(key[0][2], tuple(sources), outputs, temporaries, launches)


def torch_call(kernel, inputs: tuple):
    """The results of a call by a recorded plan, or MISSING."""
    torch = sys.modules.get("torch")
    if torch is None:
        return MISSING
    key = signature(torch, inputs)
    plan = kernel.torch_plans.get(key) if key is not None else None
    if plan is None:
        return MISSING
    dev = rt.device(plan.ordinal)
    where = inputs[0].device
    results = [
        (torch.zeros if zero else torch.empty)(shape, dtype=dtype, device=where)
        for shape, dtype, zero in plan.outputs
    ]
    scratch = [
        (torch.zeros if zero else torch.empty)(nbytes, dtype=torch.uint8, device=where)
        for nbytes, zero in plan.temporaries
    ]
    tensors = {"in": inputs, "out": results, "tmp": scratch}
    pointers = [tensors[kind][n].data_ptr() for kind, n in plan.sources]
    params = pack_pointers(pointers, dev.unread_error_record())
    stream = int(torch.cuda.current_stream(plan.ordinal).cuda_stream)
    for function, grid, block, name in plan.launches:
        dev.launch(function, grid, block, params, stream, name)
    return results[0] if len(results) == 1 else tuple(results)
