"""tune: a kernel's default schedule and sizes → the space of knobs to search (candidate values, sampling, mutation).

The knobs are the ones tensorlang exposes that change the generated code (key.TUNED_KNOBS), each
a choice the plan makes:
- fusion (auto / max / none): the regions the statements are scheduled in;
- tile: tile sizes of the permutable bands (one per member of the deepest one; values: powers of
  two from 4, divisors of the sizes, up to 256; or None, the scheduler's own choice), and
  band_tiles: sizes for one band at a time where the schedule has several;
- loop_order: a permutation of the members of the permutable bands of the deepest band's
  length (only permutable bands are reordered, where every order is legal: scheduler/order.py);
- unroll-and-jam (None, 2, 4, 8); vectorize, and vector_width (the vector register width the
  vectorisers use, 128/256/512 bits);
- gemm_blocking: the MC/NC/KC cache blocks of the packed GEMM, when the plan calls one (steps of
  2× around the host's blocking);
- row pipelining and prefetching;
- direct_conv: a convolution-shaped contraction as the register-tiled direct convolution or on
  the GEMM path, offered when the default plan runs one directly;
- thread_split: the plan's split of each phase over the threads, or "serial" (every phase on the
  calling thread: no dispatch), offered when the key has more than one thread. Which loop the
  threads split follows loop_order (the outermost parallel member).
The thread count is not a knob: it is part of the key (a record is for one thread count).
"""

from __future__ import annotations

import itertools
import random
import re
from collections.abc import Mapping
from dataclasses import dataclass

from . import key as key_

MAX_TILE = 256
UNROLLS = (None, 2, 4, 8)
FUSIONS = ("auto", "max", "none")
VECTOR_WIDTHS = (None, 128, 256, 512)
THREAD_SPLITS = (None, "serial")
# the knobs mutate picks from, and how often (tiles: the largest part of the space)
_WEIGHTS = {
    "tile": 5,
    "fusion": 2,
    "unroll": 3,
    "vectorize": 1,
    "pipeline": 1,
    "prefetch": 1,
    "loop_order": 2,
    "band_tiles": 2,
    "vector_width": 1,
    "gemm_blocking": 3,
    "thread_split": 1,
    "direct_conv": 2,
}


@dataclass(frozen=True)
class Space:
    depth: int  # members of the deepest permutable band: the length of a tile tuple
    tiles: tuple[int, ...]  # candidate tile sizes, ascending
    bands: tuple[int, ...] = ()  # members of each outermost permutable band (band_tiles' entries)
    gemm: tuple[int, int, int] | None = None  # the host's (MC, NC, KC) when the plan calls a GEMM
    threads: int = 1  # the key's thread count (thread_split is a choice only with several)
    conv: bool = False  # the default plan runs a direct convolution (direct_conv is a choice)

    def default(self) -> dict:
        return key_.knobs_json(key_.Options())

    @property
    def orders(self) -> list[list[int] | None]:
        """loop_order values: None (the cost model's) and the other permutations of `depth`."""
        perms = [list(p) for p in itertools.permutations(range(self.depth))][1:] if self.depth >= 2 else []
        return [None, *perms]

    @property
    def blockings(self) -> list[list[int] | None]:
        if self.gemm is None:
            return [None]
        mc, nc, kc = self.gemm
        grid = itertools.product((mc // 2, mc, mc * 2), (nc // 4, nc // 2, nc), (kc // 2, kc, kc * 3 // 2))
        return [None] + [list(b) for b in grid if list(b) != [mc, nc, kc]]

    def _knobs(self) -> list[str]:
        out = list(key_.TUNED_KNOBS)
        if self.depth < 2:
            out.remove("loop_order")
        if len(self.bands) < 2:
            out.remove("band_tiles")
        if self.gemm is None:
            out.remove("gemm_blocking")
        if self.threads < 2:
            out.remove("thread_split")
        if not self.conv:
            out.remove("direct_conv")
        return [k for k in out if k in _WEIGHTS]

    def sample(self, rng: random.Random) -> dict:
        tile = None if rng.random() < 0.25 else [rng.choice(self.tiles) for _ in range(self.depth)]
        out = {
            **self.default(),
            "tile": tile,
            "fusion": rng.choice(FUSIONS),
            "unroll": rng.choice(UNROLLS),
            "vectorize": rng.random() < 0.85,
            "pipeline": rng.random() < 0.7,
            "prefetch": rng.random() < 0.3,
            "loop_order": rng.choice(self.orders) if rng.random() < 0.5 else None,
            "vector_width": rng.choice(VECTOR_WIDTHS),
            "gemm_blocking": rng.choice(self.blockings),
            "thread_split": rng.choice(THREAD_SPLITS) if self.threads > 1 else None,
            "direct_conv": rng.random() < 0.5 if self.conv else True,
        }
        if len(self.bands) >= 2 and rng.random() < 0.3:
            out["band_tiles"] = [
                None if rng.random() < 0.5 else [rng.choice(self.tiles)] * n for n in self.bands
            ]
        return out

    def neighbours(self, knobs: Mapping) -> list[dict]:
        """Each knob one step away (TC's and the research note's first population)."""
        knobs = key_.normalise(dict(knobs))
        out = []
        if knobs["tile"] is None:
            for t in self.tiles:
                out.append({**knobs, "tile": [t] * self.depth})
        else:
            for m in range(len(knobs["tile"])):
                for step in (-1, 1):
                    out.append({**knobs, "tile": self._step_tile(knobs["tile"], m, step)})
            out.append({**knobs, "tile": None})
        for f in FUSIONS:
            out.append({**knobs, "fusion": f})
        for u in UNROLLS:
            out.append({**knobs, "unroll": u})
        for b in ("vectorize", "pipeline", "prefetch"):
            out.append({**knobs, b: not knobs[b]})
        for order in self.orders:
            out.append({**knobs, "loop_order": order})
        for w in VECTOR_WIDTHS:
            out.append({**knobs, "vector_width": w})
        out += [{**knobs, "gemm_blocking": b} for b in self._near_blockings(knobs["gemm_blocking"])]
        if self.threads > 1:
            out += [{**knobs, "thread_split": t} for t in THREAD_SPLITS]
        if self.conv:
            out.append({**knobs, "direct_conv": not knobs["direct_conv"]})
        if len(self.bands) >= 2:
            for i, n in enumerate(self.bands):
                for t in (16, 64):
                    out.append({**knobs, "band_tiles": self._set_band(knobs["band_tiles"], i, [t] * n)})
        return [k for k in out if k != knobs]

    def mutate(self, knobs: Mapping, rng: random.Random) -> dict:
        """One or two knobs changed at random."""
        child = key_.normalise(dict(knobs))
        names = self._knobs()
        for _ in range(1 if rng.random() < 0.6 else 2):
            which = rng.choices(names, [_WEIGHTS[n] for n in names])[0]
            if which == "tile":
                if child["tile"] is None or rng.random() < 0.15:
                    child["tile"] = (
                        None if child["tile"] is not None else [rng.choice(self.tiles)] * self.depth
                    )
                else:
                    m = rng.randrange(len(child["tile"]))
                    child["tile"] = self._step_tile(child["tile"], m, rng.choice((-2, -1, 1, 2)))
            elif which == "fusion":
                child["fusion"] = rng.choice([f for f in FUSIONS if f != child["fusion"]])
            elif which == "unroll":
                child["unroll"] = rng.choice([u for u in UNROLLS if u != child["unroll"]])
            elif which == "loop_order":
                child["loop_order"] = rng.choice([o for o in self.orders if o != child["loop_order"]])
            elif which == "vector_width":
                child["vector_width"] = rng.choice([w for w in VECTOR_WIDTHS if w != child["vector_width"]])
            elif which == "gemm_blocking":
                near = self._near_blockings(child["gemm_blocking"])
                child["gemm_blocking"] = rng.choice(near) if near else None
            elif which == "thread_split":
                child["thread_split"] = "serial" if child["thread_split"] is None else None
            elif which == "band_tiles":
                i = rng.randrange(len(self.bands))
                value = None if rng.random() < 0.3 else [rng.choice(self.tiles)] * self.bands[i]
                child["band_tiles"] = self._set_band(child["band_tiles"], i, value)
            else:
                child[which] = not child[which]
        return child

    def crossover(self, a: Mapping, b: Mapping, rng: random.Random) -> dict:
        a, b = key_.normalise(dict(a)), key_.normalise(dict(b))
        return {k: (a if rng.random() < 0.5 else b)[k] for k in a}

    def _step_tile(self, tile: list, member: int, step: int) -> list:
        values = self.tiles
        current = tile[member]
        i = min(range(len(values)), key=lambda j: abs(values[j] - current))
        new = list(tile)
        new[member] = values[max(0, min(len(values) - 1, i + step))]
        return new

    def _near_blockings(self, current: list | None) -> list[list[int] | None]:
        """Blockings one block one step (×2 or ÷2) from `current` (the host's when None)."""
        if self.gemm is None:
            return []
        base = list(current) if current is not None else list(self.gemm)
        out: list[list[int] | None] = [] if current is None else [None]
        for m in range(3):
            for factor in (0.5, 2.0):
                new = list(base)
                new[m] = max(16, int(base[m] * factor))
                if new != list(self.gemm) and new != base:
                    out.append(new)
        return out

    def _set_band(self, current: list | None, index: int, value: list | None) -> list | None:
        entries = list(current) if current is not None else [None] * len(self.bands)
        entries += [None] * (len(self.bands) - len(entries))
        entries[index] = value
        return None if all(e is None for e in entries) else entries


_NODE = re.compile(
    r"^(\s*)(?:- )?(schedule|sequence|set|filter|mark|domain|context|guard|extension|expansion):"
)


def permutable_bands(schedule_text: str) -> list[int]:
    """Members of each permutable band in a printed schedule tree, in order, leaving out a band
    whose parent is a permutable band too (the point band under a tile band, an unroll band)."""
    nodes: list[tuple[int, str, int, bool]] = []  # indent, kind, members, permutable
    parents: list[int] = []
    stack: list[int] = []
    for line in schedule_text.splitlines():
        match = _NODE.match(line)
        if match:
            indent, kind = len(match.group(1)), match.group(2)
            while stack and nodes[stack[-1]][0] >= indent:
                stack.pop()
            members = (
                len(re.findall(r"\{", line.split("->", 1)[-1])) if kind == "schedule" and "->" in line else 0
            )
            parents.append(stack[-1] if stack else -1)
            nodes.append((indent, kind, members, False))
            stack.append(len(nodes) - 1)
        elif line.strip().startswith("permutable: 1") and nodes and nodes[-1][1] == "schedule":
            nodes[-1] = (*nodes[-1][:3], True)
    out = []
    for i, (_, kind, members, permutable) in enumerate(nodes):
        parent = parents[i]
        nested = parent >= 0 and nodes[parent][1] == "schedule" and nodes[parent][3]
        if kind == "schedule" and permutable and members >= 2 and not nested:
            out.append(members)
    return out


def band_depth(schedule_text: str) -> int:
    """Members of the deepest permutable band in a printed schedule tree (1 at least, 3 at most)."""
    depth, pending = 1, 0
    for line in schedule_text.splitlines():
        text = line.strip()
        if text.startswith("schedule:"):
            pending = len(re.findall(r"\{", text.split("->", 1)[-1])) if "->" in text else 0
        elif text.startswith("permutable: 1") and pending:
            depth = max(depth, pending)
            pending = 0
    return min(depth, 3)


def tile_values(sizes: Mapping[str, int]) -> tuple[int, ...]:
    """Powers of two from 4, and the largest few divisors of each size, up to MAX_TILE (and no
    larger than the largest size)."""
    largest = max(list(sizes.values()) + [4])
    values = {p for p in (4, 8, 16, 32, 64, 128, 256) if p <= min(MAX_TILE, max(largest, 4))}
    for n in sizes.values():
        divisors = [d for d in range(4, min(MAX_TILE, n) + 1) if n % d == 0]
        values.update(divisors[-3:])
    return tuple(sorted(values))


def space_for(
    schedule_text: str,
    sizes: Mapping[str, int],
    gemm: tuple[int, int, int] | None = None,
    threads: int = 1,
    conv: bool = False,
) -> Space:
    """The space of a kernel: its default schedule's bands, its sizes' tiles, `gemm`, the host's
    (MC, NC, KC) when its default plan calls the packed GEMM (or could: `conv`, a direct
    convolution that direct_conv=False sends to the GEMM), and the key's thread count."""
    bands = tuple(min(n, 3) for n in permutable_bands(schedule_text))
    return Space(band_depth(schedule_text), tile_values(sizes), bands, gemm, threads, conv)
