"""What a held-out panel member shares with the simulators a run trains against.

"Held out" has degrees. A panel member can differ from every training simulator in its weights, or only in
the note appended to the same weights' prompt; every member of a panel plays the environment's own system
prompt. :func:`sharing` says, per panel member, which of these it shares with any training simulator of
the given configs, so that tables can mark the members that run on the training weights
(:data:`SAME_WEIGHTS_MARK`) and a test can check the words the docs use.

Shared aspects (``Sharing`` fields):

- ``weights``: the same model (path, options) with no adapter of its own, as a training simulator (a
  co-trained simulator counts by the weights it starts from);
- ``note``: its note shares content words with a training simulator's note or persona text
  (:func:`shares_text`: two or more content stems in common, or one text inside the other);
- ``persona``: one of its personas shares text with a training simulator's note or persona;
- ``decoding``: the same decoding (plain sampling or Verbalized Sampling) as a training simulator;
- ``temperature``: the same sampling temperature as a training simulator;
- ``system_prompt``: the environment's system prompt for the role, which every member shares (a note is
  appended to it);
- ``family``: its model family (``models.<m>.family``, derived from the weights by default) is a training
  simulator's. An exploit that every model of one family pays for reads as a gain on "unseen" members of that
  family; an evaluation therefore reports the unseen members of a training family and of another apart
  (``unseen_same_family``, ``unseen_other_family``), and a panel whose unseen members are all of a training
  family is warned of (:func:`family_warning`) and marked (:data:`SAME_FAMILY_MARK`).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Iterable

SAME_WEIGHTS_MARK = "†"
"""Marks, in every table, a held-out simulator that runs on a training simulator's weights."""
SAME_FAMILY_MARK = "‡"
"""Marks, in every table, a held-out simulator of a training simulator's model family, in a panel whose every
unseen member is of one (nothing in it can tell an exploit that a family shares from a gain)."""

STOP = set("""a an and are as at be before but by do does for from give given gives have her his i if in into is it
its me more most much my no not of on only or other so than that the their them then they this to too very was
we what when which who will with without you your yours answer answers one ones reply replies message messages
manner""".split())


def stems(text: str) -> set[str]:
    """Content words, crudely stemmed: enough to catch a persona rewritten in other words' company."""
    out = set()
    for w in re.findall(r"[a-z]+", text.lower()):
        if w in STOP or len(w) < 4:
            continue
        for suf in ("ically", "ical", "ally", "ness", "ing", "ed", "ly", "es", "s", "al", "y"):
            if w.endswith(suf) and len(w) - len(suf) >= 4:
                w = w[: -len(suf)]
                break
        out.add(w)
    return out


def shares_text(a: str | None, b: str | None) -> bool:
    """Two texts share text when they have two or more content stems in common (or one is in the other)."""
    a, b = (a or "").strip().lower(), (b or "").strip().lower()
    if not a or not b:
        return False
    return a in b or b in a or len(stems(a) & stems(b)) >= 2


@dataclass
class Simulator:
    """One simulator as far as sharing goes: its weights, decoding, temperature and texts."""

    weights: tuple
    decoding: str
    temperature: float | None
    texts: list[str] = field(default_factory=list)
    note: str = ""
    family: str = ""


@dataclass
class Sharing:
    weights: bool = False
    note: bool = False
    persona: bool = False
    decoding: bool = False
    temperature: bool = False
    system_prompt: bool = True
    family: bool = False
    family_name: str = ""
    """The member's own model family."""

    def shared(self) -> list[str]:
        return [k for k in ("weights", "family", "note", "persona", "decoding", "temperature", "system_prompt")
                if getattr(self, k)]


def weights_of(models: dict[str, Any], name: str, adapter: str | None = None) -> tuple:
    m = models[name]
    return (m.path, tuple(sorted((m.options or {}).items())), adapter or m.adapter)


def training_simulators(cfg) -> list[Simulator]:
    """Every simulator a training config plays against: rotation members, the persona source's notes and
    pool, the single spec (a pool or co-trained simulator starts from its spec's weights)."""
    from .partners.sources import load_personas

    p = cfg.partner
    specs = p.rotation if p.source == "rotation" else [p]
    out = []
    for s in specs:
        texts = [s.note] if s.note else []
        if p.source == "persona":
            texts += [x["text"] for x in load_personas(p.personas)]
        out.append(Simulator(weights_of(cfg.models, s.model), s.decoding, s.temperature, texts, s.note,
                             family_of(cfg.models[s.model])))
    return out


def sharing(panel, models: dict[str, Any], sources: Iterable[Simulator]) -> dict[str, Sharing]:
    """Per panel member (``spec_id``), what it shares with any of ``sources``; ``models`` resolves the
    members' model names (the run's models and the panel's own)."""
    from .partners.sources import load_personas

    sources = list(sources)
    families = {s.family for s in sources}
    out = {}
    for p in panel.partners:
        w = weights_of(models, p.model, p.adapter)
        fam = family_of(models[p.model])
        personas = [x["text"] for x in load_personas(p.personas)] if p.personas else []
        texts = [t for s in sources for t in s.texts]
        out[p.spec_id()] = Sharing(
            weights=any(w == s.weights for s in sources),
            note=any(shares_text(p.note, t) for t in texts),
            persona=any(shares_text(x, t) for x in personas for t in texts),
            decoding=any(p.decoding == s.decoding for s in sources),
            temperature=any(s.temperature is not None and p.temperature == s.temperature for s in sources),
            family=fam in families, family_name=fam)
    return out


def family_of(mc) -> str:
    """A ``models.<name>`` entry's model family (:func:`scope.models.loading.family_of`)."""
    from .models.loading import family_of as of

    return of(mc)


def family_warning(panel, shared: dict[str, Sharing]) -> str | None:
    """One line when every unseen member of ``panel`` (controls apart) is of a training simulator's family: its
    unseen reward cannot tell an exploit that the family shares from a gain. None otherwise."""
    unseen = [p.spec_id() for p in panel.partners if not p.seen and not p.control]
    if not unseen or not all(shared[k].family for k in unseen if k in shared):
        return None
    fams = sorted({shared[k].family_name for k in unseen if k in shared})
    return (f"every unseen member of the panel is of a training simulator's model family ({', '.join(fams)}): its "
            f"unseen reward cannot tell an exploit that family shares from a gain (add a member of another family)")


def same_weights(panel, models: dict[str, Any], sources: Iterable[Simulator]) -> set[str]:
    """The ids of the panel's unseen members (controls apart) that run on a training simulator's weights."""
    unseen = {p.spec_id(): not p.seen and not p.control for p in panel.partners}
    return {k for k, v in sharing(panel, models, sources).items() if v.weights and unseen[k]}


def marked(pid: str, same: set[str]) -> str:
    """A simulator's id as tables print it: with :data:`SAME_WEIGHTS_MARK` when it shares training weights."""
    return pid + SAME_WEIGHTS_MARK if pid in same else pid


def run_sharing(cfg, panel) -> dict[str, Sharing]:
    """What each member of ``panel`` shares with the training simulators of run config ``cfg``."""
    return sharing(panel, {**cfg.models, **panel.models}, training_simulators(cfg))
