"""scheduler: the loop-order and per-band tile knobs (Options.loop_order, band_tiles) → a band's member order and tile sizes.

The post-pass (postpass.optimise_tree) orders each permutable band by its cost model and tiles it
with `tile` (or its own choice). These knobs replace the two choices, band by band, for the
tuner. Legality: `loop_order` only permutes the members of a band isl marked permutable, and in
a permutable band every dependence is non-negative in every member, so every order of them is
legal (the same argument that lets the cost model reorder them). A permutation of another
length than the band's leaves that band to the cost model; anything but a permutation of
0..n-1 is rejected when Options are made (check_loop_order).
"""

from __future__ import annotations

from collections.abc import Sequence

from tensorlang.errors import TensorLangError


def check_loop_order(value: object) -> tuple[int, ...] | None:
    """Options.loop_order validated: None, or a permutation of 0..n-1 (n ≥ 2) as a tuple."""
    if value is None:
        return None
    if (
        isinstance(value, tuple | list)
        and len(value) >= 2
        and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
        and sorted(value) == list(range(len(value)))
    ):
        return tuple(value)
    raise TensorLangError(f"Options.loop_order must be a permutation of 0..n-1 (n >= 2), got {value!r}")


def check_band_tiles(value: object) -> tuple[tuple[int, ...] | None, ...] | None:
    """Options.band_tiles validated: None, or per band None or positive tile sizes (tuples)."""
    if value is None:
        return None
    if isinstance(value, tuple | list):
        out: list[tuple[int, ...] | None] = []
        for entry in value:
            if entry is None:
                out.append(None)
            elif isinstance(entry, int) and not isinstance(entry, bool) and entry >= 1:
                out.append((entry,))
            elif (
                isinstance(entry, tuple | list)
                and entry
                and all(isinstance(t, int) and not isinstance(t, bool) and t >= 1 for t in entry)
            ):
                out.append(tuple(entry))
            else:
                break
        else:
            return tuple(out)
    raise TensorLangError(
        f"Options.band_tiles must be a sequence of None or positive tile sizes per band, got {value!r}"
    )


def member_order(heuristic: Sequence[int], loop_order: tuple[int, ...] | None) -> list[int]:
    """The band's member order: the cost model's (`heuristic`, outermost first), or, for a band
    of len(loop_order) members, its members in the order loop_order gives as positions in the
    cost model's order (the identity permutation is the cost model's order)."""
    if loop_order is None or len(loop_order) != len(heuristic):
        return list(heuristic)
    return [heuristic[p] for p in loop_order]


def band_tile(
    band_tiles: tuple[tuple[int, ...] | None, ...] | None, index: int, default: tuple[int, ...] | None
) -> tuple[tuple[int, ...] | None, bool]:
    """(tile sizes, explicit) for the `index`-th permutable band of ≥ 2 members the post-pass
    visits (bottom-up, children first): band_tiles' entry when it has one that is not None,
    else `default` (Options.tile; None lets the post-pass choose)."""
    if band_tiles is not None and index < len(band_tiles) and band_tiles[index] is not None:
        return band_tiles[index], True
    return default, default is not None
