"""Finite-difference checks of tl.grad programs (shared by the gradient tests): compile the forward
and its gradient program, then compare <dX, V> with the central difference of <dO, f(X + eps V)>
along a random direction V, in float64."""

from __future__ import annotations

import re
import warnings

import numpy as np

import tensorlang as tl


def as_double(source: str) -> str:
    """The program with every `float` type written `double` (finite differences need float64)."""
    return re.sub(r"\bfloat\b", "double", source)


def random_inputs(kernel_source: str, name, shapes: dict, rng, dtypes=None, ints=None) -> list:
    out = []
    for k, shape in shapes.items():
        dtype = (dtypes or {}).get(k, "float64")
        if np.dtype(dtype).kind in "iu":
            lo, hi = (ints or {}).get(k, (0, 4))
            out.append(rng.integers(lo, hi, size=shape).astype(dtype))
        else:
            out.append(rng.uniform(-1.0, 1.0, size=shape).astype(dtype))
    return out


def check(
    source: str,
    inputs: list,
    *,
    name=None,
    wrt=None,
    eps=1e-6,
    rtol=1e-6,
    atol=1e-9,
    seed=0,
    directions=2,
    scalars=None,
):
    """Assert that tl.grad's program matches central differences; returns the gradient text."""
    rng = np.random.default_rng(seed)
    scalars = scalars or {}
    forward = tl.compile(source, name=name)
    text = tl.grad(source, name, wrt=wrt)
    with warnings.catch_warnings():
        warnings.simplefilter("error", tl.TensorLangWarning)  # a gradient program never warns
        backward = tl.compile(text)
    outs = forward(*inputs, **scalars)
    outs = outs if isinstance(outs, tuple) else (outs,)
    float_outs = [o for o in outs if o.dtype.kind == "f"]
    adjoints = [rng.standard_normal(o.shape) for o in float_outs]
    with warnings.catch_warnings():
        warnings.simplefilter("error", tl.TensorLangWarning)
        grads = backward(*inputs, *adjoints, **scalars)
    grads = grads if isinstance(grads, tuple) else (grads,)
    names = _param_names(text)[: len(inputs)]
    float_names = [n for n, x in zip(names, inputs) if np.asarray(x).dtype.kind == "f"]
    wrt_names = (
        float_names
        if wrt is None
        else ([w.strip() for w in wrt.split(",")] if isinstance(wrt, str) else list(wrt))
    )
    assert len(grads) == len(wrt_names)
    for g, n in zip(grads, wrt_names):
        assert g.shape == np.shape(inputs[names.index(n)]), (n, g.shape)
    for _ in range(directions):
        vs = {n: rng.standard_normal(np.shape(inputs[names.index(n)])) for n in wrt_names}

        def f(t, vs=vs):
            moved = [x + t * vs[n] if n in vs else x for n, x in zip(names, inputs)]
            moved = [
                np.float64(m) if np.ndim(m) == 0 and np.asarray(m).dtype.kind == "f" else m for m in moved
            ]
            o = forward(*moved, **scalars)
            o = o if isinstance(o, tuple) else (o,)
            return sum(
                float(np.sum(a * ob)) for a, ob in zip(adjoints, [x for x in o if x.dtype.kind == "f"])
            )

        numeric = (f(eps) - f(-eps)) / (2 * eps)
        analytic = sum(float(np.sum(g * vs[n])) for g, n in zip(grads, wrt_names))
        assert abs(numeric - analytic) <= atol + rtol * max(abs(numeric), abs(analytic), 1.0), (
            numeric,
            analytic,
            text,
        )
    return text


def _param_names(text: str) -> list[str]:
    head = text[text.index("(") + 1 : text.index("->")]
    head = head[: head.rindex(")")]
    depth, parts, cur = 0, [], ""
    for ch in head:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    return [p.split()[-1] for p in parts if p.strip()]
