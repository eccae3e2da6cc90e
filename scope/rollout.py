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

import random
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from .envs.base import Env
from .partners import vs as vs_mod
from .contracts import is_chat, token_model
from .partners.binding import Binding
from .types import Completion, Episode, Readout, SamplingParams, Task, Trace


Session = tuple[str, int]
"""A dialogue's session: (namespace, index). The models keep each session's key/values between its turns;
every caller that builds jobs names its own namespace (train, eval, probe, ...), so that two sets of jobs
never share a session, whatever their sizes."""


@dataclass
class Job:
    """One episode to run: its env, its record, the Binding of each role (who plays it, how) and its session."""

    env: Env
    episode: Episode
    bindings: dict[str, Binding]
    uid: Session = ("", 0)
    stop_after: dict[str, int] | None = None
    """Role -> its number of replies after which the dialogue ends ("replay_end", not graded): a replayed
    agent's recorded turns."""
    replies: dict[str, int] = field(default_factory=dict)


@dataclass
class Play:
    """What one job plays: a task, its episode record, who plays each role, and the environment's options
    when they are not the builder's. ``env_seed``: the environment's seed when the caller draws it itself
    (default: drawn by :func:`make_jobs`, in order)."""

    task: Task
    episode: Episode
    bindings: dict[str, Any]
    options: dict[str, Any] | None = None
    env_seed: float | None = None
    stop_after: dict[str, int] | None = None


def make_jobs(env_cls: type[Env], plays: list[Play], options: dict[str, Any], rng: random.Random,
              namespace: str) -> list[Job]:
    """One job per play, each with its own environment, seeded from ``rng`` (one draw per play, in order), and
    its own session ``(namespace, i)``. Every caller builds its jobs here."""
    return [Job(env=env_cls(p.task, random.Random(rng.random() if p.env_seed is None else p.env_seed),
                            **(options if p.options is None else p.options)),
                episode=p.episode, bindings=p.bindings, uid=(namespace, i), stop_after=p.stop_after)
            for i, p in enumerate(plays)]


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


def _as_binding(role: str, x: Any, sampling: dict[str, SamplingParams] | None) -> Binding:
    if isinstance(x, Binding):
        return x
    if sampling is None or role not in sampling:
        raise ValueError(f"role {role!r} is bound to a bare model ref but has no sampling settings")
    return Binding(id=x.id, ref=x, sampling=sampling[role])


def _sp_key(sp: SamplingParams) -> tuple:
    return (sp.temperature, sp.top_p, sp.max_new_tokens, sp.stop)


def run_rollouts(jobs: list[Job], sampling: dict[str, SamplingParams] | None = None, max_context: int = 4096,
                 end_on_truncation: bool = True, progress: Callable[[str], None] | None = None,
                 judge: Binding | None = None,
                 between_rounds: Callable[[], None] | None = None) -> tuple[list[Episode], RolloutStats]:
    """Run every job to its end. ``Job.bindings[role]`` is a Binding (or a bare model ref, then sampled with
    ``sampling[role]``). ``judge`` answers the environments' judge requests (all in one batched call)
    before the rewards are computed. Returns the episodes and throughput statistics.

    Each round: every live dialogue says who replies next (``_requests``); the requests that share a model,
    sampling settings, transport and decoder go in one batched call; each reply goes back to its environment
    (``_deliver``). ``progress`` gets a line after each round (an ETA from the share of dialogues that
    ended); ``between_rounds`` runs there too (an asynchronous generator takes up newer weights)."""
    from .run import eta

    stats = RolloutStats()
    t0 = time.time()
    _start(jobs, sampling)
    live = [j for j in jobs if not j.env.done]
    while live:
        stats.rounds += 1
        pending: dict[tuple, list[_Req]] = {}
        for j in live:
            for req in _requests(j, max_context):
                b = req.binding
                decoder = None if b.vs is None else b.vs.model_dump_json()
                pending.setdefault((id(b.ref), _sp_key(b.sampling), req.transport, id(req.readout), decoder),
                                   []).append(req)
        for (_, _, transport, _, _), items in pending.items():
            if transport == "tokens":
                _run_token_requests(items, stats)
            elif transport == "readout":
                _run_readout_requests(items, stats)
            else:
                _run_text_requests(items, stats)
            _deliver(items, end_on_truncation)
        live = [j for j in live if not j.env.done and j.episode.status != "failed"]
        if progress:
            took = time.time() - t0
            progress(f"round {stats.rounds}: {len(live)}/{len(jobs)} dialogues live, "
                     f"{stats.tokens_generated} tokens, {took:.0f} s ({eta(took, len(jobs) - len(live), len(live))})")
        if between_rounds is not None and live:
            between_rounds()
    if judge is not None:
        _judge(jobs, judge, stats)
    episodes = [_finish(j, max_context) for j in jobs]
    stats.seconds = time.time() - t0
    return episodes, stats


def _start(jobs: list[Job], sampling: dict[str, SamplingParams] | None) -> None:
    """Bindings for bare refs, a trace per role, the bindings' notes in the environments, who played."""
    for j in jobs:
        j.bindings = {r: _as_binding(r, x, sampling) for r, x in j.bindings.items()}
        for r in j.env.roles:
            j.episode.traces.setdefault(r, Trace(role=r))
        for r, b in j.bindings.items():
            if b.note:
                j.env.add_note(r, b.note)
        j.episode.meta.setdefault("partner", j.bindings["partner"].id if "partner" in j.bindings else None)
        j.episode.meta.setdefault("models", {r: b.id for r, b in j.bindings.items()})


def _requests(j: Job, max_context: int) -> list[_Req]:
    """This round's requests of one dialogue: usually one role; roles that act at once (coop_coding) reply in
    one round. Empty when the dialogue ends here (no role left, a context limit, or a failure, recorded)."""
    roles = j.env.next_roles()
    if not roles:
        j.env.finish(j.env.end_reason or "done")
        return []
    if j.stop_after and any(j.replies.get(r, 0) >= j.stop_after[r] for r in roles if r in j.stop_after):
        j.env.finish("replay_end")
        return []
    reqs = []
    for role in roles:
        b = j.bindings[role]
        # how the reply travels: token ids to a local model (its trace built from them), a decision readout,
        # or text (an endpoint, or Verbalized Sampling's candidates, which are not trained on)
        transport = "text" if b.vs is not None or is_chat(b.ref) else "tokens"
        req = _Req(j, role, b, transport)
        try:
            req.readout = j.env.reply_readout(role)
            if req.readout is not None:
                if transport != "tokens":
                    kind = "Verbalized Sampling" if b.vs else "an endpoint"
                    raise ValueError(f"role {role!r}: a decision readout needs a local model with plain "
                                     f"decoding, not {b.id!r} ({kind})")
                req.transport = transport = "readout"
            req.prefix = j.env.reply_prefix(role)
            if transport in ("tokens", "readout"):
                tok = token_model(b.ref).tokenizer
                req.prompt = prepare_turn(j.episode.traces[role], tok, j.env.views[role], req.prefix,
                                          limit=max_context - b.sampling.max_new_tokens)
        except Exception as e:  # a broken template or env: this episode fails, the others go on
            _fail(j, e)
            return []
        if transport in ("tokens", "readout") and req.prompt is None:
            j.env.finish("context_limit")
            return []
        reqs.append(req)
    return reqs


def _deliver(items: list[_Req], end_on_truncation: bool) -> None:
    """Each answered request's reply (and readout) to its environment; a reply cut off at its token limit is
    counted and, by default, ends the dialogue."""
    for req in items:
        j = req.job
        if j.episode.status == "failed":  # another role's reply of this round failed it
            continue
        if req.error is not None:
            _fail(j, req.error)
            continue
        try:
            if req.dist is not None:
                j.env.on_readout(req.role, req.dist)
            j.env.on_reply(req.role, req.text)
        except Exception as e:
            _fail(j, e)
            continue
        j.replies[req.role] = j.replies.get(req.role, 0) + 1
        if req.finish_reason == "length":
            cut = j.episode.truncated_replies
            cut[req.role] = cut.get(req.role, 0) + 1
            if end_on_truncation and not j.env.done:
                j.env.finish("truncated")


def _finish(j: Job, max_context: int) -> Episode:
    """The finished episode: its sessions dropped, its status and rewards, each trace closed, the transcript."""
    ep = j.episode
    for r, b in j.bindings.items():
        b.ref.drop_sessions([(j.uid, r), (j.uid, r, "text")])
    if ep.status != "failed":
        ep.status = j.env.end_reason or "done"
        try:
            if ep.status != "replay_end":
                ep.rewards = {k: float(v) for k, v in j.env.rewards().items()}
        except Exception as e:
            _fail(j, e)
        for r, b in j.bindings.items():
            if not is_chat(b.ref):
                close_trace(ep.traces[r], token_model(b.ref).tokenizer, j.env.views[r], limit=max_context)
    ep.messages = j.env.transcript
    ep.meta.update(j.env.meta)
    ep.turns = dict(j.env.turns)
    return ep


@dataclass
class _Req:
    job: Job
    role: str
    binding: Binding
    transport: str  # "tokens", "readout" or "text"
    prompt: list[int] | None = None
    prefix: str = ""
    text: str = ""
    finish_reason: str = "eos"
    error: BaseException | None = None
    readout: Readout | None = None
    dist: dict[Any, float] | None = None


def _count(stats: RolloutStats, model_id: str, n: int) -> None:
    stats.tokens_generated += n
    stats.per_model[model_id] = stats.per_model.get(model_id, 0) + n


def _prompts(items: list[_Req]) -> list[list[int]]:
    """The token prompts of requests to a local model (every one was prepared; a prompt too long ended its
    episode before it got here)."""
    out = [r.prompt for r in items]
    if any(p is None for p in out):
        raise ValueError("a request to a local model without its token prompt")
    return [p for p in out if p is not None]


def _run_token_requests(items: list[_Req], stats: RolloutStats) -> None:
    """Local model, plain decoding: extend each role's token buffer with exactly what was sampled."""
    b = items[0].binding
    tm = token_model(b.ref)
    try:
        outs = tm.generate(_prompts(items), b.sampling, sessions=[(r.job.uid, r.role) for r in items])
    except Exception as e:  # the model call failed for all of them
        for r in items:
            r.error = e
        return
    stats.calls += 1
    for r, c in zip(items, outs):
        if isinstance(c, BaseException):  # an engine backend fails requests one by one
            r.error = c
            continue
        _count(stats, c.model_id, len(c.token_ids))
        try:
            r.text = r.prefix + record_reply(r.job.episode.traces[r.role], tm.tokenizer, c, tm.eos_id)
            r.finish_reason = c.finish_reason
        except Exception as e:
            r.error = e


def _run_readout_requests(items: list[_Req], stats: RolloutStats) -> None:
    """Local model, decision readout: the exact decision distribution of each reply, and a reply drawn from
    it, recorded in the role's trace as generated (mask 1, its sampling log-probs)."""
    b = items[0].binding
    readout = items[0].readout
    assert readout is not None
    tm = token_model(b.ref)
    try:
        outs = tm.readout(_prompts(items), b.sampling, readout)
    except Exception as e:  # the model call failed for all of them
        for r in items:
            r.error = e
        return
    stats.calls += 1
    for r, res in zip(items, outs):
        c = res.completion
        _count(stats, c.model_id, len(c.token_ids))
        try:
            r.text = r.prefix + record_reply(r.job.episode.traces[r.role], tm.tokenizer, c, tm.eos_id)
            r.finish_reason, r.dist = c.finish_reason, res.dist
        except Exception as e:
            r.error = e


def chat_complete(ref: Any, convs: list[list[dict[str, str]]], sp: SamplingParams, response_format=None,
          prefix: str = "", sessions: list | None = None) -> list[Completion | BaseException]:
    """One batched text call to either kind of model. A local model renders and tokenises afresh (its
    key/values are reused per session up to the first changed token), and can be given the start of
    its reply (``prefix``, returned as part of the text)."""
    if getattr(ref, "chat", False):
        return ref.chat_generate(convs, sp, response_format=response_format)
    tok = ref.tokenizer
    try:
        prompts = [encode(tok, render(tok, c, True) + prefix) for c in convs]
        outs = list(ref.generate(prompts, sp, sessions=sessions))
    except Exception as e:
        return [e] * len(convs)
    for c in outs:
        if not isinstance(c, BaseException):
            c.text = prefix + c.text
    return outs


def _run_text_requests(items: list[_Req], stats: RolloutStats) -> None:
    """Text in, text out (an endpoint, or a local model under Verbalized Sampling): nothing is trained on
    these turns. A binding's decoder says how a reply is asked for: plainly, or by Verbalized Sampling
    (:func:`scope.partners.vs.decode`)."""
    b = items[0].binding
    for r in items:
        r.job.episode.traces[r.role].n_turns += 1

    def sessions(reqs):
        return [(r.job.uid, r.role, "text") for r in reqs]

    def count(model_id: str, n: int) -> None:
        _count(stats, model_id or b.id, n)

    def chat(convs, sp, response_format=None, prefix="", sessions=None) -> list[Completion | BaseException]:
        stats.calls += 1
        return chat_complete(b.ref, convs, sp, response_format=response_format, prefix=prefix, sessions=sessions)

    if b.vs is None:
        outs = chat([r.job.env.views[r.role] for r in items], b.sampling, sessions=sessions(items))
        for r, c in zip(items, outs):
            if isinstance(c, BaseException):
                r.error = c
            else:
                r.text, r.finish_reason = c.text, c.finish_reason
                count(c.model_id, len(c.token_ids))
        return
    starts: dict[str, list[_Req]] = {}  # replies the env forces to begin a certain way are asked for apart
    for r in items:
        starts.setdefault(r.prefix, []).append(r)
    for start, group in starts.items():
        asks = [vs_mod.Ask(r.job.env.views[r.role], r.job.env.rng, s) for r, s in zip(group, sessions(group))]
        outcomes = vs_mod.decode(asks, b.vs, b.sampling, start, chat, count, local=not is_chat(b.ref),
                                 schema=bool(getattr(b.ref, "json_schema", False)))
        for r, o in zip(group, outcomes):
            r.text, r.finish_reason, r.error = o.text, o.finish_reason, o.error
            r.job.episode.vs.append({"role": r.role, **o.record})


def _judge(jobs: list[Job], judge: Binding, stats: RolloutStats) -> None:
    """One batched text call for every judge request of the finished episodes."""
    asks = []
    for j in jobs:
        if j.episode.status != "failed":
            try:
                reqs = j.env.judge_requests()
            except Exception as e:  # noqa: BLE001
                _fail(j, e)
                continue
            asks += [(j, k, conv) for k, conv in enumerate(reqs)]
    if not asks:
        return
    outs = chat_complete(judge.ref, [conv for _, _, conv in asks], judge.sampling)
    stats.calls += 1
    replies: dict[int, list] = {}
    for (j, _, _), c in zip(asks, outs):
        replies.setdefault(id(j), [j, []])[1].append(None if isinstance(c, BaseException) else c.text)
        if not isinstance(c, BaseException):
            _count(stats, c.model_id or judge.id, len(c.token_ids))
    for j, texts in replies.values():
        try:
            j.env.set_judgements(texts)
        except Exception as e:  # noqa: BLE001
            _fail(j, e)


def _fail(j: Job, e: BaseException) -> None:
    j.episode.status = "failed"
    j.episode.error = f"{type(e).__name__}: {e}"
    j.env.done = True
