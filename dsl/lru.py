"""A bounded cache of compiled programs, or of answers about a function.

Contract: `Lru(size)` maps keys to values like a dict for `get`, `in`,
`[]=`, `len` and `values`, keeping at most `size` entries: a `get` that
hits makes its entry the most recent, and adding one past `size` drops
the least recent.  A program a caller still holds (a pullback's, the fast
path's) stays alive after it is dropped here; it is only built again when
asked for again.  Not locked: callers that build under a lock look up and
insert under it, or tolerate a lost entry (it is built again).
`held_by(owner, name, size)`: such a cache kept as an attribute of
`owner`, made at its first use.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Any, Hashable, Iterator


class Lru:
    def __init__(self, size: int) -> None:
        self.size = size
        self._entries: OrderedDict[Hashable, Any] = OrderedDict()

    def get(self, key: Hashable, default: Any = None) -> Any:
        try:  # (another thread may drop it between the two)
            self._entries.move_to_end(key)
            return self._entries[key]
        except KeyError:
            return default

    def __contains__(self, key: Hashable) -> bool:
        return key in self._entries

    def __setitem__(self, key: Hashable, value: Any) -> None:
        self._entries[key] = value
        self._entries.move_to_end(key)
        while len(self._entries) > self.size:
            self._entries.popitem(last=False)

    def __len__(self) -> int:
        return len(self._entries)

    def __bool__(self) -> bool:
        return bool(self._entries)

    def values(self) -> Iterator[Any]:
        return iter(list(self._entries.values()))


def held_by(owner: Any, name: str, size: int) -> Lru:
    """The `Lru(size)` kept as `owner.name`, made at its first use (a
    cache of answers about one function, beside its other attributes)."""
    cache = owner.__dict__.get(name)
    return cache if cache is not None else owner.__dict__.setdefault(name, Lru(size))
