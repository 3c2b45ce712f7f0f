"""emit: the layout of the block a team of threads shares for one cooperative GEMM call (no LLVM: the runtime reads it too)."""

from __future__ import annotations

from ..host import gemm_blocking, gemm_workspace_layout
from ..host.blocking import ELEMENT_BYTES

# The shared block of a cooperative call (64-byte aligned; the counters start at zero):
TEAM_TICKET = 0  # i64: the next task nobody has taken yet
TEAM_DONE = 64  # i64: tasks finished
TEAM_SIZE = 128  # i64: threads in the team (balances the row blocks; results do not depend on it)
TEAM_PANEL = 256  # the packed KC×NC panel of B all threads compute from


def gemm_team_bytes() -> int:
    """Bytes of the shared block: the header of counters, each on its own cache line, then one
    packed panel of B (the larger of the two precisions' panels, so that one size fits either)."""
    panels = []
    for dtype, size in ELEMENT_BYTES.items():
        _, b_off, total = gemm_workspace_layout(gemm_blocking(dtype), size)
        panels.append(total - b_off)
    return TEAM_PANEL + max(panels)
