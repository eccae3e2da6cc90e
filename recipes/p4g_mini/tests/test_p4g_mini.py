"""P4G-mini's grid in its quick form: every paradigm of configs/p4g_mini for two steps on tiny models, with the
unseen fitted simulator made by a quick `scope sim fit`; the grid writes its table, curves and dialogue cards.
(Run from the repository's root: the configs name their files from there.)"""
import os

import pytest
import yaml

from recipes.conftest import ROOT, shared_path
from scope.grid.runner import run_grid
from scope.grid.spec import read_spec

CONFIGS = os.path.join(ROOT, "recipes", "p4g_mini", "configs")


def test_the_p4g_mini_grid_runs_end_to_end_in_its_quick_form(tmp_path):
    p4g = shared_path("data", "p4g")
    from scope.sim.fit import FitConfig, fit

    fit(FitConfig(model="tiny-random", data_dir=p4g, out=str(tmp_path / "sim"), max_dialogues=2, max_tokens=768,
                  batch_tokens=768, epochs=0.5), log=lambda s: None, progress=False)
    with open(os.path.join(CONFIGS, "panel.yaml")) as f:
        panel = yaml.safe_load(f)
    panel["episodes"] = 1
    panel["models"]["people"] = {"path": "tiny-random", "adapter": str(tmp_path / "sim" / "adapter")}
    (tmp_path / "panel.yaml").write_text(yaml.safe_dump(panel))
    out = str(tmp_path / "grid")
    tiny = ["models.policy.path=tiny-random", "train.steps=2", "eval.every=2", f"eval.panel={tmp_path / 'panel.yaml'}",
            f"env.options.data_dir={p4g}", "env.options.max_turns=1", "rollout.n_tasks=1", "rollout.group_size=2",
            "agent.max_new_tokens=4", "partner.max_new_tokens=4", "diagnostics.probe_every=2",
            "diagnostics.probe_states=1", "diagnostics.probe_samples=2", "partner.vs.max_new_tokens=24",
            "partner.vs.max_reasks=0", "partner.pool.every=1"]
    res = run_grid(CONFIGS, out, seeds=1, overrides=tiny, log=lambda s: None)
    assert set(res["arms"]) == set(read_spec(CONFIGS).arms)
    for name in ("table.md", "curves.png", "results.json", "dialogues.md"):
        assert os.path.getsize(os.path.join(out, name)) > 0, name
    assert "fitted-to-people" in open(os.path.join(out, "single", "seed0", "eval", "step_000002", "eval.md")).read()
    cards = open(os.path.join(out, "dialogues.md")).read()
    assert "## RL (Single)" in cards and "## Population Co-Training" in cards and "## Persona (evolved)" in cards
    assert "persuadees' decisions: " in cards and "mention the charity" in cards
    with pytest.raises(ValueError, match="unknown arms"):
        run_grid(CONFIGS, out, arms=("nonsense",))


def test_the_evolved_personas_reach_the_persuadees_prompt_in_training(tmp_path, monkeypatch):
    """persona_evolved draws a persona per rollout from the evolved file; its text is in the persuadee's tokens."""
    import json

    import scope.train as T
    from scope.configfile import load_config

    p4g = shared_path("data", "p4g")
    cfg = load_config(os.path.join(CONFIGS, "persona_evolved.yaml"),
                      ["models.policy.path=tiny-random", "train.steps=1", f"run.dir={tmp_path / 'run'}",
                       f"env.options.data_dir={p4g}", "env.options.max_turns=1", "rollout.n_tasks=2",
                       "rollout.group_size=2", "agent.max_new_tokens=4", "partner.max_new_tokens=4",
                       "eval.panel=null", "diagnostics.probe_every=0", "run.save_rollouts=true"])
    with open(os.path.join(ROOT, cfg.partner.personas)) as f:
        evolved = json.load(f)
    texts = {p["text"] for p in evolved["personas"]}
    assert evolved["made_by"] == "scope personas evolve" and evolved["fitness"]["human"] > 0
    seen: list[str] = []

    def capture(episodes):  # the persuadee's context, as the text its tokens spell
        seen.extend(e.traces["partner"].covered_text for e in episodes)
        return []

    monkeypatch.setattr(T, "rollout_records", capture)
    T.train(cfg, log=lambda s: None)
    assert seen and all(any(t in s for t in texts) for s in seen), "an evolved persona is missing from a prompt"


def test_same_weights_members_are_marked_in_the_evaluation_table():
    from scope.configfile import load_config
    from scope.eval import load_panel, markdown

    cfg = load_config(os.path.join(CONFIGS, "single.yaml"))
    panel = load_panel(os.path.join(CONFIGS, "panel.yaml"))
    from scope.panels import run_sharing

    sh = run_sharing(cfg, panel)
    per = {p.spec_id(): {"mean": 0.5, "n": 8, "failed": 0, "seen": p.seen, "shares": sh[p.spec_id()].shared()}
           for p in panel.partners}
    md = markdown({"per_partner": per, "panel_mean": 0.5, "panel_std": 0.0, "seen_mean": 0.5, "unseen_mean": 0.5})
    for pid in ("lowercase-texter", "night-nurse", "church-giver"):
        assert f"| {pid}† | no |" in md
    assert "| fitted-to-people | no |" in md and "| smol-t0.7 | yes |" in md
