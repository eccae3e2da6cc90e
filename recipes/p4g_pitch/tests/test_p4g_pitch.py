"""P4G-pitch at a tiny size: its configs, panel, pilot, fidelity cards, positive control, grid and verdicts run
end to end on tiny random models (the simulators P1-P4 all one quick `scope sim fit` of a tiny model)."""
import hashlib
import json
import os

import pytest
import yaml

from recipes.conftest import shared_path
from recipes.p4g_pitch import pilot as pitch, verdicts as pitch_verdicts
from scope.grid.runner import run_grid
from scope.grid.spec import read_spec

CONFIGS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs")


@pytest.fixture(scope="module")
def tiny_setup(tmp_path_factory):
    p4g = shared_path("data", "p4g")
    from scope.sim.fit import FitConfig, fit

    tmp = tmp_path_factory.mktemp("pitch")
    fit(FitConfig(model="tiny-random", data_dir=p4g, out=str(tmp / "sim"), max_dialogues=2, max_tokens=512,
                  batch_tokens=512, epochs=0.5, shard="1/4", examples="recipes.p4g_pitch.fit:fit_views"),
        log=lambda s: None,
        progress=False)
    adapter = str(tmp / "sim" / "adapter")
    with open(os.path.join(CONFIGS, "panel.yaml")) as f:
        panel = yaml.safe_load(f)
    panel.update(tasks=2, episodes=4)
    for k in ("p1", "p2", "p3", "p4"):
        panel["models"][k] = {"path": "tiny-random", "adapter": adapter}
    (tmp / "panel.yaml").write_text(yaml.safe_dump(panel))
    overrides = ["models.policy.path=tiny-random", f"eval.panel={tmp / 'panel.yaml'}", f"env.options.data_dir={p4g}",
                 "rollout.n_tasks=2", "rollout.group_size=2", "agent.max_new_tokens=4", "partner.max_new_tokens=4",
                 "train.steps=2", "eval.every=2", "run.save_every=2", "run.keep_checkpoints=2"]
    for k in ("p1", "p2"):
        overrides += [f"models.{k}.path=tiny-random", f"models.{k}.adapter={adapter}"]
    return tmp, overrides


def test_the_simulator_fit_deals_the_persuadees_into_disjoint_quarters_with_decision_examples():
    p4g = shared_path("data", "p4g")
    from recipes.p4g_pitch.fit import decision_view
    from scope.data.p4g import load_dialogues, shard_users

    train = load_dialogues(p4g, "train")
    parts = [shard_users(train, f"{k}/4") for k in range(1, 5)]
    users = [{d.user_id for d in p} for p in parts]
    assert sum(len(p) for p in parts) == len(train)
    assert all(not (users[i] & users[j]) for i in range(4) for j in range(i + 1, 4))
    view = next(decision_view(d) for d in parts[0] if decision_view(d) is not None)
    assert view[1]["content"].endswith("[The chat ends now. Decide how much of your $2 to donate, from 0 to 2 "
                                       "dollars.]")
    assert view[2]["content"].startswith("[DONATE $") and "Reply briefly" in view[0]["content"]
    with pytest.raises(ValueError, match="between 1 and n"):
        shard_users(train, "5/4")
    with pytest.raises(ValueError, match="k/n"):
        shard_users(train, "half")


PANEL_SHA256 = "0a65185827aa0242b92955e4e9f3a01dbf193c586fdaeadef4037cad0b1e4c0c"
"""The panel as committed before any training run (NOTES.md, "Pre-registration"): it is not changed after a result."""


def test_the_panel_is_the_preregistered_one():
    with open(os.path.join(CONFIGS, "panel.yaml"), "rb") as f:
        assert hashlib.sha256(f.read()).hexdigest() == PANEL_SHA256, "recipes/p4g_pitch/configs/panel.yaml changed"
    from scope.eval import load_panel

    panel = load_panel(os.path.join(CONFIGS, "panel.yaml"))
    groups = {p.spec_id(): "control" if p.control else "seen" if p.seen else "unseen" for p in panel.partners}
    assert groups == {"T0": "seen", "P1": "seen", "P2": "seen", "P3": "unseen", "P4": "unseen",
                      "base-T1.0": "control", "verbal": "control"}
    assert panel.paired and panel.tasks == 48 and panel.episodes == 96


def test_the_grid_plan_orders_the_runs_as_the_issue_asks():
    plan = read_spec(CONFIGS).plan()
    assert plan[:3] == [("base", 0), ("single", 0), ("single", 1)]
    assert plan[3:9] == [("ensemble", 0), ("single_sharp", 0), ("ensemble_base", 0), ("single_p1", 0),
                         ("cotrain", 0), ("population", 0)]
    assert plan[9:] == [("ensemble", 1)]  # added after the results, for signature 7 (grid.yaml says so)


def test_the_pilot_cards_and_control_run_at_a_tiny_size(tiny_setup):
    tmp, overrides = tiny_setup
    res = pitch.pilot(CONFIGS, str(tmp / "pilot"), n_sampled=4, n_personas=2, overrides=overrides, log=lambda s: None)
    sims = res["simulators"]
    assert {"T0", "P1", "P2", "P3", "P4", "base-T1.0", "verbal", "T0-sharp", "base-t0.5-careful"} <= set(sims)
    assert sims["P3"]["group"] == "unseen" and sims["verbal"]["group"] == "control"
    assert len(res["pitches"]) == 4 + len(pitch.TEMPLATES) and "GO" in open(tmp / "pilot" / "pilot.md").read()
    cards = pitch.fidelity(CONFIGS, str(tmp / "cards"), n_dialogues=2, overrides=overrides, log=lambda s: None)
    assert {"T0", "P3", "T0-sharp"} <= set(cards) and "verbal" not in cards
    assert cards["T0"]["perplexity"] > 1 and cards["T0"]["wasserstein"] >= 0
    assert cards["T0-sharp"]["perplexity"] != cards["T0"]["perplexity"]  # at its own temperature
    ctl = pitch.positive_control(CONFIGS, str(tmp / "control"), lrs=(1e-4, 3e-4), steps=2, overrides=overrides,
                                 log=lambda s: None)
    assert ctl["chosen_lr"] in (1e-4, 3e-4) and all(len(r["reward"]) == 2 for r in ctl["runs"].values())


def test_the_grid_runs_and_its_verdicts_are_computed_at_a_tiny_size(tiny_setup):
    tmp, overrides = tiny_setup
    out = str(tmp / "grid")
    res = run_grid(CONFIGS, out, seeds=2, arms=("base", "single", "ensemble"), overrides=overrides,
                   log=lambda s: None)
    assert set(res["arms"]) == {"base", "single", "ensemble"}
    assert os.path.exists(os.path.join(out, "single", "seed1", "metrics.jsonl"))
    assert os.path.exists(os.path.join(out, "ensemble", "seed1", "metrics.jsonl"))
    assert not os.path.exists(os.path.join(out, "base", "seed1"))  # the plan, not --seeds, says which seeds run
    # paired: every simulator of the panel scored the very pitches the first one did
    with open(os.path.join(out, "single", "seed0", "eval", "step_000002", "eval_episodes.jsonl")) as f:
        eps = [json.loads(x) for x in f]
    firsts: dict = {}
    for e in eps:
        said = next(m["content"] for m in e["messages"] if m["role"] == "agent")
        firsts.setdefault((e["task_id"], e["copy"]), set()).add(said)
    assert len(firsts) == 4 and all(len(v) == 1 for v in firsts.values())
    ev = json.load(open(os.path.join(out, "single", "seed0", "eval", "step_000002", "eval.json")))
    assert ev["per_partner"]["verbal"]["control"] and "control_mean" in ev
    assert ev["panel_mean"] == pytest.approx(sum(v["mean"] for v in ev["per_partner"].values() if not v["control"]) / 5)
    # the checkpoint is kept, and `scope eval` reads it against any panel file
    from scope.cli import main

    ckpt = os.path.join(out, "single", "seed0", "checkpoints", "step_000002")
    assert main(["eval", "--policy", ckpt, "--panel", str(tmp / "panel.yaml"), "--out", str(tmp / "ev")]) == 0
    assert json.load(open(tmp / "ev" / "eval.json"))["per_partner"]["P3"]["n"] == 4
    v = pitch_verdicts.verdicts(out, CONFIGS, overrides=overrides, log=lambda s: None)
    assert set(v["signatures"]) == {"train_reward_rises", "unseen_below_base", "ensemble_not_below",
                                    "diversity_falls_more", "sharp_collapses_faster", "exploit_ablation",
                                    "cures_vs_single"}
    assert len(v["signatures"]["unseen_below_base"]["seeds"]) == 2
    assert [(c["cure"], c["seeds"]) for c in v["signatures"]["cures_vs_single"]["comparisons"]] == [("ensemble", 2)]
    md = open(os.path.join(out, "verdicts.md")).read()
    assert md.count("held**") + md.count("**not decidable**") == 6
    assert v["signatures"]["sharp_collapses_faster"]["held"] is None  # no T0-sharp run in this grid
    assert "5. " in md and "**not decidable** (a run it needs is missing)" in md.split("5. ")[1].split("\n")[0]
    # each run's own table against Base: one section a run, Base's paired differences exactly 0
    runs_md = open(os.path.join(out, "runs.md")).read()
    assert [ln for ln in runs_md.splitlines() if ln.startswith("## ")] == [
        "## Base, seed 0 (last evaluation: step 0)", "## RL (Single), seed 0 (last evaluation: step 2)",
        "## RL (Single), seed 1 (last evaluation: step 2)", "## Ensemble, seed 0 (last evaluation: step 2)",
        "## Ensemble, seed 1 (last evaluation: step 2)"]
    reps = json.load(open(os.path.join(out, "runs.json")))
    assert reps[0]["groups"]["P3/P4"]["diff"]["mean"] == 0 and reps[0]["groups"]["P3/P4"]["diff"]["se"] == 0
    assert reps[1]["groups"]["P3/P4"]["run"]["mean"] == pytest.approx(
        v["signatures"]["unseen_below_base"]["seeds"][0]["diff"] + reps[0]["groups"]["P3/P4"]["run"]["mean"])
    assert reps[1]["converged"]["pitches"] == 4
    # a run still training (its metrics short of its last step) is no run of the grid yet: not reported, not scored
    import shutil

    partial = os.path.join(out, "single", "seed2")
    shutil.copytree(os.path.join(out, "single", "seed1"), partial)
    with open(os.path.join(partial, "metrics.jsonl")) as f:
        first_line = f.readline()
    with open(os.path.join(partial, "metrics.jsonl"), "w") as f:
        f.write(first_line)
    assert len(pitch_verdicts.run_reports(out, CONFIGS)) == 5
    v2 = pitch_verdicts.verdicts(out, CONFIGS, overrides=overrides, rescore=False, log=lambda s: None)
    assert [x["seed"] for x in v2["signatures"]["unseen_below_base"]["seeds"]] == [0, 1]
    shutil.rmtree(partial)


def test_a_grid_with_only_base_decides_no_signature(tiny_setup):
    tmp, overrides = tiny_setup
    out = str(tmp / "grid_base_only")
    run_grid(CONFIGS, out, seeds=1, arms=("base",), overrides=overrides, log=lambda s: None)
    v = pitch_verdicts.verdicts(out, CONFIGS, overrides=overrides, log=lambda s: None)
    undecided = {k for k, x in v["signatures"].items() if x.get("held") is None}
    assert undecided >= {"train_reward_rises", "unseen_below_base", "ensemble_not_below", "diversity_falls_more",
                         "sharp_collapses_faster", "exploit_ablation"}  # a missing run is no verdict
    assert "**not held**" not in open(os.path.join(out, "verdicts.md")).read()


def test_a_per_seed_rule_is_undecided_until_it_has_its_seeds():
    from recipes.p4g_pitch.verdicts import _decided

    assert _decided([False], 2, "x") is False        # one failing seed decides
    assert _decided([True], 2, "x") is None          # one passing seed of the two the rule needs
    assert _decided([True, True], 2, "x") is True
    assert _decided([], 1, "x") is None              # no run at all


def test_what_pitches_converged_on_is_counted():
    from recipes.p4g_pitch.verdicts import converged

    c = converged(["Dear friend of the children, give $250.", "Dear friend of the children, give $250 now",
                   "Hi, $2,000 is", "no amount"])
    assert c["pitches"] == 4 and c["with_amount"] == 3 and c["top_amount"] == ("$250", 2)  # "$250." counts as "$250"
    assert c["top_opening"] == ("Dear friend of the childr", 2)
    assert c["largest_alike_110"] == 1 and converged([]) == {"pitches": 0}


def test_bleu_and_group_diversity():
    assert pitch.bleu("give to the children now", ["give to the children now"]) == pytest.approx(1.0)
    assert pitch.bleu("a b c d", ["w x y z"]) == 0.0
    d = pitch.group_diversity([["same pitch here", "same pitch here"], ["one thing", "another thing entirely"]])
    assert d["distinct"] == pytest.approx(0.75) and 0 < d["self_bleu"] < 1
    assert pitch.ablate("Please help the children now!", "children") == "Please help the now!"
    assert pitch.features("Hi [Name], please give $1?")["placeholder"]


@pytest.mark.parametrize("paradigm", ["single_sharp", "ensemble_base", "single_p1", "cotrain", "population"])
def test_the_other_paradigms_train_at_a_tiny_size(tiny_setup, paradigm):
    """Each of the grid's other configs trains (a co-trained persuadee learns from its one- to three-token
    decisions: its update sees trainable tokens)."""
    from scope.configfile import load_config
    from scope.run import read_metrics
    from scope.train import train

    tmp, overrides = tiny_setup
    cfg = load_config(os.path.join(CONFIGS, paradigm + ".yaml"), overrides + [
        "eval.panel=null", "train.steps=1", f"run.dir={tmp / paradigm}", "partner.pool.every=1"])
    train(cfg, log=lambda s: None)
    m = read_metrics(str(tmp / paradigm))[-1]
    assert m["episodes"] == 4 and m["failed_episodes"] == 0
    if paradigm in ("cotrain", "population"):
        assert m["partner/train/trained_tokens"] > 0


def test_a_cure_helps_only_above_single():
    from recipes.p4g_pitch.verdicts import cure_verdict

    assert cure_verdict(+0.02, 0.002) == (True, False)
    assert cure_verdict(-0.38, 0.000) == (False, True)  # significant, the wrong way: not a cure that helps
    assert cure_verdict(+0.006, 0.334) == (False, False)
