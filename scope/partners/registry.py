"""The partner-source registry (``<role>.source``) and what a source builder gets. Kept free of the config and
the models: the config's validation asks it which names exist."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from ..registry import Registry


@dataclass
class SourceContext:
    """What a partner-source builder gets: the role, its config, its bindings (the trained model's for a
    trainable role, else one per spec of ``rotation`` or the role's own), the trained model, the run's seed."""

    role: str
    spec: Any
    """The role's ``RoleConfig`` (typed loosely here: the config imports this registry)."""
    bindings: list[Any]
    """``scope.partners.binding.Binding``s."""
    trained: Any
    """The trained ``ModelRef``, or None."""
    seed: int


PARTNER_SOURCES: Registry[Callable[[SourceContext], Any]] = Registry("partner source", builtin={
    "single": "scope.partners.sources:single_source", "rotation": "scope.partners.sources:rotation_source",
    "persona": "scope.partners.sources:persona_source", "pool": "scope.partners.pool:pool_source"},
    group="scope.partner_sources")
"""``<role>.source``: who plays the role in each rollout. Another package adds one under the
``scope.partner_sources`` entry-point group (a function of a :class:`SourceContext`)."""
