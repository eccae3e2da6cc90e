"""Rewards by import path (``package.module:function``): the agent's and a trained partner's, what the run
logs and trains on; a function that raises or returns no number fails its episodes, counted, and the run goes
on; a path that does not import stops the run at start-up."""
import sys
import textwrap

import pytest

from helpers import tiny_run
from scope.guards import StartupError
from scope.partners.rewards import apply_partner_reward
from scope.run import read_metrics
from scope.train import train
from scope.types import Episode

MODULE = textwrap.dedent('''
    def by_length(episodes, role, agent="agent"):
        """1 for each episode whose first agent turn is longer than 20 characters."""
        out = []
        for e in episodes:
            said = [m["content"] for m in e.messages if m["role"] == "agent"]
            out.append(float(len(said[0]) > 20) if said else None)
        return out

    def partner_half(episodes, role, agent="agent"):
        return [0.5 for _ in episodes]

    def broken(episodes, role, agent="agent"):
        raise RuntimeError("the grader is down")

    def not_numbers(episodes, role, agent="agent"):
        return ["high"] + [1.0] * (len(episodes) - 1)
''')


@pytest.fixture
def rewards_module(tmp_path, monkeypatch):
    (tmp_path / "my_rewards.py").write_text(MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "my_rewards"
    sys.modules.pop("my_rewards", None)


def cfg_with(run_dir, agent_reward="env", partner=None, steps=2):
    return tiny_run(run_dir, steps, run={"save_every": 2}, agent={"reward": agent_reward}, partner=partner or {})


def test_the_agent_and_a_trained_partner_train_on_rewards_by_import_path(tmp_path, rewards_module):
    run = tmp_path / "run"
    train(cfg_with(run, f"{rewards_module}:by_length",
                   {"trainable": True, "reward": f"{rewards_module}:partner_half"}), log=lambda s: None)
    import json

    recs = [json.loads(x) for x in open(run / "rollouts" / "step_000001.jsonl")]
    for r in recs:
        said = next(m["content"] for m in r["messages"] if m["role"] == "agent")
        assert r["rewards"]["agent"] == float(len(said) > 20) and r["rewards"]["partner"] == 0.5
    m = read_metrics(str(run))[0]
    assert m["reward_mean"] == pytest.approx(sum(r["rewards"]["agent"] for r in recs) / len(recs))
    assert m["partner/reward_mean"] == 0.5


def test_a_reward_that_raises_or_returns_no_number_fails_its_episodes_and_the_step_goes_on(rewards_module):
    eps = [Episode("t", "g", i, status="done", rewards={"agent": 0.0}) for i in range(3)]
    assert apply_partner_reward(f"{rewards_module}:not_numbers", eps, "agent") == 1
    assert eps[0].failed and "'high' is not a finite number" in eps[0].error and eps[1].rewards["agent"] == 1.0
    eps = [Episode("t", "g", i, status="done", rewards={"agent": 0.0}) for i in range(3)]
    assert apply_partner_reward(f"{rewards_module}:broken", eps, "agent") == 3
    assert all(e.failed and "RuntimeError: the grader is down" in e.error for e in eps)


def test_a_reward_path_that_does_not_import_stops_the_run_at_start_up(tmp_path, rewards_module):
    run = tmp_path / "run"
    with pytest.raises(StartupError, match="agent.reward: reward 'my_rewards:nope'"):
        train(cfg_with(run, f"{rewards_module}:nope"), log=lambda s: None)
    with pytest.raises(StartupError, match="partner.reward: reward 'no_such_module:f'"):
        train(cfg_with(run, partner={"reward": "no_such_module:f"}), log=lambda s: None)
    assert not run.exists()
