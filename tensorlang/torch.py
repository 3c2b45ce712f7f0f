"""torch: tensorlang source → PyTorch custom operators (`tensorlang.torch.op`), a thin front for codegen/interop/torch_op.py.

`import tensorlang` never imports torch; `import tensorlang.torch` does (install the extra:
`pip install tensorlang[torch]`). The implementation lives in codegen (it compiles kernels), reached
through the package's lazy re-export, as `tl.compile` is.
"""

from __future__ import annotations

try:
    import torch as _torch  # noqa: F401 -- fail here, with the remedy, rather than at the first op
except ImportError as exc:  # pragma: no cover - exercised only without torch
    raise ImportError("tensorlang.torch needs PyTorch: pip install 'tensorlang[torch]'") from exc

__all__ = ["op"]


def op(source: str, name: str | None = None, *, options=None):
    """A `torch.library.custom_op` computing def `name` of `source` on CPU tensors, with a fake
    (meta) kernel from range inference and autograd from `tl.grad`'s program; the same source,
    name and options give the same operator. See README, "PyTorch"."""
    from tensorlang import _torch_op

    return _torch_op(source, name, options=options)
