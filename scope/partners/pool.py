"""Population Co-Training: a FIFO pool of snapshots of a trainable adapter, sampled per rollout.

Members are LoRA adapters on the same base as the adapter they copy, so switching members never
reloads the base. The pool is seeded with the initial adapter; every ``every`` steps the current
adapter is copied in; beyond ``size`` members the oldest is evicted. Each rollout's partner is
drawn uniformly from the members; the drawn member's sampling log-probs are what the rollout
records, so the learner's clipped ratio corrects for the gap to the current adapter.
"""
from __future__ import annotations

import os
import random
from typing import Any

import torch

from ..models.backend import LocalBackend, ModelRef
from ..types import Task
from .binding import Binding
from .registry import SourceContext


class PoolSource:
    """The population pool: a :class:`~scope.partners.binding.SnapshotSource`."""

    def __init__(self, backend: LocalBackend, source_adapter: str, sampling, size: int = 5, every: int = 4,
                 seed: int = 0, group_shared: bool = False):
        self.backend, self.src, self.sampling = backend, source_adapter, sampling
        self.size, self.every, self.group_shared = size, every, group_shared
        self.rng = random.Random(seed)
        self.members: list[str] = []
        self.refs: dict[str, ModelRef] = {}
        self.draws: dict[str, int] = {}
        self._current: str | None = None

    # -- membership --
    def _member_name(self, step: int) -> str:
        return f"{self.src}_pool_{step}"

    def snapshot(self, step: int) -> str:
        name = self._member_name(step)
        if name in self.members:
            return name
        self.backend.add_lora(name, **self.backend.lora_settings(self.src))  # a copy of the adapter's shape
        src_params = dict(self._params(self.src))
        with torch.no_grad():
            for n, p in self._params(name):
                p.copy_(src_params[n])
                p.requires_grad_(False)
        self.backend.versions[name] = self.backend.versions.get(self.src, 0)
        self.members.append(name)
        self.refs[name] = ModelRef(id=name, backend=self.backend, adapter=name, trainable=False)
        while len(self.members) > self.size:
            self.evict(self.members[0])
        return name

    def evict(self, name: str) -> None:
        self.members.remove(name)
        self.refs.pop(name, None)
        self.backend.model.delete_adapter(name)
        self.backend.versions.pop(name, None)

    def _params(self, adapter: str):
        tag = f".{adapter}."
        for n, p in self.backend.model.named_parameters():
            if tag in n and "lora_" in n:
                yield n.replace(tag, ".{}."), p

    def maybe_snapshot(self, step: int) -> bool:
        if step % self.every == 0:
            self.snapshot(step)
            return True
        return False

    # -- sampling --
    def assign(self, task: Task, task_index: int, copy: int) -> Binding:
        if not self.members:
            raise RuntimeError("the partner pool is empty; call snapshot(0) first")
        if not self.group_shared or copy == 0 or self._current not in self.members:
            self._current = self.members[self.rng.randrange(len(self.members))]
        name = self._current
        self.draws[name] = self.draws.get(name, 0) + 1
        return Binding(id=name, ref=self.refs[name], sampling=self.sampling)

    # -- state --
    def state_dict(self) -> dict[str, Any]:
        return {"members": list(self.members), "rng": self.rng.getstate(), "current": self._current}

    def save(self, path: str) -> None:
        os.makedirs(path, exist_ok=True)
        for m in self.members:
            self.backend.model.save_pretrained(path, selected_adapters=[m])

    def load(self, path: str, sd: dict[str, Any]) -> None:
        from peft import set_peft_model_state_dict
        from peft.utils import load_peft_weights

        for m in list(self.members):
            self.evict(m)
        for m in sd["members"]:
            self.backend.add_lora(m, **self.backend.lora_settings(self.src))
            set_peft_model_state_dict(self.backend.model, load_peft_weights(os.path.join(path, m)), adapter_name=m)
            for _, p in self._params(m):
                p.requires_grad_(False)
            self.members.append(m)
            self.refs[m] = ModelRef(id=m, backend=self.backend, adapter=m, trainable=False)
        self.rng.setstate(sd["rng"])
        self._current = sd["current"]


def pool_source(ctx: SourceContext) -> PoolSource:
    """``source: pool``: Population Co-Training over snapshots of the role's own trained adapter."""
    ref = ctx.trained
    if not isinstance(ref, ModelRef) or ref.adapter is None:  # (the config's validation: trainable, LoRA)
        raise ValueError(f"{ctx.role}: source pool needs a trainable LoRA model")
    rc = ctx.spec
    return PoolSource(ref.backend, ref.adapter, ctx.bindings[0].sampling, size=rc.pool.size, every=rc.pool.every,
                      seed=ctx.seed + 11, group_shared=rc.group_shared)
