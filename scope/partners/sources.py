"""Partner supply: each source hands out one Binding per rollout.

A Binding is what fills a role in one episode: a model reference, sampling settings, a decoding
strategy (plain or Verbalized Sampling) and extra system-prompt text. Frozen single partners,
rotation over K partners, persona-conditioned partners and a trainable agent are all Bindings from
one of these sources; the rollout engine treats them alike.
"""
from __future__ import annotations

import json
import os
import random
from typing import Any, Callable

from ..config import Config
from ..contracts import ModelHandle
from ..models.backend import ModelRef
from ..registry import Registry
from .registry import PARTNER_SOURCES, SourceContext
from ..types import Task
from .binding import Binding, PartnerSource, spec_binding

BUILTIN_PERSONAS = os.path.join(os.path.dirname(__file__), "data", "partner_personas.json")


class SingleSource:
    def __init__(self, binding: Binding):
        self.binding = binding

    def assign(self, task: Task, task_index: int, copy: int) -> Binding:
        return self.binding

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        pass


class RotationSource:
    """K partners in a fixed cycle: per task (``group_shared``: the G copies share one) or per rollout."""

    def __init__(self, bindings: list[Binding], group_shared: bool = True):
        self.bindings, self.group_shared = bindings, group_shared
        self.counter = 0

    def assign(self, task: Task, task_index: int, copy: int) -> Binding:
        if self.group_shared:
            if copy == 0:
                self.counter += 1
            return self.bindings[(self.counter - 1) % len(self.bindings)]
        self.counter += 1
        return self.bindings[(self.counter - 1) % len(self.bindings)]

    def state_dict(self) -> dict[str, Any]:
        return {"counter": self.counter}

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        self.counter = sd["counter"]


PERSONA_POOLS: Registry[Callable[[], list[dict[str, str]]]] = Registry(
    "persona pool", group="scope.persona_pools")
"""Named persona pools (``personas: <name>``): a function returning [{id, text}]; environments add theirs."""


def register_persona_pool(name: str, load: Callable[[], list[dict[str, str]]]) -> None:
    PERSONA_POOLS.register(name, load)


def load_personas(spec: str) -> list[dict[str, str]]:
    """A persona pool: ``builtin`` (12 manners), a registered name (an environment's own pool), or a JSON file of
    {id, text} (a list, or an object whose ``personas`` is that list, as ``scope personas evolve`` writes)."""
    pool = PERSONA_POOLS.find(spec)
    if pool is not None:
        return pool()
    path = BUILTIN_PERSONAS if spec == "builtin" else spec
    if not os.path.exists(path):
        names = ", ".join(PERSONA_POOLS.names())
        raise FileNotFoundError(f"persona pool {path!r} not found (builtin, {names} "
                                f"or a JSON file of [{{id, text}}])")
    with open(path) as f:
        data = json.load(f)
    if isinstance(data, dict) and "personas" in data:  # a file from `scope personas evolve` (with its generator)
        data = data["personas"]
    if not isinstance(data, list) or not data or not all(isinstance(p, dict) and p.get("id") and p.get("text")
                                                         for p in data):
        raise ValueError(f"persona pool {path}: expected a non-empty list of {{id, text}} objects")
    return data


class PersonaSource:
    """One partner spec plus a persona drawn uniformly per rollout (or per task with ``group_shared``)."""

    def __init__(self, base: Binding, personas: list[dict[str, str]], seed: int, group_shared: bool = False):
        self.base, self.personas, self.group_shared = base, personas, group_shared
        self.rng = random.Random(seed)
        self.current: dict[str, str] | None = None

    def assign(self, task: Task, task_index: int, copy: int) -> Binding:
        if not self.group_shared or copy == 0 or self.current is None:
            self.current = self.personas[self.rng.randrange(len(self.personas))]
        p = self.current
        return self.base.with_persona(p["text"], id=f"{self.base.id}/{p['id']}")

    def state_dict(self) -> dict[str, Any]:
        return {"rng": self.rng.getstate(), "current": self.current}

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        self.rng.setstate(sd["rng"])
        self.current = sd["current"]


def single_source(ctx: SourceContext) -> PartnerSource:
    return SingleSource(ctx.bindings[0])


def rotation_source(ctx: SourceContext) -> PartnerSource:
    return RotationSource(ctx.bindings, group_shared=ctx.spec.group_shared)


def persona_source(ctx: SourceContext) -> PartnerSource:
    return PersonaSource(ctx.bindings[0], load_personas(ctx.spec.personas), seed=ctx.seed + 7,
                         group_shared=ctx.spec.group_shared)


def build_sources(cfg: Config, frozen_refs: dict[str, ModelHandle],
                  trainable_refs: dict[str, ModelRef]) -> dict[str, PartnerSource]:
    """One source per role: who plays it in each rollout, built by its ``source``'s registered builder."""
    return {role: role_source(role, rc, frozen_refs, trainable_refs, cfg.run.seed) for role, rc in cfg.roles().items()}


def role_source(role: str, rc, frozen_refs: dict[str, ModelHandle], trainable_refs: dict[str, ModelRef],
                seed: int) -> PartnerSource:
    """The source of one role's config ``rc`` (its registered builder's)."""
    trained = trainable_refs[role] if rc.trainable else None
    bindings = [spec_binding(rc, trained)] if trained is not None else \
        [spec_binding(s, frozen_refs[s.model]) for s in rc.specs()]
    return PARTNER_SOURCES.get(rc.source)(SourceContext(role, rc, bindings, trained, seed))
