"""The P4G-pitch environment: its amount readout, its expected-value reward, its short persona, its episodes
through the engine (the persuadee's draw in its trace), its two-turn, verbal and positive-control variants.

The tiny model gets an output layer with a bias toward digits and the point, so that the amount after
``[DONATE $`` has a distribution worth checking (a random tiny model rarely writes a digit). The readout itself
is tested in the core (tests/test_readout.py)."""
import random
import statistics

import pytest
import torch

from scope.models.loading import tiny_backend

from recipes.conftest import shared_path
from recipes.p4g_pitch.env import AMOUNT, NO_AMOUNT, P4GPitch, amount, expected_reward, reward_of, short_persona
from scope.models.backend import ModelRef
from scope.rollout import Job, encode, render, run_rollouts
from scope.partners.binding import Binding
from scope.types import Episode, SamplingParams, Task


@pytest.fixture()
def tiny(smol_tokenizer):
    return tiny_backend(smol_tokenizer, seed=0)


def digit_biased(backend, seed: int = 0):
    """Give the tiny model an untied output layer whose bias favours the digits, the point and ']'."""
    tok = backend.tokenizer
    m = backend.model
    w = m.get_output_embeddings().weight
    head = torch.nn.Linear(w.shape[1], w.shape[0], bias=True)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        head.weight.copy_(w)
        head.bias.zero_()
        # 0 and 1 (whose amount the next tokens settle) and the point most, 2-9 and ']' less
        for s, b in [(str(d), (10.0 if d < 2 else 8.0) + torch.rand(1, generator=g).item()) for d in range(10)] + \
                [(".", 11.5), ("]", 8.5)]:
            head.bias[tok.convert_tokens_to_ids(s)] = b
    m.lm_head = head
    m.config.tie_word_embeddings = False
    return backend


PERSONA = {"user_id": "u1", "age": 34, "sex": "Female", "marital": "Married", "religion": "Catholic",
           "ideology": "Liberal", "income": 5, "extrovert": 2.0, "agreeable": 4.8, "conscientious": 3.2,
           "neurotic": 1.2, "open": 3.0}


def test_amount_reads_to_the_dime_and_waits_while_the_text_could_change_it():
    assert amount("", False) is None and amount("", True) == NO_AMOUNT
    assert amount("1", False) is None and amount("1", True) == 1.0
    assert amount("1.", False) is None and amount("1.", True) == 1.0
    assert amount("1.5", False) == 1.5 and amount("0.25", False) == 0.2
    assert amount("2", False) == 2.0 and amount("10", False) == 2.0 and amount("05", False) == 2.0
    assert amount("0]", False) == 0.0 and amount("x", False) == NO_AMOUNT and amount("²", False) == NO_AMOUNT
    assert amount("00", False) is None and amount("01.", True) == 1.0
    assert [reward_of(a) for a in (NO_AMOUNT, 0.0, 0.5, 1.5, 2.0)] == [0.0, 0.0, 0.25, 0.75, 1.0]
    assert expected_reward({2.0: 0.5, NO_AMOUNT: 0.25, 1.0: 0.25}) == pytest.approx(0.625)


def test_the_short_persona_names_demographics_and_the_two_most_marked_traits():
    text = short_persona(PERSONA)
    assert text.startswith("You are 34 years old, female, married, Catholic, liberal, income bracket 5 of 12.")
    assert "very high agreeableness" in text and "very low neuroticism" in text and "extraversion" not in text


def _prompts(tok, n):
    out = []
    for i in range(n):
        env = P4GPitch(Task(f"t{i}", "train", dict(PERSONA, age=20 + i)), random.Random(i))
        env.on_reply("agent", ["Please give to the children.", "Hello!", "Save the Children needs you."][i % 3])
        out.append(encode(tok, render(tok, env.views["partner"], True) + "[DONATE $"))
    return out


def test_the_expected_reward_is_the_mean_of_sampled_rewards_within_its_standard_error(tiny):
    """The readout's exact expectation against the engine's own sampler (generate), 2000 draws per prompt,
    and against the readout's own draws; the distribution sums to one."""
    b = digit_biased(tiny)
    tok = b.tokenizer
    sp = SamplingParams(temperature=0.8, max_new_tokens=3)
    prompts = _prompts(tok, 2)
    res = b.readout(prompts, sp, AMOUNT)
    for p, r in zip(prompts, res):
        assert sum(r.dist.values()) == pytest.approx(1.0, abs=1e-6)
        ev = expected_reward(r.dist)
        # the check means something: neither end of the scale, and mass on amounts that a second token settles
        assert 0.1 < ev < 0.9 and sum(v for k, v in r.dist.items() if k not in (2.0, NO_AMOUNT)) > 0.03
        outs = b.generate([p] * 2000, sp)
        sampled = [reward_of(amount(tok.decode(c.token_ids[:-1] if c.finish_reason == "eos" else c.token_ids), True))
                   for c in outs]
        m, se = statistics.mean(sampled), statistics.stdev(sampled) / len(sampled) ** 0.5
        assert abs(m - ev) < 3 * se, (m, ev, se)
        own = [reward_of(x.outcome) for x in b.readout([p] * 1000, sp, AMOUNT)]
        m2, se2 = statistics.mean(own), statistics.stdev(own) / len(own) ** 0.5
        assert abs(m2 - ev) < 3 * se2, (m2, ev, se2)


def test_a_pitch_episode_rewards_the_expectation_and_records_the_persuadees_draw(tiny):
    """Through the engine: the agent's pitch, the persuadee's readout (its draw in its trace with mask 1), the
    expected reward for the agent, the sampled one in meta, 1 - sampled for the persuadee."""
    b = digit_biased(tiny)
    ref = ModelRef("tiny", b)
    agent = Binding("agent", ref, SamplingParams(temperature=1.0, max_new_tokens=6))
    partner = Binding("partner", ref, SamplingParams(temperature=0.7, max_new_tokens=4))
    tasks = [Task(f"t{i}", "train", dict(PERSONA, age=30 + i)) for i in range(3)]
    jobs = [Job(env=P4GPitch(t, random.Random(i)), episode=Episode(t.id, f"g{i}", 0),
                bindings={"agent": agent, "partner": partner}, uid=i) for i, t in enumerate(tasks)]
    eps, _ = run_rollouts(jobs, max_context=1024, end_on_truncation=False)
    for e, j in zip(eps, jobs):
        assert e.status == "done", e.error
        assert e.rewards["agent"] == pytest.approx(e.meta["expected_reward"])
        assert e.meta["sampled_reward"] == reward_of(e.meta["decision"])
        assert e.rewards["partner"] == pytest.approx(1 - e.meta["sampled_reward"])
        tr = e.traces["partner"]
        gen = [t for t, m in zip(tr.token_ids, tr.mask) if m]
        assert 1 <= len(gen) <= 3 and tr.n_turns == 1
        assert e.messages[-1]["content"].startswith("[DONATE $")
        assert "[The chat ends now." in j.env.views["partner"][1]["content"]


def test_two_turns_and_the_verbal_control_and_the_positive_control(tiny):
    b = digit_biased(tiny)
    ref = ModelRef("tiny", b)
    agent = Binding("agent", ref, SamplingParams(temperature=1.0, max_new_tokens=6))
    partner = Binding("partner", ref, SamplingParams(temperature=0.7, max_new_tokens=4))
    task = Task("t", "train", PERSONA)
    envs = [P4GPitch(task, random.Random(0), turns=2), P4GPitch(task, random.Random(0), decision="verbal"),
            P4GPitch(task, random.Random(0), reward="mentions_children")]
    jobs = [Job(env=e, episode=Episode("t", f"g{i}", 0), bindings={"agent": agent, "partner": partner}, uid=i)
            for i, e in enumerate(envs)]
    eps, _ = run_rollouts(jobs, max_context=1024, end_on_truncation=False)
    two, verbal, control = eps
    assert [m["role"] for m in two.messages] == ["agent", "partner", "agent", "partner"]
    assert "[Write one more short message" in envs[0].views["agent"][3]["content"]
    assert two.messages[-1]["content"].startswith("[DONATE $") and "expected_reward" in two.meta
    assert "expected_reward" not in verbal.meta and not verbal.messages[-1]["content"].startswith("[DONATE $")
    assert verbal.rewards["agent"] == verbal.meta["sampled_reward"]
    pitch = control.messages[0]["content"]
    assert control.rewards["agent"] == float("child" in pitch.lower().split() or "children" in pitch.lower().split())


def test_p4g_pitch_tasks_are_the_p4g_personas():
    data = shared_path("data", "p4g")
    tasks = P4GPitch.load_tasks("test", personas="real", data_dir=data)
    assert len(tasks) > 100 and all(t.id.startswith("p4g_pitch/") for t in tasks)
    assert short_persona(tasks[0].data).startswith("You are ")
