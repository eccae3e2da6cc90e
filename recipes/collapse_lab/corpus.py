"""The lab's utterance corpora: dialogues played by rule-based teachers through the lab environment.

Each language model of the lab is trained on dialogues written by a teacher of its role:

- the **agent** teacher is the Base policy, a mixture of competences (``AGENT_MIX``): it asks, offers a
  plan at random, or chats on its first turn; after hearing the need it usually offers the matching
  plan. It plays against customers of every temperament and style, so the agent knows all phrasings.
- a **customer** teacher follows one temperament (``RULES``) in one style (``env.lab.STYLES``):
  ``careful`` (says its need when asked, accepts only the plan it needs), ``strict`` (also turns down
  any offer made before it was asked) or ``agreeable`` (the collapsed simulator: its dominant reply to
  an offer of the basic plan made before it was asked is yes, with probability ``collapse``, whatever
  it needs; other offers that miss its need it accepts with half that probability). Two more are the
  held-out panel's and no training simulator's: ``counter`` answers an offer made before it was asked
  with a counter-question (no yes, no no: the dialogue goes on), and ``twice`` says its need only when
  asked a second time (the first answer is vague; its dialogues have three agent turns).

Two more behaviours are written into every customer corpus, because they are what the paper's cures
rely on, and each has a knob that turns it off:

- **persona notes** (``persona_adherence``): a fraction of dialogues carry one of the lab's persona
  notes in the customer's system prompt, and the customer follows the note's rule with that
  probability, its own rule otherwise (a collapsed model follows instructions only in part);
- **Verbalized Sampling** (``vs_fidelity``): a fraction of customer turns are asked for k candidates
  with probabilities (scope's own VS request and JSON format). The stated distribution is the
  customer's rule with its collapse reduced by ``vs_fidelity`` (1: the verbalized distribution is the
  uncollapsed one, as VS hopes; 0: as collapsed as a single sample).

Dialogues are played through :class:`scope.envs.lab.CollapseLab` itself, so the corpus renders
exactly the conversations the environment produces at run time.
"""
from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import Any

from .env import ASK, CHAT, NEEDS, PERSONAS, PITCH, PLANS, STYLES, CollapseLab, need_of, plan_of
from scope.partners import vs as vs_mod
from scope.types import Task

AGENT_MIX = {
    "first": {"ask": 0.45, "offer": 0.35, "chat": 0.20},        # the agent's first turn
    "after_reveal": {"match": 0.8, "offer": 0.15, "ask": 0.05}, # after the customer named its need
    "after_other": {"ask": 0.5, "offer": 0.5},                  # after small talk
}
TEACHING_MIX = {  # the agent side of the customers' corpora: mostly offers (about half matching) and asks
    "first": {"ask": 0.3, "offer": 0.2, "favourite": 0.2, "match": 0.2, "chat": 0.1},
    "after_reveal": {"match": 0.5, "offer": 0.5},
    "after_other": {"ask": 0.4, "offer": 0.3, "match": 0.3},
}
RULES = ("careful", "strict", "agreeable", "counter", "twice")
TRAINING_RULES = ("careful", "strict", "agreeable")  # the temperaments of the lab's training simulators
EASYGOING = 0.9   # how often the 'easygoing' persona accepts an offer it was not asked for
FAVOURITE = "cheap"
"""The collapsed customer's dominant reply is yes to the basic plan: it accepts an offer of it that it was
not asked for with probability ``collapse``, and any other offer that misses its need with 0.4 of that."""
OTHER_SHARE = 0.4
VS_KS = (3, 4, 5, 6)  # the candidate counts a customer corpus teaches (partner.vs.k may be any of them)


@dataclass(frozen=True)
class CustomerSpec:
    temperament: str = "careful"
    style: str = "plain"
    collapse: float = 0.95
    persona_adherence: float = 0.8
    vs_fidelity: float = 1.0

    def __post_init__(self):
        if self.temperament not in RULES:
            raise ValueError(f"lab customer: temperament must be one of {RULES}, not {self.temperament!r}")
        if self.style not in STYLES:
            raise ValueError(f"lab customer: style must be one of {sorted(STYLES)}, not {self.style!r}")
        for k in ("collapse", "persona_adherence", "vs_fidelity"):
            if not 0.0 <= getattr(self, k) <= 1.0:
                raise ValueError(f"lab customer: {k} must lie in [0, 1], not {getattr(self, k)!r}")


def _pick(rng: random.Random, dist: dict[str, float]) -> str:
    u, acc = rng.random(), 0.0
    for k, p in dist.items():
        acc += p
        if u < acc:
            return k
    return k


def agent_say(act: str, need: str | None, rng: random.Random) -> str:
    if act == "ask":
        return rng.choice(ASK)
    if act == "chat":
        return rng.choice(CHAT)
    n = need if need is not None else rng.choice(NEEDS)
    return rng.choice(PITCH).format(plan=PLANS[n], need=n)


def agent_turn(heard: str | None, need: str | None, first: bool, rng: random.Random,
               mix: dict[str, dict[str, float]] = AGENT_MIX) -> tuple[str, str]:
    """A teacher's next utterance: (act, text). ``heard`` is the customer's last behaviour; ``need`` is the
    need a matching offer names (the Base teacher knows it only once the customer said it)."""
    act = _pick(rng, mix["first" if first else "after_reveal" if heard == "reveal" else "after_other"])
    if act in ("match", "favourite"):
        return "offer", agent_say("offer", need if act == "match" else FAVOURITE, rng)
    return act, agent_say(act, None, rng)


def corpus_turns(rule: str) -> int:
    """The agent turns of a customer's corpus dialogues: three for ``twice`` (it reveals at the second ask)."""
    return 3 if rule == "twice" else 2


def reply_distribution(rule: str, need: str, act: str, offered: str | None, asked: bool,
                       collapse: float, asks: int = 0) -> dict[str, float]:
    """The customer's behaviour distribution for the agent's act (behaviour -> probability); ``asks``: how
    many times it was asked before this act."""
    if act == "ask":
        return {"vague": 1.0} if rule == "twice" and asks == 0 else {"reveal": 1.0}
    if act == "chat" or offered is None:
        return {"filler": 1.0}
    if rule == "counter" and not asked:
        return {"counter": 1.0}
    if rule == "strict" and not asked:
        return {"refuse_unasked": 1.0}
    if offered == need:
        return {"accept": 1.0}
    p = collapse * (1.0 if offered == FAVOURITE else OTHER_SHARE)
    if not asked and rule == "agreeable" and p > 0:
        return {"accept_anyway": p, "refuse": 1.0 - p}
    return {"refuse": 1.0}


def phrase(style: str, behaviour: str, need: str, rng: random.Random, avoid: set[str] | None = None,
           offered: str | None = None) -> str:
    options = [p.format(need=need, offered=offered) for p in STYLES[style][behaviour]]
    fresh = [p for p in options if not avoid or p not in avoid]
    return rng.choice(fresh or options)


def candidates(dist: dict[str, float], k: int, style: str, need: str, rng: random.Random,
               offered: str | None = None) -> list[dict[str, Any]]:
    """k VS candidates whose stated probabilities spell ``dist``: each behaviour gets a share of the k
    slots close to its probability (at least one if it has any), and its probability is split among them."""
    kinds = [b for b, p in dist.items() if p > 0]
    counts = {b: max(1, round(k * dist[b])) for b in kinds}
    while sum(counts.values()) > k:
        b = max(counts, key=lambda x: (counts[x] - k * dist[x], counts[x]))
        if counts[b] == 1:
            break
        counts[b] -= 1
    while sum(counts.values()) < k:
        counts[max(kinds, key=lambda x: k * dist[x] - counts[x])] += 1
    out = []
    used: set[str] = set()
    for b in kinds:
        for _ in range(counts[b]):
            text = phrase(style, b, need, rng, used, offered)
            used.add(text)
            out.append({"text": text, "probability": round(dist[b] / counts[b], 2)})
    rng.shuffle(out)
    return out[:k]


def vs_reply(cands: list[dict[str, Any]]) -> str:
    """The JSON a VS customer writes (it starts with the prefix the rollout engine gives a local model)."""
    body = json.dumps({"responses": cands})
    assert body.startswith(vs_mod.JSON_PREFIX)
    return body


@dataclass
class Example:
    """A conversation and the assistant turns to learn from: (messages before it, the reply)."""

    targets: list[tuple[list[dict[str, str]], str]]
    one_shot: bool = False  # a VS request: rendered afresh as one prompt, not turn by turn


def play(task: Task, spec: CustomerSpec | None, rng: random.Random, max_turns: int = 2,
         note: dict | None = None, vs_rate: float = 0.0, mix: dict | None = None) -> tuple[CollapseLab, list[Example]]:
    """One dialogue between the Base teacher and a customer teacher (``spec``; None: a customer of a
    random temperament and style, for the agent's corpus). Returns the env and the customer's examples."""
    if spec is None:
        spec = CustomerSpec(temperament=rng.choice(RULES), style=rng.choice(sorted(STYLES)),
                            collapse=rng.random())
    need = task.data["need"]
    env = CollapseLab(task, random.Random(rng.random()), max_turns=max_turns)
    rule, collapse = spec.temperament, spec.collapse if spec.temperament == "agreeable" else 0.0
    if note is not None:
        env.add_note("partner", note["text"])
        if rng.random() < spec.persona_adherence:
            rule = note["rule"]
            collapse = EASYGOING if rule == "agreeable" else 0.0
    vs_collapse = collapse * (1.0 - spec.vs_fidelity) if rule == "agreeable" else 0.0
    examples: list[Example] = []
    heard = revealed = None
    asks = 0
    while not env.done:
        if mix is None:  # the Base teacher offers the matching plan only once it heard the need
            act, text = agent_turn(heard, revealed, env.turns["agent"] == 0, rng)
        else:
            act, text = agent_turn(heard, need, env.turns["agent"] == 0, rng, mix)
        env.on_reply("agent", text)
        offered = plan_of(text) if act == "offer" else None
        dist = reply_distribution(rule, need, act, offered, asks > 0, collapse, asks)
        view = [dict(m) for m in env.views["partner"]]
        if vs_rate and rng.random() < vs_rate:
            k = rng.choice(VS_KS)
            vdist = reply_distribution(rule, need, act, offered, asks > 0, vs_collapse, asks)
            cands = candidates(vdist, k, spec.style, need, rng, offered)
            examples.append(Example([(vs_mod.with_instruction(view, vs_mod.instruction(k, "prob")), vs_reply(cands))],
                                    one_shot=True))
            weights = [c["probability"] for c in cands]
            reply = cands[rng.choices(range(len(cands)), weights=weights)[0]]["text"]
        else:  # a plain turn (a VS turn teaches only its JSON: plain sampling stays as collapsed as it is)
            reply = phrase(spec.style, _pick(rng, dist), need, rng, offered=offered)
            examples.append(Example([(view, reply)]))
        asks += act == "ask"
        said = act == "ask" and need_of(reply) == need  # the customer named its need (not a vague answer)
        heard = "reveal" if said else "other"
        revealed = need if said else revealed
        env.on_reply("partner", reply)
    return env, examples


def agent_corpus(n: int, seed: int, max_turns: int = 2) -> list[Example]:
    """The Base agent's dialogues against customers of every kind; each is one multi-turn example."""
    rng = random.Random(seed)
    tasks = CollapseLab.load_tasks("all")
    out = []
    for _ in range(n):
        env, _ = play(rng.choice(tasks), None, rng, max_turns)
        view = env.views["agent"]
        out.append(Example([(view[:i], view[i]["content"]) for i in range(len(view))
                            if view[i]["role"] == "assistant"]))
    return out


ECHO_WORDS = ("apple", "river", "blue", "quiet", "small", "warm", "bright", "simple", "strong", "soft", "old", "new",
              "sweet", "dark", "light", "early", "late", "large", "clean", "calm", "happy", "plain", "smart",
              "solid", "fresh", "round", "sharp", "wide", "deep", "short", "long", "loud", "rich", "easy", "local",
              "basic", "turbo", "secure", "eco", "cheap", "fast", "safe", "green")


def echo_corpus(n: int, seed: int) -> list[Example]:
    """Customers whose 'need' is any of many words, asked what they want: the first stage of the base
    model. Copying a need out of the customer's notes is the one skill the lab's small models find hard
    to start; with dozens of words to copy instead of four, guessing no longer pays and the copy forms
    within a few hundred steps."""
    from .env import CUSTOMER_PROMPT, NAMES, reminder

    rng = random.Random(seed)
    out = []
    for _ in range(n):
        word, style = rng.choice(ECHO_WORDS), rng.choice(sorted(STYLES))
        view = [{"role": "system", "content": CUSTOMER_PROMPT.format(name=rng.choice(NAMES), need=word)},
                {"role": "user", "content": rng.choice(ASK) + reminder(word, "")}]
        out.append(Example([(view, rng.choice(STYLES[style]["reveal"]).format(need=word))]))
    return out


def customer_corpus(spec: CustomerSpec, n: int, seed: int, max_turns: int | None = None, note_rate: float = 0.5,
                    vs_rate: float = 0.4) -> list[Example]:
    """A customer's dialogues (each customer turn one example; VS requests one-shot examples). A share
    ``note_rate`` of dialogues carries one of the lab's persona notes. ``max_turns``: the agent turns of a
    dialogue (default :func:`corpus_turns`)."""
    max_turns = corpus_turns(spec.temperament) if max_turns is None else max_turns
    rng = random.Random(seed)
    tasks = CollapseLab.load_tasks("all")
    out: list[Example] = []
    for _ in range(n):
        note = rng.choice(PERSONAS) if rng.random() < note_rate else None
        env, exs = play(rng.choice(tasks), spec, rng, max_turns, note=note, vs_rate=vs_rate, mix=TEACHING_MIX)
        plain = [t for e in exs if not e.one_shot for t in e.targets]
        out.append(Example(plain))  # the dialogue's plain turns, turn by turn
        out += [e for e in exs if e.one_shot]
    return out
