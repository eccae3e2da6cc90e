"""scope's one extension mechanism: a named registry per kind of extension.

Environments, model builders, persona pools, partner rewards, partner sources and behaviour classifiers each
have one :class:`Registry`. An entry arrives one of three ways, and all three are looked up alike:

- registered in code: ``@REGISTRY.register("name")`` (or ``REGISTRY.register("name", obj)``);
- built in: ``"module:attribute"`` (or a bare ``"module"`` that registers its entries when imported),
  imported the first time the name is asked for, so that the registry itself imports nothing heavy;
- installed by another package: an entry point ``name = "module:attribute"`` (or ``"module"``) in the
  registry's entry-point group;
- imported as a plugin: a module named in a config's ``run.plugins`` (:func:`load_plugins`) registers its
  entries in code when it is imported (an experiment's ``recipes/<name>`` package).

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


def load_function(path: str, what: str, error: type[Exception] = ValueError) -> Callable[..., Any]:
    """The function ``path`` (``module:function``) names; one that does not import, or is not a function, is an
    ``error`` whose message names ``what`` and the path."""
    try:
        fn = load_path(path)
    except (ImportError, AttributeError) as e:
        raise error(f"{what} {path!r} cannot be loaded: {type(e).__name__}: {e}") from None
    if not callable(fn):
        raise error(f"{what} {path!r} is not a function")
    return fn


def load_plugins(paths: list[str]) -> None:
    """Import each module (``package.module``) for what it registers (``run.plugins``). A module that is not found
    among the installed packages is looked for from the current directory too, as ``python -m`` would (a
    checkout's ``recipes/``); an ``ImportError`` names the plugin."""
    import os
    import sys

    for path in paths:
        try:
            importlib.import_module(path)
            continue
        except ModuleNotFoundError as e:
            top = path.split(".")[0]
            if e.name != top and not (e.name or "").startswith(top + ".") or os.getcwd() in sys.path:
                raise ImportError(f"plugin {path!r} cannot be imported: {e}") from e
        sys.path.append(os.getcwd())
        try:
            importlib.import_module(path)
        except ImportError as e:
            raise ImportError(f"plugin {path!r} cannot be imported: {e}") from e


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
