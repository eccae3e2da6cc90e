"""Verbalized Sampling: the parser never raises and returns a distribution or an explicit fallback."""
import json
import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scope.partners.vs import draw, instruction, json_schema, max_words, parse
from scope.types import Completion


class Says:
    """An endpoint-like model that always says ``text``."""
    chat, trainable, version, id = True, False, 0, "says"

    def __init__(self, text):
        self.text = text

    def drop_sessions(self, keys):
        pass

    def chat_generate(self, convs, sampling, response_format=None):
        return [Completion(self.text, [], [], "stop") for _ in convs]


def _one_vs_turn(partner):
    """One P4G dialogue turn against the ``partner`` binding (the agent an endpoint that says hello)."""
    from scope.envs.base import get_env
    from scope.partners.binding import Binding
    from scope.rollout import Job, run_rollouts
    from scope.types import Episode, SamplingParams

    env_cls = get_env("p4g")
    task = env_cls.load_tasks("train")[0]
    agent = Binding("a", Says("Hello! Would you donate?"), SamplingParams(max_new_tokens=8))
    job = Job(env=env_cls(task, random.Random(0), max_turns=1), episode=Episode(task.id, "0", 0),
              bindings={"agent": agent, "partner": partner}, uid=0)
    return run_rollouts([job], end_on_truncation=False)[0]


def check(p):
    if p.ok:
        assert p.texts and len(p.texts) == len(p.probs)
        assert all(isinstance(t, str) and t.strip() for t in p.texts)
        assert all(x >= 0 and math.isfinite(x) for x in p.probs)
        assert sum(p.probs) == pytest.approx(1.0)
    else:
        assert isinstance(p.error, str) and p.error and not p.texts


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_arbitrary_strings(s):
    check(parse(s))


json_values = st.recursive(st.none() | st.booleans() | st.floats(allow_nan=True) | st.integers() | st.text(),
                           lambda ch: st.lists(ch, max_size=4) | st.dictionaries(st.text(max_size=8), ch, max_size=4),
                           max_leaves=12)
item = st.fixed_dictionaries({}, optional={"text": st.one_of(st.text(), st.integers(), st.none()),
                                           "probability": st.one_of(st.floats(allow_nan=True, allow_infinity=True),
                                                                    st.integers(-5, 5), st.text(max_size=5),
                                                                    st.none())})


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(item, json_values), max_size=8), st.text(max_size=20), st.text(max_size=20),
       st.sampled_from(["prob", "random"]), st.integers(1, 6))
def test_arbitrary_candidate_lists_inside_noise(items, before, after, method, k):
    body = json.dumps({"responses": items}, allow_nan=True)
    for raw in (body, f"{before}```json\n{body}\n```{after}", before + body + after):
        p = parse(raw, k=k, method=method)
        check(p)
        if p.ok:
            assert len(p.texts) <= k
            if method == "random":
                assert len(set(p.probs)) == 1


@given(st.one_of(st.none(), st.integers(), st.lists(st.text()), st.binary()))
def test_non_text_input(x):
    check(parse(x))


def test_typical_cases():
    raw = 'Sure!\n```json\n{"responses": [{"text": "Yes", "probability": 0.6}, {"text": "No", "probability": 0.2},' \
          ' {"text": "  ", "probability": 0.2}, {"text": "Maybe", "probability": -1}]}\n```'
    p = parse(raw)
    assert p.texts == ["Yes", "No", "Maybe"] and p.probs == pytest.approx([0.75, 0.25, 0.0])
    p = parse('{"responses": [{"text": "a", "probability": "30%"}, {"text": "b", "probability": 70}]}')
    assert p.probs == pytest.approx([0.3 / 70.3, 70 / 70.3])
    p = parse('{"responses": [{"text": "a"}, {"text": "b"}]}')  # no probabilities -> uniform
    assert p.probs == [0.5, 0.5]
    p = parse('{"responses": [' + ",".join(f'{{"text": "t{i}", "probability": 1}}' for i in range(9)) + "]}", k=5)
    assert len(p.texts) == 5
    assert not parse("I'd rather just talk.").ok
    assert not parse('{"responses": []}').ok


def test_draw_follows_stated_probabilities():
    p = parse('{"responses": [{"text": "a", "probability": 0.8}, {"text": "b", "probability": 0.2}]}')
    rng = random.Random(0)
    n = sum(draw(p, rng) == 0 for _ in range(4000))
    assert 0.77 < n / 4000 < 0.83


def test_prompt_and_schema_mention_k():
    assert "5 different replies" in instruction(5, "prob") and "probability" in instruction(5, "prob")
    assert "probability" not in instruction(3, "random")
    assert json_schema(4, "prob")["schema"]["properties"]["responses"]["maxItems"] == 4
    assert "words" not in instruction(5, "prob") and "under 36 words." in instruction(5, "prob", 36)
    assert max_words("auto", 48) == 36 and max_words(None, 48) is None and max_words(12, 48) == 12


def test_the_vs_request_carries_the_length_guide_of_its_binding():
    from scope.config import VSConfig
    from scope.partners.binding import Binding
    from scope.types import SamplingParams

    seen = []

    class Recorder(Says):  # records the requests it is sent
        def chat_generate(self, convs, sampling, response_format=None):
            seen.extend(c[-1]["content"] for c in convs)
            return super().chat_generate(convs, sampling, response_format)

    for setting, want in (("auto", "under 30 words."), (None, None), (7, "under 7 words.")):
        seen.clear()
        b = Binding("vs", Recorder('{"responses": [{"text": "ok", "probability": 1}]}'),
                    SamplingParams(max_new_tokens=40), vs=VSConfig(max_words=setting))
        _one_vs_turn(b)
        assert seen and all((want in s) if want else ("words" not in s) for s in seen), (setting, seen)


def test_items_are_salvaged_from_a_cut_off_reply():
    raw = '{"responses": [{"text": "Sure \\"yes\\"", "probability": 0.6}, {"text": "No", "probability": 0.2}, {"tex'
    p = parse(raw)
    assert p.texts == ['Sure "yes"', "No"] and p.probs == pytest.approx([0.75, 0.25])


def test_a_stray_empty_list_does_not_hide_the_candidates():
    # seen from the embedded model: a whole candidate, then a second "responses" key with an empty list
    raw = '{"responses": [{"text": "this is a question I ask often", "probability": 0.3}, "responses": []}'
    p = parse(raw)
    assert p.ok and p.texts == ["this is a question I ask often"]
    p = parse('[] {"responses": [{"text": "Yes", "probability": 0.5}]}')  # an empty list first, then the set
    assert p.ok and p.texts == ["Yes"]
    assert not parse('{"responses": [], "note": []}').ok


def test_runaway_detects_only_an_open_overlong_candidate():
    from scope.partners.vs import runaway

    done = '{"responses": [{"text": "short", "probability": 0.5}, {"text": "'
    assert not runaway(done + "x" * 10, 20)
    assert runaway(done + "x" * 21, 20)
    assert not runaway(done + "x" * 30 + '", "probability": 0.5}', 20)   # closed: not a runaway
    assert runaway(done + 'an \\"escaped\\" quote ' + "x" * 20, 20)       # escaped quotes do not close
    assert not runaway("no candidates yet", 0)


def test_complete_counts_finished_candidates():
    from scope.partners.vs import complete, parse

    two = '{"responses": [{"text": "a", "probability": 0.5}, {"text": "b", "probability": 0.3}, {"text": "c'
    assert complete(two, 2) and not complete(two, 3)
    p = parse(two, k=2)  # what a stopped reply gives: the complete candidates
    assert p.ok and p.texts == ["a", "b"]


def test_runaway_vs_attempts_restart_inside_one_call(monkeypatch):
    """Every attempt of a (tiny, random) local VS partner is made a runaway: its re-asks happen inside
    the one batched call, then the plain fallback is the only other call."""
    from scope import rollout
    from scope.partners import vs
    from scope.config import VSConfig
    from scope.envs.base import get_env
    from scope.models.backend import ModelRef
    from scope.models.loading import load_tokenizer, tiny_backend
    from scope.partners.binding import Binding
    from scope.types import Episode, SamplingParams

    monkeypatch.setattr(vs, "RUNAWAY_CHARS_PER_TOKEN", 0.25)  # a 2-character candidate is a runaway
    b = tiny_backend(load_tokenizer("tiny-random"), seed=0)
    calls = []
    orig = b.generate
    b.generate = lambda prompts, sp, adapter=None, sessions=None: (
        calls.append((len(prompts), sp.max_restarts)) or orig(prompts, sp, adapter, sessions))
    ref = ModelRef("tiny", b)
    env_cls = get_env("p4g")
    task = env_cls.load_tasks("train")[0]
    sp = SamplingParams(temperature=1.0, max_new_tokens=8)
    jobs = [rollout.Job(env=env_cls(task, random.Random(i), max_turns=1), episode=Episode(task.id, str(i), 0),
                        bindings={"agent": Binding("a", ref, sp),
                              "partner": Binding("vs", ref, sp, vs=VSConfig(k=3, max_new_tokens=64))}, uid=i)
            for i in range(3)]
    eps, _ = rollout.run_rollouts(jobs, end_on_truncation=False)
    recs = [v for e in eps for v in e.vs]
    assert len(recs) == 3
    vs_calls = [c for c in calls[1:] if c[1] > 0]
    assert vs_calls == [(3, 2)]  # one VS call for the 3 dialogues, allowed 2 restarts each
    runaways = [sum(e.startswith("runaway") for e in v["errors"]) for v in recs]
    assert sum(runaways) >= 3  # (an attempt can also end at once, with an end token or a closing quote)
    for v, n in zip(recs, runaways):
        assert n <= 2 and v["attempts"] >= 1 + n and (v["fallback"] or v["candidates"])


def test_huge_stated_probabilities_are_normalised_without_overflow():
    p = parse('{"responses": [{"text": "a", "probability": 1e308}, {"text": "b", "probability": 1e308}, '
              '{"text": "c", "probability": 1e300}]}')
    assert p.ok and p.probs == pytest.approx([0.5, 0.5, 0.0], abs=1e-6) and sum(p.probs) == pytest.approx(1.0)
    p = parse('{"responses": [{"text": "a", "probability": 1e-320}, {"text": "b", "probability": 3e-320}]}')
    assert p.ok and p.probs == pytest.approx([0.25, 0.75])
    p = parse('{"responses": [{"text": "a", "probability": 1e999}, {"text": "b", "probability": 0.9}]}')
    assert p.ok and p.probs == [1.0, 0.0]  # an infinite statement is the largest, not nothing


def test_an_echo_of_the_format_is_not_a_candidate_set():
    echo = instruction(5, "prob")  # the instruction's own example, placeholders and all
    assert not parse(echo).ok
    assert not parse('{"responses": [{"text": "<reply>", "probability": 0.5}, {"text": "...", "probability": 0.5}]}').ok
    assert not parse(json.dumps(json_schema(5, "prob"))).ok
    assert not parse(json.dumps(json_schema(5, "prob")["schema"])).ok
    assert not parse(instruction(3, "random")).ok
    for echo in ('{"responses": [{"text": "string", "probability": "number"}]}', '{"responses": [{"text": "text"}]}',
                 '{"responses": [{"text": "Response", "probability": 1}, {"text": "STR"}]}'):
        assert not parse(echo).ok, echo  # the schema's keys and type names echoed back
    assert parse('{"responses": [{"text": "text me later", "probability": 1}]}').ok


def test_a_broken_first_attempt_does_not_hide_a_complete_object_after_it():
    good = {"responses": [{"text": "A", "probability": 0.6}, {"text": "B", "probability": 0.4}]}
    for broken in ('{"responses": [{"text": "Hello there, I am\n',
                   '{"responses": [{"text": "cut off\n\nLet me redo it. '):
        p = parse(broken + json.dumps(good), k=2)
        assert p.texts == ["A", "B"] and p.probs == pytest.approx([0.6, 0.4]), p


@pytest.mark.parametrize("raw", ['{"text":"}"}' * 50, '"text":":"' * 100, '{"responses": [{"text": "}:{"}]}',
                                 '{"":"":"' * 300 + '"text": "\"", ' * 20])
def test_json_punctuation_alone_is_no_candidate(raw):
    """A reply of braces, quotes and colons holds no candidate: it falls back as a reply without one does."""
    p = parse(raw)
    assert not p.ok and not p.texts, p


@pytest.mark.parametrize("make", [
    lambda n: '{"responses": [{"text": "' * n + '{"responses": []}',
    lambda n: "[" * (20 * n), lambda n: "{" * (10 * n) + "}" * (10 * n),
    lambda n: '{"responses": [' * (2 * n) + "]}" * (2 * n),
    lambda n: '{"text": "' * (2 * n), lambda n: '"text": "a", ' * (2 * n),
    lambda n: "[" * (10 * n) + '{"text": "x"}' + "]" * (10 * n),
    lambda n: '"\\' * (10 * n), lambda n: '["\\' * (7 * n), lambda n: '"' * (20 * n)])
def test_parsing_is_linear_in_the_reply_length(make):
    """Four times the reply costs about four times the time, not sixteen (each size timed at its best of
    three, so that a busy machine does not decide it)."""
    import time

    from scope.partners.vs import complete, runaway

    def cost(raw):
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            check(parse(raw))
            complete(raw, 5)
            runaway(raw, 100)
            best = min(best, time.perf_counter() - t0)
        return best

    small, big = cost(make(1000)), cost(make(4000))
    assert big < 8 * small + 0.005, (len(make(4000)), small, big)


def test_starting_with_keeps_the_candidates_that_begin_so_and_renormalises():
    from scope.partners.vs import VSParse, starting_with

    p = VSParse(texts=["no thanks", "[DONATE $3] ok", "[DONATE $0]"], probs=[0.6, 0.3, 0.1])
    q = starting_with(p, "[DONATE $")
    assert q.texts == ["[DONATE $3] ok", "[DONATE $0]"] and q.probs == pytest.approx([0.75, 0.25])
    assert not starting_with(VSParse(texts=["no"], probs=[1.0]), "[DONATE $").ok
    assert starting_with(p, "") is p
    assert "begin with `[DONATE $` and go on" in instruction(3, "prob", start="[DONATE $")


def _forced_vs_turns(partner, n=6):
    """The persuadee's last replies of ``n`` one-turn P4G dialogues that force its decision."""
    from scope.envs.base import get_env
    from scope.partners.binding import Binding
    from scope.rollout import Job, run_rollouts
    from scope.types import Episode, SamplingParams

    env_cls = get_env("p4g")
    task = env_cls.load_tasks("train")[0]
    agent = Binding("a", Says("Hello! Would you donate?"), SamplingParams(max_new_tokens=8))
    jobs = [Job(env=env_cls(task, random.Random(i), max_turns=1, force_decision=True),
                episode=Episode(task.id, str(i), 0), bindings={"agent": agent, "partner": partner}, uid=i)
            for i in range(n)]
    eps, _ = run_rollouts(jobs, end_on_truncation=False)
    return [e.vs[-1] for e in eps], [j.env.views["agent"][-1]["content"] for j in jobs]


def test_a_forced_decision_reaches_a_verbalized_sampling_partner():
    """P4G's force_decision starts the persuadee's last reply with the donation marker: a VS persuadee
    draws only among candidates that begin with it (an endpoint), and a local one is given it as the start
    of its first candidate and of its fallback, so its decision is never lost to VS."""
    from scope.config import VSConfig
    from scope.envs.p4g import DECISION_PREFIX
    from scope.models.backend import ModelRef
    from scope.models.loading import load_tokenizer, tiny_backend
    from scope.partners.binding import Binding
    from scope.types import SamplingParams

    says = Says(json.dumps({"responses": [{"text": "No thanks.", "probability": 0.9},
                                          {"text": "[DONATE $3] fine", "probability": 0.1}]}))
    recs, last = _forced_vs_turns(Binding("vs", says, SamplingParams(), vs=VSConfig(k=2)))
    assert all(r["candidates"] == ["[DONATE $3] fine"] for r in recs) and all(t == "[DONATE $3] fine" for t in last)
    tiny = ModelRef("tiny", tiny_backend(load_tokenizer("tiny-random"), seed=0))
    recs, last = _forced_vs_turns(Binding("vs", tiny, SamplingParams(temperature=1.0, max_new_tokens=8),
                                          vs=VSConfig(k=3, max_new_tokens=48)))
    assert all(t.startswith(DECISION_PREFIX) for t in last)
    assert all(c.startswith(DECISION_PREFIX) for r in recs for c in r["candidates"])


def test_a_chance_list_inside_junk_falls_back():
    """100,000 characters of brackets and quotes hold, by chance, a valid JSON list of one short string: that is
    no candidate set (it falls back), while a bare list that is the reply, or most of it, still parses."""
    rng = random.Random(1)
    junk = "".join(rng.choice("[]{}\"c'") for _ in range(100_000))
    assert not parse(junk).ok
    assert parse('["yes", "no"]').texts == ["yes", "no"]
    assert parse('Sure: ["yes please", "no"]').texts == ["yes please", "no"]
