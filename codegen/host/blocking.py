"""host facts: cache sizes and vector width → the blocking of the packed GEMM (register tile, KC/MC/NC).

A plan may choose another cache blocking (Options.gemm_blocking, a tuning knob): its GEMM is then a
*variant*, named "<dtype>@<mc>x<nc>x<kc>" (plain "<dtype>" is the host's blocking), compiled once
per process like the default one and called under its own symbol.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

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


def check_gemm_blocking(value: object) -> tuple[int, int, int] | None:
    """Options.gemm_blocking validated: None, or (MC, NC, KC) positive integers. Raises ValueError."""
    if value is None:
        return None
    ok = isinstance(value, tuple | list) and len(value) == 3
    if not ok or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in value):
        raise ValueError(f"Options.gemm_blocking must be (MC, NC, KC) positive integers, got {value!r}")
    return tuple(value)


def blocked(dtype: str, blocking: tuple[int, int, int] | None) -> GemmBlocking:
    """The host's blocking of `dtype` with the cache blocks (MC, NC, KC) of `blocking`, made legal
    for the micro-kernel and the team's shared block: MC rounded down to a multiple of MR, NC to
    a multiple of NR, KC to a multiple of 16 (at least one of each), and NC lowered until the
    KC×NC panel of B fits the panel of the host blocking (the block a team of threads shares,
    emit/gemm_team.py, is sized for that). Any MC/NC/KC computes the same sums in the same order
    per element of C, except that the K blocks split elsewhere: results differ only by rounding
    (the tuner and the tests compare within tolerance)."""
    base = gemm_blocking(dtype)
    if blocking is None:
        return base
    mc, nc, kc = blocking
    kc = _round(kc, 16)
    nc = _round(nc, base.nr)
    limit = base.kc * base.nc
    while kc * nc > limit and nc > base.nr:
        nc -= base.nr
    if kc * nc > limit:
        kc = _round(limit // nc, 16)
    return replace(base, mc=_round(mc, base.mr), nc=nc, kc=kc)


def gemm_variant(dtype: str, blocking: tuple[int, int, int] | None) -> str:
    """The name of the GEMM a plan calls: `dtype` for the host blocking, else
    "<dtype>@<mc>x<nc>x<kc>" with the blocks `blocked` makes legal."""
    cfg, base = blocked(dtype, blocking), gemm_blocking(dtype)
    if (cfg.mc, cfg.nc, cfg.kc) == (base.mc, base.nc, base.kc):
        return dtype
    return f"{dtype}@{cfg.mc}x{cfg.nc}x{cfg.kc}"


def variant_blocking(variant: str) -> tuple[str, GemmBlocking]:
    """(dtype, blocking) of a GEMM variant name (gemm_variant)."""
    dtype, _, blocks = variant.partition("@")
    if not blocks:
        return dtype, gemm_blocking(dtype)
    mc, nc, kc = (int(v) for v in blocks.split("x"))
    return dtype, blocked(dtype, (mc, nc, kc))


def gemm_workspace_layout(cfg: GemmBlocking, size: int) -> tuple[int, int, int]:
    """(offset of packed A, offset of packed B, total bytes), 64-byte aligned parts."""
    a_bytes = cfg.mc * cfg.kc * size
    b_bytes = cfg.nc * cfg.kc * size
    a_bytes = (a_bytes + 63) // 64 * 64
    b_bytes = (b_bytes + 63) // 64 * 64
    return 0, a_bytes, a_bytes + b_bytes


def workspace_bytes(dtype: str) -> int:
    """Bytes of scratch (packed A block and B panel) one call of tl_gemm_<dtype> needs (`dtype`
    may name a variant, gemm_variant)."""
    dtype, cfg = variant_blocking(dtype)
    return gemm_workspace_layout(cfg, ELEMENT_BYTES[dtype])[2]
