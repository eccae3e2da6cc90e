"""One participant cannot starve the others: a second message while the first is answered is refused whole (409),
a bound across sessions answers 429, and another participant's message is answered in its normal time."""
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

from scope.models.server import Server
from scope.study import store
from tests.study.helpers import make, study_cfg

P4G = {"env": "p4g", "split": "test", "options": {"personas": "builtin"}, "max_turns": 50}


def slow_app(tmp_path, seconds=0.6, **study):
    cfg = study_cfg(tmp_path / "flood.db", {"p4g": P4G}, {"a": {"p4g": {"scripted": ["You said: {last_user}"]}}},
                    id="FLOOD", **study)
    app = make(cfg)
    service = app.state.service
    answer = service._answer

    def slow(*a, **kw):  # a model that takes its time
        time.sleep(seconds)
        return answer(*a, **kw)

    service._answer = slow
    return app, service


def begin(c, pid):
    st = c.post("/api/start", json={"participant_id": pid, "study_id": "FLOOD", "session_id": pid}).json()
    return st, {"X-Session-Token": st["token"]}


def user_turns(service, sid):
    return [t.content for t in store.session_turns(service.engine, sid) if t.role == "user"]


def test_a_flooding_participant_is_refused_and_the_others_are_answered_in_time(tmp_path):
    app, service = slow_app(tmp_path)
    srv = Server(app, "127.0.0.1", 0).start()
    base = f"http://127.0.0.1:{srv.server_address[1]}"
    try:
        with httpx.Client(base_url=base, timeout=60) as c:
            (sa, ha), (sb, hb) = begin(c, "A"), begin(c, "B")
            barrier = threading.Barrier(30)

            def send(k):
                with httpx.Client(base_url=base, timeout=60) as ci:
                    barrier.wait()
                    return ci.post(f"/api/session/{sa['session']}/message", json={"text": f"flood {k}"}, headers=ha)

            with ThreadPoolExecutor(30) as ex:
                flood = [ex.submit(send, k) for k in range(30)]
                time.sleep(0.2)
                t0 = time.monotonic()
                r = c.post(f"/api/session/{sb['session']}/message", json={"text": "hello"}, headers=hb)
                other = time.monotonic() - t0
                codes = sorted(f.result().status_code for f in flood)
        assert r.status_code == 200 and "You said: hello" in r.text
        assert other < 5.0, other  # one answer's time (0.6 s here), not thirty
        assert codes.count(200) >= 1 and set(codes) <= {200, 409} and codes.count(409) >= 20, codes
        refused = [f.result() for f in flood if f.result().status_code == 409]
        assert "still being answered" in refused[0].json()["error"]
        # nothing of a refused message was stored: the user turns are exactly the answered ones
        assert len(user_turns(service, sa["session"])) == codes.count(200)
    finally:
        srv.shutdown()


def test_past_the_bound_across_sessions_a_message_gets_busy(tmp_path):
    app, service = slow_app(tmp_path, seconds=1.5, max_in_flight=1)
    srv = Server(app, "127.0.0.1", 0).start()
    base = f"http://127.0.0.1:{srv.server_address[1]}"
    try:
        with httpx.Client(base_url=base, timeout=60) as c:
            (sa, ha), (sb, hb) = begin(c, "A"), begin(c, "B")
            with ThreadPoolExecutor(1) as ex:
                first = ex.submit(c.post, f"/api/session/{sa['session']}/message", json={"text": "one"}, headers=ha)
                time.sleep(0.5)
                busy = c.post(f"/api/session/{sb['session']}/message", json={"text": "two"}, headers=hb)
                assert first.result().status_code == 200
            assert busy.status_code == 429 and "try again" in busy.json()["error"]
            assert user_turns(service, sb["session"]) == []
            again = c.post(f"/api/session/{sb['session']}/message", json={"text": "two"}, headers=hb)
            assert again.status_code == 200 and user_turns(service, sb["session"]) == ["two"]
    finally:
        srv.shutdown()
