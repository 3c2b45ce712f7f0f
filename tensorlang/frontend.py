"""frontend: source text → checked ir.Program (parse, select a def, check, infer ranges, verify)."""

from __future__ import annotations

from . import ir, syntax
from .checker import check_def
from .errors import SemanticError, Source
from .parser import parse


def parse_source(text: str, filename: str = "<source>") -> syntax.Module:
    """Parse every def of `text` (no semantic checks)."""
    return parse(Source(text, filename))


def def_names(text: str) -> list[str]:
    """The names of the defs in `text`, in source order."""
    return parse_source(text).def_names()


def check_source(text: str, name: str | None = None, filename: str = "<source>") -> ir.Program:
    """Parse `text`, check the def called `name` (the only def when None) and return its Program.

    Every def must parse, but only the selected one is checked.
    """
    source = Source(text, filename)
    module = parse(source)
    program = check_def(select_def(module, name), source)
    program.verify()
    return program


def select_def(module: syntax.Module, name: str | None) -> syntax.Def:
    names = module.def_names()
    if name is None:
        if len(module.defs) > 1:
            raise SemanticError(
                f"source holds several defs: {', '.join(names)}; pass name= to choose one",
                module.defs[1].name.span,
            )
        return module.defs[0]
    matches = [d for d in module.defs if d.name.name == name]
    if not matches:
        raise SemanticError(f"no def named {name!r} in the source; it defines: {', '.join(names)}")
    if len(matches) > 1:
        raise SemanticError(f"def {name} is defined more than once", matches[1].name.span)
    return matches[0]
