"""A least-recently-used cache bounded by bytes as well as by entries, for what a Lambda sandbox keeps warm.

A cache bounded only by its number of entries is bounded in memory only when its entries are small: 4,096 compiled
JMESPath expressions, or 256 definitions of up to 400 KB each, can outgrow a 256 MB function. Each entry here is
given its weight in bytes when it is stored, and the oldest entries leave until both bounds hold.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class BoundedCache(Generic[K, V]):
    """An LRU mapping that holds at most ``max_entries`` entries weighing at most ``max_bytes`` in all.

    Parameters
    ----------
    max_bytes:
        Total weight allowed (bytes, as the caller estimates each entry).
    max_entries:
        Entries allowed.
    """

    def __init__(self, max_bytes: int, max_entries: int = 4096) -> None:
        self.max_bytes = max_bytes
        self.max_entries = max_entries
        self._entries: OrderedDict[K, tuple[V, int]] = OrderedDict()
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def get(self, key: K) -> V | None:
        """The value of ``key`` (now the most recently used), or None."""
        found = self._entries.get(key)
        if found is None:
            return None
        self._entries.move_to_end(key)
        return found[0]

    def put(self, key: K, value: V, weight: int) -> None:
        """Store ``value`` under ``key``; an entry heavier than ``max_bytes`` is not kept at all."""
        if key in self._entries:
            self.bytes -= self._entries.pop(key)[1]
        if weight > self.max_bytes:
            return
        self._entries[key] = (value, weight)
        self.bytes += weight
        while self.bytes > self.max_bytes or len(self._entries) > self.max_entries:
            _, (_, dropped) = self._entries.popitem(last=False)
            self.bytes -= dropped

    def get_or_build(self, key: K, build: Callable[[], V], weight: Callable[[V], int]) -> V:
        """The cached value of ``key``, or ``build()`` stored with ``weight(value)``."""
        found = self.get(key)
        if found is not None:
            return found
        value = build()
        self.put(key, value, weight(value))
        return value
