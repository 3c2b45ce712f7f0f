"""planning: a footprint's box at the first outer iteration → whether prefetching it pays (the size rule)."""

from __future__ import annotations

from tensorlang import ir

#: Footprints larger than this are not prefetched (they would not stay in L2 for long), nor
#: smaller ones: a few lines per iteration are what the hardware prefetcher streams well.
PREFETCH_MAX_BYTES = 256 << 10
PREFETCH_MIN_BYTES = 1 << 10


def worth_prefetching(lo: list[int], hi: list[int], extents: list[int], tensor: ir.Tensor) -> bool:
    """The box is contiguous enough (it covers at least half of the address range from its first
    to its last element) and small enough."""
    span, count, stride = 1, 1, 1
    for d in reversed(range(len(lo))):
        if hi[d] < lo[d]:
            return False
        span += (hi[d] - lo[d]) * stride
        count *= hi[d] - lo[d] + 1
        stride *= extents[d]
    return span <= 2 * count and PREFETCH_MIN_BYTES <= span * tensor.dtype.storage_bytes <= PREFETCH_MAX_BYTES
