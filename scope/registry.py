"""scope's one extension mechanism: a named registry per kind of extension.

Environments, model builders, persona pools, partner rewards, partner sources and behaviour classifiers each
have one :class:`Registry`. An entry arrives one of three ways, and all three are looked up alike:

- registered in code: ``@REGISTRY.register("name")`` (or ``REGISTRY.register("name", obj)``);
- built in: ``"module:attribute"`` (or a bare ``"module"`` that registers its entries when imported),
  imported the first time the name is asked for, so that the registry itself imports nothing heavy;
- installed by another package: an entry point ``name = "module:attribute"`` (or ``"module"``) in the
  registry's entry-point group.

CONTRIBUTING.md has a recipe for each kind.
"""
from __future__ import annotations

import importlib
from typing import Any, Callable, Generic, TypeVar

T = TypeVar("T")


def load_path(path: str) -> Any:
    """The object a path names: ``package.module:attribute``, or a bare ``package.module`` (the module). Its
    ``ImportError`` or ``AttributeError`` is raised as is."""
    module, _, attr = path.partition(":")
    mod = importlib.import_module(module)
    return getattr(mod, attr) if attr else mod


class Registry(Generic[T]):
    def __init__(self, kind: str, builtin: dict[str, str] | None = None, group: str | None = None):
        self.kind, self.builtin, self.group = kind, dict(builtin or {}), group
        self.entries: dict[str, T] = {}

    def register(self, name: str, obj: T | None = None) -> Callable[[T], T]:
        """``@registry.register(name)`` above a function or class, or ``registry.register(name, obj)``."""
        def deco(o: T) -> T:
            self.entries[name] = o
            return o

        if obj is not None:
            deco(obj)
        return deco

    def _plugins(self) -> dict[str, str]:
        if self.group is None:
            return {}
        from importlib.metadata import entry_points

        try:
            return {ep.name: ep.value for ep in entry_points(group=self.group)}
        except Exception:  # noqa: BLE001 - a broken installed distribution does not stop scope
            return {}

    def names(self) -> list[str]:
        """Every name that can be asked for: registered, built in, or installed."""
        return sorted(set(self.entries) | set(self.builtin) | set(self._plugins()))

    def find(self, name: str) -> T | None:
        """The entry ``name`` (importing its module on first use), or None."""
        if name not in self.entries:
            where = self.builtin.get(name) or self._plugins().get(name)
            if where is not None:
                obj = load_path(where)  # a bare module registers its entries when imported
                if ":" in where and name not in self.entries:
                    self.entries[name] = obj
        return self.entries.get(name)

    def get(self, name: str) -> T:
        """The entry ``name``; an unknown name is a ``KeyError`` that lists the known ones."""
        found = self.find(name)
        if found is None:
            raise KeyError(f"unknown {self.kind} {name!r}; registered: {', '.join(self.names()) or 'none'}")
        return found

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self.find(name) is not None
