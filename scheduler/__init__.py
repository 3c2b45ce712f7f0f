"""scheduler: Scop → Schedule (fusion regions, isl scheduling per region, post-passes, safe fallback)."""

from .options import ScheduleOptions, default_threads

__all__ = [
    "Schedule",
    "ScheduleOptions",
    "compute_schedule",
    "default_threads",
    "padded_schedule",
    "textual_schedule",
]


def __getattr__(name: str):
    # the scheduling modules (islpy) load on first use: the options are all that a process whose
    # kernels come from the compilation cache needs (codegen/runtime/warm.py)
    if name in ("Schedule", "compute_schedule", "padded_schedule", "textual_schedule"):
        from . import schedule

        return getattr(schedule, name)
    raise AttributeError(f"module 'scheduler' has no attribute {name!r}")
