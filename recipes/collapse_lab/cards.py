"""Behaviour cards: what a lab customer model actually does, measured through the rollout engine.

A scripted agent makes each kind of move (an offer before asking: matching, of the basic plan when it
misses, of another plan that misses; asking and then offering, matching or not) against the customer
on every task, and the card reports how often the customer accepts, and how often it names its need
correctly when asked. A collapsed customer accepts the basic plan it was not asked for; a careful one
accepts only what matches; a strict one refuses everything it was not asked for.
"""
from __future__ import annotations

import os
import random
import time
from typing import Any, Callable

from .env import NEEDS, CollapseLab, classify_reply, need_of
from .corpus import FAVOURITE, agent_say
from scope.partners.binding import Binding
from scope.rollout import Play, make_jobs, run_rollouts
from scope.types import Completion, Episode, SamplingParams


class ScriptedAgent:
    """An agent that follows a fixed plan of moves (``ask``, ``offer_match``, ``offer_other``)."""

    chat, trainable, version, id = True, False, 0, "scripted-agent"

    def __init__(self, moves: list[str], seed: int = 0):
        self.moves, self.rng = moves, random.Random(seed)

    def drop_sessions(self, keys) -> None:
        pass

    def chat_generate(self, convs, sampling, response_format=None):
        return [Completion(self._say(c), [], [], "eos") for c in convs]

    def _say(self, conv) -> str:
        turn = sum(1 for m in conv if m["role"] == "assistant")
        move = self.moves[min(turn, len(self.moves) - 1)]
        need = next(m["need"] for m in conv if "need" in m)  # set by behaviour_card on the agent's view
        if move == "ask":
            return agent_say("ask", None, self.rng)
        heard = need_of(conv[-1]["content"]) if turn else None
        target = heard or need
        if move == "offer_other":  # a plan that misses the need, and not the collapsed customer's favourite
            target = self.rng.choice([n for n in NEEDS if n not in (target, FAVOURITE)])
        elif move == "offer_favourite":
            target = FAVOURITE
        return agent_say("offer", target, self.rng)


def behaviour_card(partner: Binding, episodes: int = 64, seed: int = 0, split: str = "all") -> dict[str, Any]:
    """Accept rates of ``partner`` for each agent move, and how often it names its need when asked."""
    tasks = CollapseLab.load_tasks(split)
    plans = {"offer_match": ["offer_match"], "offer_favourite": ["offer_favourite"], "offer_other": ["offer_other"],
             "ask_then_match": ["ask", "offer_match"], "ask_then_other": ["ask", "offer_other"],
             "ask_twice": ["ask", "ask"]}
    plays: list[Play] = []
    owner: list[str] = []
    for name, moves in plans.items():
        pool = [t for t in tasks if t.data["need"] != FAVOURITE] if name == "offer_favourite" else tasks
        for i in range(episodes):
            task = pool[i % len(pool)]
            agent = Binding("scripted", ScriptedAgent(moves, seed + i), SamplingParams())
            plays.append(Play(task, Episode(task.id, name, i), {"agent": agent, "partner": partner},
                              options={"max_turns": max(2, len(moves))}))
            owner.append(name)
    jobs = make_jobs(CollapseLab, plays, {}, random.Random(seed), "lab-check")
    for j in jobs:
        j.env.views["agent"][-1]["need"] = j.env.task.data["need"]  # the scripted agent's cheat sheet
    eps, _ = run_rollouts(jobs, end_on_truncation=False)
    card: dict[str, Any] = {}
    for name in plans:
        mine = [e for e, o in zip(eps, owner) if o == name and not e.failed]
        card[f"accept|{name}"] = sum(e.status == "accepted" for e in mine) / max(len(mine), 1)
    asked = [e for e, o in zip(eps, owner) if o.startswith("ask") and not e.failed]
    named = [e for e in asked if len(e.messages) > 1 and need_of(e.messages[1]["content"]) == e.meta["need"]]
    card["names_need_when_asked"] = len(named) / max(len(asked), 1)
    twice = [e for e, o in zip(eps, owner) if o == "ask_twice" and not e.failed]
    card["names_need_at_second_ask"] = sum(  # the twice customer: vague at the first ask, its need at the second
        len(e.messages) > 3 and need_of(e.messages[3]["content"]) == e.meta["need"]
        for e in twice) / max(len(twice), 1)
    unasked = [e for e, o in zip(eps, owner) if o.startswith("offer") and not e.failed]
    # the counter customer: neither yes nor no to an offer it was not asked for
    card["goes_on_after_unasked_offer"] = sum(
        len(e.messages) > 1 and classify_reply(e.messages[1]["content"]) == "other"
        for e in unasked) / max(len(unasked), 1)
    card["failed"] = sum(e.failed for e in eps)
    card["reply_kinds"] = sorted({classify_reply(m["content"]) for e in eps for m in e.messages
                                  if m["role"] == "partner"})
    return card


def cards_markdown(cards: dict[str, dict[str, Any]]) -> str:
    """A table of behaviour cards (one row per simulator)."""
    cols = ["accept|offer_match", "accept|offer_favourite", "accept|offer_other", "accept|ask_then_match",
            "accept|ask_then_other", "names_need_when_asked", "names_need_at_second_ask", "goes_on_after_unasked_offer"]
    head = ["simulator", "yes to a matching offer", "yes to the basic plan (missing)", "yes to another missing offer",
            "asked, then matching: yes", "asked, then missing: yes", "names its need when asked",
            "names its need at the second ask", "neither yes nor no to an unasked offer"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    seen_label: dict[Any, str] = {True: " (seen)", False: " (unseen)"}
    for name, c in cards.items():
        seen = seen_label.get(c.get("seen"), "")
        lines.append(f"| {name}{seen} | " + " | ".join(f"{c[k]:.2f}" if k in c else "n/a" for k in cols) + " |")
    return "\n".join(lines) + "\n"


def panel_cards(cfg, episodes: int = 64, log=print) -> dict[str, dict[str, Any]]:
    """The behaviour card of every simulator on a lab config's evaluation panel (the panel's own sampling
    settings and notes), the training simulator included."""
    from scope.eval import load_panel
    from scope.models.loading import frozen_refs
    from scope.partners.binding import spec_binding

    panel = load_panel(cfg.eval.panel)
    models = dict(cfg.models)
    models.update(panel.models)
    refs = frozen_refs({k: m for k, m in models.items() if k != cfg.agent.model}, {}, cfg.run.seed)
    cards: dict[str, dict[str, Any]] = {}
    for p in panel.partners:
        ref = refs[p.model]
        if p.adapter is not None:  # a trained simulator (e.g. a co-training run's partner adapter)
            from scope.models.loading import load_frozen_adapter

            ref = load_frozen_adapter(ref, p.adapter, f"card_{len(cards)}")
        cards[p.spec_id()] = behaviour_card(spec_binding(p, ref), episodes=episodes, seed=cfg.run.seed)
        cards[p.spec_id()]["seen"] = p.seen
        log(f"  lab: simulator {p.spec_id()}: " + ", ".join(
            f"{k.split('|')[-1]} {v:.2f}" for k, v in cards[p.spec_id()].items() if isinstance(v, float)))
    return cards


def grid_cards(out: str, cfg, log: Callable[[str], None] = print) -> dict[str, dict[str, Any]]:
    """The grid's ``before`` hook (``grid.yaml``): what each simulator of the panel does, measured once per grid
    (building the lab's models on first use), also written as ``simulators.md``."""
    t0 = time.time()
    log("lab: the simulators' behaviour cards (builds the lab's models on first use) ...")
    cards = panel_cards(cfg, log=log)
    with open(os.path.join(out, "simulators.md"), "w") as f:
        f.write("How often each simulator of the panel says yes to each move of a scripted agent, and names its "
                "need when asked (64 dialogues per move).\n\n" + cards_markdown(cards))
    log(f"lab: wrote {out}/simulators.md ({time.time() - t0:.0f}s)")
    return cards


def main(argv: list[str] | None = None) -> int:
    """``python -m recipes.collapse_lab cards --config CFG [--adapter CKPT]``: the behaviour cards of a lab
    config's panel, or of the partner adapter of a checkpoint (a co-trained simulator), as a markdown table."""
    import argparse
    import tempfile

    import yaml

    from scope.configfile import load_config

    ap = argparse.ArgumentParser(prog="python -m recipes.collapse_lab cards")
    ap.add_argument("--config", default="recipes/collapse_lab/configs/cotrain.yaml")
    ap.add_argument("--adapter", help="a checkpoint directory whose partner adapter plays the training simulator")
    ap.add_argument("--episodes", type=int, default=64)
    a = ap.parse_args(argv)
    cfg = load_config(a.config)
    if a.adapter:
        entry = {"id": "trained", "seen": True, "model": cfg.partner.model, "temperature": cfg.partner.temperature,
                 "max_new_tokens": cfg.partner.max_new_tokens, "adapter": a.adapter}
        base = {"id": "untrained", "seen": True, "model": cfg.partner.model, "temperature": cfg.partner.temperature,
                "max_new_tokens": cfg.partner.max_new_tokens}
        with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
            yaml.safe_dump({"partners": [base, entry]}, f)
        cfg.eval.panel = f.name
    print(cards_markdown(panel_cards(cfg, episodes=a.episodes, log=lambda s: None)))
    return 0
