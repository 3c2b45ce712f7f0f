"""tune: a kernel's default schedule and sizes → the space of knobs to search (candidate values, sampling, mutation).

The knobs are the ones tensorlang exposes that change the generated code (key.TUNED_KNOBS):
fusion (auto / max / none), tile sizes of the outermost permutable bands (one per member of the
deepest one; values: powers of two from 4, divisors of the sizes, up to 256; or None, the
scheduler's own choice), unroll-and-jam (None, 2, 4, 8), vectorize, row pipelining and
prefetching. The thread count is not a knob: it is part of the key (a record is for one thread
count), and the thread split follows the plan.
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping
from dataclasses import dataclass

from . import key as key_

MAX_TILE = 256
UNROLLS = (None, 2, 4, 8)
FUSIONS = ("auto", "max", "none")


@dataclass(frozen=True)
class Space:
    depth: int  # members of the deepest permutable band: the length of a tile tuple
    tiles: tuple[int, ...]  # candidate tile sizes, ascending

    def default(self) -> dict:
        return key_.knobs_json(key_.Options())

    def sample(self, rng: random.Random) -> dict:
        tile = None if rng.random() < 0.25 else [rng.choice(self.tiles) for _ in range(self.depth)]
        return {
            "tile": tile,
            "fusion": rng.choice(FUSIONS),
            "unroll": rng.choice(UNROLLS),
            "vectorize": rng.random() < 0.85,
            "pipeline": rng.random() < 0.7,
            "prefetch": rng.random() < 0.3,
        }

    def neighbours(self, knobs: Mapping) -> list[dict]:
        """Each knob one step away (TC's and the research note's first population)."""
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
        return [k for k in out if k != dict(knobs)]

    def mutate(self, knobs: Mapping, rng: random.Random) -> dict:
        """One or two knobs changed at random (tile steps more often: the largest part of the space)."""
        child = dict(knobs)
        for _ in range(1 if rng.random() < 0.6 else 2):
            which = rng.choices(
                ("tile", "fusion", "unroll", "vectorize", "pipeline", "prefetch"), (5, 2, 3, 1, 1, 1)
            )[0]
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
            else:
                child[which] = not child[which]
        return child

    def crossover(self, a: Mapping, b: Mapping, rng: random.Random) -> dict:
        return {k: (a if rng.random() < 0.5 else b)[k] for k in a}

    def _step_tile(self, tile: list, member: int, step: int) -> list:
        values = self.tiles
        current = tile[member]
        i = min(range(len(values)), key=lambda j: abs(values[j] - current))
        new = list(tile)
        new[member] = values[max(0, min(len(values) - 1, i + step))]
        return new


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


def space_for(schedule_text: str, sizes: Mapping[str, int]) -> Space:
    return Space(band_depth(schedule_text), tile_values(sizes))
