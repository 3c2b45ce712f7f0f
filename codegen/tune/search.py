"""tune: the space and the trials measured so far → the next candidates to measure (evolutionary search).

After the default, the first candidates are the default's neighbours (one knob one step away, as
TC's and Ansor's first populations); the seeds (the best records of an earlier run of the same
key) come first when there are any, so a second run starts from the best known record. Then each
proposal is, by chance: a random point of the space (ε-greedy, 5 %), a crossover of two
tournament winners (20 %), a neighbour of the best so far, or a mutation of a tournament winner
(tournaments of 3 among the 8 fastest). Candidates measured before (any status) are not proposed
again.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Mapping

from .space import Space

EPSILON = 0.05
CROSSOVER = 0.2
ELITE = 8


def canonical(knobs: Mapping) -> str:
    return json.dumps(dict(knobs), sort_keys=True)


class Search:
    def __init__(self, space: Space, rng: random.Random, seeds: list[dict] = ()):
        self.space = space
        self.rng = rng
        self.times: dict[str, float] = {}  # canonical knobs → seconds (inf: failed)
        self.knobs: dict[str, dict] = {}
        self._queue: list[dict] = list(seeds)
        neighbours = space.neighbours(space.default())
        rng.shuffle(neighbours)
        self._queue += neighbours
        self._best_expanded: set[str] = set()

    def record(self, knobs: Mapping, seconds: float | None) -> None:
        c = canonical(knobs)
        self.knobs[c] = dict(knobs)
        self.times[c] = math.inf if seconds is None else seconds

    def seen(self, knobs: Mapping) -> bool:
        return canonical(knobs) in self.times

    def ranked(self) -> list[tuple[float, dict]]:
        return sorted((t, self.knobs[c]) for c, t in self.times.items() if math.isfinite(t))

    def _tournament(self, elite: list[dict]) -> dict:
        picks = [self.rng.randrange(len(elite)) for _ in range(3)]
        return elite[min(picks)]

    def propose(self) -> dict | None:
        """The next candidate not measured yet, or None when none is found (a tiny space)."""
        for _ in range(200):
            candidate = self._one()
            if candidate is not None and not self.seen(candidate):
                return candidate
        return None

    def _one(self) -> dict | None:
        ranked = self.ranked()
        if ranked:  # the best so far changed: its neighbours go to the front of the queue
            c = canonical(ranked[0][1])
            if c not in self._best_expanded:
                self._best_expanded.add(c)
                near = self.space.neighbours(ranked[0][1])
                self.rng.shuffle(near)
                self._queue = near + self._queue
        while self._queue:
            candidate = self._queue.pop(0)
            if not self.seen(candidate):
                return candidate
        elite = [k for _, k in ranked[:ELITE]] or [self.space.default()]
        r = self.rng.random()
        if r < EPSILON:
            return self.space.sample(self.rng)
        if r < EPSILON + CROSSOVER and len(elite) >= 2:
            child = self.space.crossover(self._tournament(elite), self._tournament(elite), self.rng)
            return child if self.rng.random() < 0.5 else self.space.mutate(child, self.rng)
        return self.space.mutate(self._tournament(elite), self.rng)
