"""Environment simulation: leaf-level labels, the 400-sample benchmark rebuilt from the tau2 data, simulators
whose accuracy is known (exact tools, no change, a noisy oracle with injected error rates), the constrained
mode's checks, and a model simulator through the engine."""
import math

import pytest

from conftest import shared_path
from scope.envsim.state import apply, diff, lenient_match, size, strict_match


def test_diff_apply_and_the_two_matches():
    a = {"orders": {"#W1": {"status": "pending", "items": [{"id": 1}], "note": "x"}}}
    b = {"orders": {"#W1": {"status": "cancelled", "items": [{"id": 1}, {"id": 2}]}, "#W2": {"k": [1, 2]}}}
    ch = diff(a, b)
    assert apply(a, ch) == b and size(ch) == 1 + 1 + 1 + 2  # status, note deleted, item added, #W2's two leaves
    assert strict_match(a, b, ch) and lenient_match(a, b, ch)
    # an invented change: strict sees it, lenient (true changed paths only) does not
    invented = ch + [{"type": "modify", "path": "orders.#W1.items.0.id", "value": 9}]
    assert not strict_match(a, b, invented) and lenient_match(a, b, invented)
    # a missed delete: both see it
    missed = [c for c in ch if c["type"] != "delete"]
    assert not strict_match(a, b, missed) and not lenient_match(a, b, missed)
    assert not strict_match(a, b, [{"type": "modify", "path": "orders.#W9.status", "value": "x"}])  # no such path


@pytest.fixture(scope="module")
def bench():
    from scope.envsim.bench import load_bench

    return load_bench(shared_path("data", "tau2"))


def test_the_benchmark_is_rebuilt_stratified_and_every_slice_is_faithful(bench):
    from collections import Counter

    from scope.envsim.bench import load_data
    from scope.envsim.samples import STRATA, check_slice, stratum

    assert len(bench) == 400 and Counter(stratum(s) for s in bench) == Counter(STRATA)
    assert {s["domain"] for s in bench} == {"retail", "airline"}
    data = load_data(shared_path("data", "tau2"))
    assert all(check_slice(s["domain"], data[s["domain"]]["db"], s) for s in bench)  # the slice alone gives the same


def test_known_simulators_score_as_they_must(bench):
    from scope.envsim.bench import run
    from scope.envsim.simulate import ExactSimulator, NoChangeSimulator

    ex = run(ExactSimulator(), bench, log=lambda s: None)["summary"]
    assert ex["overall"]["fm"] == ex["overall"]["cm_strict"] == ex["overall"]["cm_lenient"] == 1.0
    nc = run(NoChangeSimulator(), bench, log=lambda s: None)["summary"]
    zero_share = ex["axes"]["changes"]["0"]["n"] / 400
    assert nc["overall"]["cm_lenient"] == pytest.approx(zero_share)
    assert all(nc["axes"]["changes"][k]["cm_strict"] == 0.0 for k in ("1", "2", "3+"))


def test_the_noisy_oracle_is_measured_at_its_injected_rates(bench):
    from scope.envsim.bench import run
    from scope.envsim.simulate import NoisyOracle

    sim = NoisyOracle(feedback_error=0.1, change_error={"0": 0.05, "1": 0.2, "2": 0.4, "3+": 0.6}, seed=3)
    s = run(sim, bench, log=lambda m: None)["summary"]
    for b, p in sim.change_error.items():
        r = s["axes"]["changes"][b]
        se = math.sqrt(p * (1 - p) / r["n"])
        assert abs((1 - r["cm_strict"]) - p) <= 3 * se + 1e-9, (b, r, p)
    assert abs((1 - s["overall"]["fm"]) - 0.1) <= 3 * math.sqrt(0.09 / 400)
    assert s["cliff"]["cm_strict"] > 0.3  # accuracy falls as more fields change
    assert s["axes"]["changes"]["0"]["cm_lenient"] > s["axes"]["changes"]["0"]["cm_strict"]  # invented changes


def test_the_constrained_mode_catches_what_the_tools_cannot_do(bench):
    from scope.envsim.simulate import violations

    write = next(s for s in bench if s["tool"] == "cancel_pending_order" and s["changes"])
    assert violations(write, write["changes"]) == []
    status = next(c for c in write["changes"] if c["path"].endswith(".status"))
    bad = [dict(status, value="delivered")]
    assert any("no tool turns status" in v for v in violations(write, bad))
    assert any("a number where" in v or "where the field holds" in v
               for v in violations(write, [dict(status, value=3)]))
    unknown = {"type": "modify", "path": "orders.#W0000000.status", "value": "cancelled"}
    assert any("not among the records" in v for v in violations(write, [unknown]))
    read = next(s for s in bench if s["tool"] == "get_order_details")
    assert any("read tool" in v for v in violations(read, write["changes"]))
    gift = next((s for s in bench if any(c["path"].endswith(".balance") for c in s["changes"])), None)
    if gift is not None:
        c = next(c for c in gift["changes"] if c["path"].endswith(".balance"))
        assert any("cannot be negative" in v for v in violations(gift, [dict(c, value=-5)]))


def test_a_model_simulator_runs_through_the_engine_and_is_repaired_once(bench):
    from scope.envsim.bench import score
    from scope.envsim.simulate import ModelSimulator
    from scope.models.backend import ModelRef
    from scope.models.loading import load_tokenizer, tiny_backend
    from scope.partners.binding import Binding
    from scope.types import SamplingParams

    b = tiny_backend(load_tokenizer("tiny-random"), seed=0)
    binding = Binding("tiny", ModelRef("tiny:base", b), SamplingParams(temperature=1.0, max_new_tokens=16))
    few = bench[::80]
    plain = ModelSimulator(binding).predict(few)
    assert len(plain) == len(few) and all(p["calls"] == 1 for p in plain)
    rows = score(few, plain)
    assert all(not r["fm"] for r in rows)  # a random model does not write the tool's answer
    cons = ModelSimulator(binding, constrained=True).predict(few)
    assert all(p["calls"] in (1, 2) for p in cons)
    from scope.envsim.bench import run

    lines: list[str] = []
    res = run(ModelSimulator(binding, batch=2), few, log=lines.append)  # a line with an ETA after each batch
    assert len(res["rows"]) == len(few)
    done = [ln for ln in lines if "samples, " in ln and "eta" in ln]
    assert len(done) == (len(few) + 1) // 2 and done[-1].split(": ")[2].startswith(f"{len(few)}/{len(few)} samples")


def _gold_task(root, domain="retail", writes=1):
    from scope.envs.base import get_env
    from scope.envs.tau2.tools import DOMAINS

    cls = get_env(f"tau2_{domain}")
    for t in cls.load_tasks("train", data_dir=root):
        acts = t.data["task"]["evaluation_criteria"].get("actions") or []
        if sum(DOMAINS[domain][a["name"]].kind == "write" for a in acts) >= writes and len(acts) <= 5:
            return cls, t
    raise AssertionError("no task")


def _play(env, replies_for_envsim):
    """Drive a simulated-tools episode: the agent makes the gold calls, then says what must be said and ends;
    the user stays silent; ``replies_for_envsim(exact_feedback, attempt)`` answers each call."""
    import json

    crit = env.raw["evaluation_criteria"]
    calls = [f"<tool_call>{json.dumps({'name': a['name'], 'arguments': a.get('arguments', {})})}</tool_call>"
             for a in crit.get("actions") or []]
    final = "Done: " + ", ".join(map(str, crit.get("communicate_info") or [])) + " ###STOP###"
    script = iter(calls + [final])
    env.on_reply("partner", "I need help with my order.")
    attempt = 0
    while not env.done:
        role = env.next_role()
        if role == "agent":
            env.on_reply("agent", next(script))
        elif role == "envsim":
            attempt += 1
            env.on_reply("envsim", replies_for_envsim(env.sim.pending["exact"], attempt))
        else:
            env.on_reply("partner", "ok")
    return env.rewards()


def test_simulated_tools_answer_the_agent_while_the_grade_reads_the_exact_database():
    import json
    import random

    root = shared_path("data", "tau2")
    cls, task = _gold_task(root)
    # a simulator that says the exact answer and changes: every call labelled right, reward 1
    env = cls(task, random.Random(0), data_dir=root, tools="simulated")
    assert env.roles == ("agent", "partner", "envsim")
    r = _play(env, lambda ex, a: json.dumps({"feedback": ex["feedback"], "config_changes": ex["changes"]}))
    assert r["agent"] == 1.0 and r["envsim"] == 1.0 and env.meta["envsim"]["calls"] >= 1
    assert env.meta["envsim"]["fm"] == env.meta["envsim"]["cm"] == 1.0
    # a simulator that answers wrongly: the agent sees its answer, the grade still reads the exact database
    env = cls(task, random.Random(0), data_dir=root, tools="simulated")
    r = _play(env, lambda ex, a: json.dumps({"feedback": "all fine", "config_changes": []}))
    assert r["agent"] == 1.0 and r["envsim"] == 0.0
    assert any(m["content"] == "<tool_result>all fine</tool_result>" for m in env.views["agent"])
    assert not env.meta["envsim"]["labels"][0]["fm"]
    # unreadable answers reach the agent as a tool error
    env = cls(task, random.Random(0), data_dir=root, tools="simulated")
    _play(env, lambda ex, a: "no json here")
    assert env.meta["envsim"]["unreadable"] == env.meta["envsim"]["calls"] and env.tool_errors >= 1


def test_the_constrained_simulator_is_sent_back_once_then_fails_the_call():
    import json
    import random

    root = shared_path("data", "tau2")
    cls, task = _gold_task(root)
    bad = json.dumps({"feedback": "{}", "config_changes": [{"type": "modify", "path": "orders.#W0000000.status",
                                                           "value": "cancelled"}]})
    seen = []
    env = cls(task, random.Random(0), data_dir=root, tools="simulated", envsim_constrained=True)

    def reply(ex, attempt):
        seen.append(attempt)
        return bad
    _play(env, reply)
    labels = env.meta["envsim"]["labels"]
    writes = [x for x in labels if x["repaired"]]
    assert writes and all(x.get("failed") for x in writes)
    assert any("break these rules" in m["content"] for m in env.views["envsim"] if m["role"] == "user")


def test_a_run_trains_against_a_simulated_environment_and_evaluates_on_the_exact_tools(tmp_path):
    from scope.config import ConfigError, parse_config
    from scope.run import read_metrics
    from scope.train import train

    root = shared_path("data", "tau2")
    base = {"run": {"dir": str(tmp_path / "run"), "save_every": 10, "progress": False},
            "models": {"policy": {"path": "tiny-random", "lora": {"r": 4, "alpha": 8}}},
            "agent": {"model": "policy", "trainable": True, "max_new_tokens": 8},
            "partner": {"model": "policy", "max_new_tokens": 8},
            "envsim": {"model": "policy", "trainable": True, "max_new_tokens": 16},
            "env": {"name": "tau2_retail", "options": {"data_dir": root, "tools": "simulated", "max_steps": 6}},
            "rollout": {"n_tasks": 2, "group_size": 2, "end_on_truncation": False},
            "train": {"steps": 1, "lr": 1e-3}}
    with pytest.raises(ConfigError, match="needs an envsim role"):
        parse_config({**base, "envsim": None})
    train(parse_config(base), log=lambda s: None)
    m = read_metrics(str(tmp_path / "run"))[-1]
    assert m["failed_episodes"] == 0 and "envsim/accuracy" in m
    assert "envsim/train/trained_sequences" in m  # the simulator is a role like the partner: it trained



def test_the_simulator_is_a_role_of_the_rollout_engine_with_its_own_token_trace():
    """Scripted agent and user, the tiny model as the simulator: its turns are generated by the engine, token
    by token, on its own trace (mask on its tokens only), beside the agent's."""
    import json
    import random

    from scope.models.backend import ModelRef
    from scope.models.loading import load_tokenizer, tiny_backend
    from scope.partners.binding import Binding
    from scope.rollout import Job, run_rollouts
    from scope.study.agents import ScriptedRef
    from scope.types import Episode, SamplingParams

    root = shared_path("data", "tau2")
    cls, task = _gold_task(root)
    crit = task.data["task"]["evaluation_criteria"]
    calls = [f"<tool_call>{json.dumps({'name': a['name'], 'arguments': a.get('arguments', {})})}</tool_call>"
             for a in crit["actions"]]
    agent = Binding("agent", ScriptedRef("agent", calls + ["Done ###STOP###"]), SamplingParams())
    user = Binding("user", ScriptedRef("user", ["Please help."]), SamplingParams())
    b = tiny_backend(load_tokenizer("tiny-random"), seed=0)
    sim = Binding("envsim", ModelRef("tiny:base", b), SamplingParams(temperature=1.0, max_new_tokens=12))
    env = cls(task, random.Random(0), data_dir=root, tools="simulated")
    eps, _ = run_rollouts([Job(env, Episode(task.id, "g", 0), {"agent": agent, "partner": user, "envsim": sim}, uid=1)],
                          max_context=8192, end_on_truncation=False)
    e = eps[0]
    assert e.status != "failed", e.error
    n = e.meta["envsim"]["calls"]  # (the character-level tiny model's context may end it before the last call)
    assert n >= 2 and e.meta["envsim"]["unreadable"] == n  # a random model writes no JSON: each call an error
    t = e.traces["envsim"]
    assert t.n_turns == n and 0 < sum(t.mask) <= 12 * n
    assert len(t.token_ids) == len(t.mask) == len(t.logprobs)
    assert e.rewards["agent"] in (0.0, 1.0) and "envsim" in e.rewards


def test_a_trained_environment_simulator_has_a_placement_of_its_own():
    """Under torchrun every trained model is placed on ranks of its own (``parallel.<owner>``): a trainable
    envsim is one, beside the agent and the partner (tests/dist runs it on two ranks)."""
    from scope.config import parse_config
    from scope.parallel import owners_of, ranks_of

    root = shared_path("data", "tau2")
    cfg = parse_config({"models": {"policy": {"path": "tiny-random"}},
                        "agent": {"model": "policy", "trainable": True},
                        "envsim": {"model": "policy", "trainable": True},
                        "env": {"name": "tau2_retail", "options": {"data_dir": root, "tools": "simulated"}},
                        "parallel": {"agent": {"ranks": [0]}, "envsim": {"ranks": [1], "strategy": "fsdp"}}})
    assert owners_of(cfg) == ["agent", "envsim"]
    assert ranks_of(cfg, "agent", 2) == ([0], "ddp") and ranks_of(cfg, "envsim", 2) == ([1], "fsdp")
    with pytest.raises(ValueError, match=r"parallel.envsim.ranks: \[1\] is not a non-empty subset of the 1 ranks"):
        ranks_of(cfg, "envsim", 1)
