"""King of the Hill: the rules (a scripted scenario scored by hand), determinism, the behaviour tree's sanity
checks, skills trained with PPO that load and act, the LLM controller's strict parse, and a short tournament."""
import random

import numpy as np
import pytest

from scope.koth.game import Games, on_hill
from scope.koth.policies import SKILLS, SkillTeam, bt_team, play, random_picker

S, U, D, L, R = range(5)


def test_a_scripted_scenario_scores_as_computed_by_hand():
    g = Games(1, noise=0.0)
    # team 0 walks both units right; team 1 stays at its spawns
    for _ in range(3):
        g.step([[R, R, S, S]])
        assert g.score.tolist() == [[0, 0]]  # x = 1, 2, 3: not yet on the hill (it starts at x = 4)
    g.step([[R, R, S, S]])
    assert on_hill(g.pos[0, 0]) and on_hill(g.pos[0, 1]) and g.score.tolist() == [[1, 0]]
    g.step([[S, S, S, S]])
    assert g.score.tolist() == [[2, 0]]  # ticks 4 and 5: held alone twice
    # team 1 comes to meet unit 0 (at (4, 4)) with both units: two against one, unit 0 is tagged
    g2 = Games(1, noise=0.0)
    g2.pos[0] = [[4, 4], [0, 10], [6, 4], [6, 5]]
    g2.step([[S, S, L, L]])  # enemies at (5, 4) and (5, 5): both within 2 of each other, unit 0 alone
    assert g2.out[0, 0] == 3 and g2.pos[0, 0].tolist() == [0, 4] and g2.tags[0, 2] + g2.tags[0, 3] >= 1
    assert g2.out[0, 2] == 0 and g2.out[0, 3] == 0
    # one against one: both are tagged
    g3 = Games(1, noise=0.0)
    g3.pos[0] = [[4, 4], [0, 10], [6, 4], [10, 10]]
    g3.step([[S, S, L, S]])
    assert g3.out[0, 0] == 3 and g3.out[0, 2] == 3
    # a tagged unit neither moves nor scores while it is out
    g3.step([[R, S, S, S]])
    assert g3.pos[0, 0].tolist() == [0, 4] and g3.score.tolist() == [[0, 0]]


def test_games_are_deterministic_and_the_behaviour_tree_is_sane():
    a, b = Games(8, seed=5), Games(8, seed=5)
    assert (play(a, (bt_team(), bt_team())) == play(b, (bt_team(), bt_team()))).all()
    g = Games(200, seed=11)
    left = play(g, (bt_team(), bt_team()))
    g = Games(200, seed=12)
    right = 1 - play(g, (bt_team(), bt_team()))
    assert abs(np.concatenate([left, right]).mean() - 0.5) <= 0.05  # BT vs BT, sides swapped: even
    g = Games(200, seed=13)
    r = play(g, (bt_team(), SkillTeam("random", random_picker(0), None, every=10)))
    assert (r == 1).mean() >= 0.8  # the behaviour tree beats a random skill picker


def test_trained_skills_and_the_flat_team_load_and_act(tmp_path):
    from scope.koth.policies import FlatTeam
    from scope.koth.skills import load_models, train

    train(steps={"skill": 512, "flat": 512}, out=str(tmp_path), log=lambda s: None)
    models = load_models(out=str(tmp_path), train_missing=False)
    assert set(models) == set(SKILLS) | {"flat"}
    team = SkillTeam("rl", random_picker(0), {s: models[s] for s in SKILLS}, every=5)
    g = Games(4, seed=0)
    for side in (0, 1):
        act = team.act(g, side)
        assert act.shape == (4, 2) and ((act >= 0) & (act < 5)).all()
    r = play(Games(4, seed=1), (FlatTeam(models["flat"]), bt_team()))
    assert r.shape == (4,)
    with pytest.raises(FileNotFoundError, match="scope koth train"):
        load_models(["capture"], out=str(tmp_path / "empty"), train_missing=False)


def test_the_shipped_skills_are_used_while_their_settings_hold_and_beat_the_tree(tmp_path, monkeypatch):
    from scope.koth import skills
    from scope.koth.policies import FlatTeam

    monkeypatch.setenv("SCOPE_CACHE", str(tmp_path))  # an empty cache: nothing trained here
    assert skills.model_dir() == skills.SHIPPED
    models = skills.load_models(train_missing=False)
    r = play(Games(20, seed=3), (FlatTeam(models["flat"]), bt_team()))
    assert r.mean() > 0.5  # the shipped flat team was trained against the behaviour tree, and beats it
    monkeypatch.setattr(skills, "SKILLS_VERSION", skills.SKILLS_VERSION + 1)
    assert skills.model_dir() == skills.cache_dir()  # other settings: not the shipped set


def test_the_score_interval_stays_inside_zero_and_one():
    from scope.koth.tournament import stats, wilson

    lo, hi = stats([1.0] * 200)["ci95"]
    assert hi == 1.0 and 0.97 < lo < 1.0
    lo, hi = wilson(0.5, 100)
    assert abs(lo - 0.404) < 0.002 and abs(hi - 0.596) < 0.002


@pytest.mark.parametrize("text,want", [
    ("1: capture\n2: defend", [0, 1]), ("unit 1 = intercept\nunit 2 - retreat", [2, 3]),
    ("2: capture\n1: capture", [0, 0]), ("Sure!\n1: defend\n2: defend", [1, 1]),
    ("1: capture", None), ("1: capture\n2: fly", None), ("1: capture\n1: defend\n2: defend", None),
    ("capture and defend", None), ("", None),
    ("1: 3\n2: 1", [2, 0]), ("1: 1 capture\n2: 2 defend", [0, 1]), ("1. 2\n2. 4\n3: 1", [1, 3]),
    ("1: 1 capture\n2: 1 defend", None), ("1: 5\n2: 1", None), ("1:\n2: 1", None)])
def test_the_controller_is_parsed_strictly(text, want):
    from scope.koth.env import parse_skills

    assert parse_skills(text) == want


def test_the_controller_env_keeps_skills_on_a_bad_answer_and_plays_against_a_partner():
    from scope.envs.base import get_env

    E = get_env("koth")
    task = E.load_tasks("test")[0]
    env = E(task, random.Random(0), skills="scripted")
    env.on_reply("agent", "1: capture\n2: capture")
    env.on_reply("agent", "I think we should attack")  # bad: the skills stay capture, capture
    assert env.llm_skills["agent"] == [0, 0] and env.bad["agent"] == 1 and env.g.tick == 20
    while not env.done:
        env.on_reply("agent", "1: capture\n2: defend")
    r = env.rewards()
    assert env.meta["koth"]["decisions"] == 10 and r["agent"] + r["partner"] == 1.0
    duel = E(task, random.Random(0), skills="scripted", opponent="partner")
    assert duel.next_roles() == ["agent", "partner"]
    duel.on_reply("agent", "1: capture\n2: capture")
    assert duel.g.tick == 0 and duel.next_roles() == ["partner"]  # both choose, then the ticks run
    duel.on_reply("partner", "1: retreat\n2: retreat")
    assert duel.g.tick == 10


def test_a_short_tournament_runs_with_an_llm_team(tmp_path):
    from scope.koth import tournament
    from scope.models.backend import ModelRef
    from scope.models.loading import load_tokenizer, tiny_backend
    from scope.partners.binding import Binding
    from scope.types import SamplingParams

    b = tiny_backend(load_tokenizer("tiny-random"), seed=0)
    agents = {"llm": Binding("llm", ModelRef("tiny:base", b), SamplingParams(temperature=1.0, max_new_tokens=6))}
    res = tournament.run(["bt", "llm"], games=4, seed=0, agents=agents, log=lambda s: None, skills="scripted")
    s = res["pairs"]["bt vs llm"]
    assert s["games"] == 4 and s["wins"] + s["draws"] + s["losses"] == 4
    assert "p_even" in s and "| bt vs llm | 4 |" in tournament.table(res)
    tournament.write(res, str(tmp_path))


def test_the_format_bonus_pays_the_share_of_answers_that_parse():
    import random as _random

    from scope.koth.env import KingOfTheHill
    from scope.types import Task

    def play_with(answers, bonus):
        env = KingOfTheHill(Task(id="koth/1", split="train", data={"seed": 1, "side": 0}), _random.Random(0),
                            every=25, skills="scripted", format_bonus=bonus)
        for a in answers:
            env.on_reply("agent", a)
        return env.rewards()["agent"]

    answers = ["1: capture\n2: defend", "nonsense", "1: 2\n2: 2", "??"]
    base = play_with(answers, 0.0)
    assert play_with(answers, 0.2) == pytest.approx(base + 0.2 * 0.5)


def test_the_lenient_parse_reads_unit_lines_and_keeps_the_rest():
    from scope.koth.env import parse_lenient

    assert parse_lenient("1: capture\nYou are standing on", [1, 2]) == [0, 2]
    assert parse_lenient("1: 3, enemy 1 (2, 3)\n2: defend now", [0, 0]) == [2, 1]
    assert parse_lenient("1: 0, them\n", [0, 1]) is None and parse_lenient("no units", [0, 1]) is None
