"""scheduler: the host's cache hierarchy (from /sys, with sane defaults) → sizes for tiling models."""

from __future__ import annotations

import functools
from pathlib import Path

_CACHE_DIR = Path("/sys/devices/system/cpu/cpu0/cache")
_DEFAULTS = {1: 32 << 10, 2: 1 << 20, 3: 8 << 20}


def _cache_fact(level: int, name: str) -> str | None:
    """The text of `/sys/.../cache/index*/<name>` for the data (or unified) cache at `level`
    of one core, or None when /sys does not say."""
    try:
        for index in sorted(_CACHE_DIR.glob("index*")):
            if int((index / "level").read_text()) != level:
                continue
            if (index / "type").read_text().strip() not in ("Data", "Unified"):
                continue
            return (index / name).read_text().strip()
    except (OSError, ValueError):
        pass
    return None


@functools.cache
def cache_size(level: int) -> int:
    """Bytes of the data (or unified) cache at `level` of one core; a default when unknown."""
    text = (_cache_fact(level, "size") or "").upper()
    try:
        scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        return int(text.rstrip("KMG")) * scale
    except ValueError:
        return _DEFAULTS.get(level, 1 << 20)


@functools.cache
def cache_ways(level: int) -> int:
    """Associativity of the data (or unified) cache at `level` of one core; 8 when unknown."""
    try:
        ways = int(_cache_fact(level, "ways_of_associativity") or 0)
    except ValueError:
        ways = 0
    return ways if ways > 0 else 8
