"""tune: a program, its sizes, dtypes, base options and the machine → the tuning database's key.

A record holds the knobs search varies (TUNED_KNOBS) as JSON; the other fields of the caller's
Options (fast_math: it changes results; the thread count: the plan's thread split and fusion
depend on it) are part of the key. The machine part is the disk cache's environment without the
hash of the compiler's sources: a record's options stay valid options across edits of the
compiler, and the tensorlang and LLVM versions are in it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence

from ..lowering import disk_cache
from ..options import Options

SPACE_VERSION = 1  # bump when the meaning of a record's options changes
# Version 1 records made before the plan-level knobs (loop_order ...) lack them: a missing knob
# reads as its default (from_knobs, normalise), which is what those records were measured with.
TUNED_KNOBS = (
    "tile",
    "fusion",
    "unroll",
    "vectorize",
    "pipeline",
    "prefetch",
    "loop_order",  # scheduler/order.py
    "band_tiles",  # scheduler/order.py
    "vector_width",  # lowering/vector_width.py
    "gemm_blocking",  # host/blocking.py
    "thread_split",  # planning/plan.py
    "direct_conv",  # polyhedral/convolution.py: the direct convolution or the GEMM path
)
_BOOLS = ("vectorize", "pipeline", "prefetch", "direct_conv")
MACHINE_FIELDS = ("triple", "cpu", "features", "caches", "gemm", "tensorlang", "llvmlite", "llvm", "python")
_DEFAULTS = Options()


def program_hash(source: str, name: str) -> str:
    return hashlib.sha256(source.encode() + b"\0" + name.encode()).hexdigest()


def machine() -> dict[str, object]:
    env = disk_cache.environment()
    return {k: env[k] for k in MACHINE_FIELDS if k in env}


def applies(options: Options) -> bool:
    """Whether a tuned record may replace these options' knobs: tuned on, an optimised
    specialised kernel, and the knobs search varies left at their defaults (a user's choice wins)."""
    return (
        options.tuned
        and options.optimize
        and options.specialize
        and all(getattr(options, k) == getattr(_DEFAULTS, k) for k in TUNED_KNOBS)
    )


def describe(
    source: str, name: str, sizes: Mapping[str, int], dtypes: Sequence[str], options: Options
) -> dict[str, object]:
    """The canonical description a key hashes (stored with the program for `tune --list`)."""
    return {
        "program": program_hash(source, name),
        "name": name,
        "sizes": {str(k): int(v) for k, v in sorted(sizes.items())},
        "dtypes": [str(d) for d in dtypes],
        "threads": options.thread_count(),
        "fast_math": options.fast_math,
        "machine": machine(),
        "space": SPACE_VERSION,
    }


def key_of(description: Mapping[str, object]) -> str:
    return hashlib.sha256(json.dumps(description, sort_keys=True, default=str).encode()).hexdigest()


def _json(value: object) -> object:
    return [_json(v) for v in value] if isinstance(value, tuple | list) else value


def _tuples(value: object) -> object:
    return tuple(_tuples(v) for v in value) if isinstance(value, list | tuple) else value


def knobs_json(options: Options) -> dict[str, object]:
    """The tuned knobs of `options` as a JSON object (tuples as lists, None as null)."""
    return {k: _json(getattr(options, k)) for k in TUNED_KNOBS}


def normalise(knobs: dict) -> dict:
    """A record's knobs with every knob present (older records lack the later knobs: defaults)."""
    return {**knobs_json(_DEFAULTS), **knobs}


def from_knobs(knobs: object, base: Options) -> Options:
    """`base` with the knobs of a record. Raises ValueError for anything but a JSON object of
    known knobs with valid values (a corrupt or foreign record)."""
    if not isinstance(knobs, dict) or not set(knobs) <= set(TUNED_KNOBS):
        raise ValueError(f"not a record of tuned knobs: {knobs!r}")
    fields = {f: getattr(base, f) for f in Options.__dataclass_fields__}
    for k, v in knobs.items():
        v = _tuples(v)
        if k in _BOOLS and not isinstance(v, bool):
            raise ValueError(f"{k} must be a bool, got {v!r}")
        fields[k] = v
    try:
        return Options(**fields)
    except Exception as exc:  # TensorLangError for bad values
        raise ValueError(str(exc)) from exc
