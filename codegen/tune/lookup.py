"""tune: a Kernel's program, options and one call's sizes → the tuned Options the database holds for them (the Kernel's hook).

Kept apart from the tuner (no NumPy, no subprocesses): a Kernel asks once per set of sizes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ..lowering import disk_cache
from ..options import Options
from . import database
from . import key as key_


def tuned_record(
    source: str | None, name: str, options: Options, sizes: Mapping[str, int], dtypes: Sequence[object]
) -> tuple[int, Options] | None:
    """(the best record's trial id, the options to plan with), or None: no record, the cache off,
    `Options(tuned=False)`, knobs the user chose, or a kernel without source text."""
    if source is None or not key_.applies(options) or not disk_cache.enabled():
        return None
    if not database.default_path().exists():  # the common case: nothing ever tuned here
        return None
    description = key_.describe(source, name, sizes, [str(d) for d in dtypes], options)
    best = database.lookup_best(key_.key_of(description))
    if best is None:
        return None
    try:
        tuned = key_.from_knobs(best.knobs, options)
    except ValueError:
        return None
    return best.trial, tuned
