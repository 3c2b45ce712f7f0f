"""autodiff: tensorlang source → the source of its reverse-mode gradient program (`tl.grad`).

A source-to-source transform on the checked front end (no islpy, no llvmlite): versions.py puts
the def in SSA form and recomputes the forward, rules.py differentiates one right-hand side,
invert.py turns each read's scatter into a gather, reverse.py visits the statements last to
first, emit.py prints readable statements, api.py ties them together.
"""

from __future__ import annotations

from .api import grad

__all__ = ["grad"]
