"""scheduler: Scop → Schedule (legal isl schedule trees; post-passes for speed come later)."""

from .schedule import Schedule, compute_schedule, textual_schedule

__all__ = ["Schedule", "compute_schedule", "textual_schedule"]
