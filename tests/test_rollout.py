"""The rollout engine: batching per model, failure isolation, end reasons."""
import random

import pytest

from scope.envs.base import get_env
from scope.models.backend import ModelRef
from scope.models.loading import load_tokenizer, tiny_backend
from scope.rollout import Job, run_rollouts
from scope.types import Episode, SamplingParams

from helpers import ScriptedRef


def p4g_jobs(refs, n, **opts):
    env_cls = get_env("p4g")
    tasks = env_cls.load_tasks("train")
    return [Job(env=env_cls(tasks[i % len(tasks)], random.Random(i), **opts),
                episode=Episode(tasks[i % len(tasks)].id, str(i // 2), i % 2), bindings=dict(refs), uid=i)
            for i in range(n)]


SP = {"agent": SamplingParams(max_new_tokens=8), "partner": SamplingParams(max_new_tokens=8)}


def test_one_batched_call_per_model_per_round(smol_tokenizer):
    agent = ScriptedRef(smol_tokenizer, ["Please donate."], "agent")
    partner = ScriptedRef(smol_tokenizer, ["No."], "partner")
    eps, st = run_rollouts(p4g_jobs({"agent": agent, "partner": partner}, 6, max_turns=3), SP)
    assert [len(c) for c in agent.calls] == [6, 6, 6] and [len(c) for c in partner.calls] == [6, 6, 6]
    assert all(e.status == "max_turns" and e.turns == {"agent": 3, "partner": 3} for e in eps)
    assert st.tokens_generated == sum(e.traces["agent"].n_generated + e.traces["partner"].n_generated for e in eps)


class Boom(ScriptedRef):
    def generate(self, prompts, sampling, sessions=None):
        raise ConnectionError("partner endpoint down")


class HalfDown(ScriptedRef):
    """An engine backend's way to fail: the exception in the slot of each request that failed."""

    def generate(self, prompts, sampling, sessions=None):
        outs = super().generate(prompts, sampling, sessions)
        return [ConnectionError("engine lost row 0") if i == 0 else c for i, c in enumerate(outs)]


def test_a_failed_slot_of_a_token_batch_fails_only_its_episode(smol_tokenizer):
    agent = ScriptedRef(smol_tokenizer, ["Please donate."], "agent")
    partner = HalfDown(smol_tokenizer, ["Sure [DONATE $2]"], "partner")
    eps, _ = run_rollouts(p4g_jobs({"agent": agent, "partner": partner}, 3, max_turns=2), SP)
    assert eps[0].status == "failed" and "engine lost row 0" in eps[0].error
    assert all(e.status != "failed" for e in eps[1:])


def test_a_failing_model_or_env_fails_only_its_episodes(smol_tokenizer):
    agent = ScriptedRef(smol_tokenizer, ["Please donate."], "agent")
    good = ScriptedRef(smol_tokenizer, ["Sure [DONATE $2]"], "good")
    bad = Boom(smol_tokenizer, ["x"], "bad")
    jobs = p4g_jobs({"agent": agent, "partner": good}, 4)
    jobs[1].bindings["partner"] = bad
    orig = jobs[2].env.on_reply

    def broken(role, text):
        if role == "partner":
            raise ValueError("malformed reply")
        orig(role, text)

    jobs[2].env.on_reply = broken
    eps, _ = run_rollouts(jobs, SP)
    assert [e.status for e in eps] == ["done", "failed", "failed", "done"]
    assert "partner endpoint down" in eps[1].error and "malformed reply" in eps[2].error
    assert eps[0].rewards["agent"] == 1.0


def test_context_limit_ends_the_episode():
    tok = load_tokenizer("tiny-random")
    b = tiny_backend(tok)
    ref = ModelRef("tiny", b)
    eps, _ = run_rollouts(p4g_jobs({"agent": ref, "partner": ref}, 2), SP, max_context=700,
                          end_on_truncation=False)
    assert all(e.status == "context_limit" for e in eps)
    assert all(len(e.traces[r].token_ids) <= 700 for e in eps for r in ("agent", "partner"))
    assert not b.kv_store  # sessions are dropped when their episodes end


def test_every_end_reason_in_the_code_is_documented():
    """Each ``finish("...")`` in scope/ names a documented end (scope.types.END_REASONS or its environment's
    ``end_reasons``), and ``Env.finish`` refuses one that is not."""
    import glob
    import os
    import re

    from scope.types import END_REASONS

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    used = set()
    for p in glob.glob(os.path.join(root, "scope", "**", "*.py"), recursive=True):
        used |= set(re.findall(r'finish\(f?"([a-z_{}]+)"\)', open(p).read()))
    used = {u for u in used if "{" not in u} | {"user_stop", "agent_stop"}  # tau2's f"{who}_stop"
    assert used <= set(END_REASONS), used - set(END_REASONS)
    from helpers import Bandit

    class Shop(Bandit):  # an environment with an end of its own, beside END_REASONS
        end_reasons = frozenset({"refused"})

    env = Shop(Bandit.load_tasks("train")[0], random.Random(0))
    with pytest.raises(ValueError, match="not an end reason"):
        env.finish("wandered_off")
    env.finish("refused")
    assert env.done and env.end_reason == "refused"
    assert "refused" not in END_REASONS


def test_a_replay_ends_after_its_recorded_turns_ungraded_not_failed(smol_tokenizer):
    """``Job.stop_after``: the dialogue ends when the replayed agent has made its recorded replies; the
    partner's answer to the last one is kept, nothing is graded, nothing fails (the probe's and the variance
    decomposition's replays end this way)."""
    from scope.eval import ReplayRef
    from scope.partners.binding import Binding
    from scope.rollout import Play, make_jobs

    env_cls = get_env("p4g")
    task = env_cls.load_tasks("train")[0]
    partner = ScriptedRef(smol_tokenizer, ["No thanks."], "partner")
    sp = SamplingParams(max_new_tokens=8)

    def play(stop_after):
        return Play(task, Episode(task.id, "g", 0), {"agent": Binding("replay", ReplayRef(["Please give."]), sp),
                                                     "partner": Binding("p", partner, sp)}, stop_after=stop_after)

    (ep,), _ = run_rollouts(make_jobs(env_cls, [play({"agent": 1})], {"max_turns": 3}, random.Random(0), "t"))
    assert ep.status == "replay_end" and not ep.failed and ep.rewards == {}
    assert [m["role"] for m in ep.messages] == ["agent", "partner"] and ep.turns == {"agent": 1, "partner": 1}
    (ep,), _ = run_rollouts(make_jobs(env_cls, [play(None)], {"max_turns": 3}, random.Random(0), "t"))
    assert ep.failed and "no more agent turns" in ep.error  # without it, the replay runs dry and fails
