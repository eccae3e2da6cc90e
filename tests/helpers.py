"""Test doubles: a scripted model that replies with fixed texts, and a one-turn bandit env."""
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
