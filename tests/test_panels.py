"""What the held-out panels' unseen members share with the training simulators, checked as docs/evaluation.md
words it, in every shipped panel against every shipped training config of the same environment (rotation
members, notes, persona pools, VS, the lab's simulator models): no unseen member shares a note, a persona
text or Verbalized Sampling's decoding with any training simulator; every member plays the environment's
system prompt with plain sampling; the members that run on a training simulator's weights are exactly the
ones docs/evaluation.md's table lists (and marks with a dagger in every table)."""
import glob
import os
import re

import pytest

from scope.configfile import load_config
from scope.eval import load_panel
from scope.panels import same_weights, sharing, shares_text, training_simulators, weights_of
from scope.partners.sources import PERSONA_POOLS, load_personas

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def shipped_training_configs():
    paths = [f for f in glob.glob(os.path.join(ROOT, "configs", "*.yaml"))]
    paths += [f for f in glob.glob(os.path.join(ROOT, "recipes", "*", "configs", "*.yaml"))  # every recipe's too
              if os.path.basename(f) not in ("panel.yaml", "grid.yaml")]
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
        sources = [s for f, cfg in cfgs if cfg.env.name == env for s in training_simulators(cfg)]
        if env not in PERSONA_POOLS.names():  # an environment without a pool of its own: the builtin pool is a
            # persona paradigm's pool there
            from scope.panels import Simulator

            sources.append(Simulator((None,), "plain", None, [x["text"] for x in load_personas("builtin")]))
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


def documented_same_weights() -> dict[str, set[str]]:
    """docs/evaluation.md's table: panel file -> the unseen members it says run on training weights."""
    text = open(os.path.join(ROOT, "docs", "evaluation.md")).read()
    out = {}
    for m in re.finditer(r"^\| `((?:recipes/\w+/)?configs/[^`]+)` \| ([^|]*) \|", text, re.MULTILINE):
        out[os.path.normpath(os.path.join(ROOT, m.group(1)))] = set(re.findall(r"`([^`]+)`", m.group(2)))
    return out


@pytest.mark.parametrize("panel_path", sorted(panels_by_env()), ids=lambda p: os.path.relpath(p, ROOT))
def test_unseen_panel_members_share_what_the_docs_say_and_nothing_else(panel_path):
    env, cfg_models, sources = panels_by_env()[panel_path]
    panel = load_panel(panel_path)
    models = {**cfg_models, **panel.models}
    for p in panel.partners:  # every member, seen, unseen or control, samples plainly (the docs' words)
        assert p.decoding == "plain", f"{p.id}: decoding {p.decoding} is a training paradigm's (Verbalized Sampling)"
    unseen = [p for p in panel.partners if not p.seen and not p.control]  # controls are outside every mean
    assert unseen, f"{panel_path}: no unseen partner"
    shared = sharing(panel, models, sources)
    for p in unseen:
        sh = shared[p.spec_id()]
        assert not sh.note, f"{p.id}: its note shares text with a training simulator's"
        assert not sh.persona, f"{p.id}: a persona of it shares text with a training simulator's"
        w = weights_of(models, p.model, p.adapter)
        for s in sources:
            assert not (w == s.weights and p.note == s.note and not p.personas), \
                f"{p.id}: the same model and prompt as a training simulator (only sampling differs)"
    docs = documented_same_weights()
    assert panel_path in docs, f"docs/evaluation.md has no row for {os.path.relpath(panel_path, ROOT)}"
    assert same_weights(panel, models, sources) == docs[panel_path], \
        f"{os.path.relpath(panel_path, ROOT)}: docs/evaluation.md lists {sorted(docs[panel_path])} on training weights"
