"""Model backends. ``MODEL_BUILDERS``: models that scope makes itself, named ``prefix:name`` in
``models.<m>.path`` (``prefix -> build(name, options) -> checkpoint directory``). Built-in builders are
named here by module path and imported on first use (the collapse lab's models are ``lab:...``); others
register theirs with :func:`register_model_builder`. Kept free of heavy imports, and of environments."""
from __future__ import annotations

import importlib
from typing import Any, Callable

MODEL_BUILDERS: dict[str, Callable[[str, dict[str, Any]], str]] = {}
BUILTIN_BUILDERS = {"lab": "scope.lab.models:build"}


def register_model_builder(prefix: str):
    def deco(fn):
        MODEL_BUILDERS[prefix] = fn
        return fn

    return deco


def model_builder(prefix: str) -> Callable[[str, dict[str, Any]], str] | None:
    """The builder of ``prefix:...`` models, importing a built-in one on first use."""
    if prefix not in MODEL_BUILDERS and prefix in BUILTIN_BUILDERS:
        module, attr = BUILTIN_BUILDERS[prefix].split(":")
        MODEL_BUILDERS[prefix] = getattr(importlib.import_module(module), attr)
    return MODEL_BUILDERS.get(prefix)


def builder_prefixes() -> list[str]:
    return sorted(set(MODEL_BUILDERS) | set(BUILTIN_BUILDERS))
