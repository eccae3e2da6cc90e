"""The collapse lab: its environment, its teachers' corpora, its models' options, config inheritance and the
collapse signatures' peak test.

(The lab's end-to-end signatures, which need its models built, are in test_quick_grid.py: `make test-lab`.)"""
import json
import random

import pytest

from recipes.collapse_lab.corpus import (AGENT_MIX, CustomerSpec, agent_corpus, candidates, customer_corpus, play,
                                         reply_distribution)
from recipes.collapse_lab.env import (ACCEPT, NEEDS, PLANS, REFUSE, STYLES, CollapseLab, classify_reply, need_of,
                                      plan_of, reminder)
from scope.config import ConfigError
from scope.configfile import load_config
from scope.envs.base import get_env
from scope.partners import vs as vs_mod


def env_for(need="cheap", **kw):
    return CollapseLab(next(t for t in CollapseLab.load_tasks("train") if t.data["need"] == need), random.Random(0),
                       **kw)


def test_tasks_split_by_customer_and_share_the_agent_prompt():
    train, test = CollapseLab.load_tasks("train"), CollapseLab.load_tasks("test")
    assert len(train) == 32 and len(test) == 16
    assert {t.data["name"] for t in train}.isdisjoint({t.data["name"] for t in test})
    assert {t.data["need"] for t in test} == set(NEEDS)
    prompts = {json.dumps(env_for(n).views["agent"]) for n in NEEDS}
    assert len(prompts) == 1  # the need is only in the customer's prompt
    with pytest.raises(ValueError, match="split"):
        CollapseLab.load_tasks("dev")


def test_reward_is_discounted_by_the_turn_of_acceptance():
    env = env_for("cheap")
    env.on_reply("agent", "try the basic plan , it is cheap .")
    env.on_reply("partner", "great , i will take it . " + ACCEPT)
    assert env.done and env.end_reason == "accepted" and env.rewards()["agent"] == 1.0
    env = env_for("cheap")
    env.on_reply("agent", "what do you need ?")
    env.on_reply("partner", "i want something cheap .")
    assert not env.done
    env.on_reply("agent", "try the basic plan , it is cheap .")
    env.on_reply("partner", "sounds good to me . " + ACCEPT)
    assert env.rewards()["agent"] == pytest.approx(0.7)
    env = env_for("cheap")
    env.on_reply("agent", "the turbo plan is the fast one .")
    env.on_reply("partner", "no thanks , i want something cheap . " + REFUSE)
    assert env.end_reason == "refused" and env.rewards()["agent"] == 0.0
    env = env_for("cheap", max_turns=1)
    env.on_reply("agent", "hello , welcome to the shop !")
    env.on_reply("partner", "hi . i am looking for a plan .")
    assert env.end_reason == "max_turns" and env.rewards()["agent"] == 0.0


def test_the_customer_reads_its_need_and_the_fit_of_an_offer():
    env = env_for("green")
    env.on_reply("agent", "the turbo plan is the fast one .")
    seen = env.views["partner"][-1]["content"]
    assert seen == "the turbo plan is the fast one . (the turbo plan does not fit ; you want green)"
    assert env.views["agent"][-1]["role"] == "assistant" and "you want" not in json.dumps(env.views["agent"])
    assert reminder("green", "try the eco plan , it is green .") == " (the eco plan fits ; you want green)"
    assert reminder("green", "what do you need ?") == " (you want green)"


def test_reply_classes_and_the_words_they_read():
    assert classify_reply("ok . " + ACCEPT) == "accept" and classify_reply("no . " + REFUSE) == "refuse"
    assert classify_reply("i want something fast .") == "reveal" and classify_reply("hello .") == "other"
    assert need_of("i want safe , please .") == "safe"
    assert plan_of("i suggest the eco plan , it is green .") == "green" and plan_of("hi") is None
    for style in STYLES.values():  # a need word never starts a reply (its token would differ)
        for phrases in style.values():
            assert not any(p.startswith("{need}") for p in phrases)


@pytest.mark.parametrize("rule,asked,offered,expect", [
    ("careful", False, "cheap", {"accept": 1.0}), ("careful", False, "fast", {"refuse": 1.0}),
    ("strict", False, "cheap", {"refuse_unasked": 1.0}), ("strict", True, "cheap", {"accept": 1.0}),
    ("agreeable", False, "cheap", {"accept": 1.0}),
    ("agreeable", False, "fast", {"accept_anyway": pytest.approx(0.36), "refuse": pytest.approx(0.64)}),
    ("agreeable", True, "fast", {"refuse": 1.0}),  # the collapse is in offers the customer was not asked for
])
def test_teacher_rules(rule, asked, offered, expect):
    assert reply_distribution(rule, "cheap", "offer", offered, asked, 0.9) == expect
    assert reply_distribution(rule, "cheap", "ask", None, asked, 0.9) == {"reveal": 1.0}


def test_the_collapsed_customers_dominant_reply_is_yes_to_the_basic_plan():
    assert reply_distribution("agreeable", "green", "offer", "cheap", False, 0.9) == {
        "accept_anyway": 0.9, "refuse": pytest.approx(0.1)}


def test_vs_candidates_state_the_distribution_they_were_drawn_from():
    rng = random.Random(0)
    for k in (3, 4, 5, 6):
        c = candidates({"accept_anyway": 0.4, "refuse": 0.6}, k, "plain", "cheap", rng, offered="fast")
        assert len(c) == k
        p = vs_mod.parse(json.dumps({"responses": c}), k)
        share = sum(q for t, q in zip(p.texts, p.probs) if ACCEPT in t)
        assert share == pytest.approx(0.4, abs=0.06)


def test_corpora_are_played_through_the_environment():
    rng = random.Random(1)
    env, exs = play(CollapseLab.load_tasks("train")[0], CustomerSpec("agreeable", "terse", 1.0), rng, vs_rate=1.0)
    assert all(e.one_shot for e in exs)  # every customer turn was a VS request here
    for e in exs:
        (msgs, reply), = e.targets
        assert reply.startswith(vs_mod.JSON_PREFIX) and vs_mod.parse(reply, 6).ok
        assert "[Give " in msgs[-1]["content"]
    agent = agent_corpus(300, 0)
    firsts = [e.targets[0][1] for e in agent]
    asks = sum(classify_reply(x) == "other" and "?" in x for x in firsts) / len(firsts)
    assert abs(sum(plan_of(x) is not None for x in firsts) / len(firsts) - AGENT_MIX["first"]["offer"]) < 0.08
    assert asks > 0.2
    cust = customer_corpus(CustomerSpec("careful", "plain"), 50, 0, vs_rate=0.0)
    replies = [r for e in cust for _, r in e.targets]
    assert all(ACCEPT in r or REFUSE in r or need_of(r) or "plan" in r or "help" in r for r in replies)


def test_bad_model_options_are_named():
    from recipes.collapse_lab.models import build

    with pytest.raises(ValueError, match="unknown options \\['colapse'\\]"):
        build("customer", {"colapse": 0.5})
    with pytest.raises(ValueError, match="temperament"):
        build("customer", {"temperament": "grumpy"})
    with pytest.raises(ValueError, match="collapse must lie in"):
        build("customer", {"collapse": 2})
    with pytest.raises(ValueError, match="lab:agent or lab:customer"):
        build("critic", {})


def test_lab_configs_extend_the_common_one_and_take_knobs(tmp_path):
    c = load_config("recipes/collapse_lab/configs/population.yaml",
                    ["models.collapsed.options.collapse=0.7", "partner.pool.size=2", "partner.lr=3e-4"])
    assert c.env.name == "lab" and c.partner.source == "pool" and c.partner.pool.size == 2
    assert c.models["collapsed"].options["collapse"] == 0.7 and c.models["collapsed"].options["style"] == "plain"
    assert c.partner.lr == 3e-4 and c.eval.at_start
    vs = load_config("recipes/collapse_lab/configs/vs.yaml", ["partner.vs.k=3"])
    assert vs.partner.decoding == "vs" and vs.partner.vs.k == 3
    (tmp_path / "a.yaml").write_text("extends: b.yaml\n")
    (tmp_path / "b.yaml").write_text("extends: a.yaml\n")
    with pytest.raises(ConfigError, match="loop"):
        load_config(str(tmp_path / "a.yaml"))
    (tmp_path / "c.yaml").write_text("extends: nowhere.yaml\n")
    with pytest.raises(ConfigError, match="not found"):
        load_config(str(tmp_path / "c.yaml"))
    assert get_env("lab") is CollapseLab and PLANS["cheap"] == "basic"


def test_a_customer_that_leaves_its_scenario_earns_the_adversary_nothing():
    from scope.partners.rewards import adversarial
    from scope.types import Episode

    env = env_for("fast")
    env.on_reply("agent", "what do you need ?")
    env.on_reply("partner", "i want fast .")
    env.on_reply("agent", "try the turbo plan , it is fast .")
    env.on_reply("partner", "i want fast , so no thanks . " + REFUSE)  # turns down the plan it needs
    assert env.meta["partner_fidelity"] == 0.0 and "turned down" in env.meta["out_of_character"]
    liar = env_for("fast")
    liar.on_reply("agent", "what do you need ?")
    liar.on_reply("partner", "i want green .")
    assert liar.meta["partner_fidelity"] == 0.0
    staller = env_for("fast")  # neither yes nor no to an offer: the co-trained simulator's way to stall
    staller.on_reply("agent", "try the turbo plan , it is fast .")
    staller.on_reply("partner", "hmm , let me think .")
    assert staller.meta["partner_fidelity"] == 0.0 and "did not answer an offer" in staller.meta["out_of_character"]
    mute = env_for("fast")  # asked, and no need named
    mute.on_reply("agent", "what do you need ?")
    mute.on_reply("partner", "hello there .")
    assert mute.meta["partner_fidelity"] == 0.0 and "when asked" in mute.meta["out_of_character"]
    rambler = env_for("fast")  # a reply cut at its token limit ends the dialogue (the rollout's truncation)
    rambler.on_reply("agent", "what do you need ?")
    rambler.on_reply("partner", "i want fast and i also want to tell you about my day and my")
    rambler.finish("truncated")
    assert rambler.meta["partner_fidelity"] == 0.0 and "token limit" in rambler.meta["out_of_character"]
    cut_agent = env_for("fast")  # the agent's own cut reply is not the customer's doing
    cut_agent.on_reply("agent", "what do you")
    cut_agent.finish("truncated")
    assert "partner_fidelity" not in cut_agent.meta
    fair = env_for("fast")
    fair.on_reply("agent", "try the basic plan , it is cheap .")
    fair.on_reply("partner", "i want fast , so no thanks . " + REFUSE)  # turning down a plan that misses
    assert "partner_fidelity" not in fair.meta

    eps = []
    for e in (env, fair):
        ep = Episode("t", "g", 0)
        ep.meta.update(e.meta)
        ep.rewards = e.rewards()
        eps.append(ep)
    assert adversarial(eps, "partner") == [0.0, 1.0]


def _peak_run(gain: float, noise: float, seed: int = 0) -> dict:
    """A synthetic lab run: Base at step 0, the best trained evaluation at step 5, the end at step 10, on 8
    unseen customers; every task of the peak gains ``gain`` plus noise of size ``noise``."""
    rng = random.Random(seed)
    tasks = [f"t{i}" for i in range(8)]
    base = {sim: {t: 0.4 + 0.2 * rng.random() for t in tasks} for sim in ("u1", "u2")}
    # the noise is +noise on half the tasks and -noise on the other half: the true gain is exactly `gain`
    peak = {sim: {t: v + gain + (noise if i % 2 else -noise) for i, (t, v) in enumerate(c.items())}
            for sim, c in base.items()}
    end = {sim: {t: max(0.0, v - 0.2) for t, v in c.items()} for sim, c in base.items()}
    return {"cells": {"0": base, "5": peak, "10": end}, "seen_flags": {"u1": False, "u2": False},
            "unseen_peak_step": 5, "last_eval_step": 10}


def test_a_peak_is_written_only_when_it_exceeds_two_standard_errors():
    """Single's best trained evaluation counts as a peak above Base only beyond 2 paired s.e.: a small gain
    drowned in task noise is "not a peak", a gain on every task is one; the end is tested against Base too."""
    from recipes.collapse_lab.signatures import peak_test

    small = peak_test(_peak_run(0.03, 0.3))
    assert small["peaks"] is False and small["peak_minus_base"]["lo"] < 0 < small["peak_minus_base"]["hi"]
    big = peak_test(_peak_run(0.3, 0.05))
    assert big["peaks"] is True and big["peak_minus_base"]["mean"] > 2 * big["peak_minus_base"]["se"]
    assert big["ends_below_base"] is True


def test_the_unseen_customers_reward_behaviour_no_training_simulator_has():
    """The panel's unseen customers differ from every training simulator of every lab config in the behaviour
    they reward (their temperament), not only in style."""
    import glob
    import os

    from scope.eval import load_panel
    from scope.panels import training_simulators

    here = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs")
    cfgs = [load_config(f) for f in glob.glob(os.path.join(here, "*.yaml"))
            if os.path.basename(f) not in ("common.yaml", "panel.yaml", "grid.yaml")]
    trained = {dict(s.weights[1]).get("temperament") for c in cfgs for s in training_simulators(c)
               if s.weights[0] == "lab:customer"}
    assert trained == {"agreeable", "careful", "strict"}
    panel = load_panel(os.path.join(here, "panel.yaml"))
    models = {**cfgs[0].models, **panel.models}
    unseen = [p for p in panel.partners if not p.seen]
    assert len(unseen) == 3
    for p in unseen:
        assert (models[p.model].options or {}).get("temperament") not in trained, p.id


def test_a_wrong_typed_lab_option_is_one_error_line(tmp_path, capsys):
    from scope.cli import main

    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"run: {{dir: {tmp_path / 'run'}, plugins: [recipes.collapse_lab]}}\n"
                   "models: {policy: {path: tiny-random}}\nenv: {name: lab, options: {discount: high}}\n")
    assert main(["check-config", str(cfg)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "env.options.discount" in err[0]
    assert not (tmp_path / "run").exists()


def test_every_model_the_configs_name_is_shipped_under_its_current_key():
    """The demo restores the lab's models from recipes/collapse_lab/prebuilt instead of training them: a change
    to the code or texts that shape a model changes its key, and then this fails until the models are shipped
    again (`python -m recipes.collapse_lab models`; `--check` rebuilds them byte for byte)."""
    import os

    from recipes.collapse_lab.models import _key, model_dir
    from recipes.collapse_lab.prebuilt import PREBUILT, manifest, named_models, sha256

    configs = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs")
    man = manifest()
    want = {f"base-{_key('base', {})}"} | {os.path.basename(model_dir(n, o)[0]) for n, o in named_models(configs)}
    assert want <= set(man), f"not shipped under the current key: {sorted(want - set(man))}"
    for name in want:
        assert sha256(os.path.join(PREBUILT, name, "model.safetensors")) == man[name]["sha256"], name
