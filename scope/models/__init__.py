"""Model backends. ``MODEL_BUILDERS``: models that scope makes itself, named ``prefix:name`` in
``models.<m>.path`` (``prefix -> build(name, options) -> checkpoint directory``); environments register
theirs (the collapse lab's models are ``lab:...``). Kept free of heavy imports."""
from __future__ import annotations

from typing import Any, Callable

MODEL_BUILDERS: dict[str, Callable[[str, dict[str, Any]], str]] = {}


def register_model_builder(prefix: str):
    def deco(fn):
        MODEL_BUILDERS[prefix] = fn
        return fn

    return deco
