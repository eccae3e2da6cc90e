"""Building study apps for tests: scripted agents, a temporary SQLite database."""
import json
import os

from scope.study.config import parse_study
from scope.study.serve import build

SECRET = b"test-secret-0123456789"
ADMIN = "admin-token-xyz"


def tool_call(name, arguments):
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


def gold_script(task):
    """A scripted tau2 agent that makes the task's gold calls, then says every required string."""
    crit = task["evaluation_criteria"]
    calls = [tool_call(a["name"], a.get("arguments", {})) for a in crit.get("actions") or []]
    info = " ".join(str(s) for s in crit.get("communicate_info") or [])
    return calls + [f"All done. {info}".strip(), "Anything else? ({last_user})"]


def study_cfg(db, tasks, conditions, **study):
    """A study on the SQLite file ``db``; with SCOPE_STUDY_TEST_DB set (e.g. a PostgreSQL URL), on that
    database instead, emptied first."""
    url = os.environ.get("SCOPE_STUDY_TEST_DB")
    if url:
        from sqlmodel import SQLModel, create_engine

        from scope.study import store  # noqa: F401  (the tables)

        eng = create_engine(url)
        SQLModel.metadata.drop_all(eng)
        eng.dispose()
    return parse_study({"study": {"id": "S1", "database": url or f"sqlite:///{db}", **study}, "tasks": tasks,
                        "conditions": conditions})


def make(cfg):
    return build(cfg, SECRET, ADMIN)


def start(client, pid, study="S1", session="X1"):
    r = client.post("/api/start", json={"participant_id": pid, "study_id": study, "session_id": session})
    assert r.status_code == 200, r.text
    st = r.json()
    return st, {"X-Session-Token": st["token"]}


def events(resp):
    return [json.loads(line[6:]) for line in resp.text.split("\n\n") if line.startswith("data: ")]


def say(client, st, h, text):
    r = client.post(f"/api/session/{st['session']}/message", json={"text": text}, headers=h)
    assert r.status_code == 200, r.text
    return events(r)
