"""The contracts between scope's parts, as types: what the engine calls on a role's model, and what a partner
source hands out. A new backend or source implements one of these; nothing probes objects with ``hasattr``.

- :class:`ModelHandle`: any model a role can be bound to (its ``id``, the ``version`` of its weights, and a way
  to forget its cached sessions). Two kinds: :class:`TokenModel` (local weights: token in, token out, the trace
  built from its exact ids; also decision readouts) and :class:`ChatModel` (an endpoint: text in, text out;
  ``chat`` is True).

- :class:`Rollout`: what the training loop calls to play a step's jobs (the engine in this process, or Ray workers).

Who plays a role in each rollout is the partner contract, :class:`scope.partners.binding.PartnerSource`, beside
the :class:`~scope.partners.binding.Binding` it hands out.
"""
from __future__ import annotations

from typing import Any, Protocol, Sequence

from .types import Completion, Readout, ReadoutResult, SamplingParams


class ModelHandle(Protocol):
    id: str

    @property
    def version(self) -> int: ...

    def drop_sessions(self, keys: Any) -> None: ...


class TokenModel(ModelHandle, Protocol):
    @property
    def tokenizer(self) -> Any: ...

    @property
    def eos_id(self) -> int: ...

    def generate(self, prompts: list[list[int]], sampling: SamplingParams,
                 sessions: Sequence[Any] | None = None) -> list[Completion]: ...

    def readout(self, prompts: list[list[int]], sampling: SamplingParams, readout: Readout) -> list[ReadoutResult]:
        ...


class ChatModel(ModelHandle, Protocol):
    chat: bool

    def chat_generate(self, convs: list[list[dict[str, str]]], sampling: SamplingParams,
                      response_format: Any = None) -> list[Completion | BaseException]: ...


def is_chat(ref: ModelHandle) -> bool:
    """Whether ``ref`` is text in, text out (an endpoint, a replay) rather than a :class:`TokenModel`."""
    return bool(getattr(ref, "chat", False))


def token_model(ref: ModelHandle) -> TokenModel:
    """``ref`` as a :class:`TokenModel`; a chat model here is an error that names it."""
    if is_chat(ref):
        raise TypeError(f"model {ref.id!r} is text in, text out; this needs a local model (token in, token out)")
    return ref  # type: ignore[return-value]


class Rollout(Protocol):
    stats: dict[str, float]
    """Cumulative counters of its own (logged as ``ray/<name>``); empty for the engine in this process."""

    def __call__(self, jobs: list[Any], **kw: Any) -> tuple[list[Any], Any]:
        """Play every job to its end: (the episodes, in the jobs' order; the step's ``RolloutStats``)."""
        ...

    def close(self) -> None: ...
