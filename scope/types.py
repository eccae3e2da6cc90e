"""The nouns every part of scope shares: tasks, completions, traces and episodes."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable


@dataclass
class Task:
    """One scenario of an environment (a persona, a tau2 task, ...)."""

    id: str
    split: str
    data: dict[str, Any] = field(default_factory=dict)


@dataclass
class SamplingParams:
    temperature: float = 0.7
    top_p: float = 1.0
    max_new_tokens: int = 128
    stop: tuple[str, ...] = ()
    stop_fn: Callable[[str], bool] | None = None
    """Local models: called with the text generated so far after each token; True stops the row."""
    restart_fn: Callable[[str], bool] | None = None
    """Local models: called like ``stop_fn``; True discards the row's text and samples it afresh from
    the same prompt, in the running batch (at most ``max_restarts`` times; the budget of
    ``max_new_tokens`` covers all attempts)."""
    max_restarts: int = 0


@dataclass
class Completion:
    """One generated reply, token in / token out.

    ``token_ids`` are exactly the sampled ids (the end-of-turn token included when the model produced
    it); ``logprobs[i]`` is the log-probability of ``token_ids[i]`` under the sampling distribution
    (logits / temperature, before top-p truncation). ``finish_reason`` is ``"eos"`` (the model ended
    its turn), ``"stop"`` (a stop string was produced) or ``"length"`` (cut off at max_new_tokens).
    """

    text: str
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    model_id: str = ""
    model_version: int = 0
    discarded: list[str] = field(default_factory=list)
    """Texts of attempts thrown away by ``SamplingParams.restart_fn``, oldest first."""
    discarded_tokens: int = 0


@dataclass
class Readout:
    """A decision read from a model's next-token distributions rather than from one sample.

    ``outcome(text, final)`` maps the text generated so far (after any forced prefix) to the decision it
    spells, or to None while the text does not yet decide it (``final`` is True at the last of
    ``max_tokens`` tokens: it must then return a decision). Every continuation that leaves the decision
    open is expanded, so the distribution over decisions is exact under the model's sampling distribution
    (logits / temperature). Decisions must be hashable.
    """

    outcome: Callable[[str, bool], Any]
    max_tokens: int = 3
    max_nodes: int = 64
    """A guard: at most this many open continuations are expanded (the rest are read as final where they
    stand)."""


@dataclass
class ReadoutResult:
    """The decision distribution of one prompt, and one reply sampled from the same distributions (a
    Completion like any other: its ids and sampling log-probs go into the role's trace)."""

    dist: dict[Any, float]
    completion: "Completion"
    outcome: Any


@dataclass
class Trace:
    """What one role saw and produced in one episode, token by token.

    ``mask[i]`` is 1 only on tokens this role's model generated; ``logprobs[i]`` is their sampling
    log-prob (0.0 elsewhere). ``turn_model[i]`` indexes ``models`` (id, version) for generated tokens
    and is -1 elsewhere.
    """

    role: str
    token_ids: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    turn_model: list[int] = field(default_factory=list)
    models: list[tuple[str, int]] = field(default_factory=list)
    covered_text: str = ""  # the chat-template text these tokens spell (for incremental templating)
    n_turns: int = 0

    def extend_context(self, ids: list[int]) -> None:
        self.token_ids.extend(ids)
        self.mask.extend([0] * len(ids))
        self.logprobs.extend([0.0] * len(ids))
        self.turn_model.extend([-1] * len(ids))

    def extend_generated(self, ids: list[int], logprobs: list[float], model: tuple[str, int]) -> None:
        if len(ids) != len(logprobs):
            raise ValueError(f"{len(ids)} generated ids but {len(logprobs)} log-probs")
        if model not in self.models:
            self.models.append(model)
        k = self.models.index(model)
        self.token_ids.extend(ids)
        self.mask.extend([1] * len(ids))
        self.logprobs.extend(logprobs)
        self.turn_model.extend([k] * len(ids))
        self.n_turns += 1

    @property
    def n_generated(self) -> int:
        return sum(self.mask)


END_REASONS: dict[str, str] = {
    "running": "not finished yet",
    "done": "the dialogue ended as the environment's protocol says (a decision stated, every turn played)",
    "max_turns": "the environment's turn limit was reached",
    "max_steps": "tau2: the step limit was reached",
    "context_limit": "the next prompt would not fit rollout.max_context",
    "truncated": "a reply was cut off at its max_new_tokens (rollout.end_on_truncation)",
    "failed": "an error (a model call, a template, the environment's code); the episode is left out of training",
    "user_stop": "tau2: the user simulator ended the dialogue (###STOP###)",
    "agent_stop": "tau2: the agent ended the dialogue (env.options.agent_stop)",
    "too_many_errors": "tau2: the agent's tool calls failed env.options.max_errors times",
    "submitted": "coop_coding: both players submitted",
    "game_over": "koth: the game ended",
    "replay_end": "a replayed role made its last recorded reply (Job.stop_after): the episode is not graded",
}
"""Every way an episode ends (``Episode.status``, ``Env.finish``). An environment with an end of its own lists
it in its ``end_reasons``; ``Env.finish`` refuses a reason that is in neither."""


@dataclass
class Episode:
    """One dialogue: the shared message list, one Trace per role, rewards and status."""

    task_id: str
    group_id: str
    copy: int
    messages: list[dict[str, Any]] = field(default_factory=list)
    traces: dict[str, Trace] = field(default_factory=dict)
    rewards: dict[str, float] = field(default_factory=dict)
    status: str = "running"  # one of END_REASONS
    error: str | None = None
    turns: dict[str, int] = field(default_factory=dict)
    """Replies each role made (set when the dialogue ends)."""
    truncated_replies: dict[str, int] = field(default_factory=dict)
    """Replies of each role cut off at its ``max_new_tokens``."""
    vs: list[dict[str, Any]] = field(default_factory=list)
    """One record per Verbalized Sampling turn (role, candidates, the draw, re-asks, fallback)."""
    advantage: dict[str, float] = field(default_factory=dict)
    """Each trained role's advantage in its update."""
    meta: dict[str, Any] = field(default_factory=dict)
    """The environment's own record (e.g. ``coop``, ``envsim``, ``decision``) and evaluation labels."""

    @property
    def failed(self) -> bool:
        return self.status == "failed"

    def summary(self) -> dict[str, Any]:
        """A person-readable record (no token arrays)."""
        return {
            "task_id": self.task_id,
            "group_id": self.group_id,
            "copy": self.copy,
            "status": self.status,
            "error": self.error,
            "rewards": self.rewards,
            "turns": self.turns,
            "truncated_replies": self.truncated_replies,
            "advantage": self.advantage,
            "vs": self.vs,
            "tokens": {r: {"total": len(t.token_ids), "generated": t.n_generated, "turns": t.n_turns}
                       for r, t in self.traces.items()},
            "models": {r: [list(m) for m in t.models] for r, t in self.traces.items()},
            "meta": self.meta,
            "messages": self.messages,
        }

