"""Persuasion for Good: donation parsing, reward, personas and the split."""
import random

import pytest

from scope.data.p4g import FIELDS, load_builtin_personas, load_csv_personas, persona_text, split_personas
from scope.envs.p4g import PersuasionForGood, parse_donation
from scope.types import Task

from conftest import shared_path


@pytest.mark.parametrize("text,amount", [
    ("Sure! [DONATE $2]", 2.0),
    ("ok [DONATE $0.50]", 0.5),
    ("[donate $1]", 1.0),
    ("I'll give [DONATE $5] since I'm generous", 2.0),      # clipped to 2
    ("[DONATE $-3]", 0.0),                                   # clipped to 0
    ("[DONATE $1 to Save the Children]", None),              # not an intact marker
    ("I won't give $2.", None),
    ("I'll give two dollars. [DONATE two]", None),          # amounts in words never count
    ("sure, why not [DONATE $1]", 1.0),                      # an intact marker counts, whatever the words
    ("I won't [DONATE $2]", 2.0),
    ("[DONATE $2]... no wait, [DONATE $0.50]", 0.5),         # the last marker is the decision
    ("I will not [DONATE $1]. Actually, yes: [DONATE $0.25]", 0.25),
    ("[ DONATE: 1.5 ]", 1.5),
    ("no marker here, $2 maybe", None),
    ("[DONATE $]", None),
    ("[DONATE $" + "9" * 40 + "]", 2.0),                     # tens of digits: clipped like any large amount
    ("[DONATE $" + "7" * 400 + ".5]", 2.0),                  # beyond a float's range too
    ("[DONATE $0." + "0" * 30 + "1]", pytest.approx(1e-31)),
])
def test_parse_donation(text, amount):
    assert parse_donation(text) == amount


def test_parse_donation_is_linear_in_the_reply_length():
    import time

    for text in ("[DONATE $" * 20000, "[" * 40000 + "DONATE $1]", "[DONATE " + " " * 40000 + "$1]",
                 "[DONATE $1] " * 5000, "[DONATE" + " " * 40000 + "x", "[DONATE :" + " " * 40000 + "$x",
                 "[DONATE " * 5000 + " " * 20000 + "?"):  # blank runs that end in no amount
        t0 = time.perf_counter()
        parse_donation(text)
        assert time.perf_counter() - t0 < 0.5, text[:20]  # a quadratic scan takes seconds here


def make_env(**kw):
    p = load_builtin_personas()[0]
    return PersuasionForGood(Task(id="p4g/x", split="train", data=p), random.Random(0), **kw)


def test_episode_ends_at_first_marker_and_reward_is_half_the_gift():
    env = make_env()
    env.on_reply("agent", "Please donate.")
    env.on_reply("partner", "Let me think.")
    assert not env.done and env.next_role() == "agent"
    env.on_reply("agent", "It helps kids.")
    env.on_reply("partner", "Fine, [DONATE $1.2]")
    assert env.done and env.end_reason == "done"
    assert env.rewards()["agent"] == pytest.approx(0.6)


def test_continue_after_zero_plays_on_past_a_zero_marker():
    """As the paper's release: a $0 marker does not end the dialogue; a later marker replaces it."""
    env = make_env()
    env.on_reply("agent", "Please donate.")
    env.on_reply("partner", "No. [DONATE $0]")
    assert env.done and env.rewards()["agent"] == 0.0  # the default ends at the first marker
    env = make_env(max_turns=3, continue_after_zero=True)
    env.on_reply("agent", "Please donate.")
    env.on_reply("partner", "No. [DONATE $0]")
    assert not env.done and env.next_role() == "agent"
    env.on_reply("agent", "A dollar feeds a child for a day.")
    env.on_reply("partner", "Alright. [DONATE $1]")
    assert env.done and env.end_reason == "done" and env.rewards()["agent"] == pytest.approx(0.5)
    env = make_env(max_turns=2, continue_after_zero=True)
    for _ in range(2):
        env.on_reply("agent", "Please donate.")
        env.on_reply("partner", "No. [DONATE $0]")
    assert env.done and env.meta["donation"] == 0.0 and env.rewards()["agent"] == 0.0


def test_turn_limit_and_no_marker_gives_zero():
    env = make_env(max_turns=2)
    for _ in range(2):
        env.on_reply("agent", "Please donate.")
        env.on_reply("partner", "I won't give you anything.")
    assert env.done and env.end_reason == "max_turns" and env.rewards()["agent"] == 0.0


def test_agent_markers_do_not_count():
    env = make_env(max_turns=1)
    env.on_reply("agent", "[DONATE $2]")
    env.on_reply("partner", "Hmm.")
    assert env.rewards()["agent"] == 0.0


def test_force_decision_prefixes_the_last_partner_reply():
    env = make_env(max_turns=1, force_decision=True)
    assert env.reply_prefix("partner") == ""
    env.on_reply("agent", "Please donate.")
    assert env.reply_prefix("partner") == "[DONATE $"
    assert "chat ends now" in env.views["partner"][-1]["content"]
    assert "chat ends now" not in env.transcript[-1]["content"]
    env.on_reply("partner", "[DONATE $1.5 for the kids")
    assert env.done and env.rewards()["agent"] == 0.75


def test_builtin_personas_have_every_field():
    ps = load_builtin_personas()
    assert len(ps) >= 30
    assert len({p["user_id"] for p in ps}) == len(ps)
    for p in ps:
        assert all(p[k] is not None for k in FIELDS)
        text = persona_text(p)
        assert "Personality:" in text and "Values:" in text


def test_split_is_seeded_disjoint_and_by_user():
    ps = load_builtin_personas()
    tr, te = split_personas(ps, "train", seed=0), split_personas(ps, "test", seed=0)
    assert {p["user_id"] for p in tr}.isdisjoint({p["user_id"] for p in te})
    assert len(tr) + len(te) == len(ps) and len(te) == 8  # ceil(36 * 0.2)
    assert [p["user_id"] for p in te] == [p["user_id"] for p in split_personas(ps, "test", seed=0)]
    assert [p["user_id"] for p in te] != [p["user_id"] for p in split_personas(ps, "test", seed=1)]
    tasks = PersuasionForGood.load_tasks("test")
    assert {t.data["user_id"] for t in tasks} == {p["user_id"] for p in te}


def test_original_csv_layout():
    d = shared_path("data", "p4g")
    ps = load_csv_personas(d)
    assert len(ps) > 900  # one persuadee row per dialogue
    assert all(p["user_id"].startswith("user_") for p in ps)
    tr, te = split_personas(ps, "train"), split_personas(ps, "test")
    assert {p["user_id"] for p in tr}.isdisjoint({p["user_id"] for p in te})
    tasks = PersuasionForGood.load_tasks("train", personas=d)
    assert len({t.id for t in tasks}) == len(tasks)
    assert "years old" in persona_text(ps[0])


def test_csv_with_missing_columns_is_a_clear_error(tmp_path):
    (tmp_path / "full_info.csv").write_text("B2,B3,B4\nx,user_1,1\n")
    with pytest.raises(ValueError, match="missing columns"):
        load_csv_personas(str(tmp_path))
    with pytest.raises(FileNotFoundError, match="full_info.csv"):
        load_csv_personas(str(tmp_path / "nope"))


def test_real_personas_come_from_the_data_dir_or_the_environment(tmp_path, monkeypatch):
    data = shared_path("data", "p4g")
    train = PersuasionForGood.load_tasks("train", personas="real", data_dir=data)
    test = PersuasionForGood.load_tasks("test", personas="real", data_dir=data)
    assert len(train) + len(test) >= 1000  # one task per persuadee row of full_info.csv
    assert {t.data["user_id"] for t in train}.isdisjoint({t.data["user_id"] for t in test})
    monkeypatch.setenv("SCOPE_P4G_DATA", data)
    assert [t.id for t in PersuasionForGood.load_tasks("test", personas="real")] == [t.id for t in test]
    monkeypatch.delenv("SCOPE_P4G_DATA")
    with pytest.raises(FileNotFoundError, match="SCOPE_P4G_DATA") as e:
        PersuasionForGood.load_tasks("train", personas="real", data_dir=str(tmp_path))
    assert str(tmp_path) in str(e.value)
