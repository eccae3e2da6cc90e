"""The environment interface and its registry.

An Env is plain control flow for one task: what each role sees, whose turn it is, what a reply does,
when the dialogue ends, and the reward. Envs never call models; the rollout engine does, so that it
can batch the requests of many dialogues.
"""
from __future__ import annotations

import random
from typing import Any, Callable

from ..registry import Registry
from ..types import Episode, Readout, Task

ENVS: Registry[type["Env"]] = Registry("environment", builtin={
    # name -> the module that registers it, imported the first time it is asked for
    "p4g": "scope.envs.p4g",
    "tau2_retail": "scope.envs.tau2.env",
    "tau2_airline": "scope.envs.tau2.env",
    "coop_coding": "scope.envs.coop.env",
    "koth": "scope.koth.env",
}, group="scope.envs")
"""The environments: another package adds one under the ``scope.envs`` entry-point group, ``name =
"package.module"`` (the module registers its class with :func:`register_env` when imported)."""


def register_env(name: str) -> Callable[[type["Env"]], type["Env"]]:
    def deco(cls: type["Env"]) -> type["Env"]:
        cls.name = name
        return ENVS.register(name)(cls)

    return deco


def env_names() -> list[str]:
    """Every environment that can be asked for: registered, built in, or installed as a plugin."""
    return ENVS.names()


def get_env(name: str) -> type["Env"]:
    """The environment class registered under ``name``, importing its module on first use (the registry
    itself imports no environment, so that nothing below an environment imports them all)."""
    return ENVS.get(name)


class Env:
    """One dialogue between two roles over one task.

    ``views[role]`` is the chat message list that role's model sees: its own replies as
    ``assistant``, everything else as ``user`` (or ``system``). Subclasses fill the system prompts in
    ``__init__`` and implement ``next_role``, ``on_reply`` and ``rewards``.
    """

    name = "base"
    roles: tuple[str, ...] = ("agent", "partner")

    @classmethod
    def option_names(cls) -> set[str]:
        """The environment's options (``env.options`` keys): the named keyword parameters of its
        ``__init__`` and ``load_tasks``. Anything else in a config is an error."""
        import inspect

        names = set()
        for fn, skip in ((cls.__init__, {"self", "task", "rng"}), (cls.load_tasks, {"cls", "split"})):
            for p in inspect.signature(fn).parameters.values():
                if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name not in skip:
                    names.add(p.name)
        return names

    @classmethod
    def check_options(cls, options: dict[str, Any], where: str = "env.options") -> dict[str, Any]:
        """``options`` checked against what the environment declares (its ``__init__`` and ``load_tasks``
        parameters: each one's annotation, else its default's type): unknown names and values of the wrong
        type raise ``ValueError`` naming the key; values are returned converted where the conversion is
        exact (``"5"`` for an int, ``3`` for a float)."""
        import inspect
        import typing

        from pydantic import TypeAdapter, ValidationError

        known = cls.option_names()
        unknown = sorted(set(options) - known)
        if unknown:
            raise ValueError(f"{where}: {', '.join(unknown)}: not an option of {cls.name!r} "
                             f"(its options: {', '.join(sorted(known))})")
        declared: dict[str, Any] = {}
        for fn in (cls.load_tasks, cls.__init__):
            try:
                hints = typing.get_type_hints(fn)
            except Exception:  # noqa: BLE001 - an annotation that does not resolve: fall back to defaults
                hints = {}
            for p in inspect.signature(fn).parameters.values():
                if p.name in options and p.name not in declared:
                    if p.name in hints:
                        declared[p.name] = hints[p.name]
                    elif p.default is not inspect.Parameter.empty and p.default is not None:
                        declared[p.name] = type(p.default)
        out = dict(options)
        for k, t in declared.items():
            try:
                out[k] = TypeAdapter(t).validate_python(options[k])
            except ValidationError as e:
                msg = e.errors()[0]["msg"]
                raise ValueError(f"{where}.{k}: {msg[0].lower() + msg[1:]} (got {options[k]!r})") from None
        return out

    def __init__(self, task: Task, rng: random.Random, **options: Any):
        self.task = task
        self.rng = rng
        self.views: dict[str, list[dict[str, str]]] = {r: [] for r in self.roles}
        self.transcript: list[dict[str, Any]] = []
        self.done = False
        self.end_reason: str | None = None
        self.turns: dict[str, int] = {r: 0 for r in self.roles}
        self.meta: dict[str, Any] = {}

    # ---- helpers for subclasses -----------------------------------------------------------
    def say(self, speaker: str, text: str, to: tuple[str, ...] | None = None) -> None:
        """Record ``speaker``'s reply: it is the speaker's own assistant turn and a user turn for ``to``."""
        self.views[speaker].append({"role": "assistant", "content": text})
        for r in (to if to is not None else [r for r in self.roles if r != speaker]):
            self.views[r].append({"role": "user", "content": text})
        self.transcript.append({"role": speaker, "content": text})

    def add_note(self, role: str, text: str) -> None:
        """Append ``text`` to ``role``'s system prompt (before the dialogue starts)."""
        view = self.views[role]
        if view and view[0]["role"] == "system":
            view[0] = {"role": "system", "content": view[0]["content"] + "\n\n" + text}
        else:
            view.insert(0, {"role": "system", "content": text})

    end_reasons: frozenset[str] = frozenset()
    """Ends of this environment's own, beside :data:`scope.types.END_REASONS`."""

    def finish(self, reason: str) -> None:
        from ..types import END_REASONS

        if reason not in END_REASONS and reason not in self.end_reasons:
            raise ValueError(f"{type(self).__name__}.finish({reason!r}): not an end reason (scope.types.END_REASONS "
                             f"or the environment's end_reasons)")
        self.done, self.end_reason = True, reason

    # ---- the interface ----------------------------------------------------------------------
    def next_role(self) -> str | None:
        raise NotImplementedError

    def next_roles(self) -> list[str]:
        """The roles that reply in this round: by default the one ``next_role`` names. An environment
        whose roles act at the same time returns several; the rollout engine samples them in the same
        round and applies their replies in this order, so a reply reaches the others at their next turn."""
        role = self.next_role()
        return [] if role is None else [role]

    def reply_prefix(self, role: str) -> str:
        """Text the env puts at the start of ``role``'s next reply (the model continues it); default none."""
        return ""

    def reply_readout(self, role: str) -> Readout | None:
        """A decision to read from ``role``'s next-token distributions instead of sampling a free reply (see
        :class:`scope.types.Readout`); default none. The engine then hands the decision distribution to
        ``on_readout`` and a reply drawn from it to ``on_reply``. Needs a local model."""
        return None

    def on_readout(self, role: str, dist: dict[Any, float]) -> None:
        """The decision distribution of ``role``'s reply (called just before ``on_reply``)."""

    def on_reply(self, role: str, text: str) -> None:
        """Apply ``role``'s reply (the forced prefix, if any, followed by its exact generated text)."""
        raise NotImplementedError

    def rewards(self) -> dict[str, float]:
        raise NotImplementedError

    @classmethod
    def eval_options(cls, options: dict[str, Any]) -> dict[str, Any]:
        """The options a held-out evaluation plays with (default: the training's). tau2 trained against
        simulated tools is evaluated on its exact tools."""
        return dict(options)

    def judge_requests(self) -> list[list[dict[str, str]]]:
        """Conversations to put to a judge model before ``rewards`` (e.g. tau2's NL assertions); the
        rollout engine batches them across episodes. Default: none."""
        return []

    def set_judgements(self, replies: list[str | None]) -> None:
        """The judge's replies to ``judge_requests``, in order (None where the call failed)."""

    @classmethod
    def step_metrics(cls, episodes: list[Episode]) -> dict[str, float]:
        """The environment's own metrics of a training step, from its finished (not failed) episodes'
        ``meta``; logged beside the loop's. Default: none."""
        return {}

    @classmethod
    def card_lines(cls, records: list[dict[str, Any]]) -> list[str]:
        """What a grid's dialogue cards (``dialogues.md``) say of one arm's evaluation episodes (the records of
        ``eval_episodes.jsonl``), beyond the generic lines: markdown list items. Default: none."""
        return []

    # ---- tasks ------------------------------------------------------------------------------
    @classmethod
    def load_tasks(cls, split: str, **options: Any) -> list[Task]:
        raise NotImplementedError

    @classmethod
    def task_from_row(cls, row: dict[str, Any], split: str) -> Task:
        """One task from a row of a user's tasks file (``env.tasks``; its columns already renamed to the
        environment's fields). A row without what the environment needs raises ``ValueError`` (or
        ``KeyError`` with the field's name); :func:`scope.envs.tasks.load_tasks` names the row."""
        raise ValueError(f"environment {cls.name!r} does not read its tasks from a file (env.tasks)")
