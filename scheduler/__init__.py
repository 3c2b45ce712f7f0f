"""scheduler: Scop → Schedule (fusion regions, isl scheduling per region, post-passes, safe fallback)."""

from .options import ScheduleOptions, default_threads
from .schedule import Schedule, compute_schedule, textual_schedule

__all__ = ["Schedule", "ScheduleOptions", "compute_schedule", "default_threads", "textual_schedule"]
