"""The turn-synchronous rollout engine.

Many dialogues run at once. In each round every live dialogue has exactly one pending request (the
role whose turn it is); the requests that go to the same model are generated in one batched call.
Each role's Trace is built as the dialogue runs, token in / token out:

1. before a role speaks, the chat-template text of its current view is rendered; the part not yet
   in its token buffer (the other role's reply, environment messages, the generation prompt) is
   tokenised and appended with mask 0;
2. the sampled ids are appended exactly as generated, with mask 1 and their sampling log-probs;
   a reply that did not end with the end-of-turn token gets one appended with mask 0.

The buffer is never re-tokenised. If a chat template does not extend the text of the previous turn
(some templates rewrite earlier turns), the episode fails with that reason instead of training on
tokens the model never saw.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

from .envs.base import Env
from .types import Completion, Episode, SamplingParams, Trace


@dataclass
class Job:
    """One episode to run: its env, its record and the ModelRef of each role."""

    env: Env
    episode: Episode
    refs: dict[str, Any]
    uid: int = 0


@dataclass
class RolloutStats:
    tokens_generated: int = 0
    calls: int = 0
    rounds: int = 0
    seconds: float = 0.0
    per_model: dict[str, int] = field(default_factory=dict)


def render(tokenizer, messages: list[dict[str, str]], add_generation_prompt: bool) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)


def encode(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


class TemplateDrift(RuntimeError):
    pass


def _delta(trace: Trace, tokenizer, text: str) -> list[int]:
    if not text.startswith(trace.covered_text):
        raise TemplateDrift(f"role {trace.role!r}: the chat template no longer starts with the text already "
                            f"in the token buffer; refusing to re-tokenise the conversation")
    return encode(tokenizer, text[len(trace.covered_text):])


def _append(trace: Trace, tokenizer, text: str, limit: int | None = None) -> bool:
    """Extend ``trace`` so that it spells ``text``; False (and no change) if it would pass ``limit``."""
    ids = _delta(trace, tokenizer, text)
    if limit is not None and len(trace.token_ids) + len(ids) > limit:
        return False
    trace.extend_context(ids)
    trace.covered_text = text
    return True


def prepare_turn(trace: Trace, tokenizer, view: list[dict[str, str]], prefix: str = "",
                 limit: int | None = None) -> list[int] | None:
    """Append the new context of ``view`` (and a forced reply ``prefix``) to ``trace``; return the prompt,
    or None if the prompt would be longer than ``limit``."""
    if not _append(trace, tokenizer, render(tokenizer, view, True) + prefix, limit):
        return None
    return trace.token_ids


def record_reply(trace: Trace, tokenizer, c: Completion, eos_id: int) -> str:
    """Append a completion to ``trace``; return the reply text as the role's message content."""
    trace.extend_generated(c.token_ids, c.logprobs, (c.model_id, c.model_version))
    ids = list(c.token_ids)
    if c.finish_reason == "eos":
        content_ids = ids[:-1]
    else:  # not ended by the model: close the turn with mask 0 so the next context is well formed
        content_ids = ids
        trace.extend_context([eos_id])
        ids = ids + [eos_id]
    trace.covered_text += tokenizer.decode(ids, skip_special_tokens=False)
    return tokenizer.decode(content_ids, skip_special_tokens=False)


def close_trace(trace: Trace, tokenizer, view: list[dict[str, str]], limit: int | None = None) -> None:
    """Append the rest of the final conversation (mask 0) so the buffer spells the whole template."""
    if not trace.token_ids:
        return
    try:
        _append(trace, tokenizer, render(tokenizer, view, False), limit)
    except TemplateDrift:
        pass


def run_rollouts(jobs: list[Job], sampling: dict[str, SamplingParams], max_context: int = 4096,
                 end_on_truncation: bool = True, progress: Callable[[str], None] | None = None
                 ) -> tuple[list[Episode], RolloutStats]:
    stats = RolloutStats()
    t0 = time.time()
    for j in jobs:
        for r in j.env.roles:
            j.episode.traces.setdefault(r, Trace(role=r))
        j.episode.meta.setdefault("models", {r: ref.id for r, ref in j.refs.items()})
    live = [j for j in jobs if not j.env.done]
    while live:
        stats.rounds += 1
        pending: dict[int, list[tuple[Job, str, list[int], str]]] = {}
        refs: dict[int, Any] = {}
        for j in live:
            role = j.env.next_role()
            if role is None:
                j.env.finish(j.env.end_reason or "done")
                continue
            ref = j.refs[role]
            tr = j.episode.traces[role]
            try:
                prefix = j.env.reply_prefix(role)
                prompt = prepare_turn(tr, ref.tokenizer, j.env.views[role], prefix,
                                      limit=max_context - sampling[role].max_new_tokens)
            except Exception as e:  # a broken template or env: this episode fails, the others go on
                _fail(j, e)
                continue
            if prompt is None:
                j.env.finish("context_limit")
                continue
            pending.setdefault(id(ref), []).append((j, role, prompt, prefix))
            refs[id(ref)] = ref
        for key, items in pending.items():
            ref = refs[key]
            role = items[0][1]
            sp = sampling[role]
            try:
                outs = ref.generate([p for _, _, p, _ in items], sp,
                                    sessions=[(j.uid, r) for j, r, _, _ in items])
            except Exception as e:  # the model call failed for all of them
                for j, _, _, _ in items:
                    _fail(j, e)
                continue
            stats.calls += 1
            for (j, r, _, prefix), c in zip(items, outs):
                stats.tokens_generated += len(c.token_ids)
                stats.per_model[c.model_id] = stats.per_model.get(c.model_id, 0) + len(c.token_ids)
                tr = j.episode.traces[r]
                try:
                    text = prefix + record_reply(tr, ref.tokenizer, c, ref.eos_id)
                    j.env.on_reply(r, text)
                except Exception as e:
                    _fail(j, e)
                    continue
                if c.finish_reason == "length" and end_on_truncation and not j.env.done:
                    j.env.finish("truncated")
        live = [j for j in live if not j.env.done and j.episode.status != "failed"]
        if progress:
            progress(f"round {stats.rounds}: {len(live)}/{len(jobs)} dialogues live, "
                     f"{stats.tokens_generated} tokens")
    episodes = []
    for j in jobs:
        ep = j.episode
        for r, ref in j.refs.items():
            ref.drop_sessions([(j.uid, r)])
        if ep.status != "failed":
            ep.status = j.env.end_reason or "done"
            try:
                ep.rewards = {k: float(v) for k, v in j.env.rewards().items()}
            except Exception as e:
                _fail(j, e)
            for r, ref in j.refs.items():
                close_trace(ep.traces[r], ref.tokenizer, j.env.views[r], limit=max_context)
        ep.messages = j.env.transcript
        ep.meta.update(j.env.meta)
        ep.meta["turns"] = dict(j.env.turns)
        episodes.append(ep)
    stats.seconds = time.time() - t0
    return episodes, stats


def _fail(j: Job, e: BaseException) -> None:
    j.episode.status = "failed"
    j.episode.error = f"{type(e).__name__}: {e}"
    j.env.done = True
