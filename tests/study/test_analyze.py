"""The study's statistics against values known by hand, and `scope study analyze` end to end."""
import json
import math
import os

import numpy as np
import pytest
from fastapi.testclient import TestClient

from scope.study import store
from scope.stats import bootstrap_ci, fisher, holm, welch
from tests.study.helpers import make, say, start, study_cfg

P4G = {"env": "p4g", "split": "test", "options": {"personas": "builtin"}, "max_turns": 2}


def t_two_sided_p(t, df, n=200_000):
    """P(|T| > |t|) for Student's t with df degrees of freedom, by Simpson's rule on its density."""
    c = math.gamma((df + 1) / 2) / (math.sqrt(df * math.pi) * math.gamma(df / 2))
    x = np.linspace(0, abs(t), n + 1)
    f = c * (1 + x ** 2 / df) ** (-(df + 1) / 2)
    h = abs(t) / n
    inner = h / 3 * (f[0] + f[-1] + 4 * f[1:-1:2].sum() + 2 * f[2:-1:2].sum())
    return 1 - 2 * inner


def test_welch_matches_its_definition():
    a, b = [1, 2, 3, 4, 5], [2, 4, 6, 8, 10]
    r = welch(a, b)
    # means 3 and 6, variances 2.5 and 10: se^2 = 0.5 + 2; df = 2.5^2 / (0.5^2/4 + 2^2/4)
    assert r["t"] == pytest.approx(-3 / math.sqrt(2.5), abs=1e-12)
    assert r["df"] == pytest.approx(6.25 / (0.0625 + 1.0), abs=1e-12)
    assert r["p"] == pytest.approx(t_two_sided_p(r["t"], r["df"]), abs=1e-6)
    assert welch([1, 1], [1, 1])["p"] == 1.0 and math.isnan(welch([1], [2, 3])["p"])


def test_fisher_exact_on_the_tea_tasting_table():
    # 3 of 4 right in each direction: two-sided p = (1 + 16 + 16 + 1) / 70
    r = fisher([1, 1, 1, 0], [1, 0, 0, 0])
    assert r["p"] == pytest.approx(34 / 70, abs=1e-12) and r["odds_ratio"] == pytest.approx(9.0)
    assert fisher([1] * 10, [0] * 10)["p"] == pytest.approx(2 / math.comb(20, 10), rel=1e-9)


def test_holm_bonferroni():
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])
    out = holm([0.02, float("nan"), 0.01])
    assert out[0] == pytest.approx(0.02) and math.isnan(out[1]) and out[2] == pytest.approx(0.02)


def test_bootstrap_ci():
    assert bootstrap_ci([2.0] * 10) == (2.0, 2.0)
    lo, hi = bootstrap_ci([0, 1] * 50, resamples=10_000, seed=1)
    assert lo == pytest.approx(0.5 - 1.96 * 0.05, abs=0.02) and hi == pytest.approx(0.5 + 1.96 * 0.05, abs=0.02)
    assert bootstrap_ci([1, 2, 3], seed=3) == bootstrap_ci([1, 2, 3], seed=3)  # seeded


def test_analyze_end_to_end(tmp_path):
    cfg = study_cfg(tmp_path / "s.db", {"p4g": P4G},
                    {"base": {"p4g": {"scripted": ["Hello! Would you donate to Save the Children?"]}},
                     "rl": {"p4g": {"scripted": ["Hi there, how are you?"]}}})
    c = TestClient(make(cfg))
    donations = {"base": [], "rl": []}
    for i in range(12):
        st, h = start(c, f"P{i}")
        say(c, st, h, "hi")
        say(c, st, h, "ok")  # the turn cap (2)
        cond = store.get_session(c.app.state.service.engine, st["session"]).condition
        d = (0.25 * (i % 3)) + (1.0 if cond == "rl" else 0.0)
        donations[cond].append(d)
        ans = {"persuasive": 4 + (cond == "rl"), "respectful": 5, "engaging": 4, "natural": 4, "manipulated": 2,
               "donation": d}
        assert c.post(f"/api/session/{st['session']}/survey", json={"answers": ans}, headers=h).status_code == 200
    st, h = start(c, "unfinished")  # an active session is not analysed
    from scope.cli import main

    out = tmp_path / "report"
    assert main(["study", "analyze", cfg.database_url(), "--out", str(out), "--resamples", "2000"]) == 0
    res = json.load(open(out / "analysis.json"))
    r = res["task_types"]["p4g"]
    assert r["n_sessions"] == 12
    for cond in ("base", "rl"):
        s = r["summary"][cond]["donation"]
        assert s["n"] == 6 and s["mean"] == pytest.approx(np.mean(donations[cond]))
        assert s["ci"][0] <= s["mean"] <= s["ci"][1]
    assert r["summary"]["base"]["donation_asks"]["mean"] == 2.0  # both agent messages ask
    assert r["summary"]["rl"]["donation_asks"]["mean"] == 0.0
    assert r["summary"]["base"]["agent_turns"]["mean"] == 2.0
    # experience: (persuasive + 5 + 4 + 4 + (8 - 2)) / 5
    assert r["summary"]["rl"]["experience"]["mean"] == pytest.approx((5 + 5 + 4 + 4 + 6) / 5)
    t = next(t for t in r["tests"] if t["outcome"] == "donation")
    assert (t["a"], t["b"]) == ("rl", "base") and t["test"] == "welch"
    assert t["p"] == pytest.approx(welch(donations["rl"], donations["base"])["p"])
    pre = [x for x in r["tests"] if x["preregistered"]]
    assert {x["outcome"] for x in pre} == {"donation", "experience"}
    assert t["p_holm"] == pytest.approx(holm([x["p"] for x in pre])[pre.index(t)])
    for f in ("report.md", "p4g.png", "sessions.csv", "turns.csv", "surveys.csv", "outcomes.csv"):
        assert os.path.getsize(out / f) > 0
    md = open(out / "report.md").read()
    assert "| donation * |" in md and "rl vs base" in md
    assert main(["study", "analyze", str(tmp_path / "missing.db"), "--out", str(out)]) == 2
