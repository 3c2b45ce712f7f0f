"""host facts: cache sizes and vector width → the blocking of the packed GEMM (register tile, KC/MC/NC)."""

from __future__ import annotations

import functools
from dataclasses import dataclass

from .cpu import cache_size, host_has_avx512

ELEMENT_BYTES = {"float32": 4, "float64": 8}


@dataclass(frozen=True)
class GemmBlocking:
    """Blocking of one GEMM: an MR×(NV·VW) register tile, KC/MC/NC cache blocks (elements)."""

    vw: int  # vector lanes
    mr: int  # rows of C per micro-tile (broadcast A)
    nv: int  # vectors of C per micro-tile row
    kc: int
    mc: int  # multiple of mr
    nc: int  # multiple of nr
    unroll: int = 4  # k-loop unrolling of the micro-kernel
    prefetch_c: bool = False  # prefetch the C tile before the k loop

    @property
    def nr(self) -> int:
        return self.nv * self.vw


def _round(x: int, multiple: int) -> int:
    return max(multiple, x // multiple * multiple)


def gemm_blocking(dtype: str) -> GemmBlocking:
    """The blocking used for `dtype` on this host (read afresh from the host facts each time, so
    that pinned facts take effect; `_blocking` caches the arithmetic)."""
    return _blocking(dtype, cache_size(1), cache_size(2), host_has_avx512())


@functools.cache
def _blocking(dtype: str, l1: int, l2: int, avx512: bool) -> GemmBlocking:
    size = ELEMENT_BYTES[dtype]
    if avx512:
        vw, mr, nv = 64 // size, 6, 4  # 24 zmm accumulators + 4 B vectors + broadcast
    else:
        vw, mr, nv = 32 // size, 6, 2  # 12 ymm accumulators + 2 B vectors + broadcast
    nr = vw * nv
    # KC: the KC×NR micro-panel of B is reused by every MR strip of A; measured best when it is about
    # 4/3 of L1 (256 on a 48 KiB L1 for both precisions): larger KC halves the C tile traffic
    kc = _round(l1 * 4 // 3 // (nr * size), 16)
    kc = min(max(kc, 64), 384)
    # MC: the MC×KC block of A stays in L2 next to the B panel (an eighth of L2; 120..480 rows measured
    # equal at 512-2048)
    mc = min(_round(l2 // 8 // (kc * size), mr), 80 * mr)
    # NC: the KC×NC panel of B takes half of L2 (1024..4096 columns measured equal), which keeps the
    # workspace small
    nc = min(max(_round(l2 // 2 // (kc * size), nr), 4 * nr), 4096)
    return GemmBlocking(vw=vw, mr=mr, nv=nv, kc=kc, mc=mc, nc=nc, prefetch_c=True)


def gemm_workspace_layout(cfg: GemmBlocking, size: int) -> tuple[int, int, int]:
    """(offset of packed A, offset of packed B, total bytes), 64-byte aligned parts."""
    a_bytes = cfg.mc * cfg.kc * size
    b_bytes = cfg.nc * cfg.kc * size
    a_bytes = (a_bytes + 63) // 64 * 64
    b_bytes = (b_bytes + 63) // 64 * 64
    return 0, a_bytes, a_bytes + b_bytes


def workspace_bytes(dtype: str) -> int:
    """Bytes of scratch (packed A block and B panel) one call of tl_gemm_<dtype> needs."""
    return gemm_workspace_layout(gemm_blocking(dtype), ELEMENT_BYTES[dtype])[2]
