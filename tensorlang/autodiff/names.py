"""autodiff: the names a forward def uses → fresh names for the tensors and indices of its gradient.

One pool for every kind of name: in a def, tensor, size, index and let names share a namespace
(an index may not shadow a tensor), so a new tensor name must avoid every index name of every
statement, and a new index name every tensor and size name.
"""

from __future__ import annotations

from ..builtins import BUILTINS
from ..lexer import KEYWORDS


class Names:
    """Hands out names not yet used in the program being built."""

    def __init__(self, used: set[str]):
        self.used = set(used) | set(BUILTINS) | set(KEYWORDS) | {"true", "false"}

    def take(self, preferred: str) -> str:
        """`preferred` if it is free, else `preferred_1`, `preferred_2`, ..."""
        name, k = preferred, 0
        while name in self.used:
            k += 1
            name = f"{preferred}_{k}"
        self.used.add(name)
        return name

    def index(self, base: str, local: set[str] | frozenset[str] = frozenset()) -> str:
        """A new index name (`i`, `i0`, `i1`, ...) distinct from every global name and `local`."""
        name, k = base, 0
        while name in self.used or name in local:
            name = f"{base}{k}"
            k += 1
        self.used.add(name)
        return name
