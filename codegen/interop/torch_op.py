"""interop: tensorlang source → a `torch.library.custom_op` with a fake kernel and derived autograd (`tensorlang.torch.op`).

`op(source, name=None, *, options=None)` compiles the def and registers it as the operator
`tensorlang::<def>_<hash>` (the hash of source, name and options: one operator per distinct
program; asking again returns the same one) with
- a CPU kernel: the inputs are viewed through DLPack (no copy for contiguous tensors), the
  outputs wrapped with `torch.from_numpy` (no copy);
- a fake kernel: output shapes from range inference (`Kernel.output_shapes`), nothing compiled;
- autograd: the backward is a second custom op, `<op>_grad`, compiled from `tl.grad`'s program
  (`def f_grad(inputs, d<outputs>) -> (d<float inputs>)`); setup_context saves only the inputs
  that program reads (the others are passed as uninitialised placeholders of their shape), so
  `torch.compile` traces forward and backward through the fake kernels without graph breaks.
Only this module (and so only `import tensorlang.torch`) imports torch.
"""

from __future__ import annotations

import dataclasses
import hashlib
import keyword
import threading

import numpy as np
import torch

from tensorlang import ir
from tensorlang.errors import ArgumentError, TensorLangError

from ..driver import compile as tl_compile
from ..options import Options
from ..runtime.kernel import Kernel

NAMESPACE = "tensorlang"
_OPS: dict[str, object] = {}
_LOCK = threading.Lock()


def op(source: str, name: str | None = None, *, options: Options | None = None):
    """A PyTorch operator (a `torch.library.CustomOpDef`, called on CPU tensors) computing def
    `name` of `source`; see the module doc. Its `.kernel` is the forward Kernel."""
    if not isinstance(source, str):
        raise TensorLangError(
            f"tensorlang.torch.op expects the source text as a str, got {type(source).__name__}"
        )
    digest = hashlib.sha256(repr((source, name, options)).encode()).hexdigest()[:12]
    with _LOCK:
        if digest in _OPS:
            return _OPS[digest]
        kernel = tl_compile(source, name, options=options)
        qualname = f"{NAMESPACE}::{_identifier(kernel.name)}_{digest}"
        custom = _register(qualname, kernel)
        backward = _backward(source, kernel, qualname, options)
        if backward is not None:
            custom.register_autograd(backward.backward, setup_context=backward.setup_context)
        _OPS[digest] = custom
        return custom


def _identifier(text: str, fallback: str = "x") -> str:
    ok = text.isidentifier() and not keyword.iskeyword(text) and text not in {"self", "out"}
    return text if ok else fallback


def _torch_dtype(tensor) -> torch.dtype:
    return getattr(torch, np.dtype(tensor.dtype.numpy_name).name)


def _register(qualname: str, kernel: Kernel):
    """The custom op of one Kernel: schema, CPU kernel and fake kernel (no autograd)."""
    interface = kernel.interface
    missing = _sizes_without_input(kernel)
    if missing:
        raise TensorLangError(
            f"tensorlang.torch.op: {kernel.name} has sizes that no input's shape gives "
            f"({', '.join(missing)}); an op's sizes must come from its inputs"
        )
    arg_names = [_identifier(t.name, f"in{i}") for i, t in enumerate(interface.inputs)]
    if len(set(arg_names)) != len(arg_names):
        arg_names = [f"in{i}" for i in range(len(arg_names))]
    returns = (
        "Tensor" if len(interface.outputs) == 1 else f"({', '.join('Tensor' for _ in interface.outputs)})"
    )
    schema = f"({', '.join(f'Tensor {n}' for n in arg_names)}) -> {returns}"
    dtypes = [_torch_dtype(t) for t in interface.outputs]
    single = len(interface.outputs) == 1

    def forward(*tensors: torch.Tensor):
        _check_dtypes(kernel, tensors)
        result = kernel(*(t.detach() for t in tensors))
        results = (result,) if single else result
        wrapped = tuple(torch.from_numpy(r) for r in results)
        return wrapped[0] if single else wrapped

    def fake(*tensors: torch.Tensor):
        _check_dtypes(kernel, tensors)
        shapes = kernel.output_shapes(*(tuple(int(d) for d in t.shape) for t in tensors))
        device = tensors[0].device if tensors else torch.device("cpu")  # "meta" for meta tensors
        made = tuple(torch.empty(s, dtype=d, device=device) for s, d in zip(shapes, dtypes))
        return made[0] if single else made

    custom = torch.library.custom_op(qualname, forward, mutates_args=(), device_types="cpu", schema=schema)
    custom.register_fake(fake)
    custom.kernel = kernel
    return custom


def _sizes_without_input(kernel: Kernel) -> list[str]:
    given = {value for dims in kernel.interface.input_dims for kind, value in dims if kind == "size"}
    return [s for s in kernel.interface.sizes if s not in given]


def _check_dtypes(kernel: Kernel, tensors) -> None:
    interface = kernel.interface
    if len(tensors) != len(interface.inputs):
        return  # the kernel's own error
    for t, tensor in zip(interface.inputs, tensors):
        expected = _torch_dtype(t)
        if tensor.dtype != expected:
            raise ArgumentError(
                f"{interface.name}: input {t.name} expected type {t.dtype} ({expected}) but found "
                f"{tensor.dtype} (tensorlang never casts silently; convert with .to({expected}))"
            )


class _Backward:
    """setup_context and backward of an op: the gradient program as an op of its own."""

    def __init__(
        self, kernel: Kernel, grad_op, float_inputs: list[int], float_outputs: list[int], read: set[int]
    ):
        self.kernel = kernel
        self.grad_op = grad_op
        self.float_inputs = float_inputs  # forward input positions the gradient program returns
        self.float_outputs = float_outputs  # forward output positions that have an adjoint
        self.read = read  # forward input positions the gradient program reads

    def setup_context(self, ctx, inputs, output) -> None:
        saved = [x for i, x in enumerate(inputs) if i in self.read]
        ctx.save_for_backward(*saved)
        ctx.input_meta = [(x.shape, x.dtype) for x in inputs]

    def backward(self, ctx, *grads):
        saved = iter(ctx.saved_tensors)
        inputs = [
            next(saved) if i in self.read else torch.empty(shape, dtype=dtype)
            for i, (shape, dtype) in enumerate(ctx.input_meta)
        ]
        adjoints = []
        for i in self.float_outputs:
            g = grads[i]
            if g is None:  # not materialised: a zero adjoint
                shape = self.kernel.output_shapes(*(tuple(int(d) for d in s) for s, _ in ctx.input_meta))[i]
                g = torch.zeros(shape, dtype=_torch_dtype(self.kernel.interface.outputs[i]))
            adjoints.append(g)
        result = self.grad_op(*inputs, *adjoints)
        result = (result,) if len(self.float_inputs) == 1 else result
        gradients: list[torch.Tensor | None] = [None] * len(inputs)
        for position, gradient in zip(self.float_inputs, result):
            if ctx.needs_input_grad[position]:
                gradients[position] = gradient
        return tuple(gradients)


def _backward(source: str, kernel: Kernel, qualname: str, options: Options | None) -> _Backward | None:
    """The autograd of an op, or None when nothing is differentiable (no floating-point input
    or output). A def tl.grad cannot differentiate gets a backward that raises its error."""
    from tensorlang.autodiff import grad

    interface = kernel.interface
    float_inputs = [i for i, t in enumerate(interface.inputs) if t.dtype.is_float]
    float_outputs = [i for i, t in enumerate(interface.outputs) if t.dtype.is_float]
    if not float_inputs or not float_outputs:
        return None
    try:
        grad_source = grad(source, kernel.name, wrt=[interface.inputs[i].name for i in float_inputs])
        grad_kernel = tl_compile(grad_source, options=options)
    except TensorLangError as exc:
        return _Unavailable(kernel, exc)
    g = grad_kernel.interface
    if len(g.inputs) != len(interface.inputs) + len(float_outputs) or len(g.outputs) != len(float_inputs):
        raise TensorLangError(
            f"internal error: {grad_kernel.name}'s signature does not match {kernel.name}'s"
        )
    read_names: set[str] = set()
    for st in grad_kernel.program.statements:
        _reads(st, read_names)
    read = {i for i, t in enumerate(g.inputs[: len(interface.inputs)]) if t.name in read_names}
    grad_op = _register(f"{qualname}_grad", grad_kernel)
    return _Backward(kernel, grad_op, float_inputs, float_outputs, read)


def _reads(value: object, found: set[str]) -> None:
    """The tensors read anywhere in a statement: its right-hand side, and the index expressions
    of a scatter's left-hand side (`dX(Idx(j)) +=! ...` reads Idx) or of anything else it holds."""
    if isinstance(value, ir.Read):
        found.add(value.tensor)
    if isinstance(value, tuple | list):
        for item in value:
            _reads(item, found)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for f in dataclasses.fields(value):
            _reads(getattr(value, f.name), found)


class _Unavailable(_Backward):
    def __init__(self, kernel: Kernel, error: TensorLangError):
        self.kernel = kernel
        self.error = error

    def setup_context(self, ctx, inputs, output) -> None:
        pass

    def backward(self, ctx, *grads):
        raise TensorLangError(f"{self.kernel.name}: no gradient: {self.error}")
