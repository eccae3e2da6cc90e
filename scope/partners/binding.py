"""A Binding: what fills a role in one episode (a model reference, sampling settings, a decoding strategy
and extra system-prompt text); every partner source hands these out and the rollout engine reads them."""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Protocol

from ..config import PartnerSpec, VSConfig
from ..contracts import ModelHandle
from ..types import SamplingParams, Task


@dataclass
class Binding:
    id: str
    ref: ModelHandle
    sampling: SamplingParams
    vs: VSConfig | None = None
    note: str = ""

    def with_persona(self, text: str, id: str | None = None) -> "Binding":
        """This binding playing a persona: the persona's text on a line after its own note (the one way a
        persona reaches a system prompt: persona sources, panels and the persona search)."""
        return replace(self, id=self.id if id is None else id, note=(self.note + "\n" if self.note else "") + text)


def spec_sampling(spec: PartnerSpec) -> SamplingParams:
    return SamplingParams(temperature=spec.temperature, top_p=spec.top_p, max_new_tokens=spec.max_new_tokens,
                          stop=tuple(spec.stop))


def spec_binding(spec: PartnerSpec, ref: ModelHandle) -> Binding:
    return Binding(id=spec.spec_id(), ref=ref, sampling=spec_sampling(spec),
                   vs=spec.vs if spec.decoding == "vs" else None, note=spec.note)


class PartnerSource(Protocol):
    """Who plays a role in each rollout (the partner contract). Its state goes into checkpoints (``state_dict``);
    a source restores it with ``load_state_dict(sd)``, a pool (:class:`scope.partners.pool.PoolSource`), whose
    members are adapters saved beside it, with ``load(dir, sd)``."""

    def assign(self, task: Task, task_index: int, copy: int) -> Binding: ...

    def state_dict(self) -> dict[str, Any]: ...


class SnapshotSource(PartnerSource, Protocol):
    """A source that holds snapshots of a trained adapter (the population pool): the loop snapshots it
    (``snapshot`` at the start, ``maybe_snapshot`` after each step), a checkpoint saves its members beside its
    state (``save(dir)``) and a resume restores both (``load(dir, sd)``)."""

    members: list[str]

    def snapshot(self, step: int) -> str: ...

    def maybe_snapshot(self, step: int) -> bool: ...

    def save(self, path: str) -> None: ...

    def load(self, path: str, sd: dict[str, Any]) -> None: ...
