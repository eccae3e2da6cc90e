"""A persona generator as structured data, and the operators that vary it.

A genome has behaviour **axes** (a name, a definition, the role-play instruction when the axis is on
and when it is off, and how often it is on in the population), a **population template** (who these
people are) and a **role-play template** that assembles one persona's instruction from the population
text and its drawn axis settings (``{population}``, ``{traits}``). Expanding a genome draws a
population: each persona turns every axis on with its probability. Nothing model-written is executed;
a model only writes text into these fields (see ``mutate.py``).
"""
from __future__ import annotations

import copy
import hashlib
import json
import random
from dataclasses import asdict, dataclass, field
from typing import Any

MAX_TEXT = 400
"""Longest text a field may hold (a model's rewrite beyond it is refused)."""


@dataclass
class Axis:
    name: str
    definition: str
    on: str
    off: str = ""
    p_on: float = 0.5


@dataclass
class Genome:
    axes: list[Axis]
    population: str = "You are an ordinary adult who just finished a short paid task online."
    roleplay: str = "{population} {traits} Stay in character."
    parents: list[str] = field(default_factory=list)
    ops: list[str] = field(default_factory=list)

    @property
    def id(self) -> str:
        body = json.dumps([asdict(a) for a in self.axes] + [self.population, self.roleplay], sort_keys=True)
        return hashlib.sha256(body.encode()).hexdigest()[:10]

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "axes": [asdict(a) for a in self.axes], "population": self.population,
                "roleplay": self.roleplay, "parents": list(self.parents), "ops": list(self.ops)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Genome":
        g = cls(axes=[Axis(**a) for a in d["axes"]], population=d["population"], roleplay=d["roleplay"],
                parents=list(d.get("parents", [])), ops=list(d.get("ops", [])))
        check(g)
        return g

    def expand(self, n: int, rng: random.Random) -> list[dict[str, Any]]:
        """A population of ``n`` personas: {id, text, axes (name -> on)}."""
        out = []
        for i in range(n):
            setting = {a.name: rng.random() < a.p_on for a in self.axes}
            traits = " ".join(t for t in ((a.on if setting[a.name] else a.off) for a in self.axes) if t)
            text = self.roleplay.replace("{population}", self.population).replace("{traits}", traits)
            out.append({"id": f"{self.id}-{i}", "text": " ".join(text.split()), "axes": setting})
        return out


def check(g: Genome) -> None:
    """Refuse a malformed genome (a clear error names the field)."""
    if not g.axes:
        raise ValueError("genome: at least one axis")
    if "{traits}" not in g.roleplay:
        raise ValueError("genome.roleplay must contain {traits}")
    names = [a.name for a in g.axes]
    if len(set(names)) != len(names):
        raise ValueError(f"genome: axis names repeat: {names}")
    for a in g.axes:
        if not 0.0 <= a.p_on <= 1.0:
            raise ValueError(f"genome axis {a.name}: p_on must be in [0, 1]")
        for k in ("definition", "on", "off"):
            if len(getattr(a, k)) > MAX_TEXT:
                raise ValueError(f"genome axis {a.name}.{k}: longer than {MAX_TEXT} characters")
    for k in ("population", "roleplay"):
        if len(getattr(g, k)) > MAX_TEXT:
            raise ValueError(f"genome.{k}: longer than {MAX_TEXT} characters")


# The axes a search starts from and may add (each written for a P4G persuadee; off is the plain default).
LIBRARY = [
    Axis("terse", "how long the replies are", "You answer in a few words, often without full sentences.",
         "You answer in one or two full sentences."),
    Axis("skeptic", "doubt about charities", "You distrust charities and ask where the money really goes.",
         "You trust well-known charities."),
    Axis("discloser", "talking about oneself", "You mention details of your own life: your job, family and money.",
         ""),
    Axis("curious", "asking questions", "You ask the other person questions about the charity and about them.", ""),
    Axis("warm", "friendliness", "You are warm and chatty, and you react to what the other person feels.",
         "You are polite but reserved."),
    Axis("casual", "register", "You write casually: lower case, 'lol', 'yeah', no final full stop.",
         "You write with ordinary punctuation."),
    Axis("tight_budget", "money worries", "Money is tight for you this month and you say so.", ""),
    Axis("agreeable", "going along", "You readily agree with reasonable requests.",
         "You take time before agreeing to anything."),
    Axis("distracted", "attention", "You drift off topic now and then, then come back.", ""),
    Axis("emotional", "feelings", "Stories about children in need move you and you say how they make you feel.", ""),
]


# tau2's user seat: a customer of the store or the airline. The axes are the human behaviours that carry
# over from the P4G people (terseness, withholding, impatience, off-topic turns, corrections, register);
# none of them may change what the customer wants or the facts they give (the integrity gate checks).
TAU2_POPULATION = "You are a customer chatting with the company's support agent."
TAU2_LIBRARY = [
    LIBRARY[0],  # terse
    Axis("withholding", "giving details", "You give one detail at a time, and only when you are asked for it.",
         "You give the details you are asked for."),
    Axis("impatient", "patience", "You are in a hurry and say so when things take long.", ""),
    Axis("off_topic", "attention", "Now and then you mention something unrelated, then come back to your request.",
         ""),
    Axis("corrects", "corrections", "You sometimes restate a request more precisely in your next message.", ""),
    LIBRARY[5],  # casual
    Axis("polite", "politeness", "You thank the agent and apologise for the trouble.", ""),
    Axis("unsure", "confidence", "You are not sure how the website works and ask what the agent means.", ""),
]
POPULATIONS = {"p4g": Genome.population, "tau2": TAU2_POPULATION}


def domain_of(env_name: str) -> str:
    return "tau2" if env_name.startswith("tau2") else "p4g"


def library_for(population: str) -> list[Axis]:
    """The axes a generator of this population may add: tau2's customers or P4G's persuadees."""
    return TAU2_LIBRARY if population == TAU2_POPULATION else LIBRARY


def seed_genomes(n: int, rng: random.Random, axes_per: int = 3, domain: str = "p4g") -> list[Genome]:
    """``n`` starting generators, each with ``axes_per`` axes drawn from the domain's library."""
    population = POPULATIONS[domain]
    lib = library_for(population)
    out = []
    for _ in range(n):
        axes = [copy.deepcopy(a) for a in rng.sample(lib, min(axes_per, len(lib)))]
        for a in axes:
            a.p_on = round(rng.uniform(0.2, 0.8), 2)
        out.append(Genome(axes=axes, population=population, ops=["seed"]))
    return out


# ---- structural operators (no model needed) ------------------------------------------------------------
def mutate_structure(g: Genome, rng: random.Random, other: Genome | None = None) -> Genome:
    """One structural change: re-draw an axis's frequency, add a library axis, drop an axis, swap an
    axis's on/off texts, or cross over with ``other`` (a second elite)."""
    c = Genome(axes=[copy.deepcopy(a) for a in g.axes], population=g.population, roleplay=g.roleplay,
               parents=[g.id] + ([other.id] if other is not None else []))
    ops = ["p_on", "add", "drop", "swap"] + (["crossover"] if other is not None else [])
    op = rng.choice(ops)
    if op == "add":
        free = [a for a in library_for(c.population) if a.name not in {x.name for x in c.axes}]
        if not free:
            op = "p_on"
        else:
            a = copy.deepcopy(rng.choice(free))
            a.p_on = round(rng.uniform(0.2, 0.8), 2)
            c.axes.append(a)
    if op == "drop":
        if len(c.axes) <= 1:
            op = "p_on"
        else:
            c.axes.pop(rng.randrange(len(c.axes)))
    if op == "swap":
        a = rng.choice(c.axes)
        if a.off:
            a.on, a.off = a.off, a.on
        else:
            op = "p_on"
    if op == "crossover" and other is not None:  # (crossover is drawn only with ``other``)
        pool = {a.name: a for a in c.axes}
        for a in other.axes:
            pool.setdefault(a.name, copy.deepcopy(a))
        k = max(1, min(len(pool), (len(c.axes) + len(other.axes)) // 2))
        c.axes = [copy.deepcopy(pool[n]) for n in rng.sample(sorted(pool), k)]
    if op == "p_on":
        a = rng.choice(c.axes)
        a.p_on = round(min(1.0, max(0.0, a.p_on + rng.choice([-1, 1]) * rng.uniform(0.1, 0.4))), 2)
    c.ops = [op]
    check(c)
    return c
