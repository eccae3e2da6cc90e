"""Held out means held out: no unseen panel member shares text, prompt, decoding or model with any
paradigm's training simulators, in every shipped panel, checked against every shipped training config of
the same environment (rotation members, notes, persona pools, VS, the lab's simulator models)."""
import glob
import os
import re

import pytest

from scope.config import load_config
from scope.eval import load_panel
from scope.partners.sources import load_personas

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
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


def shares_text(a: str, b: str) -> bool:
    """Two texts share text when they have two or more content stems in common (or one text is in the other)."""
    a, b = a.strip().lower(), b.strip().lower()
    if not a or not b:
        return False
    return a in b or b in a or len(stems(a) & stems(b)) >= 2


def training_sources(cfg) -> list[dict]:
    """Every simulator a config trains against: its model spec, decoding, temperature and texts."""
    p = cfg.partner
    specs = p.rotation if p.source == "rotation" else [p]
    out = []
    for s in specs:
        texts = [s.note] if s.note else []
        if p.source == "persona":
            texts += [x["text"] for x in load_personas(p.personas)]
        m = cfg.models[s.model]
        out.append({"model": (m.path, tuple(sorted((m.options or {}).items())), m.adapter), "decoding": s.decoding,
                    "temperature": s.temperature, "texts": texts, "note": s.note})
    return out


def shipped_training_configs():
    paths = [f for f in glob.glob(os.path.join(ROOT, "configs", "*.yaml"))]
    for sub in ("lab", "p4g_mini"):
        paths += [f for f in glob.glob(os.path.join(ROOT, "configs", sub, "*.yaml"))
                  if os.path.basename(f) not in ("panel.yaml",)]
    out = []
    for f in sorted(paths):
        cfg = load_config(f)
        out.append((f, cfg))
    return out


def panels_by_env():
    """panel path -> (env name, the models the panel can name, every training source of that env)."""
    cfgs = shipped_training_configs()
    panels = {}
    for _f, cfg in cfgs:
        if cfg.eval.panel:
            path = os.path.normpath(os.path.join(ROOT, cfg.eval.panel))
            panels.setdefault(path, (cfg.env.name, dict(cfg.models)))
    out = {}
    for path, (env, models) in panels.items():
        sources = [s for f, cfg in cfgs if cfg.env.name == env for s in training_sources(cfg)]
        if env != "lab":  # the builtin persona pool is a persona paradigm's pool in every dialogue environment
            sources.append({"model": None, "decoding": "plain", "temperature": None, "note": None,
                            "texts": [x["text"] for x in load_personas("builtin")]})
        out[path] = (env, models, sources)
    return out


def test_the_text_rule_catches_a_paraphrase_and_passes_unrelated_text():
    assert shares_text("You doubt claims, ask for evidence and do not give money easily.",
                       "Your manner: skeptical. You doubt claims and ask for evidence "
                       "before you agree to anything.")
    assert shares_text("You are busy and impatient; you want the chat to be over quickly.",
                       "Your manner: busy and impatient. You answer in few words "
                       "and want the conversation to be quick.")
    assert not shares_text("You write in lowercase without punctuation, like a text message.",
                           "Your manner: skeptical. You doubt claims and ask for evidence "
                           "before you agree to anything.")


@pytest.mark.parametrize("panel_path", sorted(panels_by_env()), ids=lambda p: os.path.relpath(p, ROOT))
def test_unseen_panel_members_share_nothing_with_any_training_simulator(panel_path):
    env, cfg_models, sources = panels_by_env()[panel_path]
    panel = load_panel(panel_path)
    models = {**cfg_models, **panel.models}
    unseen = [p for p in panel.partners if not p.seen]
    assert unseen, f"{panel_path}: no unseen partner"
    for p in unseen:
        m = models[p.model]
        spec = (m.path, tuple(sorted((m.options or {}).items())), m.adapter)
        assert p.decoding == "plain", f"{p.id}: decoding {p.decoding} is a training paradigm's (Verbalized Sampling)"
        for s in sources:
            for t in s["texts"]:
                assert not shares_text(p.note, t), f"{p.id}: its note shares text with a training simulator's: {t!r}"
                if p.personas:
                    for x in load_personas(p.personas):
                        assert not shares_text(x["text"], t), f"{p.id}: persona {x['id']} shares text with {t!r}"
            same_sim = spec == s["model"] and p.note == s["note"] and not p.personas and p.adapter is None
            assert not same_sim, f"{p.id}: the same model and prompt as a training simulator (only sampling differs)"
        if env == "lab":  # the lab's simulators differ in the behaviour they reward, not only in style
            trained = {dict(s["model"][1]).get("temperament") for s in sources if s["model"][0] == "lab:customer"}
            assert dict(spec[1]).get("temperament") not in trained, \
                f"{p.id}: temperament {dict(spec[1]).get('temperament')} is a training simulator's"
