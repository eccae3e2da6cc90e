"""A copy-on-write view of a tau2 database, so that every episode gets a fresh database cheaply.

The loaded JSON database is shared and never modified. Reads fall through to it; the first write
to a record copies that record into the episode's overlay. The state hash covers only records
that differ from the base, so two episodes that made the same changes hash alike.
"""
from __future__ import annotations

import copy
import hashlib
import json
from typing import Any, Iterator


def _canon(v: Any) -> str:
    return json.dumps(v, sort_keys=True, default=str)


class OverlayDB:
    """``upstream_quirks``: tools reproduce tau2's own quirks (see ``modify_pending_order_items``), so that
    a dialogue is graded as tau2 grades it."""

    def __init__(self, base: dict[str, dict[str, Any]], upstream_quirks: bool = True):
        self.base = base
        self.over: dict[str, dict[str, Any]] = {t: {} for t in base}
        self.upstream_quirks = upstream_quirks

    def has(self, table: str, key: str) -> bool:
        return key in self.over[table] or key in self.base[table]

    def get(self, table: str, key: str) -> Any:
        """A record for reading (do not modify it; use ``mut``)."""
        if key in self.over[table]:
            return self.over[table][key]
        return self.base[table].get(key)

    def mut(self, table: str, key: str) -> Any:
        """A record for writing (copied into the overlay on first use)."""
        if key not in self.over[table]:
            self.over[table][key] = copy.deepcopy(self.base[table][key])
        return self.over[table][key]

    def put(self, table: str, key: str, value: Any) -> None:
        self.over[table][key] = value

    def keys(self, table: str) -> Iterator[str]:
        yield from self.base[table]
        for k in self.over[table]:
            if k not in self.base[table]:
                yield k

    def items(self, table: str) -> Iterator[tuple[str, Any]]:
        for k in self.keys(table):
            yield k, self.get(table, k)

    def changes(self) -> dict[str, dict[str, Any]]:
        """The records that differ from the base, compared as JSON (so 1 and 1.0 differ, as in tau2's hash)."""
        out: dict[str, dict[str, Any]] = {}
        for t, recs in self.over.items():
            for k, v in recs.items():
                if k not in self.base[t] or _canon(self.base[t][k]) != _canon(v):
                    out.setdefault(t, {})[k] = v
        return out

    def hash(self) -> str:
        return hashlib.sha256(_canon(self.changes()).encode()).hexdigest()
