"""scheduler: the host's cache hierarchy (from /sys, with sane defaults) → sizes for tiling models."""

from __future__ import annotations

import functools
from pathlib import Path

_CACHE_DIR = Path("/sys/devices/system/cpu/cpu0/cache")
_DEFAULTS = {1: 32 << 10, 2: 1 << 20, 3: 8 << 20}


@functools.cache
def cache_size(level: int) -> int:
    """Bytes of the data (or unified) cache at `level` of one core; a default when unknown."""
    try:
        for index in sorted(_CACHE_DIR.glob("index*")):
            if int((index / "level").read_text()) != level:
                continue
            if (index / "type").read_text().strip() not in ("Data", "Unified"):
                continue
            text = (index / "size").read_text().strip().upper()
            scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1], 1)
            return int(text.rstrip("KMG")) * scale
    except (OSError, ValueError):
        pass
    return _DEFAULTS.get(level, 1 << 20)


@functools.cache
def cache_ways(level: int) -> int:
    """Associativity of the data (or unified) cache at `level` of one core; 8 when unknown."""
    try:
        for index in sorted(_CACHE_DIR.glob("index*")):
            if int((index / "level").read_text()) != level:
                continue
            if (index / "type").read_text().strip() not in ("Data", "Unified"):
                continue
            ways = int((index / "ways_of_associativity").read_text())
            return ways if ways > 0 else 8
    except (OSError, ValueError):
        pass
    return 8
