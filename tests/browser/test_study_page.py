"""The participant page end to end in headless Chromium (Playwright driving Debian's chromium):
a tau2 session (tool calls on the session's database, graded afterwards) and a P4G session (a tiny
local model as the agent), each to its completion code. Runs in `make test-browser`."""
import hashlib
import hmac
import os
import shutil

import pytest

from conftest import shared_path
from scope.models.server import Server
from scope.study import store
from tests.study.helpers import SECRET, gold_script, make, study_cfg

CHROMIUM = os.environ.get("SCOPE_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture()
def browser():
    if not CHROMIUM:
        pytest.fail("no chromium: install Debian's chromium package (make test-browser does) or set SCOPE_CHROMIUM")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        yield b
        b.close()


def test_a_tau2_and_a_p4g_session_in_the_browser(tmp_path, browser):
    import json

    tau2 = shared_path("data", "tau2")
    with open(os.path.join(tau2, "domains", "retail", "tasks.json")) as f:
        tasks = json.load(f)
    with open(os.path.join(tau2, "domains", "retail", "split_tasks.json")) as f:
        test_ids = set(json.load(f)["test"])
    task = next(t for t in tasks if str(t["id"]) in test_ids and 2 <= len(t["evaluation_criteria"]["actions"]) <= 5)
    cfg = study_cfg(tmp_path / "b.db",
                    {"retail": {"env": "tau2_retail", "options": {"data_dir": tau2},
                                "task_ids": [f"tau2_retail/{task['id']}"]},
                     "p4g": {"env": "p4g", "split": "test", "options": {"personas": "builtin"}, "max_turns": 2}},
                    {"only": {"retail": {"scripted": gold_script(task)},
                              "p4g": {"policy": "base", "model": "tiny-random", "max_new_tokens": 24,
                                      "temperature": 1.0}}}, id="BROWSER")
    app = make(cfg)
    srv = Server(app, "127.0.0.1", 0).start()
    base = f"http://127.0.0.1:{srv.server_address[1]}"
    eng = app.state.service.engine
    try:
        kinds = set()
        for i in range(2):  # two participants fill the two cells (retail and p4g), one each
            page = browser.new_page()
            url = f"{base}/?PROLIFIC_PID=PW{i}&STUDY_ID=BROWSER&SESSION_ID=SES{i}"
            page.goto(url)
            page.wait_for_selector("#task h2")
            kind = "tau2" if "customer support" in page.inner_text("#task h2") else "p4g"
            kinds.add(kind)
            page.fill("#input", "Hello, I need help." if kind == "tau2" else "Hi, who are you?")
            page.click("#send")
            page.locator(".msg.agent").nth(1).wait_for()  # the agent's answer (after the greeting / opening)
            page.wait_for_selector("#send:enabled")
            if kind == "tau2":
                page.wait_for_selector("text=All done.")
                assert page.locator(".msg.status").count() == len(task["evaluation_criteria"]["actions"])
                # a reload resumes the same session with its messages
                page.reload()
                page.wait_for_selector("text=All done.")
                assert page.locator(".msg.user").count() == 1
                page.fill("#input", "/stop")  # /stop asks for confirmation too
                page.click("#send")
                page.wait_for_selector("#confirm[open]")
                page.click("#confirm-no")
                assert page.is_visible("#chat")
                page.click("#end")
                page.click("#confirm-yes")
            else:
                page.fill("#input", "I am not sure.")
                page.click("#send")  # the second message: the turn cap ends the chat
            page.wait_for_selector("#survey:not(.hidden)")
            if kind == "p4g":
                page.fill("#q-donation", "0.75")
            for fs in page.locator("#survey fieldset").all():
                fs.locator("input[type=radio]").nth(4).check()
            page.fill("#q-text", "It was fine.")
            page.click("#submit-survey")
            page.wait_for_selector("#done:not(.hidden)")
            code = page.inner_text("#code")
            sid = store.find_session(eng, "BROWSER", f"PW{i}").id
            assert code == hmac.new(SECRET, f"complete:{sid}".encode(), hashlib.sha256).hexdigest()[:12].upper()
            assert code in page.get_attribute("#redirect", "href")
            page.goto(url)  # a second visit after the end shows the code again
            page.wait_for_selector("#done:not(.hidden)")
            assert page.inner_text("#code") == code
            page.close()
        assert kinds == {"tau2", "p4g"}
    finally:
        srv.shutdown()
    from scope.study.analyze import collect

    rows = {r["kind"]: r for r in collect(eng)}
    assert rows["tau2"]["reward"] == 1.0 and rows["tau2"]["satisfaction"] == pytest.approx((5 * 7 + 3) / 8)
    assert rows["p4g"]["donation"] == 0.75 and rows["p4g"]["end_reason"] == "turn_cap"
    assert rows["p4g"]["agent_turns"] == 2


def test_a_king_of_the_hill_replay_is_watched_and_rated_in_the_browser(tmp_path, browser):
    cfg = study_cfg(tmp_path / "k.db", {"game": {"env": "koth", "options": {"opponent": "bt", "skills": "scripted"}}},
                    {"tree": {"game": {"team": "bt"}}}, id="KOTH")
    app = make(cfg)
    srv = Server(app, "127.0.0.1", 0).start()
    base = f"http://127.0.0.1:{srv.server_address[1]}"
    try:
        page = browser.new_page()
        page.goto(f"{base}/?PROLIFIC_PID=K1&STUDY_ID=KOTH&SESSION_ID=S1")
        page.wait_for_selector("#replay:not(.hidden)")
        assert page.is_visible("#board") and not page.is_visible("#composer")
        assert page.is_disabled("#replay-done")  # the questions come after the game has been shown
        page.wait_for_selector("#replay-done:enabled", timeout=30_000)
        assert page.inner_text("#replay-status") in ("Blue won.", "Red won.", "A draw.")
        page.click("#replay-done")
        page.wait_for_selector("#survey:not(.hidden)")
        assert "blue team" in page.inner_text("#survey h2")
        for fs in page.locator("#survey fieldset").all():
            fs.locator("input[type=radio]").nth(5).check()
        page.click("#submit-survey")
        page.wait_for_selector("#done:not(.hidden)")
        page.close()
    finally:
        srv.shutdown()
    from scope.study.analyze import collect

    (row,) = collect(app.state.service.engine)
    assert row["kind"] == "koth" and row["humanlike"] == 6 and row["believability"] == pytest.approx((6 * 3 + 2) / 4)
