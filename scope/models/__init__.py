"""Model backends. ``MODEL_BUILDERS``: models that scope makes itself, named ``prefix:name`` in
``models.<m>.path`` (``prefix -> build(name, options) -> checkpoint directory``). Another package adds a builder
under the ``scope.models`` entry-point group, or registers it with :func:`register_model_builder` (a plugin of
``run.plugins``). Kept free of heavy imports, and of environments."""
from __future__ import annotations

from typing import Any, Callable

from ..registry import Registry

Builder = Callable[[str, dict[str, Any]], str]
MODEL_BUILDERS: Registry[Builder] = Registry("model builder", group="scope.models")


def register_model_builder(prefix: str) -> Callable[[Builder], Builder]:
    return MODEL_BUILDERS.register(prefix)


def model_builder(prefix: str) -> Builder | None:
    """The builder of ``prefix:...`` models (None where none is registered)."""
    return MODEL_BUILDERS.find(prefix)


def builder_prefixes() -> list[str]:
    return MODEL_BUILDERS.names()
