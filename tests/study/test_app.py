"""The study app's API on a temporary database: flow, assignment, storage, security, restarts."""
import hashlib
import hmac
import json
import os

import pytest
from fastapi.testclient import TestClient

from conftest import shared_path
from scope.config import ConfigError
from scope.study import store
from scope.study.config import parse_study
from tests.study.helpers import ADMIN, SECRET, gold_script, make, say, start, study_cfg, tool_call

P4G = {"env": "p4g", "split": "test", "options": {"personas": "builtin"}, "max_turns": 3}


def p4g_app(tmp_path, conditions=("condAlpha", "condBeta")):
    cfg = study_cfg(tmp_path / "s.db", {"p4g": P4G},
                    {c: {"p4g": {"scripted": [f"[{i}] Would you give to the children? You said: {{last_user}}"]}}
                     for i, c in enumerate(conditions)})
    return cfg, TestClient(make(cfg))


@pytest.fixture()
def tau2_dir():
    return shared_path("data", "tau2")


def retail_task(tau2_dir, pred):
    with open(os.path.join(tau2_dir, "domains", "retail", "tasks.json")) as f:
        tasks = json.load(f)
    with open(os.path.join(tau2_dir, "domains", "retail", "split_tasks.json")) as f:
        test_ids = set(json.load(f)["test"])
    return next(t for t in tasks if str(t["id"]) in test_ids and pred(t))


# ---- configuration ----------------------------------------------------------------------------------
def test_config_errors_name_the_problem(tmp_path):
    with pytest.raises(ConfigError, match="condition 'a': needs an agent for every task type.*missing \\['p4g'\\]"):
        parse_study({"tasks": {"p4g": P4G}, "conditions": {"a": {}}})
    with pytest.raises(ConfigError, match="exactly one of policy, endpoint, scripted or team"):
        parse_study({"tasks": {"p4g": P4G}, "conditions": {"a": {"p4g": {"policy": "base", "scripted": ["x"]}}}})
    with pytest.raises(ConfigError, match="study.colour: unknown key"):
        parse_study({"study": {"colour": 1}, "tasks": {"p4g": P4G}, "conditions": {"a": {"p4g": {"scripted": ["x"]}}}})
    with pytest.raises(ConfigError, match="unknown condition 'zz'"):
        parse_study({"tasks": {"p4g": P4G}, "conditions": {"a": {"p4g": {"scripted": ["x"]}}},
                     "analysis": {"comparisons": [["a", "zz"]]}})
    cfg = study_cfg(tmp_path / "s.db", {"p4g": {**P4G, "options": {"persona_file": "x"}}},
                    {"a": {"p4g": {"scripted": ["x"]}}})
    with pytest.raises(ConfigError, match="unknown environment options \\['persona_file'\\]"):
        make(cfg)


# ---- start, resume, assignment ------------------------------------------------------------------------
def test_start_resume_and_the_condition_never_reaches_the_browser(tmp_path):
    cfg, c = p4g_app(tmp_path)
    st, h = start(c, "P1")
    assert st["kind"] == "p4g" and st["status"] == "active"
    assert st["messages"][0]["role"] == "agent"  # the persuader writes first
    again, _ = start(c, "P1")
    assert again["session"] == st["session"] and again["token"] == st["token"]
    assert len(again["messages"]) == 1  # resuming does not make the agent speak again
    assert c.post("/api/start",
                  json={"participant_id": "P1", "study_id": "S1", "session_id": "OTHER"}).status_code == 409
    # a link made for another study fills no cell of this one
    assert c.post("/api/start", json={"participant_id": "P9", "study_id": "S2", "session_id": "X"}).status_code == 404
    assert store.find_session(c.app.state.service.engine, "S2", "P9") is None
    for bad in ({"participant_id": "P 1", "study_id": "S", "session_id": "X"}, {"participant_id": "P2"},
                {"participant_id": "x" * 65, "study_id": "S", "session_id": "X"}):
        assert c.post("/api/start", json=bad).status_code == 400
    bodies = [json.dumps(st), json.dumps(again), c.get(f"/api/session/{st['session']}", headers=h).text,
              c.get("/").text]
    bodies += [json.dumps(e) for e in say(c, st, h, "hello")]
    for b in bodies:
        assert "condAlpha" not in b and "condBeta" not in b


def test_assignment_is_least_filled_with_a_stable_tie_break(tmp_path):
    assert store.choose_cell({("a", "t"): 1, ("b", "t"): 0}, "p") == ("b", "t")
    ties = {("a", "t"): 0, ("b", "t"): 0, ("c", "t"): 0}
    pick = store.choose_cell(ties, "some-participant")
    assert pick == min(ties, key=lambda k: hashlib.sha256(f"some-participant\x00{k[0]}\x00{k[1]}".encode()).hexdigest())
    assert all(store.choose_cell(dict(ties), "some-participant") == pick for _ in range(3))
    picks = {store.choose_cell(ties, f"p{i}") for i in range(30)}
    assert len(picks) == 3  # the tie-break spreads participants
    cfg, c = p4g_app(tmp_path, conditions=("a", "b", "c"))
    for i in range(7):
        start(c, f"P{i}")
    counts = sorted(store.cell_counts(c.app.state.service.engine).values())
    assert counts == [2, 2, 3]


# ---- security --------------------------------------------------------------------------------------------
def test_every_session_request_checks_the_owner_token_and_admin_needs_its_token(tmp_path):
    cfg, c = p4g_app(tmp_path)
    a, ha = start(c, "PA")
    b, hb = start(c, "PB")
    assert a["token"] == hmac.new(SECRET, f"owner:{a['session']}".encode(), hashlib.sha256).hexdigest()
    sid = a["session"]
    for h in ({}, hb, {"X-Session-Token": "0" * 64}):
        assert c.get(f"/api/session/{sid}", headers=h).status_code == 404
        assert c.post(f"/api/session/{sid}/message", json={"text": "hi"}, headers=h).status_code == 404
        assert c.post(f"/api/session/{sid}/end", headers=h).status_code == 404
        assert c.post(f"/api/session/{sid}/survey", json={"answers": {}}, headers=h).status_code == 404
    assert len(sid) >= 24  # about 144 random bits
    assert c.get("/api/admin/cells").status_code == 403
    assert c.get("/api/admin/cells", headers={"Authorization": "Bearer wrong"}).status_code == 403
    adm = {"Authorization": f"Bearer {ADMIN}"}
    assert sum(x["n"] for x in c.get("/api/admin/cells", headers=adm).json()["cells"]) == 2
    assert c.get("/api/admin/export/turns.csv").status_code == 403
    csv = c.get("/api/admin/export/sessions.csv", headers=adm).text
    assert sid in csv and b["session"] in csv


def test_inputs_are_length_capped(tmp_path):
    cfg, c = p4g_app(tmp_path)
    st, h = start(c, "P1")
    r = c.post(f"/api/session/{st['session']}/message", json={"text": "x" * 2001}, headers=h)
    assert r.status_code == 413 and "2000 characters" in r.json()["error"]
    assert c.post(f"/api/session/{st['session']}/message", json={"text": "  "}, headers=h).status_code == 400
    r = c.post(f"/api/session/{st['session']}/message", content=b"{" + b" " * 70_000 + b"}", headers=h)
    assert r.status_code == 413
    assert c.post(f"/api/session/{st['session']}/message", content=b"[1]", headers=h).status_code == 400
    c.post(f"/api/session/{st['session']}/end", headers=h)
    good = {"persuasive": 4, "respectful": 4, "engaging": 4, "natural": 4, "manipulated": 4, "donation": 1}
    r = c.post(f"/api/session/{st['session']}/survey", json={"answers": good, "free_text": "y" * 5001}, headers=h)
    assert r.status_code == 413
    turns = store.session_turns(c.app.state.service.engine, st["session"])
    assert all(len(t.content) <= 2000 for t in turns)


# ---- the chat, its end, the survey ------------------------------------------------------------------------
def test_p4g_flow_turn_cap_survey_once_and_completion_code(tmp_path):
    cfg, c = p4g_app(tmp_path)
    st, h = start(c, "P1")
    sid = st["session"]
    evs = say(c, st, h, "Who are you?")
    deltas = "".join(e["text"] for e in evs if e["type"] == "delta")
    msg = next(e for e in evs if e["type"] == "message")
    assert deltas == msg["text"] and msg["text"].endswith("You said: Who are you?")  # a scripted reply: whole
    say(c, st, h, "Maybe.")
    evs = say(c, st, h, "OK, bye.")  # the third message: the turn cap
    assert {"type": "end", "reason": "turn_cap"} in evs
    assert c.post(f"/api/session/{sid}/message", json={"text": "more"}, headers=h).status_code == 409
    state = c.get(f"/api/session/{sid}", headers=h).json()
    assert state["status"] == "ended" and state["user_turns"] == 3
    assert [m["role"] for m in state["messages"]] == ["agent", "user", "agent", "user", "agent", "user"]
    bad = c.post(f"/api/session/{sid}/survey", json={"answers": {"donation": 3}}, headers=h)
    assert bad.status_code == 400 and "missing" in bad.json()["error"]
    answers = {"persuasive": 5, "respectful": 6, "engaging": 4, "natural": 3, "manipulated": 2, "donation": 0.5}
    for bad_value in ({"persuasive": 8}, {"persuasive": 4.5}, {"donation": 2.5}, {"donation": True}):
        assert c.post(f"/api/session/{sid}/survey", json={"answers": answers | bad_value}, headers=h).status_code == 400
    r1 = c.post(f"/api/session/{sid}/survey", json={"answers": answers, "free_text": "nice"}, headers=h).json()
    r2 = c.post(f"/api/session/{sid}/survey", json={"answers": answers | {"donation": 2}}, headers=h).json()
    code = hmac.new(SECRET, f"complete:{sid}".encode(), hashlib.sha256).hexdigest()[:12].upper()
    assert r1 == r2 and r1["code"] == code and r1["redirect"].endswith("cc=" + code)
    eng = c.app.state.service.engine
    _, _, surveys = store.all_rows(eng)
    assert len(surveys) == 1 and json.loads(surveys[0].answers)["donation"] == 0.5  # stored once, the first
    assert c.get(f"/api/session/{sid}", headers=h).json()["completion"]["code"] == code


def test_stop_command_and_survey_before_the_end_is_refused(tmp_path):
    cfg, c = p4g_app(tmp_path)
    st, h = start(c, "P1")
    good = {"persuasive": 4, "respectful": 4, "engaging": 4, "natural": 4, "manipulated": 4, "donation": 1}
    assert c.post(f"/api/session/{st['session']}/survey", json={"answers": good}, headers=h).status_code == 409
    evs = say(c, st, h, "/stop")
    assert {"type": "end", "reason": "participant"} in evs


def test_a_failing_agent_ends_the_session_with_the_error_recorded(tmp_path):
    cfg = study_cfg(tmp_path / "s.db", {"p4g": P4G},
                    {"a": {"p4g": {"endpoint": {"backend": "openai", "base_url": "http://127.0.0.1:9/v1",
                                                "model_name": "none", "max_retries": 0, "timeout": 2}}}})
    c = TestClient(make(cfg))
    st, h = start(c, "P1")
    assert st["status"] == "ended" and st["end_reason"] == "agent_error"
    turns = store.session_turns(c.app.state.service.engine, st["session"])
    assert turns[-1].kind == "error" and "agent failed" in turns[-1].content and not turns[-1].visible


def test_a_checkpoint_from_scope_train_is_a_condition_without_conversion(tmp_path):
    from scope.train import train
    from tests.test_train_run import tiny_cfg

    run = tmp_path / "run"
    train(tiny_cfg(run, steps=1, save_every=1), log=lambda s: None)
    ckpt = run / "checkpoints" / "step_000001"
    cfg = study_cfg(tmp_path / "s.db", {"p4g": P4G}, {"rl": {"p4g": {"policy": str(ckpt)}},
                                                     "base": {"p4g": {"policy": "base", "model": "tiny-random"}}})
    app = make(cfg)
    svc = app.state.service
    rl = svc.agents[("rl", "p4g")]
    assert rl.binding.ref.adapter == "agent"  # the trained LoRA adapter, loaded from the checkpoint
    assert rl.binding.sampling.max_new_tokens == 12  # the training run's agent settings
    from scope.envs.p4g import AGENT_PROMPT

    c = TestClient(app)
    for pid in ("P1", "P2"):
        st, h = start(c, pid)
        say(c, st, h, "hello")
        sess = store.get_session(svc.engine, st["session"])
        env = svc.runtimes[sess.id].env
        assert env.views["agent"][0]["content"] == AGENT_PROMPT  # the system prompt of training
        turns = store.session_turns(svc.engine, sess.id)
        assert [t.role for t in turns] == ["agent", "user", "agent"]
    wrong = study_cfg(tmp_path / "w.db", {"r": {"env": "tau2_retail"}}, {"rl": {"r": {"policy": str(ckpt)}}})
    with pytest.raises(ConfigError, match="trained on 'p4g'"):
        make(wrong)


# ---- tau2: tools on a per-session database, transfer, grading, restart ---------------------------------------
def tau2_cfg(tmp_path, tau2_dir, script, cap=30):
    return study_cfg(tmp_path / "s.db", {"retail": {"env": "tau2_retail", "options": {"data_dir": tau2_dir},
                                                    "max_turns": cap}},
                     {"a": {"retail": {"scripted": script}}})


def test_tau2_tool_calls_run_on_the_session_database_and_the_grade_matches(tmp_path, tau2_dir):
    task = retail_task(tau2_dir, lambda t: 2 <= len(t["evaluation_criteria"]["actions"]) <= 6
                       and any(a["name"].startswith(("exchange", "return", "cancel", "modify"))
                               for a in t["evaluation_criteria"]["actions"]))
    cfg = tau2_cfg(tmp_path, tau2_dir, gold_script(task))
    cfg.tasks["retail"].task_ids = [f"tau2_retail/{task['id']}"]
    c = TestClient(make(cfg))
    st, h = start(c, "P1")
    assert st["kind"] == "tau2" and st["messages"] == [{"role": "agent", "text": "Hi! How can I help you today?"}]
    labels = [f["label"] for f in st["task"]["fields"]]
    assert "Why you are contacting support" in labels
    evs = say(c, st, h, "I need help with my order.")
    n_calls = len(task["evaluation_criteria"]["actions"])
    assert sum(e["type"] == "status" for e in evs) == n_calls  # tool calls are not shown, only a status line
    shown = [e["text"] for e in evs if e["type"] == "message"]
    assert len(shown) == 1 and shown[0].startswith("All done.")
    svc = c.app.state.service
    turns = store.session_turns(svc.engine, st["session"])
    tools = [t for t in turns if t.role == "tool"]
    assert len(tools) == n_calls and not any(t.visible for t in tools)
    assert all(json.loads(t.meta)["name"] == a["name"] for t, a in zip(tools, task["evaluation_criteria"]["actions"]))
    # another session's database is untouched by these writes
    other = svc.rebuild(store.get_session(svc.engine, st["session"]), [])
    assert other.db.hash() != svc.runtimes[st["session"]].env.db.hash()
    c.post(f"/api/session/{st['session']}/end", headers=h)
    from scope.study.analyze import collect

    row = collect(svc.engine)[0]
    assert row["reward"] == 1.0 and row["task_success"] == 1.0 and row["goal_abandoned"] == 0.0


def test_a_restart_in_the_middle_loses_nothing_and_rebuilds_the_tau2_state(tmp_path, tau2_dir):
    task = retail_task(tau2_dir, lambda t: 2 <= len(t["evaluation_criteria"]["actions"]) <= 6)
    acts = task["evaluation_criteria"]["actions"]
    info = " ".join(str(s) for s in task["evaluation_criteria"].get("communicate_info") or [])
    script = [tool_call(acts[0]["name"], acts[0].get("arguments", {})), "Got it, one moment please."] + \
        [tool_call(a["name"], a.get("arguments", {})) for a in acts[1:]] + [f"All done. {info}", "Bye ({last_user})"]
    cfg = tau2_cfg(tmp_path, tau2_dir, script)
    cfg.tasks["retail"].task_ids = [f"tau2_retail/{task['id']}"]
    c1 = TestClient(make(cfg))
    st, h = start(c1, "P1")
    say(c1, st, h, "Hello, my order please.")
    before = c1.app.state.service.runtimes[st["session"]].env
    hash_before = before.db.hash()
    # the server restarts: a new process would hold nothing but the database
    c2 = TestClient(make(cfg))
    svc2 = c2.app.state.service
    assert svc2.runtimes == {}
    state = c2.get(f"/api/session/{st['session']}", headers=h).json()
    assert [m["text"] for m in state["messages"]][-1] == "Got it, one moment please."
    rebuilt = svc2.runtimes[st["session"]].env
    assert rebuilt.db.hash() == hash_before and rebuilt.calls == before.calls
    evs = say(c2, st, h, "Thanks, go on.")
    assert any(e.get("text", "").startswith("All done.") for e in evs if e["type"] == "message")
    c2.post(f"/api/session/{st['session']}/end", headers=h)
    from scope.study.analyze import collect

    assert collect(svc2.engine)[0]["reward"] == 1.0


def test_a_reply_owed_when_the_server_died_is_made_on_resume(tmp_path):
    cfg, c = p4g_app(tmp_path)
    st, h = start(c, "P1")
    svc = c.app.state.service
    # the participant's message was stored, then the process died before the agent replied
    store.add_turns(svc.engine, st["session"], [{"role": "user", "content": "hi there"}], {"user_turns": 1})
    c2 = TestClient(make(cfg))
    again, _ = start(c2, "P1")
    assert [m["role"] for m in again["messages"]] == ["agent", "user", "agent"]
    assert again["messages"][-1]["text"].endswith("You said: hi there")


def test_live_environments_are_capped_and_dropped_when_a_session_ends(tmp_path):
    cfg = study_cfg(tmp_path / "s.db", {"p4g": P4G},
                    {"a": {"p4g": {"scripted": ["Would you give? You said: {last_user}"]}}})
    cfg.study.max_live_sessions = 2
    c = TestClient(make(cfg))
    svc = c.app.state.service
    people = [start(c, f"P{i}", session=f"X{i}") for i in range(4)]
    for i, (st, h) in enumerate(people):
        say(c, st, h, f"first {i}")
    assert len(svc.runtimes) == 2  # the two most recent; the others were evicted while idle
    assert list(svc.runtimes) == [people[2][0]["session"], people[3][0]["session"]]
    st, h = people[0]  # an evicted session goes on where it was: its environment is rebuilt from the turns
    evs = say(c, st, h, "second 0")
    assert [e["text"] for e in evs if e["type"] == "message"] == ["Would you give? You said: second 0"]
    env = svc.runtimes[st["session"]].env
    assert [m["content"] for m in env.views["partner"] if m["role"] == "user"][-2:] == \
        ["Would you give? You said: first 0", "Would you give? You said: second 0"]
    c.post(f"/api/session/{st['session']}/end", headers=h)
    assert st["session"] not in svc.runtimes and len(svc.runtimes) == 1  # an ended session holds nothing
    assert c.post(f"/api/session/{st['session']}/message", json={"text": "more"}, headers=h).status_code == 409


def test_transfer_to_a_human_ends_the_session(tmp_path, tau2_dir):
    script = [tool_call("transfer_to_human_agents", {"summary": "customer wants a human"}),
              "You are being transferred."]
    c = TestClient(make(tau2_cfg(tmp_path, tau2_dir, script)))
    st, h = start(c, "P1")
    evs = say(c, st, h, "I want a human.")
    assert {"type": "end", "reason": "transfer"} in evs
    state = c.get(f"/api/session/{st['session']}", headers=h).json()
    assert state["status"] == "ended" and state["end_reason"] == "transfer"
    from scope.study.analyze import collect

    row = collect(c.app.state.service.engine)[0]
    assert row["transferred"] == 1.0


def test_serve_refuses_a_bad_start_with_one_line(tmp_path, capsys, monkeypatch):
    from scope.cli import main

    assert main(["study", "serve", "--config", str(tmp_path / "none.yaml")]) == 2
    assert "study config" in capsys.readouterr().err
    cfg = tmp_path / "s.yaml"
    cfg.write_text("tasks: {p4g: {env: p4g}}\nconditions: {a: {p4g: {scripted: [hi]}}}\n")
    monkeypatch.delenv("SCOPE_STUDY_SECRET", raising=False)
    assert main(["study", "serve", "--config", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert "set SCOPE_STUDY_SECRET" in err and "Traceback" not in err
    cfg.write_text("tasks: {p4g: {env: p4g, split: nope}}\nconditions: {a: {p4g: {scripted: [hi]}}}\n")
    monkeypatch.setenv("SCOPE_STUDY_SECRET", "x" * 20)
    assert main(["study", "serve", "--config", str(cfg)]) == 2
    assert "task type p4g: split must be train, test or all" in capsys.readouterr().err
    assert not (tmp_path / "study.db").exists()  # checked before the database is made


def test_p4g_role_play_card_comes_from_a_real_persuadee(tmp_path):
    import csv

    p4g_dir = shared_path("data", "p4g")
    cfg = study_cfg(tmp_path / "s.db", {"p4g": {"env": "p4g", "options": {"personas": "real", "data_dir": p4g_dir}}},
                    {"a": {"p4g": {"scripted": ["Hello!"]}}})
    c = TestClient(make(cfg))
    st, h = start(c, "P1")
    card = st["task"]["card"]
    assert st["task"]["kind"] == "p4g" and any(line.startswith("Personality:") for line in card)
    sess = store.get_session(c.app.state.service.engine, st["session"])
    with open(os.path.join(p4g_dir, "full_info.csv"), newline="") as f:
        persuadees = {r["B3"] for r in csv.DictReader(f) if r["B4"].strip() == "1"}
    assert sess.task_id.removeprefix("p4g/").split("#")[0] in persuadees
    assert st["turn_cap"] == 10  # P4G's default cap


@pytest.mark.parametrize("kind", ["local", "endpoint"])
def test_the_agents_words_stream_while_they_are_generated_and_the_turn_is_stored_whole(tmp_path, kind):
    """A local model streams token by token, an endpoint (scope serve with stream: true) piece by piece: every
    delta reaches the page before the agent's turn is stored, and the stored turn is the whole reply."""
    from scope.models.loading import load_tokenizer, tiny_backend
    from scope.models.server import serve_in_thread

    srv = None
    if kind == "local":
        agent = {"policy": "base", "model": "tiny-random", "max_new_tokens": 24, "temperature": 1.0}
    else:
        srv, url = serve_in_thread(tiny_backend(load_tokenizer("tiny-random"), seed=2))
        agent = {"endpoint": {"backend": "openai", "base_url": url, "model_name": "tiny", "api_key_env": None},
                 "max_new_tokens": 24, "temperature": 1.0}
    try:
        cfg = study_cfg(tmp_path / "s.db", {"p4g": {**P4G, "max_turns": 3}}, {"a": {"p4g": agent}})
        c = TestClient(make(cfg))
        svc = c.app.state.service
        st, h = start(c, "P1")
        sess = store.get_session(svc.engine, st["session"])
        agent_turns = lambda: sum(t.role == "agent" for t in store.session_turns(svc.engine, sess.id))  # noqa: E731
        before = agent_turns()
        seen = []

        def emit(ev):
            seen.append((ev, agent_turns()))  # how many agent turns were stored when this event came

        events = svc.message(sess, "Hello, who are you?", emit=emit)
        deltas = [(e, n) for e, n in seen if e["type"] == "delta"]
        msg = next(e for e in events if e["type"] == "message")
        assert len(deltas) > 1, seen  # piece by piece, not one chunk
        assert all(n == before for _, n in deltas)  # every piece shown before the turn was stored
        assert "".join(e["text"] for e, _ in deltas) == msg["text"]
        stored = [t for t in store.session_turns(svc.engine, sess.id) if t.role == "agent"][-1]
        assert stored.content.strip() == msg["text"] and agent_turns() == before + 1
        assert [e for e, _ in seen if e["type"] != "delta"] == events  # the rest as the call returns it, in order
    finally:
        if srv is not None:
            srv.shutdown()


def test_live_text_never_shows_a_tool_call_or_an_end_marker():
    from scope.study.service import TAU2_STOP, _LiveText

    shown = []
    live = _LiveText(lambda ev: shown.append(ev["text"]), hide=(TAU2_STOP, "<tool_call"))
    text = 'Let me look that up. <tool_call>{"name": "find_user_id_by_email"}</tool_call>'
    for i in range(1, len(text) + 1):
        live(text[:i])
    assert "".join(shown) == "Let me look that up. "
    shown.clear()
    live = _LiveText(lambda ev: shown.append(ev["text"]), hide=(TAU2_STOP, "<tool_call"))
    text = "Done, goodbye! " + TAU2_STOP
    for i in range(1, len(text) + 1):
        live(text[:i])
    assert "".join(shown) == "Done, goodbye! "
    shown.clear()
    live = _LiveText(lambda ev: shown.append(ev["text"]), hide=(TAU2_STOP, "<tool_call"))
    for t in ("a <", "a <b", "a <b> done"):  # a tail that might have begun a marker waits, then shows
        live(t)
    assert "".join(shown) == "a <b> done"


def test_king_of_the_hill_replays_are_shown_and_rated(tmp_path):
    """A koth task type has no chat: the condition's team (a fixed one, or an LLM controller: here scripted
    skill picks) plays one game at the session's start; the state carries its replay; the survey rates the
    blue team; the analysis reads the result and the believability."""
    from scope.study.analyze import collect

    koth = {"env": "koth", "split": "test", "options": {"opponent": "bt", "skills": "scripted"}}
    cfg = study_cfg(tmp_path / "s.db", {"game": koth},
                    {"tree": {"game": {"team": "bt"}},
                     "llm": {"game": {"scripted": ["1: capture\n2: defend", "nonsense", "1: intercept\n2: capture"]}}})
    c = TestClient(make(cfg))
    seen = {}
    for pid in ("P1", "P2"):
        st, h = start(c, pid, session=pid)
        assert st["kind"] == "koth" and st["status"] == "ended" and st["messages"] == []  # the game is played
        frames = st["replay"]["frames"]
        assert len(frames) == 101 and frames[0]["tick"] == 0 and frames[-1]["tick"] == 100
        assert frames[-1]["score"] == st["replay"]["score"] and len(frames[0]["pos"]) == 4
        assert c.post(f"/api/session/{st['session']}/message", json={"text": "hi"}, headers=h).status_code == 409
        answers = {"humanlike": 5, "skilled": 4, "coordinated": 6, "mechanical": 2}
        assert c.post(f"/api/session/{st['session']}/survey", json={"answers": {"humanlike": 5}},
                      headers=h).status_code == 400
        assert c.post(f"/api/session/{st['session']}/survey", json={"answers": answers}, headers=h).status_code == 200
        seen[pid] = st
    rows = collect(c.app.state.service.engine)
    assert sorted(r["condition"] for r in rows) == ["llm", "tree"]
    for r in rows:
        assert r["kind"] == "koth" and r["believability"] == pytest.approx((5 + 4 + 6 + 6) / 4)
        assert r["result"] in (0.0, 0.5, 1.0) and 0.0 <= r["score_share"] <= 1.0
    with pytest.raises(ConfigError, match="team is for King of the Hill"):
        study_cfg(tmp_path / "t.db", {"p4g": P4G}, {"a": {"p4g": {"team": "bt"}}})


# ---- hostile input -------------------------------------------------------------------------------------
def test_an_id_with_trailing_whitespace_is_refused_not_a_second_session(tmp_path):
    cfg, c = p4g_app(tmp_path)
    start(c, "P1")
    for pid in ("P1\n", "P1 ", "\tP1", "P1\r\n"):
        r = c.post("/api/start", json={"participant_id": pid, "study_id": "S1", "session_id": "X1"})
        assert r.status_code == 400, pid
    assert store.find_session(c.app.state.service.engine, "S1", "P1\n") is None


def test_a_lone_surrogate_is_a_400_before_anything_is_stored(tmp_path):
    cfg, c = p4g_app(tmp_path)
    st, h = start(c, "P1")
    before = len(store.session_turns(c.app.state.service.engine, st["session"]))
    body = b'{"text": "hello \\ud800 there"}'  # JSON can carry an unpaired surrogate; UTF-8 cannot
    r = c.post(f"/api/session/{st['session']}/message", content=body,
               headers={**h, "content-type": "application/json"})
    assert r.status_code == 400 and "surrogate" in r.json()["error"]
    assert len(store.session_turns(c.app.state.service.engine, st["session"])) == before
    say(c, st, h, "/stop")
    good = {"persuasive": 4, "respectful": 4, "engaging": 4, "natural": 4, "manipulated": 4, "donation": 1}
    r = c.post(f"/api/session/{st['session']}/survey", content=json.dumps({"answers": good}).encode()[:-1]
               + b', "free_text": "\\udfff"}', headers={**h, "content-type": "application/json"})
    assert r.status_code == 400


@pytest.mark.parametrize("table", ["turns", "surveys", "sessions"])
def test_exports_neutralise_spreadsheet_formulas(tmp_path, table):
    """Text that a spreadsheet would run as a formula gets a leading ' in every export (OWASP); numbers stay."""
    import csv
    import io

    cfg, c = p4g_app(tmp_path)
    st, h = start(c, "P1")
    say(c, st, h, "=HYPERLINK(\"http://x\",\"y\")")
    say(c, st, h, "/stop")
    good = {"persuasive": 4, "respectful": 4, "engaging": 4, "natural": 4, "manipulated": 4, "donation": 1}
    assert c.post(f"/api/session/{st['session']}/survey", json={"answers": good, "free_text": "@SUM(A1:A9)"},
                  headers=h).status_code == 200
    text = store.csv_text(c.app.state.service.engine, table)
    cells = [x for row in csv.reader(io.StringIO(text)) for x in row]
    assert not any(x.startswith(store.FORMULA_START) for x in cells), [x for x in cells if x[:1] in "=+-@"]
    if table == "turns":
        assert "'=HYPERLINK(\"http://x\",\"y\")" in cells
    if table == "surveys":
        assert "'@SUM(A1:A9)" in cells
    assert store.safe_cell(-0.5) == -0.5 and store.safe_cell("-x") == "'-x" and store.safe_cell("ok") == "ok"
