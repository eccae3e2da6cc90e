"""The agents of a study's conditions, and the live state of each session.

A condition's agent plays in the same environment class, with the same system prompt, tool format,
note and options as in training: the session's environment is built exactly as a rollout builds it,
the participant takes the partner's seat, and the agent's reply is sampled from the agent's view of
that environment. The environment's state (for tau2, the session's own database) lives in memory and
is rebuilt from the stored turns whenever the server has lost it.
"""
from __future__ import annotations

import json
import os
import random
import threading
from typing import Any

from ..config import ConfigError
from ..envs.base import get_env
from ..partners.binding import Binding
from ..types import Completion, SamplingParams
from .config import AgentSpec, StudyConfig, TaskType


class ScriptedRef:
    """Replies said in turn: the k-th agent reply of a session is ``replies[k % len]``. ``{last_user}``
    in a reply is replaced by the participant's last message (an echo, for pilots and tests)."""

    chat = True
    trainable = False
    version = 0

    def __init__(self, id: str, replies: list[str]):
        self.id, self.replies = id, list(replies)

    def drop_sessions(self, keys) -> None:
        pass

    def chat_generate(self, conversations, sampling, response_format=None) -> list[Completion]:
        out = []
        for conv in conversations:
            first_user = next((i for i, m in enumerate(conv) if m["role"] == "user"), len(conv))
            k = sum(m["role"] == "assistant" for m in conv[first_user:])  # (a greeting before it is not counted)
            last = next((m["content"] for m in reversed(conv) if m["role"] == "user"), "")
            text = self.replies[k % len(self.replies)].replace("{last_user}", last)
            out.append(Completion(text=text, token_ids=[], logprobs=[], finish_reason="eos", model_id=self.id))
        return out


class StudyAgent:
    """The agent of one (condition, task type) cell: its binding, environment class and options."""

    def __init__(self, name: str, spec: AgentSpec, task_type: TaskType, base_dir: str = "", seed: int = 0):
        self.name, self.task_type = name, task_type
        self.env_cls = get_env(task_type.env)
        options: dict[str, Any] = {}
        sampling = SamplingParams(temperature=0.7, max_new_tokens=256)
        self.lock = threading.Lock()
        if spec.policy is not None:
            from ..policy import load_policy

            policy = spec.policy if spec.policy == "base" else _path(spec.policy, base_dir)
            if policy != "base" and not os.path.isdir(policy):
                raise ConfigError(f"condition {name}: policy {policy} is not a checkpoint directory")
            cfg, _, b = load_policy(policy, _path(spec.config, base_dir) if spec.config else None,
                                       spec.model, list(spec.set))
            trained_on = cfg.env.name
            if (policy != "base" or spec.config) and trained_on != task_type.env:
                raise ConfigError(f"condition {name}: the policy was trained on {trained_on!r}, the task type "
                                  f"is {task_type.env!r}")
            if trained_on == task_type.env:
                options.update(cfg.env.options)
            self.binding = b
            self.max_context = cfg.rollout.max_context
        elif spec.endpoint is not None:
            from ..models.openai_backend import OpenAIRef

            ref = OpenAIRef.from_config(name, spec.endpoint, seed)
            self.binding = Binding(id=name, ref=ref, sampling=sampling)
            self.max_context = None
        else:  # scripted replies; a fixed King of the Hill team never speaks
            self.binding = Binding(id=name, ref=ScriptedRef(name, spec.scripted or [""]), sampling=sampling)
            self.max_context = None
        options.update(task_type.options)
        if task_type.env == "koth":
            options["team"] = spec.team or "llm"
        if task_type.env == "p4g":  # a person decides on their own: the study's turn cap, no forced decision
            options.update(max_turns=task_type.turn_cap(), force_decision=False)
        self.options = {k: v for k, v in options.items() if k in self.env_cls.option_names()}
        unknown = sorted(set(task_type.options) - self.env_cls.option_names())
        if unknown:
            raise ConfigError(f"task type {task_type.env}: unknown environment options {unknown}")
        try:
            self.options = self.env_cls.check_options(self.options, where=f"task type {task_type.env}: options")
        except ValueError as e:
            raise ConfigError(str(e)) from None
        sp = self.binding.sampling
        self.binding.sampling = SamplingParams(
            temperature=sp.temperature if spec.temperature is None else spec.temperature, top_p=sp.top_p,
            max_new_tokens=sp.max_new_tokens if spec.max_new_tokens is None else spec.max_new_tokens, stop=sp.stop)

    def new_env(self, task, seed: int):
        env = self.env_cls(task, random.Random(seed), **self.options)
        if self.binding.note:
            env.add_note("agent", self.binding.note)
        return env

    def reply(self, env, on_text=None) -> str:
        """The agent's next reply in ``env`` (raises when the model call fails). With ``on_text``, the reply
        is streamed: ``on_text(text so far)`` as it is generated, by a local model (token by token) or an
        endpoint (``stream: true``); a scripted reply arrives whole."""
        import dataclasses

        from ..rollout import chat_complete

        prefix = env.reply_prefix("agent")
        ref, sp = self.binding.ref, self.binding.sampling
        with self.lock:  # one local model call at a time (an endpoint batches on its side)
            if on_text is not None and hasattr(ref, "chat_stream"):
                out = ref.chat_stream(env.views["agent"], sp, on_text)
            else:
                if on_text is not None and not getattr(ref, "chat", False):  # a local model: after each token
                    sp = dataclasses.replace(sp, stop_fn=lambda text: on_text(prefix + text) or False)
                out = chat_complete(ref, [env.views["agent"]], sp, prefix=prefix)[0]
        if isinstance(out, BaseException):
            raise out
        if on_text is not None:  # the whole reply (a scripted one arrives only now; a streamed one is complete)
            on_text(out.text)
        return out.text


def build_agents(cfg: StudyConfig) -> dict[tuple[str, str], StudyAgent]:
    """Every cell's agent; checkpoints that several cells share are loaded once."""
    agents: dict[tuple[str, str], StudyAgent] = {}
    cache: dict[str, StudyAgent] = {}
    for cond, per in cfg.conditions.items():
        for tt, spec in per.items():
            key = json.dumps([spec.model_dump(), cfg.tasks[tt].model_dump()], sort_keys=True, default=str)
            if key not in cache:
                cache[key] = StudyAgent(f"{cond}/{tt}", spec, cfg.tasks[tt], cfg.base_dir)
            agents[(cond, tt)] = cache[key]
    return agents


def _path(p: str, base_dir: str) -> str:
    return p if os.path.isabs(p) or not base_dir else os.path.join(base_dir, p)


# ---- tasks -------------------------------------------------------------------------------------------
class TaskBank:
    """The tasks of each task type (the split, or the listed ids), loaded once."""

    def __init__(self, cfg: StudyConfig, agents: dict[tuple[str, str], StudyAgent]):
        self.tasks: dict[str, list] = {}
        for tt, ttc in cfg.tasks.items():
            agent = next(a for (c, t), a in agents.items() if t == tt)
            try:
                tasks = agent.env_cls.load_tasks(ttc.split, **agent.options)
            except (FileNotFoundError, ValueError) as e:
                raise ConfigError(f"task type {tt}: {e}") from None
            if ttc.task_ids is not None:
                by_id = {t.id: t for t in tasks}
                missing = [i for i in ttc.task_ids if i not in by_id]
                if missing:
                    raise ConfigError(f"task type {tt}: no tasks {missing} in split {ttc.split!r}")
                tasks = [by_id[i] for i in ttc.task_ids]
            if not tasks:
                raise ConfigError(f"task type {tt}: split {ttc.split!r} has no tasks")
            self.tasks[tt] = tasks

    def pick(self, task_type: str, n: int):
        """The task of a cell's n-th participant: every condition walks the same task order."""
        ts = self.tasks[task_type]
        return ts[n % len(ts)]

    def get(self, task_type: str, task_id: str):
        for t in self.tasks[task_type]:
            if t.id == task_id:
                return t
        raise KeyError(f"task {task_id} is not among task type {task_type}'s tasks")


def env_seed(session_id: str) -> int:
    import hashlib

    return int(hashlib.sha256(session_id.encode()).hexdigest()[:8], 16)
