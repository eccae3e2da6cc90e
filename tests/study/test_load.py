"""100 simulated participants at once against a real server: nothing lost, nothing crossed, balance kept."""
import json
import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from scope.models.server import Server
from scope.study import store
from tests.study.helpers import make, study_cfg

P4G = {"env": "p4g", "split": "test", "options": {"personas": "builtin"}, "max_turns": 5}
N, MESSAGES = 100, 3


def participant(base, i, barrier):
    pid = f"P{i:03d}"
    with httpx.Client(base_url=base, timeout=120) as c:
        barrier.wait()  # everyone arrives at once
        st = c.post("/api/start", json={"participant_id": pid, "study_id": "LOAD", "session_id": f"S{i}"}).json()
        h = {"X-Session-Token": st["token"]}
        replies = []
        for k in range(MESSAGES):
            r = c.post(f"/api/session/{st['session']}/message", json={"text": f"{pid} says {k}"}, headers=h)
            r.raise_for_status()
            evs = [json.loads(x[6:]) for x in r.text.split("\n\n") if x.startswith("data: ")]
            replies += [e["text"] for e in evs if e["type"] == "message"]
        c.post(f"/api/session/{st['session']}/end", headers=h).raise_for_status()
        ans = {"persuasive": 4, "respectful": 4, "engaging": 4, "natural": 4, "manipulated": 4, "donation": 1.0}
        code = c.post(f"/api/session/{st['session']}/survey", json={"answers": ans}, headers=h).json()["code"]
        final = c.get(f"/api/session/{st['session']}", headers=h).json()
    return pid, st["session"], replies, code, final


def test_100_concurrent_participants(tmp_path):
    conds = ("a", "b", "c", "d")
    cfg = study_cfg(tmp_path / "load.db", {"p4g": P4G},
                    {c: {"p4g": {"scripted": ["You said: {last_user}"]}} for c in conds}, id="LOAD")
    app = make(cfg)
    srv = Server(app, "127.0.0.1", 0).start()
    base = f"http://127.0.0.1:{srv.server_address[1]}"
    barrier = threading.Barrier(N)
    try:
        with ThreadPoolExecutor(N) as ex:
            results = list(ex.map(lambda i: participant(base, i, barrier), range(N)))
    finally:
        srv.shutdown()
    eng = app.state.service.engine
    sessions, turns, surveys = store.all_rows(eng)
    assert len(sessions) == N and len(surveys) == N and len({s.id for s in sessions}) == N
    by_sess = {}
    for t in turns:
        by_sess.setdefault(t.session_id, []).append(t)
    for pid, sid, replies, code, final in results:
        mine = [f"{pid} says {k}" for k in range(MESSAGES)]
        # every reply echoes this participant's own words, and only theirs
        assert replies == [f"You said: {m}" for m in mine]
        ts = by_sess[sid]
        assert [t.idx for t in ts] == list(range(len(ts)))  # no gap, no duplicate
        assert [t.content for t in ts if t.role == "user"] == mine  # no message lost
        assert all(pid in t.content for t in ts if t.role == "agent" and t.idx > 0)
        assert [m["text"] for m in final["messages"] if m["role"] == "user"] == mine
        assert final["status"] == "surveyed" and final["completion"]["code"] == code
    counts = store.cell_counts(eng)
    assert sum(counts.values()) == N and max(counts.values()) - min(counts.values()) <= 1  # 25 each, within ±1
    assert sorted(counts.values()) == [25, 25, 25, 25]


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        return next(int(ln.split()[1]) for ln in f if ln.startswith("VmRSS")) / 1024


@pytest.mark.long
def test_1000_sequential_sessions_keep_memory_flat(tmp_path):
    """Participants one after another for a long time: each session's environment is dropped when it ends
    (and beyond study.max_live_sessions when idle), so the server's resident memory does not grow with the
    number of participants it has served."""
    import gc

    from fastapi.testclient import TestClient

    cfg = study_cfg(tmp_path / "long.db", {"p4g": P4G}, {"a": {"p4g": {"scripted": ["You said: {last_user}"]}}},
                    id="LOAD")
    c = TestClient(make(cfg))
    svc = c.app.state.service
    rss = {}
    for i in range(1000):
        st = c.post("/api/start",
                    json={"participant_id": f"Q{i:04d}", "study_id": "LOAD", "session_id": f"S{i}"}).json()
        h = {"X-Session-Token": st["token"]}
        assert c.post(f"/api/session/{st['session']}/message", json={"text": f"hello {i}"},
                      headers=h).status_code == 200
        if i % 3:  # two in three end their chat; the rest leave it open (idle, evicted beyond the cap)
            c.post(f"/api/session/{st['session']}/end", headers=h).raise_for_status()
        if i + 1 in (200, 1000):
            gc.collect()
            rss[i + 1] = _rss_mb()
    assert len(svc.runtimes) <= cfg.study.max_live_sessions
    assert rss[1000] - rss[200] < 25, rss  # MB, over 800 more participants
