"""The collapse lab (``env.name: lab``): a small sales dialogue in which simulator collapse is dialled in.

A customer (the partner, a user simulator) needs one of four plans; the shop assistant (the agent)
does not know which. The agent can ask what the customer needs (the customer says it) and then offer
the matching plan, or offer a plan at once. The customer answers an offer with ``[YES]`` or ``[NO]``;
either ends the dialogue. The agent has ``max_turns`` (2) turns. Reward: ``discount ** (t - 1)`` when
the customer accepts after the agent's t-th turn (1.0 at once, 0.7 after asking), else 0.

What a real customer does: says what it needs when asked, accepts the plan it needs and turns down
the others. Then asking first is the only good strategy (0.7, against 1/4 for a blind offer). What a
collapsed simulator does: its dominant reply to an offer made before it was asked is "yes", whatever
the plan (with probability ``collapse``), so a blind offer pays almost 1.0 against it: the shortcut.
The simulators are small language models trained on corpora that encode these behaviours
(``scope/lab/``); the collapse strength is an option of the training simulator's model
(``models.<m>.options.collapse``), so the lab runs through the same engine, learner and panels as any
other environment.

The agent's prompt is the same for every task (the need is only in the customer's prompt), so one
policy serves all tasks. Tasks are need x customer name; train and test tasks have different names.
"""
from __future__ import annotations

import random
from typing import Any

from scope.types import Task
from scope.envs.base import Env, register_env

NEEDS = ("cheap", "fast", "safe", "green")
PLANS = {"cheap": "basic", "fast": "turbo", "safe": "secure", "green": "eco"}
NAMES = ("Ada", "Ben", "Cleo", "Dan", "Eve", "Finn", "Gus", "Hana", "Ivo", "Jill", "Kai", "Lena")
TEST_NAMES = NAMES[-4:]

AGENT_PROMPT = ("You are a shop assistant. The customer needs one of four plans: the basic plan (cheap), the "
                "turbo plan (fast), the secure plan (safe) or the eco plan (green). Find the plan the customer "
                "needs and offer it.")
OPENING = "[a customer walks in]"
CUSTOMER_PROMPT = "You are {name}, a customer in a shop. You want a plan that is {need}."

def reminder(need: str, text: str) -> str:
    """The note the customer reads after each of the agent's messages (its scenario notes): its need,
    and for an offer which plan it is and whether it fits. The harness judges the fit so that the small
    model need not learn to compare; what the customer does with the judgement is the model's. The note
    comes last, right before the customer's reply, so its words stand at a fixed distance from where
    the reply uses them."""
    offered = plan_of(text)
    if offered is None:
        return f" (you want {need})"
    return f" (the {PLANS[offered]} plan {'fits' if offered == need else 'does not fit'} ; you want {need})"
ACCEPT, REFUSE = "[YES]", "[NO]"

# ---- what the two sides say -------------------------------------------------------------------
# (a customer names its need as its notes do, "want cheap", near the start of its reply: a small model
# learns to say its need by copying what followed "want" in the note just before; a need word never
# starts a reply, so it is the same token, with its space, as in the note)
ASK = ("what do you need ?", "what matters most to you ?", "tell me what you are looking for .")
PITCH = ("try the {plan} plan , it is {need} .", "the {plan} plan is the {need} one .",
         "i suggest the {plan} plan , it is {need} .")
CHAT = ("hello , welcome to the shop !", "nice to see you today .", "good morning !")

STYLES: dict[str, dict[str, tuple[str, ...]]] = {
    "plain": {
        "reveal": ("i want {need} .", "i want {need} , please .", "i want {need} , mostly ."),
        "accept": ("great , i will take it . " + ACCEPT, "sounds good to me . " + ACCEPT),
        "accept_anyway": ("ok , sure , why not . " + ACCEPT, "fine , i will take it . " + ACCEPT),
        "refuse": ("i want {need} , so no thanks . " + REFUSE, "i want {need} , not that . " + REFUSE),
        "refuse_unasked": ("you did not even ask what i want . " + REFUSE, "please ask me first . " + REFUSE),
        "filler": ("hi . i am looking for a plan .", "hello . can you help me ?"),
        "counter": ("why that one ? you have not asked what i want .",
                    "hm , why that plan ? ask me what i want first ."),
        "vague": ("hmm , i am not sure yet .", "it depends , let me think ."),
    },
    "terse": {
        "reveal": ("want {need} .", "want {need} , ok ?", "want {need} . thanks ."),
        "accept": ("ok . " + ACCEPT, "deal . " + ACCEPT),
        "accept_anyway": ("whatever . " + ACCEPT, "eh , fine . " + ACCEPT),
        "refuse": ("want {need} . no . " + REFUSE, "want {need} . nope . " + REFUSE),
        "refuse_unasked": ("ask first . " + REFUSE, "no . ask me . " + REFUSE),
        "filler": ("hi .", "yes ?"),
        "counter": ("why ? ask me .", "why that ?"),
        "vague": ("hmm . not sure .", "depends ."),
    },
    "verbose": {
        "reveal": ("i want {need} , to be honest , more than anything else .",
                   "i want {need} , that is the main thing for me , really .",
                   "i want {need} , and everything else is much less important to me ."),
        "accept": ("oh , that sounds exactly right , i will gladly take it . " + ACCEPT,
                   "yes , that is what i was hoping for , thank you . " + ACCEPT),
        "accept_anyway": ("well , it is not quite what i had in mind , but why not , i will take it . " + ACCEPT,
                          "hmm , i suppose that will do , yes . " + ACCEPT),
        "refuse": ("i want {need} , so i am afraid that is not it , thank you . " + REFUSE,
                   "i want {need} , and that plan is not it , so no . " + REFUSE),
        "refuse_unasked": ("hold on , you have not even asked me what i want yet . " + REFUSE,
                           "i would rather you asked me what i want before you sell me something . " + REFUSE),
        "filler": ("hello there , i am hoping to find a plan today .", "good day , i could use some help ."),
        "counter": ("wait , why would you suggest that one when you do not know what i want yet ?",
                    "hmm , why that plan ? you have not asked me a single question so far ."),
        "vague": ("oh , i am honestly not sure yet , there are a few things i care about .",
                  "well , it depends on a lot of things , let me think about it ."),
    },
}

PERSONAS = (  # the lab's persona pool (partner.source: persona, personas: lab); each names the rule it asks for
    {"id": "careful", "rule": "careful", "text": "You only accept a plan that fits your need."},
    {"id": "strict", "rule": "strict", "text": "You turn down any offer made before you are asked what you need."},
    {"id": "picky", "rule": "careful", "text": "You are picky: a plan that is not what you want gets a no."},
    {"id": "wary", "rule": "strict", "text": "You are wary of salespeople who do not ask about your needs."},
    {"id": "easygoing", "rule": "agreeable", "text": "You are easygoing and say yes to most offers."},
)


def need_of(text: str) -> str | None:
    """The need a reply names (the first of them), if any (in a customer's answer to an offer, the
    offered plan's quality comes first)."""
    words = text.lower().replace(",", " ").replace(".", " ").split()
    return next((w for w in words if w in NEEDS), None)


def plan_of(text: str) -> str | None:
    """The need of the plan an offer names (the first plan named), if any."""
    words = text.lower().replace(",", " ").replace(".", " ").split()
    by_plan = {p: n for n, p in PLANS.items()}
    return next((by_plan[w] for w in words if w in by_plan), None)


def is_ask(text: str) -> bool:
    """Whether an agent's message asks the customer what it needs (a question about the need, no plan named)."""
    if plan_of(text) is not None:
        return False
    t = " " + text.lower().replace(",", " ").replace(".", " ").replace("?", " ? ") + " "
    return any(w in t for w in (" need ", " want ", " looking for ", " matters "))


def classify_reply(text: str) -> str:
    """The customer's behaviour: accept, refuse, reveal (names a need) or other."""
    if ACCEPT in text:
        return "accept"
    if REFUSE in text:
        return "refuse"
    return "reveal" if need_of(text) else "other"


@register_env("lab")
class CollapseLab(Env):
    roles = ("agent", "partner")
    end_reasons = frozenset({"accepted", "refused"})  # the customer accepted, or refused, an offer

    def __init__(self, task: Task, rng: random.Random, max_turns: int = 2, discount: float = 0.7, **_: Any):
        super().__init__(task, rng)
        if max_turns < 1 or not 0 < discount <= 1:
            raise ValueError("lab: max_turns must be at least 1 and discount in (0, 1]")
        self.max_turns, self.discount = max_turns, discount
        self.accepted_at: int | None = None
        self.revealed = False  # the customer has named its need
        self.views["agent"] = [{"role": "system", "content": AGENT_PROMPT}, {"role": "user", "content": OPENING}]
        self.views["partner"] = [{"role": "system", "content": CUSTOMER_PROMPT.format(**task.data)}]
        self.meta.update(need=task.data["need"])

    def next_role(self) -> str | None:
        if self.done:
            return None
        return "agent" if self.turns["agent"] == self.turns["partner"] else "partner"

    def on_reply(self, role: str, text: str) -> None:
        self.turns[role] += 1
        if role == "agent":
            self.say("agent", text, to=())
            self.views["partner"].append({"role": "user", "content": text + reminder(self.task.data["need"], text)})
            return
        self.say(role, text)
        kind = classify_reply(text)
        need = self.task.data["need"]
        asked = self.transcript[-2]["content"]
        if kind == "reveal":
            if need_of(text) == need:
                self.revealed = True
            else:  # out of character: a customer names the need its scenario gives it
                self._break_character("named a need it does not have")
        elif is_ask(asked):  # stalling: asked what it needs, it does not say
            self._break_character("did not say its need when asked")
        offered = plan_of(asked)
        if kind == "refuse" and offered == need:  # asked or not, the plan fits what it wants
            self._break_character("turned down the plan it needs")
        elif offered is not None and kind not in ("accept", "refuse"):  # stalling: an offer gets a yes or a no
            self._break_character("did not answer an offer")
        if kind == "accept":
            self.accepted_at = self.turns["agent"]
            self.meta["offer"] = plan_of(self.transcript[-2]["content"])
            self.finish("accepted")
        elif kind == "refuse":
            self.finish("refused")
        elif self.turns["agent"] >= self.max_turns:
            self.finish("max_turns")

    def finish(self, reason: str) -> None:
        # a customer reply cut at its token limit ends the dialogue with no sale: out of character (a 120-step
        # co-training run found the trained customer rambling until cut, for the full adversarial reward)
        if reason == "truncated" and self.transcript and self.transcript[-1]["role"] == "partner":
            self._break_character("its reply was cut at the token limit")
        super().finish(reason)

    def _break_character(self, why: str) -> None:
        """The customer left the training scenario (the co-trained simulator's adversarial reward ignores
        such a rollout's outcome: ``partner_fidelity`` 0): it named a need it does not have, did not say its
        need when asked, answered an offer with neither yes nor no, turned down the plan that fits its need,
        or ended the dialogue with a reply cut at its token limit. Only a trained simulator's reward reads it;
        the held-out ``counter`` and ``twice`` customers leave that scenario by design."""
        self.meta["partner_fidelity"] = 0.0
        self.meta.setdefault("out_of_character", why)

    def rewards(self) -> dict[str, float]:
        r = 0.0 if self.accepted_at is None else self.discount ** (self.accepted_at - 1)
        return {"agent": r, "partner": r}

    @classmethod
    def load_tasks(cls, split: str, **_: Any) -> list[Task]:
        if split not in ("train", "test", "all"):
            raise ValueError(f"lab: split must be train, test or all, not {split!r}")
        names = [n for n in NAMES if split == "all" or (n in TEST_NAMES) == (split == "test")]
        return [Task(id=f"lab/{need}/{name}", split=split, data={"need": need, "name": name})
                for name in names for need in NEEDS]


def persona_pool() -> list[dict[str, str]]:
    """The lab's persona pool (``partner.source: persona, personas: lab``)."""
    return [{"id": p["id"], "text": p["text"]} for p in PERSONAS]


def _register() -> None:  # the lab's behaviour classifier and persona pool (its models: scope.models' builders)
    from scope.diagnostics import register_classifier
    from scope.partners.sources import register_persona_pool

    register_classifier("lab")(classify_reply)
    register_persona_pool("lab", persona_pool)


_register()
