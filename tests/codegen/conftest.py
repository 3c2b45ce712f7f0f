"""Fixtures shared by the codegen tests."""

from __future__ import annotations

import pytest


@pytest.fixture
def run_phases_calls(monkeypatch) -> dict:
    """What the kernels' run_phases is called with next (entry, buffers_for, params, plans,
    workspaces: the last call's), with every phase worth threads (MIN_PARALLEL_WORK 0)."""
    import codegen.runtime.parallel
    from codegen.runtime import kernel as kernel_module

    monkeypatch.setattr(codegen.runtime.parallel, "MIN_PARALLEL_WORK", 0)
    seen: dict = {}
    real = kernel_module.run_phases

    def spy(entry, buffers_for, params, plans, threads, workspaces):
        seen.update(entry=entry, buffers_for=buffers_for, params=params, plans=plans, workspaces=workspaces)
        return real(entry, buffers_for, params, plans, threads, workspaces)

    monkeypatch.setattr(kernel_module, "run_phases", spy)
    return seen
