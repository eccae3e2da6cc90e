"""Evaluation panels, diagnostics with known values, best-checkpoint selection and plots."""
import json
import math
import os
import subprocess
import sys

import pytest

from scope.config import ConfigError, parse_config
from scope.diagnostics import (behaviour_stats, bleu, distinct_n, group_similarity, p4g_behaviour, self_bleu,
                               variance_decomposition)
from scope.eval import load_panel, markdown, summarize
from scope.plot import plot_runs
from scope.guards import StartupError
from scope.run import read_metrics
from scope.train import train
from scope.types import Episode, SamplingParams


def test_variance_decomposition_known_cases():
    """The one-way ANOVA estimators, worked by hand: within = mean of the rows' sample variances (J - 1),
    agent = sample variance of the row means (I - 1) minus within / J, clipped at 0."""
    # all variation comes from the partner: each agent sample sees rewards 0 and 1
    v = variance_decomposition([[0, 1], [0, 1], [1, 0]])
    assert (v["partner"], v["agent"], v["partner_share"]) == (0.5, 0.0, 1.0)
    assert v["agent_raw"] == pytest.approx(-0.25)  # 0 - 0.5 / 2: the unclipped estimate
    # all from the agent: the partner always answers the same way
    v = variance_decomposition([[1, 1], [0, 0]])
    assert (v["partner"], v["agent"], v["partner_share"]) == (0.0, 0.5, 0.0)
    # mixed: within variances 0.5 and 0 -> 0.25; means 0.5 and 1 -> 0.125 - 0.25 / 2 = 0
    v = variance_decomposition([[0, 1], [1, 1]])
    assert v["partner"] == pytest.approx(0.25) and v["agent"] == pytest.approx(0.0)


def test_variance_decomposition_recovers_known_shares_from_simulated_data():
    """R = task + agent effect (variance A) + partner noise (variance P), I dialogues x J resamples per
    task: the estimated share is P / (P + A), pure partner noise included (the plug-in estimator gave
    0.80 there at J = 4)."""
    import numpy as np

    rng = np.random.default_rng(0)
    for share, J in ((1.0, 4), (0.75, 4), (0.5, 2), (0.2, 8)):
        P, A = share, 1.0 - share
        data = {}
        for t in range(3000):
            base = rng.normal(0, 3)  # task differences belong to neither part
            agent = rng.normal(0, np.sqrt(A), size=4)
            data[t] = [list(base + a + rng.normal(0, np.sqrt(P), size=J)) for a in agent]
        v = variance_decomposition(data)
        assert v["partner"] == pytest.approx(P, abs=0.03) and v["agent"] == pytest.approx(A, abs=0.03)
        assert v["partner_share"] == pytest.approx(share, abs=0.03), (share, J, v)


def test_variance_decomposition_is_conditional_on_the_task():
    # one task always succeeds and the other always fails: that is neither the partner nor the agent
    v = variance_decomposition({"easy": [[1, 1], [1, 1]], "hard": [[0, 0], [0, 0]]})
    assert (v["partner"], v["agent"], v["total"]) == (0.0, 0.0, 0.0)
    # pooled: mistaken for agent
    assert variance_decomposition([[1, 1], [1, 1], [0, 0], [0, 0]])["agent"] == pytest.approx(1 / 3)
    # in task A only the agent's turns matter, in task B only the partner's: each part is averaged over tasks
    v = variance_decomposition({"A": [[0, 0], [1, 1]], "B": [[0, 1], [0, 1]]})
    assert v["partner"] == pytest.approx(0.25) and v["agent"] == pytest.approx((0.5 - 0.25) / 2)
    # a task with a single first-stage dialogue has no agent part, and does not dilute it
    v = variance_decomposition({"A": [[0, 0], [1, 1]], "C": [[1, 1]]})
    assert v["agent"] == pytest.approx(0.5) and v["partner"] == 0.0


def test_similarity_measures():
    assert distinct_n(["a b a b"], 1) == 0.5
    assert distinct_n(["a b c", "d e f"], 2) == 1.0
    assert self_bleu(["the cat sat on the mat"] * 3) == pytest.approx(1.0)
    assert self_bleu(["alpha beta gamma delta", "one two three four five"]) < 0.2
    assert bleu("", ["x"]) == 0.0


def ep(gid, agent, partner, reward=0.0):
    msgs = []
    for a, p in zip(agent, partner):
        msgs += [{"role": "agent", "content": a}, {"role": "partner", "content": p}]
    return Episode(gid, gid, 0, messages=msgs, rewards={"agent": reward}, status="done")


def test_behaviour_modal_mass_at_the_same_dialogue_state():
    eps = [ep("g", ["hi", "give?"], ["Why?", "Okay [DONATE $1]"]),
           ep("g", ["hi", "give?"], ["Why?", "No, I will not."]),
           ep("g", ["hi", "give?"], ["Why?", "But is it real?"]),
           ep("h", ["hi"], ["Hello there"])]  # a state visited once is not counted
    b = behaviour_stats(eps, p4g_behaviour)
    # states (g, [hi]): question x3 -> 1.0; (g, [hi, Why?, give?]): donate/refuse/push_back -> 1/3
    assert b["modal_mass"] == pytest.approx((1.0 + 1 / 3) / 2) and b["states"] == 2
    assert b["class/question"] == pytest.approx(3 / 7) and b["class/donate"] == pytest.approx(1 / 7)
    # the same turn index after different histories is not the same state: nothing is compared there
    eps = [ep("g", ["hi", "give?"], ["Why?", "Okay [DONATE $1]"]),
           ep("g", ["hello", "give?"], ["Why?", "No, I will not."])]
    b = behaviour_stats(eps, p4g_behaviour)
    assert "modal_mass" not in b and b["states"] == 0
    eps = [ep("g", ["hi", "give?"], ["Why?", "Okay [DONATE $1]"]),
           ep("g", ["hi", "give?"], ["Why not?", "Okay [DONATE $2]"])]
    b = behaviour_stats(eps, p4g_behaviour)  # the first turns share a state; the second turns do not
    assert b["states"] == 1 and b["modal_mass"] == 1.0
    s = group_similarity(eps, "agent")
    assert s["self_bleu"] == pytest.approx(1.0)


def test_p4g_behaviour_classes():
    assert p4g_behaviour("Sure [DONATE $2]") == "donate"
    assert p4g_behaviour("No thanks.") == "refuse"
    assert p4g_behaviour("Hmm, but how do I know?") == "push_back"
    assert p4g_behaviour("What does the charity do?") == "question"
    assert p4g_behaviour("I like dogs.") == "other"


def test_panel_summary_and_markdown():
    per = {"a": {"mean": 0.5, "n": 4, "failed": 0, "seen": True, "se": 0.1},
           "b": {"mean": 0.1, "n": 4, "failed": 1, "seen": False, "se": 0.3},
           "c": {"mean": 0.3, "n": 4, "failed": 0, "seen": False, "se": 0.4, "truncated": 2}}
    r = summarize(per)
    assert r["panel_mean"] == pytest.approx(0.3) and r["panel_std"] == pytest.approx(math.sqrt(0.08 / 3))
    assert r["seen_mean"] == 0.5 and r["unseen_mean"] == pytest.approx(0.2)
    # the standard error of a mean of partner means: sqrt(sum of their squared s.e.) / their number
    assert r["unseen_se"] == pytest.approx(0.25) and r["seen_se"] == pytest.approx(0.1)
    per["b"].update(lo=0.02, hi=0.4, shares=["weights", "system_prompt"], family="smollm2")
    md = markdown(r)
    assert "| b† | no | smollm2 | 0.100 | [0.020, 0.400] | 0.300 | 4 | 1 | 0 | weights, system_prompt |" in md
    assert "| c | no | n/a | 0.300 | [n/a, n/a] | 0.400 | 4 | 0 | 2 | n/a |" in md
    assert "unseen 0.200 [n/a, n/a]" in md and "†: an unseen partner that runs on a training simulator's weights" in md


def test_panel_validation(tmp_path):
    with pytest.raises(ConfigError, match="partners"):
        load_panel({})
    with pytest.raises(ConfigError, match="repeat"):
        load_panel({"partners": [{"id": "x"}, {"id": "x"}]})
    with pytest.raises(ConfigError, match="partners.0.temprature: unknown key"):
        load_panel({"partners": [{"temprature": 1}]})


def write_run(d, rows):
    os.makedirs(d)
    with open(os.path.join(d, "metrics.jsonl"), "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")


def test_plot_writes_readable_pngs_and_a_score_table(tmp_path):
    a = tmp_path / "rl_single"
    b = tmp_path / "population"
    write_run(a, [{"step": s, "reward_mean": 0.1 * s, "reward_std": 0.1, "policy_entropy": 2 - 0.1 * s,
                   "zero_variance_frac": 0.1 * s, "turns_mean": 6, "eval/panel_mean": [0.2, 0.5, 0.3][s - 1],
                   "eval/panel_std": 0.05, "eval/seen_mean": [0.3, 0.6, 0.4][s - 1],
                   "eval/unseen_mean": [0.1, 0.4, 0.2][s - 1]} for s in (1, 2, 3)])
    write_run(b, [{"step": s, "reward_mean": 0.05 * s, "policy_entropy": 2.0, "zero_variance_frac": 0.2,
                   "turns_mean": 7} for s in (1, 2, 3)])
    out = tmp_path / "plots"
    files = plot_runs([str(a), str(b)], str(out))
    import matplotlib.image as mpimg

    pngs = [f for f in files if f.endswith(".png")]
    assert len(pngs) == 5
    for p in pngs:
        img = mpimg.imread(p)
        assert img.shape[0] > 100 and img.shape[1] > 100 and img.std() > 0
    table = open(out / "scores.md").read()
    # the best checkpoint chosen on the seen partners (step 2), the unseen score reported at that step
    # the train reward is the mean of the last 4 steps (here all 3: 0.1, 0.2, 0.3), not the last step's
    assert "| rl_single | 0.600 (2) | 0.400 | 0.400 | 0.200 | 0.200 |" in table
    assert "| population | n/a | n/a | n/a | n/a | 0.100 |" in table


def tiny(run_dir, panel_path, steps=2, select_on="seen"):
    return parse_config({
        "run": {"dir": str(run_dir), "save_every": 1, "progress": False},
        "models": {"policy": {"path": "tiny-random"}},
        "agent": {"model": "policy", "trainable": True, "max_new_tokens": 10},
        "partner": {"model": "policy", "max_new_tokens": 10},
        "env": {"name": "p4g", "options": {"max_turns": 1, "force_decision": True}},
        "rollout": {"n_tasks": 2, "group_size": 2, "end_on_truncation": False},
        "train": {"steps": steps, "lr": 1e-3},
        "eval": {"panel": str(panel_path), "every": 1, "select_on": select_on}})


PANEL = """
episodes: 3
partners:
  - {id: seen-p, seen: true, model: policy, temperature: 0.7, max_new_tokens: 10}
  - {id: unseen-p, seen: false, model: policy, temperature: 1.0, max_new_tokens: 10, note: "Be brief."}
"""


def test_training_evaluates_the_panel_and_keeps_the_best(tmp_path):
    panel = tmp_path / "panel.yaml"
    panel.write_text(PANEL)
    train(tiny(tmp_path / "run", panel), log=lambda s: None)
    ms = read_metrics(str(tmp_path / "run"))
    for m in ms:
        for k in ("eval/panel_mean", "eval/panel_std", "eval/seen_mean", "eval/unseen_mean",
                  "eval/partner/seen-p", "eval/partner/unseen-p", "agent_self_bleu", "partner_behaviour/states"):
            assert k in m, k
        assert m["eval/panel_mean"] == pytest.approx((m["eval/partner/seen-p"] + m["eval/partner/unseen-p"]) / 2)
    best = json.load(open(tmp_path / "run" / "best" / "best.json"))
    # chosen on the seen partners only (the default); the unseen score is reported at the chosen step
    assert best["select_on"] == "seen" and best["score"] == max(m["eval/seen_mean"] for m in ms)
    at = next(m for m in ms if m["step"] == best["step"])
    assert best["eval/unseen_mean"] == at["eval/unseen_mean"] and best["score"] == at["eval/seen_mean"]
    assert (tmp_path / "run" / "best" / "agent" / "adapter_model.safetensors").exists()
    from scope.policy import load_policy

    for policy in ("best", "checkpoints/step_000002"):  # either finds the run's own config
        cfg, _, agent = load_policy(str(tmp_path / "run" / policy), None, None, [])
        assert cfg.env.options == {"max_turns": 1, "force_decision": True} and agent.ref.adapter == "agent"
    assert (tmp_path / "run" / "eval" / "step_000001" / "eval.md").exists()
    # scope eval on the saved checkpoint, from the command line
    out = tmp_path / "ev"
    r = subprocess.run([sys.executable, "-m", "scope.cli", "eval", "--policy",
                        str(tmp_path / "run" / "checkpoints" / "step_000002"), "--panel", str(panel),
                        "--split", "test", "--episodes", "2", "--out", str(out)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    res = json.load(open(out / "eval.json"))
    assert set(res["per_partner"]) == {"seen-p", "unseen-p"} and res["per_partner"]["seen-p"]["n"] == 2
    assert "| seen-p | yes |" in r.stdout
    assert "eval: round 1: " in r.stdout and "eta" in r.stdout  # progress, a line a round


def test_choosing_on_seen_partners_needs_a_seen_partner(tmp_path):
    panel = tmp_path / "panel.yaml"
    panel.write_text(PANEL.replace("seen: true", "seen: false"))
    with pytest.raises(StartupError, match="marks no partner seen"):
        train(tiny(tmp_path / "run", panel), log=lambda s: None)
    assert not (tmp_path / "run").exists()  # refused before anything was written


def test_diagnose_command(tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text("models: {policy: {path: tiny-random}}\n"
                    "agent: {model: policy, max_new_tokens: 8}\npartner: {model: policy, max_new_tokens: 8}\n"
                    "env: {name: p4g, options: {max_turns: 1, force_decision: true}}\n")
    out = tmp_path / "d.json"
    r = subprocess.run([sys.executable, "-m", "scope.cli", "diagnose", str(spec), "--tasks", "2", "--group", "3",
                        "--resamples", "2", "--out", str(out)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    d = json.load(open(out))
    assert 0 <= d["modal_mass"] <= 1 and d["behaviour"]["states"] >= 0
    v = d["variance"]
    assert v["total"] == pytest.approx(v["partner"] + v["agent"])


def _decompose_cfg(run_dir, steps, every):
    return parse_config({
        "run": {"dir": str(run_dir), "save_every": 10, "progress": False, "save_rollouts": False},
        "models": {"policy": {"path": "tiny-random"}},
        "agent": {"model": "policy", "trainable": True, "max_new_tokens": 8},
        "partner": {"model": "policy", "max_new_tokens": 8, "temperature": 1.0},
        "env": {"name": "p4g", "options": {"max_turns": 2, "force_decision": True}},
        "rollout": {"n_tasks": 3, "group_size": 2, "end_on_truncation": False},
        "train": {"steps": steps, "lr": 1e-3},
        "diagnostics": {"decompose_every": every, "decompose_tasks": 2, "decompose_resamples": 3}})


def test_training_logs_the_variance_decomposition(tmp_path):
    train(_decompose_cfg(tmp_path / "run", 2, 1), log=lambda s: None)
    for m in read_metrics(str(tmp_path / "run")):
        assert m["collapse/total_var"] == pytest.approx(m["collapse/partner_var"] + m["collapse/agent_var"])
        assert m["collapse/partner_var"] >= 0 and m["collapse/agent_var"] >= 0
        assert m["collapse/tasks"] == 2 and 0 <= m["collapse/modal_mass"] <= 1


def test_the_decomposition_changes_no_training_number(tmp_path):
    """It draws on noise of its own and gives the generators back: a run with it on trains exactly as one
    without it (so turning it on in a reported config does not change the reported run)."""
    def run(name, every):
        train(_decompose_cfg(tmp_path / name, 3, every), log=lambda s: None)
        return read_metrics(str(tmp_path / name))

    off, on = run("off", 0), run("on", 1)
    assert all("collapse/partner_var" in m for m in on) and not any("collapse/partner_var" in m for m in off)
    for a, b in zip(off, on):
        for k in ("reward_mean", "reward_std", "policy_entropy", "train/loss", "train/kl", "tokens_generated"):
            assert a[k] == b[k], (a["step"], k)


def test_a_panel_plays_every_task_of_the_split_by_default():
    from scope.envs.base import get_env
    from scope.config import EnvConfig
    from scope.eval import Panel, panel_jobs
    from scope.partners.binding import Binding
    from scope.types import SamplingParams

    env = EnvConfig(name="p4g")
    panel = Panel(partners=[{"id": "a", "seen": True, "model": "m"}, {"id": "b", "seen": False, "model": "m"}],
                  repeats=2)
    agent = Binding("agent", object(), SamplingParams())
    jobs, owner = panel_jobs(agent, panel, {"m": object()}, env, "test", seed=0)
    tasks = sorted(t.id for t in get_env("p4g").load_tasks("test"))
    for pid in ("a", "b"):
        mine = [j.episode.task_id for j, p in zip(jobs, owner) if p.spec_id() == pid]
        assert sorted(mine) == sorted(tasks * 2)  # every test task, repeats times
    again, _ = panel_jobs(agent, panel, {"m": object()}, env, "test", seed=0)
    assert [j.env.rng.random() for j in again] == [j.env.rng.random() for j in panel_jobs(
        agent, panel, {"m": object()}, env, "test", seed=0)[0]]  # the same environment seeds each time
    capped, _ = panel_jobs(agent, Panel(partners=panel.partners, episodes=3), {"m": object()}, env, "test", 0)
    assert len(capped) == 6


class _StubPartner:
    """A partner whose reply class depends only on the agent's last message: donates to a message with
    'please', else refuses or asks (alternating)."""

    chat, trainable, version, id = True, False, 0, "stub"

    def __init__(self):
        self.n = 0

    def drop_sessions(self, keys):
        pass

    def chat_generate(self, convs, sampling, response_format=None):
        from scope.types import Completion

        out = []
        for c in convs:
            self.n += 1
            last = c[-1]["content"]
            text = "ok [DONATE $1]" if "please" in last else ("no thanks" if self.n % 2 else "why?")
            out.append(Completion(text, [], [], "eos"))
        return out


def test_probe_states_are_fixed_and_measure_the_partner_not_the_agent(tmp_path):
    """Modal mass at fixed probe states: the same partner measured at the same states gives the same value
    whichever agent the run has become (visited-state modal mass moves with the agent's rollouts)."""
    from scope.diagnostics import CLASSIFIERS
    from scope.envs.base import get_env
    from scope.eval import ProbeStates
    from scope.partners.binding import Binding

    tasks = {t.id: t for t in get_env("p4g").load_tasks("train")[:4]}
    ids = list(tasks)
    eps = [Episode(ids[i % 4], f"g{i % 4}", i, status="done",
                   messages=[{"role": "agent", "content": "please give" if i % 4 == 0 else "hello"},
                             {"role": "partner", "content": "x"}]) for i in range(8)]
    probes = ProbeStates.from_episodes(eps, 3)
    assert [s["agent_turn"] for s in probes.states] == ["please give", "hello", "hello"]
    probes.save(str(tmp_path / "p.json"))
    assert ProbeStates.load(str(tmp_path / "p.json")).states == probes.states
    sp = SamplingParams()
    partner = Binding("stub", _StubPartner(), sp)
    m = probes.measure(tasks, [partner], sp, "p4g", {"max_turns": 2}, samples=4, classify=CLASSIFIERS.get("p4g"),
                       seed=0)
    # state 1: always donate (mass 1); states 2 and 3: refuse and question alternate (mass 0.5)
    assert m["probe_states"] == 3 and m["modal_mass"] == pytest.approx((1 + 0.5 + 0.5) / 3)


def test_training_logs_probe_modal_mass_at_states_saved_at_step_1(tmp_path):
    c = tiny(tmp_path / "run", None, steps=2)
    c.eval.panel = None
    c.diagnostics.probe_every = 2
    c.diagnostics.probe_states = 2
    c.diagnostics.probe_samples = 2
    train(c, log=lambda s: None)
    ms = {m["step"]: m for m in read_metrics(str(tmp_path / "run"))}
    states = json.load(open(tmp_path / "run" / "probes.json"))
    assert len(states) == 2 and all(s["agent_turn"] for s in states)
    for step in (1, 2):  # at step 1 and every probe_every steps
        assert 0 < ms[step]["partner_behaviour/modal_mass"] <= 1 and ms[step]["partner_behaviour/probe_states"] == 2


def test_the_score_table_prints_intervals_where_the_run_logged_them():
    from scope.plot import scores_table

    ms = [{"step": 1, "reward_mean": 0.5, "eval/seen_mean": 0.6, "eval/seen_se": 0.05, "eval/unseen_mean": 0.4,
           "eval/unseen_se": 0.1}]
    row = "| r | 0.600 ± 0.098 (1) | 0.400 ± 0.196 | 0.600 ± 0.098 | 0.400 ± 0.196 | 0.500 |"
    assert row in scores_table({"r": ms})
