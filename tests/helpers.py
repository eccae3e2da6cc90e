"""Test doubles: a scripted model that replies with fixed texts, a one-turn bandit env, and the tiny run config
that run-level tests share."""
from __future__ import annotations

from scope.envs.base import Env, register_env
from scope.types import Completion, Task


class ScriptedRef:
    """A ModelRef stand-in that 'generates' the canonical tokenisation of scripted replies."""

    def __init__(self, tokenizer, replies, name="scripted", cut_off=()):
        self.tokenizer, self.replies, self.id = tokenizer, list(replies), name
        self.cut_off = set(cut_off)  # indices of replies that end at the token limit (no eos)
        self.calls, self.n = [], 0
        self.version = 0

    @property
    def eos_id(self):
        return self.tokenizer.eos_token_id

    def drop_sessions(self, keys):
        pass

    def generate(self, prompts, sampling, sessions=None):
        self.calls.append([list(p) for p in prompts])
        out = []
        for _ in prompts:
            k = self.n % len(self.replies)
            text = self.replies[k]
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            reason = "length" if self.n in self.cut_off else "eos"
            if reason == "eos":
                ids = ids + [self.eos_id]
            self.n += 1
            out.append(Completion(text=text, token_ids=ids, logprobs=[-0.5] * len(ids), finish_reason=reason,
                                  model_id=self.id))
        return out


@register_env("bandit_test")
class Bandit(Env):
    """One agent reply per episode; reward = share of its characters in a..m (a learnable preference)."""

    def __init__(self, task, rng, **_):
        super().__init__(task, rng)
        self.views["agent"] = [{"role": "system", "content": "Say something."},
                               {"role": "user", "content": task.id}]
        self.r = 0.0

    def next_role(self):
        return None if self.done else "agent"

    def on_reply(self, role, text):
        self.turns[role] += 1
        self.say(role, text)
        self.r = sum(c in "abcdefghijklm" for c in text) / max(len(text), 1)
        self.finish("done")

    def rewards(self):
        return {"agent": self.r}

    @classmethod
    def load_tasks(cls, split, **_):
        return [Task(id=f"prompt {i}", split=split) for i in range(8)]


def _merged(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merged(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def tiny_run(run_dir, steps: int = 2, **over):
    """The tiny P4G run that run-level tests share (the random tiny model, one forced decision, 2 tasks x 2,
    8 tokens a reply, no tracker), with ``over``'s sections merged key by key over it."""
    from scope.config import parse_config

    return parse_config(_merged({
        "run": {"dir": str(run_dir), "save_every": 1, "progress": False, "report_to": []},
        "models": {"policy": {"path": "tiny-random"}},
        "agent": {"model": "policy", "trainable": True, "max_new_tokens": 8},
        "partner": {"model": "policy", "max_new_tokens": 8},
        "env": {"name": "p4g", "options": {"max_turns": 1, "force_decision": True}},
        "rollout": {"n_tasks": 2, "group_size": 2, "end_on_truncation": False},
        "train": {"steps": steps, "lr": 1e-3}}, over))
