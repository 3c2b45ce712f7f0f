"""tune: a program and example inputs → the Options that measured search finds fastest, kept in a database that tl.compile reads.

Modules: key.py (what a record is keyed by, the knobs it may set), database.py (SQLite in the
cache directory), space.py (the knobs' candidate values, mutation), measure.py (one candidate in
its own process: compile, check against the default's outputs, time), search.py (evolutionary
search over measured candidates), lookup.py (the Kernel's hook: the best record for a call),
api.py (`tl.tune`, `TuneResult`).
"""

from __future__ import annotations

__all__ = ["TuneResult", "tune"]


def __getattr__(name: str):
    if name in __all__:
        from . import api

        return getattr(api, name)
    raise AttributeError(f"module 'codegen.tune' has no attribute {name!r}")
